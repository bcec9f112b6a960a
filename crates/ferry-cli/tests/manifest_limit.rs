//! `ferry receive --max-manifest`: an offer whose file list needs more memory than the limit is
//! refused before it is shown, and raising the limit accepts it (real `ferry send` and `receive`).

mod common;

use std::fs;
use std::path::Path;
use std::process::{Output, Stdio};

use common::*;

/// `ferry receive --json --yes --max-manifest LIMIT CODE --out OUT`, with `ferry send` alongside.
fn transfer_with_limit(w: &World, code: &str, src: &Path, limit: &str) -> (Output, Output) {
    let send = finish_in_background(w.spawn_send(code, &[src]));
    let recv = finish(
        w.cmd()
            .args(["receive", "--json", "--yes", "--max-manifest", limit, code])
            .arg("--out")
            .arg(w.out())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ferry receive"),
    );
    (send.join().expect("send output"), recv)
}

#[test]
fn manifest_just_over_the_limit_is_refused_and_a_raised_limit_accepts_it() {
    let w = World::new();
    let root = w.src().join("tree");
    fs::create_dir(&root).unwrap();
    for i in 0..2_000 {
        fs::write(root.join(format!("file-{i:05}.txt")), i.to_string()).unwrap();
    }
    // What the receiver will count for this offer: the same walk `ferry send` makes.
    let cost = ferry_transfer::walk(&[&root])
        .unwrap()
        .manifest
        .received_cost();

    let (send, recv) =
        transfer_with_limit(&w, "21-apple-orbit-violin", &root, &(cost - 1).to_string());
    assert_failure("one byte over the limit", &recv, 8, "manifest-too-large");
    assert!(
        event(&events(&recv.stdout), "offer").is_none(),
        "shown before it was refused"
    );
    assert!(list_all(&w.out()).is_empty(), "written into --out");
    // The sender learns why.
    assert_failure(
        "the sender of a refused offer",
        &send,
        8,
        "manifest-too-large",
    );

    let (send, recv) = transfer_with_limit(&w, "22-apple-orbit-violin", &root, &cost.to_string());
    assert_success("send", &send);
    assert_success("receive at exactly the limit", &recv);
    assert_same_tree(&root, &w.out().join("tree"));
}

#[test]
fn a_bad_size_is_a_usage_error() {
    let w = World::new();
    let out = w
        .cmd()
        .args(["receive", "--max-manifest", "lots", "1-apple-orbit-violin"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-manifest"));
}
