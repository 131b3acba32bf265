//! The changelog through the real server and CLI: register, records carrying the caller's
//! session and ids, users, clear, follow (a long poll that prints a record as soon as it is
//! committed), and kill -9 during creates from several clients: every acknowledged create has
//! exactly one record, every record its file, indices without gaps — with the records in the
//! record log's segment files (the default, write-ahead log) and as B-tree keys (`--no-wal`).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use calm_client::Client;
use calm_meta::{Caller, Handle, ROOT};
use common::*;

fn stdout(args: &[&str]) -> String {
    let out = calm(args);
    assert!(
        out.status.success(),
        "calm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `calm changelog read --follow --json` on `addr` with `args`, and the lines it prints.
fn follower(
    addr: &str,
    args: &[&str],
) -> (
    std::process::Child,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let mut child = Command::new(CALM)
        .args(["changelog", "read", "--server", addr, "--follow", "--json"])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn register_read_clear_and_follow_with_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&data_dir(&tmp));
    let addr = server.addr.as_str();
    let id = stdout(&[
        "changelog",
        "register",
        "--server",
        addr,
        "--name",
        "backup",
        "--mask",
        "CREAT,UNLNK",
    ]);
    assert_eq!(id.trim(), "cl1");
    let rt = runtime();
    rt.block_on(async {
        let c = Client::connect(addr).await.unwrap();
        // uid 1000 makes names in the root below: the root is open to everyone.
        let open = calm_meta::SetAttr {
            mode: Some(0o777),
            ..Default::default()
        };
        c.setattr(ROOT, &open).await.unwrap();
        let c = c.with_caller(Caller {
            session: 5,
            uid: 1000,
            gid: 100,
            ..Caller::default()
        });
        c.mkdir(ROOT, b"d", 0o755).await.unwrap();
        c.create(ROOT, b"a", 0o644).await.unwrap();
        c.create(ROOT, b"b", 0o644).await.unwrap();
        c.unlink(ROOT, b"a").await.unwrap();
    });
    let records = json_lines(&stdout(&[
        "changelog",
        "read",
        "--server",
        addr,
        "--user",
        "cl1",
        "--json",
    ]));
    let summary: Vec<(u64, String, String)> = records
        .iter()
        .map(|r| {
            (
                r["index"].as_u64().unwrap(),
                r["type"].as_str().unwrap().to_string(),
                r["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (1, "CREAT".into(), "a".into()),
            (2, "CREAT".into(), "b".into()),
            (3, "UNLNK".into(), "a".into())
        ],
        "MKDIR is in no mask: not written"
    );
    assert_eq!(
        (records[0]["session"].as_u64(), records[0]["uid"].as_u64()),
        (Some(5), Some(1000))
    );
    assert_eq!(records[2]["flags"], 1, "last link");
    let text = stdout(&["changelog", "read", "--server", addr]);
    assert!(
        text.lines().next().unwrap().starts_with("1 01CREAT "),
        "{text}"
    );

    let users: serde_json::Value =
        serde_json::from_str(&stdout(&["changelog", "users", "--server", addr, "--json"])).unwrap();
    assert_eq!(users["current_index"], 3);
    assert_eq!(users["users"][0]["id"], "cl1");
    assert_eq!(users["users"][0]["cleared"], 0);
    let status: serde_json::Value =
        serde_json::from_str(&stdout(&["status", "--server", addr, "--json"])).unwrap();
    assert_eq!(
        (
            status["changelog_last"].as_u64(),
            status["changelog_readers"].as_u64()
        ),
        (Some(3), Some(1))
    );
    assert_eq!(status["changelog_first"], 1);
    stdout(&["changelog", "clear", "--server", addr, "cl1", "0"]);
    assert_eq!(
        stdout(&["changelog", "read", "--server", addr, "--user", "cl1"]),
        ""
    );
    let bad = calm(&["changelog", "clear", "--server", addr, "cl1", "99"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("99"));
    let bad = calm(&[
        "changelog",
        "register",
        "--server",
        addr,
        "--mask",
        "CREAT,NOPE",
    ]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("NOPE"));

    // Follow: a record shows up as soon as it is committed.
    let (mut following, mut lines) = follower(addr, &["--user", "cl1"]);
    std::thread::sleep(Duration::from_millis(300));
    let created = Instant::now();
    rt.block_on(async {
        let c = Client::connect(addr).await.unwrap();
        c.create(ROOT, b"late", 0o644).await.unwrap();
    });
    let line = lines.next().unwrap().unwrap();
    let waited = created.elapsed();
    let _ = following.kill();
    let _ = following.wait();
    let record: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (record["type"].as_str(), record["name"].as_str()),
        (Some("CREAT"), Some("late"))
    );
    assert!(waited < Duration::from_secs(5), "follow took {waited:?}");

    // A batching follower over the wire: two records in one answer, printed in order.
    let from = (record["index"].as_u64().unwrap() + 1).to_string();
    let batching = [
        "--from",
        &from,
        "--batch-records",
        "2",
        "--linger-us",
        "100000",
    ];
    let (mut following, mut lines) = follower(addr, &batching);
    rt.block_on(async {
        let c = Client::connect(addr).await.unwrap();
        c.create(ROOT, b"batch1", 0o644).await.unwrap();
        c.create(ROOT, b"batch2", 0o644).await.unwrap();
    });
    let names: Vec<String> = (0..2)
        .map(|_| {
            let line = lines.next().unwrap().unwrap();
            let record: serde_json::Value = serde_json::from_str(&line).unwrap();
            record["name"].as_str().unwrap().to_owned()
        })
        .collect();
    let _ = following.kill();
    let _ = following.wait();
    assert_eq!(names, ["batch1", "batch2"]);
    let bad = calm(&[
        "changelog",
        "read",
        "--server",
        addr,
        "--follow",
        "--linger-us",
        "100001",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--linger-us 100001"));

    stdout(&["changelog", "deregister", "--server", addr, "cl1"]);
    let users: serde_json::Value =
        serde_json::from_str(&stdout(&["changelog", "users", "--server", addr, "--json"])).unwrap();
    assert_eq!(users["users"].as_array().unwrap().len(), 0);
}

#[test]
fn a_server_configured_to_refuse_says_why_and_applies_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--changelog-backlog-max",
        "2",
        "--changelog-backlog-policy",
        "refuse",
    ];
    let server = Server::start_with(&data_dir(&tmp), &args);
    let addr = server.addr.as_str();
    stdout(&["changelog", "register", "--server", addr, "--mask", "ALL"]);
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        c.create(ROOT, b"a", 0o644).await.unwrap();
        c.create(ROOT, b"b", 0o644).await.unwrap();
        let refused = c.create(ROOT, b"c", 0o644).await.unwrap_err();
        assert_eq!(refused.errno(), 28, "ENOSPC: {refused:?}");
        assert!(refused.to_string().contains("cl1"), "{refused}");
        assert_eq!(
            c.lookup(ROOT, b"c").await.unwrap_err().errno(),
            2,
            "not applied"
        );
        c.changelog_clear(1, 0).await.unwrap();
        c.create(ROOT, b"c", 0o644).await.unwrap();
    });
    let bad = calm(&["serve", "--changelog-backlog-policy", "drop"]);
    assert!(!bad.status.success());
}

const CLIENTS: usize = 6;

#[test]
fn kill9_during_creates_leaves_one_record_per_create_and_no_gap() {
    kill9_during_creates(&[]);
}

#[test]
fn kill9_during_creates_leaves_one_record_per_create_and_no_gap_without_the_log() {
    kill9_during_creates(&["--no-wal"]);
}

fn kill9_during_creates(args: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(&tmp);
    let rt = runtime();
    let acked: Arc<Mutex<BTreeSet<(Handle, String)>>> = Arc::default();
    let server = Server::start_with(&data, args);
    let dirs: Vec<Handle> = rt.block_on(async {
        let c = Client::connect(&server.addr).await.unwrap();
        c.changelog_register("crash", "CREAT").await.unwrap();
        let mut dirs = Vec::new();
        for k in 0..CLIENTS {
            dirs.push(
                c.mkdir(ROOT, format!("c{k}").as_bytes(), 0o755)
                    .await
                    .unwrap()
                    .handle,
            );
        }
        dirs
    });
    let storm: Vec<_> = dirs
        .iter()
        .enumerate()
        .map(|(k, &dir)| {
            let (addr, acked) = (server.addr.clone(), acked.clone());
            rt.spawn(async move {
                let c = Client::connect(&addr).await.unwrap();
                for i in 0u64.. {
                    let name = format!("c{k}f{i}");
                    match c.create(dir, name.as_bytes(), 0o644).await {
                        Ok(_) => {
                            acked.lock().unwrap().insert((dir, name));
                        }
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    server.kill9();
    rt.block_on(async {
        for task in storm {
            task.await.unwrap();
        }
    });
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 100,
        "only {} creates acknowledged",
        acked.len()
    );

    let server = Server::start_with(&data, args);
    rt.block_on(async {
        let c = Client::connect(&server.addr).await.unwrap();
        let mut records = Vec::new();
        loop {
            let from = records
                .last()
                .map_or(0, |r: &calm_changelog::Record| r.index + 1);
            let (batch, _) = c.changelog_read(from, 4096, None, 0).await.unwrap();
            if batch.is_empty() {
                break;
            }
            records.extend(batch);
        }
        let indices: Vec<u64> = records.iter().map(|r| r.index).collect();
        assert_eq!(
            indices,
            (1..=records.len() as u64).collect::<Vec<_>>(),
            "dense, from 1"
        );
        // Every record names a file that exists, and no file has two records.
        let mut by_name: BTreeMap<(Handle, Vec<u8>), u64> = BTreeMap::new();
        for record in &records {
            assert_eq!(record.kind, calm_changelog::RecordType::Create);
            *by_name
                .entry((record.parent, record.name.clone()))
                .or_default() += 1;
            let attr = c.lookup(record.parent, &record.name).await.unwrap();
            assert_eq!(
                attr.handle, record.target,
                "the record names the file it created"
            );
        }
        assert!(by_name.values().all(|n| *n == 1), "one record per create");
        // Every acknowledged create has its record; every file in the directories has one.
        for (dir, name) in &acked {
            assert!(
                by_name.contains_key(&(*dir, name.as_bytes().to_vec())),
                "no record for {name}"
            );
        }
        let mut files = 0;
        for dir in &dirs {
            let mut after = 0;
            loop {
                let page = c.readdir(*dir, after, 4096).await.unwrap();
                let Some(last) = page.last() else { break };
                after = last.cookie;
                files += page.len();
            }
        }
        assert_eq!(
            files,
            records.len(),
            "every file has its record, and no more records than files"
        );
    });
    // fsck verifies a store offline: the server goes first (killed: fsck replays its log).
    drop(server);
    let fsck = calm(&["fsck", data.to_str().unwrap()]);
    assert!(
        fsck.status.success(),
        "{}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
}
