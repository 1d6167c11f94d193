//! Borrowing the bytes of any buffer-protocol object (bytes, bytearray, memoryview, numpy
//! arrays, ctypes arrays) without copying, and filling fresh `bytes` / `bytearray` objects
//! while the GIL is released.
//!
//! PyO3 exposes the buffer protocol only for Python >= 3.11 under `abi3`, because
//! `PyObject_GetBuffer` and `Py_buffer` joined the limited API in 3.11. Both have had the same
//! signature and layout since Python 3.3, and every CPython exports the function, so this module
//! declares the two functions and the struct itself; that keeps one abi3 wheel for 3.10+.
//!
//! Invariant: a [`Pinned`] holds the exporter's buffer (which the exporter must keep valid and
//! unmoved, e.g. a bytearray refuses to resize) until it is dropped, which releases it; the
//! slices it hands out never outlive it.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;

use dataplane::mem::{Dst, Src};
use pyo3::exceptions::{PyBufferError, PyRuntimeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

/// CPython's `Py_buffer` (identical in every 3.x since 3.3; in the limited API from 3.11).
#[repr(C)]
struct PyBufferView {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut PyBufferView, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut PyBufferView);
}

const PYBUF_SIMPLE: c_int = 0;
const PYBUF_FORMAT: c_int = 0x0004;
const PYBUF_ND: c_int = 0x0008;

/// An exported buffer, released on drop.
pub struct Pinned {
    view: PyBufferView,
}

// Dropping a `Pinned` calls into Python, so it must stay on a thread that is attached; it is
// neither `Send` nor `Sync` (raw pointers), which the compiler enforces for `Python::detach`.

impl Pinned {
    fn get(obj: &Bound<'_, PyAny>, flags: c_int) -> PyResult<Pinned> {
        let mut view = std::mem::MaybeUninit::<PyBufferView>::zeroed();
        // SAFETY: `obj` is a live object (we hold the GIL through `Bound`), and `view` points to
        // writable memory of the right layout; on success CPython fills it and we release it
        // exactly once in `Drop`.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), flags) };
        if rc != 0 {
            return Err(PyErr::take(obj.py())
                .unwrap_or_else(|| PyBufferError::new_err("object does not export a buffer")));
        }
        // SAFETY: PyObject_GetBuffer returned 0, so it initialised the view.
        let view = unsafe { view.assume_init() };
        Ok(Pinned { view })
    }

    /// Any C-contiguous buffer, seen as bytes (`put`'s value).
    pub fn bytes(obj: &Bound<'_, PyAny>) -> PyResult<Pinned> {
        Self::get(obj, PYBUF_SIMPLE)
    }

    /// A 1-D buffer of 1-byte items (`put_parts`' parts); anything else is upstream's
    /// `RuntimeError("parts must be 1-D bytes-like")`.
    pub fn one_d_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Pinned> {
        let p = Self::get(obj, PYBUF_ND | PYBUF_FORMAT)?;
        if p.view.ndim != 1 || p.view.itemsize != 1 {
            return Err(PyRuntimeError::new_err("parts must be 1-D bytes-like"));
        }
        Ok(p)
    }

    /// The exported bytes as a raw range (`dataplane::sys::bytes`), not a slice: a writable
    /// exporter (a `bytearray`, a numpy array) may be written by Python while we read it
    /// without the GIL, which garbles that call's bytes, never Rust's aliasing rules.
    pub fn src(&self) -> Src<'_> {
        let len = usize::try_from(self.view.len).unwrap_or(0);
        if len == 0 || self.view.buf.is_null() {
            return Src::empty();
        }
        // SAFETY: the exporter guarantees `len` readable bytes at `buf` while the buffer is
        // held, and it is held for the lifetime of `self`, which bounds the range; no Rust
        // reference covers the exporter's memory.
        unsafe { Src::from_raw(self.view.buf as *const u8, len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released once;
        // a `Pinned` only exists on threads attached to the interpreter.
        unsafe { PyBuffer_Release(&mut self.view) };
    }
}

/// Memory of a Python object that no other code can reach yet, to be filled without the GIL.
///
/// Neither `Clone` nor `Copy`: one `Fresh` per object, and using its bytes consumes it, so
/// two writable ranges over one object cannot come from safe code.
pub struct Fresh {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `Fresh` points into an object created by this thread that is not shared with any
// other code until the fill is done; moving the pointer to a worker that fills it while this
// thread waits is sound.
unsafe impl Send for Fresh {}

impl Fresh {
    /// The memory as a range to write into, for a lifetime the caller picks.
    ///
    /// # Safety
    /// For all of `'a` the object this came from stays alive (its owner holds a reference)
    /// and no Rust reference reads or writes its bytes.
    pub unsafe fn into_dst<'a>(self) -> Dst<'a> {
        // SAFETY: `len` writable bytes at `ptr` (the object's buffer, sized at creation; a
        // null `ptr` only with `len == 0`); the object's life for `'a` is this function's
        // contract, and `self` is consumed, so no second range comes from it.
        unsafe { Dst::from_raw(self.ptr, self.len) }
    }
}

/// A new, uninitialised `bytes` object of `len` bytes and its memory.
pub fn new_bytes(py: Python<'_>, len: usize) -> PyResult<(Bound<'_, PyBytes>, Fresh)> {
    let n = ffi::Py_ssize_t::try_from(len)
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("object too large"))?;
    // SAFETY: a null source asks CPython for an uninitialised bytes object of `n` bytes; the
    // result is a new reference or null with an exception set.
    let obj = unsafe {
        Bound::from_owned_ptr_or_err(py, ffi::PyBytes_FromStringAndSize(ptr::null(), n))?
            .cast_into_unchecked::<PyBytes>()
    };
    // SAFETY: `obj` is a bytes object; PyBytes_AsString returns its internal buffer.
    let data = unsafe { ffi::PyBytes_AsString(obj.as_ptr()) } as *mut u8;
    Ok((obj, Fresh { ptr: data, len }))
}

/// Grows a new, empty bytearray (or subclass instance) to `len` bytes and returns its memory.
pub fn grow_bytearray(obj: &Bound<'_, PyByteArray>, len: usize) -> PyResult<Fresh> {
    let n = ffi::Py_ssize_t::try_from(len)
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("object too large"))?;
    // SAFETY: `obj` is a bytearray with no exports (just created); resizing it is allowed and
    // leaves the new bytes uninitialised, which the caller fills.
    if unsafe { ffi::PyByteArray_Resize(obj.as_ptr(), n) } != 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    // SAFETY: `obj` is a bytearray; PyByteArray_AsString returns its internal buffer.
    let data = unsafe { ffi::PyByteArray_AsString(obj.as_ptr()) } as *mut u8;
    Ok(Fresh { ptr: data, len })
}

/// Address of a bytearray's first byte (`BufferHandle.ptr()`).
pub fn bytearray_address(obj: &Bound<'_, PyByteArray>) -> u64 {
    // SAFETY: `obj` is a bytearray; the call only reads its buffer pointer.
    unsafe { ffi::PyByteArray_AsString(obj.as_ptr()) as u64 }
}
