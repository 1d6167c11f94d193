//! The meta flags against what upstream's `mooncake_master` (gflags 2.2) did with the same
//! command lines on 2026-12-06; each case says what it answered.

use std::collections::HashMap;

use super::*;

/// An environment and files in memory.
#[derive(Default)]
struct Fake {
    env: HashMap<String, String>,
    files: HashMap<String, String>,
}

impl Sources for Fake {
    fn env(&self, name: &str) -> Option<String> {
        self.env.get(name).cloned()
    }
    fn file(&self, path: &str) -> Result<String, String> {
        self.files
            .get(path)
            .cloned()
            .ok_or_else(|| "No such file or directory".to_string())
    }
}

fn kind(name: &str) -> Option<Kind> {
    match name {
        "enable_ha" | "help" => Some(Kind::Bool),
        "client_ttl" | "eviction_ratio" | "cluster_id" => Some(Kind::Value),
        _ => None,
    }
}

const PROGRAM: Program<'static> = Program {
    name: "mooncake_master",
    kind: &kind,
    stops: &["help"],
};

fn scan_with(fake: &Fake, args: &[&str]) -> Result<Scan, Error> {
    scan_in(args.iter().map(|a| a.to_string()).collect(), &PROGRAM, fake)
}

/// The settings (last one wins) and the warnings.
fn run(fake: &Fake, args: &[&str]) -> (HashMap<String, String>, Vec<String>) {
    match scan_with(fake, args) {
        Ok(Scan::Flags {
            settings, warnings, ..
        }) => (settings.into_iter().collect(), warnings),
        other => panic!("{args:?}: {other:?}"),
    }
}

fn value(fake: &Fake, args: &[&str], flag: &str) -> Option<String> {
    run(fake, args).0.get(flag).cloned()
}

fn error(fake: &Fake, args: &[&str]) -> String {
    match scan_with(fake, args) {
        Err(e) => e.to_string(),
        other => panic!("{args:?}: expected an error, got {other:?}"),
    }
}

fn files(files: &[(&str, &str)]) -> Fake {
    Fake {
        files: files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect(),
        ..Fake::default()
    }
}

#[test]
fn undefok_excuses_the_flags_it_names_wherever_it_stands() {
    let none = Fake::default();
    // Upstream: runs.
    let (_, warnings) = run(&none, &["--undefok=foo,bar", "--foo=1", "--bar"]);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    run(&none, &["--nofoo", "--undefok=foo"]);
    // Upstream: "ERROR: unknown command line flag 'b'".
    assert!(error(&none, &["--undefok=a", "--a=1", "--b"]).contains("--b"));
    assert!(error(&none, &["--undefok=", "--zz"]).contains("--zz"));
    // `--foo 1`: gflags leaves `1` to the program as a positional argument.
    let Ok(Scan::Flags { positional, .. }) = scan_with(&none, &["--undefok=foo", "--foo", "1"])
    else {
        panic!()
    };
    assert_eq!(positional, ["1"]);
    // A known flag named in --undefok is still set.
    let args = ["--undefok=client_ttl", "--client_ttl=46"];
    assert_eq!(value(&none, &args, "client_ttl").as_deref(), Some("46"));
}

#[test]
fn fromenv_reads_flags_where_it_stands() {
    let mut env = Fake::default();
    // Upstream: "ERROR: FLAGS_eviction_ratio not found in environment".
    let message = error(&env, &["--fromenv=eviction_ratio"]);
    assert!(
        message.contains("FLAGS_eviction_ratio not found"),
        "{message}"
    );
    assert_eq!(
        value(&env, &["--tryfromenv=eviction_ratio"], "eviction_ratio"),
        None
    );
    // Upstream: "unknown command line flag 'nosuch' (via --fromenv or --tryfromenv)", for
    // both, unless --undefok names it.
    assert!(error(&env, &["--tryfromenv=nosuch"]).contains("nosuch"));
    run(&env, &["--undefok=nosuch", "--tryfromenv=nosuch"]);

    env.env.insert("FLAGS_client_ttl".into(), "45".into());
    env.env.insert("FLAGS_eviction_ratio".into(), "0.5".into());
    let cases: &[(&[&str], &str)] = &[
        (&["--fromenv=client_ttl,eviction_ratio"], "45"),
        (&["--tryfromenv=client_ttl", "--client_ttl=12"], "12"),
        (&["--client_ttl=12", "--tryfromenv=client_ttl"], "45"),
        (&["--tryfromenv", "client_ttl"], "45"),
    ];
    for (args, ttl) in cases {
        let (settings, _) = run(&env, args);
        assert_eq!(settings["client_ttl"], *ttl, "{args:?}");
    }
    let both = ["--tryfromenv=client_ttl", "--tryfromenv=eviction_ratio"];
    assert_eq!(value(&env, &both, "eviction_ratio").as_deref(), Some("0.5"));
    // Upstream: "ERROR: infinite recursion on environment flag 'fromenv'".
    env.env.insert("FLAGS_cluster_id".into(), "fromenv".into());
    assert!(error(&env, &["--tryfromenv=cluster_id"]).contains("recurse"));
}

#[test]
fn flagfile_lines_as_gflags_reads_them() {
    let fake = files(&[
        // Upstream: the unknown flag is skipped, the other one set.
        ("f1", "--eviction_ratio=0.4\n--nosuch=1\n"),
        // Upstream: `--flag value` on a line is not a flag gflags knows: skipped.
        ("f2", "--eviction_ratio 0.4\n"),
        // Upstream: sections by program name; only mooncake_master's applies.
        (
            "f3",
            "other_prog\n--eviction_ratio=0.4\nfoo mooncake_*\n--client_ttl=33\n",
        ),
        ("f5", "--eviction_ratio=0.4\n"),
        // Comments, blank lines, leading blanks, --noflag, -flag with one dash.
        (
            "f6",
            "# c\n  --client_ttl=34\n\n--noenable_ha\n-cluster_id=x\n",
        ),
        ("f7", "--fromenv=client_ttl\n"),
        ("f8", "--flagfile=f5\n--cluster_id=y\n"),
    ]);
    let (settings, warnings) = run(&fake, &["--flagfile=f1"]);
    assert_eq!(settings["eviction_ratio"], "0.4");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let (settings, warnings) = run(&fake, &["--flagfile=f2"]);
    assert!(settings.is_empty() && warnings.len() == 1, "{settings:?}");
    let (settings, _) = run(&fake, &["--flagfile=f3"]);
    assert_eq!(settings.get("eviction_ratio"), None);
    assert_eq!(settings["client_ttl"], "33");
    // Upstream: a comma-separated list, each file in turn.
    let (settings, _) = run(&fake, &["--flagfile=f5,f3"]);
    assert_eq!(
        (&*settings["eviction_ratio"], &*settings["client_ttl"]),
        ("0.4", "33")
    );
    // Upstream: the later setting wins either way round.
    let later = |args: &[&str]| value(&fake, args, "eviction_ratio").unwrap();
    assert_eq!(later(&["--eviction_ratio=0.1", "--flagfile=f5"]), "0.4");
    assert_eq!(later(&["--flagfile=f5", "--eviction_ratio=0.1"]), "0.1");
    let (settings, _) = run(&fake, &["--flagfile", "f6"]);
    assert_eq!(settings["client_ttl"], "34");
    assert_eq!(settings["enable_ha"], "false");
    assert_eq!(settings["cluster_id"], "x");
    // Meta flags work inside a file; a file may name a file.
    let mut env = files(&[("f7", "--fromenv=client_ttl\n")]);
    env.env.insert("FLAGS_client_ttl".into(), "44".into());
    assert_eq!(
        value(&env, &["--flagfile=f7"], "client_ttl").as_deref(),
        Some("44")
    );
    let (settings, _) = run(&fake, &["--flagfile=f8"]);
    assert_eq!(
        (&*settings["eviction_ratio"], &*settings["cluster_id"]),
        ("0.4", "y")
    );
    // Upstream: "/nonexist: No such file or directory", exit 1.
    assert!(error(&fake, &["--flagfile=/nonexist"]).contains("/nonexist"));
    let looping = files(&[("loop", "--flagfile=loop\n")]);
    assert!(error(&looping, &["--flagfile=loop"]).contains("nested"));
}

#[test]
fn command_line_forms() {
    let none = Fake::default();
    let (settings, _) = run(&none, &["--enable_ha", "false", "-client_ttl", "5"]);
    assert_eq!(
        (&*settings["enable_ha"], &*settings["client_ttl"]),
        ("false", "5")
    );
    assert_eq!(
        value(&none, &["--enable_ha"], "enable_ha").as_deref(),
        Some("true")
    );
    assert_eq!(
        scan_with(&none, &["--x", "--help"]),
        Ok(Scan::Stop("help".into()))
    );
    assert!(error(&none, &["--client_ttl"]).contains("needs a value"));
    assert!(error(&none, &["--flagfile"]).contains("needs a value"));
    assert!(error(&none, &["--noclient_ttl"]).contains("not a boolean"));
    assert!(error(&none, &["--noenable_ha=1"]).contains("takes no value"));
    let Ok(Scan::Flags { positional, .. }) = scan_with(&none, &["a", "--", "--b", "-"]) else {
        panic!()
    };
    assert_eq!(positional, ["a", "--b", "-"]);
}

#[test]
fn globs() {
    for (glob, name, hit) in [
        ("mooncake_master", "mooncake_master", true),
        ("mooncake_*", "mooncake_master", true),
        ("*master", "mooncake_master", true),
        ("m?oncake*r", "mooncake_master", true),
        ("*client", "mooncake_master", false),
        ("mooncake", "mooncake_master", false),
        ("", "mooncake_master", false),
        ("*", "", true),
    ] {
        assert_eq!(glob_match(glob, name), hit, "{glob} {name}");
    }
}
