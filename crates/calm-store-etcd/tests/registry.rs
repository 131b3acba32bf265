//! The servers' registry on a real cluster: a server's lock sessions outlive it by its
//! holders lease, so that the servers taking its files over find them, and then go.

use std::time::{Duration, Instant};

use calm_store::Store;
use calm_store_etcd::{EtcdOptions, EtcdStore};
use calm_testkit::etcd::{LocalCluster, shared_url, unique_prefix};

fn store(url: &str) -> EtcdStore {
    EtcdStore::connect(EtcdOptions::from_url(url).unwrap()).expect("connecting")
}

#[test]
fn a_dead_servers_sessions_outlive_it_by_its_holders_lease_and_then_go() {
    let mut private = None;
    let prefix = unique_prefix("holders");
    let url = shared_url(&prefix).unwrap_or_else(|| {
        private
            .get_or_insert_with(|| LocalCluster::start(3).expect("starting etcd"))
            .url(&prefix)
    });
    let (dying, other) = (store(&url), store(&url));
    let (dying, other) = (dying.registry().unwrap(), other.registry().unwrap());
    let session = 0x7_0000_0001;
    dying.join(7, "dying", 1_000, 5_000).unwrap();
    dying.hold(session, "uid:1000").unwrap();
    let listed = |id: u64| other.members().unwrap().servers.iter().any(|s| s.0 == id);
    assert!(listed(7));
    assert_eq!(
        other.holders().unwrap(),
        vec![(session, "uid:1000".to_string())]
    );

    // Renewed: both stay, well past both leases.
    let until = Instant::now() + Duration::from_secs(7);
    while Instant::now() < until {
        assert!(dying.renew().unwrap(), "renewed in time");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(listed(7));
    assert_eq!(
        other.holders().unwrap(),
        vec![(session, "uid:1000".to_string())]
    );

    // The server stops renewing (it died): it leaves the members first; its session stays
    // for the takeover to read, then goes.
    let stopped = Instant::now();
    while listed(7) {
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "member still listed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        other.holders().unwrap(),
        vec![(session, "uid:1000".to_string())],
        "the session outlives the membership"
    );
    while !other.holders().unwrap().is_empty() {
        assert!(
            stopped.elapsed() < Duration::from_secs(20),
            "session still held"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        stopped.elapsed() >= Duration::from_secs(4),
        "kept its holders lease"
    );
}

/// A server whose lease ran out (the cluster stalled longer than the lease, or the server
/// could not reach it) is told so by its next renewal, and joins again: a renewal that
/// failed instead, every time, kept such a server out of the registry for good.
#[test]
fn a_renewal_after_the_lease_ran_out_says_so_and_the_server_joins_again() {
    let mut private = None;
    let prefix = unique_prefix("lapsed");
    let url = shared_url(&prefix).unwrap_or_else(|| {
        private
            .get_or_insert_with(|| LocalCluster::start(3).expect("starting etcd"))
            .url(&prefix)
    });
    let (lapsing, other) = (store(&url), store(&url));
    let (lapsing, other) = (lapsing.registry().unwrap(), other.registry().unwrap());
    let listed = |id: u64| other.members().unwrap().servers.iter().any(|s| s.0 == id);
    for round in 0..3 {
        lapsing.join(9, "lapsing", 1_000, 1_000).unwrap();
        assert!(listed(9), "round {round}: joined");
        assert!(lapsing.renew().unwrap(), "round {round}: renewed in time");
        // No renewal for longer than the lease: it runs out.
        let stopped = Instant::now();
        while listed(9) {
            assert!(
                stopped.elapsed() < Duration::from_secs(10),
                "round {round}: member still listed"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(1_500));
        assert!(
            !lapsing
                .renew()
                .expect("a renewal of a lease that ran out is an answer"),
            "round {round}: a lease that ran out was renewed"
        );
    }
    lapsing.join(9, "lapsing", 1_000, 1_000).unwrap();
    assert!(lapsing.renew().unwrap() && listed(9), "joined again");
}
