//! Which stores a large job uses to write chunks into shared-memory send slots: ordinary ones
//! (the receiving core then reads the lines out of the writer's cache) or streaming ones
//! (`memops::copy` with `stream`: the lines go to memory, and the receiver reads them there).
//!
//! Which is faster is not a property of the code but of where the two cores sit. Measured on
//! a 2-vCPU KVM guest of an AMD EPYC host (bench notes, issue 25): a producer/consumer copy
//! over eight 128 KiB slots ran at 9–11 GB/s with ordinary stores while the host kept the
//! vCPUs close, and at 2–4 GB/s for seconds to minutes at a time when it did not; streaming
//! stores ran at 8–10 GB/s throughout. oxccl-perf all_reduce, 2 ranks, heap buffers, 1–128
//! MiB: ordinary 10.1–5.9 GB/s in the good phase and 1.5–2.1 in the bad one, streaming
//! 5.6–4.2 and 7.9–4.6. So each engine measures both, per size class, and uses the faster.
//!
//! Rules: the choice is local to the sending rank (the receiver reads a slot the same way
//! either way; nothing on the wire changes) and cannot change any result, only its speed.
//! Jobs whose largest buffer is under [`ADAPT_MIN_BYTES`] always use ordinary stores (their
//! chunks are consumed while still cached). A job's time runs from its first step that
//! consumes a received chunk (every peer has arrived by then: earlier waits measure the
//! peers, not the stores) to its end. Each size class tries ordinary stores, then streaming
//! ones (twice each), then takes the faster by its running mean time per byte, and runs every
//! [`EXPLORE_EVERY`]-th job in the other mode, whose estimate that one job then replaces, so
//! that a change of phase is noticed within that many jobs.

use super::memops;
use oxccl_core::error::CoreError;
use oxccl_core::plan::exec::{apply, StepData};
use oxccl_core::reduce::ReduceCtx;

/// Performs a step as `exec::apply` does, but writes its chunk into the send `slot` with
/// streaming stores: the value goes to the destination (if any) as `apply` writes it, then to
/// the slot; a chunk reduced straight into the slot is written by the reduction as usual.
/// The slot is fenced before this returns (memops' rule: the commit that follows publishes
/// it).
pub fn apply_streamed(
    ctx: Option<&ReduceCtx>,
    fin: bool,
    data: StepData<'_>,
    dst: Option<&mut [u8]>,
    slot: &mut [u8],
) -> Result<(), CoreError> {
    match (data, dst) {
        (StepData::Src(input) | StepData::Recv(input), None) if !fin => memops::stream_copy(slot, input),
        (data, Some(d)) => {
            apply(ctx, fin, data, Some(&mut *d), None)?;
            memops::stream_copy(slot, d);
        }
        (data, None) => apply(ctx, fin, data, None, Some(&mut *slot))?,
    }
    memops::store_fence();
    Ok(())
}

/// Jobs whose largest buffer is smaller use ordinary stores.
pub const ADAPT_MIN_BYTES: usize = 1 << 20;
/// One job in this many (per size class) runs in the mode that is currently slower.
pub const EXPLORE_EVERY: u32 = 16;
/// The first jobs of a class, which alternate between the modes.
const WARMUP_JOBS: u32 = 4;
/// Size classes: powers of two from [`ADAPT_MIN_BYTES`], the last open-ended.
const CLASSES: usize = 8;
/// Weight of a new measurement in the running mean (the rest is the old mean).
const WEIGHT: f64 = 0.25;

/// The per-engine chooser.
#[derive(Debug, Default)]
pub struct StoreChooser {
    /// Per class, per mode (0 ordinary, 1 streaming): the running mean of ns per byte.
    mean: [[Option<f64>; 2]; CLASSES],
    /// Per class: jobs chosen so far.
    jobs: [u32; CLASSES],
}

/// One decision, to hand back to [`StoreChooser::record`] with the job's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    class: usize,
    /// Streaming stores.
    pub stream: bool,
    /// A job in the mode not in use (its time replaces that mode's estimate).
    explore: bool,
}

impl StoreChooser {
    /// The stores for a job whose largest buffer is `bytes`; None below [`ADAPT_MIN_BYTES`]
    /// (ordinary stores, nothing to record).
    pub fn pick(&mut self, bytes: usize) -> Option<Choice> {
        if bytes < ADAPT_MIN_BYTES {
            return None;
        }
        let class = ((bytes / ADAPT_MIN_BYTES).ilog2() as usize).min(CLASSES - 1);
        let n = self.jobs[class];
        self.jobs[class] = n.wrapping_add(1);
        let (stream, explore) = match self.mean[class] {
            // The first jobs alternate (a class's first job may also pay for first touches
            // of its buffers, so each mode is measured twice, the second replacing the first).
            _ if n < WARMUP_JOBS => (n % 2 == 1, true),
            [None, _] => (false, true),
            [Some(_), None] => (true, true),
            [Some(plain), Some(streamed)] => {
                let better = streamed < plain;
                if n % EXPLORE_EVERY == EXPLORE_EVERY - 1 {
                    (!better, true)
                } else {
                    (better, false)
                }
            }
        };
        Some(Choice { class, stream, explore })
    }

    /// The time a job run as `c` took for its `bytes` (see the module's rules).
    pub fn record(&mut self, c: Choice, bytes: usize, ns: u64) {
        let per_byte = ns as f64 / bytes.max(1) as f64;
        let m = &mut self.mean[c.class][c.stream as usize];
        *m = Some(match *m {
            Some(old) if !c.explore => old * (1.0 - WEIGHT) + per_byte * WEIGHT,
            _ => per_byte,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_jobs_are_not_measured() {
        let mut c = StoreChooser::default();
        assert_eq!(c.pick(ADAPT_MIN_BYTES - 1), None);
        assert!(c.pick(ADAPT_MIN_BYTES).is_some());
    }

    #[test]
    fn tries_both_then_keeps_the_faster_and_explores() {
        let mut c = StoreChooser::default();
        let b = 8 << 20;
        // Warm-up: ordinary, streaming, ordinary, streaming; the first ordinary job was slow
        // (first touches), the second is what counts.
        let mut warm = Vec::new();
        for ns in [40_000_000u64, 1_000_000, 4_000_000, 1_000_000] {
            let ch = c.pick(b).unwrap();
            warm.push(ch.stream);
            c.record(ch, b, ns);
        }
        assert_eq!(warm, [false, true, false, true]);
        // Streaming is faster: chosen, except one job in EXPLORE_EVERY.
        let picks: Vec<bool> = (0..2 * EXPLORE_EVERY).map(|_| c.pick(b).unwrap().stream).collect();
        let explored = picks.iter().filter(|s| !**s).count();
        assert_eq!(explored, 2, "{picks:?}");
        // Another size class knows nothing yet.
        assert!(!c.pick(200 << 20).unwrap().stream);
    }

    #[test]
    fn one_exploring_job_can_change_the_choice() {
        let mut c = StoreChooser::default();
        let b = 2 << 20;
        // Slow ordinary jobs (a bad moment), fast streaming ones, through the warm-up.
        for _ in 0..WARMUP_JOBS {
            let ch = c.pick(b).unwrap();
            c.record(ch, b, if ch.stream { 2_000_000 } else { 50_000_000 });
        }
        // From now on ordinary stores take 1 ms: the first exploring job finds that out and
        // the next job uses them.
        let mut picks = Vec::new();
        for _ in 0..EXPLORE_EVERY + 2 {
            let ch = c.pick(b).unwrap();
            picks.push(ch.stream);
            c.record(ch, b, if ch.stream { 2_000_000 } else { 1_000_000 });
        }
        let first_ordinary = picks.iter().position(|s| !s).expect("an exploring job");
        assert!(first_ordinary < EXPLORE_EVERY as usize, "{picks:?}");
        assert!(!picks[first_ordinary + 1], "{picks:?}");
    }

    #[test]
    fn follows_a_change_of_phase() {
        let mut c = StoreChooser::default();
        let b = 4 << 20;
        // Streaming is 3x faster for 200 jobs, then 3x slower for 200.
        let mut faster_in_tail = [0u32; 2];
        for job in 0..400 {
            let streaming_faster = job < 200;
            let ch = c.pick(b).unwrap();
            let fast = ch.stream == streaming_faster;
            c.record(ch, b, if fast { 1_000_000 } else { 3_000_000 });
            if job % 200 >= 150 && fast {
                faster_in_tail[job / 200] += 1;
            }
        }
        // In the last 50 jobs of each phase only the exploring ones (one in EXPLORE_EVERY)
        // use the slower mode.
        let most = 50 - 50u32.div_ceil(EXPLORE_EVERY);
        assert!(faster_in_tail.iter().all(|n| *n >= most), "{faster_in_tail:?}, want >= {most}");
    }
}
