#!/usr/bin/env python3
"""House rules of docs/STYLE.md that a tool can check, in the spirit of TigerBeetle's tidy.zig.

Usage:
    python3 scripts/tidy.py                    # check the tree; exit 1 on any violation
    python3 scripts/tidy.py --update-baseline  # record today's exceptions (then check)
    python3 scripts/tidy.py --self-test        # show that every rule fires on bad input

Each violation is printed as `path:line: rule: reason`. The rules:

- `work-item`: no reference to a numbered work item (the word issue or session, perhaps
  plural or possessive, then a number) in the docs (docs/, README.md, python/README.md,
  bench/README.md) or in the comments and docstrings of .rs, .py, .pyi, .sh, .c and .h files.
  A newcomer cannot look those numbers up: name the change instead. `issue #N` (with the `#`,
  as in "upstream issue #2187") is a public reference and is allowed.
- `fn-length`: a Rust function is at most 70 lines (FN_LINES_MAX), counted from the line of its
  `fn` to the line of its closing brace. Production code only: test files (a `tests` path
  component, a `tests.rs`, or a file that starts `#![cfg(test)]`) and `#[test]` or
  `#[cfg(test)]` items are not counted, nor fuzz targets. A function over the limit today is
  recorded in the baseline and may not grow past its recorded length; any other function
  over the limit fails.
- `file-length`: a source file (.rs, .py, .pyi, .sh, .c, .h, tests included) is at most
  1,500 lines (FILE_LINES_MAX); the same ratchet through the baseline.
- `fuzz`: every fuzz/fuzz_targets/<target>.rs is a `[[bin]]` of fuzz/Cargo.toml (which is
  what scripts/fuzz.sh runs, through `cargo fuzz list`), has at least one seed file in
  fuzz/seeds/<target>/ and a line in fuzz/sources.tsv (the sources whose change gives it its
  full share of the fuzzing budget) whose every path prefix names a file of the tree; a line
  for a target that does not exist fails too.
- `limit-unit`: a constant in a crate's src/limits.rs names its unit (see
  `limit_name_problem`): a `Duration`, or a name ending in a unit (`_BYTES`, `_MS`, `_US`,
  `_NS`, `_SECS`, `_ITEMS`, `_ENTRIES`, `_COUNT`, or the plural noun it counts, as in
  `_RANKS`), a rate (`_BYTES_PER_S`), or either followed by `_MAX`, `_MIN` or `_DEFAULT`;
  a bare `_MAX`/`_MIN`/`_DEFAULT` bounds a count of the noun before it (`CLIENT_LANES_MAX`)
  unless that noun is a time (`CONNECT_TIMEOUT_MAX` needs `_MS`). Exceptions live in the
  baseline.
- `stray-limit`: a constant that looks like a limit (an integer or `Duration` whose name ends
  in a unit, or has a word such as MAX, MIN, LIMIT, TIMEOUT, INTERVAL, BACKOFF, TTL) lives in
  a `limits.rs` of its crate (`src/limits.rs`, or a module's own, as `disk/limits.rs`), where a
  reader finds every bound in one place; not in the library code of client, collective,
  controlplane, dataplane, protocol or the Python binding. Tests are not counted. The ones left where they
  are used when the rule was written are in the baseline (`limit 0 <path>::<NAME>`); a new
  one, or one moved to another file, fails.
- `layers`: no two folders (top-level modules) of `dataplane/src` import each other, directly
  or round a longer circle: each `crate::<folder>` (or a root re-export such as
  `crate::TeError`, or a `super::` that leaves the folder) in the code, comments aside, is an
  arrow, and an arrow that can be followed back to where it started fails, at both ends. And
  `dataplane` never names `collective` (crate `mooncake-collective`, which stands on it): not
  in its Cargo.toml, not as a path in its code. Never baselined.

The baseline (scripts/tidy-baseline.txt) is the ratchet: `--update-baseline` rewrites it
from the tree as it is (lengths may go down or up, entries come and go), prints what it
changed, and then checks the tree as usual. It never hides a `work-item`, `fuzz` or
`layers` violation. Run it only for a deliberate change, and let the diff of the baseline be reviewed
with the code.

Python 3 standard library only; the whole tree takes about two seconds.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

FN_LINES_MAX = 70
FILE_LINES_MAX = 1500
BASELINE = "scripts/tidy-baseline.txt"

DOC_PATHS = ("docs/", "README.md", "python/README.md", "bench/README.md")
COMMENT_EXTS = (".rs", ".py", ".pyi", ".sh", ".c", ".h")
SOURCE_EXTS = (".rs", ".py", ".pyi", ".sh", ".c", ".h")
SKIP_DIRS = {".git", ".venv", "target", "target-loom", "node_modules", "__pycache__"}
# Generated or third-party paths, never checked.
SKIP_PREFIXES = ("fuzz/corpus/", "fuzz/artifacts/", "fuzz/target/", "fuzz/logs/", ".ci/logs/")

WORK_ITEM = re.compile(r"\b(issue|session)s?('s)? [0-9]+", re.IGNORECASE)


class Violation:
    def __init__(self, path, line, rule, reason):
        self.path, self.line, self.rule, self.reason = path, line, rule, reason

    def __str__(self):
        return f"{self.path}:{self.line}: {self.rule}: {self.reason}"


# ---------------------------------------------------------------------------------------------
# Files of the tree.


def list_files(root):
    """Tracked and untracked-but-not-ignored files (git), or a walk outside a git tree."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout.decode()
        files = [f for f in out.split("\0") if f and os.path.isfile(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith("target")]
            for name in filenames:
                files.append(os.path.relpath(os.path.join(dirpath, name), root))
    files = [f.replace(os.sep, "/") for f in files]
    return sorted(
        f
        for f in files
        if not f.startswith(SKIP_PREFIXES) and not (set(f.split("/")[:-1]) & SKIP_DIRS)
    )


def read(root, path):
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------
# Rust (and C) lexing: tokens with their line, comments apart. Enough to match braces and to
# find comments; strings, raw strings, byte strings, chars and lifetimes are skipped whole.

RAW_STRING = re.compile(r'(?:b|c)?r(#*)"')
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def lex_rust(text):
    """Returns (tokens, comments): tokens are (text, line), comments are (text, line)."""
    tokens, comments = [], []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c in " \t\r":
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            comments.append((text[i:j], line))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            comments.append((text[i:j], line))
            line += text.count("\n", i, j)
            i = j
        elif (c in "bcr") and RAW_STRING.match(text, i):
            m = RAW_STRING.match(text, i)
            end = text.find('"' + m.group(1), m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            tokens.append(("<str>", line))
            line += text.count("\n", i, end)
            i = end
        elif c == '"' or (c in "bc" and text.startswith('"', i + 1)):
            j = i + (1 if c == '"' else 2)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            tokens.append(("<str>", line))
            line += text.count("\n", i, j)
            i = j + 1
        elif c == "'" or (c == "b" and text.startswith("'", i + 1)):
            j = i + (1 if c == "'" else 2)
            if j < n and text[j] == "\\":  # an escaped char: '\n', '\'', '\u{..}'
                k = j + 2
                while k < n and text[k] != "'":
                    k += 1
                tokens.append(("<char>", line))
                i = k + 1
            elif j + 1 < n and text[j + 1] == "'":  # 'x'
                tokens.append(("<char>", line))
                i = j + 2
            else:  # a lifetime or a label
                m = IDENT.match(text, j)
                tokens.append(("'" + (m.group(0) if m else ""), line))
                i = m.end() if m else j
        elif c.isalpha() or c == "_":
            m = IDENT.match(text, i)
            raw = m.group(0) == "r" and text.startswith("#", m.end())
            if raw and IDENT.match(text, m.end() + 1):
                m2 = IDENT.match(text, m.end() + 1)  # a raw identifier: r#mod is no keyword
                tokens.append(("r#" + m2.group(0), line))
                i = m2.end()
            else:
                tokens.append((m.group(0), line))
                i = m.end()
        elif c.isdigit():
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            tokens.append(("<num>", line))
            i = j
        else:
            tokens.append((c, line))
            i += 1
    return tokens, comments


def match_braces(tokens):
    """Index of the matching close for every `{`, `(` and `[` (unbalanced ones are dropped)."""
    pairs, stack = {}, []
    closers = {"}": "{", ")": "(", "]": "["}
    for i, (t, _) in enumerate(tokens):
        if t in "{([" and len(t) == 1:
            stack.append(i)
        elif t in closers and len(t) == 1:
            # Pop to the matching opener; a stray closer (macro input) is ignored.
            for k in range(len(stack) - 1, -1, -1):
                if tokens[stack[k]][0] == closers[t]:
                    pairs[stack[k]] = i
                    del stack[k:]
                    break
    return pairs


def is_test_attr(attr):
    a = attr.replace(" ", "")
    return (
        re.fullmatch(r"(\w+::)*test", a) is not None
        or re.match(r"cfg\((all\()?test\b", a) is not None
    )


def impl_name(header):
    """`impl<T> fmt::Display for Foo<T> where ...` -> `<Foo as Display>`; `impl Foo` -> `Foo`."""
    toks, depth, flat = header, 0, []
    for t in toks:  # drop generic arguments
        if t == "<":
            depth += 1
        elif t == ">" and depth:
            depth -= 1
        elif depth == 0:
            flat.append(t)
    if "where" in flat:
        flat = flat[: flat.index("where")]

    def last_ident(ts):
        ids = [t for t in ts if IDENT.fullmatch(t) and t not in ("dyn", "mut", "const", "unsafe")]
        return ids[-1] if ids else "?"

    if "for" in flat:
        k = flat.index("for")
        return f"<{last_ident(flat[k + 1:])} as {last_ident(flat[:k])}>"
    return last_ident(flat)


def rust_functions(text):
    """Yields (qualified name, first line, length in lines, is_test) for every fn with a body."""
    tokens, _ = lex_rust(text)
    pairs = match_braces(tokens)
    scopes = []  # (name, end index, is_test)
    attrs = []
    out = []
    i = 0
    while i < len(tokens):
        while scopes and i > scopes[-1][1]:
            scopes.pop()
        t, line = tokens[i]
        in_test = bool(scopes) and scopes[-1][2]
        if t == "#" and i + 1 < len(tokens):
            j = i + 1
            inner = tokens[j][0] == "!"
            if inner:
                j += 1
            if j < len(tokens) and tokens[j][0] == "[" and j in pairs:
                attr = "".join(x for x, _ in tokens[j + 1 : pairs[j]])
                if inner:
                    if is_test_attr(attr) and not scopes:
                        return []  # #![cfg(test)]: the whole file is a test module
                else:
                    attrs.append(attr)
                i = pairs[j] + 1
                continue
        if t in ("fn", "mod", "trait", "impl") and i + 1 < len(tokens):
            name_tok = tokens[i + 1][0]
            if t != "impl" and not re.fullmatch(r"(r#)?[A-Za-z_][A-Za-z0-9_]*", name_tok):
                i += 1  # `fn(u8) -> u8`, a fn pointer type
                continue
            # The header runs to the first `{` or `;` outside parentheses and brackets.
            j = i + 1
            while j < len(tokens) and tokens[j][0] not in ("{", ";"):
                if tokens[j][0] in "([" and j in pairs:
                    j = pairs[j]
                j += 1
            if j >= len(tokens) or tokens[j][0] == ";" or j not in pairs:
                attrs = []
                i = j + 1
                continue
            is_test = in_test or any(is_test_attr(a) for a in attrs)
            attrs = []
            end = pairs[j]
            if t == "impl":
                name = impl_name([x for x, _ in tokens[i + 1 : j]])
            else:
                name = name_tok
            if t == "fn":
                qual = "::".join([s[0] for s in scopes] + [name])
                out.append((qual, line, tokens[end][1] - line + 1, is_test))
            scopes.append((name, end, is_test))
            i = j + 1
            continue
        if t in (";", "}", "{"):
            attrs = []
        i += 1
    return out


def is_test_path(path):
    parts = path.split("/")
    return "tests" in parts[:-1] or parts[-1] in ("tests.rs", "test.rs") or path.startswith("fuzz/")


# ---------------------------------------------------------------------------------------------
# Comments of Python and shell files.


def python_comments(text):
    """`#` comments and triple-quoted strings (docstrings), with their first line."""
    import io
    import tokenize

    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.string, tok.start[0]))
            elif tok.type == tokenize.STRING and re.match(r"[a-zA-Z]*('''|\"\"\")", tok.string):
                out.append((tok.string, tok.start[0]))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        out = [(line, k) for k, line in enumerate(text.splitlines(), 1) if "#" in line]
    return out


def shell_comments(text):
    out = []
    for k, line in enumerate(text.splitlines(), 1):
        m = re.search(r"(^|\s)#", line)
        if m:
            out.append((line[m.start() :], k))
    return out


def work_item_hits(chunks):
    """(line, match text) for every work-item reference in (text, first line) chunks."""
    for text, first in chunks:
        for m in WORK_ITEM.finditer(text):
            yield first + text.count("\n", 0, m.start()), m.group(0)


# ---------------------------------------------------------------------------------------------
# The rules.


def check_work_items(root, files):
    out = []
    for path in files:
        if path.startswith(DOC_PATHS) and path.endswith(".md") or path in DOC_PATHS:
            chunks = [(read(root, path), 1)]
        elif path.endswith(COMMENT_EXTS):
            text = read(root, path)
            if path.endswith((".rs", ".c", ".h")):
                chunks = lex_rust(text)[1]
            elif path.endswith((".py", ".pyi")):
                chunks = python_comments(text)
            else:
                chunks = shell_comments(text)
        else:
            continue
        for line, hit in work_item_hits(chunks):
            out.append(
                Violation(
                    path,
                    line,
                    "work-item",
                    f'"{hit}": name the change or feature, not its work-item number',
                )
            )
    return out


def measure(root, files):
    """Today's over-limit functions and files: {key: (path, line, length)}."""
    fns, big = {}, {}
    for path in files:
        if not path.endswith(SOURCE_EXTS):
            continue
        text = read(root, path)
        lines = len(text.splitlines())
        if lines > FILE_LINES_MAX:
            big[path] = (path, 1, lines)
        if path.endswith(".rs") and not is_test_path(path):
            seen = {}
            for qual, line, length, is_test in rust_functions(text):
                key = f"{path}::{qual}"
                seen[key] = seen.get(key, 0) + 1
                if seen[key] > 1:  # the same name twice in one scope (cfg variants)
                    key = f"{key}#{seen[key]}"
                if not is_test and length > FN_LINES_MAX:
                    fns[key] = (path, line, length)
    return fns, big


def check_ratchet(fns, big, baseline):
    out = []
    for kind, found, limit in (("fn", fns, FN_LINES_MAX), ("file", big, FILE_LINES_MAX)):
        rule = f"{kind}-length"
        recorded = baseline[kind]
        for key, (path, line, length) in sorted(found.items()):
            what = f"fn {key.split('::', 1)[1]}" if kind == "fn" else "file"
            if key not in recorded:
                out.append(
                    Violation(path, line, rule, f"{what} is {length} lines, over {limit}: split it")
                )
            elif length > recorded[key]:
                out.append(
                    Violation(
                        path,
                        line,
                        rule,
                        f"{what} grew to {length} lines, past its baseline of {recorded[key]}"
                        f" (limit {limit}): shrink it, or rerun with --update-baseline",
                    )
                )
    return out


def cargo_bins(toml_text):
    """name -> path of every [[bin]] of a Cargo.toml (a line scanner: stdlib tomllib is 3.11+)."""
    bins, cur = {}, None
    for line in toml_text.splitlines():
        s = line.split("#", 1)[0].strip()
        if s.startswith("["):
            cur = {} if s == "[[bin]]" else None
            continue
        m = re.fullmatch(r'(name|path)\s*=\s*"([^"]*)"', s)
        if cur is not None and m:
            cur[m.group(1)] = m.group(2)
            if "name" in cur and "path" in cur:
                bins[cur["name"]] = cur["path"]
    return bins


def check_fuzz(root, files):
    targets = sorted(
        f for f in files if re.fullmatch(r"fuzz/fuzz_targets/[^/]+\.rs", f)
    )
    if not targets:
        return []
    out = []
    toml = "fuzz/Cargo.toml"
    bins = cargo_bins(read(root, toml)) if os.path.isfile(os.path.join(root, toml)) else {}
    by_path = {p: n for n, p in bins.items()}
    fuzz_sh = "scripts/fuzz.sh"
    sh = read(root, fuzz_sh) if os.path.isfile(os.path.join(root, fuzz_sh)) else ""
    runs_all = "cargo fuzz list" in sh
    for path in targets:
        rel = path[len("fuzz/") :]
        target = os.path.basename(path)[: -len(".rs")]
        name = by_path.get(rel)
        if name is None:
            out.append(
                Violation(
                    path, 1, "fuzz", f'not a [[bin]] of {toml} (path = "{rel}"), so never fuzzed'
                )
            )
            name = target
        elif not runs_all and not re.search(rf"\b{re.escape(name)}\b", sh):
            out.append(Violation(path, 1, "fuzz", f"target {name} is not run by {fuzz_sh}"))
        seeds = os.path.join(root, "fuzz", "seeds", name)
        if not os.path.isdir(seeds) or not any(
            os.path.isfile(os.path.join(seeds, f)) for f in os.listdir(seeds)
        ):
            out.append(Violation(path, 1, "fuzz", f"no seed file in fuzz/seeds/{name}/"))
    for name, p in sorted(bins.items()):
        if not os.path.isfile(os.path.join(root, "fuzz", p)):
            why = f"[[bin]] {name} names {p}, which does not exist"
            out.append(Violation(toml, 1, "fuzz", why))
    names = {by_path.get(p[len("fuzz/") :], os.path.basename(p)[: -len(".rs")]) for p in targets}
    return out + check_fuzz_sources(root, files, names)


FUZZ_SOURCES = "fuzz/sources.tsv"


def check_fuzz_sources(root, files, names):
    """Every target has a line in fuzz/sources.tsv, and every prefix on it names a file."""
    if not os.path.isfile(os.path.join(root, FUZZ_SOURCES)):
        return [Violation(FUZZ_SOURCES, 1, "fuzz", "missing: scripts/fuzz.sh budgets by it")]
    out, seen = [], set()
    for n, line in enumerate(read(root, FUZZ_SOURCES).splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        target, _, prefixes = line.partition("\t")
        seen.add(target)
        if target not in names:
            out.append(Violation(FUZZ_SOURCES, n, "fuzz", f"no fuzz target {target}"))
        if not prefixes.split():
            out.append(Violation(FUZZ_SOURCES, n, "fuzz", f"{target} names no sources"))
        for p in prefixes.split():
            if not any(f.startswith(p) for f in files):
                out.append(Violation(FUZZ_SOURCES, n, "fuzz", f"{p} names no file"))
    for name in sorted(names - seen):
        out.append(Violation(FUZZ_SOURCES, 1, "fuzz", f"no line for target {name}"))
    return out


# The crate whose folders must not import in a circle, and the crates it must never name.
LAYERED_SRC = "dataplane/src/"
LAYERED_NEVER = {"collective": "mooncake-collective"}
MOD_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def module_of(path):
    """`dataplane/src/mem/shm.rs` -> ["mem", "shm"]; `.../mem/mod.rs` -> ["mem"]."""
    parts = path[len(LAYERED_SRC) : -len(".rs")].split("/")
    return parts[:-1] if parts[-1] in ("mod", "lib") else parts


def root_reexports(root):
    """{name: folder} for the `pub use <folder>::...` items of the crate root (`crate::TeError`)."""
    lib = os.path.join(root, LAYERED_SRC, "lib.rs")
    out = {}
    if os.path.isfile(lib):
        for m in re.finditer(r"pub use (\w+)::(\{[^}]*\}|\w+);", read(root, LAYERED_SRC + "lib.rs")):
            for name in re.findall(r"\w+", m.group(2)):
                out[name] = m.group(1)
    return out


def folder_imports(root, files):
    """{(folder, folder it names): [(path, line)]} over the code (not comments) of the crate."""
    reexports = root_reexports(root)
    edges = {}
    for path in files:
        if not (path.startswith(LAYERED_SRC) and path.endswith(".rs")):
            continue
        mod = module_of(path)
        if not mod:
            continue  # lib.rs declares the folders
        toks, _ = lex_rust(read(root, path))
        t = [x for x, _ in toks]
        for i, tok in enumerate(t):
            target = None
            if tok == "crate" and t[i + 1 : i + 3] == [":", ":"] and i + 3 < len(t):
                name = t[i + 3]
                target = name if MOD_NAME.fullmatch(name) else reexports.get(name)
            elif tok == "super" and not (i and t[i - 1] == ":"):
                j, depth = i, 0
                while t[j : j + 3] == ["super", ":", ":"]:
                    depth, j = depth + 1, j + 3
                if depth >= len(mod) and j < len(t):  # a `super::` that leaves the folder
                    name = t[j]
                    target = name if MOD_NAME.fullmatch(name) else reexports.get(name)
            if target and target != mod[0] and target not in ("self", "super", "crate"):
                edges.setdefault((mod[0], target), []).append((path, toks[i][1]))
    return edges


def check_layers(root, files):
    """Folders of the layered crate that import each other (directly or round a longer
    circle), and any mention of a crate it must never name."""
    out = []
    edges = folder_imports(root, files)
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)

    def reaches(src, dst):
        seen, todo = set(), [src]
        while todo:
            n = todo.pop()
            if n == dst:
                return True
            if n not in seen:
                seen.add(n)
                todo.extend(graph.get(n, ()))
        return False

    for (a, b), locs in sorted(edges.items()):
        if reaches(b, a):
            path, line = locs[0]
            back = next(
                (f"{p}:{n}" for (x, y), ls in sorted(edges.items()) for p, n in ls[:1]
                 if x == b and reaches(y, a)),
                "?",
            )
            out.append(Violation(path, line, "layers",
                                 f"folder {a} imports {b}, which leads back to {a} ({back})"))
    crate_dir = LAYERED_SRC.split("/")[0] + "/"
    for path in files:
        if not path.startswith(crate_dir):
            continue
        if path.endswith("Cargo.toml"):
            text = read(root, path)
            for name, package in LAYERED_NEVER.items():
                for k, line in enumerate(text.splitlines(), 1):
                    if re.match(rf"\s*({name}|{package})\s*[=.]", line) or f'"{package}"' in line:
                        out.append(Violation(path, k, "layers", f"depends on {package}"))
        elif path.endswith(".rs"):
            toks, _ = lex_rust(read(root, path))
            for i, (tok, line) in enumerate(toks):
                if (tok in LAYERED_NEVER and toks[i + 1 : i + 3] and
                        [x for x, _ in toks[i + 1 : i + 3]] == [":", ":"] and
                        not (i and toks[i - 1][0] == ":")):
                    out.append(Violation(path, line, "layers",
                                         f"names the crate {tok}, which stands on this one"))
    return out


UNITS = {"BYTES", "MS", "US", "NS", "SECS", "ITEMS", "ENTRIES", "COUNT"}
TIME_UNITS = {"MS", "US", "NS", "SECS", "S", "SEC"}
QUALIFIERS = {"MAX", "MIN", "DEFAULT"}
TIME_WORDS = {
    "TIMEOUT", "INTERVAL", "DELAY", "TTL", "PERIOD", "TICK", "DEADLINE", "LATENCY", "AGE", "WAIT"
}
CONST_DECL = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?const\s+([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([^=;]+)"
)


def limit_name_problem(name, ty):
    """None if the constant names its unit, else why not."""
    if re.search(r"\bDuration\b", ty):
        return None
    words = name.split("_")
    qualified = False
    while len(words) > 1 and words[-1] in QUALIFIERS:
        words, qualified = words[:-1], True
    last = words[-1]
    if len(words) >= 3 and words[-2] == "PER" and last in TIME_UNITS:
        return None if words[-3] in UNITS or words[-3].endswith("S") else "a rate names its unit"
    if last in UNITS:
        return None
    if last in TIME_WORDS:
        return "a time names its unit (_MS, _US, _SECS, ...) or is a Duration"
    if qualified:
        return None  # a count of the noun before the qualifier: CLIENT_LANES_MAX
    if last.endswith("S") and len(last) > 3:
        return None  # the plural noun it counts: PG_MAX_RANKS, HTTP_MAX_CONNECTIONS
    return "no unit at the end (_BYTES, _MS, _ITEMS, ..., then _MAX/_MIN/_DEFAULT)"


def limits_files(files):
    return [f for f in files if f.endswith("src/limits.rs") and not f.startswith("fuzz/")]


def measure_limits(root, files):
    """{key: (path, line, reason)} for every unit-less constant of a limits.rs."""
    found = {}
    for path in limits_files(files):
        for k, line in enumerate(read(root, path).splitlines(), 1):
            m = CONST_DECL.match(line)
            if not m or m.group(1) == "_":
                continue
            why = limit_name_problem(m.group(1), m.group(2))
            if why:
                found[f"{path}::{m.group(1)}"] = (path, k, why)
    return found


# Library code whose bounds belong in a limits.rs.
LIMIT_HOMES = (
    "client/src/", "collective/src/", "controlplane/src/", "dataplane/src/", "protocol/src/",
    "python/src/",
)
LIMIT_TYPE = re.compile(r"(?:u8|u16|u32|u64|usize|i32|i64|f64|(?:std::time::)?Duration)")
LIMIT_WORDS = {
    "MAX", "MIN", "LIMIT", "TIMEOUT", "INTERVAL", "BACKOFF", "CAP", "CAPACITY", "DEADLINE", "TTL"
}


def measure_stray_limits(root, files):
    """{key: (path, line)} for every limit-like constant outside a limits.rs."""
    found = {}
    for path in files:
        if not path.endswith(".rs") or path.endswith("/limits.rs") or is_test_path(path):
            continue
        if not path.startswith(LIMIT_HOMES):
            continue
        for k, line in enumerate(read(root, path).splitlines(), 1):
            if line.startswith("#[cfg(test)]"):
                break  # a file's test module comes last
            m = CONST_DECL.match(line)
            if not m or m.group(1) == "_" or not LIMIT_TYPE.fullmatch(m.group(2).strip()):
                continue
            words = m.group(1).split("_")
            if words[-1] in UNITS or "Duration" in m.group(2) or LIMIT_WORDS & set(words):
                found.setdefault(f"{path}::{m.group(1)}", (path, k))
    return found


def check_stray_limits(found, baseline):
    return [
        Violation(path, line, "stray-limit",
                  f"{key.split('::', 1)[1]} looks like a limit: put it in a limits.rs")
        for key, (path, line) in sorted(found.items())
        if key not in baseline["limit"]
    ]


def check_limits(found, baseline):
    return [
        Violation(path, line, "limit-unit", f"{key.split('::', 1)[1]}: {why}")
        for key, (path, line, why) in sorted(found.items())
        if key not in baseline["const"]
    ]


# ---------------------------------------------------------------------------------------------
# The baseline.

BASELINE_HEADER = f"""\
# The tidy ratchet (scripts/tidy.py): what broke a house rule when the rule was written down.
# `fn <lines> <path>::<name>`: a function over {FN_LINES_MAX} lines, which may shrink but not grow.
# `file <lines> <path>`: a source file over {FILE_LINES_MAX} lines, the same.
# `const 0 <path>::<NAME>`: a limits.rs constant whose name lacks a unit.
# `limit 0 <path>::<NAME>`: a limit-like constant outside a limits.rs.
# Regenerate with `python3 scripts/tidy.py --update-baseline` for a deliberate change only, and
# let the diff be reviewed with the code. Shrinking an entry needs no regeneration.
"""


def load_baseline(root):
    base = {"fn": {}, "file": {}, "const": {}, "limit": {}}
    path = os.path.join(root, BASELINE)
    if not os.path.isfile(path):
        return base
    with open(path, encoding="utf-8") as f:
        for k, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(maxsplit=2)
            if len(parts) != 3 or parts[0] not in base or not parts[1].isdigit():
                raise SystemExit(f"{BASELINE}:{k}: cannot read {line!r}")
            base[parts[0]][parts[2]] = int(parts[1])
    return base


def write_baseline(root, fns, big, consts, strays, old):
    lines = [BASELINE_HEADER]
    for key, (_, _, length) in sorted(fns.items()):
        lines.append(f"fn {length} {key}\n")
    for key, (_, _, length) in sorted(big.items()):
        lines.append(f"file {length} {key}\n")
    for key in sorted(consts):
        lines.append(f"const 0 {key}\n")
    for key in sorted(strays):
        lines.append(f"limit 0 {key}\n")
    with open(os.path.join(root, BASELINE), "w", encoding="utf-8") as f:
        f.write("".join(lines))
    new = {
        "fn": {k: v[2] for k, v in fns.items()},
        "file": {k: v[2] for k, v in big.items()},
        "const": {k: 0 for k in consts},
        "limit": {k: 0 for k in strays},
    }
    changes = []
    for kind in ("fn", "file", "const", "limit"):
        for key in sorted(set(old[kind]) | set(new[kind])):
            a, b = old[kind].get(key), new[kind].get(key)
            if a is None:
                size = f" ({b} lines)" if kind in ("fn", "file") else ""
                changes.append(f"  + {kind} {key}{size}")
            elif b is None:
                changes.append(f"  - {kind} {key} (gone or within the limit)")
            elif a != b:
                changes.append(f"  ~ {kind} {key}: {a} -> {b} lines")
    return changes


def stale_notes(fns, big, consts, strays, baseline):
    """Entries that may be tightened: not a failure, a hint."""
    notes = []
    for kind, found in (("fn", fns), ("file", big)):
        for key, recorded in sorted(baseline[kind].items()):
            if key not in found:
                notes.append(f"{kind} {key}: now within the limit or gone")
            elif found[key][2] < recorded:
                notes.append(f"{kind} {key}: {found[key][2]} lines, baseline {recorded}")
    for key in sorted(baseline["const"]):
        if key not in consts:
            notes.append(f"const {key}: fixed or gone")
    for key in sorted(baseline["limit"]):
        if key not in strays:
            notes.append(f"limit {key}: moved or gone")
    return notes


# ---------------------------------------------------------------------------------------------


def run(root, update=False, quiet=False):
    """Checks the tree at root; returns the violations (after rewriting the baseline if asked)."""
    files = list_files(root)
    fns, big = measure(root, files)
    consts = measure_limits(root, files)
    strays = measure_stray_limits(root, files)
    baseline = load_baseline(root)
    if update:
        changes = write_baseline(root, fns, big, consts, strays, baseline)
        if not quiet:
            print(f"tidy: wrote {BASELINE}" + (":" if changes else ", unchanged"))
            for c in changes:
                print(c)
        baseline = load_baseline(root)
    violations = (
        check_work_items(root, files)
        + check_ratchet(fns, big, baseline)
        + check_limits(consts, baseline)
        + check_stray_limits(strays, baseline)
        + check_fuzz(root, files)
        + check_layers(root, files)
    )
    if not quiet:
        notes = stale_notes(fns, big, consts, strays, baseline)
        if notes and not update:
            print(f"tidy: {len(notes)} baseline entries can be tightened (--update-baseline):")
            for n in notes:
                print("  " + n)
    return violations


def self_test():
    """Builds small bad trees in a temporary directory and checks that each rule fires."""
    top = tempfile.mkdtemp(prefix="tidy-self-test-")
    try:
        return self_test_in(top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def self_test_in(top):

    # In the samples "~" stands for a space, so that this file passes its own work-item rule
    # (and a plain grep for references): "issue~19" is written to the tree as the real thing.
    def tree(files):
        d = tempfile.mkdtemp(dir=top)
        for path, text in files.items():
            full = os.path.join(d, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(text.replace("~", " "))
        return d

    def rules(root, update=False):
        return sorted({v.rule for v in run(root, update=update, quiet=True)})

    def long_fn(name, body_lines):
        return f"fn {name}() {{\n" + "    let _x = 1;\n" * (body_lines - 2) + "}\n"

    ok_fuzz = {
        "fuzz/Cargo.toml": '[package]\nname = "f"\n\n[[bin]]\nname = "t"\npath = "fuzz_targets/t.rs"\n',
        "fuzz/fuzz_targets/t.rs": "fn main() {}\n",
        "fuzz/seeds/t/one": "x",
        "scripts/fuzz.sh": "targets=$(cargo fuzz list)\n",
        "fuzz/sources.tsv": "# target\tprefixes\nt\tsrc/lib fuzz/fuzz_targets/t.rs\n",
    }
    good = dict(ok_fuzz)
    good.update(
        {
            "docs/a.md": "Upstream issue #2187 is public. The issue of sessions is prose.\n",
            "src/lib.rs": "/// Since write intents.\n" + long_fn("short", 70)
            + "#[cfg(test)]\nmod tests {\n" + long_fn("long_test", 90) + "}\n"
            + 'const S: &str = "issue~5 in a string is code, not a comment";\n'
            + "fn c() -> char { '{' }\nfn l<'a>(x: &'a str) -> &'a str { x }\n",
            "core/src/limits.rs": "pub const A_MAX_BYTES: usize = 1;\npub const LANES_MAX: usize = 2;\n"
            "pub const T: Duration = Duration::from_secs(1);\npub const R_BYTES_PER_S: u64 = 1;\n"
            "pub const P_MAX_RANKS: usize = 3;\npub const H_MIN_MS: u64 = 1;\nconst _: () = ();\n",
            "tests/tests/long.rs": long_fn("integration", 200),
            # Layers: a uses b and c, b uses c (through `super::`), nothing goes back; a
            # comment may name anything, and a file's own folder is not an import.
            "dataplane/Cargo.toml": "[dependencies]\n# not collective: it stands on us\n",
            "dataplane/src/lib.rs": "pub mod a;\npub mod b;\npub mod c;\npub use c::E;\n",
            "dataplane/src/a/mod.rs": "use crate::b::X;\nuse crate::E;\n// crate::c, collective::net\n",
            "dataplane/src/b/mod.rs": "pub mod inner;\nuse super::c::Y;\n",
            "dataplane/src/b/inner.rs": "use super::Z;\nuse crate::b::W;\n",
            "dataplane/src/c/mod.rs": "pub struct E;\n",
        }
    )
    failures = []
    # The limits themselves are the ones STYLE.md states: a tidy loosened by accident fails.
    if (FN_LINES_MAX, FILE_LINES_MAX) != (70, 1500):
        failures.append(f"limits {FN_LINES_MAX}/{FILE_LINES_MAX}, STYLE.md says 70/1500")

    def expect(what, got, want):
        if got != want:
            failures.append(f"{what}: rules {got}, expected {want}")

    expect("a clean tree", rules(tree(good)), [])
    for what, files, want in (
        ("issue in a doc", {"docs/a.md": "Fixed in issue~19.\n"}, ["work-item"]),
        ("session in a README", {"README.md": "Since session~21.\n"}, ["work-item"]),
        ("plural, case, possessive", {"docs/b.md": "Issues~18 and 19; Issue~16's list\n"}, ["work-item"]),
        ("issue in a Rust comment", {"src/x.rs": "// see issue~4\nfn f() {}\n"}, ["work-item"]),
        ("issue in a docstring", {"m.py": '"""Tasks (issue~14)."""\n'}, ["work-item"]),
        ("issue in a Python comment", {"m.py": "x = 1  # session~3\n"}, ["work-item"]),
        ("issue in a shell comment", {"s.sh": "# issue~2\necho\n"}, ["work-item"]),
        ("a 71-line fn", {"src/y.rs": long_fn("long", 71)}, ["fn-length"]),
        ("a long method", {"src/y.rs": "impl<T> A for B<T> {\n" + long_fn("m", 80) + "}\n"}, ["fn-length"]),
        ("a 1,501-line file", {"src/z.py": "x = 1\n" * 1501}, ["file-length"]),
        ("a unit-less limit", {"core/src/limits.rs": "pub const QUEUE_DEPTH: usize = 4;\n"}, ["limit-unit"]),
        ("a time limit in u64", {"core/src/limits.rs": "pub const IO_TIMEOUT_MAX: u64 = 4;\n"}, ["limit-unit"]),
        ("a limit outside limits.rs", {"client/src/x.rs": "pub const READ_TIMEOUT: Duration = D;\n"}, ["stray-limit"]),
        ("a byte cap outside limits.rs", {"client/src/x.rs": "const BUF_BYTES: usize = 4;\n"}, ["stray-limit"]),
        ("a limit in a test module", {"client/src/x.rs": "fn f() {}\n#[cfg(test)]\nconst T_MAX: u64 = 1;\n"}, []),
        ("a limit in a module's limits.rs", {"client/src/d/limits.rs": "pub const Q_MAX_BYTES: u64 = 1;\n"}, []),
        ("a target not a [[bin]]", {"fuzz/fuzz_targets/u.rs": "fn main() {}\n", "fuzz/seeds/u/s": "x"}, ["fuzz"]),
        ("a target without seeds", {"fuzz/seeds/t/one": None}, ["fuzz"]),
        ("a target without a sources line", {"fuzz/sources.tsv": "# none\n"}, ["fuzz"]),
        ("a sources prefix naming no file", {"fuzz/sources.tsv": "t\tsrc/gone\n"}, ["fuzz"]),
        ("a sources line for no target", {"fuzz/sources.tsv": "t\tsrc/lib\nu\tsrc/lib\n"}, ["fuzz"]),
        ("a target fuzz.sh skips", {"scripts/fuzz.sh": "for x in other; do :; done\n"}, ["fuzz"]),
        ("two folders import each other", {"dataplane/src/c/mod.rs": "use crate::a::Q;\n"}, ["layers"]),
        ("a circle through super::", {"dataplane/src/c/x.rs": "use super::super::b::Q;\n"}, ["layers"]),
        ("a circle through a root re-export",
         {"dataplane/src/lib.rs": "pub mod a;\npub mod b;\npub mod c;\npub use a::E;\n",
          "dataplane/src/c/mod.rs": "fn f() -> crate::E { todo!() }\n"}, ["layers"]),
        ("dataplane names collective", {"dataplane/src/c/mod.rs": "use collective::net::Hello;\n"}, ["layers"]),
        ("dataplane depends on collective",
         {"dataplane/Cargo.toml": "[dependencies]\ncollective.workspace = true\n"}, ["layers"]),
    ):
        files2 = dict(good)
        for k, v in files.items():
            if v is None:
                files2.pop(k)
            else:
                files2[k] = v
        expect(what, rules(tree(files2)), want)

    # The ratchet: recorded, a function may stay or shrink, not grow; a file likewise.
    bad = dict(good)
    bad["src/y.rs"] = long_fn("long", 80)
    bad["src/z.py"] = "x = 1\n" * (FILE_LINES_MAX + 10)
    bad["core/src/limits.rs"] = "pub const QUEUE_DEPTH: usize = 4;\n"
    bad["client/src/w.rs"] = "const WAIT_MS: u64 = 4;\n"
    d = tree(bad)
    expect("before the baseline", rules(d), ["file-length", "fn-length", "limit-unit", "stray-limit"])
    expect("--update-baseline", rules(d, update=True), [])
    expect("as recorded", rules(d), [])
    with open(os.path.join(d, "src/y.rs"), "w") as f:
        f.write(long_fn("long", 75))
    expect("shrunk", rules(d), [])
    with open(os.path.join(d, "src/y.rs"), "w") as f:
        f.write(long_fn("long", 81))
    expect("grown past the baseline", rules(d), ["fn-length"])
    with open(os.path.join(d, "src/z.py"), "w") as f:
        f.write("x = 1\n" * (FILE_LINES_MAX + 11))
    expect("file grown", rules(d), ["file-length", "fn-length"])
    with open(os.path.join(d, "client/src/v.rs"), "w") as f:
        f.write("const WAIT_MS: u64 = 4;\n")
    expect("a recorded limit moved to another file", rules(d), ["file-length", "fn-length", "stray-limit"])
    # --update-baseline never hides a work-item or fuzz violation.
    with open(os.path.join(d, "docs/a.md"), "w") as f:
        f.write("issue~7\n".replace("~", " "))
    os.remove(os.path.join(d, "fuzz/seeds/t/one"))
    expect("update keeps the others", rules(d, update=True), ["fuzz", "work-item"])

    if failures:
        for f in failures:
            print("tidy self-test FAILED: " + f)
        return 1
    print("tidy self-test: every rule fires on bad input, a clean tree passes")
    return 0


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        return 0
    if "--self-test" in argv:
        return self_test()
    violations = run(root, update="--update-baseline" in argv)
    for v in violations:
        print(v)
    if violations:
        print(f"tidy: {len(violations)} violations (rules: python3 scripts/tidy.py --help)")
        return 1
    print("tidy: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
