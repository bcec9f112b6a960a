//! The relay's wire protocol: a 34-byte hello from the client, one status byte back.
//!
//! Pure data, no I/O: both the server and the client function use these encoders and parsers.

/// Protocol version carried in the first byte of the hello.
pub const VERSION: u8 = 1;

/// Length of the hello a client sends right after connecting.
pub const HELLO_LEN: usize = 34;

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
            _ => return None,
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
    fn status_bytes_are_fixed() {
        for b in 0..=7u8 {
            assert_eq!(Status::from_byte(b).map(|s| s as u8), Some(b));
        }
        assert_eq!(Status::from_byte(8), None);
        assert_eq!(Role::Sender.peer(), Role::Receiver);
    }
}
