//! The client side: connect to a relay, register, and wait until the other side is there.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::protocol::{Hello, Request, Role, Status};

/// Why a relay connection did not produce a paired stream.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The relay address did not resolve.
    #[error("cannot resolve the relay address")]
    Resolve(#[source] io::Error),
    /// No address of the relay accepted a connection.
    #[error("cannot reach the relay")]
    Connect(#[source] io::Error),
    /// The connection failed after it was established.
    #[error("relay connection failed")]
    Io(#[from] io::Error),
    /// The relay closed the connection without a status.
    #[error("relay closed the connection")]
    Closed,
    /// `RATE_LIMITED`: this address opened too many sessions in the last minute.
    #[error("relay refused: too many new sessions from this address, try again in a minute")]
    RateLimited,
    /// `FULL`: the relay is at its concurrent session limit.
    #[error("relay refused: it is serving as many sessions as it can, try again later")]
    Full,
    /// `TIMEOUT`: the relay gave up waiting for the other side.
    #[error("the other side did not arrive at the relay in time")]
    PeerTimeout,
    /// `BAD_HELLO`: the relay did not understand the hello (likely a version mismatch).
    #[error("relay refused the hello: incompatible relay version")]
    BadHello,
    /// `TAKEN`: the same role already waits under this code.
    #[error("relay refused: another {0} is already waiting with this code")]
    Taken(Role),
    /// `TOO_MANY`: this address already has as many sessions at the relay as it may.
    #[error("relay refused: too many sessions from this address at once, try again when one ends")]
    TooMany,
    /// A status byte this client does not know.
    #[error("relay sent an unknown status {0}")]
    UnknownStatus(u8),
    /// The caller's timeout passed before the other side arrived.
    #[error("timed out waiting for the other side at the relay")]
    TimedOut,
    /// `TAKEN` for a listener: another listener holds the hash at this index of the set.
    #[error("relay refused: another listener already holds one of these hashes")]
    HashTaken(u8),
    /// A listener asked to hold more hashes than the protocol allows.
    #[error("a listener may hold at most {max} hashes, not {0}", max = crate::protocol::MAX_LISTEN_HASHES)]
    TooManyHashes(usize),
    /// A listener's control connection was silent past its keep-alive limit.
    #[error("the relay stopped answering on the listener's connection")]
    KeepAliveTimeout,
    /// The relay sent a control message this client does not understand.
    #[error("relay sent a control message this client does not understand")]
    Protocol,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Sender => "sender",
            Role::Receiver => "receiver",
        })
    }
}

/// Connects to the relay, registers as `role` under `hash`, waits through `WAITING`, and returns
/// the stream once `PAIRED`, with no byte consumed past the status bytes and no timeouts left set.
/// From then on the stream is a transparent pipe to the peer.
///
/// `timeout` bounds everything: connecting, and waiting for the other side. Blocking.
pub fn connect(
    relay: impl ToSocketAddrs,
    role: Role,
    hash: [u8; 32],
    timeout: Duration,
) -> Result<TcpStream, RelayError> {
    let hello = Request::Session(Hello { role, hash });
    let deadline = Instant::now() + timeout;
    let mut stream = open(relay, &hello, deadline)?;
    loop {
        stream.set_read_timeout(Some(remaining(deadline)?))?;
        match next_status(&mut stream, role)? {
            Status::Waiting => continue,
            Status::Paired => {
                stream.set_read_timeout(None)?;
                stream.set_write_timeout(None)?;
                return Ok(stream);
            }
            other => return Err(RelayError::UnknownStatus(other as u8)),
        }
    }
}

/// The time left before `deadline`, or [`RelayError::TimedOut`].
pub(crate) fn remaining(deadline: Instant) -> Result<Duration, RelayError> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or(RelayError::TimedOut)
}

/// Connects to the first address of the relay that answers and sends `hello`; the stream's read
/// and write timeouts end at `deadline`.
pub(crate) fn open(
    relay: impl ToSocketAddrs,
    hello: &Request,
    deadline: Instant,
) -> Result<TcpStream, RelayError> {
    let mut last_err = io::Error::new(io::ErrorKind::NotFound, "no address");
    let mut stream = None;
    for addr in relay.to_socket_addrs().map_err(RelayError::Resolve)? {
        match TcpStream::connect_timeout(&addr, remaining(deadline)?) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last_err = e,
        }
    }
    let mut stream = stream.ok_or(RelayError::Connect(last_err))?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(remaining(deadline)?))?;
    stream.set_read_timeout(Some(remaining(deadline)?))?;
    stream.write_all(&hello.encode())?;
    Ok(stream)
}

/// Reads one status byte (within the stream's read timeout): `WAITING`, `PAIRED` and
/// `LISTENING` are returned, refusals become their errors (`TAKEN` naming `role`).
pub(crate) fn next_status(stream: &mut TcpStream, role: Role) -> Result<Status, RelayError> {
    let status = match read_byte(stream) {
        Ok(Some(b)) => b,
        Ok(None) => return Err(RelayError::Closed),
        Err(e) if is_timeout(&e) => return Err(RelayError::TimedOut),
        Err(e) => return Err(e.into()),
    };
    let answer = match Status::from_byte(status) {
        Some(s @ (Status::Waiting | Status::Paired | Status::Listening)) => Ok(s),
        Some(Status::RateLimited) => Err(RelayError::RateLimited),
        Some(Status::Full) => Err(RelayError::Full),
        Some(Status::Timeout) => Err(RelayError::PeerTimeout),
        Some(Status::BadHello) => Err(RelayError::BadHello),
        Some(Status::Taken) => Err(RelayError::Taken(role)),
        Some(Status::TooMany) => Err(RelayError::TooMany),
        None => Err(RelayError::UnknownStatus(status)),
    };
    // A relay closes the connection right after a refusal (`refuse`: the byte, then its write side). Bytes
    // after one mean the other end is no relay: a ferry peer's handshake, say, whose first byte happened to
    // read as a refusal (6 of the 256 values do). A read that fails counts as no more bytes.
    match answer {
        Err(e)
            if !matches!(e, RelayError::UnknownStatus(_))
                && matches!(read_byte(stream), Ok(Some(_))) =>
        {
            Err(RelayError::UnknownStatus(status))
        }
        answer => answer,
    }
}

/// The next byte of `stream` (within its read timeout), `None` at the end of the stream.
fn read_byte(stream: &mut TcpStream) -> io::Result<Option<u8>> {
    let mut b = [0u8; 1];
    loop {
        match stream.read(&mut b) {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(b[0])),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Whether a read or write failed for its timeout (which the OS reports either way).
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}
