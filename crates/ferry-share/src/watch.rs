//! Change notifications: the shared directory watched with inotify, changes gathered for a short while and
//! announced together, as share paths.
//!
//! Every directory of the share gets a watch (new ones as they appear; symlinks are not followed). A
//! change announces the changed entry and its directory (a listing of the directory is stale too). When the
//! kernel's queue overflowed, the whole share is announced (the empty path). When the watch limit
//! (`fs.inotify.max_user_watches`) is reached, a warning goes once through the warning callback, and from
//! then on the whole share is announced every [`UNWATCHED_INTERVAL`]: changes in the directories without a
//! watch reach clients late, never silently (and no read is ever wrong meanwhile: versions are checked on
//! every read).
//!
//! When the shared directory itself goes (removed, moved away, its file system unmounted), nothing at its
//! path is the share any more: [`WatchNotice::Gone`] says so, once, and the watch ends.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;

use crate::wire::SharePath;

/// How often the whole share is announced while some directories have no watch.
pub const UNWATCHED_INTERVAL: Duration = Duration::from_secs(10);

/// A running watch; dropping it stops it.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How often the path of the shared directory is looked at, to see it removed or replaced.
const ROOT_CHECK: Duration = Duration::from_millis(500);

/// What the watch tells besides changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchNotice {
    /// Something cannot be watched (the watch limit): changes there are announced late.
    Warning(String),
    /// The shared directory was removed, moved away or unmounted; the watch has ended.
    Gone(String),
}

fn flags() -> WatchFlags {
    WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MODIFY
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::ATTRIB
        | WatchFlags::ONLYDIR
        | WatchFlags::DONT_FOLLOW
}

/// Watches `root`; `on_change` gets the changed paths (sorted, each once) at most every `debounce`, and
/// `on_notice` what cannot be watched and the end of the shared directory.
pub fn watch(
    root: &Path,
    debounce: Duration,
    on_change: impl FnMut(Vec<SharePath>) + Send + 'static,
    on_notice: impl FnMut(WatchNotice) + Send + 'static,
) -> io::Result<Watcher> {
    watch_limited(
        root,
        debounce,
        UNWATCHED_INTERVAL,
        usize::MAX,
        on_change,
        on_notice,
    )
}

/// [`watch`] with at most `max_watches` watches (the kernel's limit stands anyway) and the interval of
/// whole-share announcements once the limit is reached.
fn watch_limited(
    root: &Path,
    debounce: Duration,
    unwatched_interval: Duration,
    max_watches: usize,
    mut on_change: impl FnMut(Vec<SharePath>) + Send + 'static,
    mut on_notice: impl FnMut(WatchNotice) + Send + 'static,
) -> io::Result<Watcher> {
    let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)?;
    let mut state = State {
        fd,
        root: root.to_path_buf(),
        dirs: HashMap::new(),
        full: false,
        max_watches,
    };
    state.add_tree(&[], &mut |w| on_notice(WatchNotice::Warning(w)));
    // The directory itself, to see it go: one that this process holds open (the share does) gets no
    // `IN_DELETE_SELF` when removed until it is closed, so what DIR's path names is looked at too.
    let dir = std::fs::File::open(root)?;
    let mut looked = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 << 10];
        let mut pending = BTreeSet::new();
        let mut since: Option<Instant> = None;
        let mut whole_announced = Instant::now();
        let tick = Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        while !stop2.load(Ordering::Relaxed) {
            let mut fds = [PollFd::new(&state.fd, PollFlags::IN)];
            let _ = rustix::event::poll(&mut fds, Some(&tick));
            let mut reader = inotify::Reader::new(&state.fd, &mut buf);
            let mut new_dirs = Vec::new();
            // Until EAGAIN: everything queued now.
            while let Ok(ev) = reader.next() {
                let flags = ev.events();
                if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                    pending.insert(SharePath::root());
                    continue;
                }
                let Some(dir) = state.dirs.get(&ev.wd()).cloned() else {
                    continue;
                };
                // The root's own end (its watch is never removed by this process).
                if dir.is_empty() {
                    let how = if flags.contains(ReadFlags::MOVE_SELF) {
                        Some("was moved away")
                    } else if flags.contains(ReadFlags::UNMOUNT) {
                        Some("is gone: its file system was unmounted")
                    } else if flags.intersects(ReadFlags::DELETE_SELF | ReadFlags::IGNORED) {
                        Some("was removed")
                    } else {
                        None
                    };
                    if let Some(how) = how {
                        on_notice(WatchNotice::Gone(format!(
                            "the shared directory {} {how}",
                            state.root.display()
                        )));
                        return;
                    }
                }
                if flags.contains(ReadFlags::IGNORED) {
                    state.dirs.remove(&ev.wd());
                    continue;
                }
                pending.extend(SharePath::new(&dir).ok());
                if let Some(name) = ev.file_name() {
                    let path = join(&dir, name.to_bytes());
                    if let Ok(p) = SharePath::new(&path) {
                        if flags.contains(ReadFlags::ISDIR)
                            && flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO)
                        {
                            new_dirs.push(path);
                        }
                        pending.insert(p);
                    }
                }
            }
            if looked.elapsed() >= ROOT_CHECK {
                looked = Instant::now();
                // Gone when DIR no longer names it (a link count alone is not trusted: some file
                // systems report 0 or 1 for directories); removed if nothing links it any more.
                let identity = |m: &std::fs::Metadata| (m.dev(), m.ino());
                let how = match (dir.metadata(), std::fs::metadata(&state.root)) {
                    (Ok(held), now) => {
                        let elsewhere = match now {
                            Ok(now) => identity(&now) != identity(&held),
                            Err(e) => e.kind() == io::ErrorKind::NotFound,
                        };
                        elsewhere.then_some(match held.nlink() {
                            0 => "was removed",
                            _ => "was moved away",
                        })
                    }
                    (Err(_), _) => None,
                };
                if let Some(how) = how {
                    on_notice(WatchNotice::Gone(format!(
                        "the shared directory {} {how}",
                        state.root.display()
                    )));
                    return;
                }
            }
            for d in new_dirs {
                state.add_tree(&d, &mut |w| on_notice(WatchNotice::Warning(w)));
            }
            if state.full && whole_announced.elapsed() >= unwatched_interval {
                pending.insert(SharePath::root());
                whole_announced = Instant::now();
            }
            if !pending.is_empty() {
                let first = *since.get_or_insert_with(Instant::now);
                if first.elapsed() >= debounce {
                    on_change(std::mem::take(&mut pending).into_iter().collect());
                    since = None;
                }
            }
        }
    });
    Ok(Watcher {
        stop,
        thread: Some(thread),
    })
}

struct State {
    fd: std::os::fd::OwnedFd,
    root: PathBuf,
    /// Watch descriptor → the directory's share path.
    dirs: HashMap<i32, Vec<u8>>,
    /// The watch limit was reached (reported once).
    full: bool,
    /// Most watches to add (below the kernel's own limit only in tests).
    max_watches: usize,
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

impl State {
    /// Watches the directory `rel` and every directory below it (not through symlinks).
    fn add_tree(&mut self, rel: &[u8], warn: &mut dyn FnMut(String)) {
        let mut stack = vec![rel.to_vec()];
        while let Some(dir) = stack.pop() {
            let full = self.root.join(OsStr::from_bytes(&dir));
            let added = if self.dirs.len() >= self.max_watches {
                Err(Errno::NOSPC)
            } else {
                inotify::add_watch(&self.fd, &full, flags())
            };
            match added {
                Ok(wd) => {
                    self.dirs.insert(wd, dir.clone());
                }
                Err(Errno::NOSPC) => {
                    if !self.full {
                        self.full = true;
                        warn(format!(
                            "the inotify watch limit is reached (fs.inotify.max_user_watches): changes in {} and other directories are announced as a change of the whole share every {} s",
                            full.display(),
                            UNWATCHED_INTERVAL.as_secs()
                        ));
                    }
                    continue;
                }
                Err(_) => continue, // gone meanwhile, or not a directory any more
            }
            let Ok(read) = std::fs::read_dir(&full) else {
                continue;
            };
            for entry in read.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(join(&dir, entry.file_name().as_bytes()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn p(s: &str) -> SharePath {
        SharePath::new(s.as_bytes()).unwrap()
    }

    #[test]
    fn writes_anywhere_in_the_share_are_announced_once() {
        let t = ferry_testkit::temp_dir("ferry-watch-");
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        let (tx, rx) = mpsc::channel();
        let _w = watch(
            t.path(),
            Duration::from_millis(50),
            move |paths| tx.send(paths).unwrap(),
            |w| panic!("{w:?}"),
        )
        .unwrap();
        std::fs::write(t.path().join("a/b/new.txt"), b"x").unwrap();
        let got = rx.recv_timeout(Duration::from_secs(5)).expect("announced");
        assert!(
            got.contains(&p("a/b/new.txt")) && got.contains(&p("a/b")),
            "{got:?}"
        );
        // A directory made after the watch started is watched too.
        std::fs::create_dir(t.path().join("later")).unwrap();
        let _ = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the new directory");
        std::fs::write(t.path().join("later/inside"), b"y").unwrap();
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !seen.contains(&p("later/inside")) {
            let left = deadline.saturating_duration_since(Instant::now());
            seen.extend(rx.recv_timeout(left).expect("a write in a new directory"));
        }
    }

    #[test]
    fn past_the_watch_limit_the_whole_share_is_announced() {
        let t = ferry_testkit::temp_dir("ferry-watch-");
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        let (tx, rx) = mpsc::channel();
        let (wtx, wrx) = mpsc::channel();
        let _w = watch_limited(
            t.path(),
            Duration::from_millis(20),
            Duration::from_millis(200),
            1,
            move |paths| tx.send(paths).unwrap(),
            move |w| wtx.send(w).unwrap(),
        )
        .unwrap();
        let warning = wrx.recv_timeout(Duration::from_secs(5)).expect("warned");
        assert!(
            matches!(&warning, WatchNotice::Warning(w) if w.contains("limit")),
            "{warning:?}"
        );
        assert!(wrx.try_recv().is_err(), "warned once");
        // A write in an unwatched directory: the whole share is announced soon.
        std::fs::write(t.path().join("a/b/new.txt"), b"x").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let got = rx.recv_timeout(left).expect("the whole share announced");
            if got.contains(&SharePath::root()) {
                break;
            }
        }
    }

    #[test]
    fn the_end_of_the_shared_directory_is_told_once() {
        for how in ["was removed", "was moved away", "was replaced"] {
            let t = ferry_testkit::temp_dir("ferry-watch-");
            let root = t.path().join("shared");
            std::fs::create_dir_all(root.join("sub")).unwrap();
            let (tx, rx) = mpsc::channel();
            // Held open, as the share holds it (no IN_DELETE_SELF then).
            let _held = std::fs::File::open(&root).unwrap();
            let w = watch(
                &root,
                Duration::from_millis(20),
                |_| {},
                move |n| tx.send(n).unwrap(),
            )
            .unwrap();
            // A subdirectory removed or moved is a change, not the end.
            std::fs::rename(root.join("sub"), root.join("sub2")).unwrap();
            std::fs::remove_dir(root.join("sub2")).unwrap();
            assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
            match how {
                "was removed" => std::fs::remove_dir(&root).unwrap(),
                "was moved away" => std::fs::rename(&root, t.path().join("elsewhere")).unwrap(),
                _ => {
                    // Another directory renamed over it: the shared one is removed.
                    std::fs::create_dir(t.path().join("new")).unwrap();
                    std::fs::rename(t.path().join("new"), &root).unwrap();
                }
            }
            let told = match how {
                "was replaced" => "was removed",
                how => how,
            };
            let got = rx.recv_timeout(Duration::from_secs(5)).expect("told");
            assert_eq!(
                got,
                WatchNotice::Gone(format!("the shared directory {} {told}", root.display()))
            );
            drop(w);
            assert!(rx.try_recv().is_err(), "told once");
        }
    }
}
