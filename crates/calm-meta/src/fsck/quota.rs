//! The quota pass of fsck, after the keyspace pass: every usage kept equals the usage counted
//! from the namespace, every limit decodes and names a live directory, and the count of
//! limited trees is right.

use std::ops::ControlFlow;

use calm_store::{ReadTxn, decode_counter};

use crate::error::Result;
use crate::quota::{KEY_QUOTA_TREES, QuotaKind, Stored, TAG_LIMITS, count, key_target};

/// The problems found, each a sentence.
pub(super) fn check<R: ReadTxn>(view: &R) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut trees = 0u64;
    let mut bad = Vec::new();
    view.visit(&[TAG_LIMITS], &[TAG_LIMITS + 1], &mut |key, value| {
        match (key_target(key), Stored::decode(value)) {
            (Some(target), Ok(_)) if target.kind == QuotaKind::Tree => trees += 1,
            (Some(_), Ok(_)) => {}
            _ => bad.push(format!("quota limits {key:?} do not decode")),
        }
        ControlFlow::Continue(())
    })?;
    for problem in bad {
        problems.push(problem);
    }
    let kept = match view.get(KEY_QUOTA_TREES)? {
        Some(v) => decode_counter(KEY_QUOTA_TREES, &v)?,
        None => 0,
    };
    if kept != trees {
        problems.push(format!(
            "counter Nquota_trees is {kept}, counted {trees} trees with a limit"
        ));
    }
    match count::check(view) {
        Ok(mismatches) => {
            problems.extend(mismatches.iter().map(ToString::to_string));
        }
        Err(failure) => problems.push(format!(
            "quota usage could not be counted: {}",
            crate::error::MetaError::from(failure)
        )),
    }
    Ok(problems)
}
