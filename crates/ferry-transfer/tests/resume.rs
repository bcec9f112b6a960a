//! A cut transfer, run again, sends only what is missing, and verifies what it keeps.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

const MIB: u64 = 1 << 20;
const A: usize = 1000;
const B: usize = 5 * MIB as usize + 123;
const C: usize = 3000;

struct Setup {
    t: TempDir,
    root: PathBuf,
    out: PathBuf,
}

/// A tree of three files, sent once over a connection cut after 3.5 MiB.
fn cut_once() -> Setup {
    let t = TempDir::new("resume");
    let root = t.join("top");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("a"), data(A, 1)).unwrap();
    fs::write(root.join("b"), data(B, 2)).unwrap();
    fs::write(root.join("c"), data(C, 3)).unwrap();
    let out = t.join("out");
    let (s, r) = run_cut(
        &[&root],
        &opts(&out, &t.join("cache")),
        Some(3 * MIB as usize + MIB as usize / 2),
    );
    assert!(s.is_err(), "{s:?}");
    assert!(r.is_err(), "{r:?}");
    assert_eq!(
        fs::read(out.join("top/a")).unwrap(),
        data(A, 1),
        "a finished before the cut"
    );
    assert!(
        !out.join("top/b").exists(),
        "no half-written file under its final name"
    );
    assert!(!out.join("top/c").exists());
    assert!(out.join("top/.b.ferry-part").exists(), "partial data kept");
    assert!(!listing(&t.join("cache")).is_empty(), "partial state kept");
    Setup { t, root, out }
}

fn finish(s: &Setup) -> (ferry_transfer::SendReport, ferry_transfer::ReceiveReport) {
    let (sent, received) = run(&[&s.root], &opts(&s.out, &s.t.join("cache")));
    let (sent, received) = (sent.unwrap(), received.unwrap());
    for name in ["a", "b", "c"] {
        assert_eq!(
            fs::read(s.out.join("top").join(name)).unwrap(),
            fs::read(s.root.join(name)).unwrap(),
            "{name}"
        );
    }
    assert_eq!(
        listing(&s.out),
        vec!["top", "top/a", "top/b", "top/c"],
        "no temporary file left"
    );
    assert!(
        listing(&s.t.join("cache")).is_empty(),
        "partial state cleaned up"
    );
    assert_eq!(sent.bytes_sent + sent.bytes_resumed, (A + B + C) as u64);
    assert_eq!(received.bytes_received, sent.bytes_sent);
    assert_eq!(received.bytes_resumed, sent.bytes_resumed);
    (sent, received)
}

#[test]
fn second_run_sends_only_the_missing_part() {
    let s = cut_once();
    let (sent, _) = finish(&s);
    // `a` was finished, `b` kept its first two verified chunks.
    assert_eq!(sent.bytes_resumed, A as u64 + 2 * MIB);
    assert_eq!(sent.bytes_sent, B as u64 - 2 * MIB + C as u64);
}

#[test]
fn corrupted_partial_data_is_not_claimed() {
    let s = cut_once();
    let part = s.out.join("top/.b.ferry-part");
    let mut bytes = fs::read(&part).unwrap();
    bytes[10] ^= 1;
    fs::write(&part, bytes).unwrap();
    let (sent, _) = finish(&s);
    assert_eq!(sent.bytes_resumed, A as u64, "b sent again in full");
}

#[test]
fn source_change_in_a_kept_chunk_is_resent_from_there() {
    let s = cut_once();
    let src = s.root.join("b");
    let meta = fs::metadata(&src).unwrap();
    let mut bytes = fs::read(&src).unwrap();
    bytes[(MIB + MIB / 2) as usize] ^= 0xff;
    fs::write(&src, &bytes).unwrap();
    // Same size and mtime: the offer is the same, only the sender's data differs.
    let mtime =
        SystemTime::UNIX_EPOCH + Duration::new(meta.mtime() as u64, meta.mtime_nsec() as u32);
    fs::File::open(&src).unwrap().set_modified(mtime).unwrap();
    let (sent, _) = finish(&s);
    assert_eq!(sent.bytes_resumed, A as u64 + MIB, "only chunk 0 kept");
}

#[test]
fn finished_file_changed_at_destination_is_a_conflict() {
    let s = cut_once();
    fs::write(s.out.join("top/a"), b"edited by the user").unwrap();
    let (_, r) = run(&[&s.root], &opts(&s.out, &s.t.join("cache")));
    assert!(
        matches!(r, Err(ferry_transfer::TransferError::Conflict { ref path }) if path == "top/a"),
        "{r:?}"
    );
    assert_eq!(
        fs::read(s.out.join("top/a")).unwrap(),
        b"edited by the user"
    );
}
