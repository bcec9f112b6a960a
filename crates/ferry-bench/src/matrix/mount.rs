//! `ferry bench mount`: the FUSE mount of a paired peer's share against the ways around it, on loopback,
//! with real processes (`ferry share`, `ferry mount`, `ferry pull`) and the two homes paired as the
//! matrix pairs them.
//!
//! Rows (medians of `runs`, A/B interleaved):
//! - uncached sequential read of the file through a fresh mount (empty chunk cache) vs `ferry pull` of it;
//! - the FUSE floor beside it ([`ferry_mount::floor`]: a file of the same size answered from one buffer,
//!   mounted as the mount mounts, in this process), through the page cache and with direct I/O: the CPU per
//!   GB any FUSE read path costs here, and from it the highest ratio to pull a mount could reach;
//! - the mount daemon's peak RSS over those reads, and the CPU per GB of the path: the sharer, the daemon
//!   (and its threads by kind: link reader, store threads, streamers, from `/proc/PID/task/*/stat` at the
//!   clock tick's resolution, and the rest: its FUSE workers), the reader;
//! - cached sequential read through the mount (FUSE passthrough) vs a direct read of the same cache file,
//!   and the same through a mount without passthrough (classic FUSE: every read reaches the daemon);
//! - random 4 KiB reads per second through the mount, cold (a fresh mount) and cached (after the file is
//!   whole in the cache), [`THREADS`] readers at once.
//!
//! - writes: [`mount_write`]'s rows.
//!
//! Every sequential read through the mount is checked against the source's BLAKE3. Needs /dev/fuse and
//! the privilege to mount (root); FUSE passthrough also needs CAP_SYS_ADMIN.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path as FsPath, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ferry_lab::PATHS;
use ferry_mount::floor::{self, Floor};

use super::mount_sshfs::{small_files, sshfs_figures, tar_c, Readers};
use super::pull::{Paired, Sharer};
use super::{ferry_cmd, Ends, Scratch, Spawned};
use crate::report::{
    median, rusage_cpu, thread_cpu, vm_hwm_kib, write_random_file, xorshift, Report, Row,
};

const BENCH: &str = "mount";

// The write rows (a writable share, the same two homes).
#[path = "mount_write.rs"]
mod mount_write;

/// Set to other builds of `ferry` (`:`-separated): their mount daemons are measured too in the uncached
/// rows, interleaved with this build's (A/B in one run; the sharer and the puller stay this build's).
pub const OTHER_DAEMON: &str = "FERRY_BENCH_MOUNT_B";
/// Set (to anything): only the uncached rows run (and with `--rss-size`, the peak RSS row of every build).
pub const ONLY_UNCACHED: &str = "FERRY_BENCH_MOUNT_ONLY_UNCACHED";

/// Set: only the write rows (the 1 GiB write until verified on the sharer vs `ferry send`, `tar x`).
pub const ONLY_WRITES: &str = "FERRY_BENCH_MOUNT_ONLY_WRITES";

/// One daemon build's samples of the uncached rows.
#[derive(Default)]
struct Uncached {
    rate: Vec<f64>,
    cpu_mount: Vec<f64>,
    cpu_daemon: Vec<f64>,
    cpu_sharer: Vec<f64>,
    cpu_reader: Vec<f64>,
    /// The daemon's CPU per GB by kind of thread ([`DAEMON_THREADS`], then the rest).
    cpu_threads: [Vec<f64>; DAEMON_THREADS.len() + 1],
    /// Cores the path kept busy while it read (its CPU seconds over the read's seconds).
    busy: Vec<f64>,
    hwm: u64,
}

/// Readers at once in the random-read rows.
pub const THREADS: usize = 16;

/// What to measure.
pub struct Options {
    /// The file's size.
    pub file_bytes: u64,
    /// Random 4 KiB reads per row.
    pub random_reads: usize,
    /// Samples per row.
    pub runs: usize,
    /// Small files in the `tar x` rows (the mount's and the sshfs reference's, the same archive).
    pub tar_files: usize,
    /// Bytes of the file read for the daemon's peak RSS row (a sparse file; none: no such row).
    pub rss_bytes: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            file_bytes: 1 << 30,
            random_reads: 20_000,
            runs: 3,
            tar_files: 10_000,
            rss_bytes: None,
        }
    }
}

impl Options {
    /// A smoke run.
    pub fn quick() -> Self {
        Options {
            file_bytes: 64 << 20,
            random_reads: 2_000,
            runs: 1,
            tar_files: 500,
            rss_bytes: None,
        }
    }
}

/// Why the mount rows cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    if !FsPath::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".into());
    }
    if !super::peers::is_root() {
        return Some("mounting needs root here".into());
    }
    None
}

/// What a run under `base` would leave if it ended before its own clean-up (a signal runs no destructor):
/// dropped, it stops the run from making scratch directories and mounts ([`super::is_ending`]), detaches
/// every mount under the run's scratch directory (sshfs's and the FUSE floor's would outlive the process)
/// and removes the directory. After [`run`] returns there is nothing left to find.
pub struct Leftovers(PathBuf);

impl Leftovers {
    /// Those of this process's run under `base`.
    pub fn of(base: &FsPath) -> Leftovers {
        Leftovers(Scratch::of_this_process(base))
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        super::end();
        // Twice: a step already past its check when the signal came may still mount or make a directory.
        for pass in 0..2 {
            if pass > 0 {
                std::thread::sleep(Duration::from_millis(300));
            }
            // Last mounted first: a mount inside another goes before it.
            let table = ferry_mount::lifecycle::mount_table();
            for m in table.iter().rev().filter(|m| m.point.starts_with(&self.0)) {
                let _ = ferry_mount::lifecycle::unmount_lazily(&m.point);
            }
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// Runs the rows into `report`, with `ferry` the binary to run and data under `base` (tmpfs).
pub fn run(opts: &Options, ferry: &FsPath, base: &FsPath, report: &mut Report) -> io::Result<()> {
    let scratch = Scratch::new(base)?;
    let src_dir = scratch.fresh("mount-src")?;
    let src = src_dir.join("file.bin");
    write_random_file(&src, opts.file_bytes, 0x6d6f_756e)?;
    if let Some(bytes) = opts.rss_bytes {
        // Holes: they cost the sharer's side no memory.
        File::create(src_dir.join(SPARSE))?.set_len(bytes)?;
    }
    let want = hash_file(&src)?;
    // Small files beside it, for `tar c` out of the mount (a directory of them read whole, as `tar`,
    // `grep -r` or a build read a tree).
    small_files(&src_dir.join(SMALL), opts.tar_files)?;
    let want_tar = tar_c(&src_dir, SMALL)?.1;
    let tar_c_rate = |dir: &FsPath| -> io::Result<f64> {
        let (secs, got) = tar_c(dir, SMALL)?;
        check(&got, &want_tar, "tar c of the small files through a mount")?;
        Ok(opts.tar_files as f64 / secs)
    };
    let ends = Ends::new(&PATHS[0], None, ferry)?;
    let paired = Paired::new(&ends, &scratch, &[&src])?;
    let share = paired.share(&ends, &src_dir)?;
    let mnt = scratch.fresh("mnt")?;
    let gb = opts.file_bytes as f64 / 1e9;

    if std::env::var_os(ONLY_WRITES).is_some() {
        drop(share);
        return mount_write::run(opts, &ends, &paired, &scratch, &src, report);
    }
    // The sharer hashes a file's tree on its first read: done before anything is timed.
    warm_sharer(&paired, &share, &mnt, ferry)?;
    // Uncached: a fresh cache each run; `ferry pull` of the same file interleaved, and the mount daemon of
    // the other build (`FERRY_BENCH_MOUNT_B`) after each run of this one's.
    let mut daemons = vec![(ferry.to_path_buf(), Uncached::default())];
    if let Some(others) = std::env::var_os(OTHER_DAEMON) {
        for b in std::env::split_paths(&others) {
            daemons.push((b, Uncached::default()));
        }
    }
    let mut pulled = Vec::new();
    // CPU seconds per GB of every process on the path (2 cores here: their sum bounds the rate).
    let (mut cpu_pull, mut busy_pull, mut cpu_pull_sharer) = (Vec::new(), Vec::new(), Vec::new());
    let sharer = share.pid();
    // The FUSE floor of each mode, after the mount's daemons in each run.
    let floor_mnt = scratch.fresh("floor-mnt")?;
    let mut floors = [
        ("page cache", floor::Mode::PageCache, Uncached::default()),
        ("direct I/O", floor::Mode::DirectIo, Uncached::default()),
    ];
    // A step's place in the run moves its figures by up to 7 % here (the same build measured as A and as B,
    // 2026-11-27; the daemon in second place ahead by 0-6 % whichever build it was, 2026-11-28), so the
    // order changes from run to run (`step_order`).
    for run in 0..opts.runs {
        let (forward, order) = step_order(run, daemons.len());
        let mut pull_once = || -> io::Result<()> {
            let out = scratch.fresh("pull-out")?;
            touch_free_memory(&scratch, opts.file_bytes)?;
            let (s0, p0) = (cpu_secs(sharer), rusage_cpu(libc::RUSAGE_CHILDREN));
            let secs = paired.pull(&ends, &share, &src, &out)?.secs;
            pulled.push(gb / secs);
            let (s1, p1) = (cpu_secs(sharer), rusage_cpu(libc::RUSAGE_CHILDREN));
            cpu_pull.push((s1 - s0 + p1 - p0) / gb);
            cpu_pull_sharer.push((s1 - s0) / gb);
            busy_pull.push((s1 - s0 + p1 - p0) / secs);
            let _ = fs::remove_dir_all(&out);
            Ok(())
        };
        if forward {
            pull_once()?;
        }
        for i in order {
            let (daemon_bin, u) = &mut daemons[i];
            uncached_read(&paired, &share, &mnt, daemon_bin, &scratch, opts, &want, u)?;
        }
        if !forward {
            pull_once()?;
        }
        for (_, mode, u) in &mut floors {
            touch_free_memory(&scratch, opts.file_bytes)?;
            floor_read(&floor_mnt, opts.file_bytes, *mode, u)?;
        }
    }
    let pulled = median(&mut pulled);
    let mut uncached = 0.0;
    let med = |v: &mut Vec<f64>| median(v);
    for (i, (daemon_bin, u)) in daemons.iter_mut().enumerate() {
        let (tag, pad) = match i {
            0 => (String::new(), ""),
            _ => (format!(" (daemon: {})", daemon_bin.display()), "  "),
        };
        let rate = median(&mut u.rate);
        if i == 0 {
            uncached = rate;
        }
        report.push(
            Row::new(
                BENCH,
                format!("{pad}uncached sequential read vs ferry pull{tag}"),
                rate,
                "GB/s",
            )
            .with_baseline(pulled),
        );
        let mut rows = vec![
            (
                "  mount daemon's peak RSS over those reads".to_string(),
                u.hwm as f64 / 1024.0,
                "MiB",
            ),
            (
                "  CPU per GB read through the mount: sharer + daemon + reader".into(),
                med(&mut u.cpu_mount),
                "s/GB",
            ),
            (
                "    of which the sharer".into(),
                med(&mut u.cpu_sharer),
                "s/GB",
            ),
            (
                "    of which the mount daemon".into(),
                med(&mut u.cpu_daemon),
                "s/GB",
            ),
        ];
        let kinds = DAEMON_THREADS.iter().map(|(_, what)| *what);
        let rest = "its FUSE workers and other threads (the rest)";
        for (kind, what) in kinds.chain([rest]).enumerate() {
            let value = median(&mut u.cpu_threads[kind]);
            // A kind of thread that took less than a clock tick over the reads has no row.
            if value > 0.0 {
                rows.push((format!("      of which {what}"), value, "s/GB"));
            }
        }
        rows.extend([
            (
                "    of which the reader (its copy out of the page cache)".into(),
                med(&mut u.cpu_reader),
                "s/GB",
            ),
            (
                "  cores the mount's path kept busy while it read".into(),
                med(&mut u.busy),
                "cores",
            ),
        ]);
        for (label, value, unit) in rows {
            report.push(Row::new(BENCH, format!("{pad}{label}"), value, unit));
        }
    }
    for (label, value, unit) in [
        (
            "  CPU per GB pulled: sharer + ferry pull",
            med(&mut cpu_pull),
            "s/GB",
        ),
        ("    of which the sharer", med(&mut cpu_pull_sharer), "s/GB"),
        (
            "  cores the pull kept busy while it ran",
            med(&mut busy_pull),
            "cores",
        ),
    ] {
        report.push(Row::new(BENCH, label, value, unit));
    }
    let figures = PullFigures {
        cpu: med(&mut cpu_pull),
        busy: med(&mut busy_pull),
        sharer: med(&mut cpu_pull_sharer),
        mount_sharer: med(&mut daemons[0].1.cpu_sharer),
    };
    push_floor_rows(report, &mut floors, &figures);
    if std::env::var_os(ONLY_UNCACHED).is_some() {
        // With --rss-size: every build's peak RSS through a small cache, one after the other.
        if let Some(bytes) = opts.rss_bytes {
            for (daemon_bin, _) in &daemons {
                forget_cache(&paired)?;
                let (secs, hwm) =
                    read_through_small_cache(&paired, &share, &mnt, daemon_bin, bytes)?;
                let tag = format!("; daemon: {}", daemon_bin.display());
                push_rss_rows(report, bytes, &tag, hwm, secs);
            }
            forget_cache(&paired)?;
        }
        return Ok(());
    }

    // Cached: the file is whole in the cache now (the last uncached read). Passthrough and classic.
    let data = cache_file(&paired, opts.file_bytes)?;
    let mut cached = Vec::new();
    for (flags, case) in [
        (
            &[][..],
            "cached sequential read, passthrough, vs the cache file read directly",
        ),
        (
            &["--no-passthrough"][..],
            "cached sequential read, classic FUSE, vs the cache file read directly",
        ),
    ] {
        let m = Mount::new(&paired, &share, &mnt, ferry, flags)?;
        // One untimed read: passthrough is taken from the second open of a whole file on.
        check(
            &hash_file(&mnt.join("file.bin"))?,
            &want,
            "a cached read through the mount",
        )?;
        let (mut through, mut direct) = (Vec::new(), Vec::new());
        for _ in 0..opts.runs.max(3) {
            direct.push(gb / read_whole(&data)?);
            // The mount's own page cache would answer a classic read without the daemon.
            forget_pages(&mnt.join("file.bin"))?;
            through.push(gb / read_whole(&mnt.join("file.bin"))?);
        }
        check(
            &hash_file(&mnt.join("file.bin"))?,
            &want,
            "a cached read through the mount",
        )?;
        cached.push(median(&mut through));
        report.push(
            Row::new(BENCH, case, cached[cached.len() - 1], "GB/s")
                .with_baseline(median(&mut direct)),
        );
        m.unmount()?;
    }

    // Random 4 KiB reads: cold (a fresh cache and mount), then cached (the same mount after a whole read).
    // The source in memory, so checking a read costs a memory compare, not another `pread`.
    let source = fs::read(&src)?;
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for run in 0..opts.runs {
        forget_cache(&paired)?;
        let m = Mount::new(&paired, &share, &mnt, ferry, &[])?;
        let path = mnt.join("file.bin");
        cold.push(random_reads(&path, &source, opts, run as u64)?);
        read_whole(&path)?;
        warm.push(random_reads(&path, &source, opts, run as u64 + 100)?);
        m.unmount()?;
    }
    let (cold, warm) = (median(&mut cold), median(&mut warm));
    report.push(Row::new(
        BENCH,
        format!("random 4 KiB reads, {THREADS} at once, cold (fresh cache)"),
        cold,
        "reads/s",
    ));
    report.push(Row::new(
        BENCH,
        format!("random 4 KiB reads, {THREADS} at once, cached"),
        warm,
        "reads/s",
    ));

    // `tar c` of the small files: out of a fresh cache and mount, then again through the same mount. One
    // untimed pass first: the sharer hashes each file's tree on its first read.
    let (mut tar_cold, mut tar_warm) = (Vec::new(), Vec::new());
    for run in 0..=opts.runs {
        forget_cache(&paired)?;
        let m = Mount::new(&paired, &share, &mnt, ferry, &[])?;
        let cold = tar_c_rate(&mnt)?;
        let warm = tar_c_rate(&mnt)?;
        if run > 0 {
            tar_cold.push(cold);
            tar_warm.push(warm);
        }
        m.unmount()?;
    }
    let (tar_cold, tar_warm) = (median(&mut tar_cold), median(&mut tar_warm));

    if let Some(bytes) = opts.rss_bytes {
        forget_cache(&paired)?;
        let (secs, hwm) = read_through_small_cache(&paired, &share, &mnt, ferry, bytes)?;
        push_rss_rows(report, bytes, "", hwm, secs);
        forget_cache(&paired)?;
    }

    // The same reads through sshfs, in this run.
    let readers = Readers {
        whole: &read_whole,
        random: &|p: &FsPath, seed| random_reads(p, &source, opts, seed),
        check: &|p: &FsPath| check(&hash_file(p)?, &want, "a read through sshfs"),
        tar_c: &tar_c_rate,
    };
    let sshfs_base = scratch.fresh("sshfs")?;
    match sshfs_figures(
        &sshfs_base,
        &src_dir,
        "file.bin",
        gb,
        opts.runs,
        opts.tar_files,
        &readers,
    ) {
        Ok(s) => {
            let vs = |case: &str, ours: f64, theirs: f64, unit: &str| {
                Row::new(BENCH, format!("{case}, ferry mount vs sshfs"), ours, unit)
                    .with_baseline(theirs)
            };
            report.push(vs("uncached sequential read", uncached, s.uncached, "GB/s"));
            report.push(vs(
                "cached sequential read (passthrough; sshfs -o kernel_cache)",
                cached[0],
                s.cached,
                "GB/s",
            ));
            report.push(vs(
                "random 4 KiB reads, cold",
                cold,
                s.random_cold,
                "reads/s",
            ));
            report.push(vs(
                "random 4 KiB reads, cached",
                warm,
                s.random_cached,
                "reads/s",
            ));
            report.push(Row::new(
                BENCH,
                format!(
                    "sshfs: tar x of {} small files into the mount",
                    opts.tar_files
                ),
                s.tar_x_files_per_s,
                "files/s",
            ));
            report.push(vs(
                &format!(
                    "tar c of {} small files, cold (fresh cache and mount)",
                    opts.tar_files
                ),
                tar_cold,
                s.tar_c_cold,
                "files/s",
            ));
            report.push(vs(
                &format!("tar c of {} small files, again (cached)", opts.tar_files),
                tar_warm,
                s.tar_c_warm,
                "files/s",
            ));
        }
        Err(e) => {
            report.push(Row::new(
                BENCH,
                format!("  no sshfs reference: {e}"),
                f64::NAN,
                "",
            ));
            for (when, rate) in [
                ("cold (fresh cache and mount)", tar_cold),
                ("again (cached)", tar_warm),
            ] {
                report.push(Row::new(
                    BENCH,
                    format!("tar c of {} small files, {when}", opts.tar_files),
                    rate,
                    "files/s",
                ));
            }
        }
    }
    drop(share);
    mount_write::run(opts, &ends, &paired, &scratch, &src, report)?;
    Ok(())
}

/// A running `ferry mount` of the sharer's default share on `mnt`; unmounted on drop.
pub(super) struct Mount {
    child: Spawned,
    mnt: PathBuf,
    ferry: PathBuf,
}

impl Mount {
    fn new(
        paired: &Paired,
        share: &Sharer,
        mnt: &FsPath,
        ferry: &FsPath,
        flags: &[&str],
    ) -> io::Result<Mount> {
        let listen = share
            .listen()
            .ok_or_else(|| io::Error::other("ferry share reported no address"))?;
        Mount::start(paired, None, &["--peer", listen], mnt, ferry, flags)
    }

    /// `ferry mount` in network namespace `ns` (none: this one), reaching the sharer with `reach`
    /// (`--peer ADDR`, or the relay's options).
    pub(super) fn start(
        paired: &Paired,
        ns: Option<&ferry_lab::Netns>,
        reach: &[&str],
        mnt: &FsPath,
        ferry: &FsPath,
        flags: &[&str],
    ) -> io::Result<Mount> {
        super::refuse_if_ending()?;
        let mut cmd = ferry_cmd(ferry, ns, paired.pull_home());
        cmd.args(["mount", "--json"])
            .args(reach)
            .args(flags)
            .arg(super::pull::SHARER)
            .arg(mnt);
        let mut child = Spawned::new(&mut cmd)?;
        child.wait_for_event("mounted")?;
        Ok(Mount {
            child,
            mnt: mnt.to_path_buf(),
            ferry: ferry.to_path_buf(),
        })
    }

    /// The daemon's process id.
    pub(super) fn pid(&self) -> u32 {
        self.child.child.id()
    }

    /// The daemon's peak resident set so far, KiB.
    fn peak_rss_kib(&self) -> u64 {
        vm_hwm_kib(self.child.child.id()).unwrap_or(0)
    }

    /// `ferry unmount`, then the daemon's exit.
    pub(super) fn unmount(mut self) -> io::Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> io::Result<()> {
        if self.child.child.try_wait()?.is_some() {
            return Ok(());
        }
        let _ = Command::new(&self.ferry)
            .arg("unmount")
            .arg(&self.mnt)
            .output();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                // Its stderr ends only when it does.
                let _ = self.child.child.kill();
                let _ = self.child.child.wait();
                return Err(io::Error::other(format!(
                    "ferry mount did not end after ferry unmount: {}",
                    self.child.stderr()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// One sequential read of a fresh `bytes`-byte FUSE floor in `mode` on `mnt`, in 1 MiB reads as the
/// uncached row reads; its samples into `u`. The floor's daemon threads run in this process: its CPU is
/// this process's over the read less the reading thread's (the bench's other threads are idle then).
fn floor_read(mnt: &FsPath, bytes: u64, mode: floor::Mode, u: &mut Uncached) -> io::Result<()> {
    let gb = bytes as f64 / 1e9;
    let f = Floor::mount(mnt, bytes, mode)?;
    let (all0, r0) = (rusage_cpu(libc::RUSAGE_SELF), thread_cpu());
    let secs = read_whole(&f.file())?;
    let (all1, r1) = (rusage_cpu(libc::RUSAGE_SELF), thread_cpu());
    let (daemon, reader) = (all1 - all0 - (r1 - r0), r1 - r0);
    u.cpu_mount.push((daemon + reader) / gb);
    u.cpu_daemon.push(daemon / gb);
    u.cpu_reader.push(reader / gb);
    u.busy.push((daemon + reader) / secs);
    u.rate.push(gb / secs);
    // Checked after the timed read (from the page cache, or through the daemon again with direct I/O).
    let pattern = floor::pattern();
    let (mut file, mut buf, mut at) = (File::open(f.file())?, vec![0u8; floor::PERIOD], 0u64);
    loop {
        let n = file.read(&mut buf)?;
        let start = (at % floor::PERIOD as u64) as usize;
        if n == 0 {
            break;
        } else if buf[..n] != pattern[start..start + n] {
            return Err(io::Error::other(format!(
                "the FUSE floor's file differs from its pattern near {at}"
            )));
        }
        at += n as u64;
    }
    if at != bytes {
        return Err(io::Error::other(format!(
            "read {at} of the FUSE floor's {bytes} bytes"
        )));
    }
    Ok(())
}

/// The order of run `run`'s timed steps: whether pull goes first (else last), and the daemons' indices in
/// the order they read. Pull alternates between first and last; the daemons' order turns by one every
/// second run and is reversed when pull goes last, so over `2 × daemons` runs every daemon takes each place
/// as often as every other one, and follows and precedes pull equally often.
fn step_order(run: usize, daemons: usize) -> (bool, Vec<usize>) {
    let forward = run.is_multiple_of(2);
    let mut order: Vec<usize> = (0..daemons).collect();
    if daemons > 0 {
        order.rotate_left((run / 2) % daemons);
    }
    if !forward {
        order.reverse();
    }
    (forward, order)
}

/// Writes and deletes a file of twice `bytes` and 256 MiB more (on the scratch tmpfs), right before a
/// timed step, so that the memory the step allocates (a pulled file; a mount's cache file; a FUSE floor's
/// page cache) is memory the machine touched a moment ago.
///
/// A virtual machine that reports its free pages to the host (virtio-balloon's free page reporting, on
/// here) gives a page freed more than ~2 s ago back to the host, and the first write to it faults in the
/// host: measured here, the copy into a tmpfs page took 5 % of a pull's profile when the pull before had
/// just freed its pages and up to 66 % otherwise. Whichever timed step allocated that memory paid for it:
/// in this loop it was always the pull (after the floors), while the mount's read reused the pages the
/// pull's output had just freed, and the ratio was 1.18-1.75 where with both steps on touched memory it is
/// 0.67-0.78.
pub(super) fn touch_free_memory(scratch: &Scratch, bytes: u64) -> io::Result<()> {
    let dir = scratch.fresh("touched")?;
    let mut file = File::create(dir.join("zeros"))?;
    let buf = vec![0u8; 1 << 20];
    for _ in 0..(2 * bytes + (256 << 20)).div_ceil(1 << 20) {
        file.write_all(&buf)?;
    }
    drop(file);
    fs::remove_dir_all(&dir)
}

/// Pull's figures of a run, and the sharer's CPU of the mount's reads in the same run (s/GB).
struct PullFigures {
    cpu: f64,
    /// Cores pull kept busy.
    busy: f64,
    sharer: f64,
    mount_sharer: f64,
}

/// The FUSE floor's rows, and for each mode the highest ratio to pull any FUSE mount could reach here.
/// The mount does pull's work plus the floor's (F) on the cores there are, so it reads at most at
/// cores ÷ (pull's CPU/GB + F) GB/s, where pull reads at its cores busy ÷ its CPU/GB. The sharer of the
/// mount's reads works less than pull's (it serves a stored hash tree where pull's hashes as it sends),
/// so a second line puts its CPU/GB in place of pull's sharer's.
fn push_floor_rows(
    report: &mut Report,
    floors: &mut [(&str, floor::Mode, Uncached)],
    pull: &PullFigures,
) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let pull_secs_per_gb = pull.cpu / pull.busy;
    // What the mount's sharer spends beyond pull's (negative: it spends less).
    let sharer_extra = pull.mount_sharer - pull.sharer;
    for (name, _, u) in floors.iter_mut() {
        let f = median(&mut u.cpu_mount);
        for (label, value, unit) in [
            (
                format!("FUSE floor, {name}: sequential read (one buffer, no work)"),
                median(&mut u.rate),
                "GB/s",
            ),
            ("  CPU per GB (F): floor daemon + reader".into(), f, "s/GB"),
            (
                "    of which the floor daemon".into(),
                median(&mut u.cpu_daemon),
                "s/GB",
            ),
            (
                "    of which the reader".into(),
                median(&mut u.cpu_reader),
                "s/GB",
            ),
            ("  cores it kept busy".into(), median(&mut u.busy), "cores"),
            (
                format!("  highest ratio to pull a mount could reach: pull's CPU/GB + F on {cores} cores"),
                pull_secs_per_gb / ((pull.cpu + f) / cores),
                "x",
            ),
            (
                "    the same with the mount's sharer CPU/GB for pull's sharer's".into(),
                pull_secs_per_gb / ((pull.cpu + sharer_extra + f) / cores),
                "x",
            ),
        ] {
            report.push(Row::new(BENCH, label, value, unit));
        }
    }
}

/// The mount daemon's busiest threads by kind: how their names begin (the kernel keeps 15 bytes of a name)
/// and what they do. The FUSE workers are the rest (the daemon's CPU less these): each runs a few clock
/// ticks per read, too few to sum thread by thread (a thread started during the read loses up to a tick
/// per field).
const DAEMON_THREADS: [(&str, &str); 3] = [
    (
        "ferry-remote-re",
        "its link reader (receive, decrypt, verify)",
    ),
    ("ferry-store", "its store threads (the cache file's writes)"),
    ("ferry-ahead", "its streamers (requests ahead, pieces held)"),
];

/// CPU seconds of `pid`'s live threads so far, summed by kind ([`DAEMON_THREADS`]).
fn cpu_by_thread_kind(pid: u32) -> [f64; DAEMON_THREADS.len()] {
    let mut out = [0.0; DAEMON_THREADS.len()];
    let tasks = fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    for task in tasks.flatten() {
        let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if let Some(kind) = DAEMON_THREADS.iter().position(|(k, _)| comm.starts_with(k)) {
            out[kind] += stat_cpu_secs(&task.path().join("stat"));
        }
    }
    out
}

/// CPU seconds (user + system) process `pid` used so far, from /proc (clock ticks of 1/100 s, as
/// `/proc/PID/stat` always counts them); 0 when it cannot be read.
pub(super) fn cpu_secs(pid: u32) -> f64 {
    stat_cpu_secs(FsPath::new(&format!("/proc/{pid}/stat")))
}

/// User and system CPU seconds in a `/proc/.../stat` file (0 when it is gone).
fn stat_cpu_secs(path: &FsPath) -> f64 {
    let stat = fs::read_to_string(path).unwrap_or_default();
    // After the command name (in parentheses, which may hold spaces): state is field 0, utime 11, stime 12.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// The sparse file of the RSS row, beside the file of the other rows.
const SPARSE: &str = "sparse.bin";

/// The directory of small files beside the file, for `tar c`.
const SMALL: &str = "small";

/// The peak RSS row of a read of `bytes` through a small cache (`tag` names the build) and its rate.
fn push_rss_rows(report: &mut Report, bytes: u64, tag: &str, hwm_kib: u64, secs: f64) {
    report.push(Row::new(
        BENCH,
        format!(
            "mount daemon's peak RSS reading a {} file (--cache-size 1G{tag})",
            crate::channel::size_name(bytes as usize)
        ),
        hwm_kib as f64 / 1024.0,
        "MiB",
    ));
    report.push(Row::new(
        BENCH,
        "  that read (uncached, the cache evicting behind it)",
        bytes as f64 / 1e9 / secs,
        "GB/s",
    ));
}

/// Reads the `bytes`-byte sparse file whole through a fresh mount with a 1 GiB cache (evicting as it
/// goes), checking every byte is zero; seconds and the daemon's peak RSS, KiB.
fn read_through_small_cache(
    paired: &Paired,
    share: &Sharer,
    mnt: &FsPath,
    ferry: &FsPath,
    bytes: u64,
) -> io::Result<(f64, u64)> {
    let m = Mount::new(paired, share, mnt, ferry, &["--cache-size", "1G"])?;
    let t0 = Instant::now();
    let mut f = File::open(mnt.join(SPARSE))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|b| *b != 0) {
            return Err(io::Error::other(format!(
                "the sparse file read through the mount has a non-zero byte near {total}"
            )));
        }
        total += n as u64;
    }
    let secs = t0.elapsed().as_secs_f64();
    // Closed before the unmount (an open file keeps the mount busy).
    drop(f);
    if total != bytes {
        return Err(io::Error::other(format!(
            "read {total} of the sparse file's {bytes} bytes through the mount"
        )));
    }
    let hwm = m.peak_rss_kib();
    m.unmount()?;
    Ok((secs, hwm))
}

/// One small read through a mount, then its cache forgotten: the sharer has the file's tree from then on.
fn warm_sharer(paired: &Paired, share: &Sharer, mnt: &FsPath, ferry: &FsPath) -> io::Result<()> {
    let m = Mount::new(paired, share, mnt, ferry, &[])?;
    File::open(mnt.join("file.bin"))?.read_exact(&mut [0u8; 4096])?;
    m.unmount()?;
    forget_cache(paired)
}

/// Removes the puller's chunk caches (the mount is not running).
pub(super) fn forget_cache(paired: &Paired) -> io::Result<()> {
    match fs::remove_dir_all(mounts_dir(paired)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn mounts_dir(paired: &Paired) -> PathBuf {
    paired.pull_home().join("cache/ferry/mounts")
}

/// The cache file that holds the `size`-byte file (the only `.data` file of that length).
fn cache_file(paired: &Paired, size: u64) -> io::Result<PathBuf> {
    let mut stack = vec![mounts_dir(paired)];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir)? {
            let e = e?;
            let p = e.path();
            if e.file_type()?.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "data") && e.metadata()?.len() == size {
                return Ok(p);
            }
        }
    }
    Err(io::Error::other(
        "no cache file of the file's size after a whole read",
    ))
}

/// Drops the page cache of `path` (a file in the mount: its FUSE inode's pages; with passthrough the
/// backing file's, which the direct read fills again the same way).
fn forget_pages(path: &FsPath) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = File::open(path)?;
    // SAFETY: posix_fadvise(2) on a descriptor this function owns; it changes no memory of ours.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// One uncached read of the whole file through a fresh mount by `daemon_bin`, with a fresh cache: its rate,
/// the CPU of every process on the path (the daemon's by kind of thread), its peak RSS, into `u`; the
/// cache it filled is checked against the source.
#[allow(clippy::too_many_arguments)]
fn uncached_read(
    paired: &Paired,
    share: &Sharer,
    mnt: &FsPath,
    daemon_bin: &FsPath,
    scratch: &Scratch,
    opts: &Options,
    want: &blake3::Hash,
    u: &mut Uncached,
) -> io::Result<()> {
    let gb = opts.file_bytes as f64 / 1e9;
    let sharer = share.pid();
    forget_cache(paired)?;
    let m = Mount::new(paired, share, mnt, daemon_bin, &[])?;
    let daemon = m.child.child.id();
    touch_free_memory(scratch, opts.file_bytes)?;
    let kinds0 = cpu_by_thread_kind(daemon);
    let (s0, d0, r0) = (cpu_secs(sharer), cpu_secs(daemon), thread_cpu());
    let secs = read_whole(&mnt.join("file.bin"))?;
    let (s1, d1, r1) = (cpu_secs(sharer), cpu_secs(daemon), thread_cpu());
    let kinds1 = cpu_by_thread_kind(daemon);
    let mut named = 0.0;
    for kind in 0..DAEMON_THREADS.len() {
        let spent = kinds1[kind] - kinds0[kind];
        named += spent;
        u.cpu_threads[kind].push(spent / gb);
    }
    // The FUSE workers, and any other thread (one that ended during the read too).
    let rest = (d1 - d0 - named).max(0.0);
    u.cpu_threads[DAEMON_THREADS.len()].push(rest / gb);
    u.cpu_mount.push((s1 - s0 + d1 - d0 + r1 - r0) / gb);
    u.cpu_daemon.push((d1 - d0) / gb);
    u.cpu_sharer.push((s1 - s0) / gb);
    u.cpu_reader.push((r1 - r0) / gb);
    u.busy.push((s1 - s0 + d1 - d0 + r1 - r0) / secs);
    u.rate.push(gb / secs);
    // What the mount now serves from its cache is what it stored while streaming.
    check(
        &hash_file(&mnt.join("file.bin"))?,
        want,
        "an uncached read through the mount",
    )?;
    u.hwm = u.hwm.max(m.peak_rss_kib());
    m.unmount()
}

/// Reads `path` whole in 1 MiB reads; seconds. The bytes are not looked at (a check here would run in
/// series with the reads and slow the reader, not the mount): [`hash_file`] checks them after.
fn read_whole(path: &FsPath) -> io::Result<f64> {
    let t0 = Instant::now();
    let mut f = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    while f.read(&mut buf)? != 0 {}
    Ok(t0.elapsed().as_secs_f64())
}

/// BLAKE3 of `path`'s content.
fn hash_file(path: &FsPath) -> io::Result<blake3::Hash> {
    let mut h = blake3::Hasher::new();
    io::copy(&mut File::open(path)?, &mut h)?;
    Ok(h.finalize())
}

fn check(got: &blake3::Hash, want: &blake3::Hash, what: &str) -> io::Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(io::Error::other(format!("{what} differs from the source")))
    }
}

/// `opts.random_reads` reads of 4 KiB at random 4 KiB-aligned offsets of `path` from [`THREADS`] threads;
/// every read compared with the same bytes of `source` (the file's content). Reads per second.
fn random_reads(path: &FsPath, source: &[u8], opts: &Options, seed: u64) -> io::Result<f64> {
    let f = File::open(path)?;
    let blocks = (opts.file_bytes / 4096).max(1);
    let per = opts.random_reads.div_ceil(THREADS);
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let f = &f;
                scope.spawn(move || -> io::Result<()> {
                    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (t as u64 + 1);
                    let mut a = vec![0u8; 4096];
                    for _ in 0..per {
                        let at = (xorshift(&mut rng) % blocks) * 4096;
                        let n = f.read_at(&mut a, at)?;
                        let want = &source[at as usize..(at as usize + 4096).min(source.len())];
                        if a[..n] != *want {
                            return Err(io::Error::other(format!(
                                "a random read through the mount at {at} differs from the source"
                            )));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("a reader thread panicked"))
    })?;
    Ok((per * THREADS) as f64 / t0.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::step_order;

    #[test]
    fn every_daemon_takes_every_place_as_often_as_the_others() {
        for daemons in 1..=4 {
            // places[d][p]: how often daemon d read in place p (0 = first step of the run, pull included).
            let mut places = vec![vec![0; daemons + 1]; daemons];
            let (mut first, mut last) = (0, 0);
            // follows[d] / precedes[d]: how often daemon d read right after / right before pull.
            let (mut follows, mut precedes) = (vec![0; daemons], vec![0; daemons]);
            for run in 0..2 * daemons {
                let (forward, order) = step_order(run, daemons);
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..daemons).collect::<Vec<_>>(), "each daemon once");
                let offset = usize::from(forward);
                for (i, d) in order.iter().enumerate() {
                    places[*d][i + offset] += 1;
                }
                if forward {
                    first += 1;
                    follows[order[0]] += 1;
                } else {
                    last += 1;
                    precedes[order[daemons - 1]] += 1;
                }
            }
            assert_eq!(first, last, "pull first as often as last");
            for d in 1..daemons {
                assert_eq!(
                    places[d], places[0],
                    "{daemons} daemons: places of daemon {d}"
                );
                assert_eq!(
                    follows[d], follows[0],
                    "{daemons} daemons: daemon {d} after pull"
                );
                assert_eq!(
                    precedes[d], precedes[0],
                    "{daemons} daemons: daemon {d} before pull"
                );
            }
        }
    }
}
