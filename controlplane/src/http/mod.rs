//! The master's two HTTP servers, both on axum over tokio, both read-mostly and off the data
//! path:
//!
//! - [`metadata`]: the transfer-engine metadata store (`/metadata?key=K` GET/PUT/DELETE,
//!   `/health`), embedded in the master with `--enable_http_metadata_server` and also run alone
//!   by the `mooncake_http_metadata_server` binary ([`metadata_main`]);
//! - [`admin`]: the admin and Prometheus metrics server on `--metrics_port`, a read-only view of
//!   the master through [`crate::view::AdminView`].
//!
//! Each module exposes a `*_router` (to mount or test in-process) and a `serve_*` that runs it on
//! a bound listener until a shutdown future resolves. Callers bind the listener themselves, so
//! they choose the address, may bind port 0, and learn the real port before serving.

pub mod admin;
pub mod metadata;
mod standalone;

pub use standalone::metadata_main;

#[cfg(test)]
pub(crate) mod test_client;

use std::future::Future;

use axum::Router;
use tokio::net::TcpListener;

/// Serves `router` on `listener` until `shutdown` resolves, then finishes in-flight requests.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}
