//! Parsing of single flag values: booleans, integers, ratios, ports and durations.
//!
//! Each parser returns `Err(expected)` with a phrase describing what was expected; the caller
//! wraps it with the flag name and the given text into a [`super::ConfigError`].

use super::flags::FlagKind;

/// The largest duration accepted, in milliseconds (about 292 million years would overflow
/// `u64` nanoseconds downstream; a year is plenty for a TTL).
pub const MAX_DURATION_MS: u64 = 365 * 24 * 3600 * 1000;

/// gflags' boolean spellings, case-insensitive ([`protocol::env::parse_flag_bool`]).
pub fn parse_bool(raw: &str) -> Result<bool, &'static str> {
    protocol::env::parse_flag_bool(raw).ok_or("a boolean (true/false, 1/0, yes/no)")
}

/// Whether `raw` spells a boolean (so `--flag true` may consume the next argument).
pub fn is_bool_literal(raw: &str) -> bool {
    parse_bool(raw).is_ok()
}

pub fn parse_i64(raw: &str) -> Result<i64, &'static str> {
    raw.trim().parse::<i64>().map_err(|_| "an integer")
}

pub fn parse_u64(raw: &str) -> Result<u64, &'static str> {
    raw.trim()
        .parse::<u64>()
        .map_err(|_| "a non-negative integer")
}

/// A finite floating-point number.
pub fn parse_f64(raw: &str) -> Result<f64, &'static str> {
    match raw.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err("a number"),
    }
}

/// A number in `[0, 1]`.
pub fn parse_ratio(raw: &str) -> Result<f64, &'static str> {
    const EXPECTED: &str = "a number in [0, 1]";
    let v = parse_f64(raw).map_err(|_| EXPECTED)?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(EXPECTED)
    }
}

/// A TCP port, `0..=65535` (0 lets the OS pick a free port).
pub fn parse_port(raw: &str) -> Result<u16, &'static str> {
    raw.trim()
        .parse::<u16>()
        .map_err(|_| "a port number in 0..=65535")
}

/// An integer in `lo..=hi`; `expected` describes the range.
pub fn parse_in_range(
    raw: &str,
    lo: i64,
    hi: i64,
    expected: &'static str,
) -> Result<i64, &'static str> {
    match raw.trim().parse::<i64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(expected),
    }
}

/// Milliseconds: a raw integer, or an integer with an `ms`, `s`, `m` or `h` suffix.
pub fn parse_duration_ms(raw: &str) -> Result<u64, &'static str> {
    const EXPECTED: &str =
        "milliseconds, or a duration with an ms|s|m|h suffix (e.g. 500, 500ms, 10s, 5m, 1h)";
    let text = raw.trim();
    let (digits, unit_ms) = if let Some(d) = text.strip_suffix("ms") {
        (d, 1)
    } else if let Some(d) = text.strip_suffix('s') {
        (d, 1000)
    } else if let Some(d) = text.strip_suffix('m') {
        (d, 60 * 1000)
    } else if let Some(d) = text.strip_suffix('h') {
        (d, 3600 * 1000)
    } else {
        (text, 1)
    };
    let digits = digits.trim_end();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(EXPECTED);
    }
    let value: u64 = digits.parse().map_err(|_| EXPECTED)?;
    match value.checked_mul(unit_ms) {
        Some(ms) if ms <= MAX_DURATION_MS => Ok(ms),
        _ => Err("a duration of at most 365 days"),
    }
}

/// Checks that `raw` is a valid value of `kind` (used for flags accepted for compatibility).
pub fn check_kind(kind: FlagKind, raw: &str) -> Result<(), &'static str> {
    match kind {
        FlagKind::Bool => parse_bool(raw).map(drop),
        FlagKind::Int32 => {
            parse_in_range(raw, i32::MIN.into(), i32::MAX.into(), "a 32-bit integer").map(drop)
        }
        FlagKind::Int64 => parse_i64(raw).map(drop),
        FlagKind::UInt32 => {
            parse_in_range(raw, 0, u32::MAX.into(), "a non-negative 32-bit integer").map(drop)
        }
        FlagKind::UInt64 => parse_u64(raw).map(drop),
        FlagKind::Double => parse_f64(raw).map(drop),
        FlagKind::Str => Ok(()),
        FlagKind::Duration => parse_duration_ms(raw).map(drop),
    }
}

/// Whether `raw` means the same value as `default` for a flag of `kind`.
pub fn same_value(kind: FlagKind, raw: &str, default: &str) -> bool {
    match kind {
        FlagKind::Bool => parse_bool(raw).ok() == parse_bool(default).ok(),
        FlagKind::Str => raw == default,
        FlagKind::Duration => parse_duration_ms(raw).ok() == parse_duration_ms(default).ok(),
        _ => match (parse_f64(raw), parse_f64(default)) {
            (Ok(a), Ok(b)) => a == b,
            _ => raw.trim() == default,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bools() {
        let cases = [
            ("true", Some(true)),
            ("TRUE", Some(true)),
            ("1", Some(true)),
            ("yes", Some(true)),
            ("y", Some(true)),
            ("t", Some(true)),
            ("false", Some(false)),
            ("0", Some(false)),
            ("no", Some(false)),
            ("No", Some(false)),
            ("2", None),
            ("", None),
            ("maybe", None),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_bool(raw).ok(), want, "{raw:?}");
        }
    }

    #[test]
    fn durations() {
        let cases = [
            ("500", Some(500)),
            ("0", Some(0)),
            ("500ms", Some(500)),
            ("10s", Some(10_000)),
            ("5m", Some(300_000)),
            ("1h", Some(3_600_000)),
            (" 10 s ", Some(10_000)),
            ("24h", Some(86_400_000)),
            ("", None),
            ("ms", None),
            ("-5", None),
            ("1.5s", None),
            ("10d", None),
            ("10sec", None),
            ("abc", None),
            ("99999999999999999999", None),
            ("9999999h", None),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_duration_ms(raw).ok(), want, "{raw:?}");
        }
    }

    #[test]
    fn ratios_and_ports() {
        let ratios = [
            ("0", true),
            ("1", true),
            ("0.95", true),
            ("1.0", true),
            ("-0.1", false),
            ("1.01", false),
            ("nan", false),
            ("inf", false),
            ("x", false),
        ];
        for (raw, ok) in ratios {
            assert_eq!(parse_ratio(raw).is_ok(), ok, "{raw:?}");
        }
        let ports = [
            ("0", Some(0)),
            ("8080", Some(8080)),
            ("65535", Some(65535)),
            ("65536", None),
            ("-1", None),
            ("http", None),
        ];
        for (raw, want) in ports {
            assert_eq!(parse_port(raw).ok(), want, "{raw:?}");
        }
    }

    #[test]
    fn kinds() {
        let cases = [
            (FlagKind::Int32, "2147483647", true),
            (FlagKind::Int32, "2147483648", false),
            (FlagKind::Int32, "-5", true),
            (FlagKind::UInt32, "-1", false),
            (FlagKind::UInt64, "18446744073709551615", true),
            (FlagKind::Int64, "1e3", false),
            (FlagKind::Double, "1e3", true),
            (FlagKind::Str, "", true),
            (FlagKind::Bool, "on", false),
        ];
        for (kind, raw, ok) in cases {
            assert_eq!(check_kind(kind, raw).is_ok(), ok, "{kind:?} {raw:?}");
        }
    }

    #[test]
    fn same_value_normalises() {
        assert!(same_value(FlagKind::Bool, "1", "true"));
        assert!(!same_value(FlagKind::Bool, "false", "true"));
        assert!(same_value(FlagKind::Double, "0.9", "0.90"));
        assert!(same_value(FlagKind::UInt32, "16", "16"));
        assert!(!same_value(FlagKind::Str, "cachelib", "offset"));
        assert!(same_value(FlagKind::Duration, "10s", "10000"));
    }
}
