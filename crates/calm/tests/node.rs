//! `calm node` for real: directory targets and loop devices, the agent in a private mount
//! namespace (`unshare --mount`: its mounts vanish with it however the test ends), loop devices
//! detached by a guard even when the test fails.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::CALM;

/// A `calm node` in its own mount namespace; killed when dropped.
struct Node {
    child: Child,
    root: PathBuf,
}

impl Node {
    /// An agent for pool `pool` only (tests run side by side, and every agent sees every
    /// block device of the machine).
    fn start(root: &Path, pool: &str, targets: &[&Path]) -> Node {
        Node::start_with(root, pool, targets, &[])
    }

    fn start_with(root: &Path, pool: &str, targets: &[&Path], extra: &[&str]) -> Node {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--"])
            .arg(CALM)
            .arg("node")
            .arg("--root")
            .arg(root)
            .args(["--pool", pool])
            .args(extra);
        if !targets.is_empty() {
            cmd.arg("--targets").args(targets);
        }
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn calm node");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().expect("piped")),
            &mut line,
        )
        .expect("ready line");
        assert!(line.starts_with("ready: "), "calm node said {line:?}");
        Node {
            child,
            root: root.to_path_buf(),
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Waits until `calm pools --json` shows `pool` in `state`; returns the pool's JSON.
    fn wait_for(&self, pool: &str, state: &str) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = common::calm(&["pools", "--json", "--root", self.root.to_str().unwrap()]);
            if out.status.success() {
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                if let Some(p) = v["pools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p["name"] == pool && p["state"] == state)
                {
                    return p.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "pool {pool} never became {state}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Mount points of the agent's namespace under its root.
    fn mounts(&self) -> Vec<String> {
        let info = std::fs::read_to_string(format!("/proc/{}/mountinfo", self.child.id())).unwrap();
        let mut out: Vec<String> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| p.starts_with(self.root.to_str().unwrap()))
            .map(str::to_string)
            .collect();
        out.sort();
        out
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn format(path: &Path, pool: &str, index: u32, pool_uuid: Option<&str>) -> String {
    let mut args = vec![
        "target".to_string(),
        "format".into(),
        path.display().to_string(),
        "--pool".into(),
        pool.into(),
        "--index".into(),
        index.to_string(),
        "--count".into(),
        "4".into(),
    ];
    if let Some(u) = pool_uuid {
        args.extend(["--pool-uuid".into(), u.into()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = common::calm(&args);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    // "... of pool \"NAME\" UUID generation 1"
    text.split_whitespace()
        .rev()
        .nth(2)
        .expect("the pool uuid")
        .to_string()
}

#[test]
fn directory_targets_assemble_into_a_pool_activated_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> = (0..4).map(|i| tmp.path().join(format!("t{i}"))).collect();
    for d in &dirs {
        std::fs::create_dir(d).unwrap();
    }
    let uuid = format(&dirs[0], "dirs", 0, None);
    format(&dirs[1], "dirs", 1, Some(&uuid));
    format(&dirs[2], "dirs", 2, Some(&uuid));
    let root = tmp.path().join("root");
    let targets: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    let node = Node::start(&root, "dirs", &targets);
    let p = node.wait_for("dirs", "assembling");
    assert_eq!(p["missing"], serde_json::json!([3]));
    assert!(
        node.mounts().is_empty(),
        "nothing mounted before the pool is complete"
    );
    // The last member is labelled; directories send no uevent: SIGHUP enumerates again.
    format(&dirs[3], "dirs", 3, Some(&uuid));
    node.signal(libc::SIGHUP);
    let p = node.wait_for("dirs", "active");
    assert!(p["activated_at_ms"].as_u64().is_some());
    let deadline = Instant::now() + Duration::from_secs(10);
    while node.mounts().len() < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let expected: Vec<String> = (0..4)
        .map(|i| {
            root.join("pools/dirs")
                .join(i.to_string())
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(node.mounts(), expected);
    // Bad input: a directory that is not there.
    let out = common::calm(&[
        "node",
        "--root",
        "/tmp",
        "--targets",
        "/nonexistent-calm-dir",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
}

/// Loop devices attached for a test, detached when dropped.
struct Loops(Vec<String>);

impl Drop for Loops {
    fn drop(&mut self) {
        for dev in &self.0 {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
    }
}

#[test]
fn loop_devices_arrive_by_uevent_and_their_pool_is_mounted_then_degraded() {
    let tmp = tempfile::tempdir().unwrap();
    let images: Vec<PathBuf> = (0..4).map(|i| tmp.path().join(format!("img{i}"))).collect();
    let mut uuid = None;
    for (i, img) in images.iter().enumerate() {
        let f = std::fs::File::create(img).unwrap();
        f.set_len(8 << 20).unwrap();
        let ok = Command::new("mkfs.ext4")
            .arg("-q")
            .arg(img)
            .status()
            .unwrap();
        assert!(ok.success());
        let u = format(img, "loops", i as u32, uuid.as_deref());
        uuid.get_or_insert(u);
    }
    let root = tmp.path().join("root");
    let node = Node::start(&root, "loops", &[]);
    // Attach them while the agent runs: each attach is a uevent.
    let mut loops = Loops(Vec::new());
    for img in &images {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(img)
            .output()
            .unwrap();
        assert!(out.status.success(), "losetup: {out:?}");
        loops
            .0
            .push(String::from_utf8(out.stdout).unwrap().trim().to_string());
    }
    let p = node.wait_for("loops", "active");
    assert_eq!(p["present"], serde_json::json!([0, 1, 2, 3]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while node.mounts().len() < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(node.mounts().len(), 4, "{:?}", node.mounts());
    // A member goes away (unmounted in the agent's namespace, then detached: the kernel's
    // change event finds no label any more): the pool is degraded, not activated again.
    let member = root.join("pools/loops/3");
    let out = Command::new("nsenter")
        .args(["-t", &node.child.id().to_string(), "-m", "umount"])
        .arg(&member)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let last = loops.0.pop().unwrap();
    let detached = Command::new("losetup")
        .args(["-d", &last])
        .status()
        .unwrap();
    assert!(detached.success());
    let p = node.wait_for("loops", "degraded");
    assert_eq!(p["missing"], serde_json::json!([3]));
}

#[test]
fn the_metadata_server_registry_lists_a_nodes_targets() {
    let tmp = tempfile::tempdir().unwrap();
    let server = common::Server::start(&common::data_dir(&tmp));
    let dirs: Vec<PathBuf> = (0..4).map(|i| tmp.path().join(format!("r{i}"))).collect();
    let mut uuid = None;
    for (i, d) in dirs.iter().enumerate() {
        std::fs::create_dir(d).unwrap();
        let u = format(d, "registered", i as u32, uuid.as_deref());
        uuid.get_or_insert(u);
    }
    let root = tmp.path().join("root");
    let targets: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    let node = Node::start_with(&root, "registered", &targets, &["--server", &server.addr]);
    node.wait_for("registered", "active");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = common::calm(&["pools", "--json", "--server", &server.addr]);
        assert!(out.status.success(), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let rows = v["targets"].as_array().unwrap();
        let mounted = rows
            .iter()
            .filter(|t| t["name"] == "registered" && t["state"] == "active")
            .filter(|t| t["mount_point"].as_str().is_some_and(|m| !m.is_empty()))
            .count();
        if mounted == 4 {
            assert!(rows.iter().all(|t| t["pool"] == uuid.as_deref().unwrap()));
            break;
        }
        assert!(Instant::now() < deadline, "registry: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
