//! `calm-testkit`: what calm's tests share, in a crate of its own so that no library a site
//! runs carries a test harness (the architecture test checks that the `calm` binary does not
//! link it). Tests take it as a dev-dependency; the benchmarks link it to start local etcd
//! clusters.
//!
//! - [`conformance`]: the behaviours every [`calm_store::Store`] backend must have.
//! - [`fault`]: [`fault::FaultStore`], a store whose N-th write fails (or panics).
//! - [`etcd`]: local etcd clusters on free ports, and the cluster `scripts/test` shares.
//! - [`fsck_clean`]: the offline verifier's report of a store, which must be clean.

pub mod conformance;
pub mod etcd;
pub mod fault;

use calm_meta::fsck::{self, FsckReport};
use calm_store::Store;

/// Verifies `store` as `calm fsck` does and asserts that nothing is wrong; the report.
pub fn fsck_clean<S: Store>(store: &S) -> FsckReport {
    let snapshot = store.snapshot().expect("a snapshot of the store");
    let report = fsck::check(&snapshot, &mut |_| {}).expect("fsck reads the store");
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
    report
}
