//! What the commands print with `--json`: a changelog record, a changelog reader and the
//! target registry, one JSON object each, with the field names scripts rely on.

use calm_changelog::{Record, User};
use calm_proto::pb;
use serde_json::{Value, json};

/// A changelog record: its index, type name, flags, time, target and parent, name, and for a
/// rename the source and what it overwrote.
pub fn record(record: &Record) -> Value {
    let mut value = json!({
        "index": record.index,
        "type": record.kind.name(),
        "flags": record.flags,
        "time_ns": record.time_ns,
        "target": record.target,
        "generation": record.generation,
        "parent": record.parent,
        "name": String::from_utf8_lossy(&record.name),
        "session": record.session,
        "uid": record.uid,
        "gid": record.gid,
    });
    if let Some(rename) = &record.rename {
        value["source_parent"] = rename.source_parent.into();
        value["source_name"] = String::from_utf8_lossy(&rename.source_name).into();
        value["overwritten"] = rename.overwritten.into();
    }
    value
}

/// A changelog reader; `now_ns` (0: unknown) gives its idle seconds.
pub fn reader(user: &User, now_ns: i64) -> Value {
    json!({
        "id": user.label(),
        "name": user.name,
        "mask": user.mask.names(),
        "cleared": user.cleared,
        "idle_s": if now_ns > 0 { (now_ns - user.last_clear_ns).max(0) / 1_000_000_000 } else { 0 },
    })
}

/// The changelog's readers as `calm changelog users --json` prints them.
pub fn readers(reply: &pb::ClUsersReply, users: &[User], now_ns: i64) -> Value {
    json!({
        "current_index": reply.last,
        "first_index": reply.first,
        "mask": reply.global_mask,
        "users": users.iter().map(|u| reader(u, now_ns)).collect::<Vec<_>>(),
    })
}

/// The target registry of a metadata server, as `calm pools --server … --json` prints it.
pub fn targets(targets: &[pb::TargetEntry]) -> Value {
    let rows: Vec<Value> = targets
        .iter()
        .map(|t| {
            json!({
                "target": t.target_uuid, "pool": t.pool_uuid, "name": t.pool_name,
                "index": t.index, "count": t.count, "generation": t.generation,
                "state": t.state, "mount_point": t.mount_point,
                "activated_ms": t.activated_ms, "node": t.node,
            })
        })
        .collect();
    json!({ "targets": rows })
}
