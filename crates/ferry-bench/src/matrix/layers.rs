//! The matrix's layer rows below `ferry send`: the AEAD in memory (once per run, the CPU ceiling), the channel
//! over one TCP connection on each path, and raw TCP with tuned socket buffers.

use std::io;
use std::net::TcpStream;
use std::time::Instant;

use aws_lc_rs::aead;
use ferry_channel::{Auth, Config};
use socket2::SockRef;

use super::{Ends, Sample};

/// The AEAD's packet size: the channel's largest.
const AEAD_PACKET: usize = 1 << 20;

/// AES-256-GCM seal+open of `bytes` in 1 MiB packets on one thread, no network; seconds.
pub(super) fn aead_in_memory(bytes: u64) -> Sample {
    let count = bytes.div_ceil(AEAD_PACKET as u64).max(1);
    let secs = crate::channel::aead_seal_open(&aead::AES_256_GCM, AEAD_PACKET, count).as_secs_f64();
    Sample {
        secs: secs * bytes as f64 / (count * AEAD_PACKET as u64) as f64,
        connected: f64::NAN,
        first_byte: f64::NAN,
    }
}

impl Ends<'_> {
    /// `bytes` through ferry's channel (handshake with a code, AES-256-GCM where the CPU has it, 1 MiB
    /// packets) over one TCP connection across the path, memory to memory. Connected: the receiver's
    /// handshake done.
    pub(super) fn channel_copy(&self, bytes: u64) -> io::Result<Sample> {
        let (tx, rx, t0) = self.tcp_pair()?;
        // As ferry's sessions: the handshake's small messages must not wait for Nagle.
        tx.set_nodelay(true)?;
        rx.set_nodelay(true)?;
        let copy = crate::channel::channel_copy(tx, rx, bytes, Config::ferry(), || {
            Auth::Code(b"7-matrix-channel-row".to_vec())
        })?;
        if copy.bytes != bytes {
            return Err(io::Error::other(format!(
                "channel copy: {} of {bytes} bytes arrived",
                copy.bytes
            )));
        }
        let since = |t: Instant| t.duration_since(t0).as_secs_f64();
        Ok(Sample {
            secs: since(copy.end),
            connected: since(copy.established),
            first_byte: copy.first.map_or(f64::NAN, since),
        })
    }
}

/// How the raw TCP copy's sockets are set up: the socket-buffer rows (issue 12, item 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tune {
    /// The host's defaults (autotuning up to `tcp_wmem`/`tcp_rmem`).
    Default,
    /// SO_SNDBUF of `net.core.wmem_max` on the sender (the kernel doubles it; autotuning of the send side
    /// off).
    SndBuf,
    /// SO_SNDBUF as above and SO_RCVBUF of `net.core.rmem_max` on the receiver (its autotuning off too).
    SndRcvBuf,
    /// TCP_NOTSENT_LOWAT of 128 KiB on the sender, buffers as the host has them.
    Lowat,
}

/// The lowat the `Lowat` row sets.
const LOWAT: u32 = 128 << 10;

impl Tune {
    /// The tuned rows, with their layer names.
    pub(super) const ROWS: [(Tune, &'static str); 3] = [
        (Tune::SndBuf, "raw TCP sndbuf"),
        (Tune::SndRcvBuf, "raw TCP snd+rcvbuf"),
        (Tune::Lowat, "raw TCP lowat"),
    ];

    /// Sets the options on a connected pair (the sender `tx`, the receiver `rx`). The receive buffer is set
    /// after the handshake, so the window scale is the one autotuning chose; SO_RCVBUF then only lowers the
    /// ceiling when `tcp_rmem`'s maximum is above `2 × rmem_max`.
    pub(super) fn apply(self, tx: &TcpStream, rx: &TcpStream) -> io::Result<()> {
        let (tx, rx) = (SockRef::from(tx), SockRef::from(rx));
        if matches!(self, Tune::SndBuf | Tune::SndRcvBuf) {
            tx.set_send_buffer_size(sysctl("core/wmem_max")? as usize)?;
        }
        if self == Tune::SndRcvBuf {
            rx.set_recv_buffer_size(sysctl("core/rmem_max")? as usize)?;
        }
        if self == Tune::Lowat {
            tx.set_tcp_notsent_lowat(LOWAT)?;
        }
        Ok(())
    }
}

/// The first number of `/proc/sys/net/NAME` (as the calling thread's namespace sees it).
fn sysctl(name: &str) -> io::Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/sys/net/{name}"))?;
    text.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| io::Error::other(format!("net/{name}: {text:?} is not a number")))
}

/// The buffer limits the rows run under, as the server's namespace sees them: a note for the table.
pub(super) fn buffer_limits(ends: &Ends<'_>) -> String {
    super::in_ns(ends.server(), || {
        let read = |n: &str| {
            std::fs::read_to_string(format!("/proc/sys/net/{n}"))
                .map(|t| t.split_whitespace().collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|e| e.to_string())
        };
        format!(
            "socket buffers: net.core.wmem_max {}, rmem_max {}, tcp_wmem {}, tcp_rmem {}, tcp_congestion_control {}; \
             sndbuf rows ask SO_SNDBUF = wmem_max (the kernel doubles it), lowat {} KiB",
            read("core/wmem_max"),
            read("core/rmem_max"),
            read("ipv4/tcp_wmem"),
            read("ipv4/tcp_rmem"),
            read("ipv4/tcp_congestion_control"),
            LOWAT >> 10,
        )
    })
}

/// Runs `f` with the server namespace's `tcp_wmem` maximum raised to `2 × net.core.wmem_max`, the send buffer
/// a socket gets from SO_SNDBUF = wmem_max: what that option would give `ferry send` without changing
/// ferry. The namespace's value is restored after.
pub(super) fn with_send_buffer<T>(ends: &Ends<'_>, f: impl FnOnce() -> T) -> io::Result<T> {
    let Some(ns) = ends.server() else {
        return Err(io::Error::other("only inside the lab"));
    };
    let file = "/proc/sys/net/ipv4/tcp_wmem";
    let before = ns.enter(|| std::fs::read_to_string(file))?;
    let fields: Vec<&str> = before.split_whitespace().collect();
    let [min, default, _] = fields[..] else {
        return Err(io::Error::other(format!("{file}: {before:?}")));
    };
    let max = 2 * sysctl("core/wmem_max")?;
    ns.enter(|| std::fs::write(file, format!("{min} {default} {max}")))?;
    let out = f();
    ns.enter(|| std::fs::write(file, before.trim()))?;
    Ok(out)
}
