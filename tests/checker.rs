//! The history checker of the randomized fault harness (`tests/tests/fault_harness.rs`,
//! rules in `docs/reliability.md`, "Randomized faults").
//!
//! A history is what the harness's clients did (one [`Op`] per call: invoke and complete time,
//! key, the write's value id, the outcome) plus what the fault schedule did ([`Mark`]s: storage
//! node kills, leader kills, eviction counters moving, soft-pin counts after an election). It is
//! stored as JSON lines, one event a line ([`History::to_jsonl`], [`History::from_jsonl`]), so
//! a failing run's file can be checked again by hand.
//!
//! Each key is a register. An operation's *effect* is a value id (put, upsert) or nothing
//! (remove). A read may return the effect of an operation `o` on its key when
//!
//! - `o` was invoked before the read completed (it may be concurrent with the read), and
//! - `o` is not *superseded*: no definite operation `a` on the key was invoked after `o`
//!   completed and completed before the read was invoked (every master orders `a` after `o`,
//!   and versions only grow). A definite operation is an acknowledged upsert or an
//!   acknowledged remove; an acknowledged `put` is not, because `put` of a key that exists is
//!   upstream's first-writer-wins no-op reported as success (`OBJECT_ALREADY_EXISTS`).
//! - Operations that failed count as possible effects (their answer may have been lost after
//!   they took effect), except removes the master refused (`OBJECT_HAS_LEASE`,
//!   `REPLICA_IS_NOT_READY`), which are known to have done nothing.
//! - Before any operation the key holds nothing (a virtual acknowledged remove at time 0).
//!
//! Rules (each broken rule is a [`Violation`]):
//!
//! 1. `foreign-bytes`: a get returned bytes that are no write's bytes for that key (torn,
//!    another key's, a killed writer's half-written object), or a value id no write to that
//!    key had been invoked with before the read completed.
//! 2. `stale-read`: a get returned a value that a later definite write had superseded.
//! 3. `remove-came-back`: a get or probe saw a value that an acknowledged remove had
//!    superseded.
//! 4. `lost-write`: a get answered `OBJECT_NOT_FOUND` (or a probe `false`) when every allowed
//!    effect is a value: an acknowledged write vanished. Accepted (counted apart, not a
//!    violation) when a storage node was SIGKILLed after the oldest allowed write was invoked
//!    (its replicas may have died with it), or the `disk` fault destroyed a disk copy of that
//!    key (a `disk-damage <key>` mark) after the oldest allowed write was invoked and before the
//!    read completed (the disk tier is a cache tier: a copy destroyed there is a miss, like an
//!    eviction of that copy), or the masters' eviction counters moved before the read
//!    completed (eviction is allowed and visible in metrics).
//! 5. `soft-pin-lost`: after an election the new leader counts fewer soft-pinned keys than
//!    the harness pinned (pinned keys are never removed). The owners re-report each object's
//!    soft pin (`HeldObject::soft_pin_ttl_ms`) and the new leader pins it again for a full ttl
//!    (`docs/ha.md`, "Soft pins after a failover"), so this is an ordinary violation. It used
//!    to be a known open window; [`Report::known`] stays for the next one and is empty now.
//! 6. `forced-remove-refused`: a forced remove answered `OBJECT_HAS_LEASE`. Force overrides
//!    every lease (`controlplane/src/service/object.rs`, `removable`); only an object not yet
//!    complete (`REPLICA_IS_NOT_READY`) may refuse it.
//!
//! Reads that failed with any other error constrain nothing.

use std::collections::HashMap;
use std::fmt::Write as _;

/// The kind of a client call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Put,
    Upsert,
    Remove,
    Get,
    Exist,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Put => "put",
            Kind::Upsert => "upsert",
            Kind::Remove => "remove",
            Kind::Get => "get",
            Kind::Exist => "exist",
        }
    }
    fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "put" => Kind::Put,
            "upsert" => Kind::Upsert,
            "remove" => Kind::Remove,
            "get" => Kind::Get,
            "exist" => Kind::Exist,
            _ => return None,
        })
    }
    fn writes(self) -> bool {
        matches!(self, Kind::Put | Kind::Upsert | Kind::Remove)
    }
}

/// What a call answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A write or remove acknowledged.
    Ok,
    /// A get returned the bytes of write `id` (the harness checked they are exactly its bytes).
    Value(u64),
    /// A get returned bytes that are no write's bytes for the key.
    Foreign,
    /// `OBJECT_NOT_FOUND` from a get.
    NotFound,
    /// A probe's answer.
    Exists(bool),
    /// Any other error (its code).
    Err(i32),
}

/// `OBJECT_HAS_LEASE` and `REPLICA_IS_NOT_READY`: a remove refused, nothing done.
const REFUSED: [i32; 2] = [OBJECT_HAS_LEASE, -703];

const OBJECT_HAS_LEASE: i32 = -706;

/// One client call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub client: u32,
    pub kind: Kind,
    pub key: String,
    /// The value id of a put or upsert.
    pub value: Option<u64>,
    /// A remove with `force` (ignores leases); false for every other call.
    pub force: bool,
    /// Nanoseconds since the harness started.
    pub invoke: u64,
    pub complete: u64,
    pub outcome: Outcome,
}

/// Something the fault schedule did or observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mark {
    /// A fault injected (`node-kill`, `node-restart`, `leader-kill`, `etcd-restart`,
    /// `client-kill`, `memory-pressure`, ...) at `at`.
    Fault { at: u64, what: String },
    /// The masters' evicted-key counters (summed over every master that ever led) grew to
    /// `total` some time after `at` (the harness dates it at the last poll that read less).
    Evictions { at: u64, total: u64 },
    /// The leader elected at about `at` counted `seen` soft-pinned keys once settled; the
    /// harness had pinned `expected`.
    SoftPins { at: u64, expected: u64, seen: u64 },
}

/// A whole run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub ops: Vec<Op>,
    pub marks: Vec<Mark>,
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub rule: &'static str,
    pub key: String,
    /// Index of the read in `History::ops` (`usize::MAX` for a mark).
    pub op: usize,
    pub detail: String,
}

/// The checker's verdict and counts.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub violations: Vec<Violation>,
    /// Broken rules that are known open windows, listed apart (none at present: see the
    /// module docs).
    pub known: Vec<Violation>,
    /// Reads checked against the rules (gets with a value or not-found, probes).
    pub reads_checked: usize,
    /// Vanished values accepted because a node holding them was killed.
    pub lost_with_node: usize,
    /// Vanished values accepted because evictions happened.
    pub lost_to_eviction: usize,
    /// Vanished values accepted because the disk fault destroyed a disk copy of that key.
    pub lost_to_disk_fault: usize,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// What an operation leaves in its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    Value(u64),
    Gone,
}

/// A possible effect on a key, with the times the rules need.
#[derive(Clone, Copy, Debug)]
struct Cand {
    effect: Effect,
    invoke: u64,
    complete: u64,
    /// Acknowledged upsert or remove: orders every later read after it.
    definite: bool,
    /// An upsert: while it is in flight the key reads as nothing.
    upsert: bool,
}

fn candidates(o: &Op) -> Vec<Cand> {
    let Some(c) = candidate(o) else {
        return Vec::new();
    };
    if o.kind == Kind::Upsert && o.outcome != Outcome::Ok {
        // A failed upsert replaced the old value at its start and was revoked: nothing left.
        let gone = Cand {
            effect: Effect::Gone,
            ..c
        };
        return vec![c, gone];
    }
    vec![c]
}

fn candidate(o: &Op) -> Option<Cand> {
    let effect = match (o.kind, o.value) {
        (Kind::Put | Kind::Upsert, Some(id)) => Effect::Value(id),
        (Kind::Remove, _) => {
            if matches!(o.outcome, Outcome::Err(c) if REFUSED.contains(&c)) {
                return None;
            }
            Effect::Gone
        }
        _ => return None,
    };
    Some(Cand {
        effect,
        invoke: o.invoke,
        complete: o.complete,
        definite: o.outcome == Outcome::Ok && o.kind != Kind::Put,
        upsert: o.kind == Kind::Upsert,
    })
}

/// Checks `h` against the rules of the module docs.
pub fn check(h: &History) -> Report {
    let mut rep = Report::default();
    // Per key: candidates, and the definite ones sorted by completion with a running maximum
    // of their invoke times (the latest "ordered after" point a read can rely on).
    let mut cands: HashMap<&str, Vec<Cand>> = HashMap::new();
    for o in h.ops.iter().filter(|o| o.kind.writes()) {
        cands.entry(&o.key).or_default().extend(candidates(o));
    }
    let mut fences: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for (k, cs) in &cands {
        let mut d: Vec<(u64, u64)> = cs
            .iter()
            .filter(|c| c.definite)
            .map(|c| (c.complete, c.invoke))
            .collect();
        d.sort_unstable();
        let mut max = 0;
        for e in &mut d {
            max = max.max(e.1);
            e.1 = max;
        }
        fences.insert(k, d);
    }
    let node_kills: Vec<u64> = h
        .marks
        .iter()
        .filter_map(|m| match m {
            Mark::Fault { at, what } if what == "node-kill" => Some(*at),
            _ => None,
        })
        .collect();
    // `disk-damage <key> ...`: a disk copy of that key destroyed (the disk tier is a cache
    // tier: a destroyed copy is a miss, like an eviction of that copy).
    let disk_damage: Vec<(&str, u64)> = h
        .marks
        .iter()
        .filter_map(|m| match m {
            Mark::Fault { at, what } => {
                let key = what.strip_prefix("disk-damage ")?.split(' ').next()?;
                Some((key, *at))
            }
            _ => None,
        })
        .collect();
    let first_eviction = h.marks.iter().find_map(|m| match m {
        Mark::Evictions { at, total } if *total > 0 => Some(*at),
        _ => None,
    });
    let empty: Vec<Cand> = Vec::new();
    for (i, r) in h.ops.iter().enumerate() {
        if r.kind == Kind::Remove && r.force && r.outcome == Outcome::Err(OBJECT_HAS_LEASE) {
            rep.violations.push(Violation {
                rule: "forced-remove-refused",
                key: r.key.clone(),
                op: i,
                detail: "a forced remove answered OBJECT_HAS_LEASE".into(),
            });
        }
        if r.kind.writes() {
            continue;
        }
        let cs = cands.get(r.key.as_str()).unwrap_or(&empty);
        // The latest invoke of a definite op that completed before this read was invoked.
        let fence = fences
            .get(r.key.as_str())
            .and_then(|d| {
                let n = d.partition_point(|&(c, _)| c < r.invoke);
                n.checked_sub(1).map(|j| d[j].1)
            })
            // The virtual remove at time 0 is superseded by any definite op before the read.
            .map(|m| m.max(1));
        let live = |c: &&Cand| c.invoke < r.complete && fence.is_none_or(|f| c.complete >= f);
        let allowed: Vec<Cand> = cs.iter().filter(live).copied().collect();
        let in_flight_upsert = cs
            .iter()
            .any(|c| c.upsert && c.invoke < r.complete && c.complete > r.invoke);
        let gone_ok =
            fence.is_none() || in_flight_upsert || allowed.iter().any(|c| c.effect == Effect::Gone);
        let violation = |rule, detail: String| Violation {
            rule,
            key: r.key.clone(),
            op: i,
            detail,
        };
        let why_superseded = |id: u64| -> &'static str {
            // Which definite op superseded the value: a remove or a write?
            let c = cs.iter().find(|c| c.effect == Effect::Value(id));
            let later = c.and_then(|c| {
                cs.iter()
                    .filter(|a| a.definite && a.invoke > c.complete && a.complete < r.invoke)
                    .max_by_key(|a| a.complete)
            });
            match later.map(|a| a.effect) {
                Some(Effect::Gone) => "remove-came-back",
                _ => "stale-read",
            }
        };
        let saw_value = match &r.outcome {
            Outcome::Foreign => {
                rep.violations.push(violation(
                    "foreign-bytes",
                    format!(
                        "{} returned bytes no write of this key wrote",
                        r.kind.name()
                    ),
                ));
                continue;
            }
            Outcome::Value(id) => Some(Some(*id)),
            Outcome::Exists(true) => Some(None),
            Outcome::NotFound | Outcome::Exists(false) => None,
            Outcome::Ok | Outcome::Err(_) => continue,
        };
        rep.reads_checked += 1;
        match saw_value {
            Some(Some(id)) => {
                let written = cs
                    .iter()
                    .any(|c| c.effect == Effect::Value(id) && c.invoke < r.complete);
                if !written {
                    rep.violations.push(violation(
                        "foreign-bytes",
                        format!("get returned value {id}, never written to this key before"),
                    ));
                } else if !allowed.iter().any(|c| c.effect == Effect::Value(id)) {
                    rep.violations.push(violation(
                        why_superseded(id),
                        format!("get returned value {id}, superseded before the read began"),
                    ));
                }
            }
            Some(None) => {
                if !allowed.iter().any(|c| matches!(c.effect, Effect::Value(_))) {
                    rep.violations.push(violation(
                        "remove-came-back",
                        "probe said the key exists, every allowed effect is a remove".into(),
                    ));
                }
            }
            None => {
                if gone_ok {
                    continue;
                }
                let oldest = allowed.iter().map(|c| c.invoke).min().unwrap_or(0);
                if node_kills.iter().any(|&t| t > oldest && t < r.complete) {
                    rep.lost_with_node += 1;
                } else if disk_damage
                    .iter()
                    .any(|&(k, t)| k == r.key && t > oldest && t < r.complete)
                {
                    rep.lost_to_disk_fault += 1;
                } else if first_eviction.is_some_and(|t| t < r.complete) {
                    rep.lost_to_eviction += 1;
                } else {
                    let ids: Vec<String> =
                        allowed.iter().map(|c| format!("{:?}", c.effect)).collect();
                    rep.violations.push(violation(
                        "lost-write",
                        format!(
                            "{} answered not found, allowed only {}",
                            r.kind.name(),
                            ids.join(", ")
                        ),
                    ));
                }
            }
        }
    }
    for m in &h.marks {
        if let Mark::SoftPins { at, expected, seen } = m {
            if seen < expected {
                rep.violations.push(Violation {
                    rule: "soft-pin-lost",
                    key: String::new(),
                    op: usize::MAX,
                    detail: format!(
                        "leader elected at {:.1} s counts {seen} soft-pinned keys of {expected}",
                        *at as f64 / 1e9
                    ),
                });
            }
        }
    }
    rep
}

// ---- JSON lines ------------------------------------------------------------------------------

fn outcome_fields(o: &Outcome) -> String {
    match o {
        Outcome::Ok => r#""result":"ok""#.into(),
        Outcome::Value(id) => format!(r#""result":"value","read":{id}"#),
        Outcome::Foreign => r#""result":"foreign""#.into(),
        Outcome::NotFound => r#""result":"not_found""#.into(),
        Outcome::Exists(b) => format!(r#""result":"exists","exists":{b}"#),
        Outcome::Err(c) => format!(r#""result":"error","code":{c}"#),
    }
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

impl Op {
    pub fn to_json(&self) -> String {
        let value = self
            .value
            .map_or(String::new(), |v| format!(r#","value":{v}"#));
        let force = if self.force { r#","force":true"# } else { "" };
        format!(
            r#"{{"type":"op","client":{},"op":"{}","key":{}{value}{force},"invoke":{},"complete":{},{}}}"#,
            self.client,
            self.kind.name(),
            json_str(&self.key),
            self.invoke,
            self.complete,
            outcome_fields(&self.outcome)
        )
    }
}

impl Mark {
    pub fn to_json(&self) -> String {
        match self {
            Mark::Fault { at, what } => {
                format!(r#"{{"type":"fault","at":{at},"what":{}}}"#, json_str(what))
            }
            Mark::Evictions { at, total } => {
                format!(r#"{{"type":"evictions","at":{at},"total":{total}}}"#)
            }
            Mark::SoftPins { at, expected, seen } => {
                format!(r#"{{"type":"soft_pins","at":{at},"expected":{expected},"seen":{seen}}}"#)
            }
        }
    }
}

impl History {
    /// One JSON object per line: ops and marks in the order given.
    pub fn to_jsonl(&self) -> String {
        let mut s = String::new();
        for m in &self.marks {
            let _ = writeln!(s, "{}", m.to_json());
        }
        for o in &self.ops {
            let _ = writeln!(s, "{}", o.to_json());
        }
        s
    }

    /// Parses what [`History::to_jsonl`] (or the harness, line by line) wrote; the error names
    /// the line.
    pub fn from_jsonl(text: &str) -> Result<History, String> {
        let mut h = History::default();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |why: &str| format!("line {}: {why}: {line}", n + 1);
            let v: serde_json::Value =
                serde_json::from_str(line).map_err(|e| bad(&e.to_string()))?;
            let u = |f: &str| v.get(f).and_then(serde_json::Value::as_u64);
            let s = |f: &str| v.get(f).and_then(serde_json::Value::as_str);
            let need = |f: &str| u(f).ok_or_else(|| bad(&format!("no number `{f}`")));
            match s("type") {
                Some("op") => {
                    let kind = s("op")
                        .and_then(Kind::parse)
                        .ok_or_else(|| bad("bad `op`"))?;
                    let outcome = match s("result") {
                        Some("ok") => Outcome::Ok,
                        Some("value") => Outcome::Value(need("read")?),
                        Some("foreign") => Outcome::Foreign,
                        Some("not_found") => Outcome::NotFound,
                        Some("exists") => Outcome::Exists(
                            v.get("exists")
                                .and_then(serde_json::Value::as_bool)
                                .ok_or_else(|| bad("no bool `exists`"))?,
                        ),
                        Some("error") => Outcome::Err(
                            v.get("code")
                                .and_then(serde_json::Value::as_i64)
                                .and_then(|c| i32::try_from(c).ok())
                                .ok_or_else(|| bad("no `code`"))?,
                        ),
                        _ => return Err(bad("bad `result`")),
                    };
                    h.ops.push(Op {
                        client: u32::try_from(need("client")?).map_err(|_| bad("client"))?,
                        kind,
                        key: s("key").ok_or_else(|| bad("no `key`"))?.to_string(),
                        value: u("value"),
                        force: match v.get("force") {
                            None => false,
                            Some(f) => f.as_bool().ok_or_else(|| bad("`force` not a bool"))?,
                        },
                        invoke: need("invoke")?,
                        complete: need("complete")?,
                        outcome,
                    });
                }
                Some("fault") => h.marks.push(Mark::Fault {
                    at: need("at")?,
                    what: s("what").ok_or_else(|| bad("no `what`"))?.to_string(),
                }),
                Some("evictions") => h.marks.push(Mark::Evictions {
                    at: need("at")?,
                    total: need("total")?,
                }),
                Some("soft_pins") => h.marks.push(Mark::SoftPins {
                    at: need("at")?,
                    expected: need("expected")?,
                    seen: need("seen")?,
                }),
                _ => return Err(bad("unknown `type`")),
            }
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(kind: Kind, value: Option<u64>, t: (u64, u64), outcome: Outcome) -> Op {
        Op {
            client: 0,
            kind,
            key: "k".into(),
            value,
            force: false,
            invoke: t.0,
            complete: t.1,
            outcome,
        }
    }
    fn up(id: u64, t: (u64, u64)) -> Op {
        op(Kind::Upsert, Some(id), t, Outcome::Ok)
    }
    fn get(t: (u64, u64), o: Outcome) -> Op {
        op(Kind::Get, None, t, o)
    }
    fn rm(t: (u64, u64), o: Outcome) -> Op {
        op(Kind::Remove, None, t, o)
    }
    fn rules(ops: Vec<Op>, marks: Vec<Mark>) -> Vec<&'static str> {
        let h = History { ops, marks };
        // Every verdict survives the round trip through the file format.
        let again = History::from_jsonl(&h.to_jsonl()).expect("round trip");
        assert_eq!(again, h);
        let r = check(&h);
        r.violations
            .iter()
            .chain(&r.known)
            .map(|v| v.rule)
            .collect()
    }

    #[test]
    fn sequential_reads_of_the_last_write_pass() {
        let ops = vec![
            get((1, 2), Outcome::NotFound),
            up(1, (3, 4)),
            get((5, 6), Outcome::Value(1)),
            up(2, (7, 8)),
            get((9, 10), Outcome::Value(2)),
            op(Kind::Exist, None, (11, 12), Outcome::Exists(true)),
            rm((13, 14), Outcome::Ok),
            get((15, 16), Outcome::NotFound),
            op(Kind::Exist, None, (17, 18), Outcome::Exists(false)),
        ];
        assert!(rules(ops, vec![]).is_empty());
    }

    #[test]
    fn a_read_concurrent_with_a_write_may_see_either() {
        for seen in [Outcome::Value(1), Outcome::Value(2)] {
            let ops = vec![up(1, (1, 2)), up(2, (3, 10)), get((4, 5), seen)];
            assert!(rules(ops, vec![]).is_empty());
        }
        // Concurrent with a remove: the value or nothing.
        for seen in [Outcome::Value(1), Outcome::NotFound] {
            let ops = vec![up(1, (1, 2)), rm((3, 10), Outcome::Ok), get((4, 5), seen)];
            assert!(rules(ops, vec![]).is_empty());
        }
    }

    #[test]
    fn a_failed_write_may_or_may_not_have_happened() {
        for seen in [Outcome::Value(1), Outcome::Value(2)] {
            let ops = vec![
                up(1, (1, 2)),
                op(Kind::Upsert, Some(2), (3, 4), Outcome::Err(-1010)),
                get((5, 6), seen),
            ];
            assert!(rules(ops, vec![]).is_empty());
        }
        // ... until a definite write after it.
        let ops = vec![
            op(Kind::Upsert, Some(2), (3, 4), Outcome::Err(-1010)),
            up(3, (5, 6)),
            get((7, 8), Outcome::Value(2)),
        ];
        assert_eq!(rules(ops, vec![]), ["stale-read"]);
    }

    #[test]
    fn an_upsert_in_flight_may_hide_the_key() {
        let ops = vec![
            up(1, (1, 2)),
            up(2, (3, 10)),
            op(Kind::Exist, None, (4, 5), Outcome::Exists(false)),
            get((6, 7), Outcome::NotFound),
        ];
        assert!(rules(ops, vec![]).is_empty());
        // Once it is acknowledged, no longer.
        let ops = vec![up(1, (1, 2)), up(2, (3, 4)), get((6, 7), Outcome::NotFound)];
        assert_eq!(rules(ops, vec![]), ["lost-write"]);
        // A failed upsert may leave nothing, until a definite write after it.
        let failed = || op(Kind::Upsert, Some(2), (3, 4), Outcome::Err(-800));
        let ops = vec![up(1, (1, 2)), failed(), get((6, 7), Outcome::NotFound)];
        assert!(rules(ops, vec![]).is_empty());
        let ops = vec![
            up(1, (1, 2)),
            failed(),
            up(3, (5, 6)),
            get((7, 8), Outcome::NotFound),
        ];
        assert_eq!(rules(ops, vec![]), ["lost-write"]);
    }

    #[test]
    fn a_stale_read_fails() {
        let ops = vec![up(1, (1, 2)), up(2, (3, 4)), get((5, 6), Outcome::Value(1))];
        assert_eq!(rules(ops, vec![]), ["stale-read"]);
    }

    #[test]
    fn an_acknowledged_remove_that_comes_back_fails() {
        let ops = vec![
            up(1, (1, 2)),
            rm((3, 4), Outcome::Ok),
            get((5, 6), Outcome::Value(1)),
            op(Kind::Exist, None, (7, 8), Outcome::Exists(true)),
        ];
        assert_eq!(rules(ops, vec![]), ["remove-came-back", "remove-came-back"]);
    }

    #[test]
    fn a_refused_remove_did_nothing() {
        let ops = vec![
            up(1, (1, 2)),
            rm((3, 4), Outcome::Err(-706)),
            get((5, 6), Outcome::NotFound),
        ];
        assert_eq!(rules(ops, vec![]), ["lost-write"]);
        // A remove that failed otherwise may have happened.
        let ops = vec![
            up(1, (1, 2)),
            rm((3, 4), Outcome::Err(-1010)),
            get((5, 6), Outcome::NotFound),
        ];
        assert!(rules(ops, vec![]).is_empty());
    }

    #[test]
    fn a_forced_remove_refused_for_a_lease_fails() {
        let forced = |o| Op {
            force: true,
            ..rm((3, 4), o)
        };
        // Not forced: a lease may refuse it, and it did nothing.
        let ops = vec![
            up(1, (1, 2)),
            rm((3, 4), Outcome::Err(-706)),
            get((5, 6), Outcome::Value(1)),
        ];
        assert_eq!(rules(ops, vec![]), Vec::<&str>::new());
        // Forced: only an incomplete object may refuse it.
        let ops = vec![
            up(1, (1, 2)),
            forced(Outcome::Err(-703)),
            get((5, 6), Outcome::Value(1)),
        ];
        assert_eq!(rules(ops, vec![]), Vec::<&str>::new());
        let ops = vec![
            up(1, (1, 2)),
            forced(Outcome::Err(-706)),
            get((5, 6), Outcome::Value(1)),
        ];
        assert_eq!(rules(ops, vec![]), vec!["forced-remove-refused"]);
        // The flag survives the file format only as a bool.
        let bad = r#"{"type":"op","client":0,"op":"remove","key":"k","force":1,"invoke":1,"complete":2,"result":"ok"}"#;
        assert!(History::from_jsonl(bad).unwrap_err().contains("force"));
    }

    #[test]
    fn not_found_after_an_acknowledged_write_fails_unless_excused() {
        let ops = || vec![up(1, (1, 2)), get((5, 6), Outcome::NotFound)];
        assert_eq!(rules(ops(), vec![]), ["lost-write"]);
        // A leader kill is no excuse (the get right after an election).
        let leader = Mark::Fault {
            at: 3,
            what: "leader-kill".into(),
        };
        assert_eq!(rules(ops(), vec![leader]), ["lost-write"]);
        // A storage node killed after the write: its replicas may be gone.
        let node = Mark::Fault {
            at: 3,
            what: "node-kill".into(),
        };
        assert!(rules(ops(), vec![node]).is_empty());
        // Killed before the write: no excuse.
        let early = Mark::Fault {
            at: 0,
            what: "node-kill".into(),
        };
        assert_eq!(rules(ops(), vec![early]), ["lost-write"]);
        // Evictions visible in metrics before the read.
        let ev = Mark::Evictions { at: 4, total: 3 };
        let h = History {
            ops: ops(),
            marks: vec![ev],
        };
        let r = check(&h);
        assert!(r.ok());
        assert_eq!(r.lost_to_eviction, 1);
        // A disk copy of this key destroyed after the write: the copy may have been the last.
        let key = ops()[1].key.clone();
        let disk = |at: u64, key: &str| Mark::Fault {
            at,
            what: format!("disk-damage {key} node0 delete of 0/1000000000001000.mco"),
        };
        let h = History {
            ops: ops(),
            marks: vec![disk(3, &key)],
        };
        let r = check(&h);
        assert!(r.ok());
        assert_eq!(r.lost_to_disk_fault, 1);
        // Another key's copy, or one destroyed before the write: no excuse.
        assert_eq!(rules(ops(), vec![disk(3, "other")]), ["lost-write"]);
        assert_eq!(rules(ops(), vec![disk(0, &key)]), ["lost-write"]);
    }

    #[test]
    fn foreign_bytes_fail() {
        let ops = vec![up(1, (1, 2)), get((3, 4), Outcome::Foreign)];
        assert_eq!(rules(ops, vec![]), ["foreign-bytes"]);
        // A value id written to this key only after the read completed.
        let ops = vec![get((1, 2), Outcome::Value(7)), up(7, (3, 4))];
        assert_eq!(rules(ops, vec![]), ["foreign-bytes"]);
        // A value id of another key.
        let mut other = up(9, (1, 2));
        other.key = "other".into();
        let ops = vec![other, get((3, 4), Outcome::Value(9))];
        assert_eq!(rules(ops, vec![]), ["foreign-bytes"]);
    }

    #[test]
    fn an_acknowledged_put_does_not_order_reads() {
        // put of an existing key is first-writer-wins: acknowledged, no effect.
        let ops = vec![
            up(1, (1, 2)),
            op(Kind::Put, Some(2), (3, 4), Outcome::Ok),
            get((5, 6), Outcome::Value(1)),
            get((7, 8), Outcome::Value(2)),
        ];
        assert!(rules(ops, vec![]).is_empty());
    }

    #[test]
    fn lost_soft_pins_fail() {
        let m = |seen| Mark::SoftPins {
            at: 5,
            expected: 4,
            seen,
        };
        assert!(rules(vec![], vec![m(4)]).is_empty());
        assert_eq!(rules(vec![], vec![m(0)]), ["soft-pin-lost"]);
        assert_eq!(rules(vec![], vec![m(3)]), ["soft-pin-lost"], "one pin lost");
        // An ordinary violation now, not a known open window.
        let r = check(&History {
            ops: vec![],
            marks: vec![m(0)],
        });
        assert_eq!(r.violations.len(), 1);
        assert!(r.known.is_empty());
    }

    #[test]
    fn keys_are_independent() {
        let mut a = up(1, (1, 2));
        a.key = "a".into();
        let mut r = rm((3, 4), Outcome::Ok);
        r.key = "b".into();
        let mut g = get((5, 6), Outcome::Value(1));
        g.key = "a".into();
        assert!(rules(vec![a, r, g], vec![]).is_empty());
    }

    #[test]
    fn bad_lines_are_errors_naming_the_line() {
        let e = History::from_jsonl("{\"type\":\"op\"}\n").unwrap_err();
        assert!(e.starts_with("line 1:"), "{e}");
        assert!(History::from_jsonl("not json").is_err());
        assert!(History::from_jsonl("{\"type\":\"x\"}").is_err());
    }
}
