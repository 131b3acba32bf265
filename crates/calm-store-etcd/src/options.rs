//! How to reach the cluster: its URL, TLS, etcd's user, and the limits a store keeps to.

use crate::{REQUEST_BYTES_MAX_DEFAULT, TXN_OPS_MAX_DEFAULT};

/// How to reach the cluster and its limits; parsed from `etcd://HOST:PORT[,HOST:PORT...]
/// [/PREFIX][?txn-ops-max=N&request-bytes-max=N&retry-ms-max=N&history-s=N]`, or `etcd+https://…` for a
/// cluster that speaks TLS (`tls-ca=FILE`, the CA of its certificates; `tls-cert=FILE` and
/// `tls-key=FILE`, a client certificate when it asks for one), with `user=NAME` for etcd's
/// authentication (the password from `password-file=FILE`, or the environment variable
/// [`PASSWORD_ENV`]: never in the URL, which shows in process listings).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    /// TLS to the cluster (with `etcd+https://`).
    pub tls: Option<EtcdTls>,
    /// etcd's user and password.
    pub user: Option<(String, String)>,
    /// Prefix of every key of this file system in etcd (several can share one cluster).
    pub prefix: String,
    /// Operations one transaction may carry: the cluster's `--max-txn-ops`.
    pub txn_ops_max: usize,
    /// Bytes one request may carry: the cluster's `--max-request-bytes`.
    pub request_bytes_max: usize,
    /// How long a request is retried while the cluster does not answer (member down, leader
    /// election), in milliseconds.
    pub retry_ms_max: u64,
    /// How long one attempt of a request may take, in milliseconds.
    pub attempt_ms_max: u64,
    /// How much of the cluster's history is kept: calm compacts what is older (`history-s=0`:
    /// calm never compacts, for a cluster whose operator does). See [`crate::history`].
    pub history_kept: std::time::Duration,
}

/// The variable holding the password of an etcd URL's `user`, when it names no password file.
pub const PASSWORD_ENV: &str = "CALM_ETCD_PASSWORD";

/// The files of TLS to the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA that signed the members' certificates.
    pub ca: std::path::PathBuf,
    /// A client certificate and its key, for a cluster that checks them.
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("prefix", &self.prefix)
            .field("txn_ops_max", &self.txn_ops_max)
            .field("request_bytes_max", &self.request_bytes_max)
            .field("retry_ms_max", &self.retry_ms_max)
            .field("attempt_ms_max", &self.attempt_ms_max)
            .field("history_kept", &self.history_kept)
            .finish()
    }
}

impl EtcdOptions {
    pub fn new(endpoints: Vec<String>, prefix: &str) -> Self {
        EtcdOptions {
            endpoints,
            tls: None,
            user: None,
            prefix: prefix.to_string(),
            txn_ops_max: TXN_OPS_MAX_DEFAULT,
            request_bytes_max: REQUEST_BYTES_MAX_DEFAULT,
            retry_ms_max: 15_000,
            // Longer than etcd's own request timeout (5 s plus two election timeouts by
            // default), so that etcd, not this client, decides when a request failed.
            attempt_ms_max: 10_000,
            history_kept: crate::history::HISTORY_KEPT_DEFAULT,
        }
    }

    /// Parses an `etcd://` URL (see the type).
    pub fn from_url(url: &str) -> Result<Self, String> {
        let (scheme, rest) = match (
            url.strip_prefix("etcd://"),
            url.strip_prefix("etcd+https://"),
        ) {
            (Some(rest), _) => ("http", rest),
            (None, Some(rest)) => ("https", rest),
            (None, None) => {
                return Err(format!(
                    "{url:?}: an etcd store is named etcd://HOST:PORT[,...] (etcd+https:// with TLS)"
                ));
            }
        };
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (hosts, prefix) = rest.split_once('/').unwrap_or((rest, "calm"));
        let prefix = if prefix.is_empty() { "calm" } else { prefix };
        if prefix.contains('?') || prefix.ends_with('/') {
            return Err(format!("{url:?}: bad key prefix {prefix:?}"));
        }
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let (name, port) = host
                .rsplit_once(':')
                .ok_or_else(|| format!("{url:?}: endpoint {host:?} is not HOST:PORT"))?;
            if name.is_empty() || port.parse::<u16>().is_err() {
                return Err(format!("{url:?}: endpoint {host:?} is not HOST:PORT"));
            }
            endpoints.push(format!("{scheme}://{host}"));
        }
        let mut options = EtcdOptions::new(endpoints, prefix);
        let (mut ca, mut cert, mut key) = (None, None, None);
        let (mut user, mut password_file) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("{url:?}: parameter {pair:?} is not NAME=VALUE"))?;
            let path = Some(std::path::PathBuf::from(value));
            match name {
                "tls-ca" => ca = path,
                "tls-cert" => cert = path,
                "tls-key" => key = path,
                "user" => user = Some(value.to_string()),
                "password-file" => password_file = path,
                _ => {}
            }
            if ["tls-ca", "tls-cert", "tls-key", "user", "password-file"].contains(&name) {
                continue;
            }
            if ![
                "txn-ops-max",
                "request-bytes-max",
                "retry-ms-max",
                "attempt-ms-max",
                "history-s",
            ]
            .contains(&name)
            {
                return Err(format!("{url:?}: unknown parameter {name:?}"));
            }
            let number: u64 = value
                .parse()
                .map_err(|_| format!("{url:?}: {name} must be a number, not {value:?}"))?;
            match name {
                "txn-ops-max" if number >= 2 => options.txn_ops_max = number as usize,
                "request-bytes-max" if number >= 4096 => {
                    options.request_bytes_max = number as usize
                }
                "retry-ms-max" => options.retry_ms_max = number,
                "attempt-ms-max" if number > 0 => options.attempt_ms_max = number,
                "history-s" => options.history_kept = std::time::Duration::from_secs(number),
                _ => return Err(format!("{url:?}: {pair:?} is out of range")),
            }
        }
        options.tls = match (scheme, ca, cert, key) {
            ("http", None, None, None) => None,
            ("http", ..) => {
                return Err(format!("{url:?}: TLS files need an etcd+https:// URL"));
            }
            (_, Some(ca), cert, key) => Some(EtcdTls {
                ca,
                identity: match (cert, key) {
                    (Some(cert), Some(key)) => Some((cert, key)),
                    (None, None) => None,
                    _ => return Err(format!("{url:?}: tls-cert and tls-key go together")),
                },
            }),
            (_, None, ..) => {
                return Err(format!(
                    "{url:?}: an etcd+https:// URL names the CA of the cluster (tls-ca=FILE)"
                ));
            }
        };
        options.user = match (user, password_file) {
            (None, None) => None,
            (None, Some(_)) => return Err(format!("{url:?}: password-file without user")),
            (Some(user), Some(file)) => {
                let password = std::fs::read_to_string(&file)
                    .map_err(|e| format!("{url:?}: {}: {e}", file.display()))?;
                Some((user, password.trim_end_matches(['\r', '\n']).to_string()))
            }
            (Some(user), None) => match std::env::var(PASSWORD_ENV) {
                Ok(password) => Some((user, password)),
                Err(_) => {
                    return Err(format!(
                        "{url:?}: user {user} needs a password: password-file=FILE or {PASSWORD_ENV}"
                    ));
                }
            },
        };
        Ok(options)
    }
}
