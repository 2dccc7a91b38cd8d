//! The shape of `src/` and of the mock crates (`mock-engine/`, `fleet-sim/`,
//! `loadgen/`), checked: no module cycle between the router's top-level
//! modules nor between any two files of a mock crate, no function over 80
//! lines in `src/` nor over 100 in the mock crates, the flow's callback file
//! within 450.
//! Every justfile recipe that builds for wasm installs the target first.
//! A rule the code must keep belongs in the test suite, not in a reviewer's
//! memory.
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

/// Each top-level module of src/ and the top-level modules its shipped
/// code names through `crate::`.
fn top_level_deps() -> BTreeMap<String, BTreeSet<String>> {
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rust_files(&src()) {
        let module = module_of(&file);
        if module == "lib" || file.ends_with("tests.rs") || file.ends_with("testkit.rs") {
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
    deps
}

/// The layers of src/, lowest first (docs/architecture.md draws them). A
/// module imports only from its own layer or lower ones: the request's
/// stages and the VM's tick sit on the VM's state, which sits on the pure
/// features, which never reach back up.
const LAYERS: [(&str, &[&str]); 7] = [
    (
        "words and bytes",
        &[
            "inline_str",
            "codec",
            "hostwire",
            "fleet",
            "trt_id",
            "multipart",
            "body",
            "api",
            "error",
            "stat_names",
            "catalog",
            "calls",
        ],
    ),
    ("state the VMs share", &["pods", "load", "scrape"]),
    (
        "pure features",
        &[
            "sched",
            "admission",
            "mooncake",
            "discovery",
            "handoff",
            "transfer",
            "engine",
            "reconcile",
            "config",
            "session",
            "trace",
            "reuse",
            "encoder",
        ],
    ),
    ("read, build and merge a split", &["split", "host"]),
    ("the VM's state", &["router"]),
    ("the request and the VM's tick", &["flow", "root"]),
    ("Envoy", &["shell", "testing"]),
];

#[test]
fn no_module_imports_from_a_higher_layer() {
    let layer_of = |m: &str| LAYERS.iter().position(|(_, ms)| ms.contains(&m));
    for (module, deps) in top_level_deps() {
        let Some(mine) = layer_of(&module) else {
            panic!("src/{module} is in no layer: add it to LAYERS in tests/layout.rs");
        };
        for d in deps {
            let theirs = layer_of(&d).unwrap_or_else(|| panic!("src/{d} is in no layer"));
            assert!(
                theirs <= mine,
                "{module} ({}) imports {d} ({}), a higher layer",
                LAYERS[mine].0,
                LAYERS[theirs].0
            );
        }
    }
}

#[test]
fn top_level_modules_have_no_cycle() {
    let deps = top_level_deps();
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

/// The line where the item starting at line `i` ends: where the braces
/// opened from there close again, or its `;` when it has no body.
fn fn_end(lines: &[String], i: usize) -> usize {
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
    end
}

#[test]
fn no_function_in_src_is_over_80_lines() {
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
            let n = fn_end(&lines, i) - i + 1;
            if n > 80 {
                long.push(format!("{}:{} ({n} lines)", file.display(), i + 1));
            }
            i += 1;
        }
    }
    assert!(
        long.is_empty(),
        "functions over 80 lines:\n{}",
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

/// The source roots of the mock crates: the mock engines, the fleet
/// simulator library and the load generator.
fn mock_crates() -> Vec<PathBuf> {
    ["mock-engine", "fleet-sim", "loadgen"]
        .iter()
        .map(|c| Path::new(env!("CARGO_MANIFEST_DIR")).join(c).join("src"))
        .collect()
}

/// One file of a crate, seen as a node of its import graph.
struct ModFile {
    path: PathBuf,
    /// Its module path from the crate root (`engines/mod.rs` → `engines`,
    /// `store/offers.rs` → `store::offers`, `main.rs` or `lib.rs` → empty).
    module: Vec<String>,
    /// Its shipped code (see [`shipped`]).
    code: String,
    /// Its child modules that ship (`mod x;` not under `#[cfg(test)]`).
    children: Vec<String>,
    /// Its child modules that only tests build (`#[cfg(test)] mod x;`).
    test_children: Vec<String>,
}

impl ModFile {
    /// The file at `path`, in the crate whose sources are under `root`.
    fn read(root: &Path, path: PathBuf) -> ModFile {
        let rel = path.strip_prefix(root).expect("under the crate's src/");
        let mut module: Vec<String> = rel
            .components()
            .map(|c| {
                c.as_os_str()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_owned()
            })
            .collect();
        if module == ["main"] || module == ["lib"] || module.last().is_some_and(|m| m == "mod") {
            module.pop();
        }
        let text = fs::read_to_string(&path).expect("read");
        ModFile::parse(path, module, &text)
    }

    fn parse(path: PathBuf, module: Vec<String>, text: &str) -> ModFile {
        let (code, test_children) = shipped(text);
        let children = child_modules(&code);
        ModFile {
            path,
            module,
            code,
            children,
            test_children,
        }
    }
}

/// A file's code without comments and literals (see [`strip`]), without
/// its inline test module (`#[cfg(test)] mod name {`, by convention the
/// last item) and without its test-only module declarations
/// (`#[cfg(test)] mod name;`), whose names come back second. Unlike
/// [`code`], a test-only declaration above shipped code cuts nothing.
fn shipped(text: &str) -> (String, Vec<String>) {
    let mut code = strip(text);
    let mut tests = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(test)]").map(|i| from + i) {
        let after = code[at + 12..].trim_start();
        let Some(item) = after.strip_prefix("mod ") else {
            from = at + 12;
            continue;
        };
        let name: String = item.chars().take_while(|c| ident(Some(*c))).collect();
        if item[name.len()..].trim_start().starts_with('{') {
            code.truncate(at);
            break;
        }
        let end = at + code[at..].find(';').expect("mod declaration ends") + 1;
        let blank: String = code[at..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        code.replace_range(at..end, &blank);
        tests.push(name);
        from = end;
    }
    (code, tests)
}

/// The names of `mod name;` declarations in `code`.
fn child_modules(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in code.lines() {
        let l = line.trim_start();
        // Any visibility: `pub`, `pub(crate)`, `pub(super)`, `pub(in a::b)`.
        let l = match l.strip_prefix("pub") {
            Some(rest) if rest.starts_with('(') => {
                rest.split_once(')').map_or(l, |(_, r)| r.trim_start())
            }
            Some(rest) if rest.starts_with(' ') => rest.trim_start(),
            _ => l,
        };
        if let Some(name) = l
            .strip_prefix("mod ")
            .and_then(|n| n.trim_end().strip_suffix(';'))
        {
            out.push(name.trim().to_owned());
        }
    }
    out
}

/// The paths a use tree written at `at` names: `a::b::{c, d::e}` gives
/// `a::b::c` and `a::b::d::e` (`{self}` names the prefix, `*` ends it).
fn use_tree(text: &[char], at: &mut usize) -> Vec<Vec<String>> {
    let skip_ws = |at: &mut usize| {
        while text.get(*at).is_some_and(|c| c.is_whitespace()) {
            *at += 1;
        }
    };
    let mut prefix = Vec::new();
    loop {
        skip_ws(at);
        if text.get(*at) == Some(&'{') {
            *at += 1;
            let mut out = Vec::new();
            loop {
                skip_ws(at);
                match text.get(*at) {
                    Some('}') | None => {
                        *at += 1;
                        break;
                    }
                    Some(',') => *at += 1,
                    _ => {
                        for tail in use_tree(text, at) {
                            // `{self}` names the prefix itself.
                            let tail = tail.into_iter().filter(|s| s != "self");
                            out.push(prefix.iter().cloned().chain(tail).collect());
                        }
                    }
                }
            }
            return out;
        }
        let start = *at;
        while ident(text.get(*at).copied()) {
            *at += 1;
        }
        let segment: String = text[start..*at].iter().collect();
        if segment.is_empty() {
            if text.get(*at) == Some(&'*') {
                *at += 1;
            }
            return vec![prefix];
        }
        prefix.push(segment);
        skip_ws(at);
        if text.get(*at) == Some(&':') && text.get(*at + 1) == Some(&':') {
            *at += 2;
        } else {
            return vec![prefix];
        }
    }
}

/// The files `file` imports: every `crate::`, `super::`, `self::` and
/// `child::` path (a child module the file declares) in its shipped code,
/// resolved to the deepest module of `modules` it names.
fn imports(file: &ModFile, modules: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let text: Vec<char> = file.code.chars().collect();
    let mut out = BTreeSet::new();
    for i in 0..text.len() {
        let before = i.checked_sub(1).and_then(|p| text.get(p).copied());
        if ident(before) || before == Some(':') || !ident(text.get(i).copied()) {
            continue;
        }
        // `pub(super)`, `pub(crate)`: a visibility, not a path.
        if i >= 4 && text[i - 4..i].iter().collect::<String>() == "pub(" {
            continue;
        }
        let mut at = i;
        for path in use_tree(&text, &mut at) {
            let Some(first) = path.first() else { continue };
            let (mut base, rest) = match first.as_str() {
                "crate" => (Vec::new(), &path[1..]),
                "self" => (file.module.clone(), &path[1..]),
                "super" => {
                    let ups = path.iter().take_while(|s| *s == "super").count();
                    let keep = file.module.len().saturating_sub(ups);
                    (file.module[..keep].to_vec(), &path[ups..])
                }
                child if file.children.iter().any(|c| c == child) && path.len() > 1 => {
                    (file.module.clone(), &path[..])
                }
                _ => continue,
            };
            let mut target = base.clone();
            for segment in rest {
                base.push(segment.clone());
                if modules.contains(&base) {
                    target = base.clone();
                } else {
                    break;
                }
            }
            if target != file.module {
                out.insert(target);
            }
        }
    }
    out
}

/// A crate's shipped files (the files only tests build are left out, and
/// `bin/`, whose files are crate roots of their own), by module path.
fn crate_files(root: &Path) -> BTreeMap<Vec<String>, ModFile> {
    let bin = root.join("bin");
    let files: Vec<ModFile> = rust_files(root)
        .into_iter()
        .filter(|p| !p.starts_with(&bin))
        .map(|p| ModFile::read(root, p))
        .collect();
    let test_only: BTreeSet<Vec<String>> = files
        .iter()
        .flat_map(|f| {
            f.test_children
                .iter()
                .map(|c| f.module.iter().cloned().chain([c.clone()]).collect())
        })
        .collect();
    files
        .into_iter()
        .filter(|f| !test_only.contains(&f.module))
        .map(|f| (f.module.clone(), f))
        .collect()
}

/// Each file's imports (see [`imports`]), by module path.
type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

fn import_graph(files: &BTreeMap<Vec<String>, ModFile>) -> Graph {
    let modules: BTreeSet<Vec<String>> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(m, f)| (m.clone(), imports(f, &modules)))
        .collect()
}

fn show(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_owned()
    } else {
        module.join("::")
    }
}

/// A cycle in `deps`, as the modules along it (the first one repeated at
/// the end), if there is one.
fn module_cycle(deps: &Graph) -> Option<Vec<String>> {
    fn visit(
        m: &[String],
        deps: &Graph,
        path: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<Vec<String>> {
        if done.contains(m) {
            return None;
        }
        if let Some(start) = path.iter().position(|p| p == m) {
            let mut cycle: Vec<String> = path[start..].iter().map(|p| show(p)).collect();
            cycle.push(show(m));
            return Some(cycle);
        }
        path.push(m.to_vec());
        for d in deps.get(m).into_iter().flatten() {
            if let Some(cycle) = visit(d, deps, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(m.to_vec());
        None
    }
    let mut done = BTreeSet::new();
    deps.keys()
        .find_map(|m| visit(m, deps, &mut Vec::new(), &mut done))
}

#[test]
fn mock_crates_have_no_import_cycle() {
    for root in mock_crates() {
        let files = crate_files(&root);
        assert!(!files.is_empty(), "{}", root.display());
        if let Some(cycle) = module_cycle(&import_graph(&files)) {
            panic!("import cycle in {}: {}", root.display(), cycle.join(" -> "));
        }
    }
    // The simulator and the load generator stand alone: mock-engine runs
    // the simulator, never the other way.
    for (name, others) in [
        ("fleet-sim", ["mock_engine", "loadgen"]),
        ("loadgen", ["mock_engine", "fleet_sim"]),
    ] {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(name).join("src");
        for f in crate_files(&root).values() {
            for other in others {
                assert!(
                    !f.code.contains(&format!("{other}::")),
                    "{} uses {other}",
                    f.path.display()
                );
            }
        }
    }
    let deps = import_graph(&crate_files(&mock_crates()[0]));
    // The bottom layer: domain types and helpers that import nothing of
    // the crate, so anything may use them.
    for leaf in [
        "config",
        "error",
        "peer",
        "disagg_auth",
        "responses",
        "conn",
        "store",
        "leg",
    ] {
        let d = &deps[&vec![leaf.to_owned()]];
        assert!(
            d.is_empty(),
            "{leaf} is a leaf: {:?}",
            d.iter().map(|m| show(m)).collect::<Vec<_>>()
        );
    }
    // The stores are data: they import their lock and nothing else.
    for (m, d) in deps
        .iter()
        .filter(|(m, _)| m.first().is_some_and(|f| f == "store"))
    {
        let others: Vec<String> = d
            .iter()
            .filter(|t| *t != &["store"])
            .map(|t| show(t))
            .collect();
        assert!(others.is_empty(), "{} imports {others:?}", show(m));
    }
}

/// The same rule for src/, at file level, between siblings and across
/// folders. A file's imports of its own folder's `mod.rs` (or an
/// ancestor's) do not count: the folder's front may define the type its
/// files implement (`Flow`, spread over the stages' files, holds their
/// state), which no layout can untangle without splitting each stage's
/// state from its code.
#[test]
fn src_files_have_no_import_cycle() {
    let files = crate_files(&src());
    let mut graph = import_graph(&files);
    for (module, deps) in graph.iter_mut() {
        deps.retain(|d| !module.starts_with(d));
    }
    if let Some(cycle) = module_cycle(&graph) {
        panic!("import cycle in src/: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_import_graph_finds_cycles() {
    let file = |module: &str, text: &str| {
        let module: Vec<String> = module
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let path = PathBuf::from(show(&module));
        (module.clone(), ModFile::parse(path, module, text))
    };
    // Two files that import each other, through `crate::` and `super::`.
    let files = BTreeMap::from([
        file("", "mod a;\nmod b;\nfn main() {}\n"),
        file("a", "use crate::b::{f, g};\npub fn h() {}\n"),
        file("b", "pub fn f() { super::a::h() }\npub fn g() {}\n"),
    ]);
    assert_eq!(
        module_cycle(&import_graph(&files)).unwrap(),
        ["a", "b", "a"]
    );
    // A folder's mod.rs that imports its file, which imports it back.
    let files = BTreeMap::from([
        file("", "pub(crate) mod p;\n"),
        file("p", "pub(super) mod q;\nuse q::x;\npub struct Y;\n"),
        file("p::q", "use super::Y;\npub fn x() {}\n"),
    ]);
    assert_eq!(
        module_cycle(&import_graph(&files)).unwrap(),
        ["p", "p::q", "p"]
    );
    // Imports that only the tests make are no edge.
    let files = BTreeMap::from([
        file("", "mod p;\n"),
        file("p", "mod q;\nuse q::x;\n"),
        file(
            "p::q",
            "pub fn x() {}\n#[cfg(test)]\nmod tests {\n    use super::super::Y;\n}\n",
        ),
    ]);
    assert_eq!(module_cycle(&import_graph(&files)), None);
    // A visibility is no path: `pub(super)` in a file names nothing.
    let files = BTreeMap::from([
        file("", "mod p;\n"),
        file("p", "mod q;\nuse q::x;\n"),
        file("p::q", "pub(super) fn x() {}\n"),
    ]);
    assert_eq!(module_cycle(&import_graph(&files)), None);
}

/// Where a function starts: `fn` after any visibility and qualifiers
/// (an ABI string is already blanked, see [`strip`]).
fn starts_fn(line: &str) -> bool {
    let mut l = line.trim_start();
    if let Some(rest) = l.strip_prefix("pub") {
        l = match rest.strip_prefix('(') {
            Some(scoped) => scoped.split_once(')').map_or(rest, |(_, r)| r),
            None => rest,
        };
    }
    loop {
        l = l.trim_start();
        let qualifier = ["const ", "async ", "unsafe ", "extern "]
            .iter()
            .find_map(|q| l.strip_prefix(q));
        match qualifier {
            Some(rest) => l = rest,
            None => return l.starts_with("fn "),
        }
    }
}

#[test]
fn no_function_in_mock_engine_is_over_100_lines() {
    let paths: Vec<PathBuf> = mock_crates()
        .iter()
        .flat_map(|root| crate_files(root).into_values().map(|f| f.path))
        .collect();
    let mut long = Vec::new();
    for path in paths {
        let (code, _) = shipped(&fs::read_to_string(&path).expect("read"));
        let lines: Vec<String> = code.lines().map(str::to_owned).collect();
        for (i, line) in lines.iter().enumerate() {
            if starts_fn(line) {
                let n = fn_end(&lines, i) - i + 1;
                if n > 100 {
                    long.push(format!("{}:{} ({n} lines)", path.display(), i + 1));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over 80 lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn use_trees_resolve_to_files() {
    let paths = |s: &str| {
        let text: Vec<char> = s.chars().collect();
        use_tree(&text, &mut 0)
            .into_iter()
            .map(|p| p.join("::"))
            .collect::<Vec<_>>()
    };
    assert_eq!(paths("crate::a::B;"), ["crate::a::B"]);
    assert_eq!(
        paths("super::{x, y::{z, self}, w::*};"),
        ["super::x", "super::y::z", "super::y", "super::w"]
    );
    assert_eq!(paths("super::super::q(1)"), ["super::super::q"]);
    assert!(starts_fn("    pub(crate) async fn go() {"));
    assert!(starts_fn("pub(in crate::a) const unsafe fn f()"));
    assert!(starts_fn(&strip("extern \"C\" fn f() {}")));
    assert!(!starts_fn("let f = fn_name;"));
    let (code, tests) = shipped("#[cfg(test)]\nmod t;\nfn a() {}\n#[cfg(test)]\nmod tests {\n}\n");
    assert_eq!(tests, ["t"]);
    assert!(code.contains("fn a()") && !code.contains("mod t") && !code.contains("tests"));
}

/// The justfile's recipes: name, the recipes it depends on, its body.
fn recipes() -> BTreeMap<String, (Vec<String>, String)> {
    let text = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("justfile"))
        .expect("justfile");
    let mut out: BTreeMap<String, (Vec<String>, String)> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.starts_with("    ") {
            if let Some(body) = current.as_ref().and_then(|n| out.get_mut(n)) {
                body.1.push_str(line);
                body.1.push('\n');
            }
            continue;
        }
        current = None;
        let Some((head, deps)) = line.split_once(':') else {
            continue;
        };
        // `name args: deps` (not a `:=` assignment, a comment or a setting).
        if deps.starts_with('=') || line.starts_with('#') || line.starts_with("set ") {
            continue;
        }
        let Some(name) = head.split_whitespace().next() else {
            continue;
        };
        let deps = deps
            .split_whitespace()
            .filter(|d| *d != "&&")
            .map(|d| d.trim_start_matches('(').to_owned())
            .collect();
        out.insert(name.to_owned(), (deps, String::new()));
        current = Some(name.to_owned());
    }
    out
}

#[test]
fn every_recipe_that_builds_for_wasm_installs_the_target_first() {
    // rustup adds rust-toolchain.toml's targets only when it installs the
    // toolchain itself; a toolchain already there lacks wasm32-wasip1.
    let all = recipes();
    let installs = |name: &str| {
        let mut todo = vec![name.to_owned()];
        let mut seen = BTreeSet::new();
        while let Some(n) = todo.pop() {
            if !seen.insert(n.clone()) {
                continue;
            }
            let Some((deps, body)) = all.get(&n) else {
                continue;
            };
            if body.contains("scripts/wasm-target.sh") {
                return true;
            }
            todo.extend(deps.iter().cloned());
        }
        false
    };
    let building: Vec<&String> = all
        .iter()
        .filter(|(_, (_, body))| body.contains("--target wasm32-wasip1"))
        // `msrv` installs its own toolchain with the target.
        .filter(|(_, (_, body))| !body.contains("rustup toolchain install"))
        .map(|(n, _)| n)
        .collect();
    assert!(building.len() >= 5, "{building:?}");
    let missing: Vec<&&String> = building.iter().filter(|n| !installs(n)).collect();
    assert!(
        missing.is_empty(),
        "recipes build for wasm without scripts/wasm-target.sh: {missing:?}"
    );
}

// ------------------------------------------------------------------ Python
//
// bench/ is one package (bench/pdbench/) and the scripts that call it; the
// same rules hold there: no module imports a script, the modules import no
// cycle, and no function in bench/ or scripts/ is over 100 lines.

/// One line of Python source, its comments and string contents blanked.
struct PyLine {
    /// The code, comments and the contents of string literals blanked (the
    /// quotes kept, so a line that is only a string is not blank).
    code: String,
    /// Whether the line starts inside brackets, a string or after a
    /// backslash: part of the statement above, whatever its indentation.
    continued: bool,
}

impl PyLine {
    fn indent(&self) -> usize {
        self.code.len() - self.code.trim_start().len()
    }

    fn is_blank(&self) -> bool {
        self.code.trim().is_empty()
    }
}

/// `text` as lines of code (see [`PyLine`]).
fn py_lines(text: &str) -> Vec<PyLine> {
    let c: Vec<char> = text.chars().collect();
    let mut lines = Vec::new();
    let mut code = String::new();
    let (mut depth, mut continued) = (0usize, false);
    // The open string's quote and whether it is triple-quoted.
    let mut string: Option<(char, bool)> = None;
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            let backslash = string.is_none() && code.trim_end().ends_with('\\');
            lines.push(PyLine {
                code: std::mem::take(&mut code),
                continued,
            });
            // A newline ends a one-quote string only by mistake: close it.
            if string.is_some_and(|(_, triple)| !triple) {
                string = None;
            }
            continued = depth > 0 || string.is_some() || backslash;
            i += 1;
            continue;
        }
        match string {
            Some((q, triple)) => {
                if ch == '\\' {
                    code.push(' ');
                    if c.get(i + 1).is_some_and(|n| *n != '\n') {
                        code.push(' ');
                        i += 1;
                    }
                } else if ch == q && (!triple || c[i..].starts_with(&[q, q, q])) {
                    let n = if triple { 3 } else { 1 };
                    code.extend(std::iter::repeat_n(q, n));
                    i += n - 1;
                    string = None;
                } else {
                    code.push(' ');
                }
            }
            None => match ch {
                '#' => {
                    while c.get(i + 1).is_some_and(|n| *n != '\n') {
                        i += 1;
                    }
                }
                '\'' | '"' => {
                    let triple = c[i..].starts_with(&[ch, ch, ch]);
                    let n = if triple { 3 } else { 1 };
                    code.extend(std::iter::repeat_n(ch, n));
                    i += n - 1;
                    string = Some((ch, triple));
                }
                '(' | '[' | '{' => {
                    depth += 1;
                    code.push(ch);
                }
                ')' | ']' | '}' => {
                    depth = depth.saturating_sub(1);
                    code.push(ch);
                }
                _ => code.push(ch),
            },
        }
        i += 1;
    }
    if !code.is_empty() {
        lines.push(PyLine { code, continued });
    }
    lines
}

/// Each function of `text` (a `def`, nested ones too) as (its line, its
/// lines from the `def` to the last line of its body, found by indentation).
fn py_functions(text: &str) -> Vec<(usize, usize)> {
    let lines = py_lines(text);
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let l = line.code.trim_start();
        if line.continued || !(l.starts_with("def ") || l.starts_with("async def ")) {
            continue;
        }
        let mut last = i;
        for (k, body) in lines.iter().enumerate().skip(i + 1) {
            if body.is_blank() {
                continue;
            }
            if !body.continued && body.indent() <= line.indent() {
                break;
            }
            last = k;
        }
        out.push((i + 1, last - i + 1));
    }
    out
}

/// The modules a module imports (`import a.b`, `from .a import b`, `from a
/// import b` where `a.b` is a module), inside functions too, resolved against
/// `package` (the package a relative import starts from) and kept when they
/// are among `known`.
fn py_imports(text: &str, package: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let lines = py_lines(text);
    for (i, line) in lines.iter().enumerate() {
        if line.continued {
            continue;
        }
        // The statement with its continuation lines, brackets dropped.
        let mut stmt = line.code.clone();
        for more in lines[i + 1..].iter().take_while(|l| l.continued) {
            stmt.push(' ');
            stmt.push_str(&more.code);
        }
        let stmt = stmt.replace(['(', ')', '\\'], " ");
        let words: Vec<&str> = stmt.split_whitespace().collect();
        let names = |list: &[&str]| -> Vec<String> {
            list.join(" ")
                .split(',')
                .filter_map(|n| n.split_whitespace().next().map(str::to_owned))
                .collect()
        };
        let mut found = Vec::new();
        match words.as_slice() {
            ["import", rest @ ..] => found.extend(names(rest)),
            ["from", from, "import", rest @ ..] => {
                let dots = from.chars().take_while(|c| *c == '.').count();
                let base = if dots == 0 {
                    (*from).to_owned()
                } else {
                    let mut parts: Vec<&str> = package.split('.').collect();
                    parts.truncate(parts.len().saturating_sub(dots - 1));
                    let tail = &from[dots..];
                    if tail.is_empty() {
                        parts.join(".")
                    } else {
                        format!("{}.{tail}", parts.join("."))
                    }
                };
                let submodules: Vec<String> = names(rest)
                    .into_iter()
                    .map(|n| format!("{base}.{n}"))
                    .filter(|m| known.contains(m))
                    .collect();
                if submodules.is_empty() {
                    found.push(base);
                } else {
                    found.extend(submodules);
                }
            }
            _ => {}
        }
        out.extend(found.into_iter().filter(|m| known.contains(m)));
    }
    out
}

/// A cycle in `deps`, as the modules along it, if there is one.
fn py_cycle(deps: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if done.contains(m) {
            return None;
        }
        if let Some(start) = path.iter().position(|p| p == m) {
            let mut cycle = path[start..].to_vec();
            cycle.push(m.to_owned());
            return Some(cycle);
        }
        path.push(m.to_owned());
        for d in deps.get(m).into_iter().flatten() {
            if let Some(cycle) = visit(d, deps, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(m.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    deps.keys()
        .find_map(|m| visit(m, deps, &mut Vec::new(), &mut done))
}

/// Every `.py` file directly in `dir`.
fn python_files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "py"))
        .collect();
    out.sort();
    out
}

fn bench_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bench")
}

/// bench/'s modules by import name: the scripts (`run`, run with bench/ on
/// the path) and the package's modules (`pdbench`, `pdbench.common`, ...),
/// each with its path and the package its relative imports start from.
fn bench_modules() -> BTreeMap<String, (PathBuf, String)> {
    let mut out = BTreeMap::new();
    for path in python_files(&bench_dir()) {
        let stem = path
            .file_stem()
            .expect("stem")
            .to_string_lossy()
            .into_owned();
        out.insert(stem, (path, String::new()));
    }
    for path in python_files(&bench_dir().join("pdbench")) {
        let stem = path
            .file_stem()
            .expect("stem")
            .to_string_lossy()
            .into_owned();
        let name = if stem == "__init__" {
            "pdbench".to_owned()
        } else {
            format!("pdbench.{stem}")
        };
        out.insert(name, (path, "pdbench".to_owned()));
    }
    out
}

#[test]
fn bench_modules_import_no_script_and_no_cycle() {
    let modules = bench_modules();
    assert!(
        modules.contains_key("pdbench.common") && modules.contains_key("run"),
        "{:?}",
        modules.keys()
    );
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    let deps: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|(name, (path, package))| {
            let text = fs::read_to_string(path).expect("read");
            (name.clone(), py_imports(&text, package, &known))
        })
        .collect();
    // A script is what runs; the package is what they share.
    let scripts: BTreeSet<&String> = known.iter().filter(|m| !m.starts_with("pdbench")).collect();
    for (name, imported) in &deps {
        let bad: Vec<&String> = imported.iter().filter(|m| scripts.contains(m)).collect();
        assert!(bad.is_empty(), "{name} imports the script(s) {bad:?}");
    }
    if let Some(cycle) = py_cycle(&deps) {
        panic!("import cycle in bench/: {}", cycle.join(" -> "));
    }
    // The shared module is the bottom layer.
    assert!(
        deps["pdbench.common"].is_empty(),
        "pdbench.common is a leaf: {:?}",
        deps["pdbench.common"]
    );
}

#[test]
fn no_python_function_in_bench_scripts_or_tests_is_over_100_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = bench_modules().into_values().map(|(p, _)| p).collect();
    for dir in ["scripts", "tests/e2e", "tests/kube"] {
        files.extend(python_files(&root.join(dir)));
    }
    let mut long = Vec::new();
    for path in files {
        let text = fs::read_to_string(&path).expect("read");
        for (line, n) in py_functions(&text) {
            if n > 100 {
                long.push(format!("{}:{line} ({n} lines)", path.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "Python functions over 100 lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_python_reader_finds_bodies_imports_and_cycles() {
    // A body of 101 lines, a string at column 0 and a comment inside it.
    let body: String = (0..99).map(|i| format!("    x{i} = {i}\n")).collect();
    let text = format!(
        "import os\n\n@deco\ndef long(a,\nb):\n    s = \"\"\"\nnot code: def x():\n\"\"\"\n# }}\n{body}\ndef short(): return 1\n"
    );
    let fns = py_functions(&text);
    assert_eq!(fns, [(4, 105), (110, 1)], "{fns:?}");
    let nested = "class A:\n    def f(self):\n        def g():\n            pass\n        return g\n\n    def h(self):\n        '''x'''\n";
    assert_eq!(py_functions(nested), [(2, 4), (3, 2), (7, 2)]);
    // Imports: relative, absolute, a submodule by name, a script, in a
    // function, in brackets over lines, in a string (not one).
    let known: BTreeSet<String> = ["pdbench", "pdbench.a", "pdbench.b", "run"]
        .map(str::to_owned)
        .into();
    let text = "from .a import (x,\n    y)\nfrom pdbench import b\ndef f():\n    import run\ns = \"import pdbench.c\"\nimport os, json\n";
    let got = py_imports(text, "pdbench", &known);
    assert_eq!(
        got,
        ["pdbench.a", "pdbench.b", "run"].map(str::to_owned).into()
    );
    assert_eq!(
        py_imports("from . import a\nfrom .. import x\n", "pdbench", &known),
        ["pdbench.a"].map(str::to_owned).into()
    );
    let deps: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(m, d)| (m.to_owned(), d.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(py_cycle(&deps).unwrap(), ["a", "b", "c", "a"]);
    let mut acyclic = deps;
    acyclic.insert("c".to_owned(), BTreeSet::new());
    assert_eq!(py_cycle(&acyclic), None);
}

/// One file owns the request's phase: every other flow file returns what
/// comes next (`flow::phase::Next`) instead of writing it.
#[test]
fn only_flow_phase_rs_moves_the_phase() {
    let dir = src().join("flow");
    let mut writers = Vec::new();
    for file in rust_files(&dir) {
        if file.file_name().is_some_and(|n| n == "phase.rs") {
            continue;
        }
        let text = fs::read_to_string(&file).expect("read");
        for (i, line) in text.lines().enumerate() {
            if line.contains("self.phase =") || line.contains("&mut self.phase") {
                writers.push(format!("{}:{}", file.display(), i + 1));
            }
        }
    }
    assert!(
        writers.is_empty(),
        "the phase is written outside src/flow/phase.rs:\n{}",
        writers.join("\n")
    );
}

/// The justfile runs bash with `pipefail`: a reader that stops early (`head`,
/// `grep -q`) kills a writer still printing with SIGPIPE, and the pipeline
/// fails with status 141 or takes the wrong branch, depending on timing
/// (`etcd --version | head -n1` failed a fresh-clone run that way).
#[test]
fn no_recipe_pipes_into_a_reader_that_stops_early() {
    let mut early = Vec::new();
    for (name, (_, body)) in recipes() {
        for line in body.lines() {
            let piped: Vec<&str> = line.split('|').skip(1).map(str::trim_start).collect();
            if piped.iter().any(|p| {
                p.starts_with("head")
                    || p.starts_with("grep -q")
                    || p.starts_with("grep -xq")
                    || p.starts_with("grep -qx")
            }) {
                early.push(format!("{name}: {}", line.trim()));
            }
        }
    }
    assert!(
        early.is_empty(),
        "recipes piping into a reader that may stop early (use `grep ... >/dev/null` or `sed -n 1p`):\n{}",
        early.join("\n")
    );
}
