//! ROOT/pools.json: the pools as the agent last saw them (written whole and renamed into
//! place, so a reader never sees half of it), and the table `calm pools` prints of it.

use serde_json::{Value, json};

/// One pool's line of the file.
#[derive(Debug, Clone)]
pub struct PoolRow {
    pub uuid: String,
    pub name: String,
    pub generation: u64,
    pub count: u32,
    /// Members present and missing, by index.
    pub present: Vec<u32>,
    pub missing: Vec<u32>,
    pub state: &'static str,
    pub activated_at_ms: Option<u64>,
    /// Each mounted member: its index, and where it is mounted or why it is not.
    pub mounts: Vec<(u32, Result<String, String>)>,
}

/// The file's text for `rows`.
pub fn text(rows: &[PoolRow]) -> String {
    let pools: Vec<Value> = rows
        .iter()
        .map(|p| {
            let mounts: Vec<Value> = p
                .mounts
                .iter()
                .map(|(index, r)| match r {
                    Ok(path) => json!({ "index": index, "mounted": path }),
                    Err(e) => json!({ "index": index, "error": e }),
                })
                .collect();
            json!({
                "uuid": p.uuid, "name": p.name, "generation": p.generation, "count": p.count,
                "present": p.present, "missing": p.missing, "state": p.state,
                "activated_at_ms": p.activated_at_ms, "mounts": mounts,
            })
        })
        .collect();
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
        let rows = [PoolRow {
            uuid: "u".into(),
            name: "data \"1\"".into(),
            generation: 3,
            count: 4,
            present: vec![0, 1, 3],
            missing: vec![2],
            state: "degraded",
            activated_at_ms: Some(17),
            mounts: vec![(0, Ok("/mnt/a".into())), (1, Err("busy".into()))],
        }];
        let lines = table(&text(&rows)).unwrap();
        assert_eq!(lines.len(), 2);
        let line: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(line, ["data", "\"1\"", "degraded", "3", "0,1,3", "2", "17"]);
        assert!(table("{").unwrap_err().starts_with("not a pools file"));
    }
}
