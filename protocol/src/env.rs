//! One reading of the small values every program takes from its environment and flags:
//! booleans, sizes and microsecond budgets. Before this module each crate parsed them its own
//! way (six boolean parsers accepted six different sets of words); now `MC_STORE_SHM=off`,
//! `--prefault=yes` and `MC_STORE_USE_HUGEPAGE=T` mean what they look like everywhere.
//!
//! Nothing here logs: the callers decide whether a malformed value is an error (flags) or
//! falls back to the default (environment variables, as upstream does).

/// The words read as true, case-insensitive, surrounding blanks ignored.
pub const TRUE_WORDS: [&str; 6] = ["1", "true", "t", "yes", "y", "on"];
/// The words read as false, case-insensitive, surrounding blanks ignored.
pub const FALSE_WORDS: [&str; 6] = ["0", "false", "f", "no", "n", "off"];

/// A boolean spelled with one of [`TRUE_WORDS`] or [`FALSE_WORDS`]; `None` for anything else.
pub fn parse_bool(raw: &str) -> Option<bool> {
    let word = raw.trim().to_ascii_lowercase();
    if TRUE_WORDS.contains(&word.as_str()) {
        Some(true)
    } else if FALSE_WORDS.contains(&word.as_str()) {
        Some(false)
    } else {
        None
    }
}

/// A command-line flag's boolean, as gflags reads it (upstream's programs use gflags): the words
/// of [`parse_bool`] except `on`/`off`, which gflags refuses. Every program's flag parser uses
/// this one, so `--flag=on` is an error everywhere, as it is upstream.
pub fn parse_flag_bool(raw: &str) -> Option<bool> {
    let word = raw.trim().to_ascii_lowercase();
    if word == "on" || word == "off" {
        return None;
    }
    parse_bool(&word)
}

/// The boolean environment variable `name`: `default` when it is unset or not a boolean word.
pub fn flag(name: &str, default: bool) -> bool {
    std::env::var(name)
        .ok()
        .and_then(|v| parse_bool(&v))
        .unwrap_or(default)
}

/// The whole number of microseconds in the environment variable `name`: `default` when it is
/// unset or not a number. Used for the busy-poll budgets (0 turns polling off).
pub fn micros(name: &str, default: u64) -> std::time::Duration {
    let us = std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default);
    std::time::Duration::from_micros(us)
}

/// The log filter the environment asks for, as upstream's variables spell it:
/// `MC_YLT_LOG_LEVEL` (a level name; `critical` is `error`), else `MC_LOG_LEVEL` (`0` info,
/// `1` warn, `2`/`3` error, or a level name or filter), else `default`. Every program and the
/// Python module set up their logger through `log::init_logging` (the `logging` feature),
/// where `RUST_LOG` overrides this.
pub fn log_level(default: &str) -> String {
    log_level_from(default, |name| std::env::var(name).ok())
}

/// [`log_level`] with the variables read through `var` (the environment, or a test's map).
pub fn log_level_from(default: &str, var: impl Fn(&str) -> Option<String>) -> String {
    let named = |v: &str| match v.trim().to_ascii_lowercase().as_str() {
        "" => None,
        "critical" => Some("error".to_string()),
        other => Some(other.to_string()),
    };
    if let Some(l) = var("MC_YLT_LOG_LEVEL").and_then(|v| named(&v)) {
        return l;
    }
    match var("MC_LOG_LEVEL").as_deref().map(str::trim) {
        Some("0") => "info".to_string(),
        Some("1") => "warn".to_string(),
        Some("2") | Some("3") => "error".to_string(),
        Some(other) => named(other).unwrap_or_else(|| default.to_string()),
        None => default.to_string(),
    }
}

/// A size: `"16777216"`, `"16MB"`, `"16 mb"`, `"1.5GB"`, `"4 GiB"`, `"512K"`. Units are binary
/// multiples (`KB` = `KiB` = 1024), as upstream reads them. Whole numbers are exact; a fraction
/// is rounded down to a byte. Percentages, negative numbers and unknown units are refused.
pub fn parse_size(raw: &str) -> Result<u64, String> {
    let s = raw.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "size {raw:?}: unknown unit {other:?} (B, KB, MB, GB, TB)"
            ))
        }
    };
    if num.is_empty() {
        return Err(format!(
            "size {raw:?}: expected a number and a unit such as \"4 GB\""
        ));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(1u64 << shift)
            .ok_or_else(|| format!("size {raw:?} is out of range"));
    }
    let f: f64 = num
        .parse()
        .map_err(|_| format!("size {raw:?}: expected a number and a unit such as \"4 GB\""))?;
    let bytes = f * (1u64 << shift) as f64;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64) {
        return Err(format!("size {raw:?} is out of range"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_read_the_same_words_everywhere() {
        for w in ["1", "true", "TRUE", " yes ", "Y", "t", "on", "On"] {
            assert_eq!(parse_bool(w), Some(true), "{w}");
        }
        for w in ["0", "false", "No", "n", "F", "off", " OFF"] {
            assert_eq!(parse_bool(w), Some(false), "{w}");
        }
        for w in ["", "2", "maybe", "tru", "enable"] {
            assert_eq!(parse_bool(w), None, "{w}");
        }
        assert_eq!(parse_flag_bool("Yes"), Some(true));
        assert_eq!(parse_flag_bool("0"), Some(false));
        assert_eq!(parse_flag_bool("on"), None);
        assert_eq!(parse_flag_bool("OFF"), None);
    }

    /// The one size reader of the node's flags and of `setup()`'s dict form: every input either
    /// accepted before they were merged still reads as the same number of bytes.
    #[test]
    fn sizes_are_binary_multiples() {
        for (raw, bytes) in [
            ("0", 0),
            ("1024", 1024),
            ("4096", 4096),
            ("18446744073709551615", u64::MAX),
            ("10 B", 10),
            ("4 KB", 4 << 10),
            ("7 KB", 7 << 10),
            ("4KiB", 4 << 10),
            ("512K", 512 << 10),
            ("512 mb", 512 << 20),
            (" 16MB ", 16 << 20),
            ("1 GB", 1 << 30),
            ("4GB", 4 << 30),
            ("4 GB", 4 << 30),
            ("1.5GB", 3 << 29),
            ("1.5 GiB", 3 << 29),
            ("2 TB", 2 << 40),
            ("2t", 2 << 40),
            // A fraction is rounded down to a byte.
            ("0.3 KB", 307),
        ] {
            assert_eq!(parse_size(raw), Ok(bytes), "{raw:?}");
        }
        for bad in [
            "",
            " ",
            "GB",
            "4 XB",
            "4 G B",
            "4 GBs",
            "-1",
            "-1 GB",
            "50%",
            "1e3",
            "1e99 TB",
            "99999999999999999999 TB",
            "18446744073709551616",
            "1.2.3",
            ".",
        ] {
            let err = parse_size(bad).expect_err(bad);
            assert!(err.contains(&format!("{bad:?}")), "{bad:?}: {err}");
        }
    }
}
