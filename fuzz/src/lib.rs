//! Deterministic fixtures for the fuzz targets: fixed key pairs (from BIP324's official vectors), fixed garbage,
//! so every input replays exactly.

use ferry_channel::keys::{EphemeralKey, SessionKeys};
use ferry_channel::{Auth, Config, Established, Handshake, Role, Sealer, Suite};

/// Garbage both fixtures send.
pub const GARBAGE: &[u8] = b"fuzz garbage";

fn hex<const N: usize>(s: &str) -> [u8; N] {
    let bytes: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect();
    bytes.try_into().expect("length")
}

/// A fixed key pair for `role` (private key and ElligatorSwift encoding from BIP324's packet vectors 1 and 2).
pub fn fixed_key(role: Role) -> EphemeralKey {
    let (secret, encoded) = match role {
        Role::Responder => (
            "61062ea5071d800bbfd59e2e8b53d47d194b095ae5a4df04936b49772ef0d4d7",
            "ec0adff257bbfe500c188c80b4fdd640f6b45a482bbc15fc7cef5931deff0aa1\
             86f6eb9bba7b85dc4dcc28b28722de1e3d9108b985e2967045668f66098e475b",
        ),
        Role::Initiator => (
            "6f312890ec83bbb26798abaadd574684a53e74ccef7953b790fcc29409080246",
            "a8785af31c029efc82fa9fc677d7118031358d7c6a25b5779a9b900e5ccd94aa\
             c97eb36a3c5dbcdb2ca5843cc4c2fe0aaa46d10eb3d233a81c3dde476da00eef",
        ),
    };
    EphemeralKey::from_parts(hex(secret), hex(encoded)).expect("valid vector key")
}

/// The fixed configuration: ferry mode, both suites, AES claimed (so the choice does not depend on the CPU),
/// small packets so each run stays cheap.
pub fn config() -> Config {
    Config {
        garbage_len: Some(GARBAGE.len()),
        aes_hardware: true,
        max_payload: 1 << 16,
        ..Config::ferry()
    }
}

/// A deterministic handshake for `role`.
pub fn handshake(role: Role, auth: Auth) -> Handshake {
    Handshake::with_key(role, config(), auth, fixed_key(role), GARBAGE.to_vec())
}

/// What a valid initiator sends before its first packet (key share, garbage, terminator), and a sealer for its
/// first packets under the BIP324 keys, as the fixed responder will expect them.
pub fn initiator_opening() -> (Vec<u8>, Sealer) {
    let key = fixed_key(Role::Initiator);
    let theirs = *fixed_key(Role::Responder).encoded();
    let keys = SessionKeys::derive(
        &key.shared_secret(&theirs, Role::Initiator),
        config().magic,
        Role::Initiator,
    );
    let mut opening = key.encoded().to_vec();
    opening.extend_from_slice(GARBAGE);
    opening.extend_from_slice(&keys.send_terminator);
    let sealer = Sealer::new(
        &keys.send,
        Suite::ChaCha20Poly1305,
        GARBAGE.to_vec(),
        1 << 24,
    );
    (opening, sealer)
}

/// A completed, unauthenticated (so deterministic) in-memory session: (initiator, responder).
pub fn established() -> (Established, Established) {
    let mut a = handshake(Role::Initiator, Auth::Unauthenticated);
    let mut b = handshake(Role::Responder, Auth::Unauthenticated);
    while !(a.is_done() && b.is_done()) {
        let (to_b, to_a) = (a.take_output(), b.take_output());
        b.feed(&to_b).expect("fixture handshake");
        a.feed(&to_a).expect("fixture handshake");
    }
    (a.finish().expect("done"), b.finish().expect("done"))
}

/// Fixtures for the transfer targets: packets cut from the fuzzer's bytes, and in-memory packet
/// ends for the engine.
pub mod transfer {
    use ferry_transfer::{PacketSink, PacketSource};
    use std::collections::VecDeque;

    /// Cuts `data` into packets, each a little-endian u16 length then that many bytes (the last
    /// one takes whatever is left).
    pub fn packets(mut data: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while data.len() >= 2 {
            let n = usize::from(u16::from_le_bytes([data[0], data[1]])).min(data.len() - 2);
            out.push(data[2..2 + n].to_vec());
            data = &data[2 + n..];
        }
        out
    }

    /// A packet source over packets in memory; after the last one, a clean end of stream.
    pub struct Packets {
        queue: VecDeque<Vec<u8>>,
        current: Vec<u8>,
    }

    impl Packets {
        /// The source of `packets`, in order.
        pub fn new(packets: impl IntoIterator<Item = Vec<u8>>) -> Packets {
            Packets {
                queue: packets.into_iter().collect(),
                current: Vec::new(),
            }
        }
    }

    impl PacketSource for Packets {
        fn recv(&mut self) -> std::io::Result<Option<&mut [u8]>> {
            match self.queue.pop_front() {
                Some(p) => {
                    self.current = p;
                    Ok(Some(&mut self.current))
                }
                None => Ok(None),
            }
        }
    }

    /// A packet sink that keeps the type byte of every packet sent (the engine's answers).
    #[derive(Default)]
    pub struct Sent {
        /// First byte of every packet, in order.
        pub types: Vec<u8>,
        buf: Vec<u8>,
    }

    impl PacketSink for Sent {
        fn send(&mut self, payload: &[u8]) -> std::io::Result<()> {
            self.types.push(payload.first().copied().unwrap_or(0));
            Ok(())
        }
        fn payload_buf(&mut self, len: usize) -> &mut [u8] {
            self.buf.resize(len, 0);
            &mut self.buf
        }
        fn send_payload_buf(&mut self, len: usize) -> std::io::Result<()> {
            self.types
                .push(self.buf[..len].first().copied().unwrap_or(0));
            Ok(())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
