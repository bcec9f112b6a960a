//! The handshake on one connection, and handshakes raced side by side on the waiting side.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, TcpStream};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ferry_channel::blocking;
use ferry_channel::{Auth, ChannelError, CodeAttempts, Config, Established, Handshake, Role};

use crate::PathKind;

/// How long one handshake may take in all, whatever the peer does (each read and write gets only what is left).
pub(crate) const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(15);
/// Most handshakes the waiting side runs at once; a connection beyond it is closed at once.
const MAX_HANDSHAKES: usize = 16;
/// Most handshakes at once from one source address, so one host cannot take every slot.
const MAX_HANDSHAKES_PER_SOURCE: usize = 4;

/// The handshake with `auth` (a code, a path upgrade's one-time secret, an identity), finished by `deadline` or
/// failed, and charged to `attempts` when the password is the code.
pub fn handshake_with(
    mut stream: TcpStream,
    role: Role,
    auth: Auth,
    attempts: Option<&Arc<CodeAttempts>>,
    deadline: Instant,
) -> Result<(TcpStream, Established), ChannelError> {
    stream.set_nodelay(true).ok();
    let mut hs = Handshake::new(role, Config::ferry(), auth);
    if let Some(attempts) = attempts {
        hs = hs.with_attempts(Arc::clone(attempts));
    }
    // Our key share and garbage leave first; the next flight (the version packet's) is padded to what the
    // first window still lets out, so the data after the handshake starts from a warm window.
    let first = hs.take_output();
    let left = deadline.saturating_duration_since(Instant::now());
    stream.set_write_timeout(Some(left.max(Duration::from_millis(1))))?;
    stream.write_all(&first)?;
    if let Ok(free) = crate::congestion::free_window(&stream, first.len()) {
        hs.pad_next_flight(free);
    }
    let est = blocking::handshake_until(&mut stream, hs, deadline)?;
    Ok((stream, est))
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
    pub(crate) result: Result<(TcpStream, Established), ChannelError>,
}

/// What reaches the waiting side's loop: a connection from its listener or the relay, or a handshake's end.
pub(crate) enum Event {
    Offered(TcpStream, PathKind, String),
    RelayFailed(crate::SessionError),
    Finished(Box<Finished>),
}

/// Handshakes running side by side, each on its own thread and each bounded by [`HANDSHAKE_DEADLINE`], so one
/// slow or hostile connection never holds up the real peer.
pub(crate) struct Handshakes {
    tx: mpsc::Sender<Event>,
    /// Running handshakes: their source address and a handle to close them.
    running: HashMap<u64, (Option<IpAddr>, TcpStream)>,
    next_id: u64,
}

impl Handshakes {
    /// No handshake yet; finished ones are reported on `tx`.
    pub(crate) fn new(tx: mpsc::Sender<Event>) -> Self {
        Handshakes {
            tx,
            running: HashMap::new(),
            next_id: 0,
        }
    }

    /// Starts a handshake on its own thread; refuses (closes) the connection when too many run already, in
    /// all or from its source address.
    pub(crate) fn start(
        &mut self,
        stream: TcpStream,
        path: PathKind,
        peer: String,
        purpose: Purpose,
        auth: Auth,
        attempts: Option<Arc<CodeAttempts>>,
    ) -> Result<(), String> {
        let source = stream.peer_addr().ok().map(|a| a.ip().to_canonical());
        let from_source = self
            .running
            .values()
            .filter(|(s, _)| source.is_some() && *s == source)
            .count();
        if self.running.len() >= MAX_HANDSHAKES {
            return Err(format!("{MAX_HANDSHAKES} handshakes are running already"));
        }
        // The relay's connections all come from the relay: only direct ones are limited per source.
        if path != PathKind::Relay && from_source >= MAX_HANDSHAKES_PER_SOURCE {
            return Err(format!(
                "{MAX_HANDSHAKES_PER_SOURCE} handshakes from that address are running already"
            ));
        }
        let id = self.next_id;
        self.next_id += 1;
        if let Ok(handle) = stream.try_clone() {
            self.running.insert(id, (source, handle));
        }
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let deadline = started + HANDSHAKE_DEADLINE;
            let role = Role::Responder;
            let result = handshake_with(stream, role, auth, attempts.as_ref(), deadline);
            let _ = tx.send(Event::Finished(Box::new(Finished {
                id,
                purpose,
                path,
                peer,
                took: started.elapsed(),
                result,
            })));
        });
        Ok(())
    }

    /// The handshake `f` reported its end.
    pub(crate) fn finished(&mut self, f: &Finished) {
        self.running.remove(&f.id);
    }

    /// Ends every running handshake: their threads fail at once and report, and their connections close.
    pub(crate) fn stop_all(&mut self) {
        for (_, (_, stream)) in self.running.drain() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

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
