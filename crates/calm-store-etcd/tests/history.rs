//! calm keeps etcd's history short: the history of creates and unlinks that leave no file
//! behind fills a small cluster's space quota when nothing compacts it, and runs through the
//! same quota, with the database no larger than a few seconds of history, when calm does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use calm_meta::{Meta, MetaError, MetaOptions, ROOT};
use calm_store_etcd::cluster::LocalCluster;
use calm_store_etcd::{EtcdOptions, EtcdStore};

/// The clusters' space quota: 3 MiB, which the churn below fills about twice over when its
/// history is kept.
const QUOTA: &str = "3145728";
/// Create+unlink pairs of the churn, from [`TASKS`] tasks at once.
const PAIRS: usize = 8_000;
const TASKS: usize = 32;

fn open(url: &str) -> Arc<Meta<EtcdStore>> {
    let store = EtcdStore::connect(EtcdOptions::from_url(url).unwrap()).expect("connecting");
    Arc::new(Meta::open(store, MetaOptions::default()).expect("opening the namespace"))
}

/// Creates and unlinks `PAIRS` files; the first error, with the pairs done before it.
fn churn(meta: &Arc<Meta<EtcdStore>>) -> Result<usize, (usize, MetaError)> {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let meta = meta.clone();
                tokio::spawn(async move {
                    for i in 0..PAIRS / TASKS {
                        let name = format!("{t}.{i}");
                        let pair = async {
                            meta.create(ROOT, name.as_bytes(), 0o644).await?;
                            meta.unlink(ROOT, name.as_bytes()).await
                        };
                        if let Err(error) = pair.await {
                            return Err((i, error));
                        }
                    }
                    Ok(PAIRS / TASKS)
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

/// The size of the cluster's database file, as etcd reports it.
fn db_size(url: &str) -> i64 {
    let endpoint = url
        .strip_prefix("etcd://")
        .and_then(|rest| rest.split(['/', ',']).next())
        .unwrap()
        .to_string();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        client.status().await.unwrap().db_size()
    })
}

#[test]
fn churn_that_would_fill_the_cluster_with_history_runs_through_when_calm_compacts() {
    // Baseline: history kept for ever (what calm did before it compacted).
    let kept = LocalCluster::start_with(1, &["--quota-backend-bytes", QUOTA]).expect("etcd");
    let url = format!("{}&history-s=0", kept.url("kept"));
    let meta = open(&url);
    match churn(&meta) {
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
    let meta = open(&url);
    let started = Instant::now();
    assert_eq!(churn(&meta).expect("churn with compaction"), PAIRS);
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
    let endpoint = url
        .strip_prefix("etcd://")
        .and_then(|rest| rest.split(['/', ',']).next())
        .unwrap()
        .to_string();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let old = runtime.block_on(async {
        let mut client = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        client
            .get("x", Some(etcd_client::GetOptions::new().with_revision(2)))
            .await
    });
    assert!(
        old.as_ref()
            .is_err_and(|e| e.to_string().contains("compacted")),
        "{old:?}"
    );
    drop(meta);
}
