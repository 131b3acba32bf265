//! A local etcd cluster of N members on 127.0.0.1, for tests and benchmarks: free ports picked
//! by binding, data in a temporary directory, every member killed and its data removed when the
//! value is dropped (also when a test fails). Members can be killed and started again, for the
//! fault tests.
//!
//! [`shared_url`] names the cluster that `scripts/test` starts for the whole suite
//! (`CALM_TEST_ETCD`), so tests need not each start three processes; a test that kills members
//! starts a cluster of its own.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The variable `scripts/test` sets to an `etcd://` URL (no prefix) of its cluster.
pub const SHARED_CLUSTER_VAR: &str = "CALM_TEST_ETCD";

/// Limits the local clusters run with, so that the store conformance suite's one large
/// transaction (20 000 writes) fits; the defaults of a production cluster are checked by their
/// own tests with a store configured for them.
pub const LOCAL_TXN_OPS_MAX: usize = 32_768;
pub const LOCAL_REQUEST_BYTES_MAX: usize = 8 << 20;

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A running local cluster.
#[derive(Debug)]
pub struct LocalCluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
    initial_cluster: String,
    /// Extra etcd flags of every member.
    extra: Vec<String>,
}

/// Most times a test cluster is started on fresh ports.
pub const START_ATTEMPTS_MAX: u32 = 3;

/// Why one attempt to start a cluster failed.
enum Start {
    /// A member process ended: try other ports.
    MemberExited(String),
    Failed(String),
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl LocalCluster {
    /// Starts `count` members and waits until the cluster answers.
    pub fn start(count: usize) -> Result<LocalCluster, String> {
        LocalCluster::start_with(count, &[])
    }

    /// Starts `count` members with extra etcd flags (a quota, say). A member that exits while
    /// starting (another process took one of its ports between our pick and its bind) makes
    /// the cluster start again on other ports, up to [`START_ATTEMPTS_MAX`] times.
    pub fn start_with(count: usize, extra: &[&str]) -> Result<LocalCluster, String> {
        which_etcd()?;
        let mut attempt = 1;
        loop {
            match LocalCluster::start_once(count, extra) {
                Err(Start::MemberExited(why)) if attempt < START_ATTEMPTS_MAX => {
                    tracing::warn!(%why, "etcd test cluster: starting again on other ports");
                    attempt += 1;
                }
                Err(Start::MemberExited(why) | Start::Failed(why)) => return Err(why),
                Ok(cluster) => return Ok(cluster),
            }
        }
    }

    fn start_once(count: usize, extra: &[&str]) -> Result<LocalCluster, Start> {
        let dir = tempfile::Builder::new()
            .prefix("calm-etcd-")
            .tempdir()
            .map_err(|e| Start::Failed(format!("making the cluster's directory: {e}")))?;
        let mut members = Vec::new();
        for i in 0..count {
            let port = || free_port().map_err(|e| Start::Failed(e.to_string()));
            members.push(Member {
                name: format!("m{i}"),
                client_port: port()?,
                peer_port: port()?,
                child: None,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = LocalCluster {
            dir,
            members,
            initial_cluster,
            extra: extra.iter().map(|a| a.to_string()).collect(),
        };
        for i in 0..count {
            cluster.start_member(i).map_err(Start::Failed)?;
        }
        cluster.wait_started(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// [`LocalCluster::wait_healthy`], telling a member that exited (with its log's end).
    fn wait_started(&mut self, timeout: Duration) -> Result<(), Start> {
        let deadline = Instant::now() + timeout;
        loop {
            for member in &mut self.members {
                if let Some(Ok(Some(status))) = member.child.as_mut().map(|c| c.try_wait()) {
                    let log = self.dir.path().join(format!("{}.log", member.name));
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    let tail: String = text.lines().rev().take(3).collect::<Vec<_>>().join(" / ");
                    return Err(Start::MemberExited(format!(
                        "etcd member {} exited ({status}) while starting: {tail}",
                        member.name
                    )));
                }
            }
            if self.members.iter().all(|m| health(m.client_port)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return self.wait_healthy(Duration::ZERO).map_err(Start::Failed);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn start_member(&mut self, i: usize) -> Result<(), String> {
        let data = self.dir.path().join(&self.members[i].name);
        let log = std::fs::File::create(
            self.dir
                .path()
                .join(format!("{}.log", self.members[i].name)),
        )
        .map_err(|e| e.to_string())?;
        let member = &mut self.members[i];
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let child = Command::new("etcd")
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&data)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "calm-test"])
            .args(["--max-txn-ops", &LOCAL_TXN_OPS_MAX.to_string()])
            .args(["--max-request-bytes", &LOCAL_REQUEST_BYTES_MAX.to_string()])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--log-level", "warn"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting etcd: {e}"))?;
        member.child = Some(child);
        Ok(())
    }

    /// Waits until every running member answers a health check.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        for member in self.members.iter().filter(|m| m.child.is_some()) {
            let url = format!("http://127.0.0.1:{}/health", member.client_port);
            loop {
                if health(member.client_port) {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "etcd member {} did not become healthy ({url}); its log is in {}",
                        member.name,
                        self.dir.path().display()
                    ));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// `etcd://` URL of every member, with `prefix` and this cluster's limits.
    pub fn url(&self, prefix: &str) -> String {
        let hosts = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",");
        local_url(&hosts, prefix)
    }

    /// Kills member `i` (SIGKILL) and waits for it to be gone.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data (it rejoins the cluster).
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        if self.members[i].child.is_none() {
            self.start_member(i)?;
        }
        self.wait_healthy(Duration::from_secs(30))
    }

    /// The index of the member that leads the cluster now (asked of each running member).
    pub fn leader(&self) -> Result<usize, String> {
        let mut ids = Vec::new();
        let mut leader = None;
        for member in &self.members {
            let answer = if member.child.is_some() {
                http(
                    member.client_port,
                    "POST /v3/maintenance/status HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}",
                )
            } else {
                String::new()
            };
            ids.push(json_string(&answer, "member_id"));
            leader = leader.or(json_string(&answer, "leader"));
        }
        let leader = leader.ok_or("no member named a leader")?;
        ids.iter()
            .position(|id| id.as_deref() == Some(leader.as_str()))
            .ok_or_else(|| format!("the leader {leader} is not a running member"))
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// An `etcd://` URL for `hosts` (comma-separated HOST:PORT) with `prefix` and the limits the
/// local clusters run with.
pub fn local_url(hosts: &str, prefix: &str) -> String {
    format!(
        "etcd://{hosts}/{prefix}?txn-ops-max={LOCAL_TXN_OPS_MAX}&request-bytes-max={LOCAL_REQUEST_BYTES_MAX}"
    )
}

/// The shared cluster of the test run (`CALM_TEST_ETCD`, set by `scripts/test`) as a URL with
/// `prefix`, if there is one.
pub fn shared_url(prefix: &str) -> Option<String> {
    let url = std::env::var(SHARED_CLUSTER_VAR).ok()?;
    let hosts = url
        .strip_prefix("etcd://")
        .unwrap_or(&url)
        .trim_end_matches('/');
    Some(local_url(hosts, prefix))
}

/// A prefix no other test of this run uses.
pub fn unique_prefix(name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "test-{name}-{}-{now}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn which_etcd() -> Result<(), String> {
    match Command::new("etcd").arg("--version").output() {
        Ok(output) if output.status.success() => Ok(()),
        _ => Err(
            "the etcd binary is not installed (Debian: etcd-server; scripts/test installs it)"
                .into(),
        ),
    }
}

/// Whether the member on `port` reports itself healthy.
fn health(port: u16) -> bool {
    http(port, "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").contains("\"health\":\"true\"")
}

/// The answer to one plain HTTP/1.0 `request` to the member on `port` (empty on failure).
fn http(port: u16, request: &str) -> String {
    http_to(&std::net::SocketAddr::from(([127, 0, 0, 1], port)), request)
}

fn http_to(addr: &std::net::SocketAddr, request: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(addr, Duration::from_millis(500))
    else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(request.as_bytes()).is_err() {
        return String::new();
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// The database of each member of the cluster an `etcd://HOST:PORT,…` URL names, as etcd
/// reports it: (bytes of its file, bytes in use), largest of the members; an error when no
/// member answers.
pub fn db_size(url: &str) -> Result<(u64, u64), String> {
    use std::net::ToSocketAddrs;
    let hosts = url.strip_prefix("etcd://").unwrap_or(url);
    let hosts = hosts.split(['/', '?']).next().unwrap_or_default();
    let mut largest: Option<(u64, u64)> = None;
    for host in hosts.split(',').filter(|h| !h.is_empty()) {
        let Some(addr) = host.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
            continue;
        };
        let answer = http_to(
            &addr,
            "POST /v3/maintenance/status HTTP/1.0\r\nHost: etcd\r\nContent-Length: 2\r\n\r\n{}",
        );
        let figure = |name| json_string(&answer, name).and_then(|v| v.parse::<u64>().ok());
        if let (Some(size), Some(in_use)) = (figure("dbSize"), figure("dbSizeInUse")) {
            let (s, u) = largest.unwrap_or_default();
            largest = Some((s.max(size), u.max(in_use)));
        }
    }
    largest.ok_or_else(|| format!("no member of {hosts} reported its database size"))
}

/// The string value of `"name":"value"` in a flat JSON answer.
fn json_string(json: &str, name: &str) -> Option<String> {
    let from = json.find(&format!("\"{name}\":\""))? + name.len() + 4;
    let len = json[from..].find('"')?;
    Some(json[from..from + len].to_string())
}
