//! `ferry bench channel`: the secure channel against the raw AEAD, plain TCP, and its own targets.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ferry_channel::blocking::{self, SecureReader, SecureWriter};
use ferry_channel::{
    frame_len, Auth, Config, Established, Handshake, IdentityKey, Opener, PeerKey, Role, Sealer,
    Suite,
};

use crate::report::{gbps, interleave, median, thread_cpu, timed, xorshift, Report, Row};

/// What to run and how long.
#[derive(Clone, Debug)]
pub struct Options {
    /// Samples per case (medians are reported).
    pub runs: usize,
    /// Bytes per in-memory sample.
    pub memory_bytes: u64,
    /// Bytes per loopback TCP sample.
    pub tcp_bytes: u64,
    /// Packets per mixed-traffic sample.
    pub mixed_packets: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            runs: 5,
            memory_bytes: 1 << 30,
            tcp_bytes: 4 << 30,
            mixed_packets: 400_000,
        }
    }
}

impl Options {
    /// A short run for smoke tests: same cases, far fewer bytes.
    pub fn quick() -> Self {
        Options {
            runs: 3,
            memory_bytes: 32 << 20,
            tcp_bytes: 64 << 20,
            mixed_packets: 20_000,
        }
    }
}

const BENCH: &str = "channel";

/// Runs every channel case and reports it.
pub fn run(opts: &Options, report: &mut Report) {
    for suite in [Suite::Aes256Gcm, Suite::ChaCha20Poly1305] {
        for size in [256usize, 64 << 10, 1 << 20] {
            in_memory(opts, suite, size, report);
        }
    }
    loopback_tcp(opts, report);
    mixed_traffic(opts, report);
    handshake_time(opts, report);
}

fn suite_config(suite: Suite) -> Config {
    let mut c = Config::ferry();
    c.suites = suite.bit();
    c.aes_hardware = true;
    c
}

/// Two established sides of one in-memory handshake.
pub fn pair(config: Config, auth: impl Fn() -> Auth) -> (Established, Established) {
    let mut a = Handshake::new(Role::Initiator, config.clone(), auth());
    let mut b = Handshake::new(Role::Responder, config, auth());
    while !(a.is_done() && b.is_done()) {
        let (to_b, to_a) = (a.take_output(), b.take_output());
        b.feed(&to_b).expect("in-memory handshake");
        a.feed(&to_a).expect("in-memory handshake");
    }
    (a.finish().expect("done"), b.finish().expect("done"))
}

/// A byte count as people write it: `256 B`, `64 KiB`, `1 MiB`.
pub fn size_name(size: usize) -> String {
    match size {
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// Seal+open in place of `size`-byte packets through the channel, against aws-lc-rs sealing and opening the
/// same sizes with no framing.
fn in_memory(opts: &Options, suite: Suite, size: usize, report: &mut Report) {
    let count = (opts.memory_bytes / size as u64).max(1000);
    let (mut tx, mut rx) = pair(suite_config(suite), || Auth::Unauthenticated);
    assert_eq!(tx.suite, suite);
    let raw_alg = match suite {
        Suite::Aes256Gcm => &aead::AES_256_GCM,
        Suite::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
    };
    let raw_run = || gbps(count * size as u64, aead_seal_open(raw_alg, size, count));
    let channel_run = || seal_open_in_place(&mut tx.sealer, &mut rx.opener, size, count);
    let (base, chan) = interleave(opts.runs, raw_run, channel_run);
    report.push(
        Row::new(
            BENCH,
            format!("{} {} seal+open in memory", suite.name(), size_name(size)),
            chan,
            "GB/s",
        )
        .with_baseline(base),
    );
}

/// `count` packets of `size` bytes sealed in place and opened with `alg` straight from aws-lc-rs, no framing
/// and no network: the AEAD's CPU ceiling on one thread. The time it took.
pub fn aead_seal_open(alg: &'static aead::Algorithm, size: usize, count: u64) -> Duration {
    let key = LessSafeKey::new(UnboundKey::new(alg, &[7u8; 32]).expect("key"));
    let mut buf = vec![0x5au8; size + 16];
    timed(|| {
        for counter in 0..count {
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&counter.to_le_bytes());
            let (body, tag_out) = buf.split_at_mut(size);
            let tag = key
                .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), body)
                .expect("seal");
            tag_out.copy_from_slice(tag.as_ref());
            key.open_in_place(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut buf)
                .expect("open");
        }
    })
    .1
}

/// One sample of the channel in memory: `count` packets of `size` bytes sealed in place and opened, in GB/s of
/// contents.
pub fn seal_open_in_place(tx: &mut Sealer, rx: &mut Opener, size: usize, count: u64) -> f64 {
    let (_, t) = timed(|| {
        for _ in 0..count {
            // Seal straight into the opener's receive buffer, where a socket read would put the bytes.
            rx.reserve(frame_len(size));
            let spare = rx.spare();
            let frame = &mut spare[..frame_len(size)];
            tx.seal_frame(frame, 0).expect("seal");
            rx.commit(frame_len(size));
            match rx.next().expect("open") {
                Some(ferry_channel::Packet::Data(d)) => assert_eq!(d.len(), size),
                other => panic!("unexpected {other:?}"),
            }
        }
    });
    gbps(count * size as u64, t)
}

/// A connected pair of loopback (127.0.0.1) TCP streams with Nagle off: (client, server).
pub fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    let client = TcpStream::connect(addr).expect("connect loopback");
    let (server, _) = listener.accept().expect("accept");
    client.set_nodelay(true).ok();
    server.set_nodelay(true).ok();
    (client, server)
}

/// One sample of plain TCP: `bytes` in 1 MiB writes from one thread to another. Returns GB/s and the CPU
/// seconds of both threads.
pub fn plain_tcp(bytes: u64) -> (f64, f64) {
    let (mut tx, mut rx) = tcp_pair();
    let start = Instant::now();
    let sender = std::thread::spawn(move || {
        let cpu = thread_cpu();
        let buf = vec![0x42u8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            tx.write_all(&buf[..n]).expect("write");
            left -= n as u64;
        }
        thread_cpu() - cpu
    });
    let cpu = thread_cpu();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    while got < bytes {
        let n = rx.read(&mut buf).expect("read");
        assert!(n > 0, "plain TCP ended early");
        got += n as u64;
    }
    let recv_cpu = thread_cpu() - cpu;
    let send_cpu = sender.join().expect("sender");
    (gbps(bytes, start.elapsed()), send_cpu + recv_cpu)
}

/// One sample through the secure channel: handshake included, 1 MiB packets sealed in place. Returns GB/s
/// and the CPU seconds of both threads.
fn channel_tcp(bytes: u64) -> (f64, f64) {
    channel_tcp_measured(bytes, Config::ferry(), || Auth::Code(b"bench".to_vec()))
}

/// One sample of `bytes` over loopback TCP through one channel with `config` and `auth` on both sides, in
/// GB/s: handshake included, packets of the largest size `config` allows sealed in place, then a close.
pub fn channel_tcp_with(bytes: u64, config: Config, auth: fn() -> Auth) -> f64 {
    channel_tcp_measured(bytes, config, auth).0
}

/// [`channel_tcp_with`], also returning the CPU seconds of both threads.
fn channel_tcp_measured(bytes: u64, config: Config, auth: fn() -> Auth) -> (f64, f64) {
    let (client, server) = tcp_pair();
    let start = Instant::now();
    let copy = channel_copy(client, server, bytes, config, auth).expect("channel copy");
    assert_eq!(copy.bytes, bytes);
    (gbps(bytes, copy.end - start), copy.cpu)
}

/// What one [`channel_copy`] saw at its receiving end.
#[derive(Clone, Copy, Debug)]
pub struct ChannelCopy {
    /// Payload bytes received.
    pub bytes: u64,
    /// When the receiver's handshake (with its authentication) completed.
    pub established: Instant,
    /// When the first payload arrived (`None`: none did).
    pub first: Option<Instant>,
    /// When the channel's close arrived.
    pub end: Instant,
    /// CPU seconds of both threads.
    pub cpu: f64,
}

/// `bytes` through one channel with `config` and `auth` on both sides, from `tx` (on a thread, the
/// initiator) to `rx` (here): handshake, packets of the largest size `config` allows sealed in place, then a
/// close.
pub fn channel_copy(
    mut tx: TcpStream,
    mut rx: TcpStream,
    bytes: u64,
    config: Config,
    auth: fn() -> Auth,
) -> std::io::Result<ChannelCopy> {
    let fail = |e: ferry_channel::ChannelError| std::io::Error::other(e.to_string());
    let tx_config = config.clone();
    let sender = std::thread::spawn(move || {
        let cpu = thread_cpu();
        let hs = Handshake::new(Role::Initiator, tx_config, auth());
        let est = blocking::handshake(&mut tx, hs).map_err(fail)?;
        let mut w = SecureWriter::new(tx, est.sealer);
        let max = w.max_payload();
        let mut left = bytes;
        while left > 0 {
            let n = left.min(max as u64) as usize;
            w.payload_buf(n).map_err(fail)?;
            w.send_payload_buf(n).map_err(fail)?;
            left -= n as u64;
        }
        w.close().map_err(fail)?;
        Ok::<f64, std::io::Error>(thread_cpu() - cpu)
    });
    let cpu = thread_cpu();
    let hs = Handshake::new(Role::Responder, config, auth());
    let est = blocking::handshake(&mut rx, hs).map_err(fail)?;
    let established = Instant::now();
    let mut r = SecureReader::new(rx, est.opener);
    let (mut got, mut first) = (0u64, None);
    while let Some(p) = r.recv().map_err(fail)? {
        first.get_or_insert_with(Instant::now);
        got += p.len() as u64;
    }
    let end = Instant::now();
    let recv_cpu = thread_cpu() - cpu;
    let send_cpu = sender
        .join()
        .map_err(|_| std::io::Error::other("the channel's sender panicked"))??;
    Ok(ChannelCopy {
        bytes: got,
        established,
        first,
        end,
        cpu: send_cpu + recv_cpu,
    })
}

fn loopback_tcp(opts: &Options, report: &mut Report) {
    let (mut plain_cpu, mut chan_cpu) = (Vec::new(), Vec::new());
    let gib = opts.tcp_bytes as f64 / (1u64 << 30) as f64;
    let (plain, chan) = interleave(
        opts.runs,
        || {
            let (rate, cpu) = plain_tcp(opts.tcp_bytes);
            plain_cpu.push(cpu / gib);
            rate
        },
        || {
            let (rate, cpu) = channel_tcp(opts.tcp_bytes);
            chan_cpu.push(cpu / gib);
            rate
        },
    );
    let suite = if ferry_channel::has_aes_hardware() {
        "aes-256-gcm"
    } else {
        "chacha20-poly1305"
    };
    report.push(
        Row::new(
            BENCH,
            format!(
                "loopback TCP {} through one channel ({suite})",
                size_name(opts.tcp_bytes as usize)
            ),
            chan,
            "GB/s",
        )
        .with_baseline(plain),
    );
    // Where the time goes: with one core per side, the ratio cannot beat the CPU ratio.
    report.push(
        Row::new(
            BENCH,
            "loopback TCP, CPU seconds per GiB, both threads: channel vs plain TCP",
            median(&mut chan_cpu),
            "s",
        )
        .with_baseline(median(&mut plain_cpu)),
    );
}

/// The fixed message-size distribution of the mixed-traffic case: 99.8 % log-uniform in 30..=600 B, 0.2 %
/// uniform in 1..=100 KB, drawn from a fixed-seed xorshift so every run sees the same sizes. Mean ≈ 290 B.
pub fn mixed_sizes(count: usize) -> Vec<usize> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || xorshift(&mut state);
    (0..count)
        .map(|_| {
            let r = next();
            if r % 1000 < 2 {
                1000 + (next() % 99_001) as usize
            } else {
                let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
                (30.0 * (20.0f64).powf(u)).round() as usize
            }
        })
        .collect()
}

/// One mixed-traffic sample in one thread: seal a packet of each of `sizes` (contents from `payload`) into
/// `wire`, then open them all from 256 KiB "reads" fed to `rx`. Returns the time to seal and the time to open.
pub fn mixed_sample(
    tx: &mut Sealer,
    rx: &mut Opener,
    sizes: &[usize],
    payload: &[u8],
    wire: &mut Vec<u8>,
) -> (Duration, Duration) {
    wire.clear();
    let (_, seal_t) = timed(|| {
        for &s in sizes {
            tx.seal_into(wire, 0, &payload[..s]).expect("seal");
        }
    });
    let (opened, open_t) = timed(|| {
        let mut opened = 0usize;
        for chunk in wire.chunks(MIXED_READ) {
            let mut rest = chunk;
            while !rest.is_empty() {
                let n = rx.feed(rest);
                rest = &rest[n..];
                while let Some(ferry_channel::Packet::Data(_)) = rx.next().expect("open") {
                    opened += 1;
                }
            }
        }
        opened
    });
    assert_eq!(opened, sizes.len());
    (seal_t, open_t)
}

/// Bytes per simulated socket read in the mixed-traffic case.
pub const MIXED_READ: usize = 256 << 10;

/// BIP324-style mixed traffic on ChaCha20-Poly1305 in one thread: seal every packet into a coalescing buffer,
/// then open them all from 256 KiB "reads".
fn mixed_traffic(opts: &Options, report: &mut Report) {
    let sizes = mixed_sizes(opts.mixed_packets);
    let total: usize = sizes.iter().sum();
    let payload = vec![0x33u8; 100_000];
    let mut wire = Vec::with_capacity(total + sizes.len() * 20);
    let (mut seal_s, mut open_s, mut both_s) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..opts.runs {
        let config = Config::bip324(ferry_channel::BITCOIN_MAINNET_MAGIC);
        let (mut tx, mut rx) = pair(config, || Auth::Unauthenticated);
        let (seal_t, open_t) =
            mixed_sample(&mut tx.sealer, &mut rx.opener, &sizes, &payload, &mut wire);
        let n = sizes.len() as f64;
        seal_s.push(n / seal_t.as_secs_f64() / 1e6);
        open_s.push(n / open_t.as_secs_f64() / 1e6);
        both_s.push(n / (seal_t + open_t).as_secs_f64() / 1e6);
    }
    let mean = total as f64 / sizes.len() as f64;
    let both = median(&mut both_s);
    report.push(Row::new(
        BENCH,
        "mixed traffic chacha20 seal+open, one thread",
        both,
        "Mpkt/s",
    ));
    report.push(Row::new(
        BENCH,
        "mixed traffic chacha20 seal only",
        median(&mut seal_s),
        "Mpkt/s",
    ));
    report.push(Row::new(
        BENCH,
        "mixed traffic chacha20 open only",
        median(&mut open_s),
        "Mpkt/s",
    ));
    report.push(Row::new(
        BENCH,
        format!("mixed traffic goodput (mean {mean:.0} B), seal+open"),
        both * 1e6 * mean / 1e9,
        "GB/s",
    ));
}

/// Makes the authentication of one side of a handshake.
type AuthFactory = Box<dyn Fn() -> Auth>;

/// Both sides of an in-memory handshake, ECDH and HKDF included.
fn handshake_time(opts: &Options, report: &mut Report) {
    let iterations = 200 * opts.runs;
    let identity = IdentityKey::generate();
    let seed = *identity.seed();
    let public = identity.public();
    let cases: [(&str, AuthFactory); 3] = [
        (
            "handshake, key agreement only (both sides)",
            Box::new(|| Auth::Unauthenticated),
        ),
        (
            "handshake + SPAKE2 code (both sides)",
            Box::new(|| Auth::Code(b"7-amber-otter-violin".to_vec())),
        ),
        (
            "handshake + Ed25519 identity (both sides)",
            Box::new(move || Auth::Identity {
                key: IdentityKey::from_seed(seed),
                peer: PeerKey::Pinned(public),
            }),
        ),
    ];
    for (name, auth) in cases {
        let mut samples: Vec<f64> = (0..iterations)
            .map(|_| {
                let (_, t) = timed(|| pair(Config::ferry(), &auth));
                t.as_secs_f64() * 1e6
            })
            .collect();
        report.push(Row::new(BENCH, name, median(&mut samples), "µs"));
    }
}
