//! Connections and their requests, by the listener that took them and how the peer was
//! identified, and connections refused by a limit: counted always (atomics in fixed tables,
//! no lock), shown in the metrics.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use calm_metrics::{MetricFamily, counter_family, gauge_family};

/// The listeners, as labels: the Unix socket, plain TCP on loopback, TLS.
pub const LISTENERS: [&str; 3] = ["unix", "tcp", "tls"];
/// How a peer was identified, as labels: a user by its socket's uid, the superuser (uid 0 on
/// the Unix socket or plain TCP), a client certificate, or a peer refused on each request.
pub const IDENTITIES: [&str; 4] = ["user", "superuser", "certificate", "refused"];

/// Why a connection was closed as soon as it came, as labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The server holds the server's most connections already.
    Connections = 0,
    /// Its peer holds its most already.
    ConnectionsPerPeer = 1,
    /// The most connections of the listener are being identified.
    Identifying = 2,
    /// The TLS handshake failed or timed out.
    Handshake = 3,
    /// Who the peer is could not be told (no credentials, plain TCP from another machine).
    Unidentified = 4,
}

/// [`Refusal`]s by name, in their order.
pub const REFUSALS: [&str; 5] = [
    "connections",
    "connections_per_peer",
    "identifying",
    "handshake",
    "unidentified",
];

type Table<T, const N: usize> = [[T; N]; 3];

/// One series: its two labels and its value.
type Row = ([(&'static str, &'static str); 2], f64);

/// A family's series as the families take them: labels and value.
type Series<'a> = (&'a [(&'a str, &'a str)], f64);

/// A family of one kind (gauge or counter) from its rows.
fn family(
    make: fn(&str, &str, &[Series]) -> MetricFamily,
    name: &str,
    help: &str,
    rows: Vec<Row>,
) -> MetricFamily {
    let values: Vec<Series> = rows.iter().map(|(l, v)| (&l[..], *v)).collect();
    make(name, help, &values)
}

/// The counts, per listener.
#[derive(Debug, Default)]
pub struct Connections {
    open: Table<AtomicI64, 4>,
    accepted: Table<AtomicU64, 4>,
    requests: Table<AtomicU64, 4>,
    refused: Table<AtomicU64, 5>,
}

impl Connections {
    /// A connection of the kind `(listener, identity)` (indexes of [`LISTENERS`] and
    /// [`IDENTITIES`]) was accepted.
    pub fn opened(&self, (l, i): (usize, usize)) {
        self.open[l][i].fetch_add(1, Ordering::Relaxed);
        self.accepted[l][i].fetch_add(1, Ordering::Relaxed);
    }

    /// A connection of the kind `(listener, identity)` was closed.
    pub fn closed(&self, (l, i): (usize, usize)) {
        self.open[l][i].fetch_sub(1, Ordering::Relaxed);
    }

    /// A request arrived on a connection of the kind `(listener, identity)`.
    pub fn request(&self, (l, i): (usize, usize)) {
        self.requests[l][i].fetch_add(1, Ordering::Relaxed);
    }

    /// A connection on `listener` (an index of [`LISTENERS`]) was closed for `why`.
    pub fn refused(&self, listener: usize, why: Refusal) {
        self.refused[listener][why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Open connections of each listener and identity kind (for tests and `families`).
    pub fn open(&self, listener: usize, identity: usize) -> i64 {
        self.open[listener][identity].load(Ordering::Relaxed)
    }

    /// Requests of each listener and identity kind.
    pub fn requests(&self, listener: usize, identity: usize) -> u64 {
        self.requests[listener][identity].load(Ordering::Relaxed)
    }

    /// Refusals of each listener and reason.
    pub fn refusals(&self, listener: usize, why: Refusal) -> u64 {
        self.refused[listener][why as usize].load(Ordering::Relaxed)
    }

    /// The families: series that counted something only (a server serves only what
    /// happened, as its other families do).
    pub fn families(&self) -> Vec<MetricFamily> {
        let mut kinds: Vec<[(&str, &str); 2]> = Vec::new();
        let (mut open, mut accepted, mut requests) = (Vec::new(), Vec::new(), Vec::new());
        for (l, listener) in LISTENERS.iter().enumerate() {
            for (i, identity) in IDENTITIES.iter().enumerate() {
                let a = self.accepted[l][i].load(Ordering::Relaxed);
                if a == 0 {
                    continue;
                }
                kinds.push([("listener", listener), ("identity", identity)]);
                open.push(self.open[l][i].load(Ordering::Relaxed).max(0) as f64);
                accepted.push(a as f64);
                requests.push(self.requests[l][i].load(Ordering::Relaxed) as f64);
            }
        }
        let mut reasons: Vec<[(&str, &str); 2]> = Vec::new();
        let mut refused = Vec::new();
        for (l, listener) in LISTENERS.iter().enumerate() {
            for (r, reason) in REFUSALS.iter().enumerate() {
                let n = self.refused[l][r].load(Ordering::Relaxed);
                if n > 0 {
                    reasons.push([("listener", listener), ("reason", reason)]);
                    refused.push(n as f64);
                }
            }
        }
        let rows = |labels: &[[(&'static str, &'static str); 2]], values: &[f64]| {
            labels
                .iter()
                .copied()
                .zip(values.iter().copied())
                .collect::<Vec<_>>()
        };
        vec![
            family(
                gauge_family,
                "calm_server_connections",
                "Connections open now, by listener (unix, tcp, tls) and how the peer was identified (user, superuser, certificate, refused).",
                rows(&kinds, &open),
            ),
            family(
                counter_family,
                "calm_server_connections_total",
                "Connections accepted since the server started, by listener and how the peer was identified.",
                rows(&kinds, &accepted),
            ),
            family(
                counter_family,
                "calm_server_connection_requests_total",
                "Requests received, by the listener of their connection and how its peer was identified (a batch counts once).",
                rows(&kinds, &requests),
            ),
            family(
                counter_family,
                "calm_server_connections_refused_total",
                "Connections closed as they came, by listener and the limit they met: connections (the server's 4096), connections_per_peer (256 per peer), identifying (256 being identified), handshake (TLS failed or timed out), unidentified (the peer could not be told).",
                rows(&reasons, &refused),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_counted_by_listener_and_identity() {
        let c = Connections::default();
        let (user, cert) = ((0, 0), (2, 2));
        c.opened(user);
        c.opened(user);
        c.opened(cert);
        c.request(user);
        c.closed(user);
        c.refused(2, Refusal::Handshake);
        assert_eq!(c.open(0, 0), 1);
        assert_eq!(c.open(2, 2), 1);
        assert_eq!(c.requests(0, 0), 1);
        assert_eq!(c.refusals(2, Refusal::Handshake), 1);
        let registry = calm_metrics::Registry::new();
        let scrape = calm_metrics::Scrape::new(&registry, "server").expect("scrape");
        let c = std::sync::Arc::new(c);
        let shown = c.clone();
        scrape.add(move || shown.families());
        let text = calm_metrics::encode(&registry);
        assert!(
            text.contains("calm_server_connections{listener=\"unix\",identity=\"user\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("calm_server_connections_total{listener=\"unix\",identity=\"user\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "calm_server_connections_refused_total{listener=\"tls\",reason=\"handshake\"} 1"
            ),
            "{text}"
        );
        // Nothing happened on plain TCP: no series.
        assert!(!text.contains("listener=\"tcp\""), "{text}");
    }
}
