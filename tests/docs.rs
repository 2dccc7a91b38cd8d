//! The docs hold together: every relative link in the repository's Markdown
//! points to a file that exists, and every `#anchor` to a heading of that
//! file (GitHub's anchor rules), so moving a section never leaves a reader
//! at a dead end.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files of the repository (not dependencies' or build output).
fn markdown(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !name.starts_with('.')
                && !matches!(name.as_str(), "target" | "node_modules" | "corpus")
            {
                markdown(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to
/// dashes.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks), with
/// GitHub's `-1`, `-2` suffixes for repeats.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = anchor(&heading.replace('`', ""));
        let mut a = base.clone();
        let mut n = 0;
        while out.contains(&a) {
            n += 1;
            a = format!("{base}-{n}");
        }
        out.insert(a);
    }
    out
}

/// The targets of inline links `[text](target)` outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code is not a link.
        let line: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].trim().to_owned());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut files = Vec::new();
    markdown(&root(), &mut files);
    assert!(files.len() > 5, "found {} Markdown files", files.len());
    let mut broken = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("read");
        for link in links(&text) {
            let link = link.split_whitespace().next().unwrap_or("").to_owned();
            if link.is_empty() || link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, frag) = match link.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let shown = file.strip_prefix(root()).unwrap().display();
            if !target.exists() {
                broken.push(format!("{shown}: {link} (no such file)"));
                continue;
            }
            if let Some(frag) = frag {
                if target.extension().is_some_and(|e| e == "md")
                    && !anchors(&fs::read_to_string(&target).expect("read")).contains(frag)
                {
                    broken.push(format!("{shown}: {link} (no such section)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_an_entrance() {
    let n = fs::read_to_string(root().join("README.md"))
        .expect("README.md")
        .lines()
        .count();
    assert!(
        n <= 300,
        "README.md has {n} lines; reference material goes to docs/"
    );
}

#[test]
fn anchors_follow_githubs_rules() {
    let a = anchors(
        "# Two commands\n## `just bench`: figures\n```\n# not a heading\n```\n## Two commands\n",
    );
    assert_eq!(
        a,
        ["just-bench-figures", "two-commands", "two-commands-1"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    assert_eq!(
        links("see [x](docs/a.md#b) and `[y](z)`"),
        vec!["docs/a.md#b"]
    );
}
