//! Fuzzes the master's HTTP metadata server (`controlplane::http::metadata`) the way a peer
//! reaches it: each input is a sequence of requests (method, raw query string, body) driven
//! through the real axum `Router` in-process, against a fresh store.
//!
//! Nothing may panic, and every answer must be the one the documented protocol gives, checked
//! against a `HashMap` model: 400 for a missing, empty or oversized key, 404 for an absent key,
//! the stored bytes for a GET, the `rpc_meta` write-once rule for PUT, 405 for other methods.
//!
//! Input layout, repeated: `op` (1 byte), `query_len` (1 byte), `query_len` bytes of query
//! string, `body_len` (2 bytes LE), `body_len` bytes of body. A short tail is used as is.
#![no_main]

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use controlplane::http::metadata::{metadata_router, MetadataStore, MAX_KEY_BYTES};
use http::{Method, Request, StatusCode};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime")
    })
}

/// What the protocol promises for one request, given the model.
fn expected(
    model: &mut HashMap<String, Vec<u8>>,
    method: &Method,
    query: &str,
    body: &[u8],
) -> (StatusCode, Vec<u8>) {
    let bad = |m: &str| (StatusCode::BAD_REQUEST, m.as_bytes().to_vec());
    let ok = |m: &str| (StatusCode::OK, m.as_bytes().to_vec());
    let not_found = (StatusCode::NOT_FOUND, b"metadata not found".to_vec());
    if ![Method::GET, Method::PUT, Method::DELETE].contains(method) {
        return (StatusCode::METHOD_NOT_ALLOWED, Vec::new());
    }
    // A repeated `key` keeps the last one, as a map built in order does.
    let key = form_urlencoded::parse(query.as_bytes())
        .filter(|(name, _)| name == "key")
        .last()
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default();
    if key.is_empty() {
        return bad("Missing key parameter");
    }
    if key.len() > MAX_KEY_BYTES {
        let message = format!(
            "metadata key too long: {} bytes, at most {MAX_KEY_BYTES}",
            key.len()
        );
        return (StatusCode::BAD_REQUEST, message.into_bytes());
    }
    match *method {
        Method::GET => match model.get(&key) {
            Some(value) => (StatusCode::OK, value.clone()),
            None => not_found,
        },
        Method::PUT => match model.get(&key) {
            Some(old) if key.contains("rpc_meta") && old == body => ok("metadata unchanged"),
            Some(_) if key.contains("rpc_meta") => bad("Duplicate rpc_meta key not allowed"),
            _ => {
                model.insert(key, body.to_vec());
                ok("metadata updated")
            }
        },
        _ => match model.remove(&key) {
            Some(_) => ok("metadata deleted"),
            None => not_found,
        },
    }
}

fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = data.split_at(n.min(data.len()));
    *data = tail;
    head
}

fuzz_target!(|data: &[u8]| {
    let store = Arc::new(MetadataStore::new());
    let router = metadata_router(store.clone());
    let mut model: HashMap<String, Vec<u8>> = HashMap::new();
    let mut rest = data;
    for _ in 0..32 {
        let Some((&op, tail)) = rest.split_first() else {
            break;
        };
        rest = tail;
        let query_len = take(&mut rest, 1).first().copied().unwrap_or(0) as usize;
        let query = String::from_utf8_lossy(take(&mut rest, query_len)).into_owned();
        let body_len = match take(&mut rest, 2) {
            [lo, hi] => u16::from_le_bytes([*lo, *hi]) as usize,
            _ => 0,
        };
        let body = take(&mut rest, body_len).to_vec();
        let (method, path) = match op % 6 {
            0 => (Method::GET, "/metadata"),
            1 => (Method::PUT, "/metadata"),
            2 => (Method::DELETE, "/metadata"),
            3 => (Method::POST, "/metadata"),
            4 => (Method::PATCH, "/metadata"),
            _ => (Method::GET, "/health"),
        };
        let uri = if query.is_empty() && op & 0x80 != 0 {
            path.to_string()
        } else {
            format!("{path}?{query}")
        };
        // A query the URI grammar refuses never reaches the server (hyper rejects the line);
        // the server sees the query as the URI parser splits it (a `#` starts a fragment).
        let Ok(uri) = uri.parse::<http::Uri>() else {
            continue;
        };
        let query = uri.query().unwrap_or("").to_string();
        let Ok(request) = Request::builder()
            .method(method.clone())
            .uri(uri.clone())
            .body(Body::from(body.clone()))
        else {
            continue;
        };
        let response = runtime()
            .block_on(router.clone().oneshot(request))
            .expect("the router is infallible");
        let status = response.status();
        let got = runtime()
            .block_on(axum::body::to_bytes(response.into_body(), usize::MAX))
            .expect("an in-memory body");
        if path == "/health" {
            assert_eq!((status, &got[..]), (StatusCode::OK, &b"OK"[..]));
            continue;
        }
        let (want_status, want_body) = expected(&mut model, &method, &query, &body);
        assert_eq!(status, want_status, "{method} {uri:?}");
        if want_status != StatusCode::METHOD_NOT_ALLOWED {
            assert_eq!(&got[..], &want_body[..], "{method} {uri:?}");
        }
    }
    assert_eq!(store.len(), model.len(), "store and model disagree");
    for (key, value) in &model {
        assert_eq!(store.get(key).as_deref(), Some(&value[..]), "{key:?}");
    }
});
