//! End-to-end tests of the relay's listener extension over real sockets on 127.0.0.x: a listener
//! that is paired repeatedly, and the hostile cases around it.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use ferry_relay::protocol::{FromRelay, Request, ToRelay, Token};
use ferry_relay::{accept_token, connect, Listener, RelayConfig, RelayError, Role};

mod support;
use support::*;

/// A listener speaking the control protocol by hand, so a test can misbehave.
struct RawListener {
    s: TcpStream,
    buf: Vec<u8>,
}

impl RawListener {
    /// Registers from `src` and returns the connection after `LISTENING`; `Err(status)` for a
    /// refusal.
    fn register(src: [u8; 4], relay: SocketAddr) -> Result<RawListener, u8> {
        let mut s = connect_from(src, relay);
        s.set_read_timeout(Some(T)).unwrap();
        s.write_all(&Request::Listen.encode()).unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        match b[0] {
            8 => Ok(RawListener { s, buf: Vec::new() }),
            other => Err(other),
        }
    }

    fn send(&mut self, m: ToRelay) {
        self.s.write_all(&m.encode()).unwrap();
    }

    /// The next message that is not a `PING` (those are answered).
    fn recv(&mut self) -> FromRelay {
        loop {
            if let Some((m, used)) = FromRelay::decode(&self.buf).unwrap() {
                self.buf.drain(..used);
                if m == FromRelay::Ping {
                    self.send(ToRelay::Pong);
                    continue;
                }
                return m;
            }
            let mut b = [0u8; 256];
            let n = self.s.read(&mut b).unwrap();
            assert!(n > 0, "relay closed the control connection");
            self.buf.extend_from_slice(&b[..n]);
        }
    }

    fn set(&mut self, hashes: &[[u8; 32]]) -> Result<(), u8> {
        self.send(ToRelay::SetHashes(hashes.to_vec()));
        match self.recv() {
            FromRelay::HashesSet(r) => r,
            other => panic!("expected HASHES_SET, got {other:?}"),
        }
    }

    fn incoming(&mut self) -> (Token, [u8; 32]) {
        match self.recv() {
            FromRelay::Incoming { token, hash } => (token, hash),
            other => panic!("expected INCOMING, got {other:?}"),
        }
    }

    /// Reads until the relay closes the connection; `true` when it did within `T`.
    fn closed_by_relay(&mut self) -> bool {
        let deadline = Instant::now() + T;
        let mut b = [0u8; 4096];
        while Instant::now() < deadline {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {
                    return false
                }
                Err(e) => panic!("{e}"),
            }
        }
        false
    }
}

/// A client under `h` on its own thread: it connects as `role`, reads the greeting the listener
/// writes, and echoes it back.
fn client(
    addr: SocketAddr,
    role: Role,
    h: [u8; 32],
) -> thread::JoinHandle<Result<u64, RelayError>> {
    thread::spawn(move || {
        let mut s = connect(addr, role, h, T)?;
        s.set_read_timeout(Some(T)).unwrap();
        let mut b = [0u8; 8];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b).unwrap();
        Ok(u64::from_le_bytes(b))
    })
}

/// The listener's side of [`client`]: greets with `n` and checks the echo.
fn serve(mut s: TcpStream, n: u64) {
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(&n.to_le_bytes()).unwrap();
    let mut b = [0u8; 8];
    s.read_exact(&mut b).unwrap();
    assert_eq!(
        u64::from_le_bytes(b),
        n,
        "the echo came from another client"
    );
}

/// `listener.accept()`, failing the test (instead of hanging it) when it does not return within
/// `T`.
fn accept_within(listener: &Arc<Listener>) -> Result<(TcpStream, [u8; 32]), RelayError> {
    let (tx, rx) = mpsc::channel();
    let l = listener.clone();
    thread::spawn(move || tx.send(l.accept()));
    rx.recv_timeout(T).expect("accept did not return in time")
}

#[test]
fn a_listener_serves_one_client_after_another_and_several_at_once() {
    let relay = start(quiet());
    let (h1, h2) = (hash(1), hash(2));
    let listener = Arc::new(Listener::register(relay.addr, &[h1, h2], T).unwrap());
    // One after another, under either hash, in either role.
    for (i, (role, h)) in [
        (Role::Receiver, h1),
        (Role::Sender, h2),
        (Role::Receiver, h1),
    ]
    .into_iter()
    .enumerate()
    {
        let c = client(relay.addr, role, h);
        let (s, got) = accept_within(&listener).unwrap();
        assert_eq!(got, h);
        serve(s, i as u64);
        assert_eq!(c.join().unwrap().unwrap(), i as u64);
    }
    // Three at once under one hash, two of them of the same role and one of the other: each is
    // served by the listener, none is paired with another client (nor refused as TAKEN).
    let clients = [Role::Receiver, Role::Receiver, Role::Sender].map(|r| client(relay.addr, r, h1));
    let mut streams: Vec<_> = (0..3)
        .map(|_| accept_within(&listener).unwrap().0)
        .collect();
    let servers: Vec<_> = streams
        .drain(..)
        .enumerate()
        .map(|(i, s)| thread::spawn(move || serve(s, 100 + i as u64)))
        .collect();
    let mut got: Vec<u64> = clients.map(|c| c.join().unwrap().unwrap()).to_vec();
    got.sort_unstable();
    assert_eq!(got, [100, 101, 102]);
    servers.into_iter().for_each(|s| s.join().unwrap());
    let st = relay.handle.stats();
    assert_eq!(
        (st.listeners, st.listeners_total, st.notifications),
        (1, 1, 6)
    );
    assert!(st.to_string().contains("listeners=1"), "{st}");
    drop(listener);
    wait_stats(&relay, "listener gone", |st| st.listeners == 0);
    let st = relay.stop();
    assert_eq!((st.paired_total, st.refused_taken), (6, 0));
}

#[test]
fn a_client_without_a_listener_waits_as_before_and_is_announced_when_one_comes() {
    let relay = start(RelayConfig {
        max_wait: Duration::from_secs(1),
        ..quiet()
    });
    let _other = Listener::register(relay.addr, &[hash(10)], T).unwrap();
    // Under a hash nobody listens on: WAITING, then TIMEOUT at the wait limit, as today.
    let t0 = Instant::now();
    let err = connect(relay.addr, Role::Receiver, hash(11), T).unwrap_err();
    assert!(matches!(err, RelayError::PeerTimeout), "{err}");
    assert!(t0.elapsed() >= Duration::from_millis(900));
    // A client that waits before the listener registers its hash is announced at registration.
    let relay2 = start(quiet());
    let c = client(relay2.addr, Role::Receiver, hash(12));
    wait_stats(&relay2, "client waiting", |st| st.waiting == 1);
    let listener = Arc::new(Listener::register(relay2.addr, &[hash(12)], T).unwrap());
    let (s, h) = accept_within(&listener).unwrap();
    assert_eq!(h, hash(12));
    serve(s, 7);
    assert_eq!(c.join().unwrap().unwrap(), 7);
}

#[test]
fn an_unanswered_notification_expires_and_its_token_with_it() {
    let relay = start(RelayConfig {
        listener_answer_timeout: Duration::from_secs(1),
        ..quiet()
    });
    let mut raw = RawListener::register([127, 0, 0, 1], relay.addr).unwrap();
    raw.set(&[hash(20)]).unwrap();
    let t0 = Instant::now();
    let c = client(relay.addr, Role::Receiver, hash(20));
    let (token, h) = raw.incoming();
    assert_eq!(h, hash(20));
    // Never answered: the client gets TIMEOUT once the answer time is over, not at max_wait.
    let err = c.join().unwrap().unwrap_err();
    assert!(matches!(err, RelayError::PeerTimeout), "{err}");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    // The token is dead: a late accept connection is refused.
    let late = accept_token(relay.addr, token, T).unwrap_err();
    assert!(matches!(late, RelayError::PeerTimeout), "{late}");
    let st = relay.stop();
    assert_eq!((st.tokens_expired, st.refused_token), (1, 1));
    assert!(st.to_string().contains("tokens_expired=1"), "{st}");
}

#[test]
fn tokens_are_single_use_and_cannot_be_guessed() {
    let relay = start(quiet());
    let mut raw = RawListener::register([127, 0, 0, 1], relay.addr).unwrap();
    raw.set(&[hash(30)]).unwrap();
    let c1 = client(relay.addr, Role::Receiver, hash(30));
    let (t1, _) = raw.incoming();
    let c2 = client(relay.addr, Role::Receiver, hash(30));
    let (t2, _) = raw.incoming();
    assert_ne!(t1, t2);
    assert_ne!(t1, hash(30));
    assert_ne!(t1, [0; 32]);
    // A token one bit off, and the hash itself, are nobody's.
    let mut near = t1;
    near[31] ^= 1;
    for wrong in [near, hash(30)] {
        let err = accept_token(relay.addr, wrong, T).unwrap_err();
        assert!(matches!(err, RelayError::PeerTimeout), "{err}");
    }
    // Each token reaches its own client, once.
    serve(accept_token(relay.addr, t1, T).unwrap(), 1);
    serve(accept_token(relay.addr, t2, T).unwrap(), 2);
    assert_eq!(c1.join().unwrap().unwrap(), 1);
    assert_eq!(c2.join().unwrap().unwrap(), 2);
    let again = accept_token(relay.addr, t1, T).unwrap_err();
    assert!(matches!(again, RelayError::PeerTimeout), "{again}");
    let st = relay.stop();
    assert_eq!((st.refused_token, st.paired_total), (3, 2));
}

#[test]
fn a_hash_has_one_listener_and_a_dead_listener_frees_its_hashes() {
    let relay = start(RelayConfig {
        // Long, so that only the listener's death can end the announced client's wait quickly.
        listener_answer_timeout: Duration::from_secs(120),
        ..quiet()
    });
    let mut first = RawListener::register([127, 0, 0, 1], relay.addr).unwrap();
    first.set(&[hash(40), hash(41)]).unwrap();
    // A second listener may not take a hash the first holds: TAKEN, naming which, and the whole
    // set is refused (hash 42 is not taken either).
    let err = Listener::register(relay.addr, &[hash(42), hash(41)], T)
        .err()
        .unwrap();
    assert!(matches!(err, RelayError::HashTaken(1)), "{err}");
    let c = client(relay.addr, Role::Receiver, hash(42));
    wait_stats(&relay, "ordinary wait", |st| {
        st.waiting == 1 && st.notifications == 0
    });
    // A client announced to the first, which then dies: the client is told at once.
    let announced = client(relay.addr, Role::Sender, hash(40));
    first.incoming();
    let t0 = Instant::now();
    drop(first);
    let err = announced.join().unwrap().unwrap_err();
    assert!(matches!(err, RelayError::PeerTimeout), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    // Its hashes are free: a new listener takes them (and the one waiting on 42 is announced).
    wait_stats(&relay, "first listener gone", |st| st.listeners == 0);
    let second =
        Arc::new(Listener::register(relay.addr, &[hash(40), hash(41), hash(42)], T).unwrap());
    let (s, h) = accept_within(&second).unwrap();
    assert_eq!(h, hash(42));
    serve(s, 5);
    assert_eq!(c.join().unwrap().unwrap(), 5);
    let st = relay.stop();
    assert_eq!(st.refused_taken, 1);
}

#[test]
fn set_hashes_replaces_the_set_without_reconnecting() {
    let relay = start(RelayConfig {
        max_wait: Duration::from_secs(1),
        ..quiet()
    });
    let listener = Arc::new(Listener::register(relay.addr, &[hash(50), hash(51)], T).unwrap());
    listener.set_hashes(&[hash(51), hash(52)]).unwrap();
    // 50 is no longer listened: a client there waits and times out as an ordinary one.
    let err = connect(relay.addr, Role::Receiver, hash(50), T).unwrap_err();
    assert!(matches!(err, RelayError::PeerTimeout), "{err}");
    // 52 is.
    let c = client(relay.addr, Role::Receiver, hash(52));
    let (s, h) = accept_within(&listener).unwrap();
    assert_eq!(h, hash(52));
    serve(s, 9);
    assert_eq!(c.join().unwrap().unwrap(), 9);
    // 50 is free for another listener; 51 is not.
    let other = Listener::register(relay.addr, &[hash(50)], T).unwrap();
    let err = other.set_hashes(&[hash(50), hash(51)]).unwrap_err();
    assert!(matches!(err, RelayError::HashTaken(1)), "{err}");
    // More than 64 hashes are refused by the client before anything is sent.
    let err = listener.set_hashes(&[hash(0); 65]).unwrap_err();
    assert!(matches!(err, RelayError::TooManyHashes(65)), "{err}");
    let st = relay.stop();
    assert_eq!((st.listeners_total, st.notifications), (2, 1));
}

#[test]
fn keepalive_keeps_an_honest_listener_and_drops_a_silent_one() {
    let every = Duration::from_millis(200);
    let relay = start(RelayConfig {
        keepalive_interval: every,
        ..quiet()
    });
    let honest =
        Arc::new(Listener::register_with_keepalive(relay.addr, &[hash(60)], T, every).unwrap());
    // A listener that registers and then never reads nor answers a ping.
    let mut silent = RawListener::register([127, 0, 0, 2], relay.addr).unwrap();
    silent.set(&[hash(61)]).unwrap();
    silent
        .s
        .set_read_timeout(Some(Duration::from_millis(1)))
        .unwrap();
    let t0 = Instant::now();
    wait_stats(&relay, "silent listener dropped", |st| {
        st.listeners_dropped == 1
    });
    assert!(
        t0.elapsed() >= every * 2,
        "dropped after {:?}",
        t0.elapsed()
    );
    silent.s.set_read_timeout(Some(T)).unwrap();
    assert!(silent.closed_by_relay());
    // Ten intervals later the honest one is still registered and serves a client.
    thread::sleep(every * 10);
    let c = client(relay.addr, Role::Receiver, hash(60));
    let (s, _) = accept_within(&honest).unwrap();
    serve(s, 3);
    assert_eq!(c.join().unwrap().unwrap(), 3);
    // The silent one's hash is free.
    Listener::register(relay.addr, &[hash(61)], T).unwrap();
    let st = relay.stop();
    assert_eq!((st.listeners_dropped, st.listeners_total), (1, 3));
}

#[test]
fn a_listener_notices_a_relay_that_went_silent() {
    // Something that answers like a relay once and then says nothing, ever (a relay behind a
    // NAT that dropped the mapping looks the same).
    let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap();
    let mute = thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        let mut hello = [0u8; 34];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&[8]).unwrap();
        let mut set = [0u8; 2 + 32];
        s.read_exact(&mut set).unwrap();
        s.write_all(&FromRelay::HashesSet(Ok(())).encode()).unwrap();
        // Read (pings) until the listener hangs up.
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
        sink.iter().filter(|&&b| b == 0x02).count()
    });
    let every = Duration::from_millis(200);
    let listener =
        Arc::new(Listener::register_with_keepalive(addr, &[hash(70)], T, every).unwrap());
    let t0 = Instant::now();
    let err = accept_within(&listener).unwrap_err();
    assert!(matches!(err, RelayError::KeepAliveTimeout), "{err}");
    assert!(t0.elapsed() >= every * 3 && t0.elapsed() < T);
    drop(listener);
    assert!(mute.join().unwrap() >= 1, "the listener never pinged");
}

#[test]
fn a_flooding_or_garbled_control_connection_is_closed() {
    let relay = start(quiet());
    // Ten thousand pings, never reading a pong.
    let mut flood = RawListener::register([127, 0, 0, 3], relay.addr).unwrap();
    flood.set(&[hash(80)]).unwrap();
    let pings = vec![0x02u8; 10_000];
    let _ = flood.s.write_all(&pings);
    assert!(flood.closed_by_relay());
    // An unknown message type, and a set over the bound.
    for bad in [vec![0x7f], vec![0x01, 65]] {
        let mut g = RawListener::register([127, 0, 0, 4], relay.addr).unwrap();
        g.s.write_all(&bad).unwrap();
        assert!(g.closed_by_relay(), "{bad:?} was accepted");
    }
    wait_stats(&relay, "all three dropped", |st| {
        st.listeners_dropped == 3 && st.listeners == 0
    });
    // The flooder's hash is free and the relay serves others as before.
    let listener = Arc::new(Listener::register(relay.addr, &[hash(80)], T).unwrap());
    let c = client(relay.addr, Role::Receiver, hash(80));
    serve(accept_within(&listener).unwrap().0, 4);
    assert_eq!(c.join().unwrap().unwrap(), 4);
}

/// Issue 46: a stranger with 16 addresses asks for 16 listener seats from each, as many as the
/// relay has (256, the default limits), without knowing any meeting hash. Each address gets 4
/// (`TOO_MANY` for the rest), and a real listener still registers and serves a client, and a
/// sender and a receiver still pair.
#[test]
fn strangers_from_16_addresses_cannot_take_every_listener_seat() {
    let relay = start(quiet());
    let defaults = RelayConfig::default();
    let per_source = defaults.max_listeners / 16;
    let mut held = Vec::new();
    let mut refused = 0;
    for i in 0..16u8 {
        for _ in 0..per_source {
            match RawListener::register([127, 0, 2, 10 + i], relay.addr) {
                Ok(l) => held.push(l),
                Err(status) => {
                    assert_eq!(status, 7, "TOO_MANY");
                    refused += 1;
                }
            }
        }
    }
    assert_eq!(held.len(), 16 * defaults.max_listeners_per_ip);
    let listener = Arc::new(Listener::register(relay.addr, &[hash(100)], T).unwrap());
    let c = client(relay.addr, Role::Receiver, hash(100));
    serve(accept_within(&listener).unwrap().0, 5);
    assert_eq!(c.join().unwrap().unwrap(), 5);
    let addr = relay.addr;
    let (s, r) = (
        client(addr, Role::Sender, hash(101)),
        thread::spawn(move || {
            let mut s = connect(addr, Role::Receiver, hash(101), T).unwrap();
            s.write_all(&6u64.to_le_bytes()).unwrap();
            let mut b = [0u8; 8];
            s.set_read_timeout(Some(T)).unwrap();
            s.read_exact(&mut b).unwrap();
            u64::from_le_bytes(b)
        }),
    );
    assert_eq!(s.join().unwrap().unwrap(), 6);
    assert_eq!(r.join().unwrap(), 6);
    drop(held);
    drop(listener);
    let stats = relay.stop();
    assert_eq!(stats.refused_listeners_per_ip, refused, "{stats}");
    assert!(
        stats
            .to_string()
            .contains(&format!("listeners_per_ip={refused}")),
        "{stats}"
    );
}

#[test]
fn every_relay_limit_applies_to_listeners() {
    // Sessions per source: the control connection holds one place, the accept connection another.
    let relay = start(RelayConfig {
        max_sessions_per_ip: 1,
        ..quiet()
    });
    let _held = RawListener::register([127, 0, 0, 5], relay.addr).unwrap();
    assert_eq!(
        RawListener::register([127, 0, 0, 5], relay.addr).err(),
        Some(7),
        "TOO_MANY"
    );
    drop(relay);

    // New sessions per source per minute: the registration and each accept take a token.
    let relay = start(RelayConfig {
        sessions_per_ip_per_minute: 2,
        ..quiet()
    });
    let mut raw = RawListener::register([127, 0, 0, 6], relay.addr).unwrap();
    raw.set(&[hash(90)]).unwrap();
    let _c = client(relay.addr, Role::Receiver, hash(90));
    let (token, _) = raw.incoming();
    let mut s = connect_from([127, 0, 0, 6], relay.addr);
    s.write_all(&Request::Accept { token }.encode()).unwrap();
    let mut b = [0u8; 1];
    s.set_read_timeout(Some(T)).unwrap();
    s.read_exact(&mut b).unwrap();
    assert_eq!(b[0], 1, "PAIRED");
    assert_eq!(
        RawListener::register([127, 0, 0, 6], relay.addr).err(),
        Some(2),
        "RATE_LIMITED"
    );
    drop(relay);

    // Listeners at once, unanswered announcements per listener, and the session slots they hold.
    let relay = start(RelayConfig {
        max_listeners: 1,
        max_sessions: 3,
        max_pending_per_listener: 1,
        ..quiet()
    });
    let mut raw = RawListener::register([127, 0, 0, 7], relay.addr).unwrap();
    assert_eq!(
        RawListener::register([127, 0, 0, 8], relay.addr).err(),
        Some(3),
        "FULL: listeners"
    );
    raw.set(&[hash(91)]).unwrap();
    // The second client is refused, not queued, while a session slot is still free.
    let _first = client(relay.addr, Role::Receiver, hash(91));
    raw.incoming();
    let err = connect(relay.addr, Role::Sender, hash(91), T).unwrap_err();
    assert!(matches!(err, RelayError::Full), "{err}");
    // The listener, its waiting client and one ordinary waiter hold the three slots: FULL.
    let _ordinary = client(relay.addr, Role::Sender, hash(92));
    wait_stats(&relay, "ordinary waiter", |st| st.waiting == 2);
    let err = connect(relay.addr, Role::Sender, hash(93), T).unwrap_err();
    assert!(matches!(err, RelayError::Full), "{err}");
    let st = relay.stop();
    assert_eq!(st.refused_full, 3);

    // The hello timeout: a listener hello cut short is closed like any other.
    let relay = start(RelayConfig {
        hello_timeout: Duration::from_millis(300),
        ..quiet()
    });
    let mut s = TcpStream::connect(relay.addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(&[1, 3, 0, 0]).unwrap();
    assert_eq!(s.read(&mut [0u8; 1]).unwrap_or(0), 0);
    assert_eq!(relay.stop().refused_bad_hello, 1);
}
