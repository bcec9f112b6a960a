//! Issue 10, item 13: free space. An offer that cannot fit is refused before any data moves, with
//! the numbers; a large file has its space reserved when it starts; a sparse file counts with the
//! room its data takes. Each test mounts a small tmpfs (root only).

mod common;

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};

use common::*;

const MIB: usize = 1 << 20;

/// A 16 MiB tmpfs with `filler` MiB taken, and the destination directory in it.
fn small_disk(w: &World, size: &str, filler: usize) -> Option<(Tmpfs, std::path::PathBuf)> {
    let disk = match Tmpfs::mount(&w.path("disk"), size) {
        Ok(d) => d,
        Err(reason) => {
            skip("space", &reason);
            return None;
        }
    };
    fs::write(disk.dir.join("filler"), vec![1u8; filler * MIB]).unwrap();
    let out = disk.dir.join("out");
    Some((disk, out))
}

fn error_message(out: &std::process::Output) -> String {
    event(&events(&out.stdout), "error").expect("an error event")["message"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn an_offer_larger_than_the_free_space_is_refused_before_any_data_moves() {
    let w = World::new();
    let Some((disk, out)) = small_disk(&w, "16m", 13) else {
        return;
    };
    let f = w.src().join("five.bin");
    fs::write(&f, pseudo_random(5 * MIB, 6)).unwrap();

    let (send, recv) = w.transfer("61-apple-orbit-violin", &[&f], &out);
    assert_failure(
        "receive of an offer that does not fit",
        &recv,
        6,
        "disk-full",
    );
    assert_failure("send of an offer that does not fit", &send, 6, "disk-full");
    let msg = error_message(&recv);
    assert!(
        msg.contains("needs 5.00 MiB more, 3.00 MiB free on") && msg.contains("--no-space-check"),
        "{msg}"
    );
    assert!(
        error_message(&send).contains("needs 5.00 MiB more"),
        "the sender is told why"
    );
    assert!(
        event(&events(&recv.stdout), "progress").is_none(),
        "data moved"
    );
    assert!(list_all(&out).is_empty(), "{:?}", list_all(&out));
    drop(disk);
}

#[test]
fn a_large_file_that_cannot_fit_fails_at_its_start() {
    let w = World::new();
    // 18 MiB free: the first file (9 MiB) fits, the second (12 MiB) does not.
    let Some((disk, out)) = small_disk(&w, "32m", 14) else {
        return;
    };
    let dir = w.src().join("two");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("a.bin"), pseudo_random(9 * MIB, 1)).unwrap();
    fs::write(dir.join("b.bin"), pseudo_random(12 * MIB, 2)).unwrap();

    let code = "62-apple-orbit-violin";
    let (send, recv) = w.transfer_with(code, &[&dir], &out, &["--no-space-check"]);
    assert_failure("receive into a disk that fills up", &recv, 6, "disk-full");
    assert!(!send.status.success(), "the sender must not report success");
    assert_same_tree(&dir.join("a.bin"), &out.join("two/a.bin"));
    assert_only_verified_finals(&out, &["two/a.bin"]);
    let parts = partial_files(&out);
    assert_eq!(parts.len(), 1, "{parts:?}");
    assert_eq!(
        fs::metadata(&parts[0]).unwrap().len(),
        0,
        "b.bin failed after its data was written, not when it started"
    );
    drop(disk);
}

#[test]
fn a_sparse_file_needs_only_the_room_of_its_data() {
    let w = World::new();
    let Some((disk, out)) = small_disk(&w, "16m", 13) else {
        return;
    };
    // 100 MiB long, 1 MiB of data: fits in the 3 MiB free.
    let img = w.src().join("disk.img");
    let f = fs::File::create(&img).unwrap();
    f.set_len(100 * MIB as u64).unwrap();
    f.write_all_at(&pseudo_random(MIB, 3), 40 * MIB as u64)
        .unwrap();
    drop(f);

    let (send, recv) = w.transfer("63-apple-orbit-violin", &[&img], &out);
    assert_success("send of a sparse file", &send);
    assert_success("receive of a sparse file", &recv);
    assert_same_tree(&img, &out.join("disk.img"));
    let blocks = fs::metadata(out.join("disk.img")).unwrap().blocks() * 512;
    assert!(blocks <= 2 * MIB as u64, "{blocks} bytes allocated");
    drop(disk);
}
