//! An emulated cluster on one machine: H "hosts" (network namespaces), each with R links
//! ("rails") to R bridges in one more "switch" namespace, every link shaped in both directions
//! with `tc ... tbf` to a given rate. Made and removed by the caller (root only; `Err` says why
//! it cannot be made, for tests to skip with: see [`crate::skip`]).
//!
//! Rules:
//! 1. Nothing is added to the root namespace: the veth pairs are created inside the host and
//!    switch namespaces, so their names (`rail0`, `rail1` in every host; `h<h>r<r>` and
//!    `br<r>` in the switch) are short and never collide with another cluster's.
//! 2. Namespace names carry the creating process's id (`oxc<pid>-<n>-h<h>`, `oxc<pid>-<n>-sw`):
//!    clusters of parallel processes or tests never collide, and [`sweep_stale`] removes those
//!    of a process that died before its [`Drop`] ran.
//! 3. Each emulated host looks like its own machine to programs started with
//!    [`Cluster::exec_in`]: its network namespace, its own hostname (a UTS namespace per
//!    command, named as the host) and its own `TMPDIR` (a directory removed on drop).
//! 4. Shaping: the host's egress on its end of each link, its ingress as the egress of the
//!    switch's end; a token bucket whose burst holds a full 64 KiB GSO segment (smaller bursts
//!    cost a single TCP stream up to 10% at 1 Gbit/s, measured) and ≥ 1 ms at the rate.
//! 5. The ranks' environment says the shaped rate (`OXCCL_NET_GBIT`), as a real NIC's speed
//!    would be read from the kernel.
//! 6. Drop removes every namespace (which removes their links and bridges) and the scratch
//!    directory, and never panics.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// What to emulate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// Hosts (network namespaces), 1..=250.
    pub hosts: usize,
    /// Rank processes per host (for [`Cluster::rank_env`]), ≥ 1.
    pub per_host: usize,
    /// Links per host, each on its own bridge and subnet: 1 or 2.
    pub rails: usize,
    /// Each link's rate in each direction, in `tc`'s syntax ("1gbit", "100mbit"); `None`:
    /// unshaped veth links.
    pub rate: Option<String>,
}

/// The port [`Cluster::rank_env`] gives as `MASTER_PORT` (the namespaces are the cluster's
/// own, so no other program holds it).
pub const MASTER_PORT: u16 = 29500;

/// The prefix of every namespace this module makes.
const PREFIX: &str = "oxc";

/// A made cluster; removed on drop.
pub struct Cluster {
    spec: Spec,
    /// `oxc<pid>-<n>`: the prefix of this cluster's namespace names.
    tag: String,
    /// Host namespaces made so far (all of them once `create` returned).
    made: Vec<String>,
    switch_made: bool,
    scratch: PathBuf,
}

/// Bits per second of a `tc` rate ("1gbit", "500mbit", "10kbit", "1000bit", "125mbps"
/// meaning bytes per second, as in `tc`).
pub fn rate_bits(rate: &str) -> Result<u64, String> {
    let r = rate.trim().to_ascii_lowercase();
    let split = r.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(r.len());
    let (num, unit) = r.split_at(split);
    let v: f64 = num.parse().map_err(|_| format!("rate {rate:?}: expected a number and a unit, as 1gbit"))?;
    let mult = match unit {
        "bit" | "" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "tbit" => 1e12,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        _ => {
            return Err(format!(
                "rate {rate:?}: unknown unit {unit:?} (bit, kbit, mbit, gbit, tbit, or bps..gbps for bytes)"
            ))
        }
    };
    let bits = v * mult;
    if !(bits >= 8000.0 && bits.is_finite()) {
        return Err(format!("rate {rate:?}: at least 8kbit"));
    }
    Ok(bits as u64)
}

/// The token bucket's burst in bytes for `bits` per second (rule 4): 128 KiB, or 1 ms at the
/// rate when that is more.
pub fn burst_bytes(bits: u64) -> u64 {
    (128 << 10).max(bits / 8 / 1000)
}

fn run(args: &[&str]) -> Result<(), String> {
    let (prog, rest) = args.split_first().ok_or("empty command")?;
    let out = Command::new(prog).args(rest).output().map_err(|e| format!("cannot run `{prog}`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn check(spec: &Spec) -> Result<(), String> {
    if !(1..=250).contains(&spec.hosts) {
        return Err(format!("hosts {}: 1 to 250", spec.hosts));
    }
    if spec.per_host == 0 {
        return Err("per_host 0: a host needs at least one rank".into());
    }
    if !(1..=2).contains(&spec.rails) {
        return Err(format!("rails {}: 1 or 2", spec.rails));
    }
    if let Some(r) = &spec.rate {
        rate_bits(r)?;
    }
    Ok(())
}

impl Cluster {
    /// Makes the cluster; `Err` says why it cannot be made here (not root, no `ip` or `tc`,
    /// a bad spec). Whatever was made before a failure is removed.
    pub fn create(spec: &Spec) -> Result<Cluster, String> {
        check(spec)?;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("network namespaces need root (this process is not)".into());
        }
        // `exec_in` needs these on every host (the namespaces share this machine's files).
        for (prog, arg) in [("unshare", "--version"), ("hostname", "--version"), ("ip", "-V")] {
            if Command::new(prog).arg(arg).output().is_err() {
                return Err(format!("`{prog}` is not installed (the emulated hosts need it)"));
            }
        }
        static N: AtomicU32 = AtomicU32::new(0);
        let tag = format!("{PREFIX}{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let scratch = std::env::temp_dir().join(&tag);
        let mut c = Cluster { spec: spec.clone(), tag, made: Vec::new(), switch_made: false, scratch };
        // On failure `c` is dropped, which removes what was made.
        c.build()?;
        Ok(c)
    }

    fn build(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(&self.scratch)
            .map_err(|e| format!("cannot create {}: {e}", self.scratch.display()))?;
        let sw = self.switch_ns();
        run(&["ip", "netns", "add", &sw])?;
        self.switch_made = true;
        run(&["ip", "-n", &sw, "link", "set", "lo", "up"])?;
        for r in 0..self.spec.rails {
            let br = format!("br{r}");
            run(&["ip", "-n", &sw, "link", "add", &br, "type", "bridge"])?;
            run(&["ip", "-n", &sw, "link", "set", &br, "up"])?;
        }
        let shape = self.spec.rate.as_ref().map(|r| {
            let bits = rate_bits(r).unwrap_or(1_000_000_000);
            (r.clone(), format!("{}b", burst_bytes(bits)))
        });
        for h in 0..self.spec.hosts {
            let ns = self.ns_name(h);
            run(&["ip", "netns", "add", &ns])?;
            self.made.push(ns.clone());
            std::fs::create_dir_all(self.tmpdir(h))
                .map_err(|e| format!("cannot create TMPDIR of host {h}: {e}"))?;
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            for r in 0..self.spec.rails {
                let (dev, end, br) = (self.ifname(r), format!("h{h}r{r}"), format!("br{r}"));
                run(&[
                    "ip", "-n", &ns, "link", "add", &dev, "type", "veth", "peer", "name", &end, "netns", &sw,
                ])?;
                run(&["ip", "-n", &ns, "addr", "add", &format!("{}/16", self.addr(h, r)), "dev", &dev])?;
                run(&["ip", "-n", &ns, "link", "set", &dev, "up"])?;
                run(&["ip", "-n", &sw, "link", "set", &end, "master", &br, "up"])?;
                if let Some((rate, burst)) = &shape {
                    for (n, d) in [(&ns, &dev), (&sw, &end)] {
                        run(&[
                            "ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", d, "root", "tbf", "rate",
                            rate, "burst", burst, "latency", "10ms",
                        ])?;
                    }
                }
            }
        }
        Ok(())
    }

    /// What was asked for.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    fn switch_ns(&self) -> String {
        format!("{}-sw", self.tag)
    }

    fn ns_name(&self, host: usize) -> String {
        format!("{}-h{host}", self.tag)
    }

    /// Host `host`'s network namespace; also its hostname and `OXCCL_HOST_ID`.
    pub fn ns(&self, host: usize) -> &str {
        &self.made[host]
    }

    /// Host `host`'s IPv4 address on rail `rail`: `10.(77 + rail).0.(host + 1)`, one /16 per
    /// rail.
    pub fn addr(&self, host: usize, rail: usize) -> String {
        format!("10.{}.0.{}", 77 + rail, host + 1)
    }

    /// The interface of rail `rail`, named the same inside every host.
    pub fn ifname(&self, rail: usize) -> String {
        format!("rail{rail}")
    }

    /// The rails' interface names as a comma list (`NCCL_SOCKET_IFNAME`, `GLOO_SOCKET_IFNAME`).
    pub fn ifnames(&self) -> String {
        (0..self.spec.rails).map(|r| self.ifname(r)).collect::<Vec<_>>().join(",")
    }

    /// Host `host`'s temporary directory (its `TMPDIR`).
    pub fn tmpdir(&self, host: usize) -> PathBuf {
        self.scratch.join(format!("h{host}"))
    }

    /// A directory for the caller's files, removed with the cluster.
    pub fn scratch(&self) -> &Path {
        &self.scratch
    }

    /// The argv prefix that runs a command on host `host`: in its network namespace, with its
    /// hostname (a UTS namespace of its own) and its `TMPDIR`.
    pub fn exec_in(&self, host: usize) -> Vec<String> {
        let tmp = self.tmpdir(host);
        [
            "ip",
            "netns",
            "exec",
            self.ns(host),
            "env",
            &format!("TMPDIR={}", tmp.display()),
            "unshare",
            "--uts",
            "sh",
            "-c",
            "hostname \"$0\" && exec \"$@\"",
            self.ns(host),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// The environment of global rank `rank` (on host `rank / per_host`): torchrun's variables
    /// (rendezvous at host 0's rail-0 address), the host's identity and the rails' interfaces.
    pub fn rank_env(&self, rank: usize) -> Vec<(String, String)> {
        let k = self.spec.per_host;
        let host = rank / k;
        [
            ("OXCCL_HOST_ID", self.ns(host).to_string()),
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", (self.spec.hosts * k).to_string()),
            ("LOCAL_RANK", (rank % k).to_string()),
            ("LOCAL_WORLD_SIZE", k.to_string()),
            ("MASTER_ADDR", self.addr(0, 0)),
            ("MASTER_PORT", MASTER_PORT.to_string()),
            ("NCCL_SOCKET_IFNAME", self.ifnames()),
        ]
        .into_iter()
        .chain(self.net_gbit().map(|g| ("OXCCL_NET_GBIT", g)))
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Each link's shaped rate in Gbit/s, as oxccl's `OXCCL_NET_GBIT` takes it (the kernel
    /// reports a veth's speed as 10 Gbit/s, not the rate `tc` holds it to); `None` unshaped.
    pub fn net_gbit(&self) -> Option<String> {
        let bits = rate_bits(self.spec.rate.as_deref()?).ok()?;
        Some(format!("{}", bits as f64 / 1e9))
    }

    /// A test launch of one rank per (host, slot) across the cluster: each rank on its host
    /// with the host's identity, the rails named by `NCCL_SOCKET_IFNAME`, and the rendezvous
    /// through a unique id file (the scratch directory is shared by the namespaces).
    pub fn launch(&self, test: &str, scenario: &str) -> crate::spawn::Launch {
        let n = self.spec.hosts * self.spec.per_host;
        let mut l = crate::spawn::Launch::new(test, scenario, n)
            .env(
                "OXCCL_UNIQUE_ID_FILE",
                crate::spawn::Launch::scratch().join("unique-id").to_str().unwrap_or(""),
            )
            .env("NCCL_SOCKET_IFNAME", &self.ifnames());
        if let Some(g) = self.net_gbit() {
            l = l.env("OXCCL_NET_GBIT", &g);
        }
        for r in 0..n {
            l.wrap.push(self.exec_in(r / self.spec.per_host));
            l.rank_env.push(self.rank_env(r).into_iter().filter(|(k, _)| k == "OXCCL_HOST_ID").collect());
        }
        l
    }

    fn remove(&mut self) {
        let mut all: Vec<String> = std::mem::take(&mut self.made);
        if std::mem::take(&mut self.switch_made) {
            all.push(self.switch_ns());
        }
        for ns in &all {
            remove_ns(ns);
        }
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// Kills what still runs in `ns` (by pid; waiting up to 2 s for them to go) and deletes it.
fn remove_ns(ns: &str) {
    let pids = || -> Vec<i32> {
        Command::new("ip").args(["netns", "pids", ns]).output().map_or(Vec::new(), |o| {
            String::from_utf8_lossy(&o.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect()
        })
    };
    let mut left = pids();
    let t = std::time::Instant::now();
    while !left.is_empty() && t.elapsed() < std::time::Duration::from_secs(2) {
        for &pid in &left {
            // SAFETY: kill(2) of a pid that `ip netns pids` listed in our namespace.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        left = pids();
    }
    let _ = run(&["ip", "netns", "del", ns]);
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The creating pid in one of this module's namespace names (`oxc<pid>-<n>-...`).
fn owner_pid(ns: &str) -> Option<u32> {
    let rest = ns.strip_prefix(PREFIX)?;
    let (pid, tail) = rest.split_once('-')?;
    let (n, _) = tail.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

/// Removes the namespaces (and so their links and bridges) and scratch directories of
/// clusters whose creating process is gone; returns the namespaces removed.
pub fn sweep_stale() -> Vec<String> {
    let Ok(o) = Command::new("ip").args(["netns", "list"]).output() else { return Vec::new() };
    let mut removed = Vec::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let Some(ns) = line.split_whitespace().next() else { continue };
        let Some(pid) = owner_pid(ns) else { continue };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        remove_ns(ns);
        if let Some(tag) = ns.rsplit_once('-').map(|(t, _)| t) {
            let _ = std::fs::remove_dir_all(std::env::temp_dir().join(tag));
        }
        removed.push(ns.to_string());
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(hosts: usize, per_host: usize, rails: usize) -> Cluster {
        let spec = Spec { hosts, per_host, rails, rate: None };
        let tag = "oxc42-0".to_string();
        let made = (0..hosts).map(|h| format!("{tag}-h{h}")).collect();
        Cluster { spec, tag, made, switch_made: false, scratch: PathBuf::from("/nonexistent/oxc42-0") }
    }

    #[test]
    fn rates() {
        assert_eq!(rate_bits("1gbit"), Ok(1_000_000_000));
        assert_eq!(rate_bits("100mbit"), Ok(100_000_000));
        assert_eq!(rate_bits("2.5Gbit"), Ok(2_500_000_000));
        assert_eq!(rate_bits("125mbps"), Ok(1_000_000_000));
        assert!(rate_bits("fast").is_err());
        assert!(rate_bits("1gbyte").unwrap_err().contains("unknown unit"));
        assert!(rate_bits("10bit").unwrap_err().contains("at least"));
        assert_eq!(burst_bytes(1_000_000_000), 128 << 10);
        assert_eq!(burst_bytes(10_000_000_000), 1_250_000);
    }

    #[test]
    fn bad_specs_are_named() {
        let s = |hosts, per_host, rails| Spec { hosts, per_host, rails, rate: None };
        assert!(Cluster::create(&s(0, 1, 1)).err().unwrap().contains("hosts 0"));
        assert!(Cluster::create(&s(2, 0, 1)).err().unwrap().contains("per_host 0"));
        assert!(Cluster::create(&s(2, 1, 3)).err().unwrap().contains("rails 3"));
        let bad_rate = Spec { rate: Some("quick".into()), ..s(2, 1, 1) };
        assert!(Cluster::create(&bad_rate).err().unwrap().contains("quick"));
    }

    #[test]
    fn names_and_addresses() {
        let c = fake(3, 2, 2);
        assert_eq!(c.ns(2), "oxc42-0-h2");
        assert_eq!(c.switch_ns(), "oxc42-0-sw");
        assert_eq!(c.addr(0, 0), "10.77.0.1");
        assert_eq!(c.addr(2, 1), "10.78.0.3");
        assert_eq!((c.ifname(0), c.ifname(1)), ("rail0".to_string(), "rail1".to_string()));
        assert_eq!(c.ifnames(), "rail0,rail1");
        assert_eq!(c.tmpdir(1), PathBuf::from("/nonexistent/oxc42-0/h1"));
        assert_eq!(owner_pid("oxc42-0-h2"), Some(42));
        assert_eq!(owner_pid("oxc42-0-sw"), Some(42));
        assert_eq!(owner_pid("oxA123"), None);
        assert_eq!(owner_pid("oxcfoo-0-h1"), None);
        let e = c.exec_in(1);
        assert_eq!(e[..4], ["ip", "netns", "exec", "oxc42-0-h1"]);
        assert_eq!(e[5], "TMPDIR=/nonexistent/oxc42-0/h1");
        assert_eq!(e.last().unwrap(), "oxc42-0-h1");
        std::mem::forget(c);
    }

    #[test]
    fn rank_env_of_each_rank() {
        let c = fake(3, 2, 2);
        let env: std::collections::HashMap<_, _> = c.rank_env(3).into_iter().collect();
        let get = |k: &str| env.get(k).map(String::as_str);
        assert_eq!(get("OXCCL_HOST_ID"), Some("oxc42-0-h1"));
        assert_eq!(get("RANK"), Some("3"));
        assert_eq!(get("WORLD_SIZE"), Some("6"));
        assert_eq!(get("LOCAL_RANK"), Some("1"));
        assert_eq!(get("LOCAL_WORLD_SIZE"), Some("2"));
        assert_eq!(get("MASTER_ADDR"), Some("10.77.0.1"));
        assert_eq!(get("MASTER_PORT"), Some("29500"));
        assert_eq!(get("NCCL_SOCKET_IFNAME"), Some("rail0,rail1"));
        assert_eq!(env.len(), 8);
        let r4: std::collections::HashMap<_, _> = c.rank_env(4).into_iter().collect();
        assert_eq!(r4["OXCCL_HOST_ID"], "oxc42-0-h2");
        assert_eq!(r4["LOCAL_RANK"], "0");
        assert!(!r4.contains_key("OXCCL_NET_GBIT"));
        std::mem::forget(c);
        // A shaped cluster tells oxccl its links' rate.
        let mut c = fake(2, 1, 1);
        c.spec.rate = Some("500mbit".into());
        let r1: std::collections::HashMap<_, _> = c.rank_env(1).into_iter().collect();
        assert_eq!(r1["OXCCL_NET_GBIT"], "0.5");
        std::mem::forget(c);
    }
}
