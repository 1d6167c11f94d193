//! The command line, read the way gflags reads it ([`protocol::gflags`]).
//!
//! Accepted forms: `--flag=value`, `--flag value`, a single dash in place of two, bare
//! `--flag` for booleans (optionally followed by a boolean literal), `--noflag` for false,
//! gflags' `--flagfile`, `--fromenv`, `--tryfromenv` and `--undefok`, and `--` to end the
//! flags. A later setting of the same flag wins. Values are kept as text here;
//! `super::resolve` types them. Positional arguments are refused (upstream ignores them).

use protocol::gflags::{self, Kind, Program};

use super::error::ConfigError;
use super::flags::{self, FlagKind, FlagSpec};

/// What the command line asks for.
#[derive(Debug)]
pub(super) enum Scan {
    Help,
    Version,
    /// Flags in the order given, each with its value as text, and warnings for the user.
    Flags(Vec<(&'static FlagSpec, String)>, Vec<String>),
}

/// The master's flags, as the gflags reader sees them.
fn kind(name: &str) -> Option<Kind> {
    let help = flags::HELP_FLAGS.contains(&name) || name == flags::VERSION_FLAG;
    match flags::lookup(name) {
        _ if help => Some(Kind::Bool),
        Some(spec) if spec.kind == FlagKind::Bool => Some(Kind::Bool),
        Some(_) => Some(Kind::Value),
        None => None,
    }
}

const STOPS: [&str; 5] = ["help", "helpfull", "helpshort", "h", flags::VERSION_FLAG];

const PROGRAM: Program<'static> = Program {
    name: "mooncake_master",
    kind: &kind,
    stops: &STOPS,
};

pub(super) fn scan(args: Vec<String>) -> Result<Scan, ConfigError> {
    scan_in(args, &gflags::System)
}

/// [`scan`] with the environment and files of `sources`.
pub(super) fn scan_in(
    args: Vec<String>,
    sources: &dyn gflags::Sources,
) -> Result<Scan, ConfigError> {
    let (settings, positional, warnings) = match gflags::scan_in(args, &PROGRAM, sources) {
        Ok(gflags::Scan::Stop(name)) if name == flags::VERSION_FLAG => return Ok(Scan::Version),
        Ok(gflags::Scan::Stop(_)) => return Ok(Scan::Help),
        Ok(gflags::Scan::Flags {
            settings,
            positional,
            warnings,
        }) => (settings, positional, warnings),
        Err(error) => return Err(config_error(error)),
    };
    if let Some(first) = positional.into_iter().next() {
        return Err(ConfigError::UnexpectedArgument(first));
    }
    let settings = settings
        .into_iter()
        .filter_map(|(name, value)| Some((flags::lookup(&name)?, value)))
        .collect();
    Ok(Scan::Flags(settings, warnings))
}

fn config_error(error: gflags::Error) -> ConfigError {
    match error {
        gflags::Error::UnknownFlag(flag) => ConfigError::UnknownFlag {
            suggestion: flags::closest(&flag),
            flag,
        },
        gflags::Error::MissingValue(flag) => ConfigError::MissingValue { flag },
        gflags::Error::NotBoolean(flag) => ConfigError::NotBoolean { flag },
        gflags::Error::NegationWithValue { flag, given } => {
            ConfigError::NegationWithValue { flag, given }
        }
        gflags::Error::File { path, message } => ConfigError::File {
            path: path.into(),
            message,
        },
        gflags::Error::FromEnv(message) => ConfigError::FromEnv(message),
    }
}
