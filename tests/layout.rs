//! The shape of `src/`, checked: no module cycle between the crate's
//! top-level modules, no function over 100 lines, the flow's callback file
//! within 450. A rule the code must keep belongs in the test suite, not in a
//! reviewer's memory.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The code of a file without its test module (by convention the last item,
/// after `#[cfg(test)]`) and without comments, strings and char literals, so
/// braces and `crate::` in them do not count.
fn code(path: &Path) -> Vec<String> {
    let text = fs::read_to_string(path).expect("read");
    let shipped = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    strip(shipped).lines().map(str::to_owned).collect()
}

/// Blanks comments, string and char literals (keeping newlines).
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(i + k).copied().unwrap_or('\0');
        if at(0) == '/' && at(1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if at(0) == 'r' && !ident(i.checked_sub(1).map(|p| c[p])) && raw_open(&c[i + 1..]) {
            let hashes = c[i + 1..].iter().take_while(|x| **x == '#').count();
            i += 2 + hashes;
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            while i < c.len() && !c[i..].starts_with(&close) {
                if c[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += close.len();
        } else if at(0) == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                if c.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
        } else if at(0) == '\'' && (at(1) == '\\' || at(2) == '\'') {
            // A char literal (a lifetime has no closing quote right after).
            i += 1;
            while i < c.len() && c[i] != '\'' {
                if c[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn ident(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// Whether `rest` (after an `r`) opens a raw string: `#`s, then a quote.
fn raw_open(rest: &[char]) -> bool {
    let hashes = rest.iter().take_while(|x| **x == '#').count();
    rest.get(hashes) == Some(&'"')
}

/// The top-level module a file belongs to (`src/sched/score.rs` → `sched`).
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).expect("under src");
    let first = rel.components().next().expect("component");
    first
        .as_os_str()
        .to_string_lossy()
        .trim_end_matches(".rs")
        .to_owned()
}

#[test]
fn top_level_modules_have_no_cycle() {
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rust_files(&src()) {
        let module = module_of(&file);
        if module == "lib" || file.ends_with("tests.rs") {
            continue;
        }
        let entry = deps.entry(module.clone()).or_default();
        for line in code(&file) {
            for (i, _) in line.match_indices("crate::") {
                let used: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !used.is_empty() && used != module {
                    entry.insert(used);
                }
            }
        }
    }
    // Depth-first search for a back edge.
    fn visit(
        m: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if done.contains(m) {
            return;
        }
        if let Some(start) = path.iter().position(|p| p == m) {
            panic!("module cycle: {} -> {m}", path[start..].join(" -> "));
        }
        path.push(m.to_owned());
        for d in deps.get(m).into_iter().flatten() {
            visit(d, deps, path, done);
        }
        path.pop();
        done.insert(m.to_owned());
    }
    let mut done = BTreeSet::new();
    for m in deps.keys() {
        visit(m, &deps, &mut Vec::new(), &mut done);
    }
    assert!(
        deps["fleet"].is_empty(),
        "fleet is a leaf: {:?}",
        deps["fleet"]
    );
}

#[test]
fn no_function_in_src_is_over_100_lines() {
    let mut long = Vec::new();
    for file in rust_files(&src()) {
        let lines = code(&file);
        let mut i = 0;
        while i < lines.len() {
            let l = lines[i].trim_start();
            let is_fn = l.starts_with("fn ")
                || l.starts_with("pub fn ")
                || l.starts_with("pub(crate) fn ")
                || l.starts_with("pub(super) fn ")
                || l.starts_with("const fn ")
                || l.starts_with("pub const fn ");
            if !is_fn {
                i += 1;
                continue;
            }
            // The body ends where the braces opened from here close again.
            let (mut depth, mut opened, mut end) = (0i32, false, i);
            for (k, line) in lines.iter().enumerate().skip(i) {
                for ch in line.chars() {
                    match ch {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        ';' if !opened && depth == 0 => break,
                        _ => {}
                    }
                }
                end = k;
                if (opened && depth == 0) || (!opened && line.trim_end().ends_with(';')) {
                    break;
                }
            }
            let n = end - i + 1;
            if n > 100 {
                long.push(format!("{}:{} ({n} lines)", file.display(), i + 1));
            }
            i += 1;
        }
    }
    assert!(
        long.is_empty(),
        "functions over 100 lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_flow_callbacks_fit_in_one_sitting() {
    let n = fs::read_to_string(src().join("flow/mod.rs"))
        .expect("flow/mod.rs")
        .lines()
        .count();
    assert!(n <= 450, "src/flow/mod.rs has {n} lines");
}

#[test]
fn the_stripper_ignores_braces_in_literals() {
    let s = strip("fn a() { let c = '{'; let s = \"}}\"; let r = r#\"{\"#; } // }");
    assert_eq!(s.matches('{').count(), s.matches('}').count(), "{s}");
    assert!(strip("fn f<'a>(x: &'a str) {}").contains("fn f<"));
}
