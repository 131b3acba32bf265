//! What quotas cost: creates, small-file writes and unlinks by an unprivileged caller in a
//! directory with tree limits on its three ancestors (and limits on the caller's user and
//! group), against the same work on a namespace without any limit, in the same run, the arms
//! alternating and taking turns to go first (the machine's drift falls on both). With
//! `acls`, the arm with limits has POSIX ACLs deciding every operation too. In-process on
//! LMDB with its write-ahead log, as `calm serve` commits: where the cost is least diluted.
//! Each phase reports its rate and the CPU time it took per operation (the process's, every
//! thread's: the work itself, which what else runs on a shared machine disturbs less).

use std::sync::Arc;

use calm_meta::ops::{Done, Op};
use calm_meta::quota::{QuotaLimits, QuotaTarget};
use calm_meta::slices::{INLINE, Slice};
use calm_meta::{Caller, Handle, Meta, NewNode, ROOT};
use calm_store::lmdb::LmdbStore;
use serde::Serialize;

use crate::mdtest::phase;
use crate::mdtest_report::median;

#[derive(Debug, Clone)]
pub struct QuotaBenchOptions {
    pub clients: usize,
    /// Files per round (split evenly across the clients).
    pub files: u64,
    /// Bytes written to each file (one inline write).
    pub file_bytes: u32,
    /// Rounds with limits and without, in turn.
    pub pairs: usize,
    /// The A/A run: both arms have the limits (the cost it shows is the method's noise).
    pub calibrate: bool,
    /// ACLs with the limits: each client's directory is root's, opened to the caller by a
    /// named entry of its access ACL, with a default ACL its files take.
    pub acls: bool,
    pub dir: std::path::PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct QuotaBenchRow {
    /// "on" (limits on three ancestors, the user and the group), "off" (none), or "aa"
    /// (the A/A run's second arm, limits on).
    pub quotas: &'static str,
    pub pair: usize,
    pub op: &'static str,
    pub clients: usize,
    pub files: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    /// The process's CPU time (user and system, every thread) over the phase, per operation,
    /// in microseconds: what the work costs, less disturbed than its rate by what else the
    /// machine runs.
    pub cpu_us_per_op: f64,
}

const OPS: [&str; 3] = ["create", "write", "unlink"];

fn caller() -> Caller {
    Caller {
        session: 0,
        uid: 1000,
        gid: 1000,
        groups: Default::default(),
    }
}

/// The ACL of a client's directory with `acls`, access and default alike: the caller (uid
/// 1000) by name may do everything, the owner (root) too, others read and search.
fn client_acl() -> Vec<u8> {
    use calm_meta::acl::{Acl, Entry, Tag};
    let entry = |tag, perm| Entry { tag, perm };
    Acl::new(vec![
        entry(Tag::UserObj, 7),
        entry(Tag::User(1000), 7),
        entry(Tag::GroupObj, 5),
        entry(Tag::Mask, 7),
        entry(Tag::Other, 5),
    ])
    .expect("a valid ACL")
    .encode()
}

/// Makes /q1/q2/q3 with a directory per client below, owned by the caller (with `acls`,
/// root's, opened to the caller by ACLs); with `limits`, a limit on each of q1, q2 and q3
/// and on the caller's user and group (none reached).
async fn prepare(
    meta: &Meta<LmdbStore>,
    clients: usize,
    limits: bool,
    acls: bool,
) -> Result<Vec<Handle>, String> {
    let e = |e: calm_meta::MetaError| e.to_string();
    let mut at = ROOT;
    let mut ancestors = Vec::new();
    for name in ["q1", "q2", "q3"] {
        at = meta
            .mkdir(at, name.as_bytes(), 0o777)
            .await
            .map_err(e)?
            .handle;
        ancestors.push(at);
    }
    let mut dirs = Vec::new();
    for c in 0..clients {
        let op = Op::Make {
            parent: at,
            name: format!("client.{c}").into_bytes(),
            node: NewNode::dir(0o755, 0, 0),
            exclusive: true,
        };
        let maker = if acls { Caller::default() } else { caller() };
        let dir = match meta.apply_as(maker, op).await.map_err(e)? {
            Done::Attr(attr) => attr.handle,
            other => return Err(format!("mkdir answered {other:?}")),
        };
        if acls {
            for name in [calm_meta::acl::ACCESS_XATTR, calm_meta::acl::DEFAULT_XATTR] {
                let op = Op::SetXattr {
                    handle: dir,
                    name: name.to_vec(),
                    value: client_acl(),
                    flags: 0,
                };
                meta.apply_as(Caller::default(), op).await.map_err(e)?;
            }
        }
        dirs.push(dir);
    }
    if limits {
        let big = QuotaLimits {
            bytes: 1 << 50,
            inodes: 1 << 40,
            soft_bytes: 1 << 49,
            soft_inodes: 1 << 39,
            grace_s: 3600,
        };
        let mut targets: Vec<QuotaTarget> =
            ancestors.iter().map(|d| QuotaTarget::tree(*d)).collect();
        targets.extend([QuotaTarget::user(1000), QuotaTarget::group(1000)]);
        for target in targets {
            meta.set_quota(Caller::default(), target, big)
                .await
                .map_err(e)?;
        }
    }
    Ok(dirs)
}

fn name(c: usize, i: u64) -> Vec<u8> {
    format!("file.{c}.{i}").into_bytes()
}

/// The CPU time this process has used (user and system, every thread), in seconds.
fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// One arm: create the files, write each once, unlink them; the seconds of each phase and the
/// CPU seconds it took.
async fn arm(options: &QuotaBenchOptions, limits: bool) -> Result<[(f64, f64); 3], String> {
    let (_work, meta) = crate::mdtest::open_meta_with(&options.dir, true)?;
    let clients = options.clients;
    let per_client = options.files / clients as u64;
    let dirs = Arc::new(prepare(&meta, clients, limits, limits && options.acls).await?);
    let (m, d) = (meta.clone(), dirs.clone());
    let cpu = cpu_seconds();
    let create = phase(clients, per_client, move |c, i| {
        let (m, d) = (m.clone(), d.clone());
        async move {
            let op = Op::Make {
                parent: d[c],
                name: name(c, i),
                node: NewNode::file(0o644, 0, 0),
                exclusive: true,
            };
            m.apply_as(caller(), op).await.map(|_| ())
        }
    })
    .await?;
    let create = (create, cpu_seconds() - cpu);
    let first = meta
        .alloc_slices(per_client * clients as u64)
        .await
        .map_err(|e| e.to_string())?;
    let bytes = options.file_bytes;
    let (m, d) = (meta.clone(), dirs.clone());
    let cpu = cpu_seconds();
    let write = phase(clients, per_client, move |c, i| {
        let (m, d) = (m.clone(), d.clone());
        async move {
            let handle = m.lookup(d[c], &name(c, i))?.handle;
            let id = (first + c as u64 * per_client + i) | INLINE;
            let slice = Slice {
                id,
                size: bytes,
                off: 0,
                len: bytes,
                pos: 0,
            };
            let data = vec![b'q'; bytes as usize];
            m.write(
                caller(),
                handle,
                vec![(0, slice)],
                u64::from(bytes),
                vec![(id, data)],
            )
            .await
            .map(|_| ())
        }
    })
    .await?;
    let write = (write, cpu_seconds() - cpu);
    let (m, d) = (meta.clone(), dirs.clone());
    let cpu = cpu_seconds();
    let unlink = phase(clients, per_client, move |c, i| {
        let (m, d) = (m.clone(), d.clone());
        async move {
            let op = Op::Unlink {
                parent: d[c],
                name: name(c, i),
                keep: Vec::new(),
            };
            m.apply_as(caller(), op).await.map(|_| ())
        }
    })
    .await?;
    let unlink = (unlink, cpu_seconds() - cpu);
    Ok([create, write, unlink])
}

pub fn run(options: &QuotaBenchOptions) -> Result<Vec<QuotaBenchRow>, String> {
    if options.clients == 0 || options.files < options.clients as u64 {
        return Err("--clients must be positive and at most --files".into());
    }
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let files = options.files / options.clients as u64 * options.clients as u64;
    let mut rows = Vec::new();
    for pair in 0..options.pairs.max(1) {
        let second = if options.calibrate { "aa" } else { "off" };
        let mut arms = [("on", true), (second, options.calibrate)];
        // In turn which arm goes first (ABBA): the first round of a pair runs on a colder
        // machine, and that must not fall on one arm.
        if pair % 2 == 1 {
            arms.reverse();
        }
        for (label, limits) in arms {
            let phases = runtime.block_on(arm(options, limits))?;
            for (op, (s, cpu)) in OPS.into_iter().zip(phases) {
                rows.push(QuotaBenchRow {
                    quotas: label,
                    pair,
                    op,
                    clients: options.clients,
                    files,
                    seconds: s,
                    ops_per_sec: files as f64 / s,
                    cpu_us_per_op: cpu * 1e6 / files as f64,
                });
            }
        }
    }
    Ok(rows)
}

/// What the limits cost one operation: the median rates with and without, `1 - on / off` of
/// the medians, and the median of each pair's own ratio.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuotaCost {
    pub op: &'static str,
    pub on: f64,
    pub off: f64,
    pub cost: f64,
    pub paired_cost: f64,
}

pub fn costs(rows: &[QuotaBenchRow]) -> Vec<QuotaCost> {
    OPS.into_iter()
        .map(|op| {
            let rate = |arm: &dyn Fn(&str) -> bool, pair: Option<usize>| -> Vec<f64> {
                rows.iter()
                    .filter(|r| r.op == op && arm(r.quotas) && pair.is_none_or(|p| r.pair == p))
                    .map(|r| r.ops_per_sec)
                    .collect()
            };
            let on = |q: &str| q == "on";
            let off = |q: &str| q == "off" || q == "aa";
            let pairs: Vec<usize> = rows.iter().map(|r| r.pair).collect();
            let paired: Vec<f64> = (0..=pairs.iter().copied().max().unwrap_or(0))
                .filter_map(|p| {
                    let (a, b) = (rate(&on, Some(p)), rate(&off, Some(p)));
                    (a.len() == 1 && b.len() == 1).then(|| 1.0 - a[0] / b[0])
                })
                .collect();
            let (with, without) = (median(rate(&on, None)), median(rate(&off, None)));
            QuotaCost {
                op,
                on: with,
                off: without,
                cost: 1.0 - with / without,
                paired_cost: median(paired),
            }
        })
        .collect()
}

/// What the arm with limits has, in words.
pub fn arm_words(acls: bool) -> &'static str {
    if acls {
        "limits (three ancestors, the user and the group) and ACLs"
    } else {
        "limits (three ancestors, the user and the group)"
    }
}

pub fn table(rows: &[QuotaBenchRow], acls: bool) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>6} {:>5} {:>7} {:>8} {:>9} {:>12} {:>11}",
        "quotas", "pair", "op", "clients", "files", "ops/s", "CPU µs/op"
    )];
    for r in rows {
        lines.push(format!(
            "{:>6} {:>5} {:>7} {:>8} {:>9} {:>12.0} {:>11.2}",
            r.quotas, r.pair, r.op, r.clients, r.files, r.ops_per_sec, r.cpu_us_per_op
        ));
    }
    lines.push(String::new());
    lines.push(format!(
        "the cost of the {} against none; with --calibrate both arms have them, so the costs \
         are the method's noise:",
        arm_words(acls)
    ));
    lines.push(format!(
        "{:>7} {:>14} {:>14} {:>8} {:>12}",
        "op", "limits ops/s", "none ops/s", "cost", "paired cost"
    ));
    for c in costs(rows) {
        lines.push(format!(
            "{:>7} {:>14.0} {:>14.0} {:>7.1}% {:>11.1}%",
            c.op,
            c.on,
            c.off,
            c.cost * 100.0,
            c.paired_cost * 100.0
        ));
    }
    lines
}

pub fn facets(rows: &[QuotaBenchRow], acls: bool) -> Vec<crate::multiples::Facet> {
    crate::multiples::facets_of(rows.iter().map(|r| {
        crate::multiples::Cell::at(
            r.op.to_string(),
            ("pair", r.pair as f64),
            ("operations/s", r.ops_per_sec),
            match r.quotas {
                "on" => arm_words(acls).to_string(),
                "aa" => format!("{} again (A/A)", arm_words(acls)),
                _ => "none".to_string(),
            },
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(quotas: &'static str, pair: usize, op: &'static str, rate: f64) -> QuotaBenchRow {
        QuotaBenchRow {
            quotas,
            pair,
            op,
            clients: 4,
            files: 100,
            seconds: 100.0 / rate,
            ops_per_sec: rate,
            cpu_us_per_op: 1e6 / rate,
        }
    }

    #[test]
    fn the_cost_is_the_share_of_the_rate_the_limits_take() {
        let rows = vec![
            row("on", 0, "create", 90.0),
            row("off", 0, "create", 100.0),
            row("on", 1, "create", 95.0),
            row("off", 1, "create", 100.0),
        ];
        let create = &costs(&rows)[0];
        assert_eq!(create.op, "create");
        assert!((create.cost - 0.075).abs() < 1e-9, "{create:?}");
        assert!((create.paired_cost - 0.075).abs() < 1e-9, "{create:?}");
        assert!(costs(&rows)[1].cost.is_nan(), "no write rows: no figure");
    }
}
