//! A thin blocking adapter over `std::io` streams (for example `std::net::TcpStream`).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use crate::error::ChannelError;
use crate::handshake::{Established, Handshake};
use crate::packet::{
    frame_len, Opener, Ready, Sealer, CONTENTS_OFFSET, HEADER_CLOSE, HEADER_DECOY,
};
use crate::sizing::PacketSizing;

/// Small packets are coalesced until this many bytes are waiting, then written at once.
const COALESCE_LIMIT: usize = 256 << 10;
/// Packets at least this large skip the coalescing buffer and are sealed in the frame buffer.
const DIRECT_THRESHOLD: usize = 64 << 10;

/// Runs a handshake to completion over a blocking stream. Bytes of application data that arrive with the end
/// of the handshake are kept in the returned opener.
pub fn handshake<S: Read + Write>(
    stream: &mut S,
    mut hs: Handshake,
) -> Result<Established, ChannelError> {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        if hs.has_output() {
            stream.write_all(&hs.take_output())?;
            stream.flush()?;
        }
        if hs.is_done() {
            return hs.finish();
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(hs.eof_error());
        }
        if let Err(e) = hs.feed(&buf[..n]) {
            // Let the peer see our last messages (a key confirmation, say) so it fails with the same cause.
            let _ = stream.write_all(&hs.take_output());
            return Err(e);
        }
    }
}

/// Runs a handshake over a TCP stream that must finish by `deadline`, whatever the peer does: every read and
/// write gets only the time that is left, so a peer that trickles a byte at a time cannot stretch it. Read and
/// write timeouts are cleared again on success.
pub fn handshake_until(
    stream: &mut TcpStream,
    hs: Handshake,
    deadline: Instant,
) -> Result<Established, ChannelError> {
    let est = handshake(&mut Deadline { stream, deadline }, hs)?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok(est)
}

/// A TCP stream whose reads and writes give up at a fixed instant.
struct Deadline<'a> {
    stream: &'a mut TcpStream,
    deadline: Instant,
}

impl Deadline<'_> {
    fn left(&self) -> io::Result<std::time::Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the handshake took too long",
            ));
        }
        Ok(left)
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        self.stream.read(buf).map_err(timed_out)
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        self.stream.write(buf).map_err(timed_out)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// A socket timeout reads as `WouldBlock` on Linux; name it for what it is.
fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::TimedOut, "the handshake took too long")
    } else {
        e
    }
}

/// Splits an established channel over a TCP stream into a reader and a writer usable from two threads.
pub fn split_tcp(
    stream: TcpStream,
    established: Established,
) -> Result<(SecureReader<TcpStream>, SecureWriter<TcpStream>), ChannelError> {
    let reader = stream.try_clone()?;
    Ok((
        SecureReader::new(reader, established.opener),
        SecureWriter::new(stream, established.sealer),
    ))
}

/// Sends packets over a blocking stream: small ones coalesced into one write, large ones sealed in place.
pub struct SecureWriter<W: Write> {
    inner: W,
    sealer: Sealer,
    pending: Vec<u8>,
    frame: Vec<u8>,
    sizing: PacketSizing,
}

impl<W: Write> SecureWriter<W> {
    /// A writer sealing with `sealer`.
    pub fn new(inner: W, sealer: Sealer) -> Self {
        let frame = vec![0u8; frame_len(sealer.max_payload())];
        let sizing = PacketSizing::new(sealer.max_payload());
        SecureWriter {
            inner,
            sealer,
            pending: Vec::with_capacity(COALESCE_LIMIT + (64 << 10)),
            frame,
            sizing,
        }
    }

    /// The largest contents one packet may carry.
    pub fn max_payload(&self) -> usize {
        self.sealer.max_payload()
    }

    /// Changes the largest contents a packet may carry, for a protocol on top that agreed on another size
    /// with its peer (whose reader must accept it: [`SecureReader::set_max_payload`]).
    pub fn set_max_payload(&mut self, max: usize) {
        self.sealer.set_max_payload(max);
        self.sizing.set_max(self.sealer.max_payload());
        let frame = frame_len(self.sealer.max_payload());
        if self.frame.len() < frame {
            self.frame.resize(frame, 0);
        }
    }

    /// How large the next packet should be for its bytes to be opened early: small at the start of the
    /// stream and after a pause, growing to [`Self::max_payload`] (see [`PacketSizing`]). Advice for
    /// senders of bulk data; any size up to the maximum is still accepted.
    pub fn packet_limit(&self) -> usize {
        self.sizing.limit(Instant::now())
    }

    /// Sends one packet. Small packets wait in a buffer until [`SecureWriter::flush`] or until enough gathered.
    pub fn send(&mut self, payload: &[u8]) -> Result<(), ChannelError> {
        if payload.len() >= DIRECT_THRESHOLD {
            let len = payload.len();
            self.payload_buf(len)?.copy_from_slice(payload);
            return self.send_payload_buf(len);
        }
        self.sealer.seal_into(&mut self.pending, 0, payload)?;
        if self.pending.len() >= COALESCE_LIMIT {
            self.write_pending()?;
        }
        Ok(())
    }

    /// Sends one small packet built in place by `build`, which gets `max` bytes of room and returns the
    /// length it wrote: the packet joins the others waiting for one write, without the copy [`Self::send`]
    /// makes. Nothing is sent when `build` fails.
    pub fn send_built<E>(
        &mut self,
        max: usize,
        build: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<Result<(), E>, ChannelError> {
        let limit = self.sealer.max_payload();
        if max > limit {
            return Err(ChannelError::Oversized {
                len: max,
                max: limit,
            });
        }
        let start = self.pending.len();
        self.pending.resize(start + frame_len(max), 0);
        let len = match build(&mut self.pending[start + CONTENTS_OFFSET..][..max]) {
            Ok(len) => len.min(max),
            Err(e) => {
                self.pending.truncate(start);
                return Ok(Err(e));
            }
        };
        self.pending.truncate(start + frame_len(len));
        if let Err(e) = self.sealer.seal_frame(&mut self.pending[start..], 0) {
            self.pending.truncate(start);
            return Err(e);
        }
        if self.pending.len() >= COALESCE_LIMIT {
            self.write_pending()?;
        }
        Ok(Ok(()))
    }

    /// Sends a decoy packet of `len` random-looking bytes, which the peer drops.
    pub fn send_decoy(&mut self, len: usize) -> Result<(), ChannelError> {
        let zeros = vec![0u8; len];
        self.sealer
            .seal_into(&mut self.pending, HEADER_DECOY, &zeros)
    }

    /// A writable area of `len` bytes inside the frame buffer, for zero-copy large packets.
    pub fn payload_buf(&mut self, len: usize) -> Result<&mut [u8], ChannelError> {
        let max = self.sealer.max_payload();
        if len > max {
            return Err(ChannelError::Oversized { len, max });
        }
        Ok(&mut self.frame[CONTENTS_OFFSET..CONTENTS_OFFSET + len])
    }

    /// Seals the first `len` bytes of [`SecureWriter::payload_buf`] in place and writes them as one packet,
    /// after anything still waiting.
    pub fn send_payload_buf(&mut self, len: usize) -> Result<(), ChannelError> {
        self.write_pending()?;
        let frame = &mut self.frame[..frame_len(len)];
        self.sealer.seal_frame(frame, 0)?;
        self.inner.write_all(frame)?;
        self.sizing.wrote(frame.len(), Instant::now());
        Ok(())
    }

    fn write_pending(&mut self) -> Result<(), ChannelError> {
        if !self.pending.is_empty() {
            self.inner.write_all(&self.pending)?;
            self.sizing.wrote(self.pending.len(), Instant::now());
            self.pending.clear();
        }
        Ok(())
    }

    /// Writes every waiting packet.
    pub fn flush(&mut self) -> Result<(), ChannelError> {
        self.write_pending()?;
        self.inner.flush()?;
        Ok(())
    }

    /// Sends the authenticated end of stream and flushes; returns the stream.
    pub fn close(mut self) -> Result<W, ChannelError> {
        self.sealer
            .seal_into(&mut self.pending, HEADER_CLOSE, &[])?;
        self.flush()?;
        Ok(self.inner)
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The same writer (keys, counters, anything not yet written) over `f(stream)`: a wrapper of the
    /// stream that writes what it is given.
    pub fn map_inner<V: Write>(self, f: impl FnOnce(W) -> V) -> SecureWriter<V> {
        SecureWriter {
            inner: f(self.inner),
            sealer: self.sealer,
            pending: self.pending,
            frame: self.frame,
            sizing: self.sizing,
        }
    }
}

/// Receives packets from a blocking stream, opening them in place in a reusable buffer.
pub struct SecureReader<R: Read> {
    inner: R,
    opener: Opener,
}

impl<R: Read> SecureReader<R> {
    /// A reader opening with `opener` (which may already hold bytes that arrived with the handshake).
    pub fn new(inner: R, opener: Opener) -> Self {
        SecureReader { inner, opener }
    }

    /// The next packet's contents, or `None` after the peer's authenticated end of stream. A stream that ends
    /// without it is [`ChannelError::Truncated`].
    pub fn recv(&mut self) -> Result<Option<&mut [u8]>, ChannelError> {
        // No packet's contents reach usize::MAX bytes: every one comes borrowed.
        match self.recv_taking(usize::MAX, |_| Vec::new())? {
            Some(Received::Borrowed(contents)) => Ok(Some(contents)),
            Some(Received::Taken { .. }) => {
                unreachable!("nothing is taken from usize::MAX bytes on")
            }
            None => Ok(None),
        }
    }

    /// Like [`SecureReader::recv`], but a packet with at least `take_from` bytes of contents comes as the
    /// buffer it was opened in ([`Received::Taken`]); the reader goes on in the buffer `spare` gives
    /// ([`Opener::take`]).
    pub fn recv_taking(
        &mut self,
        take_from: usize,
        spare: impl FnOnce(usize) -> Vec<u8>,
    ) -> Result<Option<Received<'_>>, ChannelError> {
        if self.opener.is_closed() {
            return Ok(None);
        }
        loop {
            match self.opener.next_ready()? {
                Some(Ready::Data(range)) if range.len() >= take_from => {
                    let replacement = spare(self.opener.buffer_len());
                    let buf = self.opener.take(replacement);
                    return Ok(Some(Received::Taken {
                        buf,
                        contents: range,
                    }));
                }
                Some(Ready::Data(range)) => {
                    return Ok(Some(Received::Borrowed(self.opener.contents(range))))
                }
                Some(Ready::Close) => return Ok(None),
                None => {}
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }

    /// Reads more bytes into the opener; false at the end of a stream that ended cleanly.
    fn fill(&mut self) -> Result<bool, ChannelError> {
        let n = loop {
            match self.inner.read(self.opener.spare()) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        if n == 0 {
            self.opener.check_eof()?;
            return Ok(false);
        }
        self.opener.commit(n);
        Ok(true)
    }

    /// Changes the largest contents a packet may carry, as the peer's writer did
    /// ([`SecureWriter::set_max_payload`]).
    pub fn set_max_payload(&mut self, max: usize) {
        self.opener.set_max_payload(max);
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }
}

/// A packet from [`SecureReader::recv_taking`].
#[derive(Debug)]
pub enum Received<'a> {
    /// Contents in the reader's buffer, valid until the next receive.
    Borrowed(&'a mut [u8]),
    /// The buffer the packet was opened in, handed over, and where its contents are in it.
    Taken {
        /// The buffer.
        buf: Vec<u8>,
        /// The contents' range in `buf`.
        contents: std::ops::Range<usize>,
    },
}
