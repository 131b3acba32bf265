//! `calm fsck` on a real store: clean after use, and a damaged store is reported with a
//! non-zero exit and a readable list of what is wrong.

use crate::common;

use calm_meta::ROOT;
use calm_meta::layout::{KEY_NAME_HASH, NameHash, inode_key};
use calm_store::lmdb::{LmdbOptions, LmdbStore};
use calm_store::{Store, WriteTxn};
use common::*;

#[test]
fn fsck_passes_a_clean_store_and_reports_a_damaged_one() {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(&tmp);
    let server = Server::start(&data);
    let (dir, file) = runtime().block_on(async {
        let c = calm_client::Client::connect(&server.addr).await.unwrap();
        let d = c.mkdir(ROOT, b"d", 0o755).await.unwrap();
        let f = c.create(d.handle, b"f", 0o644).await.unwrap();
        c.link(f.handle, ROOT, b"f2").await.unwrap();
        c.setxattr(f.handle, b"user.x", b"1", 0).await.unwrap();
        (d.handle, f.handle)
    });
    let (status, _) = server.terminate();
    assert!(status.success());

    let clean = calm(&["fsck", data.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&clean.stdout);
    assert!(clean.status.success(), "{out}");
    assert!(out.contains("clean") && out.contains("MB/s"), "{out}");

    // Damage: drop the directory's name and the file's inode.
    let store = LmdbStore::open(&data, &LmdbOptions::default()).unwrap();
    let mut txn = store.begin().unwrap();
    let names = NameHash::from_value(
        &calm_store::ReadTxn::get(&txn, KEY_NAME_HASH)
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    txn.delete(&names.entry_key(ROOT, b"d")).unwrap();
    txn.delete(&inode_key(file)).unwrap();
    txn.commit().unwrap();
    store.close();

    let damaged = calm(&["fsck", data.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&damaged.stdout);
    assert_eq!(damaged.status.code(), Some(1), "{out}");
    assert!(out.contains("DAMAGED"), "{out}");
    assert!(
        out.contains(&format!("directory {dir} has 0 names")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "points to handle {file}, which is not a live inode"
        )),
        "{out}"
    );
    assert!(out.contains(&format!("xattr of handle {file}")), "{out}");

    let json = calm(&["fsck", data.to_str().unwrap(), "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["clean"], false);
    assert!(report["problem_count"].as_u64().unwrap() >= 3);
}
