//! Two "hosts" on one machine: network namespaces joined by a veth pair, made and removed by
//! the test (root only; tests skip with the reason where namespaces cannot be made, which
//! under `OXCCL_REQUIRE_ALL=1` is a failure: see [`crate::skip`]). Also a lossy link made in
//! user space, and the test of whether this kernel lacks `tc netem` altogether.

use std::process::Command;

/// Two namespaces `a` and `b` with `lo` up and a veth pair between them.
pub struct TwoHosts {
    pub a: String,
    pub b: String,
    /// The veth ends in `a` and `b`.
    pub dev_a: String,
    pub dev_b: String,
    pub addr_a: String,
    pub addr_b: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("`ip {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl TwoHosts {
    /// Creates the namespaces; `Err` says why they cannot be made here.
    pub fn create() -> Result<TwoHosts, String> {
        // Unique per process and per call (tests of one binary may run side by side).
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = (std::process::id() * 7 + n) % 100_000;
        let (a, b) = (format!("oxA{id}"), format!("oxB{id}"));
        let (va, vb) = (format!("oxa{id}"), format!("oxb{id}"));
        let net = 10 + (id % 200);
        let hosts = TwoHosts {
            a: a.clone(),
            b: b.clone(),
            dev_a: va.clone(),
            dev_b: vb.clone(),
            addr_a: format!("10.{net}.7.1"),
            addr_b: format!("10.{net}.7.2"),
        };
        ip(&["netns", "add", &a])?;
        let setup = || -> Result<(), String> {
            ip(&["netns", "add", &b])?;
            ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
            ip(&["link", "set", &va, "netns", &a])?;
            ip(&["link", "set", &vb, "netns", &b])?;
            ip(&["-n", &a, "addr", "add", &format!("{}/24", hosts.addr_a), "dev", &va])?;
            ip(&["-n", &b, "addr", "add", &format!("{}/24", hosts.addr_b), "dev", &vb])?;
            for (ns, dev) in [(&a, &va), (&b, &vb)] {
                ip(&["-n", ns, "link", "set", dev, "up"])?;
                ip(&["-n", ns, "link", "set", "lo", "up"])?;
            }
            Ok(())
        };
        if let Err(e) = setup() {
            hosts.remove();
            return Err(e);
        }
        Ok(hosts)
    }

    /// The command prefix that runs a program in namespace `ns`.
    pub fn exec_in(ns: &str) -> Vec<String> {
        vec!["ip".into(), "netns".into(), "exec".into(), ns.into()]
    }

    fn remove(&self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Why `tc netem` cannot exist on this machine, given the error `tc qdisc add ... netem` gave
/// (as root): `Some` only when the kernel itself refused the qdisc kind (neither built in nor
/// loadable), with the kernel configuration's word on `CONFIG_NET_SCH_NETEM` where readable;
/// `None` for any other failure (no `tc`, no permission), which a machine can be given.
pub fn netem_absence(tc_error: &str) -> Option<String> {
    if !tc_error.contains("qdisc kind is unknown") {
        return None;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let config = Command::new("gzip")
        .args(["-dc", "/proc/config.gz"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .or_else(|| std::fs::read_to_string(format!("/boot/config-{}", release.trim())).ok());
    let word = config
        .as_deref()
        .and_then(|c| c.lines().find(|l| l.contains("CONFIG_NET_SCH_NETEM")).map(str::to_string))
        .unwrap_or_else(|| "kernel configuration not readable".into());
    Some(format!("kernel {}: tc: {}; {word}", release.trim(), tc_error.trim()))
}

/// Two namespaces joined by a lossy, slow link made in user space: a TUN device in each, and
/// a forwarder thread per direction that drops a share of the IP packets and delays the rest
/// (what `tc netem` does, for kernels without it). Removed on drop.
pub struct LossyHosts {
    pub a: String,
    pub b: String,
    pub dev_a: String,
    pub dev_b: String,
    pub addr_a: String,
    pub addr_b: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<(u64, u64)>>,
}

#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// A TUN device named `name` (IP packets, no header), in this process's namespace.
fn tun(name: &str) -> Result<std::os::fd::OwnedFd, String> {
    use std::os::fd::FromRawFd;
    // SAFETY: open(2) of a fixed path; the descriptor is owned below.
    let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(format!("open /dev/net/tun: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fd was just opened and is owned by nothing else.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let mut req =
        IfReq { name: [0; 16], flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short, _pad: [0; 22] };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads an ifreq of the right layout from a live local.
    if unsafe { libc::ioctl(fd, 0x4004_54ca, &mut req) } < 0 {
        return Err(format!("TUNSETIFF {name}: {}", std::io::Error::last_os_error()));
    }
    Ok(owned)
}

/// Moves packets from `src` to `dst`, dropping `loss_pct`% and delaying the rest by `delay`;
/// returns (forwarded, dropped).
fn forward(
    src: std::os::fd::OwnedFd,
    dst: std::os::fd::OwnedFd,
    loss_pct: u64,
    delay: std::time::Duration,
    seed: u64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (u64, u64) {
    use std::os::fd::AsRawFd;
    let mut queue: std::collections::VecDeque<(std::time::Instant, Vec<u8>)> = Default::default();
    let (mut fwd, mut dropped, mut x) = (0u64, 0u64, seed | 1);
    let mut buf = vec![0u8; 65536];
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let now = std::time::Instant::now();
        while queue.front().is_some_and(|(t, _)| *t <= now) {
            let Some((_, p)) = queue.pop_front() else { break };
            // SAFETY: writes a live buffer to an open TUN descriptor.
            unsafe { libc::write(dst.as_raw_fd(), p.as_ptr().cast(), p.len()) };
            fwd += 1;
        }
        let wait =
            queue.front().map_or(20, |(t, _)| t.saturating_duration_since(now).as_millis().max(1) as i32);
        let mut pfd = libc::pollfd { fd: src.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: polls one live pollfd.
        if unsafe { libc::poll(&mut pfd, 1, wait.min(20)) } <= 0 {
            continue;
        }
        // SAFETY: reads into a live buffer from an open TUN descriptor.
        let n = unsafe { libc::read(src.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            continue;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if x % 100 < loss_pct {
            dropped += 1;
            continue;
        }
        queue.push_back((std::time::Instant::now() + delay, buf[..n as usize].to_vec()));
    }
    (fwd, dropped)
}

impl LossyHosts {
    /// Namespaces `a` and `b` whose link loses `loss_pct`% of packets each way and delays the
    /// others by `delay` each way.
    pub fn create(loss_pct: u64, delay: std::time::Duration) -> Result<LossyHosts, String> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = (std::process::id() * 7 + n + 50_000) % 100_000;
        let net = 10 + (id % 200);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut h = LossyHosts {
            a: format!("oxLA{id}"),
            b: format!("oxLB{id}"),
            dev_a: format!("oxta{id}"),
            dev_b: format!("oxtb{id}"),
            addr_a: format!("10.{net}.9.1"),
            addr_b: format!("10.{net}.9.2"),
            stop: stop.clone(),
            threads: Vec::new(),
        };
        ip(&["netns", "add", &h.a])?;
        let setup = |h: &mut LossyHosts| -> Result<(), String> {
            ip(&["netns", "add", &h.b])?;
            let (ta, tb) = (tun(&h.dev_a)?, tun(&h.dev_b)?);
            for (ns, dev, me, peer) in
                [(&h.a, &h.dev_a, &h.addr_a, &h.addr_b), (&h.b, &h.dev_b, &h.addr_b, &h.addr_a)]
            {
                ip(&["link", "set", dev, "netns", ns])?;
                ip(&["-n", ns, "addr", "add", me, "peer", peer, "dev", dev])?;
                ip(&["-n", ns, "link", "set", dev, "up"])?;
                ip(&["-n", ns, "link", "set", "lo", "up"])?;
            }
            let dup = |f: &std::os::fd::OwnedFd| f.try_clone().map_err(|e| e.to_string());
            let (ta2, tb2) = (dup(&ta)?, dup(&tb)?);
            for (i, (src, dst)) in [(ta, tb2), (tb, ta2)].into_iter().enumerate() {
                let stop = h.stop.clone();
                h.threads.push(std::thread::spawn(move || {
                    forward(src, dst, loss_pct, delay, 77 + i as u64, stop)
                }));
            }
            Ok(())
        };
        // On failure `h` is dropped, which removes what was made.
        setup(&mut h)?;
        Ok(h)
    }

    /// Packets forwarded and dropped so far is only known at the end: stops the link and
    /// returns (forwarded, dropped) over both directions.
    pub fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut t = (0, 0);
        for th in self.threads.drain(..) {
            let (f, d) = th.join().unwrap_or((0, 0));
            t = (t.0 + f, t.1 + d);
        }
        t
    }
}

impl Drop for LossyHosts {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for th in self.threads.drain(..) {
            let _ = th.join();
        }
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}
