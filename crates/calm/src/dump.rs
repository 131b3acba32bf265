//! `calm dump`, `calm load` and `calm backups`: the namespace's metadata into one file, a new
//! store from one, and the backups a server keeps in the object store.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::stores::{OnStore, StoreAt};
use anyhow::{Context, anyhow, bail};
use calm_meta::dump::DumpSummary;
use calm_store::Store;
use calm_upkeep::backup;

#[derive(Debug, clap::Args)]
pub struct DumpArgs {
    /// The file to write (0600; written beside under a fresh name, renamed when whole).
    pub file: PathBuf,
    /// A running server (its Unix socket, or HOST:PORT), asked as an administrator.
    #[arg(long, conflicts_with_all = ["data", "store"])]
    pub server: Option<String>,
    /// The data directory of a stopped server, read without one.
    #[arg(long, conflicts_with = "store")]
    pub data: Option<PathBuf>,
    /// A namespace on etcd (etcd://…), read at one revision while its servers run.
    #[arg(long)]
    pub store: Option<String>,
    /// Print JSON instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// The dump to load (a file `calm dump` wrote); or give --from-backups.
    #[arg(required_unless_present = "from_backups")]
    pub file: Option<PathBuf>,
    /// Load the newest backup (or --backup NAME) from this object store (the URL of the
    /// namespace's file contents: file:///DIR or s3://BUCKET/PREFIX?…).
    #[arg(long, conflicts_with = "file")]
    pub from_backups: Option<String>,
    /// With --from-backups: which backup (as `calm backups` lists them).
    #[arg(long, requires = "from_backups")]
    pub backup: Option<String>,
    /// The data directory of the new store (created; it must hold no store).
    #[arg(long, conflicts_with = "store", required_unless_present = "store")]
    pub data: Option<PathBuf>,
    /// A new namespace on etcd (etcd://…; its prefix must hold nothing).
    #[arg(long)]
    pub store: Option<String>,
    /// Keep the loaded namespace's file contents in this object store of its own (new or
    /// empty: file:///DIR or s3://BUCKET/PREFIX?…): the objects the dump's files name are
    /// copied there, and the dumped namespace and the copy live side by side.
    #[arg(long, value_name = "URL", conflicts_with = "take_over_objects")]
    pub objects: Option<String>,
    /// Take over the dump's own object store, to replace a lost metadata store: from then on
    /// the namespace dumped deletes nothing from it, and its servers no longer start on it.
    #[arg(long)]
    pub take_over_objects: bool,
    /// Print JSON instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

fn summary_json(summary: &DumpSummary, bytes: u64, seconds: f64) -> serde_json::Value {
    serde_json::json!({
        "format": summary.format,
        "created_ns": summary.created_ns,
        "entries": summary.pairs,
        "inodes": summary.inodes,
        "bytes": bytes,
        "changelog_last": summary.changelog_last,
        "seconds": seconds,
        "inodes_per_s": summary.inodes as f64 / seconds.max(1e-9),
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// Writes through `write` into a new private file beside FILE (0600, under a name nobody can
/// guess, never through a link), makes it durable and renames it to FILE: a dump that stops
/// half-way, or fails, leaves nothing.
fn into_file(
    file: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<&mut std::fs::File>) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let mut staged = calm_server::private_file::PrivateFile::create(file)
        .with_context(|| format!("creating a file beside {}", file.display()))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, staged.file());
    write(&mut out)?;
    out.flush().context("writing the dump")?;
    drop(out);
    staged
        .persist()
        .with_context(|| format!("writing {}", file.display()))
}

pub fn dump(args: &DumpArgs, default_server: &str) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let named = StoreAt::named(args.data.as_deref(), args.store.as_deref());
    let (bytes, summary) = match named {
        Some(at) => {
            let (bytes, dumped) = crate::stores::read(at, true, DumpInto { file: &args.file })
                .map_err(|e| match at {
                    StoreAt::Dir(_) => e.context(
                        "dumping a stopped server's store (a running one's: --server ADDR)",
                    ),
                    StoreAt::Etcd(_) => e,
                })?;
            (bytes, Some(dumped))
        }
        None => {
            let server = args.server.as_deref().unwrap_or(default_server);
            let runtime = runtime()?;
            let bytes = into_file(&args.file, |out| {
                runtime
                    .block_on(async {
                        let client = calm_client::Client::connect(server).await?;
                        client.dump(out).await
                    })
                    .with_context(|| format!("asking {server} for a dump"))?;
                Ok(())
            })?;
            (bytes, None)
        }
    };
    // What the file holds, read back: a dump received whole says so itself.
    let summary = match summary {
        Some(summary) => summary,
        None => calm_meta::dump::verify(std::io::BufReader::new(
            std::fs::File::open(&args.file).context("reading the dump back")?,
        ))
        .context("checking the dump")?,
    };
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        println!("{}", summary_json(&summary, bytes, seconds));
    } else {
        println!(
            "dumped {} inodes ({} entries, {:.1} MB) into {} in {seconds:.1} s",
            summary.inodes,
            summary.pairs,
            bytes as f64 / 1e6,
            args.file.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn load(args: &LoadArgs) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let objects = match (&args.objects, args.take_over_objects) {
        (Some(url), _) => backup::LoadObjects::Own(url.clone()),
        (None, true) => backup::LoadObjects::TakeOver,
        (None, false) => bail!(
            "say where the loaded namespace keeps its files' contents: --objects URL for an \
             object store of its own (the dump's objects are copied there; the dumped \
             namespace goes on untouched), or --take-over-objects when the dumped namespace \
             is lost for good (the copy takes its object store over)"
        ),
    };
    // A backup is downloaded first, beside the new store's directory (or in the working
    // directory for etcd), and removed after.
    let mut downloaded = None;
    let file = match (&args.file, &args.from_backups) {
        (Some(file), _) => file.clone(),
        (None, Some(url)) => {
            let objects = calm_data::Objects::open_existing(url)
                .map_err(|e| anyhow!("object store {url}: {e}"))?;
            let dir = match &args.data {
                Some(data) => data
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."))
                    .to_path_buf(),
                None => PathBuf::from("."),
            };
            // Private, under a name nobody can guess, removed when done (or failed).
            let mut staged =
                calm_server::private_file::PrivateFile::create(&dir.join("calm-backup"))
                    .with_context(|| format!("creating a file in {}", dir.display()))?;
            let to = staged.path().to_path_buf();
            let mut file = tokio::fs::File::from_std(
                staged.file().try_clone().context("opening the download")?,
            );
            let name = runtime()?
                .block_on(backup::fetch_backup(
                    &objects,
                    args.backup.as_deref(),
                    &mut file,
                    &to,
                ))
                .map_err(|e| anyhow!(e))?;
            if !args.json {
                eprintln!("loading the backup {name} from {url}");
            }
            downloaded = Some(staged);
            to
        }
        (None, None) => bail!("give a dump file or --from-backups"),
    };
    let bytes = std::fs::metadata(&file).map_or(0, |m| m.len());
    let result = load_file(args, &file, &objects);
    drop(downloaded);
    let summary = result?;
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        println!("{}", summary_json(&summary, bytes, seconds));
    } else {
        let into = StoreAt::named(args.data.as_deref(), args.store.as_deref())
            .map_or_else(String::new, |at| at.describe());
        println!(
            "loaded {} inodes ({} entries) into {into} in {seconds:.1} s; mounts of the old \
             store must mount again",
            summary.inodes, summary.pairs
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn load_file(
    args: &LoadArgs,
    file: &Path,
    objects: &backup::LoadObjects,
) -> anyhow::Result<DumpSummary> {
    let what = || format!("loading {}", file.display());
    // Checked whole before anything is made: a missing, cut or damaged dump, or an object
    // store the copy may not use, leaves no store.
    let prepared = backup::prepare_load(file, objects).with_context(what)?;
    let Some(at) = StoreAt::named(args.data.as_deref(), args.store.as_deref()) else {
        bail!("give --data DIR or --store URL for the new store");
    };
    crate::stores::write(at, LoadInto { prepared }).with_context(what)
}

/// A dump of one store, whichever kind it is, into a new file: its bytes and what it holds.
struct DumpInto<'a> {
    file: &'a Path,
}

impl OnStore for DumpInto<'_> {
    type Out = (u64, DumpSummary);
    fn run<S: Store>(self, store: &S) -> anyhow::Result<(u64, DumpSummary)> {
        let mut summary = None;
        let bytes = into_file(self.file, |out| {
            summary = Some(backup::dump_store(store, out)?);
            Ok(())
        })?;
        Ok((
            bytes,
            summary.expect("a dump written whole has its summary"),
        ))
    }
}

/// A checked dump loaded into a new store, whichever kind it is.
struct LoadInto {
    prepared: backup::PreparedLoad,
}

impl OnStore for LoadInto {
    type Out = DumpSummary;
    fn run<S: Store>(self, store: &S) -> anyhow::Result<DumpSummary> {
        Ok(backup::load_dump_file(store, self.prepared, &mut |_| {})?)
    }
}

pub fn backups(objects_url: &str, json: bool) -> anyhow::Result<ExitCode> {
    let objects = calm_data::Objects::open_existing(objects_url)
        .map_err(|e| anyhow!("object store {objects_url}: {e}"))?;
    let listed = runtime()?
        .block_on(backup::list_backups(&objects))
        .map_err(|e| anyhow!(e))?;
    if json {
        let list: Vec<_> = listed
            .iter()
            .map(|f| serde_json::json!({"name": f.name, "bytes": f.len, "modified_ms": f.modified_ms}))
            .collect();
        println!("{}", serde_json::Value::Array(list));
    } else if listed.is_empty() {
        println!("no metadata backup in {objects_url}");
    } else {
        for f in &listed {
            println!("{}  {:.1} MB", f.name, f.len as f64 / 1e6);
        }
    }
    Ok(ExitCode::SUCCESS)
}
