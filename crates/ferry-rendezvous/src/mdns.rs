//! LAN discovery over multicast DNS (`_ferry._tcp.local.`).
//!
//! A sender [`advertise`]s its listening port under its nameplate hash; a receiver on the same link [`browse`]s
//! for that hash and gets back candidate addresses to dial. What goes on the wire is public by nature (anyone on
//! the link sees it): the service instance `ferry-<first 16 hex of the hash>-<random>`, a random host name
//! `ferry-<random>.local.`, the addresses of every interface, the port, and the TXT record `h=<nameplate hash
//! hex>`, `v=1`. The code and its words never appear; the machine's own host name does not either.
//!
//! Discovery only *proposes* addresses. Anyone on the link can answer with the same hash (the nameplate space
//! is small, so the hash is guessable), so [`browse`] returns every matching candidate and the caller tries each
//! one: the SPAKE2 exchange on the full code inside the encrypted channel is what decides who the peer is, and a
//! spoofer fails it like any other wrong-code guess.
//!
//! All of this happens before any connection opens, so the pseudorandom wire of the channel is untouched; the
//! records reveal only that a ferry sender waits on this host for some nameplate. `--no-discovery` (the CLI's
//! job) keeps even that off the link by never calling this module.
//!
//! Each call runs its own `mdns-sd` daemon thread bound to UDP 5353 (shared with other responders through
//! `SO_REUSEADDR`/`SO_REUSEPORT`) on every interface that has an address, loopback included.

use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::time::{Duration, Instant};

use mdns_sd::{
    RecvTimeoutError, ResolvedService, ScopedIp, ServiceDaemon, ServiceEvent, ServiceInfo,
};
use thiserror::Error;

use crate::NameplateHash;

/// The DNS-SD service type ferry advertises and browses.
pub const SERVICE_TYPE: &str = "_ferry._tcp.local.";
/// The TXT key carrying the full nameplate hash in lowercase hex.
pub const TXT_HASH: &str = "h";
/// The TXT key carrying the discovery record version.
pub const TXT_VERSION: &str = "v";
/// The discovery record version this code writes and the only one it accepts.
pub const VERSION: &str = "1";
/// Most candidate addresses [`browse`] returns; more answers than this are ignored.
pub const MAX_CANDIDATES: usize = 16;
/// After the first matching answer, [`browse`] keeps listening until this long passes without a new candidate,
/// so that other responders to the same query (mdns-sd delays shared answers by 10-50 ms) are collected too.
pub const GRACE: Duration = Duration::from_millis(100);

/// How long dropping an [`Advertisement`] or ending a [`browse`] waits for the daemon thread to say goodbye.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);
/// Hex digits of the nameplate hash shown in the instance name (the TXT record carries all of it).
const NAME_HASH_HEX: usize = 16;

/// Discovery could not run.
#[derive(Debug, Error)]
pub enum DiscoveryError {
    /// The mDNS daemon could not start or refused a command.
    #[error("mdns: {0}")]
    Daemon(#[from] mdns_sd::Error),
    /// The mDNS daemon thread stopped before anything was found (for example: no usable multicast socket).
    #[error("mdns daemon stopped")]
    Stopped,
}

/// A live advertisement of `_ferry._tcp` on the local links.
///
/// Dropping it unregisters the service (goodbye packets, so browsers forget it at once) and shuts its daemon
/// thread down, waiting up to a second for that to finish.
pub struct Advertisement {
    daemon: ServiceDaemon,
    fullname: String,
}

impl Advertisement {
    /// The full DNS-SD instance name, e.g. `ferry-0123456789abcdef-1a2b3c4d._ferry._tcp.local.`.
    pub fn instance(&self) -> &str {
        &self.fullname
    }
}

impl std::fmt::Debug for Advertisement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Advertisement")
            .field("instance", &self.fullname)
            .finish_non_exhaustive()
    }
}

impl Drop for Advertisement {
    fn drop(&mut self) {
        // The daemon's shutdown sends goodbyes for every registered service before it reports back.
        shut_down(&self.daemon);
    }
}

/// Advertises that a ferry sender waits on `port` for the nameplate `hash`, on every interface's addresses.
///
/// Returns at once; the daemon thread announces the service right away (no probing: the instance and host names
/// carry random suffixes, so two senders with the same nameplate on one link do not collide) and answers queries
/// until the [`Advertisement`] is dropped. Addresses follow the interfaces as they come and go.
pub fn advertise(hash: &NameplateHash, port: u16) -> Result<Advertisement, DiscoveryError> {
    let hex = hash.to_hex();
    let instance = instance_name(hash);
    let host = format!("ferry-{}.local.", random_hex::<8>());
    let txt = [(TXT_HASH, hex.as_str()), (TXT_VERSION, VERSION)];
    let mut info =
        ServiceInfo::new(SERVICE_TYPE, &instance, &host, "", port, &txt[..])?.enable_addr_auto();
    info.set_requires_probe(false);
    let fullname = info.get_fullname().to_string();

    let daemon = ServiceDaemon::new()?;
    if let Err(e) = daemon.register(info) {
        shut_down(&daemon);
        return Err(e.into());
    }
    Ok(Advertisement { daemon, fullname })
}

/// Browses the local links for senders advertising the nameplate `hash` and returns their addresses.
///
/// Returns as soon as at least one candidate was found and [`GRACE`] passed without another one, or when
/// [`MAX_CANDIDATES`] are collected, or empty when `timeout` runs out. IPv4 addresses come first, then IPv6
/// (link-local ones carry their interface as scope id). Answers whose TXT record is missing, malformed, of another
/// version or for another hash are ignored, as are unusable addresses (unspecified, multicast, broadcast, port 0)
/// and addresses that are not on a directly attached network ([`crate::netif::on_link`]: loopback, IPv6
/// link-local, or inside the subnet of one of this host's interfaces).
///
/// The daemon queries at once and repeats after about 1 s and 3 s, so a `timeout` of 2-3 s survives a lost
/// query or an advertiser that was still starting. This blocks the calling thread (use `spawn_blocking` from
/// async code).
///
/// Every candidate is only a proposal: the caller must authenticate whoever answers with the PAKE.
pub fn browse(hash: &NameplateHash, timeout: Duration) -> Result<Vec<SocketAddr>, DiscoveryError> {
    let deadline = Instant::now() + timeout;
    let daemon = ServiceDaemon::new()?;
    let events = match daemon.browse(SERVICE_TYPE) {
        Ok(events) => events,
        Err(e) => {
            shut_down(&daemon);
            return Err(e.into());
        }
    };

    let mut found = Candidates::new(*hash);
    let mut quiet_until: Option<Instant> = None;
    let mut stopped = false;
    while !found.is_full() {
        let until = quiet_until.map_or(deadline, |q| q.min(deadline));
        let Some(left) = until.checked_duration_since(Instant::now()) else {
            break;
        };
        match events.recv_timeout(left) {
            Ok(ServiceEvent::ServiceResolved(service)) => {
                if found.offer_service(&service) {
                    quiet_until = Some(Instant::now() + GRACE);
                }
            }
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => break,
            Err(RecvTimeoutError::Disconnected) => {
                stopped = true;
                break;
            }
        }
    }
    shut_down(&daemon);

    let found = found.into_addrs();
    if stopped && found.is_empty() {
        return Err(DiscoveryError::Stopped);
    }
    Ok(found)
}

/// Asks the daemon thread to stop (sending goodbyes for what it registered) and waits a bounded time for it.
fn shut_down(daemon: &ServiceDaemon) {
    if let Ok(status) = daemon.shutdown() {
        let _ = status.recv_timeout(SHUTDOWN_WAIT);
    }
}

/// `N` random bytes in lowercase hex.
fn random_hex<const N: usize>() -> String {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the system CSPRNG does not fail");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The instance name for a hash: a prefix of the hash (for people reading logs) and a random suffix.
fn instance_name(hash: &NameplateHash) -> String {
    format!(
        "ferry-{}-{}",
        &hash.to_hex()[..NAME_HASH_HEX],
        random_hex::<4>()
    )
}

/// Whether a TXT record (given as the values of its `h` and `v` keys) announces `hash` in our version.
///
/// `h` must be exactly 64 hex digits (either case) and `v` exactly [`VERSION`]; anything else is ignored.
fn txt_matches(hash: &NameplateHash, h: Option<Option<&[u8]>>, v: Option<Option<&[u8]>>) -> bool {
    let (Some(Some(h)), Some(Some(v))) = (h, v) else {
        return false;
    };
    v == VERSION.as_bytes() && parse_hash(h).is_some_and(|got| got == *hash)
}

/// Parses 64 hex digits into a hash.
fn parse_hash(hex: &[u8]) -> Option<NameplateHash> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        let digit = |c: u8| (c as char).to_digit(16);
        *byte = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(NameplateHash(out))
}

/// A resolved address as something to dial, keeping the interface of an IPv6 link-local address.
fn socket_addr(ip: &ScopedIp, port: u16) -> Option<SocketAddr> {
    let addr = match ip {
        ScopedIp::V6(v6) => {
            let a = *v6.addr();
            // Only link-local addresses need (and only they may carry) the scope to be dialable.
            let scope = if a.segments()[0] & 0xffc0 == 0xfe80 {
                v6.scope_id().index
            } else {
                0
            };
            SocketAddr::V6(SocketAddrV6::new(a, port, 0, scope))
        }
        other => SocketAddr::new(other.to_ip_addr(), port),
    };
    usable(&addr).then_some(addr)
}

/// Whether an address could be a peer at all.
fn usable(addr: &SocketAddr) -> bool {
    addr.port() != 0
        && match addr.ip() {
            IpAddr::V4(ip) => !(ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast()),
            IpAddr::V6(ip) => !(ip.is_unspecified() || ip.is_multicast()),
        }
}

/// The candidates collected so far: matching, deduplicated, bounded.
#[derive(Debug)]
struct Candidates {
    hash: NameplateHash,
    addrs: Vec<SocketAddr>,
    /// This host's interfaces, read when the browse starts: what "on link" means.
    ifaces: Vec<crate::netif::IfAddr>,
}

impl Candidates {
    fn new(hash: NameplateHash) -> Self {
        Candidates {
            hash,
            addrs: Vec::new(),
            ifaces: crate::netif::interfaces(),
        }
    }

    fn is_full(&self) -> bool {
        self.addrs.len() >= MAX_CANDIDATES
    }

    /// Takes the addresses of a resolved service if its TXT record matches; true when anything new was added.
    fn offer_service(&mut self, service: &ResolvedService) -> bool {
        let txt = &service.txt_properties;
        if !txt_matches(
            &self.hash,
            txt.get_property_val(TXT_HASH),
            txt.get_property_val(TXT_VERSION),
        ) {
            return false;
        }
        // Only addresses on a directly attached network: a spoofer's announcement naming a routed address
        // (anywhere on the internet) is never dialed, and cannot take a candidate slot either.
        let ifaces = &self.ifaces;
        let addrs: Vec<SocketAddr> = service
            .addresses
            .iter()
            .filter_map(|ip| socket_addr(ip, service.port))
            .filter(|a| crate::netif::on_link(a.ip(), ifaces))
            .collect();
        self.offer(addrs)
    }

    /// Adds new addresses up to the cap; true when anything new was added.
    fn offer(&mut self, addrs: impl IntoIterator<Item = SocketAddr>) -> bool {
        let before = self.addrs.len();
        for addr in addrs {
            if self.is_full() {
                break;
            }
            if !self.addrs.contains(&addr) {
                self.addrs.push(addr);
            }
        }
        self.addrs.len() > before
    }

    /// IPv4 first, then IPv6, each in the order they arrived.
    fn into_addrs(mut self) -> Vec<SocketAddr> {
        self.addrs.sort_by_key(|a| a.is_ipv6());
        self.addrs
    }
}

#[cfg(test)]
mod tests {
    //! Pure logic only: nothing here touches a socket (the multicast tests run in private namespaces, see
    //! `tests/mdns.rs`).
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn val(s: &str) -> Option<Option<&[u8]>> {
        Some(Some(s.as_bytes()))
    }

    #[test]
    fn txt_must_carry_the_exact_hash_and_version() {
        let hash = NameplateHash::of(7);
        let hex = hash.to_hex();
        assert!(txt_matches(&hash, val(&hex), val("1")));
        assert!(txt_matches(&hash, val(&hex.to_uppercase()), val("1")));
        assert!(!txt_matches(&NameplateHash::of(8), val(&hex), val("1")));
        assert!(!txt_matches(&hash, val(&hex), val("2")));
        assert!(!txt_matches(&hash, val(&hex), None));
        assert!(!txt_matches(&hash, val(&hex), Some(None)));
        assert!(!txt_matches(&hash, None, val("1")));
        assert!(!txt_matches(&hash, Some(None), val("1")));
        assert!(!txt_matches(&hash, val(&hex[..63]), val("1")));
        assert!(!txt_matches(&hash, val(&format!("{hex}0")), val("1")));
        assert!(!txt_matches(
            &hash,
            val(&format!("{}zz", &hex[..62])),
            val("1")
        ));
        assert!(!txt_matches(
            &hash,
            val(&format!("+{}", &hex[1..])),
            val("1")
        ));
        let multibyte = format!("é{}", &hex[2..]);
        assert_eq!(multibyte.len(), 64);
        assert!(!txt_matches(&hash, val(&multibyte), val("1")));
        assert!(!txt_matches(&hash, Some(Some(&[0xff; 64])), val("1")));
    }

    #[test]
    fn candidates_are_deduplicated_bounded_and_ipv4_first() {
        let mut c = Candidates::new(NameplateHash::of(1));
        let v6 = SocketAddr::new(Ipv6Addr::LOCALHOST.into(), 9);
        let v4 = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 9);
        assert!(c.offer([v6, v4, v4]));
        assert!(!c.offer([v6]));
        assert_eq!(c.addrs.len(), 2);
        let flood = (1..100).map(|p| SocketAddr::new(Ipv4Addr::new(10, 0, 0, 1).into(), p));
        assert!(c.offer(flood));
        assert!(c.is_full());
        assert!(!c.offer([SocketAddr::new(Ipv4Addr::new(10, 0, 0, 2).into(), 1)]));
        let addrs = c.into_addrs();
        assert_eq!(addrs.len(), MAX_CANDIDATES);
        assert_eq!(addrs[0], v4);
        assert_eq!(addrs.last(), Some(&v6));
        assert!(addrs[..MAX_CANDIDATES - 1].iter().all(SocketAddr::is_ipv4));
    }

    #[test]
    fn unusable_addresses_are_dropped_and_link_local_keeps_its_scope() {
        let any = ScopedIp::from(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let mcast = ScopedIp::from(IpAddr::V4(Ipv4Addr::new(224, 0, 0, 251)));
        let bcast = ScopedIp::from(IpAddr::V4(Ipv4Addr::BROADCAST));
        let v6any = ScopedIp::from(IpAddr::V6(Ipv6Addr::UNSPECIFIED));
        for ip in [any, mcast, bcast, v6any] {
            assert_eq!(socket_addr(&ip, 9), None, "{ip:?}");
        }
        let ok = ScopedIp::from(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)));
        assert_eq!(socket_addr(&ok, 0), None);
        assert_eq!(socket_addr(&ok, 9), Some("10.1.2.3:9".parse().unwrap()));
        let global = ScopedIp::from(IpAddr::V6("fd00::1".parse().unwrap()));
        assert_eq!(
            socket_addr(&global, 9),
            Some("[fd00::1]:9".parse().unwrap())
        );
    }

    #[test]
    fn the_instance_name_shows_only_a_hash_prefix() {
        let hash = NameplateHash::of(42);
        let hex = hash.to_hex();
        assert_eq!(parse_hash(hex.as_bytes()), Some(hash));
        let name = instance_name(&hash);
        assert_eq!(name.len(), "ferry-".len() + NAME_HASH_HEX + 1 + 8);
        assert!(name.starts_with(&format!("ferry-{}-", &hex[..NAME_HASH_HEX])));
        assert!(!name.contains(&hex));
        assert_ne!(
            instance_name(&hash),
            name,
            "two senders with one nameplate must not collide"
        );
    }
}
