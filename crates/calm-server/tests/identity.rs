//! A request id belongs to the identity that sent it: a user who learned another client's id
//! and sends a request under it first makes only its own change, and the other client's
//! request with that id is still applied (not answered with the user's result).

use std::sync::Arc;

use calm_meta::{Meta, MetaOptions, ROOT};
use calm_proto::changelog::{GID_KEY, SESSION_KEY, UID_KEY};
use calm_proto::pb::{self, meta_server::Meta as _};
use calm_server::listen::Peer;
use calm_store::mem::MemStore;

/// A create of `name` in the root, from `peer`, sent with request id `id`.
fn create(name: &str, peer: Peer, uid: u32, id: &str) -> tonic::Request<pb::MakeRequest> {
    let mut request = tonic::Request::new(pb::MakeRequest {
        parent: ROOT,
        name: name.as_bytes().to_vec(),
        kind: calm_meta::Kind::File as u32,
        mode: 0o644,
        uid,
        gid: uid,
        exclusive: true,
        ..pb::MakeRequest::default()
    });
    request.extensions_mut().insert(peer);
    let metadata = request.metadata_mut();
    metadata.insert(calm_proto::REQUEST_KEY, id.parse().unwrap());
    metadata.insert(UID_KEY, uid.to_string().parse().unwrap());
    metadata.insert(GID_KEY, uid.to_string().parse().unwrap());
    metadata.insert(SESSION_KEY, "0".parse().unwrap());
    request
}

fn user(uid: u32) -> Peer {
    Peer::Local {
        uid,
        gid: uid,
        pid: 1,
        groups: calm_meta::Groups::default(),
    }
}

#[tokio::test]
async fn a_request_id_sent_first_by_another_identity_takes_nothing_from_its_client() {
    let meta = Arc::new(Meta::open(Arc::new(MemStore::new()), MetaOptions::default()).unwrap());
    // The root directory is open to everyone, so that the user may create in it.
    meta.setattr(
        ROOT,
        calm_meta::SetAttr {
            mode: Some(0o1777),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let info = calm_server::ServerInfo::plain();
    let server = calm_server::Server::start(meta.clone(), info).await;
    let service = server.meta_service();
    // The client's id, as a user who watched the other client might have learned it.
    let id = "5eed:1:0";
    let intruder = service
        .make(create("intruders", user(1000), 1000, id))
        .await
        .expect("the user's own create")
        .into_inner();
    let owner = service
        .make(create("owners", Peer::LoopbackRoot, 0, id))
        .await
        .expect("the client's create")
        .into_inner();
    assert_ne!(
        owner.handle, intruder.handle,
        "answered with the user's file"
    );
    assert_eq!(meta.lookup(ROOT, b"owners").unwrap().uid, 0);
    assert_eq!(meta.lookup(ROOT, b"intruders").unwrap().uid, 1000);
    // The same identity sending its request again is answered as the first time, not
    // applied twice (a create would now say EEXIST).
    let again = service
        .make(create("owners", Peer::LoopbackRoot, 0, id))
        .await
        .expect("the same request again")
        .into_inner();
    assert_eq!(again.handle, owner.handle);
    let again = service
        .make(create("intruders", user(1000), 1000, id))
        .await
        .expect("the user's request again")
        .into_inner();
    assert_eq!(again.handle, intruder.handle);
}
