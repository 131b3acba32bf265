//! Files that live long keep working: what a log, a database and a file rewritten in place go
//! through in a day, done through real mounts of one server, on a local object store and on
//! S3. Each test checks every operation's answer and the bytes at the end against a model,
//! then stops everything and checks the store: no object leaked (`calm gc` finds none), and no
//! chunk left with more records than the compactor's bound.

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::{
    Backend, Mount, Server, UNPRIVILEGED_UID, all_at_once, calm_json_env, python_in,
    python_unprivileged_in,
};

/// The most records a chunk keeps once the compactor has caught up
/// (`calm_meta::compaction::CHUNK_SLICES_COMPACT_ALWAYS`).
const RECORDS_PER_CHUNK_BOUND: u64 = 1024;

/// Seconds one program of a test may run before it counts as hung.
const PROGRAM_SECONDS_MAX: u32 = 600;

fn endurance(mount: &Mount, args: &[String]) -> String {
    let out = python_in(mount, PROGRAM_SECONDS_MAX, "endurance.py", args);
    succeeded(out, args, "")
}

/// [`endurance`] as an unprivileged user (the mount needs `--allow-other`).
fn endurance_unprivileged(mount: &Mount, args: &[String]) -> String {
    let out = python_unprivileged_in(mount, PROGRAM_SECONDS_MAX, "endurance.py", args);
    succeeded(out, args, " as an unprivileged user")
}

/// The line a program printed, once it succeeded.
fn succeeded(out: std::process::Output, args: &[String], how: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "endurance.py {args:?}{how} ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.trim_end().to_string()
}

fn args(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

fn path(mount: &Mount, name: &str) -> String {
    mount.mnt.join(name).to_str().expect("utf-8").to_string()
}

/// Stops the mounts and the server, then checks the store offline: clean, every chunk within
/// the compactor's bound, and no object that nothing names.
fn check_store(tmp: &tempfile::TempDir, backend: &Backend, server: Server, mounts: Vec<Mount>) {
    for mount in mounts {
        let (status, rest) = mount.terminate();
        assert!(status.success(), "mount: {status} {rest}");
    }
    let (status, rest) = server.terminate();
    assert!(status.success(), "server: {status} {rest}");
    let data = common::data_dir(tmp);
    let data = data.to_str().expect("utf-8");
    let fsck = calm_json_env(&["fsck", data, "--json"], &backend.env());
    assert_eq!(fsck["clean"], true, "{fsck}");
    let records = fsck["slice_records_per_chunk_max"]
        .as_u64()
        .expect("a count");
    assert!(
        records <= RECORDS_PER_CHUNK_BOUND,
        "a chunk holds {records} records: {fsck}"
    );
    let gc = calm_json_env(&["gc", data, "--grace-s", "0", "--json"], &backend.env());
    assert_eq!(gc["leaked"], 0, "objects no file names: {gc}");
    assert_eq!(gc["unfinished"], 0, "unfinished writes: {gc}");
    assert_eq!(gc["missing"], 0, "{gc}");
}

/// Two writer processes on each of `mounts_used` mounts append `total` lines in all to one log
/// with O_APPEND, one write(2) per line; the log then holds every line whole, each writer's in
/// its order.
fn a_log_takes_appends(backend: Backend, mounts_used: usize, total: usize) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (server, a, b) = backend.two_mounts(&tmp);
    let mounts = [&a, &b];
    let writers = 2 * mounts_used;
    let per_writer = total / writers;
    let outs = all_at_once((0..writers).collect(), |w| {
        let mount = mounts[w % mounts_used];
        let (tag, log) = (format!("w{w}"), path(mount, "app.log"));
        endurance(
            mount,
            &args(&["append", &log, &tag, &per_writer.to_string()]),
        )
    });
    for out in outs {
        assert_eq!(out, format!("appended {per_writer}"));
    }
    let expected: Vec<String> = (0..writers).map(|w| format!("w{w}:{per_writer}")).collect();
    for mount in mounts {
        let mut check = args(&["check-appends", &path(mount, "app.log")]);
        check.extend(expected.iter().cloned());
        let out = endurance(mount, &check);
        assert!(
            out.starts_with(&format!("lines {} torn 0 missing 0 ", per_writer * writers)),
            "{out}"
        );
    }
    check_store(&tmp, &backend, server, vec![a, b]);
}

on_each_store!(
    a_log_takes_appends(1, 100_000):
    a_log_takes_100_000_appends_from_one_mount_on_a_local_directory,
    a_log_takes_100_000_appends_from_one_mount_on_s3,
    "log-one"
);

on_each_store!(
    a_log_takes_appends(2, 100_000):
    a_log_takes_100_000_appends_from_two_mounts_on_a_local_directory,
    a_log_takes_100_000_appends_from_two_mounts_on_s3,
    "log-two"
);

/// One writer on each of two mounts makes `total` small writes into the pages of a 4 MiB file
/// it alone writes (even pages, odd pages), each followed by fsync, every fsync checked; the
/// file then reads as both writers' models, from either mount.
fn a_database_file_takes_fsyncd_writes(backend: Backend, total: usize) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (server, a, b) = backend.two_mounts(&tmp);
    a.sh_ok("head -c 4194304 /dev/zero > db && sync");
    let models: Vec<String> = (0..2)
        .map(|w| {
            tmp.path()
                .join(format!("model{w}"))
                .to_str()
                .expect("utf-8")
                .to_string()
        })
        .collect();
    let mounts = [&a, &b];
    let per_writer = (total / 2).to_string();
    let outs = all_at_once(vec![0usize, 1], |w| {
        endurance(
            mounts[w],
            &args(&[
                "fsync-writes",
                &path(mounts[w], "db"),
                &models[w],
                &(w + 7).to_string(),
                &per_writer,
                &w.to_string(),
            ]),
        )
    });
    for out in outs {
        assert_eq!(out, format!("fsynced {per_writer}"));
    }
    for mount in mounts {
        let mut check = args(&["check-pages", &path(mount, "db")]);
        check.extend(models.iter().cloned());
        assert_eq!(endurance(mount, &check), "size 4194304 pages differing 0");
    }
    check_store(&tmp, &backend, server, vec![a, b]);
}

on_each_store!(
    a_database_file_takes_fsyncd_writes(20_000):
    a_database_file_takes_20_000_fsyncd_writes_from_two_mounts_on_a_local_directory,
    a_database_file_takes_20_000_fsyncd_writes_from_two_mounts_on_s3,
    "fsync"
);

/// A sqlite database with a rollback journal, written by one process on each of two mounts
/// (fcntl locks between them), `total` transactions in all: every row there, once, and
/// integrity_check ok. The writers are an unprivileged user's, as a site's databases are (the
/// kernel then checks their permission on each path it walks, with the directories' ACLs).
fn sqlite_takes_transactions(backend: Backend, total: usize) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (server, a, b) = backend.two_mounts_with(&tmp, &["--allow-other"]);
    let mounts = [&a, &b];
    for mount in mounts {
        // sqlite looks at each directory on the database's path.
        let parent = mount.mnt.parent().expect("a mount point's directory");
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    a.sh_ok(&format!(
        "mkdir db && chown {UNPRIVILEGED_UID}:{UNPRIVILEGED_UID} db"
    ));
    let as_user = |mount: &Mount, words: &[&str]| endurance_unprivileged(mount, &args(words));
    assert_eq!(
        as_user(&a, &["sqlite-init", &path(&a, "db/app.db")]),
        "created"
    );
    let per_writer = (total / 2).to_string();
    let outs = all_at_once(vec![0usize, 1], |w| {
        let mount = mounts[w];
        as_user(
            mount,
            &[
                "sqlite",
                &path(mount, "db/app.db"),
                &format!("w{w}"),
                &per_writer,
            ],
        )
    });
    for out in outs {
        assert_eq!(out, format!("committed {per_writer}"));
    }
    for mount in mounts {
        let out = as_user(
            mount,
            &[
                "check-sqlite",
                &path(mount, "db/app.db"),
                &format!("w0:{per_writer}"),
                &format!("w1:{per_writer}"),
            ],
        );
        assert_eq!(
            out,
            format!("integrity ok rows {total} counter {total} writers_wrong 0")
        );
    }
    check_store(&tmp, &backend, server, vec![a, b]);
}

on_each_store!(
    sqlite_takes_transactions(20_000):
    sqlite_takes_20_000_transactions_from_two_mounts_on_a_local_directory,
    sqlite_takes_20_000_transactions_from_two_mounts_on_s3,
    "sqlite"
);

/// A 256 KiB file rewritten in place `total` times on one mount; after each thousand, the
/// other mount reads the last version.
fn a_file_rewritten_in_place_reads_the_last_version(backend: Backend, total: usize) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (server, a, b) = backend.two_mounts(&tmp);
    for round in 0..total / 1000 {
        let first = (round * 1000).to_string();
        let written = endurance(
            &a,
            &args(&["rewrite", &path(&a, "state"), "seed", &first, "1000"]),
        );
        let read = endurance(&b, &args(&["digest", &path(&b, "state")]));
        assert_eq!(read, written, "round {round}");
    }
    check_store(&tmp, &backend, server, vec![a, b]);
}

on_each_store!(
    a_file_rewritten_in_place_reads_the_last_version(10_000):
    a_file_rewritten_10_000_times_reads_whole_from_another_mount_on_a_local_directory,
    a_file_rewritten_10_000_times_reads_whole_from_another_mount_on_s3,
    "rewrite"
);
