//! The HTTP metadata store: upstream's `HTTPStoragePlugin` protocol on a small HTTP/1.1
//! client written on `std::net::TcpStream`.
//!
//! ```text
//! GET    <path>?key=<url-encoded key>            -> 200 body | 404
//! PUT    <path>?key=<url-encoded key>  body=JSON -> 200
//! DELETE <path>?key=<url-encoded key>            -> 200 | 404
//! ```
//!
//! One connection per request (`Connection: close`), 1.5 s connect timeout and 3 s for the
//! whole exchange, `Content-Type: application/json`. Only 200 is success; a GET answered 404
//! is "no such key", a DELETE answered 404 is "already gone". The key is escaped as
//! `curl_easy_escape` does: every byte but `A-Z a-z 0-9 - . _ ~` becomes `%XX`.
//!
//! [`exchange`] is the client itself (one request, one connection); the etcd store
//! (`super::etcd`) sends its gateway calls through it too, so there is one HTTP client.
//! [`decode_response`] is its parser, fuzzed by `fuzz/fuzz_targets/metadata_http.rs`.
//!
//! Why not a library: the protocol needs four lines of HTTP; a client crate would bring an
//! async runtime or TLS stack into the data plane for nothing.
//!
//! Invariants: a response larger than [`RESPONSE_MAX_BYTES`] or not well formed is an error,
//! never a panic; no call blocks longer than about the timeout per socket operation.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::{MetadataError, MetadataStore};
use crate::sys::connect_first;

/// Bound on establishing the connection (upstream: 1.5 s).
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);
/// Bound on the whole request (upstream: 3 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest response accepted (headers and body).
pub const RESPONSE_MAX_BYTES: usize = 16 * 1024 * 1024;

/// A parsed `http://host:port/path` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpUrl {
    pub host: String,
    pub port: u16,
    /// Starts with `/`; `/` when the URL has no path.
    pub path: String,
}

impl HttpUrl {
    /// Parses `http://host[:port][/path]` (port 80 by default).
    pub fn parse(url: &str) -> Result<HttpUrl, MetadataError> {
        let bad = |why| MetadataError::BadConn {
            conn: url.to_string(),
            why,
        };
        let rest = url
            .get(..7)
            .filter(|s| s.eq_ignore_ascii_case("http://"))
            .map(|_| &url[7..])
            .ok_or_else(|| bad("expected http://"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = match super::split_host_port(authority) {
            Some((h, p)) => (h.to_string(), p),
            None if !authority.is_empty() && !authority.contains(':') => {
                (authority.to_string(), 80)
            }
            None => return Err(bad("expected host[:port] after http://")),
        };
        Ok(HttpUrl {
            host,
            port,
            path: path.to_string(),
        })
    }

    fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// The metadata store behind an HTTP metadata server.
#[derive(Clone, Debug)]
pub struct HttpStore {
    url: HttpUrl,
}

/// A parsed HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl HttpStore {
    pub fn new(url: HttpUrl) -> HttpStore {
        HttpStore { url }
    }

    fn request(
        &self,
        method: &'static str,
        key: &str,
        body: &[u8],
    ) -> Result<Response, MetadataError> {
        let target = format!("{}?key={}", self.url.path, url_escape(key));
        // With a cluster secret, writes prove it (the server checks PUT and DELETE).
        let authorization = match protocol::auth::process_token_or_none() {
            Some(t) => format!("Authorization: Bearer {}\r\n", t.http_bearer()),
            None => String::new(),
        };
        exchange_with(
            &self.url.host,
            self.url.port,
            method,
            &target,
            body,
            &authorization,
        )
    }

    fn status_error(&self, method: &'static str, key: &str, r: &Response) -> MetadataError {
        MetadataError::Status {
            peer: self.url.authority(),
            method,
            key: key.to_string(),
            status: r.status,
            body: String::from_utf8_lossy(&r.body).chars().take(200).collect(),
        }
    }
}

/// One HTTP/1.1 exchange with `host:port`: `method target` with a JSON `body`, on a new
/// connection closed afterwards, within [`CONNECT_TIMEOUT`] and [`REQUEST_TIMEOUT`]. Shared
/// by the HTTP metadata store and the etcd gateway store (`super::etcd`).
pub fn exchange(
    host: &str,
    port: u16,
    method: &str,
    target: &str,
    body: &[u8],
) -> Result<Response, MetadataError> {
    exchange_with(host, port, method, target, body, "")
}

/// [`exchange`] with extra header lines (each ending in `\r\n`).
pub fn exchange_with(
    host: &str,
    port: u16,
    method: &str,
    target: &str,
    body: &[u8],
    extra_headers: &str,
) -> Result<Response, MetadataError> {
    let peer = format!("{host}:{port}");
    let io = |source| MetadataError::Io {
        peer: peer.clone(),
        source,
    };
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let addrs = (host, port).to_socket_addrs().map_err(io)?;
    let mut stream = connect_first(addrs, CONNECT_TIMEOUT).map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {peer}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n{extra_headers}\r\n",
        body.len()
    );
    set_deadline(&stream, deadline).map_err(io)?;
    stream.write_all(head.as_bytes()).map_err(io)?;
    stream.write_all(body).map_err(io)?;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        set_deadline(&stream, deadline).map_err(io)?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        }
        if raw.len() > RESPONSE_MAX_BYTES {
            return Err(MetadataError::Malformed {
                peer,
                why: format!("response larger than {RESPONSE_MAX_BYTES} bytes"),
            });
        }
        // Stop early once a Content-Length framed response is complete.
        if let Ok(Some(r)) = parse_response(&raw) {
            return Ok(r);
        }
    }
    decode_response(&raw).map_err(|why| MetadataError::Malformed { peer, why })
}

/// Decodes a whole response as read up to the end of the stream: framed by
/// `Content-Length`, chunked, or running to the end. Never panics (fuzzed by
/// `fuzz/fuzz_targets/metadata_http.rs`).
pub fn decode_response(raw: &[u8]) -> Result<Response, String> {
    match parse_response(raw)? {
        Some(r) => Ok(r),
        None => parse_until_eof(raw),
    }
}

impl MetadataStore for HttpStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, MetadataError> {
        let r = self.request("GET", key, b"")?;
        match r.status {
            200 => Ok(Some(r.body)),
            404 => Ok(None),
            _ => Err(self.status_error("GET", key, &r)),
        }
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<(), MetadataError> {
        let r = self.request("PUT", key, value)?;
        match r.status {
            200 => Ok(()),
            _ => Err(self.status_error("PUT", key, &r)),
        }
    }

    fn remove(&self, key: &str) -> Result<(), MetadataError> {
        let r = self.request("DELETE", key, b"")?;
        match r.status {
            200 | 404 => Ok(()),
            _ => Err(self.status_error("DELETE", key, &r)),
        }
    }
}

fn set_deadline(stream: &TcpStream, deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))
}

/// `curl_easy_escape`: every byte except `A-Z a-z 0-9 - . _ ~` as `%XX`.
pub fn url_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The status line and headers: `(status, headers text, body offset)`, or `None` when the
/// header block is not complete yet.
fn parse_head(raw: &[u8]) -> Result<Option<(u16, String, usize)>, String> {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let status_line = head.lines().next().unwrap_or("");
    let mut parts = status_line.split_whitespace();
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(format!(
            "expected an HTTP/1.x status line, got {status_line:?}"
        ));
    }
    let status = parts
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("no status code in {status_line:?}"))?;
    Ok(Some((status, head, end + 4)))
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A complete response, `None` when more bytes are needed, or why it is malformed.
fn parse_response(raw: &[u8]) -> Result<Option<Response>, String> {
    let Some((status, head, at)) = parse_head(raw)? else {
        return Ok(None);
    };
    let body = &raw[at..];
    let chunked = header(&head, "transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        return Ok(dechunk(body)?.map(|body| Response { status, body }));
    }
    match header(&head, "content-length") {
        Some(v) => {
            let len: usize = v.parse().map_err(|_| format!("bad Content-Length {v:?}"))?;
            if len > RESPONSE_MAX_BYTES {
                return Err(format!("Content-Length {len} exceeds {RESPONSE_MAX_BYTES}"));
            }
            if body.len() < len {
                return Ok(None);
            }
            Ok(Some(Response {
                status,
                body: body[..len].to_vec(),
            }))
        }
        None => Ok(None),
    }
}

/// A response without length framing: the body runs to end of stream.
fn parse_until_eof(raw: &[u8]) -> Result<Response, String> {
    let Some((status, head, at)) = parse_head(raw)? else {
        return Err(format!(
            "connection closed after {} bytes, before the end of the headers",
            raw.len()
        ));
    };
    // A framed body that the stream cut short is truncated, not complete.
    if let Some(v) = header(&head, "content-length") {
        return Err(format!(
            "connection closed after {} of {v} body bytes",
            raw.len() - at
        ));
    }
    if header(&head, "transfer-encoding").is_some() {
        return Err("connection closed inside a chunked body".into());
    }
    Ok(Response {
        status,
        body: raw[at..].to_vec(),
    })
}

/// Decodes a chunked body; `None` when incomplete.
fn dechunk(mut b: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = String::from_utf8_lossy(&b[..eol]);
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        if size == 0 {
            return Ok(Some(out));
        }
        let start = eol + 2;
        if size > RESPONSE_MAX_BYTES.saturating_sub(out.len()) {
            return Err("chunked body too large".into());
        }
        let Some(end) = start.checked_add(size).filter(|e| e + 2 <= b.len()) else {
            return Ok(None);
        };
        out.extend_from_slice(&b[start..end]);
        b = &b[end + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_parsing() {
        let u = HttpUrl::parse("http://127.0.0.1:8080/metadata").unwrap();
        assert_eq!(u.authority(), "127.0.0.1:8080");
        assert_eq!(u.path, "/metadata");
        let u = HttpUrl::parse("HTTP://host").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("host", 80, "/")
        );
        assert!(HttpUrl::parse("http://:1/x").is_err());
        assert!(HttpUrl::parse("http://h:x/").is_err());
        assert!(HttpUrl::parse("ftp://h").is_err());
    }

    #[test]
    fn escaping_matches_curl() {
        assert_eq!(
            url_escape("mooncake/ram/127.0.0.1:12345"),
            "mooncake%2Fram%2F127.0.0.1%3A12345"
        );
        assert_eq!(url_escape("a b~_-."), "a%20b~_-.");
        assert_eq!(url_escape("é"), "%C3%A9");
    }

    #[test]
    fn response_parsing() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
            .unwrap()
            .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hi"[..]));
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nhi")
                .unwrap()
                .is_none()
        );
        let c = parse_response(
            b"HTTP/1.1 404 NF\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!((c.status, c.body.as_slice()), (404, &b"abc"[..]));
        assert!(parse_response(b"SSH-2.0\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 x\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n").is_err());
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err()
        );
        assert!(parse_until_eof(b"HTTP/1.1 200").is_err());
        assert_eq!(
            parse_until_eof(b"HTTP/1.0 200 OK\r\n\r\nxyz").unwrap().body,
            b"xyz"
        );
        // Cut short: an error, not a shorter body.
        assert!(decode_response(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nhi").is_err());
        assert!(decode_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n"
        )
        .is_err());
        assert!(decode_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n"
        )
        .is_err());
        assert_eq!(
            decode_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi").unwrap(),
            Response {
                status: 200,
                body: b"hi".to_vec()
            }
        );
    }
}
