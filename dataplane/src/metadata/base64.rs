//! Base64 (RFC 4648) for the etcd gateway, whose JSON carries keys and values as base64
//! `bytes` fields.
//!
//! [`encode`] writes the standard alphabet with `=` padding, as the gateway does. [`decode`]
//! accepts what the gateway's own decoder accepts: the standard or the URL-safe alphabet,
//! with or without padding. Trailing bits that do not fill a byte are ignored.
//!
//! Why not a crate: thirty lines with tests; the data plane keeps its dependencies few
//! (`docs/` house rules).
//!
//! Invariant: [`decode`] never panics; any input that is not base64 is an error saying which
//! byte is wrong.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `bytes` as standard base64 with padding.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn sextet(c: u8) -> Option<u32> {
    let v = match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' | b'-' => 62,
        b'/' | b'_' => 63,
        _ => return None,
    };
    Some(u32::from(v))
}

/// Decodes standard or URL-safe base64, padded or not.
pub fn decode(text: &str) -> Result<Vec<u8>, String> {
    let bytes = text.as_bytes();
    let data_len = bytes.iter().rposition(|&c| c != b'=').map_or(0, |i| i + 1);
    let padding = bytes.len() - data_len;
    if padding > 2 || (padding > 0 && !bytes.len().is_multiple_of(4)) {
        return Err(format!(
            "base64: bad padding ({padding} '=' in {} characters)",
            bytes.len()
        ));
    }
    let data = &bytes[..data_len];
    if data.len() % 4 == 1 {
        return Err(format!(
            "base64: {} characters cannot encode whole bytes",
            data.len()
        ));
    }
    let mut out = Vec::with_capacity(data.len() / 4 * 3 + 2);
    for (ci, chunk) in data.chunks(4).enumerate() {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            let v = sextet(c).ok_or_else(|| {
                format!(
                    "base64: byte {:#04x} at offset {} is not in the alphabet",
                    c,
                    ci * 4 + i
                )
            })?;
            n |= v << (18 - 6 * i);
        }
        // 2 characters carry 1 byte, 3 carry 2, 4 carry 3.
        let whole = chunk.len() - 1;
        out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8][..whole]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4648_vectors() {
        let v = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, enc) in v {
            assert_eq!(encode(plain.as_bytes()), enc);
            assert_eq!(decode(enc).unwrap(), plain.as_bytes());
            assert_eq!(decode(enc.trim_end_matches('=')).unwrap(), plain.as_bytes());
        }
    }

    #[test]
    fn both_alphabets_and_every_byte() {
        let all: Vec<u8> = (0..=255u8).collect();
        let e = encode(&all);
        assert_eq!(decode(&e).unwrap(), all);
        let url_safe = e.replace('+', "-").replace('/', "_");
        assert_ne!(url_safe, e);
        assert_eq!(decode(&url_safe).unwrap(), all);
        assert_eq!(encode(&[0xfb, 0xff]), "+/8=");
        assert_eq!(decode("-_8").unwrap(), [0xfb, 0xff]);
    }

    #[test]
    fn round_trips_random_lengths() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..200usize {
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let e = encode(&data);
            assert_eq!(e.len(), len.div_ceil(3) * 4);
            assert_eq!(decode(&e).unwrap(), data, "len {len}");
        }
    }

    #[test]
    fn garbage_is_an_error() {
        for bad in [
            "Z", "Zg=", "Zg===", "=", "Z===", "Zm9v!", "Zm 9v", "Zg==Zg==", "é", "Zm9=v",
        ] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
        let e = decode("Zm9v*A").unwrap_err();
        assert!(e.contains("0x2a") && e.contains("offset 4"), "{e}");
    }
}
