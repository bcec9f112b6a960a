//! The link lab: emulated network paths between anonymous network namespaces, for `ferry bench
//! matrix` and for tests that need a real RTT, a real rate limit or real loss.
//!
//! This kernel has no netem, so the emulator is a packet-level delay line in user space ([`link`]):
//! each end namespace has a layer-3 tun device, and this process forwards every IP packet from one
//! device to the other through a drop-tail bottleneck queue with its own token bucket (the rate),
//! a FIFO holding each packet for the one-way delay, and random loss. Real TCP runs end to end:
//! its segments are what gets delayed, paced and dropped, so congestion control, retransmission
//! and window limits behave as on a real path.
//!
//! ```no_run
//! use ferry_lab::{Lab, Path};
//! let lab = Lab::build(&Path::by_name("wan").unwrap()).unwrap();
//! let listener = lab.server.enter(|| std::net::TcpListener::bind((lab.server_ip(), 0))).unwrap();
//! let addr = listener.local_addr().unwrap();
//! let conn = lab.client.enter(|| std::net::TcpStream::connect(addr)).unwrap();
//! // ... 24 ms RTT, 500 Mbit/s between `conn` and the accepted socket.
//! ```
//!
//! Every address exists only inside the lab's namespaces; nothing is added to this process's own
//! namespace, and when the [`Lab`] (or the process) goes, the kernel removes everything.
#![warn(missing_docs, unreachable_pub)]

pub mod link;
pub mod netns;
mod path;
mod tun;

use std::io;
use std::net::Ipv4Addr;

pub use link::{Link, LinkSpec};
pub use netns::Netns;
pub use path::{Path, PATHS};

/// Why a lab could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A network namespace could not be created (not root?).
    #[error("cannot create the {0} network namespace: {1}")]
    Namespace(&'static str, #[source] io::Error),
    /// A tun device could not be created.
    #[error("cannot create tun device {0} in {1}: {2}")]
    Tun(String, &'static str, #[source] io::Error),
    /// A setup command failed.
    #[error("{0}: {1}")]
    Command(String, String),
    /// A forwarding thread could not start.
    #[error("cannot start the link's threads: {0}")]
    Thread(#[from] io::Error),
    /// The path has no emulated link (loopback).
    #[error("path {0} is not emulated")]
    NotEmulated(&'static str),
}

impl From<LabError> for io::Error {
    /// The underlying OS error where there is one (so that `EPERM` stays recognisable), else the message.
    fn from(e: LabError) -> io::Error {
        match e {
            LabError::Namespace(_, e) | LabError::Tun(_, _, e) | LabError::Thread(e) => e,
            other => io::Error::other(other.to_string()),
        }
    }
}

/// Why this process cannot build a lab, if it cannot: root (namespaces, tun devices) and `ip`.
pub fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, tun devices)".into());
    }
    match std::process::Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => return Some(format!("`ip -V` failed: {:?}", o.status)),
        Err(e) => return Some(format!("`ip` (iproute2) is not usable: {e}")),
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun is missing (no tun driver)".into());
    }
    None
}

/// The client's address on a direct path.
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// The server's address on a direct path.
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
/// Client and relay on the relay path's first hop.
const HOP1: (Ipv4Addr, Ipv4Addr) = (Ipv4Addr::new(10, 77, 1, 1), Ipv4Addr::new(10, 77, 1, 2));
/// Server and relay on the relay path's second hop.
const HOP2: (Ipv4Addr, Ipv4Addr) = (Ipv4Addr::new(10, 77, 2, 1), Ipv4Addr::new(10, 77, 2, 2));

/// One emulated path: a client and a server namespace, joined directly by one link, or through a
/// relay namespace by two links in series (each with half the RTT, so that the path's RTT is the
/// configured one).
///
/// ```text
///   direct:  client 10.77.0.1 ══link══ 10.77.0.2 server
///   relay:   client 10.77.1.1 ══link══ 10.77.1.2 relay 10.77.2.2 ══link══ 10.77.2.1 server
/// ```
pub struct Lab {
    /// Where the connecting side (the receiver, the client) runs.
    pub client: Netns,
    /// Where the listening side (the sender, the server) runs.
    pub server: Netns,
    /// Where `ferry relay` runs, on a relay path.
    pub relay: Option<Netns>,
    /// The path this lab emulates.
    pub path: Path,
    // Dropped before the namespaces (field order): the threads stop while the devices exist.
    links: Vec<Link>,
}

impl Lab {
    /// Builds the namespaces, devices and links of `path`.
    pub fn build(path: &Path) -> Result<Lab, LabError> {
        let spec = path.link.ok_or(LabError::NotEmulated(path.name))?;
        let client = Netns::create("client")?;
        let server = Netns::create("server")?;
        let seed = 0x1ab5_eed0;
        if !path.relay {
            let a = end(&client, "lab0", CLIENT_IP, SERVER_IP)?;
            let b = end(&server, "lab0", SERVER_IP, CLIENT_IP)?;
            let links = vec![Link::start(a, b, spec, seed)?];
            return Ok(Lab {
                client,
                server,
                relay: None,
                path: *path,
                links,
            });
        }
        let relay = Netns::create("relay")?;
        let hop = spec.half_rtt();
        let c = end(&client, "lab0", HOP1.0, HOP1.1)?;
        let rc = end(&relay, "lab-c", HOP1.1, HOP1.0)?;
        let rs = end(&relay, "lab-s", HOP2.1, HOP2.0)?;
        let s = end(&server, "lab0", HOP2.0, HOP2.1)?;
        let links = vec![
            Link::start(c, rc, hop, seed)?,
            Link::start(rs, s, hop, seed + 1)?,
        ];
        Ok(Lab {
            client,
            server,
            relay: Some(relay),
            path: *path,
            links,
        })
    }

    /// The server's address as the client reaches it on a direct path.
    pub fn server_ip(&self) -> Ipv4Addr {
        SERVER_IP
    }

    /// The client's own address (on a relay path, on the first hop).
    pub fn client_ip(&self) -> Ipv4Addr {
        if self.relay.is_some() {
            HOP1.0
        } else {
            CLIENT_IP
        }
    }

    /// The relay's addresses: as the client reaches it, and as the server does.
    pub fn relay_ips(&self) -> Option<(Ipv4Addr, Ipv4Addr)> {
        self.relay.as_ref().map(|_| (HOP1.1, HOP2.1))
    }

    /// The running links: one on a direct path, two (client side first) through a relay.
    pub fn links(&self) -> &[Link] {
        &self.links
    }
}

/// A tun device `dev` in `ns` with address `local`, point-to-point to `peer`, up; its queue.
fn end(ns: &Netns, dev: &str, local: Ipv4Addr, peer: Ipv4Addr) -> Result<std::fs::File, LabError> {
    let file = tun::open_in(ns, dev)?;
    // A queue long enough that the kernel never drops before the emulator sees the packet: the
    // bottleneck and its drops are the emulator's.
    ns.ip(&format!(
        "addr add {local} peer {peer}/32 dev {dev}\n\
         link set {dev} mtu 1500 txqueuelen 10000 up\n"
    ))?;
    Ok(file)
}
