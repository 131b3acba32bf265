//! The shapes of the metadata service's answers: what a mutation did, as each call answers it.

use calm_meta::ops::Done;
use calm_meta::{Attr, MetaError};
use calm_proto::pb;

pub(crate) fn attr(result: Result<calm_meta::Attr, MetaError>) -> Result<pb::Attr, MetaError> {
    result.map(|a| pb::Attr::from(&a))
}

pub(crate) fn done_attr(result: Result<Done, MetaError>) -> Result<pb::Attr, MetaError> {
    match result? {
        Done::Attr(a) => Ok(pb::Attr::from(&a)),
        other => Err(MetaError::Io(format!("unexpected answer {other:?}"))),
    }
}

pub(crate) fn done_empty(result: Result<Done, MetaError>) -> Result<pb::Empty, MetaError> {
    result.map(|_| pb::Empty {})
}

pub(crate) fn done_removed(
    result: Result<(Done, Option<Attr>), MetaError>,
) -> Result<pb::RemovedReply, MetaError> {
    result.map(|(done, dir)| pb::RemovedReply {
        orphan: match done {
            Done::Orphaned(handle) => handle,
            _ => 0,
        },
        dir: dir.as_ref().map(pb::Attr::from),
    })
}

/// A make's or a link's answer, with its directory's attributes when known.
pub(crate) fn done_entry(
    result: Result<(Done, Option<Attr>), MetaError>,
) -> Result<pb::Attr, MetaError> {
    let (done, dir) = result?;
    let mut attr = done_attr(Ok(done))?;
    attr.dir = dir.as_ref().map(|dir| Box::new(pb::Attr::from(dir)));
    Ok(attr)
}
