//! A small HTTP/1.1 endpoint for observability: `GET` requests answered from a routes
//! callback by a few threads, one answer per connection. The storage node serves its
//! `/metrics` and `/health` with it (`node::metrics`), and a store client its
//! `enable_client_http_server` endpoint (the Python binding). Nothing here knows what the
//! routes say.
//!
//! A request has [`REQUEST_DEADLINE`] from its connection's accept to its answer, however it
//! trickles its bytes, and [`WORKERS`] threads answer: a few slow or silent clients can hold
//! the endpoint for one deadline at most, never starve `/health` for longer.

use crate::limits::{ACCEPT_POLL, REQUEST_DEADLINE, REQUEST_HEAD_MAX_BYTES};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The Prometheus text content type.
pub const PROMETHEUS: &str = "text/plain; version=0.0.4";
/// Upstream's default port of the client HTTP server (`client_http_port`, `--http_port`).
pub const CLIENT_HTTP_PORT_DEFAULT: u16 = 9300;

/// Threads accepting and answering; each answers one connection at a time.
pub const WORKERS: usize = 4;

/// One answer.
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    pub fn ok(content_type: &'static str, body: String) -> Reply {
        Reply {
            status: 200,
            content_type,
            body,
        }
    }
}

/// Upstream's client `/health` answer for a health code (0 healthy): 200
/// `{"status":"healthy","code":0}`, else 503 `{"status":"unhealthy","code":N}`.
pub fn health_json(code: i32) -> Reply {
    let (status, word) = if code == 0 {
        (200, "healthy")
    } else {
        (503, "unhealthy")
    };
    Reply {
        status,
        content_type: "application/json",
        body: format!("{{\"status\":\"{word}\",\"code\":{code}}}"),
    }
}

/// The answer for a path (without its query), or `None` for a 404.
pub type Routes = Arc<dyn Fn(&str) -> Option<Reply> + Send + Sync>;

pub struct HttpEndpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl HttpEndpoint {
    /// Binds `addr` (port 0 picks one) and serves `routes` on [`WORKERS`] threads called
    /// `name` until dropped.
    pub fn start(addr: SocketAddr, name: &str, routes: Routes) -> std::io::Result<HttpEndpoint> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut endpoint = HttpEndpoint {
            addr,
            stop,
            threads: Vec::with_capacity(WORKERS),
        };
        for _ in 0..WORKERS {
            let (listener, stop, routes) =
                (listener.try_clone()?, endpoint.stop.clone(), routes.clone());
            let thread = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || serve(&listener, &stop, &routes))?;
            endpoint.threads.push(thread);
        }
        Ok(endpoint)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One worker: accepts and answers until `stop`.
fn serve(listener: &TcpListener, stop: &AtomicBool, routes: &Routes) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((sock, _)) => {
                let _ = answer(sock, routes);
            }
            Err(_) => std::thread::sleep(ACCEPT_POLL),
        }
    }
}

/// Time left before `deadline`, as a socket timeout (never zero, which means "none").
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    Ok(left)
}

/// Reads one request head and answers it within [`REQUEST_DEADLINE`]; every connection is
/// closed after one answer.
fn answer(mut sock: TcpStream, routes: &Routes) -> std::io::Result<()> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    sock.set_nonblocking(false)?;
    sock.set_write_timeout(Some(REQUEST_DEADLINE))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        sock.set_read_timeout(Some(left(deadline)?))?;
        let n = sock.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > REQUEST_HEAD_MAX_BYTES {
            return respond(&mut sock, 431, "text/plain", "request header too large\n");
        }
    }
    let head = parse_head(&head);
    if head.method != "GET" {
        return respond(&mut sock, 405, "text/plain", "method not allowed\n");
    }
    match routes(&head.path) {
        Some(r) => respond(&mut sock, r.status, r.content_type, &r.body),
        None => respond(&mut sock, 404, "text/plain", "404 Not Found"),
    }
}

/// What a request line asks for.
#[derive(Debug, PartialEq, Eq)]
pub struct Head {
    /// The first word of the request line (`""` when there is none).
    pub method: String,
    /// The second word, without its query (`""` when there is none). Never holds `?`.
    pub path: String,
}

/// Reads the method and path from the request line at the start of `head` (bytes up to the
/// first `\r`; not UTF-8 is read lossily). Pure, for the `http_endpoint` fuzz target.
pub fn parse_head(head: &[u8]) -> Head {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    Head {
        method: method.to_string(),
        path: path.to_string(),
    }
}

fn respond(sock: &mut TcpStream, status: u16, ctype: &str, body: &str) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes())?;
    sock.write_all(body.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_names_its_method_and_its_path_without_the_query() {
        let h = parse_head(b"GET /metrics?x=1&y HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!((h.method.as_str(), h.path.as_str()), ("GET", "/metrics"));
        let h = parse_head(b"POST\r\n\r\n");
        assert_eq!((h.method.as_str(), h.path.as_str()), ("POST", ""));
        let h = parse_head(b"\xff /?\r\n");
        assert_eq!((h.method.as_str(), h.path.as_str()), ("\u{fffd}", "/"));
        assert_eq!(parse_head(b"").path, "");
    }

    /// Four clients trickle a byte of their heads every 500 ms: each is dropped at its
    /// deadline, and `/health` is answered meanwhile. One slow client used to hold the only
    /// thread for as long as it kept sending.
    #[test]
    fn trickling_clients_do_not_starve_health() {
        use std::io::{Read, Write};
        let routes: Routes = Arc::new(|p: &str| (p == "/health").then(|| health_json(0)));
        let ep = HttpEndpoint::start("127.0.0.1:0".parse().unwrap(), "t-http", routes).unwrap();
        let addr = ep.local_addr();
        let slow: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    let start = Instant::now();
                    for b in b"GET /health HTTP/1.1\r\nHost: a\r\nX-Slow: aaaaaaaaaaaaaaaa" {
                        if s.write_all(&[*b]).is_err() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    start.elapsed()
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let asked = Instant::now();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        let waited = asked.elapsed();
        assert!(waited < REQUEST_DEADLINE * 2, "/health waited {waited:?}");
        for t in slow {
            let held = t.join().unwrap();
            assert!(held < REQUEST_DEADLINE * 3, "a trickler was held {held:?}");
        }
    }
}
