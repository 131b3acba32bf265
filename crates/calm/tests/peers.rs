//! Three `calm serve --store etcd://` processes, one lock table per file: fcntl locks of
//! processes on mounts of different servers exclude each other, F_GETLK and waits work across
//! servers, locked read-modify-write keeps exact totals; and kill -9 of the server deciding
//! some files during a lock storm grants no lock twice (checked against a model of who holds
//! what), the locks held through it are reclaimed, and the waiters proceed.

use crate::common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use calm_client::routing::LockRouter;
use calm_client::{COMMITTER_OF, Client};
use calm_locks::peers::owner_of;
use calm_locks::{LockKind, OFFSET_MAX, Owner, Range, Request, Scope};
use calm_meta::ROOT;
use calm_meta::slices::{INLINE, Slice};
use calm_meta::{Caller, MetaError, SetAttr};
use calm_proto::locks::{LockCall, LockCode};
use calm_testkit::etcd::{LocalCluster, unique_prefix};
use common::{Mount, Server, all_at_once, python_in, runtime};

use common::etcd_url as cluster;

/// Three servers of one namespace, with a short membership lease, once each sees all three.
fn three_servers(url: &str, tmp: &std::path::Path, lease_ms: u64) -> Vec<Server> {
    three_servers_with(url, tmp, lease_ms, &[&[], &[], &[]])
}

/// [`three_servers`], each with its own extra arguments.
fn three_servers_with(
    url: &str,
    tmp: &std::path::Path,
    lease_ms: u64,
    extra: &[&[&str]; 3],
) -> Vec<Server> {
    let objects = format!("file://{}", tmp.join("objects").display());
    let lease = lease_ms.to_string();
    let servers: Vec<Server> = ["a", "b", "c"]
        .iter()
        .zip(extra)
        .map(|(name, extra)| {
            let mut args = vec![
                "--store",
                url,
                "--objects",
                &objects,
                "--server-lease-ms",
                &lease,
            ];
            args.extend_from_slice(extra);
            Server::start_with(&tmp.join(name), &args)
        })
        .collect();
    let rt = runtime();
    rt.block_on(async {
        for server in &servers {
            let client = Client::connect(&server.addr).await.unwrap();
            let started = Instant::now();
            loop {
                let members = client.members().await.unwrap();
                assert!(members.has_peers);
                if members.servers.len() == 3 {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "the servers never saw each other: {members:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    servers
}

fn keeper(mount: &Mount, path: &str) -> std::process::Child {
    let mut keeper = Command::new("nsenter")
        .args(["-t", &mount.pid().to_string(), "-m", "--", "python3", "-c"])
        .arg(format!(
            "import fcntl, sys\nf = open('{}/{path}', 'r+')\nfcntl.lockf(f, fcntl.LOCK_EX)\n\
             print('held', flush=True)\nsys.stdin.read()",
            mount.mnt.display()
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the lock keeper");
    let mut line = String::new();
    BufReader::new(keeper.stdout.as_mut().expect("piped"))
        .read_line(&mut line)
        .expect("keeper output");
    assert_eq!(line, "held\n");
    keeper
}

const TRY_LOCK: &str = "python3 -c \"
import fcntl
f = open('f', 'r+')
try:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print('granted')
except OSError as e:
    print('refused', e.errno)
\"";

/// F_GETLK of a write lock on the whole file: the type of the lock in the way (2: none).
const GET_LOCK: &str = "python3 -c \"
import fcntl, struct
f = open('f', 'r+')
got = fcntl.fcntl(f, fcntl.F_GETLK, struct.pack('@hhqqi', fcntl.F_WRLCK, 0, 0, 0, 0))
print(struct.unpack('@hhqqi', got)[0])
\"";

#[test]
fn fcntl_locks_through_mounts_of_three_servers_are_one_lock_table() {
    let mut private = None;
    let url = cluster("locks3", &mut private);
    let tmp = tempfile::tempdir().unwrap();
    let servers = three_servers(&url, tmp.path(), 5_000);
    let mounts: Vec<Mount> = servers
        .iter()
        .map(|s| Mount::remote(&s.addr, &[]))
        .collect();
    let (a, b, c) = (&mounts[0], &mounts[1], &mounts[2]);
    a.sh_ok("echo data > f");
    let mut held = keeper(a, "f");
    // Whichever server decides f, two of the three mounts reach it through another server.
    assert_eq!(b.sh_ok(TRY_LOCK), "refused 11\n", "granted through B");
    assert_eq!(c.sh_ok(TRY_LOCK), "refused 11\n", "granted through C");
    assert_eq!(
        c.sh_ok(GET_LOCK).trim(),
        "1",
        "F_GETLK through C saw no write lock"
    );
    // A blocking waiter on C is woken when the holder on A lets go.
    let mut waiter = Command::new("timeout")
        .args(["60", "nsenter", "-t", &c.pid().to_string(), "-m", "--"])
        .args(["python3", "-c"])
        .arg(format!(
            "import fcntl\nf = open('{}/f', 'r+')\nfcntl.lockf(f, fcntl.LOCK_EX)\nprint('got', flush=True)",
            c.mnt.display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the waiter");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "the waiter was granted while A held the lock"
    );
    drop(held.stdin.take());
    held.wait().unwrap();
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "got\n",
        "the waiter on C was not woken by the unlock on A"
    );
    assert_eq!(b.sh_ok(GET_LOCK).trim(), "2", "a lock outlived its holder");

    // Locked read-modify-write by processes on all three mounts keeps every increment.
    const RECORDS: u32 = 8;
    const ITERATIONS: u32 = 150;
    a.sh_ok(&format!("head -c {} /dev/zero > counters", RECORDS * 8));
    let outputs = all_at_once(vec![(a, 1), (b, 2), (c, 3), (a, 4)], |(mount, seed)| {
        python_in(
            mount,
            180,
            "increment.py",
            &[
                mount.mnt.join("counters").display().to_string(),
                ITERATIONS.to_string(),
                RECORDS.to_string(),
                seed.to_string(),
            ],
        )
    });
    for out in &outputs {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let sum = "python3 -c \"
import struct
print(sum(struct.unpack('<8Q', open('counters', 'rb').read())))
\"";
    for mount in &mounts {
        assert_eq!(
            mount.sh_ok(sum).trim(),
            (4 * ITERATIONS).to_string(),
            "an increment was lost"
        );
    }
}

/// Who holds each file's exclusive lock, as the storm's tasks were told: a grant while the
/// model says another task holds the file is a double grant.
#[derive(Default)]
struct Model {
    holder: HashMap<u64, usize>,
    double_grants: Vec<String>,
}

#[test]
fn killing_the_server_deciding_some_files_during_a_lock_storm_grants_nothing_twice() {
    let mut private = None;
    let url = cluster("failover", &mut private);
    let tmp = tempfile::tempdir().unwrap();
    let mut servers = three_servers(&url, tmp.path(), 2_000);
    let rt = runtime();
    let (victim_index, victim, view, files, routers, slow) = rt.block_on(async {
        let a = Client::connect(&servers[0].addr).await.unwrap();
        let members = a.members().await.unwrap();
        let view: Vec<u64> = members.servers.iter().map(|m| m.id).collect();
        let dir = a.mkdir(ROOT, b"storm", 0o755).await.unwrap().handle;
        let mut files = Vec::new();
        for i in 0..12 {
            files.push(
                a.create(dir, format!("f{i}").as_bytes(), 0o644)
                    .await
                    .unwrap()
                    .handle,
            );
        }
        // The victim: the server that decides the most of these files, but not all.
        let mut counts: HashMap<u64, usize> = HashMap::new();
        for file in &files {
            *counts.entry(owner_of(*file, &view).unwrap()).or_default() += 1;
        }
        let victim = *counts.iter().max_by_key(|(_, n)| **n).unwrap().0;
        let mut victim_index = None;
        for (i, server) in servers.iter().enumerate() {
            let client = Client::connect(&server.addr).await.unwrap();
            if client.members().await.unwrap().me == victim {
                victim_index = Some(i);
            }
        }
        let victim_index = victim_index.expect("the victim is one of the three");
        // Two clients, on the two servers that survive.
        let mut routers = Vec::new();
        for (i, server) in servers.iter().enumerate() {
            if i != victim_index {
                let home = Client::connect(&server.addr).await.unwrap();
                routers.push(LockRouter::open(home, 5_000).await.unwrap());
            }
        }
        for router in &routers {
            tokio::spawn(router.clone().run());
        }
        // A server that does not decide a file says so (a client with an old view is sent
        // on), rather than granting: no lock is decided by two servers.
        for server in &servers {
            let client = Client::connect(&server.addr).await.unwrap();
            if client.members().await.unwrap().me == owner_of(files[0], &view).unwrap() {
                continue;
            }
            let session = client.open_lock_session(5_000).await.unwrap();
            let request = Request {
                resource: files[0],
                owner: Owner::File { file: 1 },
                scope: Scope::WholeFile,
                kind: LockKind::Write,
            };
            let answers = client
                .lock_batch(session, &[LockCall::Set(request), LockCall::Test(request)])
                .await
                .unwrap();
            assert!(
                answers.iter().all(|a| a.code == LockCode::Moved),
                "{answers:?}"
            );
            client.close_lock_session(session).await.unwrap();
        }
        // A third client, which neither polls nor calls: it reclaims only when told to, long
        // after the victim's files were taken over. Its lease outlasts the test.
        let home = Client::connect(&servers[(victim_index + 1) % 3].addr)
            .await
            .unwrap();
        let slow = LockRouter::open(home, 60_000).await.unwrap();
        (victim_index, victim, view, files, routers, slow)
    });
    let model = Arc::new(Mutex::new(Model::default()));
    let killed_at_ms = Arc::new(AtomicU64::new(0));
    let grants_after_kill = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    const TASKS_PER_CLIENT: usize = 4;
    /// Rounds each task runs after the kill; before it, as many as fit.
    const ROUNDS_AFTER_KILL: usize = 15;
    const ROUNDS_MAX: usize = 100_000;
    const HOLD_PAST_KILL_MS: u64 = 4_000;
    let storm = rt.spawn({
        let (model, files, killed_at_ms, grants_after_kill) = (
            model.clone(),
            files.clone(),
            killed_at_ms.clone(),
            grants_after_kill.clone(),
        );
        async move {
            let mut tasks = Vec::new();
            for (r, router) in routers.iter().enumerate() {
                for t in 0..TASKS_PER_CLIENT {
                    let task = r * TASKS_PER_CLIENT + t;
                    let (router, model, files, killed_at_ms, grants_after_kill) = (
                        router.clone(),
                        model.clone(),
                        files.clone(),
                        killed_at_ms.clone(),
                        grants_after_kill.clone(),
                    );
                    tasks.push(tokio::spawn(async move {
                        let owner = Owner::File {
                            file: 1000 + task as u64,
                        };
                        let mut after_kill = 0;
                        for round in 0..ROUNDS_MAX {
                            if killed_at_ms.load(Ordering::Acquire) > 0 {
                                after_kill += 1;
                                if after_kill > ROUNDS_AFTER_KILL {
                                    break;
                                }
                            }
                            let file = files[(task * 7 + round * 5) % files.len()];
                            let request = Request {
                                resource: file,
                                owner,
                                scope: Scope::Range(Range {
                                    start: 0,
                                    end: OFFSET_MAX,
                                }),
                                kind: LockKind::Write,
                            };
                            let tag = (task as u64) << 32 | round as u64;
                            let answer = router
                                .wait(tag, request, None)
                                .await
                                .map_err(|f| format!("task {task} round {round}: {f}"))?;
                            if answer.code != LockCode::Ok {
                                return Err(format!("task {task} round {round}: {answer:?}"));
                            }
                            {
                                let mut model = model.lock().unwrap();
                                if let Some(other) = model.holder.insert(file, task) {
                                    model.double_grants.push(format!(
                                        "file {file}: task {task} granted while task {other} held it"
                                    ));
                                }
                            }
                            let granted_after_kill = killed_at_ms.load(Ordering::Acquire) > 0;
                            if granted_after_kill {
                                grants_after_kill.fetch_add(1, Ordering::Relaxed);
                            }
                            tokio::time::sleep(Duration::from_millis(3)).await;
                            // A lock held through the kill is held until well after the
                            // takeover (the lease, 2 s), so that a second grant shows.
                            loop {
                                let killed = killed_at_ms.load(Ordering::Acquire);
                                let now = started.elapsed().as_millis() as u64;
                                if granted_after_kill || killed == 0 || now >= killed + HOLD_PAST_KILL_MS {
                                    break;
                                }
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            model.lock().unwrap().holder.remove(&file);
                            let answers = router
                                .call(file, &[LockCall::Unlock(request)])
                                .await
                                .map_err(|f| format!("task {task} unlock: {f}"))?;
                            if answers[0].code != LockCode::Ok {
                                return Err(format!("task {task} unlock: {:?}", answers[0]));
                            }
                        }
                        Ok::<(), String>(())
                    }));
                }
            }
            let mut failures = Vec::new();
            for task in tasks {
                if let Err(e) = task.await.unwrap() {
                    failures.push(e);
                }
            }
            failures
        }
    });
    // The slow client takes two of the victim's files while the storm runs, and keeps them.
    const SLOW: usize = 99;
    let slow_files: Vec<u64> = files
        .iter()
        .copied()
        .filter(|f| owner_of(*f, &view) == Some(victim))
        .take(2)
        .collect();
    let slow_request = |file: u64| Request {
        resource: file,
        owner: Owner::File { file: 7 },
        scope: Scope::Range(Range {
            start: 0,
            end: OFFSET_MAX,
        }),
        kind: LockKind::Write,
    };
    std::thread::sleep(Duration::from_millis(300));
    rt.block_on(async {
        for (i, file) in slow_files.iter().enumerate() {
            let answer = slow
                .wait(1 << 40 | i as u64, slow_request(*file), None)
                .await
                .unwrap();
            assert_eq!(answer.code, LockCode::Ok);
            let mut model = model.lock().unwrap();
            if let Some(other) = model.holder.insert(*file, SLOW) {
                model.double_grants.push(format!(
                    "file {file}: the slow client granted while {other} held it"
                ));
            }
        }
    });
    // Kill the victim while the storm runs.
    std::thread::sleep(Duration::from_millis(400));
    let victim_server = servers.remove(victim_index);
    victim_server.kill9();
    killed_at_ms.store(started.elapsed().as_millis() as u64, Ordering::Release);
    // The victim's lease (2 s) has run out and its files were taken over: only now does the
    // slow client reclaim. Until then the new deciders must grant nobody its files.
    std::thread::sleep(Duration::from_millis(3_500));
    rt.block_on(async {
        slow.refresh(None).await;
        assert_eq!(slow.held(), slow_files.len(), "the slow client lost a lock");
        tokio::time::sleep(Duration::from_millis(500)).await;
        for file in &slow_files {
            model.lock().unwrap().holder.remove(file);
            let answers = slow
                .call(*file, &[LockCall::Unlock(slow_request(*file))])
                .await
                .unwrap();
            assert_eq!(answers[0].code, LockCode::Ok);
        }
    });
    let failures = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), storm)
            .await
            .expect("the storm did not end within 120 s")
            .unwrap()
    });
    eprintln!(
        "storm: killed at {} ms, ended at {} ms, {} grants after the kill",
        killed_at_ms.load(Ordering::Relaxed),
        started.elapsed().as_millis(),
        grants_after_kill.load(Ordering::Relaxed)
    );
    let model = model.lock().unwrap();
    assert!(model.double_grants.is_empty(), "{:?}", model.double_grants);
    assert!(failures.is_empty(), "tasks failed: {failures:?}");
    assert!(
        grants_after_kill.load(Ordering::Relaxed) > 0,
        "no lock was granted after the kill"
    );
    drop(servers);
}

/// `python3` that tries to lock `path` without waiting: "granted" or "refused ERRNO".
fn try_lock(path: &str) -> String {
    TRY_LOCK.replace("open('f'", &format!("open('{path}'"))
}

/// For `watch`, `mount` is refused the lock on `path` at every try (200 ms apart): it is
/// still held elsewhere. `what` names the holder for the failure message.
fn stays_refused(mount: &Mount, path: &str, watch: Duration, what: &str) {
    let watched = Instant::now();
    while watched.elapsed() < watch {
        assert_eq!(
            mount.sh_ok(&try_lock(path)),
            "refused 11\n",
            "the lock held through {what} was granted to another after {:?}",
            watched.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Tries the lock on `path` through `mount` every 100 ms until it is granted or `since` is
/// `within` old: whether it was granted, and when (from `since`).
fn granted_within(mount: &Mount, path: &str, since: Instant, within: Duration) -> (bool, Duration) {
    while since.elapsed() < within {
        if mount.sh_ok(&try_lock(path)) == "granted\n" {
            return (true, since.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (false, since.elapsed())
}

/// Of the files `d/f0` … `d/f15`, one whose locks the first of `servers` decides.
fn decided_by_the_first(servers: &[Server]) -> String {
    runtime().block_on(async {
        let b = Client::connect(&servers[1].addr).await.unwrap();
        let a = Client::connect(&servers[0].addr).await.unwrap();
        let doomed = a.members().await.unwrap().me;
        let view: Vec<u64> = b
            .members()
            .await
            .unwrap()
            .servers
            .iter()
            .map(|m| m.id)
            .collect();
        let dir = b.lookup(ROOT, b"d").await.unwrap().handle;
        for i in 0..16 {
            let name = format!("f{i}");
            let handle = b.lookup(dir, name.as_bytes()).await.unwrap().handle;
            if owner_of(handle, &view) == Some(doomed) {
                return name;
            }
        }
        panic!("none of 16 files is decided by the first server");
    })
}

/// Three servers, a mount of all three (`--server A,B,C`, on the first), a mount of the
/// second, a directory `d` of 16 files made through the first, and the path of one whose
/// locks the first server decides.
struct Moving {
    _private: Option<calm_testkit::etcd::LocalCluster>,
    _tmp: tempfile::TempDir,
    servers: Vec<Server>,
    /// Each server's metrics endpoint.
    metrics: Vec<String>,
    moving: Mount,
    other: Mount,
    path: String,
}

impl Moving {
    fn start(tag: &str) -> Moving {
        Moving::start_with_lease(tag, 2_000)
    }

    fn start_with_lease(tag: &str, lease_ms: u64) -> Moving {
        let mut private = None;
        let url = cluster(tag, &mut private);
        let tmp = tempfile::tempdir().unwrap();
        let metrics: Vec<String> = (0..3)
            .map(|_| format!("127.0.0.1:{}", common::free_port()))
            .collect();
        let servers = three_servers_with(
            &url,
            tmp.path(),
            lease_ms,
            &[
                &["--metrics", &metrics[0]],
                &["--metrics", &metrics[1]],
                &["--metrics", &metrics[2]],
            ],
        );
        let list = servers
            .iter()
            .map(|s| s.addr.clone())
            .collect::<Vec<_>>()
            .join(",");
        let moving = Mount::remote(&list, &[]);
        let other = Mount::remote(&servers[1].addr, &[]);
        moving.sh_ok("mkdir d && for i in $(seq 0 15); do echo $i > d/f$i; done");
        let path = format!("d/{}", decided_by_the_first(&servers));
        Moving {
            _private: private,
            _tmp: tmp,
            servers,
            metrics,
            moving,
            other,
            path,
        }
    }
}

/// A mount of three servers (`--server A,B,C`) whose server dies goes on with the next: its
/// namespace operations pause and succeed, nothing is applied twice, and a lock a process on
/// it held on a file decided by the dead server is still held after the move (reclaimed at
/// the file's new decider), as seen from a mount of another server.
#[test]
fn a_mount_of_three_servers_moves_on_when_its_server_dies_and_keeps_its_locks() {
    let Moving {
        _private,
        _tmp,
        mut servers,
        moving,
        other,
        path,
        metrics,
    } = Moving::start("mountmove");
    let mut held = keeper(&moving, &path);
    assert_eq!(other.sh_ok(&try_lock(&path)), "refused 11\n");
    servers.remove(0).kill9();
    // The mount goes on: everything succeeds, after a pause.
    let out = moving.sh_ok(
        "touch d/new && mv d/new d/renamed && rm d/f15 && mkdir d/sub && echo hello > d/sub/x \
         && cat d/sub/x && ls d | wc -l",
    );
    assert_eq!(out, "hello\n17\n", "{out}");
    // Through the takeover (lease 2 s, then the reclaim), the lock is never granted to the
    // other mount.
    stays_refused(&other, &path, Duration::from_secs(5), "the dead server");
    drop(held.stdin.take());
    held.wait().unwrap();
    let (granted, _) = granted_within(&other, &path, Instant::now(), Duration::from_secs(20));
    assert!(granted, "the released lock stayed held");
    // What the moved mount did is what the others see, once.
    assert_eq!(
        other.sh_ok("ls d | sort | tr '\\n' ' '"),
        "f0 f1 f10 f11 f12 f13 f14 f2 f3 f4 f5 f6 f7 f8 f9 renamed sub "
    );
    // The survivors' metrics: the view changed to two servers, both decide, and each took over
    // the dead server's files (besides its own joining takeover); every takeover ends.
    for endpoint in &metrics[1..] {
        let deadline = Instant::now() + Duration::from_secs(30);
        let text = loop {
            let text = common::http_get(endpoint, "/metrics");
            let at = |series: &str| common::sample(&text, series).unwrap_or(-1.0);
            let ended: f64 = ["reclaimed", "deadline", "left"]
                .iter()
                .map(|how| {
                    at(&format!(
                        "calm_peers_takeovers_ended_total{{how=\"{how}\"}}"
                    ))
                })
                .sum();
            if at("calm_peers_takeovers_in_grace") == 0.0
                && ended == at("calm_peers_takeovers_total")
            {
                break text;
            }
            assert!(Instant::now() < deadline, "takeovers never ended:\n{text}");
            std::thread::sleep(Duration::from_millis(200));
        };
        let out = common::promtool_check_metrics(&text);
        assert!(out.status.success(), "{out:?}");
        let at = |series: &str| common::sample(&text, series).unwrap_or(-1.0);
        assert_eq!(at("calm_peers_servers"), 2.0, "{text}");
        assert_eq!(at("calm_peers_deciding"), 1.0, "{text}");
        assert!(at("calm_peers_view_changes_total") >= 1.0, "{text}");
        assert!(at("calm_peers_takeovers_total") >= 2.0, "{text}");
        assert!(at("calm_peers_grace_seconds_total") > 0.0, "{text}");
        // What the alert rules in docs/operations/ read of several servers.
        let rules = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/operations/alerts.yml"
        ))
        .unwrap();
        for word in rules.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("calm_peers_") {
                assert!(text.contains(&format!("# TYPE {word} ")), "{word}:\n{text}");
            }
        }
    }
}

/// A server stopped with SIGTERM hands its files over at once instead of leaving them until its
/// lease runs out: with a lease of 30 s, the server exits within `STOP_WAIT_MAX` (5 s) and a
/// margin; a mount of all three servers on it goes on, and a process on that mount keeps the
/// lock it held on a file the stopped server decided (never granted to another meanwhile);
/// once it lets go, a mount of another server is granted the lock well before the lease
/// (stop, then at most the grace of 10 s).
#[test]
fn a_server_stopped_by_sigterm_hands_its_files_over_before_its_lease_runs_out() {
    const LEASE: Duration = Duration::from_secs(30);
    const STOP_BOUND: Duration = Duration::from_secs(10);
    const HANDOVER_BOUND: Duration = Duration::from_secs(20);
    let Moving {
        _private,
        _tmp,
        mut servers,
        moving,
        other,
        path,
        ..
    } = Moving::start_with_lease("sigtermmove", LEASE.as_millis() as u64);
    let mut held = keeper(&moving, &path);
    assert_eq!(other.sh_ok(&try_lock(&path)), "refused 11\n");
    let asked = Instant::now();
    let (status, said) = servers.remove(0).terminate();
    let stopped = asked.elapsed();
    assert!(status.success(), "{status}: {said}");
    assert!(
        stopped < STOP_BOUND,
        "the server took {stopped:?} to stop on SIGTERM"
    );
    // The mount goes on through the others.
    assert_eq!(moving.sh_ok("touch d/after && ls d | wc -l"), "17\n");
    // The lock stays with its holder through the hand-over.
    stays_refused(&other, &path, Duration::from_secs(3), "the stopped server");
    drop(held.stdin.take());
    held.wait().unwrap();
    let (was_granted, granted) = granted_within(&other, &path, asked, LEASE);
    assert!(was_granted, "not granted within the lease");
    assert!(
        granted < HANDOVER_BOUND,
        "granted {granted:?} after SIGTERM: the files waited for the lease"
    );
    eprintln!("stopped in {stopped:?}, the lock granted elsewhere {granted:?} after SIGTERM");
}

/// A process waiting in F_SETLKW through a mount whose server decides the file: that server is
/// killed, and the wait goes on at the file's new decider, to be granted once the holder (on
/// another server's mount) lets go — never an error. (The mount's connection moved to another
/// server and the wait was sent there in the dead server's session, which it refused.)
/// `calm locks` run during the move lists the holder.
#[test]
fn a_lock_wait_through_the_deciders_own_mount_outlives_the_decider() {
    let Moving {
        _private,
        _tmp,
        mut servers,
        moving,
        other,
        path,
        ..
    } = Moving::start("waitmove");
    let mut held = keeper(&other, &path);
    let mut waiter = Command::new("nsenter")
        .args(["-t", &moving.pid().to_string(), "-m", "--", "python3", "-c"])
        .arg(format!(
            "import fcntl\nf = open('{}/{path}', 'r+')\nprint('waiting', flush=True)\n\
             try:\n    fcntl.lockf(f, fcntl.LOCK_EX)\n    print('granted', flush=True)\n\
             except OSError as e:\n    print('error', e.errno, flush=True)\n",
            moving.mnt.display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the waiter");
    let (lines, got) = std::sync::mpsc::channel();
    let stdout = waiter.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let _ = lines.send(line.unwrap_or_default());
        }
    });
    assert_eq!(got.recv().unwrap(), "waiting");
    // In the kernel's wait, at the decider, before the decider dies.
    assert!(
        got.recv_timeout(Duration::from_millis(500)).is_err(),
        "the wait ended while the lock was held"
    );
    servers.remove(0).kill9();
    // `calm locks` asked at once, while the file's decider moves, waits for the move and lists
    // the holder (it failed for seconds).
    let listed = common::calm(&[
        "locks",
        &format!("/{path}"),
        "--server",
        &servers[0].addr,
        "--json",
    ]);
    assert!(listed.status.success(), "{listed:?}");
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(
        listed["locks"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    // Past the dead server's lease (2 s) and the takeover: the holder still holds it, the
    // waiter still waits.
    assert_eq!(
        got.recv_timeout(Duration::from_secs(5)).ok(),
        None,
        "the wait ended while the lock was held"
    );
    drop(held.stdin.take());
    held.wait().unwrap();
    let answer = got.recv_timeout(Duration::from_secs(60));
    let _ = waiter.kill();
    let _ = waiter.wait();
    assert_eq!(answer.as_deref(), Ok("granted"), "the waiter's answer");
}

/// The storage nodes' target registry is one for all servers: a node registered through one
/// server is listed by the others; a complete registration replaces the node's targets, a
/// partial one adds to them; when the server a node registered with dies, the node is listed
/// again once it registers with another.
#[test]
fn the_target_registry_is_shared_by_every_server() {
    let mut private = None;
    let url = cluster("targets", &mut private);
    let tmp = tempfile::tempdir().unwrap();
    let mut servers = three_servers(&url, tmp.path(), 2_000);
    let rt = runtime();
    rt.block_on(async {
        let clients = {
            let mut clients = Vec::new();
            for server in &servers {
                clients.push(Client::connect(&server.addr).await.unwrap());
            }
            clients
        };
        let target = |uuid: &str, index: u32| calm_proto::pb::TargetEntry {
            target_uuid: uuid.into(),
            pool_uuid: "p1".into(),
            pool_name: "pool".into(),
            index,
            count: 3,
            state: "active".into(),
            ..Default::default()
        };
        let uuids = |list: Vec<calm_proto::pb::TargetEntry>| {
            let mut uuids: Vec<(String, String)> =
                list.into_iter().map(|t| (t.node, t.target_uuid)).collect();
            uuids.sort();
            uuids
        };
        let registration = |node: &str, targets, complete| calm_proto::pb::TargetRegistration {
            node: node.into(),
            targets,
            complete,
        };
        clients[0]
            .register_targets(registration(
                "n1",
                vec![target("t1", 0), target("t2", 1)],
                true,
            ))
            .await
            .unwrap();
        clients[1]
            .register_targets(registration("n2", vec![target("t3", 2)], true))
            .await
            .unwrap();
        let all = vec![
            ("n1".to_string(), "t1".to_string()),
            ("n1".to_string(), "t2".to_string()),
            ("n2".to_string(), "t3".to_string()),
        ];
        for client in &clients {
            assert_eq!(uuids(client.list_targets().await.unwrap()), all);
        }
        // Partial adds; complete replaces.
        clients[2]
            .register_targets(registration("n2", vec![target("t4", 0)], false))
            .await
            .unwrap();
        clients[1]
            .register_targets(registration("n1", vec![target("t2", 1)], true))
            .await
            .unwrap();
        let now = vec![
            ("n1".to_string(), "t2".to_string()),
            ("n2".to_string(), "t3".to_string()),
            ("n2".to_string(), "t4".to_string()),
        ];
        assert_eq!(uuids(clients[0].list_targets().await.unwrap()), now);
        // n1 last registered through the second server: when it dies, n1 is gone from the
        // list once that server's lease ran out, and back after it registers elsewhere.
        drop(clients);
    });
    servers.remove(1).kill9();
    rt.block_on(async {
        let first = Client::connect(&servers[0].addr).await.unwrap();
        let started = Instant::now();
        loop {
            let nodes: Vec<String> = first
                .list_targets()
                .await
                .unwrap()
                .into_iter()
                .map(|t| t.node)
                .collect();
            if !nodes.contains(&"n1".to_string()) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "a dead server's registrations outlived its lease"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        first
            .register_targets(calm_proto::pb::TargetRegistration {
                node: "n1".into(),
                targets: vec![calm_proto::pb::TargetEntry {
                    target_uuid: "t2".into(),
                    ..Default::default()
                }],
                complete: true,
            })
            .await
            .unwrap();
        let second = Client::connect(&servers[1].addr).await.unwrap();
        let listed = second.list_targets().await.unwrap();
        assert!(
            listed
                .iter()
                .any(|t| t.node == "n1" && t.target_uuid == "t2")
        );
    });
}

/// A server cut off from etcd (here: stopped with SIGSTOP, so it renews nothing, as across a
/// partition) loses its files to the others once its lease ran out; a lock held through it is
/// reclaimed at the new decider, so nobody else gets it; and when the server comes back it
/// grants nothing on its own before it has joined again (its lease lapsed, or it has read
/// that it is no longer a member, whichever it finds first: the lease arithmetic itself is
/// checked by calm-locks' model test of a simulated cluster).
#[test]
fn a_server_cut_off_from_etcd_stops_deciding_before_others_take_over() {
    let mut private = None;
    let url = cluster("partition", &mut private);
    let tmp = tempfile::tempdir().unwrap();
    let servers = three_servers(&url, tmp.path(), 2_000);
    let rt = runtime();
    rt.block_on(async {
        let a = Client::connect(&servers[0].addr).await.unwrap();
        let members = a.members().await.unwrap();
        let view: Vec<u64> = members.servers.iter().map(|m| m.id).collect();
        // The third server will be cut off; a file it decides.
        let c = Client::connect(&servers[2].addr).await.unwrap();
        let cut = c.members().await.unwrap().me;
        let dir = a.mkdir(ROOT, b"p", 0o755).await.unwrap().handle;
        // Two files it decides: one locked through it, one free.
        let mut files = Vec::new();
        for i in 0..128 {
            let handle = a
                .create(dir, format!("f{i}").as_bytes(), 0o644)
                .await
                .unwrap()
                .handle;
            if owner_of(handle, &view) == Some(cut) {
                files.push(handle);
                if files.len() == 2 {
                    break;
                }
            }
        }
        assert_eq!(files.len(), 2, "not two files decided by the third server");
        let (file, free) = (files[0], files[1]);
        let request_on = |resource: u64, owner: u64| Request {
            resource,
            owner: Owner::File { file: owner },
            scope: Scope::WholeFile,
            kind: LockKind::Write,
        };
        let request = |owner: u64| request_on(file, owner);
        let holder = LockRouter::open(a.clone(), 30_000).await.unwrap();
        tokio::spawn(holder.clone().run());
        let b = Client::connect(&servers[1].addr).await.unwrap();
        let other = LockRouter::open(b, 30_000).await.unwrap();
        tokio::spawn(other.clone().run());
        let answers = holder
            .call(file, &[LockCall::Set(request(1))])
            .await
            .unwrap();
        assert_eq!(answers[0].code, LockCode::Ok);
        // A session straight on the third server, opened while it is whole.
        let direct_session = c.open_lock_session(60_000).await.unwrap();

        servers[2].signal(libc::SIGSTOP);
        // Its lease (2 s) runs out; the others take its files over, the holder reclaims.
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        let answers = other
            .call(file, &[LockCall::Set(request(2))])
            .await
            .unwrap();
        assert_eq!(
            answers[0].code,
            LockCode::Conflict,
            "granted while the holder's lock moved: {answers:?}"
        );

        // The free file is taken through its new decider.
        let answer = other.wait(78, request_on(free, 2), None).await.unwrap();
        assert_eq!(answer.code, LockCode::Ok, "{answer:?}");

        // Back: its lease lapsed while it slept, so it grants nothing (it would grant the free
        // file: its own table is empty there), whatever its clients' views say, until it has
        // joined again and the file is its own once more.
        servers[2].signal(libc::SIGCONT);
        let answers = c
            .lock_batch(direct_session, &[LockCall::Set(request_on(free, 3))])
            .await;
        match answers {
            Ok(answers) => assert_ne!(
                answers[0].code,
                LockCode::Ok,
                "the server cut off granted a lock another holds: {answers:?}"
            ),
            // Its session may be gone (the lease task ran first): nothing granted either.
            Err(failure) => assert!(
                matches!(failure.code, LockCode::Fenced | LockCode::NoSuchSession),
                "{failure}"
            ),
        }
        // The holder lets go; the other client gets it, wherever the file is decided now.
        let answers = holder
            .call(file, &[LockCall::Unlock(request(1))])
            .await
            .unwrap();
        assert_eq!(answers[0].code, LockCode::Ok);
        let answers = other
            .call(free, &[LockCall::Unlock(request_on(free, 2))])
            .await
            .unwrap();
        assert_eq!(answers[0].code, LockCode::Ok);
        let answer = other.wait(77, request(2), None).await.unwrap();
        assert_eq!(answer.code, LockCode::Ok, "{answer:?}");
    });
    drop(servers);
}

/// etcd's own failures, seen through mounts of two of three calm servers: killing the etcd
/// leader during a run of creates changes nothing (every create succeeds); with the quorum
/// lost, an operation fails with EIO within a bounded time; with it back, operations resume and
/// nothing acknowledged is lost.
#[test]
fn etcd_failures_through_mounts_of_three_servers() {
    // A cluster of its own: this test kills members.
    let mut cluster = LocalCluster::start(3).expect("starting etcd");
    const RETRY_MS: u64 = 2_000;
    let url = format!(
        "{}&retry-ms-max={RETRY_MS}&attempt-ms-max=1000",
        cluster.url(&unique_prefix("etcdfail"))
    );
    let tmp = tempfile::tempdir().unwrap();
    let servers = three_servers(&url, tmp.path(), 2_000);
    let a = Mount::remote(&servers[0].addr, &[]);
    let b = Mount::remote(&servers[1].addr, &[]);
    a.sh_ok("mkdir d");
    let creating = std::thread::scope(|scope| {
        let run = scope.spawn(|| a.sh("for i in $(seq 1 300); do echo $i > d/f$i || exit 1; done"));
        std::thread::sleep(Duration::from_millis(300));
        let leader = cluster.leader().expect("finding the leader");
        cluster.kill(leader);
        (run.join().unwrap(), leader)
    });
    let (out, leader) = creating;
    assert!(
        out.status.success(),
        "a create failed while etcd kept its quorum: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(b.sh_ok("ls d | wc -l").trim(), "300");
    // One more member down: no quorum.
    let second = (0..3).find(|&i| i != leader).unwrap();
    cluster.kill(second);
    let started = Instant::now();
    let out = a.sh("echo x > d/during");
    let took = started.elapsed();
    assert!(!out.status.success(), "a create without a quorum succeeded");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Input/output error"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        took < Duration::from_secs(15),
        "a create without a quorum failed only after {took:?}"
    );
    cluster.restart(leader).expect("restarting a member");
    cluster.restart(second).expect("restarting a member");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = a.sh("echo x > d/after");
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "creates did not resume with the quorum back: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // Nothing acknowledged is lost, seen through the other server.
    let listed = b.sh_ok("ls d | grep -c '^f'; cat d/f1 d/f300; test -e d/after && echo after");
    assert_eq!(listed, "300\n1\n300\nafter\n", "{listed}");
}

/// A client sends every mutation (names, contents, attributes) to the one server that commits
/// the namespace's mutations (the decider of the root directory), so that one committer groups
/// them (commits of several servers conflict on the store's commit key and run again); when
/// that server dies, a client with a list of servers sends them to its own server instead, and
/// nothing is applied twice or lost.
#[test]
fn mutations_go_to_the_server_that_commits_them() {
    let mut private = None;
    let url = cluster("placement", &mut private);
    let tmp = tempfile::tempdir().unwrap();
    let mut servers = three_servers(&url, tmp.path(), 2_000);
    let rt = runtime();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let owner = committer_index(&servers);
    rt.block_on(async {
        // The client's own server (the first of its list) is another one.
        let own = (owner + 1) % addrs.len();
        let list: Vec<String> = (0..addrs.len())
            .map(|i| addrs[(own + i) % addrs.len()].clone())
            .collect();
        let client = Client::connect_servers(&list).await.unwrap();
        let ops_committed = |addr: String| async move {
            let client = Client::connect(&addr).await.unwrap();
            client.status().await.unwrap().ops_committed
        };
        let dir = client.mkdir(ROOT, b"d", 0o755).await.unwrap().handle;
        let mut before = Vec::new();
        for addr in &addrs {
            before.push(ops_committed(addr.clone()).await);
        }
        for i in 0..100 {
            let name = format!("f{i}");
            client.create(dir, name.as_bytes(), 0o644).await.unwrap();
        }
        // Contents and attributes too: 20 files written (a small write, kept inline), made
        // longer, changed mode, given and rid of an attribute; 100 commits.
        let first = client.alloc_slices(20).await.unwrap();
        for i in 0..20u64 {
            let file = client
                .lookup(dir, format!("f{i}").as_bytes())
                .await
                .unwrap()
                .handle;
            write_inline(&client, file, first + i, format!("bytes of f{i}")).await;
            client.write(file, &[], 4096, Vec::new()).await.unwrap();
            let mode = SetAttr {
                mode: Some(0o600),
                ..SetAttr::default()
            };
            client.setattr(file, &mode).await.unwrap();
            client.setxattr(file, b"user.k", b"v", 0).await.unwrap();
            client.removexattr(file, b"user.k").await.unwrap();
        }
        let mut after = Vec::new();
        for addr in &addrs {
            after.push(ops_committed(addr.clone()).await);
        }
        let grew: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        assert!(
            grew[owner] >= 200,
            "the committing server committed them: {grew:?}"
        );
        assert!(grew[own] < 10, "the client's own server did not: {grew:?}");
        for i in 0..20u64 {
            let attr = client
                .lookup(dir, format!("f{i}").as_bytes())
                .await
                .unwrap();
            assert_eq!((attr.size, attr.mode & 0o7777), (4096, 0o600), "f{i}");
        }
        // The committer decides as the caller: a user who does not own the file is refused.
        let stranger = client.with_caller(Caller {
            uid: 40004,
            gid: 40004,
            ..Caller::default()
        });
        let file = client.lookup(dir, b"f0").await.unwrap().handle;
        let chmod = SetAttr {
            mode: Some(0o666),
            ..SetAttr::default()
        };
        let refused = stranger.setattr(file, &chmod).await;
        assert!(
            matches!(refused, Err(MetaError::NotPermitted(_))),
            "{refused:?}"
        );
        let refused = stranger.setxattr(file, b"user.k", b"v", 0).await;
        assert!(matches!(refused, Err(MetaError::Access(_))), "{refused:?}");
        assert_eq!(client.getattr(file).await.unwrap().mode & 0o7777, 0o600);
        // The committing server dies under the client's placed connection.
        servers.remove(owner).kill9();
        for i in 100..150 {
            let name = format!("f{i}");
            let file = client
                .create(dir, name.as_bytes(), 0o644)
                .await
                .unwrap()
                .handle;
            let id = client.alloc_slices(1).await.unwrap();
            write_inline(&client, file, id, format!("bytes of {name}")).await;
        }
        for i in 100..150 {
            let name = format!("f{i}");
            let file = client.lookup(dir, name.as_bytes()).await.unwrap().handle;
            let map = client.read_map(file).await.unwrap();
            let expected = format!("bytes of {name}").into_bytes();
            assert_eq!(map.attr.size, expected.len() as u64, "{name}");
            assert_eq!(map.inline.len(), 1, "{name}");
            assert_eq!(map.inline[0].1, expected, "{name}");
        }
        let mut names: Vec<String> = client
            .readdir(dir, 0, 1000)
            .await
            .unwrap()
            .into_iter()
            .map(|e| String::from_utf8(e.name).unwrap())
            .collect();
        names.sort();
        let mut expected: Vec<String> = (0..150).map(|i| format!("f{i}")).collect();
        expected.sort();
        assert_eq!(names, expected, "every create once, none lost");
    });
}

/// Writes `bytes` at the start of `file` as one inline slice `id`.
async fn write_inline(client: &Client, file: u64, id: u64, bytes: String) {
    let len = bytes.len() as u32;
    let slice = Slice {
        id: id | INLINE,
        size: len,
        off: 0,
        len,
        pos: 0,
    };
    let inline = vec![(id | INLINE, bytes.into_bytes())];
    client
        .write(file, &[(0, slice)], u64::from(len), inline)
        .await
        .unwrap();
}

/// A lock's check of its file reads what its server has followed of the store, without a
/// round trip; a file created a moment ago through another server, which that server may not
/// have followed yet, is still found (a refusal is confirmed on a fresh read), so creating a
/// file and locking it at once never fails, whichever servers the two go through.
#[test]
fn a_file_created_through_one_server_is_locked_at_once_through_another() {
    let mut private = None;
    let url = cluster("create-lock", &mut private);
    let tmp = tempfile::tempdir().unwrap();
    let servers = three_servers(&url, tmp.path(), 2_000);
    let rt = runtime();
    rt.block_on(async {
        let client = Client::connect(&servers[0].addr).await.unwrap();
        let dir = client.mkdir(ROOT, b"d", 0o755).await.unwrap().handle;
        let router = LockRouter::open(client.clone(), 30_000).await.unwrap();
        tokio::spawn(router.clone().run());
        for i in 0..200u64 {
            let name = format!("f{i}");
            let file = client
                .create(dir, name.as_bytes(), 0o644)
                .await
                .unwrap()
                .handle;
            let request = Request {
                resource: file,
                owner: Owner::File { file: i + 1 },
                scope: Scope::WholeFile,
                kind: LockKind::Write,
            };
            let answers = router
                .call(file, &[LockCall::Set(request), LockCall::Unlock(request)])
                .await
                .unwrap();
            assert!(
                answers.iter().all(|a| a.code == LockCode::Ok),
                "file {i}: {answers:?}"
            );
        }
        // A handle that names no file is still refused.
        let missing = Request {
            resource: 1 << 40,
            owner: Owner::File { file: 1 },
            scope: Scope::WholeFile,
            kind: LockKind::Write,
        };
        let answers = router
            .call(missing.resource, &[LockCall::Set(missing)])
            .await
            .unwrap();
        assert_eq!(answers[0].code, LockCode::NoSuchFile, "{answers:?}");
    });
}

/// A counter incremented under an exclusive lock by four processes on two mounts (one of all
/// three servers, one of the second) while the server deciding the counter's locks is killed
/// -9: its locks move with their holders, no call fails, and the counter ends at exactly the
/// increments made.
#[test]
fn a_locked_counter_through_three_servers_ends_exact_when_its_decider_dies() {
    let Moving {
        _private,
        _tmp,
        mut servers,
        moving,
        other,
        path,
        ..
    } = Moving::start("counterkill");
    moving.sh_ok(&format!("echo 0 > {path}"));
    let stop = _tmp.path().join("stop").display().to_string();
    let workers: Vec<std::process::Child> = [&moving, &other, &moving, &other]
        .iter()
        .map(|mount| {
            Command::new("nsenter")
                .args(["-t", &mount.pid().to_string(), "-m", "--", "python3"])
                .arg(format!("{}/locked_counter.py", common::PROGRAMS))
                .arg(mount.mnt.join(&path))
                .arg(&stop)
                .stdout(Stdio::piped())
                .spawn()
                .expect("a worker")
        })
        .collect();
    std::thread::sleep(Duration::from_secs(5));
    servers.remove(0).kill9();
    std::thread::sleep(Duration::from_secs(10));
    std::fs::write(&stop, b"").expect("stop");
    let mut total = 0;
    for worker in workers {
        let out = worker.wait_with_output().expect("a worker's end");
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "a worker failed: {said}");
        total += said
            .trim()
            .strip_prefix("done ")
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("unexpected: {said}"));
    }
    let counter = other.sh_ok(&format!("cat {path}"));
    eprintln!("{total} increments through the decider's death; the counter says {counter}");
    assert_eq!(counter.trim().parse::<u64>().expect("a number"), total);
}

/// The index (in `servers`) of the server that commits the namespace's mutations.
fn committer_index(servers: &[Server]) -> usize {
    runtime().block_on(async {
        let probe = Client::connect(&servers[0].addr).await.unwrap();
        let members = probe.members().await.unwrap();
        let mut view: Vec<u64> = members.servers.iter().map(|m| m.id).collect();
        view.sort_unstable();
        let committer = owner_of(COMMITTER_OF, &view).unwrap();
        let address = &members
            .servers
            .iter()
            .find(|m| m.id == committer)
            .unwrap()
            .address;
        servers.iter().position(|s| &s.addr == address).unwrap()
    })
}

/// Creates and unlinks `PAIRS` files in `$MNT/DIR`, one pair after another; prints the pairs
/// per second and the 99th percentile of an unlink in ms.
const CHURN_TIMED: &str = "import os, sys, time\n\
d = os.path.join(os.environ['MNT'], sys.argv[1]); os.makedirs(d, exist_ok=True)\n\
pairs = int(sys.argv[2]); took = []\n\
start = time.monotonic()\n\
for i in range(pairs): p = os.path.join(d, str(i)); open(p, 'w').close(); \
t = time.monotonic(); os.unlink(p); took.append(time.monotonic() - t)\n\
took.sort()\n\
print(round(pairs / (time.monotonic() - start), 1), round(took[len(took) * 99 // 100] * 1000, 2))\n";

/// A mount of a server that does not commit, with files held open on it (any file: the
/// mount names what it has open in each removal, so that a removed open file is kept), sends
/// its unlinks to the committing server like every other mutation: its own server commits
/// none of them, the rate and the tail stay beside those of a mount of the committer, and a
/// file unlinked while open there is still read through its descriptor, then destroyed at
/// its close.
#[test]
fn unlinks_with_files_held_open_go_to_the_committer() {
    let mut private = None;
    let url = cluster("held-open", &mut private);
    let tmp = tempfile::tempdir().unwrap();
    let servers = three_servers(&url, tmp.path(), 2_000);
    let owner = committer_index(&servers);
    let other = (owner + 1) % servers.len();
    let at_other = Mount::remote(&servers[other].addr, &[]);
    let at_owner = Mount::remote(&servers[owner].addr, &[]);
    at_other.sh_ok("echo kept bytes > held && echo other > other-held");
    // Held open on the mount of the server that does not commit: one file read after its
    // unlink, one only held.
    let go = tmp.path().join("go").display().to_string();
    let (mut holder, mut said) = common::spawn_in(
        &at_other,
        &format!(
            "import os, time\nf = open(os.environ['MNT'] + '/held')\n\
             g = open(os.environ['MNT'] + '/other-held')\n\
             print(os.fstat(f.fileno()).st_ino, flush=True)\n\
             while not os.path.exists('{go}'): time.sleep(0.05)\n\
             print(f.read().strip(), flush=True)\n"
        ),
    );
    let held_ino: u64 = said.next().unwrap().unwrap().parse().unwrap();
    let ops_committed = |index: usize| {
        runtime().block_on(async {
            let client = Client::connect(&servers[index].addr).await.unwrap();
            client.status().await.unwrap().ops_committed
        })
    };
    let before = ops_committed(other);
    let timed = |mount: &Mount, dir: &str| -> (f64, f64) {
        let out = mount.sh_ok(&format!(
            "python3 -c \"{}\" {dir} 300",
            CHURN_TIMED.replace('"', "\\\"")
        ));
        let mut figures = out.split_whitespace().map(|f| f.parse::<f64>().unwrap());
        (figures.next().unwrap(), figures.next().unwrap())
    };
    // Another mount creates all the while (its creates go to the committer).
    let stop = tmp.path().join("stop").display().to_string();
    let (mut creator, _) = common::spawn_in(
        &at_owner,
        &format!(
            "import os\nd = os.environ['MNT'] + '/bg'; os.mkdir(d); i = 0\n\
             while not os.path.exists('{stop}'): open(d + '/' + str(i), 'w').close(); i += 1\n"
        ),
    );
    let (rate_other, p99_other) = timed(&at_other, "o");
    let (rate_owner, p99_owner) = timed(&at_owner, "c");
    std::fs::write(&stop, b"").unwrap();
    creator.wait().unwrap();
    let committed_at_other = ops_committed(other) - before;
    eprintln!(
        "300 create+unlink pairs with files held open, another mount creating: through the other server's mount \
         {rate_other} pairs/s, unlink p99 {p99_other} ms; through the committer's mount \
         {rate_owner} pairs/s, p99 {p99_owner} ms; the other server committed \
         {committed_at_other} operations"
    );
    assert!(
        committed_at_other < 10,
        "the mount's own server committed {committed_at_other} of 600 mutations"
    );
    // The open file unlinked there is kept for its holder, and goes at its close.
    at_other.sh_ok("rm held");
    assert!(
        at_owner.sh("cat held").status.code() != Some(0),
        "the name is gone"
    );
    std::fs::write(&go, b"").unwrap();
    assert_eq!(said.next().unwrap().unwrap(), "kept bytes");
    holder.wait().unwrap();
    let client = runtime()
        .block_on(Client::connect(&servers[other].addr))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while runtime().block_on(client.getattr(held_ino)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the unlinked file outlived its last close"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Touches `name` through each mount, each answered at once (no EBUSY, no wait on conflicts).
fn touch_through_each(mounts: &[Mount], name: &str) {
    for (i, mount) in mounts.iter().enumerate() {
        let started = Instant::now();
        let out = mount.sh(&format!("touch {name}.{i}"));
        assert!(
            out.status.success(),
            "touch through mount {i} after {:?}: {}",
            started.elapsed(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "touch through mount {i} took {:?}",
            started.elapsed()
        );
    }
}

/// Three servers on an etcd cluster whose history calm keeps one second: etcd's revision
/// moves without a calm commit (fsck's hold on history, a server killed -9 whose lease runs
/// out), the namespace sits quiet while history is compacted past its last commit, an
/// operator compacts at the current revision: every mount of every server still mutates at
/// once, and a server restarted then starts.
#[test]
fn no_compaction_or_quiet_wedges_a_namespace_on_etcd() {
    let cluster = LocalCluster::start(1).expect("etcd");
    let url = format!("{}&history-s=1", cluster.url("wedge"));
    let tmp = tempfile::tempdir().unwrap();
    let mut servers = three_servers(&url, tmp.path(), 1_000);
    let mounts: Vec<Mount> = servers
        .iter()
        .map(|s| Mount::remote(&s.addr, &[]))
        .collect();
    touch_through_each(&mounts, "first");
    // fsck holds history while it reads, and lets go: the revision moves twice.
    let fsck = common::calm(&["fsck", "--store", &url]);
    assert!(fsck.status.success(), "{fsck:?}");
    std::thread::sleep(Duration::from_secs(3));
    touch_through_each(&mounts, "after-fsck");
    // A server killed -9: its lease runs out (the revision moves), then quiet.
    let objects = format!("file://{}", tmp.path().join("objects").display());
    let last = servers.pop().unwrap();
    drop(mounts);
    last.kill9();
    std::thread::sleep(Duration::from_secs(4));
    let mut mounts: Vec<Mount> = servers
        .iter()
        .map(|s| Mount::remote(&s.addr, &[]))
        .collect();
    touch_through_each(&mounts, "after-kill");
    // An operator compacts at the current revision.
    let endpoint = url
        .strip_prefix("etcd://")
        .and_then(|rest| rest.split(['/', ',']).next())
        .unwrap()
        .to_string();
    let etcdctl = |args: &[&str]| {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoint}"))
            .args(args)
            .output()
            .expect("etcdctl");
        assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    etcdctl(&["put", "another-program", "x"]);
    let status = etcdctl(&["endpoint", "status", "--write-out=json"]);
    let revision = status
        .split("\"revision\":")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .expect("the revision in etcdctl's answer")
        .to_string();
    etcdctl(&["compact", &revision]);
    touch_through_each(&mounts, "after-operator");
    // A server started now, on a namespace whose history is compacted past its last commit.
    std::thread::sleep(Duration::from_secs(3));
    let lease = "1000".to_string();
    let restarted = Server::start_with(
        &tmp.path().join("c2"),
        &[
            "--store",
            &url,
            "--objects",
            &objects,
            "--server-lease-ms",
            &lease,
        ],
    );
    mounts.push(Mount::remote(&restarted.addr, &[]));
    touch_through_each(&mounts, "after-restart");
    let names = mounts[2].sh_ok("ls | sort | tr '\\n' ' '");
    for name in [
        "first.0",
        "after-fsck.2",
        "after-kill.1",
        "after-operator.0",
    ] {
        assert!(names.contains(name), "{name} missing from {names}");
    }
    drop(mounts);
    servers.push(restarted);
}
