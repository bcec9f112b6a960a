//! Everyday use: what a person at a terminal sees. Closed pipes, the hints the sender prints, the
//! question and its answers (through a real pseudo-terminal made by util-linux `script`), exit statuses
//! of a bad command line, signals and the same-host registry.

mod common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A pipe whose read end is already closed: every write to the returned end fails with EPIPE.
fn broken_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills both descriptors, which we then own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fds[0] and fds[1] are open descriptors owned by nobody else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Stdio::from(write)
}

fn assert_no_panic(what: &str, out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() != Some(101) && !stderr.contains("panicked"),
        "{what} panicked: {:?}\n{stderr}",
        out.status
    );
}

#[test]
fn completions_into_a_closed_pipe_do_not_panic() {
    let w = World::new();
    let out = finish(
        w.cmd()
            .args(["completions", "bash"])
            .stdout(broken_pipe())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_no_panic("ferry completions bash | head -1", &out);
}

#[test]
fn a_benchmark_into_a_closed_pipe_does_not_panic() {
    let w = World::new();
    let out = finish(
        w.cmd()
            .args(["bench", "channel", "--quick"])
            .stdout(broken_pipe())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_no_panic("ferry bench channel --quick | head -1", &out);
    assert!(out.status.success(), "{:?}", out.status);
}

#[test]
fn help_into_a_closed_pipe_does_not_panic() {
    let w = World::new();
    let out = finish(
        w.cmd()
            .args(["send", "--help"])
            .stdout(broken_pipe())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_no_panic("ferry send --help | head -1", &out);
}

#[test]
fn a_send_with_its_stderr_closed_still_sends() {
    let w = World::new();
    let f = w.src().join("a.txt");
    fs::write(&f, b"hello").unwrap();
    let code = "61-apple-orbit-violin";
    let send = w
        .cmd()
        .args(["send", "--code", code])
        .arg(&f)
        .stdout(Stdio::null())
        .stderr(broken_pipe())
        .spawn()
        .unwrap();
    let send = finish_in_background(send);
    let recv = finish(w.spawn_receive(code, &w.out()));
    let send = send.join().unwrap();
    assert_no_panic("send with a closed stderr", &send);
    assert_success("send with a closed stderr", &send);
    assert_success("receive", &recv);
    assert_eq!(fs::read(w.out().join("a.txt")).unwrap(), b"hello");
}

/// Runs `ferry ARGS --json` to its end (stdin closed).
fn run_json(w: &World, args: &[&str]) -> Output {
    finish(
        w.cmd()
            .args(args)
            .arg("--json")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// A bad command line is exit 2 (`usage`), found before any code is printed or any peer sought.
fn assert_usage(what: &str, out: &Output) {
    assert_failure(what, out, 2, "usage");
    assert!(
        event(&events(&out.stdout), "code").is_none(),
        "{what}: no code may be printed for a bad command line"
    );
}

#[test]
fn two_paths_with_the_same_name_are_a_bad_command_line() {
    let w = World::new();
    for d in ["a", "b"] {
        fs::create_dir_all(w.src().join(d)).unwrap();
        fs::write(w.src().join(d).join("same.txt"), d).unwrap();
    }
    let (a, b) = (w.src().join("a/same.txt"), w.src().join("b/same.txt"));
    let out = run_json(&w, &["send", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_usage("send a/same.txt b/same.txt", &out);
}

#[test]
fn a_malformed_relay_is_a_bad_command_line() {
    let w = World::new();
    let f = w.src().join("a.txt");
    fs::write(&f, b"x").unwrap();
    for relay in ["nonsense", "host:", ":7440", "host:port", "host:99999"] {
        let out = run_json(&w, &["send", "--relay", relay, f.to_str().unwrap()]);
        assert_usage(&format!("send --relay {relay}"), &out);
        let out = run_json(
            &w,
            &["receive", "--relay", relay, "7-apple-orbit-violin", "--yes"],
        );
        assert_usage(&format!("receive --relay {relay}"), &out);
    }
}

#[test]
fn force_relay_without_a_relay_is_a_bad_command_line() {
    let w = World::new();
    let f = w.src().join("a.txt");
    fs::write(&f, b"x").unwrap();
    let out = run_json(&w, &["send", "--force-relay", f.to_str().unwrap()]);
    assert_usage("send --force-relay", &out);
    let out = run_json(
        &w,
        &["receive", "--force-relay", "7-apple-orbit-violin", "--yes"],
    );
    assert_usage("receive --force-relay", &out);
}

#[test]
fn a_missing_path_is_an_io_error() {
    let w = World::new();
    let missing = w.src().join("not-there");
    let out = run_json(&w, &["send", missing.to_str().unwrap()]);
    assert_failure("send a missing path", &out, 1, "io");
    let message = event(&events(&out.stdout), "error").unwrap()["message"].clone();
    assert!(message.as_str().unwrap().contains("not-there"), "{message}");
}

#[test]
fn out_naming_a_file_says_so_before_looking_for_the_sender() {
    let w = World::new();
    let file = w.path("a-file");
    fs::write(&file, b"x").unwrap();
    for out_dir in [file.as_path(), Path::new("/dev/null")] {
        let out = run_json(
            &w,
            &[
                "receive",
                "7-apple-orbit-violin",
                "--yes",
                "--out",
                out_dir.to_str().unwrap(),
            ],
        );
        assert_usage(&format!("receive --out {}", out_dir.display()), &out);
        let message = event(&events(&out.stdout), "error").unwrap()["message"].clone();
        let message = message.as_str().unwrap();
        assert!(
            message.contains("not a directory") && !message.contains("os error"),
            "{message}"
        );
    }
}

/// Starts `ferry send` in text mode with `args`, reads its stderr until a line containing `until`, and
/// returns everything read so far; the sender is then ended.
fn sender_hints(w: &World, args: &[&str], until: &str) -> String {
    let f = w.src().join("hint.txt");
    fs::write(&f, b"hint").unwrap();
    let mut child = w
        .cmd()
        .arg("send")
        .args(args)
        .arg(&f)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if lines.read_line(&mut line).unwrap() == 0 {
            break;
        }
        seen.push_str(&line);
        if line.contains(until) {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    seen
}

#[test]
fn hints_for_an_unspecified_listen_address_name_no_unspecified_address() {
    let w = World::new();
    let hints = sender_hints(
        &w,
        &["--code", "62-apple-orbit-violin", "--listen", "0.0.0.0:0"],
        "Listening on",
    );
    assert!(hints.contains("Listening on"), "{hints}");
    assert!(!hints.contains("--peer 0.0.0.0"), "{hints}");
}

#[test]
fn hints_for_a_loopback_listen_address_say_this_machine() {
    let w = World::new();
    let hints = sender_hints(
        &w,
        &["--code", "63-apple-orbit-violin", "--listen", "127.0.0.1:0"],
        "Listening on",
    );
    assert!(hints.contains("--peer 127.0.0.1:"), "{hints}");
    assert!(!hints.contains("another machine"), "{hints}");
}

#[test]
fn hints_name_the_relay_given_on_the_command_line() {
    let w = World::new();
    let mut relay = w.cmd();
    relay.args(["relay", "--listen", "127.0.0.1:0"]);
    let relay = RelayProcess::spawn(relay);
    let hints = sender_hints(
        &w,
        &[
            "--code",
            "64-apple-orbit-violin",
            "--relay",
            &relay.addr.to_string(),
        ],
        "On the other side run:",
    );
    let line = hints
        .lines()
        .find(|l| l.contains("On the other side run:"))
        .unwrap();
    assert!(
        line.contains(&format!(
            "ferry receive --relay {} 64-apple-orbit-violin",
            relay.addr
        )),
        "{hints}"
    );
}

#[test]
fn relay_option_naming_a_sender_says_it_is_no_relay() {
    let w = World::new();
    let f = w.src().join("a.txt");
    fs::write(&f, b"x").unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let listen = format!("127.0.0.1:{port}");
    let mut send = Watched::new(
        w.cmd()
            .args([
                "send",
                "--json",
                "--code",
                "65-apple-orbit-violin",
                "--listen",
                &listen,
            ])
            .arg(&f)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    send.wait_for(|e| e["event"] == "code");
    // Another world: the receiver cannot find the sender on this host, only "through the relay".
    let other = World::new();
    let out = run_json(
        &other,
        &[
            "receive",
            "--force-relay",
            "--relay",
            &listen,
            "65-apple-orbit-violin",
            "--yes",
        ],
    );
    send.signal(libc::SIGTERM);
    let _ = send.finish();
    assert_failure("receive --relay SENDER", &out, 4, "relay");
    let message = event(&events(&out.stdout), "error").unwrap()["message"].clone();
    let message = message.as_str().unwrap();
    assert!(
        !message.contains("unknown status") && message.contains("not a ferry relay"),
        "{message}"
    );
}

/// Entries left in this world's same-host rendezvous directory.
fn registry_entries(w: &World) -> Vec<std::path::PathBuf> {
    list_all(&w.path("runtime/ferry/rendezvous"))
}

fn signal_leaves_no_registry_entry(signal: libc::c_int) {
    let w = World::new();
    let f = w.src().join("a.txt");
    fs::write(&f, b"x").unwrap();
    let mut send = Watched::new(w.spawn_send("66-apple-orbit-violin", &[&f]));
    send.wait_for(|e| e["event"] == "code");
    assert!(
        !registry_entries(&w).is_empty(),
        "the sender announces itself"
    );
    send.signal(signal);
    let out = send.finish();
    assert!(!out.status.success(), "{:?}", out.status);
    assert_eq!(registry_entries(&w), Vec::<std::path::PathBuf>::new());
}

#[test]
fn sigint_leaves_no_registry_entry() {
    signal_leaves_no_registry_entry(libc::SIGINT);
}

#[test]
fn sigterm_leaves_no_registry_entry() {
    signal_leaves_no_registry_entry(libc::SIGTERM);
}

/// A sender (`--json`) of one file of `size` bytes, and a receiver at a terminal asking the question.
fn sender_and_asking_receiver(w: &World, code: &str, size: usize) -> (Watched, Pty) {
    let f = w.src().join("asked.bin");
    fs::write(&f, pseudo_random(size, 7)).unwrap();
    let mut send = Watched::new(w.spawn_send(code, &[&f]));
    send.wait_for(|e| e["event"] == "code");
    let out = w.out();
    let recv = Pty::spawn(w, &["receive", code, "--out", out.to_str().unwrap()]);
    recv.wait_for("Accept? [y/N]");
    (send, recv)
}

/// What the receiver printed after its question.
fn after_question(text: &str) -> &str {
    text.split_once("Accept? [y/N]")
        .map_or("", |(_, rest)| rest)
}

#[test]
fn declining_draws_no_progress_bar() {
    for keys in [&b"n\n"[..], &b"\x04"[..]] {
        let w = World::new();
        let (send, mut recv) = sender_and_asking_receiver(&w, "67-apple-orbit-violin", 3 << 20);
        recv.type_keys(keys);
        let (status, text) = recv.finish();
        let send = send.finish();
        assert_eq!(status, Some(7), "{text}");
        let after = after_question(&text);
        assert!(
            !after.contains("ETA") && !after.contains("B/s"),
            "a stray bar after {keys:?}: {after:?}"
        );
        assert_failure("sender of a declined offer", &send, 7, "declined");
    }
}

#[test]
fn ctrl_c_at_the_question_declines_and_keeps_nothing() {
    let w = World::new();
    let (send, mut recv) = sender_and_asking_receiver(&w, "68-apple-orbit-violin", 3 << 20);
    recv.type_keys(b"\x03");
    let (status, text) = recv.finish();
    let send = send.finish();
    assert_eq!(status, Some(130), "{text}");
    let after = after_question(&text);
    assert!(
        !after.contains("partial data") && !after.contains("ETA"),
        "{after:?}"
    );
    // The terminal echoed ^C after the question: the message starts a line of its own.
    assert!(
        after.contains("\nferry: interrupted at the question"),
        "{after:?}"
    );
    assert_failure(
        "sender when the receiver pressed Ctrl-C",
        &send,
        7,
        "declined",
    );
    assert!(list_all(&w.out()).is_empty(), "{:?}", list_all(&w.out()));
}

/// The seconds of the receiver's "done: ... in S s" line.
fn summary_seconds(text: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.contains("done: received"))
        .unwrap_or_else(|| panic!("no summary in {text:?}"));
    let (_, rest) = line.split_once(" in ").unwrap();
    rest.split(' ').next().unwrap().parse().unwrap()
}

#[test]
fn time_at_the_question_is_not_transfer_time() {
    let w = World::new();
    let (send, mut recv) = sender_and_asking_receiver(&w, "69-apple-orbit-violin", 1 << 20);
    // Think for a while: none of it may count. Causality, not speed: both sides start their clocks
    // after the "y" is typed, so both measure at most the time from typing it to seeing the end.
    std::thread::sleep(Duration::from_millis(1500));
    let typed = Instant::now();
    recv.type_keys(b"y\n");
    let (status, text) = recv.finish();
    let send = send.finish();
    let bound = typed.elapsed().as_secs_f64();
    assert_eq!(status, Some(0), "{text}");
    assert_success("send", &send);
    let receiver = summary_seconds(&text);
    assert!(
        receiver <= bound + 0.01,
        "receiver counted {receiver} s of at most {bound} s: {text}"
    );
    let done = event(&events(&send.stdout), "done").unwrap().clone();
    let sender = done["seconds"].as_f64().unwrap();
    assert!(
        sender <= bound,
        "sender counted {sender} s of at most {bound} s"
    );
}

/// Issue 10, item 10: a cut connection leaves the bar saying "stopped", not a stale rate and
/// "ETA 0s". Deterministic: the sender's `--json` events go into a one-page pipe nobody reads, so
/// the sender blocks within its first few dozen packets of a 1 GiB file (an event per packet, at
/// most one a millisecond), well before the end; the receiver's bar is drawn by then, and the
/// sender is killed.
#[test]
fn a_cut_connection_leaves_no_eta_on_the_bar() {
    let w = World::new();
    let f = w.src().join("big.bin");
    fs::File::create(&f).unwrap().set_len(1 << 30).unwrap();
    let code = "70-apple-orbit-violin";
    let mut send = w.spawn_send(code, &[&f]);
    let pipe = send.stdout.as_ref().unwrap().as_raw_fd();
    // SAFETY: fcntl(2) on a pipe descriptor we own; a failure shows in the return value.
    let rc = unsafe { libc::fcntl(pipe, libc::F_SETPIPE_SZ, 4096) };
    assert!(
        rc >= 4096,
        "F_SETPIPE_SZ: {}",
        std::io::Error::last_os_error()
    );
    let out = w.out();
    let recv = Pty::spawn(
        &w,
        &["receive", code, "--yes", "--out", out.to_str().unwrap()],
    );
    recv.wait_for(" ETA ");
    send.kill().unwrap();
    let _ = send.wait();
    let (status, text) = recv.finish();
    assert_ne!(status, Some(0), "{text}");
    let before_error = text
        .split_once("ferry: ")
        .unwrap_or_else(|| panic!("no error line: {text:?}"))
        .0;
    let last_draw = before_error.rsplit('\r').find(|s| !s.trim().is_empty());
    let last_draw = last_draw.unwrap_or_default();
    assert!(
        last_draw.contains("stopped") && !last_draw.contains("ETA"),
        "the bar's last state: {last_draw:?}"
    );
}

/// As `send --help` and README say: without discovery the sender listens on loopback only.
#[test]
fn without_discovery_the_sender_listens_on_loopback() {
    let w = World::new();
    let f = w.src().join("a.txt");
    fs::write(&f, b"x").unwrap();
    let mut send = Watched::new(w.spawn_send("73-apple-orbit-violin", &[&f]));
    let code = send.wait_for(|e| e["event"] == "code");
    send.signal(libc::SIGTERM);
    let _ = send.finish();
    let listen: std::net::SocketAddr = code["listen"].as_str().unwrap().parse().unwrap();
    assert!(listen.ip().is_loopback(), "listens on {listen}");
}

/// README's receive example: the receiver says how it is connected before it shows the offer.
#[test]
fn the_receiver_says_how_it_is_connected_before_the_offer() {
    let w = World::new();
    let f = w.src().join("a.txt");
    fs::write(&f, b"hello").unwrap();
    let code = "74-apple-orbit-violin";
    let send = finish_in_background(w.spawn_send(code, &[&f]));
    let recv = finish(w.spawn_receive_with(&["--yes"], code, &w.out()));
    assert_success("send", &send.join().unwrap());
    assert_success("receive", &recv);
    let text = String::from_utf8_lossy(&recv.stderr);
    let connected = text.find("Connected directly on this host (127.0.0.1:");
    let offer = text.find("Offer: 1 file");
    assert!(
        matches!((connected, offer), (Some(c), Some(o)) if c < o) && text.contains("aes-256-gcm"),
        "{text}"
    );
}

/// Issue 45: without discovery and without a relay only this machine can reach the sender, so its hint
/// says so and what another machine would need, instead of a command that waits there for nothing.
#[test]
fn without_discovery_or_a_relay_the_hint_names_this_machine() {
    let w = World::new();
    let args = ["--code", "75-apple-orbit-violin"];
    let hints = sender_hints(&w, &args, "run:");
    assert!(
        hints.contains("On this machine run:  ferry receive 75-apple-orbit-violin\n"),
        "{hints}"
    );
    let hints = sender_hints(&w, &args, "Only this");
    let note = hints.lines().last().unwrap();
    assert!(
        note.contains("discovery is off") && note.contains("--relay") && note.contains("--listen"),
        "{note}"
    );
}

/// Issue 45: with `--listen` on loopback the hint is for this machine, and the `--peer` command is printed.
#[test]
fn with_a_loopback_listen_address_the_hint_is_for_this_machine() {
    let w = World::new();
    let hints = sender_hints(
        &w,
        &["--code", "76-apple-orbit-violin", "--listen", "127.0.0.1:0"],
        "Listening on",
    );
    let peer = hints
        .lines()
        .find_map(|l| l.split_once("(ferry receive --peer "))
        .map(|(_, rest)| rest.split(' ').next().unwrap().to_string())
        .unwrap_or_else(|| panic!("no --peer command: {hints}"));
    assert!(peer.starts_with("127.0.0.1:"), "{hints}");
    assert!(hints.contains("On this machine run:"), "{hints}");
}

/// Issue 45: the offer counts the symlinks it holds, as its JSON does, on both sides.
#[test]
fn the_offer_counts_symlinks() {
    let w = World::new();
    let tree = w.src().join("tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    fs::write(tree.join("a.txt"), b"a").unwrap();
    fs::write(tree.join("sub/b.txt"), b"b").unwrap();
    std::os::unix::fs::symlink("a.txt", tree.join("link")).unwrap();
    let code = "77-apple-orbit-violin";
    let send = w
        .cmd()
        .args(["send", "--code", code])
        .arg(&tree)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let send = finish_in_background(send);
    let recv = finish(w.spawn_receive_with(&["--yes"], code, &w.out()));
    let send = send.join().unwrap();
    assert_success("send", &send);
    assert_success("receive", &recv);
    let sent = String::from_utf8_lossy(&send.stderr);
    assert!(
        sent.contains("Sending 2 files, 2 B (2 directories, 1 symlink)."),
        "{sent}"
    );
    let received = String::from_utf8_lossy(&recv.stderr);
    assert!(
        received.contains("Offer: 2 files, 2 directories, 1 symlink, 2 B"),
        "{received}"
    );
}

/// Issue 45: `y` typed at once after the sender went away (before the receiver's watch could say so) ends
/// the same way as a sender noticed while asking, with a line that says why, not with a raw "Broken pipe".
#[test]
fn a_yes_right_after_the_sender_left_is_not_a_broken_pipe() {
    for round in 0..5 {
        let w = World::new();
        let code = format!("{}-apple-orbit-violin", 80 + round);
        let (send, mut recv) = sender_and_asking_receiver(&w, &code, 12);
        send.signal(libc::SIGKILL);
        let _ = send.finish();
        recv.type_keys(b"y\n");
        let (status, text) = recv.finish();
        let after = after_question(&text);
        assert!(!after.contains("Broken pipe"), "round {round}: {after:?}");
        assert!(!after.contains("os error"), "round {round}: {after:?}");
        match status {
            Some(0) => assert_eq!(
                fs::read(w.out().join("asked.bin")).unwrap(),
                pseudo_random(12, 7)
            ),
            Some(4) => {
                assert!(
                    after.contains("the sender is gone"),
                    "round {round}: {after:?}"
                );
                assert!(list_all(&w.out()).is_empty(), "{:?}", list_all(&w.out()));
            }
            other => panic!("round {round}: exit {other:?}: {after:?}"),
        }
    }
}

/// Issue 45: a receiver at the question notices that the sender went away, says so and ends as `peer-gone`
/// (exit 4) without waiting for an answer nobody can use.
#[test]
fn a_sender_gone_at_the_question_ends_it() {
    let w = World::new();
    let (send, recv) = sender_and_asking_receiver(&w, "78-apple-orbit-violin", 12);
    send.signal(libc::SIGKILL);
    let _ = send.finish();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !recv.text().contains("the sender is gone") {
        assert!(
            Instant::now() < deadline,
            "the receiver still asks: {:?}",
            recv.text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, text) = recv.finish();
    assert_eq!(status, Some(4), "{text}");
    assert!(list_all(&w.out()).is_empty(), "{:?}", list_all(&w.out()));
}
