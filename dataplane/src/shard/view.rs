//! A shard's view of the memory it serves: its own copy of the registration table and the
//! [`MemoryGate`] through which `ServedMemory::unregister` waits for it.
//!
//! Protocol (a Dekker-style handshake, all accesses `SeqCst`):
//! - the shard, to start an operation on registered memory: refresh the copy if the table's
//!   generation moved; check the range; count the operation under the copy's generation `g`
//!   and publish the oldest counted generation in the gate; load the table's generation
//!   again, and if it is no longer `g`, uncount and start over;
//! - unregister: remove the buffer and bump the generation to `g'`; then wait until every
//!   gate shows no generation older than `g'`.
//!
//! Either the shard sees `g'` on its second load (and re-checks against the new table, which
//! refuses the range), or unregister sees the shard's published `g < g'` and waits until the
//! operation is released. So when unregister returns, no operation checked against the old
//! table is in flight.
//!
//! Invariant: every [`MemoryLease`] handed out is given back to [`MemoryView::release`]
//! exactly once, after the kernel is done with the memory it covers.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::mem::served::{MemoryGate, ServedMemory};
use crate::mem::Registry;
use crate::transport::header::RequestHeader;
use crate::TeError;

/// Permission to touch a checked range until it is released. Not `Clone`: one per operation.
#[derive(Debug)]
#[must_use = "a lease must be released, or unregister waits forever"]
pub(crate) struct MemoryLease {
    generation: u64,
}

/// The shard's copy of the table; see the module docs.
pub(crate) struct MemoryView {
    memory: Arc<ServedMemory>,
    gate: Arc<MemoryGate>,
    generation: u64,
    registry: Registry,
    /// generation -> operations in flight that were checked against it.
    in_use: BTreeMap<u64, u32>,
    /// The value last published in the gate.
    published: u64,
}

impl MemoryLease {
    /// A lease not backed by any view, for unit tests of code that carries leases.
    #[cfg(test)]
    pub(crate) fn detached() -> MemoryLease {
        MemoryLease { generation: 0 }
    }
}

impl MemoryView {
    /// A view of `memory`, attached as a new gate.
    pub(crate) fn new(memory: Arc<ServedMemory>) -> MemoryView {
        let gate = memory.attach_gate();
        let (generation, registry) = memory.snapshot_with_generation();
        MemoryView {
            memory,
            gate,
            generation,
            registry,
            in_use: BTreeMap::new(),
            published: u64::MAX,
        }
    }

    /// Checks a request's range; on success the range may be touched until the lease is
    /// released. Errors: `len == 0` is `InvalidArgument`; a range outside one registered
    /// buffer (or not addressable here) is `AddressNotRegistered`.
    pub(crate) fn check(&mut self, req: &RequestHeader) -> Result<MemoryLease, TeError> {
        if req.len == 0 {
            return Err(TeError::InvalidArgument);
        }
        loop {
            if self.memory.generation() != self.generation {
                (self.generation, self.registry) = self.memory.snapshot_with_generation();
            }
            let addressable = usize::try_from(req.addr)
                .ok()
                .and_then(|a| a.checked_add(usize::try_from(req.len).ok()?))
                .is_some();
            if !addressable || !self.registry.check(req.addr, req.len) {
                return Err(TeError::AddressNotRegistered);
            }
            let lease = self.acquire(self.generation);
            if self.memory.generation() == self.generation {
                return Ok(lease);
            }
            self.release(lease);
        }
    }

    fn acquire(&mut self, generation: u64) -> MemoryLease {
        *self.in_use.entry(generation).or_insert(0) += 1;
        self.publish();
        MemoryLease { generation }
    }

    /// The table this view copies (for requests that are not on the byte path).
    pub(crate) fn memory(&self) -> &ServedMemory {
        &self.memory
    }

    /// Gives a lease back once the kernel no longer touches its range.
    pub(crate) fn release(&mut self, lease: MemoryLease) {
        let n = self
            .in_use
            .get_mut(&lease.generation)
            .expect("a lease is released once, after it was acquired");
        assert!(*n > 0);
        *n -= 1;
        if *n == 0 {
            self.in_use.remove(&lease.generation);
        }
        self.publish();
    }

    /// Operations holding a lease now.
    pub(crate) fn leases_out(&self) -> u64 {
        self.in_use.values().map(|&n| u64::from(n)).sum()
    }

    fn publish(&mut self) {
        let oldest = self.in_use.keys().next().copied().unwrap_or(u64::MAX);
        if oldest != self.published {
            self.gate.publish(oldest);
            self.published = oldest;
        }
    }

    /// Keeps the gate alive for ever: used when a stopping shard must abandon operations
    /// still in flight, so that unregister keeps waiting rather than freeing their memory.
    pub(crate) fn abandon(self) {
        std::mem::forget(self.gate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::header::Opcode;

    fn req(addr: u64, len: u64) -> RequestHeader {
        RequestHeader {
            opcode: Opcode::Read,
            request_id: 1,
            addr,
            len,
        }
    }

    #[test]
    fn follows_registration_changes_and_blocks_unregister_while_leased() {
        let memory = ServedMemory::new();
        let mut view = MemoryView::new(memory.clone());
        assert_eq!(
            view.check(&req(4096, 10)).unwrap_err(),
            TeError::AddressNotRegistered
        );
        // SAFETY: the range is never dereferenced: this test only exercises the table.
        unsafe { memory.register(4096, 4096).unwrap() };
        let lease = view.check(&req(4096, 10)).unwrap();
        assert_eq!(view.leases_out(), 1);
        assert_eq!(
            view.check(&req(4096, 0)).unwrap_err(),
            TeError::InvalidArgument
        );
        std::thread::scope(|s| {
            let m = memory.clone();
            let unregister = s.spawn(move || m.unregister(4096));
            std::thread::sleep(std::time::Duration::from_millis(30));
            assert!(
                !unregister.is_finished(),
                "unregister must wait for the lease"
            );
            view.release(lease);
            assert_eq!(unregister.join().unwrap(), Ok(4096));
        });
        assert_eq!(
            view.check(&req(4096, 10)).unwrap_err(),
            TeError::AddressNotRegistered
        );
        assert_eq!(view.leases_out(), 0);
    }
}
