//! A fault-injecting TCP proxy for tests: put one in front of a Postgres server per
//! relay, point the relay at the proxy, and break that relay's link at will.
//!
//! [`FaultProxy`] listens on `127.0.0.1:0` and forwards each accepted connection to
//! the upstream address. At run time it can:
//!
//! - [`drop_all`](FaultProxy::drop_all): reset every current connection (both sides
//!   see a connection reset, as after a crashed server or a cut link);
//! - [`set_delay`](FaultProxy::set_delay): hold every forwarded chunk for a while;
//! - [`black_hole`](FaultProxy::black_hole) / [`heal`](FaultProxy::heal): stop moving
//!   bytes in both directions without closing anything, as a network partition does;
//!   the client notices only through its own timeouts. Bytes read before or during the
//!   partition are delivered after the heal, as TCP retransmission would. New
//!   connections made during the partition are accepted but stay silent too;
//! - [`refuse`](FaultProxy::refuse): close new connections at once (the listener stays
//!   bound, so the port is never lost).
//!
//! It is bounded: at most [`FaultProxy::MAX_CONNECTIONS`] connections at a time (more
//! are closed on accept) and one buffer of [`FaultProxy::CHUNK`] bytes per direction.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use huddle_testkit::proxy::FaultProxy;
//! let proxy = FaultProxy::start("127.0.0.1:5432".parse().unwrap()).await?;
//! let url = proxy.redirect_url("postgres://postgres@127.0.0.1:5432/db");
//! // ... start a relay on `url` ...
//! proxy.black_hole();
//! // ... longer than the claim TTL ...
//! proxy.heal();
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted and forwarded.
    pub accepted: u64,
    /// Connections closed on accept (refusing, over the bound, upstream down).
    pub refused: u64,
    /// Connections reset by [`FaultProxy::drop_all`].
    pub dropped: u64,
    /// Connections open now.
    pub open: usize,
}

#[derive(Debug)]
struct Shared {
    /// Bumped by `drop_all`; a connection ends when it changes.
    generation: watch::Sender<u64>,
    /// Whether bytes are held (black-holed).
    holed: watch::Sender<bool>,
    refusing: watch::Sender<bool>,
    delay_us: AtomicU64,
    open: AtomicUsize,
    accepted: AtomicU64,
    refused: AtomicU64,
    dropped: AtomicU64,
}

/// A TCP proxy between clients and one upstream address that injects faults on
/// demand. Dropping it stops accepting and closes every connection.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Most connections open at once; more are closed on accept.
    pub const MAX_CONNECTIONS: usize = 256;
    /// Bytes read at a time per direction.
    pub const CHUNK: usize = 16 * 1024;

    /// Listens on `127.0.0.1:0` and forwards to `upstream`. Needs a Tokio runtime;
    /// the proxy's tasks run on it.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            generation: watch::channel(0).0,
            holed: watch::channel(false).0,
            refusing: watch::channel(false).0,
            delay_us: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, upstream, shared.clone()));
        Ok(FaultProxy {
            addr,
            upstream,
            shared,
            accept,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address connections are forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// `url` with its `host:port` of the upstream replaced by the proxy's, e.g.
    /// `postgres://u@127.0.0.1:5432/db` -> `postgres://u@127.0.0.1:<proxy>/db`.
    /// Panics when `url` does not name the upstream address: a test bug.
    pub fn redirect_url(&self, url: &str) -> String {
        let from = self.upstream.to_string();
        assert!(
            url.contains(&from),
            "{url} does not name the proxy's upstream {from}"
        );
        url.replacen(&from, &self.addr.to_string(), 1)
    }

    /// Resets every current connection, both sides; returns how many. New
    /// connections are accepted as before.
    pub fn drop_all(&self) -> usize {
        let n = self.shared.open.load(Ordering::SeqCst);
        self.shared.generation.send_modify(|g| *g += 1);
        n
    }

    /// Holds every forwarded chunk for `delay` (zero: none).
    pub fn set_delay(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.delay_us.store(us, Ordering::SeqCst);
    }

    /// Stops moving bytes in both directions, for current and new connections,
    /// without closing anything, until [`FaultProxy::heal`].
    pub fn black_hole(&self) {
        self.shared.holed.send_replace(true);
    }

    /// Moves bytes again after [`FaultProxy::black_hole`]; what was held is delivered.
    pub fn heal(&self) {
        self.shared.holed.send_replace(false);
    }

    /// Whether the link is black-holed now.
    pub fn is_black_holed(&self) -> bool {
        *self.shared.holed.borrow()
    }

    /// Closes new connections at once while `on`; current ones go on.
    pub fn refuse(&self, on: bool) {
        self.shared.refusing.send_replace(on);
    }

    /// Counters so far.
    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            accepted: self.shared.accepted.load(Ordering::SeqCst),
            refused: self.shared.refused.load(Ordering::SeqCst),
            dropped: self.shared.dropped.load(Ordering::SeqCst),
            open: self.shared.open.load(Ordering::SeqCst),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Ends every connection task (they watch the generation).
        self.shared.generation.send_modify(|g| *g += 1);
    }
}

/// Resets a connection when dropped (RST rather than FIN), as a cut link looks.
fn reset_on_drop(s: &TcpStream) {
    let _ = s.set_zero_linger();
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let full = shared.open.load(Ordering::SeqCst) >= FaultProxy::MAX_CONNECTIONS;
        if *shared.refusing.borrow() || full {
            reset_on_drop(&client);
            shared.refused.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        shared.open.fetch_add(1, Ordering::SeqCst);
        let shared = shared.clone();
        tokio::spawn(async move {
            connection(client, upstream, &shared).await;
            shared.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Forwards one connection until either side closes or `drop_all` is called.
async fn connection(client: TcpStream, upstream: SocketAddr, shared: &Shared) {
    let mut generation = shared.generation.subscribe();
    generation.mark_unchanged();
    let _ = client.set_nodelay(true);
    reset_on_drop(&client);
    // While black-holed, a new connection is not even forwarded: the client waits.
    let mut holed = shared.holed.subscribe();
    let server = tokio::select! {
        _ = generation.changed() => {
            shared.dropped.fetch_add(1, Ordering::SeqCst);
            return;
        }
        s = async {
            let _ = holed.wait_for(|h| !*h).await;
            TcpStream::connect(upstream).await
        } => s,
    };
    let Ok(server) = server else {
        shared.refused.fetch_add(1, Ordering::SeqCst);
        return;
    };
    shared.accepted.fetch_add(1, Ordering::SeqCst);
    let _ = server.set_nodelay(true);
    reset_on_drop(&server);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    tokio::select! {
        _ = generation.changed() => {
            shared.dropped.fetch_add(1, Ordering::SeqCst);
        }
        _ = pump(cr, sw, shared) => {}
        _ = pump(sr, cw, shared) => {}
    }
    // Dropping the halves resets both sockets (zero linger).
}

/// Copies one direction, honouring the black hole and the delay, until EOF or error.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, shared: &Shared) {
    let mut holed = shared.holed.subscribe();
    let mut buf = vec![0u8; FaultProxy::CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // A partition holds the bytes until it heals (and stops reading, so the
        // sender's buffers fill as over a dead link).
        if holed.wait_for(|h| !*h).await.is_err() {
            return;
        }
        let delay = shared.delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_micros(delay)).await;
            if holed.wait_for(|h| !*h).await.is_err() {
                return;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// An echo server on `127.0.0.1:0`.
    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        s.write_all(msg).await?;
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).await?;
        Ok(got)
    }

    /// A proxy in front of an echo server, with one connection that has echoed once.
    async fn warm_proxy() -> (FaultProxy, TcpStream) {
        let p = FaultProxy::start(echo_server().await).await.expect("proxy");
        let mut s = TcpStream::connect(p.addr()).await.expect("connect");
        let got = within("warm", roundtrip(&mut s, b"x")).await.expect("io");
        assert_eq!(got, b"x");
        (p, s)
    }

    const LIMIT: Duration = Duration::from_secs(5);

    async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(LIMIT, f)
            .await
            .unwrap_or_else(|_| panic!("{what}: not within {LIMIT:?}"))
    }

    /// Waits (bounded) until the proxy's counters satisfy `cond`.
    async fn stats_until(p: &FaultProxy, what: &str, cond: impl Fn(ProxyStats) -> bool) {
        within(what, async {
            while !cond(p.stats()) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
    }

    #[tokio::test]
    async fn forwards_both_ways() {
        let p = FaultProxy::start(echo_server().await).await.expect("proxy");
        let mut s = TcpStream::connect(p.addr()).await.expect("connect");
        let got = within("echo", roundtrip(&mut s, b"hello"))
            .await
            .expect("io");
        assert_eq!(got, b"hello");
        // More than one chunk, both ways.
        let big: Vec<u8> = (0..(3 * FaultProxy::CHUNK + 17))
            .map(|i| (i % 251) as u8)
            .collect();
        let got = within("big echo", roundtrip(&mut s, &big))
            .await
            .expect("io");
        assert_eq!(got, big);
        assert_eq!(p.stats().accepted, 1);
        assert_eq!(p.stats().open, 1);
    }

    #[tokio::test]
    async fn drop_all_resets_current_connections_and_accepts_new_ones() {
        let p = FaultProxy::start(echo_server().await).await.expect("proxy");
        let mut a = TcpStream::connect(p.addr()).await.expect("connect");
        let mut b = TcpStream::connect(p.addr()).await.expect("connect");
        within("a", roundtrip(&mut a, b"a")).await.expect("io");
        within("b", roundtrip(&mut b, b"b")).await.expect("io");
        assert_eq!(p.drop_all(), 2);
        for s in [&mut a, &mut b] {
            let mut buf = [0u8; 1];
            // The proxy closed its side: a read ends (EOF or reset), never hangs.
            let r = within("read after drop", s.read(&mut buf)).await;
            assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
        }
        stats_until(&p, "both dropped", |s| s.dropped == 2 && s.open == 0).await;
        let mut c = TcpStream::connect(p.addr()).await.expect("connect");
        let got = within("after drop", roundtrip(&mut c, b"again"))
            .await
            .expect("io");
        assert_eq!(got, b"again");
    }

    #[tokio::test]
    async fn delay_holds_each_chunk() {
        let (p, mut s) = warm_proxy().await;
        p.set_delay(Duration::from_millis(150));
        let t = Instant::now();
        within("delayed", roundtrip(&mut s, b"y"))
            .await
            .expect("io");
        // Held once each way.
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        p.set_delay(Duration::ZERO);
        let t = Instant::now();
        within("undelayed", roundtrip(&mut s, b"z"))
            .await
            .expect("io");
        assert!(
            t.elapsed() < Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
    }

    #[tokio::test]
    async fn black_hole_holds_bytes_without_closing_and_heal_delivers_them() {
        let (p, mut s) = warm_proxy().await;
        p.black_hole();
        assert!(p.is_black_holed());
        s.write_all(b"held").await.expect("write into the hole");
        let mut got = [0u8; 4];
        // Nothing comes back while the link is black-holed, and nothing is closed.
        let r = tokio::time::timeout(Duration::from_millis(400), s.read_exact(&mut got)).await;
        assert!(r.is_err(), "bytes crossed a black hole: {r:?}");
        // A connection made during the partition stays silent too.
        let mut late = TcpStream::connect(p.addr()).await.expect("connect");
        late.write_all(b"late").await.expect("write");
        let mut buf = [0u8; 4];
        let r = tokio::time::timeout(Duration::from_millis(200), late.read_exact(&mut buf)).await;
        assert!(r.is_err(), "a new connection crossed the hole: {r:?}");
        assert_eq!(p.stats().open, 2);
        p.heal();
        within("held bytes after heal", s.read_exact(&mut got))
            .await
            .expect("io");
        assert_eq!(&got, b"held");
        within("late bytes after heal", late.read_exact(&mut buf))
            .await
            .expect("io");
        assert_eq!(&buf, b"late");
        let got = within("after heal", roundtrip(&mut s, b"free"))
            .await
            .expect("io");
        assert_eq!(got, b"free");
    }

    #[tokio::test]
    async fn refuse_closes_new_connections_only() {
        let (p, mut old) = warm_proxy().await;
        p.refuse(true);
        let mut new = TcpStream::connect(p.addr()).await.expect("tcp accept");
        let r = within("refused", roundtrip(&mut new, b"no")).await;
        assert!(r.is_err(), "a refused connection answered: {r:?}");
        assert_eq!(p.stats().refused, 1);
        let got = within("old goes on", roundtrip(&mut old, b"yes"))
            .await
            .expect("io");
        assert_eq!(got, b"yes");
        p.refuse(false);
        let mut again = TcpStream::connect(p.addr()).await.expect("connect");
        let got = within("accepted again", roundtrip(&mut again, b"ok"))
            .await
            .expect("io");
        assert_eq!(got, b"ok");
    }

    #[tokio::test]
    async fn connections_are_bounded() {
        let p = FaultProxy::start(echo_server().await).await.expect("proxy");
        let mut held = Vec::new();
        for _ in 0..FaultProxy::MAX_CONNECTIONS {
            held.push(TcpStream::connect(p.addr()).await.expect("connect"));
        }
        stats_until(&p, "all open", |s| s.open == FaultProxy::MAX_CONNECTIONS).await;
        let mut extra = TcpStream::connect(p.addr()).await.expect("tcp accept");
        let r = within("over the bound", roundtrip(&mut extra, b"no")).await;
        assert!(r.is_err(), "a connection over the bound answered: {r:?}");
        assert_eq!(p.stats().refused, 1);
        drop(held);
        stats_until(&p, "all closed", |s| s.open == 0).await;
    }

    #[tokio::test]
    async fn an_upstream_that_is_down_closes_the_client() {
        // A port with nothing listening: bind, note the port, close.
        let dead = {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            l.local_addr().expect("addr")
        };
        let p = FaultProxy::start(dead).await.expect("proxy");
        let mut s = TcpStream::connect(p.addr()).await.expect("tcp accept");
        let r = within("upstream down", roundtrip(&mut s, b"x")).await;
        assert!(r.is_err(), "{r:?}");
        stats_until(&p, "counted", |s| s.refused == 1 && s.open == 0).await;
    }

    #[tokio::test]
    async fn redirect_url_swaps_the_address() {
        let up: SocketAddr = "127.0.0.1:5999".parse().expect("addr");
        let p = FaultProxy::start(up).await.expect("proxy");
        let url = p.redirect_url("postgres://postgres@127.0.0.1:5999/huddle");
        assert_eq!(
            url,
            format!("postgres://postgres@127.0.0.1:{}/huddle", p.port())
        );
    }
}
