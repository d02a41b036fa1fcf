//! Two "hosts" on one machine: network namespaces joined by a veth pair, made and removed by
//! the test (root only; tests skip with the reason where namespaces cannot be made).

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
