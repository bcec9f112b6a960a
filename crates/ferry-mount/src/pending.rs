//! Name and attribute changes made in the mount while the sharer is out of reach: kept in order, in a
//! journal beside the working copies, and sent when the link is back, before any working copy is pushed.
//!
//! Offline, the mount changes its own view at once (the inode table, the copies' paths) and queues what
//! the sharer must do to match: a `mkdir`, a rename, a removal, a `chmod`. Content is never queued: the
//! working copies are the content, journaled already, and pushed after the queue is empty, so every copy
//! lands under the path its last rename gave it, in a directory the queue made. A file made in the mount
//! and never pushed is not on the sharer: its renames only move its copy, and are not queued.
//!
//! A queued change the sharer refuses when it comes (another peer removed the file meanwhile, say) is said
//! and dropped; nothing of the content is lost by it, since content goes with the pushes, which keep both
//! versions of a file changed on both sides (the conflict rule).

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use ferry_share::wire::{SharePath, Time};

use crate::source::{Sink, SourceError};
use crate::writes::{hex, unhex};

/// One change to send to the sharer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `mkdir path` with these permission bits.
    Mkdir(SharePath, u32),
    /// `rmdir path`.
    Rmdir(SharePath),
    /// Removes the file or symlink, if still the version last seen (when known).
    Unlink(SharePath, Option<[u8; 32]>),
    /// Renames `from` to `to`, replacing `to` when the flag says so, if `to` is still the version last
    /// seen (when known; otherwise `from` is kept beside it).
    Rename(SharePath, SharePath, bool, Option<[u8; 32]>),
    /// Sets the permission bits and/or the modification time.
    SetAttr(SharePath, Option<u32>, Option<Time>),
    /// Makes a symlink at the path to the target.
    Symlink(SharePath, Vec<u8>),
}

impl Op {
    /// Sends the change to `sink`: `Some` of the name a rename was kept under beside a file that changed.
    pub fn apply(&self, sink: &dyn Sink) -> Result<Option<Vec<u8>>, SourceError> {
        match self {
            Op::Mkdir(p, mode) => sink.mkdir(p, *mode),
            Op::Rmdir(p) => sink.rmdir(p),
            Op::Unlink(p, base) => sink.unlink(p, *base),
            Op::Rename(from, to, replace, base) => return sink.rename(from, to, *replace, *base),
            Op::SetAttr(p, mode, mtime) => sink.set_attr(p, *mode, *mtime),
            Op::Symlink(p, target) => sink.symlink(p, target),
        }
        .map(|()| None)
    }

    /// Whether `errno`, answered to this change, means the sharer is already as the change would make it
    /// (a directory made twice, a file removed twice): not worth a word.
    fn already_done(&self, errno: i32) -> bool {
        matches!(
            (self, errno),
            (Op::Mkdir(..), libc::EEXIST) | (Op::Rmdir(_) | Op::Unlink(..), libc::ENOENT)
        )
    }

    /// What the change does, for the log (paths escaped).
    pub fn describe(&self) -> String {
        let p = |p: &SharePath| p.as_bytes().escape_ascii().to_string();
        match self {
            Op::Mkdir(path, _) => format!("mkdir {}", p(path)),
            Op::Rmdir(path) => format!("rmdir {}", p(path)),
            Op::Unlink(path, _) => format!("remove {}", p(path)),
            Op::Rename(from, to, ..) => format!("rename {} to {}", p(from), p(to)),
            Op::SetAttr(path, ..) => format!("set the mode or time of {}", p(path)),
            Op::Symlink(path, _) => format!("symlink {}", p(path)),
        }
    }

    pub(crate) fn encode(&self) -> String {
        // An empty field (a symlink's target) is written `-`, so that every field has a word.
        let hex = |b: &[u8]| match b.is_empty() {
            true => "-".to_string(),
            false => hex(b),
        };
        let opt = |o: Option<String>| o.unwrap_or_else(|| "-".into());
        match self {
            Op::Mkdir(p, mode) => format!("mkdir {} {mode:o}", hex(p.as_bytes())),
            Op::Rmdir(p) => format!("rmdir {}", hex(p.as_bytes())),
            // The version last seen goes last, absent when unknown (as in a journal of an older ferry).
            Op::Unlink(p, base) => format!("unlink {}{}", hex(p.as_bytes()), seen(base)),
            Op::Rename(from, to, replace, base) => format!(
                "rename {} {} {}{}",
                hex(from.as_bytes()),
                hex(to.as_bytes()),
                u8::from(*replace),
                seen(base)
            ),
            Op::SetAttr(p, mode, mtime) => format!(
                "setattr {} {} {}",
                hex(p.as_bytes()),
                opt(mode.map(|m| format!("{m:o}"))),
                opt(mtime.map(|t| format!("{}.{}", t.secs, t.nanos)))
            ),
            Op::Symlink(p, target) => format!("symlink {} {}", hex(p.as_bytes()), hex(target)),
        }
    }

    /// The change on `line`, or `None` if it is not one (cut short by a crash).
    pub(crate) fn decode(line: &str) -> Option<Op> {
        let unhex = |s: &str| match s {
            "-" => Some(Vec::new()),
            s => unhex(s),
        };
        let path = |s: &str| SharePath::new(&unhex(s)?).ok();
        let mut w = line.split(' ');
        let op = match (w.next()?, w.next()?) {
            ("mkdir", p) => Op::Mkdir(path(p)?, u32::from_str_radix(w.next()?, 8).ok()? & 0o7777),
            ("rmdir", p) => Op::Rmdir(path(p)?),
            ("unlink", p) => Op::Unlink(path(p)?, root(w.next())?),
            ("rename", p) => {
                let (to, replace) = (path(w.next()?)?, w.next()? == "1");
                Op::Rename(path(p)?, to, replace, root(w.next())?)
            }
            ("setattr", p) => {
                let mode = match w.next()? {
                    "-" => None,
                    m => Some(u32::from_str_radix(m, 8).ok()? & 0o7777),
                };
                let mtime = match w.next()? {
                    "-" => None,
                    t => {
                        let (secs, nanos) = t.split_once('.')?;
                        Some(Time {
                            secs: secs.parse().ok()?,
                            nanos: nanos.parse().ok().filter(|n| *n < 1_000_000_000)?,
                        })
                    }
                };
                Op::SetAttr(path(p)?, mode, mtime)
            }
            ("symlink", p) => Op::Symlink(path(p)?, unhex(w.next()?)?),
            _ => return None,
        };
        w.next().is_none().then_some(op)
    }
}

/// ` ROOT` in hex for a version last seen, nothing when unknown.
fn seen(base: &Option<[u8; 32]>) -> String {
    base.map(|b| format!(" {}", hex(&b))).unwrap_or_default()
}

/// A journal's optional last field: `Some(None)` when absent, `None` when it is no root.
fn root(word: Option<&str>) -> Option<Option<[u8; 32]>> {
    match word {
        None => Some(None),
        Some(w) => unhex(w)?.try_into().ok().map(Some),
    }
}

/// The journal's first line.
const MAGIC: &str = "ferry-pending 1";

/// The changes waiting for the sharer, in order, with their journal.
#[derive(Debug)]
pub struct Pending {
    journal: PathBuf,
    ops: Mutex<VecDeque<Op>>,
    /// Held while the queue is sent, so that two senders never send one change twice.
    sending: Mutex<()>,
}

/// What one [`Pending::send`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Sent {
    /// Changes the sharer took.
    pub applied: usize,
    /// Changes the sharer refused (dropped), with why.
    pub refused: Vec<(Op, String)>,
    /// The link was lost before the queue was empty: the rest waits.
    pub offline: bool,
}

impl Pending {
    /// The queue journaled at `journal` (read back if an earlier mount left one).
    pub fn open(journal: &Path) -> io::Result<Pending> {
        let ops = match std::fs::read_to_string(journal) {
            Ok(text) => {
                let mut lines = text.lines();
                match lines.next() {
                    // A line a crash cut short ends what can be read: the journal is rewritten whole at
                    // every change, so only the last one can be.
                    Some(MAGIC) => lines.map_while(Op::decode).collect(),
                    _ => VecDeque::new(),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => VecDeque::new(),
            Err(e) => return Err(e),
        };
        Ok(Pending {
            journal: journal.to_path_buf(),
            ops: Mutex::new(ops),
            sending: Mutex::new(()),
        })
    }

    fn ops(&self) -> MutexGuard<'_, VecDeque<Op>> {
        self.ops.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether no change waits.
    pub fn is_empty(&self) -> bool {
        self.ops().is_empty()
    }

    /// How many changes wait.
    pub fn len(&self) -> usize {
        self.ops().len()
    }

    /// Queues `op` after the others, journaled before this returns.
    pub fn push(&self, op: Op) -> io::Result<()> {
        let mut ops = self.ops();
        ops.push_back(op);
        self.write(&ops).inspect_err(|_| {
            ops.pop_back();
        })
    }

    /// Writes the journal whole (through a temporary file and a rename, so a crash leaves the old or the
    /// new one); an empty queue has none.
    fn write(&self, ops: &VecDeque<Op>) -> io::Result<()> {
        if ops.is_empty() {
            return match std::fs::remove_file(&self.journal) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        let mut text = format!("{MAGIC}\n");
        for op in ops {
            text.push_str(&op.encode());
            text.push('\n');
        }
        let mut tmp = self.journal.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.journal)
    }

    /// Sends the changes to `sink` in order, each taken off the queue once the sharer answered it (done,
    /// or refused: said in [`Sent::refused`]); stops at the first that finds the link lost.
    pub fn send(&self, sink: &dyn Sink) -> Sent {
        let _sending = self.sending.lock().unwrap_or_else(|e| e.into_inner());
        let mut sent = Sent::default();
        loop {
            let Some(op) = self.ops().front().cloned() else {
                return sent;
            };
            match op.apply(sink) {
                Ok(None) => sent.applied += 1,
                // The conflict rule: the sharer's file stays, the renamed one is kept beside it.
                Ok(Some(name)) => {
                    let why = format!(
                        "conflict: it changed on the sharer too: its version stays, yours is kept as {}",
                        name.escape_ascii()
                    );
                    sent.refused.push((op, why));
                }
                Err(SourceError::Offline(_)) => {
                    sent.offline = true;
                    return sent;
                }
                Err(e) if op.already_done(e.errno()) => sent.applied += 1,
                Err(e) => sent.refused.push((op, e.to_string())),
            }
            let mut ops = self.ops();
            ops.pop_front();
            // A journal that cannot be rewritten sends the change again next time: the sharer answers it
            // as done before.
            let _ = self.write(&ops);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> SharePath {
        SharePath::new(s.as_bytes()).unwrap()
    }

    #[test]
    fn every_change_reads_back_from_its_journal_line() {
        let ops = [
            Op::Mkdir(p("d"), 0o755),
            Op::Rmdir(p("d/e f")),
            Op::Unlink(p("x"), None),
            Op::Unlink(p("x"), Some([7; 32])),
            Op::Rename(p("a"), p("d/b"), true, None),
            Op::Rename(p("a"), p("d/b"), true, Some([9; 32])),
            Op::Rename(p("a"), p("b"), false, None),
            Op::SetAttr(p("a"), Some(0o600), None),
            Op::SetAttr(p("a"), None, Some(Time { secs: -5, nanos: 7 })),
            Op::Symlink(p("l"), b"../t".to_vec()),
        ];
        for op in ops {
            assert_eq!(Op::decode(&op.encode()), Some(op));
        }
        assert_eq!(Op::decode("rename 61"), None);
        assert_eq!(Op::decode("mkdir 61 755 extra"), None);
        assert_eq!(Op::decode("unlink 2f2e2e"), None, "an unsafe path");
        // An older mount's journal names no version: still read.
        assert_eq!(
            Op::decode("rename 61 62 1"),
            Some(Op::Rename(p("a"), p("b"), true, None))
        );
        assert_eq!(Op::decode("unlink 78 abcd"), None, "a version too short");
    }

    #[test]
    fn the_queue_survives_the_mount_and_a_cut_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let j = dir.path().join("pending");
        let q = Pending::open(&j).unwrap();
        q.push(Op::Mkdir(p("d"), 0o700)).unwrap();
        q.push(Op::Rename(p("a"), p("d/a"), true, None)).unwrap();
        drop(q);
        let q = Pending::open(&j).unwrap();
        assert_eq!(q.len(), 2);
        // A crash while it was written cuts the last line at worst.
        let text = std::fs::read_to_string(&j).unwrap();
        std::fs::write(&j, &text[..text.len() - 4]).unwrap();
        assert_eq!(Pending::open(&j).unwrap().len(), 1);
    }

    /// Records the changes it takes; offline while `down`; refuses a rename of `gone`.
    #[derive(Default)]
    struct Recorder {
        done: Mutex<Vec<String>>,
        down: std::sync::atomic::AtomicBool,
    }

    impl Sink for Recorder {
        fn mkdir(&self, path: &SharePath, _mode: u32) -> Result<(), SourceError> {
            self.take(
                format!("mkdir {path:?}"),
                libc::EEXIST,
                path == &p("exists"),
            )
        }
        fn rename(
            &self,
            from: &SharePath,
            to: &SharePath,
            _: bool,
            _: Option<[u8; 32]>,
        ) -> Result<Option<Vec<u8>>, SourceError> {
            self.take(
                format!("rename {from:?} {to:?}"),
                libc::ENOENT,
                from == &p("gone"),
            )
            .map(|()| None)
        }
        fn unlink(&self, path: &SharePath, _: Option<[u8; 32]>) -> Result<(), SourceError> {
            self.take(format!("unlink {path:?}"), libc::ENOENT, false)
        }
    }

    impl Recorder {
        fn take(&self, what: String, errno: i32, refuse: bool) -> Result<(), SourceError> {
            if self.down.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(SourceError::Offline("down".into()));
            }
            if refuse {
                return Err(SourceError::Failed {
                    errno,
                    message: "refused".into(),
                });
            }
            self.done.lock().unwrap().push(what);
            Ok(())
        }
    }

    #[test]
    fn changes_go_in_order_wait_for_the_link_and_a_refused_one_is_said_and_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let q = Pending::open(&dir.path().join("pending")).unwrap();
        q.push(Op::Mkdir(p("d"), 0o755)).unwrap();
        q.push(Op::Mkdir(p("exists"), 0o755)).unwrap();
        q.push(Op::Rename(p("gone"), p("x"), true, None)).unwrap();
        q.push(Op::Rename(p("a"), p("d/a"), true, None)).unwrap();
        let sink = Recorder::default();
        sink.down.store(true, std::sync::atomic::Ordering::Relaxed);
        let sent = q.send(&sink);
        assert!(sent.offline);
        assert_eq!((sent.applied, q.len()), (0, 4));
        sink.down.store(false, std::sync::atomic::Ordering::Relaxed);
        let sent = q.send(&sink);
        assert!(!sent.offline);
        // The directory made twice is done; the rename of a file gone meanwhile is said and dropped.
        assert_eq!(sent.applied, 3);
        assert_eq!(sent.refused.len(), 1);
        assert_eq!(sent.refused[0].0, Op::Rename(p("gone"), p("x"), true, None));
        assert!(q.is_empty());
        assert_eq!(
            *sink.done.lock().unwrap(),
            [
                format!("mkdir {:?}", p("d")),
                format!("rename {:?} {:?}", p("a"), p("d/a"))
            ]
        );
        assert!(
            !dir.path().join("pending").exists(),
            "no journal once empty"
        );
    }
}
