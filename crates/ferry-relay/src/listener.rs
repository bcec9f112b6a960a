//! The listener's side: stay registered at a relay under a set of hashes and accept one client
//! after another (and several at once), each on its own paired stream.
//!
//! Blocking, for a server thread: [`Listener::accept`] returns the next client's stream, ready
//! for the channel handshake exactly as [`connect`](crate::connect) returns one. A reader thread
//! owns the control connection's reading side: it answers the relay's pings, pings the relay
//! when it has heard nothing for the keep-alive interval, queues announcements for `accept`, and
//! ends the listener when the relay is silent for three intervals.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::client::{is_timeout, next_status, open, remaining, RelayError};
use crate::protocol::{FromRelay, Request, Role, Status, ToRelay, Token, MAX_LISTEN_HASHES};

/// The default keep-alive interval of [`Listener::register`]: a ping after this long without a
/// byte from the relay, and the listener ends after three.
pub const KEEPALIVE: Duration = Duration::from_secs(30);

/// Announcements queued for [`Listener::accept`] at most; the relay bounds its unanswered ones
/// per listener (16 by default), so this only overflows when accept is not called for minutes,
/// and then the extra clients time out as if unanswered.
const QUEUED: usize = 64;

/// A registration at a relay under up to [`MAX_LISTEN_HASHES`] hashes. `Send + Sync`: share it
/// (for example in an `Arc`) to call [`set_hashes`](Self::set_hashes) from one thread while
/// another blocks in [`accept`](Self::accept). Dropping it closes the registration.
///
/// ```no_run
/// # fn main() -> Result<(), ferry_relay::RelayError> {
/// use std::time::Duration;
/// let hashes = [[1u8; 32], [2u8; 32]]; // e.g. each paired peer's meeting hashes
/// let listener = ferry_relay::Listener::register("relay.example.net:7440", &hashes, Duration::from_secs(10))?;
/// loop {
///     let (stream, hash) = listener.accept()?;
///     // hand `stream` to the channel handshake for the peer whose hash is `hash`
/// #   drop((stream, hash));
/// }
/// # }
/// ```
pub struct Listener {
    relay: SocketAddr,
    control: Arc<Control>,
    incoming: Mutex<Receiver<(Token, [u8; 32])>>,
    /// Also serializes [`Listener::set_hashes`] calls, so each gets its own answer.
    replies: Mutex<Receiver<Result<(), u8>>>,
    timeout: Duration,
    reader: Option<JoinHandle<()>>,
}

/// What the reader thread and the callers share: the writing side and why reading ended.
struct Control {
    writer: Mutex<TcpStream>,
    ended: Mutex<Option<Ended>>,
}

/// Why the control connection ended.
#[derive(Clone, Copy, Debug)]
enum Ended {
    Closed,
    Silent,
    Garbage,
    Io(io::ErrorKind),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing is left half-done under these locks (a write, a receive), so a poisoned one is fine.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Control {
    fn send(&self, msg: &ToRelay) -> io::Result<()> {
        lock(&self.writer).write_all(&msg.encode())
    }

    fn error(&self) -> RelayError {
        let ended = *lock(&self.ended);
        match ended {
            Some(Ended::Silent) => RelayError::KeepAliveTimeout,
            Some(Ended::Garbage) => RelayError::Protocol,
            Some(Ended::Io(kind)) => RelayError::Io(kind.into()),
            Some(Ended::Closed) | None => RelayError::Closed,
        }
    }
}

impl Listener {
    /// Connects to the relay, registers as a listener, and sets `hashes` (at most
    /// [`MAX_LISTEN_HASHES`]); keep-alive every [`KEEPALIVE`]. `timeout` bounds the registration
    /// and, later, each accept connection and each [`set_hashes`](Self::set_hashes).
    pub fn register(
        relay: impl ToSocketAddrs,
        hashes: &[[u8; 32]],
        timeout: Duration,
    ) -> Result<Listener, RelayError> {
        Listener::register_with_keepalive(relay, hashes, timeout, KEEPALIVE)
    }

    /// [`register`](Self::register) with another keep-alive interval.
    pub fn register_with_keepalive(
        relay: impl ToSocketAddrs,
        hashes: &[[u8; 32]],
        timeout: Duration,
        keepalive: Duration,
    ) -> Result<Listener, RelayError> {
        if hashes.len() > MAX_LISTEN_HASHES {
            return Err(RelayError::TooManyHashes(hashes.len()));
        }
        let deadline = Instant::now() + timeout;
        let mut stream = open(relay, &Request::Listen, deadline)?;
        match next_status(&mut stream, Role::Receiver)? {
            Status::Listening => {}
            other => return Err(RelayError::UnknownStatus(other as u8)),
        }
        let relay = stream.peer_addr()?;
        // A relay that stops reading must not block a write for ever; the reader's timeout is
        // its own.
        stream.set_write_timeout(Some(keepalive))?;
        let reading = stream.try_clone()?;
        let control = Arc::new(Control {
            writer: Mutex::new(stream),
            ended: Mutex::new(None),
        });
        let (incoming_tx, incoming) = mpsc::sync_channel(QUEUED);
        let (replies_tx, replies) = mpsc::sync_channel(1);
        let reader = {
            let control = control.clone();
            std::thread::Builder::new()
                .name("ferry-relay-listener".into())
                .spawn(move || {
                    let why = read_control(reading, &control, &incoming_tx, &replies_tx, keepalive);
                    *lock(&control.ended) = Some(why);
                    // Whatever ended reading ends the connection, so the relay frees the hashes.
                    let _ = lock(&control.writer).shutdown(Shutdown::Both);
                })?
        };
        let mut listener = Listener {
            relay,
            control,
            incoming: Mutex::new(incoming),
            replies: Mutex::new(replies),
            timeout: remaining(deadline)?,
            reader: Some(reader),
        };
        listener.set_hashes(hashes)?;
        listener.timeout = timeout;
        Ok(listener)
    }

    /// Replaces the set of hashes (at most [`MAX_LISTEN_HASHES`]) without reconnecting: the
    /// hourly renewal of meeting hashes. All or nothing: on [`RelayError::HashTaken`] another
    /// listener holds one of them and the previous set stays. A client already waiting under a
    /// new hash is announced at once.
    pub fn set_hashes(&self, hashes: &[[u8; 32]]) -> Result<(), RelayError> {
        if hashes.len() > MAX_LISTEN_HASHES {
            return Err(RelayError::TooManyHashes(hashes.len()));
        }
        let replies = lock(&self.replies);
        // An answer to an earlier call that timed out is not this call's.
        while replies.try_recv().is_ok() {}
        self.control
            .send(&ToRelay::SetHashes(hashes.to_vec()))
            .map_err(|_| self.control.error())?;
        match replies.recv_timeout(self.timeout) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(i)) => Err(RelayError::HashTaken(i)),
            Err(RecvTimeoutError::Timeout) => Err(RelayError::TimedOut),
            Err(RecvTimeoutError::Disconnected) => Err(self.control.error()),
        }
    }

    /// Waits for the next client and returns its paired stream (a transparent pipe, no timeouts
    /// set, as [`connect`](crate::connect) returns) and the hash it came under. A client that
    /// cannot be reached (it left, or the relay refused the accept connection) is skipped. An
    /// error means the registration is over (the relay closed it or went silent): register
    /// again.
    pub fn accept(&self) -> Result<(TcpStream, [u8; 32]), RelayError> {
        let incoming = lock(&self.incoming);
        loop {
            let (token, hash) = incoming.recv().map_err(|_| self.control.error())?;
            if let Ok(stream) = accept_token(self.relay, token, self.timeout) {
                return Ok((stream, hash));
            }
        }
    }

    /// The relay's address this listener is registered at.
    pub fn relay_addr(&self) -> SocketAddr {
        self.relay
    }

    /// Ends the registration: the relay frees the hashes, and a blocked [`accept`](Self::accept)
    /// returns an error.
    pub fn close(&self) {
        let _ = lock(&self.control.writer).shutdown(Shutdown::Both);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.close();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// Opens the accept connection for one announced client and returns it once `PAIRED`.
pub fn accept_token(
    relay: SocketAddr,
    token: Token,
    timeout: Duration,
) -> Result<TcpStream, RelayError> {
    let mut stream = open(relay, &Request::Accept { token }, Instant::now() + timeout)?;
    match next_status(&mut stream, Role::Receiver)? {
        Status::Paired => {
            stream.set_read_timeout(None)?;
            stream.set_write_timeout(None)?;
            Ok(stream)
        }
        other => Err(RelayError::UnknownStatus(other as u8)),
    }
}

/// The reader thread: until the connection ends, and why it did.
fn read_control(
    mut stream: TcpStream,
    control: &Control,
    incoming: &SyncSender<(Token, [u8; 32])>,
    replies: &SyncSender<Result<(), u8>>,
    keepalive: Duration,
) -> Ended {
    if let Err(e) = stream.set_read_timeout(Some(keepalive)) {
        return Ended::Io(e.kind());
    }
    let mut buf = [0u8; 256];
    let mut filled = 0;
    let mut heard = Instant::now();
    let mut pinged = heard;
    loop {
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Ended::Closed,
            Ok(n) => {
                filled += n;
                heard = Instant::now();
            }
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Ended::Io(e.kind()),
        }
        loop {
            let (msg, used) = match FromRelay::decode(&buf[..filled]) {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(_) => return Ended::Garbage,
            };
            buf.copy_within(used..filled, 0);
            filled -= used;
            match msg {
                FromRelay::Ping => {
                    if let Err(e) = control.send(&ToRelay::Pong) {
                        return Ended::Io(e.kind());
                    }
                }
                FromRelay::Pong => {}
                FromRelay::Incoming { token, hash } => match incoming.try_send((token, hash)) {
                    // Nobody accepts for a while: this client times out as if unanswered.
                    Ok(()) | Err(TrySendError::Full(_)) => {}
                    Err(TrySendError::Disconnected(_)) => return Ended::Closed,
                },
                FromRelay::HashesSet(r) => {
                    let _ = replies.try_send(r);
                }
            }
        }
        let now = Instant::now();
        if now.duration_since(heard) >= keepalive * 3 {
            return Ended::Silent;
        }
        if now.duration_since(heard) >= keepalive && now.duration_since(pinged) >= keepalive {
            if let Err(e) = control.send(&ToRelay::Ping) {
                return Ended::Io(e.kind());
            }
            pinged = now;
        }
    }
}
