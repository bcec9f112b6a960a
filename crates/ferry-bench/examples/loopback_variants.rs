//! Can the channel get closer to plain TCP over loopback by arranging the same work differently?
//!
//! `cargo run --release -p ferry-bench --example loopback_variants [RUNS]` moves 4 GiB over a
//! 127.0.0.1 TCP connection with each variant in turn (interleaved, RUNS rounds, default 7) and
//! prints the medians and their ratio to plain TCP measured in the same rounds:
//! - plain TCP, 1 MiB writes (the baseline of `ferry bench channel`);
//! - the channel as ferry runs it: 1 MiB packets sealed in place and written by the same thread;
//! - the channel with packets of 256 KiB, 2 MiB and 4 MiB;
//! - the channel with sealing and writing on two threads (three buffers in rotation), so that the
//!   sealing of one packet overlaps the write of the one before.
//!
//! On a 2-core machine the sender's thread is the busy one (its write also runs the loopback's
//! receive processing); the question is whether moving the sealing off it helps when the receiver
//! already occupies the other core.

use ferry_bench::channel::{channel_tcp_with, pair, plain_tcp, tcp_pair};
use ferry_channel::blocking::{SecureReader, SecureWriter};
use ferry_channel::{frame_len, Auth, Config, CONTENTS_OFFSET};
use std::io::Write;
use std::sync::mpsc;
use std::time::Instant;

const BYTES: u64 = 4 << 30;

fn auth() -> Auth {
    Auth::Code(b"variants".to_vec())
}

/// `BYTES` through one channel in packets of `size`, as `ferry bench channel` runs it.
fn channel(size: usize) -> f64 {
    let mut config = Config::ferry();
    config.max_payload = size;
    channel_tcp_with(BYTES, config, auth)
}

/// `BYTES` through one channel in 1 MiB packets, sealed on one thread and written on another.
fn channel_pipelined() -> f64 {
    let size = 1 << 20;
    let (a, b) = pair(Config::ferry(), auth);
    let (mut tx, rx) = tcp_pair();
    let start = Instant::now();
    let count = BYTES / size as u64;
    let sender = std::thread::spawn(move || {
        let mut sealer = a.sealer;
        let (to_writer, sealed) = mpsc::sync_channel::<Vec<u8>>(2);
        let (give_back, returned) = mpsc::channel::<Vec<u8>>();
        let writer = std::thread::spawn(move || {
            for buf in sealed {
                tx.write_all(&buf).expect("write");
                let _ = give_back.send(buf);
            }
            tx
        });
        let mut spare: Vec<Vec<u8>> = (0..3).map(|_| vec![0u8; frame_len(size)]).collect();
        for _ in 0..count {
            let mut buf = spare
                .pop()
                .unwrap_or_else(|| returned.recv().expect("buffer back"));
            buf[CONTENTS_OFFSET] = 1;
            sealer.seal_frame(&mut buf, 0).expect("seal");
            to_writer.send(buf).expect("to writer");
        }
        drop(to_writer);
        let tx = writer.join().expect("writer");
        SecureWriter::new(tx, sealer).close().expect("close");
    });
    let mut r = SecureReader::new(rx, b.opener);
    let mut got = 0u64;
    while let Some(p) = r.recv().expect("recv") {
        got += p.len() as u64;
    }
    assert_eq!(got, count * size as u64);
    sender.join().expect("sender");
    BYTES as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("RUNS is a number"))
        .unwrap_or(7);
    type Variant = (&'static str, Box<dyn Fn() -> f64>);
    let variants: Vec<Variant> = vec![
        ("plain TCP, 1 MiB writes", Box::new(|| plain_tcp(BYTES).0)),
        (
            "channel, 1 MiB packets (ferry)",
            Box::new(|| channel(1 << 20)),
        ),
        ("channel, 256 KiB packets", Box::new(|| channel(256 << 10))),
        ("channel, 2 MiB packets", Box::new(|| channel(2 << 20))),
        ("channel, 4 MiB packets", Box::new(|| channel(4 << 20))),
        (
            "channel, 1 MiB, seal and write on two threads",
            Box::new(channel_pipelined),
        ),
    ];
    let mut samples = vec![Vec::new(); variants.len()];
    for _ in 0..runs {
        for (i, (_, run)) in variants.iter().enumerate() {
            samples[i].push(run());
        }
    }
    let medians: Vec<f64> = samples
        .iter_mut()
        .map(|s| {
            s.sort_by(f64::total_cmp);
            s[s.len() / 2]
        })
        .collect();
    for ((name, _), m) in variants.iter().zip(&medians) {
        println!("{name:<48} {m:6.3} GB/s  {:.3} of plain", m / medians[0]);
    }
}
