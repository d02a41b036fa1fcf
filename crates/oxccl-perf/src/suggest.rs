//! "Did you mean …?": the known word nearest to a mistyped one, shared by `oxccl-perf` (its
//! hand-parsed options and benchmark names) and `oxccl` (the values its clap parsers check).
//!
//! Rules:
//! 1. Nearness is clap's own measure (Jaro similarity, above 0.7, from the same `strsim`
//!    crate), taken between the words without case, `_` and `-` (so `allreduce_perf` finds
//!    `all_reduce_perf`, `--warmup-iters` finds `--warmup_iters`).
//! 2. One suggestion at most: the nearest; on a tie, the first candidate given.

/// Clap's threshold: a candidate must be more similar than this to be suggested.
const THRESHOLD: f64 = 0.7;

/// The candidate nearest to `word`, if any is near enough to be what was meant.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let plain = |w: &str| w.chars().filter(|c| *c != '_' && *c != '-').collect::<String>().to_lowercase();
    let word = plain(word);
    let mut best: Option<(f64, &str)> = None;
    for c in candidates {
        let s = strsim::jaro(&word, &plain(c));
        if s > THRESHOLD && best.is_none_or(|(b, _)| s > b) {
            best = Some((s, c));
        }
    }
    best.map(|(_, c)| c)
}

/// `; did you mean "X"?` for the nearest candidate, or nothing.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    nearest(word, candidates).map(|c| format!("; did you mean \"{c}\"?")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_candidate_or_none() {
        let words = ["--minbytes", "--maxbytes", "--stepbytes", "--nthreads"];
        assert_eq!(nearest("--minbyte", words), Some("--minbytes"));
        assert_eq!(nearest("--maxbyts", words), Some("--maxbytes"));
        assert_eq!(nearest("--nthread", words), Some("--nthreads"));
        assert_eq!(nearest("--colour", words), None);
        assert_eq!(nearest("-q", ["-b", "-e"]), None);
        assert_eq!(nearest("x", []), None);
        // Case, dashes and underscores aside.
        let benches = ["all_reduce_perf", "reduce_perf", "all_gather_perf"];
        assert_eq!(nearest("allreduce_perf", benches), Some("all_reduce_perf"));
        assert_eq!(nearest("All-Gather", benches), Some("all_gather_perf"));
        assert_eq!(nearest("warmup-iters", ["warmup_iters", "iters"]), Some("warmup_iters"));
        // A tie goes to the first candidate.
        assert_eq!(nearest("abcd", ["abce", "abcf"]), Some("abce"));
        assert_eq!(did_you_mean("allreduse", ["allreduce", "allgather"]), "; did you mean \"allreduce\"?");
        assert_eq!(did_you_mean("zzz", ["allreduce"]), "");
    }
}
