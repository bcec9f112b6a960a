//! The receiver's file creation on its own: many small files made the way `ferry receive` makes
//! them, with one system call per step (what the receiver does) and, with the `uring` feature,
//! batched through io_uring.
//!
//! Per small file the receiver (`ferry-transfer`'s `Destination::open_temp` and `finish_file`)
//! does `openat(dirfd, ".", O_WRONLY|O_TMPFILE|O_CLOEXEC, mode)`, `write` of all bytes,
//! `futimens` (after the last write, or the write would move the mtime), then
//! `linkat(fd, "", dirfd, NAME, AT_EMPTY_PATH)` and `close`: the "std" variant. Before that it
//! used a named temporary file: `openat(dirfd, ".NAME.ferry-part",
//! O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC, mode)`, `write`, `futimens`, `close`, then
//! `renameat2(dirfd, temp, dirfd, NAME, RENAME_NOREPLACE)`: the "renamed" variant, which it still
//! uses for files larger than one chunk and which the io_uring variants batch. On tmpfs nearly
//! all of that is kernel time, so the questions are which sequence is cheaper and whether
//! submitting many files per system call wins. io_uring has no `utimensat`, so the times are
//! always set by a plain system call.
//!
//! Every run is checked afterwards (each file's size, bytes and mtime, and that no temporary
//! name is left), so a variant that skips work cannot win.

use std::cell::Cell;
use std::ffi::CString;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::report::{interleave, xorshift, Report, Row};

const MODE: libc::mode_t = 0o644;
const POOL: usize = 64 << 10;
const MAX_FILE: usize = 8 << 10;

/// The files to make, fixed in advance so that every variant makes the same tree.
pub struct Plan {
    dirs: usize,
    /// Grouped by directory, as the receiver meets them (the sender walks one directory at a time).
    files: Vec<FileSpec>,
    /// Random bytes; each file's content is a slice of it.
    pool: Vec<u8>,
}

struct FileSpec {
    dir: usize,
    temp: CString,
    name: CString,
    offset: usize,
    len: usize,
    mtime: (i64, u32),
}

impl FileSpec {
    fn data<'a>(&self, pool: &'a [u8]) -> &'a [u8] {
        &pool[self.offset..self.offset + self.len]
    }

    fn times(&self) -> [libc::timespec; 2] {
        let t = libc::timespec {
            tv_sec: self.mtime.0 as libc::time_t,
            tv_nsec: self.mtime.1 as libc::c_long,
        };
        [t, t]
    }
}

impl Plan {
    /// `files` files of 4-8 KiB spread round-robin over `dirs` directories.
    pub fn new(files: usize, dirs: usize) -> Plan {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut pool = vec![0u8; POOL + MAX_FILE];
        for chunk in pool.chunks_mut(8) {
            chunk.copy_from_slice(&xorshift(&mut seed).to_le_bytes()[..chunk.len()]);
        }
        let mut specs: Vec<FileSpec> = (0..files)
            .map(|i| {
                let name = format!("f{i:06}");
                FileSpec {
                    dir: i % dirs,
                    temp: CString::new(format!(".{name}.ferry-part")).expect("no NUL"),
                    name: CString::new(name).expect("no NUL"),
                    offset: xorshift(&mut seed) as usize % POOL,
                    len: 4096 + (xorshift(&mut seed) % 4097) as usize,
                    mtime: (1_500_000_000 + i as i64, (i as u32 * 7919) % 1_000_000_000),
                }
            })
            .collect();
        specs.sort_by_key(|f| f.dir);
        Plan {
            dirs,
            files: specs,
            pool,
        }
    }

    /// How many files.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether there are no files.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// A fresh tree of empty directories with open descriptors (as the receiver's `DirCursor` holds
/// them), removed on drop.
struct Tree {
    root: PathBuf,
    dirs: Vec<OwnedFd>,
}

impl Tree {
    fn new(root: &Path, dirs: usize) -> io::Result<Tree> {
        let _ = fs::remove_dir_all(root);
        let mut tree = Tree {
            root: root.to_path_buf(),
            dirs: Vec::with_capacity(dirs),
        };
        for d in 0..dirs {
            let path = root.join(format!("d{d:03}"));
            fs::create_dir_all(&path)?;
            let dir = fs::File::open(&path)?;
            tree.dirs.push(OwnedFd::from(dir));
        }
        Ok(tree)
    }

    fn dir(&self, f: &FileSpec) -> RawFd {
        self.dirs[f.dir].as_raw_fd()
    }

    fn path(&self, f: &FileSpec) -> PathBuf {
        let name = Path::new(std::ffi::OsStr::from_bytes(f.name.as_bytes()));
        self.root.join(format!("d{:03}", f.dir)).join(name)
    }

    /// Every planned file has its final name, size, bytes and mtime, and nothing else is there.
    fn verify(&self, plan: &Plan) -> io::Result<()> {
        let bad = |what: String| Err(io::Error::other(format!("create bench: {what}")));
        let mut per_dir = vec![0usize; plan.dirs];
        for f in &plan.files {
            per_dir[f.dir] += 1;
            let path = self.path(f);
            let meta = fs::symlink_metadata(&path)?;
            if !meta.is_file() || meta.len() != f.len as u64 {
                return bad(format!("{} is not a {}-byte file", path.display(), f.len));
            }
            if (meta.mtime(), meta.mtime_nsec()) != (f.mtime.0, f.mtime.1 as i64) {
                return bad(format!("{} has the wrong mtime", path.display()));
            }
            if fs::read(&path)? != f.data(&plan.pool) {
                return bad(format!("{} has the wrong content", path.display()));
            }
        }
        for (d, want) in per_dir.iter().enumerate() {
            let dir = self.root.join(format!("d{d:03}"));
            let found = fs::read_dir(&dir)?.count();
            if found != *want {
                return bad(format!(
                    "{} holds {found} entries, not {want}",
                    dir.display()
                ));
            }
        }
        Ok(())
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// How the files are made.
#[derive(Clone, Copy, Debug)]
pub enum Variant {
    /// The receiver's system calls for a small file (unnamed, then linked), one file after the
    /// other, on `threads` threads (each takes whole directories).
    Std {
        /// Threads.
        threads: usize,
    },
    /// The named temporary file and the rename, on one thread.
    Renamed,
    /// Batched through io_uring.
    #[cfg(feature = "uring")]
    Uring(uring::Config),
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Variant::Std { threads: 1 } => write!(f, "std"),
            Variant::Std { threads } => write!(f, "std {threads} threads"),
            Variant::Renamed => write!(f, "renamed"),
            #[cfg(feature = "uring")]
            Variant::Uring(c) => write!(f, "{c}"),
        }
    }
}

/// Opens `name` in `dir` with `flags` and writes `f`'s bytes and times (after the last write, or
/// the write would move the mtime): the steps both sequences share.
fn open_and_fill(
    plan: &Plan,
    dir: RawFd,
    name: &std::ffi::CStr,
    flags: libc::c_int,
    f: &FileSpec,
) -> io::Result<fs::File> {
    // SAFETY: valid dir fd and NUL-terminated name; the returned fd is checked and owned.
    let fd = check(unsafe { libc::openat(dir, name.as_ptr(), flags, MODE as libc::c_uint) })?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let mut file = fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(f.data(&plan.pool))?;
    let times = f.times();
    // SAFETY: the fd is open for the lifetime of `file`; `times` points to two valid timespecs.
    check(unsafe { libc::futimens(file.as_raw_fd(), times.as_ptr()) })?;
    Ok(file)
}

/// The receiver's sequence for one small file: unnamed, then linked under its name.
fn create_one(plan: &Plan, tree: &Tree, f: &FileSpec) -> io::Result<()> {
    let dir = tree.dir(f);
    let flags = libc::O_WRONLY | libc::O_TMPFILE | libc::O_CLOEXEC;
    let file = open_and_fill(plan, dir, c".", flags, f)?;
    // SAFETY: valid fds, an empty and a NUL-terminated name.
    check(unsafe {
        libc::linkat(
            file.as_raw_fd(),
            c"".as_ptr(),
            dir,
            f.name.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// The earlier sequence: a named temporary file, renamed into place.
fn create_renamed(plan: &Plan, tree: &Tree, f: &FileSpec) -> io::Result<()> {
    let dir = tree.dir(f);
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    drop(open_and_fill(plan, dir, &f.temp, flags, f)?);
    rename_into_place(dir, f)
}

/// Gives `f` its final name in `dir`, never replacing an existing file (the receiver's last step).
fn rename_into_place(dir: RawFd, f: &FileSpec) -> io::Result<()> {
    // SAFETY: valid dir fd and NUL-terminated names.
    check(unsafe {
        libc::renameat2(
            dir,
            f.temp.as_ptr(),
            dir,
            f.name.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    })?;
    Ok(())
}

fn create_std(plan: &Plan, tree: &Tree, threads: usize) -> io::Result<()> {
    if threads <= 1 {
        return plan
            .files
            .iter()
            .try_for_each(|f| create_one(plan, tree, f));
    }
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    plan.files
                        .iter()
                        .filter(|f| f.dir % threads == t)
                        .try_for_each(|f| create_one(plan, tree, f))
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("create thread"))
    })
}

/// Makes every planned file under a fresh `root` with `variant`, checks the result and removes
/// it; returns files per second (the check and the removal are not timed).
pub fn create_run(plan: &Plan, root: &Path, variant: Variant) -> io::Result<f64> {
    let tree = Tree::new(root, plan.dirs)?;
    let start = Instant::now();
    match variant {
        Variant::Std { threads } => create_std(plan, &tree, threads)?,
        Variant::Renamed => plan
            .files
            .iter()
            .try_for_each(|f| create_renamed(plan, &tree, f))?,
        #[cfg(feature = "uring")]
        Variant::Uring(config) => uring::create(plan, &tree, &config)?,
    }
    let secs = start.elapsed().as_secs_f64();
    tree.verify(plan)?;
    Ok(plan.len() as f64 / secs)
}

/// `baseline` and `candidate` interleaved `runs` times under `root`; both medians in files/s.
pub fn compare(
    plan: &Plan,
    root: &Path,
    runs: usize,
    baseline: Variant,
    candidate: Variant,
) -> io::Result<(f64, f64)> {
    let failed = Cell::new(None);
    let sample = |v| {
        create_run(plan, root, v).unwrap_or_else(|e| {
            failed.set(Some(e));
            f64::NAN
        })
    };
    let medians = interleave(runs, || sample(baseline), || sample(candidate));
    match failed.into_inner() {
        Some(e) => Err(e),
        None => Ok(medians),
    }
}

/// The file-creation case of `ferry bench transfer`: `files` files of 4-8 KiB in 100 directories
/// under `scratch`: the receiver's unnamed files against named ones renamed into place,
/// io_uring against the renamed sequence it batches, and two threads against one for reference.
pub fn run(files: usize, runs: usize, scratch: &Path, report: &mut Report) -> io::Result<()> {
    let plan = Plan::new(files, 100);
    let root = scratch.join(format!("ferry-bench-create-{}", std::process::id()));
    let one = Variant::Std { threads: 1 };
    let cases = [
        (Variant::Renamed, one),
        #[cfg(feature = "uring")]
        (Variant::Renamed, Variant::Uring(uring::Config::BEST)),
        (one, Variant::Std { threads: 2 }),
    ];
    for (baseline, candidate) in cases {
        let (base, value) = compare(&plan, &root, runs, baseline, candidate)?;
        report.push(
            Row::new(
                "transfer",
                format!("{files} files, create: {candidate} vs {baseline}"),
                value,
                "files/s",
            )
            .with_baseline(base),
        );
    }
    Ok(())
}

/// The io_uring variant.
#[cfg(feature = "uring")]
pub mod uring {
    use std::io;
    use std::os::fd::RawFd;

    use io_uring::{opcode, squeue, types, IoUring};

    use super::{check, rename_into_place, FileSpec, Plan, Tree, MODE};

    /// How the mtime is set, which io_uring cannot do.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Times {
        /// `utimensat` by the temporary name after the ring closed the direct descriptor.
        ByPath,
        /// The ring installs the direct descriptor as a regular fd (`FIXED_FD_INSTALL`) for
        /// `futimens`; the ring closes it with the rename.
        Installed,
    }

    /// One arrangement of io_uring operations.
    #[derive(Clone, Copy, Debug)]
    pub struct Config {
        /// Files per submission.
        pub batch: usize,
        /// How the mtime is set.
        pub times: Times,
        /// Renames through the ring (else `renameat2` system calls).
        pub rename_in_ring: bool,
        /// Cap on the ring's bounded io-wq workers (0: the kernel's default).
        pub max_workers: u32,
        /// Submit the next batch's chains before this batch's system calls.
        pub pipelined: bool,
    }

    impl Config {
        /// The arrangement `ferry bench transfer` reports: the best of those measured on the
        /// 2-core development machine (batches of 32-512, both ways of setting the mtime,
        /// renames in the ring or not, pipelined or not, io-wq capped or not). Even this one
        /// lost to the plain system calls there: the kernel punts every `O_CREAT` open (and
        /// every rename) to an io-wq worker, and that hand-off costs more than the system calls
        /// it saves; renames through the ring lost most.
        pub const BEST: Config = Config {
            batch: 128,
            times: Times::ByPath,
            rename_in_ring: false,
            max_workers: 0,
            pipelined: false,
        };
    }

    impl std::fmt::Display for Config {
        /// Short enough for the report's case column: only what differs from [`Config::BEST`]
        /// besides the batch size.
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "io_uring x{}", self.batch)?;
            if self.times == Times::Installed {
                write!(f, " futimens")?;
            }
            if self.rename_in_ring {
                write!(f, " ring-rename")?;
            }
            if self.max_workers > 0 {
                write!(f, " wq{}", self.max_workers)?;
            }
            if self.pipelined {
                write!(f, " pipelined")?;
            }
            Ok(())
        }
    }

    const OPEN: u64 = 0;
    const WRITE: u64 = 1;
    const INSTALL: u64 = 2;
    const CLOSE: u64 = 3;
    const RENAME: u64 = 4;

    /// A completion's user data: the file's index in the plan and the operation.
    fn tag(file: usize, op: u64) -> u64 {
        (file as u64) << 8 | op
    }

    /// Submits what is queued and reaps `want` completions, passing each `(file, op, res)` to
    /// `seen`; every completion is reaped even after a failure, so nothing in flight still
    /// points into the plan when this returns.
    fn complete(
        ring: &mut IoUring,
        want: usize,
        mut seen: impl FnMut(usize, u64, i32) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut got = 0;
        let mut first_err = None;
        while got < want {
            match ring.submit_and_wait(want - got) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            for cqe in ring.completion() {
                got += 1;
                let (file, op) = ((cqe.user_data() >> 8) as usize, cqe.user_data() & 0xff);
                if let Err(e) = seen(file, op, cqe.result()) {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn failed(op: &str, res: i32) -> io::Error {
        let e = io::Error::from_raw_os_error(-res);
        io::Error::new(e.kind(), format!("io_uring {op}: {e}"))
    }

    /// Makes every planned file. Per batch: linked chains OPENAT (into a direct descriptor slot)
    /// -> WRITE -> [FIXED_FD_INSTALL ->] CLOSE, all reaped at once; then the mtimes by system
    /// calls; then the renames, by system calls or queued on the ring (and the installed fds'
    /// closes) to go with the next submission. `pipelined` submits the next batch's chains before
    /// this batch's system calls, so io-wq works on them meanwhile.
    pub(super) fn create(plan: &Plan, tree: &Tree, config: &Config) -> io::Result<()> {
        let batch = config.batch.max(1);
        let slots = if config.pipelined { 2 * batch } else { batch };
        let per_file = if config.times == Times::Installed {
            4
        } else {
            3
        };
        // Room for a batch's chains next to the previous batch's queued closes and renames.
        let entries = ((per_file + 2) * slots).next_power_of_two() as u32;
        let mut ring = IoUring::builder().setup_single_issuer().build(entries)?;
        ring.submitter().register_files_sparse(slots as u32)?;
        if config.max_workers > 0 {
            ring.submitter()
                .register_iowq_max_workers(&mut [config.max_workers, 0])?;
        }
        let mut fds: Vec<RawFd> = vec![-1; slots];
        let batches: Vec<(usize, &[FileSpec])> = plan
            .files
            .chunks(batch)
            .enumerate()
            .map(|(k, files)| (k * batch, files))
            .collect();
        let mut in_flight = 0;
        if config.pipelined {
            in_flight += push_chains(&mut ring, plan, tree, batches[0], slots, config.times)?;
        }
        for (k, &(first, files)) in batches.iter().enumerate() {
            if !config.pipelined {
                in_flight +=
                    push_chains(&mut ring, plan, tree, (first, files), slots, config.times)?;
            }
            reap(&mut ring, plan, &mut fds, std::mem::take(&mut in_flight))?;
            if let (true, Some(&next)) = (config.pipelined, batches.get(k + 1)) {
                in_flight += push_chains(&mut ring, plan, tree, next, slots, config.times)?;
                ring.submit()?;
            }
            for (i, f) in (first..).zip(files) {
                let times = f.times();
                // SAFETY: a valid dir fd or an fd installed above; NUL-terminated name; two valid
                // timespecs.
                check(unsafe {
                    match config.times {
                        Times::ByPath => libc::utimensat(
                            tree.dir(f),
                            f.temp.as_ptr(),
                            times.as_ptr(),
                            libc::AT_SYMLINK_NOFOLLOW,
                        ),
                        Times::Installed => libc::futimens(fds[i % slots], times.as_ptr()),
                    }
                })?;
                if config.times == Times::Installed {
                    let close = opcode::Close::new(types::Fd(fds[i % slots]))
                        .build()
                        .user_data(tag(i, CLOSE));
                    // SAFETY: the entry holds no pointer.
                    unsafe { ring.submission().push(&close) }.map_err(io::Error::other)?;
                    fds[i % slots] = -1;
                    in_flight += 1;
                }
                let dir = tree.dir(f);
                if config.rename_in_ring {
                    let rename = opcode::RenameAt::new(
                        types::Fd(dir),
                        f.temp.as_ptr(),
                        types::Fd(dir),
                        f.name.as_ptr(),
                    )
                    .flags(libc::RENAME_NOREPLACE)
                    .build()
                    .user_data(tag(i, RENAME));
                    // SAFETY: the names live in `plan`, which outlives the `reap` of this entry.
                    unsafe { ring.submission().push(&rename) }.map_err(io::Error::other)?;
                    in_flight += 1;
                } else {
                    rename_into_place(dir, f)?;
                }
            }
        }
        reap(&mut ring, plan, &mut fds, in_flight)
    }

    /// Reaps `want` completions and checks each.
    fn reap(ring: &mut IoUring, plan: &Plan, fds: &mut [RawFd], want: usize) -> io::Result<()> {
        let slots = fds.len();
        complete(ring, want, |i, op, res| {
            match op {
                OPEN if res < 0 => return Err(failed("openat", res)),
                WRITE if res != plan.files[i].len as i32 => {
                    return Err(failed("write", res.min(-libc::EIO)))
                }
                INSTALL if res < 0 => return Err(failed("fixed fd install", res)),
                INSTALL => fds[i % slots] = res,
                CLOSE if res < 0 => return Err(failed("close", res)),
                RENAME if res < 0 => return Err(failed("renameat", res)),
                _ => {}
            }
            Ok(())
        })
    }

    /// Queues the chains of the batch starting at file `first`; returns how many completions
    /// they will post.
    fn push_chains(
        ring: &mut IoUring,
        plan: &Plan,
        tree: &Tree,
        (first, files): (usize, &[FileSpec]),
        slots: usize,
        times: Times,
    ) -> io::Result<usize> {
        // O_CLOEXEC is refused with a direct descriptor (which no exec can inherit anyway).
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let link = squeue::Flags::IO_LINK;
        let mut sq = ring.submission();
        let mut posted = 0;
        for (i, f) in (first..).zip(files) {
            let slot = (i % slots) as u32;
            let fixed = types::Fixed(slot);
            let target = types::DestinationSlot::try_from_slot_target(slot)
                .map_err(|_| io::Error::other("no such direct descriptor slot"))?;
            let data = f.data(&plan.pool);
            let mut chain = vec![
                opcode::OpenAt::new(types::Fd(tree.dir(f)), f.temp.as_ptr())
                    .flags(flags)
                    .mode(MODE)
                    .file_index(Some(target))
                    .build()
                    .flags(link)
                    .user_data(tag(i, OPEN)),
                opcode::Write::new(fixed, data.as_ptr(), data.len() as u32)
                    .offset(0)
                    .build()
                    .flags(link)
                    .user_data(tag(i, WRITE)),
            ];
            if times == Times::Installed {
                chain.push(
                    opcode::FixedFdInstall::new(fixed, 0)
                        .build()
                        .flags(link)
                        .user_data(tag(i, INSTALL)),
                );
            }
            chain.push(opcode::Close::new(fixed).build().user_data(tag(i, CLOSE)));
            posted += chain.len();
            // SAFETY: the names and bytes live in `plan`, which outlives the `reap` of these
            // entries.
            unsafe { sq.push_multiple(&chain) }.map_err(io::Error::other)?;
        }
        Ok(posted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("ferry-create-test-{name}-{}", std::process::id()))
    }

    fn makes_and_checks(variant: Variant, name: &str) {
        let plan = Plan::new(300, 7);
        let root = scratch(name);
        let rate = create_run(&plan, &root, variant).expect("create and verify");
        assert!(rate > 0.0);
        assert!(!root.exists(), "the tree is removed after the run");
    }

    #[test]
    fn std_variant_makes_the_planned_tree() {
        makes_and_checks(Variant::Std { threads: 1 }, "std1");
        makes_and_checks(Variant::Std { threads: 3 }, "std3");
        makes_and_checks(Variant::Renamed, "renamed");
    }

    #[cfg(feature = "uring")]
    #[test]
    fn uring_arrangements_make_the_planned_tree() {
        use uring::{Config, Times};
        for (i, times) in [Times::ByPath, Times::Installed].into_iter().enumerate() {
            for (rename_in_ring, pipelined) in
                [(false, false), (true, false), (false, true), (true, true)]
            {
                let config = Config {
                    batch: 64,
                    times,
                    rename_in_ring,
                    max_workers: 1,
                    pipelined,
                };
                let name = format!("uring{i}{rename_in_ring}{pipelined}");
                makes_and_checks(Variant::Uring(config), &name);
            }
        }
        makes_and_checks(Variant::Uring(Config::BEST), "uring-best");
    }

    #[test]
    fn verify_catches_wrong_bytes_times_and_leftovers() {
        let plan = Plan::new(50, 3);
        let root = scratch("verify");
        let tree = Tree::new(&root, plan.dirs).unwrap();
        create_std(&plan, &tree, 1).unwrap();
        tree.verify(&plan).expect("a correct tree passes");

        let f = &plan.files[17];
        let path = tree.path(f);
        let good = fs::read(&path).unwrap();
        let mut bad = good.clone();
        bad[100] ^= 1;
        fs::write(&path, &bad).unwrap();
        assert!(tree.verify(&plan).is_err(), "a flipped byte is caught");

        let file = fs::File::options().write(true).open(&path).unwrap();
        (&file).write_all(&good).unwrap();
        let times = f.times();
        // SAFETY: valid fd and two valid timespecs.
        check(unsafe { libc::futimens(file.as_raw_fd(), times.as_ptr()) }).unwrap();
        tree.verify(&plan).expect("restored");
        file.set_modified(std::time::SystemTime::now()).unwrap();
        assert!(tree.verify(&plan).is_err(), "a wrong mtime is caught");
        // SAFETY: as above.
        check(unsafe { libc::futimens(file.as_raw_fd(), times.as_ptr()) }).unwrap();

        let leftover = root.join("d001").join(".f000001.ferry-part");
        fs::write(&leftover, b"x").unwrap();
        assert!(
            tree.verify(&plan).is_err(),
            "a leftover temporary file is caught"
        );
    }
}
