//! The owner's disk-tier settings, and how the original's environment variables spell them.

use std::path::PathBuf;

use super::limits::{DEFAULT_KEYS_LIMIT, DEFAULT_SIZE_LIMIT_BYTES};
use super::limits::{DISK_WORKERS_DEFAULT_MAX, DISK_WORKERS_MAX};
use super::DiskError;

/// The directory when `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH` is unset.
pub const DEFAULT_DIR: &str = "/data/file_storage";
/// Watermarks when unset.
pub const DEFAULT_HIGH_WATERMARK: f64 = 0.90;
pub const DEFAULT_LOW_WATERMARK: f64 = 0.80;

/// An owner's disk tier.
#[derive(Clone, Debug, PartialEq)]
pub struct DiskConfig {
    /// Where the object files live (created when missing).
    pub dir: PathBuf,
    /// Logical bytes: the disk segment's size. [`super::DiskTier::open`] lowers it to what the
    /// filesystem can hold ([`super::DiskTier::size_limit`]).
    pub size_limit_bytes: u64,
    /// Most objects on disk (0: no limit).
    pub keys_limit: u64,
    /// Cap on the real disk usage of the files (`st_blocks`, as `du` counts); `None`: no cap.
    pub max_physical_bytes: Option<u64>,
    /// Whether the master evicts from this disk ahead of need.
    pub watermark_eviction: bool,
    /// Start evicting above this share of the logical limit, in (0, 1].
    pub high_watermark: f64,
    /// Stop evicting at this share, in (0, 1), below `high_watermark`.
    pub low_watermark: f64,
    /// io_uring where the kernel allows it; false: pread/pwrite.
    pub use_uring: bool,
    /// `O_DIRECT` where the filesystem allows it; false: buffered I/O (through the page
    /// cache). Not one of the original's variables: for tests and for filesystems that
    /// accept `O_DIRECT` but serve it slowly.
    pub direct_io: bool,
    /// I/O worker threads, 1 ..= `DISK_WORKERS_MAX`.
    pub workers: usize,
    /// The CPU priority of offload writes (`MOONCAKE_OFFLOAD_WRITE_PRIORITY`; ours).
    pub write_priority: WritePriority,
}

/// The CPU priority a worker runs offload writes at (`docs/tiering.md`, "I/O"). Reads and
/// deletes always run at the thread's normal priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePriority {
    /// `SCHED_IDLE`: only CPU no normal thread wants (nice 10 where the thread could not
    /// come back from it). The default.
    Idle,
    /// Nice 10.
    Nice,
    /// As reads: offload keeps pace with the puts and takes its share of the CPU from them.
    Normal,
}

impl DiskConfig {
    /// The defaults, on `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> DiskConfig {
        DiskConfig {
            dir: dir.into(),
            size_limit_bytes: DEFAULT_SIZE_LIMIT_BYTES,
            keys_limit: DEFAULT_KEYS_LIMIT,
            max_physical_bytes: None,
            watermark_eviction: true,
            high_watermark: DEFAULT_HIGH_WATERMARK,
            low_watermark: DEFAULT_LOW_WATERMARK,
            use_uring: true,
            direct_io: true,
            workers: default_workers(),
            write_priority: WritePriority::Idle,
        }
    }

    /// The original's variables (see `docs/tiering.md`); `dir_override` (a flag or a Python
    /// argument) wins over `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`. A malformed value is an error
    /// naming its variable.
    pub fn from_env(dir_override: Option<&str>) -> Result<DiskConfig, DiskError> {
        Self::from_lookup(dir_override, |name| std::env::var(name).ok())
    }

    /// [`DiskConfig::from_env`] over any variable source (the tests' maps).
    pub fn from_lookup(
        dir_override: Option<&str>,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<DiskConfig, DiskError> {
        let dir = match dir_override {
            Some(d) => d.to_string(),
            None => get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH").unwrap_or(DEFAULT_DIR.to_string()),
        };
        if dir.trim().is_empty() {
            return Err(bad(
                "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
                &dir,
                "empty path",
            ));
        }
        let mut cfg = DiskConfig::new(dir);
        let size = |name: &str| -> Result<Option<u64>, DiskError> {
            get(name)
                .map(|v| protocol::env::parse_size(&v).map_err(|why| bad(name, &v, &why)))
                .transpose()
        };
        if let Some(n) = size("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES")? {
            if n == 0 {
                return Err(bad(
                    "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES",
                    "0",
                    "must be > 0",
                ));
            }
            cfg.size_limit_bytes = n;
        }
        if let Some(v) = get("MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT") {
            cfg.keys_limit = v.trim().parse().map_err(|_| {
                bad(
                    "MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT",
                    &v,
                    "expected a whole number",
                )
            })?;
        }
        cfg.max_physical_bytes = size("MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES")?;
        let boolean = |name: &str, default: bool| -> Result<bool, DiskError> {
            match get(name) {
                None => Ok(default),
                Some(v) => protocol::env::parse_bool(&v)
                    .ok_or_else(|| bad(name, &v, "expected true/false (1/0, yes/no, on/off)")),
            }
        };
        cfg.watermark_eviction = boolean("MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION", true)?;
        cfg.use_uring = boolean("MOONCAKE_OFFLOAD_USE_URING", true)?;
        if let Some(v) = get("MOONCAKE_OFFLOAD_WRITE_PRIORITY") {
            cfg.write_priority = match v.trim().to_ascii_lowercase().as_str() {
                "idle" => WritePriority::Idle,
                "nice" => WritePriority::Nice,
                "normal" => WritePriority::Normal,
                _ => {
                    let why = "expected idle, nice or normal";
                    return Err(bad("MOONCAKE_OFFLOAD_WRITE_PRIORITY", &v, why));
                }
            };
        }
        (cfg.high_watermark, cfg.low_watermark) = watermarks(&get)?;
        Ok(cfg)
    }

    /// What the master needs to keep this disk within its limits: watermarks in thousandths
    /// (both 0 when watermark eviction is off) and the key limit.
    pub fn policy(&self) -> protocol::DiskPolicy {
        let permille = |r: f64| (r * 1000.0).round().clamp(0.0, 1000.0) as u16;
        let (high, low) = if self.watermark_eviction {
            (permille(self.high_watermark), permille(self.low_watermark))
        } else {
            (0, 0)
        };
        protocol::DiskPolicy {
            high_watermark_permille: high,
            low_watermark_permille: low,
            keys_limit: self.keys_limit,
        }
    }

    /// Checks the values a caller may have set by hand.
    pub(crate) fn validate(&self) -> Result<(), DiskError> {
        let why = if self.workers == 0 || self.workers > DISK_WORKERS_MAX {
            format!(
                "workers must be 1..={DISK_WORKERS_MAX}, got {}",
                self.workers
            )
        } else if self.size_limit_bytes == 0 {
            "the size limit must be > 0".to_string()
        } else if !(self.low_watermark > 0.0
            && self.low_watermark < self.high_watermark
            && self.high_watermark <= 1.0)
        {
            format!(
                "watermarks must satisfy 0 < low ({}) < high ({}) <= 1",
                self.low_watermark, self.high_watermark
            )
        } else {
            return Ok(());
        };
        Err(DiskError::InvalidConfig(why))
    }
}

/// The high and low disk-eviction watermark ratios (long name first, then the short one),
/// each in (0, 1], the high above the low.
fn watermarks(get: &impl Fn(&str) -> Option<String>) -> Result<(f64, f64), DiskError> {
    let ratio = |long: &str, short: &str, default: f64| -> Result<(f64, String), DiskError> {
        let (name, v) = match (get(long), get(short)) {
            (Some(v), _) => (long, v),
            (None, Some(v)) => (short, v),
            (None, None) => return Ok((default, long.to_string())),
        };
        match v.trim().parse::<f64>() {
            Ok(r) if r > 0.0 && r <= 1.0 => Ok((r, name.to_string())),
            _ => Err(bad(name, &v, "expected a ratio in (0, 1]")),
        }
    };
    let (high, high_name) = ratio(
        "MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO",
        "MOONCAKE_DISK_EVICTION_HIGH_WATERMARK_RATIO",
        DEFAULT_HIGH_WATERMARK,
    )?;
    let (low, _) = ratio(
        "MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO",
        "MOONCAKE_DISK_EVICTION_LOW_WATERMARK_RATIO",
        DEFAULT_LOW_WATERMARK,
    )?;
    if high <= low {
        return Err(bad(
            &high_name,
            &high.to_string(),
            &format!("the high watermark must exceed the low one ({low})"),
        ));
    }
    Ok((high, low))
}

/// The available cores, at most `DISK_WORKERS_DEFAULT_MAX`.
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, DISK_WORKERS_DEFAULT_MAX)
}

fn bad(var: &str, value: &str, why: &str) -> DiskError {
    DiskError::BadVariable {
        var: var.to_string(),
        value: value.to_string(),
        why: why.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<DiskConfig, DiskError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        DiskConfig::from_lookup(None, |k| map.get(k).cloned())
    }

    #[test]
    fn defaults_are_the_originals() {
        let c = with(&[]).unwrap();
        assert_eq!(c.dir, PathBuf::from("/data/file_storage"));
        assert_eq!(c.size_limit_bytes, 2 << 40);
        assert_eq!(c.keys_limit, 10_000_000);
        assert_eq!(c.max_physical_bytes, None);
        assert!(c.watermark_eviction && c.use_uring);
        let p = c.policy();
        assert_eq!(
            (p.high_watermark_permille, p.low_watermark_permille),
            (900, 800)
        );
        assert_eq!(p.keys_limit, 10_000_000);
    }

    #[test]
    fn variables_are_read_and_bad_ones_named() {
        let c = with(&[
            ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/nvme/x"),
            ("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "4 GB"),
            ("MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT", "7"),
            ("MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES", "1MB"),
            ("MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION", "false"),
            ("MOONCAKE_DISK_EVICTION_HIGH_WATERMARK_RATIO", "0.7"),
            ("MOONCAKE_DISK_EVICTION_LOW_WATERMARK_RATIO", "0.6"),
            ("MOONCAKE_OFFLOAD_USE_URING", "off"),
            ("MOONCAKE_OFFLOAD_WRITE_PRIORITY", "Nice"),
        ])
        .unwrap();
        assert_eq!(c.write_priority, WritePriority::Nice);
        assert_eq!(c.dir, PathBuf::from("/nvme/x"));
        assert_eq!(c.size_limit_bytes, 4 << 30);
        assert_eq!(c.keys_limit, 7);
        assert_eq!(c.max_physical_bytes, Some(1 << 20));
        assert!(!c.watermark_eviction && !c.use_uring);
        assert_eq!((c.high_watermark, c.low_watermark), (0.7, 0.6));
        assert_eq!(c.policy().high_watermark_permille, 0);
        let o = DiskConfig::from_lookup(Some("/over"), |k| {
            (k == "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH").then(|| "/env".to_string())
        });
        assert_eq!(o.unwrap().dir, PathBuf::from("/over"));

        for (var, value) in [
            ("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "lots"),
            ("MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT", "-1"),
            ("MOONCAKE_OFFLOAD_USE_URING", "maybe"),
            ("MOONCAKE_OFFLOAD_WRITE_PRIORITY", "low"),
            ("MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO", "1.5"),
            ("MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO", "0.95"),
        ] {
            let e = with(&[(var, value)]).unwrap_err().to_string();
            let named = if var.contains("LOW") {
                "MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO"
            } else {
                var
            };
            assert!(e.contains(named), "{e} does not name {named}");
        }
    }
}
