//! The client local buffer as a byte budget.
//!
//! Upstream stages every non-zero-copy operation (`put`, `get`, `get_buffer`, tensors) through
//! a "local buffer" of `local_buffer_size` bytes, so an operation larger than what is free
//! fails with `INVALID_PARAMS` and `local_buffer_size = 0` disables them (tests rely on this).
//! We move bytes straight from and to the caller's memory, so no staging copy is made, but the
//! same bound is kept: each operation reserves its size for as long as it runs.
//!
//! The policy lives in `Store`, not in the binding: `Store::put`, `put_copied` and
//! `put_many_copied` (bytes of Python objects), `get`, `locate_copy` and `read_many_copied`
//! (copies into new objects) reserve; the zero-copy calls on registered or caller memory
//! (`put_parts`, `put_many`, `get_into`, ...) do not, as upstream's do not stage.

use std::sync::atomic::{AtomicU64, Ordering};

use protocol::ErrorCode;

use super::{error, StoreError};

pub struct LocalBudget {
    capacity: u64,
    in_use: AtomicU64,
}

/// Bytes reserved from the budget; returned when dropped.
pub struct Reservation<'a> {
    budget: &'a LocalBudget,
    bytes: u64,
}

impl LocalBudget {
    pub fn new(capacity: u64) -> LocalBudget {
        LocalBudget {
            capacity,
            in_use: AtomicU64::new(0),
        }
    }

    /// Reserves `bytes`, or fails with `INVALID_PARAMS` when they are not free.
    pub fn reserve(&self, bytes: u64) -> Result<Reservation<'_>, ErrorCode> {
        let mut cur = self.in_use.load(Ordering::Relaxed);
        loop {
            let next = cur.checked_add(bytes).filter(|n| *n <= self.capacity);
            let Some(next) = next else {
                return Err(ErrorCode::InvalidParams);
            };
            match self
                .in_use
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Ok(Reservation {
                        budget: self,
                        bytes,
                    })
                }
                Err(seen) => cur = seen,
            }
        }
    }

    /// [`LocalBudget::reserve`] for `what` (`"put k"`, `"get k"`), failing with the cause a
    /// person reads: the size asked for and the buffer's capacity.
    pub fn reserve_for(
        &self,
        what: impl std::fmt::Display,
        bytes: u64,
    ) -> Result<Reservation<'_>, StoreError> {
        self.reserve(bytes).map_err(|e| {
            StoreError::new(
                e,
                format!(
                    "{what}: {} does not fit in the free local buffer ({} in all)",
                    error::bytes(bytes),
                    error::bytes(self.capacity)
                ),
            )
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

impl Reservation<'_> {
    /// The bytes reserved.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.budget.in_use.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_and_returned() {
        let b = LocalBudget::new(100);
        let r1 = b.reserve(60).unwrap();
        assert!(b.reserve(41).is_err());
        let r2 = b.reserve(40).unwrap();
        drop(r1);
        assert!(b.reserve(60).is_ok());
        drop(r2);
        assert_eq!(
            LocalBudget::new(0).reserve(1).err(),
            Some(ErrorCode::InvalidParams)
        );
        assert!(LocalBudget::new(0).reserve(0).is_ok());
    }
}
