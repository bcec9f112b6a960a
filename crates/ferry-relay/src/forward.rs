//! Moving bytes between the two sides of a paired session.
//!
//! Each direction is a small loop on tokio readiness: the sockets are non-blocking, so an idle
//! session costs no thread, only two registered sockets (and two pipes when splicing).
//!
//! The splice path moves data socket → pipe → socket inside the kernel (`splice(2)`), never
//! touching user memory. Readiness subtlety: a non-blocking splice into a pipe returns `EAGAIN`
//! both when the socket is empty and when the pipe is full, so `EAGAIN` only clears the socket's
//! read readiness when the pipe was empty (then the socket must be the cause). Otherwise the
//! loop drains the pipe and tries again, which avoids both a lost wake-up and a busy loop.
//!
//! Memory per session is fixed: two pipes of `buffer_size` (kernel pages), or two copy buffers
//! of `buffer_size` (heap) for the fallback. Nothing grows with traffic.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// How a paired session's bytes are moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Forwarding {
    /// `splice(2)` through a pipe per direction (zero-copy); falls back to [`Forwarding::Copy`]
    /// per direction when the kernel refuses splice or a pipe cannot be created.
    #[default]
    Splice,
    /// A read/write loop through a fixed user-space buffer per direction.
    Copy,
}

/// When the session last moved a byte, and how many it moved, read by the session's watchdog
/// (idle time, minimum bytes per window).
pub(crate) struct Activity {
    base: Instant,
    last_ms: AtomicU64,
    bytes: AtomicU64,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Activity {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// Bytes delivered so far, both directions together.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    fn touch(&self) {
        self.last_ms
            .store(self.base.elapsed().as_millis() as u64, Relaxed);
    }

    /// The instant of the last byte moved (or of pairing).
    pub(crate) fn last(&self) -> Instant {
        self.base + Duration::from_millis(self.last_ms.load(Relaxed))
    }
}

/// What both directions share: the counters and the activity clock.
pub(crate) struct Meter<'a> {
    pub(crate) bytes: &'a AtomicU64,
    pub(crate) spliced: &'a AtomicU64,
    pub(crate) copied: &'a AtomicU64,
    pub(crate) activity: &'a Activity,
}

impl Meter<'_> {
    fn moved(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Relaxed);
        self.activity.bytes.fetch_add(n as u64, Relaxed);
        self.activity.touch();
    }
}

/// Forwards both ways until both sides have shut down their writing, propagating each half-close.
/// An error in either direction ends the whole session (the caller closes both sockets).
pub(crate) async fn forward(
    a: &TcpStream,
    b: &TcpStream,
    mode: Forwarding,
    buffer_size: usize,
    meter: &Meter<'_>,
) -> io::Result<()> {
    tokio::try_join!(
        direction(a, b, mode, buffer_size, meter),
        direction(b, a, mode, buffer_size, meter)
    )?;
    Ok(())
}

async fn direction(
    from: &TcpStream,
    to: &TcpStream,
    mode: Forwarding,
    buffer_size: usize,
    meter: &Meter<'_>,
) -> io::Result<()> {
    if mode == Forwarding::Splice {
        if let Ok(pipe) = Pipe::new(buffer_size) {
            meter.spliced.fetch_add(1, Relaxed);
            match splice_direction(from, to, &pipe, meter).await {
                Err(Fallback) => meter.spliced.fetch_sub(1, Relaxed),
                Ok(r) => return r,
            };
        }
    }
    meter.copied.fetch_add(1, Relaxed);
    copy_direction(from, to, buffer_size, meter).await
}

/// The kernel refused the very first splice (nothing moved yet): use the copy loop instead.
struct Fallback;

async fn splice_direction(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &Pipe,
    meter: &Meter<'_>,
) -> Result<io::Result<()>, Fallback> {
    let mut in_pipe = 0usize;
    let mut eof = false;
    let mut first = true;
    // Whether the last fill stopped because the pipe was full: more data is known to follow, so
    // the drain may carry SPLICE_F_MORE. Small, interactive writes never get it (it corks).
    let mut bulk = false;
    // A drain carried SPLICE_F_MORE and nothing has followed yet: push before going idle.
    let mut corked = false;
    loop {
        if !eof && in_pipe < pipe.capacity {
            let room = pipe.capacity - in_pipe;
            let r = from.try_io(Interest::READABLE, || {
                match splice(from.as_raw_fd(), pipe.write.as_raw_fd(), room, 0) {
                    // EAGAIN with data in the pipe may mean "pipe full": not the socket's fault,
                    // so keep its readiness and go drain.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && in_pipe > 0 => Ok(None),
                    r => r.map(Some),
                }
            });
            match r {
                Ok(Some(0)) => eof = true,
                Ok(Some(n)) => {
                    in_pipe += n;
                    bulk = in_pipe == pipe.capacity;
                    meter.activity.touch();
                }
                Ok(None) => bulk = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The pipe was empty, so the socket has nothing: wait for it.
                    if std::mem::take(&mut corked) {
                        push(to);
                    }
                    if let Err(e) = from.readable().await {
                        return Ok(Err(e));
                    }
                    continue;
                }
                Err(e) if first && is_unsupported(&e) => return Err(Fallback),
                Err(e) => return Ok(Err(e)),
            }
            first = false;
        }
        if in_pipe > 0 {
            let flags = if bulk { libc::SPLICE_F_MORE } else { 0 };
            let r = to.try_io(Interest::WRITABLE, || {
                splice(pipe.read.as_raw_fd(), to.as_raw_fd(), in_pipe, flags)
            });
            match r {
                Ok(n) => {
                    in_pipe -= n;
                    corked = bulk;
                    meter.moved(n);
                }
                // The pipe is not empty, so EAGAIN is the socket's send buffer: wait for room.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Err(e) = to.writable().await {
                        return Ok(Err(e));
                    }
                }
                Err(e) => return Ok(Err(e)),
            }
        } else if eof {
            return Ok(shutdown_write(to));
        }
    }
}

async fn copy_direction(
    from: &TcpStream,
    to: &TcpStream,
    buffer_size: usize,
    meter: &Meter<'_>,
) -> io::Result<()> {
    let mut buf = vec![0u8; buffer_size.max(4096)];
    loop {
        let n = loop {
            match from.try_read(&mut buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => from.readable().await?,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            return shutdown_write(to);
        }
        meter.activity.touch();
        let mut done = 0;
        while done < n {
            match to.try_write(&buf[done..n]) {
                Ok(m) => {
                    done += m;
                    meter.moved(m);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => to.writable().await?,
                Err(e) => return Err(e),
            }
        }
    }
}

fn is_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
    )
}

/// Shuts down the writing half of a socket the session still holds by reference.
pub(crate) fn shutdown_write(s: &TcpStream) -> io::Result<()> {
    // SAFETY: `s` owns a valid socket fd for the duration of the call; shutdown(2) does not
    // close or invalidate it.
    let r = unsafe { libc::shutdown(s.as_raw_fd(), libc::SHUT_WR) };
    if r == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        // The peer may already be gone; that ends the session the same way.
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            Ok(())
        } else {
            Err(e)
        }
    }
}

/// Sends whatever SPLICE_F_MORE held back: setting TCP_NODELAY pushes pending frames at once.
pub(crate) fn push(s: &TcpStream) {
    // Failure only means the socket is going away; the session notices on its next call.
    let _ = s.set_nodelay(true);
}

/// One non-blocking splice call; `Ok(0)` at end of stream.
fn splice(from: RawFd, to: RawFd, len: usize, extra: libc::c_uint) -> io::Result<usize> {
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK | extra;
    // SAFETY: both fds are open for the duration of the call (borrowed from live owners); null
    // offsets are required for pipes and sockets; the kernel reads and writes no user memory.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            flags,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// A kernel pipe used as the splice buffer of one direction.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl Pipe {
    fn new(size: usize) -> io::Result<Pipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid, writable array of two c_ints, as pipe2(2) requires.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let want = size.clamp(4096, 1 << 30) as libc::c_int;
        // SAFETY: F_SETPIPE_SZ / F_GETPIPE_SZ take an int argument and touch no user memory.
        // A refusal (above pipe-max-size, or the user's pipe page quota) keeps the default size.
        let capacity = unsafe {
            libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, want);
            libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ)
        };
        if capacity <= 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Pipe {
            read,
            write,
            capacity: capacity as usize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipe_gets_requested_size() {
        let p = Pipe::new(256 * 1024).unwrap();
        assert!(p.capacity >= 4096);
        assert!(p.capacity <= 256 * 1024 || p.capacity == 64 * 1024);
    }
}
