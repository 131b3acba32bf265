//! Locks through the real server: conflicts with the holder over the wire, a waiting request
//! completed by the release (no polling), cancel (EINTR), deadlock, batching, a lease that runs
//! out releasing read and write locks and waking waiters, fencing of the expired session and of
//! sessions from before a restart, `calm locks PATH`, and lock counts in `calm status`.

use crate::common;

use std::time::{Duration, Instant};

use calm_client::Client;
use calm_locks::{LockKind, Owner, Range, Request, Scope};
use calm_meta::ROOT;
use calm_proto::locks::{LockCall, LockCode};
use common::*;

const P1: Owner = Owner::Process { pid: 4001 };
const P2: Owner = Owner::Process { pid: 4002 };

fn request(file: u64, owner: Owner, start: u64, end: u64, kind: LockKind) -> Request {
    Request {
        resource: file,
        owner,
        scope: Scope::Range(Range { start, end }),
        kind,
    }
}

#[test]
fn conflicts_waits_cancel_deadlock_and_batches_over_the_wire() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&data_dir(&tmp));
    runtime().block_on(async {
        let c = Client::connect(&server.addr).await.unwrap();
        let file = c.create(ROOT, b"f", 0o644).await.unwrap().handle;
        let a = c.open_lock_session(30_000).await.unwrap();
        let b = c.open_lock_session(30_000).await.unwrap();

        // A conflict names its holder, with the pid F_GETLK reports.
        let held = request(file, P1, 0, 99, LockKind::Write);
        let answers = c.lock_batch(a, &[LockCall::Set(held)]).await.unwrap();
        assert!(answers[0].is_ok(), "{answers:?}");
        let wanted = request(file, P2, 50, 50, LockKind::Read);
        let answers = c
            .lock_batch(b, &[LockCall::Set(wanted), LockCall::Test(wanted)])
            .await
            .unwrap();
        for answer in &answers {
            assert_eq!(answer.code, LockCode::Conflict);
            let holder = answer.conflict.unwrap();
            assert_eq!(
                (holder.session, holder.owner, holder.owner.pid()),
                (a, P1, 4001)
            );
        }

        // A waiting request completes when the holder releases, with no polling.
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move { c.lock_wait(b, 1, wanted).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "it must wait");
        let listing = c.list_locks(file).await.unwrap();
        assert_eq!(listing.waiting.len(), 1);
        c.lock_batch(a, &[LockCall::Unlock(held)]).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("granted on release")
            .unwrap()
            .unwrap();
        assert!(answer.is_ok(), "{answer:?}");

        // Cancel (EINTR) leaves nothing behind.
        let writer = request(file, P1, 0, 99, LockKind::Write);
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move { c.lock_wait(a, 7, writer).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(c.lock_cancel(a, 7).await.unwrap());
        let answer = waiter.await.unwrap().unwrap();
        assert_eq!(answer.code, LockCode::Cancelled);
        assert!(
            !c.lock_cancel(a, 7).await.unwrap(),
            "nothing left to cancel"
        );
        let listing = c.list_locks(file).await.unwrap();
        assert!(listing.waiting.is_empty());
        assert_eq!(listing.locks.len(), 1, "only b's read lock");

        // Deadlock: a waits for b's read lock; b asking for a's lock gets EDEADLK.
        let second = c.create(ROOT, b"g", 0o644).await.unwrap().handle;
        let a_holds = request(second, P1, 0, 0, LockKind::Write);
        assert!(c.lock_batch(a, &[LockCall::Set(a_holds)]).await.unwrap()[0].is_ok());
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move {
                c.lock_wait(a, 8, request(file, P1, 50, 50, LockKind::Write))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let answer = c
            .lock_wait(b, 9, request(second, P2, 0, 0, LockKind::Read))
            .await
            .unwrap();
        assert_eq!(answer.code, LockCode::Deadlock);
        assert_eq!(answer.code.errno(), 35);
        // b releases everything: a gets its lock.
        let answers = c
            .lock_batch(b, &[LockCall::Release(P2, None)])
            .await
            .unwrap();
        assert_eq!(answers[0].released, 1);
        assert!(waiter.await.unwrap().unwrap().is_ok());

        // A batch of many operations, each answered; bad ones get their own error.
        let calls: Vec<LockCall> = (0..1000)
            .map(|i| LockCall::Set(request(second, P2, 10 + 2 * i, 10 + 2 * i, LockKind::Write)))
            .collect();
        let answers = c.lock_batch(b, &calls).await.unwrap();
        assert_eq!(answers.len(), 1000);
        assert!(answers.iter().all(|a| a.is_ok()));
        let missing = request(999_999, P2, 0, 0, LockKind::Write);
        let answers = c.lock_batch(b, &[LockCall::Set(missing)]).await.unwrap();
        assert_eq!(answers[0].code, LockCode::NoSuchFile);
        assert_eq!(c.list_locks(second).await.unwrap().total, 1001);
    });
    let out = calm(&["locks", "/g", "--server", &server.addr]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("1001 locks, 0 waiting"), "{text}");
    assert!(text.contains("POSIX  WRITE"), "{text}");
    let out = calm(&["locks", "/nope", "--server", &server.addr]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
    let status = calm(&["status", "--server", &server.addr, "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["locks"], 1001 + 1);
    assert_eq!(status["lock_sessions"], 2);
    assert_eq!(status["locked_files"], 2);
}

#[test]
fn an_expired_lease_releases_everything_and_the_session_is_fenced() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&data_dir(&tmp));
    let rt = runtime();
    let (file, old_session) = rt.block_on(async {
        let c = Client::connect(&server.addr).await.unwrap();
        let file = c.create(ROOT, b"f", 0o644).await.unwrap().handle;
        let short = c.open_lock_session(300).await.unwrap();
        let long = c.open_lock_session(60_000).await.unwrap();
        let calls = [
            LockCall::Set(request(file, P1, 0, 9, LockKind::Write)),
            LockCall::Set(request(file, P1, 20, 29, LockKind::Read)),
            LockCall::Set(Request {
                resource: file,
                owner: Owner::File { file: 3 },
                scope: Scope::WholeFile,
                kind: LockKind::Write,
            }),
        ];
        assert!(
            c.lock_batch(short, &calls)
                .await
                .unwrap()
                .iter()
                .all(|a| a.is_ok())
        );
        let started = Instant::now();
        // The other session waits for each kind of lock the short one holds.
        let waits = [
            request(file, P2, 5, 5, LockKind::Read),
            request(file, P2, 25, 25, LockKind::Write),
            Request {
                resource: file,
                owner: Owner::File { file: 4 },
                scope: Scope::WholeFile,
                kind: LockKind::Read,
            },
        ];
        let mut waiters = Vec::new();
        for (tag, w) in waits.into_iter().enumerate() {
            let c = c.clone();
            waiters.push(tokio::spawn(async move {
                c.lock_wait(long, tag as u64, w).await
            }));
        }
        for waiter in waiters {
            let answer = tokio::time::timeout(Duration::from_secs(10), waiter)
                .await
                .expect("woken when the lease ran out")
                .unwrap()
                .unwrap();
            assert!(answer.is_ok(), "{answer:?}");
        }
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "not before the lease ran out"
        );
        // The short session comes back: refused, and told why.
        let refused = c
            .lock_batch(
                short,
                &[LockCall::Set(request(file, P1, 100, 100, LockKind::Read))],
            )
            .await
            .unwrap_err();
        assert_eq!(refused.code, LockCode::Fenced);
        assert!(refused.message.contains("expired"), "{refused}");
        assert_eq!(
            c.keep_alive(short).await.unwrap_err().code,
            LockCode::Fenced
        );
        let listing = c.list_locks(file).await.unwrap();
        assert!(
            listing.locks.iter().all(|h| h.session == long),
            "{listing:?}"
        );
        assert!(c.keep_alive(long).await.unwrap() > 0);
        (file, long)
    });
    // After a restart every session of the earlier life is fenced, never reused.
    drop(server);
    let server = Server::start(&data_dir(&tmp));
    rt.block_on(async {
        let c = Client::connect(&server.addr).await.unwrap();
        let answer = c
            .lock_batch(
                old_session,
                &[LockCall::Test(request(file, P1, 0, 0, LockKind::Read))],
            )
            .await
            .unwrap_err();
        assert_eq!(answer.code, LockCode::Fenced);
        let fresh = c.open_lock_session(1_000).await.unwrap();
        assert!(fresh > old_session);
        assert_eq!(
            c.open_lock_session(10).await.unwrap_err().code,
            LockCode::BadLease
        );
    });
}
