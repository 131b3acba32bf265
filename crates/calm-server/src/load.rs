//! Who loads the server: every request counted, with the time spent answering it, by the
//! caller's uid and by its job (the `calm-job` metadata a mount sends, read from the calling
//! process's environment), in bounded tables ([`calm_metrics::Load`]). Counted always (a hash
//! and two atomic additions per request: `calm stats --by uid|job` needs no metrics endpoint);
//! a batch's calls each as their own caller. A task sweeps the idle keys out every
//! [`LOAD_SWEEP_EVERY`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use calm_metrics::{Load, counter_family};
use calm_proto::changelog::{JOB_KEY, UID_KEY};
use calm_proto::pb;
use tonic::codegen::http;

/// Keys each table shows by name (`calm status`, the metrics); the rest are "other".
pub const LOAD_SHOWN: usize = 20;

/// How often keys idle since the last sweep leave the tables.
pub const LOAD_SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The key of requests that name no uid or no job.
const NONE: &str = "none";

/// Requests and time per uid and per job.
#[derive(Debug, Default)]
pub struct Loads {
    uid: Load,
    job: Load,
    /// Namespace calls answered (a batch's calls each, not the batch) and the time spent
    /// answering them: the average latency of `calm stats`. Lock calls are not among them (a
    /// blocking one waits as long as the lock is held).
    namespace_calls: AtomicU64,
    namespace_ns: AtomicU64,
}

impl Loads {
    /// One request of `uid` and `job` that took `took`; `namespace`: a namespace call.
    pub fn count(&self, uid: Option<&str>, job: Option<&str>, took: Duration, namespace: bool) {
        let nanos = took.as_nanos() as u64;
        self.uid.count(uid.unwrap_or(NONE), nanos);
        self.job.count(job.unwrap_or(NONE), nanos);
        if namespace {
            self.namespace_calls.fetch_add(1, Ordering::Relaxed);
            self.namespace_ns.fetch_add(nanos, Ordering::Relaxed);
        }
    }

    /// Namespace calls answered since start, and the nanoseconds they took in all.
    pub fn namespace_time(&self) -> (u64, u64) {
        (
            self.namespace_calls.load(Ordering::Relaxed),
            self.namespace_ns.load(Ordering::Relaxed),
        )
    }

    /// Sweeps the idle keys out every [`LOAD_SWEEP_EVERY`], for ever.
    pub async fn sweep(self: Arc<Self>) {
        let mut every = tokio::time::interval(LOAD_SWEEP_EVERY);
        every.tick().await;
        loop {
            every.tick().await;
            self.uid.sweep();
            self.job.sweep();
        }
    }

    /// The busiest uids and jobs, as `status` answers them.
    pub fn status(&self) -> (Vec<pb::Load>, Vec<pb::Load>) {
        let wire = |load: &Load| {
            load.top(LOAD_SHOWN)
                .into_iter()
                .map(|l| pb::Load {
                    key: l.key,
                    requests: l.requests,
                    seconds_ns: l.nanos,
                })
                .collect()
        };
        (wire(&self.uid), wire(&self.job))
    }
}

/// What `identity` may see of the tables: mounts and administrators every key; a user only
/// its own uid's figures, and no job (which jobs are its own is not known here), so that one
/// user cannot watch what another does. Of the figures nearest their limits, a user sees its
/// own lock sessions and its own user quota only (another's quota is refused to it by the
/// quota calls too).
pub fn visible_to(identity: &crate::auth::Identity, status: &mut pb::StatusReply) {
    if let crate::auth::Identity::User { key, uid, .. } = identity {
        let own = uid.to_string();
        status.by_uid.retain(|l| l.key == own);
        status.by_job.clear();
        let own_quota = calm_types::QuotaTarget::user(*uid).to_string();
        status
            .nearest
            .retain(|n| n.who == *key || n.who == own_quota);
    }
}

/// The families of the busiest uids and jobs.
pub fn families(status: &pb::StatusReply) -> Vec<calm_metrics::MetricFamily> {
    let mut out = Vec::new();
    for (by, loads, who) in [
        ("uid", &status.by_uid, "user"),
        ("job", &status.by_job, "job"),
    ] {
        let labels: Vec<[(&str, &str); 1]> = loads.iter().map(|l| [(by, l.key.as_str())]).collect();
        let requests: Vec<(&[(&str, &str)], f64)> = labels
            .iter()
            .zip(loads)
            .map(|(l, load)| (&l[..], load.requests as f64))
            .collect();
        let seconds: Vec<(&[(&str, &str)], f64)> = labels
            .iter()
            .zip(loads)
            .map(|(l, load)| (&l[..], load.seconds_ns as f64 / 1e9))
            .collect();
        out.push(counter_family(
            &format!("calm_server_{by}_requests_total"),
            &format!(
                "Requests the server answered per {who}: the {LOAD_SHOWN} sending the most, then \"other\" (\"none\": requests naming no {who})."
            ),
            &requests,
        ));
        out.push(counter_family(
            &format!("calm_server_{by}_seconds_total"),
            &format!(
                "Time the server spent answering each {who}'s requests (a mutation's includes its commit), for the same {who}s."
            ),
            &seconds,
        ));
    }
    out
}

fn text(value: &Option<http::HeaderValue>) -> Option<&str> {
    value.as_ref().and_then(|v| v.to_str().ok())
}

/// Counts every request by its caller's uid and job (a batch's calls are counted where the
/// batch dispatches them).
#[derive(Debug, Clone)]
pub struct LoadLayer {
    pub(crate) loads: Arc<Loads>,
    pub(crate) connections: Arc<crate::connections::Connections>,
}

impl<S> tower::Layer<S> for LoadLayer {
    type Service = Loaded<S>;

    fn layer(&self, inner: S) -> Loaded<S> {
        Loaded {
            inner,
            loads: self.loads.clone(),
            connections: self.connections.clone(),
        }
    }
}

/// The service [`LoadLayer`] makes.
#[derive(Debug, Clone)]
pub struct Loaded<S> {
    inner: S,
    loads: Arc<Loads>,
    connections: Arc<crate::connections::Connections>,
}

impl<S, B, R> tower::Service<http::Request<B>> for Loaded<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if let Some(peer) = request.extensions().get::<crate::listen::Peer>() {
            self.connections.request(peer.kind());
        }
        let path = request.uri().path();
        let batch = path == "/calm.v1.Meta/Batch";
        let namespace = path.starts_with("/calm.v1.Meta/");
        // The values are shared with the request (no copy): read once it is answered.
        let who = (!batch).then(|| {
            let headers = request.headers();
            (headers.get(UID_KEY).cloned(), headers.get(JOB_KEY).cloned())
        });
        let loads = self.loads.clone();
        let started = Instant::now();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            if let Some((uid, job)) = who {
                loads.count(text(&uid), text(&job), started.elapsed(), namespace);
            }
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_sees_only_its_own_load_limits_and_no_job() {
        let loads = Loads::default();
        for (uid, job) in [("1000", "a"), ("2000", "b"), ("2000", "b")] {
            loads.count(Some(uid), Some(job), Duration::from_micros(10), true);
        }
        // A lock call: in the user's load, not in the namespace calls' time.
        loads.count(Some("1000"), Some("a"), Duration::from_secs(5), false);
        assert_eq!(loads.namespace_time(), (3, 30_000));
        let (by_uid, by_job) = loads.status();
        let near = |who: &str, what: &str| pb::NearLimit {
            who: who.into(),
            what: what.into(),
            used: 9,
            limit: 10,
        };
        let status = pb::StatusReply {
            by_uid,
            by_job,
            nearest: vec![
                near("user 2000", "bytes"),
                near("uid 2000", "lock sessions"),
                near("group 100", "inodes"),
                near("the tree of directory 7", "bytes"),
                near("user 1000", "bytes"),
                near("uid 1000", "locks of session 3"),
            ],
            ..Default::default()
        };
        let user = crate::auth::Identity::User {
            key: "uid 1000".into(),
            uid: 1000,
            gid: 1000,
            groups: Default::default(),
        };
        let mut seen = status.clone();
        visible_to(&user, &mut seen);
        let keys: Vec<&str> = seen.by_uid.iter().map(|l| l.key.as_str()).collect();
        assert_eq!(keys, ["1000"]);
        assert!(seen.by_job.is_empty());
        let near: Vec<&str> = seen.nearest.iter().map(|n| n.who.as_str()).collect();
        assert_eq!(
            near,
            ["user 1000", "uid 1000"],
            "another's quota or sessions shown"
        );
        let admin = crate::auth::Identity::Admin { key: "root".into() };
        let mut all = status.clone();
        visible_to(&admin, &mut all);
        assert_eq!(all, status);
    }
}
