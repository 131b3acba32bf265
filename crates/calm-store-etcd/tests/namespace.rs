//! calm's namespace on etcd: two namespaces (two servers) over one cluster serve one
//! namespace; groups over etcd's transaction limit are cut; the leader killed during a create
//! storm fails no create and loses none; a lost quorum fails creates with EIO within a bound
//! counted from each create, and they resume when it returns; churn whose history would fill a
//! small cluster's space quota runs through when calm compacts the history (and fills it when
//! nothing does); history compacted past the last commit never wedges the namespace; a clear
//! of thousands of records is purged within etcd's limit of operations per transaction.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use calm_changelog::{Mask, RecordType};
use calm_meta::{Handle, Meta, MetaError, MetaOptions, ROOT};
use calm_store_etcd::{EtcdOptions, EtcdStore};
use calm_testkit::etcd::{LocalCluster, shared_url, unique_prefix};

/// Taken by the tests that run a cluster of their own (they stop members): one such cluster
/// at a time, so that two do not start, elect and time out against each other on a small
/// machine.
static PRIVATE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn open(url: &str, batch_ops_max: usize) -> Arc<Meta<EtcdStore>> {
    let store = EtcdStore::connect(EtcdOptions::from_url(url).unwrap()).expect("connecting");
    let options = MetaOptions {
        batch_ops_max,
        ..MetaOptions::default()
    };
    Arc::new(Meta::open(store, options).expect("opening the namespace"))
}

/// The shared cluster of the run, or a private one kept alive by `private`.
fn cluster_url(private: &mut Option<LocalCluster>, prefix: &str) -> String {
    if let Some(url) = shared_url(prefix) {
        return url;
    }
    private
        .get_or_insert_with(|| LocalCluster::start(3).expect("starting etcd"))
        .url(prefix)
}

/// Every record of the changelog, in index order.
fn all_records(meta: &Meta<EtcdStore>) -> Vec<calm_changelog::Record> {
    let mut out: Vec<calm_changelog::Record> = Vec::new();
    loop {
        let from = out.last().map_or(0, |r| r.index + 1);
        let batch = meta.changelog_read(from, 4096, usize::MAX, None).unwrap();
        if batch.is_empty() {
            return out;
        }
        out.extend(batch);
    }
}

#[test]
fn two_servers_serve_one_namespace() {
    let mut private = None;
    let url = cluster_url(&mut private, &unique_prefix("two-servers"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let a = open(&url, 16);
    let b = open(&url, 16);
    assert_ne!(
        a.epoch(),
        b.epoch(),
        "each server opens with an epoch of its own"
    );
    runtime.block_on(async {
        a.changelog_register("audit", Mask::all()).await.unwrap();
        let dir_a = a.mkdir(ROOT, b"from-a", 0o755).await.unwrap().handle;
        // B sees A's directory at once (reads go to the cluster).
        let dir_b = b.lookup(ROOT, b"from-a").unwrap().handle;
        assert_eq!(dir_a, dir_b);

        // Both servers create at once, 4 clients each, in the same directory.
        let mut tasks = Vec::new();
        for (server, meta) in [("a", &a), ("b", &b)] {
            for c in 0..4 {
                let meta = meta.clone();
                tasks.push(tokio::spawn(async move {
                    let mut made = Vec::new();
                    for i in 0..25 {
                        let name = format!("{server}.{c}.{i}");
                        let attr = meta.create(dir_a, name.as_bytes(), 0o644).await.unwrap();
                        made.push((name, attr.handle));
                    }
                    made
                }));
            }
        }
        let mut made: Vec<(String, Handle)> = Vec::new();
        for task in tasks {
            made.extend(task.await.unwrap());
        }
        let handles: HashSet<Handle> = made.iter().map(|(_, h)| *h).collect();
        assert_eq!(handles.len(), 200, "a handle was given twice");
        assert!(!handles.contains(&dir_a));
        for (name, handle) in &made {
            for meta in [&a, &b] {
                assert_eq!(meta.lookup(dir_a, name.as_bytes()).unwrap().handle, *handle);
            }
        }
        // A name taken on one server is taken on the other.
        let clash = b.create(dir_a, b"a.0.0", 0o644).await;
        assert!(matches!(clash, Err(MetaError::Exists)), "{clash:?}");

        // The changelog: indices dense from 1, one CREAT per create, in one order both
        // servers read alike.
        let records = all_records(&a);
        assert_eq!(records, all_records(&b));
        for (i, record) in records.iter().enumerate() {
            assert_eq!(record.index, i as u64 + 1, "indices are dense");
        }
        let mut created: Vec<Handle> = records
            .iter()
            .filter(|r| r.kind == RecordType::Create)
            .map(|r| r.target)
            .collect();
        created.sort_unstable();
        let mut expected: Vec<Handle> = handles.into_iter().collect();
        expected.sort_unstable();
        assert_eq!(created, expected, "every create has exactly one record");

        // B's followers learn of A's records without polling: its last index catches up.
        let last = records.last().unwrap().index;
        let deadline = Instant::now() + Duration::from_secs(10);
        while b.changelog_last() < last && Instant::now() < deadline {
            b.changelog_wait(b.changelog_last(), Duration::from_millis(200))
                .await
                .unwrap();
        }
        assert_eq!(b.changelog_last(), last);
        assert_eq!(a.changelog_last(), last);
    });
}

/// A client's acknowledgement jumps by every request answered while an older one waited:
/// here by 300 at once, more records than etcd's 128 operations of a transaction can delete.
/// Each later request deletes a bounded part of them, none fails, and they are all gone
/// after a few.
#[test]
fn a_client_acknowledging_hundreds_at_once_keeps_working() {
    use calm_meta::ops::Op;
    use calm_meta::requests::{RECORD_DELETES_PER_REQUEST, RequestId, key};
    use calm_store::{ReadTxn, Store};
    let mut private = None;
    let base = cluster_url(&mut private, &unique_prefix("acked"));
    let url = base.replace("txn-ops-max=32768", "txn-ops-max=128");
    assert_ne!(url, base);
    let meta = open(&url, 512);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let make = |i: u64| Op::Make {
        parent: ROOT,
        name: format!("f{i}").into_bytes(),
        node: calm_meta::NewNode::file(0o644, 0, 0),
        exclusive: true,
    };
    let request = |seq: u64, acked: u64| {
        runtime.block_on(meta.apply_request(
            calm_meta::Caller::default(),
            make(seq),
            Some(RequestId {
                client: 7,
                seq,
                acked,
            }),
        ))
    };
    let records = || {
        let snapshot = meta.store().snapshot().unwrap();
        let mut seqs = Vec::new();
        snapshot
            .visit(&key(7, 0), &key(8, 0), &mut |k, _| {
                seqs.push(u64::from_be_bytes(k[9..17].try_into().unwrap()));
                std::ops::ControlFlow::Continue(())
            })
            .unwrap();
        seqs
    };
    // 300 requests, none acknowledged (an older one still waits).
    for seq in 1..=300 {
        request(seq, 0).expect("a create");
    }
    assert_eq!(records().len(), 300);
    // Then every one at once, and more requests after.
    let rounds = 300 / RECORD_DELETES_PER_REQUEST as u64 + 2;
    for seq in 301..=300 + rounds {
        if let Err(error) = request(seq, seq - 1) {
            panic!("request {seq} after an acknowledgement of 300 failed: {error}");
        }
    }
    assert_eq!(
        records(),
        vec![300 + rounds],
        "every acknowledged record deleted"
    );
}

#[test]
fn a_group_over_the_transaction_limit_is_cut_not_lost() {
    let mut private = None;
    let base = cluster_url(&mut private, &unique_prefix("split"));
    // etcd's default limit of 128 operations per transaction, and groups of up to 512
    // operations: 64 concurrent creates (5 writes each) cannot fit in one transaction.
    let url = base.replace("txn-ops-max=32768", "txn-ops-max=128");
    assert_ne!(url, base);
    let meta = open(&url, 512);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let meta = meta.clone();
                tokio::spawn(async move {
                    meta.create(ROOT, format!("f{i}").as_bytes(), 0o644)
                        .await
                        .map(|a| a.handle)
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().expect("every create commits");
        }
    });
    assert_eq!(meta.readdir(ROOT, 0, 1000).unwrap().len(), 64);
    // An operation that alone is over the request limit gets a clear error.
    let status = runtime.block_on(meta.setxattr(ROOT, b"user.big", &vec![0u8; 60_000], 0));
    if let Err(error) = status {
        panic!("a 60 kB attribute is within every limit: {error}");
    }
}

#[test]
fn killing_the_leader_during_a_create_storm_fails_no_create_and_loses_nothing() {
    // A cluster of its own: this test kills one of its members.
    let _alone = PRIVATE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = LocalCluster::start(3).expect("starting etcd");
    let url = cluster.url(&unique_prefix("member-kill"));
    let meta = open(&url, 16);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let leader = cluster.leader().expect("finding the leader");
    // The storm goes on until this many creates were acknowledged after the kill (a minute
    // at most: a storm that stopped fails below).
    const AFTER_KILL_WANTED: u64 = 200;
    let (acked, after_kill, failed) = runtime.block_on(async {
        meta.changelog_register("audit", Mask::all()).await.unwrap();
        let killed = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let after_kill = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let tasks: Vec<_> = (0..8)
            .map(|c| {
                let (meta, killed, stop) = (meta.clone(), killed.clone(), stop.clone());
                let (after_kill, failed) = (after_kill.clone(), failed.clone());
                tokio::spawn(async move {
                    let mut acked = Vec::new();
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let name = format!("{c}.{i}");
                        i += 1;
                        let was_killed = killed.load(Ordering::Relaxed);
                        match meta.create(ROOT, name.as_bytes(), 0o644).await {
                            Ok(attr) => {
                                acked.push((name, attr.handle));
                                if was_killed {
                                    after_kill.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            // A member lost while the others keep the quorum is the
                            // store's to hide: no create may fail.
                            Err(error) => failed.lock().unwrap().push(format!("{name}: {error}")),
                        }
                    }
                    acked
                })
            })
            .collect();
        while tasks.iter().all(|t| !t.is_finished()) && meta.changelog_last() < 200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Kill the leader: the hardest member to lose (an election follows).
        tokio::task::block_in_place(|| cluster.kill(leader));
        killed.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(60);
        while after_kill.load(Ordering::Relaxed) < AFTER_KILL_WANTED && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let mut acked = Vec::new();
        for task in tasks {
            acked.extend(task.await.unwrap());
        }
        let failed = std::mem::take(&mut *failed.lock().unwrap());
        (acked, after_kill.load(Ordering::Relaxed), failed)
    });
    assert!(
        failed.is_empty(),
        "creates failed although two members of three kept the quorum: {failed:?}"
    );
    assert!(
        after_kill >= AFTER_KILL_WANTED,
        "the storm stopped when a member died: {after_kill} creates in a minute after the kill"
    );
    // Read everything back through a fresh connection to the two members left.
    drop(meta);
    let check = open(&url, 16);
    for (name, handle) in &acked {
        let found = check.lookup(ROOT, name.as_bytes());
        assert_eq!(
            found.map(|a| a.handle).ok(),
            Some(*handle),
            "acknowledged create {name} is lost"
        );
    }
    let records = all_records(&check);
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record.index, i as u64 + 1, "indices are dense");
    }
    let recorded: HashSet<Handle> = records.iter().map(|r| r.target).collect();
    for (name, handle) in &acked {
        assert!(recorded.contains(handle), "{name} has no record");
    }
    eprintln!(
        "{} creates acknowledged, {after_kill} of them after the leader was killed",
        acked.len()
    );
}

/// The clusters' space quota: 3 MiB, which the churn below fills more than one and a half times
/// over when its history is kept (about 9 000 pairs fill it: fewer as the history a pair
/// leaves grew, more as it shrank; 7 000 when this test was written).
const QUOTA: &str = "3145728";
/// Create+unlink pairs of the churn, from [`TASKS`] tasks at once.
const PAIRS: usize = 16_000;
const TASKS: usize = 32;

/// Creates and unlinks `pairs` files; the first error, with the pairs done before it.
fn churn(meta: &Arc<Meta<EtcdStore>>, pairs: usize) -> Result<usize, (usize, MetaError)> {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let meta = meta.clone();
                tokio::spawn(async move {
                    for i in 0..pairs / TASKS {
                        let name = format!("{t}.{i}");
                        let pair = async {
                            meta.create(ROOT, name.as_bytes(), 0o644).await?;
                            meta.unlink(ROOT, name.as_bytes()).await
                        };
                        if let Err(error) = pair.await {
                            return Err((i, error));
                        }
                    }
                    Ok(pairs / TASKS)
                })
            })
            .collect();
        let (mut done, mut first_error) = (0, None);
        for task in tasks {
            match task.await.unwrap() {
                Ok(n) => done += n,
                Err((n, error)) => {
                    done += n;
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            None => Ok(done),
            Some(error) => Err((done, error)),
        }
    })
}

/// A plain etcd client of the first member named in `url`.
async fn etcd_client(url: &str) -> etcd_client::Client {
    let endpoint = url
        .strip_prefix("etcd://")
        .and_then(|rest| rest.split(['/', ',']).next())
        .unwrap()
        .to_string();
    etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap()
}

/// The size of the cluster's database file, as etcd reports it.
fn db_size(url: &str) -> i64 {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async { etcd_client(url).await.status().await.unwrap().db_size() })
}

#[test]
fn churn_that_would_fill_the_cluster_with_history_runs_through_when_calm_compacts() {
    // Baseline: history kept for ever (what calm did before it compacted).
    let kept = LocalCluster::start_with(1, &["--quota-backend-bytes", QUOTA]).expect("etcd");
    let url = format!("{}&history-s=0", kept.url("kept"));
    let meta = open(&url, MetaOptions::default().batch_ops_max);
    match churn(&meta, PAIRS) {
        Err((done, MetaError::NoSpace(message))) => {
            eprintln!("history kept: the quota refused writes after {done} pairs ({message})");
            assert!(done < PAIRS * 3 / 4, "filled late: {done} pairs");
        }
        other => panic!("history kept for ever did not fill the quota: {other:?}"),
    }
    drop(meta);
    drop(kept);

    // calm compacting, with a history of one second (a compaction every 200 ms).
    let compacted = LocalCluster::start_with(1, &["--quota-backend-bytes", QUOTA]).expect("etcd");
    let url = format!("{}&history-s=1", compacted.url("compacted"));
    let meta = open(&url, MetaOptions::default().batch_ops_max);
    let started = Instant::now();
    assert_eq!(churn(&meta, PAIRS).expect("churn with compaction"), PAIRS);
    let took = started.elapsed();
    // The compactor reads the revision each period and compacts a second behind it.
    std::thread::sleep(Duration::from_millis(1500));
    let stats = meta.store().stats();
    let compactions = stats.compactions.load(std::sync::atomic::Ordering::Relaxed);
    let size = db_size(&url);
    eprintln!(
        "compacted: {PAIRS} pairs in {took:?}, {compactions} compactions, database {size} bytes"
    );
    assert!(compactions >= 2, "{compactions} compactions in {took:?}");
    assert!(
        size < 3 << 20,
        "the database holds {size} bytes after {PAIRS} pairs that leave nothing"
    );
    // What was compacted is gone: a read at the first revisions fails as etcd says.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let old = runtime.block_on(async {
        etcd_client(&url)
            .await
            .get("x", Some(etcd_client::GetOptions::new().with_revision(2)))
            .await
    });
    assert!(
        old.as_ref()
            .is_err_and(|e| e.to_string().contains("compacted")),
        "{old:?}"
    );
    // A hold (what fsck takes for its snapshot) keeps history from its revision, through
    // more churn, until it is let go.
    let compacted = || {
        meta.store()
            .stats()
            .compacted_revision
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let hold = meta.store().hold_history().expect("holding history");
    churn(&meta, 512).expect("churn while held");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        compacted() <= hold.revision(),
        "compacted to {} past the hold at {}",
        compacted(),
        hold.revision()
    );
    let held = hold.revision();
    drop(hold);
    churn(&meta, 64).expect("churn after the hold");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        compacted() > held,
        "still at {} after the hold",
        compacted()
    );
    drop(meta);
}

/// etcd's revision moves without a calm commit (a hold taken and let go, as fsck does; a key
/// of another program; a lease running out), the namespace sits quiet while calm compacts
/// history past its last commit, and an operator compacts at the current revision: every
/// mutation still goes through at once, from every server, and a server opens.
#[test]
fn history_compacted_past_the_last_commit_never_wedges_the_namespace() {
    let _one = PRIVATE_CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = LocalCluster::start(1).expect("etcd");
    // A second of history: compacted every 200 ms.
    let url = format!("{}&history-s=1", cluster.url("wedge"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let a = open(&url, 16);
    let b = open(&url, 16);
    let create = |meta: &Arc<Meta<EtcdStore>>, name: &str| {
        let started = Instant::now();
        runtime
            .block_on(meta.create(ROOT, name.as_bytes(), 0o644))
            .unwrap_or_else(|e| panic!("creating {name} after {:?}: {e:?}", started.elapsed()));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "creating {name} took {:?}",
            started.elapsed()
        );
    };
    create(&a, "first");
    create(&b, "second");
    let moved = |round: usize| {
        // A hold on history taken and let go (fsck's), and a key of another program.
        drop(a.store().hold_history().expect("hold"));
        runtime.block_on(async {
            let mut client = etcd_client(&url).await;
            for i in 0..3 {
                client
                    .put(format!("other-program/{round}/{i}"), "x", None)
                    .await
                    .unwrap();
            }
        });
    };
    for round in 0..3 {
        moved(round);
        // Quiet, while calm compacts past its last commit.
        let compacted = || a.store().stats().compacted_revision.load(Ordering::Relaxed);
        let compacted_before = compacted();
        std::thread::sleep(Duration::from_millis(2500));
        assert!(compacted() > compacted_before, "no compaction in the quiet");
        create(&a, &format!("a{round}"));
        create(&b, &format!("b{round}"));
        create(&a, &format!("a{round}.again"));
    }
    // An operator compacts at the current revision.
    moved(3);
    runtime.block_on(async {
        let mut client = etcd_client(&url).await;
        let revision = client
            .get("x", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        client.compact(revision, None).await.unwrap();
    });
    create(&b, "after-operator");
    create(&a, "after-operator-a");
    // A server opens on the namespace, and creates.
    moved(4);
    std::thread::sleep(Duration::from_millis(2500));
    let c = open(&url, 16);
    create(&c, "from-a-new-server");
    for name in [
        "first",
        "second",
        "a2",
        "b2",
        "after-operator",
        "from-a-new-server",
    ] {
        assert!(c.lookup(ROOT, name.as_bytes()).is_ok(), "{name}");
    }
}

/// A reader clears thousands of records at once, more than one etcd transaction may delete:
/// the purge goes in steps that fit the cluster's limit, alongside creates from two servers
/// and alone when they stop, until the changelog holds nothing cleared; no create fails and
/// no clear is refused.
#[test]
fn a_clear_of_thousands_of_records_is_purged_within_the_transaction_limit() {
    let mut private = None;
    // etcd's default limit of operations per transaction (the test clusters allow more).
    let url = format!(
        "{}&txn-ops-max=128",
        cluster_url(&mut private, &unique_prefix("purge"))
    );
    let a = open(&url, 16);
    let b = open(&url, 16);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let reader = runtime
        .block_on(a.changelog_register("follower", Mask::all()))
        .unwrap();
    // 3 000 records: each create writes one.
    let create_many = |meta: &Arc<Meta<EtcdStore>>, prefix: &str, count: usize| {
        runtime.block_on(async {
            let tasks: Vec<_> = (0..8)
                .map(|t| {
                    let meta = meta.clone();
                    let prefix = prefix.to_string();
                    tokio::spawn(async move {
                        for i in 0..count / 8 {
                            let name = format!("{prefix}.{t}.{i}");
                            meta.create(ROOT, name.as_bytes(), 0o644).await.unwrap();
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        })
    };
    create_many(&a, "a", 1600);
    create_many(&b, "b", 1600);
    let last = a.changelog_last().max(b.changelog_last());
    assert!(last >= 3200, "{last} records");
    // The records of one group of creates share a key on etcd: fewer keys than records.
    let prefix = EtcdOptions::from_url(&url).unwrap().prefix;
    let log_keys = runtime.block_on(async {
        let start = [prefix.as_bytes(), b"/d/", &[calm_store::LOG_FAMILY, 0]].concat();
        let end = [prefix.as_bytes(), b"/e"].concat();
        etcd_client(&url)
            .await
            .get(
                start,
                Some(
                    etcd_client::GetOptions::new()
                        .with_range(end)
                        .with_count_only(),
                ),
            )
            .await
            .unwrap()
            .count()
    });
    eprintln!("{last} records in {log_keys} keys");
    assert!(
        (log_keys as u64) < last / 2,
        "{last} records in {log_keys} keys"
    );
    // Cleared through b (the other server), in one call.
    runtime
        .block_on(b.changelog_clear(reader.id, last))
        .expect("clearing thousands of records at once");
    // Purged while creates go on, then alone.
    create_many(&a, "after", 400);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let users = a.changelog_users().unwrap();
        if users.first > last {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the changelog still starts at {} of {last} cleared",
            users.first
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let purged = a.status().unwrap().changelog_purged + b.status().unwrap().changelog_purged;
    eprintln!("{purged} records purged of {last} cleared");
    assert!(purged >= last, "{purged} purged of {last}");
    let failed = a.status().unwrap().failed_commits + b.status().unwrap().failed_commits;
    assert_eq!(failed, 0, "no group failed");
    // What was not cleared is still there, in order.
    let records = all_records(&a);
    assert!(records.iter().all(|r| r.index > last));
    assert!(records.len() >= 400);
}

/// Without a quorum for longer than a call's bound, with creates from many tasks at once
/// (they queue behind the group that waits on the cluster): every create is answered within
/// its bound, counted from when it was made (twice `retry-ms-max`, as for one alone), not
/// after the groups queued before it have each run their time; once the quorum is back the
/// creates succeed again; nothing acknowledged is lost.
#[test]
fn losing_the_quorum_answers_every_waiting_create_within_its_bound() {
    let _alone = PRIVATE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = LocalCluster::start(3).expect("starting etcd");
    const RETRY_MS: u64 = 2_000;
    const OUTAGE: Duration = Duration::from_millis(4 * RETRY_MS + 1_500);
    let url = format!(
        "{}&retry-ms-max={RETRY_MS}&attempt-ms-max=1000",
        cluster.url(&unique_prefix("quorum-many"))
    );
    let meta = open(&url, 16);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    // (task, start, took, ok) of every create.
    type Answered = (usize, Duration, Duration, bool);
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (meta, stop) = (meta.clone(), stop.clone());
            runtime.spawn(async move {
                let mut answered: Vec<Answered> = Vec::new();
                let mut acked = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("{t}.{i}");
                    i += 1;
                    let at = started.elapsed();
                    let created = meta.create(ROOT, name.as_bytes(), 0o644).await;
                    answered.push((t, at, started.elapsed() - at, created.is_ok()));
                    match created {
                        Ok(attr) => acked.push((name, attr.handle)),
                        Err(MetaError::Io(_)) => {}
                        Err(other) => panic!("{name}: {other:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (answered, acked)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let leader = cluster.leader().expect("finding the leader");
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let lost = started.elapsed();
    for &i in &others {
        cluster.kill(i);
    }
    std::thread::sleep(OUTAGE);
    for &i in &others {
        cluster.restart(i).expect("restarting a member");
    }
    let back = started.elapsed();
    std::thread::sleep(Duration::from_secs(8));
    stop.store(true, Ordering::Relaxed);
    let mut answered = Vec::new();
    let mut acked = Vec::new();
    for task in tasks {
        let (a, k) = runtime.block_on(task).unwrap();
        answered.extend(a);
        acked.extend(k);
    }
    let failed: Vec<&Answered> = answered.iter().filter(|a| !a.3).collect();
    let slowest = failed.iter().map(|a| a.2).max().unwrap_or_default();
    let after_back = failed.iter().filter(|a| a.1 + a.2 > back).count();
    eprintln!(
        "quorum lost at {lost:?} for {OUTAGE:?}: {} creates, {} failed, the slowest failure \
         answered after {slowest:?}, {after_back} failures answered after the quorum was back",
        answered.len(),
        failed.len()
    );
    assert!(!failed.is_empty(), "no create failed without a quorum");
    let bound = Duration::from_millis(2 * RETRY_MS + 1_000);
    for (t, at, took, _) in &failed {
        assert!(
            *took < bound,
            "task {t}'s create made at {at:?} failed after {took:?}"
        );
    }
    // The last creates, with the quorum back, succeeded.
    for t in 0..8 {
        let last = answered.iter().filter(|a| a.0 == t).max_by_key(|a| a.1);
        assert!(
            last.is_some_and(|a| a.3),
            "task {t}'s last create: {last:?}"
        );
    }
    drop(meta);
    let check = open(&url, 16);
    for (name, handle) in &acked {
        assert_eq!(
            check.lookup(ROOT, name.as_bytes()).map(|a| a.handle).ok(),
            Some(*handle),
            "acknowledged create {name} is lost"
        );
    }
}
