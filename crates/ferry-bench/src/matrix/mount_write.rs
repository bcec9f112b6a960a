//! `ferry bench mount`'s write rows, through a mount of a `ferry share --writable` on loopback:
//! - a file written into the mount until it is verified on the sharer (the clock stops when close(2)
//!   returns: the mount pushes on close, and the sharer lands the content only once its root verifies) vs
//!   `ferry send` of the same file between the same two machines, interleaved;
//! - `tar x` of many small files into the mount, files per second: the same archive as sshfs's row
//!   ([`small_files_tarball`]); each file is on the sharer when tar closes it (create, write, fchmod and
//!   futimens stay local until that close's push: one round trip per file).
//!
//! Both are checked on the sharer after the clock stops (BLAKE3 of the file; the number of files tar made).
//! Each timed step of the first row writes into memory touched just before it ([`touch_free_memory`]: this
//! machine's host takes free pages back, and the first write to one faults there), and the work a push
//! leaves the daemon (putting the pushed file into its cache) ends before the next step and is reported on
//! its own.
//! A submodule of `mount`, whose mount and helpers it uses.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::Path as FsPath;
use std::time::{Duration, Instant};

use super::{cpu_secs, hash_file, touch_free_memory, Mount, Options, BENCH};
use crate::matrix::mount_sshfs::{small_files_tarball, tar_x_seconds};
use crate::matrix::pull::Paired;
use crate::matrix::{Ends, Scratch};
use crate::report::{median, Report, Row};

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
    let (mut writing, mut pushing, mut after) = (Vec::new(), Vec::new(), Vec::<f64>::new());
    let m = Mount::new(paired, &share, &mnt, ends.ferry, &[])?;
    let bytes = fs::metadata(src)?.len();
    for run in 0..opts.runs {
        // Each timed step writes into memory touched just before (see `touch_free_memory`): the send its
        // output, the write the kernel's pages of the file, the working copy and the sharer's temp file.
        touch_free_memory(scratch, bytes)?;
        let out = scratch.fresh("send-out")?;
        sent.push(gb / ends.ferry_send(src, &out, scratch)?.secs);
        let _ = fs::remove_dir_all(&out);
        let name = format!("written-{run}.bin");
        touch_free_memory(scratch, bytes.saturating_mul(3) / 2)?;
        let (write, push) = write_through(src, &mnt.join(&name))?;
        written.push(gb / (write + push));
        writing.push(write / gb);
        pushing.push(push / gb);
        // What the push leaves the daemon to do (the pushed content put into its cache) ends before the
        // next step, and is counted on its own.
        after.push(settle(m.pid()) / gb);
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
    report.push(Row::new(
        BENCH,
        "  of which writing (until the last write returned)",
        median(&mut writing),
        "s/GB",
    ));
    report.push(Row::new(
        BENCH,
        "  of which the push (fsync until the sharer verified and landed it)",
        median(&mut pushing),
        "s/GB",
    ));
    // Later runs write the same content, which the cache holds by then: only the first run's counts.
    report.push(Row::new(
        BENCH,
        "  then the daemon's CPU putting the pushed file into its cache (first run), not in the rate",
        after.first().copied().unwrap_or(0.0),
        "CPU-s/GB",
    ));

    // tar x of the same small files as sshfs's row (100 B to 8 KiB, 100 to a directory), a fresh directory
    // in the mount each run; every file counted on the sharer.
    let files = opts.tar_files;
    let tar_dir = scratch.fresh("tar-archive")?;
    let archive = small_files_tarball(&tar_dir, files)?;
    let mut rates = Vec::new();
    for run in 0..opts.runs {
        let name = format!("untarred-{run}");
        let secs = tar_x_seconds(&archive, &mnt.join(&name), files)?;
        let landed = count_files(&target.join(&name))?;
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

/// Copies `src` into the new file `dst` (in the mount) in 1 MiB writes, then fsync and close (that is when
/// the sharer has it, verified); seconds writing, and seconds from there to close's return.
fn write_through(src: &FsPath, dst: &FsPath) -> io::Result<(f64, f64)> {
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
    let t1 = Instant::now();
    // close(2) reports the push's failure; File's drop would not.
    to.sync_all()?;
    drop(to);
    Ok(((t1 - t0).as_secs_f64(), t1.elapsed().as_secs_f64()))
}

/// Waits until process `pid` is quiet (under 10 ms of CPU in 200 ms; 30 s at most) and returns the CPU
/// seconds it used meanwhile.
fn settle(pid: u32) -> f64 {
    let start = cpu_secs(pid);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = start;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = cpu_secs(pid);
        if now - last < 0.01 || Instant::now() >= deadline {
            return now - start;
        }
        last = now;
    }
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
