//! Transfer-engine metadata: where segment descriptors live, what they look like, and how a
//! peer is asked for its descriptor directly.
//!
//! - [`desc`]: the JSON of `mooncake/ram/<name>` ([`desc::SegmentDesc`]) and
//!   `mooncake/rpc_meta/<name>` ([`desc::RpcMeta`]), field names as upstream writes them;
//! - [`http`]: the HTTP metadata store (`http://host:port/metadata`, GET/PUT/DELETE with a
//!   URL-encoded `key` query, 3 s timeout, only 200 is success) on a small HTTP/1.1 client;
//! - [`etcd`]: the etcd metadata store (`etcd://h1:p1,h2:p2` or a bare `h:p`) over etcd v3's
//!   JSON gateway, on the same HTTP client; [`base64`] encodes its keys and values;
//! - [`handshake`]: upstream's handshake framing (u64 LE length, u8 type, JSON) with its
//!   server and client, used for P2PHANDSHAKE descriptor exchange, notifies, probes and the
//!   RDMA QP exchange;
//! - [`rdma_desc`]: the RDMA descriptor members (devices, rkeys) and the `Connection` body.
//!
//! A metadata connection string is parsed by [`MetadataBackend::parse`] (P2PHANDSHAKE, HTTP,
//! etcd; redis and https are refused with a clear error). Keys are built by [`Keys`], which
//! applies `MC_METADATA_CLUSTER_ID`.
//!
//! Invariants: nothing here panics on bytes from the network: every decode returns a
//! [`MetadataError`]; every network call is bounded by a timeout.

pub mod base64;
pub mod desc;
pub mod etcd;
pub mod handshake;
pub mod http;
pub mod rdma_desc;

use crate::TeError;

/// A key-value store of metadata (the HTTP metadata server or etcd).
pub trait MetadataStore: Send + Sync {
    /// The value of `key`, or `None` when the store does not hold it.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, MetadataError>;
    /// Stores `value` (compact JSON) under `key`.
    fn put(&self, key: &str, value: &[u8]) -> Result<(), MetadataError>;
    /// Removes `key`. Removing a key that is not there is not an error.
    fn remove(&self, key: &str) -> Result<(), MetadataError>;
}

/// Why a metadata operation failed. Each variant says what was expected and what arrived.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// The connection string names a backend this build does not have.
    #[error("metadata backend {backend:?} is not supported: {why}")]
    Unsupported { backend: String, why: &'static str },
    /// The connection string does not parse.
    #[error("bad metadata connection string {conn:?}: {why}")]
    BadConn { conn: String, why: &'static str },
    /// A socket operation failed (connect, send, receive, timeout).
    #[error("metadata I/O with {peer} failed: {source}")]
    Io {
        peer: String,
        #[source]
        source: std::io::Error,
    },
    /// The server answered with a status other than 200.
    #[error("metadata server {peer} answered {method} {key:?} with HTTP {status}: {body}")]
    Status {
        peer: String,
        method: &'static str,
        key: String,
        status: u16,
        body: String,
    },
    /// The answer is not well formed (HTTP framing, handshake framing or JSON).
    #[error("malformed metadata answer from {peer}: {why}")]
    Malformed { peer: String, why: String },
    /// The peer refused a handshake request.
    #[error("peer {peer} rejected the handshake: {why}")]
    Rejected { peer: String, why: String },
}

impl MetadataError {
    /// The transfer-engine code for this failure.
    pub fn code(&self) -> TeError {
        match self {
            MetadataError::Unsupported { .. } => TeError::NotImplemented,
            MetadataError::BadConn { .. } => TeError::InvalidArgument,
            MetadataError::Io { .. } => TeError::Socket,
            MetadataError::Status { .. } => TeError::Metadata,
            MetadataError::Malformed { .. } => TeError::MalformedJson,
            MetadataError::Rejected { .. } => TeError::RejectHandshake,
        }
    }
}

/// A parsed metadata connection string, every backend this build has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataBackend {
    /// `P2PHANDSHAKE`: no central store; descriptors are fetched from the peer itself.
    P2p,
    /// `http://host:port/path`.
    Http(http::HttpUrl),
    /// `etcd://h1:p1[,h2:p2...]` or a bare `h1:p1[,h2:p2...]` (`;` also separates).
    Etcd(Vec<etcd::Endpoint>),
}

impl MetadataBackend {
    /// Parses upstream's connection strings: `P2PHANDSHAKE`, `http://host:port/path`,
    /// `etcd://h:p[,h:p...]` or a bare `h:p[,h:p...]` (etcd); `redis://` and `https://` are
    /// refused.
    pub fn parse(conn: &str) -> Result<MetadataBackend, MetadataError> {
        let conn = conn.trim();
        if conn.eq_ignore_ascii_case("P2PHANDSHAKE") {
            return Ok(MetadataBackend::P2p);
        }
        let unsupported = |backend: &str, why| MetadataError::Unsupported {
            backend: backend.to_string(),
            why,
        };
        match conn.split_once("://") {
            Some((scheme, _)) if scheme.eq_ignore_ascii_case("http") => {
                Ok(MetadataBackend::Http(http::HttpUrl::parse(conn)?))
            }
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("etcd") => {
                Ok(MetadataBackend::Etcd(etcd::parse_endpoints(rest)?))
            }
            Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => Err(unsupported(
                "https",
                "TLS is not built in; use http://host:port/metadata",
            )),
            Some((scheme, _)) => Err(unsupported(
                scheme,
                "only http://host:port/metadata, etcd://host:port and P2PHANDSHAKE are supported",
            )),
            None if conn.contains(':') => Ok(MetadataBackend::Etcd(etcd::parse_endpoints(conn)?)),
            None => Err(MetadataError::BadConn {
                conn: conn.to_string(),
                why: "expected P2PHANDSHAKE, http://host:port/path, etcd://host:port or host:port",
            }),
        }
    }

    /// The store of this backend; `None` for P2PHANDSHAKE.
    pub fn open(&self) -> Option<Box<dyn MetadataStore>> {
        match self {
            MetadataBackend::P2p => None,
            MetadataBackend::Http(url) => Some(Box::new(http::HttpStore::new(url.clone()))),
            MetadataBackend::Etcd(eps) => Some(Box::new(etcd::EtcdStore::new(eps.clone()))),
        }
    }
}

/// Builds upstream's metadata keys: `mooncake/[<cluster id>/]ram/<name>` and
/// `mooncake/[<cluster id>/]rpc_meta/<name>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys with the cluster id of `MC_METADATA_CLUSTER_ID`, if set and non-empty.
    pub fn from_env() -> Keys {
        Keys::with_cluster(std::env::var("MC_METADATA_CLUSTER_ID").ok().as_deref())
    }

    /// The keys a store process (storage node, store client) publishes under:
    /// `MC_METADATA_CLUSTER_ID` when set; else its store cluster (`--cluster_id` /
    /// `MC_STORE_CLUSTER_ID`) unless that is upstream's default `mooncake_cluster`, so that two
    /// clusters sharing one etcd do not overwrite each other's descriptors while a default
    /// deployment keeps upstream's key layout.
    pub fn for_store(store_cluster: &str) -> Keys {
        let metadata_cluster = std::env::var("MC_METADATA_CLUSTER_ID").ok();
        Keys::for_store_in(store_cluster, metadata_cluster.as_deref())
    }

    /// [`Keys::for_store`] with `MC_METADATA_CLUSTER_ID` given as `metadata_cluster` (read once
    /// by the caller, so a test does not have to change the process environment).
    pub fn for_store_in(store_cluster: &str, metadata_cluster: Option<&str>) -> Keys {
        match metadata_cluster {
            Some(id) if !id.trim().is_empty() => Keys::with_cluster(Some(id)),
            _ if store_cluster.trim() == protocol::DEFAULT_CLUSTER_ID => Keys::with_cluster(None),
            _ => Keys::with_cluster(Some(store_cluster)),
        }
    }

    /// Keys under `mooncake/<cluster>/` (or `mooncake/` for `None` or an empty id).
    pub fn with_cluster(cluster: Option<&str>) -> Keys {
        let prefix = match cluster.map(str::trim) {
            Some(id) if !id.is_empty() => format!("mooncake/{id}/"),
            _ => "mooncake/".to_string(),
        };
        Keys { prefix }
    }

    /// The segment descriptor key. A name containing `/` is appended to the prefix verbatim,
    /// as upstream's `getFullMetadataKey` does.
    pub fn ram(&self, segment_name: &str) -> String {
        if segment_name.contains('/') {
            format!("{}{segment_name}", self.prefix)
        } else {
            format!("{}ram/{segment_name}", self.prefix)
        }
    }

    /// The handshake endpoint key.
    pub fn rpc_meta(&self, server_name: &str) -> String {
        format!("{}rpc_meta/{server_name}", self.prefix)
    }
}

/// Splits `host:port` (or `[v6]:port`) into host and port.
pub fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6,
        // An unbracketed host with a colon is a bare IPv6 address, not host:port.
        None if host.contains(':') => return None,
        None => host,
    };
    if host.is_empty() {
        return None;
    }
    Some((host, port.parse().ok()?))
}

/// The host part of a server or segment name: `host` of `host:port`, of `host:port#1` and of
/// `host:anything`; the whole name when it has no colon (or is a bare IPv6 address).
pub fn host_of(name: &str) -> &str {
    if let Some((h, _)) = split_host_port(name) {
        return h;
    }
    match name.split_once(':') {
        Some((h, rest)) if !h.is_empty() && !rest.contains(':') => h,
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_keys_are_namespaced_by_a_non_default_cluster() {
        let keys = |store, metadata| Keys::for_store_in(store, metadata).prefix;
        assert_eq!(keys("mooncake_cluster", None), "mooncake/");
        assert_eq!(keys("prod-a", None), "mooncake/prod-a/");
        assert_eq!(keys("prod-a", Some(" ")), "mooncake/prod-a/");
        assert_eq!(keys("prod-a", Some("te")), "mooncake/te/");
        assert_eq!(keys("mooncake_cluster", Some("te")), "mooncake/te/");
    }

    #[test]
    fn conn_strings() {
        assert_eq!(
            MetadataBackend::parse("P2PHANDSHAKE").unwrap(),
            MetadataBackend::P2p
        );
        match MetadataBackend::parse("http://127.0.0.1:8080/metadata").unwrap() {
            MetadataBackend::Http(u) => {
                assert_eq!((u.host.as_str(), u.port), ("127.0.0.1", 8080));
                assert_eq!(u.path, "/metadata");
            }
            other => panic!("{other:?}"),
        }
        let local = |port| etcd::Endpoint {
            host: "127.0.0.1".into(),
            port,
        };
        for conn in [
            "etcd://127.0.0.1:2379",
            "127.0.0.1:2379",
            "ETCD://127.0.0.1:2379/",
        ] {
            assert_eq!(
                MetadataBackend::parse(conn).unwrap(),
                MetadataBackend::Etcd(vec![local(2379)]),
                "{conn}"
            );
        }
        assert_eq!(
            MetadataBackend::parse("etcd://127.0.0.1:1,127.0.0.1:2;127.0.0.1:3").unwrap(),
            MetadataBackend::Etcd(vec![local(1), local(2), local(3)])
        );
        assert_eq!(
            MetadataBackend::parse("etcd://").unwrap_err().code(),
            TeError::InvalidArgument
        );
        assert!(MetadataBackend::parse("P2PHANDSHAKE")
            .unwrap()
            .open()
            .is_none());
        assert!(MetadataBackend::parse("h:1").unwrap().open().is_some());
        assert_eq!(
            MetadataBackend::parse("redis://h:1").unwrap_err().code(),
            TeError::NotImplemented
        );
        assert_eq!(
            MetadataBackend::parse("nonsense").unwrap_err().code(),
            TeError::InvalidArgument
        );
    }

    #[test]
    fn keys_with_and_without_cluster() {
        let k = Keys::with_cluster(None);
        assert_eq!(k.ram("127.0.0.1:1"), "mooncake/ram/127.0.0.1:1");
        assert_eq!(k.rpc_meta("127.0.0.1:1"), "mooncake/rpc_meta/127.0.0.1:1");
        assert_eq!(k.ram("nvmeof/x"), "mooncake/nvmeof/x");
        let c = Keys::with_cluster(Some("c1"));
        assert_eq!(c.ram("a"), "mooncake/c1/ram/a");
        assert_eq!(Keys::with_cluster(Some("")), k);
    }

    #[test]
    fn host_port_split() {
        assert_eq!(split_host_port("a:1"), Some(("a", 1)));
        assert_eq!(split_host_port("[::1]:80"), Some(("::1", 80)));
        assert_eq!(split_host_port("a"), None);
        assert_eq!(split_host_port(":1"), None);
        assert_eq!(split_host_port("a:99999"), None);
        assert_eq!(host_of("10.0.0.1:50052#1"), "10.0.0.1");
        assert_eq!(host_of("h:1"), "h");
        assert_eq!(host_of("h"), "h");
        assert_eq!(host_of("::1"), "::1");
        assert_eq!(split_host_port("::1"), None);
    }
}
