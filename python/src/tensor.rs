//! The tensor header codec for the Python tensor layer (`mooncake/_tensor.py`): thin bindings
//! of `protocol::tensor`, so the 304-byte format has one implementation, unit-tested and
//! fuzzed in Rust.

use protocol::tensor::{
    LayoutAxis, LayoutKind, TensorDtype, TensorMetadata, TENSOR_METADATA_BYTES,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::pybuf::Pinned;

/// One layout axis as a tuple: `(kind, axis_index, shard_rank, shard_count, split_dim,
/// reserved0, reserved1)`.
type AxisTuple = (i32, i32, i32, i32, i32, i32, i64);

/// `sizeof(TensorMetadata)` = 304.
#[pyfunction]
fn _tensor_metadata_size() -> usize {
    TENSOR_METADATA_BYTES
}

/// `[(code, torch_name, element_bytes), ...]` for every supported dtype.
#[pyfunction]
fn _tensor_dtypes() -> Vec<(i32, &'static str, u64)> {
    TensorDtype::ALL
        .iter()
        .map(|d| (*d as i32, d.torch_name(), d.element_bytes()))
        .collect()
}

/// The 304 header bytes for a tensor of `dtype` (code) whose bytes have `local_shape`; a shard
/// also gives `global_shape` and its layout `axes`.
#[pyfunction]
#[pyo3(signature = (dtype, local_shape, global_shape=None, axes=None))]
fn _encode_tensor_header<'py>(
    py: Python<'py>,
    dtype: i32,
    local_shape: Vec<i64>,
    global_shape: Option<Vec<i64>>,
    axes: Option<Vec<AxisTuple>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let d = TensorDtype::from_i32(dtype)
        .ok_or_else(|| PyValueError::new_err(format!("unsupported tensor dtype code {dtype}")))?;
    let mut m = TensorMetadata::full(d, &local_shape).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unsupported tensor shape {local_shape:?} (at most 8 non-negative dims)"
        ))
    })?;
    let axes = axes.unwrap_or_default();
    if global_shape.is_some() || !axes.is_empty() {
        let g = global_shape.unwrap_or_else(|| local_shape.clone());
        if g.len() != local_shape.len() || axes.len() > protocol::tensor::MAX_LAYOUT_AXES {
            return Err(PyValueError::new_err(
                "global shape or axes do not fit the header",
            ));
        }
        m.layout_kind = LayoutKind::Shard;
        m.global_shape = g;
        m.axes = axes
            .into_iter()
            .map(
                |(kind, axis_index, shard_rank, shard_count, split_dim, r0, r1)| LayoutAxis {
                    kind,
                    axis_index,
                    shard_rank,
                    shard_count,
                    split_dim,
                    reserved0: r0,
                    reserved1: r1,
                },
            )
            .collect();
    }
    let bytes = m.encode();
    // Only emit what decodes: the Python layer never writes a header it could not read back.
    TensorMetadata::decode(&bytes, TENSOR_METADATA_BYTES as u64 + m.data_bytes)
        .map_err(|e| PyValueError::new_err(format!("invalid tensor header: {e}")))?;
    Ok(PyBytes::new(py, &bytes))
}

/// Parses the header at the start of `data` (any bytes-like object) for an object of
/// `total_len` bytes (default `len(data)`): `(dtype, layout_kind, global_shape, local_shape,
/// axes, data_offset, data_bytes)`. Raises `ValueError` for an invalid header.
#[pyfunction]
#[pyo3(signature = (data, total_len=None))]
#[allow(clippy::type_complexity)]
fn _decode_tensor_header(
    data: &Bound<'_, PyAny>,
    total_len: Option<u64>,
) -> PyResult<(i32, u32, Vec<i64>, Vec<i64>, Vec<AxisTuple>, u64, u64)> {
    let pinned = Pinned::bytes(data)?;
    let src = pinned.src();
    let total = total_len.unwrap_or(src.len() as u64);
    // Only the header is decoded; copy it out of the (possibly writable) exporter.
    let head = src
        .split_at(src.len().min(TENSOR_METADATA_BYTES))
        .0
        .to_vec();
    let m = TensorMetadata::decode(&head, total)
        .map_err(|e| PyValueError::new_err(format!("invalid tensor object: {e}")))?;
    let axes = m
        .axes
        .iter()
        .map(|a| {
            (
                a.kind,
                a.axis_index,
                a.shard_rank,
                a.shard_count,
                a.split_dim,
                a.reserved0,
                a.reserved1,
            )
        })
        .collect();
    Ok((
        m.dtype as i32,
        m.layout_kind as u32,
        m.global_shape,
        m.local_shape,
        axes,
        m.data_offset,
        m.data_bytes,
    ))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_tensor_metadata_size, m)?)?;
    m.add_function(wrap_pyfunction!(_tensor_dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(_encode_tensor_header, m)?)?;
    m.add_function(wrap_pyfunction!(_decode_tensor_header, m)?)?;
    Ok(())
}
