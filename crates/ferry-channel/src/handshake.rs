//! The handshake state machine: key shares, garbage, terminators, decoys, version packets, suite choice and
//! authentication. Sans-IO: bytes go in through [`Handshake::feed`], bytes to send come out of
//! [`Handshake::take_output`]; no sockets, no clocks.

use std::sync::Arc;

use aws_lc_rs::digest;

use crate::auth::{Auth, AuthState, CodeAttempts};
use crate::error::ChannelError;
use crate::keys::{fill_random, EphemeralKey, SessionKeys, ELLSWIFT_LEN, TERMINATOR_LEN};
use crate::lanes::LaneKeys;
use crate::packet::{
    frame_len, Opener, PacketReader, Sealer, CONTENTS_OFFSET, DEFAULT_MAX_PAYLOAD, HEADER_DECOY,
};
use crate::suite::{has_aes_hardware, Suite, TAG_LEN};
use crate::Role;

/// Most garbage a side may send (BIP324).
pub const MAX_GARBAGE: usize = 4095;
/// ferry's network magic; with Bitcoin's mainnet magic the handshake is BIP324's.
pub const FERRY_MAGIC: [u8; 4] = *b"fery";
/// Bitcoin mainnet's network magic.
pub const BITCOIN_MAINNET_MAGIC: [u8; 4] = [0xf9, 0xbe, 0xb4, 0xd9];
/// ferry's protocol version, carried in the version packet. Version 2 carries the SPAKE2 message in the
/// version packet (one round trip less than version 1, which sent it after the version packets crossed).
pub const PROTOCOL_VERSION: u8 = 2;
/// Handshake packets (version, authentication) are small; anything larger is hostile.
const MAX_HANDSHAKE_PACKET: usize = 4096;
/// Most bytes [`Handshake::pad_next_flight`] pads a flight to: a first window of 10 segments is 14.5 KB on
/// Ethernet and 90 KB with jumbo frames; on loopback (10 segments of 64 KiB) the window needs no warming.
pub const MAX_PAD: usize = 64 << 10;
/// Most bytes of decoy packets a handshake takes from the peer: four times what [`MAX_PAD`] lets a ferry
/// send, so a peer cannot keep the handshake busy opening decoys until its deadline.
pub const MAX_HANDSHAKE_DECOYS: usize = 4 * MAX_PAD;

/// Channel parameters.
#[derive(Clone, Debug)]
pub struct Config {
    /// Network magic mixed into the key schedule.
    pub magic: [u8; 4],
    /// `false` runs plain BIP324: empty version packet, ChaCha20-Poly1305 only, no ferry key switch.
    pub ferry: bool,
    /// Largest contents of one packet; checked before any allocation.
    pub max_payload: usize,
    /// Garbage length; `None` draws it uniformly from 0..=4095.
    pub garbage_len: Option<usize>,
    /// Sizes of decoy packets sent before the version packet, to pad the handshake's shape.
    pub decoys: Vec<usize>,
    /// Suites we offer, as a bit set of [`Suite::bit`].
    pub suites: u8,
    /// Whether we tell the peer that this machine has AES instructions.
    pub aes_hardware: bool,
}

impl Config {
    /// ferry's defaults: its own magic, 1 MiB packets, both suites, AES chosen where both sides have it.
    pub fn ferry() -> Self {
        Config {
            magic: FERRY_MAGIC,
            ferry: true,
            max_payload: DEFAULT_MAX_PAYLOAD,
            garbage_len: None,
            decoys: Vec::new(),
            suites: Suite::ChaCha20Poly1305.bit() | Suite::Aes256Gcm.bit(),
            aes_hardware: has_aes_hardware(),
        }
    }

    /// Plain BIP324 with a given network magic (Bitcoin mainnet: [`BITCOIN_MAINNET_MAGIC`]).
    pub fn bip324(magic: [u8; 4]) -> Self {
        Config {
            magic,
            ferry: false,
            max_payload: DEFAULT_MAX_PAYLOAD,
            garbage_len: None,
            decoys: Vec::new(),
            suites: Suite::ChaCha20Poly1305.bit(),
            aes_hardware: false,
        }
    }

    fn version_contents(&self) -> Vec<u8> {
        if self.ferry {
            vec![PROTOCOL_VERSION, self.suites, u8::from(self.aes_hardware)]
        } else {
            Vec::new()
        }
    }
}

/// What a version packet says (ferry mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Offer {
    suites: u8,
    aes_hardware: bool,
}

/// The offer of a version packet, and what follows it: the sender's first authentication message, if any.
fn parse_offer(contents: &[u8]) -> Result<(Offer, &[u8]), ChannelError> {
    match contents {
        [PROTOCOL_VERSION, suites, hw, rest @ ..] => Ok((
            Offer {
                suites: *suites,
                aes_hardware: *hw == 1,
            },
            rest,
        )),
        // Our version, but cut short: not something a ferry of this version sends.
        [PROTOCOL_VERSION, ..] => Err(ChannelError::AuthProtocol("truncated version packet")),
        [v, ..] => Err(ChannelError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: *v,
        }),
        [] => Err(ChannelError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: 0,
        }),
    }
}

/// AES-256-GCM when both offer it and both have AES instructions, else ChaCha20-Poly1305 if both offer it.
fn choose_suite(a: Offer, b: Offer) -> Result<Suite, ChannelError> {
    let common = a.suites & b.suites;
    if common & Suite::Aes256Gcm.bit() != 0 && a.aes_hardware && b.aes_hardware {
        Ok(Suite::Aes256Gcm)
    } else if common & Suite::ChaCha20Poly1305.bit() != 0 {
        Ok(Suite::ChaCha20Poly1305)
    } else if common & Suite::Aes256Gcm.bit() != 0 {
        Ok(Suite::Aes256Gcm)
    } else {
        Err(ChannelError::SuiteMismatch)
    }
}

enum Phase {
    /// Waiting for the peer's 64-byte key share.
    KeyShare,
    /// Scanning the peer's garbage for its terminator.
    Terminator,
    /// Waiting for the peer's version packet.
    Version,
    /// Exchanging authentication messages.
    Auth,
    /// Finished; application data may flow.
    Done,
    /// Failed; nothing more is accepted.
    Failed,
}

/// A completed handshake: both halves of the channel and what was agreed.
pub struct Established {
    /// Encrypts what we send.
    pub sealer: Sealer,
    /// Decrypts what we receive; holds any bytes that arrived after the handshake.
    pub opener: Opener,
    /// The session id (identical on both sides of one connection).
    pub session_id: [u8; 32],
    /// Hash of the session id, both key shares and both version packets.
    pub transcript: [u8; 32],
    /// The negotiated suite.
    pub suite: Suite,
    /// The peer's identity key, when identity authentication ran.
    pub peer_identity: Option<[u8; 32]>,
    /// Our role.
    pub role: Role,
    /// What the keys of the session's lanes come from.
    lane_secret: [u8; 32],
}

impl Established {
    /// The keys of this session's lanes (extra connections, see [`crate::lanes`]), for packets of at most
    /// `max_payload` bytes of contents.
    pub fn lane_keys(&self, max_payload: usize) -> LaneKeys {
        LaneKeys::from_secret(self.lane_secret, self.suite, max_payload)
    }
}

/// One side's handshake.
pub struct Handshake {
    role: Role,
    config: Config,
    key: EphemeralKey,
    garbage: Vec<u8>,
    phase: Phase,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    scanned: usize,
    keys: Option<SessionKeys>,
    theirs: [u8; ELLSWIFT_LEN],
    sealer: Option<Sealer>,
    reader: Option<PacketReader>,
    transcript: [u8; 32],
    auth: AuthState,
    peer_identity: Option<[u8; 32]>,
    /// The contents of the version packet we sent (the offer, then in ferry mode our SPAKE2 message).
    version: Vec<u8>,
    /// Our first authentication message rode in our version packet, so the peer's rides in its own.
    auth_in_version: bool,
    /// What the flight that carries our version packet is padded to with decoys ([`Handshake::pad_next_flight`]).
    pad_to: usize,
    /// Bytes of the peer's decoy packets taken so far (at most [`MAX_HANDSHAKE_DECOYS`]).
    decoys_taken: usize,
}

impl Handshake {
    /// Starts a handshake with a fresh ephemeral key and random garbage. Our key share and garbage are queued
    /// at once; both sides send first, so the handshake costs no extra round trip.
    pub fn new(role: Role, config: Config, auth: Auth) -> Self {
        let len = match config.garbage_len {
            Some(n) => n.min(MAX_GARBAGE),
            None => {
                let mut r = [0u8; 2];
                fill_random(&mut r);
                usize::from(u16::from_le_bytes(r)) % (MAX_GARBAGE + 1)
            }
        };
        let mut garbage = vec![0u8; len];
        fill_random(&mut garbage);
        Self::with_key(role, config, auth, EphemeralKey::generate(), garbage)
    }

    /// Starts a handshake with a given key and garbage (deterministic, for tests and vectors).
    pub fn with_key(
        role: Role,
        config: Config,
        auth: Auth,
        key: EphemeralKey,
        garbage: Vec<u8>,
    ) -> Self {
        let mut out = Vec::with_capacity(ELLSWIFT_LEN + garbage.len() + 256);
        out.extend_from_slice(key.encoded());
        out.extend_from_slice(&garbage);
        Handshake {
            role,
            config,
            key,
            garbage,
            phase: Phase::KeyShare,
            inbuf: Vec::new(),
            out,
            scanned: 0,
            keys: None,
            theirs: [0; ELLSWIFT_LEN],
            sealer: None,
            reader: None,
            transcript: [0; 32],
            auth: AuthState::new(auth),
            peer_identity: None,
            version: Vec::new(),
            auth_in_version: false,
            pad_to: 0,
            decoys_taken: 0,
        }
    }

    /// Pads the flight that carries our version packet (sent once the peer's key share is in) with decoy
    /// packets, which the peer drops, to `bytes` in all (at most [`MAX_PAD`]): the flight's terminator,
    /// decoys and version packet. The IO layer gives what its connection may send at once without waiting
    /// for an acknowledgement: in slow start each segment acknowledged grows the congestion window by one,
    /// so the data after the handshake starts from a window twice the first one, a round trip ahead
    /// (BENCHMARKS.md, "Session 9: a warm window"). The version packet comes last, so it leaves within
    /// the window.
    pub fn pad_next_flight(&mut self, bytes: usize) {
        self.pad_to = bytes.min(MAX_PAD);
    }

    /// Shares a failed-attempt budget with every other handshake on the same code (see [`CodeAttempts`]).
    /// Without it, each handshake is one attempt on its own. No effect unless authenticating with a code.
    pub fn with_attempts(mut self, attempts: Arc<CodeAttempts>) -> Self {
        self.auth.set_attempts(attempts);
        self
    }

    /// True once the peer's PAKE message arrived and the attempt is not yet settled: if the handshake ends now,
    /// the attempt counts as a failed guess.
    pub fn attempt_charged(&self) -> bool {
        self.auth.charged()
    }

    /// Bytes to send now.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// True when bytes are waiting in [`Handshake::take_output`].
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// True once both sides are authenticated and application data may flow.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// The session id, once key agreement ran.
    pub fn session_id(&self) -> Option<[u8; 32]> {
        self.keys.as_ref().map(|k| k.session_id)
    }

    /// True once the peer's first flight (key share, garbage and terminator) has arrived: a waiting side
    /// can give that much a short deadline, since a ferry sends it at once.
    pub fn first_flight_received(&self) -> bool {
        !matches!(self.phase, Phase::KeyShare | Phase::Terminator)
    }

    /// The peer closed the transport before the handshake finished.
    pub fn eof_error(&self) -> ChannelError {
        match self.phase {
            Phase::KeyShare | Phase::Terminator => ChannelError::NotFerry,
            _ => ChannelError::Truncated,
        }
    }

    /// Takes bytes received from the peer and advances as far as they allow.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), ChannelError> {
        match self.phase {
            Phase::Failed => return Err(ChannelError::Closed),
            Phase::Done => {
                // Bytes after the handshake belong to the application; keep them for the opener.
                self.inbuf.extend_from_slice(data);
                return Ok(());
            }
            _ => {}
        }
        self.inbuf.extend_from_slice(data);
        let result = self.advance();
        if result.is_err() {
            self.phase = Phase::Failed;
        }
        result
    }

    fn advance(&mut self) -> Result<(), ChannelError> {
        loop {
            match self.phase {
                Phase::KeyShare => {
                    if self.inbuf.len() < ELLSWIFT_LEN {
                        return Ok(());
                    }
                    self.theirs.copy_from_slice(&self.inbuf[..ELLSWIFT_LEN]);
                    self.inbuf.drain(..ELLSWIFT_LEN);
                    self.on_key_share();
                }
                Phase::Terminator => {
                    if !self.scan_terminator()? {
                        return Ok(());
                    }
                }
                Phase::Version | Phase::Auth => {
                    let Some(contents) = self.next_packet()? else {
                        return Ok(());
                    };
                    if matches!(self.phase, Phase::Version) {
                        self.on_version(&contents)?;
                    } else {
                        self.on_auth(&contents)?;
                    }
                }
                Phase::Done | Phase::Failed => return Ok(()),
            }
        }
    }

    fn on_key_share(&mut self) {
        let secret = self.key.shared_secret(&self.theirs, self.role);
        let keys = SessionKeys::derive(&secret, self.config.magic, self.role);
        let suite = Suite::ChaCha20Poly1305;
        let mut sealer = Sealer::new(
            &keys.send,
            suite,
            std::mem::take(&mut self.garbage),
            MAX_HANDSHAKE_PACKET,
        );
        // In ferry mode a SPAKE2 message, which needs only the session id, rides in the version packet:
        // it reaches the peer a round trip sooner than in a packet of its own after the version packets
        // crossed. The transcript, and so both confirmations, cover it.
        self.version = self.config.version_contents();
        if self.config.ferry {
            if let Some(first) = self.auth.start_early(self.role, &keys.session_id) {
                self.version.extend_from_slice(&first);
                self.auth_in_version = true;
            }
        }
        let start = self.out.len();
        self.out.extend_from_slice(&keys.send_terminator);
        for &size in &self.config.decoys {
            let mut decoy = vec![0u8; size.min(MAX_HANDSHAKE_PACKET)];
            fill_random(&mut decoy);
            sealer
                .seal_into(&mut self.out, HEADER_DECOY, &decoy)
                .expect("decoy fits a handshake packet");
        }
        // The padding: decoys of zeros (sealed, they read as random) up to what leaves room for the version.
        let end = start + self.pad_to.saturating_sub(frame_len(self.version.len()));
        let zeros = [0u8; MAX_HANDSHAKE_PACKET];
        while self.out.len() + frame_len(0) < end {
            let size = (end - self.out.len() - frame_len(0)).min(MAX_HANDSHAKE_PACKET);
            sealer
                .seal_into(&mut self.out, HEADER_DECOY, &zeros[..size])
                .expect("decoy fits a handshake packet");
        }
        sealer
            .seal_into(&mut self.out, 0, &self.version)
            .expect("version fits a handshake packet");
        self.sealer = Some(sealer);
        self.keys = Some(keys);
        self.phase = Phase::Terminator;
    }

    /// Looks for the peer's terminator within the first 4095 + 16 bytes after its key share.
    fn scan_terminator(&mut self) -> Result<bool, ChannelError> {
        let keys = self.keys.as_ref().expect("keys exist after the key share");
        let limit = MAX_GARBAGE + TERMINATOR_LEN;
        let searchable = self.inbuf.len().min(limit);
        let from = self.scanned.saturating_sub(TERMINATOR_LEN - 1);
        let found = self.inbuf[from..searchable]
            .windows(TERMINATOR_LEN)
            .position(|w| w == keys.recv_terminator)
            .map(|p| p + from);
        match found {
            Some(at) => {
                let garbage = self.inbuf[..at].to_vec();
                self.inbuf.drain(..at + TERMINATOR_LEN);
                self.reader = Some(PacketReader::new(
                    &keys.recv,
                    Suite::ChaCha20Poly1305,
                    garbage,
                    MAX_HANDSHAKE_PACKET,
                ));
                self.phase = Phase::Version;
                Ok(true)
            }
            None if self.inbuf.len() >= limit => Err(ChannelError::NotFerry),
            None => {
                self.scanned = searchable;
                Ok(false)
            }
        }
    }

    /// Opens the next non-decoy handshake packet and returns its contents.
    fn next_packet(&mut self) -> Result<Option<Vec<u8>>, ChannelError> {
        let reader = self
            .reader
            .as_mut()
            .expect("reader exists after the terminator");
        loop {
            let Some((total, header)) = reader.open(&mut self.inbuf)? else {
                return Ok(None);
            };
            if header & HEADER_DECOY == 0 {
                let contents = self.inbuf[CONTENTS_OFFSET..total - TAG_LEN].to_vec();
                self.inbuf.drain(..total);
                return Ok(Some(contents));
            }
            self.inbuf.drain(..total);
            self.decoys_taken += total;
            if self.decoys_taken > MAX_HANDSHAKE_DECOYS {
                return Err(ChannelError::AuthProtocol(
                    "more decoy packets in the handshake than a ferry sends",
                ));
            }
        }
    }

    fn on_version(&mut self, contents: &[u8]) -> Result<(), ChannelError> {
        let ours = std::mem::take(&mut self.version);
        let (init_v, resp_v, init_k, resp_k) = match self.role {
            Role::Initiator => (&ours[..], contents, self.key.encoded(), &self.theirs),
            Role::Responder => (contents, &ours[..], &self.theirs, self.key.encoded()),
        };
        let keys = self.keys.as_ref().expect("keys exist after the key share");
        let mut ctx = digest::Context::new(&digest::SHA256);
        ctx.update(b"ferry/transcript/v1");
        ctx.update(&self.config.magic);
        ctx.update(&keys.session_id);
        ctx.update(init_k);
        ctx.update(resp_k);
        for v in [init_v, resp_v] {
            ctx.update(&(v.len() as u32).to_le_bytes());
            ctx.update(v);
        }
        self.transcript.copy_from_slice(ctx.finish().as_ref());

        let mut peer_first: &[u8] = &[];
        if self.config.ferry {
            let (theirs, first) = parse_offer(contents)?;
            let (mine, _) = parse_offer(&ours)?;
            peer_first = first;
            let suite = choose_suite(mine, theirs)?;
            // Switch to keys bound to the transcript: an edited offer gives the two sides different keys.
            // Authentication packets stay bounded by MAX_HANDSHAKE_PACKET; `finish` lifts the bound.
            let (send, recv) = keys.suite_keys(suite, &self.transcript, self.role);
            self.sealer = Some(Sealer::new(&send, suite, Vec::new(), MAX_HANDSHAKE_PACKET));
            self.reader = Some(PacketReader::new(
                &recv,
                suite,
                Vec::new(),
                MAX_HANDSHAKE_PACKET,
            ));
        }
        let session_id = keys.session_id;
        self.phase = Phase::Auth;
        if self.auth_in_version {
            if peer_first.is_empty() {
                return Err(ChannelError::AuthProtocol(
                    "version packet without the PAKE message",
                ));
            }
            return self.on_auth(peer_first);
        }
        if !peer_first.is_empty() {
            return Err(ChannelError::AuthProtocol(
                "unexpected authentication message in the version packet",
            ));
        }
        let messages = self.auth.start(self.role, &session_id, &self.transcript);
        self.send_handshake_messages(messages)?;
        if matches!(self.auth, AuthState::Done) {
            self.phase = Phase::Done;
        }
        Ok(())
    }

    fn on_auth(&mut self, contents: &[u8]) -> Result<(), ChannelError> {
        let (messages, outcome) = match self.auth.on_message(self.role, &self.transcript, contents)
        {
            Ok(step) => step,
            Err(ChannelError::WrongCode) if self.role == Role::Responder => {
                // Tell the initiator why, so it reports a wrong code rather than a cut connection.
                self.send_handshake_messages(vec![crate::auth::reject_message()])?;
                return Err(ChannelError::WrongCode);
            }
            Err(e @ (ChannelError::Refused(_) | ChannelError::IdentityMismatch))
                if self.role == Role::Responder =>
            {
                // Refused, with nothing that names us: the initiator reports it instead of a cut connection.
                self.send_handshake_messages(vec![crate::auth::not_admitted_message()])?;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        self.send_handshake_messages(messages)?;
        if let Some(outcome) = outcome {
            self.peer_identity = outcome.peer_identity;
            self.phase = Phase::Done;
        }
        Ok(())
    }

    fn send_handshake_messages(&mut self, messages: Vec<Vec<u8>>) -> Result<(), ChannelError> {
        let sealer = self
            .sealer
            .as_mut()
            .expect("sealer exists after the key share");
        for m in messages {
            sealer.seal_into(&mut self.out, 0, &m)?;
        }
        Ok(())
    }

    /// The established channel. Fails unless [`Handshake::is_done`].
    pub fn finish(self) -> Result<Established, ChannelError> {
        if !self.is_done() {
            return Err(ChannelError::AuthProtocol("handshake not finished"));
        }
        let keys = self.keys.expect("keys exist when done");
        let mut sealer = self.sealer.expect("sealer exists when done");
        let mut reader = self.reader.expect("reader exists when done");
        sealer.set_max_payload(self.config.max_payload);
        reader.set_max_payload(self.config.max_payload);
        Ok(Established {
            suite: sealer.suite(),
            opener: Opener::new(reader, &self.inbuf),
            sealer,
            session_id: keys.session_id,
            transcript: self.transcript,
            peer_identity: self.peer_identity,
            role: self.role,
            lane_secret: keys.lane_secret(&self.transcript),
        })
    }
}
