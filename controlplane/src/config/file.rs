//! `--config_path` files: a JSON or YAML mapping whose keys are flag names.
//!
//! YAML is chosen by the `.yaml`/`.yml` extension, JSON by `.json`; any other name is read as
//! JSON when its first non-blank character is `{`, else as YAML. Scalars become the same text a
//! command-line value would be. `client_live_ttl_sec` (and the newer `client_active_ttl_sec`)
//! set `client_ttl`. Keys that name no flag are ignored with a warning, because upstream's own
//! sample configs carry keys that only some versions read.

use std::path::Path;

use super::error::ConfigError;
use super::flags::{self, FlagSpec};

/// The largest config file read; a master config is a few KiB.
pub const MAX_CONFIG_FILE_BYTES: u64 = 1 << 20;

/// Settings found in a config file, and warnings about keys it ignored.
#[derive(Debug, Default)]
pub(super) struct FileSettings {
    pub values: Vec<(&'static FlagSpec, String)>,
    pub warnings: Vec<String>,
}

pub(super) fn load(path: &Path) -> Result<FileSettings, ConfigError> {
    let error = |message: String| ConfigError::File {
        path: path.to_path_buf(),
        message,
    };
    let unreadable = |e: std::io::Error| error(format!("cannot read it: {e}"));
    let size = std::fs::metadata(path).map_err(unreadable)?.len();
    if size > MAX_CONFIG_FILE_BYTES {
        return Err(error(format!(
            "expected at most {MAX_CONFIG_FILE_BYTES} bytes, the file has {size}"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(unreadable)?;
    parse(path, &text)
}

/// Parses the text of a config file named `path` (the name picks JSON or YAML).
pub(super) fn parse(path: &Path, text: &str) -> Result<FileSettings, ConfigError> {
    let error = |message: String| ConfigError::File {
        path: path.to_path_buf(),
        message,
    };
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let is_yaml = match extension.as_deref() {
        Some("yaml" | "yml") => true,
        Some("json") => false,
        _ => !text.trim_start().starts_with('{'),
    };
    let entries: Vec<(String, Scalar)> = if is_yaml {
        let value: yaml_serde::Value =
            yaml_serde::from_str(text).map_err(|e| error(format!("invalid YAML: {e}")))?;
        yaml_entries(value).map_err(error)?
    } else {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| error(format!("invalid JSON: {e}")))?;
        json_entries(value).map_err(error)?
    };

    let mut settings = FileSettings::default();
    for (key, scalar) in entries {
        let flag = flags::FILE_KEY_ALIASES
            .iter()
            .find(|(alias, _)| *alias == key)
            .map_or(key.as_str(), |&(_, flag)| flag);
        let Some(spec) = flags::lookup(flag) else {
            let hint = flags::closest(&key)
                .map(|s| format!(" (did you mean {s}?)"))
                .unwrap_or_default();
            settings.warnings.push(format!(
                "config file {}: key \"{key}\" is not a known flag and is ignored{hint}",
                path.display()
            ));
            continue;
        };
        if spec.name == flags::CONFIG_PATH_FLAG {
            settings.warnings.push(format!(
                "config file {}: key \"config_path\" is ignored inside a config file",
                path.display()
            ));
            continue;
        }
        match scalar {
            Scalar::Text(text) => settings.values.push((spec, text)),
            Scalar::Null => {}
            Scalar::Nested => {
                return Err(error(format!(
                    "key \"{key}\": expected a single value for --{}, got a list or mapping",
                    spec.name
                )))
            }
        }
    }
    Ok(settings)
}

/// A config value reduced to what a flag can hold.
enum Scalar {
    Text(String),
    /// `null` / `~`: leave the flag at its default.
    Null,
    Nested,
}

fn json_entries(value: serde_json::Value) -> Result<Vec<(String, Scalar)>, String> {
    use serde_json::Value;
    let Value::Object(map) = value else {
        return Err("expected a JSON object of flag names to values at the top level".into());
    };
    Ok(map
        .into_iter()
        .map(|(key, value)| {
            let scalar = match value {
                Value::Null => Scalar::Null,
                Value::Bool(b) => Scalar::Text(b.to_string()),
                Value::Number(n) => Scalar::Text(n.to_string()),
                Value::String(s) => Scalar::Text(s),
                Value::Array(_) | Value::Object(_) => Scalar::Nested,
            };
            (key, scalar)
        })
        .collect())
}

fn yaml_entries(value: yaml_serde::Value) -> Result<Vec<(String, Scalar)>, String> {
    use yaml_serde::Value;
    let map = match value {
        Value::Mapping(map) => map,
        // An empty file: nothing set.
        Value::Null => return Ok(Vec::new()),
        _ => return Err("expected a YAML mapping of flag names to values at the top level".into()),
    };
    map.into_iter()
        .map(|(key, value)| {
            let key = match key {
                Value::String(s) => s,
                other => return Err(format!("expected string keys, got {other:?}")),
            };
            let scalar = match value {
                Value::Null => Scalar::Null,
                Value::Bool(b) => Scalar::Text(b.to_string()),
                Value::Number(n) => Scalar::Text(n.to_string()),
                Value::String(s) => Scalar::Text(s),
                Value::Tagged(_) | Value::Sequence(_) | Value::Mapping(_) => Scalar::Nested,
            };
            Ok((key, scalar))
        })
        .collect()
}
