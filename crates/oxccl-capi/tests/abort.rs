//! `ncclCommAbort` from another thread ends a call that is blocked waiting for a peer, returns
//! promptly itself, and leaves the handle refused by name. Ranks are threads; the entry points
//! are the library's own (the rlib of the same code as libnccl.so).

use nccl::{
    ncclCommAbort, ncclCommDestroy, ncclCommGetAsyncError, ncclCommInitRank, ncclComm_t, ncclGetLastError,
    ncclGetUniqueId, ncclRecv, ncclUniqueId,
};
use std::ffi::CStr;
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

struct Comm(ncclComm_t);
// SAFETY: an ncclComm_t may be used from any thread (the library serializes calls).
unsafe impl Send for Comm {}

fn init(n: usize) -> Vec<ncclComm_t> {
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, 0);
    let hs: Vec<_> = (0..n)
        .map(|r| {
            std::thread::spawn(move || {
                let mut c: ncclComm_t = std::ptr::null_mut();
                // SAFETY: valid out-pointer, id, rank.
                assert_eq!(unsafe { ncclCommInitRank(&mut c, n as i32, id, r as i32) }, 0);
                Comm(c)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap().0).collect()
}

#[test]
fn abort_from_another_thread_ends_a_blocked_receive() {
    let comms = init(2);
    let c0 = Comm(comms[0]);
    // Rank 0 waits for a message rank 1 never sends.
    let blocked = std::thread::spawn(move || {
        let c0 = c0;
        let mut buf = [0u8; 64];
        let t = Instant::now();
        // SAFETY: 64 writable bytes, a live communicator, host memory.
        let rc = unsafe { ncclRecv(buf.as_mut_ptr().cast(), 64, 1, 1, c0.0, std::ptr::null_mut()) };
        // SAFETY: NUL-terminated text owned by this thread.
        let msg =
            unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }.to_string_lossy().into_owned();
        (rc, t.elapsed(), msg)
    });
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    // SAFETY: rank 0's live communicator, aborted once.
    assert_eq!(unsafe { ncclCommAbort(comms[0]) }, 0);
    let abort_took = t.elapsed();
    let (rc, waited, msg) = blocked.join().unwrap();
    assert_ne!(rc, 0, "the blocked receive must fail");
    assert!(msg.contains("abort"), "{msg}");
    assert!(abort_took < Duration::from_secs(5), "abort took {abort_took:?}");
    assert!(waited < Duration::from_secs(6), "the receive returned after {waited:?}");
    let mut e = 0;
    // SAFETY: a destroyed handle is refused, not dereferenced.
    assert_eq!(unsafe { ncclCommGetAsyncError(comms[0], &mut e) }, 5);
    // SAFETY: rank 1's live communicator.
    assert_eq!(unsafe { ncclCommDestroy(comms[1]) }, 0);
}
