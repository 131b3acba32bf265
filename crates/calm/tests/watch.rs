//! Watches against a real `calm serve`: directory, subtree and handle watches in order; a
//! client's own changes seen through `wait_past(reached)`; a watcher that does not read while
//! thousands of changes commit gets one resync and ends with the true state; replay from an old
//! index; `calm watch`.

use crate::common;

use std::collections::BTreeSet;

use calm_changelog::RecordType;
use calm_client::{Client, WatchEvent, WatchWhat};
use common::Server;

async fn names(client: &Client, dir: u64) -> BTreeSet<Vec<u8>> {
    let mut out = BTreeSet::new();
    let mut after = 0;
    loop {
        let entries = client.readdir(dir, after, 4096).await.unwrap();
        let Some(last) = entries.last() else {
            return out;
        };
        after = last.cookie;
        out.extend(entries.into_iter().map(|e| e.name));
    }
}

/// Events until the stream has passed `index`.
async fn until(watch: &mut calm_client::Watch, index: u64) -> Vec<WatchEvent> {
    watch.wait_past(index).await.unwrap();
    let mut events = Vec::new();
    while watch.passed() >= index {
        // Everything up to `index` is buffered now; take it without waiting for more.
        match tokio::time::timeout(std::time::Duration::from_millis(200), watch.next()).await {
            Ok(Ok(Some(event))) => events.push(event),
            _ => break,
        }
    }
    events
}

/// The records among `events`.
fn records(events: &[WatchEvent]) -> impl Iterator<Item = &calm_changelog::Record> {
    events.iter().filter_map(|e| match e {
        WatchEvent::Change(r) => Some(r),
        _ => None,
    })
}

fn changes(events: &[WatchEvent]) -> Vec<(RecordType, String)> {
    records(events)
        .map(|r| (r.kind, String::from_utf8_lossy(&r.name).into_owned()))
        .collect()
}

#[test]
fn directory_subtree_and_handle_watches_see_their_changes_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&common::data_dir(&tmp));
    common::runtime().block_on(async {
        let client = Client::connect(&server.addr).await.unwrap();
        let a = client.mkdir(calm_meta::ROOT, b"a", 0o755).await.unwrap();
        let b = client.mkdir(a.handle, b"b", 0o755).await.unwrap();
        let f = client.create(b.handle, b"f", 0o644).await.unwrap();
        let mut dir = watch_dir(&client, a.handle, false).await.unwrap();
        let mut tree = watch_dir(&client, a.handle, true).await.unwrap();
        let mut file = client
            .watch(WatchWhat::Handles(vec![f.handle]), 0)
            .await
            .unwrap();

        client.create(a.handle, b"top", 0o644).await.unwrap();
        client.create(b.handle, b"deep", 0o644).await.unwrap();
        client
            .rename(b.handle, b"f", a.handle, b"moved", 0)
            .await
            .unwrap();
        client.unlink(b.handle, b"deep").await.unwrap();
        let reached = client.reached();
        assert!(
            reached >= 4,
            "mutations answer with their changelog index: {reached}"
        );

        let on_dir = changes(&until(&mut dir, reached).await);
        assert_eq!(
            on_dir,
            [
                (RecordType::Create, "top".into()),
                (RecordType::Rename, "moved".into())
            ],
            "a directory watch sees its own entries only"
        );
        let on_tree = changes(&until(&mut tree, reached).await);
        assert_eq!(
            on_tree,
            [
                (RecordType::Create, "top".into()),
                (RecordType::Create, "deep".into()),
                (RecordType::Rename, "moved".into()),
                (RecordType::Unlink, "deep".into()),
            ],
            "a subtree watch sees everything below, in commit order"
        );
        let on_file = changes(&until(&mut file, reached).await);
        assert_eq!(on_file, [(RecordType::Rename, "moved".into())]);
    });
}

/// The kinds and targets of the changes among `events`.
fn targets(events: &[WatchEvent]) -> Vec<(RecordType, u64)> {
    records(events).map(|r| (r.kind, r.target)).collect()
}

#[test]
fn directory_and_subtree_watches_see_the_attribute_changes_of_their_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&common::data_dir(&tmp));
    common::runtime().block_on(async {
        let client = Client::connect(&server.addr).await.unwrap();
        let a = client.mkdir(calm_meta::ROOT, b"a", 0o755).await.unwrap();
        let b = client.mkdir(a.handle, b"b", 0o755).await.unwrap();
        let other = client
            .mkdir(calm_meta::ROOT, b"other", 0o755)
            .await
            .unwrap();
        let top = client.create(a.handle, b"top", 0o644).await.unwrap();
        let deep = client.create(b.handle, b"deep", 0o644).await.unwrap();
        // A second name elsewhere: its attribute changes concern both directories.
        client
            .link(deep.handle, other.handle, b"alias")
            .await
            .unwrap();
        let mut on_a = watch_dir(&client, a.handle, false).await.unwrap();
        let mut below_a = watch_dir(&client, a.handle, true).await.unwrap();
        let mut on_b = watch_dir(&client, b.handle, false).await.unwrap();
        let mut on_other = watch_dir(&client, other.handle, false).await.unwrap();

        // Each watch is read up to each change before the next one is made: a watcher that
        // is behind keeps only the latest change per object (docs/design/watch.md), and this
        // test wants every one.
        let mut seen: [Vec<WatchEvent>; 4] = Default::default();
        let mut drain = async |seen: &mut [Vec<WatchEvent>; 4]| {
            let reached = client.reached();
            for (watch, seen) in [&mut on_a, &mut below_a, &mut on_b, &mut on_other]
                .into_iter()
                .zip(seen.iter_mut())
            {
                seen.extend(until(watch, reached).await);
            }
        };
        let chmod = calm_meta::SetAttr {
            mode: Some(0o600),
            ..Default::default()
        };
        client.setattr(top.handle, &chmod).await.unwrap();
        drain(&mut seen).await;
        let chown = calm_meta::SetAttr {
            uid: Some(1234),
            ..Default::default()
        };
        client.setattr(deep.handle, &chown).await.unwrap();
        drain(&mut seen).await;
        let truncate = calm_meta::SetAttr {
            size: Some(5),
            ..Default::default()
        };
        client.setattr(deep.handle, &truncate).await.unwrap();
        drain(&mut seen).await;
        let touch = calm_meta::SetAttr {
            mtime: Some(calm_meta::SetTime::At(1_000_000_000)),
            ..Default::default()
        };
        client.setattr(top.handle, &touch).await.unwrap();
        drain(&mut seen).await;
        client
            .setxattr(deep.handle, b"user.k", b"v", 0)
            .await
            .unwrap();
        drain(&mut seen).await;
        // Moved out of the watched tree: its later changes are no longer the tree's.
        client
            .rename(a.handle, b"top", other.handle, b"top", 0)
            .await
            .unwrap();
        drain(&mut seen).await;
        client.setattr(top.handle, &chmod).await.unwrap();
        drain(&mut seen).await;
        let [on_a, below_a, on_b, on_other] = seen;

        let (t, d) = (top.handle, deep.handle);
        assert_eq!(
            targets(&on_a),
            [
                (RecordType::Setattr, t),
                (RecordType::Mtime, t),
                (RecordType::Rename, t)
            ],
            "a directory watch sees its entries' attribute changes"
        );
        assert_eq!(
            targets(&below_a),
            [
                (RecordType::Setattr, t),
                (RecordType::Setattr, d),
                (RecordType::Trunc, d),
                (RecordType::Mtime, t),
                (RecordType::Xattr, d),
                (RecordType::Rename, t)
            ],
            "a subtree watch sees those of everything below it"
        );
        assert_eq!(
            targets(&on_b),
            [
                (RecordType::Setattr, d),
                (RecordType::Trunc, d),
                (RecordType::Xattr, d)
            ]
        );
        assert_eq!(
            targets(&on_other),
            [
                (RecordType::Setattr, d),
                (RecordType::Trunc, d),
                (RecordType::Xattr, d),
                (RecordType::Rename, t),
                (RecordType::Setattr, t)
            ],
            "the directory of a file's second name sees its changes too"
        );
    });
}

#[test]
fn a_watcher_that_does_not_read_resyncs_and_ends_with_the_true_state() {
    let tmp = tempfile::tempdir().unwrap();
    // A small queue, so that a few thousand changes overflow it whatever the buffers between
    // the server and this client hold.
    let server = Server::start_with(&common::data_dir(&tmp), &["--watch-queue-max", "64"]);
    common::runtime().block_on(async {
        let client = Client::connect(&server.addr).await.unwrap();
        let dir = client
            .mkdir(calm_meta::ROOT, b"d", 0o755)
            .await
            .unwrap()
            .handle;
        let mut watch = watch_dir(&client, dir, false).await.unwrap();
        // 12 000 changes (about 4 MB of events) of 8 000 files while the watcher reads
        // nothing: far more than its queue (64 objects) and the stream's buffers can hold. The writers do not wait for it.
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let client = client.clone();
                tokio::spawn(async move {
                    for i in 0..1000 {
                        // Long names: the events outgrow the HTTP/2 windows (2 MiB) as well.
                        let name = format!("w{w}-{i}-{}", "n".repeat(200));
                        client.create(dir, name.as_bytes(), 0o644).await.unwrap();
                        if i % 2 == 0 {
                            client.unlink(dir, name.as_bytes()).await.unwrap();
                        }
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.await.unwrap();
        }
        let reached = client.reached();
        // The watcher applies what it gets; on a resync it re-reads the directory.
        let mut view: BTreeSet<Vec<u8>> = BTreeSet::new();
        let mut resyncs = 0;
        watch.wait_past(reached).await.unwrap();
        loop {
            let event =
                match tokio::time::timeout(std::time::Duration::from_millis(300), watch.next())
                    .await
                {
                    Ok(event) => event.unwrap().expect("stream open"),
                    Err(_) => break,
                };
            match event {
                WatchEvent::Resync { .. } => {
                    resyncs += 1;
                    view = names(&client, dir).await;
                }
                WatchEvent::Change(r) => match r.kind {
                    RecordType::Create => {
                        view.insert(r.name);
                    }
                    RecordType::Unlink => {
                        view.remove(&r.name);
                    }
                    other => panic!("unexpected {other:?}"),
                },
                WatchEvent::Progress { .. } => {}
            }
        }
        assert!(
            resyncs >= 1,
            "the watcher fell behind and was told to resync"
        );
        let truth = names(&client, dir).await;
        assert_eq!(truth.len(), 4000);
        assert_eq!(view, truth, "the watcher's view is the directory");
    });
}

#[test]
fn a_watch_from_an_old_index_replays_then_follows() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&common::data_dir(&tmp));
    common::runtime().block_on(async {
        let client = Client::connect(&server.addr).await.unwrap();
        // A first watch makes the server keep every record type.
        let _keep = watch_dir(&client, calm_meta::ROOT, true).await.unwrap();
        let dir = client
            .mkdir(calm_meta::ROOT, b"d", 0o755)
            .await
            .unwrap()
            .handle;
        let start = client.reached();
        for name in ["a", "b", "c"] {
            client.create(dir, name.as_bytes(), 0o644).await.unwrap();
        }
        let mut watch = client
            .watch(
                WatchWhat::Dir {
                    handle: dir,
                    recursive: false,
                },
                start,
            )
            .await
            .unwrap();
        client.create(dir, b"d", 0o644).await.unwrap();
        let got = changes(&until(&mut watch, client.reached()).await);
        let names: Vec<&str> = got.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(
            names,
            ["a", "b", "c", "d"],
            "history, then the live change, once each"
        );
    });
}

#[test]
fn bad_watches_are_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&common::data_dir(&tmp));
    common::runtime().block_on(async {
        let client = Client::connect(&server.addr).await.unwrap();
        let f = client.create(calm_meta::ROOT, b"f", 0o644).await.unwrap();
        let err = watch_dir(&client, f.handle, false).await.unwrap_err();
        assert_eq!(err, calm_meta::MetaError::NotDir);
        let err = client
            .watch(WatchWhat::Handles(vec![999_999]), 0)
            .await
            .unwrap_err();
        assert_eq!(err, calm_meta::MetaError::NotFound);
    });
}

#[test]
fn calm_watch_prints_changes_as_they_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&common::data_dir(&tmp));
    let rt = common::runtime();
    let client = rt.block_on(Client::connect(&server.addr)).unwrap();
    rt.block_on(client.mkdir(calm_meta::ROOT, b"w", 0o755))
        .unwrap();
    let child = std::process::Command::new(common::CALM)
        .args([
            "watch",
            "/w",
            "--json",
            "--count",
            "2",
            "--server",
            &server.addr,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Give the watch time to start, then change things.
    std::thread::sleep(std::time::Duration::from_millis(500));
    rt.block_on(async {
        let w = client.lookup(calm_meta::ROOT, b"w").await.unwrap().handle;
        client.create(w, b"x", 0o644).await.unwrap();
        client.mkdir(w, b"y", 0o755).await.unwrap();
    });
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["type"], "CREAT");
    assert_eq!(lines[0]["name"], "x");
    assert_eq!(lines[1]["type"], "MKDIR");
}

/// A watch of directory `handle` (and below it when `recursive`) from now on.
async fn watch_dir(
    client: &Client,
    handle: calm_meta::Handle,
    recursive: bool,
) -> Result<calm_client::Watch, calm_meta::MetaError> {
    client.watch(WatchWhat::Dir { handle, recursive }, 0).await
}
