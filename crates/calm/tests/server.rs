//! The server as a user meets it: the ready line, errors with the right errno over the wire,
//! bounded and malformed requests answered with an error while the server keeps serving,
//! one server per data directory, status, and a clean stop on SIGTERM.

use crate::common;

use std::io::{Read, Write};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use calm_client::Client;
use calm_meta::{MetaError, RENAME_NOREPLACE, ROOT, XATTR_CREATE};
use common::*;

#[test]
fn serve_prints_ready_and_answers_with_the_right_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&data_dir(&tmp));
    // "ready in N ms, serving on unix:DATA/calm.sock and 127.0.0.1:PORT".
    let socket = format!("unix:{}", data_dir(&tmp).join("calm.sock").display());
    assert!(
        server.ready_line.starts_with("ready in ")
            && server
                .ready_line
                .contains(&format!(", serving on {socket} and 127.0.0.1:")),
        "{}",
        server.ready_line
    );
    assert!(server.addr.starts_with("127.0.0.1:"), "{}", server.addr);
    let rt = runtime();
    rt.block_on(async {
        let c = Client::connect(&server.addr).await.unwrap();
        let d = c.mkdir(ROOT, b"d", 0o755).await.unwrap();
        let f = c.create(d.handle, b"f", 0o644).await.unwrap();
        assert_eq!(c.lookup(d.handle, b"f").await.unwrap(), f);
        assert_eq!(
            c.create(d.handle, b"f", 0o644).await.unwrap_err(),
            MetaError::Exists
        );
        assert_eq!(c.rmdir(ROOT, b"d").await.unwrap_err(), MetaError::NotEmpty);
        assert_eq!(
            c.lookup(ROOT, &[b'x'; 256]).await.unwrap_err(),
            MetaError::NameTooLong
        );
        assert_eq!(c.create(ROOT, b"a/b", 0o644).await.unwrap_err().errno(), 22);
        c.create(ROOT, b"g", 0o644).await.unwrap();
        assert_eq!(
            c.rename(ROOT, b"g", d.handle, b"f", RENAME_NOREPLACE)
                .await
                .unwrap_err()
                .errno(),
            17
        );
        c.setxattr(f.handle, b"user.k", b"v", XATTR_CREATE)
            .await
            .unwrap();
        assert_eq!(c.getxattr(f.handle, b"user.k").await.unwrap(), b"v");
        assert_eq!(
            c.getxattr(f.handle, b"user.nope").await.unwrap_err(),
            MetaError::NoData
        );
        let entries = c.readdir(d.handle, 0, 100).await.unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(c.statfs().await.unwrap().inodes, 4);
    });
    let status = calm(&["status", "--server", &server.addr, "--json"]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["inodes"], 4);
    assert!(json["commits"].as_u64().unwrap() >= 1);
    assert!(json["request_errors"].as_u64().unwrap() >= 6);
}

/// A codec that sends and receives raw bytes, to put arbitrary payloads on the wire.
#[derive(Debug, Clone, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        Ok(Some(bytes.to_vec()))
    }
}

async fn raw_call(
    addr: &str,
    path: &'static str,
    payload: Vec<u8>,
) -> Result<Vec<u8>, tonic::Status> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(64 << 20);
    grpc.ready().await.unwrap();
    grpc.unary(
        tonic::Request::new(payload),
        http::uri::PathAndQuery::from_static(path),
        RawCodec,
    )
    .await
    .map(|r| r.into_inner())
}

/// Sends one gRPC request whose length prefix promises more bytes than follow, over a bare
/// HTTP/2 connection; returns the grpc-status the server answered with.
async fn truncated_call(addr: &str) -> Option<String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/calm.v1.Meta/Lookup"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    let mut frame = BytesMut::new();
    frame.put_u8(0); // not compressed
    frame.put_u32(1000); // promises 1000 bytes…
    frame.put_slice(&[0x08, 0x01, 0x12]); // …sends 3
    send.send_data(Bytes::from(frame), true).unwrap();
    let response = response.await.unwrap();
    let headers_status = response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_string());
    let mut body = response.into_body();
    while body.data().await.is_some() {}
    let trailers = body.trailers().await.ok().flatten();
    headers_status.or_else(|| {
        trailers.and_then(|t| {
            t.get("grpc-status")
                .map(|v| v.to_str().unwrap().to_string())
        })
    })
}

#[test]
fn garbage_truncated_and_oversized_requests_get_errors_and_the_server_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&data_dir(&tmp));
    let rt = runtime();
    rt.block_on(async {
        // Not protobuf at all.
        let status = raw_call(&server.addr, "/calm.v1.Meta/Make", vec![0xff; 64])
            .await
            .unwrap_err();
        assert_ne!(status.code(), tonic::Code::Ok);
        // A valid prefix of a message, cut in the middle of a field.
        let status = raw_call(&server.addr, "/calm.v1.Meta/Lookup", vec![0x12, 0x40, b'a'])
            .await
            .unwrap_err();
        assert_ne!(status.code(), tonic::Code::Ok);
        // Larger than MESSAGE_BYTES_MAX: refused before decoding.
        let big = vec![0u8; calm_proto::MESSAGE_BYTES_MAX + 1];
        let status = raw_call(&server.addr, "/calm.v1.Meta/Make", big)
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
        // A method that does not exist.
        let status = raw_call(&server.addr, "/calm.v1.Meta/Nope", vec![])
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        // A gRPC frame that promises more than it carries.
        let grpc_status = truncated_call(&server.addr).await;
        assert!(
            grpc_status.as_ref().is_some_and(|s| s != "0"),
            "truncated frame answered {grpc_status:?}"
        );
    });
    // Raw bytes that are not even HTTP/2.
    let mut tcp = std::net::TcpStream::connect(&server.addr).unwrap();
    tcp.write_all(b"GET / HTTP/1.0\r\n\r\n\x00\x01garbage")
        .unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut sink = Vec::new();
    let _ = tcp.read_to_end(&mut sink);
    // Still serving, and nothing half-done was left behind.
    rt.block_on(async {
        let c = Client::connect(&server.addr).await.unwrap();
        c.create(ROOT, b"after", 0o644).await.unwrap();
        assert_eq!(
            c.statfs().await.unwrap().inodes,
            2,
            "only the root and 'after'"
        );
    });
    let (status, rest) = server.terminate();
    assert!(status.success());
    assert!(rest.contains("stopped"));
    let fsck = calm(&["fsck", data_dir(&tmp).to_str().unwrap()]);
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
}

#[test]
fn a_second_server_on_the_same_data_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(&tmp);
    let _server = Server::start(&data);
    let second = calm(&[
        "serve",
        "--data",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(second.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("in use by another calm server"), "{stderr}");
}

#[test]
fn sigint_and_sigterm_stop_cleanly_and_the_data_survives() {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(&tmp);
    for (round, signal) in [libc::SIGINT, libc::SIGTERM].into_iter().enumerate() {
        let server = Server::start(&data);
        let rt = runtime();
        rt.block_on(async {
            let c = Client::connect(&server.addr).await.unwrap();
            c.create(ROOT, format!("f{round}").as_bytes(), 0o644)
                .await
                .unwrap();
            if round == 1 {
                c.lookup(ROOT, b"f0")
                    .await
                    .expect("created before the previous stop");
            }
        });
        server.signal(signal);
        let mut server = server;
        let status = server.child.wait().unwrap();
        assert!(status.success(), "exit after signal {signal}: {status}");
    }
}

#[test]
fn bad_arguments_and_missing_stores_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let fsck = calm(&["fsck", tmp.path().join("nothing").to_str().unwrap()]);
    assert_eq!(fsck.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&fsck.stderr).contains("holds no store"));
    let serve = calm(&[
        "serve",
        "--listen",
        "not-an-address",
        "--data",
        tmp.path().join("d").to_str().unwrap(),
    ]);
    assert_eq!(serve.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&serve.stderr).contains("listening on not-an-address"));
    let status = calm(&["status", "--server", "127.0.0.1:1"]);
    assert_eq!(status.status.code(), Some(2));
}

/// Every decimal argument is a finite number within its named range, or a usage error that
/// says so: no panic (exit 101), no silent default.
#[test]
fn numbers_outside_their_range_are_usage_errors_not_panics() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let data = data.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["stats", "--interval-s", "1e308"], "outside"),
        (&["stats", "--interval-s", "nan"], "not a finite number"),
        (
            &["serve", "--data", data, "--trash-hours", "1e300"],
            "outside",
        ),
        (
            &["serve", "--data", data, "--trash-hours", "nan"],
            "not a finite number",
        ),
        (&["serve", "--data", data, "--trash-hours=-1"], "outside"),
        (
            &["serve", "--data", data, "--backup-every-hours", "1e300"],
            "outside",
        ),
        (
            &["serve", "--data", data, "--backup-every-hours", "1e-9"],
            "less than a second",
        ),
        (
            &["serve", "--data", data, "--backup-every-hours", "inf"],
            "not a finite number",
        ),
        (
            &["serve", "--data", data, "--trash-min-age-s", "1e300"],
            "outside",
        ),
    ];
    for (args, says) in cases {
        let out = calm(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    assert!(
        !tmp.path().join("d").exists(),
        "a refused serve made its data directory"
    );
}

#[test]
fn a_command_whose_reader_went_away_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&data_dir(&tmp));
    // The pipe's read end is closed before the command writes to it.
    let mut child = std::process::Command::new(CALM)
        .args(["status", "--server", &server.addr])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}", out.status);
}

#[test]
fn concurrent_calls_of_one_client_travel_in_batches_each_answered_as_alone() {
    use calm_proto::pb;
    use calm_proto::pb::meta_client::MetaClient;
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&data_dir(&tmp));
    let rt = runtime();
    rt.block_on(async {
        let c = Client::connect(&server.addr).await.unwrap();
        let d = c.mkdir(ROOT, b"d", 0o755).await.unwrap();
        for i in 0..50 {
            c.create(d.handle, format!("old{i}").as_bytes(), 0o644)
                .await
                .unwrap();
        }
        // 400 calls at once on one connection: creates of new names and of names that exist,
        // lookups of names that exist and of names that do not.
        let mut tasks = Vec::new();
        for i in 0..100 {
            let c = c.clone();
            let dir = d.handle;
            tasks.push(tokio::spawn(async move {
                let new = format!("new{i}");
                let made = c.create(dir, new.as_bytes(), 0o640).await.unwrap();
                assert_eq!(made.mode & 0o777, 0o640);
                let old = format!("old{}", i % 50);
                assert_eq!(
                    c.create(dir, old.as_bytes(), 0o644).await.unwrap_err(),
                    MetaError::Exists
                );
                assert_eq!(c.lookup(dir, new.as_bytes()).await.unwrap(), made);
                assert_eq!(
                    c.lookup(dir, format!("missing{i}").as_bytes())
                        .await
                        .unwrap_err(),
                    MetaError::NotFound
                );
                made.handle
            }));
        }
        let mut handles = Vec::new();
        for task in tasks {
            handles.push(task.await.unwrap());
        }
        handles.sort_unstable();
        handles.dedup();
        assert_eq!(handles.len(), 100, "each create made a file of its own");
        assert_eq!(c.readdir(d.handle, 0, 1000).await.unwrap().len(), 150);

        // The wire: a batch past the limit is refused whole; a call naming no operation is
        // answered with an error beside the others' answers.
        let mut raw = MetaClient::connect(format!("http://{}", server.addr))
            .await
            .unwrap();
        let lookup = |name: &str| pb::Call {
            metadata: Default::default(),
            op: Some(pb::call::Op::Lookup(pb::LookupRequest {
                parent: d.handle,
                name: name.as_bytes().to_vec(),
            })),
        };
        let too_many = vec![lookup("old1"); calm_proto::batch::BATCH_CALLS_MAX + 1];
        let refused = raw
            .batch(pb::BatchRequest {
                calls: too_many,
                ordered: false,
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        let empty = pb::Call {
            metadata: Default::default(),
            op: None,
        };
        let replies = raw
            .batch(pb::BatchRequest {
                calls: vec![lookup("old1"), empty, lookup("nope")],
                ordered: false,
            })
            .await
            .unwrap()
            .into_inner()
            .replies;
        assert_eq!(replies.len(), 3);
        assert_eq!(replies[0].code, 0);
        assert!(matches!(
            replies[0].reply,
            Some(pb::call_reply::Reply::Attr(_))
        ));
        assert_eq!(replies[1].code, tonic::Code::InvalidArgument as u32);
        assert_eq!(replies[2].code, tonic::Code::NotFound as u32);
        assert_eq!(
            calm_proto::batch::response_of::<pb::Attr>(replies[2].clone())
                .map_err(|s| calm_proto::error_from_status(&s))
                .unwrap_err(),
            MetaError::NotFound
        );
    });
    let status = calm(&["status", "--server", &server.addr, "--json"]);
    assert!(status.status.success());
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let (batches, calls) = (
        json["batches"].as_u64().unwrap(),
        json["batched_calls"].as_u64().unwrap(),
    );
    // Every call of the client went in a batch (51 setup calls, 400 at once, a readdir that is
    // not batched, and the 3 raw calls); those made at once shared batches.
    assert!(calls >= 454, "{calls} calls in batches");
    assert!(batches < calls - 100, "{batches} batches for {calls} calls");
}

/// A path on this machine but on no calm mount (and not in the namespace) is said to be so by
/// every command that takes a path, not looked up as if it were the namespace's ("no such
/// file"); a path inside the namespace from its root still works.
#[test]
fn a_path_on_no_calm_mount_is_said_to_be_so() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = data_dir(&tmp);
    let server = Server::start(&data);
    let local = tmp.path().join("local");
    std::fs::create_dir(&local).expect("mkdir");
    let local = local.to_str().expect("utf-8");
    let socket = format!("unix:{}", data.join("calm.sock").display());
    for args in [
        vec!["summary", local, "--server", &socket],
        vec!["quota", "--server", &socket, "get", local],
        vec!["clone", local, "/copy", "--server", &socket],
    ] {
        let out = calm(&args);
        assert!(!out.status.success(), "{args:?}: {out:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("on no calm mount"), "{args:?}: {said}");
    }
    let rt = runtime();
    rt.block_on(async {
        let client = Client::connect(&server.addr).await.expect("connect");
        client.mkdir(ROOT, b"proj", 0o755).await.expect("mkdir");
    });
    let out = calm(&["summary", "/proj", "--server", &socket]);
    assert!(out.status.success(), "{out:?}");
    let (status, _) = server.terminate();
    assert!(status.success());
}
