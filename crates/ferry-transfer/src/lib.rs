//! ferry's transfer protocol, independent of the encryption (its file-system layer is `ferry_tree`).
//!
//! The sender walks its `PATH` arguments into a [`Manifest`], offers it, and streams the file data
//! with no round trip per file; the receiver validates every name, checks for conflicts, accepts
//! (telling the sender what it already holds from an earlier, cut transfer), writes each file under
//! a hidden temporary name, verifies its BLAKE3 hash, and only then gives it its final name.
//!
//! Both sides talk through two small traits, [`PacketSink`] and [`PacketSource`]: the encrypted
//! channel implements them in [`secure`], and [`plain`] implements them over any `Read`/`Write` with a
//! 4-byte length prefix (for tests and for the plaintext benchmark).
//!
//! ```no_run
//! use ferry_transfer::{plain, receive, send, walk, ReceiveOptions, SendOptions};
//! use std::net::{TcpListener, TcpStream};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let listener = TcpListener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! let sender = std::thread::spawn(move || -> Result<(), ferry_transfer::TransferError> {
//!     let (conn, _) = listener.accept()?;
//!     let walked = walk(&["some/dir"])?;
//!     let mut sink = plain::PlainSink::new(conn.try_clone()?);
//!     let mut source = plain::PlainSource::new(conn);
//!     send(&mut sink, &mut source, &walked.manifest, &SendOptions::default(), &mut ())?;
//!     Ok(())
//! });
//! let conn = TcpStream::connect(addr)?;
//! let mut sink = plain::PlainSink::new(conn.try_clone()?);
//! let mut source = plain::PlainSource::new(conn);
//! let opts = ReceiveOptions::new("out");
//! receive(&mut source, &mut sink, &opts, &mut |_offer| true, &mut ())?;
//! sender.join().unwrap()?;
//! # Ok(())
//! # }
//! ```
//!
//! # Integrity and resume
//!
//! Files are hashed as a BLAKE3 tree whose 1 MiB subtrees ([`CHUNK`]) are the chunk hashes: the
//! chunk hashes (BLAKE3 chaining values) travel with the data, and the whole-file hash is the
//! standard `blake3::hash` of the file, merged from them, so every byte is hashed exactly once on
//! each side. Partial data stays under the temporary name in the destination directory; the chunk
//! hashes the receiver verified are logged in `$XDG_CACHE_HOME/ferry/partial/<offer-id-hex>/state`
//! (see [`resume`]), so the same send/receive run again transfers only what is missing.

#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod dest;
mod error;
pub mod lanes;
pub mod manifest;
pub mod plain;
mod progress;
mod receive;
pub mod resume;
pub mod secure;
mod send;
mod walk;
pub mod wire;
mod writer;

pub use error::TransferError;
pub use manifest::{Entry, EntryKind, Manifest, Totals};
pub use progress::{Progress, ProgressState};
#[doc(hidden)]
pub use receive::read_offer;
pub use receive::{
    receive, Offer, Output, ReceiveOptions, ReceiveReport, DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_MANIFEST, OFFER_NAMES,
};
pub use send::{send, send_from, OpenSource, SendOptions, SendReport};
pub use walk::{walk, Walk, WalkWarning, MAX_HELD, MAX_HELD_TOTAL};

/// Largest packet, in bytes, that the engine sends by default (1 MiB).
pub const MAX_PACKET: usize = 1 << 20;

pub use ferry_tree::hash::CHUNK;

/// Sends packets (each packet = one message of up to [`MAX_PACKET`] bytes by default) over some channel.
pub trait PacketSink {
    /// Queue a small packet (may be coalesced with others into one write).
    fn send(&mut self, payload: &[u8]) -> std::io::Result<()>;
    /// A writable area of exactly `len` bytes inside the sink's own frame buffer, for zero-copy big
    /// packets (the engine reads file data straight into it).
    fn payload_buf(&mut self, len: usize) -> &mut [u8];
    /// Send the first `len` bytes of `payload_buf` as one packet (flushes anything queued first).
    fn send_payload_buf(&mut self, len: usize) -> std::io::Result<()>;
    /// Write out everything queued.
    fn flush(&mut self) -> std::io::Result<()>;
    /// How large the next data packet should be, at most `max`: a sink whose bytes can be opened only
    /// packet by packet (the channel) asks for small packets at the start of a stream, while TCP's
    /// window is small, so that the first bytes arrive early (see `ferry_channel::sizing`).
    fn packet_limit(&self, max: usize) -> usize {
        max
    }
}

/// Receives packets from some channel.
pub trait PacketSource {
    /// Next packet; `Ok(None)` at a clean, authenticated end of stream. An unexpected EOF is an error.
    fn recv(&mut self) -> std::io::Result<Option<&mut [u8]>>;
}

impl<T: PacketSink + ?Sized> PacketSink for &mut T {
    fn send(&mut self, payload: &[u8]) -> std::io::Result<()> {
        (**self).send(payload)
    }
    fn payload_buf(&mut self, len: usize) -> &mut [u8] {
        (**self).payload_buf(len)
    }
    fn send_payload_buf(&mut self, len: usize) -> std::io::Result<()> {
        (**self).send_payload_buf(len)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        (**self).flush()
    }
    fn packet_limit(&self, max: usize) -> usize {
        (**self).packet_limit(max)
    }
}

impl<T: PacketSource + ?Sized> PacketSource for &mut T {
    fn recv(&mut self) -> std::io::Result<Option<&mut [u8]>> {
        (**self).recv()
    }
}
