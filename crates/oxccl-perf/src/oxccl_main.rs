//! `oxccl`: tools around the library. `oxccl analyze DUMP...` merges the ranks' flight
//! recorder dumps and prints the verdict: which rank stopped first, at which call, who waited
//! for whom, and the first error.

fn usage() -> ! {
    eprintln!("usage: oxccl analyze DUMP.json...   (flight recorder dumps, one per rank)");
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.split_first() {
        Some((cmd, files)) if cmd == "analyze" && !files.is_empty() => {
            match oxccl::flight::analyze_files(files) {
                Ok(v) => print!("{v}"),
                Err(e) => {
                    eprintln!("oxccl analyze: {e}");
                    std::process::exit(1);
                }
            }
        }
        _ => usage(),
    }
}
