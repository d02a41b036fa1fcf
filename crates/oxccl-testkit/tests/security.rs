//! The bootstrap and the services under attack: random bytes, partial and oversized frames,
//! wrong secrets, forged hellos and thousands of connections, at the rendezvous root while
//! ranks join and at every rank's service (TCP and Unix socket) while they run collectives.
//! Nothing may crash, hang or leak, the job's results stay exact, and strangers are logged.

use oxccl::{Communicator, ReduceOp};
use oxccl_testkit::Rng;
use oxccl_testkit::{child, Launch};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

/// A frame header as the bootstrap writes them: `[len u32][kind u8][0; 3]`.
fn header(len: u32, kind: u8) -> Vec<u8> {
    let mut h = len.to_le_bytes().to_vec();
    h.extend_from_slice(&[kind, 0, 0, 0]);
    h
}

/// One attack on `addr`; returns whether a connection was made.
fn attack(addr: SocketAddr, rng: &mut Rng, held: &mut Vec<TcpStream>) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
    let what = rng.next_u64() % 8;
    let _ = match what {
        // Random bytes.
        0 => {
            let n = 1 + (rng.next_u64() % 4096) as usize;
            s.write_all(&rng.bytes(n))
        }
        // A header announcing a huge frame, then some of it.
        1 => s.write_all(&header(u32::MAX, 10)).and_then(|_| s.write_all(&rng.bytes(1000))),
        // A hello-sized frame of garbage (wrong secret, nonsense ranks).
        2 => {
            let body = rng.bytes(80);
            s.write_all(&header(body.len() as u32, 10)).and_then(|_| s.write_all(&body))
        }
        // Message frames without a hello.
        3 => {
            let body = rng.bytes(64);
            s.write_all(&header(body.len() as u32, 11)).and_then(|_| s.write_all(&body))
        }
        // Half a header, then the connection is kept open (a stalled stranger).
        4 => {
            let r = s.write_all(&[7, 0]);
            if held.len() < 200 {
                held.push(s.try_clone().unwrap());
            }
            r
        }
        // Frame kinds nobody uses, and probes/goodbyes from a stranger.
        5 => {
            let k = [0u8, 13, 14, 15, 16, 12, 99, 255][(rng.next_u64() % 8) as usize];
            s.write_all(&header(8, k)).and_then(|_| s.write_all(&rng.bytes(8)))
        }
        // Connect and close at once.
        _ => Ok(()),
    };
    // Whatever comes back is read (a stranger gets nothing useful), without waiting long.
    let _ = s.set_read_timeout(Some(Duration::from_millis(5)));
    let mut sink = [0u8; 256];
    let _ = s.read(&mut sink);
    true
}

/// Garbage at a Unix socket (shared-memory offers, control blocks): datagrams of random
/// bytes on the abstract name.
fn attack_unix(name: &[u8; 16], rng: &mut Rng) -> bool {
    // SAFETY: plain socket calls on a descriptor this function owns and closes.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return false;
        }
        let mut a: libc::sockaddr_un = std::mem::zeroed();
        a.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (i, b) in name.iter().enumerate() {
            a.sun_path[i + 1] = *b as libc::c_char;
        }
        let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
        let ok = libc::connect(fd, (&a as *const libc::sockaddr_un).cast(), len as libc::socklen_t) == 0;
        if ok {
            let n = 1 + (rng.next_u64() % 600) as usize;
            let b = rng.bytes(n);
            libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT);
        }
        libc::close(fd);
        ok
    }
}

/// Every rank runs exact all-reduces for a while; rank 0 also attacks every rank's service.
fn under_attack(ctx: oxccl_testkit::ChildCtx) {
    let comm = Communicator::from_env().unwrap();
    let (me, p) = (comm.rank().idx(), comm.size());
    let attacks: usize = ctx.args.parse().unwrap();
    let attacker = (me == 0).then(|| {
        let peers: Vec<(SocketAddr, [u8; 16])> = comm.peers().iter().map(|q| (q.addr, q.unix_name)).collect();
        std::thread::spawn(move || {
            let mut rng = Rng::new(0x5eed_0000 + attacks as u64);
            let mut held = Vec::new();
            let (mut tcp, mut unix) = (0, 0);
            for i in 0..attacks {
                let (addr, name) = peers[i % peers.len()];
                tcp += attack(addr, &mut rng, &mut held) as usize;
                if i % 4 == 0 {
                    unix += attack_unix(&name, &mut rng) as usize;
                }
            }
            (tcp, unix, held.len())
        })
    });
    let t = Instant::now();
    let mut calls = 0;
    loop {
        // Inputs for which every reduction order gives the same answer: small integers.
        let n = [1, 1000, 70_000][calls % 3];
        let mut v: Vec<u32> = (0..n).map(|i| (i % 7) as u32 + me as u32).collect();
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        let want = |i: usize| (i % 7) as u32 * p as u32 + (p * (p - 1) / 2) as u32;
        assert!(v.iter().enumerate().all(|(i, x)| *x == want(i)), "rank {me}: call {calls} wrong");
        calls += 1;
        assert!(t.elapsed() < Duration::from_secs(120), "rank {me}: the job crawled");
        // Rank 0 tells the others when the attack is over (all decide from the same word).
        if calls >= 50 && calls % 10 == 0 {
            let mut done = [attacker.as_ref().is_none_or(|a| a.is_finished()) as u8];
            comm.broadcast_in_place(&mut done, oxccl::Rank::new(0)).unwrap();
            if done[0] == 1 {
                break;
            }
        }
    }
    if let Some(a) = attacker {
        let (tcp, unix, held) = a.join().unwrap();
        println!("ATTACKS {attacks}: {tcp} TCP connections, {unix} Unix connections, {held} held open");
    }
    // Memory stays bounded whatever strangers send (peak resident size, KiB).
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let hwm: u64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(hwm < 1 << 20, "rank {me}: peak resident size {hwm} KiB");
    println!("CALLS {calls} exact, peak resident {} MiB", hwm >> 10);
}

#[test]
fn strangers_and_garbage_do_not_disturb_the_job() {
    if let Some(ctx) = child("attack") {
        return under_attack(ctx);
    }
    for (transport, shm_off) in [("shm", "0"), ("tcp", "1")] {
        let id = oxccl::new_unique_id(&oxccl::Config::default()).unwrap();
        // The root is attacked before the ranks come (it is waiting for them), and some of
        // those connections stay open, stalled, while they join.
        let root: SocketAddr =
            id.to_string().split('@').nth(1).unwrap().split('/').next().unwrap().parse().unwrap();
        let mut rng = Rng::new(42);
        let mut held_at_root = Vec::new();
        let root_attacks: usize = (0..1500).map(|_| attack(root, &mut rng, &mut held_at_root) as usize).sum();
        let outs = Launch::new("strangers_and_garbage_do_not_disturb_the_job", "attack", 3)
            .args("2000")
            .env("OXCCL_UNIQUE_ID", &id.to_string())
            .env("NCCL_SHM_DISABLE", shm_off)
            .env("NCCL_DEBUG", "WARN")
            .env("OXCCL_TIMEOUT", "60")
            .timeout(Duration::from_secs(180))
            .run()
            .unwrap_or_else(|e| panic!("{transport}: {e}"));
        drop(held_at_root);
        for o in &outs {
            assert!(o.stdout.contains("exact"), "{transport} rank {}: {}", o.rank, o.stdout);
        }
        let line = outs[0].stdout.lines().find(|l| l.contains("ATTACKS")).unwrap_or_default().to_string();
        // Strangers are logged by the services they reached.
        let logged: usize = outs.iter().map(|o| o.stderr.matches("dropping connection").count()).sum();
        assert!(logged > 100, "{transport}: only {logged} dropped connections logged");
        oxccl_testkit::report!(
            "{transport}: {line}; {root_attacks} attacks on the root before the ranks joined; {logged} strangers dropped and logged; {}",
            outs[0].stdout.lines().find(|l| l.contains("CALLS")).unwrap_or_default()
        );
    }
}
