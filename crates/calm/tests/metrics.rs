//! Prometheus's metrics of a server (`calm serve --metrics`) and of a mount (`calm mount
//! --metrics`): promtool accepts what each endpoint serves, the requests a mount sends are
//! counted by method with their failures, the kernel's requests to a mount by kind with
//! theirs, and a real Prometheus scraping both answers rates the test caused.

use crate::common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Mount, Server, free_port, sample};

/// `GET path` on `addr`; the body.
fn get(addr: &str, path: &str) -> String {
    common::http_get(addr, path)
}

fn promtool_accepts(text: &str) {
    let out = common::promtool_check_metrics(text);
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_server_s_metrics_count_what_its_mounts_ask() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let metrics = format!("127.0.0.1:{}", free_port());
    let server = Server::start_with(&data, &["--metrics", &metrics]);
    let mount = Mount::remote(&server.addr, &[]);
    // The mount may answer the creates itself and send them on in groups: a syncfs makes
    // sure every one reached the server before it is scraped.
    mount.sh_ok("for i in $(seq 50); do : > f$i; done; ls missing 2>/dev/null || true; sync -f .");
    let text = get(&metrics, "/metrics");
    promtool_accepts(&text);
    let made = sample(
        &text,
        "calm_server_requests_seconds_count{op=\"calm.v1.Meta/Make\"}",
    )
    .unwrap_or(0.0);
    assert!(made >= 50.0, "every create counted:\n{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("calm_server_requests_errors_total")
                && l.contains("error=\"NotFound\"")),
        "the lookups of missing names counted as NotFound:\n{text}"
    );
    assert_eq!(sample(&text, "calm_inodes"), Some(51.0), "{text}");
    // The mount's watch stream: its queue is there, empty or nearly.
    assert!(
        sample(&text, "calm_watch_queued_changes_max").is_some_and(|q| q <= 4096.0),
        "{text}"
    );
    // Commit groups as distributions: every create was in one.
    let groups = sample(&text, "calm_commit_group_operations_count").unwrap_or(0.0);
    assert!(groups >= 1.0, "{text}");
    assert!(
        sample(&text, "calm_commit_group_operations_sum").unwrap_or(0.0) >= 50.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "calm_commit_group_seconds_bucket{le=\"+Inf\"}"),
        sample(&text, "calm_commit_group_seconds_count"),
        "{text}"
    );
    // The write-ahead log was flushed, at most once per group (a server answers a change once
    // its record is written and flushes within 10 ms, sharing a flush among the groups
    // written meanwhile), timed apart from the groups (a few commits of the server's own, at
    // start, are not in groups).
    let syncs = sample(&text, "calm_store_wal_sync_seconds_count").unwrap_or(0.0);
    assert!(syncs >= 1.0 && syncs <= groups + 5.0, "{text}");
    // The flushes were timed (on the store's own thread: not a part of the groups' time).
    assert!(
        sample(&text, "calm_store_wal_sync_seconds_sum").is_some_and(|s| s > 0.0),
        "{text}"
    );
    assert!(
        sample(&text, "calm_store_wal_written_bytes_total").unwrap_or(0.0) >= 50.0 * 24.0,
        "{text}"
    );
    assert!(
        sample(&text, "calm_lock_sessions").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    // The mount's connection (plain TCP on loopback, as root) and its requests.
    let tcp_root = "{listener=\"tcp\",identity=\"superuser\"}";
    assert!(
        sample(&text, &format!("calm_server_connections{tcp_root}")).unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    // A batch (the makes a mount answered itself, sent in order) is one request on its
    // connection but each of its calls is counted by its method: so the connection carried at
    // least the lookup of the missing name and the creates, and at most as many requests as
    // the methods counted.
    let on_connection = sample(
        &text,
        &format!("calm_server_connection_requests_total{tcp_root}"),
    )
    .unwrap_or(0.0);
    let by_method: f64 = text
        .lines()
        .filter_map(|l| l.strip_prefix("calm_server_requests_seconds_count{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        on_connection >= 2.0 && on_connection <= by_method,
        "{on_connection} requests on the connection, {by_method} by method:\n{text}"
    );
    // Anything but /metrics: 404.
    let mut stream = std::net::TcpStream::connect(&metrics).unwrap();
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
}

/// A mount's own endpoint: the kernel's requests counted by kind with their failures by errno,
/// the object store's requests with their bytes; `calm stats MOUNTPOINT` shows the creates'
/// rate.
#[test]
fn a_mount_s_metrics_count_the_kernel_s_requests() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = Server::start(&data);
    let metrics = format!("127.0.0.1:{}", free_port());
    let mount = Mount::remote(&server.addr, &["--metrics", &metrics]);
    mount.sh_ok(
        "for i in $(seq 50); do : > f$i; done
         python3 -c \"import os
for _ in range(5):
    try: os.getxattr('f1', 'user.unset')
    except OSError: pass\"
         head -c 5242880 /dev/urandom > big; sync big
         dd if=big of=/dev/null bs=1M iflag=direct status=none",
    );
    let text = get(&metrics, "/metrics");
    promtool_accepts(&text);
    let at = |series: &str| sample(&text, series).unwrap_or(0.0);
    assert!(
        at("calm_mount_requests_seconds_count{op=\"create\"}") >= 51.0,
        "{text}"
    );
    assert!(
        at("calm_mount_requests_errors_total{error=\"ENODATA\",op=\"getxattr\"}") >= 5.0,
        "{text}"
    );
    assert!(
        at("calm_objects_requests_seconds_count{kind=\"put\",part=\"mount\"}") >= 2.0,
        "5 MiB: two blocks at least\n{text}"
    );
    assert!(
        at("calm_objects_bytes_total{kind=\"put\",part=\"mount\"}") >= 5242880.0,
        "{text}"
    );
    assert!(
        at("calm_objects_bytes_total{kind=\"get\",part=\"mount\"}") >= 5242880.0,
        "the direct read went to the store:\n{text}"
    );
    assert!(
        text.contains("# HELP calm_mount_requests_seconds How long"),
        "{text}"
    );

    // `calm stats MOUNTPOINT` while the mount makes files.
    let stats = mount.sh_ok(&format!(
        "for i in $(seq 2000); do : > g$i; done & maker=$!
         '{calm}' stats \"$MNT\" --interval-s 0.3 --count 3 --json
         wait $maker",
        calm = common::CALM
    ));
    let lines: Vec<serde_json::Value> = stats
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 3, "{stats}");
    let creates = lines
        .iter()
        .map(|l| l["ops"]["create"]["per_s"].as_f64().unwrap_or(0.0))
        .fold(0.0, f64::max);
    assert!(creates > 0.0, "no create seen: {stats}");
    // Outside a calm mount's root: a clear error.
    let out = common::calm(&["stats", tmp.path().to_str().unwrap(), "--count", "1"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a calm mount"),
        "{out:?}"
    );
}

/// A real Prometheus scrapes the server and a mount every second; creates through the mount
/// show in the rates its HTTP API answers, of the server's requests and of the mount's.
#[test]
fn prometheus_scrapes_a_server_and_a_mount_and_answers_rates_the_test_caused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let metrics = format!("127.0.0.1:{}", free_port());
    let server = Server::start_with(&data, &["--metrics", &metrics]);
    let mount_metrics = format!("127.0.0.1:{}", free_port());
    let mount = Mount::remote(&server.addr, &["--metrics", &mount_metrics]);
    let web = format!("127.0.0.1:{}", free_port());
    let config = tmp.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
             - job_name: calm\n    static_configs:\n      - targets: ['{metrics}', '{mount_metrics}']\n"
        ),
    )
    .unwrap();
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _prometheus = Stop(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (scripts/setup installs it)"),
    );
    // Creates for a few seconds, while it scrapes.
    mount.sh_ok("for i in $(seq 400); do : > f$i; done");
    for query in [
        "sum(rate(calm_server_requests_seconds_count[30s]))",
        "sum(rate(calm_mount_requests_seconds_count{op=\"create\"}[30s]))",
    ] {
        rate_answered(&web, query, &mount);
    }
}

/// Asks the Prometheus at `web` for `query` until it answers a value above zero (at most a
/// minute), making and removing files on `mount` meanwhile.
fn rate_answered(web: &str, query: &str, mount: &Mount) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let encoded: String = query
            .chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '_' => c.to_string(),
                other => format!("%{:02X}", other as u32),
            })
            .collect();
        let path = format!("/api/v1/query?query={encoded}");
        // Nothing or a 503 until Prometheus is ready.
        let answer = common::http_get_when_ready(web, &path).unwrap_or_default();
        if let Ok(json) = serde_json::from_str::<serde_json::Value>(&answer)
            && let Some(value) = json["data"]["result"][0]["value"][1].as_str()
            && value.parse::<f64>().unwrap_or(0.0) > 0.0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus answered no rate for {query} in 60 s: {answer}"
        );
        mount.sh_ok("for i in $(seq 50); do : > g$i; rm g$i; done");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `calm stats` while a mount makes files: the JSON lines show the mutations' rate, the table
/// has its header and one line per interval.
#[test]
fn calm_stats_shows_the_rate_a_mount_causes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &[]);
    let socket = format!("unix:{}", data.join("calm.sock").display());
    let stats = Command::new(common::CALM)
        .args([
            "stats",
            "--server",
            &socket,
            "--interval-s",
            "0.5",
            "--count",
            "6",
            "--json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("calm stats");
    mount.sh_ok("for i in $(seq 300); do : > f$i; done");
    let out = stats.wait_with_output().expect("calm stats");
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 6);
    let most = lines
        .iter()
        .map(|l| l["ops_per_s"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(most > 0.0, "no mutation seen: {lines:?}");
    // The server's time per namespace call: some, and less than a second.
    let call_ms = lines
        .iter()
        .map(|l| l["call_ms"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(call_ms > 0.0 && call_ms < 1000.0, "{lines:?}");
    assert!(lines.iter().all(|l| l["lock_sessions"] == 1), "{lines:?}");

    let table = common::calm(&[
        "stats",
        "--server",
        &socket,
        "--interval-s",
        "0.2",
        "--count",
        "2",
    ]);
    let text = String::from_utf8(table.stdout).unwrap();
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(rows.len(), 3, "{text}");
    assert!(
        rows[0].contains("ops/s") && !text.contains('\u{1b}'),
        "{text}"
    );
}

/// Who loads the server: requests counted per uid and per job (the job read by the mount from
/// each process's environment), shown as metrics and by `calm stats --by`; a flood of job ids
/// keeps the table to its bound.
#[test]
fn the_server_counts_its_load_per_user_and_per_job() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let metrics = format!("127.0.0.1:{}", free_port());
    let server = Server::start_with(&data, &["--metrics", &metrics]);
    let mount = Mount::remote(
        &server.addr,
        &["--allow-other", "--job-variable", "CALM_TEST_JOB"],
    );
    mount.sh_ok(
        "mkdir -m 777 shared
         for i in $(seq 200); do CALM_TEST_JOB=train-7 touch shared/a$i; done
         for i in $(seq 40); do CALM_TEST_JOB='b;7 x' touch shared/b$i; done
         for i in $(seq 60); do
             setpriv --reuid=65534 --regid=65534 --clear-groups touch shared/n$i
         done",
    );
    let text = get(&metrics, "/metrics");
    promtool_accepts(&text);
    let at = |series: &str| sample(&text, series).unwrap_or(0.0);
    let train = at("calm_server_job_requests_total{job=\"train-7\"}");
    // A job id keeps letters, digits and ._:- only.
    let other_job = at("calm_server_job_requests_total{job=\"b7x\"}");
    assert!(train >= 200.0 && other_job >= 40.0, "{text}");
    assert!(train > other_job, "{text}");
    assert!(
        at("calm_server_uid_requests_total{uid=\"65534\"}") >= 60.0,
        "{text}"
    );
    assert!(
        at("calm_server_uid_requests_total{uid=\"0\"}") >= 240.0,
        "{text}"
    );
    assert!(
        at("calm_server_uid_seconds_total{uid=\"0\"}") > 0.0,
        "time is counted too:\n{text}"
    );

    // `calm stats --by job` while one job makes files: it comes first.
    let socket = format!("unix:{}", data.join("calm.sock").display());
    let stats = Command::new(common::CALM)
        .args([
            "stats",
            "--server",
            &socket,
            "--by",
            "job",
            "--interval-s",
            "0.5",
            "--count",
            "4",
            "--json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("calm stats");
    mount.sh_ok("for i in $(seq 600); do CALM_TEST_JOB=busy-1 touch shared/c$i; done");
    let out = stats.wait_with_output().expect("calm stats");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let firsts: Vec<String> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .filter_map(|l| l["loads"][0]["key"].as_str().map(str::to_string))
        .collect();
    assert!(firsts.iter().any(|k| k == "busy-1"), "{text}");

    // A flood of job ids: the metrics name at most the busiest 20 and "other".
    mount.sh_ok("for i in $(seq 300); do CALM_TEST_JOB=flood-$i touch shared/f$i; done");
    let text = get(&metrics, "/metrics");
    let jobs = text
        .lines()
        .filter(|l| l.starts_with("calm_server_job_requests_total{"))
        .count();
    assert!(jobs <= 21, "{jobs} job series:\n{text}");
    assert!(
        sample(&text, "calm_server_job_requests_total{job=\"other\"}").unwrap_or(0.0) >= 100.0,
        "{text}"
    );
}

/// An embedded mount calls its server in the same process, without a connection: its calls
/// are counted as a connection's requests are, by method and failure, and by uid and job.
#[test]
fn an_embedded_mount_s_calls_are_counted_by_its_server() {
    let metrics = format!("127.0.0.1:{}", free_port());
    let mount = Mount::embedded(&["--metrics", &metrics, "--job-variable", "CALM_TEST_JOB"]);
    mount.sh_ok(
        "for i in $(seq 50); do CALM_TEST_JOB=embedded-1 touch f$i; done
         ls missing 2>/dev/null || true
         python3 -c \"import fcntl
f = open('f1', 'r+')
for _ in range(10):
    fcntl.lockf(f, fcntl.LOCK_EX)
    fcntl.lockf(f, fcntl.LOCK_UN)\"",
    );
    let text = get(&metrics, "/metrics");
    promtool_accepts(&text);
    let at = |series: &str| sample(&text, series).unwrap_or(0.0);
    assert!(
        at("calm_server_requests_seconds_count{op=\"calm.v1.Meta/Make\"}") >= 50.0,
        "{text}"
    );
    assert!(
        at("calm_server_requests_errors_total{error=\"NotFound\",op=\"calm.v1.Meta/Lookup\"}")
            >= 1.0,
        "{text}"
    );
    assert!(
        at("calm_server_requests_seconds_count{op=\"calm.v1.Locks/Apply\"}") >= 10.0,
        "{text}"
    );
    assert!(
        at("calm_server_job_requests_total{job=\"embedded-1\"}") >= 50.0,
        "{text}"
    );
    assert!(
        at("calm_server_uid_requests_total{uid=\"0\"}") >= 70.0,
        "{text}"
    );
}

/// The alert rules in docs/: promtool accepts them and its unit tests of them pass, and every
/// metric they name is one a server or a mount serves.
#[test]
fn the_alert_rules_check_and_name_metrics_calm_serves() {
    let rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations");
    for args in [
        &["check", "rules", "alerts.yml"][..],
        &["test", "rules", "alerts_test.yml"][..],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&rules)
            .output()
            .expect("promtool (scripts/setup installs prometheus)");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let metrics = format!("127.0.0.1:{}", free_port());
    let server = Server::start_with(&data, &["--metrics", &metrics]);
    let mount_metrics = format!("127.0.0.1:{}", free_port());
    let mount = Mount::remote(
        &server.addr,
        &["--metrics", &mount_metrics, "--allow-other"],
    );
    // A failure, so that the errors' family has a series.
    mount.sh_ok(": > f; python3 -c \"import os\ntry: os.getxattr('f', 'user.unset')\nexcept OSError: pass\"");
    // A user quota at 95 % of its inodes: counted as near its limit.
    let socket = format!("unix:{}", data.join("calm.sock").display());
    mount.sh_ok("mkdir -m 777 q; for i in $(seq 19); do setpriv --reuid=4242 --regid=4242 --clear-groups touch q/f$i; done");
    let set = common::calm(&[
        "quota", "set", "--server", &socket, "--user", "4242", "--inodes", "20",
    ]);
    assert!(set.status.success(), "{set:?}");
    // A changelog reader that reads nothing, and a lock refused for a conflict.
    let register = common::calm(&["changelog", "register", "--server", &socket]);
    assert!(register.status.success(), "{register:?}");
    mount.sh_ok(
        "for i in $(seq 30); do : > r$i; done
         exec 3>l; flock -n 3; (exec 4>l; flock -n 4) && exit 1; exec 3>&-",
    );
    // Connections from one peer past its limit (the superuser holds the mount's already):
    // the ones over it are closed as they come, and counted.
    let refused =
        "calm_server_connections_refused_total{listener=\"unix\",reason=\"connections_per_peer\"}";
    let held: Vec<std::os::unix::net::UnixStream> = (0..260)
        .map(|_| std::os::unix::net::UnixStream::connect(data.join("calm.sock")).expect("connect"))
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sample(&get(&metrics, "/metrics"), refused).unwrap_or(0.0) < 4.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            get(&metrics, "/metrics")
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(held);
    let served = get(&metrics, "/metrics") + &get(&mount_metrics, "/metrics");
    assert!(
        sample(&served, "calm_changelog_reader_lag_records{reader=\"cl1\"}").unwrap_or(0.0) >= 30.0,
        "{served}"
    );
    assert!(
        sample(&served, "calm_lock_grants_total{waited=\"no\"}").unwrap_or(0.0) >= 1.0,
        "{served}"
    );
    assert!(
        sample(&served, "calm_lock_refusals_total{reason=\"conflict\"}").unwrap_or(0.0) >= 1.0,
        "{served}"
    );
    assert_eq!(
        sample(&served, "calm_quotas_near_limit{kind=\"user\"}"),
        Some(1.0),
        "{served}"
    );
    assert_eq!(
        sample(&served, "calm_quotas_near_limit{kind=\"group\"}"),
        Some(0.0),
        "{served}"
    );
    let text = std::fs::read_to_string(rules.join("alerts.yml")).unwrap();
    let mut named: Vec<&str> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("calm_") && word.len() > 5)
        .collect();
    named.sort_unstable();
    named.dedup();
    assert!(named.len() >= 10, "{named:?}");
    for name in named {
        // Served by servers sharing etcd only: tests/peers.rs reads them from two of three.
        if name.starts_with("calm_peers_") {
            continue;
        }
        assert!(
            served.contains(&format!("# TYPE {name} ")),
            "alerts.yml names {name}, which no endpoint serves"
        );
    }
}

/// Idle connections to the metrics endpoint never keep a scrape waiting: with 8 and then 64
/// connections opened by another user and left silent (and one sending its headers a byte a
/// second), a scrape is answered, and the silent ones are closed by the server after its
/// header timeout (5 s).
#[test]
fn idle_connections_never_block_a_scrape() {
    use std::io::{Read, Write};
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let metrics = format!("127.0.0.1:{}", free_port());
    let server = Server::start_with(&data, &["--metrics", &metrics]);
    for idle in [8, 64] {
        let silent: Vec<std::net::TcpStream> = (0..idle)
            .map(|_| std::net::TcpStream::connect(&metrics).expect("connect"))
            .collect();
        let mut slow = std::net::TcpStream::connect(&metrics).expect("connect");
        slow.write_all(b"GET /metr").unwrap();
        let asked = std::time::Instant::now();
        // A scrape bounded in time: one that waited for ever would fail here, not hang.
        let mut scrape = std::net::TcpStream::connect(&metrics).expect("connect");
        scrape
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        write!(
            scrape,
            "GET /metrics HTTP/1.1\r\nHost: {metrics}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        scrape
            .read_to_string(&mut text)
            .expect("a scrape answered within 30 s");
        assert!(text.contains("calm_inodes"), "{text}");
        eprintln!(
            "{idle} idle connections: a scrape answered in {:?}",
            asked.elapsed()
        );
        for mut stream in silent {
            stream
                .set_read_timeout(Some(std::time::Duration::from_secs(20)))
                .unwrap();
            let mut byte = [0u8; 1];
            // Closed by the server: the read ends (0 bytes), never times out here.
            let read = stream.read(&mut byte);
            let closed = match &read {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
            };
            assert!(closed, "an idle connection stayed open: {read:?}");
        }
        assert!(
            asked.elapsed() < std::time::Duration::from_secs(20),
            "the idle connections were never closed"
        );
        drop(slow);
    }
    let (status, _) = server.terminate();
    assert!(status.success());
}
