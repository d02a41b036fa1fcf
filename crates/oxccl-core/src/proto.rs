//! The wire formats of the LL and LL128 protocols: how a chunk is laid out in a connection slot
//! so the receiver can tell, from the data alone, that it is complete — no head counter.
//!
//! - **LL**: each 8-byte line carries 4 bytes of data (low half) and a 4-byte flag (high half),
//!   written with one 8-byte store. A line is ready when its flag equals the flag of the step
//!   being read; a line left from an earlier step carries an older flag, so it is never taken
//!   for new data, and an 8-byte store cannot be seen half-written. Half the slot is flags.
//! - **LL128**: each 128-byte line carries 120 bytes of data in its first 15 words and the flag
//!   in its last word, written in order with the flag last. The receiver takes a line whose
//!   flag is current; that is only sound where the path keeps a line's stores in order (the
//!   tuner enables LL128 only there, [`crate::tuner::Model::ll128`]).
//!
//! Flags are the step number plus one (never 0, so zeroed memory is never ready), and change
//! from one use of a slot to the next.

/// The protocols, in NCCL's order: how a chunk's arrival is signalled. Simple: a counter
/// published after the data; LL and LL128: flags inside the data's own lines (below). The
/// tuner chooses among them; transports lay each out in its own slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    LL,
    LL128,
    Simple,
}

pub const PROTOS: [Proto; 3] = [Proto::LL, Proto::LL128, Proto::Simple];

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::LL => "LL",
            Proto::LL128 => "LL128",
            Proto::Simple => "Simple",
        }
    }
}

/// Bytes of data per LL line, and bytes per line.
pub const LL_DATA_BYTES: usize = 4;
pub const LL_LINE_BYTES: usize = 8;
/// Words per LL128 line (the last is the flag), data bytes per line, bytes per line.
pub const LL128_WORDS: usize = 16;
pub const LL128_DATA_BYTES: usize = 120;
pub const LL128_LINE_BYTES: usize = 128;

/// The flag of step `step` (never 0).
pub fn flag_of(step: u64) -> u32 {
    ((step % u32::MAX as u64) + 1) as u32
}

/// A line not ready yet: which one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotReady {
    pub line: usize,
}

/// One LL line.
#[inline]
pub fn ll_pack(data: u32, flag: u32) -> u64 {
    (u64::from(flag) << 32) | u64::from(data)
}

/// The data of an LL line, if it carries `flag`.
#[inline]
pub fn ll_unpack(line: u64, flag: u32) -> Option<u32> {
    ((line >> 32) as u32 == flag).then_some(line as u32)
}

/// LL lines needed for `bytes` of data.
pub fn ll_lines(bytes: usize) -> usize {
    bytes.div_ceil(LL_DATA_BYTES)
}

/// Encodes `data` as LL lines into `out` (`ll_lines(data.len())` of them; the last line's
/// unused bytes are zero).
pub fn ll_encode(data: &[u8], flag: u32, out: &mut [u64]) {
    for (i, c) in data.chunks(LL_DATA_BYTES).enumerate() {
        let mut w = [0u8; 4];
        w[..c.len()].copy_from_slice(c);
        out[i] = ll_pack(u32::from_le_bytes(w), flag);
    }
}

/// Decodes LL lines into `out` (`out.len()` bytes), or names the first line not ready.
pub fn ll_decode(lines: &[u64], flag: u32, out: &mut [u8]) -> Result<(), NotReady> {
    for (i, c) in out.chunks_mut(LL_DATA_BYTES).enumerate() {
        let d = lines.get(i).and_then(|&l| ll_unpack(l, flag)).ok_or(NotReady { line: i })?;
        c.copy_from_slice(&d.to_le_bytes()[..c.len()]);
    }
    Ok(())
}

/// LL128 lines needed for `bytes` of data.
pub fn ll128_lines(bytes: usize) -> usize {
    bytes.div_ceil(LL128_DATA_BYTES)
}

/// Encodes `data` as LL128 lines (16 words each; the flag word last).
pub fn ll128_encode(data: &[u8], flag: u32, out: &mut [u64]) {
    for (i, c) in data.chunks(LL128_DATA_BYTES).enumerate() {
        let line = &mut out[i * LL128_WORDS..(i + 1) * LL128_WORDS];
        let mut buf = [0u8; LL128_DATA_BYTES];
        buf[..c.len()].copy_from_slice(c);
        for (w, b) in line[..LL128_WORDS - 1].iter_mut().zip(buf.chunks(8)) {
            *w = u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        }
        line[LL128_WORDS - 1] = u64::from(flag);
    }
}

/// Decodes LL128 lines into `out`, or names the first line whose flag is not current.
pub fn ll128_decode(words: &[u64], flag: u32, out: &mut [u8]) -> Result<(), NotReady> {
    for (i, c) in out.chunks_mut(LL128_DATA_BYTES).enumerate() {
        let line = words.get(i * LL128_WORDS..(i + 1) * LL128_WORDS).ok_or(NotReady { line: i })?;
        if line[LL128_WORDS - 1] != u64::from(flag) {
            return Err(NotReady { line: i });
        }
        let mut buf = [0u8; LL128_DATA_BYTES];
        for (b, w) in buf.chunks_mut(8).zip(&line[..LL128_WORDS - 1]) {
            b.copy_from_slice(&w.to_le_bytes());
        }
        c.copy_from_slice(&buf[..c.len()]);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Chunks in connection slots: the formats above applied to a slot of shared words. A chunk
// starts with a head (its length and call signature) in the protocol's own format, so the
// receiver learns everything about it from flagged lines — no counter, no side table.

use core::sync::atomic::{AtomicU64, Ordering};

/// A flagged chunk's head: its length in bytes and its call signature.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkHead {
    pub len: u32,
    pub sig: [u64; 3],
}

/// LL lines a chunk's head takes (8 × 4 bytes: length, a check word, three signature words).
pub const LL_HEAD_LINES: usize = 8;
/// The check word of a head (tells a head from garbage carrying the right flag).
const HEAD_CHECK: u32 = 0x4F58_4C4C;
/// Largest LL and LL128 slots: LL is the latency protocol, its chunks stay small.
pub const LL_SLOT_MAX: usize = 16 << 10;
pub const LL128_SLOT_MAX: usize = 64 << 10;

/// Bytes of an LL slot beside Simple slots of `slot_bytes` (a multiple of 128).
pub fn ll_slot_bytes(slot_bytes: usize) -> usize {
    slot_bytes.clamp(512, LL_SLOT_MAX) & !(LL128_LINE_BYTES - 1)
}

/// Bytes of an LL128 slot beside Simple slots of `slot_bytes` (a multiple of 128).
pub fn ll128_slot_bytes(slot_bytes: usize) -> usize {
    slot_bytes.clamp(512, LL128_SLOT_MAX) & !(LL128_LINE_BYTES - 1)
}

/// The largest chunk protocol `p` carries through a connection whose Simple slots are
/// `slot_bytes`: the whole slot (Simple), 4 of every 8 bytes after the head lines (LL), 120 of
/// every 128 after the head line (LL128).
pub fn chunk_capacity(p: Proto, slot_bytes: usize) -> usize {
    match p {
        Proto::Simple => slot_bytes,
        Proto::LL => (ll_slot_bytes(slot_bytes) / LL_LINE_BYTES - LL_HEAD_LINES) * LL_DATA_BYTES,
        Proto::LL128 => (ll128_slot_bytes(slot_bytes) / LL128_LINE_BYTES - 1) * LL128_DATA_BYTES,
    }
}

fn head_words(h: &ChunkHead) -> [u32; LL_HEAD_LINES] {
    let [a, b, c] = h.sig;
    [h.len, HEAD_CHECK, a as u32, (a >> 32) as u32, b as u32, (b >> 32) as u32, c as u32, (c >> 32) as u32]
}

/// A receiver's progress through one flagged chunk: its head once read, bytes decoded so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    pub head: Option<ChunkHead>,
    pub done: usize,
}

/// Writes a chunk as LL lines into `slot`: `LL_HEAD_LINES` head lines, then data lines, each
/// line one 8-byte store, so a reader can take the head and then each line as it lands.
/// `data.len()` must fit the slot.
pub fn ll_write(slot: &[AtomicU64], head: &ChunkHead, data: &[u8], flag: u32) {
    for (l, w) in slot.iter().zip(head_words(head)) {
        l.store(ll_pack(w, flag), Ordering::Relaxed);
    }
    let lines = &slot[LL_HEAD_LINES..];
    let mut words = data.chunks_exact(LL_DATA_BYTES);
    let mut n = 0;
    for (l, w) in lines.iter().zip(&mut words) {
        let w = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        l.store(ll_pack(w, flag), Ordering::Relaxed);
        n += 1;
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 4];
        w[..rest.len()].copy_from_slice(rest);
        lines[n].store(ll_pack(u32::from_le_bytes(w), flag), Ordering::Relaxed);
    }
}

fn read_head(words: [u32; LL_HEAD_LINES], cap: usize) -> Option<ChunkHead> {
    if words[1] != HEAD_CHECK {
        return None;
    }
    let sig = |k: usize| u64::from(words[2 + 2 * k]) | (u64::from(words[3 + 2 * k]) << 32);
    Some(ChunkHead { len: (words[0] as usize).min(cap) as u32, sig: [sig(0), sig(1), sig(2)] })
}

/// Takes what has arrived of the LL chunk flagged `flag` in `slot` into `out`, resuming from
/// `p`; true once the whole chunk is in `out[..len]`. A line is taken only when it carries
/// `flag` (a stale or unwritten line never does); the length is clamped to `out`.
pub fn ll_poll(slot: &[AtomicU64], flag: u32, p: &mut Progress, out: &mut [u8]) -> bool {
    let head = match p.head {
        Some(h) => h,
        None => {
            let mut w = [0u32; LL_HEAD_LINES];
            for (k, l) in slot[..LL_HEAD_LINES].iter().enumerate() {
                match ll_unpack(l.load(Ordering::Relaxed), flag) {
                    Some(v) => w[k] = v,
                    None => return false,
                }
            }
            let cap = out.len().min((slot.len() - LL_HEAD_LINES) * LL_DATA_BYTES);
            let Some(h) = read_head(w, cap) else { return false };
            p.head = Some(h);
            h
        }
    };
    let len = head.len as usize;
    let lines = &slot[LL_HEAD_LINES..];
    // Wait on the chunk's last line before taking the rest: polling the line being written
    // pulls its cache line back and forth between the cores once per store.
    if p.done < len && ll_unpack(lines[(len - 1) / LL_DATA_BYTES].load(Ordering::Relaxed), flag).is_none() {
        return false;
    }
    // Whole lines in a tight loop, then the last partial one (`done` is a multiple of 4
    // until the end).
    let full = len / LL_DATA_BYTES;
    let start = p.done / LL_DATA_BYTES;
    if start < full {
        let dst = &mut out[start * LL_DATA_BYTES..full * LL_DATA_BYTES];
        for (k, (b, l)) in dst.chunks_exact_mut(LL_DATA_BYTES).zip(&lines[start..full]).enumerate() {
            let v = l.load(Ordering::Relaxed);
            if (v >> 32) as u32 != flag {
                p.done = (start + k) * LL_DATA_BYTES;
                return false;
            }
            b.copy_from_slice(&(v as u32).to_le_bytes());
        }
        p.done = full * LL_DATA_BYTES;
    }
    if p.done < len {
        let Some(d) = ll_unpack(lines[full].load(Ordering::Relaxed), flag) else { return false };
        out[p.done..len].copy_from_slice(&d.to_le_bytes()[..len - p.done]);
        p.done = len;
    }
    true
}

/// Writes a chunk as LL128 lines into `slot`: the head in line 0, then data lines; each line's
/// data words first, then its flag word with a release store, so a reader that acquires a
/// current flag sees the whole line, and takes lines as they land.
pub fn ll128_write(slot: &[AtomicU64], head: &ChunkHead, data: &[u8], flag: u64) {
    let hw = head_words(head);
    for (k, w) in slot[..LL_HEAD_LINES / 2].iter().enumerate() {
        w.store(u64::from(hw[2 * k]) | (u64::from(hw[2 * k + 1]) << 32), Ordering::Relaxed);
    }
    slot[LL128_WORDS - 1].store(flag, Ordering::Release);
    for (i, piece) in data.chunks(LL128_DATA_BYTES).enumerate() {
        let line = &slot[(i + 1) * LL128_WORDS..(i + 2) * LL128_WORDS];
        let mut words = piece.chunks_exact(8);
        let mut k = 0;
        for (w, b) in line.iter().zip(&mut words) {
            w.store(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]), Ordering::Relaxed);
            k += 1;
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            line[k].store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        line[LL128_WORDS - 1].store(flag, Ordering::Release);
    }
}

/// Takes what has arrived of the LL128 chunk flagged `flag` in `slot` into `out`, resuming
/// from `p`; true once the whole chunk is in `out[..len]`.
pub fn ll128_poll(slot: &[AtomicU64], flag: u64, p: &mut Progress, out: &mut [u8]) -> bool {
    let head = match p.head {
        Some(h) => h,
        None => {
            if slot[LL128_WORDS - 1].load(Ordering::Acquire) != flag {
                return false;
            }
            let mut w = [0u32; LL_HEAD_LINES];
            for (k, x) in slot[..LL_HEAD_LINES / 2].iter().enumerate() {
                let v = x.load(Ordering::Relaxed);
                w[2 * k] = v as u32;
                w[2 * k + 1] = (v >> 32) as u32;
            }
            let cap = out.len().min((slot.len() / LL128_WORDS).saturating_sub(1) * LL128_DATA_BYTES);
            let Some(h) = read_head(w, cap) else { return false };
            p.head = Some(h);
            h
        }
    };
    let len = head.len as usize;
    // As LL: wait on the last line first.
    if p.done < len {
        let last = 1 + (len - 1) / LL128_DATA_BYTES;
        if slot[last * LL128_WORDS + LL128_WORDS - 1].load(Ordering::Acquire) != flag {
            return false;
        }
    }
    while p.done < len {
        let line = 1 + p.done / LL128_DATA_BYTES;
        let words = &slot[line * LL128_WORDS..(line + 1) * LL128_WORDS];
        if words[LL128_WORDS - 1].load(Ordering::Acquire) != flag {
            return false;
        }
        let n = (len - p.done).min(LL128_DATA_BYTES);
        let dst = &mut out[p.done..p.done + n];
        let mut parts = dst.chunks_exact_mut(8);
        for (b, w) in (&mut parts).zip(words) {
            b.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        let rest = parts.into_remainder();
        if !rest.is_empty() {
            let w = words[n / 8].load(Ordering::Relaxed).to_le_bytes();
            let k = rest.len();
            rest.copy_from_slice(&w[..k]);
        }
        p.done += n;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn ll_round_trips_every_length_and_refuses_stale_lines() {
        for n in [0, 1, 3, 4, 5, 8, 63, 64, 1000] {
            let d = data(n, 7);
            let mut lines = vec![0u64; ll_lines(n)];
            // Zeroed memory is never ready (flags start at 1).
            let mut out = vec![0u8; n];
            if n > 0 {
                assert_eq!(ll_decode(&lines, flag_of(0), &mut out), Err(NotReady { line: 0 }));
            }
            ll_encode(&d, flag_of(5), &mut lines);
            ll_decode(&lines, flag_of(5), &mut out).unwrap();
            assert_eq!(out, d);
            // Reading the slot for the next step sees only stale lines.
            if n > 0 {
                assert_eq!(ll_decode(&lines, flag_of(6), &mut out), Err(NotReady { line: 0 }));
            }
        }
        assert_eq!(ll_pack(0xdead_beef, 3), 0x0000_0003_dead_beef);
        assert_eq!(ll_unpack(0x0000_0003_dead_beef, 3), Some(0xdead_beef));
        assert_eq!(ll_unpack(0x0000_0003_dead_beef, 4), None);
        assert_ne!(flag_of(u32::MAX as u64 - 1), 0);
        assert_ne!(flag_of(u32::MAX as u64), 0);
    }

    #[test]
    fn a_partly_written_ll_chunk_is_ready_exactly_up_to_its_first_missing_line() {
        let old = data(64, 1);
        let new = data(64, 2);
        let mut slot = vec![0u64; ll_lines(64)];
        ll_encode(&old, flag_of(0), &mut slot);
        let mut fresh = vec![0u64; ll_lines(64)];
        ll_encode(&new, flag_of(1), &mut fresh);
        // The writer's stores land in any order; after each, the reader takes the message only
        // when every line is new, and reports the first line still old.
        let order = [5usize, 0, 15, 3, 1, 2, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14];
        let mut out = vec![0u8; 64];
        for (k, &l) in order.iter().enumerate() {
            slot[l] = fresh[l];
            let r = ll_decode(&slot, flag_of(1), &mut out);
            let first_old = (0..16).find(|i| !order[..=k].contains(i));
            match first_old {
                Some(i) => assert_eq!(r, Err(NotReady { line: i })),
                None => {
                    r.unwrap();
                    assert_eq!(out, new);
                }
            }
        }
    }

    #[test]
    fn ll128_round_trips_and_a_torn_or_stale_line_is_never_ready() {
        for n in [1, 119, 120, 121, 240, 1000] {
            let d = data(n, 3);
            let mut words = vec![0u64; ll128_lines(n) * LL128_WORDS];
            ll128_encode(&d, flag_of(9), &mut words);
            let mut out = vec![0u8; n];
            ll128_decode(&words, flag_of(9), &mut out).unwrap();
            assert_eq!(out, d);
            assert_eq!(ll128_decode(&words, flag_of(10), &mut out), Err(NotReady { line: 0 }));
        }
        // A line being written in order (data words first, flag last): every prefix short of
        // the flag reads as not ready, whatever data words have landed.
        let old = data(120, 1);
        let new = data(120, 2);
        let mut slot = vec![0u64; LL128_WORDS];
        ll128_encode(&old, flag_of(0), &mut slot);
        let mut fresh = vec![0u64; LL128_WORDS];
        ll128_encode(&new, flag_of(1), &mut fresh);
        let mut out = vec![0u8; 120];
        for w in 0..LL128_WORDS {
            assert_eq!(
                ll128_decode(&slot, flag_of(1), &mut out),
                Err(NotReady { line: 0 }),
                "after {w} words"
            );
            slot[w] = fresh[w];
        }
        ll128_decode(&slot, flag_of(1), &mut out).unwrap();
        assert_eq!(out, new);
        // Payload efficiency: LL 50 %, LL128 120/128.
        assert_eq!(ll_lines(4096) * LL_LINE_BYTES, 8192);
        assert_eq!(ll128_lines(120 * 64) * LL128_LINE_BYTES, 128 * 64);
    }

    fn atomics(n: usize) -> Vec<AtomicU64> {
        (0..n).map(|_| AtomicU64::new(0)).collect()
    }

    fn snapshot(s: &[AtomicU64]) -> Vec<u64> {
        s.iter().map(|w| w.load(Ordering::Relaxed)).collect()
    }

    #[test]
    fn chunk_capacities_follow_the_formats() {
        assert_eq!(chunk_capacity(Proto::Simple, 128 << 10), 128 << 10);
        assert_eq!(chunk_capacity(Proto::LL, 128 << 10), (16384 / 8 - 8) * 4);
        assert_eq!(chunk_capacity(Proto::LL128, 128 << 10), (65536 / 128 - 1) * 120);
        // The smallest NCCL_BUFFSIZE (4096 over 8 slots) still carries the widest element.
        for p in [Proto::LL, Proto::LL128] {
            assert!(chunk_capacity(p, 512) >= 200, "{p}");
        }
    }

    /// Writes a chunk (in the protocol's format) into a copy of the slot, then replays its
    /// stores one word at a time, in the given order, over a slot that holds an older chunk:
    /// the reader never reports the chunk complete before every word has landed, and then
    /// reads exactly the new data and head.
    fn replay(p: Proto, mut order: impl FnMut(&[usize]) -> Vec<usize>) {
        for len in [0usize, 1, 5, 119, 120, 121, 333, 1000] {
            let words = 32 * 16;
            let old = data(4000, 1);
            let new = data(len, 2);
            let (h_old, h_new) = (
                ChunkHead { len: 1000, sig: [1, 2, 3] },
                ChunkHead { len: len as u32, sig: [7, 8, u64::MAX] },
            );
            let slot = atomics(words);
            // The new chunk's stores: written over two backgrounds, the words it writes agree.
            let fresh = [atomics(words), atomics(words)];
            fresh[1].iter().for_each(|w| w.store(u64::MAX, Ordering::Relaxed));
            // Old chunk: step 3 of this slot; new: step 3 + 8 (the slot's next use).
            match p {
                Proto::LL => {
                    ll_write(&slot, &h_old, &old[..(words - 8) * 4 - 3], flag_of(3));
                    fresh.iter().for_each(|f| ll_write(f, &h_new, &new, flag_of(11)));
                }
                _ => {
                    ll128_write(&slot, &h_old, &old[..(32 - 1) * 120 - 5], 4);
                    fresh.iter().for_each(|f| ll128_write(f, &h_new, &new, 12));
                }
            }
            let (target, other) = (snapshot(&fresh[0]), snapshot(&fresh[1]));
            let changed: Vec<usize> = (0..words)
                .filter(|&i| target[i] == other[i] && target[i] != slot[i].load(Ordering::Relaxed))
                .collect();
            let mut prog = Progress::default();
            let mut out = vec![0u8; 4000];
            let poll = |slot: &[AtomicU64], prog: &mut Progress, out: &mut [u8]| match p {
                Proto::LL => ll_poll(slot, flag_of(11), prog, out),
                _ => ll128_poll(slot, 12, prog, out),
            };
            let seq = order(&changed);
            for (k, &i) in seq.iter().enumerate() {
                assert!(
                    !poll(&slot, &mut prog, &mut out),
                    "{p} len {len}: complete after {k} of {} stores",
                    seq.len()
                );
                slot[changed[i]].store(target[changed[i]], Ordering::Relaxed);
            }
            assert!(poll(&slot, &mut prog, &mut out), "{p} len {len}: not complete after every store");
            assert_eq!(prog.head, Some(h_new));
            assert_eq!(&out[..len], &new[..], "{p} len {len}");
        }
    }

    #[test]
    fn a_torn_or_stale_ll_chunk_in_a_slot_is_never_read_as_ready() {
        replay(Proto::LL, |c| (0..c.len()).rev().collect());
        replay(Proto::LL, |c| (0..c.len()).collect());
        let mut r = 0x9e37_79b9_u64;
        replay(Proto::LL, |c| {
            let mut v: Vec<usize> = (0..c.len()).collect();
            for i in (1..v.len()).rev() {
                r ^= r << 13;
                r ^= r >> 7;
                r ^= r << 17;
                v.swap(i, (r % (i as u64 + 1)) as usize);
            }
            v
        });
    }

    #[test]
    fn a_torn_or_stale_ll128_chunk_in_a_slot_is_never_read_as_ready() {
        // Stores in program order (the head line, then data lines, each line's flag last),
        // and each line's stores in order but the lines in reverse.
        replay(Proto::LL128, |c| (0..c.len()).collect());
        replay(Proto::LL128, |c| {
            let mut lines: Vec<Vec<usize>> = Vec::new();
            for (i, w) in c.iter().enumerate() {
                match lines.last_mut() {
                    Some(l) if c[l[0]] / LL128_WORDS == w / LL128_WORDS => l.push(i),
                    _ => lines.push(vec![i]),
                }
            }
            lines.reverse();
            lines.into_iter().flatten().collect()
        });
    }
}
