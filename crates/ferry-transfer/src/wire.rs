//! The wire format: message types, records, and a bounded little-endian reader.
//!
//! Every packet starts with one message-type byte. All integers are little-endian.
//!
//! | type | sender | body |
//! | --- | --- | --- |
//! | [`MSG_OFFER`] | sender | version u8, flags u8 ([`OFFER_TEXT`]; other bits refused), entries u64, manifest bytes u64 (the sum of the pages' bodies), files u64, dirs u64, symlinks u64, bytes u64, allocated bytes u64 (at most bytes: what the files' data takes on the sender's disk, holes of sparse files not counted), offer id [32] |
//! | [`MSG_MANIFEST`] | sender | count u32, then `count` entries (see [`crate::manifest`]); at most [`MAX_PAGE`] bytes |
//! | [`MSG_EARLY`] | sender | right after the last manifest page, before the answer: records as in [`MSG_DATA`]; all of them together at most [`MAX_EARLY`] bytes (see [Early data](#early-data)) |
//! | [`MSG_EARLY_END`] | sender | — (ends the early part; always sent, also when it is empty or holds the final record) |
//! | [`MSG_ACCEPT`] | receiver | resume pages u32 (that many [`MSG_RESUME`] packets follow) |
//! | [`MSG_DECLINE`] | receiver | — |
//! | [`MSG_RESUME`] | receiver | count u32, then records: index u32, kind u8 ([`HELD_CHUNKS`]: first u32, n u32, n × cv[32]; [`HELD_COMPLETE`] and [`HELD_EXISTING`]: hash[32]) |
//! | [`MSG_VERDICT`] | sender | only after an answer with [`HELD_EXISTING`] records, before any data: last u8 (1 on the last page), count u32, then `count` indices u32, ascending over all pages: the [`HELD_EXISTING`] files whose hash differs from the sender's (sent from offset 0 if the receiver replaces them); every other one is identical and is not sent; at most [`MAX_PAGE`] bytes |
//! | [`MSG_DATA`] | sender | records until the end of the packet (see below) |
//! | [`MSG_DONE`] | receiver | files u64, bytes u64 — everything verified and in place |
//! | [`MSG_ERROR`] | either | code length u8, code, message length u16, message (UTF-8, ≤ [`MAX_ERROR_MESSAGE`]) |
//!
//! Data records: [`REC_START`] index u32, offset u64 (the file's data follows from `offset`);
//! [`REC_START_SPARSE`] (the same, for a file with holes: the receiver reserves no space for it);
//! [`REC_DATA`] len u32, bytes; [`REC_HOLE`] len u64 (the next `len` bytes of the file are zeros
//! that are not sent: a hole of a sparse file, never past the file's size, never across a chunk
//! boundary); [`REC_CHUNK`] chunk u32, cv[32] (the BLAKE3 chaining value of
//! the 1 MiB subtree `chunk`, sent for files larger than one chunk); [`REC_END`] hash[32] (the
//! file's BLAKE3); [`REC_FINISH`] (no more files); [`REC_SKIP`] index u32, reason length u16,
//! reason (UTF-8, ≤ [`MAX_SKIP_REASON`]) — the file `index` could not be opened and is not sent:
//! it takes the place of that file's [`REC_START`] and the receiver drops the entry.
//!
//! # Early data
//!
//! The sender does not wait for the answer before streaming: right after the manifest it sends the
//! first part of the data stream as it would send it to a receiver that holds nothing (no resume
//! claims), in [`MSG_EARLY`] packets of at most [`MAX_EARLY`] bytes in all, closed by one
//! [`MSG_EARLY_END`], and only then reads the answer. The early part counts exactly when the answer
//! is an accept without resume pages ([`Answer::uses_early`]): then the receiver takes its records
//! as the start of the data and the sender goes on with [`MSG_DATA`] packets from where the early
//! part stopped (nothing more when it held [`REC_FINISH`]). After any other answer both sides drop
//! it: the sender starts the data stream again from the first file, with the claims, after its
//! verdict if any. The receiver reads the early part to its end marker before it answers with
//! claims (resume pages may be large: neither side then blocks writing while the other does) and
//! after it declines (the sender is not cut off while writing it); a receiver that waits for a
//! user's yes reads nothing meanwhile, and the bounded early part waits in the buffers.
//! [`EarlyPart`] is the receiver's bookkeeping: an early part over [`MAX_EARLY`] bytes, or anything
//! else before its end marker, is a protocol error.

use crate::TransferError;

/// Version byte of the offer (2: the offer announces its manifest's size; 3: the flags byte, the
/// allocated bytes, [`HELD_EXISTING`] claims and their [`MSG_VERDICT`], skipped files and sparse
/// files' holes as records of their own; 4: the early part, [`MSG_EARLY`] and [`MSG_EARLY_END`],
/// after the manifest).
pub const VERSION: u8 = 4;

/// Offer flag: the offer is a text message, one file of at most [`MAX_TEXT`] bytes that the
/// receiver shows instead of writing (unless told to write it).
pub const OFFER_TEXT: u8 = 1;

/// Largest text message a receiver takes (1 MiB): it is held in memory until verified.
pub const MAX_TEXT: u64 = 1 << 20;

/// Offer header: totals and offer id.
pub const MSG_OFFER: u8 = 1;
/// One page of manifest entries.
pub const MSG_MANIFEST: u8 = 2;
/// The receiver accepts; resume pages follow.
pub const MSG_ACCEPT: u8 = 3;
/// The receiver declines.
pub const MSG_DECLINE: u8 = 4;
/// One page of resume records.
pub const MSG_RESUME: u8 = 5;
/// File data records.
pub const MSG_DATA: u8 = 6;
/// Final acknowledgement: all files verified and renamed.
pub const MSG_DONE: u8 = 7;
/// An error with a stable code; the sender of it stops.
pub const MSG_ERROR: u8 = 8;
/// Which of the receiver's [`HELD_EXISTING`] files differ from the sender's.
pub const MSG_VERDICT: u8 = 9;
/// File data records sent before the answer (the early part).
pub const MSG_EARLY: u8 = 10;
/// The end of the early part.
pub const MSG_EARLY_END: u8 = 11;

/// Most bytes of all [`MSG_EARLY`] packets of one offer together (their type bytes included): what
/// a receiver may have to read and drop after an answer that does not use them (1 MiB, about what a
/// wide-area link carries in one round trip once the manifest has warmed the connection up).
pub const MAX_EARLY: usize = 1 << 20;

/// Data record: start of a file.
pub const REC_START: u8 = 1;
/// Data record: bytes of the current file.
pub const REC_DATA: u8 = 2;
/// Data record: hash of one finished chunk of the current file.
pub const REC_CHUNK: u8 = 3;
/// Data record: end of the current file, with its hash.
pub const REC_END: u8 = 4;
/// Data record: no more files.
pub const REC_FINISH: u8 = 5;
/// Data record: the next bytes of the current file are a hole (zeros, not sent).
pub const REC_HOLE: u8 = 6;
/// Data record: start of a file with holes (as [`REC_START`], but no space is reserved for it).
pub const REC_START_SPARSE: u8 = 7;
/// Data record: a file that is not sent (it could not be opened), with why.
pub const REC_SKIP: u8 = 8;

/// Resume record kind: the receiver holds the first chunks, with these chaining values.
pub const HELD_CHUNKS: u8 = 1;
/// Resume record kind: the receiver holds the whole file (finished earlier), with this hash.
pub const HELD_COMPLETE: u8 = 2;
/// Resume record kind: a regular file of the offered size, that this offer did not write, already
/// has the file's final name (a tree received before), with this hash. The sender answers every
/// such claim in [`MSG_VERDICT`]: a file found identical is left as it is.
pub const HELD_EXISTING: u8 = 3;

/// Largest manifest or resume page, in bytes.
pub const MAX_PAGE: usize = 1 << 20;
/// Longest error message on the wire.
pub const MAX_ERROR_MESSAGE: usize = 1024;
/// Longest reason of a [`REC_SKIP`] record.
pub const MAX_SKIP_REASON: usize = 256;

/// Size of the offer message.
pub const OFFER_LEN: usize = 3 + 7 * 8 + 32;
/// Size of a [`REC_START`] record.
pub const START_LEN: usize = 1 + 4 + 8;
/// Size of a [`REC_DATA`] header.
pub const DATA_HEADER_LEN: usize = 1 + 4;
/// Size of a [`REC_HOLE`] record.
pub const HOLE_LEN: usize = 1 + 8;
/// Size of a [`REC_CHUNK`] record.
pub const CHUNK_LEN: usize = 1 + 4 + 32;
/// Size of a [`REC_END`] record.
pub const END_LEN: usize = 1 + 32;
/// Size of a [`REC_SKIP`] record without its reason.
pub const SKIP_LEN: usize = 1 + 4 + 2;

pub use ferry_wire::{truncate_text, Cursor, Put, Reader};

/// The totals announced in an offer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OfferHeader {
    /// Number of manifest entries.
    pub entries: u64,
    /// Bytes of all manifest entries' encodings (the manifest pages without their 5-byte headers),
    /// so that a receiver can refuse a manifest too large for its memory before reading it.
    pub manifest_bytes: u64,
    /// Totals by kind and bytes.
    pub totals: crate::Totals,
    /// Bytes the files' data takes on the sender's disk, at most `totals.bytes` (less when files
    /// are sparse): what the receiver checks its free space against.
    pub bytes_allocated: u64,
    /// BLAKE3 of the manifest encoding.
    pub offer_id: [u8; 32],
    /// A text message ([`OFFER_TEXT`]): one file of at most [`MAX_TEXT`] bytes.
    pub text: bool,
}

impl OfferHeader {
    /// Encodes the offer message.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u8(MSG_OFFER);
        out.put_u8(VERSION);
        out.put_u8(if self.text { OFFER_TEXT } else { 0 });
        out.put_u64(self.entries);
        out.put_u64(self.manifest_bytes);
        out.put_u64(self.totals.files);
        out.put_u64(self.totals.dirs);
        out.put_u64(self.totals.symlinks);
        out.put_u64(self.totals.bytes);
        out.put_u64(self.bytes_allocated);
        out.put(&self.offer_id);
    }

    /// Decodes an offer message (including its type byte).
    pub fn decode(packet: &[u8]) -> Result<Self, TransferError> {
        let mut r = Reader::new(packet);
        expect_type(&mut r, MSG_OFFER, "offer")?;
        let version = r.u8()?;
        if version != VERSION {
            return Err(TransferError::protocol(format!(
                "unsupported offer version {version}"
            )));
        }
        let flags = r.u8()?;
        if flags & !OFFER_TEXT != 0 {
            return Err(TransferError::protocol(format!(
                "unknown offer flags {flags:#04x}"
            )));
        }
        let h = OfferHeader {
            entries: r.u64()?,
            manifest_bytes: r.u64()?,
            totals: crate::Totals {
                files: r.u64()?,
                dirs: r.u64()?,
                symlinks: r.u64()?,
                bytes: r.u64()?,
            },
            bytes_allocated: r.u64()?,
            offer_id: r.array()?,
            text: flags & OFFER_TEXT != 0,
        };
        r.finish()?;
        if h.bytes_allocated > h.totals.bytes {
            return Err(TransferError::protocol(
                "offer announces more allocated bytes than bytes",
            ));
        }
        Ok(h)
    }
}

/// The receiver's answer to an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Accepted; this many [`MSG_RESUME`] pages follow.
    Accept {
        /// Resume pages that follow.
        resume_pages: u32,
    },
    /// Declined.
    Decline,
}

impl Answer {
    /// Encodes the answer message.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Answer::Accept { resume_pages } => {
                out.put_u8(MSG_ACCEPT);
                out.put_u32(resume_pages);
            }
            Answer::Decline => out.put_u8(MSG_DECLINE),
        }
    }

    /// Decodes an answer message (including its type byte); an error message from the peer becomes
    /// [`TransferError::Remote`].
    pub fn decode(packet: &[u8]) -> Result<Self, TransferError> {
        let mut r = Reader::new(packet);
        let answer = match r.u8()? {
            MSG_DECLINE => Answer::Decline,
            MSG_ERROR => return Err(decode_error_body(&mut r)),
            MSG_ACCEPT => Answer::Accept {
                resume_pages: r.u32()?,
            },
            t => {
                return Err(TransferError::protocol(format!(
                    "expected accept, got message type {t}"
                )))
            }
        };
        r.finish()?;
        Ok(answer)
    }

    /// Whether the early part counts as the start of the data: an accept without resume claims.
    pub fn uses_early(&self) -> bool {
        *self == Answer::Accept { resume_pages: 0 }
    }
}

/// The receiver's side of the early part: which packets belong to it, and its bound.
#[derive(Debug, Clone, Default)]
pub struct EarlyPart {
    bytes: usize,
    ended: bool,
}

impl EarlyPart {
    /// An early part not read yet.
    pub fn new() -> Self {
        EarlyPart::default()
    }

    /// Whether its end marker has been read.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Takes the next packet while the part is open: the records of an [`MSG_EARLY`] packet, or
    /// `None` for the end marker (the part is then ended). More than [`MAX_EARLY`] bytes, any other
    /// message, or a packet after the end is a protocol error (an error message from the peer
    /// becomes [`TransferError::Remote`]).
    pub fn take<'p>(&mut self, packet: &'p [u8]) -> Result<Option<&'p [u8]>, TransferError> {
        if self.ended {
            return Err(TransferError::protocol("early data after its end"));
        }
        let mut r = Reader::new(packet);
        match r.u8()? {
            MSG_EARLY => {
                self.bytes += packet.len();
                if self.bytes > MAX_EARLY {
                    return Err(TransferError::protocol(format!(
                        "early data over {MAX_EARLY} bytes"
                    )));
                }
                Ok(Some(&packet[1..]))
            }
            MSG_EARLY_END => {
                r.finish()?;
                self.ended = true;
                Ok(None)
            }
            MSG_ERROR => Err(decode_error_body(&mut r)),
            t => Err(TransferError::protocol(format!(
                "expected early data or its end, got message type {t}"
            ))),
        }
    }
}

/// Reads the type byte and fails with a clear message if it is not `want` (an error message from
/// the peer becomes [`TransferError::Remote`]).
pub fn expect_type(r: &mut Reader<'_>, want: u8, what: &str) -> Result<(), TransferError> {
    let got = r.u8()?;
    if got == want {
        return Ok(());
    }
    if got == MSG_ERROR {
        return Err(decode_error_body(r));
    }
    Err(TransferError::protocol(format!(
        "expected {what}, got message type {got}"
    )))
}

/// Encodes an error message with the error's stable code.
pub fn encode_error(err: &TransferError, out: &mut Vec<u8>) {
    let code = err.code().as_str().as_bytes();
    let msg = err.to_string();
    let msg = truncate_text(&msg, MAX_ERROR_MESSAGE);
    out.put_u8(MSG_ERROR);
    out.put_u8(code.len() as u8);
    out.put(code);
    out.put_u16(msg.len() as u16);
    out.put(msg.as_bytes());
}

/// Tells the peer why this side failed, best effort, unless the failure came from the peer or the
/// channel itself (then there is nobody to tell or nothing new to say).
pub(crate) fn report_failure<T, K: crate::PacketSink>(
    result: &Result<T, TransferError>,
    sink: &mut K,
) {
    if let Err(e) = result {
        if !matches!(
            e,
            TransferError::Remote { .. } | TransferError::Declined | TransferError::Io(_)
        ) {
            let mut msg = Vec::new();
            encode_error(e, &mut msg);
            let _ = sink.send(&msg).and_then(|_| sink.flush());
        }
    }
}

/// Decodes the body of an error message (after its type byte) into [`TransferError::Remote`].
pub fn decode_error_body(r: &mut Reader<'_>) -> TransferError {
    let mut parse = || -> Result<TransferError, TransferError> {
        let n = r.u8()? as usize;
        let code = String::from_utf8_lossy(r.bytes(n)?).into_owned();
        let n = r.u16()? as usize;
        if n > MAX_ERROR_MESSAGE {
            return Err(TransferError::protocol("error message too long"));
        }
        let message = String::from_utf8_lossy(r.bytes(n)?).into_owned();
        Ok(TransferError::Remote { code, message })
    };
    parse().unwrap_or_else(|e| e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offer_round_trip_and_bounds() {
        let h = OfferHeader {
            entries: 3,
            manifest_bytes: 100,
            totals: crate::Totals {
                files: 1,
                dirs: 1,
                symlinks: 1,
                bytes: 9,
            },
            bytes_allocated: 8,
            offer_id: [7; 32],
            text: true,
        };
        let mut buf = Vec::new();
        h.encode(&mut buf);
        assert_eq!(buf.len(), OFFER_LEN);
        assert_eq!(OfferHeader::decode(&buf).unwrap(), h);
        assert!(OfferHeader::decode(&buf[..buf.len() - 1]).is_err());
        // A flag this version does not know is refused, not ignored.
        let mut unknown = buf.clone();
        unknown[2] |= 0x80;
        assert!(OfferHeader::decode(&unknown).is_err());
        buf.push(0);
        assert!(OfferHeader::decode(&buf).is_err());
        let mut more_allocated_than_bytes = Vec::new();
        OfferHeader {
            bytes_allocated: 10,
            ..h
        }
        .encode(&mut more_allocated_than_bytes);
        assert!(OfferHeader::decode(&more_allocated_than_bytes).is_err());
    }

    #[test]
    fn answers_round_trip_and_only_a_plain_accept_uses_the_early_part() {
        for (answer, uses) in [
            (Answer::Accept { resume_pages: 0 }, true),
            (Answer::Accept { resume_pages: 3 }, false),
            (Answer::Decline, false),
        ] {
            let mut buf = Vec::new();
            answer.encode(&mut buf);
            assert_eq!(Answer::decode(&buf).unwrap(), answer);
            assert_eq!(answer.uses_early(), uses);
            buf.push(0);
            assert!(Answer::decode(&buf).is_err());
        }
        assert!(Answer::decode(&[MSG_DATA]).is_err());
    }

    #[test]
    fn early_part_is_bounded_and_ends_once() {
        let mut early = EarlyPart::new();
        let packet = vec![MSG_EARLY; MAX_EARLY / 2];
        assert_eq!(
            early.take(&packet).unwrap().unwrap().len(),
            packet.len() - 1
        );
        assert!(early.take(&packet).unwrap().is_some());
        // One byte over the bound.
        assert!(matches!(
            early.clone().take(&[MSG_EARLY]),
            Err(TransferError::Protocol(_))
        ));
        assert!(early.clone().take(&[MSG_DATA, REC_FINISH]).is_err());
        assert!(early.clone().take(&[MSG_EARLY_END, 0]).is_err());
        assert_eq!(early.take(&[MSG_EARLY_END]).unwrap(), None);
        assert!(early.ended());
        assert!(early.take(&[MSG_EARLY_END]).is_err());
        let mut err = Vec::new();
        encode_error(&TransferError::Declined, &mut err);
        assert!(matches!(
            EarlyPart::new().take(&err),
            Err(TransferError::Remote { .. })
        ));
    }

    #[test]
    fn error_round_trip() {
        let mut buf = Vec::new();
        encode_error(&TransferError::Conflict { path: "a".into() }, &mut buf);
        let mut r = Reader::new(&buf);
        match expect_type(&mut r, MSG_DONE, "done") {
            Err(TransferError::Remote { code, message }) => {
                assert_eq!(code, "conflict");
                assert!(message.contains("already exists"));
            }
            other => panic!("{other:?}"),
        }
    }
}
