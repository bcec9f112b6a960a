//! Lanes on sockets: the extra TCP connections of a session where one stream's window cannot cover the
//! path (the keys, hellos and reordering are [`ferry_channel::lanes`]).
//!
//! The receiver of the data dials each extra lane to the address its session's connection reached and sends
//! the lane's hello; the sender accepts them on the listener it met the receiver on ([`Rendezvous::accept_lanes`]),
//! closes without an answer any connection whose hello does not verify or whose lane joined already, and
//! writes on the others. Over the relay a session has one lane: the relay pairs one connection per nameplate.
//!
//! How many lanes: [`lane_count`], from the round trip the handshake took and this host's send buffer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use ferry_channel::blocking::{SecureReader, SecureWriter};
use ferry_channel::lanes::{HelloCheck, LaneKeys, HELLO_LEN, MAX_LANES};
use socket2::SockRef;

use crate::congestion::{DataStream, Policy};
use crate::handshake::Event;
use crate::{PathKind, Rendezvous, SessionError};

/// How long a lane's connection may take to send its hello, or to connect.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections whose hello is awaited at once.
const MAX_PENDING_HELLOS: usize = 2 * MAX_LANES;
/// Most lanes chosen without `--lanes`.
pub const MAX_AUTO_LANES: usize = 8;
/// The rate lanes are sized for without `--lanes`: the path's rate is not known before data flows, so the
/// count is the one that would fill a path of this rate at the measured round trip.
const AUTO_RATE: f64 = 125e6;
/// What share of its send buffer one TCP stream keeps in flight (measured in the link lab: 4 MiB of
/// `tcp_wmem` carried 0.216 × 1 Gbit/s × 100 ms = 2.7 MB, 0.64 of it; the rest is the kernel's overhead).
const IN_FLIGHT_SHARE: f64 = 0.64;

/// The first number of `/proc/sys/net/NAME`.
fn sysctl(name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/sys/net/{name}"))
        .ok()?
        .split_whitespace()
        .last()
        .and_then(|v| v.parse().ok())
}

/// The send buffer [`tune_sender`] asks for: `net.core.wmem_max` where twice it (the kernel doubles what is
/// asked) is more than autotuning reaches (`tcp_wmem`'s maximum), else none.
fn send_buffer_request() -> Option<usize> {
    let (wmem_max, tcp_wmem) = (sysctl("core/wmem_max")?, sysctl("ipv4/tcp_wmem")?);
    (2 * wmem_max > tcp_wmem).then_some(wmem_max as usize)
}

/// Sets the data sender's socket up for bulk data: SO_SNDBUF of `net.core.wmem_max` where that is more than
/// autotuning would reach (it turns this socket's send-side autotuning off, so only there). Best effort.
pub fn tune_sender(stream: &TcpStream) {
    if let Some(size) = send_buffer_request() {
        let _ = SockRef::from(stream).set_send_buffer_size(size);
    }
}

/// What each lane's socket holds unsent at most (TCP_NOTSENT_LOWAT), so that a lane's writer takes the next
/// packet only when its connection is sending: without it a lane in slow start takes as many packets as its
/// send buffer holds (up to 8 MiB) at memory speed, and the stream waits for them in order while the faster
/// lane idles.
pub const LANE_NOTSENT_LOWAT: u32 = 512 << 10;

/// Sets a lane's socket (the session's own connection too, once the data is spread over lanes) to hold at
/// most [`LANE_NOTSENT_LOWAT`] unsent. Best effort.
pub fn tune_lane(stream: &TcpStream) {
    let _ = SockRef::from(stream).set_tcp_notsent_lowat(LANE_NOTSENT_LOWAT);
}

/// The send buffer one stream of this host gets (after [`tune_sender`]).
fn stream_buffer() -> f64 {
    let tcp_wmem = sysctl("ipv4/tcp_wmem").unwrap_or(4 << 20);
    let tuned = send_buffer_request().map_or(0, |s| 2 * s as u64);
    tcp_wmem.max(tuned) as f64
}

/// The windows' headroom: lanes enough for this many times the path's BDP, as a window is full only after
/// slow start (measured on high-bdp, 1 GiB: 4 lanes 0.770 of the wire, 3 lanes 0.672, 2 lanes 0.644).
const HEADROOM: f64 = 1.5;
/// From this round trip on, a session has at least two lanes: one loss then slows half the data (measured
/// in the link lab, raw TCP at 24 ms RTT: with 0.5 % loss two streams carry 0.928 of the wire against one
/// stream's 0.774; without loss 0.944 against 0.940, so the second stream costs nothing there).
const TWO_LANES_FROM: f64 = 0.010;

/// A second lane against loss (see [`TWO_LANES_FROM`]) only for transfers of at least this many times what
/// the path carries in a round trip at [`AUTO_RATE`]: a shorter one spends its time in slow start, and each lane
/// has a slow start of its own (measured on wan, 24 ms: see [`lane_count`]).
const TWO_LANES_FROM_BDPS: f64 = 64.0;

/// How many lanes a session whose handshake took `handshake` on the waiting side (about two round trips:
/// the key shares, then the confirmations) uses without `--lanes` for `bytes` of data: enough streams for
/// their windows together to cover [`HEADROOM`] × [`AUTO_RATE`] × RTT (none more when one stream's slow start
/// would carry it all before its window is full), at least 2 from [`TWO_LANES_FROM`] when the transfer is
/// long enough ([`TWO_LANES_FROM_BDPS`]), at most [`MAX_AUTO_LANES`]. (A lost handshake packet lengthens
/// the handshake and adds lanes: on a lossy path, where they help most.)
pub fn lane_count(handshake: Duration, bytes: u64) -> usize {
    lanes_for(
        handshake.as_secs_f64() / 2.0,
        bytes as f64,
        stream_buffer() * IN_FLIGHT_SHARE,
    )
}

/// [`lane_count`] for a round trip of `rtt` seconds, `bytes` to send and `per_stream` bytes one stream keeps
/// in flight.
fn lanes_for(rtt: f64, bytes: f64, per_stream: f64) -> usize {
    // Slow start carries about twice the window it ends at: below that, one stream never fills its window.
    let needed = if bytes <= 2.0 * per_stream {
        1
    } else {
        (HEADROOM * AUTO_RATE * rtt / per_stream).ceil() as usize
    };
    let long = bytes >= TWO_LANES_FROM_BDPS * AUTO_RATE * rtt;
    let least = if rtt >= TWO_LANES_FROM && long { 2 } else { 1 };
    needed.clamp(least, MAX_AUTO_LANES)
}

impl Rendezvous {
    /// Accepts lanes `1..lanes` of the session whose lane keys are `keys` on this side's listener, each
    /// ready to write on, until every lane joined or the receiver is dropped. Connections whose hello does
    /// not verify, or whose lane joined already, are closed without an answer. Other paths' connections
    /// (the relay) are closed.
    pub fn accept_lanes(
        &mut self,
        keys: LaneKeys,
        lanes: usize,
        policy: &Policy,
    ) -> mpsc::Receiver<SecureWriter<DataStream>> {
        let (tx, rx) = mpsc::channel();
        let offers = std::mem::replace(&mut self.rx, mpsc::channel().1);
        let keys = Arc::new(keys);
        let check = Arc::new(Mutex::new(HelloCheck::new(&keys, lanes)));
        let pending = Arc::new(AtomicUsize::new(0));
        let policy = policy.clone();
        std::thread::spawn(move || loop {
            if check.lock().expect("no hello panics holding it").is_full() {
                return;
            }
            let stream = match offers.recv_timeout(Duration::from_millis(500)) {
                Ok(Event::Offered(stream, path, _)) if path != PathKind::Relay => stream,
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            if pending.load(Ordering::Relaxed) >= MAX_PENDING_HELLOS {
                continue;
            }
            pending.fetch_add(1, Ordering::Relaxed);
            let (keys, check, pending, tx, policy) = (
                Arc::clone(&keys),
                Arc::clone(&check),
                Arc::clone(&pending),
                tx.clone(),
                policy.clone(),
            );
            std::thread::spawn(move || {
                let lane = read_hello(&stream).and_then(|hello| {
                    check
                        .lock()
                        .expect("no hello panics holding it")
                        .check(&hello)
                        .ok()
                });
                pending.fetch_sub(1, Ordering::Relaxed);
                if let Some(i) = lane {
                    stream.set_read_timeout(None).ok();
                    tune_sender(&stream);
                    tune_lane(&stream);
                    let data = DataStream::new(stream, &policy);
                    let _ = tx.send(SecureWriter::new(data, keys.sealer(i)));
                }
            });
        });
        rx
    }
}

/// A lane's hello, if it came in time.
fn read_hello(mut stream: &TcpStream) -> Option<[u8; HELLO_LEN]> {
    stream.set_read_timeout(Some(HELLO_TIMEOUT)).ok()?;
    let mut hello = [0u8; HELLO_LEN];
    stream.read_exact(&mut hello).ok()?;
    Some(hello)
}

/// Dials lanes `1..lanes` of the session whose lane keys are `keys` to `addr` (where its connection went),
/// each on a thread of its own; each lane's reader, or why it failed, arrives on the receiver.
pub fn dial_lanes(
    addr: SocketAddr,
    keys: LaneKeys,
    lanes: usize,
) -> mpsc::Receiver<Result<SecureReader<TcpStream>, SessionError>> {
    let (tx, rx) = mpsc::channel();
    let keys = Arc::new(keys);
    for i in 1..lanes.min(MAX_LANES) {
        let (keys, tx) = (Arc::clone(&keys), tx.clone());
        std::thread::spawn(move || {
            let dialled = (|| {
                let mut stream = TcpStream::connect_timeout(&addr, HELLO_TIMEOUT)?;
                stream.set_nodelay(true)?;
                stream.write_all(&keys.hello(i))?;
                Ok(SecureReader::new(stream, keys.opener(i)))
            })();
            let _ = tx.send(dialled.map_err(SessionError::Io));
        });
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn lanes_grow_with_the_round_trip_and_stay_bounded() {
        assert_eq!(lane_count(Duration::from_micros(200), GIB), 1);
        assert_eq!(lane_count(Duration::from_millis(1), GIB), 1);
        assert!(lane_count(Duration::from_millis(48), GIB) >= 2);
        assert!(
            lane_count(Duration::from_millis(200), GIB)
                >= lane_count(Duration::from_millis(1), GIB)
        );
        assert_eq!(
            lane_count(Duration::from_secs(10), 100 * GIB),
            MAX_AUTO_LANES
        );
    }

    #[test]
    fn a_short_transfer_keeps_one_lane() {
        // This host's lab: 8 MiB of send buffer per stream, 0.64 of it in flight.
        let per_stream = 0.64 * 8.0 * (1 << 20) as f64;
        // 10,000 small files (61 MB) at 24 ms: in slow start most of the time, one lane; 1 GiB, two.
        assert_eq!(lanes_for(0.024, 61.4e6, per_stream), 1);
        assert_eq!(lanes_for(0.024, GIB as f64, per_stream), 2);
        // What one stream's slow start carries before its window is full: one lane at any round trip.
        assert_eq!(lanes_for(5.0, 1e6, per_stream), 1);
        // The same 61 MB at 100 ms, longer than one window: the windows decide (4 for 1.5 × 12.5 MB).
        assert_eq!(lanes_for(0.100, 61.4e6, per_stream), 4);
    }
}
