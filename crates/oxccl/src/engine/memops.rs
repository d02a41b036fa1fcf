//! Bulk copies for the direct path and for large jobs' writes into shared-memory slots
//! (`engine::stores`): ordinary copies for data that stays in cache, streaming
//! (non-temporal) stores for data too large to: they write memory without first reading the
//! destination's lines, which is a third of the traffic of an out-of-place copy.
//!
//! Rule: after streaming stores, [`store_fence`] must run before anything that publishes the
//! data to another core (the direct path's `done` flag), since those stores are weakly ordered.

/// Copies `len` bytes from `src` to `dst`, with streaming stores when `stream` is set.
///
/// # Safety
/// `src` must be valid for `len` reads and `dst` for `len` writes, and the ranges must not
/// overlap.
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream && len >= 256 {
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy_stream_x86(dst, src, len) };
        return;
    }
    let _ = stream;
    // SAFETY: forwarded from the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Copies `src` into `dst` (of the same length) with streaming stores ([`store_fence`]'s rule
/// applies).
pub fn stream_copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "stream_copy of slices of different lengths");
    // SAFETY: both slices are valid for their (equal) lengths, and a `&mut` slice never
    // overlaps a shared one.
    unsafe { copy(dst.as_mut_ptr(), src.as_ptr(), src.len(), true) }
}

/// # Safety
/// As [`copy`].
#[cfg(target_arch = "x86_64")]
unsafe fn copy_stream_x86(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    // Head: up to the first 16-byte-aligned destination address.
    let head = (16 - (dst as usize & 15)) & 15;
    // SAFETY: head < 16 ≤ len; in bounds by the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut off = head;
    while off + 64 <= len {
        // SAFETY: off + 64 ≤ len, so all four 16-byte loads and stores are in bounds; the
        // destination address is 16-byte aligned (head made it so); SSE2 is part of x86_64.
        unsafe {
            let s = src.add(off) as *const __m128i;
            let d = dst.add(off) as *mut __m128i;
            let (a, b, c, e) = (
                _mm_loadu_si128(s),
                _mm_loadu_si128(s.add(1)),
                _mm_loadu_si128(s.add(2)),
                _mm_loadu_si128(s.add(3)),
            );
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        off += 64;
    }
    // SAFETY: the remaining tail is in bounds.
    unsafe { std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len - off) };
}

/// Orders earlier streaming stores before later stores (a no-op where there are none).
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no operands and is part of x86_64's baseline (SSE).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_length_and_alignment() {
        let src: Vec<u8> = (0..2010u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0usize, 1, 15, 16, 63, 64, 255, 256, 257, 1000, 1999] {
            for off in 0..17 {
                for stream in [false, true] {
                    let mut dst = vec![0u8; 2100];
                    // SAFETY: both ranges are in bounds of their vectors and distinct.
                    unsafe { copy(dst.as_mut_ptr().add(off), src.as_ptr(), len, stream) };
                    store_fence();
                    assert_eq!(&dst[off..off + len], &src[..len], "len {len} off {off} stream {stream}");
                    assert!(dst[..off].iter().all(|b| *b == 0) && dst[off + len..].iter().all(|b| *b == 0));
                }
            }
            let mut dst = vec![0u8; len];
            stream_copy(&mut dst, &src[3..3 + len]);
            store_fence();
            assert_eq!(dst, &src[3..3 + len], "stream_copy len {len}");
        }
    }
}
