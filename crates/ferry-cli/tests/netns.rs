//! Both peers behind a masquerading NAT router, the relay on the "public" side: real `ferry` processes in
//! network namespaces that this test creates and alone uses.
//!
//! Topology (every address exists only inside these namespaces):
//!
//! ```text
//!   sender  10.200.1.2 ─┐
//!                        ├─ router (10.200.1.1, 10.200.2.1 │ masquerade out of `wan` 10.200.9.1) ── public 10.200.9.2 (relay)
//!   receiver 10.200.2.2 ─┘
//! ```
//!
//! The router forwards only new connections from its private side out of `wan` (masqueraded to
//! 10.200.9.1) and replies to them; everything else is rejected, as a home NAT does. So the peers cannot
//! reach each other directly, the public side cannot reach them, and the relay is the only path.
//!
//! The namespaces are anonymous: each is created by `unshare(CLONE_NEWNET)` on a short-lived thread and
//! held only by an open file in this process (and by the `ferry` processes started inside it). Nothing is
//! named in `/run/netns`, and no interface, route or firewall rule is added to this process's own
//! namespace; when the last holder goes, the kernel removes the namespace with its veths and nft table,
//! even if this process is killed.

mod common;

use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use common::*;
use ferry_lab::Netns;

const SENDER_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 1, 2);
const RECEIVER_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 2, 2);
/// The router's public-side address: what every connection from behind the NAT looks like outside.
const ROUTER_PUBLIC_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 9, 1);
const RELAY_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 9, 2);
/// How long a probe connection may take; a rejected one fails at once.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Skips (or, in CI, fails) the test `netns::{test}`.
fn skip(test: &str, reason: &str) {
    common::skip(&format!("netns::{test}"), reason);
}

/// Why this run cannot build the namespaces, if it cannot.
fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, veth pairs, nftables)".into());
    }
    for (tool, arg, package) in [("ip", "-V", "iproute2"), ("nft", "--version", "nftables")] {
        match Command::new(tool).arg(arg).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => return Some(format!("`{tool} {arg}` failed: {:?}", o.status)),
            Err(e) => return Some(format!("`{tool}` ({package}) is not usable: {e}")),
        }
    }
    None
}

/// The two private networks, the NAT router and the public side. Dropping it deletes the nft table and
/// the veths and closes the namespaces (which would take the rest with them anyway).
struct NatLab {
    sender: Netns,
    receiver: Netns,
    router: Netns,
    public: Netns,
    table: String,
}

impl NatLab {
    fn build() -> io::Result<NatLab> {
        let lab = NatLab {
            sender: Netns::create("sender")?,
            receiver: Netns::create("receiver")?,
            router: Netns::create("router")?,
            public: Netns::create("public")?,
            table: format!("ferry_nat_{}", std::process::id()),
        };
        // The veths are created inside the router, and one end of each moved out: at no moment does an
        // interface exist in this process's own namespace.
        lab.router.ip(&format!(
            "link set lo up\n\
             link add lan1 type veth peer name s-eth\n\
             link add lan2 type veth peer name r-eth\n\
             link add wan type veth peer name p-eth\n\
             link set s-eth netns {}\n\
             link set r-eth netns {}\n\
             link set p-eth netns {}\n\
             addr add 10.200.1.1/24 dev lan1\n\
             addr add 10.200.2.1/24 dev lan2\n\
             addr add {ROUTER_PUBLIC_IP}/24 dev wan\n\
             link set lan1 up\n\
             link set lan2 up\n\
             link set wan up\n",
            lab.sender.path(),
            lab.receiver.path(),
            lab.public.path(),
        ))?;
        lab.sender.ip(&format!(
            "link set lo up\n\
             addr add {SENDER_IP}/24 dev s-eth\n\
             link set s-eth up\n\
             route add default via 10.200.1.1\n"
        ))?;
        lab.receiver.ip(&format!(
            "link set lo up\n\
             addr add {RECEIVER_IP}/24 dev r-eth\n\
             link set r-eth up\n\
             route add default via 10.200.2.1\n"
        ))?;
        // The public side even routes the private range to the router, so that an inbound attempt is
        // stopped by the NAT itself, not merely by a missing route.
        lab.public.ip(&format!(
            "link set lo up\n\
             addr add {RELAY_IP}/24 dev p-eth\n\
             link set p-eth up\n\
             route add 10.200.0.0/16 via {ROUTER_PUBLIC_IP}\n"
        ))?;
        // /proc/sys/net belongs to the namespace of the thread that opens it.
        lab.router
            .enter(|| fs::write("/proc/sys/net/ipv4/ip_forward", "1"))?;
        lab.router.run(
            "nft",
            &["-f", "-"],
            &format!(
                r#"table ip {table} {{
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        oifname "wan" counter masquerade
    }}
    chain forward {{
        type filter hook forward priority filter; policy drop;
        ct state established,related accept
        iifname {{ "lan1", "lan2" }} oifname "wan" accept
        counter reject with icmp type admin-prohibited
    }}
}}
"#,
                table = lab.table
            ),
        )?;
        Ok(lab)
    }

    /// The packet count of the rule in `chain` of the router's table that has a counter.
    fn counter(&self, chain: &str) -> u64 {
        let json = self
            .router
            .run(
                "nft",
                &["-j", "list", "chain", "ip", &self.table, chain],
                "",
            )
            .expect("nft list chain");
        let v: Value = serde_json::from_str(&json).expect("nft JSON");
        v["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item["rule"]["expr"].as_array())
            .flatten()
            .find_map(|e| e["counter"]["packets"].as_u64())
            .unwrap_or_else(|| panic!("no counter in chain {chain}: {json}"))
    }

    /// New connections the router masqueraded (the nat chain sees the first packet of each).
    fn masqueraded(&self) -> u64 {
        self.counter("postrouting")
    }

    /// Packets the router refused to forward.
    fn rejected(&self) -> u64 {
        self.counter("forward")
    }

    /// Connects from `from` to a listener on the public side: (the client's own address, the address
    /// the public side saw it come from).
    fn observed_from_public(&self, from: &Netns) -> (SocketAddr, SocketAddr) {
        let listener = self
            .public
            .enter(|| TcpListener::bind((RELAY_IP, 0)))
            .expect("listen on the public side");
        let target = listener.local_addr().unwrap();
        let client = from
            .enter(|| TcpStream::connect_timeout(&target, PROBE_TIMEOUT))
            .unwrap_or_else(|e| panic!("{} cannot reach the public side: {e}", from.name()));
        let (_conn, seen) = listener.accept().expect("accept the probe");
        (client.local_addr().unwrap(), seen)
    }
}

impl Drop for NatLab {
    fn drop(&mut self) {
        let _ = self
            .router
            .run("nft", &["delete", "table", "ip", &self.table], "");
        // Deleting one end of a veth deletes the pair.
        for link in ["lan1", "lan2", "wan"] {
            let _ = self.router.run("ip", &["link", "del", link], "");
        }
    }
}

/// What this process's own network namespace looks like: it must be the same after the test.
fn own_namespace_snapshot() -> (Vec<String>, String, String) {
    let mut links: Vec<String> = fs::read_to_string("/proc/thread-self/net/dev")
        .expect("read /proc/thread-self/net/dev")
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(|n| n.trim().to_string()))
        .collect();
    links.sort();
    let forward = fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap_or_default();
    let ruleset = Command::new("nft")
        .args(["list", "ruleset"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    (links, forward, ruleset)
}

/// A `ferry relay` child in a namespace, killed on drop.
fn start_relay(w: &World, ns: &Netns, listen: SocketAddr) -> RelayProcess {
    let mut cmd = w.cmd();
    ns.inside(&mut cmd)
        .arg("relay")
        .arg("--listen")
        .arg(listen.to_string())
        .args(["--stats-interval", "0"]);
    RelayProcess::spawn(cmd)
}

/// How the peers look for each other besides the relay.
#[derive(Clone, Copy, Debug)]
enum Paths {
    /// `--force-relay` on both sides.
    RelayOnly,
    /// Defaults: the sender listens on its namespace's loopback and announces in its own runtime
    /// directory, where the receiver (with another one, in another namespace) cannot find it.
    DirectAbsent,
    /// The sender listens on its private address and the receiver is told it with `--peer`; the NAT
    /// rejects that connection and the receiver falls back to the relay.
    DirectBlocked,
}

/// A 16 MiB file and a small tree of directories and files (some empty) under `src`.
fn payload(src: &Path) -> Vec<std::path::PathBuf> {
    let big = src.join("big.bin");
    fs::write(&big, pseudo_random(16 << 20, 31)).unwrap();
    let tree = src.join("tree");
    for i in 0..40usize {
        let d = tree.join(format!("d{}", i % 4)).join(format!("e{}", i % 3));
        fs::create_dir_all(&d).unwrap();
        fs::write(
            d.join(format!("f{i}.dat")),
            pseudo_random((i * 997) % 9000, i as u64 + 1),
        )
        .unwrap();
    }
    fs::create_dir_all(tree.join("empty")).unwrap();
    vec![big, tree]
}

/// Runs one transfer from the sender's namespace to the receiver's through the relay on the public
/// side, and checks everything the NAT and the relay promise.
fn transfer_through_nat(test: &str, paths: Paths, code: &str) {
    if let Some(reason) = missing_prerequisite() {
        return skip(test, &reason);
    }
    let before = own_namespace_snapshot();
    {
        let lab = match NatLab::build() {
            Ok(lab) => lab,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                return skip(test, &format!("cannot create network namespaces: {e}"));
            }
            Err(e) => panic!("building the namespaces: {e}"),
        };
        prove_the_nat(&lab);
        run_transfer(&lab, paths, code);
    }
    assert_eq!(
        before,
        own_namespace_snapshot(),
        "this process's own network namespace (links, ip_forward, nft ruleset) must be untouched"
    );
}

/// The NAT is real: the public side sees both peers as the router's public address, and cannot open a
/// connection to a peer's private address even though it routes that range to the router.
fn prove_the_nat(lab: &NatLab) {
    for (ns, private) in [(&lab.sender, SENDER_IP), (&lab.receiver, RECEIVER_IP)] {
        let (local, seen) = lab.observed_from_public(ns);
        assert_eq!(
            local.ip(),
            IpAddr::V4(private),
            "{} connects from its private address",
            ns.name()
        );
        assert_eq!(
            seen.ip(),
            IpAddr::V4(ROUTER_PUBLIC_IP),
            "the public side must see {} as the router's masqueraded address",
            ns.name()
        );
    }

    let listener = lab
        .sender
        .enter(|| TcpListener::bind((SENDER_IP, 0)))
        .expect("listen on the sender's private address");
    let target = listener.local_addr().unwrap();
    // Control: on its own subnet the listener is reachable.
    lab.router
        .enter(|| TcpStream::connect_timeout(&target, PROBE_TIMEOUT))
        .unwrap_or_else(|e| panic!("control: the router cannot reach {target}: {e}"));
    listener.accept().expect("accept the control probe");

    let rejected = lab.rejected();
    let inbound = lab
        .public
        .enter(|| TcpStream::connect_timeout(&target, PROBE_TIMEOUT));
    assert!(
        inbound.is_err(),
        "the public side opened a connection to the sender's private address {target} through the NAT"
    );
    assert!(
        lab.rejected() > rejected,
        "the router's NAT rule, not something else, stopped the inbound connection: {:?}",
        inbound.err()
    );
    listener.set_nonblocking(true).unwrap();
    assert_eq!(
        listener.accept().err().map(|e| e.kind()),
        Some(io::ErrorKind::WouldBlock),
        "nothing from the public side reached the sender"
    );
}

fn run_transfer(lab: &NatLab, paths: Paths, code: &str) {
    let (sw, rw, relay_world) = (World::new(), World::new(), World::new());
    let relay = start_relay(&relay_world, &lab.public, SocketAddr::from((RELAY_IP, 0)));
    assert_eq!(relay.addr.ip(), IpAddr::V4(RELAY_IP));
    let relay_addr = relay.addr.to_string();
    let sent = payload(&sw.src());
    let masqueraded = lab.masqueraded();
    let rejected = lab.rejected();

    let mut send = sw.cmd();
    lab.sender
        .inside(&mut send)
        .args(["send", "--json", "--relay", &relay_addr, "--code", code]);
    match paths {
        Paths::RelayOnly => {
            send.arg("--force-relay");
        }
        Paths::DirectAbsent => {}
        Paths::DirectBlocked => {
            send.arg("--listen").arg(format!("{SENDER_IP}:0"));
        }
    }
    send.args(&sent)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut send = Watched::new(send.spawn().expect("spawn ferry send"));
    let code_event = send.wait_for(|e| e["event"] == "code");
    let listen = code_event["listen"].as_str().map(str::to_string);

    let mut recv = rw.cmd();
    lab.receiver.inside(&mut recv).args([
        "receive",
        "--json",
        "--yes",
        "--relay",
        &relay_addr,
        code,
    ]);
    match paths {
        Paths::RelayOnly => {
            recv.arg("--force-relay");
        }
        Paths::DirectAbsent => {}
        Paths::DirectBlocked => {
            recv.arg("--peer")
                .arg(listen.as_deref().unwrap_or("missing"));
        }
    }
    recv.arg("--out")
        .arg(rw.out())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let recv = finish(recv.spawn().expect("spawn ferry receive"));
    let send: Output = send.finish();
    drop(relay);

    assert_success("send", &send);
    assert_success("receive", &recv);
    for (side, out) in [("sender", &send), ("receiver", &recv)] {
        let ev = events(&out.stdout);
        let connected = event(&ev, "connected")
            .unwrap_or_else(|| panic!("{side} reported no `connected` event"));
        assert_eq!(connected["path"], "relay", "{side} must use the relay");
        assert_eq!(connected["peer"], relay_addr.as_str(), "{side}'s relay");
    }
    for name in ["big.bin", "tree"] {
        let (a, b) = (sw.src().join(name), rw.out().join(name));
        if name == "tree" {
            // Directory mtimes move when entries are created; the check is about the contents.
            for p in [&a, &b] {
                set_mtime(p, 1_700_000_000, 0);
            }
        }
        assert_same_tree(&a, &b);
    }
    assert!(
        lab.masqueraded() >= masqueraded + 2,
        "both peers' connections to the relay went out through the masquerade ({} -> {})",
        masqueraded,
        lab.masqueraded()
    );

    match paths {
        Paths::RelayOnly => assert_eq!(listen, None, "--force-relay opens no listener"),
        Paths::DirectAbsent => {
            let listen = listen.expect("the sender listens by default");
            assert!(
                listen.starts_with("127.0.0.1:"),
                "the default direct path is the sender namespace's own loopback: {listen}"
            );
        }
        Paths::DirectBlocked => {
            let listen = listen.expect("--listen is reported");
            let warning = events(&recv.stdout)
                .into_iter()
                .find(|e| e["event"] == "warning")
                .unwrap_or_else(|| panic!("the receiver must say the direct path failed"));
            let message = warning["message"].as_str().unwrap_or_default();
            assert!(
                message.contains(&listen),
                "the warning names the direct path {listen}: {message}"
            );
            assert!(
                lab.rejected() > rejected,
                "the NAT router rejected the direct connection to {listen}"
            );
        }
    }
}

#[test]
fn force_relay_carries_a_transfer_between_two_peers_behind_nat() {
    transfer_through_nat(
        "force_relay_carries_a_transfer_between_two_peers_behind_nat",
        Paths::RelayOnly,
        "71-apple-orbit-violin",
    );
}

#[test]
fn without_a_direct_path_the_peers_fall_back_to_the_relay() {
    transfer_through_nat(
        "without_a_direct_path_the_peers_fall_back_to_the_relay",
        Paths::DirectAbsent,
        "72-apple-orbit-violin",
    );
}

#[test]
fn a_direct_path_blocked_by_nat_falls_back_to_the_relay() {
    transfer_through_nat(
        "a_direct_path_blocked_by_nat_falls_back_to_the_relay",
        Paths::DirectBlocked,
        "73-apple-orbit-violin",
    );
}
