//! A thin async adapter over tokio's `AsyncRead + AsyncWrite`.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::ChannelError;
use crate::handshake::{Established, Handshake};
use crate::packet::{Opener, Ready, Sealer, HEADER_CLOSE};

/// Runs a handshake to completion over an async stream.
pub async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    mut hs: Handshake,
) -> Result<Established, ChannelError> {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        if hs.has_output() {
            stream.write_all(&hs.take_output()).await?;
            stream.flush().await?;
        }
        if hs.is_done() {
            return hs.finish();
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(hs.eof_error());
        }
        if let Err(e) = hs.feed(&buf[..n]) {
            let _ = stream.write_all(&hs.take_output()).await;
            return Err(e);
        }
    }
}

/// Sends packets over an async stream; small packets are coalesced until [`AsyncSecureWriter::flush`].
pub struct AsyncSecureWriter<W> {
    inner: W,
    sealer: Sealer,
    pending: Vec<u8>,
}

impl<W: AsyncWrite + Unpin> AsyncSecureWriter<W> {
    /// A writer sealing with `sealer`.
    pub fn new(inner: W, sealer: Sealer) -> Self {
        AsyncSecureWriter {
            inner,
            sealer,
            pending: Vec::with_capacity(64 << 10),
        }
    }

    /// Queues one packet; it is written at the next flush, or once 256 KiB are waiting.
    pub async fn send(&mut self, payload: &[u8]) -> Result<(), ChannelError> {
        self.sealer.seal_into(&mut self.pending, 0, payload)?;
        if self.pending.len() >= 256 << 10 {
            self.flush().await?;
        }
        Ok(())
    }

    /// Writes every queued packet.
    pub async fn flush(&mut self) -> Result<(), ChannelError> {
        if !self.pending.is_empty() {
            self.inner.write_all(&self.pending).await?;
            self.pending.clear();
        }
        self.inner.flush().await?;
        Ok(())
    }

    /// Sends the authenticated end of stream, flushes and shuts the write side down.
    pub async fn close(mut self) -> Result<W, ChannelError> {
        self.sealer
            .seal_into(&mut self.pending, HEADER_CLOSE, &[])?;
        self.flush().await?;
        self.inner.shutdown().await?;
        Ok(self.inner)
    }
}

/// Receives packets from an async stream.
pub struct AsyncSecureReader<R> {
    inner: R,
    opener: Opener,
}

impl<R: AsyncRead + Unpin> AsyncSecureReader<R> {
    /// A reader opening with `opener`.
    pub fn new(inner: R, opener: Opener) -> Self {
        AsyncSecureReader { inner, opener }
    }

    /// The next packet's contents, or `None` after the authenticated end of stream.
    pub async fn recv(&mut self) -> Result<Option<&mut [u8]>, ChannelError> {
        if self.opener.is_closed() {
            return Ok(None);
        }
        loop {
            match self.opener.next_ready()? {
                Some(Ready::Data(range)) => return Ok(Some(self.opener.contents(range))),
                Some(Ready::Close) => return Ok(None),
                None => {}
            }
            let n = self.inner.read(self.opener.spare()).await?;
            if n == 0 {
                self.opener.check_eof()?;
                return Ok(None);
            }
            self.opener.commit(n);
        }
    }
}

/// Splits an established channel over any async stream into halves.
pub fn split<S: AsyncRead + AsyncWrite>(
    stream: S,
    established: Established,
) -> (
    AsyncSecureReader<tokio::io::ReadHalf<S>>,
    AsyncSecureWriter<tokio::io::WriteHalf<S>>,
) {
    let (r, w) = tokio::io::split(stream);
    (
        AsyncSecureReader::new(r, established.opener),
        AsyncSecureWriter::new(w, established.sealer),
    )
}
