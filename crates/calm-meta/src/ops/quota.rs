//! Setting and removing a quota's limits (the superuser only). A tree limited for the first
//! time is counted in the same commit, so its usage is exact from the start.

use calm_store::WriteTxn;

use crate::ctx::Ctx;
use crate::error::MetaError;
use crate::outcome::{Done, Outcome};
use crate::quota::{QuotaKind, QuotaLimits, QuotaTarget, TREE_QUOTAS_MAX};

/// The longest grace a soft limit may have: ten years.
pub const GRACE_S_MAX: u64 = 10 * 366 * 24 * 3600;

pub(crate) fn set_quota<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    target: QuotaTarget,
    limits: QuotaLimits,
) -> Outcome<Done> {
    if !ctx.caller.is_root() {
        return Err(MetaError::NotPermitted("only the superuser sets quotas".into()).into());
    }
    for (soft, hard, what) in [
        (limits.soft_bytes, limits.bytes, "bytes"),
        (limits.soft_inodes, limits.inodes, "inodes"),
    ] {
        if soft > 0 && hard > 0 && soft > hard {
            return Err(MetaError::Invalid(format!(
                "the soft limit of {what} ({soft}) is above the hard one ({hard})"
            ))
            .into());
        }
    }
    if limits.grace_s > GRACE_S_MAX {
        return Err(MetaError::Invalid(format!(
            "a grace of {} s; at most {GRACE_S_MAX} s",
            limits.grace_s
        ))
        .into());
    }
    let mut counted = None;
    match target.kind {
        QuotaKind::User | QuotaKind::Group => {
            if target.id > u64::from(u32::MAX) {
                return Err(MetaError::Invalid(format!("{target}: not a 32-bit id")).into());
            }
        }
        QuotaKind::Tree => {
            ctx.load_dir(target.id)?;
            let limited = ctx.quota.has_tree(ctx.txn, target.id)?;
            if !limited && !limits.is_none() {
                if ctx.quota.trees(ctx.txn)? >= TREE_QUOTAS_MAX {
                    return Err(MetaError::NoSpace(format!(
                        "{TREE_QUOTAS_MAX} trees have a limit already"
                    ))
                    .into());
                }
                // The tree is counted on the transaction: what this group changed so far goes
                // into it first (the same bytes its end would write).
                ctx.write_back()?;
                counted = Some(crate::quota::count::tree(ctx.txn, target.id)?);
            }
        }
    }
    let now = ctx.now;
    let report = ctx.quota.set(ctx.txn, target, limits, counted, now)?;
    Ok(Done::Quota(report))
}
