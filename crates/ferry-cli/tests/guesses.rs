//! Online guessing against a waiting `ferry send`, and connections that stall its handshake: real processes,
//! real sockets on 127.0.0.1.
//!
//! The attacker speaks real ferry (the channel's own handshake) with a wrong code. It gets as far as the PAKE,
//! reads everything the sender sends, and hangs up before confirming. It must never receive anything it could
//! check its guess against offline, and after the documented limit of such attempts the code is dead: the
//! sender stops with `wrong-code`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use ferry_channel::{Auth, ChannelError, Config, Handshake, Role, MAX_FAILED_ATTEMPTS};

const CODE: &str = "31-apple-orbit-violin";
const WRONG: &str = "31-apple-orbit-zoo";

/// Starts `ferry send --json` and returns it with the address it listens on (from its `code` event).
fn sender(w: &World, file: &std::path::Path) -> (Watched, SocketAddr) {
    let mut send = Watched::new(w.spawn_send(CODE, &[file]));
    let code = send.wait_for(|e| e["event"] == "code");
    let listen = code["listen"]
        .as_str()
        .expect("the code event names the listen address")
        .parse()
        .expect("an address");
    (send, listen)
}

/// One guess: the PAKE with `WRONG`, then a hang-up instead of the confirmation. Returns what the attacker
/// learned: `Err(WrongCode)` means the sender's bytes let it check the guess offline.
fn guess_and_hang_up(addr: SocketAddr) -> Result<(), ChannelError> {
    let mut stream = TcpStream::connect(addr).expect("connect to the sender");
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut hs = Handshake::new(
        Role::Initiator,
        Config::ferry(),
        Auth::Code(WRONG.as_bytes().to_vec()),
    );
    let mut buf = vec![0u8; 16 << 10];
    let deadline = Instant::now() + Duration::from_secs(30);
    // The sender's bytes are fed one at a time, so our PAKE message goes out before the byte that completes the
    // sender's PAKE message makes us queue our confirmation.
    'pake: loop {
        assert!(Instant::now() < deadline, "the sender never ran the PAKE");
        let out = hs.take_output();
        if !out.is_empty() {
            stream.write_all(&out).expect("write to the sender");
        }
        let n = match stream.read(&mut buf) {
            Ok(0) => panic!("the sender closed before the PAKE"),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => panic!("read: {e}"),
        };
        for (i, byte) in buf[..n].iter().enumerate() {
            hs.feed(std::slice::from_ref(byte))?;
            if hs.attempt_charged() {
                let rest = buf[i + 1..n].to_vec();
                hs.feed(&rest)?;
                break 'pake;
            }
            let out = hs.take_output();
            if !out.is_empty() {
                stream.write_all(&out).expect("write to the sender");
            }
        }
    }
    // Our confirmation is queued; we drop it and read whatever the sender still sends for a while.
    let _ = hs.take_output();
    let until = Instant::now() + Duration::from_millis(800);
    while Instant::now() < until {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hs.feed(&buf[..n])?,
            Err(_) => {}
        }
    }
    assert!(!hs.is_done(), "a wrong code can never finish");
    Ok(())
}

#[test]
fn guesses_that_hang_up_get_nothing_to_check_and_end_the_code_at_the_limit() {
    let w = World::new();
    let file = w.src().join("secret.txt");
    std::fs::write(&file, b"not for guessers").unwrap();
    let (send, addr) = sender(&w, &file);
    for i in 1..=MAX_FAILED_ATTEMPTS {
        if let Err(e) = guess_and_hang_up(addr) {
            panic!("guess {i}: the sender let the attacker check its guess offline ({e})");
        }
    }
    // The code is dead: the sender ends by itself with wrong-code (a sender that keeps waiting is killed by the
    // watchdog and fails the assertion below).
    let out = send.finish();
    assert_failure("the sender after the guesses", &out, 3, "wrong-code");
    let ev = events(&out.stdout);
    let message = event(&ev, "error").unwrap()["message"].to_string();
    assert!(
        message.contains("spent"),
        "the sender says the code is spent: {message}"
    );
    // And a receiver with the right code now finds nobody (and does not wait long for somebody).
    let args = ["--json", "--yes", "--wait", "1s"];
    let recv = finish(w.spawn_receive_with(&args, CODE, &w.out()));
    assert_failure("a receiver after the code died", &recv, 4, "peer-not-found");
    assert!(!w.out().join("secret.txt").exists());
}

#[test]
fn one_wrong_confirmation_ends_the_send() {
    let w = World::new();
    let file = w.src().join("secret.txt");
    std::fs::write(&file, b"not for guessers").unwrap();
    let send = finish_in_background(w.spawn_send(CODE, &[&file]));
    let recv = finish(w.spawn_receive(WRONG, &w.out()));
    assert_failure("the receiver with a wrong code", &recv, 3, "wrong-code");
    let send = send.join().unwrap();
    assert_failure("the sender after a wrong code", &send, 3, "wrong-code");
}

#[test]
fn a_connection_that_trickles_bytes_does_not_hold_up_the_real_receiver() {
    let w = World::new();
    let file = w.src().join("data.bin");
    std::fs::write(&file, pseudo_random(256 << 10, 5)).unwrap();
    let (send, addr) = sender(&w, &file);
    // The slow peer connects first and sends one byte a second, forever (until the sender closes it).
    let mut slow = TcpStream::connect(addr).expect("connect");
    let trickle = std::thread::spawn(move || {
        for _ in 0..120 {
            if slow.write_all(&[0x42]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let recv = finish(w.spawn_receive(CODE, &w.out()));
    assert_success("the real receiver", &recv);
    assert_success("the sender", &send.finish());
    assert_same_tree(&file, &w.out().join("data.bin"));
    drop(trickle);
}
