//! LAN discovery over real multicast, run only inside private network namespaces this test creates.
//!
//! Each `#[test]` here is an *outer* test: it never touches the network itself. It re-executes this test binary
//! under `unshare -n` (after `ip link set lo up` and `multicast on`), running one `#[ignore]`d *inner* test that
//! does the advertising and browsing. An inner test refuses to run unless it was started that way: it checks the
//! marker variable, that its network namespace differs from the outer one, and that it sees exactly the interfaces
//! the outer test set up. The outer test checks the child's exit status and a success marker the inner test prints
//! last (so a test filtered away by a typo cannot pass). Without root, `unshare` or `ip`, it skips with the reason.
//!
//! The two-namespace test joins namespace A (advertiser) and namespace B (browser) with a veth pair created inside
//! A and moved into B by process id, so it needs no `/run/netns` and leaves nothing behind: both namespaces vanish
//! with their processes.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_rendezvous::mdns::{self, MAX_CANDIDATES, SERVICE_TYPE};
use ferry_rendezvous::NameplateHash;
use mdns_sd::{ServiceDaemon, ServiceInfo, TxtProperty};

/// Set (to the outer test's network namespace) in the environment of every inner test.
const OUTER_NETNS: &str = "FERRY_MDNS_TEST_OUTER_NETNS";
/// The file whose appearance tells the veth advertiser to stop.
const STOP_FILE: &str = "FERRY_MDNS_TEST_STOP_FILE";
/// What an inner test prints when it got to the end.
const OK_MARKER: &str = "FERRY_MDNS_INNER_OK";
/// Longest an outer test waits for its namespace to finish.
const OUTER_TIMEOUT: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------------------------------------------
// Outer side: sets up namespaces, never sends a packet.

fn netns_id() -> String {
    std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// Says that `test` did not run, and why; in CI (`CI` set: it runs as root with `ip` and `unshare` installed
/// by `.ci/run`) that is a failure instead.
fn skip(test: &str, why: &str) {
    ferry_testkit::skip(&format!("mdns::{test}"), why);
}

/// Why namespace tests cannot run here, if they cannot.
fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: creating network namespaces needs CAP_SYS_ADMIN".into());
    }
    for (tool, arg) in [("unshare", "--version"), ("ip", "-V")] {
        match Command::new(tool)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
        {
            Ok(s) if s.success() => {}
            _ => return Some(format!("`{tool}` is not available")),
        }
    }
    match Command::new("unshare")
        .args(["-n", "--", "true"])
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => None,
        _ => Some("`unshare -n` fails here (no permission to create a network namespace)".into()),
    }
}

/// Runs `sh -c script` in a fresh network namespace with `$0` = this test binary; returns its output.
fn run_in_new_netns(script: &str, stop_file: Option<&Path>) -> Output {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new("unshare");
    cmd.args(["-n", "--", "sh", "-c", script])
        .arg(&exe)
        .env(OUTER_NETNS, netns_id())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(f) = stop_file {
        cmd.env(STOP_FILE, f);
    }
    let mut child = cmd.spawn().expect("spawn unshare");
    let started = Instant::now();
    // Read the pipes on threads so a chatty child cannot block on a full pipe while we poll for its exit.
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut v);
        v
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for unshare") {
            break status;
        }
        if started.elapsed() > OUTER_TIMEOUT {
            let _ = child.kill();
            break child.wait().expect("wait for killed unshare");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

/// Fails the outer test unless the namespace run succeeded and every inner test in `inner` printed its marker.
fn check(output: &Output, inner: &[&str]) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("--- namespace stdout ---\n{stdout}--- namespace stderr ---\n{stderr}");
    assert!(
        output.status.success(),
        "namespace run failed: {:?}",
        output.status
    );
    for name in inner {
        assert!(
            stdout.contains(&format!("{OK_MARKER} {name}")),
            "{name} did not run to its end"
        );
    }
}

fn lo_only_script(inner: &str) -> String {
    format!(
        "set -e; ip link set lo up; ip link set lo multicast on; \
         exec \"$0\" --exact {inner} --ignored --nocapture --test-threads=1"
    )
}

#[test]
fn advertisement_is_found_in_a_loopback_namespace() {
    if let Some(why) = skip_reason() {
        skip("advertisement_is_found_in_a_loopback_namespace", &why);
        return;
    }
    let inner = "inner_lo_advertise_and_browse";
    check(&run_in_new_netns(&lo_only_script(inner), None), &[inner]);
}

#[test]
fn spoofers_are_returned_and_garbage_is_ignored() {
    if let Some(why) = skip_reason() {
        skip("spoofers_are_returned_and_garbage_is_ignored", &why);
        return;
    }
    let inner = "inner_lo_spoofer_and_garbage";
    check(&run_in_new_netns(&lo_only_script(inner), None), &[inner]);
}

/// Exit status of the namespace script when veth pairs cannot be made (no veth module): a skip, not a failure.
const NO_VETH: i32 = 77;

#[test]
fn advertisement_is_found_across_a_veth_link() {
    if let Some(why) = skip_reason() {
        skip("advertisement_is_found_across_a_veth_link", &why);
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let stop = dir.path().join("stop");
    // Runs in namespace A. B is a second `unshare -n` started in the background; `unshare` without --fork
    // execs in place, so $B is the pid of a process in B once its namespace differs from ours. Then the veth
    // end `fb` is moved into B, B configures it and execs the browser; A runs the advertiser until B is done.
    let script = format!(
        r#"
set -u
ip link set lo up && ip link set lo multicast on || exit 1
ip link add fa type veth peer name fb 2>/dev/null || exit {NO_VETH}
ip link delete fa
unshare -n -- sh -c '
  set -e
  ip link set lo up; ip link set lo multicast on
  i=0; while ! ip link show fb >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 200 ] || exit 91; sleep 0.05; done
  ip addr add 10.213.0.2/24 dev fb
  ip -6 addr add fd00:f0e7::2/64 dev fb nodad
  ip link set fb multicast on; ip link set fb up
  exec "$0" --exact inner_veth_browser --ignored --nocapture --test-threads=1' "$0" &
B=$!
me=$(readlink /proc/self/ns/net)
i=0
while [ "$(readlink /proc/$B/ns/net 2>/dev/null)" = "$me" ]; do
  i=$((i+1)); [ $i -lt 200 ] || {{ kill $B; exit 92; }}; sleep 0.02
done
ip link add fa type veth peer name fb || {{ kill $B; exit 93; }}
ip link set fb netns $B || {{ kill $B; exit 94; }}
ip addr add 10.213.0.1/24 dev fa
ip -6 addr add fd00:f0e7::1/64 dev fa nodad
ip link set fa multicast on; ip link set fa up
"$0" --exact inner_veth_advertiser --ignored --nocapture --test-threads=1 &
A=$!
wait $B; rb=$?
touch "${STOP_FILE}"
wait $A; ra=$?
echo "browser exit $rb, advertiser exit $ra"
[ $rb -eq 0 ] && [ $ra -eq 0 ]
"#
    );
    let output = run_in_new_netns(&script, Some(&stop));
    if output.status.code() == Some(NO_VETH) {
        skip(
            "advertisement_is_found_across_a_veth_link",
            "cannot create a veth pair here",
        );
        return;
    }
    check(&output, &["inner_veth_advertiser", "inner_veth_browser"]);
}

// ---------------------------------------------------------------------------------------------------------------
// Inner side: runs only inside the namespace the outer test made.

/// Panics (before any packet is sent) unless this process runs in a namespace made by an outer test, with
/// exactly the interfaces `expected`.
fn assert_private_netns(expected: &[&str]) {
    let outer = std::env::var(OUTER_NETNS).expect(
        "inner tests run only through their outer test (they need a private network namespace)",
    );
    let here = netns_id();
    assert!(
        !here.is_empty() && here != outer,
        "not in a private network namespace ({here} vs {outer})"
    );
    // /proc/self/net follows the network namespace (unlike /sys/class/net, which follows the sysfs mount).
    let dev = std::fs::read_to_string("/proc/self/net/dev").expect("read /proc/self/net/dev");
    let interfaces: BTreeSet<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    let expected: BTreeSet<&str> = expected.iter().copied().collect();
    assert_eq!(
        interfaces, expected,
        "unexpected interfaces in the test namespace"
    );
}

fn done(name: &str) {
    println!("{OK_MARKER} {name}");
}

fn ports(addrs: &[SocketAddr]) -> BTreeSet<u16> {
    addrs.iter().map(SocketAddr::port).collect()
}

fn assert_ipv4_first(addrs: &[SocketAddr]) {
    let first_v6 = addrs
        .iter()
        .position(SocketAddr::is_ipv6)
        .unwrap_or(addrs.len());
    assert!(
        addrs[first_v6..].iter().all(SocketAddr::is_ipv6),
        "IPv4 must come first: {addrs:?}"
    );
}

#[test]
#[ignore = "runs only inside a private network namespace, started by advertisement_is_found_in_a_loopback_namespace"]
fn inner_lo_advertise_and_browse() {
    assert_private_netns(&["lo"]);
    let hash = NameplateHash::of(7);
    let adv = mdns::advertise(&hash, 40007).expect("advertise");
    assert!(adv.instance().ends_with(SERVICE_TYPE));
    assert!(
        !adv.instance().contains(&hash.to_hex()),
        "instance names carry only a prefix of the hash"
    );

    let started = Instant::now();
    let found = mdns::browse(&hash, Duration::from_secs(10)).expect("browse");
    let took = started.elapsed();
    println!("found {found:?} in {took:?}");
    assert!(
        found.contains(&SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 40007)),
        "{found:?}"
    );
    assert_eq!(ports(&found), BTreeSet::from([40007]));
    assert_ipv4_first(&found);
    assert!(
        took < Duration::from_secs(5),
        "browse must return once found, not at the timeout ({took:?})"
    );

    let other =
        mdns::browse(&NameplateHash::of(8), Duration::from_millis(1500)).expect("browse other");
    assert!(
        other.is_empty(),
        "another nameplate must not match: {other:?}"
    );

    // Dropping the advertisement unregisters it and stops its daemon: nobody answers any more.
    drop(adv);
    let gone = mdns::browse(&hash, Duration::from_millis(1500)).expect("browse after drop");
    assert!(
        gone.is_empty(),
        "a dropped advertisement must not be found: {gone:?}"
    );
    done("inner_lo_advertise_and_browse");
}

/// Registers a service for `_ferry._tcp` with arbitrary TXT properties, bypassing ferry's own encoder.
fn register_raw(daemon: &ServiceDaemon, name: &str, port: u16, txt: Vec<TxtProperty>) {
    let mut info = ServiceInfo::new(SERVICE_TYPE, name, &format!("{name}.local."), "", port, txt)
        .expect("service info")
        .enable_addr_auto();
    info.set_requires_probe(false);
    daemon.register(info).expect("register");
}

fn prop(key: &str, val: impl AsRef<[u8]>) -> TxtProperty {
    TxtProperty::from((key, val))
}

/// Sends malformed mDNS packets to the group on loopback until `stop` is set.
fn spray_garbage(stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind garbage socket");
        let group = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(224, 0, 0, 251)), 5353);
        // A response header claiming 65535 answers, a truncated one, a name-compression loop, pure noise.
        let mut packets: Vec<Vec<u8>> = vec![
            vec![0, 0, 0x84, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0],
            vec![0, 0, 0x84],
            vec![0, 0, 0x84, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0xc0, 12, 0, 12, 0, 1],
        ];
        let mut noise = [0u8; 512];
        for round in 0..200u32 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            for (i, b) in noise.iter_mut().enumerate() {
                *b = (i as u32)
                    .wrapping_mul(2654435761)
                    .wrapping_add(round)
                    .to_le_bytes()[1];
            }
            packets.truncate(3);
            packets.push(noise.to_vec());
            for p in &packets {
                let _ = sock.send_to(p, group);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

#[test]
#[ignore = "runs only inside a private network namespace, started by spoofers_are_returned_and_garbage_is_ignored"]
fn inner_lo_spoofer_and_garbage() {
    assert_private_netns(&["lo"]);
    let hash = NameplateHash::of(321);
    let hex = hash.to_hex();
    let _real = mdns::advertise(&hash, 41000).expect("advertise");

    let spoofer = ServiceDaemon::new().expect("spoofer daemon");
    // Same hash, another port: a candidate like any other (the PAKE will reject it).
    register_raw(
        &spoofer,
        "spoof-valid",
        41001,
        vec![prop("h", &hex), prop("v", "1")],
    );
    // Malformed or foreign records: each must be ignored.
    let bad: Vec<Vec<TxtProperty>> = vec![
        vec![prop("h", &hex[..40]), prop("v", "1")],
        vec![prop("h", format!("{}zz", &hex[..62])), prop("v", "1")],
        vec![prop("v", "1")],
        vec![TxtProperty::from("h"), prop("v", "1")],
        vec![prop("h", &hex), prop("v", "2")],
        vec![prop("h", &hex)],
        vec![prop("h", [0xffu8; 64]), prop("v", "1")],
        vec![prop("h", NameplateHash::of(322).to_hex()), prop("v", "1")],
        // RFC 6763: only the first occurrence of a key counts.
        vec![prop("h", "00"), prop("h", &hex), prop("v", "1")],
        vec![prop("h", format!("{hex}{hex}")), prop("v", "1")],
        vec![],
    ];
    for (i, txt) in bad.into_iter().enumerate() {
        register_raw(&spoofer, &format!("spoof-bad-{i}"), 42000 + i as u16, txt);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let sprayer = spray_garbage(stop.clone());
    std::thread::sleep(Duration::from_millis(300));
    let found = mdns::browse(&hash, Duration::from_secs(10)).expect("browse");
    println!("found {found:?}");
    assert_eq!(ports(&found), BTreeSet::from([41000, 41001]), "{found:?}");
    assert_ipv4_first(&found);

    // A flood of matching answers is capped.
    let flooded = NameplateHash::of(999);
    for i in 0..(MAX_CANDIDATES as u16 + 8) {
        let txt = vec![prop("h", flooded.to_hex()), prop("v", "1")];
        register_raw(&spoofer, &format!("flood-{i}"), 43000 + i, txt);
    }
    // Registration is asynchronous: let the daemon announce them all, so that the browse gets them together
    // in its query's answer rather than a few early ones and then a quiet gap.
    std::thread::sleep(Duration::from_millis(500));
    let capped = mdns::browse(&flooded, Duration::from_secs(10)).expect("browse flood");
    println!("flood gave {} candidates", capped.len());
    assert_eq!(capped.len(), MAX_CANDIDATES, "{capped:?}");
    assert!(capped
        .iter()
        .all(|a| (43000..43000 + MAX_CANDIDATES as u16 + 8).contains(&a.port())));

    stop.store(true, Ordering::Relaxed);
    sprayer.join().expect("garbage thread");
    if let Ok(status) = spoofer.shutdown() {
        let _ = status.recv_timeout(Duration::from_secs(1));
    }
    done("inner_lo_spoofer_and_garbage");
}

const VETH_HASH: u32 = 55;
const VETH_PORT: u16 = 40555;

#[test]
#[ignore = "runs only inside namespace A, started by advertisement_is_found_across_a_veth_link"]
fn inner_veth_advertiser() {
    assert_private_netns(&["lo", "fa"]);
    let stop = PathBuf::from(std::env::var_os(STOP_FILE).expect("stop file"));
    let adv = mdns::advertise(&NameplateHash::of(VETH_HASH), VETH_PORT).expect("advertise");
    let started = Instant::now();
    while !stop.exists() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(adv);
    done("inner_veth_advertiser");
}

#[test]
#[ignore = "runs only inside namespace B, started by advertisement_is_found_across_a_veth_link"]
fn inner_veth_browser() {
    assert_private_netns(&["lo", "fb"]);
    let found =
        mdns::browse(&NameplateHash::of(VETH_HASH), Duration::from_secs(20)).expect("browse");
    println!("found {found:?}");
    assert!(
        found.contains(&"10.213.0.1:40555".parse().unwrap()),
        "{found:?}"
    );
    assert!(
        found.contains(&"[fd00:f0e7::1]:40555".parse().unwrap()),
        "{found:?}"
    );
    for addr in &found {
        if let SocketAddr::V6(v6) = addr {
            let link_local = v6.ip().segments()[0] & 0xffc0 == 0xfe80;
            assert_eq!(
                link_local,
                v6.scope_id() != 0,
                "link-local addresses need their interface: {addr}"
            );
        }
    }
    assert_eq!(ports(&found), BTreeSet::from([VETH_PORT]));
    assert_ipv4_first(&found);
    assert!(
        !found.iter().any(|a| a.ip().is_loopback()),
        "A's loopback must not be offered over veth: {found:?}"
    );

    let other = mdns::browse(
        &NameplateHash::of(VETH_HASH + 1),
        Duration::from_millis(1500),
    )
    .expect("browse");
    assert!(
        other.is_empty(),
        "another nameplate must not match: {other:?}"
    );
    done("inner_veth_browser");
}

#[test]
fn announcements_of_off_link_addresses_are_not_candidates() {
    if let Some(why) = skip_reason() {
        println!("SKIP announcements_of_off_link_addresses_are_not_candidates: {why}");
        return;
    }
    let inner = "inner_lo_off_link_spoofer";
    check(&run_in_new_netns(&lo_only_script(inner), None), &[inner]);
}

/// A DNS name in wire format (no compression).
fn dns_name(out: &mut Vec<u8>, name: &str) {
    for label in name.trim_end_matches('.').split('.') {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
}

/// One resource record: name, type, class (with the cache-flush bit for unique records), TTL 120, data.
fn dns_record(out: &mut Vec<u8>, name: &str, rtype: u16, unique: bool, rdata: &[u8]) {
    dns_name(out, name);
    out.extend_from_slice(&rtype.to_be_bytes());
    let class: u16 = if unique { 0x8001 } else { 1 };
    out.extend_from_slice(&class.to_be_bytes());
    out.extend_from_slice(&120u32.to_be_bytes());
    out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    out.extend_from_slice(rdata);
}

/// A hand-made mDNS response announcing a ferry sender for `hash` at `ip:port` under `instance`: what a
/// spoofer can put on the link, whatever a well-behaved responder would filter.
fn crafted_announcement(hash: &NameplateHash, instance: &str, ip: Ipv4Addr, port: u16) -> Vec<u8> {
    let full = format!("{instance}.{SERVICE_TYPE}");
    let host = format!("{instance}.local.");
    let mut p = vec![0, 0, 0x84, 0, 0, 0, 0, 4, 0, 0, 0, 0];
    let mut ptr = Vec::new();
    dns_name(&mut ptr, &full);
    dns_record(&mut p, SERVICE_TYPE, 12, false, &ptr);
    let mut srv = vec![0, 0, 0, 0];
    srv.extend_from_slice(&port.to_be_bytes());
    dns_name(&mut srv, &host);
    dns_record(&mut p, &full, 33, true, &srv);
    let mut txt = Vec::new();
    for entry in [format!("h={}", hash.to_hex()), "v=1".to_string()] {
        txt.push(entry.len() as u8);
        txt.extend_from_slice(entry.as_bytes());
    }
    dns_record(&mut p, &full, 16, true, &txt);
    dns_record(&mut p, &host, 1, true, &ip.octets());
    p
}

#[test]
#[ignore = "runs only inside a private network namespace, started by announcements_of_off_link_addresses_are_not_candidates"]
fn inner_lo_off_link_spoofer() {
    assert_private_netns(&["lo"]);
    let hash = NameplateHash::of(404);
    // The spoofer announces the same hash twice: once at an on-link address (loopback, like any host on the
    // link) and once at a routed one, which no interface here reaches directly.
    let on_link = crafted_announcement(&hash, "spoof-near", Ipv4Addr::LOCALHOST, 44001);
    let off_link = crafted_announcement(&hash, "spoof-far", Ipv4Addr::new(198, 51, 100, 7), 44002);
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let sprayer = std::thread::spawn(move || {
        let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind spoofer socket");
        let group = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(224, 0, 0, 251)), 5353);
        for _ in 0..400 {
            if flag.load(Ordering::Relaxed) {
                return;
            }
            let _ = sock.send_to(&off_link, group);
            let _ = sock.send_to(&on_link, group);
            std::thread::sleep(Duration::from_millis(25));
        }
    });
    let mut seen = BTreeSet::new();
    // Several browses, so the crafted answers certainly arrived in at least one of them.
    for _ in 0..3 {
        let found = mdns::browse(&hash, Duration::from_secs(4)).expect("browse");
        println!("found {found:?}");
        assert!(
            found
                .iter()
                .all(|a| a.ip() != IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7))),
            "an off-link address was offered as a candidate: {found:?}"
        );
        seen.extend(ports(&found));
    }
    assert!(
        seen.contains(&44001),
        "the crafted on-link announcement is parsed (so the off-link one was too): {seen:?}"
    );
    stop.store(true, Ordering::Relaxed);
    sprayer.join().expect("spoofer thread");
    done("inner_lo_off_link_spoofer");
}
