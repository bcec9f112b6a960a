//! The delay line: a user-space forwarder between two tun devices that models one link.
//!
//! Each direction is one thread and one FIFO. A packet read from one end is, in this order:
//! 1. dropped with probability [`LinkSpec::loss`] (independent, uniform: random loss, not bursts);
//! 2. put on the wire behind the packets already queued: its transmission ends `len * 8 / rate`
//!    after the previous one's (or after now, when the wire is idle) — this is the bottleneck's
//!    serialisation, the emulator's own token bucket with a bucket of one packet;
//! 3. dropped if the queue before the wire already holds more than [`LinkSpec::queue_bytes`]
//!    (a drop-tail bottleneck buffer, as in a router);
//! 4. written to the other end one-way delay (RTT / 2) after its transmission ends.
//!
//! Packets are IP packets of at most the device MTU (1500: no offloads reach the tun, see
//! [`crate::tun`]), so the rate counts IP bytes: a TCP stream with timestamps carries at most
//! 1448/1500 = 0.965 of it as payload. Not modelled: link-layer framing, reordering, jitter,
//! bursty loss, asymmetric links.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What one emulated link does to the packets crossing it (both directions alike).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkSpec {
    /// The wire's rate in bits per second (IP bytes).
    pub rate_bps: u64,
    /// Round-trip time added by the link (half each way).
    pub rtt: Duration,
    /// Fraction of packets dropped at random, 0.0-1.0.
    pub loss: f64,
    /// The bottleneck buffer in bytes; `None`: one bandwidth-delay product, at least 128 KiB.
    pub queue_bytes: Option<u64>,
}

impl LinkSpec {
    /// The bottleneck buffer this link has.
    pub fn queue(&self) -> u64 {
        self.queue_bytes
            .unwrap_or_else(|| (self.bdp_bytes()).max(128 << 10))
    }

    /// The bandwidth-delay product in bytes.
    pub fn bdp_bytes(&self) -> u64 {
        (self.rate_bps as f64 / 8.0 * self.rtt.as_secs_f64()) as u64
    }

    /// The same link with every delay halved: each of two hops in series.
    pub fn half_rtt(self) -> LinkSpec {
        LinkSpec {
            rtt: self.rtt / 2,
            ..self
        }
    }
}

/// What one direction of a link did so far.
#[derive(Debug, Default)]
pub struct DirectionStats {
    /// Packets delivered to the other end.
    pub packets: AtomicU64,
    /// IP bytes delivered.
    pub bytes: AtomicU64,
    /// Packets dropped at random ([`LinkSpec::loss`]).
    pub lost: AtomicU64,
    /// Packets dropped because the bottleneck buffer was full.
    pub overflowed: AtomicU64,
    /// Packets the other end refused (its queue full, or it went down).
    pub write_errors: AtomicU64,
}

/// A running link between two tun devices; dropping it stops the forwarding.
pub struct Link {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    stats: [Arc<DirectionStats>; 2],
}

impl Link {
    /// Starts forwarding between `a` and `b` (two tun queues) as `spec` says; `seed` drives the loss.
    pub(crate) fn start(a: File, b: File, spec: LinkSpec, seed: u64) -> io::Result<Link> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = [
            Arc::new(DirectionStats::default()),
            Arc::new(DirectionStats::default()),
        ];
        let (a, b) = (Arc::new(a), Arc::new(b));
        let mut threads = Vec::new();
        for (i, (from, to)) in [(a.clone(), b.clone()), (b, a)].into_iter().enumerate() {
            let line = DelayLine {
                spec,
                from,
                to,
                stop: stop.clone(),
                stats: stats[i].clone(),
                seed: seed
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .wrapping_add(i as u64)
                    | 1,
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("ferry-lab-link-{i}"))
                    .spawn(move || line.run())?,
            );
        }
        Ok(Link {
            stop,
            threads,
            stats,
        })
    }

    /// The counters of the direction from the first end to the second (`0`) or back (`1`).
    pub fn stats(&self, direction: usize) -> &DirectionStats {
        &self.stats[direction]
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One direction of a link.
struct DelayLine {
    spec: LinkSpec,
    from: Arc<File>,
    to: Arc<File>,
    stop: Arc<AtomicBool>,
    stats: Arc<DirectionStats>,
    seed: u64,
}

/// A packet on its way: its bytes and when it reaches the other end.
struct InFlight {
    due: Instant,
    packet: Vec<u8>,
}

/// The longest the loop sleeps with nothing to deliver, so that it notices [`Link`]'s drop.
const IDLE_WAIT: Duration = Duration::from_millis(50);

impl DelayLine {
    fn run(self) {
        let DelayLine {
            spec,
            from,
            to,
            stop,
            stats,
            mut seed,
        } = self;
        let (mut from, mut to): (&File, &File) = (&from, &to);
        // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack; it reads no memory. The
        // default 50 µs slack added that much to every hold, measurable against a LAN's 0.25 ms.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        realtime_priority();
        let one_way = spec.rtt / 2;
        let ns_per_byte = 8e9 / spec.rate_bps.max(1) as f64;
        let queue_time = Duration::from_nanos((spec.queue() as f64 * ns_per_byte) as u64);
        let loss_threshold = (spec.loss.clamp(0.0, 1.0) * u64::MAX as f64) as u64;
        let mut wire_free = Instant::now();
        let mut line: VecDeque<InFlight> = VecDeque::new();
        let mut spare: Vec<Vec<u8>> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            // Everything the sending end has queued, stamped as it is read.
            loop {
                let mut buf = spare.pop().unwrap_or_default();
                buf.resize(65536, 0);
                let n = match from.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        spare.push(buf);
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    // The device went away: the lab is being torn down.
                    Err(_) => return,
                };
                buf.truncate(n);
                if loss_threshold > 0 && next_random(&mut seed) < loss_threshold {
                    stats.lost.fetch_add(1, Ordering::Relaxed);
                    spare.push(buf);
                    continue;
                }
                let now = Instant::now();
                let start = wire_free.max(now);
                if start.duration_since(now) > queue_time {
                    stats.overflowed.fetch_add(1, Ordering::Relaxed);
                    spare.push(buf);
                    continue;
                }
                wire_free = start + Duration::from_nanos((n as f64 * ns_per_byte) as u64);
                line.push_back(InFlight {
                    due: wire_free + one_way,
                    packet: buf,
                });
            }
            // Everything due, in order.
            let now = Instant::now();
            while line.front().is_some_and(|p| p.due <= now) {
                let p = line.pop_front().expect("a packet");
                match to.write(&p.packet) {
                    Ok(_) => {
                        stats.packets.fetch_add(1, Ordering::Relaxed);
                        stats
                            .bytes
                            .fetch_add(p.packet.len() as u64, Ordering::Relaxed);
                    }
                    Err(_) => {
                        stats.write_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                spare.push(p.packet);
            }
            let wait = line
                .front()
                .map_or(IDLE_WAIT, |p| p.due.saturating_duration_since(now));
            wait_readable(from, wait.min(IDLE_WAIT));
        }
    }
}

/// Moves the calling thread to SCHED_FIFO (priority 10) where allowed (root), so that a wake-up is
/// not delayed by a slice of whatever else runs: on a loaded machine (a build beside the benchmark) a
/// normal thread's wake-up came up to ~12 ms late, which a delay line cannot tolerate. The thread
/// sleeps in ppoll between packets, so it never holds a core; where the change is refused, the thread
/// stays as it was.
fn realtime_priority() {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: `param` is a valid sched_param alive across the call; pthread_self() is this thread.
    unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
}

/// Waits until `file` has something to read or `timeout` passes (nanosecond timer, so that a
/// 0.25 ms one-way delay is held as such, not rounded to a millisecond).
fn wait_readable(file: &File, timeout: Duration) {
    let mut fds = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` is one valid pollfd and `ts` a valid timespec, both alive across the call; a
    // null signal mask leaves the mask alone. poll(2) only takes milliseconds, which would round
    // a LAN's 0.25 ms one-way delay up fourfold.
    unsafe { libc::ppoll(&mut fds, 1, &ts, std::ptr::null()) };
}

/// xorshift64: the link's loss decisions, reproducible from the seed.
fn next_random(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    /// A link between two datagram socket pairs (message boundaries kept, as a tun's): the far ends
    /// stand for the two namespaces. No root needed.
    fn link(spec: LinkSpec) -> (UnixDatagram, UnixDatagram, Link) {
        let (a_out, a_in) = UnixDatagram::pair().unwrap();
        let (b_out, b_in) = UnixDatagram::pair().unwrap();
        for s in [&a_in, &b_in] {
            s.set_nonblocking(true).unwrap();
        }
        let file = |s: UnixDatagram| File::from(std::os::fd::OwnedFd::from(s));
        let link = Link::start(file(a_in), file(b_in), spec, 7).unwrap();
        (a_out, b_out, link)
    }

    fn spec(rate_bps: u64, rtt_ms: u64, loss: f64) -> LinkSpec {
        LinkSpec {
            rate_bps,
            rtt: Duration::from_millis(rtt_ms),
            loss,
            queue_bytes: None,
        }
    }

    #[test]
    fn packets_arrive_in_order_never_before_the_delay_and_the_rate_allow() {
        // 1000-byte packets at 8 Mbit/s: 1 ms each on the wire; 20 ms one way.
        let (a, b, link) = link(spec(8_000_000, 40, 0.0));
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let t0 = Instant::now();
        for i in 0..50u8 {
            a.send(&[i; 1000]).unwrap();
        }
        let mut buf = [0u8; 2000];
        for i in 0..50u8 {
            let n = b.recv(&mut buf).unwrap();
            assert_eq!((n, buf[0]), (1000, i), "whole packets, in order");
            let earliest = Duration::from_millis(20) + Duration::from_millis(i as u64 + 1);
            assert!(
                t0.elapsed() >= earliest,
                "packet {i} came early: {:?}",
                t0.elapsed()
            );
        }
        // Generous: a loaded machine may be late, not this late.
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert_eq!(counted(&link.stats(0).packets, 50), 50);
        assert_eq!(counted(&link.stats(0).bytes, 50_000), 50_000);
        // And back the other way.
        b.send(b"ack").unwrap();
        a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(a.recv(&mut buf).unwrap(), 3);
        assert_eq!(counted(&link.stats(1).packets, 1), 1);
    }

    /// `counter` once it reached `want` or after 2 s: the line counts a packet just after handing it on, so
    /// the receiver may have it a moment before it is counted.
    fn counted(counter: &AtomicU64, want: u64) -> u64 {
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            let n = counter.load(Ordering::Relaxed);
            if n >= want || Instant::now() >= until {
                return n;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn loss_drops_about_its_share() {
        let (a, b, link) = link(spec(1_000_000_000, 0, 0.1));
        b.set_nonblocking(true).unwrap();
        for _ in 0..2000 {
            a.send(&[0; 100]).unwrap();
            // Keep the far end's buffer from filling: read what has come through.
            while b.recv(&mut [0u8; 200]).is_ok() {}
        }
        // Every packet read meets one fate: lost (decided first, independently), dropped at a full queue,
        // not written (a far end a loaded test thread did not drain in time), or forwarded.
        let s = link.stats(0);
        let fates = || {
            [&s.packets, &s.lost, &s.overflowed, &s.write_errors]
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .sum::<u64>()
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while fates() < 2000 && Instant::now() < deadline {
            while b.recv(&mut [0u8; 200]).is_ok() {}
            std::thread::sleep(Duration::from_millis(5));
        }
        let lost = s.lost.load(Ordering::Relaxed);
        assert_eq!(fates(), 2000);
        assert!(
            (120..=280).contains(&lost),
            "10 % of 2000 configured, {lost} lost"
        );
    }

    #[test]
    fn a_full_bottleneck_buffer_drops_the_tail() {
        // 1 Mbit/s with a 10 kB buffer: a burst of 50 kB cannot all wait.
        let mut slow = spec(1_000_000, 0, 0.0);
        slow.queue_bytes = Some(10_000);
        let (a, _b, link) = link(slow);
        for _ in 0..50 {
            a.send(&[0; 1000]).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let s = link.stats(0);
        while s.overflowed.load(Ordering::Relaxed) + s.packets.load(Ordering::Relaxed) < 50
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let dropped = s.overflowed.load(Ordering::Relaxed);
        assert!(
            (30..=40).contains(&dropped),
            "{dropped} of 50 dropped at a 10-packet buffer"
        );
    }

    #[test]
    fn queue_defaults_to_one_bdp_with_a_floor() {
        let wan = LinkSpec {
            rate_bps: 500_000_000,
            rtt: Duration::from_millis(24),
            loss: 0.0,
            queue_bytes: None,
        };
        assert_eq!(wan.bdp_bytes(), 1_500_000);
        assert_eq!(wan.queue(), 1_500_000);
        let lan = LinkSpec {
            rate_bps: 1_000_000_000,
            rtt: Duration::from_micros(500),
            ..wan
        };
        assert_eq!(lan.queue(), 128 << 10);
        assert_eq!(wan.half_rtt().rtt, Duration::from_millis(12));
    }
}
