//! The packet layer: BIP324 framing, sealed and opened in place.
//!
//! A frame on the wire is `length (3, FSChaCha20) || header (1) || contents || tag (16)`, where header and
//! contents are the AEAD plaintext. The first packet in each direction carries the sender's garbage as AAD.
//! Header bit 7 marks a decoy, which the receiver drops; ferry adds bit 0 for the authenticated end of stream.

use crate::error::ChannelError;
use crate::fschacha::FsChaCha20;
use crate::keys::DirectionKeys;
use crate::suite::{FsAead, Suite, TAG_LEN};

/// Bytes of encrypted length before the header.
pub const LENGTH_LEN: usize = 3;
/// Offset of the contents in a frame (length + header).
pub const CONTENTS_OFFSET: usize = LENGTH_LEN + 1;
/// Bytes a frame adds to its contents.
pub const FRAME_OVERHEAD: usize = CONTENTS_OFFSET + TAG_LEN;
/// The largest contents the 3-byte length can express.
pub const MAX_ENCODABLE: usize = (1 << 24) - 1;
/// Header bit: a decoy packet, to be ignored (BIP324's `ignore` bit).
pub const HEADER_DECOY: u8 = 0x80;
/// Header bit: the authenticated end of stream (a ferry extension; BIP324 leaves it reserved).
pub const HEADER_CLOSE: u8 = 0x01;
/// What an opener's receive buffer starts at, before any large packet.
const INITIAL_BUFFER: usize = 64 << 10;
/// Default maximum contents per packet: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;

/// The length of a frame holding `payload` bytes of contents.
pub const fn frame_len(payload: usize) -> usize {
    payload + FRAME_OVERHEAD
}

/// The sending half of a channel direction: encrypts packets.
pub struct Sealer {
    length: FsChaCha20,
    aead: FsAead,
    aad: Option<Vec<u8>>,
    max_payload: usize,
}

impl Sealer {
    /// A sealer from direction keys; `first_aad` is authenticated with the first packet (BIP324: our garbage).
    pub fn new(keys: &DirectionKeys, suite: Suite, first_aad: Vec<u8>, max_payload: usize) -> Self {
        Sealer {
            length: FsChaCha20::new(keys.length),
            aead: FsAead::new(suite, &keys.packet),
            aad: Some(first_aad),
            max_payload: max_payload.min(MAX_ENCODABLE),
        }
    }

    /// The largest contents one packet may carry.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// The suite protecting contents.
    pub fn suite(&self) -> Suite {
        self.aead.suite()
    }

    /// Changes the largest contents a packet may carry (capped at [`MAX_ENCODABLE`]): for a protocol on top
    /// that agreed on another size with its peer after the handshake.
    pub fn set_max_payload(&mut self, max: usize) {
        self.max_payload = max.min(MAX_ENCODABLE);
    }

    /// Seals a frame in place. `frame` is laid out as `[4 free bytes][contents][16 free bytes]`.
    pub fn seal_frame(&mut self, frame: &mut [u8], header: u8) -> Result<(), ChannelError> {
        let Some(payload) = frame.len().checked_sub(FRAME_OVERHEAD) else {
            return Err(ChannelError::Oversized {
                len: 0,
                max: self.max_payload,
            });
        };
        if payload > self.max_payload {
            return Err(ChannelError::Oversized {
                len: payload,
                max: self.max_payload,
            });
        }
        let mut len = [0u8; LENGTH_LEN];
        len.copy_from_slice(&(payload as u32).to_le_bytes()[..LENGTH_LEN]);
        self.length.crypt(&mut len);
        frame[..LENGTH_LEN].copy_from_slice(&len);
        frame[LENGTH_LEN] = header;
        let (body, tag) = frame[LENGTH_LEN..].split_at_mut(1 + payload);
        let t = match self.aad.take() {
            Some(aad) => self.aead.seal(&aad, body),
            None => self.aead.seal(&[], body),
        };
        tag.copy_from_slice(&t);
        Ok(())
    }

    /// Appends one sealed packet with `payload` as contents to `out` (for coalescing small packets).
    pub fn seal_into(
        &mut self,
        out: &mut Vec<u8>,
        header: u8,
        payload: &[u8],
    ) -> Result<(), ChannelError> {
        self.seal_into_inner(out, header, payload)
    }

    /// Like [`Sealer::seal_into`] with explicit AAD for this packet (BIP324's test vectors use it).
    pub fn seal_into_with_aad(
        &mut self,
        out: &mut Vec<u8>,
        header: u8,
        payload: &[u8],
        aad: &[u8],
    ) -> Result<(), ChannelError> {
        self.aad = Some(aad.to_vec());
        self.seal_into_inner(out, header, payload)
    }

    fn seal_into_inner(
        &mut self,
        out: &mut Vec<u8>,
        header: u8,
        payload: &[u8],
    ) -> Result<(), ChannelError> {
        let start = out.len();
        out.reserve(frame_len(payload.len()));
        out.extend_from_slice(&[0u8; CONTENTS_OFFSET]);
        out.extend_from_slice(payload);
        out.extend_from_slice(&[0u8; TAG_LEN]);
        let result = self.seal_frame(&mut out[start..], header);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }
}

/// Opens packets one at a time from a byte slice; keeps the decrypted length of a packet not yet complete.
pub(crate) struct PacketReader {
    length: FsChaCha20,
    aead: FsAead,
    aad: Option<Vec<u8>>,
    max_payload: usize,
    pending: Option<usize>,
}

impl PacketReader {
    pub(crate) fn new(
        keys: &DirectionKeys,
        suite: Suite,
        first_aad: Vec<u8>,
        max_payload: usize,
    ) -> Self {
        PacketReader {
            length: FsChaCha20::new(keys.length),
            aead: FsAead::new(suite, &keys.packet),
            aad: Some(first_aad),
            max_payload: max_payload.min(MAX_ENCODABLE),
            pending: None,
        }
    }

    pub(crate) fn set_max_payload(&mut self, max: usize) {
        self.max_payload = max.min(MAX_ENCODABLE);
    }

    /// The full frame length of the packet being received, once its length is known.
    pub(crate) fn pending_frame(&self) -> Option<usize> {
        self.pending.map(frame_len)
    }

    /// Opens the packet at the start of `buf` in place, if it is complete. Returns its frame length and header;
    /// the plaintext contents are `buf[CONTENTS_OFFSET..frame_len - TAG_LEN]`.
    pub(crate) fn open(&mut self, buf: &mut [u8]) -> Result<Option<(usize, u8)>, ChannelError> {
        let len = match self.pending {
            Some(len) => len,
            None => {
                if buf.len() < LENGTH_LEN {
                    return Ok(None);
                }
                let mut l = [buf[0], buf[1], buf[2]];
                self.length.crypt(&mut l);
                let len = u32::from_le_bytes([l[0], l[1], l[2], 0]) as usize;
                // Checked before any buffer is sized for the packet.
                if len > self.max_payload {
                    return Err(ChannelError::Oversized {
                        len,
                        max: self.max_payload,
                    });
                }
                self.pending = Some(len);
                len
            }
        };
        let total = frame_len(len);
        if buf.len() < total {
            return Ok(None);
        }
        let (body, tag) = buf[LENGTH_LEN..total].split_at_mut(1 + len);
        let tag: &[u8; TAG_LEN] = (&*tag).try_into().expect("split leaves exactly the tag");
        let aad = self.aad.take();
        self.aead
            .open(aad.as_deref().unwrap_or(&[]), body, tag)
            .map_err(|_| ChannelError::Tampered)?;
        self.pending = None;
        Ok(Some((total, body[0])))
    }
}

/// One packet delivered by an [`Opener`].
#[derive(Debug, PartialEq, Eq)]
pub enum Packet<'a> {
    /// Application contents, decrypted in place in the opener's buffer.
    Data(&'a mut [u8]),
    /// The peer's authenticated end of stream.
    Close,
}

/// A packet opened by [`Opener::next_ready`], named by position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ready {
    /// Contents at this range of the opener's buffer.
    Data(std::ops::Range<usize>),
    /// The peer's authenticated end of stream.
    Close,
}

/// The receiving half of a channel direction: a reusable buffer that bytes are read into and packets are opened
/// in, without allocation per packet.
pub struct Opener {
    reader: PacketReader,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    closed: bool,
}

impl Opener {
    /// An opener for packets sealed under `keys` with `suite` by a [`Sealer`] made with the same `first_aad`
    /// and `max_payload` (for protocols that run the key schedule themselves, and tests).
    pub fn with_keys(
        keys: &DirectionKeys,
        suite: Suite,
        first_aad: Vec<u8>,
        max_payload: usize,
    ) -> Self {
        Opener::new(PacketReader::new(keys, suite, first_aad, max_payload), &[])
    }

    pub(crate) fn new(reader: PacketReader, leftover: &[u8]) -> Self {
        // Start small; the buffer grows once, to one largest frame plus slack, when a large packet comes.
        // (Zeroing a 1 MiB buffer that small-packet sessions never use costs more than the whole key
        // agreement.)
        let mut buf = vec![0u8; INITIAL_BUFFER.max(leftover.len())];
        buf[..leftover.len()].copy_from_slice(leftover);
        Opener {
            reader,
            buf,
            start: 0,
            end: leftover.len(),
            closed: false,
        }
    }

    /// The most the buffer grows to: one largest frame plus slack, so large reads can also take the
    /// start of the next frame.
    fn capacity(&self) -> usize {
        frame_len(self.reader.max_payload) + (64 << 10)
    }

    /// The largest contents one packet may carry.
    pub fn max_payload(&self) -> usize {
        self.reader.max_payload
    }

    /// Changes the largest contents a packet may carry (capped at [`MAX_ENCODABLE`]), as the peer's
    /// [`Sealer::set_max_payload`] did; the buffer grows to match when a large packet comes.
    pub fn set_max_payload(&mut self, max: usize) {
        self.reader.set_max_payload(max);
    }

    /// Bytes a buffer handed to [`Opener::take`] should have, so the opener need not grow it.
    pub fn buffer_len(&self) -> usize {
        self.capacity()
    }

    /// Hands over the buffer that holds the packet [`Opener::next_ready`] named last (its
    /// [`Ready::Data`] range indexes the buffer returned) and goes on in `replacement`, into which any
    /// bytes read after that packet are moved (at most the rest of one read). A caller that owns the
    /// packet's buffer passes its contents on without copying them; a replacement of
    /// [`Opener::buffer_len`] bytes (a recycled one: a fresh buffer is zeroed at the cost of a copy)
    /// keeps the opener from allocating.
    pub fn take(&mut self, mut replacement: Vec<u8>) -> Vec<u8> {
        let rest = self.end - self.start;
        if replacement.len() < rest.max(INITIAL_BUFFER) {
            replacement.resize(rest.max(INITIAL_BUFFER), 0);
        }
        replacement[..rest].copy_from_slice(&self.buf[self.start..self.end]);
        self.start = 0;
        self.end = rest;
        std::mem::replace(&mut self.buf, replacement)
    }

    /// True once the authenticated end of stream arrived.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Free space to read transport bytes into; call only after [`Opener::next`] returned `Ok(None)`.
    ///
    /// While a large packet is incomplete, the space offered ends where that packet ends, so reads stop at
    /// packet boundaries and the buffer never has to move large partial packets.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        let want = |s: &Self| match s.reader.pending_frame() {
            Some(frame) => s.start + frame,
            None => s.buf.len(),
        };
        let cap = self.capacity();
        if (want(self) > self.buf.len() || self.end == self.buf.len()) && self.buf.len() < cap {
            self.buf.resize(cap, 0);
        }
        if want(self) > self.buf.len() || self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let limit = want(self).min(self.buf.len()).max(self.end);
        &mut self.buf[self.end..limit]
    }

    /// Grows the buffer to its full size if fewer than `n` bytes are free, so the next [`Opener::spare`]
    /// can offer a whole large frame (for callers that seal straight into it, like the benchmark).
    pub fn reserve(&mut self, n: usize) {
        if self.buf.len() - self.end < n && self.buf.len() < self.capacity() {
            let cap = self.capacity();
            self.buf.resize(cap, 0);
        }
    }

    /// Records that `n` bytes were read into [`Opener::spare`].
    pub fn commit(&mut self, n: usize) {
        self.end += n;
        debug_assert!(self.end <= self.buf.len());
    }

    /// Copies bytes in (the sans-IO entry point); returns how many fit. Call [`Opener::next`] until it returns
    /// `Ok(None)` before feeding more.
    pub fn feed(&mut self, data: &[u8]) -> usize {
        self.reserve(data.len());
        let spare = self.spare();
        let n = spare.len().min(data.len());
        spare[..n].copy_from_slice(&data[..n]);
        self.commit(n);
        n
    }

    /// Opens the next complete packet, skipping decoys. `Ok(None)` means more bytes are needed.
    #[allow(clippy::should_implement_trait)] // Fallible and borrowing: not an Iterator.
    pub fn next(&mut self) -> Result<Option<Packet<'_>>, ChannelError> {
        Ok(match self.next_ready()? {
            None => None,
            Some(Ready::Close) => Some(Packet::Close),
            Some(Ready::Data(range)) => Some(Packet::Data(&mut self.buf[range])),
        })
    }

    /// Like [`Opener::next`], but names the contents by their place in the buffer instead of borrowing it, so
    /// that a caller can read more bytes in a loop and borrow only at the end (see [`Opener::contents`]).
    pub fn next_ready(&mut self) -> Result<Option<Ready>, ChannelError> {
        loop {
            if self.start == self.end {
                return Ok(None);
            }
            if self.closed {
                // Nothing may follow the end of stream.
                return Err(ChannelError::Tampered);
            }
            let Some((total, header)) = self.reader.open(&mut self.buf[self.start..self.end])?
            else {
                return Ok(None);
            };
            let s = self.start;
            self.start += total;
            if header & HEADER_DECOY != 0 {
                continue;
            }
            if header & HEADER_CLOSE != 0 {
                self.closed = true;
                if total != FRAME_OVERHEAD {
                    return Err(ChannelError::Tampered);
                }
                return Ok(Some(Ready::Close));
            }
            return Ok(Some(Ready::Data(s + CONTENTS_OFFSET..s + total - TAG_LEN)));
        }
    }

    /// The contents named by [`Ready::Data`]; valid until the next call that takes `&mut self`.
    pub fn contents(&mut self, range: std::ops::Range<usize>) -> &mut [u8] {
        &mut self.buf[range]
    }

    /// Called when the transport reached end of file: fine after an authenticated close, truncation otherwise.
    pub fn check_eof(&self) -> Result<(), ChannelError> {
        if self.closed && self.start == self.end {
            Ok(())
        } else {
            Err(ChannelError::Truncated)
        }
    }
}
