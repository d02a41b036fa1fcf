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
}
