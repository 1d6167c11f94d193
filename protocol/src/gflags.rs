//! The command line of `mooncake_master` and `mooncake_client`, read the way gflags reads
//! upstream's: the program's own flags, and gflags' four meta flags, which a program never sees.
//!
//! - `--flagfile=F[,G...]`: the settings in each file, where the flag stands. One flag a line
//!   (`--flag=value`, `--flag`, `--noflag`; leading blanks skipped, the rest of the line is the
//!   value); `#` starts a comment line. A line that does not start with `-` lists program
//!   names (globs with `*` and `?`): the flags after it apply only if one matches this
//!   program, so one file can serve several programs. As in gflags, a line naming an unknown
//!   flag, or a non-boolean flag without `=value`, is skipped (with a warning here, where
//!   gflags says nothing); a file that cannot be read is an error.
//! - `--fromenv=a,b`: `a` and `b` from `FLAGS_a`, `FLAGS_b` of the environment, where the flag
//!   stands; a variable that is not set is an error. `--tryfromenv` skips unset ones. A name
//!   that is not a flag is an unknown flag (which `--undefok` may excuse); a value `fromenv`
//!   or `tryfromenv` is refused (gflags' "infinite recursion").
//! - `--undefok=a,b`: unknown flags `--a`, `--b` (or `--noa`) are ignored with a warning,
//!   wherever `--undefok` stands (its last value counts). As in gflags, such a flag's value must
//!   be written `--a=value`: after `--a value`, `value` is a positional argument.
//!
//! A later setting of a flag wins, whichever way it came. Besides gflags' forms, a boolean flag
//! takes a following boolean word (`--enable_ha false`), as before this module. Values stay
//! text here: the program types and checks them, as gflags does after the meta flags.
//! Positional arguments (gflags leaves them to the program, and upstream's ignore them) come
//! back to the caller. The environment and the files are read through [`Sources`], so tests
//! need neither `set_var` nor real files.

use crate::limits::FLAGFILE_LEVELS_MAX;

/// What a program's flag takes, as far as the command line is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `--flag`, `--noflag`, `--flag=bool`.
    Bool,
    /// `--flag=value` or `--flag value`.
    Value,
}

/// A program, as the scanner needs to know it.
pub struct Program<'a> {
    /// The name `--flagfile` sections are matched against (`mooncake_master`).
    pub name: &'a str,
    /// The kind of each of the program's flags; `None` for a name it does not have.
    pub kind: &'a dyn Fn(&str) -> Option<Kind>,
    /// Flags that end the scan at once (`--help`, `--version`).
    pub stops: &'a [&'a str],
}

/// Where `--fromenv` and `--flagfile` read.
pub trait Sources {
    /// The environment variable `name`.
    fn env(&self, name: &str) -> Option<String>;
    /// The text of the file at `path`.
    fn file(&self, path: &str) -> Result<String, String>;
}

/// The process environment and the file system.
pub struct System;

impl Sources for System {
    fn env(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
    fn file(&self, path: &str) -> Result<String, String> {
        std::fs::read_to_string(path).map_err(|e| e.to_string())
    }
}

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Scan {
    /// A flag of [`Program::stops`] was given (its name).
    Stop(String),
    /// The settings, in the order they take effect (a later one wins), the positional
    /// arguments, and warnings for the user (skipped flagfile lines, excused unknown flags).
    Flags {
        settings: Vec<(String, String)>,
        positional: Vec<String>,
        warnings: Vec<String>,
    },
}

/// A command line gflags would refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("unknown flag --{0}")]
    UnknownFlag(String),
    #[error("flag --{0} needs a value (--{0}=VALUE or --{0} VALUE)")]
    MissingValue(String),
    #[error("flag --no{0}: --{0} is not a boolean flag, give it a value instead")]
    NotBoolean(String),
    #[error("flag --no{flag} takes no value, got \"{given}\"")]
    NegationWithValue { flag: String, given: String },
    #[error("--flagfile {path}: {message}")]
    File { path: String, message: String },
    #[error("--fromenv: {0}")]
    FromEnv(String),
}

const FLAGFILE: &str = "flagfile";
const FROMENV: &str = "fromenv";
const TRYFROMENV: &str = "tryfromenv";
const UNDEFOK: &str = "undefok";
/// gflags' own flags, which every program takes.
pub const META_FLAGS: [&str; 4] = [FLAGFILE, FROMENV, TRYFROMENV, UNDEFOK];

/// Reads `args` (without the program name) from the process environment and files.
pub fn scan(args: Vec<String>, program: &Program<'_>) -> Result<Scan, Error> {
    scan_in(args, program, &System)
}

/// [`scan`] reading the environment and files through `sources`.
pub fn scan_in(
    args: Vec<String>,
    program: &Program<'_>,
    sources: &dyn Sources,
) -> Result<Scan, Error> {
    let mut scanner = Scanner {
        program,
        sources,
        settings: Vec::new(),
        positional: Vec::new(),
        warnings: Vec::new(),
        unknown: Vec::new(),
        undefok: String::new(),
    };
    if let Some(stop) = scanner.command_line(args)? {
        return Ok(Scan::Stop(stop));
    }
    scanner.finish()
}

struct Scanner<'a> {
    program: &'a Program<'a>,
    sources: &'a dyn Sources,
    settings: Vec<(String, String)>,
    positional: Vec<String>,
    warnings: Vec<String>,
    /// Unknown flags met so far: the error unless `--undefok` names them at the end.
    unknown: Vec<(String, Error)>,
    undefok: String,
}

/// Where a flag was written, for what an unusable one costs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    CommandLine,
    /// `--fromenv`: errors count as on the command line.
    Env,
    /// A flagfile line, at this nesting depth.
    File(usize),
}

impl Scanner<'_> {
    fn command_line(&mut self, args: Vec<String>) -> Result<Option<String>, Error> {
        let mut args = args.into_iter().peekable();
        while let Some(arg) = args.next() {
            if arg == "--" {
                self.positional.extend(args);
                break;
            }
            let Some(body) = dashless(&arg) else {
                self.positional.push(arg);
                continue;
            };
            let (name, inline) = split(body);
            if self.program.stops.contains(&name) {
                return Ok(Some(name.to_string()));
            }
            let value = match (inline, self.kind(name)) {
                (Some(value), _) => Some(value.to_string()),
                (None, Some(Kind::Value)) => Some(
                    args.next()
                        .ok_or_else(|| Error::MissingValue(name.into()))?,
                ),
                (None, Some(Kind::Bool)) => args.next_if(|next| is_bool_word(next)),
                (None, None) => None,
            };
            self.set(name, value, Origin::CommandLine)?;
        }
        Ok(None)
    }

    /// The kind of `name`: the program's, or the meta flags' (values).
    fn kind(&self, name: &str) -> Option<Kind> {
        if META_FLAGS.contains(&name) {
            return Some(Kind::Value);
        }
        (self.program.kind)(name)
    }

    /// One flag with its value as written (`None`: no `=value` and no value argument).
    fn set(&mut self, name: &str, value: Option<String>, origin: Origin) -> Result<(), Error> {
        let depth = match origin {
            Origin::CommandLine | Origin::Env => 0,
            Origin::File(depth) => depth,
        };
        match (name, value) {
            (FLAGFILE, Some(paths)) => return self.flagfiles(&paths, depth + 1),
            (FROMENV, Some(names)) => return self.environment(&names, true),
            (TRYFROMENV, Some(names)) => return self.environment(&names, false),
            (UNDEFOK, Some(names)) => self.undefok = names,
            (name, value) => match self.kind(name) {
                Some(Kind::Bool) => {
                    let value = value.unwrap_or_else(|| "true".into());
                    self.settings.push((name.into(), value));
                }
                Some(Kind::Value) => match value {
                    Some(value) => self.settings.push((name.into(), value)),
                    None if matches!(origin, Origin::File(_)) => {
                        self.skip(name, "a flag of this program that needs =value")
                    }
                    None => return Err(Error::MissingValue(name.into())),
                },
                None => self.negated_or_unknown(name, value, origin)?,
            },
        }
        Ok(())
    }

    /// `--noflag`, or a name this program does not have.
    fn negated_or_unknown(
        &mut self,
        name: &str,
        value: Option<String>,
        origin: Origin,
    ) -> Result<(), Error> {
        let negated = name.strip_prefix("no").filter(|n| !META_FLAGS.contains(n));
        let error = match (negated.map(|n| (n, self.kind(n))), value) {
            (Some((flag, Some(Kind::Bool))), None) => {
                self.settings.push((flag.into(), "false".into()));
                return Ok(());
            }
            (Some((flag, Some(Kind::Bool))), Some(given)) => Error::NegationWithValue {
                flag: flag.into(),
                given,
            },
            (Some((flag, Some(Kind::Value))), _) => Error::NotBoolean(flag.into()),
            _ => Error::UnknownFlag(name.into()),
        };
        match origin {
            Origin::CommandLine if matches!(error, Error::UnknownFlag(_)) => {
                self.unknown.push((name.into(), error));
                Ok(())
            }
            Origin::CommandLine | Origin::Env => Err(error),
            Origin::File(_) => {
                self.skip(name, &error.to_string());
                Ok(())
            }
        }
    }

    fn skip(&mut self, name: &str, why: &str) {
        self.warnings.push(format!(
            "--flagfile: line --{name} skipped ({why}), as gflags skips it"
        ));
    }

    fn flagfiles(&mut self, paths: &str, depth: usize) -> Result<(), Error> {
        for path in list(paths) {
            if depth > FLAGFILE_LEVELS_MAX {
                return Err(Error::File {
                    path: path.into(),
                    message: format!("nested more than {FLAGFILE_LEVELS_MAX} deep (a loop?)"),
                });
            }
            let text = self.sources.file(path).map_err(|message| Error::File {
                path: path.into(),
                message,
            })?;
            self.flagfile(&text, depth)?;
        }
        Ok(())
    }

    /// The lines of one flagfile, with gflags' program sections.
    fn flagfile(&mut self, text: &str, depth: usize) -> Result<(), Error> {
        let (mut relevant, mut in_names) = (true, false);
        for line in text.lines().map(str::trim_start) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some(body) = line.strip_prefix('-') else {
                if !in_names {
                    (in_names, relevant) = (true, false);
                }
                let name = self.program.name;
                relevant |= line.split(' ').any(|glob| glob_match(glob, name));
                continue;
            };
            in_names = false;
            if relevant {
                let (name, value) = split(body.strip_prefix('-').unwrap_or(body));
                self.set(name, value.map(str::to_string), Origin::File(depth))?;
            }
        }
        Ok(())
    }

    fn environment(&mut self, names: &str, required: bool) -> Result<(), Error> {
        for name in list(names) {
            if self.kind(name).is_none() {
                let error = Error::FromEnv(format!("unknown flag {name:?}"));
                self.unknown.push((name.into(), error));
                continue;
            }
            let variable = format!("FLAGS_{name}");
            let Some(value) = self.sources.env(&variable) else {
                if required {
                    return Err(Error::FromEnv(format!(
                        "{variable} not found in environment"
                    )));
                }
                continue;
            };
            if value == FROMENV || value == TRYFROMENV {
                return Err(Error::FromEnv(format!(
                    "{variable}={value} would recurse without end"
                )));
            }
            self.set(name, Some(value), Origin::Env)?;
        }
        Ok(())
    }

    /// The settings, once `--undefok` has excused what it names.
    fn finish(mut self) -> Result<Scan, Error> {
        let undefok: Vec<&str> = list(&self.undefok).collect();
        for (name, error) in self.unknown {
            let plain = name.strip_prefix("no").filter(|n| undefok.contains(n));
            if !undefok.contains(&name.as_str()) && plain.is_none() {
                return Err(error);
            }
            self.warnings.push(format!(
                "flag --{name} ignored: it is not a flag of this program (--undefok)"
            ));
        }
        Ok(Scan::Flags {
            settings: self.settings,
            positional: self.positional,
            warnings: self.warnings,
        })
    }
}

/// `arg` without its one or two leading dashes; `None` for a positional argument (no dash, or
/// nothing after the dashes).
fn dashless(arg: &str) -> Option<&str> {
    let body = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-'))?;
    (!body.is_empty()).then_some(body)
}

fn split(body: &str) -> (&str, Option<&str>) {
    match body.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (body, None),
    }
}

/// gflags' comma-separated lists; empty items are dropped.
fn list(names: &str) -> impl Iterator<Item = &str> {
    names.split(',').filter(|n| !n.is_empty())
}

fn is_bool_word(word: &str) -> bool {
    crate::env::parse_flag_bool(word).is_some()
}

/// A shell glob with `*` and `?` (what flagfile sections use) over the whole of `name`.
fn glob_match(glob: &str, name: &str) -> bool {
    let (glob, name): (Vec<char>, Vec<char>) = (glob.chars().collect(), name.chars().collect());
    let (mut g, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match glob.get(g) {
            Some('*') => {
                star = Some((g, n));
                g += 1;
            }
            Some(&c) if c == '?' || c == name[n] => {
                g += 1;
                n += 1;
            }
            _ => match star {
                Some((sg, sn)) => {
                    (g, n) = (sg + 1, sn + 1);
                    star = Some((sg, sn + 1));
                }
                None => return false,
            },
        }
    }
    glob[g..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests;
