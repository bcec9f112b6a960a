//! End-to-end tests of the relay over real sockets on 127.0.0.1.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use ferry_relay::{connect, Forwarding, RelayConfig, RelayError, Role};

mod support;
use support::*;

/// Sends a raw hello and returns the stream with the first status byte read.
fn raw_hello(addr: SocketAddr, role: u8, h: [u8; 32]) -> (TcpStream, u8) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut hello = vec![1u8, role];
    hello.extend_from_slice(&h);
    s.write_all(&hello).unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    (s, b[0])
}

/// A deterministic pseudorandom byte stream, so both ends can check every byte.
struct Stream(u64);

impl Stream {
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let b = self.0.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }
}

fn send_stream(mut s: TcpStream, seed: u64, len: usize) -> TcpStream {
    let mut gen = Stream(seed);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len());
        gen.fill(&mut buf[..n]);
        s.write_all(&buf[..n]).unwrap();
        left -= n;
    }
    s.shutdown(Shutdown::Write).unwrap();
    s
}

fn check_stream(s: &mut TcpStream, seed: u64, len: usize) {
    let mut gen = Stream(seed);
    let mut buf = vec![0u8; 1 << 20];
    let mut want = vec![0u8; 1 << 20];
    let mut got = 0usize;
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        // The generator works in 8-byte steps; reads of 1 MiB arrive in any size, so compare
        // through a re-aligned window.
        let mut off = 0;
        while off < n {
            let pos = got % (1 << 20);
            let take = (n - off).min((1 << 20) - pos);
            if pos == 0 {
                let chunk = (len - got).min(1 << 20);
                gen.fill(&mut want[..chunk]);
            }
            assert_eq!(
                &buf[off..off + take],
                &want[pos..pos + take],
                "byte {} differs",
                got
            );
            got += take;
            off += take;
        }
    }
    assert_eq!(got, len, "stream length");
}

fn pair(addr: SocketAddr, h: [u8; 32]) -> (TcpStream, TcpStream) {
    let r = thread::spawn(move || connect(addr, Role::Receiver, h, T).unwrap());
    let s = connect(addr, Role::Sender, h, T).unwrap();
    (s, r.join().unwrap())
}

fn both_ways(mode: Forwarding) {
    const LEN: usize = 64 << 20;
    let relay = start(RelayConfig {
        forwarding: mode,
        ..quiet()
    });
    let (s, r) = pair(relay.addr, hash(1));
    let (mut s2, mut r2) = (s.try_clone().unwrap(), r.try_clone().unwrap());
    let a = thread::spawn(move || send_stream(s, 11, LEN));
    let b = thread::spawn(move || send_stream(r, 22, LEN));
    let c = thread::spawn(move || check_stream(&mut r2, 11, LEN));
    check_stream(&mut s2, 22, LEN);
    c.join().unwrap();
    a.join().unwrap();
    b.join().unwrap();
    let stats = relay.stop();
    assert_eq!(stats.bytes_forwarded, 2 * LEN as u64);
    assert_eq!(stats.paired_total, 1);
    assert_eq!(stats.active, 0);
    let spliced = if mode == Forwarding::Splice { 2 } else { 0 };
    assert_eq!(
        (stats.spliced_directions, stats.copied_directions),
        (spliced, 2 - spliced)
    );
}

#[test]
fn pairs_and_forwards_64_mib_each_way_with_splice() {
    both_ways(Forwarding::Splice);
}

#[test]
fn pairs_and_forwards_64_mib_each_way_with_copy() {
    both_ways(Forwarding::Copy);
}

#[test]
fn half_close_is_propagated_each_way() {
    for mode in [Forwarding::Splice, Forwarding::Copy] {
        let relay = start(RelayConfig {
            forwarding: mode,
            ..quiet()
        });
        let (mut s, mut r) = pair(relay.addr, hash(2));
        r.set_read_timeout(Some(T)).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        s.write_all(b"abc").unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap(); // ends only if the relay propagated the shutdown
        assert_eq!(got, b"abc");
        // The other direction still works after the first one closed.
        r.write_all(b"xyz").unwrap();
        r.shutdown(Shutdown::Write).unwrap();
        got.clear();
        s.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"xyz");
        // Both directions done: the relay closes the session.
        let deadline = Instant::now() + T;
        while relay.handle.stats().active != 0 {
            assert!(
                Instant::now() < deadline,
                "session not closed, mode {mode:?}"
            );
            thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn garbage_is_refused_with_bad_hello() {
    let relay = start(RelayConfig {
        hello_timeout: Duration::from_millis(500),
        ..quiet()
    });
    let mut s = TcpStream::connect(relay.addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut got = Vec::new();
    // Either BAD_HELLO then EOF, or a reset because unread garbage was discarded.
    match s.read_to_end(&mut got) {
        Ok(_) => assert!(got.is_empty() || got == [5], "got {got:?}"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset),
    }
    // A hello with a good version but a bad role.
    let (mut s, status) = raw_hello(relay.addr, 9, hash(3));
    assert_eq!(status, 5);
    assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0);
    // A partial hello and silence: closed after the hello timeout.
    let mut s = TcpStream::connect(relay.addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(&[1, 1, 0, 0]).unwrap();
    let t0 = Instant::now();
    assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0);
    assert!(t0.elapsed() < Duration::from_secs(5));
    let stats = relay.stop();
    assert_eq!(stats.refused_bad_hello, 3);
    assert_eq!(stats.waiting, 0);
}

#[test]
fn second_side_that_never_arrives_times_out() {
    let relay = start(RelayConfig {
        max_wait: Duration::from_secs(1),
        ..quiet()
    });
    let t0 = Instant::now();
    let err = connect(relay.addr, Role::Sender, hash(4), T).unwrap_err();
    assert!(matches!(err, RelayError::PeerTimeout), "{err}");
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(5));
    // The slot is free again: the hash can be used for a real session.
    let (mut s, mut r) = pair(relay.addr, hash(4));
    s.write_all(b"ok").unwrap();
    let mut b = [0u8; 2];
    r.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ok");
    assert_eq!(relay.stop().refused_timeout, 1);
}

#[test]
fn too_many_new_sessions_from_one_source_are_rate_limited() {
    let relay = start(RelayConfig {
        sessions_per_ip_per_minute: 3,
        ..quiet()
    });
    let held: Vec<_> = (0..3)
        .map(|i| {
            let (s, status) = raw_hello(relay.addr, 1, hash(100 + i));
            assert_eq!(status, 0, "WAITING");
            s
        })
        .collect();
    let err = connect(relay.addr, Role::Receiver, hash(100), T).unwrap_err();
    assert!(matches!(err, RelayError::RateLimited), "{err}");
    assert_eq!(
        err.to_string(),
        "relay refused: too many new sessions from this address, try again in a minute"
    );
    drop(held);
    assert_eq!(relay.stop().refused_rate_limited, 1);
}

#[test]
fn duplicate_role_is_taken_and_the_first_still_pairs() {
    let relay = start(quiet());
    let (mut first, status) = raw_hello(relay.addr, 1, hash(5));
    assert_eq!(status, 0);
    let err = connect(relay.addr, Role::Sender, hash(5), T).unwrap_err();
    assert!(matches!(err, RelayError::Taken(Role::Sender)), "{err}");
    let mut r = connect(relay.addr, Role::Receiver, hash(5), T).unwrap();
    let mut b = [0u8; 1];
    first.read_exact(&mut b).unwrap();
    assert_eq!(b[0], 1, "PAIRED");
    first.write_all(b"x").unwrap();
    r.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"x");
    assert_eq!(relay.stop().refused_taken, 1);
}

#[test]
fn full_at_the_concurrent_session_limit() {
    let relay = start(RelayConfig {
        max_sessions: 2,
        ..quiet()
    });
    // One paired session and one waiting one fill both slots.
    let (_s, _r) = pair(relay.addr, hash(6));
    let (waiter, status) = raw_hello(relay.addr, 2, hash(7));
    assert_eq!(status, 0);
    let err = connect(relay.addr, Role::Sender, hash(8), T).unwrap_err();
    assert!(matches!(err, RelayError::Full), "{err}");
    // Joining an existing waiting session needs no new slot.
    let joined = connect(relay.addr, Role::Sender, hash(7), T);
    assert!(joined.is_ok());
    drop(waiter);
    assert_eq!(relay.stop().refused_full, 1);
}

#[test]
fn waiting_client_that_hangs_up_frees_its_slot() {
    let relay = start(quiet());
    let (s, status) = raw_hello(relay.addr, 1, hash(9));
    assert_eq!(status, 0);
    assert_eq!(relay.handle.stats().waiting, 1);
    drop(s);
    let deadline = Instant::now() + T;
    while relay.handle.stats().waiting != 0 {
        assert!(Instant::now() < deadline);
        thread::sleep(Duration::from_millis(10));
    }
    // The same role can register under the hash again.
    let (_s, status) = raw_hello(relay.addr, 1, hash(9));
    assert_eq!(status, 0);
}

#[test]
fn idle_paired_session_is_closed() {
    let relay = start(RelayConfig {
        idle_timeout: Duration::from_secs(1),
        // The idle rule alone (the minimum per window would close it at the same moment).
        min_bytes_per_window: 0,
        ..quiet()
    });
    let (mut s, mut r) = pair(relay.addr, hash(10));
    s.write_all(b"a").unwrap();
    let mut b = [0u8; 1];
    r.read_exact(&mut b).unwrap();
    r.set_read_timeout(Some(T)).unwrap();
    let t0 = Instant::now();
    assert_eq!(r.read(&mut b).unwrap_or(0), 0);
    assert!(t0.elapsed() >= Duration::from_millis(900));
    assert_eq!(relay.stop().idle_closed, 1);
}

#[test]
fn a_thousand_idle_connections_do_not_exhaust_it() {
    let limit = ferry_relay::raise_nofile_limit();
    if limit < 5000 {
        println!("skipped: open file limit is {limit}, need 5000 for 2000 connections each side");
        return;
    }
    let relay = start(RelayConfig {
        max_sessions: 2000,
        sessions_per_ip_per_minute: 10_000,
        // All from 127.0.0.1: this is about resources, not the per-source caps.
        max_handshakes_per_ip: 10_000,
        max_sessions_per_ip: 10_000,
        ..quiet()
    });
    // 1,000 that never send a byte, and 1,000 registered that wait forever.
    let silent: Vec<_> = (0..1000)
        .map(|_| TcpStream::connect(relay.addr).unwrap())
        .collect();
    let waiting: Vec<_> = (0..1000)
        .map(|i| {
            let (s, status) = raw_hello(relay.addr, 1, hash(10_000 + i));
            assert_eq!(status, 0);
            s
        })
        .collect();
    let deadline = Instant::now() + T;
    loop {
        let st = relay.handle.stats();
        if st.handshaking == 1000 && st.waiting == 1000 {
            break;
        }
        assert!(Instant::now() < deadline, "{st}");
        thread::sleep(Duration::from_millis(10));
    }
    // A real session still pairs and moves data at once.
    let t0 = Instant::now();
    let (s, mut r) = pair(relay.addr, hash(11));
    let sender = thread::spawn(move || send_stream(s, 33, 8 << 20));
    check_stream(&mut r, 33, 8 << 20);
    sender.join().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10));
    drop((silent, waiting));
    let stats = relay.stop();
    assert_eq!(stats.paired_total, 1);
}

#[test]
fn shutdown_stops_cleanly() {
    let relay = start(quiet());
    let addr = relay.addr;
    let (mut waiter, status) = raw_hello(addr, 1, hash(12));
    assert_eq!(status, 0);
    let (mut s, mut r) = pair(addr, hash(13));
    s.write_all(b"in flight").unwrap();
    let mut b = [0u8; 9];
    r.read_exact(&mut b).unwrap();
    let t0 = Instant::now();
    let handle = relay.handle.clone();
    let stats = relay.stop();
    // The waiting client is closed without a status; the idle paired one after the 1 s grace.
    assert_eq!(waiter.read(&mut [0u8; 1]).unwrap_or(0), 0);
    assert!(t0.elapsed() < Duration::from_secs(4));
    assert_eq!(r.read(&mut b).unwrap_or(0), 0);
    assert_eq!((stats.active, stats.waiting, stats.handshaking), (0, 0, 0));
    assert_eq!(stats.paired_total, 1);
    assert_eq!(handle.stats(), stats);
    // Nothing listens any more.
    assert!(TcpStream::connect(addr).is_err());
}

// ---- Denial of service from one source address (issue 9, item 5). Each test binds its client
// sockets to distinct 127.0.0.x addresses, so the relay sees distinct sources.

/// A raw hello from `src`; returns the stream and the first status byte (or `None` when the
/// relay closed or reset without one).
fn hello_from(src: [u8; 4], addr: SocketAddr, role: u8, h: [u8; 32]) -> (TcpStream, Option<u8>) {
    let mut s = connect_from(src, addr);
    s.set_read_timeout(Some(T)).unwrap();
    let mut hello = vec![1u8, role];
    hello.extend_from_slice(&h);
    // The relay may already have closed a refused connection: then the write or read fails.
    let _ = s.write_all(&hello);
    let mut b = [0u8; 1];
    let status = match s.read(&mut b) {
        Ok(1) => Some(b[0]),
        _ => None,
    };
    (s, status)
}

/// A session from two fresh addresses pairs and carries bytes both ways.
fn pair_from(relay: &Running, a: [u8; 4], b: [u8; 4], h: [u8; 32]) {
    let addr = relay.addr;
    let r = thread::spawn(move || hello_from(b, addr, 2, h));
    let (mut s, status) = hello_from(a, addr, 1, h);
    let mut r_stream = match status {
        Some(0) => {
            let (r, st) = r.join().unwrap();
            assert_eq!(st, Some(1), "receiver PAIRED");
            let mut b = [0u8; 1];
            s.read_exact(&mut b).unwrap();
            assert_eq!(b[0], 1, "sender PAIRED after WAITING");
            r.set_read_timeout(Some(T)).unwrap();
            r
        }
        Some(1) => {
            let (mut r, st) = r.join().unwrap();
            assert_eq!(st, Some(0), "receiver WAITING");
            let mut b = [0u8; 1];
            r.read_exact(&mut b).unwrap();
            assert_eq!(b[0], 1, "receiver PAIRED after WAITING");
            r
        }
        other => panic!("a legitimate sender from {a:?} got {other:?} instead of a session"),
    };
    s.write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    r_stream.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    r_stream.write_all(b"pong").unwrap();
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"pong");
}

/// A relay with the default limits for a flood of about 1,000 connections, or `None` (the test is
/// skipped) when the open file limit is too low for it. Its hello timeout is long, so that no flood
/// connection expires while the flood is still being accepted on a loaded machine: only the limits
/// under test free a seat.
fn relay_for_a_flood() -> Option<Running> {
    let limit = ferry_relay::raise_nofile_limit();
    if limit < 3000 {
        println!("skipped: open file limit is {limit}, need 3000 for the flood");
        return None;
    }
    Some(start(RelayConfig {
        hello_timeout: Duration::from_secs(300),
        ..quiet()
    }))
}

#[test]
fn a_pre_hello_flood_from_one_address_does_not_lock_out_another() {
    // Default limits: the flood is more connections than the relay's whole handshake budget.
    let Some(relay) = relay_for_a_flood() else {
        return;
    };
    let flood_n = RelayConfig::default().max_handshakes + 100;
    let flood: Vec<_> = (0..flood_n)
        .map(|_| connect_from([127, 0, 0, 2], relay.addr))
        .collect();
    // Every flood connection has been accepted (held or dropped) before the real peers come.
    wait_stats(&relay, "flood accepted", |st| {
        st.connections_total >= flood_n as u64
    });
    let cap = RelayConfig::default().max_handshakes_per_ip;
    // Each connection beyond the cap took the seat of an older one of its source, which closes.
    wait_stats(&relay, "the source holds its cap", |st| {
        st.handshaking <= cap as u64
    });
    pair_from(&relay, [127, 0, 0, 3], [127, 0, 0, 4], hash(20));
    drop(flood);
    let stats = relay.stop();
    assert_eq!(stats.paired_total, 1);
    assert_eq!(stats.refused_handshakes_per_ip, (flood_n - cap) as u64);
    assert!(stats.to_string().contains("handshakes_per_ip="), "{stats}");
}

/// Issue 46: 64 addresses x 16 silent sockets hold every one of the 1,024 hello seats (the
/// default limits). A newcomer takes the seat of the oldest silent one instead of being closed,
/// so a real session still pairs, and its client's hello needs well under a millisecond.
#[test]
fn silent_sockets_from_64_addresses_do_not_keep_a_session_out() {
    let Some(relay) = relay_for_a_flood() else {
        return;
    };
    let (max, per_ip) = (
        RelayConfig::default().max_handshakes,
        RelayConfig::default().max_handshakes_per_ip,
    );
    let sources = max / per_ip;
    let mut flood = Vec::new();
    for i in 0..sources {
        for _ in 0..per_ip {
            flood.push(connect_from([127, 0, 1, 10 + i as u8], relay.addr));
        }
    }
    wait_stats(&relay, "every hello seat taken", |st| {
        st.handshaking == max as u64
    });
    let started = Instant::now();
    pair_from(&relay, [127, 0, 0, 200], [127, 0, 0, 201], hash(40));
    let took = started.elapsed();
    // The time a real client needs from connect to its answer, with the seats still full.
    let started = Instant::now();
    let (_w, status) = hello_from([127, 0, 0, 202], relay.addr, 1, hash(41));
    let hello_took = started.elapsed();
    assert_eq!(status, Some(0), "WAITING");
    let st = relay.handle.stats();
    println!(
        "{} silent sockets from {sources} addresses: paired in {took:?}; a hello answered in \
         {hello_took:?}; {st}",
        flood.len()
    );
    assert!(st.evicted_handshakes >= 1, "{st}");
    // The silent sockets that gave way are the oldest: the first ones opened were closed.
    flood[0].set_read_timeout(Some(T)).unwrap();
    assert_eq!(flood[0].read(&mut [0u8; 1]).unwrap_or(0), 0);
    drop(flood);
    let stats = relay.stop();
    assert_eq!(stats.refused_full, 0, "{stats}");
    assert!(stats.to_string().contains("evicted_handshakes="), "{stats}");
}

/// A connection that sends nothing is closed after the default hello timeout of 3 s.
#[test]
fn a_silent_connection_is_closed_after_three_seconds() {
    let relay = start(quiet());
    let mut s = connect_from([127, 0, 0, 203], relay.addr);
    s.set_read_timeout(Some(T)).unwrap();
    let started = Instant::now();
    assert_eq!(s.read(&mut [0u8; 1]).unwrap_or(0), 0);
    let took = started.elapsed();
    assert!(
        (Duration::from_millis(2500)..Duration::from_secs(5)).contains(&took),
        "closed after {took:?}"
    );
    assert_eq!(relay.stop().refused_bad_hello, 1);
}

#[test]
fn one_address_cannot_hold_every_session_slot() {
    // Enough slots for what one address may hold, plus a few; the attacker asks for all of them
    // (within its per-minute rate) and waits.
    let relay = start(RelayConfig {
        max_sessions: 40,
        ..quiet()
    });
    let mut held = Vec::new();
    let mut refused = 0;
    for i in 0..40 {
        match hello_from([127, 0, 0, 5], relay.addr, 1, hash(200 + i)) {
            (s, Some(0)) => held.push(s),
            (_, _) => refused += 1,
        }
    }
    assert!(refused > 0, "one address took all {} slots", held.len());
    let cap = RelayConfig::default().max_sessions_per_ip;
    assert_eq!(held.len(), cap);
    // Another address still gets a session, and pairs.
    pair_from(&relay, [127, 0, 0, 6], [127, 0, 0, 7], hash(300));
    // The refusal is a clear status: TOO_MANY, and the client says what it means.
    let (_, status) = hello_from([127, 0, 0, 5], relay.addr, 2, hash(301));
    assert_eq!(status, Some(7), "TOO_MANY");
    // Both sides of a session count: the capped address cannot even join a waiting session.
    let (_w, status) = hello_from([127, 0, 0, 8], relay.addr, 1, hash(302));
    assert_eq!(status, Some(0));
    let (_, status) = hello_from([127, 0, 0, 5], relay.addr, 2, hash(302));
    assert_eq!(status, Some(7));
    // A session that ends gives its place back.
    held.pop();
    wait_stats(&relay, "slot released", |st| st.waiting == cap as u64);
    let (_again, status) = hello_from([127, 0, 0, 5], relay.addr, 1, hash(303));
    assert_eq!(status, Some(0), "WAITING again after one ended");
    drop(held);
    let stats = relay.stop();
    let refused = (40 - cap + 2) as u64;
    assert_eq!(stats.refused_sessions_per_ip, refused);
    assert!(
        stats
            .to_string()
            .contains(&format!("sessions_per_ip={refused}")),
        "{stats}"
    );
}

#[test]
fn the_client_reports_too_many_sessions_clearly() {
    let relay = start(RelayConfig {
        max_sessions_per_ip: 1,
        ..quiet()
    });
    let (_held, status) = raw_hello(relay.addr, 1, hash(310));
    assert_eq!(status, 0);
    let err = connect(relay.addr, Role::Sender, hash(311), T).unwrap_err();
    assert!(matches!(err, RelayError::TooMany), "{err}");
    assert_eq!(
        err.to_string(),
        "relay refused: too many sessions from this address at once, try again when one ends"
    );
}

#[test]
fn a_paired_session_trickling_bytes_is_closed() {
    // A 1 s window; the trickle sends one byte every 200 ms, so it is never idle for a window.
    let relay = start(RelayConfig {
        idle_timeout: Duration::from_secs(1),
        ..quiet()
    });
    let (s, mut r) = pair(relay.addr, hash(30));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut s = s;
            // Keeps the connection open until the relay closes it or the test gives up.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if s.write_all(b".").is_err() {
                    return;
                }
                thread::sleep(Duration::from_millis(200));
            }
        })
    };
    r.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let deadline = Instant::now() + T;
    let mut b = [0u8; 64];
    let closed = loop {
        match r.read(&mut b) {
            Ok(0) => break true,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break true,
            _ if Instant::now() > deadline => break false,
            _ => continue,
        }
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        closed,
        "a session moving a byte every 200 ms was never closed"
    );
    trickle.join().unwrap();
    let stats = relay.stop();
    assert_eq!((stats.slow_closed, stats.idle_closed), (1, 0));
    assert!(stats.to_string().contains("slow_closed=1"), "{stats}");
}

#[test]
fn a_session_moving_enough_in_every_window_stays_open() {
    // 2 s windows with a 64 KiB minimum; the sender moves 64 KiB every 50 ms for 4.5 s (three
    // windows), then finishes normally: nothing is cut. (Only a 2 s stall of the sender could
    // leave a window short.)
    let relay = start(RelayConfig {
        idle_timeout: Duration::from_secs(2),
        ..quiet()
    });
    let (s, mut r) = pair(relay.addr, hash(31));
    const CHUNK: usize = 64 << 10;
    let rounds = 90;
    let sender = thread::spawn(move || {
        let mut s = s;
        let mut gen = Stream(44);
        let mut buf = vec![0u8; CHUNK * rounds];
        gen.fill(&mut buf);
        for c in buf.chunks(CHUNK) {
            s.write_all(c).unwrap();
            thread::sleep(Duration::from_millis(50));
        }
        s.shutdown(Shutdown::Write).unwrap();
        s
    });
    check_stream(&mut r, 44, CHUNK * rounds);
    // All delivered, to the last byte: then both sides hang up and the session ends normally.
    drop((r, sender.join().unwrap()));
    wait_stats(&relay, "session ended", |st| st.active == 0);
    let stats = relay.stop();
    assert_eq!((stats.slow_closed, stats.idle_closed), (0, 0));
}

#[test]
fn a_paired_session_ends_at_its_lifetime() {
    let relay = start(RelayConfig {
        max_session_lifetime: Some(Duration::from_secs(1)),
        ..quiet()
    });
    let (s, mut r) = pair(relay.addr, hash(32));
    // A fast, steady stream: only the lifetime can end it.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pump = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut s = s;
            let buf = vec![7u8; 64 << 10];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && s.write_all(&buf).is_ok() {}
        })
    };
    r.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let deadline = Instant::now() + T;
    let mut b = vec![0u8; 1 << 20];
    let closed = loop {
        match r.read(&mut b) {
            Ok(0) => break true,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break true,
            _ if Instant::now() > deadline => break false,
            _ => continue,
        }
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(closed, "the session outlived its lifetime");
    pump.join().unwrap();
    assert_eq!(relay.stop().lifetime_closed, 1);
}

/// An end that is no relay, whose first answer byte happens to read as a refusal (a ferry peer's handshake
/// starts with 64 bytes that look random): the client says it is no relay, not that the relay refused.
/// The same byte followed by the end of the stream, as a relay sends it, is that refusal.
#[test]
fn a_refusal_byte_followed_by_more_bytes_is_no_relay() {
    for (status, more) in [(2u8, true), (4, true), (7, true), (4, false), (6, false)] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut hello = [0u8; 34];
            s.read_exact(&mut hello).unwrap();
            let mut answer = vec![status];
            if more {
                answer.extend((1..64u8).map(|i| i.wrapping_mul(37)));
            }
            s.write_all(&answer).unwrap();
            // The client may have read enough and hung up already (then this fails, harmlessly).
            let _ = s.shutdown(Shutdown::Write);
            // Held until the client is done, as a peer waiting for the rest of a handshake would.
            let _ = s.read(&mut [0u8; 1]);
        });
        let err = connect(addr, Role::Receiver, hash(400), T).unwrap_err();
        match more {
            true => assert!(
                matches!(err, RelayError::UnknownStatus(s) if s == status),
                "status {status}: {err}"
            ),
            false => assert!(
                !matches!(err, RelayError::UnknownStatus(_)),
                "status {status}: {err}"
            ),
        }
        peer.join().unwrap();
    }
}
