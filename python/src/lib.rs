//! `mooncake._native`: the native half of the `mooncake` Python package.
//!
//! - [`store::PyStore`] and the value classes in [`types`]: what `mooncake.store` re-exports;
//!   [`dummy::PyDummy`], the dummy client a store switches to (`setup_dummy`); the methods
//!   both serve, written once in [`api`];
//! - [`engine::PyTransferEngine`] and its small classes: what `mooncake.engine` re-exports;
//! - [`pg::PyPgComm`]: the native data path of `mooncake.pg` (`collective`);
//! - [`ep::PyEpBuffer`]: the native data path of `mooncake.mooncake_ep_buffer`;
//! - the tensor header codec (`protocol::tensor`) for the pure-Python tensor layer
//!   (`mooncake/_tensor.py`);
//! - `run_master`, `run_http_metadata_server`, `run_client`, `run_transfer_engine_bench`: the
//!   console scripts' entry points, so a `pip install` brings working `mooncake_master` etc.
//!   without separate binaries.
//!
//! Invariants: nothing here panics on input from Python (bad input is a negative code or a
//! Python exception); every call that waits on the network releases the GIL.

mod api;
mod dummy;
mod engine;
mod ep;
mod mempool;
mod pg;
mod pybuf;
mod setup_args;
mod store;
mod tensor;
mod types;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyType};

static BUFFER_HANDLE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// `BufferHandle` (`mooncake/_buffer_handle.py`): a `bytearray` subclass, so it has the buffer
/// protocol on every Python the abi3 wheel supports (a native class can only export buffers
/// under abi3 from 3.11 on).
fn buffer_handle_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    BUFFER_HANDLE
        .get_or_try_init(py, || {
            let m = PyModule::import(py, "mooncake._buffer_handle")?;
            Ok::<_, PyErr>(m.getattr("BufferHandle")?.cast_into::<PyType>()?.unbind())
        })
        .map(|t| t.bind(py))
}

/// A new `BufferHandle` of `len` uninitialised bytes and its memory, to fill without the GIL.
pub(crate) fn new_buffer_handle(
    py: Python<'_>,
    len: usize,
) -> PyResult<(Bound<'_, PyAny>, pybuf::Fresh)> {
    let h = buffer_handle_type(py)?.call0()?;
    let fresh = pybuf::grow_bytearray(h.cast::<PyByteArray>()?, len)?;
    Ok((h, fresh))
}

/// The shared set-up ([`protocol::log`]: `RUST_LOG`, `MC_YLT_LOG_LEVEL`, `MC_LOG_LEVEL`) on
/// stderr, default warnings only: a library stays quiet in its host program until asked.
fn init_logging() {
    use protocol::log::{Ansi, Level, Writer};
    protocol::log::init_logging(Level::Default("warn"), Writer::Stderr, Ansi::IfTerminal);
}

/// `mooncake_master`: runs the master with `args` (without the program name); returns its
/// exit code. The GIL is released for the whole run.
#[pyfunction]
fn run_master(py: Python<'_>, args: Vec<String>) -> i32 {
    py.detach(|| controlplane::cli::master_main(args))
}

/// `mooncake_http_metadata_server`: the standalone HTTP metadata server.
#[pyfunction]
fn run_http_metadata_server(py: Python<'_>, args: Vec<String>) -> i32 {
    py.detach(|| controlplane::http::metadata_main(args))
}

/// `mooncake_client`: a storage node contributing memory to the store (`client::cli`).
#[pyfunction]
fn run_client(py: Python<'_>, args: Vec<String>) -> i32 {
    py.detach(|| client::cli::node_main(args))
}

/// `transfer_engine_bench`: the transfer-engine benchmark (`mooncake_bench::engine`).
#[pyfunction]
fn run_transfer_engine_bench(py: Python<'_>, args: Vec<String>) -> i32 {
    py.detach(|| mooncake_bench::engine::bench_main(args))
}

/// `[(name, code), ...]`: every store error code in declaration order (`protocol::ErrorCode`),
/// the table `mooncake.error_codes.ErrorCode` is checked against.
#[pyfunction]
fn _error_codes() -> Vec<(&'static str, i32)> {
    protocol::ErrorCode::ALL
        .iter()
        .map(|c| (c.name(), c.code()))
        .collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    let py = m.py();
    m.add_class::<store::PyStore>()?;
    m.add_class::<dummy::PyDummy>()?;
    m.add_class::<types::PyReplicateConfig>()?;
    m.add_class::<types::PyReplicaDescriptor>()?;
    m.add_class::<types::PyMemoryDescriptor>()?;
    m.add_class::<types::PyDescriptor>()?;
    m.add_class::<types::PyObjectDataType>()?;
    m.add_class::<types::PyReplicaStatus>()?;
    m.add_class::<types::PySoftPinAction>()?;
    m.add("BufferHandle", buffer_handle_type(py)?)?;
    for (v, name) in types::PyObjectDataType::VARIANTS {
        m.add(*name, *v)?;
    }
    for (v, name) in types::PyReplicaStatus::VARIANTS {
        m.add(*name, *v)?;
    }
    m.add_function(wrap_pyfunction!(run_master, m)?)?;
    m.add_function(wrap_pyfunction!(run_http_metadata_server, m)?)?;
    m.add_function(wrap_pyfunction!(run_client, m)?)?;
    m.add_function(wrap_pyfunction!(run_transfer_engine_bench, m)?)?;
    m.add_function(wrap_pyfunction!(_error_codes, m)?)?;
    m.add_function(wrap_pyfunction!(store::_bytearray_address, m)?)?;
    tensor::register(m)?;
    engine::register(m)?;
    pg::register(m)?;
    ep::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
