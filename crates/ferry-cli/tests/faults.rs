//! Faults around a real transfer: a peer that is not ferry, a full disk, Ctrl-C on either side,
//! and the `--json` event contract that scripts rely on.

mod common;

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::process::Output;
use std::time::Duration;

use common::*;
use ferry_rendezvous::local::Announcement;
use ferry_rendezvous::Code;
use serde_json::Value;

/// A listener on 127.0.0.1 announced under `code` that answers every connection with `reply` and
/// then reads until the peer goes away (or closes at once when `linger` is false).
fn spawn_impostor(w: &World, code: &str, reply: Vec<u8>, linger: bool) -> Announcement {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let code: Code = code.parse().unwrap();
    let announcement = w.announce(&code, listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else {
            return;
        };
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let _ = s.write_all(&reply);
        if linger {
            let _ = std::io::copy(&mut s, &mut std::io::sink());
        }
    });
    announcement
}

/// `ferry receive` against something that is not a ferry sender: a clear `not-ferry`, exit 4,
/// quickly, and nothing written.
fn receive_from_impostor(reply: Vec<u8>, linger: bool) {
    let w = World::new();
    let code = "9-apple-orbit-violin";
    let _impostor = spawn_impostor(&w, code, reply, linger);
    let recv = finish_measured(w.spawn_receive(code, &w.out()));
    if linger {
        assert_failure("receive from an impostor", &recv.output, 4, "not-ferry");
    } else {
        // An impostor that hangs up at once may reset the connection before its banner is read:
        // then the receiver can only say the peer is gone. Either way: exit 4, a clear code.
        let code = event(&events(&recv.output.stdout), "error").map(|e| e["code"].clone());
        let code = code
            .as_ref()
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        assert!(
            recv.output.status.code() == Some(4) && (code == "not-ferry" || code == "peer-gone"),
            "expected exit 4 with not-ferry or peer-gone, got {:?} and {code:?}",
            recv.output.status
        );
    }
    assert!(
        recv.elapsed < Duration::from_secs(10),
        "took {:?}",
        recv.elapsed
    );
    assert!(list_all(&w.out()).is_empty(), "{:?}", list_all(&w.out()));
}

#[test]
fn garbage_speaking_listener_is_not_ferry() {
    // More than a key share, the longest garbage and a terminator: the handshake must give up on
    // the missing terminator, not wait for more.
    let mut garbage = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n".to_vec();
    garbage.extend(pseudo_random(16 << 10, 9));
    receive_from_impostor(garbage, true);
}

#[test]
fn listener_that_sends_a_banner_and_hangs_up_is_not_ferry() {
    receive_from_impostor(b"SSH-2.0-OpenSSH_9.6\r\n".to_vec(), false);
}

#[test]
fn disk_full_keeps_the_partial_file_and_resumes_once_space_is_free() {
    let w = World::new();
    let disk = match Tmpfs::mount(&w.path("disk"), "16m") {
        Ok(d) => d,
        Err(reason) => return skip("disk_full", &reason),
    };
    let out = disk.dir.join("out");
    // About 3 MiB stay free for a 5 MiB file.
    let filler = disk.dir.join("filler");
    fs::write(&filler, vec![1u8; 13 << 20]).unwrap();
    let f = w.src().join("five.bin");
    fs::write(&f, pseudo_random(5 << 20, 6)).unwrap();
    let code = "51-apple-orbit-violin";

    // Past the check before accepting (see space.rs), the disk fills up during the data.
    let (send, recv) = w.transfer_with(code, &[&f], &out, &["--no-space-check"]);
    assert_failure("receive into a full disk", &recv, 6, "disk-full");
    assert!(!send.status.success(), "the sender must not report success");
    assert!(!out.join("five.bin").exists(), "no final name when cut");
    let parts = partial_files(&out);
    assert_eq!(parts.len(), 1, "the partial data is kept: {parts:?}");
    let kept = fs::metadata(&parts[0]).unwrap().len();
    assert!(kept > 0, "partial file is empty");

    fs::remove_file(&filler).unwrap();
    let (send, recv) = w.transfer(code, &[&f], &out);
    assert_success("send after freeing space", &send);
    assert_success("receive after freeing space", &recv);
    assert_same_tree(&f, &out.join("five.bin"));
    let resumed = event(&events(&recv.stdout), "done").unwrap()["bytes_resumed"]
        .as_u64()
        .unwrap();
    assert!(
        resumed > 0 && resumed <= kept,
        "resumed {resumed} of the {kept} bytes kept by the disk-full run: its partial data was not reused"
    );
    assert!(partial_files(&out).is_empty(), "temporary file left");
    drop(disk);
}

/// Interrupts one side with SIGINT once it reports 30 % of a 256 MiB file: it exits 130 with an
/// `interrupted` event, the other side reports `peer-gone`, and running both again resumes.
fn interrupt_and_resume(interrupt_receiver: bool, nameplate: u32) {
    let w = World::new();
    let f = w.src().join("big.bin");
    let size = 256u64 << 20;
    fs::write(&f, pseudo_random(size as usize, 7)).unwrap();
    let code = format!("{nameplate}-apple-orbit-violin");

    let send = Watched::new(w.spawn_send(&code, &[&f]));
    let recv = Watched::new(w.spawn_receive(&code, &w.out()));
    let (mut target, other) = if interrupt_receiver {
        (recv, send)
    } else {
        (send, recv)
    };
    let other = std::thread::spawn(move || other.finish());
    target.wait_for(|e| {
        e["event"] == "progress" && e["bytes_done"].as_u64().unwrap_or(0) * 10 >= size * 3
    });
    target.signal(libc::SIGINT);
    let (target, other) = (target.finish(), other.join().unwrap());
    let (who, peer) = if interrupt_receiver {
        ("receiver", "sender")
    } else {
        ("sender", "receiver")
    };
    assert_failure(&format!("interrupted {who}"), &target, 130, "interrupted");
    assert_failure(
        &format!("{peer} of an interrupted {who}"),
        &other,
        4,
        "peer-gone",
    );
    // Issue 45: both sides say what happened and how to go on, in words; a sender keeps no data.
    let message = |out: &Output| {
        event(&events(&out.stdout), "error").unwrap()["message"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (said, heard) = (message(&target), message(&other));
    assert!(
        (said.contains("kept") || said.contains("keeps")) && said.contains("resume"),
        "{said}"
    );
    assert!(!said.contains("partial data"), "{said}");
    assert!(
        heard.starts_with(&format!("the {who} is gone")) && heard.contains("resume"),
        "{heard}"
    );
    assert!(!w.out().join("big.bin").exists(), "no final name when cut");
    assert_eq!(partial_files(&w.out()).len(), 1, "partial data kept");

    let (send, recv) = w.transfer(&code, &[&f], &w.out());
    assert_success("resumed send", &send);
    assert_success("resumed receive", &recv);
    assert_same_tree(&f, &w.out().join("big.bin"));
    let resumed = event(&events(&recv.stdout), "done").unwrap()["bytes_resumed"]
        .as_u64()
        .unwrap();
    assert!(resumed > 0, "nothing kept from the interrupted run");
    assert!(partial_files(&w.out()).is_empty(), "temporary file left");
}

#[test]
fn ctrl_c_on_the_receiver_exits_130_and_resumes() {
    interrupt_and_resume(true, 61);
}

#[test]
fn ctrl_c_on_the_sender_exits_130_and_resumes() {
    interrupt_and_resume(false, 62);
}

/// Every stdout line is a JSON object with a string `event` field; returns the event names.
fn event_names(side: &str, out: &Output) -> Vec<String> {
    String::from_utf8(out.stdout.clone())
        .unwrap_or_else(|e| panic!("{side}: stdout is not UTF-8: {e}"))
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{side}: not a JSON line: {line:?}: {e}"));
            v["event"]
                .as_str()
                .unwrap_or_else(|| panic!("{side}: no \"event\" field: {line}"))
                .to_string()
        })
        .collect()
}

#[test]
fn json_events_follow_the_contract() {
    let w = World::new();
    let f = w.src().join("contract.bin");
    let size = 8u64 << 20;
    fs::write(&f, pseudo_random(size as usize, 8)).unwrap();
    let code = "71-apple-orbit-violin";
    let (send, recv) = w.transfer(code, &[&f], &w.out());
    assert_success("send", &send);
    assert_success("receive", &recv);
    assert_same_tree(&f, &w.out().join("contract.bin"));

    let names = event_names("sender", &send);
    assert_eq!(names.first().map(String::as_str), Some("code"), "{names:?}");
    assert_eq!(names.last().map(String::as_str), Some("done"), "{names:?}");
    let first = &events(&send.stdout)[0];
    assert_eq!(first["code"], code);
    let listen: std::net::SocketAddr = first["listen"].as_str().unwrap().parse().unwrap();
    assert!(listen.ip().is_loopback(), "listens on {listen}");

    // Receiver: (connected) offer progress* file-done done, nothing after done.
    let names = event_names("receiver", &recv);
    let body: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .skip_while(|&n| n == "connected")
        .collect();
    let progress = body.iter().filter(|&&n| n == "progress").count();
    let mut expected = vec!["offer"];
    expected.extend(std::iter::repeat_n("progress", progress));
    expected.extend(["file-done", "done"]);
    assert_eq!(body, expected, "receiver events");
    assert!(progress >= 1, "an 8 MiB file reports progress");

    let ev = events(&recv.stdout);
    assert_eq!(event(&ev, "offer").unwrap()["files"], 1);
    assert_eq!(event(&ev, "offer").unwrap()["bytes"], size);
    let mut last = 0;
    for p in ev.iter().filter(|e| e["event"] == "progress") {
        let done = p["bytes_done"].as_u64().unwrap();
        assert!(
            done >= last && done <= size,
            "progress went {last} → {done}"
        );
        assert_eq!(p["bytes_total"], size);
        last = done;
    }
    let file_done = event(&ev, "file-done").unwrap();
    assert_eq!(
        (file_done["path"].as_str(), file_done["bytes"].as_u64()),
        (Some("contract.bin"), Some(size))
    );
    let done = event(&ev, "done").unwrap();
    assert_eq!(
        (done["files"].as_u64(), done["bytes"].as_u64()),
        (Some(1), Some(size))
    );
    assert_eq!(done["bytes_resumed"], 0);
}

#[test]
fn json_events_of_a_tree_report_every_file_once() {
    let w = World::new();
    let root = w.src().join("tree");
    let files = ["a.bin", "sub/b.bin", "sub/deeper/c.bin"];
    for (i, rel) in files.iter().enumerate() {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, pseudo_random((i + 1) << 20, i as u64 + 20)).unwrap();
    }
    let (send, recv) = w.transfer("72-apple-orbit-violin", &[&root], &w.out());
    assert_success("send", &send);
    assert_success("receive", &recv);
    event_names("sender", &send);
    let names = event_names("receiver", &recv);
    let offer = names.iter().position(|n| n == "offer").expect("offer");
    assert_eq!(names.last().map(String::as_str), Some("done"), "{names:?}");
    assert!(names[..offer].iter().all(|n| n == "connected"), "{names:?}");
    let mut done: Vec<String> = events(&recv.stdout)
        .iter()
        .filter(|e| e["event"] == "file-done")
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    done.sort();
    let mut want: Vec<String> = files.iter().map(|f| format!("tree/{f}")).collect();
    want.sort();
    assert_eq!(done, want, "one file-done per file");
}

/// Issue 45: a resumed tree's summary counts the files kept whole from the cut run apart from those that
/// moved, so that moved, kept and identical add up to the offer.
#[test]
fn a_resumed_summary_counts_what_was_kept() {
    let w = World::new();
    let tree = w.src().join("tree");
    fs::create_dir_all(&tree).unwrap();
    for i in 0..5 {
        fs::write(tree.join(format!("a{i}.bin")), pseudo_random(3 << 20, i)).unwrap();
    }
    let size = 256u64 << 20;
    fs::write(tree.join("big.bin"), pseudo_random(size as usize, 7)).unwrap();
    let code = "63-apple-orbit-violin";
    let send = Watched::new(w.spawn_send(code, &[&tree]));
    let mut recv = Watched::new(w.spawn_receive(code, &w.out()));
    let send = std::thread::spawn(move || send.finish());
    recv.wait_for(|e| {
        e["event"] == "progress" && e["bytes_done"].as_u64().unwrap_or(0) * 10 >= size * 3
    });
    recv.signal(libc::SIGINT);
    let _ = (recv.finish(), send.join().unwrap());

    let send = finish_in_background(w.spawn_send(code, &[&tree]));
    let recv = finish(w.spawn_receive_with(&["--yes"], code, &w.out()));
    assert_success("resumed send", &send.join().unwrap());
    assert_success("resumed receive", &recv);
    assert_same_tree(&tree, &w.out().join("tree"));
    let text = String::from_utf8_lossy(&recv.stderr);
    let done = text
        .lines()
        .find(|l| l.contains("done: received"))
        .unwrap_or_else(|| panic!("no summary: {text}"));
    assert!(
        done.contains("done: received 1 file,") && done.contains("kept from before: 5 whole files"),
        "{done}"
    );
}
