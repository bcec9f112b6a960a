//! The congestion control of the connections that carry a transfer's data: CUBIC until the path drops a
//! packet the sender did not cause, then BBR.
//!
//! Measured in the link lab (500 Mbit/s, 24 ms, a drop-tail queue of one BDP; BENCHMARKS.md): BBR leaves
//! 1-2 % of a clean path unused (ProbeRTT drains the pipe for 200 ms every 10 s, and its 2 × BDP window
//! overflows the queue: 3-4 % of the packets are sent twice), so `send` of 1 GiB carries 0.940 of the wire;
//! CUBIC fills the queue and carries 0.952. But CUBIC takes any loss for congestion: with 0.5 % random loss
//! it carries a few Mbit/s, where BBR carries 0.94 of the wire.
//!
//! The sender tells the two kinds of loss apart by the queue: a packet dropped because the sender filled
//! the path's buffer is dropped while that buffer is full, when the smoothed round trip is well above the
//! path's minimum ([`QUEUED`]); a packet lost on a path with no queue (a radio, a bad cable) is lost at the
//! minimum. So a data connection starts on CUBIC and, the first time its retransmissions grow while its
//! round trip is within [`QUEUED`] of the minimum, moves to BBR for good, and with it every connection
//! of its session ([`Policy`]): the lanes share the path, and a lane left on CUBIC beside lanes on BBR
//! would see their queue and take its own random losses for congestion. Errors either way cost little:
//! a congestion loss on a path with a short buffer (taken for random) gives BBR, the system's choice here;
//! a random loss while CUBIC holds a queue (taken for congestion) is followed by one without a queue once
//! CUBIC has backed off.
//!
//! Only where the host offers both (the system's default is BBR, which every process may set again): on
//! any other host the system's choice stays. `FERRY_CONGESTION=system` keeps the system's choice too.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use socket2::SockRef;

/// A round trip at most this many times the minimum (plus [`JITTER`]) means no queue before the
/// bottleneck: a loss then was not the sender's doing.
const QUEUED: f64 = 1.25;
/// Slack for the host's own scheduling in the round trip (a LAN's minimum is ~0.5 ms).
const JITTER: Duration = Duration::from_micros(500);
/// How often a session's connections' counters are read (one `getsockopt` each).
const EVERY: Duration = Duration::from_millis(10);

/// The policy, chosen once per process from the system and `FERRY_CONGESTION`.
fn adaptive() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        if std::env::var("FERRY_CONGESTION").as_deref() == Ok("system") {
            return false;
        }
        let read = |name: &str| std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"));
        let default = read("tcp_congestion_control").unwrap_or_default();
        let available = read("tcp_available_congestion_control").unwrap_or_default();
        default.trim() == "bbr" && available.split_whitespace().any(|c| c == "cubic")
    })
}

/// The counters of one TCP connection this policy reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters {
    /// Segments retransmitted since the connection began.
    pub retransmitted: u32,
    /// The smoothed round trip.
    pub rtt: Duration,
    /// The smallest round trip seen (the path without a queue).
    pub min_rtt: Duration,
}

/// Reads `stream`'s counters (`TCP_INFO`).
pub fn counters(stream: &TcpStream) -> io::Result<Counters> {
    let info = tcp_info(stream)?;
    Ok(Counters {
        retransmitted: info.tcpi_total_retrans,
        rtt: Duration::from_micros(info.tcpi_rtt.into()),
        min_rtt: Duration::from_micros(info.tcpi_min_rtt.into()),
    })
}

#[allow(unsafe_code)]
fn tcp_info(stream: &TcpStream) -> io::Result<libc::tcp_info> {
    // No safe crate of this workspace reads TCP_INFO (socket2 and rustix do not); the policy above is
    // worth 1.2 % of a clean WAN path (BENCHMARKS.md).
    // SAFETY: `tcp_info` is plain old data (integers only), so all zeroes is a valid value; getsockopt(2)
    // writes at most `len` bytes into it and sets `len` to what it wrote; the descriptor is `stream`'s,
    // open for the whole call.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(info)
    }
}

/// What the policy decides after a look at the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Stay on CUBIC.
    Stay,
    /// Move to BBR: a retransmission with no queue on the path.
    Bbr,
}

/// The policy's memory of one connection (sans IO: fed with [`Counters`] and the time they were read).
#[derive(Debug, Default)]
pub struct LossWatch {
    retransmitted: u32,
    /// The round trips read over the last [`PEAK_WINDOW`] round trips, oldest first.
    recent: VecDeque<(Instant, Duration)>,
}

/// How far back (in minimum round trips) a queue counts: a loss is read some time after it happened, and
/// a sender backs off at once, so the queue it overfilled may be draining by then.
const PEAK_WINDOW: u32 = 4;

impl LossWatch {
    /// Judges the counters read at `now`: BBR once retransmissions grew while no round trip of the last
    /// [`PEAK_WINDOW`] minimum round trips showed a queue.
    pub fn judge(&mut self, now: Instant, c: Counters) -> Verdict {
        let window = c.min_rtt * PEAK_WINDOW;
        while self
            .recent
            .front()
            .is_some_and(|&(at, _)| now.duration_since(at) > window)
        {
            self.recent.pop_front();
        }
        self.recent.push_back((now, c.rtt));
        let peak = self
            .recent
            .iter()
            .map(|&(_, rtt)| rtt)
            .max()
            .unwrap_or(c.rtt);
        let grew = c.retransmitted > self.retransmitted;
        self.retransmitted = c.retransmitted;
        let no_queue = c.min_rtt.is_zero() || peak <= c.min_rtt.mul_f64(QUEUED) + JITTER;
        if grew && no_queue {
            Verdict::Bbr
        } else {
            Verdict::Stay
        }
    }
}

/// The verdict shared by the data connections of one session: once one of them saw loss without a
/// queue, all of them move to BBR. One thread per session reads the connections' counters every
/// [`EVERY`] while any of them runs CUBIC; it holds them weakly, so a connection closes when its writer
/// drops it.
#[derive(Clone, Debug, Default)]
pub struct Policy(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    bbr: AtomicBool,
    watched: Mutex<Watched>,
}

/// The connections on CUBIC (held weakly), and whether the reading thread runs.
type Watched = (Vec<(Weak<TcpStream>, LossWatch)>, bool);

impl Policy {
    /// A session's policy: CUBIC until a loss without a queue.
    pub fn new() -> Policy {
        Policy::default()
    }

    /// Whether the session moved to BBR.
    pub fn on_bbr(&self) -> bool {
        self.0.bbr.load(Ordering::Relaxed)
    }

    /// Puts `stream` on CUBIC and under watch, unless the session moved to BBR or the host does not
    /// offer both; whether it did.
    fn watch(&self, stream: &Arc<TcpStream>) -> bool {
        let mut watched = self.0.watched.lock().expect("no reader panics holding it");
        if !adaptive()
            || self.on_bbr()
            || SockRef::from(&**stream)
                .set_tcp_congestion(b"cubic")
                .is_err()
        {
            return false;
        }
        watched
            .0
            .push((Arc::downgrade(stream), LossWatch::default()));
        if !watched.1 {
            watched.1 = true;
            let shared = Arc::clone(&self.0);
            std::thread::spawn(move || read_counters(&shared));
        }
        true
    }
}

/// The session's reading thread: a [`pass`] every [`EVERY`] until none is left to watch.
fn read_counters(shared: &Shared) {
    loop {
        std::thread::sleep(EVERY);
        if !pass(shared, Instant::now(), &counters) {
            return;
        }
    }
}

/// Judges each watched connection still open by the counters `read` gives; at the first
/// [`Verdict::Bbr`] moves them all to BBR. Whether any is left to watch (if not, the reading thread is
/// marked stopped).
fn pass(shared: &Shared, now: Instant, read: &dyn Fn(&TcpStream) -> io::Result<Counters>) -> bool {
    let mut watched = shared.watched.lock().expect("no reader panics holding it");
    let (streams, running) = &mut *watched;
    streams.retain(|(s, _)| s.strong_count() > 0);
    let bbr = streams.iter_mut().any(|(s, watch)| {
        s.upgrade()
            .is_some_and(|s| read(&s).is_ok_and(|c| watch.judge(now, c) == Verdict::Bbr))
    });
    if bbr {
        shared.bbr.store(true, Ordering::Relaxed);
        for s in streams.drain(..).filter_map(|(s, _)| s.upgrade()) {
            let _ = SockRef::from(&*s).set_tcp_congestion(b"bbr");
        }
    }
    if streams.is_empty() {
        *running = false;
    }
    *running
}

/// The sending side of a data connection under a session's [`Policy`].
#[derive(Debug)]
pub struct DataStream {
    stream: Arc<TcpStream>,
    watched: bool,
}

impl DataStream {
    /// Sends on `stream` under `policy` (on CUBIC until its session moves to BBR) where the host offers
    /// both; elsewhere on the system's choice.
    pub fn new(stream: TcpStream, policy: &Policy) -> DataStream {
        let stream = Arc::new(stream);
        let watched = policy.watch(&stream);
        DataStream { stream, watched }
    }

    /// The TCP stream.
    pub fn get_ref(&self) -> &TcpStream {
        &self.stream
    }

    /// Whether the connection started on CUBIC under watch.
    pub fn watched(&self) -> bool {
        self.watched
    }
}

impl Write for DataStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self.stream).write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&*self.stream).write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&*self.stream).flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(retransmitted: u32, rtt_ms: f64) -> Counters {
        Counters {
            retransmitted,
            rtt: Duration::from_secs_f64(rtt_ms / 1e3),
            min_rtt: Duration::from_millis(24),
        }
    }

    /// Feeds `samples` (milliseconds since the start, counters) to a new watch; its verdicts.
    fn verdicts(samples: &[(u64, Counters)]) -> Vec<Verdict> {
        let start = Instant::now();
        let mut w = LossWatch::default();
        samples
            .iter()
            .map(|&(ms, c)| w.judge(start + Duration::from_millis(ms), c))
            .collect()
    }

    #[test]
    fn a_loss_with_a_full_queue_keeps_cubic_and_a_loss_without_one_moves_to_bbr() {
        use Verdict::{Bbr, Stay};
        // As measured on wan (24 ms, a queue of one BDP): slow start overflows the buffer (the round
        // trip doubled), CUBIC backs off to 0.7 of its window (a queue of 0.4 BDP stays), no new loss
        // for seconds; then a loss at the minimum round trip.
        let samples = [
            (0, at(0, 24.3)),
            (300, at(0, 48.0)),
            (390, at(298, 48.6)),
            (480, at(746, 46.8)),
            (890, at(753, 34.4)),
            (5000, at(753, 24.1)),
            (5100, at(754, 24.5)),
        ];
        assert_eq!(
            verdicts(&samples),
            [Stay, Stay, Stay, Stay, Stay, Stay, Bbr]
        );
    }

    #[test]
    fn a_loss_read_after_the_overfilled_queue_drained_is_still_congestion() {
        use Verdict::{Bbr, Stay};
        // The queue was full 40 ms before the loss was read (within 4 round trips): congestion. The same
        // reading a second later, with no queue seen since, is a loss of the path's.
        let samples = [(0, at(0, 47.0)), (40, at(30, 25.0)), (1040, at(31, 25.0))];
        assert_eq!(verdicts(&samples), [Stay, Stay, Bbr]);
    }

    #[test]
    fn the_first_loss_of_a_lossy_path_moves_to_bbr_in_slow_start() {
        use Verdict::{Bbr, Stay};
        assert_eq!(
            verdicts(&[(0, at(0, 24.2)), (50, at(3, 25.0))]),
            [Stay, Bbr]
        );
    }

    #[test]
    fn a_connection_without_a_round_trip_yet_is_judged_by_its_losses() {
        let unknown = Counters {
            retransmitted: 1,
            rtt: Duration::ZERO,
            min_rtt: Duration::ZERO,
        };
        assert_eq!(verdicts(&[(0, unknown)]), [Verdict::Bbr]);
    }

    #[test]
    fn a_loopback_connection_reads_its_counters() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let policy = Policy::new();
        let mut data = DataStream::new(client, &policy);
        data.write_all(&[7u8; 100_000]).unwrap();
        let mut got = vec![0u8; 100_000];
        std::io::Read::read_exact(&mut server, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 7));
        let c = counters(data.get_ref()).unwrap();
        assert_eq!(c.retransmitted, 0, "loopback loses nothing");
        assert!(c.rtt > Duration::ZERO && c.min_rtt <= c.rtt, "{c:?}");
        // On a host whose default is BBR the connection starts on CUBIC; elsewhere it keeps the default.
        let cc = SockRef::from(data.get_ref()).tcp_congestion().unwrap();
        let cc = String::from_utf8_lossy(&cc);
        let cc = cc.trim_end_matches('\0');
        if adaptive() {
            assert!(data.watched());
            assert_eq!(cc, "cubic");
        } else {
            assert!(!data.watched());
        }
        assert!(!policy.on_bbr());
    }

    #[test]
    fn once_the_session_moved_to_bbr_its_connections_follow_and_new_ones_start_there() {
        if !adaptive() {
            eprintln!(
                "skipped: this host's default congestion control is not bbr (or it has no cubic)"
            );
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let connect = || TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let cc = |s: &DataStream| SockRef::from(s.get_ref()).tcp_congestion().unwrap();
        let policy = Policy::new();
        let (a, b) = (
            DataStream::new(connect(), &policy),
            DataStream::new(connect(), &policy),
        );
        assert!(a.watched() && b.watched());
        assert!(cc(&a).starts_with(b"cubic") && cc(&b).starts_with(b"cubic"));
        let start = Instant::now();
        let quiet = |_: &TcpStream| Ok(at(0, 24.1));
        assert!(pass(&policy.0, start, &quiet), "no loss: still watching");
        assert!(!policy.on_bbr());
        // One connection loses a packet with no queue: both move.
        let a_fd = a.get_ref().as_raw_fd();
        let lossy = |s: &TcpStream| Ok(at(u32::from(s.as_raw_fd() == a_fd), 24.2));
        assert!(
            !pass(&policy.0, start + EVERY, &lossy),
            "nothing left to watch"
        );
        assert!(policy.on_bbr());
        assert!(cc(&a).starts_with(b"bbr") && cc(&b).starts_with(b"bbr"));
        let c = DataStream::new(connect(), &policy);
        assert!(
            !c.watched(),
            "a connection joining after the move keeps the system's choice"
        );
        assert!(cc(&c).starts_with(b"bbr"));
    }

    #[test]
    fn the_reading_thread_ends_when_its_connections_close() {
        if !adaptive() {
            eprintln!(
                "skipped: this host's default congestion control is not bbr (or it has no cubic)"
            );
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let policy = Policy::new();
        let a = DataStream::new(
            TcpStream::connect(listener.local_addr().unwrap()).unwrap(),
            &policy,
        );
        let (mut peer, _) = listener.accept().unwrap();
        assert!(policy.0.watched.lock().unwrap().1, "reading");
        drop(a);
        // The connection closes at once (the thread holds it weakly): the peer reads its end.
        let mut buf = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut peer, &mut buf).unwrap(), 0);
        let deadline = Instant::now() + Duration::from_secs(5);
        while policy.0.watched.lock().unwrap().1 {
            assert!(Instant::now() < deadline, "the reading thread did not end");
            std::thread::sleep(EVERY);
        }
    }
}
