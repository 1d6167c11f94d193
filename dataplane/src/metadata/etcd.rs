//! The etcd metadata store: transfer-engine descriptors kept in etcd, reached through etcd
//! v3's JSON gRPC gateway on the client port.
//!
//! ```text
//! POST <api>/kv/range        {"key":"<b64 key>"}                    -> {"kvs":[{"key","value"}]} | {}
//! POST <api>/kv/put          {"key":"<b64 key>","value":"<b64 JSON>"} -> {"header":{..}}
//! POST <api>/kv/deleterange  {"key":"<b64 key>"}                    -> {"deleted":"1"} | {}
//! <api> is /v3 (etcd >= 3.4) or /v3beta (3.3); found on the first call and remembered.
//! ```
//!
//! Why the gateway and not gRPC: the data plane has no async runtime, no gRPC stack and no
//! `protoc` step, and keeps it that way (`etcd-client` is for the control plane's HA, which
//! already runs tokio). The gateway ships with every etcd since 3.3, enabled by default, and
//! three unary calls are all the metadata store needs. Requests go through the same small
//! HTTP/1.1 client as the HTTP metadata store ([`super::http::exchange`]): a connection per
//! call, 1.5 s to connect, 3 s for the whole call (per endpoint tried).
//!
//! Endpoints: `etcd://h1:p1,h2:p2` (`,` or `;` between endpoints, port 2379 when omitted,
//! an optional `http://` on each). They are tried in order starting from the one that last
//! answered; an endpoint that cannot be reached or answers 5xx passes the call to the next.
//! A 4xx answer is final: another member would say the same.
//!
//! Keys carry no lease, as upstream's etcd plugin writes them: an engine that dies without
//! shutting down leaves its keys behind until it is restarted under the same name.
//!
//! Invariants: decoding a gateway answer ([`decode_answer`]) never panics on any bytes
//! (fuzzed by `fuzz/fuzz_targets/etcd_gateway.rs`); every call is bounded by the timeouts
//! above times the number of endpoints.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{json, Value};

use super::{base64, http, MetadataError, MetadataStore};

/// etcd's client port, used when an endpoint has none.
pub const DEFAULT_PORT: u16 = 2379;
/// Endpoints one connection string may name.
pub const ENDPOINTS_MAX: usize = 16;
/// Gateway API roots, newest first: `/v3` (etcd 3.4+, also served by 3.4 as `/v3beta`) and
/// `/v3beta` (3.3).
pub const API_ROOTS: [&str; 2] = ["/v3", "/v3beta"];
/// Keys in one answer the decoder accepts (a single-key range returns at most one).
pub const ANSWER_KVS_MAX: usize = 1024;

/// One etcd client endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Parses an endpoint list: `h1:p1,h2:p2` or `h1:p1;h2:p2` (what follows `etcd://`, or a
/// bare connection string). Each endpoint may carry `http://` and a trailing `/`.
pub fn parse_endpoints(list: &str) -> Result<Vec<Endpoint>, MetadataError> {
    let bad = |why| MetadataError::BadConn {
        conn: list.to_string(),
        why,
    };
    let mut out = Vec::new();
    for item in list
        .split([',', ';'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let lower = item.to_ascii_lowercase();
        if lower.starts_with("https://") {
            return Err(MetadataError::Unsupported {
                backend: "etcd over https".into(),
                why: "TLS is not built in; give etcd's plain http client URL",
            });
        }
        let item = if lower.starts_with("http://") {
            &item[7..]
        } else {
            item
        };
        let item = item.trim_end_matches('/');
        let ep = match super::split_host_port(item) {
            Some((h, p)) => Endpoint {
                host: h.to_string(),
                port: p,
            },
            None if !item.is_empty() && !item.contains([':', '/', '[', ']']) => Endpoint {
                host: item.to_string(),
                port: DEFAULT_PORT,
            },
            None => return Err(bad("expected host:port[,host:port...] for etcd")),
        };
        out.push(ep);
    }
    if out.is_empty() {
        return Err(bad("no etcd endpoint given"));
    }
    if out.len() > ENDPOINTS_MAX {
        return Err(bad("more than 16 etcd endpoints"));
    }
    Ok(out)
}

/// A decoded gateway answer: what range, put and deleterange return that we use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatewayAnswer {
    /// `kvs` as (key, value) bytes; empty when absent.
    pub kvs: Vec<(Vec<u8>, Vec<u8>)>,
    /// `deleted`; 0 when absent.
    pub deleted: u64,
}

fn int64_field(v: Option<&Value>, name: &str) -> Result<u64, String> {
    match v {
        None | Some(Value::Null) => Ok(0),
        // proto3 JSON writes int64 as a string; accept a number too.
        Some(Value::String(s)) => s
            .parse()
            .map_err(|_| format!("{name}: expected an integer string, got {s:?}")),
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| format!("{name}: expected a non-negative integer, got {n}")),
        Some(other) => Err(format!("{name}: expected an integer, got {other}")),
    }
}

fn bytes_field(kv: &serde_json::Map<String, Value>, name: &str) -> Result<Vec<u8>, String> {
    match kv.get(name) {
        // proto3 JSON omits empty fields.
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => base64::decode(s).map_err(|e| format!("kvs[].{name}: {e}")),
        Some(other) => Err(format!(
            "kvs[].{name}: expected a base64 string, got {}",
            kind(other)
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Decodes the body of a 200 answer of the gateway. An error says what was expected.
pub fn decode_answer(body: &[u8]) -> Result<GatewayAnswer, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("gateway answer is not JSON: {e}"))?;
    let Value::Object(obj) = v else {
        return Err(format!(
            "gateway answer: expected a JSON object, got {}",
            kind(&v)
        ));
    };
    // A gRPC error delivered in a 200 body (streamed calls) is still an error.
    if let Some(e) = obj.get("error") {
        return Err(format!("gateway error: {}", error_text(&obj, e)));
    }
    let kvs = match obj.get("kvs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            if items.len() > ANSWER_KVS_MAX {
                return Err(format!(
                    "kvs: {} entries, more than {ANSWER_KVS_MAX}",
                    items.len()
                ));
            }
            let mut kvs = Vec::with_capacity(items.len());
            for item in items {
                let Value::Object(kv) = item else {
                    return Err(format!("kvs[]: expected an object, got {}", kind(item)));
                };
                kvs.push((bytes_field(kv, "key")?, bytes_field(kv, "value")?));
            }
            kvs
        }
        Some(other) => return Err(format!("kvs: expected an array, got {}", kind(other))),
    };
    Ok(GatewayAnswer {
        kvs,
        deleted: int64_field(obj.get("deleted"), "deleted")?,
    })
}

/// The message of a gateway error object (`{"error":..,"message":..,"code":N}`).
fn error_text(obj: &serde_json::Map<String, Value>, fallback: &Value) -> String {
    let text = match obj.get("message").or(Some(fallback)) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    text.chars().take(200).collect()
}

/// The value of `key` in a range answer: `None` when the answer holds no entry; an error
/// when it holds entries for other keys.
pub fn decode_range(body: &[u8], key: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let a = decode_answer(body)?;
    if a.kvs.is_empty() {
        return Ok(None);
    }
    match a.kvs.into_iter().find(|(k, _)| k == key) {
        Some((_, v)) => Ok(Some(v)),
        None => Err(format!(
            "range of {:?} answered with other keys only",
            String::from_utf8_lossy(key)
        )),
    }
}

/// The text of a non-200 answer: the gateway's `message`, else the body's start.
fn status_text(body: &[u8]) -> String {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) if o.contains_key("message") || o.contains_key("error") => {
            error_text(&o, o.get("error").unwrap_or(&Value::Null))
        }
        _ => String::from_utf8_lossy(body).chars().take(200).collect(),
    }
}

/// The gateway calls this store makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Range,
    Put,
    DeleteRange,
}

impl Call {
    fn name(self) -> &'static str {
        match self {
            Call::Range => "range",
            Call::Put => "put",
            Call::DeleteRange => "deleterange",
        }
    }
}

/// The metadata store in etcd; see the module docs.
#[derive(Debug)]
pub struct EtcdStore {
    endpoints: Vec<Endpoint>,
    /// Index of the endpoint that answered last; calls start there.
    preferred: AtomicUsize,
    /// Index in [`API_ROOTS`] of the root that answered last.
    api: AtomicUsize,
}

impl EtcdStore {
    /// A store over `endpoints` (at least one; see [`parse_endpoints`]). Nothing is sent
    /// until the first call.
    pub fn new(endpoints: Vec<Endpoint>) -> EtcdStore {
        EtcdStore {
            endpoints,
            preferred: AtomicUsize::new(0),
            api: AtomicUsize::new(0),
        }
    }

    /// The endpoints, in the order given.
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// Keys and values under `prefix` (a range `[prefix, prefix+1)`), at most `limit`.
    /// For tests and tools; the engine reads single keys.
    pub fn list_prefix(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, MetadataError> {
        let end = prefix_end(prefix.as_bytes());
        let body = json!({
            "key": base64::encode(prefix.as_bytes()),
            "range_end": base64::encode(&end),
            "limit": limit.min(ANSWER_KVS_MAX),
        });
        let raw = self.call(Call::Range, prefix, &body)?;
        let a = decode_answer(&raw).map_err(|why| self.malformed(why))?;
        Ok(a.kvs
            .into_iter()
            .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
            .collect())
    }

    fn malformed(&self, why: String) -> MetadataError {
        MetadataError::Malformed {
            peer: self.peer_text(),
            why,
        }
    }

    fn peer_text(&self) -> String {
        let i = self.preferred.load(Ordering::Relaxed) % self.endpoints.len().max(1);
        match self.endpoints.get(i) {
            Some(ep) => format!("etcd {ep}"),
            None => "etcd (no endpoint)".into(),
        }
    }

    /// Sends `body` to the endpoints in turn until one answers; returns the 200 body.
    fn call(&self, call: Call, key: &str, body: &Value) -> Result<Vec<u8>, MetadataError> {
        let body = body.to_string().into_bytes();
        let n = self.endpoints.len();
        let start = self.preferred.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for i in 0..n {
            let idx = (start + i) % n;
            let ep = &self.endpoints[idx];
            match self.call_endpoint(ep, call, key, &body) {
                Ok(answer) => {
                    self.preferred.store(idx, Ordering::Relaxed);
                    return Ok(answer);
                }
                Err(e) if passes_to_next(&e) => failures.push(e),
                Err(e) => return Err(e),
            }
        }
        if failures.len() == 1 {
            if let Some(e) = failures.pop() {
                return Err(e);
            }
        }
        let list: Vec<String> = self.endpoints.iter().map(ToString::to_string).collect();
        let why: Vec<String> = failures.iter().map(ToString::to_string).collect();
        Err(MetadataError::Io {
            peer: format!("etcd [{}]", list.join(", ")),
            source: std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                format!("no endpoint answered: {}", why.join("; ")),
            ),
        })
    }

    /// One call to one endpoint, finding the gateway's API root if the remembered one is
    /// not served there.
    fn call_endpoint(
        &self,
        ep: &Endpoint,
        call: Call,
        key: &str,
        body: &[u8],
    ) -> Result<Vec<u8>, MetadataError> {
        let first = self.api.load(Ordering::Relaxed) % API_ROOTS.len();
        for k in 0..API_ROOTS.len() {
            let root_idx = (first + k) % API_ROOTS.len();
            let target = format!("{}/kv/{}", API_ROOTS[root_idx], call.name());
            let r = http::exchange(&ep.host, ep.port, "POST", &target, body).map_err(|e| {
                match e {
                    // Name the endpoint as an etcd one in the message.
                    MetadataError::Io { source, .. } => MetadataError::Io {
                        peer: format!("etcd {ep}"),
                        source,
                    },
                    other => other,
                }
            })?;
            if r.status == 404 {
                // This root is not served (older or newer gateway): try the other.
                continue;
            }
            self.api.store(root_idx, Ordering::Relaxed);
            if r.status != 200 {
                return Err(MetadataError::Status {
                    peer: format!("etcd {ep}"),
                    method: call.name(),
                    key: key.to_string(),
                    status: r.status,
                    body: status_text(&r.body),
                });
            }
            return Ok(r.body);
        }
        Err(MetadataError::Status {
            peer: format!("etcd {ep}"),
            method: call.name(),
            key: key.to_string(),
            status: 404,
            body: format!(
                "no etcd v3 JSON gateway at {} (etcd older than 3.3, or not etcd)",
                API_ROOTS.join(" or ")
            ),
        })
    }
}

/// Whether a failure on one endpoint lets the call go on to the next.
fn passes_to_next(e: &MetadataError) -> bool {
    match e {
        MetadataError::Io { .. } => true,
        MetadataError::Status { status, .. } => *status >= 500,
        _ => false,
    }
}

/// The smallest key greater than every key starting with `prefix` (etcd's `range_end`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte is 0xff (or empty): range to the end of the keyspace.
    vec![0]
}

impl MetadataStore for EtcdStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, MetadataError> {
        let raw = self.call(
            Call::Range,
            key,
            &json!({ "key": base64::encode(key.as_bytes()) }),
        )?;
        decode_range(&raw, key.as_bytes()).map_err(|why| self.malformed(why))
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<(), MetadataError> {
        let raw = self.call(
            Call::Put,
            key,
            &json!({
                "key": base64::encode(key.as_bytes()),
                "value": base64::encode(value),
            }),
        )?;
        decode_answer(&raw)
            .map(drop)
            .map_err(|why| self.malformed(why))
    }

    fn remove(&self, key: &str) -> Result<(), MetadataError> {
        let raw = self.call(
            Call::DeleteRange,
            key,
            &json!({ "key": base64::encode(key.as_bytes()) }),
        )?;
        decode_answer(&raw)
            .map(drop)
            .map_err(|why| self.malformed(why))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    #[test]
    fn endpoint_lists() {
        let eps = parse_endpoints("127.0.0.1:2379").unwrap();
        assert_eq!(
            eps,
            [Endpoint {
                host: "127.0.0.1".into(),
                port: 2379
            }]
        );
        let eps = parse_endpoints(" a:1, b:2;http://c:3/ ;; [::1]:4,d").unwrap();
        let text: Vec<String> = eps.iter().map(ToString::to_string).collect();
        assert_eq!(text, ["a:1", "b:2", "c:3", "[::1]:4", "d:2379"]);
        for bad in ["", " , ;", "a:b", "a:1,:2", "::1", "h/x"] {
            let e = parse_endpoints(bad).unwrap_err();
            assert_eq!(e.code(), crate::TeError::InvalidArgument, "{bad:?}: {e}");
        }
        assert_eq!(
            parse_endpoints("https://a:1").unwrap_err().code(),
            crate::TeError::NotImplemented
        );
        let many = vec!["h:1"; ENDPOINTS_MAX + 1].join(",");
        assert!(parse_endpoints(&many).is_err());
    }

    #[test]
    fn answers_of_a_real_gateway_decode() {
        let range = br#"{"header":{"cluster_id":"1","member_id":"2","revision":"2","raft_term":"2"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"count":"1"}"#;
        assert_eq!(decode_range(range, b"foo").unwrap(), Some(b"bar".to_vec()));
        let miss = br#"{"header":{"cluster_id":"1","revision":"2"}}"#;
        assert_eq!(decode_range(miss, b"foo").unwrap(), None);
        let empty_value = br#"{"kvs":[{"key":"Zm9v"}],"count":"1"}"#;
        assert_eq!(decode_range(empty_value, b"foo").unwrap(), Some(vec![]));
        let del = br#"{"header":{"revision":"3"},"deleted":"1"}"#;
        assert_eq!(decode_answer(del).unwrap().deleted, 1);
        assert_eq!(decode_answer(br#"{"deleted":2}"#).unwrap().deleted, 2);
        assert_eq!(decode_answer(b"{}").unwrap(), GatewayAnswer::default());
    }

    #[test]
    fn malformed_answers_are_errors() {
        let cases: [&[u8]; 14] = [
            b"",
            b"not json",
            b"[]",
            b"\"x\"",
            br#"{"kvs":"x"}"#,
            br#"{"kvs":[1]}"#,
            br#"{"kvs":[{"key":"!!","value":"YmFy"}]}"#,
            br#"{"kvs":[{"key":"Zm9v","value":"Y"}]}"#,
            br#"{"kvs":[{"key":"Zm9v","value":7}]}"#,
            br#"{"deleted":"x"}"#,
            br#"{"deleted":-1}"#,
            br#"{"deleted":[]}"#,
            br#"{"error":{"grpc_code":14,"message":"etcdserver: no leader"}}"#,
            b"{\"kvs\":[{\"key\":\"Zm9v\",\"value\":\"YmFy\"}",
        ];
        for c in cases {
            assert!(
                decode_answer(c).is_err(),
                "{:?}",
                String::from_utf8_lossy(c)
            );
        }
        let other = br#"{"kvs":[{"key":"YmFy","value":"YmFy"}]}"#;
        let e = decode_range(other, b"foo").unwrap_err();
        assert!(e.contains("other keys"), "{e}");
        let e = decode_answer(br#"{"error":{"message":"etcdserver: no leader"}}"#).unwrap_err();
        assert!(e.contains("no leader"), "{e}");
        let deep = "[".repeat(100_000);
        assert!(decode_answer(deep.as_bytes()).is_err());
    }

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"mooncake/"), b"mooncake0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    }

    /// A fake gateway: answers each connection with the next canned response (the last one
    /// repeats) and records the request lines.
    struct Fake {
        port: u16,
        seen: Arc<Mutex<Vec<String>>>,
    }

    fn fake(responses: Vec<Vec<u8>>) -> Fake {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let log = seen.clone();
        std::thread::spawn(move || {
            for (i, s) in l.incoming().enumerate() {
                let Ok(mut s) = s else { continue };
                let mut raw = Vec::new();
                let mut buf = [0u8; 4096];
                // Read the head and the Content-Length body.
                loop {
                    let n = s.read(&mut buf).unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    raw.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&raw).into_owned();
                    if let Some(p) = text.find("\r\n\r\n") {
                        let len: usize = text
                            .lines()
                            .find_map(|l| l.strip_prefix("Content-Length: "))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if raw.len() >= p + 4 + len {
                            break;
                        }
                    }
                }
                let text = String::from_utf8_lossy(&raw).into_owned();
                log.lock()
                    .unwrap()
                    .push(text.lines().next().unwrap_or("").to_string());
                let r = &responses[i.min(responses.len() - 1)];
                let _ = s.write_all(r);
            }
        });
        Fake { port, seen }
    }

    fn http(status: &str, body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    fn store_at(ports: &[u16]) -> EtcdStore {
        EtcdStore::new(
            ports
                .iter()
                .map(|&port| Endpoint {
                    host: "127.0.0.1".into(),
                    port,
                })
                .collect(),
        )
    }

    fn dead_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn malformed_gateway_answers_are_errors_not_panics() {
        let bodies = [
            http("200 OK", "garbage"),
            http("200 OK", r#"{"kvs":[{"key":"%%%","value":"YmFy"}]}"#),
            http("200 OK", r#"{"kvs":[{"key":"Zm9v","value":{}}]}"#),
            http("200 OK", "[1,2,3]"),
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"kvs\":".to_vec(),
            b"SSH-2.0-OpenSSH\r\n\r\n".to_vec(),
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
            Vec::new(),
        ];
        for body in bodies {
            let f = fake(vec![body.clone()]);
            let s = store_at(&[f.port]);
            let e = s.get("foo").unwrap_err();
            assert!(
                matches!(e, MetadataError::Malformed { .. }),
                "{:?}: {e}",
                String::from_utf8_lossy(&body)
            );
            assert_eq!(e.code(), crate::TeError::MalformedJson);
            assert!(s.put("foo", b"x").is_err());
            assert!(s.remove("foo").is_err());
        }
    }

    #[test]
    fn status_errors_carry_the_gateway_message() {
        let f = fake(vec![http(
            "400 Bad Request",
            r#"{"error":"etcdserver: key is not provided","message":"etcdserver: key is not provided","code":3}"#,
        )]);
        let e = store_at(&[f.port]).get("k").unwrap_err();
        match &e {
            MetadataError::Status { status, body, .. } => {
                assert_eq!(*status, 400);
                assert_eq!(body, "etcdserver: key is not provided");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(e.code(), crate::TeError::Metadata);
    }

    #[test]
    fn old_gateway_root_is_found_and_remembered() {
        let not_found = http("404 Not Found", "404 page not found");
        let hit = http("200 OK", r#"{"kvs":[{"key":"aw==","value":"dg=="}]}"#);
        let f = fake(vec![not_found, hit]);
        let s = store_at(&[f.port]);
        assert_eq!(s.get("k").unwrap(), Some(b"v".to_vec()));
        assert_eq!(s.get("k").unwrap(), Some(b"v".to_vec()));
        let seen = f.seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            [
                "POST /v3/kv/range HTTP/1.1",
                "POST /v3beta/kv/range HTTP/1.1",
                "POST /v3beta/kv/range HTTP/1.1",
            ]
        );
        // A server with neither root is not an etcd gateway.
        let f = fake(vec![http("404 Not Found", "")]);
        let e = store_at(&[f.port]).get("k").unwrap_err();
        assert!(e.to_string().contains("no etcd v3 JSON gateway"), "{e}");
    }

    #[test]
    fn endpoints_fail_over_and_the_answering_one_is_remembered() {
        let dead = dead_port();
        let unavailable = fake(vec![http(
            "503 Service Unavailable",
            r#"{"message":"etcdserver: no leader"}"#,
        )]);
        let good = fake(vec![http("200 OK", r#"{"header":{}}"#)]);
        let s = store_at(&[dead, unavailable.port, good.port]);
        s.put("k", b"v").unwrap();
        s.put("k", b"v").unwrap();
        assert_eq!(unavailable.seen.lock().unwrap().len(), 1);
        assert_eq!(good.seen.lock().unwrap().len(), 2);
        // All down: one error naming every endpoint.
        let (d1, d2) = (dead_port(), dead_port());
        let e = store_at(&[d1, d2]).get("k").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&format!("127.0.0.1:{d1}")) && text.contains(&format!("127.0.0.1:{d2}")),
            "{text}"
        );
        assert_eq!(e.code(), crate::TeError::Socket);
        // A 4xx is final: the next endpoint is not asked.
        let bad = fake(vec![http("400 Bad Request", r#"{"message":"no"}"#)]);
        let spare = fake(vec![http("200 OK", "{}")]);
        assert!(store_at(&[bad.port, spare.port]).get("k").is_err());
        assert!(spare.seen.lock().unwrap().is_empty());
    }
}
