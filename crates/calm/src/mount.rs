//! `calm mount MOUNTPOINT`: the FUSE file system, over a running server (`--server`) or over
//! a server started in this process on an embedded store (`--embedded DIR`, which also
//! serves gRPC so that `calm status`, `calm locks` and `calm changelog` work against it).
//! Unmounts on SIGINT or SIGTERM; ends by itself when unmounted with `fusermount3 -u`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use calm_fuse::MountOptions;
use calm_server::Assembled;

/// `calm mount` flags.
#[derive(Debug, clap::Args)]
pub struct MountArgs {
    /// Where to mount (an existing empty directory).
    pub mountpoint: PathBuf,
    /// A running server to mount (file contents go to the object store its namespace names);
    /// several servers of one namespace, comma-separated (A,B,C): when the one in use dies,
    /// the mount moves to the next that answers and sends again what was in flight.
    #[arg(long, conflicts_with = "embedded")]
    pub server: Option<String>,
    /// Run the server in this process on the store in DIR (created when absent); file
    /// contents go to the namespace's object store, DIR/objects unless --objects says else.
    #[arg(long)]
    pub embedded: Option<PathBuf>,
    /// Bytes of writes buffered in memory before they are committed, for the whole mount,
    /// in MiB.
    #[arg(long, default_value_t = calm_fuse::contents::WRITE_BUFFER_BYTES_DEFAULT >> 20)]
    pub write_buffer_mib: u64,
    /// The CA that signed the server's certificate, for a --server over TLS (PEM).
    #[arg(long, requires_all = ["tls_client_cert", "tls_client_key"])]
    pub tls_ca: Option<PathBuf>,
    /// This mount's client certificate (`calm certs issue DIR mount:NAME` makes one).
    #[arg(long)]
    pub tls_client_cert: Option<PathBuf>,
    /// The key of --tls-client-cert.
    #[arg(long)]
    pub tls_client_key: Option<PathBuf>,
    /// Lease of the mount's lock session, in ms: a mount that dies loses its locks this long
    /// after its last renewal.
    #[arg(long, default_value_t = calm_fuse::locks::LEASE_MS_DEFAULT)]
    pub lock_lease_ms: u64,
    /// Let every user use the mount, not only the one who mounted it (permission bits still
    /// apply). Needs root or `user_allow_other` in /etc/fuse.conf.
    #[arg(long)]
    pub allow_other: bool,
    /// Where to keep blocks of a remote object store on local disk (a directory per
    /// namespace below it). Default: $XDG_CACHE_HOME/calm/blocks, or ~/.cache/calm/blocks.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Most bytes of blocks kept in --cache-dir, in MiB (0: no disk cache). Unused when the
    /// object store is a local directory.
    #[arg(long, default_value_t = calm_data::cache::DISK_CACHE_BYTES_DEFAULT >> 20)]
    pub cache_size_mib: u64,
    /// How long the kernel trusts attributes and names, in ms, while the mount follows the
    /// server's changes (which invalidate them at once); otherwise at most 1000.
    #[arg(long, default_value_t = calm_fuse::fs::TTL_DEFAULT.as_millis() as u64)]
    pub ttl_ms: u64,
    /// Small writes committed together up to this many bytes (in a file's first 64 MiB) are kept
    /// by the metadata server beside their records instead of written as objects: one durable
    /// write instead of three. 0: always objects; at most 65536.
    #[arg(long, default_value_t = calm_meta::slices::INLINE_WRITE_BYTES_MAX,
          value_parser = clap::value_parser!(u64).range(0..=calm_meta::slices::INLINE_WRITE_BYTES_MAX))]
    pub inline_bytes_max: u64,
    /// Appends go through the kernel's page cache, which may cut one write into several
    /// appends (for measuring what atomic appends cost; `calm-bench appends`).
    #[arg(long, hide = true)]
    pub append_through_cache: bool,
    /// Count nothing of the kernel's requests (for measuring what counting costs; `calm-bench
    /// mount --metrics-cost`).
    #[arg(long, hide = true)]
    pub count_nothing: bool,
    /// The environment variable that names a calling process's job (e.g. SLURM_JOB_ID): the
    /// mount reads it once per process and sends it with its requests, so that the server
    /// counts who loads it per job (`calm stats --by job`).
    #[arg(long)]
    pub job_variable: Option<String>,
    /// How the kernel's requests reach the mount: `device`, the FUSE device; `io-uring`, FUSE
    /// over io_uring when the kernel offers it (Linux 6.14 or later, with `echo Y >
    /// /sys/module/fuse/parameters/enable_uring`), else the device.
    #[arg(long, value_enum, default_value = "device")]
    pub fuse_channel: FuseChannel,
    /// Threads reading the FUSE device (at most 64).
    #[arg(long, default_value_t = calm_fuse::fs::FUSE_THREADS as u16,
          value_parser = clap::value_parser!(u16).range(1..=calm_fuse::fs::FUSE_THREADS_MAX as i64))]
    pub fuse_threads: u16,
    /// Send every chmod, chown and change of times to the server before answering it, also
    /// for files this mount made and has open alone (which it otherwise holds: it answers
    /// their changes itself and sends them at their close, fsync or when another client asks);
    /// and every create, mkdir, unlink and rmdir, also in directories this mount made and
    /// nobody else looked into (whose changes it otherwise answers itself and sends at once).
    #[arg(long)]
    pub no_hold: bool,
    /// Ask the server at every open of a file, also one this mount read and nobody changed
    /// since (whose opens it otherwise answers itself, keeping the kernel's pages: the server
    /// asks for the copy back before it answers another client's change of the file).
    #[arg(long)]
    pub no_copies: bool,
    #[command(flatten)]
    pub changelog: crate::serve::ServerArgs,
}

/// `--fuse-channel`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum FuseChannel {
    Device,
    IoUring,
}

pub fn run(args: &MountArgs, started: Instant) -> anyhow::Result<ExitCode> {
    if args.server.is_none() && args.embedded.is_none() {
        bail!("give --server ADDR or --embedded DIR");
    }
    if !args.mountpoint.is_dir() {
        bail!(
            "mount point {} is not a directory",
            args.mountpoint.display()
        );
    }
    // The block cache holds file contents: readable by this user alone.
    calm_server::private_files();
    let mut options = MountOptions {
        write_buffer_bytes: args.write_buffer_mib.saturating_mul(1 << 20),
        ttl: Duration::from_millis(args.ttl_ms),
        lease_ms: args.lock_lease_ms,
        allow_other: args.allow_other,
        cache_dir: args.cache_dir.clone().or_else(calm_fuse::default_cache_dir),
        cache_bytes: args.cache_size_mib.saturating_mul(1 << 20),
        inline_bytes_max: args.inline_bytes_max,
        append_through_cache: args.append_through_cache,
        metrics: None,
        count_requests: !args.count_nothing,
        job_variable: args.job_variable.clone(),
        channel: match args.fuse_channel {
            FuseChannel::Device => calm_fuse::fs::Channel::Device,
            FuseChannel::IoUring => calm_fuse::fs::Channel::IoUring,
        },
        device_threads: usize::from(args.fuse_threads),
        // Every change durable when it returns: none answered by the mount itself.
        hold_files: !args.no_hold && !args.changelog.sync,
        keep_copies: !args.no_copies,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    match &args.embedded {
        None => {
            // The mount's own metrics, when asked for: bound before anything starts (a
            // mistake in the address stops the mount), served once it runs.
            let endpoint = match &args.changelog.metrics {
                Some(addr) => {
                    let listener = calm_metrics::bind(addr)
                        .with_context(|| format!("listening on {addr} (--metrics)"))?;
                    let registry = calm_metrics::Registry::new();
                    options.metrics = Some(registry.clone());
                    let _runtime = runtime.enter();
                    Some(
                        calm_metrics::serve(listener, registry)
                            .with_context(|| format!("serving the metrics on {addr}"))?,
                    )
                }
                None => None,
            };
            let server = args.server.as_deref().expect("checked above");
            let tls = match (&args.tls_ca, &args.tls_client_cert, &args.tls_client_key) {
                (Some(ca), Some(cert), Some(key)) => Some(calm_client::ClientTls {
                    ca: ca.clone(),
                    cert: cert.clone(),
                    key: key.clone(),
                    domain: None,
                }),
                _ => None,
            };
            runtime.block_on(mount_over(
                server,
                tls.as_ref(),
                &args.mountpoint,
                &options,
                started,
                None,
            ))?;
            drop(endpoint);
        }
        Some(dir) => {
            let config = args.changelog.config(false);
            config.check()?;
            let (_lock, store) =
                calm_server::assembly::open_embedded(dir, |d| args.changelog.open_lmdb(d))?;
            let name = dir.display().to_string();
            let assembled =
                runtime.block_on(Assembled::open(store, &config, dir, name, started))?;
            let addrs = assembled.addrs.clone();
            options.metrics = assembled.registry();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let (server, listeners, meta) = runtime.block_on(assembled.start());
            // The mount calls the namespace and the locks in this process; other clients
            // reach the same services on the listener.
            let local = calm_client::InProcess {
                meta: server.counted_meta_service(),
                locks: server.counted_lock_service(),
                watch: server.watch_service(),
            };
            let server = runtime.spawn(server.serve(listeners, async move {
                let _ = stopped.await;
            }));
            let mounted = runtime.block_on(mount_over(
                &addrs[0],
                None,
                &args.mountpoint,
                &options,
                started,
                Some((addrs.join(" and "), local)),
            ));
            let _ = stop.send(());
            let served = runtime.block_on(server);
            mounted?;
            served
                .map_err(|e| anyhow!("server task: {e}"))?
                .context("serving")?;
            drop(runtime);
            calm_server::assembly::take_store(meta)?.close();
        }
    }
    println!("unmounted");
    Ok(ExitCode::SUCCESS)
}

async fn mount_over(
    server: &str,
    tls: Option<&calm_client::ClientTls>,
    mountpoint: &Path,
    options: &MountOptions,
    started: Instant,
    serving: Option<(String, calm_client::InProcess)>,
) -> anyhow::Result<()> {
    let mut client = match serving {
        // The server in this process: nothing to move to.
        Some(_) => calm_client::Client::connect_with(server, tls).await,
        None => {
            let servers: Vec<String> = server.split(',').map(str::to_string).collect();
            calm_client::Client::connect_servers_with(&servers, tls).await
        }
    }
    .with_context(|| format!("connecting to {server}"))?;
    let serving = serving.map(|(addr, local)| {
        client = client.clone().in_process(local);
        addr
    });
    let mut mounted = calm_fuse::mount(
        client,
        mountpoint,
        options,
        tokio::runtime::Handle::current(),
    )
    .await
    .with_context(|| format!("mounting at {}", mountpoint.display()))?;
    let stop = crate::serve::shutdown_signal();
    let ms = started.elapsed().as_millis();
    match serving {
        Some(addr) => println!(
            "mounted at {} in {ms} ms; serving on {addr}",
            mountpoint.display()
        ),
        None => println!("mounted at {} in {ms} ms", mountpoint.display()),
    }
    std::io::stdout().flush()?;
    tokio::select! {
        _ = stop => {}
        _ = mounted.ended() => {}
    }
    mounted
        .unmount()
        .await
        .with_context(|| format!("unmounting {}", mountpoint.display()))?;
    Ok(())
}
