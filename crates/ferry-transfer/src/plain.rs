//! Packets over any `Read`/`Write` with a 4-byte little-endian length prefix and no encryption.
//!
//! Used by this crate's tests and by the benchmark's plaintext run of the same pipeline. Small
//! packets are coalesced into one buffer and written together; a big packet is built in place
//! after them ([`PacketSink::payload_buf`]) and written with them in one `write_all`. A clean end
//! of stream is EOF at a packet boundary (unauthenticated here, unlike the secure channel).

use crate::{PacketSink, PacketSource, MAX_PACKET};
use std::io::{self, Read, Write};

/// Queued small packets are written once they reach this many bytes.
const QUEUE_LIMIT: usize = 64 * 1024;

/// Writes length-prefixed packets to `W`.
pub struct PlainSink<W: Write> {
    inner: W,
    buf: Box<[u8]>,
    queued: usize,
    max_packet: usize,
}

impl<W: Write> PlainSink<W> {
    /// A sink for packets of up to [`MAX_PACKET`] bytes.
    pub fn new(inner: W) -> Self {
        Self::with_max_packet(inner, MAX_PACKET)
    }

    /// A sink for packets of up to `max_packet` bytes.
    pub fn with_max_packet(inner: W, max_packet: usize) -> Self {
        PlainSink {
            inner,
            buf: vec![0; QUEUE_LIMIT + 4 + max_packet].into_boxed_slice(),
            queued: 0,
            max_packet,
        }
    }

    /// The underlying writer.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    fn write_queued(&mut self) -> io::Result<()> {
        if self.queued > 0 {
            self.inner.write_all(&self.buf[..self.queued])?;
            self.queued = 0;
        }
        Ok(())
    }
}

fn too_big(len: usize, max: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("packet of {len} bytes over the limit of {max}"),
    )
}

impl<W: Write> PacketSink for PlainSink<W> {
    fn send(&mut self, payload: &[u8]) -> io::Result<()> {
        if payload.len() > self.max_packet {
            return Err(too_big(payload.len(), self.max_packet));
        }
        if self.queued + 4 + payload.len() > QUEUE_LIMIT {
            self.write_queued()?;
        }
        if 4 + payload.len() > QUEUE_LIMIT {
            self.inner
                .write_all(&(payload.len() as u32).to_le_bytes())?;
            return self.inner.write_all(payload);
        }
        let q = self.queued;
        self.buf[q..q + 4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        self.buf[q + 4..q + 4 + payload.len()].copy_from_slice(payload);
        self.queued += 4 + payload.len();
        Ok(())
    }

    fn payload_buf(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.max_packet, "payload_buf over the packet limit");
        let start = self.queued + 4;
        &mut self.buf[start..start + len]
    }

    fn send_payload_buf(&mut self, len: usize) -> io::Result<()> {
        if len > self.max_packet {
            return Err(too_big(len, self.max_packet));
        }
        let q = self.queued;
        self.buf[q..q + 4].copy_from_slice(&(len as u32).to_le_bytes());
        self.inner.write_all(&self.buf[..q + 4 + len])?;
        self.queued = 0;
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.write_queued()?;
        self.inner.flush()
    }
}

/// Reads length-prefixed packets from `R`.
pub struct PlainSource<R: Read> {
    inner: R,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    max_packet: usize,
}

impl<R: Read> PlainSource<R> {
    /// A source for packets of up to [`MAX_PACKET`] bytes.
    pub fn new(inner: R) -> Self {
        Self::with_max_packet(inner, MAX_PACKET)
    }

    /// A source for packets of up to `max_packet` bytes.
    pub fn with_max_packet(inner: R, max_packet: usize) -> Self {
        PlainSource {
            inner,
            buf: vec![0; 4 + max_packet + QUEUE_LIMIT].into_boxed_slice(),
            start: 0,
            end: 0,
            max_packet,
        }
    }

    /// Makes sure `n` bytes are buffered from `start`; `Ok(false)` on EOF before any of them.
    fn fill(&mut self, n: usize) -> io::Result<bool> {
        if self.end - self.start >= n {
            return Ok(true);
        }
        if self.start + n > self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.end - self.start < n {
            let got = self.inner.read(&mut self.buf[self.end..])?;
            if got == 0 {
                if self.end == self.start {
                    return Ok(false);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "stream cut inside a packet",
                ));
            }
            self.end += got;
        }
        Ok(true)
    }
}

impl<R: Read> PacketSource for PlainSource<R> {
    fn recv(&mut self) -> io::Result<Option<&mut [u8]>> {
        if !self.fill(4)? {
            return Ok(None);
        }
        let len_bytes: [u8; 4] = self.buf[self.start..self.start + 4]
            .try_into()
            .expect("4 bytes");
        let len = u32::from_le_bytes(len_bytes) as usize;
        if len > self.max_packet {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                too_big(len, self.max_packet),
            ));
        }
        if !self.fill(4 + len)? {
            unreachable!("header already buffered");
        }
        let at = self.start + 4;
        self.start = at + len;
        Ok(Some(&mut self.buf[at..at + len]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_round_trip() {
        let mut sink = PlainSink::with_max_packet(Vec::new(), 100_000);
        sink.send(b"one").unwrap();
        sink.send(b"").unwrap();
        let big = sink.payload_buf(100_000);
        big.fill(7);
        sink.send_payload_buf(99_999).unwrap();
        sink.send(&[9; 70_000]).unwrap();
        sink.flush().unwrap();
        assert!(sink.send(&[0; 100_001]).is_err());
        let bytes = sink.get_mut().clone();
        let mut source = PlainSource::with_max_packet(&bytes[..], 100_000);
        assert_eq!(source.recv().unwrap().unwrap(), b"one");
        assert_eq!(source.recv().unwrap().unwrap(), b"");
        assert_eq!(source.recv().unwrap().unwrap(), &[7; 99_999][..]);
        assert_eq!(source.recv().unwrap().unwrap(), &[9; 70_000][..]);
        assert!(source.recv().unwrap().is_none());
        let mut cut = PlainSource::new(&bytes[..bytes.len() - 1]);
        for _ in 0..3 {
            cut.recv().unwrap();
        }
        assert_eq!(cut.recv().unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
