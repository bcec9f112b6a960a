//! A cut transfer, run again, sends only what is missing, and verifies what it keeps.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
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
    assert!(part_of(&out.join("top"), "b").exists(), "partial data kept");
    assert!(!listing(&t.join("cache")).is_empty(), "partial state kept");
    Setup { t, root, out }
}

/// The temporary file of `name` in `dir` (`.NAME.ferry-part-TOKEN`).
fn part_of(dir: &std::path::Path, name: &str) -> PathBuf {
    let prefix = format!(".{name}.ferry-part-");
    let found: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&prefix)
        })
        .collect();
    assert!(found.len() <= 1, "{found:?}");
    found.into_iter().next().unwrap_or_else(|| dir.join(prefix))
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
    let part = part_of(&s.out.join("top"), "b");
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

/// Issue 9, item 3: a directory that existed before the transfer keeps its mode and times, also
/// in a resumed run (which used to apply the sender's to every offered directory), and even with
/// `overwrite`.
#[test]
fn a_resumed_run_leaves_an_existing_directory_alone() {
    let t = TempDir::new("resume-existing");
    let root = t.join("top");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("a"), data(A, 1)).unwrap();
    fs::write(root.join("b"), data(B, 2)).unwrap();
    fs::set_permissions(&root, fs::Permissions::from_mode(0o777)).unwrap();
    let out = t.join("out");
    let existing = out.join("top");
    fs::create_dir_all(&existing).unwrap();
    fs::set_permissions(&existing, fs::Permissions::from_mode(0o700)).unwrap();
    // The sender's time for it; the kernel itself updates its mtime as files are added.
    let mtime = SystemTime::UNIX_EPOCH + Duration::new(1_500_000_000, 7);
    fs::File::open(&root).unwrap().set_modified(mtime).unwrap();
    let mut o = opts(&out, &t.join("cache"));
    o.overwrite = true;

    let (s, r) = run_cut(&[&root], &o, Some(2 * MIB as usize));
    assert!(s.is_err() && r.is_err(), "{s:?} {r:?}");
    let (s, r) = run(&[&root], &o);
    s.unwrap();
    assert!(r.unwrap().bytes_resumed > 0, "the second run resumed");
    assert_eq!(fs::read(existing.join("b")).unwrap(), data(B, 2));
    let md = fs::metadata(&existing).unwrap();
    assert_eq!(
        md.mode() & 0o7777,
        0o700,
        "an existing directory was chmodded"
    );
    assert_ne!(
        md.modified().unwrap(),
        mtime,
        "an existing directory was re-timed"
    );
}

/// A resumed file is checked like any other: a same-size change after the walk (mtime put back)
/// is `SourceChanged`, whether the receiver claims the whole file (`a`) or its first chunks (`b`).
#[test]
fn a_resumed_file_changed_after_the_walk_is_refused() {
    for name in ["a", "b"] {
        let s = cut_once();
        let walked = ferry_transfer::walk(&[&s.root]).unwrap();
        let src = s.root.join(name);
        let meta = fs::metadata(&src).unwrap();
        let f = fs::OpenOptions::new().write(true).open(&src).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"CHANGED!", 100).unwrap();
        let mtime =
            SystemTime::UNIX_EPOCH + Duration::new(meta.mtime() as u64, meta.mtime_nsec() as u32);
        f.set_modified(mtime).unwrap();
        drop(f);
        let (sent, received) = run_walked(walked, &opts(&s.out, &s.t.join("cache")), None);
        match sent {
            Err(ferry_transfer::TransferError::SourceChanged { path }) => {
                assert!(path.ends_with(name), "{name}: {path}")
            }
            other => panic!("{name}: sender gave {other:?}"),
        }
        assert!(received.is_err(), "{name}: the receiver must not succeed");
    }
}
