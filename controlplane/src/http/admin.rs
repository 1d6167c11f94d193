//! The admin and metrics HTTP server on `--metrics_port`, a window on the master through
//! [`AdminView`] (upstream `master_admin_service.cpp`). Its only writes are the tenant quota
//! `PUT` and `DELETE`: with a cluster secret set they need `Authorization: Bearer
//! <Token::http_bearer>` (401 and nothing changed without it); every `GET` stays open.
//!
//! Routes (`GET` unless said):
//! - `/metrics`: Prometheus text, `Content-Type: text/plain; version=0.0.4`;
//! - `/metrics/summary`: one line, `role=leader, ha_state=disabled, service_ready=true,
//!   master={keys=N, allocated_bytes=N, capacity_bytes=N, clients=N}`;
//! - `/health`: `{"status":"ok","role":"leader","ha_state":"disabled","service_ready":true}`,
//!   in HA mode also `leader_address`, `view_version`, `etcd_reachable` and
//!   `term_started_unix_ms` (when this master last won an election, 0 if never);
//! - `/role` → `leader` | `standby`; `/ha_status` → `disabled` | `leading` | `standby` |
//!   `lease_unproven` (a leader that cannot prove its etcd lease and does not serve);
//! - `/leader` → `{"present":false}` without HA, else `{"present":bool,
//!   "leader_address":"host:port","view_version":N}` as last read from etcd;
//! - `/query_key?key=K`: 200 `{"success":true,"data":[{buffer_address, size,
//!   transport_endpoint, segment_name, status}]}` or 404
//!   `{"success":false,"error_code":N,"error_message":"NAME"}`;
//! - `/get_all_keys`, `/get_all_segments`: one name per line, each line ending in `\n`;
//! - `/get_segments_detail`: `{"total_segments":N,"segments":[...]}` (fields below);
//! - `/query_segment?segment=S`: `S\nUsed(bytes): U\nCapacity(bytes) : C\n`, 404 when unknown.
//! - `/api/v1/tenant_quotas[?tenant_id=T]`: `GET` the tenants' quota rows, `PUT` with
//!   `{"requested_quota_bytes": N}` to set one, `DELETE` to drop one (`service/quota.rs`);
//!   `{"success":true,"data":...}`, or a status with `{"success":false,"error_code":N,
//!   "error_message":S}` (409 `-1011` without quotas, 404 `-704` for an unknown tenant, 409
//!   `-1702` for one that still holds objects, 400 `-600` for a bad parameter or body).
//! - `POST /api/v1/drain?segment=S[&deadline_sec=N]`: drains segment `S` (`service/drain.rs`,
//!   `docs/fleet.md`): no new allocation at once, its only copies moved elsewhere, unmounted
//!   when done or at the deadline (default 60 s; 0 unmounts at once). 200
//!   `{"success":true}`, 404 `-101` for an unknown segment, 400 `-600` for a bad parameter;
//!   a write, so it needs the bearer token when a cluster secret is set.
//! - `/kv_events/status`: the KV-cache event publisher (`docs/kv-events.md`):
//!   `{"enabled", "endpoint", "backend_id", "queue_capacity", "published_events",
//!   "published_batches", "dropped_events", "non_hash_keys"}`.
//!
//! - `/` and `/ui`: the status page (`status.html`, served from the binary; no build step, no
//!   CDN), which polls `/status.json` every second: the HA role and leader, and, while this
//!   master serves, the cluster at a glance ([`crate::view::ClusterStatus`]).
//!
//! Anything else is 404. Without HA the master is always the leader with its service ready.
//! In HA mode the data routes (`/query_key`, `/get_all_*`, `/get_segments_detail`,
//! `/query_segment`) answer 503 `{"success":false,"error_code":-1010,...}` while this master
//! may not serve: a standby's index is empty or stale, and says nothing about the cluster.

use std::future::Future;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::FromRef;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use protocol::auth::{self, Token};
use protocol::ReplicaStatus;
use serde::Deserialize;
use serde_json::json;
use tokio::net::TcpListener;

use crate::ha::HaState;
use crate::view::{AdminView, QuotaAnswer, QuotaRefusal, SegmentDetail};

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4";
const JSON: &str = "application/json; charset=utf-8";
const ROLE: &str = "leader";
const HA_STATE: &str = "disabled";

type View = Arc<dyn AdminView>;
type Ha = Option<Arc<HaState>>;

/// What the handlers see: the master's view and, in HA mode, its role.
#[derive(Clone)]
struct Admin {
    view: View,
    ha: Ha,
}

impl FromRef<Admin> for View {
    fn from_ref(a: &Admin) -> View {
        a.view.clone()
    }
}

impl FromRef<Admin> for Ha {
    fn from_ref(a: &Admin) -> Ha {
        a.ha.clone()
    }
}

/// The routes of the admin server over `view` (a master without HA).
pub fn admin_router(view: View) -> Router {
    admin_router_ha(view, None)
}

/// The routes of the admin server over `view`, reporting the HA role in `ha`, with this
/// process's cluster secret (`protocol::auth::process_token`) guarding the writes.
pub fn admin_router_ha(view: View, ha: Ha) -> Router {
    admin_router_with_auth(view, ha, auth::process_token_or_none())
}

/// [`admin_router_ha`] with an explicit secret (`None`: writes are open).
pub fn admin_router_with_auth(view: View, ha: Ha, auth: Option<&'static Token>) -> Router {
    let data = Router::new()
        .route("/query_key", get(query_key))
        .route("/get_all_keys", get(all_keys))
        .route("/get_all_segments", get(all_segments))
        .route("/get_segments_detail", get(segments_detail))
        .route("/query_segment", get(query_segment))
        .route(
            "/api/v1/tenant_quotas",
            get(get_quotas).put(put_quota).delete(delete_quota),
        )
        .route("/api/v1/drain", axum::routing::post(drain_segment))
        .route_layer(axum::middleware::from_fn_with_state(
            ha.clone(),
            require_serving,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            super::BearerGuard {
                auth,
                reads_open: true,
            },
            super::require_bearer,
        ));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/metrics/summary", get(metrics_summary))
        .route("/health", get(health))
        .route("/kv_events/status", get(kv_events_status))
        .route("/role", get(role))
        .route("/ha_status", get(ha_status))
        .route("/leader", get(leader))
        .route("/", get(status_page))
        .route("/ui", get(status_page))
        .route("/status.json", get(status_json))
        .merge(data)
        .with_state(Admin { view, ha })
}

/// Serves the admin routes on `listener` until `shutdown` resolves.
pub async fn serve_admin(
    listener: TcpListener,
    view: View,
    ha: Ha,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    super::serve(listener, admin_router_ha(view, ha), shutdown).await
}

async fn require_serving(
    State(ha): State<Ha>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match ha {
        Some(h) if !h.may_serve() => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({
                "success": false,
                "error_code": protocol::ErrorCode::UnavailableInCurrentStatus.code(),
                "error_message": "UNAVAILABLE_IN_CURRENT_STATUS: this master is not the serving leader",
                "leader_address": h.status().leader_address,
            }),
        ),
        _ => next.run(req).await,
    }
}

/// (role, ha_state, service_ready) of this master.
fn role_of(ha: &Ha) -> (&'static str, &'static str, bool) {
    match ha {
        None => (ROLE, HA_STATE, true),
        Some(h) => {
            let st = h.status();
            let state = match (st.role, st.serving) {
                ("leader", true) => "leading",
                ("leader", false) => "lease_unproven",
                _ => "standby",
            };
            (st.role, state, st.serving)
        }
    }
}

async fn role(State(ha): State<Ha>) -> &'static str {
    role_of(&ha).0
}

async fn ha_status(State(ha): State<Ha>) -> &'static str {
    role_of(&ha).1
}

async fn leader(State(ha): State<Ha>) -> Response {
    let body = match ha {
        None => json!({"present": false}),
        Some(h) => {
            let st = h.status();
            json!({
                "present": st.leader_address.is_some(),
                "leader_address": st.leader_address,
                "view_version": st.view_version,
            })
        }
    };
    json_response(StatusCode::OK, body)
}

/// The status page: static HTML and a small script that polls `/status.json`.
const STATUS_PAGE: &str = include_str!("status.html");

async fn status_page() -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        STATUS_PAGE,
    )
        .into_response()
}

async fn status_json(State(view): State<View>, State(ha): State<Ha>) -> Response {
    let (_, state, serving) = role_of(&ha);
    let ha_part = match &ha {
        None => json!({"enabled": false, "state": state, "serving": true}),
        Some(h) => {
            let st = h.status();
            json!({
                "enabled": true,
                "state": state,
                "serving": serving,
                "leader_address": st.leader_address,
                "view_version": st.view_version,
                "etcd_reachable": st.etcd_reachable,
            })
        }
    };
    // A standby's index is empty or stale: it shows only its role.
    let cluster = if serving {
        whole_index(move || serde_json::to_value(view.status()).unwrap_or_default())
            .await
            .unwrap_or_default()
    } else {
        serde_json::Value::Null
    };
    json_response(StatusCode::OK, json!({"ha": ha_part, "cluster": cluster}))
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response {
    (status, [(header::CONTENT_TYPE, JSON)], body.to_string()).into_response()
}

fn text_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, PROMETHEUS_TEXT)], body).into_response()
}

async fn metrics(State(view): State<View>) -> Response {
    text_response(StatusCode::OK, view.render_metrics())
}

async fn metrics_summary(State(view): State<View>, State(ha): State<Ha>) -> Response {
    let text = view.render_metrics();
    let value = |name: &str| metric_value(&text, name).unwrap_or_else(|| "0".to_string());
    let (role, ha_state, ready) = role_of(&ha);
    let summary = format!(
        "role={role}, ha_state={ha_state}, service_ready={ready}, master={{keys={}, \
         allocated_bytes={}, capacity_bytes={}, clients={}}}",
        value("master_key_count"),
        value("master_allocated_bytes"),
        value("master_total_capacity_bytes"),
        value("master_active_clients"),
    );
    text_response(StatusCode::OK, summary)
}

/// The value of the first unlabelled sample of `name` in Prometheus text.
fn metric_value(text: &str, name: &str) -> Option<String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let mut parts = line.split_whitespace();
            (parts.next()? == name).then(|| parts.next().map(str::to_string))?
        })
}

/// The KV-cache event publisher: on or off, its endpoint and counters (`docs/kv-events.md`).
async fn kv_events_status(State(view): State<View>) -> Response {
    json_response(StatusCode::OK, json!(view.kv_events()))
}

async fn health(State(ha): State<Ha>) -> Response {
    let (role, ha_state, ready) = role_of(&ha);
    let mut body =
        json!({"status": "ok", "role": role, "ha_state": ha_state, "service_ready": ready});
    if let Some(h) = &ha {
        let st = h.status();
        body["leader_address"] = json!(st.leader_address);
        body["view_version"] = json!(st.view_version);
        body["etcd_reachable"] = json!(st.etcd_reachable);
        body["term_started_unix_ms"] = json!(st.term_started_unix_ms);
    }
    json_response(StatusCode::OK, body)
}

#[derive(Deserialize)]
struct KeyQuery {
    #[serde(default)]
    key: String,
}

async fn query_key(
    State(view): State<View>,
    query: Result<Query<KeyQuery>, QueryRejection>,
) -> Response {
    let key = query.map(|Query(q)| q.key).unwrap_or_default();
    match view.query_key(&key) {
        Ok(replicas) => {
            let data: Vec<_> = replicas
                .iter()
                .map(|r| {
                    json!({
                        "buffer_address": r.buffer_address,
                        "size": r.size,
                        "transport_endpoint": r.transport_endpoint,
                        "segment_name": r.segment_name,
                        "status": replica_status_name(r.status),
                    })
                })
                .collect();
            json_response(StatusCode::OK, json!({"success": true, "data": data}))
        }
        Err(code) => json_response(
            StatusCode::NOT_FOUND,
            json!({"success": false, "error_code": code.code(), "error_message": code.name()}),
        ),
    }
}

/// Upstream's spelling of a replica status.
fn replica_status_name(status: ReplicaStatus) -> &'static str {
    match status {
        ReplicaStatus::Undefined => "UNDEFINED",
        ReplicaStatus::Initialized => "INITIALIZED",
        ReplicaStatus::Processing => "PROCESSING",
        ReplicaStatus::Complete => "COMPLETE",
        ReplicaStatus::Removed => "REMOVED",
        ReplicaStatus::Failed => "FAILED",
    }
}

fn lines(items: Vec<String>) -> String {
    let mut body = String::with_capacity(items.iter().map(|s| s.len() + 1).sum());
    for item in items {
        body.push_str(&item);
        body.push('\n');
    }
    body
}

async fn all_keys(State(view): State<View>) -> Response {
    match whole_index(move || lines(view.all_keys())).await {
        Ok(text) => text_response(StatusCode::OK, text),
        Err(e) => e,
    }
}

async fn all_segments(State(view): State<View>) -> Response {
    match whole_index(move || lines(view.all_segments())).await {
        Ok(text) => text_response(StatusCode::OK, text),
        Err(e) => e,
    }
}

async fn segments_detail(State(view): State<View>) -> Response {
    let segments = whole_index(move || {
        let all: Vec<_> = view.segments_detail().iter().map(segment_json).collect();
        json!({"total_segments": all.len(), "segments": all})
    });
    match segments.await {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(e) => e,
    }
}

/// Reads of the whole index (every key, every segment, the status page's cluster) in flight
/// at once; more wait their turn, so a request loop cannot multiply the master's memory.
const WHOLE_INDEX_READS: usize = 2;
static WHOLE_INDEX: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(WHOLE_INDEX_READS);

/// Runs `read`, which walks the index under the master's lock, on tokio's blocking pool
/// (an async worker the RPC shares must not wait on that lock), at most
/// [`WHOLE_INDEX_READS`] at a time. A 500 if the read panicked.
async fn whole_index<T: Send + 'static>(
    read: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Response> {
    let _turn = WHOLE_INDEX.acquire().await;
    tokio::task::spawn_blocking(read).await.map_err(|e| {
        text_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading the index failed: {e}"),
        )
    })
}

fn segment_json(s: &SegmentDetail) -> serde_json::Value {
    let usage_percent = if s.allocator_capacity_bytes > 0 {
        s.allocator_used_bytes as f64 / s.allocator_capacity_bytes as f64 * 100.0
    } else {
        0.0
    };
    json!({
        "segment_name": s.segment_name,
        "segment_id": s.segment_id,
        "client_id": s.client_id,
        "base_address": format!("{:#x}", s.base_address),
        "size_bytes": s.size_bytes,
        "size_human": size_human(s.size_bytes),
        "te_endpoint": s.te_endpoint,
        "protocol": s.protocol,
        "status": s.status,
        "allocator_used_bytes": s.allocator_used_bytes,
        "allocator_capacity_bytes": s.allocator_capacity_bytes,
        "allocator_usage_percent": usage_percent,
    })
}

/// Size in GiB as upstream's `ostream << double` prints it (`%g`: six significant digits,
/// scientific below 1e-4 and from 1e6).
fn size_human(bytes: u64) -> String {
    format!("{} GiB", format_g(bytes as f64 / (1u64 << 30) as f64))
}

/// C's `%g` with the default precision of 6.
fn format_g(value: f64) -> String {
    const PRECISION: i32 = 6;
    if value == 0.0 || !value.is_finite() {
        return format!("{value}");
    }
    let trim = |text: String| -> String {
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text
        }
    };
    let scientific = format!("{:.*e}", (PRECISION - 1) as usize, value);
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if !(-4..PRECISION).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa.to_string()), exponent.abs())
    } else {
        let decimals = (PRECISION - 1 - exponent).max(0) as usize;
        trim(format!("{value:.decimals$}"))
    }
}

#[derive(Deserialize)]
struct SegmentQuery {
    #[serde(default)]
    segment: String,
}

async fn query_segment(
    State(view): State<View>,
    query: Result<Query<SegmentQuery>, QueryRejection>,
) -> Response {
    let name = query.map(|Query(q)| q.segment).unwrap_or_default();
    let found = view
        .segments_detail()
        .into_iter()
        .find(|s| s.segment_name == name);
    match found {
        Some(s) => text_response(
            StatusCode::OK,
            format!(
                "{name}\nUsed(bytes): {}\nCapacity(bytes) : {}\n",
                s.allocator_used_bytes, s.allocator_capacity_bytes
            ),
        ),
        None => text_response(
            StatusCode::NOT_FOUND,
            format!("Failed to query segment: no segment named \"{name}\"\n"),
        ),
    }
}

#[derive(Deserialize)]
struct DrainQuery {
    #[serde(default)]
    segment: String,
    deadline_sec: Option<u64>,
}

/// `POST /api/v1/drain?segment=S[&deadline_sec=N]` (module docs).
async fn drain_segment(
    State(view): State<View>,
    query: Result<Query<DrainQuery>, QueryRejection>,
) -> Response {
    let q = match query {
        Ok(Query(q)) if !q.segment.is_empty() => q,
        _ => {
            let code = protocol::ErrorCode::InvalidParams;
            return json_response(
                StatusCode::BAD_REQUEST,
                json!({"success": false, "error_code": code.code(), "error_message": code.name()}),
            );
        }
    };
    let deadline_ms = q
        .deadline_sec
        .map_or(crate::limits::DRAIN_DEADLINE_MS_DEFAULT, |s| {
            s.saturating_mul(1000)
        });
    match view.drain_segment(&q.segment, deadline_ms) {
        Ok(()) => json_response(StatusCode::OK, json!({"success": true})),
        Err(code) => json_response(
            StatusCode::NOT_FOUND,
            json!({"success": false, "error_code": code.code(), "error_message": code.name()}),
        ),
    }
}

#[derive(Deserialize)]
struct TenantQuery {
    tenant_id: Option<String>,
}

/// The `tenant_id` parameter of a request's query string (read as axum's `Query` reads it):
/// `Ok(None)` when absent or the query does not parse, refused when empty or not a valid
/// tenant name (upstream's 400). Pure, for the `admin_query` fuzz target.
pub fn tenant_param(query: Option<&str>) -> Result<Option<String>, QuotaRefusal> {
    let parsed = serde_urlencoded::from_str::<TenantQuery>(query.unwrap_or_default()).ok();
    match parsed.and_then(|q| q.tenant_id) {
        Some(t) if !protocol::tenant::valid_tenant(&t) => Err(bad_tenant()),
        t => Ok(t),
    }
}

fn bad_tenant() -> QuotaRefusal {
    QuotaRefusal::new(
        400,
        protocol::ErrorCode::InvalidParams,
        "Missing or invalid tenant_id",
    )
}

fn required_tenant(query: Option<&str>) -> Result<String, QuotaRefusal> {
    tenant_param(query)?.ok_or_else(bad_tenant)
}

fn quota_refused(r: QuotaRefusal) -> Response {
    json_response(
        StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        json!({"success": false, "error_code": r.code.code(), "error_message": r.message}),
    )
}

fn quota_answer(a: QuotaAnswer) -> Response {
    match a {
        Ok(data) => json_response(StatusCode::OK, json!({"success": true, "data": data})),
        Err(r) => quota_refused(r),
    }
}

/// `GET /api/v1/tenant_quotas[?tenant_id=T]` (`service/quota.rs`).
async fn get_quotas(
    State(view): State<View>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    match tenant_param(query.as_deref()) {
        Ok(t) => quota_answer(view.tenant_quotas(t.as_deref())),
        Err(r) => quota_refused(r),
    }
}

/// `PUT /api/v1/tenant_quotas?tenant_id=T` with `{"requested_quota_bytes": N}`.
async fn put_quota(
    State(view): State<View>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    body: axum::body::Bytes,
) -> Response {
    let tenant = match required_tenant(query.as_deref()) {
        Ok(t) => t,
        Err(r) => return quota_refused(r),
    };
    let bytes = match quota_body(&body) {
        Ok(n) => n,
        Err(why) => {
            return quota_refused(QuotaRefusal::new(
                400,
                protocol::ErrorCode::InvalidParams,
                format!("Invalid JSON body: {why}"),
            ))
        }
    };
    quota_answer(off_worker(move || view.set_tenant_quota(&tenant, bytes)).await)
}

/// The bytes a quota `PUT` body `{"requested_quota_bytes": N}` asks for, or why it cannot be
/// read. Absent is 0, which the range check refuses, as upstream. Pure, for the
/// `admin_query` fuzz target.
pub fn quota_body(body: &[u8]) -> Result<u64, String> {
    let doc: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let Some(fields) = doc.as_object() else {
        return Err("expected a JSON object".into());
    };
    match fields.get("requested_quota_bytes") {
        None => Ok(0),
        Some(v) => v.as_u64().ok_or_else(|| "Failed to parse number".into()),
    }
}

/// Runs a quota change on tokio's blocking pool: it rewrites and fsyncs the policy file under
/// the master's lock, which must not stall an async worker the RPC shares.
async fn off_worker(change: impl FnOnce() -> QuotaAnswer + Send + 'static) -> QuotaAnswer {
    tokio::task::spawn_blocking(change)
        .await
        .unwrap_or_else(|e| {
            Err(QuotaRefusal::new(
                500,
                protocol::ErrorCode::InternalError,
                format!("quota change failed: {e}"),
            ))
        })
}

/// `DELETE /api/v1/tenant_quotas?tenant_id=T`.
async fn delete_quota(
    State(view): State<View>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    match required_tenant(query.as_deref()) {
        Ok(t) => quota_answer(off_worker(move || view.delete_tenant_quota(&t)).await),
        Err(r) => quota_refused(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::test_client::{request, spawn};
    use protocol::{ErrorCode, ReplicaDescriptor};

    /// A fixed master: one key on one segment.
    struct FakeView;

    impl AdminView for FakeView {
        fn query_key(&self, key: &str) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
            match key {
                "mooncake/k:1" => Ok(vec![ReplicaDescriptor {
                    status: ReplicaStatus::Complete,
                    medium: protocol::ReplicaMedium::Memory,
                    segment_name: "127.0.0.1:12345".into(),
                    transport_endpoint: "127.0.0.1:12346".into(),
                    buffer_address: 0x7f00_0000_1000,
                    size: 4096,
                    version: protocol::Version::ZERO,
                }]),
                "" => Err(ErrorCode::InvalidKey),
                _ => Err(ErrorCode::ObjectNotFound),
            }
        }

        fn all_keys(&self) -> Vec<String> {
            vec!["mooncake/k:1".into(), "k2".into()]
        }

        fn all_segments(&self) -> Vec<String> {
            vec!["127.0.0.1:12345".into()]
        }

        fn segments_detail(&self) -> Vec<SegmentDetail> {
            vec![SegmentDetail {
                segment_name: "127.0.0.1:12345".into(),
                segment_id: "0000000000000001-0000000000000002".into(),
                client_id: "0000000000000003-0000000000000004".into(),
                base_address: 0x7f00_0000_0000,
                size_bytes: 1 << 30,
                te_endpoint: "127.0.0.1:12346".into(),
                protocol: "tcp".into(),
                status: "OK".into(),
                allocator_used_bytes: 1 << 28,
                allocator_capacity_bytes: 1 << 30,
            }]
        }

        fn status(&self) -> crate::view::ClusterStatus {
            crate::view::ClusterStatus {
                keys: 2,
                capacity_bytes: 1 << 30,
                allocated_bytes: 1 << 28,
                ..Default::default()
            }
        }

        fn render_metrics(&self) -> String {
            "# HELP master_key_count Keys\n# TYPE master_key_count gauge\nmaster_key_count 2\n\
             master_allocated_bytes 4096\nmaster_total_capacity_bytes 1073741824\n"
                .into()
        }
    }

    async fn server() -> std::net::SocketAddr {
        spawn(admin_router(Arc::new(FakeView))).await
    }

    async fn get_json(addr: std::net::SocketAddr, path: &str) -> (u16, serde_json::Value) {
        let response = request(addr, "GET", path, b"").await;
        assert_eq!(response.header("content-type"), Some(JSON), "{path}");
        (
            response.status,
            serde_json::from_slice(&response.body).expect("JSON body"),
        )
    }

    #[tokio::test]
    async fn tenant_quota_routes() {
        async fn call(
            addr: std::net::SocketAddr,
            method: &str,
            path: &str,
            body: &str,
        ) -> (u16, serde_json::Value) {
            let r = request(addr, method, path, body.as_bytes()).await;
            (
                r.status,
                serde_json::from_slice(&r.body).expect("JSON body"),
            )
        }
        fn refusal(code: i32, message: &str) -> serde_json::Value {
            json!({"success": false, "error_code": code, "error_message": message})
        }
        // Without quotas: unavailable in this mode, after the parameter and body checks.
        let addr = server().await;
        let q = "/api/v1/tenant_quotas";
        assert_eq!(
            call(addr, "GET", q, "").await,
            (409, refusal(-1011, "UNAVAILABLE_IN_CURRENT_MODE"))
        );
        let put = format!("{q}?tenant_id=t1");
        assert_eq!(
            call(addr, "PUT", &put, r#"{"requested_quota_bytes": 5}"#).await,
            (409, refusal(-1011, "UNAVAILABLE_IN_CURRENT_MODE"))
        );
        assert_eq!(
            call(addr, "PUT", q, r#"{"requested_quota_bytes": 5}"#).await,
            (400, refusal(-600, "Missing or invalid tenant_id"))
        );
        assert_eq!(
            call(addr, "DELETE", &format!("{q}?tenant_id="), "").await,
            (400, refusal(-600, "Missing or invalid tenant_id"))
        );
        let (status, body) = call(addr, "PUT", &put, r#"{"requested_quota_bytes": "12"}"#).await;
        assert_eq!(
            (status, &body["error_message"]),
            (400, &json!("Invalid JSON body: Failed to parse number"))
        );
        let (status, body) = call(addr, "PUT", &put, "{").await;
        assert_eq!(status, 400);
        assert!(body["error_message"]
            .as_str()
            .unwrap()
            .starts_with("Invalid JSON body: "));

        // With a policy file, on a real master.
        let dir = crate::model::ScratchDir::new("quota-http");
        let path = dir.0.join("q.yaml");
        std::fs::write(
            &path,
            "version: 1\ntenants:\n  - name: t1\n    quota: 1MB\n",
        )
        .unwrap();
        let policy = crate::service::quota::QuotaPolicy::load(&path).unwrap();
        let cfg = crate::service::ServiceConfig {
            multi_tenants: true,
            tenant_quota: Some(policy),
            ..crate::model::cfg()
        };
        let clock = Arc::new(crate::clock::SystemClock::default());
        let svc = crate::service::MasterService::new(cfg, clock);
        let addr = spawn(admin_router(Arc::new(svc))).await;
        let row = |t: &str, requested: u64| {
            json!({"tenant_id": t, "requested_quota_bytes": requested, "effective_quota_bytes": 0,
                   "charged_bytes": 0, "admission_closed": false, "over_quota": false,
                   "has_explicit_policy": true})
        };
        assert_eq!(
            call(addr, "GET", q, "").await,
            (200, json!({"success": true, "data": [row("t1", 1 << 20)]}))
        );
        let put2 = format!("{q}?tenant_id=t2");
        assert_eq!(
            call(addr, "PUT", &put2, r#"{"requested_quota_bytes": 2048}"#).await,
            (200, json!({"success": true, "data": row("t2", 2048)}))
        );
        assert_eq!(
            call(addr, "PUT", &put2, r#"{"quota": "2MB"}"#).await,
            (
                400,
                refusal(-600, "Tenant quota must be in [1, 2^63 - 1] bytes")
            )
        );
        assert_eq!(
            call(addr, "GET", &put2, "").await,
            (200, json!({"success": true, "data": row("t2", 2048)}))
        );
        assert_eq!(
            call(addr, "DELETE", &put2, "").await,
            (200, json!({"success": true, "data": null}))
        );
        assert_eq!(
            call(addr, "DELETE", &put2, "").await,
            (404, refusal(-704, "OBJECT_NOT_FOUND"))
        );
        assert_eq!(
            call(addr, "GET", &put2, "").await,
            (404, refusal(-704, "OBJECT_NOT_FOUND"))
        );
        let saved = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            saved,
            "version: 1\n\ntenants:\n  - name: \"t1\"\n    quota: 1048576\n"
        );
    }

    #[tokio::test]
    async fn ha_roles_and_a_standby_refuses_data_routes() {
        let ha = Arc::new(HaState::new("127.0.0.1:50051".into()));
        let addr = spawn(admin_router_ha(Arc::new(FakeView), Some(ha.clone()))).await;
        let text = |path: &'static str| async move {
            let r = request(addr, "GET", path, b"").await;
            (r.status, r.text())
        };
        assert_eq!(text("/role").await, (200, "standby".into()));
        assert_eq!(text("/ha_status").await, (200, "standby".into()));
        let (status, body) = get_json(addr, "/query_key?key=k2").await;
        assert_eq!(status, 503);
        assert_eq!(body["error_code"], -1010);
        assert_eq!(request(addr, "GET", "/get_all_keys", b"").await.status, 503);
        let (_, health) = get_json(addr, "/health").await;
        assert_eq!(health["service_ready"], false);
        assert_eq!(health["role"], "standby");
        assert_eq!(health["term_started_unix_ms"], 0, "never won");

        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        ha.become_leader(42);
        assert_eq!(text("/ha_status").await, (200, "lease_unproven".into()));
        ha.prove(std::time::Instant::now(), std::time::Duration::from_secs(5));
        assert_eq!(text("/role").await, (200, "leader".into()));
        assert_eq!(text("/ha_status").await, (200, "leading".into()));
        assert_eq!(request(addr, "GET", "/get_all_keys", b"").await.status, 200);
        let (_, leader) = get_json(addr, "/leader").await;
        assert_eq!(leader["present"], true);
        assert_eq!(leader["leader_address"], "127.0.0.1:50051");
        assert_eq!(leader["view_version"], 42);
        let (_, health) = get_json(addr, "/health").await;
        assert_eq!(health["service_ready"], true);
        assert_eq!(health["view_version"], 42);
        let started = health["term_started_unix_ms"].as_u64().expect("a number");
        assert!(
            (before..before + 60_000).contains(&started),
            "term started {started}, won just after {before}"
        );
    }

    #[tokio::test]
    async fn text_endpoints() {
        let addr = server().await;
        let cases: &[(&str, u16, &str)] = &[
            ("/role", 200, "leader"),
            ("/ha_status", 200, "disabled"),
            ("/get_all_keys", 200, "mooncake/k:1\nk2\n"),
            ("/get_all_segments", 200, "127.0.0.1:12345\n"),
            (
                "/query_segment?segment=127.0.0.1%3A12345",
                200,
                "127.0.0.1:12345\nUsed(bytes): 268435456\nCapacity(bytes) : 1073741824\n",
            ),
            (
                "/metrics/summary",
                200,
                "role=leader, ha_state=disabled, service_ready=true, master={keys=2, \
                 allocated_bytes=4096, capacity_bytes=1073741824, clients=0}",
            ),
        ];
        for &(path, status, body) in cases {
            let response = request(addr, "GET", path, b"").await;
            assert_eq!(
                (response.status, response.text().as_str()),
                (status, body),
                "{path}"
            );
        }
        let missing = request(addr, "GET", "/query_segment?segment=nope", b"").await;
        assert_eq!(missing.status, 404);
        assert!(missing.text().contains("nope"));
        assert_eq!(
            request(addr, "GET", "/query_segment", b"").await.status,
            404
        );
        assert_eq!(
            request(addr, "GET", "/no_such_route", b"").await.status,
            404
        );
    }

    #[tokio::test]
    async fn metrics_is_prometheus_text() {
        let addr = server().await;
        let response = request(addr, "GET", "/metrics", b"").await;
        assert_eq!(response.status, 200);
        assert_eq!(
            response.header("content-type"),
            Some("text/plain; version=0.0.4")
        );
        assert_eq!(response.text(), FakeView.render_metrics());
    }

    #[tokio::test]
    async fn status_page_and_its_json() {
        let addr = server().await;
        for path in ["/", "/ui"] {
            let page = request(addr, "GET", path, b"").await;
            assert_eq!(page.status, 200);
            assert_eq!(
                page.header("content-type"),
                Some("text/html; charset=utf-8")
            );
            assert!(page.text().contains("fetch(\"status.json\""), "{path}");
            assert!(!page.text().contains("://"), "{path}: no external resource");
        }
        let (status, body) = get_json(addr, "/status.json").await;
        assert_eq!(status, 200);
        assert_eq!(body["ha"]["enabled"], json!(false));
        assert_eq!(body["cluster"]["keys"], json!(2));
        assert_eq!(body["cluster"]["capacity_bytes"], json!(1u64 << 30));
    }

    #[tokio::test]
    async fn json_endpoints() {
        let addr = server().await;
        let (status, body) = get_json(addr, "/health").await;
        assert_eq!(status, 200);
        assert_eq!(
            body,
            json!({"status": "ok", "role": "leader", "ha_state": "disabled", "service_ready": true})
        );
        assert_eq!(
            get_json(addr, "/leader").await,
            (200, json!({"present": false}))
        );

        let (status, body) = get_json(addr, "/query_key?key=mooncake%2Fk%3A1").await;
        assert_eq!(status, 200);
        assert_eq!(
            body,
            json!({"success": true, "data": [{
                "buffer_address": 0x7f00_0000_1000u64,
                "size": 4096,
                "transport_endpoint": "127.0.0.1:12346",
                "segment_name": "127.0.0.1:12345",
                "status": "COMPLETE",
            }]})
        );
        let (status, body) = get_json(addr, "/query_key?key=absent").await;
        assert_eq!(status, 404);
        assert_eq!(
            body,
            json!({"success": false, "error_code": -704, "error_message": "OBJECT_NOT_FOUND"})
        );
        let (status, body) = get_json(addr, "/query_key").await;
        assert_eq!(status, 404);
        assert_eq!(body["error_message"], "INVALID_KEY");

        let (status, body) = get_json(addr, "/get_segments_detail").await;
        assert_eq!(status, 200);
        assert_eq!(
            body,
            json!({"total_segments": 1, "segments": [{
                "segment_name": "127.0.0.1:12345",
                "segment_id": "0000000000000001-0000000000000002",
                "client_id": "0000000000000003-0000000000000004",
                "base_address": "0x7f0000000000",
                "size_bytes": 1u64 << 30,
                "size_human": "1 GiB",
                "te_endpoint": "127.0.0.1:12346",
                "protocol": "tcp",
                "status": "OK",
                "allocator_used_bytes": 1u64 << 28,
                "allocator_capacity_bytes": 1u64 << 30,
                "allocator_usage_percent": 25.0,
            }]})
        );
    }

    #[test]
    fn size_human_matches_ostream_formatting() {
        let cases = [
            (0, "0 GiB"),
            (1 << 30, "1 GiB"),
            (1 << 29, "0.5 GiB"),
            (3 << 30, "3 GiB"),
            (1536 << 20, "1.5 GiB"),
            (1 << 20, "0.000976562 GiB"),
            (1 << 10, "9.53674e-07 GiB"),
            (100 << 30, "100 GiB"),
            (1_000_000_000, "0.931323 GiB"),
            (1 << 50, "1.04858e+06 GiB"),
        ];
        for (bytes, want) in cases {
            assert_eq!(size_human(bytes), want, "{bytes}");
        }
    }

    #[test]
    fn metric_value_finds_unlabelled_samples() {
        let text = "# HELP a x\na{l=\"1\"} 5\na 7\nab 9\n";
        assert_eq!(metric_value(text, "a").as_deref(), Some("7"));
        assert_eq!(metric_value(text, "ab").as_deref(), Some("9"));
        assert_eq!(metric_value(text, "c"), None);
    }
}
