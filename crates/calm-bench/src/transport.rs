//! What a connection's transport costs: the same stats (lookups of one file), one after
//! another over one connection, through the server's Unix socket (the local default), plain
//! TCP on loopback (the superuser's only) and mutual TLS on loopback (what a remote client
//! uses), against one server in this process. Also the time to connect (TLS: the handshake).

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct TransportResult {
    /// "unix", "tcp" or "tls".
    pub transport: &'static str,
    pub stats: u64,
    pub connect_ms: f64,
    pub seconds: f64,
    pub stats_per_sec: f64,
    /// Mean time of one stat, in µs.
    pub stat_us: f64,
}

async fn stats(
    transport: &'static str,
    addr: &str,
    tls: Option<&calm_client::ClientTls>,
    count: u64,
) -> Result<TransportResult, String> {
    let started = Instant::now();
    let client = calm_client::Client::connect_with(addr, tls)
        .await
        .map_err(|e| format!("{transport}: {e}"))?;
    // The first request finishes the connection (a channel connects lazily on some paths).
    let file = client
        .lookup(calm_meta::ROOT, b"file")
        .await
        .map_err(|e| format!("{transport}: {e}"))?
        .handle;
    let connect_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    for _ in 0..count {
        let attr = client
            .lookup(calm_meta::ROOT, b"file")
            .await
            .map_err(|e| format!("{transport}: {e}"))?;
        if attr.handle != file {
            return Err(format!("{transport}: the file changed under the benchmark"));
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(TransportResult {
        transport,
        stats: count,
        connect_ms,
        seconds,
        stats_per_sec: count as f64 / seconds.max(1e-9),
        stat_us: seconds * 1e6 / count.max(1) as f64,
    })
}

/// Runs `count` stats over each transport, `rounds` times in turn (unix, tcp, tls, unix, …).
pub fn run(
    dir: &std::path::Path,
    count: u64,
    rounds: usize,
) -> Result<Vec<TransportResult>, String> {
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let (work, meta) = crate::mdtest::open_meta_with(dir, true)?;
    let certs = work.path().join("certs");
    calm_server::tls::make_ca(&certs)?;
    calm_server::tls::issue(&certs, "server", &["127.0.0.1".into()], 1)?;
    let (admin_cert, admin_key) = calm_server::tls::issue(&certs, "admin", &[], 1)?;
    let tls_server = Arc::new(calm_server::tls::TlsServer::new(
        &certs.join("server.pem"),
        &certs.join("server-key.pem"),
        &certs.join(calm_server::tls::CA_CERT),
    )?);
    let client_tls = calm_client::ClientTls {
        ca: certs.join(calm_server::tls::CA_CERT),
        cert: admin_cert,
        key: admin_key,
        domain: None,
    };
    runtime.block_on(async {
        meta.create(calm_meta::ROOT, b"file", 0o644)
            .await
            .map_err(|e| e.to_string())?;
        let socket = format!("unix:{}", work.path().join("calm.sock").display());
        let (unix, unix_addr) = calm_server::listen::bind(&socket, None).await?;
        let (tcp, tcp_addr) = calm_server::listen::bind("127.0.0.1:0", None).await?;
        let (tls, tls_addr) = calm_server::listen::bind("127.0.0.1:0", Some(tls_server)).await?;
        let info = calm_server::ServerInfo::plain();
        let server = calm_server::Server::start(meta.clone(), info).await;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.serve(vec![unix, tcp, tls], async {
            let _ = stopped.await;
        }));
        let mut results = Vec::new();
        for _ in 0..rounds {
            results.push(stats("unix", &unix_addr, None, count).await?);
            results.push(stats("tcp", &tcp_addr, None, count).await?);
            results.push(stats("tls", &tls_addr, Some(&client_tls), count).await?);
        }
        let _ = stop.send(());
        serving
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(results)
    })
}

/// The plot's panels: a stat's time and the time to connect, each transport a line over the
/// rounds.
pub fn facets(results: &[TransportResult]) -> Vec<crate::multiples::Facet> {
    let mut rounds: std::collections::HashMap<&str, u32> = Default::default();
    crate::multiples::facets_of(results.iter().flat_map(|r| {
        let round = rounds.entry(r.transport).or_default();
        *round += 1;
        let cell = |panel: &str, y_label: &str, y: f64| {
            crate::multiples::Cell::at(
                panel,
                ("round", f64::from(*round)),
                (y_label, y),
                format!("calm over {}", r.transport),
            )
        };
        [
            cell("one stat", "µs", r.stat_us),
            cell("connecting (TLS: with the handshake)", "ms", r.connect_ms),
        ]
    }))
}

/// The table: each transport's best round against the Unix socket's best round.
pub fn table(results: &[TransportResult]) -> Vec<String> {
    let best = |transport: &str| {
        results
            .iter()
            .filter(|r| r.transport == transport)
            .max_by(|a, b| a.stats_per_sec.total_cmp(&b.stats_per_sec))
    };
    let mut lines = vec![format!(
        "{:>9} {:>7} {:>11} {:>11} {:>9} {:>8}",
        "transport", "stats", "connect ms", "stats/s", "µs/stat", "vs unix"
    )];
    let unix = best("unix").map_or(f64::NAN, |r| r.stats_per_sec);
    for r in results {
        lines.push(format!(
            "{:>9} {:>7} {:>11.2} {:>11.0} {:>9.1} {:>7.2}x",
            r.transport,
            r.stats,
            r.connect_ms,
            r.stats_per_sec,
            r.stat_us,
            r.stats_per_sec / unix
        ));
    }
    for transport in ["tcp", "tls"] {
        if let Some(r) = best(transport) {
            lines.push(format!(
                "best {transport}: {:.0} stats/s, {:.2}x the Unix socket's best ({unix:.0})",
                r.stats_per_sec,
                r.stats_per_sec / unix
            ));
        }
    }
    lines
}
