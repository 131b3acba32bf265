//! The one door to the metadata stores: every command that opens a store itself (serve, an
//! embedded mount, fsck, gc, dump, load) opens it here, so that a new kind of store is
//! added here (and in its crate) alone. What a command then does with the store is an
//! [`OnStore`]: written once, run on whichever kind of store was named.

use std::path::Path;

use anyhow::{Context, anyhow};
use calm_store::Store;
use calm_store::lmdb::{LmdbOptions, LmdbStore};
use calm_store_etcd::{EtcdOptions, EtcdStore};

/// Where a namespace's metadata is: a data directory's embedded store, or an etcd cluster.
#[derive(Debug, Clone, Copy)]
pub enum StoreAt<'a> {
    Dir(&'a Path),
    Etcd(&'a str),
}

impl<'a> StoreAt<'a> {
    /// The store a command names with `--data DIR` or `--store URL` (the directory first).
    pub fn named(data: Option<&'a Path>, store: Option<&'a str>) -> Option<StoreAt<'a>> {
        match (data, store) {
            (Some(data), _) => Some(StoreAt::Dir(data)),
            (None, Some(url)) => Some(StoreAt::Etcd(url)),
            (None, None) => None,
        }
    }

    /// How a user names it.
    pub fn describe(&self) -> String {
        match self {
            StoreAt::Dir(dir) => dir.display().to_string(),
            StoreAt::Etcd(url) => url.to_string(),
        }
    }
}

/// What a command does with an open store, whichever kind it is.
pub trait OnStore {
    type Out;
    fn run<S: Store>(self, store: &S) -> anyhow::Result<Self::Out>;
}

/// Opens the store to read it as it is: a data directory's read-only, after replaying what its
/// write-ahead log holds (a server that stopped uncleanly; the count is said on standard
/// error unless `quiet`), a cluster's as its servers run.
pub fn read<W: OnStore>(at: StoreAt, quiet: bool, work: W) -> anyhow::Result<W::Out> {
    match at {
        StoreAt::Dir(data) => {
            let (store, replayed) = open_offline(data)?;
            if replayed > 0 && !quiet {
                eprintln!("recovered {replayed} commits from the write-ahead log");
            }
            work.run(&store)
        }
        StoreAt::Etcd(url) => work.run(&connect_etcd(url)?),
    }
}

/// Opens the store to write into it while no server serves it: a data directory locked for
/// the time (with its write-ahead log, closed cleanly after), a cluster as it is.
pub fn write<W: OnStore>(at: StoreAt, work: W) -> anyhow::Result<W::Out> {
    match at {
        StoreAt::Dir(data) => {
            let options = LmdbOptions {
                wal: true,
                ..LmdbOptions::default()
            };
            let (_lock, store) =
                calm_server::assembly::open_embedded(data, |dir| LmdbStore::open(dir, &options))?;
            let out = work.run(&store);
            store.close();
            out
        }
        StoreAt::Etcd(url) => work.run(&connect_etcd(url)?),
    }
}

/// The embedded store in `dir` for a server (or an embedded mount's) to serve: with the
/// write-ahead log or not, its commits made durable as `sync` says.
pub fn open_serving(
    dir: &Path,
    wal: bool,
    sync: calm_store::CommitSync,
) -> Result<LmdbStore, calm_store::StoreError> {
    let options = LmdbOptions {
        wal,
        sync,
        ..LmdbOptions::default()
    };
    LmdbStore::open(dir, &options)
}

/// The store in `data` read-only, after replaying what its log holds; and how many commits
/// that was.
pub fn open_offline(data: &Path) -> anyhow::Result<(LmdbStore, usize)> {
    let replayed = LmdbStore::recover_log(data)
        .with_context(|| format!("recovering the store in {}", data.display()))?;
    let options = LmdbOptions {
        read_only: true,
        ..LmdbOptions::default()
    };
    let store = LmdbStore::open(data, &options)
        .with_context(|| format!("opening the store in {}", data.display()))?;
    Ok((store, replayed))
}

/// The namespace on the etcd cluster at `url` (`etcd://…`).
pub fn connect_etcd(url: &str) -> anyhow::Result<EtcdStore> {
    let options = EtcdOptions::from_url(url).map_err(|e| anyhow!(e))?;
    EtcdStore::connect(options).with_context(|| format!("connecting to {url}"))
}
