//! The master's two HTTP servers, both on axum over tokio, both read-mostly and off the data
//! path:
//!
//! - [`metadata`]: the transfer-engine metadata store (`/metadata?key=K` GET/PUT/DELETE,
//!   `/health`), embedded in the master with `--enable_http_metadata_server` and also run alone
//!   by the `mooncake_http_metadata_server` binary ([`metadata_main`]);
//! - [`admin`]: the admin and Prometheus metrics server on `--metrics_port`, a view of the
//!   master through [`crate::view::AdminView`] (its only writes, tenant quotas, need the
//!   cluster secret's bearer when one is set).
//!
//! Each module exposes a `*_router` (to mount or test in-process) and a `serve_*` that runs it on
//! a bound listener until a shutdown future resolves. Callers bind the listener themselves, so
//! they choose the address, may bind port 0, and learn the real port before serving.
//!
//! [`serve`] is the one accept loop of both: hyper's HTTP/1 connection with its timer, so a
//! request head must arrive within [`HTTP_HEADER_TIMEOUT`] (an idle keep-alive connection is
//! closed after it too), a whole request within [`HTTP_REQUEST_TIMEOUT`], and at most
//! [`HTTP_MAX_CONNECTIONS`] connections at once. Without these, half-sent requests held
//! connections open for as long as their sender liked, in the file descriptors the master's
//! RPC port shares.

pub mod admin;
pub mod metadata;
mod standalone;

pub use standalone::metadata_main;

#[cfg(test)]
pub(crate) mod test_client;

use std::future::Future;
use std::sync::Arc;

use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use protocol::auth::Token;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tracing::{debug, warn};

use crate::limits::{HTTP_HEADER_TIMEOUT, HTTP_MAX_CONNECTIONS, HTTP_REQUEST_TIMEOUT};

/// Serves `router` on `listener` until `shutdown` resolves, then finishes in-flight requests
/// (connections idle past that are closed). See the module docs for the limits.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = router.layer(axum::middleware::from_fn(request_deadline));
    let live = Arc::new(Semaphore::new(HTTP_MAX_CONNECTIONS));
    let (stopping, stop_seen) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (sock, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    warn!("HTTP accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = live.clone().try_acquire_owned() else {
            warn!("HTTP: refusing {peer}: {HTTP_MAX_CONNECTIONS} connections already open");
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let mut stop_seen = stop_seen.clone();
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HTTP_HEADER_TIMEOUT);
            let conn = builder.serve_connection(TokioIo::new(sock), service);
            tokio::pin!(conn);
            let ended = tokio::select! {
                r = conn.as_mut() => r,
                _ = async { stop_seen.wait_for(|s| *s).await.map(|_| ()) } => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = ended {
                debug!("HTTP connection from {peer} ended: {e}");
            }
            drop(permit);
        });
    }
    let _ = stopping.send(true);
    // Every permit back: every connection has answered what it was asked and closed.
    let _all = live.acquire_many(HTTP_MAX_CONNECTIONS as u32).await;
    Ok(())
}

/// Answers 408 to a request whose handler (body read included) has not finished within
/// [`HTTP_REQUEST_TIMEOUT`].
async fn request_deadline(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    match tokio::time::timeout(HTTP_REQUEST_TIMEOUT, next.run(req)).await {
        Ok(answer) => answer,
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            [(header::CONNECTION, "close")],
            format!("request not completed within {HTTP_REQUEST_TIMEOUT:?}"),
        )
            .into_response(),
    }
}

/// Which requests a route's [`require_bearer`] lets through without the cluster secret's
/// bearer.
#[derive(Clone, Copy)]
pub(crate) struct BearerGuard {
    /// The secret (`None`: no secret set, every request goes on).
    pub(crate) auth: Option<&'static Token>,
    /// `GET` and `HEAD` go on without it (routes whose reads are public).
    pub(crate) reads_open: bool,
}

/// Middleware: a request goes on when no secret is set, when it is a read of a route whose
/// reads are open, or when it carries `Authorization: Bearer <Token::http_bearer>`; else 401
/// before its handler runs (and before its body is read).
pub(crate) async fn require_bearer(
    axum::extract::State(guard): axum::extract::State<BearerGuard>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(token) = guard.auth else {
        return next.run(req).await;
    };
    let read = matches!(*req.method(), Method::GET | Method::HEAD);
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if (guard.reads_open && read) || token.check_authorization(given) {
        return next.run(req).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "cluster secret required: Authorization: Bearer <derived token>, see docs/security.md",
    )
        .into_response()
}
