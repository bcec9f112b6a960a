//! This machine's network interfaces: which addresses a receiver elsewhere could dial.

use std::net::IpAddr;

/// One address of one interface, with its netmask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IfAddr {
    /// The interface's address.
    pub ip: IpAddr,
    /// Its netmask (all ones when the kernel gave none).
    pub mask: IpAddr,
}

impl IfAddr {
    /// True when `ip` lies in this address's subnet: a host on the same link.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.ip, self.mask, ip) {
            (IpAddr::V4(a), IpAddr::V4(m), IpAddr::V4(b)) => {
                let m = u32::from(m);
                u32::from(a) & m == u32::from(b) & m
            }
            (IpAddr::V6(a), IpAddr::V6(m), IpAddr::V6(b)) => {
                let m = u128::from(m);
                u128::from(a) & m == u128::from(b) & m
            }
            _ => false,
        }
    }
}

/// Reads an IPv4 or IPv6 `sockaddr`, if it is one.
///
/// # Safety
/// `sa` is null or points to a valid `sockaddr` whose family says which struct it is.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: `sa` is valid per this function's contract; the family says which struct it is.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let sin = &*(sa as *const libc::sockaddr_in);
                Some(IpAddr::from(
                    u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                ))
            }
            libc::AF_INET6 => {
                let sin6 = &*(sa as *const libc::sockaddr_in6);
                Some(IpAddr::from(sin6.sin6_addr.s6_addr))
            }
            _ => None,
        }
    }
}

/// Every IPv4 and IPv6 address of this machine's interfaces, loopback included, with its netmask.
pub fn interfaces() -> Vec<IfAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        // SAFETY: ifa_addr and ifa_netmask are null or valid sockaddrs of the list.
        if let Some(ip) = unsafe { sockaddr_ip(ifa.ifa_addr) } {
            // SAFETY: as above.
            let mask = unsafe { sockaddr_ip(ifa.ifa_netmask) }.unwrap_or(match ip {
                IpAddr::V4(_) => IpAddr::from([255u8; 4]),
                IpAddr::V6(_) => IpAddr::from([255u8; 16]),
            });
            let entry = IfAddr { ip, mask };
            if !out.contains(&entry) {
                out.push(entry);
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// Non-loopback, non-link-local addresses of this machine's interfaces: what a receiver elsewhere could dial.
pub fn interface_addresses() -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    for ip in interfaces().into_iter().map(|i| i.ip).filter(usable) {
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// True when `ip` is this host or a host on a directly attached network: loopback, IPv6 link-local, or inside
/// the subnet of one of `ifaces`. Anything else is reached through a router and is not "on the LAN".
pub fn on_link(ip: IpAddr, ifaces: &[IfAddr]) -> bool {
    let ip = ip.to_canonical();
    match ip {
        IpAddr::V4(v4) if v4.is_loopback() => return true,
        IpAddr::V6(v6) if v6.is_loopback() || (v6.segments()[0] & 0xffc0) == 0xfe80 => return true,
        _ => {}
    }
    ifaces.iter().any(|i| i.contains(ip))
}

fn usable(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified(),
        IpAddr::V6(v6) => {
            !v6.is_loopback() && !v6.is_unspecified() && (v6.segments()[0] & 0xffc0) != 0xfe80
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(ip: &str, mask: &str) -> IfAddr {
        IfAddr {
            ip: ip.parse().unwrap(),
            mask: mask.parse().unwrap(),
        }
    }

    #[test]
    fn only_this_host_and_attached_subnets_are_on_link() {
        let ifaces = [
            net("192.168.7.20", "255.255.255.0"),
            net("fd00:1:2:3::9", "ffff:ffff:ffff:ffff::"),
        ];
        for ip in [
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "fe80::1234",
            "192.168.7.1",
            "192.168.7.254",
            "::ffff:192.168.7.5",
            "fd00:1:2:3::77",
        ] {
            assert!(on_link(ip.parse().unwrap(), &ifaces), "{ip} is on link");
        }
        for ip in [
            "192.168.8.1",
            "10.0.0.1",
            "8.8.8.8",
            "fd00:1:2:4::1",
            "2001:db8::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!on_link(ip.parse().unwrap(), &ifaces), "{ip} is routed");
        }
        assert!(
            !on_link("192.168.7.1".parse().unwrap(), &[]),
            "no interface, no LAN"
        );
    }

    #[test]
    fn this_machine_lists_its_loopback_with_a_mask() {
        let all = interfaces();
        assert!(
            all.iter().any(|i| i.ip.is_loopback()),
            "loopback is listed: {all:?}"
        );
    }

    #[test]
    fn loopback_and_link_local_are_not_candidates() {
        assert!(!usable(&"127.0.0.1".parse().unwrap()));
        assert!(!usable(&"::1".parse().unwrap()));
        assert!(!usable(&"fe80::1".parse().unwrap()));
        assert!(!usable(&"169.254.1.1".parse().unwrap()));
        assert!(usable(&"192.0.2.1".parse().unwrap()));
    }
}
