//! A node agent's targets as the server's registry receives them.

use calm_node::agent::TargetSnapshot;
use calm_node::label::uuid_text;

use crate::pb;

/// The registration of `node`'s targets: every one it holds (`complete`), each with its
/// label's identities, its state, where it is mounted and since when.
pub fn registration(node: &str, targets: Vec<TargetSnapshot>) -> pb::TargetRegistration {
    pb::TargetRegistration {
        node: node.to_string(),
        complete: true,
        targets: targets
            .into_iter()
            .map(|t| pb::TargetEntry {
                target_uuid: uuid_text(&t.label.target),
                pool_uuid: uuid_text(&t.label.pool),
                pool_name: t.label.pool_name,
                index: t.label.index,
                count: t.label.count,
                generation: t.label.generation,
                state: t.state.to_string(),
                mount_point: t
                    .mount_point
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                activated_ms: t.activated_ms.unwrap_or(0),
                node: String::new(),
                registered_ms: 0,
            })
            .collect(),
    }
}

/// The registry's targets as a table for a terminal: pool, state, generation, member, node,
/// mount point.
pub fn table(targets: &[pb::TargetEntry]) -> Vec<String> {
    let mut out = vec![format!(
        "{:<16} {:<11} {:>4} {:>6} {:<12} {:<30}",
        "pool", "state", "gen", "member", "node", "mounted at"
    )];
    for t in targets {
        out.push(format!(
            "{:<16} {:<11} {:>4} {:>6} {:<12} {:<30}",
            t.pool_name,
            t.state,
            t.generation,
            format!("{}/{}", t.index, t.count),
            t.node,
            t.mount_point
        ));
    }
    out
}
