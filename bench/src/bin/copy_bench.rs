//! A put's copy into segment memory: plain memcpy (`Src::copy_to`) against streaming stores
//! (`Src::stream_to`) and streaming stores shared with the copy helpers
//! (`copier::copy_all`, from `copier::WIDE_MIN` up; `MC_STORE_COPY_THREADS` sets how many), by size, into destinations that are resident but not in the cache, and
//! into pages never touched (the first write into fresh segment memory).
//!
//! ```text
//! cargo run --release -p mooncake-bench --bin copy_bench -- [--segment-mib 1024] [--rounds 3]
//! ```
//!
//! A shared memfd mapping (as a storage node's segment) is filled once; each size then copies
//! one hot source into destinations spread over the whole mapping (a put's destination is a
//! freshly allocated range, rarely cached), with `copy_to`, `stream_to` and `copy_all`, and
//! prints GB/s per round. `fresh` writes 4 MiB into pages of a second mapping that nobody has
//! touched yet, where each page fault allocates and zeroes the page: the case
//! `paths::copy::write_parts` leaves to memcpy (`Dst::resident`).

use std::time::Instant;

use dataplane::mem::copier::{self, Way};
use dataplane::mem::{Dst, HugepagePolicy, Segment, SegmentOptions, Src};
use dataplane::sys::bytes::STREAM_MIN;

/// A memfd-backed shared segment, as a storage node's (plain pages, not prefaulted).
fn shared_segment(len: usize) -> Segment {
    let opts = SegmentOptions {
        hugepages: HugepagePolicy::Never,
        prefault: false,
    };
    Segment::new_shared(len, opts).expect("a shared segment")
}

/// `--help`.
const USAGE: &str = "copy_bench: copies into a shared segment, cold and warm pages

copy_bench [--segment-mib 1024] [--rounds 3]";

fn main() {
    mooncake_bench::help(USAGE);
    let mut segment_mib = 1024usize;
    let mut rounds = 3usize;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| mooncake_bench::usage_error(format_args!("{a} wants a number")))
        };
        match a.as_str() {
            "--segment-mib" => segment_mib = value(),
            "--rounds" => rounds = value(),
            _ => mooncake_bench::usage_error(format_args!("unknown argument {a}")),
        }
    }
    let len = segment_mib << 20;
    let seg = shared_segment(len);
    // SAFETY: our own segment of `len` bytes, mapped until `seg` drops at the end; nothing
    // else forms a reference over it.
    let mut whole = unsafe { Dst::from_raw(seg.as_ptr(), len) };
    let fill = vec![1u8; 1 << 20];
    for mut d in whole.reborrow().chunks(1 << 20) {
        Src::from(&fill[..]).copy_to(&mut d);
    }
    let source: Vec<u8> = (0..4usize << 20).map(|i| (i * 31) as u8).collect();
    println!(
        "streaming from {} bytes up, shared with {} helpers from {} up; GB/s per round, \
         copy_to / stream_to / shared",
        STREAM_MIN,
        copier::helpers_wanted(),
        copier::WIDE_MIN
    );
    for size in [
        4usize << 10,
        16 << 10,
        64 << 10,
        256 << 10,
        1 << 20,
        4 << 20,
    ] {
        let slots = len / size;
        let n = slots.min(20_000);
        let src = Src::from(&source[..size]);
        let mut line = format!("{:>8} B resident:", size);
        for _ in 0..rounds {
            let mut rates = [0.0f64; 3];
            for (k, rate) in rates.iter_mut().enumerate() {
                let t = Instant::now();
                for i in 0..n {
                    // Spread over the mapping, as a segment's allocations are.
                    let slot = (i * 7919) % slots;
                    let mut d = whole.tail(slot * size).split_at(size).0;
                    match k {
                        0 => src.copy_to(&mut d),
                        1 => src.stream_to(&mut d),
                        _ => copier::copy_all(vec![(src, d)], Way::Stream),
                    }
                }
                *rate = (size * n) as f64 / t.elapsed().as_secs_f64() / 1e9;
            }
            line += &format!("  {:5.2} / {:5.2} / {:5.2}", rates[0], rates[1], rates[2]);
        }
        println!("{line}");
    }
    // Fresh pages: a new mapping per round and method, 48 x 4 MiB each.
    let size = 4usize << 20;
    let mut line = format!("{:>8} B fresh:   ", size);
    for _ in 0..rounds {
        let mut rates = [0.0f64; 2];
        for (k, rate) in rates.iter_mut().enumerate() {
            let fresh = shared_segment(48 * size);
            // SAFETY: our own new segment of 48 * size bytes, mapped until `fresh` drops at
            // the end of this iteration, after the last use of `d`.
            let mut d = unsafe { Dst::from_raw(fresh.as_ptr(), 48 * size) };
            let src = Src::from(&source[..]);
            let t = Instant::now();
            for mut piece in d.reborrow().chunks(size) {
                if k == 0 {
                    src.copy_to(&mut piece);
                } else {
                    src.stream_to(&mut piece);
                }
            }
            *rate = (48 * size) as f64 / t.elapsed().as_secs_f64() / 1e9;
        }
        line += &format!("  {:5.2} / {:5.2}", rates[0], rates[1]);
    }
    println!("{line}");
}
