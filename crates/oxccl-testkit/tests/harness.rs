//! The test harness itself: a launch whose children ran nothing, or not their scenario to its
//! end, fails with a message naming the rank, the filter and the scenario; skips fail under
//! `OXCCL_REQUIRE_ALL=1` unless the machine cannot have the capability, and every skip is
//! logged; every test binary works under its run root and a test-scoped cache, removed at exit.

use oxccl_testkit::{child, scope, Launch};
use std::path::{Path, PathBuf};

oxccl_testkit::test_scope!();

const RAN: &str = "a_launch_whose_children_ran_nothing_fails";

#[test]
fn a_launch_whose_children_ran_nothing_fails() {
    if let Some(ctx) = child("ran") {
        println!("RAN rank {}", ctx.rank);
        return;
    }
    // The control: the right filter and scenario pass, every rank having run.
    let done = Launch::new(RAN, "ran", 2).run().unwrap_or_else(|e| panic!("{e}"));
    for d in &done {
        assert!(d.stdout.contains(&format!("RAN rank {}", d.rank)), "rank {}: {}", d.rank, d.stdout);
    }
    // A filter that matches no test: libtest runs nothing and exits 0.
    let e = Launch::new("no_such_test", "ran", 2).run().expect_err("a launch that ran no test passed");
    for want in
        ["2 of 2 ranks failed", "rank 0 (", "rank 1 (", "never claimed scenario \"ran\"", "no_such_test"]
    {
        assert!(e.contains(want), "{want:?} missing from:\n{e}");
    }
    // A misspelt scenario: the child runs this test, which does not claim "rna" and takes the
    // parent's path; its launch is refused, so it fails, and its parent says why.
    let e = Launch::new(RAN, "rna", 2).run().expect_err("a launch of a misspelt scenario passed");
    for want in ["never claimed scenario \"rna\"", RAN, "rank 0 (", "rank 1 ("] {
        assert!(e.contains(want), "{want:?} missing from:\n{e}");
    }
    assert!(e.contains("which its test never claimed"), "the child's refusal is not shown:\n{e}");
}

#[test]
fn a_child_that_ends_inside_its_scenario_fails_its_launch() {
    if let Some(_ctx) = child("quits") {
        // Exits 0 in the middle of its part, as a stray exit(0) in the code under test would.
        std::process::exit(0);
    }
    let e = Launch::new("a_child_that_ends_inside_its_scenario_fails_its_launch", "quits", 2)
        .run()
        .expect_err("a child that never finished its scenario passed");
    for want in
        ["2 of 2 ranks failed", "rank 0 (exit status: 0)", "claimed scenario \"quits\"", "never finished"]
    {
        assert!(e.contains(want), "{want:?} missing from:\n{e}");
    }
}

/// A skip is logged; under `OXCCL_REQUIRE_ALL=1` it fails, unless the capability is one the
/// machine cannot have.
#[test]
fn skips_are_logged_and_fail_where_ci_requires_everything() {
    if let Some(ctx) = child("skip") {
        match ctx.args.as_str() {
            "skip" => oxccl_testkit::skip("t", "a capability", "a reason"),
            _ => oxccl_testkit::skip_unavailable("t", "a kernel module", "not built"),
        }
        return;
    }
    let dir = Launch::scratch();
    let log = dir.join("skips.log");
    let launch = |kind: &str, require: &str| {
        Launch::new("skips_are_logged_and_fail_where_ci_requires_everything", "skip", 1)
            .args(kind)
            .env("OXCCL_REQUIRE_ALL", require)
            .env("OXCCL_SKIP_LOG", log.to_str().unwrap())
            .run()
    };
    launch("skip", "0").unwrap_or_else(|e| panic!("a skip failed without OXCCL_REQUIRE_ALL: {e}"));
    launch("unavailable", "1").unwrap_or_else(|e| panic!("an unavailable capability failed: {e}"));
    let e = launch("skip", "1").expect_err("a skip passed under OXCCL_REQUIRE_ALL=1");
    assert!(e.contains("t: a capability is unavailable (a reason), and OXCCL_REQUIRE_ALL=1"), "{e}");
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "SKIPPED t: a capability: a reason",
            "SKIPPED t: a kernel module (not available on this machine): not built"
        ],
        "the skip log"
    );
}

/// This process's run root, which the scope made and `TMPDIR` names.
fn my_root() -> &'static PathBuf {
    let root = scope::root().expect("this test binary has no run root");
    assert_eq!(&std::env::temp_dir(), root, "TMPDIR is not the run root");
    root
}

#[test]
fn every_process_works_under_its_run_root_and_a_test_scoped_cache() {
    if let Some(_ctx) = child("where") {
        let cache = oxccl::env::cache_dir().unwrap();
        // After libtest's "test NAME ... ", which has no line end.
        println!("\nROOT {}\nCACHE {}", my_root().display(), cache.display());
        return;
    }
    let root = my_root();
    assert!(root.is_dir(), "{}", root.display());
    let cache = oxccl::env::cache_dir().expect("a cache directory");
    let home_cache = std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/oxccl"));
    if scope::cache_is_scoped() {
        assert_eq!(cache, root.join("cache"));
    }
    assert_ne!(Some(&cache), home_cache.as_ref(), "tests must not cache in ~/.cache/oxccl");
    // A rank has its own root inside this one, removed when it exits, and this one's cache.
    let done = Launch::new("every_process_works_under_its_run_root_and_a_test_scoped_cache", "where", 2)
        .run()
        .unwrap_or_else(|e| panic!("{e}"));
    for d in &done {
        let said = |tag: &str| {
            d.stdout
                .lines()
                .find_map(|l| l.strip_prefix(tag))
                .map(PathBuf::from)
                .unwrap_or_else(|| panic!("rank {} did not say its {tag:?}: {}", d.rank, d.stdout))
        };
        let (child_root, child_cache) = (said("ROOT "), said("CACHE "));
        assert!(
            child_root.starts_with(root),
            "rank {}: {} is outside {}",
            d.rank,
            child_root.display(),
            root.display()
        );
        assert!(!child_root.exists(), "rank {}: its run root {} outlived it", d.rank, child_root.display());
        assert_eq!(child_cache, cache, "rank {}: another cache", d.rank);
    }
}

/// Every test binary of the workspace enters its scope: each file under `crates/*/tests/`,
/// `oxccl`'s unit tests, and the unit tests of every program (`[[bin]]`, whose modules are
/// compiled into a test binary of their own); oxccl-core's tests, which cannot (the kit
/// depends on that crate), write no files.
#[test]
fn every_test_binary_enters_its_scope() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut checked = 0;
    for krate in std::fs::read_dir(crates).unwrap().flatten() {
        let name = krate.file_name().to_string_lossy().into_owned();
        let Ok(tests) = std::fs::read_dir(krate.path().join("tests")) else { continue };
        for f in tests.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "rs")) {
            let text = std::fs::read_to_string(&f).unwrap();
            if name == "oxccl-core" {
                for w in ["fs::write", "File::create", "create_dir", "temp_dir", "OpenOptions"] {
                    assert!(!text.contains(w), "{}: writes files ({w}) outside any scope", f.display());
                }
            } else {
                assert!(
                    text.contains("oxccl_testkit::test_scope!();"),
                    "{} does not enter its scope",
                    f.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} test files found under {}", crates.display());
    // Crate roots whose unit tests enter the scope: oxccl's library and every program.
    let mut roots = vec![crates.join("oxccl/src/lib.rs")];
    for krate in std::fs::read_dir(crates).unwrap().flatten() {
        let Ok(manifest) = std::fs::read_to_string(krate.path().join("Cargo.toml")) else { continue };
        for section in manifest.split("[[bin]]").skip(1) {
            let section = section.split("\n[").next().unwrap();
            let path =
                section.lines().find_map(|l| l.trim().strip_prefix("path = ")).expect("a [[bin]] path");
            roots.push(krate.path().join(path.trim_matches('"')));
        }
    }
    assert!(roots.len() >= 5, "only {} crate roots found under {}", roots.len(), crates.display());
    for root in roots {
        assert!(
            std::fs::read_to_string(&root).unwrap().contains("#[cfg(test)]\noxccl_testkit::test_scope!();"),
            "{}: its unit tests do not enter the scope",
            root.display()
        );
    }
}
