//! End-to-end tests of the relay over real sockets on 127.0.0.1.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ferry_relay::{connect, Forwarding, Relay, RelayConfig, RelayError, RelayHandle, Role, Stats};

const T: Duration = Duration::from_secs(20);

struct Running {
    addr: SocketAddr,
    handle: RelayHandle,
    thread: Option<JoinHandle<std::io::Result<Stats>>>,
}

impl Running {
    fn stop(mut self) -> Stats {
        self.handle.shutdown();
        self.thread.take().unwrap().join().unwrap().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

fn quiet() -> RelayConfig {
    RelayConfig {
        print_stats: false,
        worker_threads: 2,
        shutdown_grace: Duration::from_secs(1),
        ..RelayConfig::default()
    }
}

fn start(config: RelayConfig) -> Running {
    let relay = Relay::bind("127.0.0.1:0", config).unwrap();
    let addr = relay.local_addr();
    let handle = relay.shutdown_handle();
    let thread = Some(thread::spawn(move || relay.run_blocking()));
    Running {
        addr,
        handle,
        thread,
    }
}

fn hash(n: u64) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(&n.to_le_bytes());
    h[8] = 0xfe;
    h
}

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
