//! `setup(...)` arguments: the positional/keyword form and the dict form with "16MB"-style
//! sizes, both turned into a [`client::StoreConfig`] with upstream's defaults and checks.

use std::collections::HashMap;

use client::StoreConfig;
use protocol::ErrorCode;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Upper bound of `local_buffer_size` in the dict form (upstream: 1 TiB).
const MAX_LOCAL_BUFFER_BYTES: u64 = 1 << 40;
/// Smallest non-zero size the dict form accepts.
const MIN_SIZE_BYTES: u64 = 1024;
/// Dict-form default for both sizes (upstream `types.h`).
const DEFAULT_SIZE_BYTES: u64 = 16 << 20;

/// Names of `setup`'s parameters in order; the first seven are required.
const PARAMS: [&str; 13] = [
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "local_buffer_size",
    "protocol",
    "rdma_devices",
    "master_server_addr",
    "engine",
    "enable_ssd_offload",
    "ssd_offload_path",
    "tenant_id",
    "enable_client_http_server",
    "client_http_port",
];
const REQUIRED: usize = 7;

/// What a `setup` call asks for: a config, or a code to return without connecting.
pub enum Setup {
    /// The store's config, and the port of the client HTTP server when it is asked for
    /// (`enable_client_http_server`, `client_http_port`; `client::store::http`).
    Config(StoreConfig, Option<u16>),
    Reject(ErrorCode),
}

/// The client HTTP server's port when `enabled`; a port outside 1..=65535 is refused.
fn client_http(enabled: bool, port: Option<i64>) -> Result<Option<u16>, ErrorCode> {
    if !enabled {
        return Ok(None);
    }
    match port.map_or(Some(client::http_endpoint::CLIENT_HTTP_PORT_DEFAULT), |p| {
        u16::try_from(p).ok()
    }) {
        Some(p) if p != 0 => Ok(Some(p)),
        _ => {
            tracing::error!("setup refused: client_http_port must be in 1..=65535");
            Err(ErrorCode::InvalidParams)
        }
    }
}

/// Binds `setup(*args, **kwargs)` like the two pybind11 overloads: one dict argument (or
/// `config=`) is the dict form; otherwise the seven required positional-or-keyword arguments.
pub fn parse(args: &Bound<'_, PyTuple>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Setup> {
    let nkw = kwargs.map_or(0, |k| k.len());
    if args.len() == 1 && nkw == 0 {
        if let Ok(d) = args.get_item(0)?.cast_into::<PyDict>() {
            return from_dict(&d);
        }
    }
    if args.is_empty() && nkw == 1 {
        if let Some(d) = kwargs.and_then(|k| k.get_item("config").ok().flatten()) {
            let d = d
                .cast_into::<PyDict>()
                .map_err(|_| PyTypeError::new_err("setup(): config must be a dict"))?;
            return from_dict(&d);
        }
    }
    if args.len() > PARAMS.len() {
        return Err(PyTypeError::new_err(format!(
            "setup() takes at most {} arguments ({} given)",
            PARAMS.len(),
            args.len()
        )));
    }
    let mut bound: Vec<Option<Bound<'_, PyAny>>> = vec![None; PARAMS.len()];
    for (i, a) in args.iter().enumerate() {
        bound[i] = Some(a);
    }
    if let Some(k) = kwargs {
        for (name, value) in k.iter() {
            let name: String = name.extract()?;
            let Some(i) = PARAMS.iter().position(|p| *p == name) else {
                return Err(PyTypeError::new_err(format!(
                    "setup() got an unexpected keyword argument '{name}'"
                )));
            };
            if bound[i].is_some() {
                return Err(PyTypeError::new_err(format!(
                    "setup() got multiple values for argument '{name}'"
                )));
            }
            bound[i] = Some(value);
        }
    }
    if let Some(i) = bound[..REQUIRED].iter().position(Option::is_none) {
        return Err(PyTypeError::new_err(format!(
            "setup() missing required argument '{}'",
            PARAMS[i]
        )));
    }
    let s = |i: usize| -> PyResult<String> {
        bound[i].as_ref().map_or(Ok(String::new()), |v| {
            v.extract::<String>()
                .map_err(|_| PyTypeError::new_err(format!("setup(): {} must be a str", PARAMS[i])))
        })
    };
    let n = |i: usize| -> PyResult<u64> {
        bound[i].as_ref().map_or(Ok(0), |v| {
            v.extract::<u64>().map_err(|_| {
                PyTypeError::new_err(format!("setup(): {} must be a non-negative int", PARAMS[i]))
            })
        })
    };
    // Optional arguments are type-checked like pybind11 would; `engine` is not needed.
    for (i, check) in [
        (8usize, "bool"),
        (9, "str"),
        (10, "str"),
        (11, "bool"),
        (12, "int"),
    ] {
        if let Some(v) = &bound[i] {
            let ok = match check {
                "bool" => v.extract::<bool>().is_ok(),
                "str" => v.extract::<String>().is_ok(),
                _ => v.extract::<i64>().is_ok(),
            };
            if !ok {
                return Err(PyTypeError::new_err(format!(
                    "setup(): {} must be a {check}",
                    PARAMS[i]
                )));
            }
        }
    }
    let flag = |i: usize| {
        bound[i]
            .as_ref()
            .is_some_and(|v| v.is_truthy().unwrap_or(true))
    };
    let tenant_id = bound[10].as_ref().map(|_| s(10)).transpose()?;
    if let Some(e) = unsupported(tenant_id.clone()) {
        return Ok(Setup::Reject(e));
    }
    let port = bound[12].as_ref().map(|v| v.extract::<i64>()).transpose()?;
    let http = match client_http(flag(11), port) {
        Ok(h) => h,
        Err(e) => return Ok(Setup::Reject(e)),
    };
    Ok(Setup::Config(
        StoreConfig {
            local_hostname: s(0)?,
            metadata_server: s(1)?,
            global_segment_size: n(2)?,
            local_buffer_size: n(3)?,
            protocol: s(4)?,
            rdma_devices: s(5)?,
            master_server_addr: s(6)?,
            tenant_id: tenant_id.unwrap_or_default(),
            ssd_offload: flag(8).then(|| s(9)).transpose()?,
        },
        http,
    ))
}

/// The dict form: every value is taken as `str(v)`.
fn from_dict(d: &Bound<'_, PyDict>) -> PyResult<Setup> {
    let mut m = HashMap::new();
    for (k, v) in d.iter() {
        m.insert(k.str()?.to_string(), v.str()?.to_string());
    }
    Ok(from_map(&m))
}

pub fn from_map(m: &HashMap<String, String>) -> Setup {
    let get = |k: &str, default: &str| m.get(k).cloned().unwrap_or_else(|| default.to_string());
    let (Some(local_hostname), Some(metadata_server)) =
        (m.get("local_hostname"), m.get("metadata_server"))
    else {
        return Setup::Reject(ErrorCode::InvalidParams);
    };
    // `"16777216"`, `"16MB"`, `"1.5GB"`, `"4 GiB"`: the node's `--global_segment_size` reader.
    let size = |k: &str| match m.get(k) {
        None => Some(DEFAULT_SIZE_BYTES),
        Some(v) => protocol::env::parse_size(v).ok(),
    };
    let (Some(global), Some(local)) = (size("global_segment_size"), size("local_buffer_size"))
    else {
        return Setup::Reject(ErrorCode::InvalidParams);
    };
    let on = |k: &str| {
        m.get(k)
            .and_then(|v| protocol::env::parse_bool(v))
            .unwrap_or(false)
    };
    if let Some(e) = unsupported(m.get("tenant_id").cloned()) {
        return Setup::Reject(e);
    }
    let port = match m.get("client_http_port").map(|v| v.trim().parse::<i64>()) {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(_)) => Some(-1),
    };
    let http = match client_http(on("enable_client_http_server"), port) {
        Ok(h) => h,
        Err(e) => return Setup::Reject(e),
    };
    if (global != 0 && global < MIN_SIZE_BYTES)
        || (local != 0 && !(MIN_SIZE_BYTES..=MAX_LOCAL_BUFFER_BYTES).contains(&local))
    {
        return Setup::Reject(ErrorCode::InvalidParams);
    }
    Setup::Config(
        StoreConfig {
            local_hostname: local_hostname.clone(),
            metadata_server: metadata_server.clone(),
            global_segment_size: global,
            local_buffer_size: local,
            protocol: get("protocol", "tcp"),
            rdma_devices: get("rdma_devices", ""),
            master_server_addr: get("master_server_addr", "127.0.0.1:50051"),
            tenant_id: get("tenant_id", protocol::tenant::DEFAULT_TENANT),
            ssd_offload: on("enable_ssd_offload").then(|| get("ssd_offload_path", "")),
        },
        http,
    )
}

/// A `tenant_id` that cannot name a tenant (NUL, over `protocol::limits::TENANT_MAX_BYTES`;
/// empty is the default tenant, as upstream) fails the setup with `INVALID_PARAMS` and a
/// logged reason.
fn unsupported(tenant_id: Option<String>) -> Option<ErrorCode> {
    let why = if tenant_id
        .as_deref()
        .is_some_and(|t| !t.is_empty() && !protocol::tenant::valid_tenant(t))
    {
        "tenant_id must be at most 4096 bytes without NUL"
    } else {
        return None;
    };
    tracing::error!("setup refused: {why}");
    Some(ErrorCode::InvalidParams)
}
