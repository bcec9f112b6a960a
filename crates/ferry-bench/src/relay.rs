//! The relay benchmark behind `ferry bench relay`.
//!
//! Everything runs in this process on 127.0.0.1. The relay under test runs on its own thread
//! with a single-threaded tokio runtime, so every instruction the relay executes (accept,
//! pairing, forwarding, timers) runs on that one thread, and `getrusage(RUSAGE_THREAD)` taken on
//! it before and after is exactly the relay's CPU (user + system, which is where splice works).
//!
//! Cases:
//! - **throughput**: [`BenchOptions::bytes`] from one peer to the other through the relay
//!   (splice, then copy), against the same bytes over a direct loopback TCP connection,
//!   interleaved per run (direct, splice, copy), medians over [`BenchOptions::runs`].
//! - **CPU per GiB**: the relay thread's CPU for each relayed transfer, scaled to 1 GiB. On
//!   loopback this figure is not the relay's own work alone: a loopback transmit runs the
//!   receiving socket's whole TCP input path (and the ACKs it triggers, and the transmits those
//!   ACKs release) in softirq on the sending thread. The relay thread therefore pays for part of
//!   the peers' TCP work, and the peers' threads pay for part of the relay's.
//! - **whole-process CPU per GiB and the marginal cost of relaying**: the CPU of every thread of
//!   this process (sender, receiver and relay all live here) plus the kernel's `ksoftirqd`
//!   threads, over the transfer, for the direct and for each relayed transfer. Relayed minus
//!   direct is what relaying adds to the machine, however the kernel distributes it between
//!   threads. (Whole-machine `/proc/stat` would also count the other tenants of a shared machine.)
//! - **pairing latency**: from a client's `connect` until it reads the first byte of the other
//!   side, which is already there: a receiver waiting at the relay (the direct pairing), or a
//!   [`Listener`] (announcement, the listener's data connection, then the same pairing).
//!   Interleaved per round, medians over [`BenchOptions::pairings`] rounds.
//! - **many sessions**: [`BenchOptions::sessions`] sessions held open at once (all senders
//!   waiting, then all receivers paired, then each exchanges a small message both ways). Memory
//!   is the whole process's (relay and clients share it), so it is an upper bound on the relay's.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use ferry_relay::protocol::Hello;
use ferry_relay::{connect, Forwarding, Listener, Relay, RelayConfig, RelayHandle, Role, Stats};

use crate::report::{median, rusage_cpu, thread_cpu, Row};

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Bytes per throughput transfer. Default: 1 GiB.
    pub bytes: u64,
    /// Interleaved runs per throughput case; medians are reported. Default: 5.
    pub runs: usize,
    /// Concurrent sessions in the many-sessions case. Default: 1000.
    pub sessions: usize,
    /// Bytes each side sends in one of the many sessions. Default: 4 KiB.
    pub session_bytes: usize,
    /// The relay's [`RelayConfig::buffer_size`]. Default: the config's default.
    pub buffer_size: usize,
    /// Rounds of the pairing-latency case (one direct and one listener pairing each). Default: 200.
    pub pairings: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            bytes: 1 << 30,
            runs: 5,
            sessions: 1000,
            session_bytes: 4096,
            buffer_size: RelayConfig::default().buffer_size,
            pairings: 200,
        }
    }
}

/// A row of this benchmark.
fn row(case: impl Into<String>, value: f64, unit: &str, baseline: Option<f64>) -> Row {
    let r = Row::new("relay", case, value, unit);
    match baseline {
        Some(b) => r.with_baseline(b),
        None => r,
    }
}

/// Runs every case and returns its rows. Sends traffic to 127.0.0.1 only.
pub fn run(opts: &BenchOptions) -> io::Result<Vec<Row>> {
    let per_gib = (1u64 << 30) as f64 / opts.bytes as f64;
    let mut direct = Vec::new();
    let mut relayed = [Vec::new(), Vec::new()];
    let modes = [Forwarding::Splice, Forwarding::Copy];
    for _ in 0..opts.runs.max(1) {
        direct.push(direct_transfer(opts.bytes)?);
        for (i, mode) in modes.into_iter().enumerate() {
            relayed[i].push(relayed_transfer(opts.bytes, mode, opts.buffer_size)?);
        }
    }
    // Medians per column; each sample scaled to 1 GiB.
    let med =
        |v: &[Sample], f: fn(&Sample) -> f64| median(&mut v.iter().map(f).collect::<Vec<_>>());
    let base = med(&direct, |s| s.rate);
    let base_total = med(&direct, |s| s.total_cpu) * per_gib;
    let cc = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let mut rows = vec![
        row(format!("direct loopback TCP (cc {cc})"), base, "GB/s", None),
        // What one loopback TCP hop costs both its ends (copies + stack), for scale: the relay
        // terminates one hop and originates another, minus the two copies.
        row(
            "direct: sender + receiver CPU per GiB (reference)",
            med(&direct, |s| s.endpoint_cpu) * per_gib,
            "s/GiB",
            None,
        ),
        row(
            "direct: whole-process + ksoftirqd CPU per GiB",
            base_total,
            "s/GiB",
            None,
        ),
    ];
    for (i, name) in ["splice", "copy"].into_iter().enumerate() {
        let v = &relayed[i];
        rows.push(row(
            format!("through relay ({name})"),
            med(v, |s| s.rate),
            "GB/s",
            Some(base),
        ));
        rows.push(row(
            format!("relay thread CPU per GiB ({name})"),
            med(v, |s| s.relay_cpu) * per_gib,
            "s/GiB",
            None,
        ));
        rows.push(row(
            format!("relayed: sender + receiver CPU per GiB ({name})"),
            med(v, |s| s.endpoint_cpu) * per_gib,
            "s/GiB",
            None,
        ));
        rows.push(row(
            format!("relayed: whole-process + ksoftirqd CPU per GiB ({name})"),
            med(v, |s| s.total_cpu) * per_gib,
            "s/GiB",
            None,
        ));
        // Median of the per-run differences would pair runs arbitrarily; the difference of the
        // medians is the plain reading of the two rows above.
        rows.push(row(
            format!("marginal CPU of relaying per GiB, relayed - direct ({name})"),
            med(v, |s| s.total_cpu) * per_gib - base_total,
            "s/GiB",
            None,
        ));
    }
    rows.extend(pairing_latency(opts.pairings)?);
    rows.extend(many_sessions(opts.sessions, opts.session_bytes)?);
    Ok(rows)
}

/// The pairing-latency case: direct pairing against the listener path, interleaved.
fn pairing_latency(rounds: usize) -> io::Result<Vec<Row>> {
    let relay = BenchRelay::start(bench_config(Forwarding::Splice))?;
    let addr = relay.addr;
    let wait = Duration::from_secs(20);
    let listened = session_hash(usize::MAX);
    let listener = Arc::new(Listener::register(addr, &[listened], wait).map_err(io::Error::other)?);
    let server = {
        let listener = listener.clone();
        thread::spawn(move || {
            while let Ok((mut s, _)) = listener.accept() {
                // Greet, then hold the session until the client hangs up.
                if s.write_all(&[1]).is_ok() {
                    let _ = s.read(&mut [0u8; 1]);
                }
            }
        })
    };
    let first_byte = |mut s: TcpStream| -> io::Result<()> { s.read_exact(&mut [0u8; 1]) };
    let (mut direct, mut listening) = (Vec::new(), Vec::new());
    for i in 0..rounds.max(1) {
        // The receiver is registered (WAITING read) before the clock starts.
        let h = session_hash(1_000_000 + i);
        let mut waiting = TcpStream::connect(addr)?;
        waiting.write_all(
            &Hello {
                role: Role::Receiver,
                hash: h,
            }
            .encode(),
        )?;
        waiting.read_exact(&mut [0u8; 1])?;
        let t0 = Instant::now();
        let s = connect(addr, Role::Sender, h, wait).map_err(io::Error::other)?;
        waiting.read_exact(&mut [0u8; 1])?;
        waiting.write_all(&[1])?;
        first_byte(s)?;
        direct.push(t0.elapsed().as_secs_f64() * 1e6);
        drop(waiting);

        let t0 = Instant::now();
        let s = connect(addr, Role::Receiver, listened, wait).map_err(io::Error::other)?;
        first_byte(s)?;
        listening.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    listener.close();
    let _ = server.join();
    relay.stop()?;
    let base = median(&mut direct);
    Ok(vec![
        row("pairing latency, direct (peer waiting)", base, "us", None),
        row(
            "pairing latency, through a listener",
            median(&mut listening),
            "us",
            Some(base),
        ),
    ])
}

/// A relay on its own thread and single-threaded runtime; joining yields its CPU seconds.
struct BenchRelay {
    addr: SocketAddr,
    handle: RelayHandle,
    thread: JoinHandle<io::Result<(Stats, f64)>>,
}

impl BenchRelay {
    fn start(config: RelayConfig) -> io::Result<BenchRelay> {
        let relay = Relay::bind("127.0.0.1:0", config)?;
        let (addr, handle) = (relay.local_addr(), relay.shutdown_handle());
        let thread = thread::Builder::new()
            .name("bench-relay".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let t0 = thread_cpu();
                let stats = rt.block_on(relay.run())?;
                Ok((stats, thread_cpu() - t0))
            })?;
        Ok(BenchRelay {
            addr,
            handle,
            thread,
        })
    }

    fn stop(self) -> io::Result<(Stats, f64)> {
        self.handle.shutdown();
        self.thread
            .join()
            .map_err(|_| io::Error::other("relay thread panicked"))?
    }
}

/// CPU seconds (user + system) of every thread of this process plus the kernel's softirq
/// threads: the whole cost of a transfer whose three parties all live in this process, as long
/// as no other work of this process runs meanwhile.
fn process_cpu() -> f64 {
    rusage_cpu(libc::RUSAGE_SELF) + ksoftirqd_cpu()
}

/// CPU seconds of all `ksoftirqd/N` threads (softirq work the kernel deferred off the threads
/// that raised it), from `/proc/<pid>/stat`; 0 where unreadable. Clock-tick resolution.
fn ksoftirqd_cpu() -> f64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    let mut ticks = 0u64;
    for entry in dir.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": fields after the comm's closing parenthesis.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if !head.contains("(ksoftirqd/") {
            continue;
        }
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the comm.
        if let (Some(u), Some(s)) = (f.get(11), f.get(12)) {
            ticks += u.parse::<u64>().unwrap_or(0) + s.parse::<u64>().unwrap_or(0);
        }
    }
    ticks as f64 / hz
}

fn bench_config(forwarding: Forwarding) -> RelayConfig {
    RelayConfig {
        forwarding,
        print_stats: false,
        max_sessions: 100_000,
        max_handshakes: 100_000,
        max_handshakes_per_ip: 100_000,
        max_sessions_per_ip: 200_000,
        max_listeners_per_ip: 100_000,
        sessions_per_ip_per_minute: 1_000_000,
        shutdown_grace: Duration::from_secs(1),
        ..RelayConfig::default()
    }
}

/// Writes `bytes` from a 1 MiB buffer, then half-closes; returns the thread's CPU seconds.
fn pump(mut s: TcpStream, bytes: u64) -> io::Result<f64> {
    let t0 = thread_cpu();
    let buf = vec![0x5au8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        s.write_all(&buf[..n])?;
        left -= n as u64;
    }
    s.shutdown(Shutdown::Write)?;
    Ok(thread_cpu() - t0)
}

/// Reads to end of stream; returns the byte count and the thread's CPU seconds.
fn drain(mut s: TcpStream) -> io::Result<(u64, f64)> {
    let t0 = thread_cpu();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        match s.read(&mut buf)? {
            0 => return Ok((total, thread_cpu() - t0)),
            n => total += n as u64,
        }
    }
}

/// One measured transfer.
struct Sample {
    /// GB/s.
    rate: f64,
    /// CPU seconds of the sending and receiving threads.
    endpoint_cpu: f64,
    /// CPU seconds of the whole process and ksoftirqd over the transfer.
    total_cpu: f64,
    /// CPU seconds of the relay's thread (0 for a direct transfer).
    relay_cpu: f64,
}

/// Returns (GB/s, sending + receiving threads' CPU seconds, whole-process + ksoftirqd CPU).
fn timed_transfer(tx: TcpStream, rx: TcpStream, bytes: u64) -> io::Result<(f64, f64, f64)> {
    let p0 = process_cpu();
    let t0 = Instant::now();
    let sender = thread::spawn(move || pump(tx, bytes));
    let (got, rx_cpu) = drain(rx)?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = sender
        .join()
        .map_err(|_| io::Error::other("sender panicked"))??;
    let total = process_cpu() - p0;
    if got != bytes {
        return Err(io::Error::other(format!("received {got} of {bytes} bytes")));
    }
    Ok((bytes as f64 / secs / 1e9, cpu + rx_cpu, total))
}

fn direct_transfer(bytes: u64) -> io::Result<Sample> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let tx = TcpStream::connect(listener.local_addr()?)?;
    let (rx, _) = listener.accept()?;
    let (rate, endpoint_cpu, total_cpu) = timed_transfer(tx, rx, bytes)?;
    Ok(Sample {
        rate,
        endpoint_cpu,
        total_cpu,
        relay_cpu: 0.0,
    })
}

/// One transfer through a fresh relay.
fn relayed_transfer(bytes: u64, mode: Forwarding, buffer_size: usize) -> io::Result<Sample> {
    let relay = BenchRelay::start(RelayConfig {
        buffer_size,
        ..bench_config(mode)
    })?;
    let addr = relay.addr;
    let hash = [0xb5; 32];
    let t = Duration::from_secs(30);
    let rx = thread::spawn(move || connect(addr, Role::Receiver, hash, t));
    let tx = connect(addr, Role::Sender, hash, t).map_err(io::Error::other)?;
    let rx = rx
        .join()
        .map_err(|_| io::Error::other("receiver panicked"))?
        .map_err(io::Error::other)?;
    let (rate, endpoint_cpu, total_cpu) = timed_transfer(tx, rx, bytes)?;
    let (stats, relay_cpu) = relay.stop()?;
    if stats.bytes_forwarded != bytes {
        return Err(io::Error::other("relay byte count mismatch"));
    }
    Ok(Sample {
        rate,
        endpoint_cpu,
        total_cpu,
        relay_cpu,
    })
}

/// Async client hello for the many-sessions case (2,000 blocking threads would measure the
/// scheduler, not the relay). Returns the stream once PAIRED.
async fn async_pair(
    addr: SocketAddr,
    role: Role,
    hash: [u8; 32],
    registered: Option<tokio::sync::mpsc::Sender<()>>,
) -> io::Result<tokio::net::TcpStream> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(&Hello { role, hash }.encode()).await?;
    loop {
        match s.read_u8().await? {
            0 => {
                if let Some(r) = &registered {
                    let _ = r.send(()).await;
                }
            }
            1 => return Ok(s),
            e => return Err(io::Error::other(format!("relay status {e}"))),
        }
    }
}

async fn exchange(mut s: tokio::net::TcpStream, fill: u8, len: usize, peer: u8) -> io::Result<()> {
    let (mut r, mut w) = s.split();
    let out = vec![fill; len];
    let write = async {
        w.write_all(&out).await?;
        w.shutdown().await
    };
    let read = async {
        let mut got = Vec::with_capacity(len);
        r.read_to_end(&mut got).await?;
        if got.len() == len && got.iter().all(|b| *b == peer) {
            Ok(())
        } else {
            Err(io::Error::other("session data mismatch"))
        }
    };
    tokio::try_join!(write, read)?;
    Ok(())
}

fn many_sessions(sessions: usize, len: usize) -> io::Result<Vec<Row>> {
    let limit = ferry_relay::raise_nofile_limit();
    // Per session: two client sockets, two relay sockets, two pipes (four descriptors).
    let sessions = sessions.min((limit.saturating_sub(256) / 8) as usize);
    let rss0 = proc_status_kib("VmRSS:");
    let relay = BenchRelay::start(bench_config(Forwarding::Splice))?;
    let addr = relay.addr;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let t0 = Instant::now();
    let (ok, peak_rss) = rt.block_on(async move {
        let (reg_tx, mut reg_rx) = tokio::sync::mpsc::channel(sessions.max(1));
        let mut tasks = Vec::with_capacity(sessions * 2);
        for i in 0..sessions {
            let hash = session_hash(i);
            let reg = reg_tx.clone();
            tasks.push(tokio::spawn(async move {
                let s = async_pair(addr, Role::Sender, hash, Some(reg)).await?;
                exchange(s, 1, len, 2).await
            }));
        }
        drop(reg_tx);
        // Every sender is waiting before any receiver arrives: all sessions exist at once.
        for _ in 0..sessions {
            reg_rx.recv().await;
        }
        let (held_tx, held_rx) = tokio::sync::watch::channel(false);
        let mut paired = Vec::with_capacity(sessions);
        for i in 0..sessions {
            let hash = session_hash(i);
            let (ptx, prx) = tokio::sync::oneshot::channel::<()>();
            paired.push(prx);
            let mut held = held_rx.clone();
            tasks.push(tokio::spawn(async move {
                let s = async_pair(addr, Role::Receiver, hash, None).await;
                let _ = ptx.send(());
                let s = s?;
                // Hold every session open until all are paired, then exchange.
                let _ = held.wait_for(|h| *h).await;
                exchange(s, 2, len, 1).await
            }));
        }
        for p in paired {
            let _ = p.await;
        }
        let peak = proc_status_kib("VmRSS:");
        held_tx.send_replace(true);
        let mut ok = 0usize;
        for t in tasks {
            if matches!(t.await, Ok(Ok(()))) {
                ok += 1;
            }
        }
        (ok / 2, peak)
    });
    let wall = t0.elapsed().as_secs_f64();
    drop(rt);
    let (stats, cpu) = relay.stop()?;
    let hwm = proc_status_kib("VmHWM:");
    let n = sessions as f64;
    Ok(vec![
        row(
            format!("{sessions} concurrent sessions completed"),
            ok as f64,
            "sessions",
            Some(n),
        ),
        row(
            format!("{sessions} sessions: paired by relay"),
            stats.paired_total as f64,
            "sessions",
            Some(n),
        ),
        row(format!("{sessions} sessions: wall time"), wall, "s", None),
        row(format!("{sessions} sessions: relay CPU"), cpu, "s", None),
        row(
            format!("{sessions} sessions: process RSS growth at peak (relay + clients)"),
            (peak_rss - rss0) as f64 / 1024.0,
            "MiB",
            None,
        ),
        row(
            "process VmHWM after all cases (relay + clients)",
            hwm as f64 / 1024.0,
            "MiB",
            None,
        ),
    ])
}

fn session_hash(i: usize) -> [u8; 32] {
    let mut h = [0x33u8; 32];
    h[..8].copy_from_slice(&(i as u64).to_le_bytes());
    h
}

/// A `kB` field of /proc/self/status, in KiB (0 if unreadable).
fn proc_status_kib(field: &str) -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}
