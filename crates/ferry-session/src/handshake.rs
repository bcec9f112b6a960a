//! The handshake on one connection, and handshakes raced side by side on the waiting side.
//!
//! The waiting side's slots are what a stranger attacks: anyone who knows the port can open sockets and
//! say nothing, or trickle. So a connection gets [`FIRST_FLIGHT_DEADLINE`] for its first flight (a ferry
//! sends its key share as it connects and its terminator one round trip later), and when the slots are
//! full a newcomer takes the place of the connection that did least: the oldest that sent nothing, then
//! the oldest that sent less than a key share (a ferry's first packet holds a whole one), then the oldest
//! that has not sent a first flight, then the oldest that stalls after it.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ferry_channel::{Auth, ChannelError, CodeAttempts, Config, Established, Handshake, Role};

use crate::{Events, PathKind};

/// How long one handshake may take in all, whatever the peer does (each read and write gets only what is left).
pub(crate) const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(15);
/// How long the waiting side waits for a connection's first flight (key share, garbage, terminator): a
/// ferry sends it within one round trip, so a socket that is silent or trickles loses its slot by then.
pub(crate) const FIRST_FLIGHT_DEADLINE: Duration = Duration::from_secs(3);
/// Age after which a connection that sent its first flight may give its slot to a newcomer when all are
/// taken: a ferry finishes a few round trips after its first flight, so one still running is stalling.
const STALLED_AFTER: Duration = Duration::from_secs(5);
/// Most handshakes the waiting side runs at once.
const MAX_HANDSHAKES: usize = 16;
/// Most handshakes at once from one source (an IPv4 address, an IPv6 /64), so one host cannot take every
/// slot by itself.
const MAX_HANDSHAKES_PER_SOURCE: usize = 4;
/// Connections that fail before a first flight are reported one by one only this often, so that a flood
/// of them cannot flood the log too.
const NOISE_EVERY: Duration = Duration::from_secs(10);

/// The handshake with `auth` (a code, a path upgrade's one-time secret, an identity), finished by `deadline` or
/// failed, and charged to `attempts` when the password is the code.
pub fn handshake_with(
    stream: TcpStream,
    role: Role,
    auth: Auth,
    attempts: Option<&Arc<CodeAttempts>>,
    deadline: Instant,
) -> Result<(TcpStream, Established), ChannelError> {
    let by = Deadlines {
        first_flight: deadline,
        done: deadline,
    };
    shake(stream, role, auth, attempts, by, &Progress::default())
}

/// The looking side's handshake, as [`handshake_with`]; a failure says whether the peer had sent any byte
/// (a waiting side whose slots are all taken closes a connection before its first).
pub(crate) fn initiate(
    stream: TcpStream,
    auth: Auth,
    attempts: Option<&Arc<CodeAttempts>>,
) -> Result<(TcpStream, Established), (ChannelError, bool)> {
    let deadline = Instant::now() + HANDSHAKE_DEADLINE;
    let by = Deadlines {
        first_flight: deadline,
        done: deadline,
    };
    let progress = Progress::default();
    shake(stream, Role::Initiator, auth, attempts, by, &progress)
        .map_err(|e| (e, progress.get() > Progress::SILENT))
}

/// True for a failure that means the peer closed the connection: with nothing heard from it, a waiting
/// side that was busy, worth dialling again.
pub(crate) fn closed_at_once(e: &ChannelError) -> bool {
    match e {
        ChannelError::NotFerry => true,
        ChannelError::Io(e) => matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

/// When the peer's first flight must have arrived, and when the whole handshake must be done.
#[derive(Clone, Copy)]
struct Deadlines {
    first_flight: Instant,
    done: Instant,
}

/// How far a handshake got, as its thread sees it: [`Progress::SILENT`], [`Progress::HEARD`] (some bytes),
/// [`Progress::KEYED`] (the peer's first flight arrived); [`Progress::KEY_SHARE`] (a key share's worth of
/// bytes) is read from the kernel's count only, by [`Running::progress`].
#[derive(Default)]
struct Progress(AtomicU8);

impl Progress {
    const SILENT: u8 = 0;
    const HEARD: u8 = 1;
    const KEY_SHARE: u8 = 2;
    const KEYED: u8 = 3;

    fn get(&self) -> u8 {
        self.0.load(Ordering::Relaxed)
    }

    fn reach(&self, step: u8) {
        self.0.fetch_max(step, Ordering::Relaxed);
    }
}

fn shake(
    mut stream: TcpStream,
    role: Role,
    auth: Auth,
    attempts: Option<&Arc<CodeAttempts>>,
    by: Deadlines,
    progress: &Progress,
) -> Result<(TcpStream, Established), ChannelError> {
    stream.set_nodelay(true).ok();
    let mut hs = Handshake::new(role, Config::ferry(), auth);
    if let Some(attempts) = attempts {
        hs = hs.with_attempts(Arc::clone(attempts));
    }
    // Our key share and garbage leave first; the next flight (the version packet's) is padded to what the
    // first window still lets out, so the data after the handshake starts from a warm window.
    let first = hs.take_output();
    write_by(&mut stream, &first, by.done)?;
    if let Ok(free) = crate::congestion::free_window(&stream, first.len()) {
        hs.pad_next_flight(free);
    }
    let est = drive(&mut stream, hs, by, progress)?;
    Ok((stream, est))
}

/// Runs `hs` to its end over `stream`: every read gets only the time left until the first flight's
/// deadline (until it arrived) or the whole handshake's, so a peer that trickles cannot stretch either.
fn drive(
    stream: &mut TcpStream,
    mut hs: Handshake,
    by: Deadlines,
    progress: &Progress,
) -> Result<Established, ChannelError> {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        if hs.has_output() {
            write_by(stream, &hs.take_output(), by.done)?;
        }
        if hs.is_done() {
            stream.set_read_timeout(None)?;
            stream.set_write_timeout(None)?;
            return hs.finish();
        }
        let until = match progress.get() {
            Progress::KEYED => by.done,
            _ => by.first_flight.min(by.done),
        };
        stream.set_read_timeout(Some(time_left(until)?))?;
        let n = stream.read(&mut buf).map_err(timed_out)?;
        if n == 0 {
            return Err(hs.eof_error());
        }
        progress.reach(Progress::HEARD);
        if let Err(e) = hs.feed(&buf[..n]) {
            // Let the peer see our last messages (a key confirmation, say) so it fails with the same cause.
            let _ = write_by(stream, &hs.take_output(), by.done);
            return Err(e);
        }
        if hs.first_flight_received() {
            progress.reach(Progress::KEYED);
        }
    }
}

/// Writes all of `bytes` by `until`, each write getting only what is left.
fn write_by(stream: &mut TcpStream, mut bytes: &[u8], until: Instant) -> io::Result<()> {
    while !bytes.is_empty() {
        stream.set_write_timeout(Some(time_left(until)?))?;
        match stream.write(bytes).map_err(timed_out)? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => bytes = &bytes[n..],
        }
    }
    Ok(())
}

fn time_left(until: Instant) -> io::Result<Duration> {
    match until.saturating_duration_since(Instant::now()) {
        left if left.is_zero() => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the handshake took too long",
        )),
        left => Ok(left),
    }
}

/// A socket timeout reads as `WouldBlock` on Linux; name it for what it is.
fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::TimedOut, "the handshake took too long")
    } else {
        e
    }
}

/// What a handshake is for: the meeting (the first connection) or a path upgrade's one-time secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Authenticated as the meeting says.
    Meeting,
    /// Authenticated by a path upgrade's secret.
    Upgrade,
}

/// A handshake that ended, one way or the other.
pub(crate) struct Finished {
    id: u64,
    pub(crate) purpose: Purpose,
    pub(crate) path: PathKind,
    pub(crate) peer: String,
    /// How long the handshake took.
    pub(crate) took: Duration,
    /// Whether the peer's first flight had arrived.
    pub(crate) keyed: bool,
    pub(crate) result: Result<(TcpStream, Established), ChannelError>,
}

/// What reaches the waiting side's loop: a connection from its listener or the relay, or a handshake's end.
pub(crate) enum Event {
    Offered(TcpStream, PathKind, String),
    RelayFailed(crate::SessionError),
    /// Relay trouble that waiting outlives (a taken meeting, asked for again): only worth a warning.
    RelayWarning(String),
    Finished(Box<Finished>),
}

/// One running handshake, as the waiting side's slots see it.
struct Running {
    /// Its source (an IPv4 address, an IPv6 /64); `None` through the relay.
    source: Option<IpAddr>,
    started: Instant,
    progress: Arc<Progress>,
    /// A handle to close it.
    stream: TcpStream,
}

impl Running {
    /// What it did so far, least first: nothing, some bytes, a key share's worth, its first flight. The
    /// first three by the kernel's count, so that a connection whose thread has not run yet (a flood keeps
    /// both cores busy) is not taken for one that did less: a ferry's key share arrives with its connection,
    /// while a trickling socket turned over with the others made a real client the oldest in its class.
    fn progress(&self) -> u8 {
        let heard = crate::congestion::bytes_received(&self.stream).unwrap_or(0);
        match self.progress.get() {
            Progress::KEYED => Progress::KEYED,
            _ if heard >= ferry_channel::keys::ELLSWIFT_LEN as u64 => Progress::KEY_SHARE,
            _ if heard > 0 => Progress::HEARD,
            p => p,
        }
    }
}

/// Handshakes running side by side, each on its own thread and each bounded by [`FIRST_FLIGHT_DEADLINE`]
/// and [`HANDSHAKE_DEADLINE`], so one slow or hostile connection never holds up the real peer.
pub(crate) struct Handshakes {
    tx: mpsc::Sender<Event>,
    running: HashMap<u64, Running>,
    next_id: u64,
    /// Connections dropped before a first flight since the last report, and when that was.
    noise: (u64, Option<Instant>),
}

impl Handshakes {
    /// No handshake yet; finished ones are reported on `tx`.
    pub(crate) fn new(tx: mpsc::Sender<Event>) -> Self {
        Handshakes {
            tx,
            running: HashMap::new(),
            next_id: 0,
            noise: (0, None),
        }
    }

    /// Starts a handshake on its own thread. When too many run already, in all or from its source, the
    /// one that did least makes room (see the module's summary); when none may, the new connection is
    /// refused (closed).
    pub(crate) fn start(
        &mut self,
        stream: TcpStream,
        path: PathKind,
        peer: String,
        purpose: Purpose,
        auth: Auth,
        attempts: Option<Arc<CodeAttempts>>,
    ) -> Result<(), String> {
        // The relay's connections all come from the relay: only direct ones are limited per source.
        let source = match path {
            PathKind::Relay => None,
            _ => stream
                .peer_addr()
                .ok()
                .map(|a| ferry_relay::source_key(a.ip())),
        };
        let from_source = |r: &Running| source.is_some() && r.source == source;
        if source.is_some()
            && self.running.values().filter(|r| from_source(r)).count() >= MAX_HANDSHAKES_PER_SOURCE
            && !self.make_room(from_source)
        {
            return Err(format!(
                "{MAX_HANDSHAKES_PER_SOURCE} handshakes from that source are running already"
            ));
        }
        if self.running.len() >= MAX_HANDSHAKES && !self.make_room(|_| true) {
            return Err(format!("{MAX_HANDSHAKES} handshakes are running already"));
        }
        let id = self.next_id;
        self.next_id += 1;
        let progress = Arc::new(Progress::default());
        let started = Instant::now();
        if let Ok(handle) = stream.try_clone() {
            let progress = Arc::clone(&progress);
            let running = Running {
                source,
                started,
                progress,
                stream: handle,
            };
            self.running.insert(id, running);
        }
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            let by = Deadlines {
                first_flight: started + FIRST_FLIGHT_DEADLINE,
                done: started + HANDSHAKE_DEADLINE,
            };
            let role = Role::Responder;
            let result = shake(stream, role, auth, attempts.as_ref(), by, &progress);
            let _ = tx.send(Event::Finished(Box::new(Finished {
                id,
                purpose,
                path,
                peer,
                took: started.elapsed(),
                keyed: progress.get() == Progress::KEYED,
                result,
            })));
        });
        Ok(())
    }

    /// Closes the running handshake among `which` that did least (oldest first among equals; one that sent
    /// its first flight only once it has run [`STALLED_AFTER`]); false when none may be closed.
    fn make_room(&mut self, which: impl Fn(&Running) -> bool) -> bool {
        let now = Instant::now();
        let victim = self
            .running
            .iter()
            .filter(|(_, r)| which(r))
            .map(|(id, r)| (r.progress(), r.started, *id))
            .filter(|(p, started, _)| {
                *p < Progress::KEYED || now.duration_since(*started) >= STALLED_AFTER
            })
            .min();
        let Some((_, _, id)) = victim else {
            return false;
        };
        if let Some(r) = self.running.remove(&id) {
            // Its thread reads the end of the stream at once and reports.
            let _ = r.stream.shutdown(std::net::Shutdown::Both);
        }
        true
    }

    /// The handshake `f` reported its end.
    pub(crate) fn finished(&mut self, f: &Finished) {
        self.running.remove(&f.id);
    }

    /// Whether a failed handshake from `peer` deserves a warning of its own: one whose peer sent a first
    /// flight (`keyed`) does; of the others (silent, trickling, made room for, not ferry) the first does,
    /// and then a count every [`NOISE_EVERY`] is said here instead.
    pub(crate) fn worth_a_warning(
        &mut self,
        keyed: bool,
        peer: &str,
        events: &mut dyn Events,
    ) -> bool {
        if keyed {
            return true;
        }
        let now = Instant::now();
        let (count, said) = &mut self.noise;
        match said {
            None => {
                *said = Some(now);
                true
            }
            Some(at) if now.duration_since(*at) >= NOISE_EVERY => {
                *count += 1;
                events.warn(&format!(
                    "dropped {count} connections in the last {}s that sent no ferry handshake in time                      (last from {})",
                    now.duration_since(*at).as_secs(),
                    peer
                ));
                (*count, *said) = (0, Some(now));
                false
            }
            Some(_) => {
                *count += 1;
                false
            }
        }
    }

    /// Ends every running handshake: their threads fail at once and report, and their connections close.
    pub(crate) fn stop_all(&mut self) {
        for (_, r) in self.running.drain() {
            let _ = r.stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Issue 46: under a flood the slots turn over within a real client's round trip, so a client whose key
    /// share arrived became the oldest connection that had "heard" anything and was closed mid-handshake
    /// (the flood test failed 2 times in 6): a trickler goes first.
    #[test]
    fn a_newcomer_closes_a_trickler_before_a_connection_that_sent_a_key_share() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, _rx) = mpsc::channel();
        let mut slots = Handshakes::new(tx);
        let start = |slots: &mut Handshakes, first: &[u8]| {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(first).unwrap();
            let (s, _) = listener.accept().unwrap();
            let code = Auth::Code(b"7-amber-otter".to_vec());
            // Through the relay: no per-source limit, only the slots.
            slots
                .start(s, PathKind::Relay, "x".into(), Purpose::Meeting, code, None)
                .unwrap();
            c
        };
        // The oldest sent a key share (and waits for the answer, as a client does); the others a byte.
        let mut clients = vec![start(&mut slots, &[7; 64])];
        for _ in 1..MAX_HANDSHAKES {
            clients.push(start(&mut slots, &[7]));
        }
        std::thread::sleep(Duration::from_millis(100));
        clients.push(start(&mut slots, &[]));
        assert_eq!(slots.running.len(), MAX_HANDSHAKES);
        assert!(
            slots.running.contains_key(&0),
            "the key share's connection was closed"
        );
        assert!(
            !slots.running.contains_key(&1),
            "the oldest trickler still runs"
        );
        slots.stop_all();
    }

    /// Both sides pad the flight of their version packet to what the first window lets out (on loopback a
    /// first window of 10 segments of 64 KiB, so the padding's limit): each side received at least that.
    #[test]
    fn a_real_handshake_fills_the_first_window_both_ways() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let code = || Auth::Code(b"7-amber-otter".to_vec());
        let deadline = Instant::now() + HANDSHAKE_DEADLINE;
        let responder = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            handshake_with(s, Role::Responder, code(), None, deadline).unwrap()
        });
        let s = TcpStream::connect(addr).unwrap();
        let (initiator, a) = handshake_with(s, Role::Initiator, code(), None, deadline).unwrap();
        let (responder, b) = responder.join().unwrap();
        assert_eq!(a.session_id, b.session_id);
        for (side, s) in [("initiator", &initiator), ("responder", &responder)] {
            let received = crate::congestion::bytes_received(s).unwrap();
            assert!(
                received >= (ferry_channel::MAX_PAD - 100) as u64,
                "the {side} received {received} bytes in the handshake"
            );
        }
    }
}
