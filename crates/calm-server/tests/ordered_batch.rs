//! What a mount that holds a directory sends: handles granted to its client in advance
//! (`Meta.GrantHandles`), used by makes it answered itself, sent in an ordered batch
//! (`BatchRequest.ordered`). The batch's calls are applied in their order (a make then a
//! removal of the same name, a mkdir then a make in it) and each answers for itself; a handle
//! granted to one client is refused to another, and to the same client twice; a make with a
//! granted handle and no request id is refused; only makes, unlinks and rmdirs are taken.

use std::collections::HashMap;
use std::sync::Arc;

use calm_meta::{Meta, MetaOptions, ROOT};
use calm_proto::pb;
use calm_proto::pb::meta_server::Meta as _;
use calm_store::mem::MemStore;

async fn server() -> (Arc<Meta<Arc<MemStore>>>, calm_server::Server<Arc<MemStore>>) {
    let meta = Arc::new(Meta::open(Arc::new(MemStore::new()), MetaOptions::default()).unwrap());
    let server = calm_server::Server::start(meta.clone(), calm_server::ServerInfo::plain()).await;
    (meta, server)
}

/// Metadata of a call by `client`'s mount, request number `seq`, as root (none of its
/// requests acknowledged: all in flight, as a batch's are until it is answered).
fn metadata(client: u64, seq: u64) -> HashMap<String, String> {
    let id = calm_types::RequestId {
        client,
        seq,
        acked: 0,
    };
    HashMap::from([
        ("calm-uid".into(), "0".into()),
        ("calm-gid".into(), "0".into()),
        (calm_proto::REQUEST_KEY.into(), id.to_text()),
    ])
}

fn make(client: u64, seq: u64, parent: u64, name: &str, kind: u32, handle: u64) -> pb::Call {
    pb::Call {
        metadata: metadata(client, seq),
        op: Some(pb::call::Op::Make(pb::MakeRequest {
            parent,
            name: name.into(),
            kind,
            mode: 0o755,
            exclusive: true,
            handle,
            ..Default::default()
        })),
    }
}

fn unlink(client: u64, seq: u64, parent: u64, name: &str) -> pb::Call {
    pb::Call {
        metadata: metadata(client, seq),
        op: Some(pb::call::Op::Unlink(pb::RemoveRequest {
            parent,
            name: name.into(),
            keep: Vec::new(),
            time_ns: 0,
        })),
    }
}

fn local<T>(message: T, client: u64, seq: u64) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.extensions_mut().insert(calm_proto::InProcess);
    calm_proto::batch::metadata_into(metadata(client, seq), request.metadata_mut()).unwrap();
    request
}

#[tokio::test]
async fn an_ordered_batch_applies_its_calls_in_order_with_the_handles_granted_to_its_client() {
    let (meta, server) = server().await;
    let service = server.meta_service();
    let (a, b) = (11, 12);
    let grant = pb::GrantRequest { count: 4 };
    let first = service
        .grant_handles(local(grant, a, 1))
        .await
        .unwrap()
        .into_inner()
        .first;
    let (file, dir) = (calm_types::Kind::File as u32, calm_types::Kind::Dir as u32);
    let calls = vec![
        make(a, 2, ROOT, "d", dir, first),
        make(a, 3, first, "f", file, first + 1),
        unlink(a, 4, first, "f"),
        make(a, 5, first, "f", file, first + 2),
        // Another client with a's handle; a with a handle it used.
        make(b, 1, first, "g", file, first + 3),
        make(a, 6, first, "h", file, first + 1),
        // A lookup has no place in an ordered batch.
        pb::Call {
            metadata: metadata(a, 7),
            op: Some(pb::call::Op::Lookup(pb::LookupRequest {
                parent: ROOT,
                name: b"d".to_vec(),
            })),
        },
    ];
    let request = pb::BatchRequest {
        calls,
        ordered: true,
    };
    let replies = service
        .batch(local(request.clone(), a, 8))
        .await
        .unwrap()
        .into_inner()
        .replies;
    let codes: Vec<u32> = replies.iter().map(|r| r.code).collect();
    let (refused, invalid) = (
        tonic::Code::FailedPrecondition as u32,
        tonic::Code::InvalidArgument as u32,
    );
    assert_eq!(codes, vec![0, 0, 0, 0, refused, refused, invalid]);
    // In order: f made, removed and made again, with the later handle.
    assert_eq!(meta.lookup(ROOT, b"d").unwrap().handle, first);
    assert_eq!(meta.lookup(first, b"f").unwrap().handle, first + 2);
    assert!(meta.lookup(first, b"g").is_err() && meta.lookup(first, b"h").is_err());
    // Sent again (a lost connection): each call answers from its record, applied once (the
    // make of the f removed since answers that its node is gone).
    let again = service
        .batch(local(request, a, 8))
        .await
        .unwrap()
        .into_inner()
        .replies;
    let codes: Vec<u32> = again.iter().take(4).map(|r| r.code).collect();
    assert_eq!(codes, vec![0, tonic::Code::NotFound as u32, 0, 0]);
    assert_eq!(meta.lookup(ROOT, b"d").unwrap().handle, first);
    assert_eq!(meta.lookup(first, b"f").unwrap().handle, first + 2);
    let names = meta.readdir(first, 0, 100).unwrap();
    assert_eq!(names.len(), 1, "{names:?}");
    // The last granted handle, by its client: the grant is used up. Made at the time the
    // mount says it answered it: the node's times and its directory's are that.
    let mut answered = make(a, 9, first, "k", file, first + 3);
    let at = 1_234_567_890_123_456_789;
    if let Some(pb::call::Op::Make(m)) = &mut answered.op {
        m.time_ns = at;
    }
    let last = service
        .batch(local(
            pb::BatchRequest {
                calls: vec![answered],
                ordered: true,
            },
            a,
            10,
        ))
        .await
        .unwrap()
        .into_inner()
        .replies;
    assert_eq!(last[0].code, 0);
    let k = meta.lookup(first, b"k").unwrap();
    let d = meta.getattr(first).unwrap();
    assert_eq!(
        (k.mtime_ns, k.ctime_ns, d.mtime_ns, d.ctime_ns),
        (at, at, at, at)
    );
    // A make naming a handle without a request id is refused.
    let mut no_id = local(
        pb::MakeRequest {
            parent: ROOT,
            name: b"x".to_vec(),
            kind: file,
            mode: 0o644,
            exclusive: true,
            handle: first + 5,
            ..Default::default()
        },
        a,
        11,
    );
    no_id.metadata_mut().remove(calm_proto::REQUEST_KEY);
    let refused = service.make(no_id).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
}
