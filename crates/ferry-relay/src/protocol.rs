//! The relay's wire protocol: a 34-byte hello from the client, one status byte back, and for a
//! listener the messages of its control connection.
//!
//! Pure data, no I/O: both the server and the client functions use these encoders and parsers.
//!
//! # Hellos (34 bytes, `[version = 1][role][body: 32]`)
//! | role | name | body | answer |
//! |---|---|---|---|
//! | 1 | sender | nameplate hash | `WAITING` then `PAIRED`, or `PAIRED`, or an error |
//! | 2 | receiver | nameplate hash | as the sender |
//! | 3 | listener (control connection) | 32 zero bytes (reserved) | `8 LISTENING`, then control messages; or an error |
//! | 4 | accept (a listener's data connection) | a token from `INCOMING` | `PAIRED`, or `4 TIMEOUT` when no client waits under the token |
//!
//! Roles 3 and 4 are the listener extension; a relay without it answers them `BAD_HELLO`, and
//! senders and receivers are unchanged: a client that arrives under a listened hash sees exactly
//! `WAITING` then `PAIRED`, whatever role it has.
//!
//! # Control messages (after `LISTENING`; one type byte, then a fixed or bounded body)
//! | dir | type | name | body |
//! |---|---|---|---|
//! | → relay | `0x01` | `SET_HASHES` | `[n: u8 ≤ 64][n × 32-byte hash]`: replaces the whole set |
//! | → relay | `0x02` | `PING` | none |
//! | → relay | `0x03` | `PONG` | none |
//! | → listener | `0x81` | `HASHES_SET` | `[result: 0 ok, 6 TAKEN][index: u8]`: on `TAKEN` the old set stays, `index` is the first hash another listener holds |
//! | → listener | `0x82` | `PING` | none |
//! | → listener | `0x83` | `PONG` | none |
//! | → listener | `0x84` | `INCOMING` | `[token: 32][hash: 32]`: a client waits under `hash`; open an accept connection with `token` |
//!
//! Each side answers a `PING` with a `PONG` and pings when it has heard nothing for its keep-alive
//! interval; a side that hears nothing for three intervals drops the connection. Anything else
//! (an unknown type, `n > 64`) ends the control connection.

use ferry_wire::{Put, Reader, WireError};

/// Protocol version carried in the first byte of the hello.
pub const VERSION: u8 = 1;

/// Length of the hello a client sends right after connecting.
pub const HELLO_LEN: usize = 34;

/// Role byte of a listener's control connection.
pub const ROLE_LISTEN: u8 = 3;

/// Role byte of a listener's data connection, which presents a token.
pub const ROLE_ACCEPT: u8 = 4;

/// Most hashes one listener may hold at once.
pub const MAX_LISTEN_HASHES: usize = 64;

/// A one-time token the relay hands a listener in `INCOMING` for one waiting client.
pub type Token = [u8; 32];

/// Which side of a transfer a client is; one of each is paired under a nameplate hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The side offering files (`ferry send`).
    Sender,
    /// The side accepting files (`ferry receive`).
    Receiver,
}

impl Role {
    /// The role's byte in the hello.
    pub fn to_byte(self) -> u8 {
        match self {
            Role::Sender => 1,
            Role::Receiver => 2,
        }
    }

    /// Parses a role byte; `None` for anything but 1 or 2.
    pub fn from_byte(b: u8) -> Option<Role> {
        match b {
            1 => Some(Role::Sender),
            2 => Some(Role::Receiver),
            _ => None,
        }
    }

    /// The role this one is paired with.
    pub fn peer(self) -> Role {
        match self {
            Role::Sender => Role::Receiver,
            Role::Receiver => Role::Sender,
        }
    }
}

/// The hello: which role, under which nameplate hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The client's role.
    pub role: Role,
    /// The rendezvous hash (of nameplate and first word) both peers derived from the code; the
    /// relay never sees the code.
    pub hash: [u8; 32],
}

impl Hello {
    /// The 34 bytes on the wire: version, role, hash.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[0] = VERSION;
        out[1] = self.role.to_byte();
        out[2..].copy_from_slice(&self.hash);
        out
    }

    /// Checks the first two bytes (version and role) so garbage is refused before the rest is read.
    pub fn parse_prefix(prefix: [u8; 2]) -> Option<Role> {
        if prefix[0] != VERSION {
            return None;
        }
        Role::from_byte(prefix[1])
    }

    /// Parses a whole hello; `None` for a wrong version or role.
    pub fn parse(bytes: &[u8; HELLO_LEN]) -> Option<Hello> {
        let role = Hello::parse_prefix([bytes[0], bytes[1]])?;
        let mut hash = [0u8; 32];
        hash.copy_from_slice(&bytes[2..]);
        Some(Hello { role, hash })
    }
}

/// Any hello: a side of a session, a listener's control connection, or a listener's data
/// connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// A sender or a receiver (roles 1 and 2).
    Session(Hello),
    /// A listener's control connection (role 3).
    Listen,
    /// A listener's data connection for the client that waits under `token` (role 4).
    Accept {
        /// The token from `INCOMING`.
        token: Token,
    },
}

impl Request {
    /// The 34 bytes on the wire.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[0] = VERSION;
        match self {
            Request::Session(h) => return h.encode(),
            Request::Listen => out[1] = ROLE_LISTEN,
            Request::Accept { token } => {
                out[1] = ROLE_ACCEPT;
                out[2..].copy_from_slice(token);
            }
        }
        out
    }

    /// Checks version and role so garbage is refused before the rest is read.
    pub fn valid_prefix(prefix: [u8; 2]) -> bool {
        prefix[0] == VERSION
            && (Role::from_byte(prefix[1]).is_some()
                || prefix[1] == ROLE_LISTEN
                || prefix[1] == ROLE_ACCEPT)
    }

    /// Parses a whole hello; `None` for a wrong version or role, or a listener hello whose
    /// reserved bytes are not zero.
    pub fn parse(bytes: &[u8; HELLO_LEN]) -> Option<Request> {
        if let Some(h) = Hello::parse(bytes) {
            return Some(Request::Session(h));
        }
        if bytes[0] != VERSION {
            return None;
        }
        let body: Token = bytes[2..].try_into().expect("32 bytes");
        match bytes[1] {
            ROLE_LISTEN if body == [0; 32] => Some(Request::Listen),
            ROLE_ACCEPT => Some(Request::Accept { token: body }),
            _ => None,
        }
    }
}

/// The status byte the relay sends; everything but `Waiting` and `Paired` is followed by a close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Registered; the other side has not arrived yet.
    Waiting = 0,
    /// Both sides are here; from the next byte on the relay is a transparent pipe.
    Paired = 1,
    /// Too many new sessions from this source address in the last minute.
    RateLimited = 2,
    /// The relay is at its concurrent session limit.
    Full = 3,
    /// The other side did not arrive in time.
    Timeout = 4,
    /// Wrong version or role, or garbage.
    BadHello = 5,
    /// That role is already waiting under this hash.
    Taken = 6,
    /// This source address already takes part in as many sessions at once as it may.
    TooMany = 7,
    /// A listener's control connection is registered; control messages follow.
    Listening = 8,
}

impl Status {
    /// Parses a status byte; `None` for an unknown value.
    pub fn from_byte(b: u8) -> Option<Status> {
        Some(match b {
            0 => Status::Waiting,
            1 => Status::Paired,
            2 => Status::RateLimited,
            3 => Status::Full,
            4 => Status::Timeout,
            5 => Status::BadHello,
            6 => Status::Taken,
            7 => Status::TooMany,
            8 => Status::Listening,
            _ => return None,
        })
    }
}

/// A control message from the listener to the relay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToRelay {
    /// Replace the listened hashes (at most [`MAX_LISTEN_HASHES`]).
    SetHashes(Vec<[u8; 32]>),
    /// Are you there?
    Ping,
    /// The answer to a [`FromRelay::Ping`].
    Pong,
}

/// A control message from the relay to the listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FromRelay {
    /// The answer to [`ToRelay::SetHashes`]: `Err(i)` when hash `i` is another listener's (`TAKEN`);
    /// then the previous set stays.
    HashesSet(Result<(), u8>),
    /// Are you there?
    Ping,
    /// The answer to a [`ToRelay::Ping`].
    Pong,
    /// A client waits under `hash`: open an accept connection with `token`.
    Incoming {
        /// Single use; expires when the client stops waiting.
        token: Token,
        /// Which of the listener's hashes the client came under.
        hash: [u8; 32],
    },
}

/// Longest control message: `SET_HASHES` with the most hashes.
pub const MAX_CONTROL_LEN: usize = 2 + 32 * MAX_LISTEN_HASHES;

/// Splits one message off the front of a byte stream: `Ok(None)` when more bytes are needed,
/// else the message and the bytes it took.
fn next_message<T>(
    buf: &[u8],
    parse: impl FnOnce(u8, &mut Reader<'_>) -> Result<T, WireError>,
) -> Result<Option<(T, usize)>, WireError> {
    let mut r = Reader::new(buf);
    let Ok(kind) = r.u8() else { return Ok(None) };
    match parse(kind, &mut r) {
        Ok(m) => Ok(Some((m, buf.len() - r.remaining()))),
        Err(WireError::Truncated) => Ok(None),
        Err(e) => Err(e),
    }
}

impl ToRelay {
    /// The message's bytes. A set longer than [`MAX_LISTEN_HASHES`] is the caller's bug.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            ToRelay::SetHashes(hashes) => {
                assert!(hashes.len() <= MAX_LISTEN_HASHES, "too many hashes");
                out.put_u8(0x01);
                out.put_u8(hashes.len() as u8);
                for h in hashes {
                    out.put(h);
                }
            }
            ToRelay::Ping => out.put_u8(0x02),
            ToRelay::Pong => out.put_u8(0x03),
        }
        out
    }

    /// The first message in `buf`: `Ok(None)` when it is not complete yet, an error for an
    /// unknown type or a set over the bound (checked before its hashes arrive).
    pub fn decode(buf: &[u8]) -> Result<Option<(ToRelay, usize)>, WireError> {
        next_message(buf, |kind, r| match kind {
            0x01 => {
                let n = r.u8()? as usize;
                if n > MAX_LISTEN_HASHES {
                    return Err(WireError::TooLong("hash set"));
                }
                (0..n)
                    .map(|_| r.array())
                    .collect::<Result<_, _>>()
                    .map(ToRelay::SetHashes)
            }
            0x02 => Ok(ToRelay::Ping),
            0x03 => Ok(ToRelay::Pong),
            _ => Err(WireError::Invalid("control message type")),
        })
    }
}

impl FromRelay {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            FromRelay::HashesSet(r) => {
                out.put_u8(0x81);
                match r {
                    Ok(()) => out.put(&[0, 0]),
                    Err(i) => out.put(&[Status::Taken as u8, *i]),
                }
            }
            FromRelay::Ping => out.put_u8(0x82),
            FromRelay::Pong => out.put_u8(0x83),
            FromRelay::Incoming { token, hash } => {
                out.put_u8(0x84);
                out.put(token);
                out.put(hash);
            }
        }
        out
    }

    /// The first message in `buf`, as [`ToRelay::decode`].
    pub fn decode(buf: &[u8]) -> Result<Option<(FromRelay, usize)>, WireError> {
        next_message(buf, |kind, r| match kind {
            0x81 => match r.array::<2>()? {
                [0, _] => Ok(FromRelay::HashesSet(Ok(()))),
                [6, i] => Ok(FromRelay::HashesSet(Err(i))),
                _ => Err(WireError::Invalid("hash set result")),
            },
            0x82 => Ok(FromRelay::Ping),
            0x83 => Ok(FromRelay::Pong),
            0x84 => Ok(FromRelay::Incoming {
                token: r.array()?,
                hash: r.array()?,
            }),
            _ => Err(WireError::Invalid("control message type")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_rejects_garbage() {
        let h = Hello {
            role: Role::Receiver,
            hash: [7; 32],
        };
        let bytes = h.encode();
        assert_eq!(bytes[0], 1);
        assert_eq!(bytes[1], 2);
        assert_eq!(Hello::parse(&bytes), Some(h));
        let mut bad = bytes;
        bad[0] = 2;
        assert_eq!(Hello::parse(&bad), None);
        bad[0] = 1;
        bad[1] = 3;
        assert_eq!(Hello::parse(&bad), None);
        assert_eq!(Hello::parse_prefix(*b"GE"), None);
    }

    #[test]
    fn listener_hellos_round_trip_and_old_hellos_are_unchanged() {
        let h = Hello {
            role: Role::Sender,
            hash: [3; 32],
        };
        assert_eq!(Request::Session(h).encode(), h.encode());
        for req in [
            Request::Session(h),
            Request::Listen,
            Request::Accept { token: [9; 32] },
        ] {
            let bytes = req.encode();
            assert!(Request::valid_prefix([bytes[0], bytes[1]]));
            assert_eq!(Request::parse(&bytes), Some(req));
        }
        assert_eq!(Request::Listen.encode()[..2], [1, 3]);
        assert_eq!(Request::Accept { token: [9; 32] }.encode()[..2], [1, 4]);
        // The listener's reserved bytes must be zero; roles past 4 and other versions are garbage.
        let mut bad = Request::Listen.encode();
        bad[33] = 1;
        assert_eq!(Request::parse(&bad), None);
        assert!(!Request::valid_prefix([1, 5]));
        assert!(!Request::valid_prefix([2, 1]));
        // The old parser still refuses the new roles (as an old relay does, with BAD_HELLO).
        assert_eq!(Hello::parse(&Request::Listen.encode()), None);
    }

    #[test]
    fn control_messages_round_trip_and_are_bounded() {
        let to = [
            ToRelay::SetHashes(vec![[1; 32], [2; 32]]),
            ToRelay::SetHashes(vec![]),
            ToRelay::Ping,
            ToRelay::Pong,
        ];
        let from = [
            FromRelay::HashesSet(Ok(())),
            FromRelay::HashesSet(Err(5)),
            FromRelay::Ping,
            FromRelay::Pong,
            FromRelay::Incoming {
                token: [7; 32],
                hash: [8; 32],
            },
        ];
        for m in to {
            let b = m.encode();
            assert_eq!(ToRelay::decode(&b), Ok(Some((m, b.len()))));
            // Every strict prefix asks for more; nothing is taken.
            for cut in 0..b.len() {
                assert_eq!(ToRelay::decode(&b[..cut]), Ok(None));
            }
        }
        for m in from {
            let b = m.encode();
            assert_eq!(FromRelay::decode(&b), Ok(Some((m, b.len()))));
            for cut in 0..b.len() {
                assert_eq!(FromRelay::decode(&b[..cut]), Ok(None));
            }
        }
        // Two messages back to back: the first is split off.
        let mut two = ToRelay::Ping.encode();
        two.extend(ToRelay::Pong.encode());
        assert_eq!(ToRelay::decode(&two), Ok(Some((ToRelay::Ping, 1))));
        // A set over the bound is refused on its count byte, before any hash is read.
        assert!(ToRelay::decode(&[0x01, 65]).is_err());
        assert!(ToRelay::decode(&[0x00]).is_err());
        assert!(FromRelay::decode(&[0x81, 3, 0]).is_err());
        assert!(FromRelay::decode(&[0x01]).is_err());
        let max = ToRelay::SetHashes(vec![[0; 32]; MAX_LISTEN_HASHES]).encode();
        assert_eq!(max.len(), MAX_CONTROL_LEN);
    }

    #[test]
    fn status_bytes_are_fixed() {
        for b in 0..=8u8 {
            assert_eq!(Status::from_byte(b).map(|s| s as u8), Some(b));
        }
        assert_eq!(Status::from_byte(9), None);
        assert_eq!(Role::Sender.peer(), Role::Receiver);
    }
}
