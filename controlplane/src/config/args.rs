//! The command line, read the way gflags reads it.
//!
//! Accepted forms: `--flag=value`, `--flag value`, a single dash in place of two, bare
//! `--flag` for booleans (optionally followed by a boolean literal), `--noflag` for false,
//! `--flagfile=F` (one flag per line, `#` comments) and `--` to end the flags. A later
//! setting of the same flag wins. Values are kept as text here; `super::resolve` types them.

use std::path::Path;

use super::error::ConfigError;
use super::flags::{self, FlagKind, FlagSpec};
use super::value::is_bool_literal;

/// How deep `--flagfile` may nest before it is taken for a loop.
const MAX_FLAGFILE_DEPTH: usize = 8;

/// What the command line asks for.
#[derive(Debug)]
pub(super) enum Scan {
    Help,
    Version,
    /// Flags in the order given, each with its value as text.
    Flags(Vec<(&'static FlagSpec, String)>),
}

pub(super) fn scan(args: Vec<String>) -> Result<Scan, ConfigError> {
    let mut out = Vec::new();
    match scan_into(args, &mut out, 0)? {
        Some(stop) => Ok(stop),
        None => Ok(Scan::Flags(out)),
    }
}

/// Appends the settings of `args` to `out`; returns `Some` when `--help` or `--version` stops
/// the scan.
fn scan_into(
    args: Vec<String>,
    out: &mut Vec<(&'static FlagSpec, String)>,
    depth: usize,
) -> Result<Option<Scan>, ConfigError> {
    let mut args = args.into_iter().peekable();
    while let Some(arg) = args.next() {
        if arg == "--" {
            return match args.next() {
                Some(positional) => Err(ConfigError::UnexpectedArgument(positional)),
                None => Ok(None),
            };
        }
        let Some(body) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            return Err(ConfigError::UnexpectedArgument(arg));
        };
        if body.is_empty() {
            return Err(ConfigError::UnexpectedArgument(arg));
        }
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (body, None),
        };
        if flags::HELP_FLAGS.contains(&name) {
            return Ok(Some(Scan::Help));
        }
        if name == flags::VERSION_FLAG {
            return Ok(Some(Scan::Version));
        }
        if name == flags::FLAGFILE_FLAG {
            let path = match inline {
                Some(path) => path,
                None => args.next().ok_or_else(|| missing(name))?,
            };
            let lines = read_flagfile(Path::new(&path), depth)?;
            if let Some(stop) = scan_into(lines, out, depth + 1)? {
                return Ok(Some(stop));
            }
            continue;
        }
        if let Some(spec) = flags::lookup(name) {
            let value = match (inline, spec.kind) {
                (Some(value), _) => value,
                (None, FlagKind::Bool) => match args.next_if(|next| is_bool_literal(next)) {
                    Some(literal) => literal,
                    None => "true".to_string(),
                },
                (None, _) => args.next().ok_or_else(|| missing(name))?,
            };
            out.push((spec, value));
            continue;
        }
        if let Some(spec) = name.strip_prefix("no").and_then(flags::lookup) {
            if spec.kind != FlagKind::Bool {
                return Err(ConfigError::NotBoolean {
                    flag: spec.name.to_string(),
                });
            }
            if let Some(given) = inline {
                return Err(ConfigError::NegationWithValue {
                    flag: spec.name.to_string(),
                    given,
                });
            }
            out.push((spec, "false".to_string()));
            continue;
        }
        return Err(ConfigError::UnknownFlag {
            flag: name.to_string(),
            suggestion: flags::closest(name),
        });
    }
    Ok(None)
}

fn missing(name: &str) -> ConfigError {
    ConfigError::MissingValue {
        flag: name.to_string(),
    }
}

/// The arguments in a flagfile: one flag per line; a line without `=` may hold `--flag value`.
fn read_flagfile(path: &Path, depth: usize) -> Result<Vec<String>, ConfigError> {
    let file_error = |message: String| ConfigError::File {
        path: path.to_path_buf(),
        message,
    };
    if depth >= MAX_FLAGFILE_DEPTH {
        return Err(file_error(format!(
            "--flagfile nested more than {MAX_FLAGFILE_DEPTH} deep (a loop?)"
        )));
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| file_error(format!("cannot read it: {e}")))?;
    let mut args = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.contains('=') {
            args.push(line.to_string());
        } else {
            args.extend(line.split_whitespace().map(str::to_string));
        }
    }
    Ok(args)
}
