//! Which network interface the bootstrap and TCP transport use: NCCL's rules.
//!
//! `NCCL_SOCKET_IFNAME` is a comma-separated list of interface name prefixes; a leading `^`
//! excludes the listed names instead of selecting them, and a leading `=` (after any `^`)
//! makes the names exact instead of prefixes: `eth`, `=eth0`, `^docker,lo`, `^=docker0`.
//! Without it, the order is: `ib*` interfaces, then any interface except `docker*`, `lo` and
//! `virbr*`, then `docker*`/`virbr*`, then `lo`; among equals, one whose subnet contains the
//! rendezvous root's address comes first. IPv4 is preferred unless `NCCL_SOCKET_FAMILY` says
//! otherwise; IPv6 link-local addresses are never used (they need a scope to be reachable).

use crate::error::CoreError;
use std::net::IpAddr;

/// One address of one interface, as the OS reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub addr: IpAddr,
    pub prefix_len: u8,
    pub up: bool,
}

/// An address family restriction (`NCCL_SOCKET_FAMILY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// Parses `AF_INET` / `AF_INET6` (also `4` / `6`).
    pub fn parse(s: &str) -> Option<Family> {
        match s.trim() {
            "AF_INET" | "4" | "ipv4" => Some(Family::V4),
            "AF_INET6" | "6" | "ipv6" => Some(Family::V6),
            _ => None,
        }
    }

    fn matches(self, a: &IpAddr) -> bool {
        matches!((self, a), (Family::V4, IpAddr::V4(_)) | (Family::V6, IpAddr::V6(_)))
    }
}

/// A parsed `NCCL_SOCKET_IFNAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfSpec {
    pub exclude: bool,
    pub exact: bool,
    pub names: Vec<String>,
}

impl IfSpec {
    /// Parses the variable's value.
    pub fn parse(s: &str) -> IfSpec {
        let mut s = s.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        IfSpec {
            exclude,
            exact,
            names: s.split(',').map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect(),
        }
    }

    /// Whether interface `name` is selected.
    pub fn matches(&self, name: &str) -> bool {
        let hit =
            self.names.iter().any(|n| if self.exact { name == n } else { name.starts_with(n.as_str()) });
        hit != self.exclude
    }
}

fn default_class(name: &str) -> u8 {
    if name.starts_with("ib") {
        0
    } else if name == "lo" || name.starts_with("lo:") {
        3
    } else if name.starts_with("docker") || name.starts_with("virbr") {
        2
    } else {
        1
    }
}

fn in_subnet(a: &IpAddr, prefix: u8, b: &IpAddr) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let m = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix.min(32)) };
            u32::from(*a) & m == u32::from(*b) & m
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let m = if prefix == 0 { 0 } else { u128::MAX << (128 - prefix.min(128)) };
            u128::from(*a) & m == u128::from(*b) & m
        }
        _ => false,
    }
}

fn usable(i: &Iface) -> bool {
    match i.addr {
        IpAddr::V6(a) => i.up && (a.segments()[0] & 0xffc0) != 0xfe80,
        IpAddr::V4(_) => i.up,
    }
}

/// Picks the interface address to use. `root` is the rendezvous address when known (ranks
/// prefer an interface on its subnet). The error lists every interface there is.
pub fn select<'a>(
    ifaces: &'a [Iface],
    spec: Option<&IfSpec>,
    family: Option<Family>,
    root: Option<IpAddr>,
) -> Result<&'a Iface, CoreError> {
    let mut cands: Vec<&Iface> = ifaces
        .iter()
        .filter(|i| usable(i))
        .filter(|i| family.is_none_or(|f| f.matches(&i.addr)))
        .filter(|i| spec.is_none_or(|s| s.matches(&i.name)))
        .collect();
    // Stable sort: the OS order breaks ties.
    cands.sort_by_key(|i| {
        let class = if spec.is_some() { 0 } else { default_class(&i.name) };
        let subnet = root.is_some_and(|r| in_subnet(&i.addr, i.prefix_len, &r));
        let v6 = matches!(i.addr, IpAddr::V6(_));
        (!subnet, class, v6)
    });
    cands.first().copied().ok_or_else(|| {
        let mut names: Vec<String> = ifaces
            .iter()
            .map(|i| format!("{}={}{}", i.name, i.addr, if i.up { "" } else { "(down)" }))
            .collect();
        names.dedup();
        let wanted = match spec {
            Some(s) => format!(
                "NCCL_SOCKET_IFNAME={}{}{}",
                if s.exclude { "^" } else { "" },
                if s.exact { "=" } else { "" },
                s.names.join(",")
            ),
            None => "any interface".to_string(),
        };
        let fam = match family {
            Some(Family::V4) => " with an IPv4 address",
            Some(Family::V6) => " with an IPv6 address",
            None => "",
        };
        CoreError::InvalidArgument {
            arg: "NCCL_SOCKET_IFNAME",
            reason: format!(
                "no usable interface matches {wanted}{fam}; interfaces present: {}",
                if names.is_empty() { "none".to_string() } else { names.join(", ") }
            ),
        }
    })
}

/// Most rails (interfaces spread over) a rank uses; the wire carries at most this many.
pub const MAX_RAILS: usize = 8;

/// The rails: where `NCCL_SOCKET_IFNAME` names interfaces (not `^` exclusions), every usable
/// interface it matches with the chosen address's family, one address each, ordered by
/// interface name (so rail `r` is the same network on every host that names its interfaces
/// alike, as NCCL assumes of its NICs), at most [`MAX_RAILS`]. Fewer than two: none (the
/// chosen address carries everything).
pub fn rails<'a>(ifaces: &'a [Iface], spec: Option<&IfSpec>, chosen: IpAddr) -> Vec<&'a Iface> {
    let Some(spec) = spec.filter(|s| !s.exclude) else { return Vec::new() };
    let v6 = matches!(chosen, IpAddr::V6(_));
    let mut out: Vec<&Iface> = ifaces
        .iter()
        .filter(|i| usable(i) && matches!(i.addr, IpAddr::V6(_)) == v6 && spec.matches(&i.name))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup_by(|a, b| a.name == b.name);
    out.truncate(MAX_RAILS);
    if out.len() < 2 || !out.iter().any(|i| i.addr == chosen) {
        return Vec::new();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifs() -> Vec<Iface> {
        let mk =
            |n: &str, a: &str, p| Iface { name: n.into(), addr: a.parse().unwrap(), prefix_len: p, up: true };
        vec![
            mk("lo", "127.0.0.1", 8),
            mk("docker0", "172.17.0.1", 16),
            mk("eth0", "192.0.2.2", 24),
            mk("eth0", "fe80::1", 64),
            mk("eth1", "10.0.0.5", 24),
            mk("eth10", "10.9.0.5", 16),
            mk("ib0", "10.20.0.1", 16),
        ]
    }

    #[test]
    fn spec_rules() {
        let s = IfSpec::parse("eth");
        assert!(s.matches("eth0") && s.matches("eth10") && !s.matches("ib0"));
        let s = IfSpec::parse("=eth1");
        assert!(s.matches("eth1") && !s.matches("eth10"));
        let s = IfSpec::parse("^docker,lo");
        assert!(!s.matches("docker0") && !s.matches("lo") && s.matches("eth0"));
        let s = IfSpec::parse("^=eth1");
        assert!(!s.matches("eth1") && s.matches("eth10"));
    }

    #[test]
    fn default_order_and_subnet_preference() {
        let i = ifs();
        assert_eq!(select(&i, None, None, None).unwrap().name, "ib0");
        let no_ib: Vec<Iface> = i.iter().filter(|x| x.name != "ib0").cloned().collect();
        assert_eq!(select(&no_ib, None, None, None).unwrap().name, "eth0");
        let root = "10.9.3.3".parse().ok();
        assert_eq!(select(&no_ib, None, None, root).unwrap().name, "eth10");
        let only_lo = vec![i[0].clone(), i[1].clone()];
        assert_eq!(select(&only_lo, None, None, None).unwrap().name, "docker0");
        let s = IfSpec::parse("=eth1");
        assert_eq!(select(&i, Some(&s), None, None).unwrap().addr.to_string(), "10.0.0.5");
        // The link-local IPv6 address of eth0 is never chosen.
        assert!(select(&i, Some(&IfSpec::parse("=eth0")), Some(Family::V6), None).is_err());
    }

    #[test]
    fn no_match_lists_interfaces() {
        let i = ifs();
        let e = select(&i, Some(&IfSpec::parse("=nope0")), None, None).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("NCCL_SOCKET_IFNAME==nope0"), "{m}");
        assert!(m.contains("eth0=192.0.2.2") && m.contains("lo=127.0.0.1"), "{m}");
    }

    #[test]
    fn rails_are_the_named_interfaces_in_name_order() {
        let mk =
            |n: &str, a: &str| Iface { name: n.into(), addr: a.parse().unwrap(), prefix_len: 24, up: true };
        let l = vec![
            mk("rail1", "10.2.0.1"),
            mk("lo", "127.0.0.1"),
            mk("rail0", "10.1.0.1"),
            mk("rail0", "10.1.9.9"),
            mk("rail1", "fd00::1"),
        ];
        let spec = IfSpec::parse("rail");
        let names = |v: Vec<&Iface>| v.iter().map(|i| format!("{}={}", i.name, i.addr)).collect::<Vec<_>>();
        let chosen: IpAddr = "10.1.0.1".parse().unwrap();
        assert_eq!(names(rails(&l, Some(&spec), chosen)), ["rail0=10.1.0.1", "rail1=10.2.0.1"]);
        // No explicit list, an exclusion, one match, or a chosen address outside them: none.
        assert!(rails(&l, None, chosen).is_empty());
        assert!(rails(&l, Some(&IfSpec::parse("^lo")), chosen).is_empty());
        assert!(rails(&l, Some(&IfSpec::parse("rail1")), "10.2.0.1".parse().unwrap()).is_empty());
        assert!(rails(&l, Some(&spec), "127.0.0.1".parse().unwrap()).is_empty());
    }
}
