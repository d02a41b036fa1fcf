//! Model checks of the shared-memory connection's header steps (rules 2–4 of
//! [`super`]) under loom (`--features model`), a thread a side, on a header in ordinary
//! memory; the Simple slots' bytes are loom cells, so a slot written while its reader may
//! still read it is a data race that loom reports.

use super::*;
use crate::sync::{plain_read, plain_write, Plain};
use loom::sync::{Arc, Notify};
use loom::thread;

const SLOTS: u64 = 2;

/// What the sender writes for chunk `n`: its length word and signature (in the
/// header), its bytes (in the slot).
fn len_of(n: u64) -> u32 {
    (100 + n as u32) | (proto_tag(Proto::Simple) << 30)
}
fn sig_of(n: u64) -> SigWords {
    [n + 1, !n, 7 * n + 3]
}
fn data_of(n: u64) -> u64 {
    0xd00d_0000 + n
}

struct Conn {
    h: Box<Header>,
    slots: [Plain; SLOTS as usize],
    /// The sender's and the receiver's doorbells (loom `Notify`s, as the eventfds:
    /// a ring before the wait is kept), used where the sides sleep (rule 4).
    send_bell: Notify,
    recv_bell: Notify,
}

fn conn() -> Arc<Conn> {
    Arc::new(Conn {
        h: Header::new(SLOTS as usize, 64),
        slots: [Plain::new(0), Plain::new(0)],
        send_bell: Notify::new(),
        recv_bell: Notify::new(),
    })
}

/// Waits until `ready()`: spinning, or (`sleep`) by rule 4 on `bell`, announced in
/// `flag`.
fn wait(mut ready: impl FnMut() -> bool, sleep: bool, flag: &AtomicU32, bell: &Notify) {
    while !ready() {
        if !sleep {
            thread::yield_now();
            continue;
        }
        sleep_announce(flag);
        if !ready() {
            bell.wait();
        }
        sleep_end(flag);
    }
}

/// The sender's side of `ShmSend::ready` and `commit` (Simple) for chunks `0..n`.
fn send(c: &Conn, n: u64, sleep: bool) {
    let (mut head, mut tail_seen) = (0u64, 0u64);
    while head < n {
        wait(|| c.h.room(head, &mut tail_seen, SLOTS), sleep, &c.h.send_sleeping.0, &c.send_bell);
        let i = (head % SLOTS) as usize;
        plain_write(&c.slots[i], data_of(head));
        c.h.describe(i, len_of(head), &sig_of(head));
        head += 1;
        c.h.publish(head);
        if sleep && bell_needed(&c.h.recv_sleeping.0) {
            c.recv_bell.notify();
        }
    }
}

/// The receiver's side of `ShmRecv::ready`, `chunk`, `sig` and `release` (Simple) for
/// chunks `0..n`: each chunk once, in order, as written.
fn recv(c: &Conn, n: u64, sleep: bool) {
    let (mut tail, mut head_seen) = (0u64, 0u64);
    while tail < n {
        let ready = || {
            if head_seen <= tail {
                head_seen = c.h.published();
            }
            head_seen > tail
        };
        wait(ready, sleep, &c.h.recv_sleeping.0, &c.recv_bell);
        let i = (tail % SLOTS) as usize;
        assert_eq!(c.h.len_tag(i), len_of(tail), "chunk {tail}'s length");
        assert_eq!(c.h.sig(i), sig_of(tail), "chunk {tail}'s signature");
        assert_eq!(plain_read(&c.slots[i]), data_of(tail), "chunk {tail}'s bytes");
        tail += 1;
        c.h.free(tail);
        if sleep && bell_needed(&c.h.send_sleeping.0) {
            c.send_bell.notify();
        }
    }
    assert_eq!(c.h.published(), n, "no chunk beyond the sent ones");
}

/// Both sides, `n` chunks, sleeping or spinning.
fn run(n: u64, sleep: bool) {
    let c = conn();
    let tx = {
        let c = c.clone();
        thread::spawn(move || send(&c, n, sleep))
    };
    recv(&c, n, sleep);
    tx.join().unwrap();
}

/// Rules 2 and 3: a ring of 2 slots, 3 chunks (slot 0 reused), both sides spinning:
/// the receiver takes every chunk once, in order, with the length, signature and
/// bytes written before its publication, and the sender never rewrites a slot
/// being read.
#[test]
fn model_shm_ring_delivers_each_chunk_once_in_order() {
    let n = crate::sync::model("shm ring: 2 slots, 3 chunks", None, || run(3, false));
    assert!(n > 1);
}

/// Rule 4: the same, both sides sleeping on their doorbells whenever they find
/// nothing to do: every sleep ends (a lost wake-up is a deadlock, which loom reports).
/// Interleavings of at most 2 preemptions (loom's bound).
#[test]
fn model_shm_sleeping_sides_are_always_woken() {
    let n = crate::sync::model("shm sleep: 2 slots, 3 chunks, both sides sleep", Some(2), || run(3, true));
    assert!(n > 1);
}
