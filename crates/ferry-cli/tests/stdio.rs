//! Issue 10: text messages, standard input and standard output, and `receive -o NAME`, with real
//! `ferry` processes on loopback (no discovery).

mod common;

use std::fs;
use std::io::Write;
use std::process::{Child, Command, Output, Stdio};

use common::*;

const CODE: &str = "7-apple-orbit-violin";

/// `ferry send --json --code CODE ARGS...` with standard input piped.
fn spawn_send_with(w: &World, args: &[&str]) -> Child {
    w.cmd()
        .arg("send")
        .args(["--json", "--code", CODE])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ferry send")
}

/// Starts a sender with `args` that reads `input` on stdin (written from another thread, as a
/// pipe would), then runs `ferry receive ARGS... CODE --out OUT`; returns both outputs.
fn round_trip(
    w: &World,
    send_args: &[&str],
    input: Vec<u8>,
    recv_args: &[&str],
) -> (Output, Output) {
    let mut send = spawn_send_with(w, send_args);
    let mut stdin = send.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let send = finish_in_background(send);
    let recv = finish(w.spawn_receive_with(recv_args, CODE, &w.out()));
    writer.join().unwrap();
    (send.join().unwrap(), recv)
}

/// A text message that a terminal must not get raw: an escape sequence, a tab and UTF-8.
const TEXT: &str = "héllo\n\u{1b}[31mred\ttab\n";

#[test]
fn text_is_printed_exactly_to_a_pipe_without_a_question() {
    let w = World::new();
    // No --yes and no terminal: a file offer would be declined, a text message is shown.
    let (send, recv) = round_trip(&w, &["--text", TEXT], Vec::new(), &[]);
    assert_success("send --text", &send);
    assert_success("receive a text", &recv);
    assert_eq!(
        String::from_utf8_lossy(&recv.stdout),
        TEXT,
        "printed exactly"
    );
    assert!(
        list_all(&w.out()).is_empty(),
        "a text message writes nothing"
    );
    let stderr = String::from_utf8_lossy(&recv.stderr);
    assert!(stderr.contains("Text message, 20 B"), "{stderr}");
    // Issue 45: as README shows it, the text is what the receiver prints; no "received 1 file".
    assert!(!stderr.contains("done:"), "{stderr}");
}

#[test]
fn text_arrives_as_a_json_event() {
    let w = World::new();
    let (send, recv) = round_trip(&w, &["--text", TEXT], Vec::new(), &["--json"]);
    assert_success("send --text", &send);
    assert_success("receive --json a text", &recv);
    let ev = events(&recv.stdout);
    assert_eq!(event(&ev, "offer").unwrap()["text"], true);
    assert_eq!(event(&ev, "text").unwrap()["text"], TEXT);
    assert!(list_all(&w.out()).is_empty());
}

#[test]
fn text_from_stdin_over_the_limit_is_refused_before_a_code() {
    let w = World::new();
    let mut send = spawn_send_with(&w, &["--text", "-"]);
    let mut stdin = send.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&vec![b'x'; (1 << 20) + 1]);
    });
    let out = finish(send);
    writer.join().unwrap();
    assert_failure("send --text - of 1 MiB + 1", &out, 8, "text-too-large");
    assert!(
        event(&events(&out.stdout), "code").is_none(),
        "no code is printed"
    );
    let msg = String::from_utf8_lossy(&out.stdout);
    assert!(msg.contains("more than the limit of 1.00 MiB"), "{msg}");
}

/// Issue 45: the size of a text over the limit is its whole size, in the limit's unit.
#[test]
fn text_over_the_limit_says_its_size_in_the_limits_unit() {
    let w = World::new();
    let mut send = spawn_send_with(&w, &["--text", "-"]);
    let mut stdin = send.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&vec![b'x'; 2 << 20]);
    });
    let out = finish(send);
    writer.join().unwrap();
    assert_failure("send --text - of 2 MiB", &out, 8, "text-too-large");
    let msg = String::from_utf8_lossy(&out.stdout);
    assert!(
        msg.contains(
            "the text message has 2.00 MiB (2097152 bytes), more than the limit of 1.00 MiB (1048576 bytes)"
        ),
        "{msg}"
    );
}

#[test]
fn stdin_arrives_under_its_name() {
    let w = World::new();
    let (send, recv) = round_trip(
        &w,
        &["-", "--name", "x"],
        b"data".to_vec(),
        &["--json", "--yes"],
    );
    assert_success("printf data | ferry send - --name x", &send);
    assert_success("receive", &recv);
    assert_eq!(fs::read(w.out().join("x")).unwrap(), b"data");
    assert_eq!(list_all(&w.out()), [w.out().join("x")]);
}

#[test]
fn large_stdin_to_stdout_through_pipes_is_exact() {
    let w = World::new();
    let data = pseudo_random(64 << 20, 10);
    let (send, recv) = round_trip(&w, &["-"], data.clone(), &["--yes", "-o", "-"]);
    assert_success("ferry send - < 64 MiB", &send);
    assert_success("ferry receive -o - | ...", &recv);
    assert!(
        recv.stdout == data,
        "stdout differs ({} bytes)",
        recv.stdout.len()
    );
    assert!(list_all(&w.out()).is_empty(), "nothing written to --out");
    let stderr = String::from_utf8_lossy(&recv.stderr);
    assert!(stderr.contains("verified"), "{stderr}");
}

#[test]
fn output_name_renames_a_file_and_a_directory() {
    let w = World::new();
    let file = w.src().join("report.txt");
    fs::write(&file, b"numbers").unwrap();
    let tree = w.src().join("photos");
    fs::create_dir_all(tree.join("2024")).unwrap();
    fs::write(tree.join("2024/a.jpg"), pseudo_random(3 << 20, 1)).unwrap();
    std::os::unix::fs::symlink("2024/a.jpg", tree.join("latest")).unwrap();

    for (src, name) in [(&file, "renamed.txt"), (&tree, "pictures")] {
        let send = finish_in_background(w.spawn_send(CODE, &[src]));
        let recv = finish(w.spawn_receive_with(&["--json", "--yes", "-o", name], CODE, &w.out()));
        assert_success("send", &send.join().unwrap());
        assert_success(&format!("receive -o {name}"), &recv);
        assert_same_tree(src, &w.out().join(name));
        let offer = event(&events(&recv.stdout), "offer").unwrap().clone();
        assert_eq!(
            offer["names"],
            serde_json::json!([name]),
            "the offer shows the new name"
        );
    }
    let mut top: Vec<_> = fs::read_dir(w.out())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    top.sort();
    assert_eq!(top, ["pictures", "renamed.txt"]);
}

#[test]
fn output_name_with_two_top_level_items_is_refused_before_accepting() {
    let w = World::new();
    let (a, b) = (w.src().join("a"), w.src().join("b"));
    fs::write(&a, b"1").unwrap();
    fs::create_dir(&b).unwrap();
    let send = finish_in_background(w.spawn_send(CODE, &[&a, &b]));
    let recv = finish(w.spawn_receive_with(&["--json", "--yes", "-o", "one"], CODE, &w.out()));
    let send = send.join().unwrap();
    assert_failure("receive -o one of two items", &recv, 7, "output-mismatch");
    assert!(
        event(&events(&recv.stdout), "offer").is_none(),
        "refused before the question"
    );
    assert_failure("send of two items to -o one", &send, 7, "output-mismatch");
    assert!(list_all(&w.out()).is_empty());
}

#[test]
fn stdout_takes_only_one_regular_file() {
    let w = World::new();
    let d = w.src().join("d");
    fs::create_dir(&d).unwrap();
    let send = finish_in_background(w.spawn_send(CODE, &[&d]));
    let recv = finish(w.spawn_receive_with(&["--yes", "-o", "-"], CODE, &w.out()));
    assert_eq!(recv.status.code(), Some(7), "{recv:?}");
    assert!(recv.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&recv.stderr);
    assert!(
        stderr.contains("a directory \"d\", not a regular file"),
        "{stderr}"
    );
    assert_failure(
        "send of a directory to -o -",
        &send.join().unwrap(),
        7,
        "output-mismatch",
    );
}

#[test]
fn bad_uses_are_refused_as_usage() {
    let w = World::new();
    let run = |args: &[&str]| w.cmd().args(args).output().unwrap();
    for args in [
        &["receive", "--json", "-o", "-", CODE][..],
        &["receive", "-o", "a/b", CODE],
        &["receive", "-o", "..", CODE],
        &["send", "--name", "x", "file"],
        &["send", "-", "--name", "a/b"],
        &["send", "-", "other"],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
}

/// `ferry send -` and `ferry send --text -` with a terminal on standard input (util-linux `script`).
#[test]
fn stdin_from_a_terminal_is_refused() {
    if Command::new("script").arg("--version").output().is_err() {
        return skip(
            "stdin_from_a_terminal_is_refused",
            "util-linux script is not installed",
        );
    }
    let w = World::new();
    for args in [&["send", "-"][..], &["send", "--text", "-"]] {
        let line = std::iter::once(ferry().display().to_string())
            .chain(args.iter().map(|a| a.to_string()))
            .collect::<Vec<_>>()
            .join(" ");
        let mut script = Command::new("script");
        script.args(["-qefc", &line, "/dev/null"]);
        for (k, v) in w.cmd().get_envs() {
            match v {
                Some(v) => script.env(k, v),
                None => script.env_remove(k),
            };
        }
        let child = script
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = finish(child);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {text}");
        assert!(
            text.contains("stdin is a terminal; pipe data in or give a path"),
            "{args:?}: {text}"
        );
    }
}
