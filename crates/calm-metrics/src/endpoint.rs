//! The `/metrics` endpoint: HTTP/1.1 on a TCP address, `GET /metrics` answered with the
//! registry in the text exposition format (version 0.0.4), anything else 404.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus::Registry;

/// Scrapes answered at once; one more waits for a slot (a scraper cannot take the process's
/// memory or its cores). A slot is held while a scrape is encoded, not while a connection is
/// open: idle connections never keep a scrape waiting.
pub const SCRAPES_AT_ONCE: usize = 8;
/// Connections open at once; one more waits to be accepted until one closes.
pub const CONNECTIONS_MAX: usize = 256;
/// A connection that has not sent a whole request's headers within this is closed (also
/// between the requests of a kept-alive connection).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// No connection stays open longer than this, whatever it sends (a scraper connects again).
pub const CONNECTION_LIFE_MAX: Duration = Duration::from_secs(60);

/// A running endpoint; dropping it stops it.
#[derive(Debug)]
pub struct Endpoint {
    /// Where it listens (the port the kernel picked for `:0`).
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds the endpoint's address (`HOST:PORT`), before anything is served: a mistake in it
/// stops the start.
pub fn bind(addr: &str) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Serves `registry` at `http://ADDR/metrics` on `listener` ([`bind`]), on the current tokio
/// runtime.
pub fn serve(listener: std::net::TcpListener, registry: Registry) -> std::io::Result<Endpoint> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let addr = listener.local_addr()?;
    let slots = Arc::new(tokio::sync::Semaphore::new(SCRAPES_AT_ONCE));
    let connections = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    let task = tokio::spawn(async move {
        loop {
            let Ok(open) = connections.clone().acquire_owned().await else {
                return;
            };
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (registry, slots) = (registry.clone(), slots.clone());
            tokio::spawn(async move {
                let answer = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let (registry, slots) = (registry.clone(), slots.clone());
                    async move {
                        let _slot = slots.acquire().await;
                        Ok::<_, Infallible>(respond(&registry, &request))
                    }
                });
                let served = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), answer);
                match tokio::time::timeout(CONNECTION_LIFE_MAX, served).await {
                    Ok(Err(error)) => tracing::debug!(%error, "a metrics connection ended"),
                    Err(_) => tracing::debug!("a metrics connection open too long was closed"),
                    Ok(Ok(())) => {}
                }
                drop(open);
            });
        }
    });
    Ok(Endpoint { addr, task })
}

fn respond(registry: &Registry, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, kind, body) = match (request.method(), request.uri().path()) {
        (&hyper::Method::GET, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            crate::encode(registry),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "calm serves its metrics at /metrics\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = kind.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}
