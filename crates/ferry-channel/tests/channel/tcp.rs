//! The thin adapters over real sockets on 127.0.0.1 (ephemeral ports, nothing else): a handshake with a code,
//! bulk data both ways at once through the blocking adapter (64 MiB) and the tokio adapter (4 MiB), the
//! authenticated close, and `Truncated` when the peer drops the socket without it.

use std::future::Future;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::OnceLock;
use std::thread;

use ferry_channel::blocking::{self, SecureReader, SecureWriter};
use ferry_channel::sizing::FIRST_PACKET;
use ferry_channel::tokio_io::{self, AsyncSecureReader, AsyncSecureWriter};
use ferry_channel::{ChannelError, Established, Handshake, Role, DEFAULT_MAX_PAYLOAD};

use crate::common::*;

/// The byte stream each direction carries is this pattern repeated; its period is prime, so packet boundaries
/// never line up with it and a misplaced packet is caught.
const PERIOD: usize = 1_048_573;
/// Packet sizes, in turn: full packets (sealed in place), small ones (coalesced), and odd ones.
const SIZES: [usize; 7] = [
    DEFAULT_MAX_PAYLOAD,
    1,
    70_000,
    300,
    DEFAULT_MAX_PAYLOAD - 1,
    0,
    65_536,
];

fn pattern() -> &'static [u8] {
    static PATTERN: OnceLock<Vec<u8>> = OnceLock::new();
    PATTERN.get_or_init(|| payload(99, PERIOD))
}

/// Calls `f` on the pieces of the pattern stream that cover `len` bytes from `offset`.
fn for_pattern_pieces(mut offset: usize, len: usize, mut f: impl FnMut(usize, &[u8])) {
    let p = pattern();
    let mut done = 0;
    while done < len {
        let at = offset % PERIOD;
        let n = (PERIOD - at).min(len - done);
        f(done, &p[at..at + n]);
        done += n;
        offset += n;
    }
}

fn fill_from_pattern(offset: usize, buf: &mut [u8]) {
    for_pattern_pieces(offset, buf.len(), |at, piece| {
        buf[at..at + piece.len()].copy_from_slice(piece)
    });
}

fn matches_pattern(offset: usize, data: &[u8]) -> bool {
    let mut ok = true;
    for_pattern_pieces(offset, data.len(), |at, piece| {
        ok &= &data[at..at + piece.len()] == piece
    });
    ok
}

/// Packet lengths that add up to exactly `total`.
fn packet_lengths(total: usize) -> impl Iterator<Item = usize> {
    let mut sent = 0;
    SIZES.iter().cycle().map_while(move |&n| {
        let n = n.min(total - sent);
        sent += n;
        (n > 0 || sent < total).then_some(n)
    })
}

/// A connected pair of sockets on 127.0.0.1 with the handshake run by `run` on both ends.
fn connected<T: Send + 'static>(
    run: impl Fn(TcpStream, Handshake) -> T + Send + Sync + Clone + 'static,
) -> (T, T) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1");
    let addr = listener.local_addr().unwrap();
    let run_b = run.clone();
    let server = thread::spawn(move || {
        let (stream, _) = listener.accept().expect("accept");
        run_b(stream, responder(aes_config(), code()))
    });
    let client = TcpStream::connect(addr).expect("connect to 127.0.0.1");
    let a = run(client, initiator(aes_config(), code()));
    (a, server.join().expect("responder thread"))
}

fn blocking_handshake(mut stream: TcpStream, hs: Handshake) -> (TcpStream, Established) {
    let est = blocking::handshake(&mut stream, hs).expect("handshake over TCP");
    (stream, est)
}

/// Sends `total` bytes of the pattern, then closes.
fn send_pattern(mut w: SecureWriter<TcpStream>, total: usize) {
    let mut offset = 0;
    for len in packet_lengths(total) {
        if len >= 1 << 16 {
            fill_from_pattern(offset, w.payload_buf(len).unwrap());
            w.send_payload_buf(len).unwrap();
        } else {
            let mut small = vec![0; len];
            fill_from_pattern(offset, &mut small);
            w.send(&small).unwrap();
        }
        offset += len;
    }
    w.close().unwrap();
}

/// Receives the pattern up to the close; returns how many bytes came.
fn recv_pattern(mut r: SecureReader<TcpStream>) -> usize {
    let mut offset = 0;
    while let Some(d) = r.recv().unwrap() {
        assert!(matches_pattern(offset, d), "bytes at {offset} differ");
        offset += d.len();
    }
    offset
}

#[test]
fn blocking_adapter_moves_64_mib_each_way_over_tcp_and_closes() {
    const TOTAL: usize = 64 << 20;
    let ((sa, a), (sb, b)) = connected(blocking_handshake);
    assert_agree(&a, &b);
    let mut threads = Vec::new();
    for (stream, est) in [(sa, a), (sb, b)] {
        let (r, w) = blocking::split_tcp(stream, est).unwrap();
        threads.push(thread::spawn(move || {
            send_pattern(w, TOTAL);
            0
        }));
        threads.push(thread::spawn(move || recv_pattern(r)));
    }
    let received: usize = threads
        .into_iter()
        .map(|t| t.join().expect("no thread panicked"))
        .sum();
    assert_eq!(received, 2 * TOTAL);
}

#[test]
fn blocking_adapter_reports_truncation_when_the_peer_drops_the_socket() {
    let ((sa, a), (sb, b)) = connected(blocking_handshake);
    let (ra, mut wa) = blocking::split_tcp(sa, a).unwrap();
    wa.send(b"last words").unwrap();
    wa.flush().unwrap();
    drop((ra, wa));
    let (mut rb, _wb) = blocking::split_tcp(sb, b).unwrap();
    assert_eq!(
        rb.recv().unwrap().map(|d| d.to_vec()),
        Some(b"last words".to_vec())
    );
    assert!(matches!(rb.recv(), Err(ChannelError::Truncated)));
}

/// A small packet after a large one, from a peer that then waits for an answer, is delivered at once:
/// no read waits for bytes the peer does not owe. A reader that did (say, one that raised the socket's
/// `SO_RCVLOWAT` to save wake-ups, as was tried and dropped: see BENCHMARKS.md) would hang here, and
/// the test fails on its deadline.
#[test]
fn blocking_reader_delivers_a_small_packet_after_a_large_one_at_once() {
    let ((sa, a), (sb, b)) = connected(blocking_handshake);
    let (mut ra, mut wa) = blocking::split_tcp(sa, a).unwrap();
    let (mut rb, mut wb) = blocking::split_tcp(sb, b).unwrap();
    const ROUNDS: usize = 8;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let ping = thread::spawn(move || {
        for round in 0..ROUNDS {
            let big = payload(round, DEFAULT_MAX_PAYLOAD - round);
            wa.send(&big).unwrap();
            wa.send(format!("ping {round}").as_bytes()).unwrap();
            wa.flush().unwrap();
            let answer = ra.recv().unwrap().map(|d| d.to_vec());
            assert_eq!(answer, Some(format!("pong {round}").into_bytes()));
        }
        wa.close().unwrap();
    });
    let pong = thread::spawn(move || {
        for round in 0..ROUNDS {
            let big = rb.recv().unwrap().map(|d| d.to_vec());
            assert_eq!(big, Some(payload(round, DEFAULT_MAX_PAYLOAD - round)));
            let small = rb.recv().unwrap().map(|d| d.to_vec());
            assert_eq!(small, Some(format!("ping {round}").into_bytes()));
            wb.send(format!("pong {round}").as_bytes()).unwrap();
            wb.flush().unwrap();
        }
        assert!(rb.recv().unwrap().is_none(), "then the authenticated close");
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("every round trip completed (no read waited for bytes never owed)");
    ping.join().unwrap();
    pong.join().unwrap();
}

/// A bulk sender that builds each packet as large as `packet_limit` says: the packets start at
/// `FIRST_PACKET`, grow to the maximum, and every one arrives whole and in order.
#[test]
fn packets_sized_by_the_writer_start_small_grow_and_roundtrip() {
    const TOTAL: usize = 6 << 20;
    let ((sa, a), (sb, b)) = connected(blocking_handshake);
    let (_ra, mut w) = blocking::split_tcp(sa, a).unwrap();
    let (mut r, _wb) = blocking::split_tcp(sb, b).unwrap();
    let sender = thread::spawn(move || {
        let mut sizes = Vec::new();
        let mut offset = 0;
        while offset < TOTAL {
            let len = w.packet_limit().min(TOTAL - offset);
            fill_from_pattern(offset, w.payload_buf(len).unwrap());
            w.send_payload_buf(len).unwrap();
            sizes.push(len);
            offset += len;
        }
        w.close().unwrap();
        sizes
    });
    let mut received = Vec::new();
    let mut offset = 0;
    while let Some(d) = r.recv().unwrap() {
        assert!(matches_pattern(offset, d), "bytes at {offset} differ");
        offset += d.len();
        received.push(d.len());
    }
    let sent = sender.join().unwrap();
    assert_eq!(offset, TOTAL);
    assert_eq!(received, sent, "one packet arrives per packet sent");
    assert_eq!(sent[0], FIRST_PACKET);
    let (_last, growing) = sent.split_last().unwrap();
    assert!(growing.windows(2).all(|w| w[0] <= w[1]), "sizes only grow");
    assert_eq!(*sent.iter().max().unwrap(), DEFAULT_MAX_PAYLOAD);
    assert!(sent.iter().filter(|&&n| n == DEFAULT_MAX_PAYLOAD).count() >= 3);
}

/// Runs the async side of one TCP connection on a runtime of its own: the handshake, then `f`.
fn tokio_side<T, F: Future<Output = T>>(
    stream: TcpStream,
    hs: Handshake,
    f: impl FnOnce(Established, tokio::net::TcpStream) -> F,
) -> T {
    stream.set_nonblocking(true).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut s = tokio::net::TcpStream::from_std(stream).unwrap();
        let est = tokio_io::handshake(&mut s, hs)
            .await
            .expect("async handshake");
        f(est, s).await
    })
}

async fn tokio_send(
    mut w: AsyncSecureWriter<tokio::io::WriteHalf<tokio::net::TcpStream>>,
    total: usize,
) {
    let mut offset = 0;
    for len in packet_lengths(total) {
        let mut buf = vec![0; len];
        fill_from_pattern(offset, &mut buf);
        w.send(&buf).await.unwrap();
        offset += len;
    }
    w.close().await.unwrap();
}

async fn tokio_recv(
    mut r: AsyncSecureReader<tokio::io::ReadHalf<tokio::net::TcpStream>>,
) -> Result<usize, ChannelError> {
    let mut offset = 0;
    while let Some(d) = r.recv().await? {
        assert!(matches_pattern(offset, d), "bytes at {offset} differ");
        offset += d.len();
    }
    Ok(offset)
}

#[test]
fn tokio_adapter_moves_data_each_way_over_tcp_and_closes() {
    const TOTAL: usize = 4 << 20;
    let (a, b) = connected(|stream, hs| {
        tokio_side(stream, hs, |est, s| async move {
            let (r, w) = tokio_io::split(s, est);
            let (_, got) = tokio::join!(tokio_send(w, TOTAL), tokio_recv(r));
            got
        })
    });
    assert_eq!((a.unwrap(), b.unwrap()), (TOTAL, TOTAL));
}

#[test]
fn tokio_adapter_reports_truncation_when_the_peer_drops_the_socket() {
    let (a, b) = connected(|stream, hs| {
        tokio_side(stream, hs, |est, s| async move {
            let role = est.role;
            let (mut r, mut w) = tokio_io::split(s, est);
            if role == Role::Initiator {
                w.send(b"last words").await.unwrap();
                w.flush().await.unwrap();
                // Both halves dropped: the socket closes without the authenticated end of stream.
                return None;
            }
            let first = r.recv().await.unwrap().map(|d| d.to_vec());
            assert_eq!(first.as_deref(), Some(&b"last words"[..]));
            Some(r.recv().await.err())
        })
    });
    assert!(a.is_none());
    assert!(matches!(b, Some(Some(ChannelError::Truncated))), "{b:?}");
}
