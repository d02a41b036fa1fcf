//! A communicator's end frees its state even when other threads hold its handle or are inside
//! a call on it: a call in flight keeps the state until it returns (the end waits for it), a
//! call that comes after the end is refused by name, and what stays is a tomb of a few dozen
//! bytes. Ranks are threads; the entry points are the library's own (the rlib of the same
//! code as libnccl.so).

use nccl::handle::state;
use nccl::{
    ncclAllReduce, ncclCommAbort, ncclCommCount, ncclCommDestroy, ncclCommInitRank, ncclComm_t,
    ncclGetLastError, ncclGetUniqueId, ncclRecv, ncclSend, ncclUniqueId,
};
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

#[global_allocator]
static ALLOC: oxccl_testkit::alloc::Counting = oxccl_testkit::alloc::Counting;

/// The tests run one at a time: one counts the whole process's heap.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Clone, Copy)]
struct Comm(ncclComm_t);
// SAFETY: an ncclComm_t may be used from any thread (the library serializes calls).
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

impl Comm {
    /// The handle (a method, so closures capture the whole `Comm`, which is `Send`).
    fn h(self) -> ncclComm_t {
        self.0
    }
}

fn last_error() -> String {
    // SAFETY: NUL-terminated text owned by this thread.
    unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }.to_string_lossy().into_owned()
}

fn init(n: usize) -> Vec<Comm> {
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, 0);
    let hs: Vec<_> = (0..n)
        .map(|r| {
            std::thread::spawn(move || {
                let mut c: ncclComm_t = std::ptr::null_mut();
                // SAFETY: valid out-pointer, id, rank.
                let rc = unsafe { ncclCommInitRank(&mut c, n as i32, id, r as i32) };
                assert_eq!(rc, 0, "{}", last_error());
                Comm(c)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn freed(c: Comm) -> bool {
    state(c.0, "comm").unwrap().is_freed()
}

/// `ncclCommDestroy` while another thread waits in a receive: the destroy waits for that call
/// (which completes when the peer sends), then frees the state; later calls are refused.
#[test]
fn destroy_waits_for_a_call_in_another_thread_then_frees() {
    let _g = one_at_a_time();
    let comms = init(2);
    let (c0, c1) = (comms[0], comms[1]);
    let recv = std::thread::spawn(move || {
        let mut buf = [0u32; 16];
        // SAFETY: 16 writable u32 (ncclUint32), a live communicator, host memory.
        let rc = unsafe { ncclRecv(buf.as_mut_ptr().cast(), 16, 3, 1, c0.h(), std::ptr::null_mut()) };
        (rc, buf, Instant::now(), last_error())
    });
    std::thread::sleep(Duration::from_millis(200));
    let destroy = std::thread::spawn(move || {
        // SAFETY: rank 0's live communicator, destroyed once.
        let rc = unsafe { ncclCommDestroy(c0.h()) };
        (rc, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!freed(c0), "freed while a receive was still running on it");
    let sent_at = Instant::now();
    let data: Vec<u32> = (0..16).collect();
    // SAFETY: 16 readable u32, rank 1's live communicator.
    let rc = unsafe { ncclSend(data.as_ptr().cast(), 16, 3, 0, c1.0, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "{}", last_error());
    let (rc, buf, received_at, msg) = recv.join().unwrap();
    let (drc, destroyed_at) = destroy.join().unwrap();
    assert_eq!(rc, 0, "the receive that started before the destroy completes: {msg}");
    assert_eq!(buf.to_vec(), data);
    assert_eq!(drc, 0);
    assert!(destroyed_at >= sent_at && received_at >= sent_at);
    assert!(freed(c0), "the destroy returned but the state was not freed");
    let mut n = 0;
    // SAFETY: a destroyed handle is refused, not dereferenced.
    assert_eq!(unsafe { ncclCommCount(c0.0, &mut n) }, 5);
    assert!(last_error().contains("was destroyed"), "{}", last_error());
    // SAFETY: rank 1's live communicator.
    assert_eq!(unsafe { ncclCommDestroy(c1.0) }, 0);
    assert!(freed(c1));
}

/// Threads calling in a loop while another ends the communicator (destroy, then abort):
/// every call either runs or is refused by name, and the state is freed once they are out.
#[test]
fn calls_racing_an_end_run_or_are_refused_by_name() {
    let _g = one_at_a_time();
    for round in 0..20 {
        let c = init(1)[0];
        let ended = Arc::new(AtomicBool::new(false));
        let ran = Arc::new(AtomicU64::new(0));
        let callers: Vec<_> = (0..3)
            .map(|t| {
                let (ended, ran) = (ended.clone(), ran.clone());
                std::thread::spawn(move || loop {
                    let after_end = ended.load(Ordering::SeqCst);
                    let (s, mut d) = ([t as f32 + 1.0; 8], [0f32; 8]);
                    let mut n = 0;
                    // SAFETY: 32-byte buffers; the handle may be ended meanwhile (refused then).
                    let rc = unsafe {
                        if t == 2 {
                            ncclCommCount(c.h(), &mut n)
                        } else {
                            ncclAllReduce(
                                s.as_ptr().cast(),
                                d.as_mut_ptr().cast(),
                                8,
                                7,
                                0,
                                c.h(),
                                std::ptr::null_mut(),
                            )
                        }
                    };
                    match rc {
                        0 => {
                            assert!(!after_end, "round {round}: a call ran after the end had returned");
                            assert!(t == 2 && n == 1 || d == s, "round {round}: a call ran wrong");
                            ran.fetch_add(1, Ordering::Relaxed);
                        }
                        5 => {
                            let m = last_error();
                            assert!(m.contains("was destroyed"), "round {round}: {m}");
                            return;
                        }
                        rc => panic!("round {round}: a call returned {rc}: {}", last_error()),
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(5));
        // SAFETY: a live communicator, ended once.
        let rc = unsafe {
            if round % 2 == 0 {
                ncclCommDestroy(c.0)
            } else {
                ncclCommAbort(c.0)
            }
        };
        assert_eq!(rc, 0, "{}", last_error());
        ended.store(true, Ordering::SeqCst);
        for h in callers {
            h.join().unwrap();
        }
        assert!(freed(c), "round {round}: the state was not freed once every call was out");
        assert!(ran.load(Ordering::Relaxed) > 0, "round {round}: no call ran before the end");
    }
}

/// What stays of a destroyed communicator: its tomb (16 bytes) and registry entry.
#[test]
fn a_destroyed_communicator_leaves_a_tomb_of_a_few_dozen_bytes() {
    let _g = one_at_a_time();
    let cycle = || {
        let c = init(1)[0];
        // SAFETY: a live communicator, destroyed once.
        assert_eq!(unsafe { ncclCommDestroy(c.0) }, 0);
    };
    for _ in 0..20 {
        cycle();
    }
    // The unique ids' root threads end on their own shortly after each init.
    std::thread::sleep(Duration::from_millis(300));
    let before = oxccl_testkit::alloc::live();
    let n = 2000;
    for _ in 0..n {
        cycle();
    }
    std::thread::sleep(Duration::from_millis(300));
    let per = (oxccl_testkit::alloc::live() - before) as f64 / n as f64;
    oxccl_testkit::report!("{per:.1} bytes of heap per destroyed communicator");
    // 16 bytes of tomb and a registry entry (17 bytes a bucket, the table doubling at 7/8
    // full: at most ~39 bytes an entry).
    assert!(per <= 64.0, "{per:.1} bytes stay per destroyed communicator");
}
