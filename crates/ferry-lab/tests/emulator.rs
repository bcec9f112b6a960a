//! The emulator validated against itself: a plain TCP copy through each link reaches the configured
//! rate and a 1-byte ping-pong the configured RTT, within generous bounds (these tests assert that the
//! emulator works, not a speed; BENCHMARKS.md has the precise figures and the command).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferry_lab::{Lab, Netns, Path};
use ferry_testkit::skip;

/// One lab at a time: two emulators sharing this machine's two cores would measure each other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The lab for `path`, or `None` after saying why the test is skipped.
fn lab(test: &str, path: &str) -> Option<Lab> {
    if let Some(reason) = ferry_lab::missing_prerequisite() {
        skip(test, &reason);
        return None;
    }
    Some(Lab::build(&Path::by_name(path).expect("a known path")).expect("building the lab"))
}

/// A connected pair: (client side in `from`, server side in `to` listening on `ip`).
fn connect(from: &Netns, to: &Netns, ip: Ipv4Addr) -> (TcpStream, TcpStream) {
    let listener = to
        .enter(|| TcpListener::bind((ip, 0)))
        .expect("listen in the server namespace");
    let addr: SocketAddr = listener.local_addr().unwrap();
    let client = from
        .enter(|| TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
        .expect("connect through the link");
    let (server, _) = listener.accept().unwrap();
    (client, server)
}

/// The median round trip of a 1-byte message each way (Nagle off), after a few to warm up.
fn ping_pong_rtt(a: &mut TcpStream, b: &mut TcpStream, rounds: usize) -> Duration {
    a.set_nodelay(true).unwrap();
    b.set_nodelay(true).unwrap();
    let mut b2 = b.try_clone().unwrap();
    let echo = std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        while b2.read_exact(&mut byte).is_ok() && byte[0] != 0xff {
            b2.write_all(&byte).unwrap();
        }
    });
    let mut samples = Vec::new();
    let mut byte = [1u8; 1];
    for i in 0..rounds + 3 {
        let t = Instant::now();
        a.write_all(&[1]).unwrap();
        a.read_exact(&mut byte).unwrap();
        if i >= 3 {
            samples.push(t.elapsed());
        }
    }
    a.write_all(&[0xff]).unwrap();
    echo.join().unwrap();
    samples.sort();
    samples[samples.len() / 2]
}

/// Copies `bytes` of a counting pattern from `tx` to `rx`; checks every word arrived in order and
/// returns the payload rate in bytes per second over the last three quarters of the bytes (the first
/// quarter holds TCP's slow start, which is no property of the link).
fn copy_rate(tx: TcpStream, mut rx: TcpStream, bytes: u64) -> f64 {
    let sender = std::thread::spawn(move || {
        let mut tx = tx;
        let mut buf = vec![0u8; 1 << 20];
        let mut word = 0u64;
        let mut left = bytes;
        while left > 0 {
            for chunk in buf.chunks_mut(8) {
                chunk.copy_from_slice(&word.to_le_bytes());
                word += 1;
            }
            let n = left.min(buf.len() as u64) as usize;
            tx.write_all(&buf[..n]).unwrap();
            left -= n as u64;
        }
    });
    let mut buf = vec![0u8; 1 << 20];
    let (mut got, mut first) = (0u64, None);
    let mut pending = Vec::new();
    let mut word = 0u64;
    loop {
        let n = rx.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got += n as u64;
        if got >= bytes / 4 {
            first.get_or_insert_with(|| (Instant::now(), got));
        }
        pending.extend_from_slice(&buf[..n]);
        let whole = pending.len() / 8 * 8;
        for w in pending[..whole].chunks(8) {
            assert_eq!(
                u64::from_le_bytes(w.try_into().unwrap()),
                word,
                "data corrupted"
            );
            word += 1;
        }
        pending.drain(..whole);
    }
    sender.join().unwrap();
    assert_eq!(got, bytes, "every byte arrives");
    let (t0, first_n) = first.expect("some data");
    (got - first_n) as f64 / t0.elapsed().as_secs_f64()
}

/// The most payload a TCP stream can carry on a wire that counts IP bytes: 1448 of every 1500 (IPv4
/// and TCP headers with timestamps).
const TCP_PAYLOAD_SHARE: f64 = 1448.0 / 1500.0;

/// The load average, for the record of a measurement.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Rate within `rate_bounds` of the TCP payload ceiling of the wire, RTT from `rtt_under` under to
/// `rtt_over` over the configured one.
fn rate_and_rtt(
    test: &str,
    path: &str,
    bytes: u64,
    rate_bounds: (f64, f64),
    rtt_under: Duration,
    rtt_over: Duration,
) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(lab) = lab(test, path) else { return };
    let spec = lab.path.link.unwrap();
    let (mut a, mut b) = connect(&lab.client, &lab.server, lab.server_ip());
    let rtt = ping_pong_rtt(&mut a, &mut b, 20);
    let rate = copy_rate(a, b, bytes);
    let ceiling = spec.rate_bps as f64 / 8.0 * TCP_PAYLOAD_SHARE;
    println!(
        "{path}: payload {:.1} Mbit/s = {:.3} of the TCP ceiling of a {} Mbit/s wire, RTT {:.3} ms \
         (configured {:.3} ms); load average {}",
        rate * 8.0 / 1e6,
        rate / ceiling,
        spec.rate_bps / 1_000_000,
        rtt.as_secs_f64() * 1e3,
        spec.rtt.as_secs_f64() * 1e3,
        load()
    );
    assert!(
        rate >= rate_bounds.0 * ceiling && rate <= rate_bounds.1 * ceiling,
        "{path}: {rate:.0} B/s against a ceiling of {ceiling:.0} B/s"
    );
    assert!(
        rtt + rtt_under >= spec.rtt && rtt <= spec.rtt + rtt_over,
        "{path}: RTT {rtt:?} against {:?}",
        spec.rtt
    );
    let s = lab.links()[0].stats(1);
    assert_eq!(s.lost.load(Ordering::Relaxed), 0, "no loss configured");
}

/// Generous: the emulator works (a loaded machine may starve its threads).
fn works(test: &str, path: &str) {
    let ms = Duration::from_millis;
    rate_and_rtt(
        test,
        path,
        96 << 20,
        (0.5, 1.1),
        ms(0) + Duration::from_micros(100),
        ms(5),
    );
}

/// Precise, as the issue asks (5 % of the rate, 1 ms of the RTT): only on an otherwise idle machine,
/// so not in the default run; `cargo test --release -p ferry-lab --test emulator -- --ignored
/// --nocapture --test-threads 1`.
fn precise(test: &str, path: &str, bytes: u64) {
    let ms = Duration::from_millis;
    rate_and_rtt(test, path, bytes, (0.95, 1.05), ms(1), ms(1));
}

#[test]
fn lan_link_has_its_rate_and_rtt() {
    works("emulator::lan_link_has_its_rate_and_rtt", "lan");
}

#[test]
fn wan_link_has_its_rate_and_rtt() {
    works("emulator::wan_link_has_its_rate_and_rtt", "wan");
}

#[test]
#[ignore = "precise figures need an idle machine"]
fn lan_link_is_within_5_percent_and_1_ms() {
    precise(
        "emulator::lan_link_is_within_5_percent_and_1_ms",
        "lan",
        512 << 20,
    );
}

#[test]
#[ignore = "precise figures need an idle machine"]
fn wan_link_is_within_5_percent_and_1_ms() {
    precise(
        "emulator::wan_link_is_within_5_percent_and_1_ms",
        "wan",
        256 << 20,
    );
}

#[test]
fn lossy_link_drops_its_share_and_tcp_still_delivers_everything() {
    let test = "emulator::lossy_link_drops_its_share_and_tcp_still_delivers_everything";
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(lab) = lab(test, "lossy-wan") else {
        return;
    };
    let (a, b) = connect(&lab.client, &lab.server, lab.server_ip());
    // Slow under loss (that is the point); the copy still checks every byte.
    let rate = copy_rate(a, b, 16 << 20);
    // Client to server is the link's first direction: the data; its ACKs go the other way.
    let data = lab.links()[0].stats(0);
    let (lost, sent) = (
        data.lost.load(Ordering::Relaxed),
        data.packets.load(Ordering::Relaxed),
    );
    let share = lost as f64 / (lost + sent) as f64;
    println!(
        "lossy-wan: {lost} of {} data packets dropped ({:.3} %), {:.1} Mbit/s",
        lost + sent,
        share * 100.0,
        rate * 8.0 / 1e6
    );
    assert!(
        (0.002..=0.01).contains(&share),
        "0.5 % configured, {share} dropped"
    );
}

#[test]
fn relay_path_joins_three_namespaces_with_half_the_rtt_each_hop() {
    let test = "emulator::relay_path_joins_three_namespaces_with_half_the_rtt_each_hop";
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(lab) = lab(test, "wan-relay") else {
        return;
    };
    let relay = lab.relay.as_ref().expect("a relay namespace");
    let (to_client, to_server) = lab.relay_ips().unwrap();
    let hop = lab.path.link.unwrap().rtt / 2;
    for (from, ip) in [(&lab.client, to_client), (&lab.server, to_server)] {
        let (mut a, mut b) = connect(from, relay, ip);
        let rtt = ping_pong_rtt(&mut a, &mut b, 10);
        println!("wan-relay: {} to relay RTT {rtt:?}", from.name());
        assert!(
            rtt + Duration::from_micros(100) >= hop && rtt <= hop + Duration::from_millis(5),
            "hop RTT {rtt:?} against {hop:?}"
        );
    }
    // The peers cannot reach each other except through the relay: no route between the hops.
    let (client_ip, _) = (lab.client_ip(), ());
    let direct = lab.server.enter(|| {
        TcpStream::connect_timeout(&SocketAddr::from((client_ip, 9)), Duration::from_secs(1))
    });
    assert!(direct.is_err(), "the server reached the client directly");
}

#[test]
fn the_lab_leaves_this_namespace_alone_and_is_gone_when_dropped() {
    let test = "emulator::the_lab_leaves_this_namespace_alone_and_is_gone_when_dropped";
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let links = || std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
    let before = links();
    let Some(lab) = lab(test, "lan") else { return };
    assert!(!before.contains("lab0"));
    assert_eq!(links(), before, "no device in this process's namespace");
    let inside = lab
        .client
        .enter(|| std::fs::read_to_string("/proc/thread-self/net/dev").unwrap());
    assert!(
        inside.contains("lab0"),
        "the client namespace has the link's end"
    );
    drop(lab);
    assert_eq!(links(), before);
}
