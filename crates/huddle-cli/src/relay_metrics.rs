//! `huddle relay --metrics ADDR`: the relay's own metrics over HTTP (plan 0055).
//!
//! One route, `GET /metrics`, answering [`RelayMetrics::encode`] (the OpenMetrics text
//! format, which Prometheus scrapes). Loopback by default, with the same `Host` check
//! as `huddle serve` (a page elsewhere cannot read it through DNS rebinding); a
//! non-loopback address needs `--metrics-allow-remote`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use huddle_relay::RelayMetrics;
use tokio_util::sync::CancellationToken;

/// Where `--metrics` serves: `PORT` (on 127.0.0.1) or `IP:PORT`, checked against
/// `--metrics-allow-remote`.
pub fn parse_addr(text: &str, allow_remote: bool) -> anyhow::Result<SocketAddr> {
    let addr = match text.parse::<u16>() {
        Ok(port) => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
        Err(_) => text.parse::<SocketAddr>().map_err(|_| {
            anyhow::anyhow!(
                "--metrics {text:?} is not an address: give PORT (served on 127.0.0.1) or \
                 IP:PORT, e.g. 127.0.0.1:9464"
            )
        })?,
    };
    if !addr.ip().is_loopback() && !allow_remote {
        anyhow::bail!(
            "--metrics {addr} is not a loopback address: anyone who can reach it reads the \
             relay's metrics. Pass --metrics-allow-remote to serve it anyway, or use \
             127.0.0.1"
        );
    }
    Ok(addr)
}

/// A bound metrics server, not yet serving.
pub struct MetricsServer {
    listener: tokio::net::TcpListener,
    loopback: bool,
}

impl MetricsServer {
    /// Binds `addr` (so a taken port fails the relay's start) and prints the URL on
    /// standard output.
    pub async fn bind(addr: SocketAddr) -> anyhow::Result<MetricsServer> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("--metrics: cannot listen on {addr}: {e}"))?;
        let local = listener.local_addr()?;
        tracing::info!(%local, "relay metrics on http");
        println!("http://{local}/metrics");
        Ok(MetricsServer {
            listener,
            loopback: addr.ip().is_loopback(),
        })
    }

    /// Serves `metrics` until `stop` is cancelled.
    pub async fn serve(self, metrics: RelayMetrics, stop: CancellationToken) {
        let state = Shared {
            metrics,
            loopback_hosts_only: self.loopback,
        };
        let app = axum::Router::new()
            .route("/metrics", get(scrape))
            .fallback(|| async {
                (
                    StatusCode::NOT_FOUND,
                    "no such path: the relay's metrics are at /metrics\n",
                )
            })
            .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
            .with_state(state);
        if let Err(e) = axum::serve(self.listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
        {
            tracing::warn!(error = %e, "the relay's metrics server stopped");
        }
    }
}

#[derive(Clone)]
struct Shared {
    metrics: RelayMetrics,
    loopback_hosts_only: bool,
}

async fn scrape(State(state): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(huddle_relay::metrics::CONTENT_TYPE),
        )],
        state.metrics.encode(),
    )
        .into_response()
}

/// Refuses requests naming another host on a loopback server.
async fn guard(State(state): State<Shared>, request: Request, next: Next) -> Response {
    if state.loopback_hosts_only && !crate::serve::loopback_host(&request) {
        return (
            StatusCode::FORBIDDEN,
            "this server answers loopback host names only (127.0.0.1, localhost, [::1])\n",
        )
            .into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            parse_addr("9464", false).unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert!(parse_addr("[::1]:0", false).is_ok());
        assert!(parse_addr("0.0.0.0:9464", false)
            .unwrap_err()
            .to_string()
            .contains("--metrics-allow-remote"));
        assert!(parse_addr("0.0.0.0:9464", true).is_ok());
        assert!(parse_addr("localhost:x", true).is_err());
    }
}
