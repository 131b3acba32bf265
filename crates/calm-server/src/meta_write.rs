//! A write and a change of the written file's attributes in one request (`WriteRequest`'s
//! `set_attr`): the close of a file whose mode, owner or times the mount answered itself
//! sends its bytes and those changes together, and they are applied in one group of the
//! namespace's commits instead of two requests each waiting for its own.

use calm_meta::MetaError;
use calm_meta::ops::{Done, Op};
use calm_proto::pb;
use calm_store::Store;
use tonic::Status;

use crate::MetaService;

/// The change a write carries, checked: of the written file, with no size and no release of
/// a hold (what gives a hold back answers for it alone).
pub(crate) fn change_after_write(
    handle: u64,
    change: Option<pb::SetAttrRequest>,
) -> Result<Option<Op>, Status> {
    let Some(change) = change else {
        return Ok(None);
    };
    if change.handle != handle || change.size.is_some() {
        return Err(Status::invalid_argument(
            "a write's change of attributes is of the written file, with no size",
        ));
    }
    if change.release_hold {
        return Err(Status::invalid_argument(
            "a write's change of attributes gives no hold back",
        ));
    }
    Ok(Some(Op::SetAttr {
        handle,
        attr: calm_proto::setattr_from_wire(&change),
    }))
}

impl<S: Store> MetaService<S> {
    /// Applies the write `op` and then `then`, if any: the answer is the file after both, or
    /// the write's own where `then` was refused (or the write was).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn write_then_change(
        &self,
        caller: calm_meta::Caller,
        op: Op,
        id: Option<calm_meta::requests::RequestId>,
        handle: u64,
        adding: usize,
        chunks: Vec<u64>,
        then: Option<Op>,
    ) -> Result<Done, MetaError> {
        let Some(then) = then else {
            return self
                .apply_with_room(caller, op, id, handle, adding, |_| chunks.clone())
                .await;
        };
        let (written, changed) = self
            .meta
            .apply_pair(caller.clone(), op.clone(), id, then)
            .await;
        let written = match written {
            // The chunk is full: the write goes again once compaction made room. The change,
            // applied already, came before it: the answer is the write's, which does not show
            // the change (its times are the write's), so the caller sends the change again.
            Err(MetaError::Busy(_)) => {
                return self
                    .apply_with_room(caller, op, id, handle, adding, |_| chunks.clone())
                    .await;
            }
            written => {
                if let (Ok(_), Some(data)) = (&written, &self.data) {
                    data.compactor.written(&self.meta, handle, &chunks);
                }
                written
            }
        };
        match (written, changed) {
            (Ok(_), Ok(changed)) => Ok(changed),
            (written, _) => written,
        }
    }
}
