//! The primitives every ferry wire format is written with: a bounded little-endian [`Reader`] over one
//! message, and [`Put`] for building one (into a `Vec` or, with [`Cursor`], in place in a packet buffer).
//!
//! Each protocol keeps its messages, their types and their checks in one module of its own (the transfer
//! protocol in `ferry_transfer::wire`, the share protocol in `ferry_share::wire`); this crate only makes sure
//! no decoder reads past a message or leaves bytes unread.
//!
//! ```
//! use ferry_wire::{Put, Reader};
//!
//! let mut msg = Vec::new();
//! msg.put_u8(7);
//! msg.put_u32(1_000);
//! msg.put_bytes16(b"name");
//! let mut r = Reader::new(&msg);
//! assert_eq!(r.u8().unwrap(), 7);
//! assert_eq!(r.u32().unwrap(), 1_000);
//! assert_eq!(r.bytes16(255).unwrap(), b"name");
//! r.finish().unwrap();
//! ```
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod code;

pub use code::ErrorCode;

/// A message that does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The message ends before a field does.
    #[error("truncated message")]
    Truncated,
    /// Bytes are left after the last field.
    #[error("trailing bytes in message")]
    Trailing,
    /// A length field is over its bound.
    #[error("{0} longer than allowed")]
    TooLong(&'static str),
    /// A field has a value the protocol does not allow.
    #[error("invalid {0}")]
    Invalid(&'static str),
}

/// `text` cut to at most `max` bytes, at a character boundary (a bounded message field of UTF-8).
pub fn truncate_text(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A bounded reader over one message: every read checks the remaining length first.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads from `buf`.
    #[inline]
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// Bytes left.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Whether all bytes were consumed.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Takes `n` bytes, or fails if fewer are left.
    #[inline]
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.buf.len() {
            return Err(WireError::Truncated);
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    /// Takes everything that is left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    /// Takes a fixed-size array.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        Ok(self.bytes(N)?.try_into().expect("length checked"))
    }

    /// Takes a `u8`.
    #[inline]
    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    /// Takes a little-endian `u16`.
    #[inline]
    pub fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// Takes a little-endian `u32`.
    #[inline]
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// Takes a little-endian `u64`.
    #[inline]
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Takes a little-endian `i64`.
    #[inline]
    pub fn i64(&mut self) -> Result<i64, WireError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// Takes a `u16` length and that many bytes, refusing a length over `max` before reading them.
    pub fn bytes16(&mut self, max: usize) -> Result<&'a [u8], WireError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(WireError::TooLong("field"));
        }
        self.bytes(n)
    }

    /// Takes a `u32` count, refusing one over `max`, or one that could not fit in the bytes left when each
    /// item takes at least `min_item` bytes (so a hostile count never sizes an allocation).
    pub fn count(&mut self, max: u32, min_item: usize) -> Result<usize, WireError> {
        let n = self.u32()?;
        if n > max {
            return Err(WireError::TooLong("list"));
        }
        let n = n as usize;
        if n.saturating_mul(min_item.max(1)) > self.buf.len() {
            return Err(WireError::Truncated);
        }
        Ok(n)
    }

    /// Fails unless every byte was consumed.
    #[inline]
    pub fn finish(&self) -> Result<(), WireError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(WireError::Trailing)
        }
    }
}

/// Appends little-endian integers and bytes to a message.
pub trait Put {
    /// Appends bytes.
    fn put(&mut self, bytes: &[u8]);
    /// Appends a `u8`.
    fn put_u8(&mut self, v: u8) {
        self.put(&[v]);
    }
    /// Appends a little-endian `u16`.
    fn put_u16(&mut self, v: u16) {
        self.put(&v.to_le_bytes());
    }
    /// Appends a little-endian `u32`.
    fn put_u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }
    /// Appends a little-endian `u64`.
    fn put_u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }
    /// Appends a little-endian `i64`.
    fn put_i64(&mut self, v: i64) {
        self.put(&v.to_le_bytes());
    }
    /// Appends a `u16` length and the bytes; the caller keeps `bytes` within the bound its decoder checks.
    fn put_bytes16(&mut self, bytes: &[u8]) {
        debug_assert!(bytes.len() <= u16::MAX as usize);
        self.put_u16(bytes.len() as u16);
        self.put(bytes);
    }
}

impl Put for Vec<u8> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// A writer into a fixed buffer (a packet built in place); callers check [`Cursor::room`] first.
pub struct Cursor<'a> {
    /// The buffer.
    pub buf: &'a mut [u8],
    /// Bytes written so far.
    pub pos: usize,
}

impl Cursor<'_> {
    /// Bytes still free.
    pub fn room(&self) -> usize {
        self.buf.len() - self.pos
    }
}

impl Put for Cursor<'_> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.pos..self.pos + bytes.len()].copy_from_slice(bytes);
        self.pos += bytes.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_bounded() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u16().unwrap(), 0x0201);
        assert_eq!(r.u32(), Err(WireError::Truncated));
        assert_eq!(r.u8().unwrap(), 3);
        assert!(r.finish().is_ok());
        assert_eq!(Reader::new(&[0]).finish(), Err(WireError::Trailing));
    }

    #[test]
    fn lengths_and_counts_are_checked_before_use() {
        let mut msg = Vec::new();
        msg.put_bytes16(&[7; 300]);
        assert_eq!(
            Reader::new(&msg).bytes16(255),
            Err(WireError::TooLong("field"))
        );
        assert_eq!(Reader::new(&msg).bytes16(300).unwrap().len(), 300);
        // A count of a billion items in a 10-byte message is refused without allocating anything.
        let mut msg = Vec::new();
        msg.put_u32(1_000_000_000);
        msg.put(&[0; 6]);
        assert_eq!(
            Reader::new(&msg).count(u32::MAX, 1),
            Err(WireError::Truncated)
        );
        assert_eq!(
            Reader::new(&msg).count(1000, 1),
            Err(WireError::TooLong("list"))
        );
    }

    #[test]
    fn the_cursor_writes_in_place() {
        let mut buf = [0u8; 8];
        let mut c = Cursor {
            buf: &mut buf,
            pos: 0,
        };
        c.put_u32(0xdead_beef);
        assert_eq!(c.room(), 4);
        assert_eq!(&buf[..4], &0xdead_beefu32.to_le_bytes());
    }

    #[test]
    fn text_is_cut_on_a_character_boundary() {
        assert_eq!(truncate_text("abc", 2), "ab");
        assert_eq!(truncate_text("é", 1), "");
        assert_eq!(truncate_text("aé", 2), "a");
        assert_eq!(truncate_text("a", 5), "a");
    }
}
