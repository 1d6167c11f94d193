//! The object file: its header, its name, and its length.
//!
//! One file per object, named by the object's disk address (`<address as 16 hex>.mco`) in
//! its worker's subdirectory. All integers little-endian:
//!
//! ```text
//!  0        4          8          12         16               24               32
//!  | "MCDK" | format=1 | hdr_len  | key_len  | term u64       | seq u64        |
//!  32                  40                    44          48
//!  | size u64          | data crc32 u32      | flags u32 (bit 0 hard pin, bit 1 soft pin)
//!  48                  56                    60          64
//!  | soft_pin_ttl_ms u64| header crc32 u32   | reserved 0 u32
//!  64 .. 64+key_len: the key (UTF-8, scoped as the catalog keeps it)
//!  then zeros up to hdr_len (the smallest multiple of 4096 that holds 64+key_len),
//!  then size bytes of data, then zeros up to the next multiple of 4096
//! ```
//!
//! The header crc32 covers bytes `0..56` and the key (it cannot cover itself). Every length
//! is a multiple of 4096 so that the whole file moves in aligned blocks under `O_DIRECT`, and
//! a file's length is a function of its header ([`FileHeader::file_len`]): a file cut short
//! (a crash between the write and the rename's journal commit, a full disk) is told apart at
//! the scan without reading its data.
//!
//! Invariant: [`FileHeader::decode`] never panics, and whatever it accepts
//! [`FileHeader::encode`] gives back byte for byte (the fuzz target `disk_header` checks
//! both).

use protocol::Version;

use super::limits::DISK_BLOCK_BYTES;

/// The magic, the bytes `MCDK` at offset 0.
pub const FILE_MAGIC: [u8; 4] = *b"MCDK";
/// The only format written and read.
pub const FILE_FORMAT: u32 = 1;
/// The fixed part of the header, before the key.
pub const FILE_HEADER_FIXED_BYTES: usize = 64;
/// Suffix of an object file.
pub const OBJECT_SUFFIX: &str = ".mco";
/// Suffix of a file being written (deleted by the scan at start).
pub const TEMP_SUFFIX: &str = ".tmp";

const FLAG_HARD_PIN: u32 = 1;
const FLAG_SOFT_PIN: u32 = 2;

/// What an object file's header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileHeader {
    pub key: String,
    pub version: Version,
    /// Data bytes.
    pub size: u64,
    /// crc32 of the data bytes.
    pub data_crc: u32,
    pub hard_pin: bool,
    /// The soft pin the put asked for: `Some(ttl_ms)`, `Some(0)` for the master's default.
    pub soft_pin_ttl_ms: Option<u64>,
}

/// Why a header did not decode; each says what was expected and what was found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("header needs {expected} bytes, the file has {got}")]
    Short { expected: usize, got: usize },
    #[error("bad magic: expected \"MCDK\", found {got:?}")]
    BadMagic { got: [u8; 4] },
    #[error("unknown format {got} (this build reads {FILE_FORMAT})")]
    BadFormat { got: u32 },
    #[error("header length {got} is not the {expected} its key of {key_len} bytes needs")]
    BadHeaderLength {
        expected: u64,
        got: u32,
        key_len: u32,
    },
    #[error("key length {got} is not in 1..={max}")]
    BadKeyLength { got: u32, max: usize },
    #[error("unknown flags {got:#x}, or a soft-pin ttl without the soft-pin flag")]
    BadFlags { got: u32 },
    #[error("reserved field is {got:#x}, expected 0")]
    Reserved { got: u32 },
    #[error("header checksum {stored:#010x} does not match the header's {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("the key is not UTF-8")]
    KeyNotUtf8,
    #[error("size {got} is 0 or too large for a file")]
    BadSize { got: u64 },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// `n` rounded up to a multiple of [`DISK_BLOCK_BYTES`]; `None` on overflow.
pub fn round_up(n: u64) -> Option<u64> {
    let b = DISK_BLOCK_BYTES as u64;
    n.checked_add(b - 1).map(|x| x / b * b)
}

/// The header length a key of `key_len` bytes takes.
pub fn header_len(key_len: usize) -> u64 {
    // 64 + KEY_MAX_BYTES cannot overflow; the key length is checked before it gets here.
    round_up(FILE_HEADER_FIXED_BYTES as u64 + key_len as u64).unwrap_or(u64::MAX)
}

/// The largest object a file may hold: its file length must stay a `u64` and an `i64` offset.
pub const SIZE_MAX: u64 = 1 << 56;

impl FileHeader {
    /// Header bytes (a multiple of 4096), where the data starts.
    pub fn header_len(&self) -> u64 {
        header_len(self.key.len())
    }

    /// The whole file's length: header, data, padding.
    pub fn file_len(&self) -> u64 {
        self.header_len() + round_up(self.size).unwrap_or(u64::MAX)
    }

    /// The header block, `header_len()` bytes, zero-padded.
    pub fn encode(&self) -> Vec<u8> {
        let hdr_len = self.header_len();
        let mut b = vec![0u8; hdr_len as usize];
        b[0..4].copy_from_slice(&FILE_MAGIC);
        b[4..8].copy_from_slice(&FILE_FORMAT.to_le_bytes());
        b[8..12].copy_from_slice(&(hdr_len as u32).to_le_bytes());
        b[12..16].copy_from_slice(&(self.key.len() as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.version.term.to_le_bytes());
        b[24..32].copy_from_slice(&self.version.seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.size.to_le_bytes());
        b[40..44].copy_from_slice(&self.data_crc.to_le_bytes());
        let mut flags = 0;
        if self.hard_pin {
            flags |= FLAG_HARD_PIN;
        }
        if self.soft_pin_ttl_ms.is_some() {
            flags |= FLAG_SOFT_PIN;
        }
        b[44..48].copy_from_slice(&flags.to_le_bytes());
        b[48..56].copy_from_slice(&self.soft_pin_ttl_ms.unwrap_or(0).to_le_bytes());
        let key_end = FILE_HEADER_FIXED_BYTES + self.key.len();
        b[FILE_HEADER_FIXED_BYTES..key_end].copy_from_slice(self.key.as_bytes());
        let crc = header_crc(&b[0..56], self.key.as_bytes());
        b[56..60].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The bytes a decode needs: the fixed part, then (from it) the whole header block.
    /// `None` while `b` is shorter than the fixed part or the length field does not decode.
    pub fn needed(b: &[u8]) -> Option<usize> {
        (b.len() >= FILE_HEADER_FIXED_BYTES).then(|| u32_at(b, 8) as usize)
    }

    /// Decodes the header at the start of `b` (at least its `hdr_len` bytes).
    pub fn decode(b: &[u8]) -> Result<FileHeader, HeaderError> {
        let (hdr_len, key_len) = Self::decode_lengths(b)?;
        let flags = u32_at(b, 44);
        let ttl = u64_at(b, 48);
        if flags & !(FLAG_HARD_PIN | FLAG_SOFT_PIN) != 0 || (flags & FLAG_SOFT_PIN == 0 && ttl != 0)
        {
            return Err(HeaderError::BadFlags { got: flags });
        }
        let reserved = u32_at(b, 60);
        if reserved != 0 {
            return Err(HeaderError::Reserved { got: reserved });
        }
        let key_end = FILE_HEADER_FIXED_BYTES + key_len as usize;
        let key = &b[FILE_HEADER_FIXED_BYTES..key_end];
        let stored = u32_at(b, 56);
        let computed = header_crc(&b[0..56], key);
        if stored != computed {
            return Err(HeaderError::Checksum { stored, computed });
        }
        // The padding is part of the format: zeros, so that encode gives these bytes back.
        if b[key_end..hdr_len as usize].iter().any(|&x| x != 0) {
            return Err(HeaderError::Reserved { got: u32::MAX });
        }
        let key = std::str::from_utf8(key).map_err(|_| HeaderError::KeyNotUtf8)?;
        let size = u64_at(b, 32);
        if size == 0 || size > SIZE_MAX {
            return Err(HeaderError::BadSize { got: size });
        }
        Ok(FileHeader {
            key: key.to_string(),
            version: Version {
                term: u64_at(b, 16),
                seq: u64_at(b, 24),
            },
            size,
            data_crc: u32_at(b, 40),
            hard_pin: flags & FLAG_HARD_PIN != 0,
            soft_pin_ttl_ms: (flags & FLAG_SOFT_PIN != 0).then_some(ttl),
        })
    }

    /// Checks the magic, the format, the key length and the header length at the start of
    /// `b`, and that `b` holds the whole header block; returns (header length, key length).
    fn decode_lengths(b: &[u8]) -> Result<(u32, u32), HeaderError> {
        if b.len() < FILE_HEADER_FIXED_BYTES {
            return Err(HeaderError::Short {
                expected: FILE_HEADER_FIXED_BYTES,
                got: b.len(),
            });
        }
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&b[0..4]);
        if magic != FILE_MAGIC {
            return Err(HeaderError::BadMagic { got: magic });
        }
        let format = u32_at(b, 4);
        if format != FILE_FORMAT {
            return Err(HeaderError::BadFormat { got: format });
        }
        let hdr_len = u32_at(b, 8);
        let key_len = u32_at(b, 12);
        let max = protocol::limits::KEY_MAX_BYTES;
        if key_len == 0 || key_len as usize > max {
            return Err(HeaderError::BadKeyLength { got: key_len, max });
        }
        let expected = header_len(key_len as usize);
        if u64::from(hdr_len) != expected {
            return Err(HeaderError::BadHeaderLength {
                expected,
                got: hdr_len,
                key_len,
            });
        }
        if b.len() < hdr_len as usize {
            return Err(HeaderError::Short {
                expected: hdr_len as usize,
                got: b.len(),
            });
        }
        Ok((hdr_len, key_len))
    }
}

fn header_crc(fixed: &[u8], key: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(fixed);
    h.update(key);
    h.finalize()
}

/// The file name of the object at `addr`.
pub fn object_name(addr: u64) -> String {
    format!("{addr:016x}{OBJECT_SUFFIX}")
}

/// The temporary name the object at `addr` is written under before its rename.
pub fn temp_name(addr: u64) -> String {
    format!("{addr:016x}{OBJECT_SUFFIX}{TEMP_SUFFIX}")
}

/// The address an object file's name says; `None` for any other name.
pub fn parse_object_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(OBJECT_SUFFIX)?;
    if hex.len() != 16 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FileHeader {
        FileHeader {
            key: "tenant/key-1".into(),
            version: Version { term: 3, seq: 9 },
            size: 4097,
            data_crc: 0xdead_beef,
            hard_pin: true,
            soft_pin_ttl_ms: Some(500),
        }
    }

    #[test]
    fn header_layout_is_the_documented_one() {
        let h = sample();
        let b = h.encode();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[0..4], b"MCDK");
        assert_eq!(u32_at(&b, 4), 1);
        assert_eq!(u32_at(&b, 8), 4096);
        assert_eq!(u32_at(&b, 12), 12);
        assert_eq!(u64_at(&b, 16), 3);
        assert_eq!(u64_at(&b, 24), 9);
        assert_eq!(u64_at(&b, 32), 4097);
        assert_eq!(u32_at(&b, 40), 0xdead_beef);
        assert_eq!(u32_at(&b, 44), 3);
        assert_eq!(u64_at(&b, 48), 500);
        assert_eq!(u32_at(&b, 60), 0);
        assert_eq!(&b[64..76], b"tenant/key-1");
        assert_eq!(FileHeader::decode(&b), Ok(h.clone()));
        assert_eq!(h.file_len(), 4096 + 8192);
    }

    #[test]
    fn every_flipped_byte_of_the_header_is_caught() {
        let b = sample().encode();
        for at in 0..76 {
            let mut c = b.clone();
            c[at] ^= 0x40;
            assert!(FileHeader::decode(&c).is_err(), "flip at {at} accepted");
        }
        assert!(FileHeader::decode(&b[..100]).is_err());
    }

    /// What the fuzz target `disk_header` checks, over every single-byte change of two
    /// headers: no panic, and what decodes encodes to the same bytes.
    #[test]
    fn decode_of_mutations_never_panics_and_round_trips() {
        let long = FileHeader {
            key: "k".repeat(4100),
            soft_pin_ttl_ms: None,
            ..sample()
        };
        for h in [sample(), long] {
            let b = h.encode();
            for at in 0..b.len().min(4200) {
                for x in [1u8, 0x80, 0xff] {
                    let mut c = b.clone();
                    c[at] ^= x;
                    if let Ok(d) = FileHeader::decode(&c) {
                        assert_eq!(d.encode(), &c[..d.header_len() as usize]);
                    }
                }
            }
            for cut in [0, 10, 63, 64, 100, b.len() - 1] {
                assert!(FileHeader::decode(&b[..cut]).is_err());
            }
        }
    }

    /// The fuzz seeds were written from the documented layout by another encoder (Python's
    /// struct and zlib.crc32): this decoder reads them.
    #[test]
    fn the_fuzz_seeds_decode() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/disk_header");
        let plain = FileHeader::decode(&std::fs::read(dir.join("plain")).unwrap()).unwrap();
        assert_eq!(
            (plain.key.as_str(), plain.size, plain.data_crc),
            ("tenant/key", 4097, 0x1234_5678)
        );
        assert_eq!(plain.version, Version { term: 1, seq: 2 });
        let pinned = FileHeader::decode(&std::fs::read(dir.join("pinned")).unwrap()).unwrap();
        assert_eq!(pinned.header_len(), 8192);
        assert!(pinned.hard_pin);
        assert_eq!(pinned.soft_pin_ttl_ms, Some(500));
    }

    #[test]
    fn names_round_trip() {
        let a = (1u64 << 60) + 0x1234;
        assert_eq!(parse_object_name(&object_name(a)), Some(a));
        assert_eq!(parse_object_name(&temp_name(a)), None);
        assert_eq!(parse_object_name("zz.mco"), None);
    }
}
