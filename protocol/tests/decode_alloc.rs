//! What decoding a list costs in memory before its elements are known to be there.
//!
//! A counting global allocator (this test binary's own, so no other test shares it) records
//! the peak of live heap bytes while a body is decoded. A body whose count claims as many
//! elements as its bytes allow, and whose first element is bad, must fail having reserved no
//! more than the body's size: before, `Vec<String>` reserved 24 bytes per 4-byte claim.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use protocol::message::{BatchExistKey, Request, Rpc};
use protocol::wire::{DecodeError, Wire};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` with the same layout and pointer; the
// counters are bookkeeping only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's layout is passed on unchanged (GlobalAlloc's contract).
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout (GlobalAlloc's contract).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak heap bytes above what was live before `f` ran.
fn peak_during(f: impl FnOnce()) -> usize {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    f();
    PEAK.load(Ordering::Relaxed) - base
}

/// A `Vec<String>` body claiming `n` strings in `4 * n` bytes, the first of which is not
/// UTF-8 (so decoding fails at the first element).
fn claim_strings(n: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(4 + 4 * n);
    (n as u32).encode(&mut body);
    body.extend_from_slice(&[1, 0, 0, 0, 0xff]);
    body.resize(4 + 4 * n, 0);
    body
}

// One test function: the counters are process-wide, and tests in one binary run in parallel.
#[test]
fn claimed_counts_cost_no_more_than_the_bytes_sent() {
    a_claimed_list_reserves_no_more_than_its_body();
    a_request_claiming_more_than_the_batch_cap_is_refused_before_reserving();
}

fn a_claimed_list_reserves_no_more_than_its_body() {
    let n = 1 << 20;
    let body = claim_strings(n);
    let mut got = None;
    let peak = peak_during(|| got = Some(Vec::<String>::from_bytes(&body)));
    assert_eq!(got, Some(Err(DecodeError::Utf8)));
    assert!(
        peak <= body.len(),
        "decoding a {} byte body reserved {peak} bytes",
        body.len()
    );
}

fn a_request_claiming_more_than_the_batch_cap_is_refused_before_reserving() {
    // A count of 2^31 in 64 bytes: refused by the count, nothing reserved.
    let mut body = Vec::new();
    (1u32 << 31).encode(&mut body);
    body.resize(64, 0);
    let mut got = None;
    let peak = peak_during(|| got = Some(Request::decode(BatchExistKey::OP, &body)));
    assert!(matches!(got, Some(Err(DecodeError::TooLong { .. }))));
    assert!(peak <= 64, "reserved {peak} bytes");
}
