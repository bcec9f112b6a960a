//! This machine's network interfaces: which addresses a receiver elsewhere could dial.

use std::net::IpAddr;

/// Non-loopback, non-link-local addresses of this machine's interfaces.
pub(crate) fn interface_addresses() -> Vec<IpAddr> {
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
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr whose family says which struct it is.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            let ip = match family {
                libc::AF_INET => {
                    // SAFETY: the family is AF_INET, so this is a sockaddr_in.
                    let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    Some(IpAddr::from(
                        u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                    ))
                }
                libc::AF_INET6 => {
                    // SAFETY: the family is AF_INET6, so this is a sockaddr_in6.
                    let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                }
                _ => None,
            };
            if let Some(ip) = ip.filter(usable) {
                if !out.contains(&ip) {
                    out.push(ip);
                }
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
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

    #[test]
    fn loopback_and_link_local_are_not_candidates() {
        assert!(!usable(&"127.0.0.1".parse().unwrap()));
        assert!(!usable(&"::1".parse().unwrap()));
        assert!(!usable(&"fe80::1".parse().unwrap()));
        assert!(!usable(&"169.254.1.1".parse().unwrap()));
        assert!(usable(&"192.0.2.1".parse().unwrap()));
    }
}
