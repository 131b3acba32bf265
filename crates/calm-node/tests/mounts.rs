//! The mount-table watcher against the real kernel, in a private mount namespace: each test
//! re-runs this test binary under `unshare --mount` (so every mount it makes vanishes with that
//! process, however it ends) with `CALM_NODE_IN_NAMESPACE` set; only then do the `inner_*`
//! tests act.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use calm_node::mounts::kernel::read_mountinfo;
use calm_node::mounts::{Mode, Mount, MountWatcher};

const IN_NAMESPACE: &str = "CALM_NODE_IN_NAMESPACE";

/// Runs the inner test `name` in a private mount namespace and asserts it passed.
fn in_namespace(name: &str) {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--"])
        .arg(exe)
        .args([
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(IN_NAMESPACE, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} in a private namespace:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn inside() -> bool {
    std::env::var_os(IN_NAMESPACE).is_some()
}

fn c(path: &Path) -> CString {
    CString::new(path.as_os_str().as_encoded_bytes()).unwrap()
}

fn bind(source: &Path, target: &Path) {
    // SAFETY: mount(2) with valid C strings.
    let rc = unsafe {
        libc::mount(
            c(source).as_ptr(),
            c(target).as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    assert_eq!(
        rc,
        0,
        "bind {}: {}",
        target.display(),
        std::io::Error::last_os_error()
    );
}

fn unmount(target: &Path) {
    // SAFETY: umount2(2) with a valid C string.
    let rc = unsafe { libc::umount2(c(target).as_ptr(), 0) };
    assert_eq!(
        rc,
        0,
        "umount {}: {}",
        target.display(),
        std::io::Error::last_os_error()
    );
}

type Key = (u32, u32, PathBuf, String);

fn keys(mounts: &[Mount]) -> BTreeSet<Key> {
    mounts
        .iter()
        .map(|m| (m.id, m.parent, m.mount_point.clone(), m.fs_type.clone()))
        .collect()
}

/// Waits until the watcher's table equals mountinfo; returns the last difference otherwise.
fn settle(watcher: &MountWatcher) -> Result<usize, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let truth = keys(&read_mountinfo().unwrap());
        let seen = keys(&watcher.table());
        if truth == seen {
            return Ok(truth.len());
        }
        if Instant::now() > deadline {
            let missing: Vec<_> = truth.difference(&seen).take(5).collect();
            let extra: Vec<_> = seen.difference(&truth).take(5).collect();
            return Err(format!("missing {missing:?}, extra {extra:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn storm(mode: Mode, mounts: usize) {
    let watcher = MountWatcher::start_with(mode).expect("start the watcher");
    let base = tempfile::tempdir().unwrap();
    let source = base.path().join("source");
    std::fs::create_dir(&source).unwrap();
    let targets: Vec<PathBuf> = (0..mounts)
        .map(|i| base.path().join(format!("m{i}")))
        .collect();
    for t in &targets {
        std::fs::create_dir(t).unwrap();
    }
    let before = watcher.table().len();
    for t in &targets {
        bind(&source, t);
    }
    // Stack a second mount on a few, then take half of everything away again.
    for t in targets.iter().step_by(100) {
        bind(&source, t);
    }
    for t in targets.iter().skip(1).step_by(2) {
        unmount(t);
    }
    let n = settle(&watcher).unwrap_or_else(|e| panic!("{mode:?}: the table is not exact: {e}"));
    assert!(
        n >= before + mounts / 2,
        "{mode:?}: {n} mounts after the storm"
    );
    // Everything away: back to where it started.
    for t in targets.iter().step_by(2) {
        unmount(t);
    }
    // The stacked ones on odd mount points are gone with them; on even ones one is left.
    for t in targets.iter().step_by(100) {
        unmount(t);
    }
    assert_eq!(settle(&watcher).unwrap(), before, "{mode:?}");
    assert!(watcher.failed().is_none());
}

#[test]
#[ignore = "runs inside a private mount namespace (see in_namespace)"]
fn inner_storm_fanotify() {
    if inside() {
        storm(Mode::Fanotify, 2000);
    }
}

#[test]
#[ignore = "runs inside a private mount namespace (see in_namespace)"]
fn inner_storm_mountinfo() {
    if inside() {
        storm(Mode::Mountinfo { budget: 10 }, 1000);
    }
}

#[test]
#[ignore = "runs inside a private mount namespace (see in_namespace)"]
fn inner_overflow_resyncs_without_missing_a_mount() {
    if !inside() {
        return;
    }
    let watcher = MountWatcher::start_with(Mode::Fanotify).unwrap();
    let base = tempfile::tempdir().unwrap();
    let source = base.path().join("source");
    std::fs::create_dir(&source).unwrap();
    let kept = base.path().join("kept");
    std::fs::create_dir(&kept).unwrap();
    let churn = base.path().join("churn");
    std::fs::create_dir(&churn).unwrap();
    {
        // The watcher cannot take events while the table is held: the kernel's queue
        // (16 384 events by default) overflows under 24 000 mount changes.
        let _frozen = watcher.freeze();
        for _ in 0..12_000 {
            bind(&source, &churn);
            unmount(&churn);
        }
        bind(&source, &kept);
    }
    settle(&watcher).unwrap_or_else(|e| panic!("after an overflow: {e}"));
    assert!(watcher.stats().overflows >= 1, "{:?}", watcher.stats());
    assert!(watcher.table().iter().any(|m| m.mount_point == kept));
}

fn own_mount(mode: Mode) {
    let watcher = MountWatcher::start_with(mode).unwrap();
    let base = tempfile::tempdir().unwrap();
    let source = base.path().join("source");
    std::fs::create_dir(&source).unwrap();
    // A storm is going on (so a budgeted watcher is holding back)...
    let noise: Vec<PathBuf> = (0..300)
        .map(|i| base.path().join(format!("n{i}")))
        .collect();
    for n in &noise {
        std::fs::create_dir(n).unwrap();
        bind(&source, n);
    }
    // ...and our own mount still completes at once.
    let mine = base.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    let expected = watcher.expect(&mine);
    let started = Instant::now();
    bind(&source, &mine);
    let seen = expected.wait(Duration::from_secs(10));
    let took = started.elapsed();
    assert_eq!(seen.map(|m| m.mount_point), Some(mine), "{mode:?}");
    assert!(
        took < Duration::from_secs(2),
        "{mode:?}: own mount seen after {took:?}"
    );
}

#[test]
#[ignore = "runs inside a private mount namespace (see in_namespace)"]
fn inner_own_mount_completes() {
    if inside() {
        own_mount(Mode::Fanotify);
        own_mount(Mode::Mountinfo { budget: 10 });
    }
}

#[test]
fn a_storm_of_2000_bind_mounts_leaves_the_fanotify_table_exact() {
    in_namespace("inner_storm_fanotify");
}

#[test]
fn a_storm_leaves_the_mountinfo_fallback_table_exact() {
    in_namespace("inner_storm_mountinfo");
}

#[test]
fn an_overflow_of_the_event_queue_resyncs_without_missing_a_mount() {
    in_namespace("inner_overflow_resyncs_without_missing_a_mount");
}

#[test]
fn the_completion_of_ones_own_mount_never_waits_for_the_budget() {
    in_namespace("inner_own_mount_completes");
}

#[test]
#[ignore = "runs inside a private mount namespace (see in_namespace)"]
fn inner_a_fuse_subtype_is_part_of_the_type() {
    if !inside() {
        return;
    }
    let watcher = MountWatcher::start_with(Mode::Fanotify).unwrap();
    let base = tempfile::tempdir().unwrap();
    let target = base.path().join("fuse");
    std::fs::create_dir(&target).unwrap();
    // A FUSE mount needs only an open /dev/fuse to exist (nothing answers it: it is never
    // used, only listed); closing the device ends its connection.
    let dev = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .unwrap();
    let options = CString::new(format!(
        "fd={},rootmode=40000,user_id=0,group_id=0",
        std::os::fd::AsRawFd::as_raw_fd(&dev)
    ))
    .unwrap();
    let fs_type = CString::new("fuse.calmtest").unwrap();
    let source = CString::new("calmtest").unwrap();
    // SAFETY: mount(2) with valid C strings.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            c(&target).as_ptr(),
            fs_type.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            options.as_ptr().cast(),
        )
    };
    assert_eq!(rc, 0, "mount fuse: {}", std::io::Error::last_os_error());
    settle(&watcher).unwrap_or_else(|e| panic!("with a FUSE mount: {e}"));
    let listed = watcher.table();
    let fuse = listed
        .iter()
        .find(|m| m.mount_point == target)
        .expect("the FUSE mount is in the table");
    assert_eq!(fuse.fs_type, "fuse.calmtest");
    drop(dev);
    // SAFETY: umount2(2) with a valid C string.
    unsafe { libc::umount2(c(&target).as_ptr(), libc::MNT_DETACH) };
}

#[test]
fn a_fuse_subtype_is_named_as_mountinfo_names_it() {
    in_namespace("inner_a_fuse_subtype_is_part_of_the_type");
}
