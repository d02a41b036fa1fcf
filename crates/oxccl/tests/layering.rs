//! The runtime's layering rules, checked over the sources of the library and its C ABI
//! (their `#[cfg(test)]` modules aside): the OS is called through `sys` only (no `libc::`
//! elsewhere), the environment is read in `env.rs` only (`Config` parses what it reads), and
//! a module names only modules of its layer or below (`LAYERS`; the few known exceptions are
//! listed in `KNOWN_UPWARD` and must go, not grow). A broken rule fails naming each file and
//! line.

use std::path::{Path, PathBuf};

oxccl_testkit::test_scope!();

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Whether `f` is a `tests.rs` that its parent module declares under `#[cfg(test)]`
/// (`dir/tests.rs` of `dir/mod.rs`, `dir.rs` or, at the top, `lib.rs`).
fn is_test_file(f: &Path) -> bool {
    if f.file_name().is_none_or(|n| n != "tests.rs") {
        return false;
    }
    let dir = f.parent().expect("a parent directory");
    let parents = [dir.join("mod.rs"), dir.with_extension("rs"), dir.join("lib.rs")];
    parents.iter().filter_map(|p| std::fs::read_to_string(p).ok()).any(|t| {
        let l: Vec<&str> = t.lines().map(str::trim).collect();
        l.windows(2).any(|w| w[0] == "#[cfg(test)]" && w[1].ends_with("mod tests;"))
    })
}

/// Each source line outside test modules, with its file (relative to the workspace) and number.
/// A test module is `#[cfg(test)]` followed by `mod NAME {` (public or not), to the end of the file (the
/// convention here: test modules close their files).
fn lines(crates: &[&str]) -> Vec<(String, usize, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut out = Vec::new();
    for c in crates {
        let mut files = Vec::new();
        rust_files(&root.join(c).join("src"), &mut files);
        files.sort();
        for f in files {
            if is_test_file(&f) {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let rel = f.strip_prefix(&root).unwrap_or(&f).to_string_lossy().into_owned();
            let all: Vec<&str> = text.lines().collect();
            for (i, l) in all.iter().enumerate() {
                let next = all.get(i + 1).map_or("", |n| n.trim_start());
                let next = next.trim_start_matches("pub(crate) ").trim_start_matches("pub ");
                if l.trim() == "#[cfg(test)]" && next.starts_with("mod ") {
                    break;
                }
                out.push((rel.clone(), i + 1, l.to_string()));
            }
        }
    }
    out
}

fn code(l: &str) -> &str {
    // A comment's mention of a call is not a call.
    l.split("//").next().unwrap_or("")
}

#[test]
fn only_sys_calls_libc() {
    let bad: Vec<String> = lines(&["crates/oxccl", "crates/oxccl-capi"])
        .into_iter()
        .filter(|(f, _, l)| !f.contains("/src/sys/") && code(l).contains("libc::"))
        .map(|(f, n, l)| format!("{f}:{n}: {}", l.trim()))
        .collect();
    assert!(bad.is_empty(), "libc called outside oxccl::sys:\n{}", bad.join("\n"));
}

#[test]
fn only_env_reads_the_environment() {
    let reads = ["env::var(", "env::var_os(", "env::vars(", "env::vars_os(", "getenv"];
    let bad: Vec<String> = lines(&["crates/oxccl", "crates/oxccl-capi", "crates/oxccl-core"])
        .into_iter()
        .filter(|(f, _, l)| {
            !f.ends_with("crates/oxccl/src/env.rs") && reads.iter().any(|r| code(l).contains(r))
        })
        .map(|(f, n, l)| format!("{f}:{n}: {}", l.trim()))
        .collect();
    assert!(
        bad.is_empty(),
        "the environment read outside oxccl::env (Config parses it):\n{}",
        bad.join("\n")
    );
}

/// The scan itself sees what it looks for: the rules' own homes are found and hold matches.
#[test]
fn the_scan_finds_the_homes_of_both_rules() {
    let all = lines(&["crates/oxccl"]);
    assert!(all.iter().any(|(f, _, l)| f.contains("/src/sys/") && code(l).contains("libc::")));
    assert!(all.iter().any(|(f, _, l)| f.ends_with("src/env.rs") && code(l).contains("env::var")));
    // Test modules are cut, inline or in files of their own: the bootstrap's tests read the
    // environment (benchmark sizes), the kernels' inline ones OXCCL_REQUIRE_NVRTC.
    assert!(!all.iter().any(|(f, _, _)| f.ends_with("bootstrap/tests.rs")));
    assert!(all.iter().any(|(f, _, _)| f.ends_with("bootstrap/mod.rs")));
    assert!(is_test_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bootstrap/tests.rs")));
    assert!(!all.iter().any(|(f, _, l)| f.ends_with("cuda/kernels.rs") && l.contains("OXCCL_REQUIRE_NVRTC")));
}

/// The library's top modules by layer, lowest first; a module may name its own layer's and
/// those below (`crate::…`, or the crate root's re-exports of them).
const LAYERS: &[&[&str]] = &[
    &["sys", "sync", "error", "log", "env"],
    &["flight", "calib", "topo", "wait"],
    &["bootstrap"],
    &["rendezvous", "transport", "mem"],
    &["engine"],
    &["comm"],
    &["rma", "cuda"],
];

/// Upward references allowed for now (file, module named), each to be removed by moving the
/// code to its layer: none are left. Keep it empty.
const KNOWN_UPWARD: &[(&str, &str)] = &[];

fn layer(m: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&m))
}

/// The top module a crate-root name re-exports (lib.rs's `pub use`), if one of ours.
fn root_name(n: &str) -> Option<&'static str> {
    match n {
        "Communicator" | "Detached" | "Group" | "Scope" | "Work" => Some("comm"),
        "Error" | "RejectReason" | "Result" => Some("error"),
        "new_unique_id" => Some("rendezvous"),
        _ => None,
    }
}

/// The modules a line of code names through `crate::`: `crate::m…` and `crate::{m…, n…}`.
fn named(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let items: Vec<&str> = match rest.strip_prefix('{') {
            Some(g) => g.split('}').next().unwrap_or("").split(',').collect(),
            None => vec![rest],
        };
        for it in items {
            let head: String = it.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if let Some(m) = root_name(&head) {
                out.push(m.to_string());
            } else if layer(&head).is_some() {
                out.push(head);
            }
        }
    }
    out
}

/// How deep the module of the file at `rel` (under src/) sits: `engine/mod.rs` 1,
/// `engine/direct/setup.rs` 3.
fn depth(rel: &str) -> usize {
    let parts: Vec<&str> = rel.trim_end_matches(".rs").split('/').collect();
    parts.len() - usize::from(parts.last() == Some(&"mod"))
}

/// The top modules a line of a module `depth` deep names through `super::` chains that climb
/// to the crate root (`super::super::transport` from `engine/direct`).
fn named_through_super(code: &str, depth: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("super::") {
        let before = rest[..i].chars().last();
        rest = &rest[i..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            ups += 1;
            rest = r;
        }
        // `self::super::` or `x::super::` do not start at the module itself.
        if ups >= depth && !before.is_some_and(|c| c == ':' || c.is_alphanumeric() || c == '_') {
            let items: Vec<&str> = match rest.strip_prefix('{') {
                Some(g) => g.split('}').next().unwrap_or("").split(',').collect(),
                None => vec![rest],
            };
            for it in items {
                let head: String =
                    it.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if layer(&head).is_some() {
                    out.push(head);
                }
            }
        }
    }
    out
}

#[test]
fn modules_name_only_their_layer_and_below() {
    let mut found: Vec<(String, String, String)> = Vec::new();
    for (f, n, l) in lines(&["crates/oxccl"]) {
        let Some(rel) = f.strip_prefix("crates/oxccl/src/") else { continue };
        let top = rel.split('/').next().unwrap_or(rel).trim_end_matches(".rs");
        let Some(mine) = layer(top) else { continue };
        for m in named(code(&l)).into_iter().chain(named_through_super(code(&l), depth(rel))) {
            if m != top && layer(&m).is_some_and(|t| t > mine) {
                found.push((f.clone(), m, format!("{f}:{n}: {}", l.trim())));
            }
        }
    }
    let new: Vec<&str> = found
        .iter()
        .filter(|(f, m, _)| !KNOWN_UPWARD.contains(&(f.as_str(), m.as_str())))
        .map(|(_, _, at)| at.as_str())
        .collect();
    assert!(new.is_empty(), "a module names a module of a higher layer (see LAYERS):\n{}", new.join("\n"));
    let gone: Vec<String> = KNOWN_UPWARD
        .iter()
        .filter(|(f, m)| !found.iter().any(|(g, n, _)| g == f && n == m))
        .map(|(f, m)| format!("{f} → {m}"))
        .collect();
    assert!(gone.is_empty(), "fixed, so take them off KNOWN_UPWARD: {}", gone.join(", "));
}

#[test]
fn every_top_module_has_a_layer_and_names_are_read_from_groups() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for e in std::fs::read_dir(&root).expect("src") {
        let name = e.expect("an entry").file_name().to_string_lossy().trim_end_matches(".rs").to_string();
        if name != "lib" {
            assert!(layer(&name).is_some(), "src/{name} is in no layer of LAYERS");
        }
    }
    assert_eq!(named("use crate::{Communicator, Rank, engine::RawBuf};"), ["comm", "engine"]);
    assert_eq!(named("let x = crate::sys::fd::POLLIN; crate::error::Error::x"), ["sys", "error"]);
    assert_eq!((depth("engine/mod.rs"), depth("engine/direct/setup.rs"), depth("wait.rs")), (1, 3, 1));
    let up = "use super::super::{comm::Inner, sys}; super::super::super::rma::x";
    assert_eq!(named_through_super(up, 2), ["comm", "sys", "rma"]);
    assert_eq!(named_through_super(up, 3), ["rma"]);
    assert!(named_through_super("use super::engine::x;", 2).is_empty());
}

/// The quoted `NCCL_*` / `OXCCL_*` names in a line of code (a variable read, or named in the
/// error about it).
fn variables_named(code: &str) -> Vec<String> {
    code.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            (s.starts_with("NCCL_") || s.starts_with("OXCCL_"))
                && s.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(String::from)
        .collect()
}

#[test]
fn every_variable_read_is_in_the_one_table_and_every_entry_is_read() {
    use oxccl_core::variables::{Reader, ALL};
    // The three readers (rule 1 of oxccl_core::variables), their test modules aside.
    let readers = [
        ("crates/oxccl-core/src/config.rs", Reader::Settings),
        ("crates/oxccl-core/src/launch.rs", Reader::Launcher),
        ("crates/oxccl/src/env.rs", Reader::Cache),
        ("crates/oxccl/src/topo.rs", Reader::Topology),
    ];
    let all = lines(&["crates/oxccl-core", "crates/oxccl"]);
    let mut read = Vec::new();
    for (f, n, l) in &all {
        let Some((_, reader)) = readers.iter().find(|(r, _)| f == r) else { continue };
        for v in variables_named(code(l)) {
            let entry = ALL.iter().find(|x| x.name == v);
            assert!(entry.is_some(), "{f}:{n}: {v} is read but not in oxccl_core::variables::ALL");
            assert_eq!(entry.map(|x| x.reader), Some(*reader), "{f}:{n}: {v} is listed under another reader");
            read.push(v);
        }
    }
    let unread: Vec<&str> = ALL.iter().map(|x| x.name).filter(|v| !read.iter().any(|r| r == v)).collect();
    assert!(unread.is_empty(), "listed in oxccl_core::variables::ALL but read by none: {unread:?}");
    // The scan sees what it must: a setting, a launcher variable and a cache directory.
    assert!(["NCCL_BUFFSIZE", "OXCCL_UNIQUE_ID_FILE", "OXCCL_KERNEL_CACHE"]
        .iter()
        .all(|v| read.iter().any(|r| r == v)));
    assert_eq!(
        variables_named(r#"get("NCCL_ALGO") "OXCCL_X=1" "oxccl_y" "OXCCL_Z""#),
        ["NCCL_ALGO", "OXCCL_Z"]
    );
}
