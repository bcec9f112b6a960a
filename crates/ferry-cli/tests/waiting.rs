//! A receiver started before its sender waits for it (`--wait`), retrying every path, and says what it
//! tried when the wait is over.

mod common;

use std::fs;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::*;

/// Far more than any wait here needs: only a hang goes past it.
const NO_HANG: Duration = Duration::from_secs(60);

/// `ferry receive --json --yes --wait WAIT [extra...] CODE --out OUT`, running.
fn waiting_receiver(w: &World, code: &str, wait: &str, extra: &[&str]) -> std::process::Child {
    let mut args = vec!["--json", "--yes", "--wait", wait];
    args.extend_from_slice(extra);
    w.spawn_receive_with(&args, code, &w.out())
}

fn warnings(out: &std::process::Output) -> Vec<String> {
    events(&out.stdout)
        .iter()
        .filter(|e| e["event"] == "warning")
        .map(|e| e["message"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn a_receiver_started_first_meets_its_sender_on_this_host() {
    let w = World::new();
    let code = "81-apple-orbit-violin";
    let f = w.src().join("late.bin");
    fs::write(&f, pseudo_random(100_000, 81)).unwrap();
    let recv = finish_in_background(waiting_receiver(&w, code, "2m", &[]));
    std::thread::sleep(Duration::from_secs(3));
    let send = finish(w.spawn_send(code, &[&f]));
    let recv = recv.join().unwrap();
    assert_success("sender started after the receiver", &send);
    assert_success("receiver started before the sender", &recv);
    let connected = event(&events(&recv.stdout), "connected").cloned();
    assert_eq!(connected.unwrap()["path"], "same-host");
    assert_same_tree(&f, &w.out().join("late.bin"));
}

/// A free loopback port, nobody listening on it.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn a_receiver_retries_a_peer_address_until_the_sender_listens() {
    let w = World::new();
    let code = "82-apple-orbit-violin";
    let f = w.src().join("late.bin");
    fs::write(&f, pseudo_random(100_000, 82)).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let recv = finish_in_background(waiting_receiver(&w, code, "2m", &["--peer", &addr]));
    // Long enough for more refused rounds (0, 0.25, 0.75, 1.75 s...) than the code's budget of 3 failed
    // attempts: a connection that never reached the PAKE must cost no guess.
    std::thread::sleep(Duration::from_millis(2500));
    let send = finish(
        w.cmd()
            .args(["send", "--json", "--code", code, "--listen", &addr])
            .arg(&f)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let recv = recv.join().unwrap();
    assert_success("sender listening after the receiver started", &send);
    assert_success("receiver retrying --peer", &recv);
    assert_eq!(
        event(&events(&recv.stdout), "connected").unwrap()["path"],
        "direct"
    );
    assert_same_tree(&f, &w.out().join("late.bin"));
    // Each refused round is not a warning of its own: the first says it, the others are quiet.
    let refused: Vec<_> = warnings(&recv)
        .into_iter()
        .filter(|m| m.contains("cannot reach"))
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
}

/// Runs a receiver with `--wait WAIT` and no sender: it must fail with `peer-not-found` well before
/// [`NO_HANG`]; returns its error message.
fn nobody_comes(w: &World, wait: &str, extra: &[&str]) -> String {
    let started = Instant::now();
    let out = finish(waiting_receiver(w, "83-apple-orbit-violin", wait, extra));
    assert!(started.elapsed() < NO_HANG, "took {:?}", started.elapsed());
    assert_failure("receiver without a sender", &out, 4, "peer-not-found");
    let ev = events(&out.stdout);
    let message = event(&ev, "error").unwrap()["message"].clone();
    message.as_str().map(str::to_string).unwrap_or_default()
}

#[test]
fn without_a_sender_the_wait_ends_with_what_was_tried() {
    let w = World::new();
    let message = nobody_comes(&w, "1s", &[]);
    assert!(
        message.contains("within 1s") && message.contains("this host"),
        "{message}"
    );

    let addr = format!("127.0.0.1:{}", free_port());
    let message = nobody_comes(&w, "1s", &["--peer", &addr]);
    assert!(
        message.contains(&format!("--peer {addr}")) && message.contains("refused"),
        "{message}"
    );

    // `0`: one round, no waiting.
    let message = nobody_comes(&w, "0", &[]);
    assert!(
        message.contains("at once (--wait 0)") && message.contains("this host"),
        "{message}"
    );
}

#[test]
fn a_relay_is_waited_at_for_the_wait_and_named_at_the_end() {
    let w = World::new();
    let relay = RelayProcess::spawn({
        let mut c = w.cmd();
        c.args(["relay", "--listen", "127.0.0.1:0", "--stats-interval", "0"]);
        c
    });
    let message = nobody_comes(&w, "1s", &["--relay", &relay.addr.to_string()]);
    assert!(
        message.contains(&format!("the relay {} (no sender came)", relay.addr)),
        "{message}"
    );
}

#[test]
fn a_bad_wait_is_a_usage_error() {
    let w = World::new();
    let out = finish(waiting_receiver(
        &w,
        "84-apple-orbit-violin",
        "5 fortnights",
        &[],
    ));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown unit"), "{stderr}");
}

/// Issue 45: `--wait 0` looks once, so an address it cannot reach is not "tried again".
#[test]
fn with_wait_0_an_unreachable_peer_is_not_tried_again() {
    let w = World::new();
    let addr = format!("127.0.0.1:{}", free_port());
    let out = finish(waiting_receiver(
        &w,
        "85-apple-orbit-violin",
        "0",
        &["--peer", &addr],
    ));
    assert_failure("receiver with --wait 0", &out, 4, "peer-not-found");
    let said = warnings(&out);
    assert!(
        said.iter()
            .any(|w| w.contains(&format!("cannot reach {addr}"))),
        "{said:?}"
    );
    assert!(!said.iter().any(|w| w.contains("trying again")), "{said:?}");
}

/// Issue 45: a receiver stopped while it still looks for its sender says it was interrupted, and nothing of
/// partial data it never had.
#[test]
fn ctrl_c_while_waiting_speaks_of_no_data() {
    let w = World::new();
    let recv = Watched::new(waiting_receiver(&w, "86-apple-orbit-violin", "1m", &[]));
    std::thread::sleep(Duration::from_millis(500));
    recv.signal(libc::SIGINT);
    let out = recv.finish();
    assert_failure("receiver stopped while waiting", &out, 130, "interrupted");
    let message = event(&events(&out.stdout), "error").unwrap()["message"].clone();
    assert_eq!(message, "interrupted", "{message}");
}
