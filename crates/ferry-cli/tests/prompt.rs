//! What a person at a terminal sees around the offer: the code prompt of `ferry receive` without CODE
//! (Tab completion through a real pseudo-terminal made by util-linux `script`), the offer's `--list`,
//! and the sender's `--qr`.

mod common;

use std::fs;
use std::process::Stdio;

use common::*;
use serde_json::Value;

/// A running `--json` sender of one small file under `code`, already findable.
fn sender(w: &World, code: &str) -> (Watched, std::path::PathBuf) {
    let f = w.src().join("typed.bin");
    fs::write(&f, pseudo_random(5000, 71)).unwrap();
    let mut send = Watched::new(w.spawn_send(code, &[&f]));
    send.wait_for(|e| e["event"] == "code");
    (send, f)
}

/// `ferry receive --yes --out OUT` without a code, at a terminal, once it asks.
fn prompting_receiver(w: &World) -> Pty {
    let out = w.out();
    let recv = Pty::spawn(w, &["receive", "--yes", "--out", out.to_str().unwrap()]);
    recv.wait_for("Enter the code: ");
    recv
}

#[test]
fn tab_completes_the_code_words_and_the_code_is_used() {
    let w = World::new();
    let (send, f) = sender(&w, "71-apple-orbit-violin");
    let mut recv = prompting_receiver(&w);
    // Each prefix names one word: Tab completes it, with the dash before the next word.
    recv.type_keys(b"71-appl\t");
    recv.wait_for("71-apple-");
    recv.type_keys(b"orbi\tviol\t");
    recv.wait_for("71-apple-orbit-violin");
    recv.type_keys(b"\r");
    let (status, text) = recv.finish();
    assert_eq!(status, Some(0), "{text}");
    assert_success("sender to a typed code", &send.finish());
    assert_same_tree(&f, &w.out().join("typed.bin"));
}

#[test]
fn a_mistyped_code_is_a_bad_code() {
    let w = World::new();
    let mut recv = prompting_receiver(&w);
    recv.type_keys(b"71-zzzz-orbit-violin\r");
    let (status, text) = recv.finish();
    assert_eq!(status, Some(2), "{text}");
    assert!(text.contains("\"zzzz\" is not a code word"), "{text}");
}

#[test]
fn ctrl_c_and_ctrl_d_at_the_code_prompt_end_without_a_backtrace() {
    for (keys, status, says) in [
        (&b"71-app\x03"[..], 130, "interrupted at the code prompt"),
        (&b"\x04"[..], 2, "no code given"),
    ] {
        let w = World::new();
        let mut recv = prompting_receiver(&w);
        recv.type_keys(keys);
        let (got, text) = recv.finish();
        assert_eq!(got, Some(status), "{keys:?}: {text}");
        assert!(text.contains(says) && !text.contains("panicked"), "{text}");
        assert!(list_all(&w.out()).is_empty());
    }
}

/// The processes whose parent is `parent`, from /proc.
fn children_of(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": the command may hold spaces and parentheses; the last ')' ends it.
        let after = &stat[stat.rfind(')').unwrap() + 1..];
        let ppid: u32 = after.split_whitespace().nth(1).unwrap().parse().unwrap();
        if ppid == parent {
            found.push(pid);
        }
    }
    found
}

#[test]
fn sigterm_at_the_code_prompt_puts_the_terminal_back() {
    let w = World::new();
    let out = w.out();
    // The shell stays to print the terminal's settings after ferry ended.
    let line = format!(
        "echo shell=$$; {} receive --yes --out {}; stty -a",
        shell_quote(&ferry().display().to_string()),
        shell_quote(out.to_str().unwrap())
    );
    let recv = Pty::spawn_line(&w, &line);
    recv.wait_for("Enter the code: ");
    let text = recv.text();
    let shell: u32 = text
        .split("shell=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no shell pid in {text:?}"));
    let receivers = children_of(shell);
    assert_eq!(receivers.len(), 1, "the shell's children: {receivers:?}");
    // SAFETY: kill(2) with a pid this test started (the shell's only child, ferry) and a valid signal.
    assert_eq!(unsafe { libc::kill(receivers[0] as i32, libc::SIGTERM) }, 0);
    let (_, text) = recv.finish();
    let flags: Vec<&str> = text.split_whitespace().collect();
    for flag in ["icanon", "echo"] {
        assert!(
            flags.contains(&flag),
            "{flag} is off after ferry ended at its prompt:\n{text}"
        );
    }
}

#[test]
fn without_a_terminal_the_code_must_be_given() {
    let w = World::new();
    for json in [true, false] {
        let mut cmd = w.cmd();
        cmd.arg("receive");
        if json {
            cmd.arg("--json");
        }
        let out = finish(
            cmd.arg("--out")
                .arg(w.out())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        if json {
            assert_failure("receive without a code", &out, 2, "usage");
        } else {
            assert_eq!(out.status.code(), Some(2));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("give the code"), "{stderr}");
        }
    }
}

#[test]
fn a_waiting_receiver_shows_a_spinner_at_a_terminal() {
    let w = World::new();
    let out = w.out();
    let recv = Pty::spawn(
        &w,
        &[
            "receive",
            "--wait",
            "2s",
            "76-apple-orbit-violin",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let (status, text) = recv.finish();
    assert_eq!(status, Some(4), "{text}");
    assert!(
        text.contains("Waiting for the sender...") && text.contains("no sender for nameplate 76"),
        "{text}"
    );
}

/// A tree with nested files, an empty directory, a symlink and a name with a terminal escape.
fn listed_tree(w: &World) -> std::path::PathBuf {
    let root = w.src().join("tree");
    fs::create_dir_all(root.join("sub/deeper")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("a.txt"), b"hello").unwrap();
    fs::write(root.join("sub/deeper/b.bin"), pseudo_random(3000, 5)).unwrap();
    fs::write(root.join("sub/\x1b[31mred"), b"x").unwrap();
    std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
    root
}

const LISTED: &[&str] = &[
    "tree",
    "tree/a.txt",
    "tree/empty",
    "tree/link",
    "tree/sub",
    "tree/sub/\x1b[31mred",
    "tree/sub/deeper",
    "tree/sub/deeper/b.bin",
];

#[test]
fn list_names_every_entry_in_the_offer() {
    let w = World::new();
    let root = listed_tree(&w);

    // JSON: the offer's `entries`, exact paths, only with --list.
    for (code, list) in [
        ("72-apple-orbit-violin", true),
        ("73-apple-orbit-violin", false),
    ] {
        let send = finish_in_background(w.spawn_send(code, &[&root]));
        let out = w.path(code);
        let args: &[&str] = if list {
            &["--json", "--yes", "--list"]
        } else {
            &["--json", "--yes"]
        };
        let recv = finish(w.spawn_receive_with(args, code, &out));
        assert_success("receive --json", &recv);
        assert_success("send", &send.join().unwrap());
        let ev = events(&recv.stdout);
        let offer = event(&ev, "offer").unwrap();
        if list {
            let mut entries: Vec<&str> = offer["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            entries.sort();
            assert_eq!(entries, LISTED);
        } else {
            assert_eq!(offer.get("entries"), None::<&Value>);
        }
    }

    // Text: one line per entry before the question, escaped, files with their sizes.
    let code = "74-apple-orbit-violin";
    let send = finish_in_background(w.spawn_send(code, &[&root]));
    let recv = finish(w.spawn_receive_with(&["--yes", "--list"], code, &w.out()));
    assert_success("receive --list", &recv);
    assert_success("send", &send.join().unwrap());
    let stderr = String::from_utf8_lossy(&recv.stderr);
    assert!(
        !stderr.contains('\x1b'),
        "a raw escape reached the terminal: {stderr:?}"
    );
    for line in [
        "5 B  tree/a.txt",
        "2.93 KiB  tree/sub/deeper/b.bin",
        "1 B  tree/sub/\\x1b[31mred",
        "  tree/empty/",
        "  tree/link -> a.txt",
    ] {
        assert!(
            stderr.lines().any(|l| l.ends_with(line)),
            "no line ending in {line:?} in:\n{stderr}"
        );
    }
}

/// The QR code drawn with half blocks in `text`, read back into its text with a QR decoder.
fn decode_qr(text: &str) -> String {
    let rows: Vec<Vec<char>> = text
        .lines()
        .filter(|l| l.chars().count() > 20 && l.chars().all(|c| " █▀▄".contains(c)))
        .map(|l| l.chars().collect())
        .collect();
    assert!(!rows.is_empty(), "no QR code in:\n{text}");
    // Each character is two modules, one above the other; a drawn half is a light module (the
    // terminal's text colour on its dark background).
    let modules: Vec<Vec<bool>> = rows
        .iter()
        .flat_map(|r| {
            let top = r.iter().map(|&c| c == '█' || c == '▀').collect();
            let bottom = r.iter().map(|&c| c == '█' || c == '▄').collect();
            [top, bottom]
        })
        .collect();
    const SCALE: usize = 4;
    let (w, h) = (modules[0].len() * SCALE, modules.len() * SCALE);
    let mut image = rqrr::PreparedImage::prepare_from_greyscale(w, h, |x, y| {
        let light = modules[y / SCALE].get(x / SCALE).copied().unwrap_or(true);
        if light {
            255
        } else {
            0
        }
    });
    let grids = image.detect_grids();
    assert_eq!(grids.len(), 1, "QR codes found in:\n{text}");
    grids[0].decode().expect("a readable QR code").1
}

#[test]
fn qr_shows_the_receivers_command() {
    let w = World::new();
    let code = "75-apple-orbit-violin";
    let f = w.src().join("q.txt");
    fs::write(&f, b"q").unwrap();
    let spawn = |qr: bool| {
        let mut cmd = w.cmd();
        cmd.args(["send", "--json", "--code", code]);
        if qr {
            cmd.arg("--qr");
        }
        Watched::new(
            cmd.arg(&f)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    };
    for qr in [true, false] {
        let mut send = spawn(qr);
        send.wait_for(|e| e["event"] == "code");
        let out = w.path(if qr { "with" } else { "without" });
        assert_success("receive", &finish(w.spawn_receive(code, &out)));
        let send = send.finish();
        assert_success("send --qr", &send);
        let stderr = String::from_utf8_lossy(&send.stderr);
        if qr {
            assert_eq!(decode_qr(&stderr), format!("ferry receive {code}"));
        } else {
            assert!(
                !stderr.contains('█'),
                "a QR code nobody asked for:\n{stderr}"
            );
        }
    }
}
