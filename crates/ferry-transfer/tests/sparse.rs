//! Sparse files arrive sparse with their whole content verified, also when resumed; large files
//! that are not sparse get their space reserved as they start.

mod common;

use common::*;
use std::fs::{self, File};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

const MIB: u64 = 1 << 20;

/// Creates a file of `size` bytes that holds `extents` (offset, length) of pseudo-random data and
/// holes everywhere else.
fn sparse_file(path: &Path, size: u64, extents: &[(u64, usize)]) {
    let f = File::create(path).unwrap();
    f.set_len(size).unwrap();
    for (i, &(offset, len)) in extents.iter().enumerate() {
        f.write_all_at(&data(len, 40 + i as u64), offset).unwrap();
    }
}

/// Bytes a file takes on disk.
fn allocated(path: &Path) -> u64 {
    fs::metadata(path).unwrap().blocks() * 512
}

/// BLAKE3 of a file's whole logical content.
fn content_hash(path: &Path) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    h.update_reader(File::open(path).unwrap()).unwrap();
    h.finalize()
}

/// Whether the temporary directory keeps holes (and so can show that the result is sparse).
fn holes_supported(t: &TempDir) -> bool {
    let probe = t.join("probe");
    sparse_file(&probe, 8 * MIB, &[(MIB, 4096)]);
    let ok = allocated(&probe) < MIB;
    fs::remove_file(&probe).unwrap();
    if !ok {
        let msg = "SKIPPED sparse: the temporary directory's file system keeps no holes";
        assert!(std::env::var_os("CI").is_none(), "{msg} (CI must run it)");
        eprintln!("{msg}");
    }
    ok
}

/// Asserts that `got` has `want`'s content and takes about the room `want` takes, not its size.
fn assert_same_and_sparse(want: &Path, got: &Path) {
    assert_eq!(content_hash(got), content_hash(want), "{}", got.display());
    let (a, b) = (allocated(want), allocated(got));
    assert!(
        b <= a + MIB && b < fs::metadata(got).unwrap().len() / 4,
        "{}: {b} bytes allocated, the source takes {a}",
        got.display()
    );
}

#[test]
fn sparse_files_arrive_sparse_with_their_whole_content() {
    let t = TempDir::new("sparse");
    if !holes_supported(&t) {
        return;
    }
    let root = t.join("top");
    fs::create_dir_all(&root).unwrap();
    // Data at the start, across chunk boundaries at an odd offset, and near the end; a final hole.
    let big = root.join("big.img");
    sparse_file(
        &big,
        100 * MIB,
        &[
            (0, 300_000),
            (5 * MIB + 12_345, 2 * MIB as usize),
            (99 * MIB + 10, 65_536),
        ],
    );
    // A file of less than one chunk with a hole on either side of its data.
    let small = root.join("small.db");
    sparse_file(&small, 512 << 10, &[(100 << 10, 8192)]);
    // A file that is all hole, and an ordinary one.
    let empty = root.join("empty.img");
    sparse_file(&empty, 3 * MIB + 5, &[]);
    fs::write(root.join("plain"), data(70_000, 3)).unwrap();

    let out = t.join("out");
    let (s, r) = run(&[&root], &opts(&out, &t.join("cache")));
    let (s, r) = (s.unwrap(), r.unwrap());
    for name in ["big.img", "small.db", "empty.img"] {
        assert_same_and_sparse(&root.join(name), &out.join("top").join(name));
    }
    assert_eq!(fs::read(out.join("top/plain")).unwrap(), data(70_000, 3));
    let logical = 100 * MIB + (512 << 10) + 3 * MIB + 5 + 70_000;
    assert_eq!(s.bytes_sent, logical, "holes count with their length");
    assert_eq!(r.bytes_received, logical);
}

#[test]
fn a_cut_sparse_transfer_resumes_and_stays_sparse() {
    let t = TempDir::new("sparse-resume");
    if !holes_supported(&t) {
        return;
    }
    let img = t.join("disk.img");
    sparse_file(
        &img,
        100 * MIB,
        &[(0, 4 * MIB as usize), (60 * MIB, 2 * MIB as usize)],
    );
    let out = t.join("out");
    let o = opts(&out, &t.join("cache"));
    // Holes take a few bytes on the wire: 5 MiB cuts into the first packet of the data at
    // 60 MiB, which also carries the last records of the hole before it.
    let (s, r) = run_cut(&[&img], &o, Some(5 * MIB as usize));
    assert!(s.is_err() && r.is_err(), "{s:?} {r:?}");
    assert!(!out.join("disk.img").exists());

    let (s, r) = run(&[&img], &o);
    let (s, r) = (s.unwrap(), r.unwrap());
    assert!(
        s.bytes_resumed >= 48 * MIB,
        "resumed only {} bytes: the chunks of the hole were not kept",
        s.bytes_resumed
    );
    assert_eq!(s.bytes_sent + s.bytes_resumed, 100 * MIB);
    assert_eq!(r.bytes_resumed, s.bytes_resumed);
    assert_same_and_sparse(&img, &out.join("disk.img"));
    assert_eq!(listing(&out), vec!["disk.img"], "no temporary file left");
}

/// Issue 10, item 13: a large file that is not sparse has its whole size reserved when it starts,
/// so a full disk shows then, not after the data (here: the space is held by the partial file of
/// a transfer cut early).
#[test]
fn a_large_file_reserves_its_space_when_it_starts() {
    let t = TempDir::new("reserve");
    let f = t.join("big.bin");
    let size = 20 * MIB as usize;
    fs::write(&f, data(size, 5)).unwrap();
    let out = t.join("out");
    let (s, r) = run_cut(&[&f], &opts(&out, &t.join("cache")), Some(5 * MIB as usize));
    assert!(s.is_err() && r.is_err(), "{s:?} {r:?}");
    let parts = listing(&out);
    assert_eq!(parts.len(), 1, "{parts:?}");
    let part = out.join(&parts[0]);
    let len = fs::metadata(&part).unwrap().len();
    assert!(len <= 5 * MIB, "{len} bytes written before the cut");
    assert!(
        allocated(&part) >= size as u64,
        "{} bytes allocated for a {size}-byte file cut after {len}",
        allocated(&part)
    );
    // The reservation does not change the file: the resume completes it.
    let (s, r) = run(&[&f], &opts(&out, &t.join("cache")));
    s.unwrap();
    assert!(r.unwrap().bytes_resumed > 0);
    assert_eq!(fs::read(out.join("big.bin")).unwrap(), data(size, 5));
}

/// A sparse file that grows or shrinks after the walk is a changed source, even when it ends in a
/// hole (whose last record reads nothing that could notice).
#[test]
fn a_sparse_file_that_changed_size_after_the_walk_is_refused() {
    let t = TempDir::new("sparse-changed");
    if !holes_supported(&t) {
        return;
    }
    for new_size in [12 * MIB, 5 * MIB] {
        let img = t.join("grows.img");
        sparse_file(&img, 10 * MIB, &[(0, MIB as usize)]);
        let walked = ferry_transfer::walk(&[&img]).unwrap();
        File::options()
            .write(true)
            .open(&img)
            .unwrap()
            .set_len(new_size)
            .unwrap();
        let out = t.join(format!("out-{new_size}"));
        let (s, r) = run_walked(walked, &opts(&out, &t.join("cache")), None);
        assert!(
            matches!(s, Err(ferry_transfer::TransferError::SourceChanged { .. })),
            "{new_size}: {s:?}"
        );
        assert!(r.is_err(), "{r:?}");
        assert!(!out.join("grows.img").exists());
    }
}
