//! PyTorch from PyPI loads our libnccl.so.2 in place of NVIDIA's: every nccl symbol
//! `libtorch_cuda.so` imports is defined by our library (so the next PyTorch release's
//! additions fail here first), and with `LD_PRELOAD` and `LD_BIND_NOW=1` (every symbol
//! resolved at load, not at first call) `import torch` works and `torch.cuda.nccl.version()`
//! answers our version, from our library.
//!
//! The python comes from `OXCCL_PYTHON` (CI makes a virtualenv with PyTorch), else `python3`;
//! without PyTorch the tests skip (a failure under `OXCCL_REQUIRE_ALL=1`, as in CI).

use std::path::PathBuf;
use std::process::Command;

oxccl_testkit::test_scope!();

/// Our library, as cargo built it with this test (`target/<profile>/deps/libnccl.so`).
fn our_lib() -> PathBuf {
    let so = std::env::current_exe().unwrap().parent().unwrap().join("libnccl.so");
    assert!(so.exists(), "{} is missing: cargo builds the cdylib with the tests", so.display());
    so
}

fn python() -> PathBuf {
    std::env::var_os("OXCCL_PYTHON").map(PathBuf::from).unwrap_or_else(|| "python3".into())
}

/// PyTorch's `torch/lib` directory, found without importing torch (the import is what the
/// other test tries); `None` (after recording a skip) when PyTorch is not installed.
fn torch_lib_dir(test: &str) -> Option<PathBuf> {
    let out = Command::new(python())
        .args([
            "-c",
            "import importlib.util as u, os; s = u.find_spec('torch'); \
             print(os.path.join(s.submodule_search_locations[0], 'lib'))",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => Some(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())),
        Ok(o) => {
            oxccl_testkit::skip(
                test,
                "PyTorch",
                &format!(
                    "{} finds no torch ({}); set OXCCL_PYTHON to a python with torch",
                    python().display(),
                    String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
                ),
            );
            None
        }
        Err(e) => {
            oxccl_testkit::skip(test, "python", &format!("cannot run {}: {e}", python().display()));
            None
        }
    }
}

/// The dynamic symbols of `lib`: undefined (imported) ones, or defined (exported) ones.
fn symbols(lib: &std::path::Path, undefined: bool) -> Vec<String> {
    let flag = if undefined { "--undefined-only" } else { "--defined-only" };
    let o = Command::new("nm").args(["-D", flag]).arg(lib).output().expect("run nm (binutils)");
    assert!(o.status.success(), "nm {}: {}", lib.display(), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect()
}

#[test]
fn every_nccl_symbol_pytorch_imports_is_ours() {
    let Some(dir) = torch_lib_dir("every_nccl_symbol_pytorch_imports_is_ours") else { return };
    let ours: std::collections::HashSet<String> = symbols(&our_lib(), false).into_iter().collect();
    let mut wanted: Vec<String> = Vec::new();
    for lib in ["libtorch_cuda.so", "libtorch_python.so", "libtorch_cpu.so"] {
        let p = dir.join(lib);
        if p.exists() {
            wanted.extend(
                symbols(&p, true).into_iter().filter(|s| s.starts_with("nccl") || s.starts_with("pnccl")),
            );
        }
    }
    wanted.sort();
    wanted.dedup();
    assert!(
        wanted.len() >= 40,
        "libtorch_cuda.so imports only {} nccl symbols: is this a CUDA build of PyTorch? {wanted:?}",
        wanted.len()
    );
    let missing: Vec<&String> = wanted.iter().filter(|s| !ours.contains(*s)).collect();
    assert!(missing.is_empty(), "PyTorch imports nccl symbols our library lacks: {missing:?}");
    println!("{} nccl symbols PyTorch imports, all defined by ours", wanted.len());
}

#[test]
fn pytorch_imports_with_our_library_preloaded_and_reports_our_version() {
    if torch_lib_dir("pytorch_imports_with_our_library_preloaded_and_reports_our_version").is_none() {
        return;
    }
    let lib = our_lib();
    // torch also loads NVIDIA's libnccl.so.2 from its wheel by path; what matters is where
    // the symbols bind. The loader's own record of every binding (LD_DEBUG=bindings) says
    // where each of libtorch_cuda.so's nccl symbols went; ncclGetErrorString(8), looked up
    // the way libtorch's references are (the global scope), answers our text.
    let script = "import ctypes, torch, torch.cuda.nccl as n\n\
                  g = ctypes.CDLL(None)\n\
                  g.ncclGetErrorString.restype = ctypes.c_char_p\n\
                  print('version', n.version())\n\
                  print('text', g.ncclGetErrorString(8).decode())\n";
    let dir = std::env::temp_dir().join(format!("torch-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new(python())
        .args(["-c", script])
        .env("LD_PRELOAD", &lib)
        .env("LD_BIND_NOW", "1")
        .env("LD_DEBUG", "bindings")
        .env("LD_DEBUG_OUTPUT", dir.join("ld"))
        .output()
        .expect("run python");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "import torch with our libnccl preloaded failed:\n{out}{err}");
    let v = nccl::NCCL_VERSION_CODE;
    let want = format!("version ({}, {}, {})", v / 10000, v / 100 % 100, v % 100);
    assert!(out.contains(&want), "expected `{want}`:\n{out}{err}");
    assert!(out.contains("text timed out"), "ncclGetErrorString answered from another library:\n{out}");
    // "binding file .../libtorch_cuda.so [0] to <library> [0]: normal symbol `ncclX'".
    let ours = lib.to_str().unwrap();
    let (mut to_ours, mut elsewhere) = (0, Vec::new());
    for f in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        for l in text.lines().filter(|l| l.contains("libtorch_cuda.so [") && l.contains("symbol `nccl")) {
            if l.contains(&format!(" to {ours} [")) {
                to_ours += 1;
            } else {
                elsewhere.push(l.trim().to_string());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(elsewhere.is_empty(), "libtorch_cuda.so's nccl symbols bound elsewhere: {elsewhere:?}");
    assert!(to_ours >= 40, "only {to_ours} of libtorch_cuda.so's nccl symbols were bound (to ours)");
    println!("{}\n{to_ours} nccl bindings of libtorch_cuda.so, all to {ours}", out.trim());
}
