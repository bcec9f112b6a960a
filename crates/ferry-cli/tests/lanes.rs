//! Lanes end to end: real `ferry send` and `ferry receive` processes over loopback, the data spread over
//! several TCP connections of one session and put back in order.

mod common;

use std::fs;
use std::process::Stdio;

use common::*;

/// A file of several MiB (many full packets, so every lane carries some) and a tree of small files.
fn source(w: &World) -> std::path::PathBuf {
    let root = w.src().join("payload");
    fs::create_dir_all(root.join("small/deeper")).unwrap();
    fs::write(root.join("big.bin"), pseudo_random(24 << 20, 7)).unwrap();
    for i in 0..300 {
        let dir = if i % 2 == 0 { "small" } else { "small/deeper" };
        fs::write(
            root.join(dir).join(format!("f{i}")),
            pseudo_random(100 + i * 37, i as u64),
        )
        .unwrap();
    }
    root
}

/// `ferry send --json --lanes SEND` and `ferry receive --json --yes [--lanes RECV]`; both outputs.
fn transfer_on_lanes(
    w: &World,
    code: &str,
    src: &std::path::Path,
    send_lanes: &str,
    recv_lanes: Option<&str>,
) -> (std::process::Output, std::process::Output) {
    let send = w
        .cmd()
        .args(["send", "--json", "--lanes", send_lanes, "--code", code])
        .arg(src)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ferry send");
    let send = finish_in_background(send);
    let mut args = vec!["--json", "--yes"];
    if let Some(n) = recv_lanes {
        args.extend(["--lanes", n]);
    }
    let recv = finish(w.spawn_receive_with(&args, code, &w.out()));
    (send.join().expect("send output"), recv)
}

#[test]
fn four_lanes_carry_a_file_and_a_tree_byte_identical() {
    let w = World::new();
    let src = source(&w);
    let (send, recv) = transfer_on_lanes(&w, "21-apple-orbit-violin", &src, "4", Some("4"));
    assert_success("send", &send);
    assert_success("receive", &recv);
    assert_same_tree(&src, &w.out().join("payload"));
    let ev = events(&send.stdout);
    let lanes = event(&ev, "lanes").expect("the sender reports its lanes");
    // Lanes join while the data flows (dialled once the receiver read the lane count), so a loaded machine
    // may finish before the last one joined; more than one carried data.
    let n = lanes["lanes"].as_u64().unwrap();
    assert!((2..=4).contains(&n), "lanes: {lanes}");
}

#[test]
fn a_receiver_that_allows_one_lane_still_receives_everything() {
    let w = World::new();
    let src = source(&w);
    let (send, recv) = transfer_on_lanes(&w, "22-apple-orbit-violin", &src, "4", Some("1"));
    assert_success("send", &send);
    assert_success("receive", &recv);
    assert_same_tree(&src, &w.out().join("payload"));
    // The sender's lane 0 carried it all, with lane headers; no other lane was dialled.
    assert!(event(&events(&send.stdout), "lanes").is_none());
}

#[test]
fn lanes_one_is_the_plain_session() {
    let w = World::new();
    let src = source(&w);
    let (send, recv) = transfer_on_lanes(&w, "23-apple-orbit-violin", &src, "1", None);
    assert_success("send", &send);
    assert_success("receive", &recv);
    assert_same_tree(&src, &w.out().join("payload"));
}

#[test]
fn a_lane_count_out_of_range_is_a_usage_error() {
    let w = World::new();
    let out = w
        .cmd()
        .args(["send", "--lanes", "17", "--code", "24-apple-orbit-violin"])
        .arg(w.src())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = w
        .cmd()
        .args(["send", "--lanes", "0", "--code", "24-apple-orbit-violin"])
        .arg(w.src())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
