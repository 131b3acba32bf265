//! Batches of namespace calls (`Meta.Batch`): how one call's request metadata, reply and status
//! travel inside a batch, so that each call is answered exactly as it would have been alone.

use std::collections::HashMap;

use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, KeyAndValueRef, MetadataMap};
use tonic::{Code, Response, Status};

use crate::pb::call_reply::Reply;
use crate::{ERROR_CODE_KEY, INDEX_KEY, pb};

/// Most calls in one batch; the server refuses a larger one.
pub const BATCH_CALLS_MAX: usize = 64;

/// Encoded bytes past which a client stops adding calls to a batch (one call may exceed it
/// alone; a batch then holds that call only). Well under [`crate::MESSAGE_BYTES_MAX`].
pub const BATCH_BYTES_MAX: usize = 1 << 20;

/// The reply types a batched call may have.
pub trait Replied: Sized {
    fn wrap(self) -> Reply;
    fn unwrap(reply: Reply) -> Option<Self>;
}

macro_rules! replied {
    ($type:ty, $variant:ident) => {
        impl Replied for $type {
            fn wrap(self) -> Reply {
                Reply::$variant(self)
            }
            fn unwrap(reply: Reply) -> Option<Self> {
                match reply {
                    Reply::$variant(inner) => Some(inner),
                    _ => None,
                }
            }
        }
    };
}

replied!(pb::Attr, Attr);
replied!(pb::RemovedReply, Removed);
replied!(pb::Empty, Empty);
replied!(pb::ReadMapReply, Map);

/// The ASCII entries of a request's metadata, as a call carries them.
pub fn metadata_of(metadata: &MetadataMap) -> HashMap<String, String> {
    metadata
        .iter()
        .filter_map(|entry| match entry {
            KeyAndValueRef::Ascii(key, value) => value
                .to_str()
                .ok()
                .map(|value| (key.as_str().to_string(), value.to_string())),
            KeyAndValueRef::Binary(..) => None,
        })
        .collect()
}

/// Puts a call's metadata into the request the server makes of it; an entry that is not valid
/// metadata is refused, as it would have been on a request of its own.
pub fn metadata_into(
    entries: HashMap<String, String>,
    metadata: &mut MetadataMap,
) -> Result<(), Status> {
    for (key, value) in entries {
        let bad = || Status::invalid_argument(format!("call metadata {key:?} is not valid"));
        let name = AsciiMetadataKey::from_bytes(key.as_bytes()).map_err(|_| bad())?;
        let value = AsciiMetadataValue::try_from(value.as_str()).map_err(|_| bad())?;
        metadata.insert(name, value);
    }
    Ok(())
}

fn number<T: std::str::FromStr + Default>(metadata: &MetadataMap, key: &str) -> T {
    metadata
        .get(key)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_default()
}

/// The calm error code a failed call's status carries (0: none, a refusal without one).
pub fn calm_code(status: &Status) -> u32 {
    number(status.metadata(), ERROR_CODE_KEY)
}

/// What the server sends back for one call: its reply with the `calm-index` it answered
/// with, or its status with the `calm-code`.
pub fn call_reply<T: Replied>(result: Result<Response<T>, Status>) -> pb::CallReply {
    match result {
        Ok(response) => pb::CallReply {
            index: number(response.metadata(), INDEX_KEY),
            reply: Some(response.into_inner().wrap()),
            ..pb::CallReply::default()
        },
        Err(status) => failed_reply(&status),
    }
}

/// A failed call's reply.
pub fn failed_reply(status: &Status) -> pb::CallReply {
    pb::CallReply {
        code: status.code() as u32,
        message: status.message().to_string(),
        calm_code: calm_code(status),
        ..pb::CallReply::default()
    }
}

/// The answer a call would have had alone, from its reply in a batch.
pub fn response_of<T: Replied>(reply: pb::CallReply) -> Result<Response<T>, Status> {
    if reply.code != Code::Ok as u32 {
        let mut metadata = MetadataMap::new();
        if reply.calm_code != 0 {
            metadata.insert(ERROR_CODE_KEY, AsciiMetadataValue::from(reply.calm_code));
        }
        return Err(Status::with_metadata(
            Code::from(reply.code as i32),
            reply.message,
            metadata,
        ));
    }
    let Some(inner) = reply.reply.and_then(T::unwrap) else {
        return Err(Status::internal(
            "a batched call was answered with another reply type",
        ));
    };
    let mut response = Response::new(inner);
    if reply.index != 0 {
        response
            .metadata_mut()
            .insert(INDEX_KEY, AsciiMetadataValue::from(reply.index));
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use calm_types::MetaError;

    #[test]
    fn a_reply_and_its_index_come_back_as_they_went() {
        let attr = pb::Attr {
            handle: 7,
            size: 4096,
            ..pb::Attr::default()
        };
        let mut response = Response::new(attr.clone());
        response
            .metadata_mut()
            .insert(INDEX_KEY, AsciiMetadataValue::from(42u64));
        let back = response_of::<pb::Attr>(call_reply(Ok(response))).expect("a reply");
        assert_eq!(back.get_ref(), &attr);
        assert_eq!(number::<u64>(back.metadata(), INDEX_KEY), 42);
    }

    #[test]
    fn an_error_comes_back_as_the_same_error() {
        for error in [
            MetaError::NotFound,
            MetaError::Exists,
            MetaError::Access("no search permission".into()),
            MetaError::Invalid("name too long".into()),
        ] {
            let status = crate::status_from_error(&error);
            let back = response_of::<pb::Attr>(call_reply::<pb::Attr>(Err(status.clone())))
                .expect_err("an error");
            assert_eq!(back.code(), status.code());
            assert_eq!(crate::error_from_status(&back), error);
        }
        // A status without a calm code (refused by the server) stays one.
        let refused = Status::permission_denied("not a mount");
        let back = response_of::<pb::Empty>(failed_reply(&refused)).expect_err("an error");
        assert_eq!(back.code(), Code::PermissionDenied);
        assert_eq!(back.message(), "not a mount");
        assert!(back.metadata().get(ERROR_CODE_KEY).is_none());
    }

    #[test]
    fn a_reply_of_another_type_is_an_error_not_a_panic() {
        let reply = call_reply(Ok(Response::new(pb::Empty {})));
        let back = response_of::<pb::Attr>(reply).expect_err("wrong type");
        assert_eq!(back.code(), Code::Internal);
        let none = response_of::<pb::Attr>(pb::CallReply::default()).expect_err("no reply");
        assert_eq!(none.code(), Code::Internal);
    }

    #[test]
    fn metadata_travels_and_bad_metadata_is_refused() {
        let mut sent = MetadataMap::new();
        sent.insert("calm-uid", AsciiMetadataValue::from(1000u32));
        sent.insert("calm-groups", "4,24,27".parse().expect("ascii"));
        let mut received = MetadataMap::new();
        metadata_into(metadata_of(&sent), &mut received).expect("valid");
        assert_eq!(received.get("calm-uid"), sent.get("calm-uid"));
        assert_eq!(received.get("calm-groups"), sent.get("calm-groups"));
        let bad = HashMap::from([("not a key".to_string(), "1".to_string())]);
        assert!(metadata_into(bad, &mut MetadataMap::new()).is_err());
        let bad = HashMap::from([("calm-uid".to_string(), "line\nbreak".to_string())]);
        assert!(metadata_into(bad, &mut MetadataMap::new()).is_err());
    }
}
