//! Embeds the git commit the filter was built from, so the line it logs at VM
//! start says exactly which build is running. `PD_ROUTER_GIT_COMMIT` set in
//! the environment wins (builds from a source archive have no `.git`).

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PD_ROUTER_GIT_COMMIT");
    let commit = std::env::var("PD_ROUTER_GIT_COMMIT")
        .ok()
        .or_else(git_commit);
    let commit = commit.unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=PD_ROUTER_GIT_COMMIT={commit}");
}

fn git_commit() -> Option<String> {
    let git = Path::new(".git");
    if git.is_dir() {
        // Rebuild when a commit moves HEAD (the branch ref, loose or packed).
        println!("cargo:rerun-if-changed=.git/HEAD");
        if let Ok(head) = std::fs::read_to_string(git.join("HEAD")) {
            if let Some(r) = head.trim().strip_prefix("ref: ") {
                if git.join(r).exists() {
                    println!("cargo:rerun-if-changed=.git/{r}");
                }
            }
        }
        if git.join("packed-refs").exists() {
            println!("cargo:rerun-if-changed=.git/packed-refs");
        }
    }
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let commit = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!commit.is_empty()).then_some(commit)
}
