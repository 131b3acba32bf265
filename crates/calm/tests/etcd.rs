//! Two `calm serve --store etcd://` processes over one etcd cluster (the shared cluster of
//! `scripts/test`, or a private one): one namespace through either server, and kill -9 of one
//! server leaves the other serving everything acknowledged.

use crate::common;

use calm_meta::ROOT;
use common::{Server, runtime};

use common::etcd_url as cluster;

#[test]
fn killing_one_server_leaves_the_other_serving_the_namespace() {
    let mut private = None;
    let url = cluster("servers", &mut private);
    let tmp = tempfile::tempdir().unwrap();
    // --data is not used with --store; each server still gets a directory of its own.
    let a = Server::start_with(&tmp.path().join("a"), &["--store", &url]);
    let b = Server::start_with(&tmp.path().join("b"), &["--store", &url]);
    let rt = runtime();
    rt.block_on(async {
        let ca = calm_client::Client::connect(&a.addr).await.unwrap();
        let cb = calm_client::Client::connect(&b.addr).await.unwrap();
        let dir = ca.mkdir(ROOT, b"shared", 0o755).await.unwrap().handle;
        let mut made = Vec::new();
        for i in 0..40 {
            let (client, name) = if i % 2 == 0 {
                (&ca, format!("a{i}"))
            } else {
                (&cb, format!("b{i}"))
            };
            made.push((
                name.clone(),
                client
                    .create(dir, name.as_bytes(), 0o644)
                    .await
                    .unwrap()
                    .handle,
            ));
        }
        // Each server sees what the other created.
        for (name, handle) in &made {
            assert_eq!(
                ca.lookup(dir, name.as_bytes()).await.unwrap().handle,
                *handle
            );
            assert_eq!(
                cb.lookup(dir, name.as_bytes()).await.unwrap().handle,
                *handle
            );
        }
        drop(ca);
        a.kill9();
        // B keeps serving: everything acknowledged is there, and new work goes on.
        for (name, handle) in &made {
            assert_eq!(
                cb.lookup(dir, name.as_bytes()).await.unwrap().handle,
                *handle
            );
        }
        for i in 0..20 {
            cb.create(dir, format!("after{i}").as_bytes(), 0o644)
                .await
                .unwrap();
        }
        assert_eq!(cb.readdir(dir, 0, 1000).await.unwrap().len(), 60);
    });
    drop(b);
}

/// Mounts of two servers over one etcd cluster keep their caches exact: a change made through
/// the mount of one server is seen through the mount of the other long before the kernel's
/// 60 s timeout (each server publishes what the other commits to its mounts' change streams).
#[test]
fn a_change_through_one_servers_mount_reaches_the_other_servers_mount() {
    let mut private = None;
    let url = cluster("coherent", &mut private);
    let tmp = tempfile::tempdir().unwrap();
    let a = Server::start_with(&tmp.path().join("a"), &["--store", &url]);
    let b = Server::start_with(&tmp.path().join("b"), &["--store", &url]);
    let on_a = common::Mount::remote(&a.addr, &[]);
    let on_b = common::Mount::remote(&b.addr, &[]);
    on_a.sh_ok("mkdir d && touch d/f d/g");
    // B caches them, then A changes them.
    on_b.sh_ok("stat d/f d/g > /dev/null && ls d > /dev/null");
    on_a.sh_ok("chmod 600 d/f && mv d/g d/h && touch d/new");
    let seen = on_b.sh("for _ in $(seq 1000); do
           if [ $(stat -c %a d/f) = 600 ] && [ ! -e d/g ] && [ -e d/h ] \
              && ls d | grep -qx new; then exit 0; fi
           sleep 0.01
         done; exit 1");
    assert!(
        seen.status.success(),
        "the changes through A's server were not seen through B's within 10 s"
    );
}

#[test]
fn fsck_checks_a_namespace_on_etcd_while_its_servers_run() {
    use calm_store::{Store, WriteTxn};
    let mut private = None;
    let url = cluster("fsck", &mut private);
    let tmp = tempfile::tempdir().unwrap();
    let a = Server::start_with(&tmp.path().join("a"), &["--store", &url]);
    let b = Server::start_with(&tmp.path().join("b"), &["--store", &url]);
    let rt = runtime();
    let victim = rt.block_on(async {
        let ca = calm_client::Client::connect(&a.addr).await.unwrap();
        let cb = calm_client::Client::connect(&b.addr).await.unwrap();
        let dir = ca.mkdir(ROOT, b"d", 0o755).await.unwrap().handle;
        let mut last = 0;
        for i in 0..20 {
            let client = if i % 2 == 0 { &ca } else { &cb };
            last = client
                .create(dir, format!("f{i}").as_bytes(), 0o644)
                .await
                .unwrap()
                .handle;
        }
        cb.link(last, ROOT, b"second-name").await.unwrap();
        ca.setxattr(last, b"user.k", b"v", 0).await.unwrap();
        let link = calm_meta::NewNode::symlink(b"d/f0", 0, 0);
        cb.make(ROOT, b"s", &link, true).await.unwrap();
        last
    });
    let fsck = |url: &str| {
        let out = common::calm(&["fsck", "--store", url, "--json"]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
        });
        (out.status.code(), json)
    };
    // Servers running: one revision of the cluster, clean, everything counted.
    let (code, report) = fsck(&url);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["clean"], true, "{report}");
    // The root, d, 20 files and the symlink; 20 names in d, the second name and s in the root.
    assert_eq!(report["inodes"], 23, "{report}");
    assert_eq!(report["directories"], 2, "{report}");
    assert_eq!(report["dentries"], 23, "{report}");
    assert_eq!(report["xattrs"], 1, "{report}");

    // Damage made behind the servers' backs: a file's inode goes, its names stay.
    let store =
        calm_store_etcd::EtcdStore::connect(calm_store_etcd::EtcdOptions::from_url(&url).unwrap())
            .unwrap();
    let mut txn = store.begin().unwrap();
    assert!(txn.delete(&calm_meta::layout::inode_key(victim)).unwrap());
    txn.commit().unwrap();
    let (code, report) = fsck(&url);
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(report["clean"], false, "{report}");
    assert!(
        report["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().contains(&victim.to_string())),
        "the missing inode {victim} is named: {report}"
    );

    // A cluster that does not answer is a clear error (exit 2), not a report.
    let out = common::calm(&[
        "fsck",
        "--store",
        "etcd://127.0.0.1:1/nothing?retry-ms-max=200&attempt-ms-max=100",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("127.0.0.1:1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Neither a data directory and --store, nor neither.
    assert!(!common::calm(&["fsck"]).status.success());
    drop((a, b));
}

/// `calm fsck` over a namespace of two metadata clusters (two key prefixes of one etcd
/// cluster): each cluster checked and the two as one namespace; the stores given in the wrong
/// order, and one cluster alone, said so; a root name kept on the cluster its hash does not
/// place it on, and a root whose mode differs on one cluster, found.
#[test]
fn fsck_checks_a_namespace_over_two_clusters_as_one() {
    use calm_meta::ops::{Done, Op};
    use calm_meta::{Caller, MetaOptions, NewNode, SetAttr};
    use calm_testkit::etcd::{shared_url, unique_prefix};
    let mut private = None;
    let first = cluster("fsck-clusters", &mut private);
    let second = match &private {
        Some(local) => local.url(&unique_prefix("fsck-clusters")),
        None => shared_url(&unique_prefix("fsck-clusters")).expect("the shared cluster"),
    };
    let connect = |url: &str| {
        calm_store_etcd::EtcdStore::connect(calm_store_etcd::EtcdOptions::from_url(url).unwrap())
            .unwrap()
    };
    let make = |parent, name: &str, node| Op::Make {
        parent,
        name: name.as_bytes().to_vec(),
        node,
        exclusive: true,
    };
    let rt = runtime();
    let stores = vec![connect(&first), connect(&second)];
    let ns = calm_clusters::Clusters::open(stores, MetaOptions::default()).unwrap();
    // Twelve top-level trees, placed on the clusters by their names' hashes, a file in each.
    let mut on = [0; 2];
    rt.block_on(async {
        for i in 0..12 {
            let name = format!("top{i}");
            on[ns.cluster_of_name(ROOT, name.as_bytes()).unwrap()] += 1;
            let dir = match ns
                .apply_as(
                    Caller::default(),
                    make(ROOT, &name, NewNode::dir(0o755, 0, 0)),
                )
                .await
                .unwrap()
            {
                Done::Attr(attr) => attr.handle,
                other => panic!("mkdir answered {other:?}"),
            };
            let file = make(dir, "f", NewNode::file(0o644, 0, 0));
            ns.apply_as(Caller::default(), file).await.unwrap();
        }
    });
    assert!(on.iter().all(|n| *n > 0), "12 names spread as {on:?}");
    let fsck = |urls: &[&str], json: bool| {
        let mut args = vec!["fsck"];
        for url in urls {
            args.extend(["--store", url]);
        }
        if json {
            args.push("--json");
        }
        let out = common::calm(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(
            out.status.code(),
            Some(2),
            "the check did not run: {stderr}"
        );
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = fsck(&[&first, &second], true);
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["clean"], true, "{report}");
    // One root, 12 directories, 12 files; 24 names.
    assert_eq!(report["inodes"], 25, "{report}");
    assert_eq!(report["dentries"], 24, "{report}");
    let clusters = report["clusters"].as_array().unwrap();
    assert_eq!(clusters.len(), 2);
    for (index, cluster) in clusters.iter().enumerate() {
        assert_eq!(cluster["clean"], true, "{report}");
        assert_eq!(cluster["inodes"], 1 + 2 * on[index], "{report}");
    }
    let (code, text) = fsck(&[&first, &second], false);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("namespace over 2 clusters: 25 inodes, 24 names"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("clean"), "{text}");

    // In the wrong order: each store is named with the cluster it is.
    let (code, text) = fsck(&[&second, &first], false);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("given as cluster 0 is cluster 1 of 2"),
        "{text}"
    );
    assert!(
        text.contains("given as cluster 1 is cluster 0 of 2"),
        "{text}"
    );
    // One cluster alone: clean, and said to be one of two.
    let (code, text) = fsck(&[&second], false);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("cluster 1 of 2 of its namespace, checked alone"),
        "{text}"
    );

    // Behind the namespace's back: a root name made on the cluster its hash does not place it
    // on (lookups would never find it), and cluster 1's root made private.
    let stray = (0..)
        .map(|i| format!("stray{i}"))
        .find(|name| ns.cluster_of_name(ROOT, name.as_bytes()).unwrap() == 0)
        .unwrap();
    rt.block_on(async {
        let wrong = make(ROOT, &stray, NewNode::dir(0o755, 0, 0));
        ns.meta(1).apply_as(Caller::default(), wrong).await.unwrap();
        let chmod = Op::SetAttr {
            handle: ROOT,
            attr: SetAttr {
                mode: Some(0o700),
                ..SetAttr::default()
            },
        };
        ns.meta(1).apply_as(Caller::default(), chmod).await.unwrap();
    });
    let (code, text) = fsck(&[&first, &second], true);
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(report["clean"], false, "{report}");
    let clusters = report["clusters"].as_array().unwrap();
    assert_eq!(clusters[0]["clean"], true, "{report}");
    let misplaced = format!("name /{stray} is on cluster 1, but its hash places it on cluster 0");
    assert!(
        clusters[1]["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().contains(&misplaced)),
        "{report}"
    );
    let problems = report["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{report}");
    assert!(
        problems[0]
            .as_str()
            .unwrap()
            .contains("mode 700, on cluster 0 0:0 and mode 755"),
        "{report}"
    );
    drop(ns);
}

/// A server on etcd stops on SIGTERM within `STOP_BOUND` with a mount of it open and a lock
/// held through it (it used to wait for ever for the thread following the servers' registry,
/// and for the mount's streams); its new namespace's objects are in its --data directory (they
/// went to ./calm-data/objects of the working directory).
#[test]
fn a_server_on_etcd_stops_on_sigterm_in_bounded_time() {
    // What the README promises: requests in flight get STOP_WAIT_MAX, leaving the registry
    // LEAVE_WAIT_MAX; the mount's watch and the lock wait end at once.
    const STOP_BOUND: std::time::Duration =
        calm_server::STOP_WAIT_MAX.saturating_add(calm_server::LEAVE_WAIT_MAX);
    let mut private = None;
    let url = cluster("sigterm", &mut private);
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start_with(&tmp.path().join("a"), &["--store", &url]);
    let rt = runtime();
    let objects = rt.block_on(async {
        let client = calm_client::Client::connect(&server.addr).await.unwrap();
        client.status().await.unwrap().objects_url
    });
    let data = tmp.path().join("a").canonicalize().unwrap();
    assert_eq!(objects, format!("file://{}/objects", data.display()));
    let took = server.stops_on_sigterm_with_a_mount(STOP_BOUND);
    eprintln!("stopped {took:?} after SIGTERM");
}

/// Quotas with two servers on one etcd namespace: a tree limit holds across both (creates and
/// writes sent to either at once never pass it, and exactly the limit's worth succeed), the
/// usage is exact after one server is killed -9 in the middle (fsck's quota pass and the other
/// server's check), and a limit set through one server holds at once on the other.
#[test]
fn quotas_hold_across_two_servers_on_etcd_and_through_kill_9() {
    use calm_client::{QuotaLimits, QuotaTarget};
    let mut private = None;
    let url = cluster("quota", &mut private);
    let tmp = tempfile::tempdir().unwrap();
    let a = Server::start_with(&tmp.path().join("a"), &["--store", &url]);
    let b = Server::start_with(&tmp.path().join("b"), &["--store", &url]);
    let rt = runtime();
    let (dir, cb) = rt.block_on(async {
        let ca = calm_client::Client::connect(&a.addr).await.unwrap();
        let cb = calm_client::Client::connect(&b.addr).await.unwrap();
        let dir = ca.mkdir(ROOT, b"p", 0o755).await.unwrap().handle;
        let limits = QuotaLimits {
            inodes: 30,
            bytes: 10_000,
            ..QuotaLimits::default()
        };
        ca.set_quota(QuotaTarget::tree(dir), limits).await.unwrap();
        // 80 creates at once, half through each server: exactly 30 are made.
        let tries: Vec<_> = (0..80)
            .map(|i| {
                let client = if i % 2 == 0 { ca.clone() } else { cb.clone() };
                tokio::spawn(
                    async move { client.create(dir, format!("f{i}").as_bytes(), 0o644).await },
                )
            })
            .collect();
        let mut answers = Vec::new();
        for task in tries {
            answers.push(task.await.unwrap());
        }
        let made: Vec<u64> = answers
            .iter()
            .filter_map(|a| a.as_ref().ok().map(|attr| attr.handle))
            .collect();
        assert_eq!(made.len(), 30, "{answers:?}");
        assert!(
            answers
                .iter()
                .filter_map(|a| a.as_ref().err())
                .all(|e| e.errno() == 122),
            "{answers:?}"
        );
        // Sizes grown through both at once: the bytes never pass 10 000.
        let grows: Vec<_> = made
            .iter()
            .enumerate()
            .map(|(i, handle)| {
                let client = if i % 2 == 0 { ca.clone() } else { cb.clone() };
                let attr = calm_meta::SetAttr {
                    size: Some(700),
                    ..calm_meta::SetAttr::default()
                };
                let handle = *handle;
                tokio::spawn(async move { client.setattr(handle, &attr).await })
            })
            .collect();
        let mut grown = 0;
        for task in grows {
            grown += usize::from(task.await.unwrap().is_ok());
        }
        assert_eq!(grown, 14, "10 000 bytes hold 14 files of 700");
        let report = cb.quota(QuotaTarget::tree(dir)).await.unwrap();
        assert_eq!((report.usage.inodes, report.usage.bytes), (30, 9_800));
        drop(ca);
        (dir, cb)
    });
    // A killed -9 while unlinks and creates go through both.
    let ca = rt.block_on(calm_client::Client::connect(&a.addr)).unwrap();
    let storm = rt.spawn({
        let (ca, cb) = (ca.clone(), cb.clone());
        async move {
            for i in 0..200 {
                let client = if i % 2 == 0 { &ca } else { &cb };
                let _ = client.unlink(dir, format!("f{}", i % 80).as_bytes()).await;
                let _ = client.create(dir, format!("g{i}").as_bytes(), 0o644).await;
            }
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    a.kill9();
    let _ = rt.block_on(storm);
    rt.block_on(async {
        assert!(cb.check_quotas().await.unwrap().is_empty());
        // A limit set through B holds at once: no more creates.
        let full = QuotaLimits {
            inodes: 1,
            ..QuotaLimits::default()
        };
        let now = cb.quota(QuotaTarget::tree(dir)).await.unwrap().usage.inodes;
        assert!(now >= 1, "{now}");
        cb.set_quota(QuotaTarget::tree(dir), full).await.unwrap();
        let refused = cb.create(dir, b"one-more", 0o644).await.unwrap_err();
        assert_eq!(refused.errno(), 122);
    });
    let out = common::calm(&["fsck", "--store", &url, "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    drop(b);
}

/// A server on etcd shows how long its requests to the cluster took, as a histogram promtool
/// accepts.
#[test]
fn a_server_on_etcd_shows_its_requests_to_the_cluster() {
    let mut private = None;
    let url = cluster("metrics", &mut private);
    let tmp = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let server = Server::start_with(
        &tmp.path().join("a"),
        &["--store", &url, "--metrics", &metrics],
    );
    let mount = common::Mount::remote(&server.addr, &[]);
    mount.sh_ok("mkdir m && for i in $(seq 20); do : > m/f$i; done");
    let text = common::http_get(&metrics, "/metrics");
    let count = text
        .lines()
        .find_map(|l| l.strip_prefix("calm_store_requests_seconds_count "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(count >= 20.0, "{text}");
    let check = common::promtool_check_metrics(&text);
    assert!(check.status.success(), "{check:?}");
}
