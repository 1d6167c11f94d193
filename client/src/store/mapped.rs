//! Is an address range mapped in this process? Read from `/proc/self/maps`.
//!
//! The zero-copy calls accept caller memory that was never registered (upstream over TCP
//! copies from any address), but an address Python made up must come back as an error code,
//! not a segfault: a range is used only when every byte of it lies in mappings with the
//! needed permissions. The maps file is read per check, so the check costs a few tens of
//! microseconds; registered memory skips it.

/// True when `[addr, addr + len)` is mapped readable (and writable with `write`) here. When
/// `/proc/self/maps` cannot be read nothing can be checked, and the answer is false.
pub fn is_mapped(addr: u64, len: u64, write: bool) -> bool {
    if len == 0 {
        return true;
    }
    match std::fs::read_to_string("/proc/self/maps") {
        Ok(maps) => covered(&maps, addr, len, write),
        Err(_) => false,
    }
}

/// The check itself, over the text of a maps file (sorted by address, as the kernel writes it).
fn covered(maps: &str, addr: u64, len: u64, write: bool) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let mut at = addr;
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms)) = (it.next(), it.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        if hi <= at {
            continue;
        }
        let p = perms.as_bytes();
        let allowed = p.first() == Some(&b'r') && (!write || p.get(1) == Some(&b'w'));
        if lo > at || !allowed {
            return false;
        }
        at = hi;
        if at >= end {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "1000-3000 rw-p 00000000 00:00 0\n3000-4000 r--p 00000000 00:00 0\n\
                        5000-6000 rw-p 00000000 00:00 0\n";

    #[test]
    fn ranges_across_mappings() {
        assert!(covered(MAPS, 0x1000, 0x2000, true));
        assert!(covered(MAPS, 0x2000, 0x1800, false));
        assert!(!covered(MAPS, 0x2000, 0x1800, true), "read-only tail");
        assert!(!covered(MAPS, 0x3800, 0x1000, false), "hole at 0x4000");
        assert!(!covered(MAPS, 0x8000, 1, false), "past every mapping");
        assert!(!covered(MAPS, u64::MAX, 2, false), "wraps");
    }

    #[test]
    fn own_stack_is_mapped_and_null_is_not() {
        let x = [0u8; 64];
        assert!(is_mapped(x.as_ptr() as u64, 64, true));
        assert!(!is_mapped(0, 8, false));
    }
}
