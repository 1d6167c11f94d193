//! Errors from reading flags and config files. Each names the flag, what was expected and
//! what was given, so the message alone tells the user how to fix the command line.

use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown flag --{flag}{}", suggestion_text(.suggestion))]
    UnknownFlag {
        flag: String,
        suggestion: Option<&'static str>,
    },

    #[error("flag --{flag} needs a value (--{flag}=VALUE or --{flag} VALUE)")]
    MissingValue { flag: String },

    #[error("flag --no{flag}: --{flag} is not a boolean flag, give it a value instead")]
    NotBoolean { flag: String },

    #[error("flag --no{flag} takes no value, got \"{given}\"")]
    NegationWithValue { flag: String, given: String },

    #[error("invalid value for --{flag}: expected {expected}, got \"{given}\"")]
    InvalidValue {
        flag: String,
        expected: String,
        given: String,
    },

    #[error("unsupported value for --{flag}: \"{given}\" ({detail})")]
    Unsupported {
        flag: String,
        given: String,
        detail: String,
    },

    #[error("invalid flag combination: {0}")]
    Conflict(String),

    #[error("unexpected argument \"{0}\": mooncake_master takes only flags (see --help)")]
    UnexpectedArgument(String),

    #[error("--fromenv: {0}")]
    FromEnv(String),

    #[error("config file {}: {message}", .path.display())]
    File { path: PathBuf, message: String },
}

fn suggestion_text(suggestion: &Option<&'static str>) -> String {
    match suggestion {
        Some(name) => format!("; did you mean --{name}?"),
        None => "; run with --help for the list of flags".to_string(),
    }
}

impl ConfigError {
    pub(crate) fn invalid(flag: &str, expected: &str, given: &str) -> ConfigError {
        ConfigError::InvalidValue {
            flag: flag.to_string(),
            expected: expected.to_string(),
            given: given.to_string(),
        }
    }
}
