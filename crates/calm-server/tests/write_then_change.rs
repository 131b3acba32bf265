//! A write that carries a change of the written file's attributes (`WriteRequest.set_attr`,
//! what a mount sends at the close of a small file whose mode, owner and times it answered
//! itself): both are applied, in that order; a change that names another file, a size or the
//! release of a hold is refused with nothing applied; a change the caller may not make leaves
//! the write applied and the attributes as they were, and the answer shows it.

use std::sync::Arc;

use calm_meta::slices::{INLINE, Slice};
use calm_meta::{Meta, MetaOptions, ROOT};
use calm_proto::pb;
use calm_store::mem::MemStore;

struct Fixture {
    meta: Arc<Meta<Arc<MemStore>>>,
    service: Arc<dyn pb::meta_server::Meta<HoldsStream = calm_server::holds::RecallStream>>,
    _server: calm_server::Server<Arc<MemStore>>,
}

async fn fixture() -> Fixture {
    let meta = Arc::new(Meta::open(Arc::new(MemStore::new()), MetaOptions::default()).unwrap());
    let server = calm_server::Server::start(meta.clone(), calm_server::ServerInfo::plain()).await;
    Fixture {
        service: server.meta_service(),
        meta,
        _server: server,
    }
}

/// A request as a client in the server's own process sends it, for `uid`.
fn local<T>(message: T, uid: u32) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.extensions_mut().insert(calm_proto::InProcess);
    for key in ["calm-uid", "calm-gid"] {
        request.metadata_mut().insert(key, uid.into());
    }
    request
}

impl Fixture {
    /// `data` written at the start of `file` inline, with `change`.
    async fn write(
        &self,
        file: u64,
        data: &[u8],
        change: Option<pb::SetAttrRequest>,
        uid: u32,
    ) -> Result<pb::Attr, tonic::Status> {
        let id = self.meta.alloc_slices(1).await.unwrap() | INLINE;
        let len = data.len() as u32;
        let slice = Slice {
            id,
            size: len,
            off: 0,
            len,
            pos: 0,
        };
        let request = pb::WriteRequest {
            handle: file,
            records: vec![calm_proto::slice_to_wire(0, &slice)],
            end: 0,
            inline: vec![pb::InlineBytes {
                id,
                data: data.to_vec(),
            }],
            set_attr: change,
        };
        self.service
            .write(local(request, uid))
            .await
            .map(|r| r.into_inner())
    }
}

fn at(ns: i64) -> Option<pb::TimeSet> {
    Some(pb::TimeSet { now: false, ns })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_and_its_change_are_applied_together() {
    let f = fixture().await;
    let file = f.meta.create(ROOT, b"f", 0o644).await.unwrap().handle;
    let change = pb::SetAttrRequest {
        handle: file,
        mode: Some(0o600),
        uid: Some(7),
        gid: Some(8),
        mtime: at(1_234_000_000),
        atime: at(5_678_000_000),
        ..Default::default()
    };
    let answer = f.write(file, b"hello", Some(change), 0).await.unwrap();
    let kept = f.meta.getattr(file).unwrap();
    for attr in [
        (answer.size, answer.mode & 0o7777, answer.uid, answer.gid),
        (kept.size, kept.mode & 0o7777, kept.uid, kept.gid),
    ] {
        assert_eq!(attr, (5, 0o600, 7, 8));
    }
    // The change came after the write: its times stand, not the write's.
    assert_eq!(
        (answer.mtime_ns, answer.atime_ns),
        (1_234_000_000, 5_678_000_000)
    );
    assert_eq!(
        (kept.mtime_ns, kept.atime_ns),
        (1_234_000_000, 5_678_000_000)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_another_file_a_size_or_a_release_is_refused_with_nothing_applied() {
    let f = fixture().await;
    let file = f.meta.create(ROOT, b"f", 0o644).await.unwrap().handle;
    let other = f.meta.create(ROOT, b"g", 0o644).await.unwrap().handle;
    let wrong = [
        pb::SetAttrRequest {
            handle: other,
            mode: Some(0o600),
            ..Default::default()
        },
        pb::SetAttrRequest {
            handle: file,
            size: Some(1),
            ..Default::default()
        },
        pb::SetAttrRequest {
            handle: file,
            mode: Some(0o600),
            release_hold: true,
            ..Default::default()
        },
    ];
    for change in wrong {
        let refused = f.write(file, b"hello", Some(change), 0).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        for handle in [file, other] {
            let attr = f.meta.getattr(handle).unwrap();
            assert_eq!((attr.size, attr.mode & 0o7777), (0, 0o644));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_the_caller_may_not_make_leaves_the_write_and_shows_in_the_answer() {
    let f = fixture().await;
    let file = f.meta.create(ROOT, b"f", 0o666).await.unwrap().handle;
    // Anyone may write the file; only its owner may chmod it, only the superuser chown it.
    for change in [
        pb::SetAttrRequest {
            handle: file,
            mode: Some(0o600),
            ..Default::default()
        },
        pb::SetAttrRequest {
            handle: file,
            uid: Some(1000),
            ..Default::default()
        },
    ] {
        let answer = f.write(file, b"hello", Some(change), 1000).await.unwrap();
        let kept = f.meta.getattr(file).unwrap();
        for attr in [
            (answer.size, answer.mode & 0o7777, answer.uid),
            (kept.size, kept.mode & 0o7777, kept.uid),
        ] {
            assert_eq!(attr, (5, 0o666, 0));
        }
    }
}
