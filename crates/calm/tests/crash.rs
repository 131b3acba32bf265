//! kill -9 during a storm of creates from several clients, three times over: after each
//! restart fsck is clean, every acknowledged create is there with the handle it was given,
//! and no handle was ever handed out twice. Every fourth file also gets a second name in a
//! shared directory (so the store's record of where a file's names are, its `L` keys, is
//! written under the kill too): every acknowledged one is there, and fsck checks the records. With the write-ahead log (the default), whose
//! recovery replays the log, and with LMDB's own commit (`--no-wal`).

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use calm_client::Client;
use calm_meta::{Handle, ROOT};
use common::*;

const CLIENTS: usize = 6;

#[test]
fn kill9_during_a_create_storm_loses_no_acknowledged_create() {
    storm_kill9_restart(&[]);
}

#[test]
fn kill9_during_a_create_storm_loses_no_acknowledged_create_without_the_log() {
    storm_kill9_restart(&["--no-wal"]);
}

fn storm_kill9_restart(args: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(&tmp);
    // name → (directory, handle) of every acknowledged create, across all rounds.
    let acked: Arc<Mutex<HashMap<String, (Handle, Handle)>>> = Arc::default();
    // The same for the second names.
    let linked: Arc<Mutex<HashMap<String, (Handle, Handle)>>> = Arc::default();
    let rt = runtime();
    for round in 0..3 {
        let server = Server::start_with(&data, args);
        let (dirs, links): (Vec<Handle>, Handle) = rt.block_on(async {
            let c = Client::connect(&server.addr).await.unwrap();
            let links = c
                .mkdir(ROOT, format!("r{round}links").as_bytes(), 0o755)
                .await
                .unwrap()
                .handle;
            let mut dirs = Vec::new();
            for k in 0..CLIENTS {
                dirs.push(
                    c.mkdir(ROOT, format!("r{round}c{k}").as_bytes(), 0o755)
                        .await
                        .unwrap()
                        .handle,
                );
            }
            (dirs, links)
        });
        let before = acked.lock().unwrap().len();
        let storm: Vec<_> = dirs
            .iter()
            .enumerate()
            .map(|(k, &dir)| {
                let (addr, acked, linked) = (server.addr.clone(), acked.clone(), linked.clone());
                rt.spawn(async move {
                    let c = Client::connect(&addr).await.unwrap();
                    for i in 0u64.. {
                        let name = format!("r{round}c{k}f{i}");
                        let handle = match c.create(dir, name.as_bytes(), 0o644).await {
                            Ok(attr) => {
                                acked
                                    .lock()
                                    .unwrap()
                                    .insert(name.clone(), (dir, attr.handle));
                                attr.handle
                            }
                            Err(_) => return, // the server died under us
                        };
                        if i % 4 == 0 {
                            let alias = format!("{name}-also");
                            match c.link(handle, links, alias.as_bytes()).await {
                                Ok(_) => {
                                    linked.lock().unwrap().insert(alias, (links, handle));
                                }
                                Err(_) => return,
                            }
                        }
                    }
                })
            })
            .collect();
        // Let the storm run (past 100 acknowledged creates, however loaded the machine), then
        // kill the server in the middle of it.
        let started = std::time::Instant::now();
        while acked.lock().unwrap().len() < before + 150 {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "round {round}: the storm did not get going"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        server.kill9();
        rt.block_on(async {
            for task in storm {
                task.await.unwrap();
            }
        });
        let after = acked.lock().unwrap().len();
        assert!(
            after > before + 100,
            "round {round}: only {} creates acknowledged",
            after - before
        );

        let fsck = calm(&["fsck", data.to_str().unwrap()]);
        let out = String::from_utf8_lossy(&fsck.stdout);
        assert!(
            fsck.status.success(),
            "round {round}: fsck after kill -9:\n{out}"
        );
        if !args.contains(&"--no-wal") {
            // The kill came well within a checkpoint interval: the log had commits to replay.
            let err = String::from_utf8_lossy(&fsck.stderr);
            assert!(
                err.contains("commits from the write-ahead log"),
                "round {round}: fsck did not recover the log:\n{err}"
            );
        }

        let server = Server::start_with(&data, args);
        rt.block_on(async {
            let c = Client::connect(&server.addr).await.unwrap();
            let acked = acked.lock().unwrap().clone();
            for (name, (dir, handle)) in &acked {
                let attr = c
                    .lookup(*dir, name.as_bytes())
                    .await
                    .unwrap_or_else(|e| panic!("acknowledged {name} lost: {e}"));
                assert_eq!(attr.handle, *handle, "{name} changed handle");
            }
            let linked = linked.lock().unwrap().clone();
            assert!(!linked.is_empty(), "no second name was acknowledged");
            for (alias, (dir, handle)) in &linked {
                let attr = c
                    .lookup(*dir, alias.as_bytes())
                    .await
                    .unwrap_or_else(|e| panic!("acknowledged link {alias} lost: {e}"));
                assert_eq!(attr.handle, *handle, "{alias} names another file");
                assert_eq!(attr.nlink, 2, "{alias}");
            }
            let mut handles: Vec<Handle> = acked.values().map(|(_, h)| *h).collect();
            handles.sort_unstable();
            let total = handles.len();
            handles.dedup();
            assert_eq!(handles.len(), total, "a handle was handed out twice");
            let fresh = c
                .create(ROOT, format!("fresh{round}").as_bytes(), 0o644)
                .await
                .unwrap();
            assert!(
                fresh.handle > *handles.last().unwrap(),
                "a handle below the old mark after restart"
            );
        });
        let (status, _) = server.terminate();
        assert!(status.success());
    }
}

/// SIGTERM with a mount open and a lock held through it (streams that never end by themselves)
/// stops the server within a bound, cleanly: its store needs no recovery and fsck is clean. (It
/// waited for the mount for ever.)
#[test]
fn a_server_with_a_mount_stops_on_sigterm_in_bounded_time() {
    // What the README promises: requests in flight get STOP_WAIT_MAX, leaving the registry
    // LEAVE_WAIT_MAX; the mount's watch and the lock wait end at once.
    const STOP_BOUND: std::time::Duration =
        calm_server::STOP_WAIT_MAX.saturating_add(calm_server::LEAVE_WAIT_MAX);
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let server = Server::start(&data);
    let took = server.stops_on_sigterm_with_a_mount(STOP_BOUND);
    eprintln!("stopped {took:?} after SIGTERM");
    let fsck = calm(&["fsck", data.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&fsck.stderr);
    eprintln!("fsck: {err}");
    assert!(
        fsck.status.success(),
        "{}{err}",
        String::from_utf8_lossy(&fsck.stdout),
    );
    assert!(!err.contains("commits from the write-ahead log"), "{err}");
}
