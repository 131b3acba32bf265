//! What `calm quota` and `calm summary` print: sizes read and written in the units people
//! type, a table of quotas, and the same as JSON; and where a path given on the command line
//! is in the namespace.

use std::path::Path;

use calm_types::{Handle, QuotaKind, QuotaReport, QuotaUsage, ROOT};
use serde_json::{Value, json};

use calm_client::{Client, Result};
use calm_types::MetaError;

/// Reads a count of bytes or inodes: digits with an optional binary suffix (K, M, G, T, P;
/// `10G` is 10 × 2^30).
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&text[..text.len() - 1], 10),
        Some('M') => (&text[..text.len() - 1], 20),
        Some('G') => (&text[..text.len() - 1], 30),
        Some('T') => (&text[..text.len() - 1], 40),
        Some('P') => (&text[..text.len() - 1], 50),
        _ => (text, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (digits, then K, M, G, T or P)"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text} is more than 2^64"))
}

/// Bytes as people read them: 1.5G, 300M, 12K, 17.
pub fn human_bytes(n: i64) -> String {
    let units = [(50, "P"), (40, "T"), (30, "G"), (20, "M"), (10, "K")];
    for (shift, unit) in units {
        let size = 1i64 << shift;
        if n.abs() >= size {
            return format!("{:.1}{unit}", n as f64 / size as f64);
        }
    }
    n.to_string()
}

fn limit(n: u64, bytes: bool) -> String {
    match (n, bytes) {
        (0, _) => "-".into(),
        (n, true) => human_bytes(n as i64),
        (n, false) => n.to_string(),
    }
}

/// Who a quota is for, as a user names it.
pub fn target_name(report: &QuotaReport, paths: &dyn Fn(Handle) -> Option<String>) -> String {
    let t = report.target;
    match t.kind {
        QuotaKind::Tree => paths(t.id).unwrap_or_else(|| format!("directory {}", t.id)),
        owner => format!("{} {}", owner.word(), t.id),
    }
}

/// One line per quota: whose, usage against each limit, and a soft limit's grace left.
pub fn quota_lines(reports: &[(String, QuotaReport)], now_ns: i64) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<28} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  {}",
        "quota", "bytes", "soft", "hard", "inodes", "soft", "hard", "grace"
    )];
    for (name, r) in reports {
        let l = r.limits;
        let grace = [r.bytes_over_since_ns, r.inodes_over_since_ns]
            .into_iter()
            .filter(|since| *since != 0)
            .min()
            .map(|since| {
                let left = l.grace_s as i64 - (now_ns - since) / 1_000_000_000;
                if left > 0 {
                    format!("{left} s left")
                } else {
                    "over: growth refused".into()
                }
            })
            .unwrap_or_default();
        lines.push(format!(
            "{:<28} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  {}",
            name,
            human_bytes(r.usage.bytes),
            limit(l.soft_bytes, true),
            limit(l.bytes, true),
            r.usage.inodes,
            limit(l.soft_inodes, false),
            limit(l.inodes, false),
            grace
        ));
    }
    lines
}

pub fn quota_json(name: &str, r: &QuotaReport) -> Value {
    json!({
        "quota": name,
        "kind": r.target.kind.word(),
        "id": r.target.id,
        "bytes": r.usage.bytes,
        "inodes": r.usage.inodes,
        "directories": r.usage.dirs,
        "bytes_hard": r.limits.bytes,
        "bytes_soft": r.limits.soft_bytes,
        "inodes_hard": r.limits.inodes,
        "inodes_soft": r.limits.soft_inodes,
        "grace_s": r.limits.grace_s,
        "bytes_over_since_ns": r.bytes_over_since_ns,
        "inodes_over_since_ns": r.inodes_over_since_ns,
    })
}

pub fn summary_json(path: &str, usage: &QuotaUsage, kept: bool) -> Value {
    json!({
        "path": path,
        "files": usage.inodes - usage.dirs,
        "directories": usage.dirs,
        "bytes": usage.bytes,
        "from": if kept { "quota" } else { "walk" },
    })
}

/// Where `path` is in the namespace: a path on a calm mount on this machine (its inode
/// number is the handle), else a path inside the namespace from its root (`/dir/sub`), walked
/// with lookups. A path that is on this machine but on no calm mount, and not in the
/// namespace either, is said to be so (not "no such file").
pub async fn resolve_path(client: &Client, path: &str) -> Result<Handle> {
    if let Some(handle) = on_mount(Path::new(path)) {
        return Ok(handle);
    }
    let mut handle = ROOT;
    for name in path.split('/').filter(|c| !c.is_empty()) {
        handle = match client.lookup(handle, name.as_bytes()).await {
            Ok(attr) => attr.handle,
            Err(MetaError::NotFound) if Path::new(path).exists() => {
                return Err(MetaError::Invalid(format!(
                    "{path} is on this machine but on no calm mount, and the namespace has \
                     no such path: give a path on a calm mount, or one inside the namespace \
                     from its root (/dir)"
                )));
            }
            Err(error) => return Err(error),
        };
    }
    Ok(handle)
}

/// The handle of `path` when it is on a calm mount.
fn on_mount(path: &Path) -> Option<Handle> {
    use std::os::unix::fs::MetadataExt;
    let full = std::fs::canonicalize(path).ok()?;
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // The deepest mount point holding the path decides.
    let mut best: Option<(usize, bool)> = None;
    for line in table.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(point), Some(dash)) = (fields.get(4), fields.iter().position(|f| *f == "-"))
        else {
            continue;
        };
        let point = point.replace("\\040", " ");
        // `fuse.calm`, or `fuse` with the source `calm` where the kernel keeps no subtype.
        let calm = matches!(
            (fields.get(dash + 1), fields.get(dash + 2)),
            (Some(&"fuse.calm"), _) | (Some(&"fuse"), Some(&"calm"))
        );
        if full.starts_with(&point) && best.is_none_or(|(len, _)| point.len() >= len) {
            best = Some((point.len(), calm));
        }
    }
    match best {
        Some((_, true)) => Some(std::fs::metadata(&full).ok()?.ino()),
        _ => None,
    }
}
