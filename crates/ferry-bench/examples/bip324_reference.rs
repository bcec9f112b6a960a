//! ferry's BIP324 mode side by side with the rust-bitcoin `bip324` crate, the reference implementation in Rust.
//!
//! ```text
//! cargo run --release -p ferry-bench --example bip324_reference -- [--json] [--quick] [--runs N]
//! ```
//!
//! Runs the ChaCha20-Poly1305 cases of `ferry bench channel` with both implementations in the same process,
//! interleaved A/B (bip324, ferry, bip324, ferry, ...), and reports medians. In every row `value` is ferry
//! (`Config::bip324(BITCOIN_MAINNET_MAGIC)`, `Auth::Unauthenticated`: the same protocol on the wire) and
//! `baseline` is the `bip324` crate. `ratio` is ferry / bip324 for rates (`[ferry/bip324]` in the case name)
//! and bip324 / ferry for times (`[bip324/ferry]`), so above 1 always means ferry is faster.
//!
//! Before measuring, the two implementations talk to each other in memory, in both roles: a full handshake
//! (garbage and decoys both ways) that must agree on the session id, then packets of many sizes both ways
//! across several rekeys, each opened by the other implementation. A disagreement aborts the run.
//!
//! How the `bip324` crate is driven, through its public API only:
//! - in memory and mixed traffic: `CipherSession` from an in-memory `Handshake`; `outbound().encrypt` copies
//!   the contents into the packet buffer (the crate has no seal-in-place), `inbound().decrypt_in_place` opens;
//! - loopback TCP: its own blocking `io::Protocol` over a `BufReader`, as its documentation advises;
//! - handshake: `Handshake::new` (which draws the key and builds a secp256k1 context) through
//!   `receive_version`, with the caller's garbage drawn from the same CSPRNG that ferry uses.
//!
//! The `bip324` crate is a dev-dependency of ferry-bench only; it is never in ferry's own path.

use std::io::BufReader;
use std::time::{Duration, Instant};

use bip324::io::{Payload, Protocol};
use bip324::{
    CipherSession, GarbageResult, Initialized, OutboundCipher, PacketType, ReceivedKey,
    SentVersion, VersionResult, NUM_LENGTH_BYTES,
};
use ferry_bench::channel::{
    channel_tcp_with, mixed_sample, mixed_sizes, pair, seal_open_in_place, size_name, tcp_pair,
    Options, MIXED_READ,
};
use ferry_bench::report::{gbps, interleave, median, timed};
use ferry_bench::{Report, Row};
use ferry_channel::{Auth, Config, Handshake, Packet, Role, BITCOIN_MAINNET_MAGIC};

const BENCH: &str = "bip324";
const MAGIC: [u8; 4] = BITCOIN_MAINNET_MAGIC;
/// Garbage each side sends in the timed handshakes: about the mean of BIP324's uniform 0..=4095.
const HANDSHAKE_GARBAGE: usize = 2048;
/// Contents per packet over TCP, for both implementations (ferry's default maximum).
const TCP_PACKET: usize = 1 << 20;
/// Encoded key share length (ElligatorSwift).
const KEY_LEN: usize = 64;

fn main() {
    let mut json = false;
    let mut quick = false;
    let mut runs = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => json = true,
            "--quick" => quick = true,
            "--runs" => {
                let n = args.next().and_then(|v| v.parse::<usize>().ok());
                runs = Some(n.filter(|&n| n > 0).unwrap_or_else(|| usage()));
            }
            _ => usage(),
        }
    }
    let mut opts = if quick {
        Options::quick()
    } else {
        // The reference is several times slower than ferry: 256 MiB in-memory samples keep a full run to a few
        // minutes and still last seconds each.
        Options {
            memory_bytes: 256 << 20,
            tcp_bytes: 1 << 30,
            ..Options::default()
        }
    };
    if let Some(n) = runs {
        opts.runs = n;
    }

    for role in [Role::Initiator, Role::Responder] {
        let packets = interop(role);
        eprintln!(
            "interop: ferry {role:?} <-> bip324 crate {:?}: handshake with garbage and decoys agreed on the \
             session id; {packets} packets each way opened by the other implementation",
            role.peer()
        );
    }
    eprintln!("value = ferry (Config::bip324, unauthenticated); baseline = bip324 crate 0.11");

    let mut report = Report::new(json);
    for size in [256usize, 64 << 10, 1 << 20] {
        in_memory(&opts, size, &mut report);
    }
    loopback_tcp(&opts, &mut report);
    mixed_traffic(&opts, &mut report);
    handshake_time(&opts, &mut report);
}

fn usage() -> ! {
    eprintln!("usage: bip324_reference [--json] [--quick] [--runs N]");
    std::process::exit(2);
}

fn bip_role(role: Role) -> bip324::Role {
    match role {
        Role::Initiator => bip324::Role::Initiator,
        Role::Responder => bip324::Role::Responder,
    }
}

fn random_garbage(len: usize) -> Vec<u8> {
    let mut g = vec![0u8; len];
    aws_lc_rs::rand::fill(&mut g).expect("the system CSPRNG does not fail");
    g
}

fn key_share(bytes: &[u8]) -> [u8; KEY_LEN] {
    bytes[..KEY_LEN].try_into().expect("a whole key share")
}

/// Completes a `bip324` crate handshake from everything the peer sent after its key share: garbage,
/// terminator, decoys, version packet.
fn bip324_finish(hs: bip324::Handshake<SentVersion>, from_peer: &[u8]) -> CipherSession {
    let (mut hs, consumed) = match hs.receive_garbage(from_peer).expect("garbage") {
        GarbageResult::FoundGarbage {
            handshake,
            consumed_bytes,
        } => (handshake, consumed_bytes),
        GarbageResult::NeedMoreData(_) => panic!("bip324: no garbage terminator"),
    };
    let mut rest = &from_peer[consumed..];
    loop {
        let len_bytes = rest[..NUM_LENGTH_BYTES].try_into().expect("length bytes");
        let len = hs.decrypt_packet_len(len_bytes).expect("packet length");
        let mut packet = rest[NUM_LENGTH_BYTES..NUM_LENGTH_BYTES + len].to_vec();
        rest = &rest[NUM_LENGTH_BYTES + len..];
        match hs.receive_version(&mut packet).expect("version packet") {
            VersionResult::Complete { cipher } => return cipher,
            VersionResult::Decoy(next) => hs = next,
        }
    }
}

/// Both sides of a `bip324` crate handshake in memory, each sending `garbage_len` random bytes of garbage:
/// (initiator, responder).
fn bip324_pair(garbage_len: usize) -> (CipherSession, CipherSession) {
    let (ga, gb) = (random_garbage(garbage_len), random_garbage(garbage_len));
    let a = bip324::Handshake::<Initialized>::new(MAGIC, bip324::Role::Initiator).expect("key");
    let b = bip324::Handshake::<Initialized>::new(MAGIC, bip324::Role::Responder).expect("key");
    let version_len = bip324::Handshake::<ReceivedKey>::send_version_len(None);
    let key_len = bip324::Handshake::<Initialized>::send_key_len(Some(&ga));
    let (mut a_out, mut b_out) = (
        vec![0u8; key_len + version_len],
        vec![0u8; key_len + version_len],
    );
    let a = a.send_key(Some(&ga), &mut a_out).expect("send key");
    let b = b.send_key(Some(&gb), &mut b_out).expect("send key");
    let a = a.receive_key(key_share(&b_out)).expect("receive key");
    let b = b.receive_key(key_share(&a_out)).expect("receive key");
    let a = a
        .send_version(&mut a_out[key_len..], None)
        .expect("version");
    let b = b
        .send_version(&mut b_out[key_len..], None)
        .expect("version");
    (
        bip324_finish(a, &b_out[KEY_LEN..]),
        bip324_finish(b, &a_out[KEY_LEN..]),
    )
}

/// ferry in BIP324 mode as `ferry_role` against the `bip324` crate as the other side, in memory. Both send
/// garbage and decoys; the session ids must match; then packets of mixed sizes go both ways across several
/// rekeys (every 224 packets), each sealed by one implementation and opened by the other. Returns the number
/// of packets per direction; panics on any disagreement.
fn interop(ferry_role: Role) -> usize {
    let mut config = Config::bip324(MAGIC);
    config.garbage_len = Some(1000);
    config.decoys = vec![0, 37];
    let mut ferry = Handshake::new(ferry_role, config, Auth::Unauthenticated);
    let ferry_first = ferry.take_output();

    let garbage = random_garbage(777);
    let decoy = [0x5au8; 91];
    let decoys: [&[u8]; 1] = [&decoy];
    let hs =
        bip324::Handshake::<Initialized>::new(MAGIC, bip_role(ferry_role.peer())).expect("key");
    let key_len = bip324::Handshake::<Initialized>::send_key_len(Some(&garbage));
    let version_len = bip324::Handshake::<ReceivedKey>::send_version_len(Some(&decoys));
    let mut bip_out = vec![0u8; key_len + version_len];
    let hs = hs.send_key(Some(&garbage), &mut bip_out).expect("send key");
    let hs = hs
        .receive_key(key_share(&ferry_first))
        .expect("receive key");
    let hs = hs
        .send_version(&mut bip_out[key_len..], Some(&decoys))
        .expect("version");

    ferry
        .feed(&bip_out)
        .expect("ferry accepts the bip324 crate's handshake");
    assert!(ferry.is_done(), "ferry handshake incomplete");
    let from_ferry = [&ferry_first[KEY_LEN..], &ferry.take_output()[..]].concat();
    let mut cipher = bip324_finish(hs, &from_ferry);
    let mut est = ferry.finish().expect("established");
    assert_eq!(&est.session_id, cipher.id(), "session ids differ");

    let packets = 3 * 224 + 17;
    let mut wire = Vec::new();
    for i in 0..packets {
        let size = [0usize, 1, 255, 4096, 70_000][i % 5];
        let payload: Vec<u8> = (0..size).map(|j| (i * 31 + j) as u8).collect();

        // ferry seals, the bip324 crate opens.
        wire.clear();
        est.sealer.seal_into(&mut wire, 0, &payload).expect("seal");
        let len_bytes = wire[..NUM_LENGTH_BYTES].try_into().expect("length bytes");
        let len = cipher.inbound().decrypt_packet_len(len_bytes);
        assert_eq!(NUM_LENGTH_BYTES + len, wire.len(), "length of packet {i}");
        let (kind, plain) = cipher
            .inbound()
            .decrypt_in_place(&mut wire[NUM_LENGTH_BYTES..], None)
            .expect("the bip324 crate opens ferry's packet");
        assert_eq!(kind, PacketType::Genuine);
        assert_eq!((plain[0], &plain[1..]), (0, &payload[..]), "packet {i}");

        // The bip324 crate seals, ferry opens.
        let packet = cipher
            .outbound()
            .encrypt_to_vec(&payload, PacketType::Genuine, None);
        assert_eq!(est.opener.feed(&packet), packet.len());
        match est
            .opener
            .next()
            .expect("ferry opens the bip324 crate's packet")
        {
            Some(Packet::Data(d)) => assert_eq!(&d[..], &payload[..], "packet {i}"),
            other => panic!("packet {i}: unexpected {other:?}"),
        }
    }
    packets
}

/// One in-memory sample of the `bip324` crate: `count` packets of `size` bytes encrypted and decrypted, GB/s.
fn bip324_seal_open(
    tx: &mut CipherSession,
    rx: &mut CipherSession,
    buf: &mut [u8],
    size: usize,
    count: u64,
) -> f64 {
    let contents = vec![0x5au8; size];
    let (_, t) = timed(|| {
        for _ in 0..count {
            tx.outbound()
                .encrypt(&contents, buf, PacketType::Genuine, None)
                .expect("encrypt");
            let len_bytes = buf[..NUM_LENGTH_BYTES].try_into().expect("length bytes");
            let len = rx.inbound().decrypt_packet_len(len_bytes);
            let (_, plain) = rx
                .inbound()
                .decrypt_in_place(&mut buf[NUM_LENGTH_BYTES..NUM_LENGTH_BYTES + len], None)
                .expect("decrypt");
            assert_eq!(plain.len(), 1 + size);
        }
    });
    gbps(count * size as u64, t)
}

/// Seal+open of `size`-byte packets in one thread, no I/O.
fn in_memory(opts: &Options, size: usize, report: &mut Report) {
    let count = (opts.memory_bytes / size as u64).max(1000);
    let (mut ftx, mut frx) = pair(Config::bip324(MAGIC), || Auth::Unauthenticated);
    let (mut btx, mut brx) = bip324_pair(0);
    let mut buf = vec![0u8; OutboundCipher::encryption_buffer_len(size)];
    let (base, ferry) = interleave(
        opts.runs,
        || bip324_seal_open(&mut btx, &mut brx, &mut buf, size, count),
        || seal_open_in_place(&mut ftx.sealer, &mut frx.opener, size, count),
    );
    report.push(
        Row::new(
            BENCH,
            format!(
                "chacha20 {} seal+open in memory [ferry/bip324]",
                size_name(size)
            ),
            ferry,
            "GB/s",
        )
        .with_baseline(base),
    );
}

/// One TCP sample of the `bip324` crate's blocking `io::Protocol`: handshake included, 1 MiB packets.
fn bip324_tcp(bytes: u64) -> f64 {
    let (client, server) = tcp_pair();
    let start = Instant::now();
    let sender = std::thread::spawn(move || {
        let reader = BufReader::new(client.try_clone().expect("clone stream"));
        let mut p = Protocol::new(MAGIC, bip324::Role::Initiator, None, None, reader, client)
            .expect("bip324 handshake");
        let full = Payload::genuine(vec![0x42u8; TCP_PACKET]);
        let mut left = bytes;
        while left > 0 {
            let n = left.min(TCP_PACKET as u64) as usize;
            if n == TCP_PACKET {
                p.write(&full).expect("write");
            } else {
                p.write(&Payload::genuine(vec![0x42u8; n])).expect("write");
            }
            left -= n as u64;
        }
    });
    let reader = BufReader::new(server.try_clone().expect("clone stream"));
    let mut p = Protocol::new(MAGIC, bip324::Role::Responder, None, None, reader, server)
        .expect("bip324 handshake");
    let mut got = 0u64;
    while got < bytes {
        got += p.read().expect("read").contents().len() as u64;
    }
    sender.join().expect("sender");
    gbps(bytes, start.elapsed())
}

/// Bulk data from one thread to another over 127.0.0.1 through one channel.
fn loopback_tcp(opts: &Options, report: &mut Report) {
    let (base, ferry) = interleave(
        opts.runs,
        || bip324_tcp(opts.tcp_bytes),
        || {
            channel_tcp_with(opts.tcp_bytes, Config::bip324(MAGIC), || {
                Auth::Unauthenticated
            })
        },
    );
    report.push(
        Row::new(
            BENCH,
            format!(
                "loopback TCP {} one channel chacha20 [ferry/bip324]",
                size_name(opts.tcp_bytes as usize)
            ),
            ferry,
            "GB/s",
        )
        .with_baseline(base),
    );
}

/// The `bip324` crate's counterpart of [`mixed_sample`]: seal every packet into `wire`, then copy it into a
/// receive buffer in 256 KiB "reads" and decrypt each complete packet in place there.
fn bip324_mixed_sample(
    tx: &mut CipherSession,
    rx: &mut CipherSession,
    sizes: &[usize],
    payload: &[u8],
    wire: &mut Vec<u8>,
    rbuf: &mut Vec<u8>,
) -> (Duration, Duration) {
    wire.clear();
    let (_, seal_t) = timed(|| {
        for &s in sizes {
            let start = wire.len();
            wire.resize(start + OutboundCipher::encryption_buffer_len(s), 0);
            tx.outbound()
                .encrypt(&payload[..s], &mut wire[start..], PacketType::Genuine, None)
                .expect("encrypt");
        }
    });
    let (opened, open_t) = timed(|| {
        let mut opened = 0usize;
        rbuf.clear();
        let mut pos = 0;
        // The length of a packet whose length bytes are decrypted but whose rest has not all arrived.
        let mut pending: Option<usize> = None;
        for chunk in wire.chunks(MIXED_READ) {
            rbuf.drain(..pos);
            pos = 0;
            rbuf.extend_from_slice(chunk);
            loop {
                let len = match pending.take() {
                    Some(len) => len,
                    None if rbuf.len() - pos < NUM_LENGTH_BYTES => break,
                    None => {
                        let len_bytes = rbuf[pos..pos + NUM_LENGTH_BYTES]
                            .try_into()
                            .expect("length bytes");
                        pos += NUM_LENGTH_BYTES;
                        rx.inbound().decrypt_packet_len(len_bytes)
                    }
                };
                if rbuf.len() - pos < len {
                    pending = Some(len);
                    break;
                }
                rx.inbound()
                    .decrypt_in_place(&mut rbuf[pos..pos + len], None)
                    .expect("decrypt");
                pos += len;
                opened += 1;
            }
        }
        opened
    });
    assert_eq!(opened, sizes.len());
    (seal_t, open_t)
}

/// `ferry bench channel`'s mixed traffic (`mixed_sizes`), one thread, a fresh session per sample.
fn mixed_traffic(opts: &Options, report: &mut Report) {
    let sizes = mixed_sizes(opts.mixed_packets);
    let total: usize = sizes.iter().sum();
    let payload = vec![0x33u8; 100_000];
    let mut wire = Vec::with_capacity(total + sizes.len() * 20);
    let mut rbuf = Vec::with_capacity(2 * MIXED_READ + 100_000);
    let n = sizes.len() as f64;
    let mpkts = |t: Duration| n / t.as_secs_f64() / 1e6;
    // (bip324, ferry) samples of seal+open, seal only, open only.
    let mut samples: [(Vec<f64>, Vec<f64>); 3] = Default::default();
    for _ in 0..opts.runs {
        let (mut btx, mut brx) = bip324_pair(0);
        let (bs, bo) =
            bip324_mixed_sample(&mut btx, &mut brx, &sizes, &payload, &mut wire, &mut rbuf);
        let (mut ftx, mut frx) = pair(Config::bip324(MAGIC), || Auth::Unauthenticated);
        let (fs, fo) = mixed_sample(
            &mut ftx.sealer,
            &mut frx.opener,
            &sizes,
            &payload,
            &mut wire,
        );
        for (i, (b, f)) in [(bs + bo, fs + fo), (bs, fs), (bo, fo)]
            .into_iter()
            .enumerate()
        {
            samples[i].0.push(mpkts(b));
            samples[i].1.push(mpkts(f));
        }
    }
    let mean = total as f64 / n;
    let names = [
        format!("mixed traffic (mean {mean:.0} B) seal+open, one thread [ferry/bip324]"),
        "mixed traffic seal only [ferry/bip324]".to_string(),
        "mixed traffic open only [ferry/bip324]".to_string(),
    ];
    for (name, (b, f)) in names.into_iter().zip(samples.iter_mut()) {
        report.push(Row::new(BENCH, name, median(f), "Mpkt/s").with_baseline(median(b)));
    }
}

/// Both sides of a handshake in memory: key exchange, garbage, version; no ferry authentication.
fn handshake_time(opts: &Options, report: &mut Report) {
    let iterations = 200 * opts.runs;
    let mut config = Config::bip324(MAGIC);
    config.garbage_len = Some(HANDSHAKE_GARBAGE);
    let (mut b, mut f) = (Vec::new(), Vec::new());
    for _ in 0..iterations {
        b.push(timed(|| bip324_pair(HANDSHAKE_GARBAGE)).1.as_secs_f64() * 1e6);
        f.push(
            timed(|| pair(config.clone(), || Auth::Unauthenticated))
                .1
                .as_secs_f64()
                * 1e6,
        );
    }
    let (base, ferry) = (median(&mut b), median(&mut f));
    let mut row = Row::new(
        BENCH,
        format!(
            "handshake both sides, {} garbage [bip324/ferry]",
            size_name(HANDSHAKE_GARBAGE)
        ),
        ferry,
        "µs",
    )
    .with_baseline(base);
    // A time: lower is better, so the ratio is baseline / value to keep "above 1 = ferry faster".
    row.ratio = (ferry > 0.0).then(|| base / ferry);
    report.push(row);
}
