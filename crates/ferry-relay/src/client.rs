//! The client side: connect to a relay, register, and wait until the other side is there.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::protocol::{Hello, Role, Status};

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
    let deadline = Instant::now() + timeout;
    let remaining = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(RelayError::TimedOut)
    };
    let mut last_err = io::Error::new(io::ErrorKind::NotFound, "no address");
    let mut stream = None;
    for addr in relay.to_socket_addrs().map_err(RelayError::Resolve)? {
        match TcpStream::connect_timeout(&addr, remaining()?) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last_err = e,
        }
    }
    let mut stream = stream.ok_or(RelayError::Connect(last_err))?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(remaining()?))?;
    stream.write_all(&Hello { role, hash }.encode())?;
    loop {
        stream.set_read_timeout(Some(remaining()?))?;
        let mut b = [0u8; 1];
        let status = match stream.read(&mut b) {
            Ok(0) => return Err(RelayError::Closed),
            Ok(_) => b[0],
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(RelayError::TimedOut)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        match Status::from_byte(status) {
            Some(Status::Waiting) => continue,
            Some(Status::Paired) => {
                stream.set_read_timeout(None)?;
                stream.set_write_timeout(None)?;
                return Ok(stream);
            }
            Some(Status::RateLimited) => return Err(RelayError::RateLimited),
            Some(Status::Full) => return Err(RelayError::Full),
            Some(Status::Timeout) => return Err(RelayError::PeerTimeout),
            Some(Status::BadHello) => return Err(RelayError::BadHello),
            Some(Status::Taken) => return Err(RelayError::Taken(role)),
            Some(Status::TooMany) => return Err(RelayError::TooMany),
            None => return Err(RelayError::UnknownStatus(status)),
        }
    }
}
