//! The congestion control of the connections that carry a transfer's data: BBR to start, CUBIC once the
//! path's own buffer overflowed, BBR for good once the path dropped a packet the sender did not cause.
//!
//! Measured in the link lab (500 Mbit/s, 24 ms, a drop-tail queue of one BDP; BENCHMARKS.md): BBR leaves
//! 1-2 % of a clean path unused (ProbeRTT drains the pipe for 200 ms every 10 s, and its 2 × BDP window
//! overflows the queue: 3-4 % of the packets are sent twice), so `send` of 1 GiB carries 0.940 of the wire;
//! CUBIC fills the queue and carries 0.952. But CUBIC takes any loss for congestion: with 0.5 % random loss
//! it carries a few Mbit/s, where BBR carries 0.93 of the wire. And CUBIC's slow start may end far too
//! early (HyStart reads a little jitter as a queue: measured, 10,000 files on wan took 1.8 s instead of
//! 1.3), where BBR's start-up measures the rate.
//!
//! The sender tells the two kinds of loss apart by the queue ([`LossWatch`]): a packet dropped because the
//! sender filled the path's buffer is dropped while that buffer is full, when the round trip is well above
//! the path's minimum ([`QUEUED`]); a packet lost on the path (a radio, a bad cable) is lost with no queue
//! (in BBR's start-up before it built one, under CUBIC because CUBIC cannot build one there). So a session's
//! data connections ([`Policy`]) start on the system's BBR; at the first loss with a queue (start-up
//! overfilled the buffer: the path is clean so far) they move to CUBIC; at the first loss without a queue
//! (in either phase) they move to BBR for good. All of a session's connections move together: the lanes
//! share the path, and a lane left on CUBIC beside lanes on BBR would see their queue and take its own
//! random losses for congestion. Errors either way cost little: a congestion loss on a path with a short
//! buffer (taken for random) gives BBR, the system's choice; a random loss while a queue stands (taken
//! for congestion) is followed by one without a queue once CUBIC has backed off.
//!
//! Only where the host offers both (the system's default is BBR, which every process may set again): on
//! any other host the system's choice stays. `FERRY_CONGESTION=system` keeps the system's choice too.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use socket2::SockRef;

use crate::PathKind;

/// A round trip at most this many times the minimum (plus [`JITTER`]) means no queue before the
/// bottleneck: a loss then was not the sender's doing.
const QUEUED: f64 = 1.25;
/// Slack for the host's own scheduling in the round trip (a LAN's minimum is ~0.5 ms).
const JITTER: Duration = Duration::from_micros(500);
/// The shortest path (minimum round trip) moved to CUBIC. Below it BBR stays: on lan (1 Gbit/s, 0.5 ms)
/// BBR carried 0.96 of the wire, at TCP's ceiling, and CUBIC 0.89-0.90 against BBR's 0.92 in one run
/// (BENCHMARKS.md).
const CUBIC_FROM: Duration = Duration::from_millis(5);
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
    /// The connection is recovering from a loss (fast recovery, or after a retransmission timeout).
    pub recovering: bool,
}

/// Reads `stream`'s counters (`TCP_INFO`).
pub fn counters(stream: &TcpStream) -> io::Result<Counters> {
    let info = tcp_info(stream)?;
    Ok(Counters {
        retransmitted: info.tcpi_total_retrans,
        rtt: Duration::from_micros(info.tcpi_rtt.into()),
        min_rtt: Duration::from_micros(info.tcpi_min_rtt.into()),
        recovering: matches!(info.tcpi_ca_state, TCP_CA_RECOVERY | TCP_CA_LOSS),
    })
}

/// `tcpi_ca_state` in fast recovery and after a retransmission timeout (`enum tcp_ca_state` in Linux's
/// `include/net/tcp.h`; the libc crate does not name them).
const TCP_CA_RECOVERY: u8 = 3;
const TCP_CA_LOSS: u8 = 4;

/// The bytes `stream` may send now without waiting for an acknowledgement: its congestion window less the
/// segments in flight, where the `just_written` bytes count as in flight whether or not they left yet.
pub fn free_window(stream: &TcpStream, just_written: usize) -> io::Result<usize> {
    let info = tcp_info(stream)?;
    let mss = info.tcpi_snd_mss.max(1) as usize;
    let in_flight = (info.tcpi_unacked as usize).max(just_written.div_ceil(mss));
    Ok((info.tcpi_snd_cwnd as usize).saturating_sub(in_flight) * mss)
}

/// The bytes `stream` received so far, as the kernel counts them (read by us or not).
pub(crate) fn bytes_received(stream: &TcpStream) -> io::Result<u64> {
    Ok(tcp_info(stream)?.tcpi_bytes_received)
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

/// What a loss tells, if the counters show one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Retransmissions grew while the path held a queue: the sender overfilled its buffer.
    Congestion,
    /// Retransmissions grew with no queue on the path: the path lost the packet.
    Path,
}

/// The policy's memory of one connection (sans IO: fed with [`Counters`] and the time they were read).
#[derive(Debug, Default)]
pub struct LossWatch {
    retransmitted: u32,
    /// The last reading found the connection recovering from a loss.
    recovering: bool,
    /// The round trips read over the last [`PEAK_WINDOW`] minimum round trips, oldest first.
    recent: VecDeque<(Instant, Duration)>,
}

/// How far back (in minimum round trips) a queue counts: a loss is read some time after it happened, and
/// a sender backs off at once, so the queue it overfilled may be draining by then.
const PEAK_WINDOW: u32 = 4;

impl LossWatch {
    /// Judges the counters read at `now`: a loss if retransmissions grew, [`Loss::Path`] when no round
    /// trip of the last [`PEAK_WINDOW`] minimum round trips showed a queue. Retransmissions made while the
    /// last reading already found the connection recovering belong to a loss judged then, not to a new
    /// one: a queue overfilled by a whole window loses hundreds of segments, and their recovery can
    /// outlast the queue's round trips by many (on wan it went on for a second, on a loaded host long
    /// enough to be taken for the path's loss once the queue had drained).
    pub fn judge(&mut self, now: Instant, c: Counters) -> Option<Loss> {
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
        let grew = c.retransmitted > self.retransmitted && !self.recovering;
        self.retransmitted = c.retransmitted;
        self.recovering = c.recovering;
        let queue = !c.min_rtt.is_zero() && peak > c.min_rtt.mul_f64(QUEUED) + JITTER;
        match (grew, queue) {
            (false, _) => None,
            (true, true) => Some(Loss::Congestion),
            (true, false) => Some(Loss::Path),
        }
    }
}

/// Where a session's data connections are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// On BBR, no loss seen yet.
    Start,
    /// On CUBIC: the path overflowed only its own buffer so far.
    Cubic,
    /// On BBR for good: the path lost a packet (or the policy is off).
    Bbr,
}

impl Phase {
    /// The phase after `loss` on a path whose minimum round trip is `min_rtt`: CUBIC only from
    /// [`CUBIC_FROM`].
    pub fn after(self, loss: Loss, min_rtt: Duration) -> Phase {
        match (self, loss) {
            (_, Loss::Path) | (Phase::Bbr, _) => Phase::Bbr,
            (Phase::Start | Phase::Cubic, Loss::Congestion) if min_rtt >= CUBIC_FROM => {
                Phase::Cubic
            }
            (Phase::Start | Phase::Cubic, Loss::Congestion) => Phase::Bbr,
        }
    }

    fn algorithm(self) -> &'static [u8] {
        match self {
            Phase::Cubic => b"cubic",
            Phase::Start | Phase::Bbr => b"bbr",
        }
    }
}

/// The phase shared by the data connections of one session ([`Phase`]). One thread per session reads
/// the connections' counters every [`EVERY`] until the session is on BBR for good; it holds them
/// weakly, so a connection closes when its writer drops it.
#[derive(Clone, Debug)]
pub struct Policy(Arc<Mutex<Shared>>);

#[derive(Debug)]
struct Shared {
    phase: Phase,
    /// The connections watched (held weakly), each with its watch.
    streams: Vec<(Weak<TcpStream>, LossWatch)>,
    /// Whether the reading thread runs.
    reading: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy::new()
    }
}

impl Policy {
    /// A session's policy, in [`Phase::Start`] (or [`Phase::Bbr`] where it is off on this host).
    pub fn new() -> Policy {
        Policy::in_phase(if adaptive() { Phase::Start } else { Phase::Bbr })
    }

    /// The policy of a session whose data takes `path`: [`Policy::new`], or the system's choice through a
    /// relay (its second hop is the relay's, on the system's choice, and CUBIC on the first measured
    /// worse, BENCHMARKS.md).
    pub fn for_path(path: PathKind) -> Policy {
        match path {
            PathKind::Relay => Policy::system(),
            PathKind::SameHost | PathKind::Lan | PathKind::Direct => Policy::new(),
        }
    }

    /// A policy that keeps the system's choice.
    fn system() -> Policy {
        Policy::in_phase(Phase::Bbr)
    }

    fn in_phase(phase: Phase) -> Policy {
        Policy(Arc::new(Mutex::new(Shared {
            phase,
            streams: Vec::new(),
            reading: false,
        })))
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.0.lock().expect("no reader panics holding it")
    }

    /// Where the session is.
    pub fn phase(&self) -> Phase {
        self.shared().phase
    }

    /// Puts `stream` under watch in the session's phase, unless the session is on BBR for good; whether
    /// it did.
    fn watch(&self, stream: &Arc<TcpStream>) -> bool {
        let mut shared = self.shared();
        if shared.phase == Phase::Bbr {
            return false;
        }
        if shared.phase == Phase::Cubic {
            let _ = SockRef::from(&**stream).set_tcp_congestion(b"cubic");
        }
        shared
            .streams
            .push((Arc::downgrade(stream), LossWatch::default()));
        if !shared.reading {
            shared.reading = true;
            let policy = self.clone();
            std::thread::spawn(move || read_counters(&policy));
        }
        true
    }
}

/// The session's reading thread: a [`pass`] every [`EVERY`] while there is something to watch.
fn read_counters(policy: &Policy) {
    loop {
        std::thread::sleep(EVERY);
        if !pass(policy, Instant::now(), &counters) {
            return;
        }
    }
}

/// Judges each watched connection still open by the counters `read` gives and moves the session (all
/// its connections) to the phase the losses call for. Whether anything is left to watch (if not, the
/// reading thread is marked stopped).
fn pass(policy: &Policy, now: Instant, read: &dyn Fn(&TcpStream) -> io::Result<Counters>) -> bool {
    let mut shared = policy.shared();
    let Shared {
        phase,
        streams,
        reading,
    } = &mut *shared;
    streams.retain(|(s, _)| s.strong_count() > 0);
    let was = *phase;
    for (s, watch) in streams.iter_mut() {
        let Some(c) = s.upgrade().and_then(|s| read(&s).ok()) else {
            continue;
        };
        if let Some(loss) = watch.judge(now, c) {
            *phase = phase.after(loss, c.min_rtt);
        }
    }
    if *phase != was {
        for s in streams.iter().filter_map(|(s, _)| s.upgrade()) {
            let _ = SockRef::from(&*s).set_tcp_congestion(phase.algorithm());
        }
    }
    if *phase == Phase::Bbr {
        streams.clear();
    }
    if streams.is_empty() {
        *reading = false;
    }
    *reading
}

/// The sending side of a data connection under a session's [`Policy`].
#[derive(Debug)]
pub struct DataStream {
    stream: Arc<TcpStream>,
    watched: bool,
}

impl DataStream {
    /// Sends on `stream` under `policy` (on the session's algorithm, watched until it is on BBR for good)
    /// where the host offers both algorithms; elsewhere on the system's choice.
    pub fn new(stream: TcpStream, policy: &Policy) -> DataStream {
        let stream = Arc::new(stream);
        let watched = policy.watch(&stream);
        DataStream { stream, watched }
    }

    /// The TCP stream.
    pub fn get_ref(&self) -> &TcpStream {
        &self.stream
    }

    /// Whether the connection was put under watch (the session was not on BBR for good).
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
            recovering: false,
        }
    }

    fn recovering(retransmitted: u32, rtt_ms: f64) -> Counters {
        Counters {
            recovering: true,
            ..at(retransmitted, rtt_ms)
        }
    }

    /// Feeds `samples` (milliseconds since the start, counters) to a new watch; its verdicts.
    fn verdicts(samples: &[(u64, Counters)]) -> Vec<Option<Loss>> {
        let start = Instant::now();
        let mut w = LossWatch::default();
        samples
            .iter()
            .map(|&(ms, c)| w.judge(start + Duration::from_millis(ms), c))
            .collect()
    }

    #[test]
    fn a_loss_with_a_full_queue_is_congestion_and_a_loss_without_one_the_paths() {
        use Loss::{Congestion, Path};
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
        let want = [
            None,
            None,
            Some(Congestion),
            Some(Congestion),
            Some(Congestion),
            None,
            Some(Path),
        ];
        assert_eq!(verdicts(&samples), want);
    }

    #[test]
    fn a_loss_read_after_the_overfilled_queue_drained_is_still_congestion() {
        use Loss::{Congestion, Path};
        // The queue was full 40 ms before the loss was read (within 4 round trips): congestion. The same
        // reading a second later, with no queue seen since, is a loss of the path's.
        let samples = [(0, at(0, 47.0)), (40, at(30, 25.0)), (1040, at(31, 25.0))];
        assert_eq!(verdicts(&samples), [None, Some(Congestion), Some(Path)]);
    }

    #[test]
    fn the_retransmissions_of_a_loss_judged_are_not_judged_again_while_it_is_recovered() {
        use Loss::{Congestion, Path};
        // The queue overfilled at 0-40 ms; its recovery retransmits for 300 ms more, long after the
        // queue drained: one loss, congestion. Once recovered, a loss at the minimum round trip is the
        // path's, and one found already recovering is judged as well (the reading before did not see it).
        let samples = [
            (0, at(0, 47.0)),
            (40, recovering(30, 46.0)),
            (140, recovering(400, 26.0)),
            (340, at(900, 25.0)),
            (1000, at(900, 24.5)),
            (1010, recovering(901, 24.5)),
            (2000, at(901, 24.5)),
            (2010, recovering(905, 24.5)),
        ];
        assert_eq!(
            verdicts(&samples),
            [
                None,
                Some(Congestion),
                None,
                None,
                None,
                Some(Path),
                None,
                Some(Path)
            ]
        );
    }

    #[test]
    fn a_connection_without_a_round_trip_yet_is_judged_by_its_losses() {
        let unknown = Counters {
            retransmitted: 1,
            rtt: Duration::ZERO,
            min_rtt: Duration::ZERO,
            recovering: false,
        };
        assert_eq!(verdicts(&[(0, unknown)]), [Some(Loss::Path)]);
    }

    #[test]
    fn the_phases_go_from_bbr_to_cubic_on_congestion_and_to_bbr_for_good_on_a_paths_loss() {
        use Loss::{Congestion, Path};
        let wan = Duration::from_millis(24);
        assert_eq!(Phase::Start.after(Congestion, wan), Phase::Cubic);
        assert_eq!(Phase::Start.after(Path, wan), Phase::Bbr);
        assert_eq!(Phase::Cubic.after(Congestion, wan), Phase::Cubic);
        assert_eq!(Phase::Cubic.after(Path, wan), Phase::Bbr);
        assert_eq!(Phase::Bbr.after(Congestion, wan), Phase::Bbr);
        assert_eq!(Phase::Bbr.after(Path, wan), Phase::Bbr);
        // A LAN stays on BBR.
        let lan = Duration::from_micros(500);
        assert_eq!(Phase::Start.after(Congestion, lan), Phase::Bbr);
    }

    #[test]
    fn a_policy_keeping_the_systems_choice_watches_nothing() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let policy = Policy::for_path(PathKind::Relay);
        let a = DataStream::new(
            TcpStream::connect(listener.local_addr().unwrap()).unwrap(),
            &policy,
        );
        assert!(!a.watched());
        assert!(!policy.shared().reading);
        assert_eq!(policy.phase(), Phase::Bbr);
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
        assert_eq!(data.watched(), adaptive());
        let want = if adaptive() { Phase::Start } else { Phase::Bbr };
        assert_eq!(policy.phase(), want);
    }

    /// The congestion control `s` runs.
    fn algorithm(s: &DataStream) -> String {
        let cc = SockRef::from(s.get_ref()).tcp_congestion().unwrap();
        String::from_utf8_lossy(&cc)
            .trim_end_matches('\0')
            .to_owned()
    }

    /// Whether the policy applies on this host; if not, says the test is skipped (which fails under CI).
    fn applies(test: &str) -> bool {
        if !adaptive() {
            ferry_testkit::skip(
                test,
                "this host's default congestion control is not bbr (or it has no cubic)",
            );
        }
        adaptive()
    }

    #[test]
    fn a_session_moves_all_its_connections_together_and_new_ones_join_its_phase() {
        if !applies("a_session_moves_all_its_connections_together_and_new_ones_join_its_phase") {
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let connect = || TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let policy = Policy::new();
        let (a, b) = (
            DataStream::new(connect(), &policy),
            DataStream::new(connect(), &policy),
        );
        assert!(a.watched() && b.watched());
        assert_eq!((algorithm(&a), algorithm(&b)), ("bbr".into(), "bbr".into()));
        let start = Instant::now();
        let a_fd = a.get_ref().as_raw_fd();
        // Feeds `a` a loss (one more retransmission each time) at `rtt_ms`; `b` nothing.
        let lost = std::cell::Cell::new(0);
        let lost = &lost;
        let a_loses = |rtt_ms: f64| {
            move |s: &TcpStream| {
                if s.as_raw_fd() == a_fd {
                    lost.set(lost.get() + 1);
                    Ok(at(lost.get(), rtt_ms))
                } else {
                    Ok(at(0, 24.1))
                }
            }
        };
        assert!(pass(&policy, start, &|_: &TcpStream| Ok(at(0, 24.1))));
        assert_eq!(policy.phase(), Phase::Start, "no loss");
        // Start-up overfilled the queue: both to CUBIC, and a new connection joins on CUBIC.
        assert!(pass(&policy, start + EVERY, &a_loses(48.0)));
        assert_eq!(policy.phase(), Phase::Cubic);
        let c = DataStream::new(connect(), &policy);
        for s in [&a, &b, &c] {
            assert_eq!(algorithm(s), "cubic");
        }
        // A loss with no queue (for 4 round trips): all to BBR for good; nothing left to watch.
        assert!(!pass(
            &policy,
            start + Duration::from_secs(1),
            &a_loses(24.2)
        ));
        assert_eq!(policy.phase(), Phase::Bbr);
        for s in [&a, &b, &c] {
            assert_eq!(algorithm(s), "bbr");
        }
        let d = DataStream::new(connect(), &policy);
        assert!(
            !d.watched(),
            "a connection joining after the move keeps the system's choice"
        );
        assert_eq!(algorithm(&d), "bbr");
    }

    #[test]
    fn the_reading_thread_ends_when_its_connections_close() {
        if !applies("the_reading_thread_ends_when_its_connections_close") {
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let policy = Policy::new();
        let a = DataStream::new(
            TcpStream::connect(listener.local_addr().unwrap()).unwrap(),
            &policy,
        );
        let (mut peer, _) = listener.accept().unwrap();
        assert!(policy.shared().reading);
        drop(a);
        // The connection closes at once (the thread holds it weakly): the peer reads its end.
        let mut buf = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut peer, &mut buf).unwrap(), 0);
        let deadline = Instant::now() + Duration::from_secs(5);
        while policy.shared().reading {
            assert!(Instant::now() < deadline, "the reading thread did not end");
            std::thread::sleep(EVERY);
        }
    }
}
