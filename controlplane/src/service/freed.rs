//! Per-segment outbox of freed ranges, told to the segment's owner in its next `Ping`.
//!
//! Owners keep a catalog of the objects in their segments to re-report them after a master
//! restart (`docs/recovery.md`). When the master frees a span (remove, eviction, revoke,
//! discard, a replaced value's buffer), the owner must drop the matching catalog entry, or a
//! removed object would come back after the next restart. The master queues the span here and
//! hands the queue to the owner with the next `PingResponse`.
//!
//! Invariants:
//! - queued ranges are disjoint and none overlaps a live allocation: allocating or reserving
//!   a span first [`FreedOutbox::claim`]s it, cutting it out of every queued range. So a
//!   notice can never name a range a newer object lives in (the owner's side of the same
//!   guarantee is `Catalog::forget`'s mark);
//! - at most [`FREED_OUTBOX_MAX`] ranges are queued; beyond that a freed range is not queued
//!   (counted in `dropped`) and its catalog entry lingers until the range is reused.

use std::collections::BTreeMap;

use protocol::limits::FREED_OUTBOX_MAX;

use crate::alloc::Span;

#[derive(Debug, Default)]
pub(crate) struct FreedOutbox {
    /// addr -> len, disjoint.
    ranges: BTreeMap<u64, u64>,
    /// Freed ranges not queued because the outbox was full.
    pub dropped: u64,
}

impl FreedOutbox {
    /// Queues a span the allocator just freed.
    pub fn push(&mut self, span: Span) {
        if span.len == 0 {
            return;
        }
        if self.ranges.len() >= FREED_OUTBOX_MAX {
            self.dropped += 1;
            return;
        }
        // A freed span was allocated, so `claim` cut it out of every queued range: no overlap.
        self.ranges.insert(span.addr, span.len);
    }

    /// Cuts a span that is being allocated out of every queued range.
    pub fn claim(&mut self, span: Span) {
        let (start, end) = (span.addr, span.end());
        let mut hit: Vec<(u64, u64)> = Vec::new();
        if let Some((&a, &l)) = self.ranges.range(..start).next_back() {
            if a + l > start {
                hit.push((a, l));
            }
        }
        hit.extend(self.ranges.range(start..end).map(|(&a, &l)| (a, l)));
        for (a, l) in hit {
            self.ranges.remove(&a);
            if a < start {
                self.ranges.insert(a, start - a);
            }
            if a + l > end {
                self.ranges.insert(end, a + l - end);
            }
        }
    }

    /// Takes up to `max` queued ranges, lowest addresses first.
    pub fn drain(&mut self, max: usize, out: &mut Vec<(u64, u64)>) {
        while out.len() < max {
            match self.ranges.pop_first() {
                Some(r) => out.push(r),
                None => return,
            }
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ranges.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(addr: u64, len: u64) -> Span {
        Span { addr, len }
    }

    #[test]
    fn claims_cut_queued_ranges() {
        let mut o = FreedOutbox::default();
        o.push(span(100, 100));
        o.push(span(300, 50));
        o.claim(span(150, 10));
        o.claim(span(290, 20));
        let mut out = Vec::new();
        o.drain(2, &mut out);
        assert_eq!(out, vec![(100, 50), (160, 40)]);
        out.clear();
        o.drain(10, &mut out);
        assert_eq!(out, vec![(310, 40)]);
        assert_eq!(o.len(), 0);
    }
}
