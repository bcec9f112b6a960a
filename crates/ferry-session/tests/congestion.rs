//! The congestion policy on real emulated paths (the link lab: network namespaces joined by a link with a
//! rate, a delay, a drop-tail queue and, on lossy-wan, random loss): a path that loses packets moves the
//! session to BBR for good; a clean path, whose only losses are the ones the sender causes by filling its
//! queue, moves it to CUBIC and keeps it there.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::Duration;

use ferry_lab::{Lab, Path};
use ferry_session::congestion::{counters, DataStream, Phase, Policy};
use ferry_testkit::skip;

/// One lab at a time: two emulators on this machine's two cores would measure each other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Sends from the server namespace to the client over `path` through a [`DataStream`] under a new policy:
/// until the connection retransmitted, then `after` bytes more (at most `most` in all); the policy
/// afterwards and the retransmissions, or `None` (skipped) where no lab can be built here.
fn send_over(test: &str, path: &str, after: usize, most: usize) -> Option<(Policy, u32)> {
    if let Some(reason) = ferry_lab::missing_prerequisite() {
        skip(test, &reason);
        return None;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::build(&Path::by_name(path).expect("a known path")).expect("building the lab");
    let ip = lab.client_ip();
    let listener = lab
        .client
        .enter(|| TcpListener::bind((ip, 0)))
        .expect("listen in the client namespace");
    let addr: SocketAddr = listener.local_addr().unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut rx, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        loop {
            let n = rx.read(&mut buf).unwrap();
            if n == 0 {
                return got;
            }
            assert!(buf[..n].iter().all(|&b| b == 0x5a), "data corrupted");
            got += n;
        }
    });
    let stream = lab
        .server
        .enter(|| TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
        .expect("connect through the link");
    let policy = Policy::new();
    let mut data = DataStream::new(stream, &policy);
    if !data.watched() {
        skip(
            test,
            "this host's default congestion control is not bbr, or it has no cubic",
        );
        return None;
    }
    let chunk = vec![0x5au8; 1 << 20];
    let (mut sent, mut end) = (0, most);
    while sent < end {
        data.write_all(&chunk).unwrap();
        sent += chunk.len();
        if end == most && counters(data.get_ref()).unwrap().retransmitted > 0 {
            end = (sent + after).min(most);
        }
    }
    data.get_ref().shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(receiver.join().unwrap(), sent, "every byte arrives");
    let retransmitted = counters(data.get_ref()).unwrap().retransmitted;
    Some((policy, retransmitted))
}

#[test]
fn a_path_that_loses_packets_moves_the_session_to_bbr_for_good() {
    // 0.5 % random loss: the first loss within a few hundred packets, before start-up built a queue.
    if let Some(sent) = send_over(
        "a_path_that_loses_packets_moves_the_session_to_bbr_for_good",
        "lossy-wan",
        8 << 20,
        64 << 20,
    ) {
        let (policy, retransmitted) = sent;
        assert!(retransmitted > 0, "the path lost nothing");
        assert_eq!(
            policy.phase(),
            Phase::Bbr,
            "random loss was taken for congestion"
        );
    }
}

#[test]
fn a_clean_path_moves_the_session_to_cubic_and_keeps_it_there_through_its_own_congestion_losses() {
    // wan (500 Mbit/s, 24 ms, a queue of one BDP): BBR's start-up overfills the queue (hundreds of
    // retransmissions with the round trip doubled, as measured), then CUBIC does from time to time; 16 MiB
    // more are sent after the first retransmission. About one start-up in 25 here left start-up before it
    // overfilled the queue and then sent 256 MiB without a loss: that experiment judged nothing, so it is
    // made again (a new connection), at most three times.
    let test =
        "a_clean_path_moves_the_session_to_cubic_and_keeps_it_there_through_its_own_congestion_losses";
    for attempt in 1..=3 {
        let Some((policy, retransmitted)) = send_over(test, "wan", 16 << 20, 256 << 20) else {
            return;
        };
        if retransmitted == 0 && attempt < 3 {
            eprintln!("{test}: start-up did not overfill the queue (attempt {attempt}); again");
            continue;
        }
        assert!(
            retransmitted > 0,
            "start-up did not overfill the queue in three attempts: nothing was judged"
        );
        assert_eq!(
            policy.phase(),
            Phase::Cubic,
            "congestion loss was taken for random loss"
        );
        return;
    }
}
