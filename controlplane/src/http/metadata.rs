//! The HTTP metadata server: the store the transfer engine keeps its segment descriptors in
//! (`mooncake/ram/<segment>`, `mooncake/rpc_meta/<segment>`), as upstream's
//! `http_metadata_server.cpp` serves it.
//!
//! Protocol (bodies are plain text unless noted):
//! - `GET /metadata?key=K` → 200 with the stored bytes (`Content-Type: application/json`), or
//!   404 `metadata not found`;
//! - `PUT /metadata?key=K` → 200 `metadata updated`; for a key containing `rpc_meta`, a second
//!   PUT with the same body → 200 `metadata unchanged`, with a different body → 400
//!   `Duplicate rpc_meta key not allowed` (an `rpc_meta` entry names one live process);
//! - `DELETE /metadata?key=K` → 200 `metadata deleted`, or 404 `metadata not found`;
//! - a missing or empty `key` → 400 `Missing key parameter`; a key longer than
//!   [`MAX_KEY_BYTES`] → 400; a body larger than [`MAX_BODY_BYTES`] → 413;
//! - `GET /health` → 200 `OK`.
//!
//! With a cluster secret (`protocol::auth`), every `/metadata` request needs
//! `Authorization: Bearer <Token::http_bearer>`: `PUT` and `DELETE` change state, and `GET`
//! returns segment descriptors (addresses, and for RDMA the remote keys that let a peer read
//! and write the segment). Without it they get 401 and change and return nothing. `/health`
//! stays open.
//!
//! Keys are percent-decoded from the query string (the transfer engine escapes them with
//! `curl_easy_escape`), so the store holds `mooncake/ram/host:port`, and the master can remove
//! entries in-process through [`MetadataStore`] when a client times out.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use parking_lot::RwLock;
use protocol::auth::{self, Token};
use tokio::net::TcpListener;

/// Largest value accepted by `PUT` (a segment descriptor is a few KiB).
pub const MAX_BODY_BYTES: usize = 16 << 20;
/// Longest key accepted.
pub const MAX_KEY_BYTES: usize = 4096;

/// What a [`MetadataStore::put`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// The key was created or its value replaced.
    Updated,
    /// An `rpc_meta` key was written again with the value it already had.
    Unchanged,
    /// An `rpc_meta` key exists with a different value; nothing changed.
    DuplicateRpcMeta,
}

/// The in-memory key/value store behind the server. Cheap to share: one `RwLock` over a map,
/// values are reference-counted `Bytes` so a `GET` does not copy them.
#[derive(Debug, Default)]
pub struct MetadataStore {
    entries: RwLock<HashMap<String, Bytes>>,
}

impl MetadataStore {
    pub fn new() -> MetadataStore {
        MetadataStore::default()
    }

    pub fn get(&self, key: &str) -> Option<Bytes> {
        self.entries.read().get(key).cloned()
    }

    /// Stores `value` under `key`, refusing to replace an `rpc_meta` key with a different value.
    pub fn put(&self, key: &str, value: impl Into<Bytes>) -> PutOutcome {
        let value = value.into();
        let mut entries = self.entries.write();
        if key.contains("rpc_meta") {
            if let Some(existing) = entries.get(key) {
                return if *existing == value {
                    PutOutcome::Unchanged
                } else {
                    PutOutcome::DuplicateRpcMeta
                };
            }
        }
        entries.insert(key.to_string(), value);
        PutOutcome::Updated
    }

    /// Removes `key`; `false` when it was absent.
    pub fn delete(&self, key: &str) -> bool {
        self.entries.write().remove(key).is_some()
    }

    /// Removes every key for which `matches` holds and returns how many went (for the master's
    /// cleanup of a timed-out client's `mooncake/ram/*` and `mooncake/rpc_meta/*` entries).
    pub fn remove_matching(&self, mut matches: impl FnMut(&str) -> bool) -> usize {
        let mut entries = self.entries.write();
        let before = entries.len();
        entries.retain(|key, _| !matches(key));
        before - entries.len()
    }

    /// Every key, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.entries.read().keys().cloned().collect();
        keys.sort();
        keys
    }

    pub fn len(&self) -> usize {
        self.entries.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.read().is_empty()
    }
}

/// The routes of the metadata server over `store`, with this process's cluster secret
/// (`protocol::auth::process_token`) guarding `/metadata` when one is configured.
pub fn metadata_router(store: Arc<MetadataStore>) -> Router {
    metadata_router_with_auth(store, auth::process_token_or_none())
}

/// [`metadata_router`] with an explicit secret (`None`: open to all).
pub fn metadata_router_with_auth(
    store: Arc<MetadataStore>,
    auth: Option<&'static Token>,
) -> Router {
    let guard = super::BearerGuard {
        auth,
        reads_open: false,
    };
    Router::new()
        .route(
            "/metadata",
            get(get_metadata).put(put_metadata).delete(delete_metadata),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            guard,
            super::require_bearer,
        ))
        .route("/health", get(|| async { "OK" }))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(store)
}

/// Serves the metadata protocol on `listener` until `shutdown` resolves.
pub async fn serve_metadata(
    listener: TcpListener,
    store: Arc<MetadataStore>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    super::serve(listener, metadata_router(store), shutdown).await
}

type Params = Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>;

/// The `key` query parameter, or the 400 response for a missing, empty or oversized one.
fn key_of(params: Params) -> Result<String, (StatusCode, String)> {
    let key = params
        .ok()
        .and_then(|Query(mut map)| map.remove("key"))
        .unwrap_or_default();
    if key.is_empty() {
        return Err((StatusCode::BAD_REQUEST, "Missing key parameter".to_string()));
    }
    if key.len() > MAX_KEY_BYTES {
        let message = format!(
            "metadata key too long: {} bytes, at most {MAX_KEY_BYTES}",
            key.len()
        );
        return Err((StatusCode::BAD_REQUEST, message));
    }
    Ok(key)
}

async fn get_metadata(State(store): State<Arc<MetadataStore>>, params: Params) -> Response {
    let key = match key_of(params) {
        Ok(key) => key,
        Err(rejection) => return rejection.into_response(),
    };
    match store.get(&key) {
        Some(value) => ([(header::CONTENT_TYPE, "application/json")], value).into_response(),
        None => (StatusCode::NOT_FOUND, "metadata not found").into_response(),
    }
}

async fn put_metadata(
    State(store): State<Arc<MetadataStore>>,
    params: Params,
    body: Bytes,
) -> Response {
    let key = match key_of(params) {
        Ok(key) => key,
        Err(rejection) => return rejection.into_response(),
    };
    match store.put(&key, body) {
        PutOutcome::Updated => (StatusCode::OK, "metadata updated").into_response(),
        PutOutcome::Unchanged => (StatusCode::OK, "metadata unchanged").into_response(),
        PutOutcome::DuplicateRpcMeta => (
            StatusCode::BAD_REQUEST,
            "Duplicate rpc_meta key not allowed",
        )
            .into_response(),
    }
}

async fn delete_metadata(State(store): State<Arc<MetadataStore>>, params: Params) -> Response {
    let key = match key_of(params) {
        Ok(key) => key,
        Err(rejection) => return rejection.into_response(),
    };
    if store.delete(&key) {
        (StatusCode::OK, "metadata deleted").into_response()
    } else {
        (StatusCode::NOT_FOUND, "metadata not found").into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::test_client::{request, spawn};

    #[test]
    fn store_put_get_delete() {
        let store = MetadataStore::new();
        assert!(store.is_empty());
        assert_eq!(store.put("mooncake/ram/a", "1"), PutOutcome::Updated);
        assert_eq!(store.put("mooncake/ram/a", "2"), PutOutcome::Updated);
        assert_eq!(store.get("mooncake/ram/a").as_deref(), Some(&b"2"[..]));
        assert_eq!(store.put("mooncake/rpc_meta/a", "x"), PutOutcome::Updated);
        assert_eq!(store.put("mooncake/rpc_meta/a", "x"), PutOutcome::Unchanged);
        assert_eq!(
            store.put("mooncake/rpc_meta/a", "y"),
            PutOutcome::DuplicateRpcMeta
        );
        assert_eq!(store.get("mooncake/rpc_meta/a").as_deref(), Some(&b"x"[..]));
        assert_eq!(store.keys(), vec!["mooncake/ram/a", "mooncake/rpc_meta/a"]);
        assert!(store.delete("mooncake/ram/a"));
        assert!(!store.delete("mooncake/ram/a"));
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn store_remove_matching() {
        let store = MetadataStore::new();
        for key in [
            "mooncake/ram/h:1",
            "mooncake/rpc_meta/h:1",
            "mooncake/ram/h:2",
        ] {
            store.put(key, "{}");
        }
        assert_eq!(store.remove_matching(|k| k.ends_with("/h:1")), 2);
        assert_eq!(store.keys(), vec!["mooncake/ram/h:2"]);
    }

    async fn server() -> (std::net::SocketAddr, Arc<MetadataStore>) {
        let store = Arc::new(MetadataStore::new());
        let addr = spawn(metadata_router(store.clone())).await;
        (addr, store)
    }

    #[tokio::test]
    async fn protocol_over_http() {
        let (addr, store) = server().await;
        let escaped = "/metadata?key=mooncake%2Fram%2F127.0.0.1%3A12345";
        let body = r#"{"name":"127.0.0.1:12345","buffers":[]}"#;
        // (method, path, body, status, response body)
        let steps: &[(&str, &str, &str, u16, &str)] = &[
            ("GET", "/health", "", 200, "OK"),
            ("GET", escaped, "", 404, "metadata not found"),
            ("PUT", escaped, body, 200, "metadata updated"),
            ("GET", escaped, "", 200, body),
            (
                "GET",
                "/metadata?key=mooncake/ram/127.0.0.1:12345",
                "",
                200,
                body,
            ),
            ("PUT", escaped, "{}", 200, "metadata updated"),
            ("GET", escaped, "", 200, "{}"),
            ("DELETE", escaped, "", 200, "metadata deleted"),
            ("DELETE", escaped, "", 404, "metadata not found"),
            ("GET", escaped, "", 404, "metadata not found"),
            (
                "PUT",
                "/metadata?key=mooncake%2Frpc_meta%2Fh%3A1",
                "{\"a\":1}",
                200,
                "metadata updated",
            ),
            (
                "PUT",
                "/metadata?key=mooncake%2Frpc_meta%2Fh%3A1",
                "{\"a\":1}",
                200,
                "metadata unchanged",
            ),
            (
                "PUT",
                "/metadata?key=mooncake%2Frpc_meta%2Fh%3A1",
                "{\"a\":2}",
                400,
                "Duplicate rpc_meta key not allowed",
            ),
            (
                "GET",
                "/metadata?key=mooncake%2Frpc_meta%2Fh%3A1",
                "",
                200,
                "{\"a\":1}",
            ),
            (
                "DELETE",
                "/metadata?key=mooncake%2Frpc_meta%2Fh%3A1",
                "",
                200,
                "metadata deleted",
            ),
            (
                "PUT",
                "/metadata?key=mooncake%2Frpc_meta%2Fh%3A1",
                "{\"a\":2}",
                200,
                "metadata updated",
            ),
            ("GET", "/metadata", "", 400, "Missing key parameter"),
            ("GET", "/metadata?key=", "", 400, "Missing key parameter"),
            (
                "PUT",
                "/metadata?other=1",
                "x",
                400,
                "Missing key parameter",
            ),
            ("DELETE", "/metadata", "", 400, "Missing key parameter"),
        ];
        for &(method, path, body, status, want) in steps {
            let response = request(addr, method, path, body.as_bytes()).await;
            assert_eq!(response.status, status, "{method} {path}: {response:?}");
            assert_eq!(response.text(), want, "{method} {path}");
        }
        assert_eq!(store.keys(), vec!["mooncake/rpc_meta/h:1"]);
    }

    #[tokio::test]
    async fn get_sets_json_content_type() {
        let (addr, store) = server().await;
        store.put("k", "{}");
        let response = request(addr, "GET", "/metadata?key=k", b"").await;
        assert_eq!(response.status, 200);
        assert_eq!(response.header("content-type"), Some("application/json"));
    }

    #[tokio::test]
    async fn limits() {
        let (addr, store) = server().await;
        let too_big = vec![b'x'; MAX_BODY_BYTES + 1];
        let response = request(addr, "PUT", "/metadata?key=big", &too_big).await;
        assert_eq!(response.status, 413);
        let just_fits = vec![b'x'; MAX_BODY_BYTES];
        let response = request(addr, "PUT", "/metadata?key=big", &just_fits).await;
        assert_eq!(response.status, 200);
        assert_eq!(store.get("big").map(|v| v.len()), Some(MAX_BODY_BYTES));

        let long_key = format!("/metadata?key={}", "k".repeat(MAX_KEY_BYTES + 1));
        let response = request(addr, "PUT", &long_key, b"{}").await;
        assert_eq!(response.status, 400);
        assert!(response.text().contains("too long"));
    }

    #[tokio::test]
    async fn unknown_paths_and_methods() {
        let (addr, _) = server().await;
        assert_eq!(request(addr, "GET", "/nope", b"").await.status, 404);
        assert_eq!(
            request(addr, "POST", "/metadata?key=k", b"{}").await.status,
            405
        );
    }

    #[tokio::test]
    async fn serve_metadata_stops_on_shutdown() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_metadata(
            listener,
            Arc::new(MetadataStore::new()),
            async {
                let _ = stopped.await;
            },
        ));
        assert_eq!(request(addr, "GET", "/health", b"").await.status, 200);
        stop.send(()).unwrap();
        let result = tokio::time::timeout(std::time::Duration::from_secs(5), server).await;
        assert!(matches!(result, Ok(Ok(Ok(())))), "{result:?}");
    }
}
