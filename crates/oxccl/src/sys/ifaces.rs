//! The machine's network interfaces and their addresses (`getifaddrs`).

use oxccl_core::ifname::Iface;
use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fn prefix_of(mask: *const libc::sockaddr) -> u8 {
    if mask.is_null() {
        return 0;
    }
    // SAFETY: a non-null netmask from getifaddrs points at a sockaddr of its family.
    unsafe {
        match (*mask).sa_family as i32 {
            libc::AF_INET => {
                let m = &*(mask as *const libc::sockaddr_in);
                u32::from_be(m.sin_addr.s_addr).count_ones() as u8
            }
            libc::AF_INET6 => {
                let m = &*(mask as *const libc::sockaddr_in6);
                m.sin6_addr.s6_addr.iter().map(|b| b.count_ones()).sum::<u32>() as u8
            }
            _ => 0,
        }
    }
}

/// Every IPv4 and IPv6 address of every interface, in the order the OS lists them.
pub fn list() -> io::Result<Vec<Iface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` walks the list getifaddrs returned, which stays valid until freed.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        // SAFETY: ifa_addr is non-null and points at a sockaddr of the family it names.
        let addr = unsafe {
            match (*ifa.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        out.push(Iface {
            name,
            addr,
            prefix_len: prefix_of(ifa.ifa_netmask),
            up: ifa.ifa_flags & libc::IFF_UP as u32 != 0,
        });
    }
    // SAFETY: frees the list getifaddrs allocated; nothing refers to it any more.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The speed the kernel reports for interface `name`, Gbit/s (`/sys/class/net/NAME/speed`,
/// in Mbit/s); `None` where it reports none (loopback, a link that is down, some virtual
/// interfaces) or the name is not a plain interface name.
pub fn speed_gbit(name: &str) -> Option<f64> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return None;
    }
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/speed")).ok()?;
    let mbit: i64 = text.trim().parse().ok()?;
    (mbit > 0).then(|| mbit as f64 / 1000.0)
}
