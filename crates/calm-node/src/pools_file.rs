//! ROOT/pools.json: the pools as the agent last saw them (written whole and renamed into
//! place, so a reader never sees half of it), and the table `calm pools` prints of it.

use serde_json::{Value, json};

/// One pool's entry in the file: members present and missing by index, and each mounted
/// member's index with where it is mounted or why it is not.
pub fn pool(
    uuid: &str,
    name: &str,
    (generation, count): (u64, u32),
    (present, missing): (&[u32], &[u32]),
    state: &str,
    activated_at_ms: Option<u64>,
    mounts: &[(u32, Result<String, String>)],
) -> Value {
    let mounts: Vec<Value> = mounts
        .iter()
        .map(|(index, r)| match r {
            Ok(path) => json!({ "index": index, "mounted": path }),
            Err(e) => json!({ "index": index, "error": e }),
        })
        .collect();
    json!({
        "uuid": uuid, "name": name, "generation": generation, "count": count,
        "present": present, "missing": missing, "state": state,
        "activated_at_ms": activated_at_ms, "mounts": mounts,
    })
}

/// The file's text for the pools' entries ([`pool`]).
pub fn text(pools: Vec<Value>) -> String {
    format!("{}\n", json!({ "pools": pools }))
}

/// The table of the file's `text`: a pool per line with its state, generation, members
/// present and missing, and when it was activated.
pub fn table(text: &str) -> Result<Vec<String>, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not a pools file: {e}"))?;
    let mut out = vec![format!(
        "{:<16} {:<11} {:>4} {:<12} {:<12} {:>15}",
        "pool", "state", "gen", "present", "missing", "activated (ms)"
    )];
    let list = |v: &Value| {
        let items: Vec<String> = v
            .as_array()
            .into_iter()
            .flatten()
            .map(Value::to_string)
            .collect();
        items.join(",")
    };
    for p in value["pools"].as_array().into_iter().flatten() {
        out.push(format!(
            "{:<16} {:<11} {:>4} {:<12} {:<12} {:>15}",
            p["name"].as_str().unwrap_or(""),
            p["state"].as_str().unwrap_or(""),
            p["generation"],
            list(&p["present"]),
            list(&p["missing"]),
            p["activated_at_ms"]
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_reads_what_the_agent_wrote() {
        let entry = pool(
            "u",
            "data \"1\"",
            (3, 4),
            (&[0, 1, 3], &[2]),
            "degraded",
            Some(17),
            &[(0, Ok("/mnt/a".into())), (1, Err("busy".into()))],
        );
        let lines = table(&text(vec![entry])).unwrap();
        assert_eq!(lines.len(), 2);
        let line: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(line, ["data", "\"1\"", "degraded", "3", "0,1,3", "2", "17"]);
        assert!(table("{").unwrap_err().starts_with("not a pools file"));
    }
}
