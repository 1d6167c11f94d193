//! The memcpy of a put's parts into a segment, shared by the two paths that copy: our own
//! segment ([`super::own`]) and a same-host peer's ([`super::shm`]).

use dataplane::mem::copier::{self, Way};
use dataplane::mem::{Dst, Src};
use dataplane::sys::bytes::STREAM_MIN;

/// Whose mapping a put writes through, for [`write_parts`].
#[derive(Clone, Copy)]
pub(super) enum Mapping {
    /// Our own segment.
    Own,
    /// A same-host peer's segment, mapped into this process (`ShmMapping`).
    Peer { hugetlb: bool },
}

/// Writes a put's parts, which add up to `dst`'s length, into `dst`: an object's range in a
/// segment, which this core does not read next (`bench/README.md`, "Same-host 4 MiB put",
/// has the figures for each choice here).
///
/// - Streamed past the cache ([`Src::stream_to`]) when every page under it is allocated
///   already ([`Dst::resident`]); plain when one may still be (a first write into fresh
///   segment memory, where the kernel zeroes each page through the cache and streaming over
///   those lines is slower than a memcpy).
/// - Into a peer's segment, the resident pages are first mapped 16 at a time
///   ([`Dst::map_ahead`]): this process maps the segment for itself, and its first write to
///   each page would otherwise trap once per page, though the page exists. A small object
///   (one page, often) maps its page's 64 KiB window too, so that the next fifteen small puts
///   beside it do not trap: one load when the page is mapped already, and a page nobody wrote
///   yet is allocated by the read as it would be by the write.
/// - A peer's hugetlb segment is taken as allocated: the owner takes its pages from the pool
///   (and prefaults them, as `docs/deploy.md` advises), and our mapping's residency says only
///   whether we touched them; two traps per 4 MiB need no mapping ahead.
/// - From `copier::WIDE_MIN` bytes up, idle helper threads copy pieces beside the caller
///   ([`copier`]).
pub(super) fn write_parts(parts: &[Src<'_>], dst: Dst<'_>, mapping: Mapping) {
    let way = match mapping {
        Mapping::Peer { hugetlb: true } => Way::Stream,
        Mapping::Peer { hugetlb: false } if dst.len() < STREAM_MIN => {
            dst.map_ahead();
            Way::Plain
        }
        _ if !dst.worth_streaming(dst.len()) => Way::Plain,
        Mapping::Peer { hugetlb: false } => Way::MapAheadStream,
        Mapping::Own => Way::Stream,
    };
    let mut rest = dst;
    let mut pairs = Vec::with_capacity(parts.len());
    for &p in parts {
        let (head, tail) = rest.split_at(p.len());
        pairs.push((p, head));
        rest = tail;
    }
    copier::copy_all(pairs, way);
}

/// A get's copy out of a segment: memcpy, its reader being the next user of the bytes.
pub(super) fn read_into(from: Src<'_>, dst: Dst<'_>) {
    copier::copy_all(vec![(from, dst)], Way::Plain);
}
