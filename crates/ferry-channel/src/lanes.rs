//! Lanes: more TCP connections for one established session, where one stream's window cannot cover the path.
//!
//! The sans-IO half. An extra lane is authenticated against the session it joins, with no new key agreement
//! and no new PAKE or signature: every key comes from the session's lane secret ([`Established::lane_keys`])
//! by HKDF with labels no other key uses.
//!
//! - The lane hello: the dialling side (the receiver of the data) sends [`HELLO_LEN`] bytes on the new
//!   connection, `HMAC-SHA256(hello key, "lane" || index)`. They look random on the wire and name both the
//!   session and the lane. The listening side ([`HelloCheck`]) closes a connection whose hello matches no lane
//!   of its session (forged, or of another session) without an answer, and one whose lane is taken already
//!   (a replayed hello).
//! - Each lane `i ≥ 1` has its own length and packet keys ([`LaneKeys::sealer`], [`LaneKeys::opener`]): no
//!   nonce is ever used under one key on two connections. Lane 0 is the session's own connection.
//! - Data packets carry an 8-byte header ([`LaneHeader`]): the packet's sequence number over all lanes, or
//!   the end of the stream with the number of packets sent. The receiver puts them back in order in a
//!   [`Reorder`] buffer, which admits only sequence numbers within [`REORDER_WINDOW`] of the next one
//!   expected: a lane that runs ahead waits (its reader stops reading, TCP pushes back on the sender), so a
//!   hostile peer cannot make the buffer grow.
//!
//! ```
//! use ferry_channel::lanes::{HelloCheck, LaneHeader, LaneKeys, Reorder};
//! use ferry_channel::Suite;
//!
//! let keys = LaneKeys::from_secret([7; 32], Suite::ChaCha20Poly1305, 1 << 20);
//! let mut check = HelloCheck::new(&keys, 4);
//! assert_eq!(check.check(&keys.hello(2)).unwrap(), 2);
//! assert!(check.check(&keys.hello(2)).is_err()); // replayed
//!
//! let mut r = Reorder::new();
//! r.insert(LaneHeader::Data(1), b"b".to_vec()).unwrap();
//! assert_eq!(r.pop(), None);
//! r.insert(LaneHeader::Data(0), b"a".to_vec()).unwrap();
//! assert_eq!(r.pop(), Some(b"a".to_vec()));
//! assert_eq!(r.pop(), Some(b"b".to_vec()));
//! r.insert(LaneHeader::End(2), Vec::new()).unwrap();
//! assert!(r.is_finished());
//! ```

use std::collections::BTreeMap;

use aws_lc_rs::{constant_time, hkdf, hmac};
use thiserror::Error;

use crate::keys::DirectionKeys;
use crate::packet::{Opener, Sealer};
use crate::suite::Suite;

/// Bytes of a lane hello.
pub const HELLO_LEN: usize = 32;
/// Bytes of the header before each data packet's contents on lanes.
pub const LANE_HEADER: usize = 8;
/// Most lanes a session has, its own connection included.
pub const MAX_LANES: usize = 16;
/// The data sender's first packet in a session: how many lanes the data takes (1: the session's connection
/// alone, without lane headers).
pub fn announcement(lanes: usize) -> [u8; 2] {
    [b'L', lanes.clamp(1, MAX_LANES) as u8]
}

/// The lane count of a sender's first packet, or `None` if the packet is not an announcement.
pub fn read_announcement(packet: &[u8]) -> Option<usize> {
    match packet {
        [b'L', n] if (1..=MAX_LANES).contains(&(*n as usize)) => Some(*n as usize),
        _ => None,
    }
}

/// How far past the next expected packet a packet may be numbered and still be taken into the reorder
/// buffer: the buffer holds at most this many packets (of at most the session's packet size each).
pub const REORDER_WINDOW: u64 = 64;
/// The header bit that marks the end of the stream (the rest is the count of packets sent).
const END_BIT: u64 = 1 << 63;

/// What breaks the lanes' rules.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LaneError {
    /// A lane hello that names no lane of this session.
    #[error("lane hello does not verify")]
    Forged,
    /// A lane hello for a lane that joined already.
    #[error("lane {0} joined already (replayed hello)")]
    Replayed(usize),
    /// A packet too short for its lane header.
    #[error("lane packet of {0} bytes has no header")]
    NoHeader(usize),
    /// A sequence number delivered already, twice, or past the end.
    #[error("lane packet {0} is out of order")]
    OutOfOrder(u64),
    /// A sequence number too far ahead of the next one expected.
    #[error("lane packet {seq} is past the reorder window (next expected {next})")]
    PastWindow {
        /// The packet's number.
        seq: u64,
        /// The next number expected.
        next: u64,
    },
    /// An end of stream that contradicts the packets seen.
    #[error("lane end of stream at {0} contradicts the packets received")]
    BadEnd(u64),
}

/// A packet's lane header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneHeader {
    /// A data packet and its sequence number.
    Data(u64),
    /// The end of the stream: the number of data packets sent in all.
    End(u64),
}

impl LaneHeader {
    /// The header's bytes.
    pub fn encode(self) -> [u8; LANE_HEADER] {
        match self {
            LaneHeader::Data(seq) => (seq & !END_BIT).to_le_bytes(),
            LaneHeader::End(count) => ((count & !END_BIT) | END_BIT).to_le_bytes(),
        }
    }

    /// Splits `packet` into its header and contents.
    pub fn decode(packet: &[u8]) -> Result<(LaneHeader, &[u8]), LaneError> {
        if packet.len() < LANE_HEADER {
            return Err(LaneError::NoHeader(packet.len()));
        }
        let (head, rest) = packet.split_at(LANE_HEADER);
        let v = u64::from_le_bytes(head.try_into().expect("8 bytes"));
        let header = match v & END_BIT {
            0 => LaneHeader::Data(v),
            _ if !rest.is_empty() => return Err(LaneError::BadEnd(v & !END_BIT)),
            _ => LaneHeader::End(v & !END_BIT),
        };
        Ok((header, rest))
    }
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// Every key of a session's lanes, from its lane secret.
pub struct LaneKeys {
    prk: hkdf::Prk,
    suite: Suite,
    max_payload: usize,
}

impl LaneKeys {
    /// The keys of the lanes of a session whose lane secret is `secret`, protected by `suite`, with packets of
    /// at most `max_payload` bytes of contents (header included).
    pub fn from_secret(secret: [u8; 32], suite: Suite, max_payload: usize) -> Self {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"ferry/lanes").extract(&secret);
        LaneKeys {
            prk,
            suite,
            max_payload,
        }
    }

    fn expand(&self, label: &[&[u8]]) -> [u8; 32] {
        let mut out = [0u8; 32];
        self.prk
            .expand(label, Len(32))
            .and_then(|okm| okm.fill(&mut out))
            .expect("HKDF output length is far below its limit");
        out
    }

    /// The hello that joins lane `index` to the session.
    pub fn hello(&self, index: usize) -> [u8; HELLO_LEN] {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.expand(&[b"hello"]));
        let mut msg = b"lane".to_vec();
        msg.extend_from_slice(&(index as u32).to_le_bytes());
        let mut out = [0u8; HELLO_LEN];
        out.copy_from_slice(hmac::sign(&key, &msg).as_ref());
        out
    }

    /// The keys of lane `index`'s one direction (from the side that listens to the side that dialled).
    fn direction(&self, index: usize) -> DirectionKeys {
        let i = (index as u32).to_le_bytes();
        DirectionKeys {
            length: self.expand(&[b"lane/", &i, b"/L"]),
            packet: self.expand(&[b"lane/", &i, b"/P"]),
        }
    }

    /// Seals what the listening side sends on lane `index`.
    pub fn sealer(&self, index: usize) -> Sealer {
        Sealer::new(
            &self.direction(index),
            self.suite,
            Vec::new(),
            self.max_payload,
        )
    }

    /// Opens what the dialling side receives on lane `index`.
    pub fn opener(&self, index: usize) -> Opener {
        Opener::with_keys(
            &self.direction(index),
            self.suite,
            Vec::new(),
            self.max_payload,
        )
    }
}

/// The listening side's check of lane hellos: which lanes may still join.
pub struct HelloCheck {
    expected: Vec<[u8; HELLO_LEN]>,
    joined: Vec<bool>,
}

impl HelloCheck {
    /// Lanes `1..lanes` may join (lane 0 is the session's connection), each once.
    pub fn new(keys: &LaneKeys, lanes: usize) -> Self {
        let lanes = lanes.clamp(1, MAX_LANES);
        HelloCheck {
            expected: (1..lanes).map(|i| keys.hello(i)).collect(),
            joined: vec![false; lanes - 1],
        }
    }

    /// The lane `hello` joins, or why it joins none (close the connection without an answer).
    pub fn check(&mut self, hello: &[u8]) -> Result<usize, LaneError> {
        let found = self
            .expected
            .iter()
            .position(|h| constant_time::verify_slices_are_equal(h, hello).is_ok())
            .ok_or(LaneError::Forged)?;
        if std::mem::replace(&mut self.joined[found], true) {
            return Err(LaneError::Replayed(found + 1));
        }
        Ok(found + 1)
    }

    /// True once every lane joined.
    pub fn is_full(&self) -> bool {
        self.joined.iter().all(|j| *j)
    }
}

/// The receiver's reorder buffer: packets from every lane in, the stream in order out.
#[derive(Default)]
pub struct Reorder {
    next: u64,
    pending: BTreeMap<u64, Vec<u8>>,
    end: Option<u64>,
}

impl Reorder {
    /// Nothing received yet.
    pub fn new() -> Self {
        Reorder::default()
    }

    /// Whether a packet numbered `seq` may be inserted now; if not, its lane waits until [`Reorder::pop`]
    /// made room (it cannot be the next one expected).
    pub fn admits(&self, header: LaneHeader) -> bool {
        match header {
            LaneHeader::Data(seq) => seq < self.next.saturating_add(REORDER_WINDOW),
            LaneHeader::End(_) => true,
        }
    }

    /// Takes one packet from a lane.
    pub fn insert(&mut self, header: LaneHeader, contents: Vec<u8>) -> Result<(), LaneError> {
        match header {
            LaneHeader::Data(seq) => {
                if !self.admits(header) {
                    return Err(LaneError::PastWindow {
                        seq,
                        next: self.next,
                    });
                }
                if seq < self.next || self.end.is_some_and(|end| seq >= end) {
                    return Err(LaneError::OutOfOrder(seq));
                }
                if self.pending.insert(seq, contents).is_some() {
                    return Err(LaneError::OutOfOrder(seq));
                }
            }
            LaneHeader::End(count) => {
                let last_pending = self.pending.keys().next_back().map(|s| s + 1);
                if self.end.is_some()
                    || count < self.next
                    || last_pending.is_some_and(|l| l > count)
                {
                    return Err(LaneError::BadEnd(count));
                }
                self.end = Some(count);
            }
        }
        Ok(())
    }

    /// The next packet in order, if it arrived.
    pub fn pop(&mut self) -> Option<Vec<u8>> {
        let contents = self.pending.remove(&self.next)?;
        self.next += 1;
        Some(contents)
    }

    /// Packets waiting for an earlier one.
    pub fn waiting(&self) -> usize {
        self.pending.len()
    }

    /// True once the end of stream arrived and every packet before it was popped.
    pub fn is_finished(&self) -> bool {
        self.end == Some(self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Packet;

    fn keys(secret: u8) -> LaneKeys {
        LaneKeys::from_secret([secret; 32], Suite::Aes256Gcm, 1 << 16)
    }

    #[test]
    fn packets_spread_over_lanes_come_out_in_order() {
        let keys = keys(1);
        let lanes = 4;
        let mut sealers: Vec<Sealer> = (0..lanes).map(|i| keys.sealer(i)).collect();
        let mut openers: Vec<Opener> = (0..lanes).map(|i| keys.opener(i)).collect();
        // The sender spreads 200 packets unevenly: lane i takes packets whose number mod 7 falls in its range.
        let mut wires = vec![Vec::new(); lanes];
        let count = 200u64;
        for seq in 0..count {
            let lane = [0, 0, 1, 2, 3, 3, 3][(seq % 7) as usize];
            let mut payload = LaneHeader::Data(seq).encode().to_vec();
            payload.extend_from_slice(format!("packet {seq}").as_bytes());
            sealers[lane]
                .seal_into(&mut wires[lane], 0, &payload)
                .unwrap();
        }
        let end = LaneHeader::End(count).encode();
        sealers[2].seal_into(&mut wires[2], 0, &end).unwrap();
        for (o, w) in openers.iter_mut().zip(&wires) {
            o.feed(w);
        }
        // The receiver reads the lanes in turn, a lane waiting whenever its packet is past the window.
        let mut r = Reorder::new();
        let mut out = Vec::new();
        let mut held: Vec<Option<(LaneHeader, Vec<u8>)>> = vec![None; lanes];
        let mut most_waiting = 0;
        while !r.is_finished() {
            for lane in (0..lanes).rev() {
                if held[lane].is_none() {
                    if let Some(Packet::Data(p)) = openers[lane].next().unwrap() {
                        let (h, c) = LaneHeader::decode(p).unwrap();
                        held[lane] = Some((h, c.to_vec()));
                    }
                }
                if let Some((h, c)) = held[lane].take() {
                    if r.admits(h) {
                        r.insert(h, c).unwrap();
                    } else {
                        held[lane] = Some((h, c));
                    }
                }
                most_waiting = most_waiting.max(r.waiting());
                while let Some(p) = r.pop() {
                    out.push(String::from_utf8(p).unwrap());
                }
            }
        }
        let want: Vec<String> = (0..count).map(|s| format!("packet {s}")).collect();
        assert_eq!(out, want);
        assert!(most_waiting <= REORDER_WINDOW as usize);
    }

    #[test]
    fn both_sides_of_a_session_agree_on_its_lanes_and_other_sessions_do_not() {
        use crate::{Auth, Config, Handshake, Role};
        let session = || {
            let code = || Auth::Code(b"7-amber-otter".to_vec());
            let mut a = Handshake::new(Role::Initiator, Config::ferry(), code());
            let mut b = Handshake::new(Role::Responder, Config::ferry(), code());
            while !(a.is_done() && b.is_done()) {
                let (to_b, to_a) = (a.take_output(), b.take_output());
                b.feed(&to_b).unwrap();
                a.feed(&to_a).unwrap();
            }
            (a.finish().unwrap(), b.finish().unwrap())
        };
        let (a, b) = session();
        let (ka, kb) = (a.lane_keys(1 << 16), b.lane_keys(1 << 16));
        assert_eq!(HelloCheck::new(&kb, 2).check(&ka.hello(1)), Ok(1));
        let mut wire = Vec::new();
        kb.sealer(1).seal_into(&mut wire, 0, b"lane data").unwrap();
        let mut o = ka.opener(1);
        o.feed(&wire);
        assert_eq!(
            o.next().unwrap(),
            Some(Packet::Data(&mut b"lane data".to_vec()[..]))
        );
        let (c, _) = session();
        let kc = c.lane_keys(1 << 16);
        assert_eq!(
            HelloCheck::new(&kb, 2).check(&kc.hello(1)),
            Err(LaneError::Forged)
        );
    }

    #[test]
    fn a_forged_hello_and_another_sessions_hello_join_no_lane() {
        let keys = keys(2);
        let mut check = HelloCheck::new(&keys, 4);
        assert_eq!(check.check(&[0u8; HELLO_LEN]), Err(LaneError::Forged));
        assert_eq!(check.check(&keys.hello(2)[..31]), Err(LaneError::Forged));
        // Lane 0 is the session's own connection: no hello joins it.
        assert_eq!(check.check(&keys.hello(0)), Err(LaneError::Forged));
        // A lane the session does not have.
        assert_eq!(check.check(&keys.hello(4)), Err(LaneError::Forged));
        assert_eq!(check.check(&self::keys(3).hello(1)), Err(LaneError::Forged));
        assert_eq!(check.check(&keys.hello(3)), Ok(3));
    }

    #[test]
    fn a_replayed_hello_is_refused() {
        let keys = keys(4);
        let mut check = HelloCheck::new(&keys, 3);
        assert_eq!(check.check(&keys.hello(1)), Ok(1));
        assert_eq!(check.check(&keys.hello(1)), Err(LaneError::Replayed(1)));
        assert!(!check.is_full());
        assert_eq!(check.check(&keys.hello(2)), Ok(2));
        assert!(check.is_full());
    }

    #[test]
    fn lanes_have_keys_of_their_own() {
        let keys = keys(5);
        let mut wire = Vec::new();
        keys.sealer(1)
            .seal_into(&mut wire, 0, b"for lane 1")
            .unwrap();
        // The same packet under lane 2's keys does not open: no key serves two lanes.
        let mut other = keys.opener(2);
        other.feed(&wire);
        assert!(other.next().is_err());
        let mut right = keys.opener(1);
        right.feed(&wire);
        assert_eq!(
            right.next().unwrap(),
            Some(Packet::Data(&mut b"for lane 1".to_vec()[..]))
        );
        // And the first packet of two lanes differs, though both seal the same bytes at nonce 0.
        let (mut a, mut b) = (Vec::new(), Vec::new());
        keys.sealer(1).seal_into(&mut a, 0, b"same").unwrap();
        keys.sealer(2).seal_into(&mut b, 0, b"same").unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn a_hostile_sender_cannot_grow_the_buffer_or_repeat_packets() {
        let mut r = Reorder::new();
        assert!(!r.admits(LaneHeader::Data(REORDER_WINDOW)));
        assert_eq!(
            r.insert(LaneHeader::Data(REORDER_WINDOW), vec![0; 10]),
            Err(LaneError::PastWindow {
                seq: REORDER_WINDOW,
                next: 0
            })
        );
        assert_eq!(
            r.insert(LaneHeader::Data(u64::MAX >> 1), vec![]),
            Err(LaneError::PastWindow {
                seq: u64::MAX >> 1,
                next: 0
            })
        );
        r.insert(LaneHeader::Data(3), vec![3]).unwrap();
        assert_eq!(
            r.insert(LaneHeader::Data(3), vec![3]),
            Err(LaneError::OutOfOrder(3))
        );
        // An end before a packet already received, and a second end.
        assert_eq!(
            r.insert(LaneHeader::End(2), vec![]),
            Err(LaneError::BadEnd(2))
        );
        r.insert(LaneHeader::End(5), vec![]).unwrap();
        assert_eq!(
            r.insert(LaneHeader::End(5), vec![]),
            Err(LaneError::BadEnd(5))
        );
        assert_eq!(
            r.insert(LaneHeader::Data(5), vec![]),
            Err(LaneError::OutOfOrder(5))
        );
        for seq in [0, 1, 2, 4] {
            r.insert(LaneHeader::Data(seq), vec![seq as u8]).unwrap();
        }
        let got: Vec<Vec<u8>> = std::iter::from_fn(|| r.pop()).collect();
        assert_eq!(got, (0..5).map(|s| vec![s]).collect::<Vec<_>>());
        assert!(r.is_finished());
        assert_eq!(
            r.insert(LaneHeader::Data(1), vec![]),
            Err(LaneError::OutOfOrder(1))
        );
    }

    #[test]
    fn a_lane_that_dies_leaves_the_stream_unfinished() {
        // Lane 1 carried packet 1 and died before its end: the receiver never reaches the end, however long
        // the other lanes run, and packets after the gap stay held, never delivered out of order.
        let mut r = Reorder::new();
        r.insert(LaneHeader::Data(0), vec![0]).unwrap();
        r.insert(LaneHeader::Data(2), vec![2]).unwrap();
        r.insert(LaneHeader::End(3), vec![]).unwrap();
        assert_eq!(r.pop(), Some(vec![0]));
        assert_eq!(r.pop(), None);
        assert!(!r.is_finished());
        // A truncated lane's opener says so at end of file.
        let keys = keys(6);
        let mut wire = Vec::new();
        keys.sealer(1)
            .seal_into(&mut wire, 0, &LaneHeader::Data(1).encode())
            .unwrap();
        let mut o = keys.opener(1);
        o.feed(&wire[..wire.len() - 1]);
        assert_eq!(o.next().unwrap(), None);
        assert!(o.check_eof().is_err());
    }

    #[test]
    fn headers_round_trip_and_malformed_ones_are_refused() {
        for h in [
            LaneHeader::Data(0),
            LaneHeader::Data(1 << 40),
            LaneHeader::End(7),
        ] {
            let mut p = h.encode().to_vec();
            if matches!(h, LaneHeader::Data(_)) {
                p.push(9);
            }
            assert_eq!(LaneHeader::decode(&p).unwrap().0, h);
        }
        assert_eq!(LaneHeader::decode(&[1, 2, 3]), Err(LaneError::NoHeader(3)));
        let mut end_with_data = LaneHeader::End(1).encode().to_vec();
        end_with_data.push(0);
        assert_eq!(
            LaneHeader::decode(&end_with_data),
            Err(LaneError::BadEnd(1))
        );
    }

    #[test]
    fn announcements_round_trip_and_others_are_refused() {
        for n in 1..=MAX_LANES {
            assert_eq!(read_announcement(&announcement(n)), Some(n));
        }
        assert_eq!(read_announcement(&announcement(99)), Some(MAX_LANES));
        for bad in [&b"L\x00"[..], b"L\x11", b"X\x01", b"L", b"L\x01\x00", b""] {
            assert_eq!(read_announcement(bad), None, "{bad:?}");
        }
    }
}
