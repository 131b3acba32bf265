//! `calm`: one binary, thin. Each subcommand parses its arguments and calls into a library
//! crate; nothing here knows the store layout or the wire format.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod certs;
mod changelog;
mod clone;

mod dump;
mod fsck;
mod gc;
mod locks;
mod mount;
mod node;
mod numbers;
mod quota;
mod serve;
mod stats;
mod status;
mod stores;
mod trash;
mod watch;

/// The server a command talks to when --server is not given: the Unix socket of the default
/// data directory (as `scripts/run` and `calm serve` make it).
const DEFAULT_SERVER: &str = "unix:calm-data/calm.sock";

/// calm: a POSIX file system that many clients share, whose metadata stays fast as files,
/// locks, changes, watchers, mounts and disks grow.
#[derive(Debug, Parser)]
#[command(name = "calm", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the metadata server (gRPC) on an embedded store.
    Serve {
        /// Directory of the store (created when absent), and of the Unix socket (calm.sock).
        #[arg(long, default_value = "./calm-data")]
        data: PathBuf,
        /// Keep the metadata on an etcd cluster instead of in --data:
        /// etcd://HOST:PORT[,HOST:PORT...][/PREFIX][?txn-ops-max=N&request-bytes-max=N&history-s=N]
        /// (calm compacts the cluster's history older than history-s, 60 by default; 0: never), or
        /// etcd+https://… with tls-ca=F[&tls-cert=F&tls-key=F] and user=NAME&password-file=F
        /// (or CALM_ETCD_PASSWORD). Several servers may serve one namespace from the same URL.
        #[arg(long)]
        store: Option<String>,
        #[command(flatten)]
        changelog: serve::ServerArgs,
    },
    /// Mount calm with FUSE: over a running server, or with the server in this process.
    Mount(mount::MountArgs),
    /// Show a running server's counts and figures.
    Status {
        #[arg(long, default_value = DEFAULT_SERVER)]
        server: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A running server's figures every interval, as rates (mutations, commit groups and their
    /// time, requests, errors, deletions) and levels (locks, sessions, the deletion queue,
    /// inodes, heap); or a mount's (MOUNTPOINT): the kernel's requests with their latency, the
    /// busiest kinds, invalidations, writes buffered, the object store's throughput, the block
    /// cache's hit ratio. One line each, a header every 20, no colour; or JSON lines.
    Stats {
        /// A mount's own figures instead of a server's: the kernel's requests by kind with
        /// their latency, the object store's throughput, the block cache's hit ratio.
        mountpoint: Option<std::path::PathBuf>,
        #[arg(long, default_value = DEFAULT_SERVER, conflicts_with = "mountpoint")]
        server: String,
        /// Who loads the server: each user's (uid) or job's requests per second and the
        /// server's time spent on them, the busiest first (jobs as mounts name them:
        /// `calm mount --job-variable`).
        #[arg(long, value_parser = ["uid", "job"], conflicts_with = "mountpoint")]
        by: Option<String>,
        /// Seconds between two samples (0.1 to 86 400).
        #[arg(long, default_value_t = 1.0, value_parser = numbers::interval_s)]
        interval_s: f64,
        /// Stop after this many lines (default: until interrupted).
        #[arg(long)]
        count: Option<u64>,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The metadata changelog: readers, records, clear.
    Changelog {
        #[arg(long, default_value = DEFAULT_SERVER, global = true)]
        server: String,
        #[command(subcommand)]
        command: changelog::ChangelogCommand,
    },
    /// Quotas: how much a user, a group or a directory tree may use, and uses.
    Quota {
        #[arg(long, default_value = DEFAULT_SERVER, global = true)]
        server: String,
        #[command(subcommand)]
        command: quota::QuotaCommand,
    },
    /// The files, directories and bytes below a directory (at once where its tree has a
    /// quota, else by walking it).
    Summary {
        /// A directory: on a calm mount here, or inside the namespace from its root (/dir).
        path: String,
        #[arg(long, default_value = DEFAULT_SERVER)]
        server: String,
        /// Print JSON instead of a sentence.
        #[arg(long)]
        json: bool,
    },
    /// List the locks held on a file and the requests waiting for them.
    Locks {
        /// Path of the file inside calm's namespace, from its root (`/dir/file`).
        path: String,
        #[arg(long, default_value = DEFAULT_SERVER)]
        server: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Follow the changes under a directory (or to a file) as they commit.
    Watch {
        /// Path inside calm's namespace, from its root (`/dir`).
        path: String,
        /// Everything below the directory, not only its entries.
        #[arg(long)]
        recursive: bool,
        /// Start at this changelog index (0: from now).
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Stop after this many changes.
        #[arg(long)]
        count: Option<u64>,
        #[arg(long, default_value = DEFAULT_SERVER)]
        server: String,
        /// JSON lines instead of changelog lines.
        #[arg(long)]
        json: bool,
    },
    /// Target labels: format a device or directory as a pool member, or show its label.
    #[command(subcommand)]
    Target(node::TargetCommand),
    /// The storage-node agent: discover targets, assemble pools, activate each once.
    Node {
        /// Where pools are mounted (ROOT/pools/POOL/INDEX) and pools.json is kept.
        #[arg(long)]
        root: PathBuf,
        /// Directory targets (besides every block device).
        #[arg(long, num_args = 1..)]
        targets: Vec<PathBuf>,
        /// Labels read at once during an enumeration.
        #[arg(long, default_value_t = 16)]
        read_parallelism: usize,
        /// Pools activated at once.
        #[arg(long, default_value_t = 8)]
        activation_workers: usize,
        /// Activate a pool degraded when members are still missing this long after its first.
        #[arg(long)]
        degraded_after_s: Option<u64>,
        /// Only this pool (repeatable; default: every pool found).
        #[arg(long = "pool")]
        pools: Vec<String>,
        /// Register the targets with this metadata server's registry.
        #[arg(long)]
        server: Option<String>,
    },
    /// The pools a node agent knows: members present and missing, state, activation time.
    Pools {
        /// A node agent's root (its pools.json).
        #[arg(long, required_unless_present = "server")]
        root: Option<PathBuf>,
        /// Or: the metadata server's target registry.
        #[arg(long, conflicts_with = "root")]
        server: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Verify a store: a data directory's with its server stopped, or a namespace on etcd
    /// while its servers run (fsck reads one revision of the cluster).
    Fsck {
        /// The data directory to check (its server must be stopped).
        #[arg(required_unless_present = "store", conflicts_with = "store")]
        data: Option<PathBuf>,
        /// Check the namespace on this etcd cluster instead (the URL `calm serve --store`
        /// takes); its servers may be running. A namespace over several metadata clusters:
        /// give --store once per cluster, cluster 0 first, to check each and all of them as
        /// one namespace.
        #[arg(long)]
        store: Vec<String>,
        /// Also check that every object the metadata names is in the object store, whole.
        #[arg(long)]
        objects: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List (and with --delete remove) the objects no file names any more, left by mounts
    /// killed mid-upload. Offline, on a stopped server's data directory.
    Gc {
        /// The data directory of the namespace (its server stopped); or give --server.
        #[arg(required_unless_present = "server", conflicts_with = "server")]
        data: Option<PathBuf>,
        /// A running server (its Unix socket, or HOST:PORT), asked as an administrator: the
        /// objects are found, and with --delete removed, while the namespace is served.
        #[arg(long)]
        server: Option<String>,
        /// Objects younger than this (in seconds) are left alone: uploads whose commit may be
        /// on its way.
        #[arg(long, default_value_t = 3600)]
        grace_s: u64,
        /// Delete the leaked objects.
        #[arg(long)]
        delete: bool,
        #[arg(long)]
        json: bool,
    },
    /// Write the whole namespace's metadata at one moment into a file: names, attributes,
    /// xattrs and ACLs, which objects hold each file's bytes, quotas (not locks, sessions or
    /// the changelog's records). From a running server, a stopped one's data directory, or
    /// etcd.
    Dump(dump::DumpArgs),
    /// Make a new store from a dump (or from the newest backup in the object store), after
    /// checking the whole file; the store must be new.
    Load(dump::LoadArgs),
    /// Copy a file or a whole tree as a clone: the copy shares the source's bytes (nothing is
    /// copied but metadata, a request per directory), and a later write to either never
    /// changes the other. You need to read SRC and write DST's directory, as for cp -r; the
    /// superuser's copies keep their owners (as cp -a), anyone else owns theirs.
    Clone {
        /// What to copy: a path on a calm mount here, or inside the namespace (/dir/file).
        src: String,
        /// The copy's path, which must not exist (its directory on the same namespace).
        dst: String,
        #[arg(long, default_value = DEFAULT_SERVER)]
        server: String,
    },
    /// The trash: what was removed, kept for a while (calm serve --trash-hours): list,
    /// restore, purge.
    Trash {
        #[arg(long, default_value = DEFAULT_SERVER, global = true)]
        server: String,
        #[command(subcommand)]
        command: trash::TrashCommand,
    },
    /// List the metadata backups servers keep in an object store (--backup-every-hours).
    Backups {
        /// The object store of the namespace's file contents (file:///DIR or s3://…).
        objects: String,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Make a CA and certificates for TLS listeners (--tls-cert) and their clients.
    #[command(subcommand)]
    Certs(certs::Certs),
}

impl Command {
    /// A command that prints what it found and ends (no server, mount or agent).
    fn prints_and_ends(&self) -> bool {
        matches!(
            self,
            Command::Status { .. }
                | Command::Stats { .. }
                | Command::Changelog { .. }
                | Command::Locks { .. }
                | Command::Watch { .. }
                | Command::Pools { .. }
                | Command::Fsck { .. }
                | Command::Gc { .. }
                | Command::Dump(_)
                | Command::Load(_)
                | Command::Backups { .. }
                | Command::Trash { .. }
                | Command::Clone { .. }
                | Command::Certs(_)
        )
    }
}

fn main() -> ExitCode {
    calm_server::heap::tune_malloc();
    let started = std::time::Instant::now();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CALM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if cli.command.prints_and_ends() {
        // A command whose output goes into a pipe that closes early (`calm status | head`)
        // ends quietly, as other Unix tools do, instead of panicking in println!. Servers and
        // mounts keep SIGPIPE ignored: a client that goes away must not end them.
        // SAFETY: signal(2) sets this process's disposition of SIGPIPE, before any thread.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    if matches!(cli.command, Command::Serve { .. } | Command::Mount(_))
        && let Err(e) = calm_server::heap::keep_releasing()
    {
        tracing::warn!(%e, "starting the thread that gives free memory back to the system");
    }
    let outcome = match cli.command {
        Command::Serve {
            data,
            store,
            changelog,
        } => match store {
            Some(url) => serve::run_etcd(&url, &data, &changelog, started),
            None => serve::run(&data, &changelog, started),
        },
        Command::Mount(args) => mount::run(&args, started),
        Command::Status { server, json } => status::run(&server, json),
        Command::Stats {
            mountpoint: Some(mountpoint),
            interval_s,
            count,
            json,
            ..
        } => stats::run_mount(&mountpoint, interval_s, count, json),
        Command::Stats {
            server,
            interval_s,
            count,
            json,
            by,
            ..
        } => stats::run(&server, by.as_deref(), interval_s, count, json),
        Command::Changelog { server, command } => changelog::run(&server, command),
        Command::Locks { path, server, json } => locks::run(&server, &path, json),
        Command::Quota { server, command } => quota::run(&server, command),
        Command::Summary { path, server, json } => quota::summary(&server, &path, json),
        Command::Watch {
            path,
            recursive,
            from,
            count,
            server,
            json,
        } => watch::run(&server, &path, recursive, from, json, count),
        Command::Target(command) => node::target(command),
        Command::Node {
            root,
            targets,
            read_parallelism,
            activation_workers,
            degraded_after_s,
            pools,
            server,
        } => node::node(
            &root,
            targets,
            read_parallelism,
            activation_workers,
            degraded_after_s,
            pools,
            server.as_deref(),
        ),
        Command::Pools { root, server, json } => match (root, server) {
            (_, Some(server)) => node::pools_from_server(&server, json),
            (Some(root), None) => node::pools(&root, json),
            (None, None) => unreachable!("clap requires one"),
        },
        Command::Fsck {
            data,
            store,
            objects,
            json,
        } => match (data, store.is_empty()) {
            (_, false) => fsck::run_etcd(&store, objects, json),
            (Some(data), true) => fsck::run(&data, objects, json),
            (None, true) => Err(anyhow::anyhow!("name a data directory or --store")),
        },
        Command::Gc {
            data,
            server,
            grace_s,
            delete,
            json,
        } => match (data, server) {
            (_, Some(server)) => gc::run_online(&server, grace_s, delete, json),
            (Some(data), None) => gc::run(&data, grace_s, delete, json),
            (None, None) => Err(anyhow::anyhow!("name a data directory or --server")),
        },
        Command::Dump(args) => dump::dump(&args, DEFAULT_SERVER),
        Command::Load(args) => dump::load(&args),
        Command::Backups { objects, json } => dump::backups(&objects, json),
        Command::Trash { server, command } => trash::run(&server, command),
        Command::Clone { src, dst, server } => clone::run(&server, &src, &dst),
        Command::Certs(command) => certs::run(command),
    };
    match outcome {
        Ok(code) => code,
        Err(error) => {
            eprintln!("calm: {error:#}");
            ExitCode::from(2)
        }
    }
}
