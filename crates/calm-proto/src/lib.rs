//! `calm-proto`: the wire. The generated gRPC code for proto/calm.proto, and the conversions
//! between wire messages and the namespace's types, including errors: a [`MetaError`] crosses
//! the wire as a gRPC status carrying its stable code in the `calm-code` metadata entry, so the
//! far side gets back the very same error (and errno).
//!
//! It knows no sockets and no store: both sides (calm-server, calm-client) do their own I/O.

use calm_types::{Attr, DirEntry, Kind, MetaError, NewNode, SetAttr, SetTime};

pub mod batch;
pub mod changelog;
pub mod locks;
pub mod quota;
pub mod targets;

/// The generated messages, client and server.
#[allow(missing_debug_implementations, clippy::all)]
pub mod pb {
    tonic::include_proto!("calm.v1");
}

/// Every method of the protocol, as `package.Service/Method` (a request's path without its
/// first `/`).
pub mod methods {
    include!(concat!(env!("OUT_DIR"), "/methods.rs"));
}

/// Largest gRPC message either side accepts, in bytes. The largest legitimate request is a
/// setxattr of 64 KiB; a readdir reply of 4096 entries of 255-byte names is about 1.1 MiB.
pub const MESSAGE_BYTES_MAX: usize = 4 << 20;

/// The metadata key holding a [`MetaError`] code.
pub const ERROR_CODE_KEY: &str = "calm-code";

/// Response metadata of a mutation: the changelog index reached when it committed (at least the
/// index of its own record).
pub const INDEX_KEY: &str = "calm-index";
/// Request metadata: a mutation's request id, `CLIENT:SEQ:ACKED` in hex (the client's random
/// id, the mutation's number, and the number up to which the client has every answer): a
/// server applies a mutation at most once, however often it is sent.
pub const REQUEST_KEY: &str = "calm-request";

/// `Attr.held`: the caller's session holds the file's mode and times (`Meta.Holds`).
pub const HOLD_MODE_TIMES: u32 = 1;
/// `Attr.held`: the caller's session holds the file's owner too.
pub const HOLD_OWNER: u32 = 2;
/// `Attr.held`: the caller's session holds the directory's names: it may answer makes and
/// removals in it itself, with handles granted in advance, and send them after in order.
pub const HOLD_NAMES: u32 = 4;

/// Marks a request made by a client in the server's own process (an embedded mount): set in
/// the request's extensions, which never cross the wire, so no remote client can claim it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InProcess;

/// The gRPC status standing for `error`.
pub fn status_from_error(error: &MetaError) -> tonic::Status {
    use tonic::Code;
    let code = match error {
        MetaError::NotFound | MetaError::NoData | MetaError::Stale => Code::NotFound,
        MetaError::Exists => Code::AlreadyExists,
        MetaError::NoSpace(_) | MetaError::TooManyLinks | MetaError::FileTooBig => {
            Code::ResourceExhausted
        }
        MetaError::Io(_) => Code::Unavailable,
        MetaError::Corrupt(_) => Code::DataLoss,
        MetaError::ReadOnly(_) | MetaError::NotPermitted(_) | MetaError::Access(_) => {
            Code::PermissionDenied
        }
        MetaError::Busy(_) => Code::Aborted,
        _ => Code::FailedPrecondition,
    };
    let mut metadata = tonic::metadata::MetadataMap::new();
    metadata.insert(
        ERROR_CODE_KEY,
        error
            .code()
            .to_string()
            .parse()
            .expect("digits are valid metadata"),
    );
    tonic::Status::with_metadata(code, error.detail().to_string(), metadata)
}

/// The [`MetaError`] a status stands for. A status without a calm code (transport failure,
/// a message the server refused to decode, a deadline) becomes [`MetaError::Io`] with the
/// status text, so the caller sees why.
pub fn error_from_status(status: &tonic::Status) -> MetaError {
    status
        .metadata()
        .get(ERROR_CODE_KEY)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok())
        .and_then(|code| MetaError::from_code(code, status.message()))
        .unwrap_or_else(|| match status.code() {
            // The server refused the client itself (who it is, or what it may call).
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                MetaError::NotPermitted(status.message().to_string())
            }
            code => MetaError::Io(format!("{code:?}: {}", status.message())),
        })
}

fn kind_from_wire(kind: u32) -> Result<Kind, MetaError> {
    u8::try_from(kind)
        .ok()
        .and_then(Kind::from_u8)
        .ok_or_else(|| MetaError::Invalid(format!("unknown inode kind {kind}")))
}

impl From<&Attr> for pb::Attr {
    fn from(a: &Attr) -> Self {
        pb::Attr {
            handle: a.handle,
            generation: a.generation,
            kind: a.kind as u32,
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            size: a.size,
            rdev: a.rdev,
            atime_ns: a.atime_ns,
            mtime_ns: a.mtime_ns,
            ctime_ns: a.ctime_ns,
            dir: None,
            held: 0,
            held_room: 0,
        }
    }
}

impl TryFrom<pb::Attr> for Attr {
    type Error = MetaError;
    fn try_from(a: pb::Attr) -> Result<Self, MetaError> {
        Ok(Attr {
            handle: a.handle,
            generation: a.generation,
            kind: kind_from_wire(a.kind)?,
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            size: a.size,
            rdev: a.rdev,
            atime_ns: a.atime_ns,
            mtime_ns: a.mtime_ns,
            ctime_ns: a.ctime_ns,
        })
    }
}

/// A make's or a link's answer: the new name's attributes, and its directory's when the server
/// sent them.
pub fn entry_from_wire(mut reply: pb::Attr) -> Result<(Attr, Option<Attr>), MetaError> {
    let dir = reply
        .dir
        .take()
        .map(|dir| Attr::try_from(*dir))
        .transpose()?;
    Ok((reply.try_into()?, dir))
}

impl From<&DirEntry> for pb::DirEntry {
    fn from(e: &DirEntry) -> Self {
        pb::DirEntry {
            name: e.name.clone(),
            handle: e.handle,
            kind: e.kind as u32,
            cookie: e.cookie,
            attr: None,
        }
    }
}

impl TryFrom<pb::DirEntry> for DirEntry {
    type Error = MetaError;
    fn try_from(e: pb::DirEntry) -> Result<Self, MetaError> {
        Ok(DirEntry {
            name: e.name,
            handle: e.handle,
            kind: kind_from_wire(e.kind)?,
            cookie: e.cookie,
        })
    }
}

/// The node a make request asks for.
pub fn node_from_request(r: &pb::MakeRequest) -> Result<NewNode, MetaError> {
    Ok(NewNode {
        kind: kind_from_wire(r.kind)?,
        mode: r.mode,
        uid: r.uid,
        gid: r.gid,
        rdev: r.rdev,
        target: r.target.clone(),
        mode_before_umask: r.mode_before_umask,
        // The client a grant belongs to, and the quota share, are the server's to say
        // (`calm-server`).
        granted: None,
        share: calm_types::Share::None,
    })
}

fn time_to_wire(t: Option<SetTime>) -> Option<pb::TimeSet> {
    t.map(|t| match t {
        SetTime::Now => pb::TimeSet { now: true, ns: 0 },
        SetTime::At(ns) => pb::TimeSet { now: false, ns },
    })
}

fn time_from_wire(t: Option<pb::TimeSet>) -> Option<SetTime> {
    t.map(|t| {
        if t.now {
            SetTime::Now
        } else {
            SetTime::At(t.ns)
        }
    })
}

pub fn setattr_to_wire(handle: u64, s: &SetAttr) -> pb::SetAttrRequest {
    pb::SetAttrRequest {
        handle,
        mode: s.mode,
        uid: s.uid,
        gid: s.gid,
        size: s.size,
        atime: time_to_wire(s.atime),
        mtime: time_to_wire(s.mtime),
        ctime_ns: s.ctime,
        release_hold: false,
    }
}

pub fn setattr_from_wire(r: &pb::SetAttrRequest) -> SetAttr {
    SetAttr {
        mode: r.mode,
        uid: r.uid,
        gid: r.gid,
        size: r.size,
        atime: time_from_wire(r.atime),
        mtime: time_from_wire(r.mtime),
        ctime: r.ctime_ns,
    }
}

/// A slice record on the wire.
pub fn slice_to_wire(chunk: u64, s: &calm_types::slices::Slice) -> pb::SliceRecord {
    pb::SliceRecord {
        chunk,
        id: s.id,
        size: s.size,
        off: s.off,
        len: s.len,
        pos: s.pos,
    }
}

/// A slice record from the wire (checked by the namespace when it is applied).
pub fn slice_from_wire(r: &pb::SliceRecord) -> (u64, calm_types::slices::Slice) {
    (
        r.chunk,
        calm_types::slices::Slice {
            id: r.id,
            size: r.size,
            off: r.off,
            len: r.len,
            pos: r.pos,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_survives_the_wire() {
        for (code, errno, name) in calm_types::error::CODES {
            let error = MetaError::from_code(*code, "some detail").unwrap();
            let back = error_from_status(&status_from_error(&error));
            assert_eq!(back, error, "{name}");
            assert_eq!(back.errno(), *errno);
        }
        let foreign = tonic::Status::internal("boom");
        assert!(matches!(error_from_status(&foreign), MetaError::Io(m) if m.contains("boom")));
    }

    #[test]
    fn setattr_round_trips() {
        let s = SetAttr {
            mode: Some(0o600),
            size: Some(7),
            atime: Some(SetTime::Now),
            mtime: Some(SetTime::At(-3)),
            ..SetAttr::default()
        };
        assert_eq!(setattr_from_wire(&setattr_to_wire(9, &s)), s);
    }
}
