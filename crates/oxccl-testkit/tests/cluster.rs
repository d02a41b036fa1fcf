//! The emulated cluster ([`oxccl_testkit::cluster`]): 3 hosts with 2 shaped rails each; every
//! host reaches every other on every rail, a TCP transfer takes at least the time the rate
//! implies (and two transfers out of one host share its link), every host has its own
//! hostname and TMPDIR, and nothing is left in `ip netns list` after the drop; a dead
//! process's namespaces are swept, a live one's kept. Sockets are made
//! in threads that entered a host's namespace (setns), so no helper program is needed.

use oxccl_testkit::cluster::{burst_bytes, rate_bits, Cluster, Spec};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

/// Runs `f` on a thread inside network namespace `ns`.
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
    let path = std::ffi::CString::new(format!("/run/netns/{ns}")).unwrap();
    std::thread::spawn(move || {
        // SAFETY: open(2) of a path; setns(2) of this thread only; the fd is closed after.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            assert!(fd >= 0, "open {path:?}: {}", std::io::Error::last_os_error());
            assert_eq!(libc::setns(fd, libc::CLONE_NEWNET), 0, "setns: {}", std::io::Error::last_os_error());
            libc::close(fd);
        }
        f()
    })
}

/// A listener in `ns` on `addr`:`port`, accepting `n` connections and reading each to its end;
/// returns the bytes read per connection.
fn sink(ns: &str, addr: String, port: u16, n: usize) -> std::thread::JoinHandle<Vec<u64>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = in_ns(ns, move || {
        let l = TcpListener::bind((addr.as_str(), port)).unwrap();
        tx.send(()).unwrap();
        let conns: Vec<_> = (0..n).map(|_| l.accept().unwrap().0).collect();
        let readers: Vec<_> = conns
            .into_iter()
            .map(|mut c| {
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    let mut total = 0u64;
                    loop {
                        match c.read(&mut buf).unwrap() {
                            0 => break total,
                            k => total += k as u64,
                        }
                    }
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    rx.recv_timeout(Duration::from_secs(10)).expect("listener never came up");
    h
}

/// Sends `bytes` from `ns` to `to`:`port`.
fn send(ns: &str, to: String, port: u16, bytes: usize) -> std::thread::JoinHandle<()> {
    in_ns(ns, move || {
        let mut s = TcpStream::connect((to.as_str(), port)).unwrap();
        s.write_all(&vec![7u8; bytes]).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
    })
}

fn netns_list() -> String {
    String::from_utf8_lossy(&Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).into_owned()
}

fn in_host(c: &Cluster, h: usize, script: &str) -> String {
    let argv = c.exec_in(h);
    let out = Command::new(&argv[0]).args(&argv[1..]).args(["sh", "-c", script]).output().unwrap();
    assert!(out.status.success(), "{script} on host {h}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn three_hosts_two_rails_shaped() {
    let rate = "200mbit";
    let spec = Spec { hosts: 3, per_host: 1, rails: 2, rate: Some(rate.into()) };
    let c = match Cluster::create(&spec) {
        Ok(c) => c,
        Err(why) => return oxccl_testkit::skip("three_hosts_two_rails_shaped", "network namespaces", &why),
    };
    let names: Vec<String> = (0..3).map(|h| c.ns(h).to_string()).collect();

    // Each host is its own machine: hostname, TMPDIR, and the rails' interfaces by name.
    for h in 0..3 {
        let seen =
            in_host(&c, h, "hostname; echo $TMPDIR; test -d $TMPDIR && echo ok; ls /sys/class/net | sort");
        let want = format!("{}\n{}\nok\nlo\nrail0\nrail1", c.ns(h), c.tmpdir(h).display());
        assert_eq!(seen, want, "host {h}");
    }

    // Every host reaches every other on every rail (from its own address on that rail).
    let mut port = 7000;
    for rail in 0..2 {
        for to in 0..3 {
            let from: Vec<usize> = (0..3).filter(|f| *f != to).collect();
            let s = sink(&names[to], c.addr(to, rail), port, from.len());
            let senders: Vec<_> =
                from.iter().map(|f| send(&names[*f], c.addr(to, rail), port, 1000)).collect();
            for t in senders {
                t.join().unwrap();
            }
            assert_eq!(s.join().unwrap(), vec![1000; from.len()], "rail {rail}, into host {to}");
            port += 1;
        }
    }

    // One stream: 4 MB at 200 Mbit/s takes at least 160 ms less the token bucket's burst (the
    // link's rate bounds its payload), and not so much more that the shaping starves a single
    // stream.
    let bits = rate_bits(rate).unwrap();
    let bytes = 4_000_000usize;
    let burst = burst_bytes(bits) as f64;
    let floor = (bytes as f64 - burst) * 8.0 / bits as f64;
    for rail in 0..2 {
        let s = sink(&names[1], c.addr(1, rail), port, 1);
        let t0 = Instant::now();
        send(&names[0], c.addr(1, rail), port, bytes).join().unwrap();
        assert_eq!(s.join().unwrap(), vec![bytes as u64]);
        let dt = t0.elapsed().as_secs_f64();
        oxccl_testkit::report!(
            "rail {rail}: one stream, {bytes} B in {:.0} ms: {:.0} Mbit/s at {rate}",
            dt * 1e3,
            bytes as f64 * 8.0 / dt / 1e6
        );
        assert!(dt >= floor, "rail {rail}: {bytes} B took {dt:.3} s, under the {floor:.3} s the rate allows");
        assert!(
            dt <= floor * 3.0,
            "rail {rail}: {bytes} B took {dt:.3} s, over 3x the {floor:.3} s of the rate"
        );
        port += 1;
    }

    // Two streams out of host 0 (to hosts 1 and 2) share its link: both together take at
    // least the time of both payloads at the rate.
    let (s1, s2) = (sink(&names[1], c.addr(1, 0), port, 1), sink(&names[2], c.addr(2, 0), port, 1));
    let t0 = Instant::now();
    let a = send(&names[0], c.addr(1, 0), port, bytes);
    let b = send(&names[0], c.addr(2, 0), port, bytes);
    a.join().unwrap();
    b.join().unwrap();
    assert_eq!((s1.join().unwrap(), s2.join().unwrap()), (vec![bytes as u64], vec![bytes as u64]));
    let dt = t0.elapsed().as_secs_f64();
    oxccl_testkit::report!("two streams out of host 0: 2 x {bytes} B in {:.0} ms", dt * 1e3);
    let floor2 = (2.0 * bytes as f64 - burst) * 8.0 / bits as f64;
    assert!(dt >= floor2, "two streams out of one host took {dt:.3} s, under the {floor2:.3} s of its link");
    assert!(dt <= floor2 * 3.0, "two streams out of one host took {dt:.3} s, over 3x the {floor2:.3} s");

    drop(c);
    let left = netns_list();
    for n in &names {
        assert!(!left.contains(n.as_str()), "{n} still in `ip netns list`:\n{left}");
    }
    let tag = names[0].trim_end_matches("-h0");
    assert!(!left.contains(tag), "a namespace of {tag} is left:\n{left}");
    assert!(!std::path::Path::new(&std::env::temp_dir().join(tag)).exists(), "the scratch directory is left");
}

/// Namespaces named for a process that is gone are swept; a live process's are not.
#[test]
fn stale_namespaces_are_swept() {
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = format!("oxc{dead}-0-h0");
    let live = format!("oxc{}-999-h0", std::process::id());
    for ns in [&stale, &live] {
        let out = Command::new("ip").args(["netns", "add", ns]).output().unwrap();
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr).into_owned();
            let _ = Command::new("ip").args(["netns", "del", &stale]).output();
            return oxccl_testkit::skip("stale_namespaces_are_swept", "network namespaces", &why);
        }
    }
    let removed = oxccl_testkit::cluster::sweep_stale();
    let left = netns_list();
    let _ = Command::new("ip").args(["netns", "del", &live]).output();
    assert!(removed.contains(&stale), "{stale} not swept: {removed:?}");
    assert!(!removed.contains(&live), "{live} (this live process's) was swept");
    assert!(!left.contains(stale.as_str()), "{stale} still listed:\n{left}");
    assert!(left.contains(live.as_str()), "{live} gone:\n{left}");
}
