//! `oxccl-callcost`: one rank of a two-rank communicator making 8-byte float sum all-reduces,
//! for counting the instructions of one call under callgrind (`tests/call_cost.rs`).
//!
//! `--rank 1` makes the communicator's unique id, prints `id <hex>` on stdout and joins;
//! `--rank 0 --id <hex>` joins it. Both make `--warmup` calls, then `--calls` more inside
//! [`oxccl_callcost_measured`], the function callgrind collects in. Settings are the defaults
//! a user gets (the environment is not read), so the count is that of the common call.

#[cfg(test)]
oxccl_testkit::test_scope!();

use oxccl::{Communicator, Config, Rank, ReduceOp, UniqueId};
use std::io::Write as _;
use std::time::Duration;

/// The measured calls: callgrind collects from entry to exit of this function only.
#[no_mangle]
#[inline(never)]
pub fn oxccl_callcost_measured(c: &Communicator, send: &[f32; 2], recv: &mut [f32; 2], calls: usize) {
    for _ in 0..calls {
        if let Err(e) = c.all_reduce(&send[..], &mut recv[..], ReduceOp::Sum) {
            eprintln!("oxccl-callcost: all_reduce failed: {e}");
            std::process::exit(1);
        }
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn num(args: &[String], name: &str, default: usize) -> usize {
    match arg(args, name) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("oxccl-callcost: {name} expects a number, got {v:?}");
            std::process::exit(2)
        }),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rank = num(&args, "--rank", usize::MAX);
    let (calls, warmup) = (num(&args, "--calls", 1000), num(&args, "--warmup", 100));
    let config = Config::default().with_timeout(Some(Duration::from_secs(600)));
    let id = match (rank, arg(&args, "--id")) {
        (1, None) => {
            let id = oxccl::new_unique_id(&config).unwrap_or_else(|e| {
                eprintln!("oxccl-callcost: no unique id: {e}");
                std::process::exit(1)
            });
            let hex: String = id.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
            let mut out = std::io::stdout();
            let _ = writeln!(out, "id {hex}");
            let _ = out.flush();
            id
        }
        (0, Some(hex)) => {
            let bytes: Option<Vec<u8>> = (0..hex.len() / 2)
                .map(|i| hex.get(2 * i..2 * i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
                .collect();
            bytes.and_then(|b| UniqueId::from_bytes(&b).ok()).unwrap_or_else(|| {
                eprintln!("oxccl-callcost: --id is not a unique id in hex");
                std::process::exit(2)
            })
        }
        _ => {
            eprintln!("usage: oxccl-callcost --rank 1 [--calls N] [--warmup W]   (prints `id <hex>`)");
            eprintln!("       oxccl-callcost --rank 0 --id <hex> [--calls N] [--warmup W]");
            std::process::exit(2)
        }
    };
    let c = Communicator::init(&id, 2, Rank::new(rank), config).unwrap_or_else(|e| {
        eprintln!("oxccl-callcost: init failed: {e}");
        std::process::exit(1)
    });
    let send = [1.0f32 + rank as f32, 2.0];
    let mut recv = [0.0f32; 2];
    for _ in 0..warmup {
        if let Err(e) = c.all_reduce(&send[..], &mut recv[..], ReduceOp::Sum) {
            eprintln!("oxccl-callcost: all_reduce failed: {e}");
            std::process::exit(1);
        }
    }
    oxccl_callcost_measured(&c, &send, &mut recv, calls);
    if recv != [3.0, 4.0] {
        eprintln!("oxccl-callcost: wrong result {recv:?}");
        std::process::exit(1);
    }
    // Rank 1's reader may be gone by now (the test reads only the id line).
    let _ = writeln!(std::io::stdout(), "done {calls}");
}
