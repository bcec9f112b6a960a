//! `ferry bench mount`'s write rows, through a mount of a `ferry share --writable` on loopback:
//! - a file written into the mount until it is verified on the sharer (the clock stops when close(2)
//!   returns: the mount pushes on close, and the sharer lands the content only once its root verifies) vs
//!   `ferry send` of the same file between the same two machines, interleaved;
//! - `tar x` of many small files into the mount, files per second (each file: create, write, close, then
//!   tar's utimens and chmod, each a round trip to the sharer).
//!
//! Both are checked on the sharer after the clock stops (BLAKE3 of the file; the number of files tar made).
//! A submodule of `mount`, whose mount and helpers it uses.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::Path as FsPath;
use std::process::Command;
use std::time::Instant;

use super::{hash_file, Mount, Options, BENCH};
use crate::matrix::pull::Paired;
use crate::matrix::{Ends, Scratch};
use crate::report::{median, xorshift, Report, Row};

/// Small files in the `tar x` row (a smoke run takes fewer).
const TAR_FILES: usize = 10_000;

/// Runs the write rows into `report`: `src` is the file to write (already shared read-only by the
/// caller; this shares a directory of its own, writable).
pub(super) fn run(
    opts: &Options,
    ends: &Ends<'_>,
    paired: &Paired,
    scratch: &Scratch,
    src: &FsPath,
    report: &mut Report,
) -> io::Result<()> {
    let target = scratch.fresh("mount-write-target")?;
    let share = paired.share_with(ends, &target, &["--writable"])?;
    let mnt = scratch.fresh("mnt-write")?;
    let want = hash_file(src)?;
    let gb = fs::metadata(src)?.len() as f64 / 1e9;

    let (mut written, mut sent) = (Vec::new(), Vec::new());
    let m = Mount::new(paired, &share, &mnt, ends.ferry, &[])?;
    for run in 0..opts.runs {
        let out = scratch.fresh("send-out")?;
        sent.push(gb / ends.ferry_send(src, &out, scratch)?.secs);
        let _ = fs::remove_dir_all(&out);
        let name = format!("written-{run}.bin");
        written.push(gb / write_through(src, &mnt.join(&name))?);
        if hash_file(&target.join(&name))? != want {
            return Err(io::Error::other(
                "the file written through the mount differs on the sharer",
            ));
        }
        fs::remove_file(mnt.join(&name))?;
    }
    report.push(
        Row::new(
            BENCH,
            "write into a writable mount until verified on the sharer vs ferry send",
            median(&mut written),
            "GB/s",
        )
        .with_baseline(median(&mut sent)),
    );

    // tar x of small files (1-4 KiB, 100 to a directory), a fresh directory in the mount each run.
    let files = if opts.file_bytes < 1 << 30 {
        TAR_FILES / 10
    } else {
        TAR_FILES
    };
    let archive = small_files_tar(scratch, files)?;
    let mut rates = Vec::new();
    for run in 0..opts.runs {
        let into = mnt.join(format!("untarred-{run}"));
        fs::create_dir(&into)?;
        let t0 = Instant::now();
        let ok = Command::new("tar")
            .arg("xf")
            .arg(&archive)
            .arg("-C")
            .arg(&into)
            .status()?
            .success();
        let secs = t0.elapsed().as_secs_f64();
        if !ok {
            return Err(io::Error::other("tar x into the mount failed"));
        }
        let landed = count_files(&target.join(format!("untarred-{run}")))?;
        if landed != files {
            return Err(io::Error::other(format!(
                "tar x into the mount: {landed} of {files} files on the sharer"
            )));
        }
        rates.push(files as f64 / secs);
    }
    report.push(Row::new(
        BENCH,
        format!("tar x of {files} small files into a writable mount"),
        median(&mut rates),
        "files/s",
    ));
    m.unmount()?;
    drop(share);
    Ok(())
}

/// Copies `src` into the new file `dst` (in the mount) in 1 MiB writes and closes it; seconds, close
/// included (that is when the sharer has it, verified).
fn write_through(src: &FsPath, dst: &FsPath) -> io::Result<f64> {
    let mut from = File::open(src)?;
    let mut buf = vec![0u8; 1 << 20];
    let t0 = Instant::now();
    let mut to = File::create(dst)?;
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            break;
        }
        to.write_all(&buf[..n])?;
    }
    // close(2) reports the push's failure; File's drop would not.
    to.sync_all()?;
    drop(to);
    Ok(t0.elapsed().as_secs_f64())
}

/// A tar archive of `files` small files in directories of 100, made once with `tar c`.
fn small_files_tar(scratch: &Scratch, files: usize) -> io::Result<std::path::PathBuf> {
    let tree = scratch.fresh("tar-tree")?;
    for i in 0..files {
        let dir = tree.join(format!("d{:03}", i / 100));
        if i % 100 == 0 {
            fs::create_dir(&dir)?;
        }
        let mut rng = i as u64 + 1;
        let size = 1024 + (i * 37) % 3072;
        let bytes: Vec<u8> = (0..size).map(|_| xorshift(&mut rng) as u8).collect();
        fs::write(dir.join(format!("f{i:05}")), bytes)?;
    }
    let archive = scratch.fresh("tar-archive")?.join("small.tar");
    let ok = Command::new("tar")
        .arg("cf")
        .arg(&archive)
        .arg("-C")
        .arg(&tree)
        .arg(".")
        .status()?
        .success();
    if !ok {
        return Err(io::Error::other("tar c of the small files failed"));
    }
    Ok(archive)
}

/// Regular files under `dir`.
fn count_files(dir: &FsPath) -> io::Result<usize> {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                n += 1;
            }
        }
    }
    Ok(n)
}
