//! Working copies against an in-memory sharer that applies puts as the real one does: ranges over the
//! base's content, the conflict rule.
#![allow(clippy::single_range_in_vec_init)]

use std::collections::HashMap;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferry_share::tree::Version;
use ferry_share::wire::{Entry, SharePath, Time};

use super::{Pushed, Recovered, WorkingCopy, Writes};
use crate::source::{PutContent, PutOutcome, Sink, SourceError};

/// A file's content, the counter standing in for its root, its mode.
type FakeFile = (Vec<u8>, u8, u32);

/// Files by path; every put's ranges are recorded.
#[derive(Default)]
struct FakeSharer {
    files: Mutex<HashMap<SharePath, FakeFile>>,
    sent: Mutex<Vec<Option<Vec<Range<u64>>>>>,
}

fn root(n: u8) -> [u8; 32] {
    [n; 32]
}

impl FakeSharer {
    fn set(&self, path: &str, content: &[u8]) -> Version {
        let mut files = self.files.lock().unwrap();
        let n = files.get(&p(path)).map_or(1, |f| f.1 + 1);
        files.insert(p(path), (content.to_vec(), n, 0o644));
        Version {
            root: root(n),
            size: content.len() as u64,
        }
    }

    fn content(&self, path: &str) -> Vec<u8> {
        self.files.lock().unwrap()[&p(path)].0.clone()
    }
}

impl Sink for FakeSharer {
    fn put(
        &self,
        path: &SharePath,
        base: Option<[u8; 32]>,
        content: PutContent<'_>,
    ) -> Result<PutOutcome, SourceError> {
        let (file, ranges, mode) = (content.file, content.ranges, content.mode);
        self.sent.lock().unwrap().push(ranges.map(|r| r.to_vec()));
        if path.as_bytes().starts_with(b"gone/") {
            return Err(SourceError::Failed {
                errno: libc::ENOENT,
                message: "gone: no such directory".into(),
            });
        }
        let mut all = vec![0; file.metadata().unwrap().len() as usize];
        file.read_exact_at(&mut all, 0).unwrap();
        let mut files = self.files.lock().unwrap();
        let current = files.get(path).map(|f| root(f.1));
        // As the sharer does: the base's bytes, then the ranges sent.
        let content = match (ranges, files.get(path)) {
            (Some(ranges), Some(old)) => {
                let mut c = old.0.clone();
                c.resize(all.len(), 0);
                for r in ranges {
                    c[r.start as usize..r.end as usize]
                        .copy_from_slice(&all[r.start as usize..r.end as usize]);
                }
                c
            }
            _ => all.clone(),
        };
        if current != base {
            let name = format!("{}.conflict", String::from_utf8_lossy(path.as_bytes()));
            files.insert(p(&name), (all, 100, mode));
            return Ok(PutOutcome::Conflicted {
                name: name.into_bytes(),
            });
        }
        let n = files.get(path).map_or(1, |f| f.1 + 1);
        let size = content.len() as u64;
        files.insert(path.clone(), (content, n, mode));
        Ok(PutOutcome::Written {
            version: Version {
                root: root(n),
                size,
            },
        })
    }
}

/// Refuses every put for want of room, or fails it as a lost link while set.
struct Refusing(std::sync::atomic::AtomicBool);

impl Sink for Refusing {
    fn put(
        &self,
        _: &SharePath,
        _: Option<[u8; 32]>,
        _: PutContent<'_>,
    ) -> Result<PutOutcome, SourceError> {
        Err(match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            true => SourceError::Offline("link lost".into()),
            false => SourceError::Failed {
                errno: libc::ENOSPC,
                message: "no space left on the sharer".into(),
            },
        })
    }
}

/// A push nobody stops.
const NEVER: &dyn Fn() -> bool = &|| false;

fn p(s: &str) -> SharePath {
    SharePath::new(s.as_bytes()).unwrap()
}

/// The sharer's entry of a file (0644, time 0).
fn file_entry(name: &[u8], size: u64) -> Entry {
    Entry {
        name: name.to_vec(),
        kind: ferry_share::wire::Kind::File,
        size,
        mode: 0o100644,
        mtime: 0,
        mtime_nsec: 0,
        target: Vec::new(),
    }
}

fn writes() -> (tempfile::TempDir, Writes) {
    let dir = tempfile::tempdir().unwrap();
    let w = Writes::new(&dir.path().join("writes")).unwrap();
    (dir, w)
}

/// A copy of the sharer's `path`, loaded.
fn copy_of(w: &Writes, sharer: &FakeSharer, path: &str, base: Version) -> WorkingCopy {
    let mut c = w.create(&p(path), Some(base), 0o644).unwrap();
    c.load(0, &sharer.content(path)).unwrap();
    c
}

#[test]
fn a_write_in_the_middle_sends_only_its_range_and_the_sharer_gets_the_whole() {
    let sharer = FakeSharer::default();
    let old: Vec<u8> = (0..100u8).collect();
    let base = sharer.set("f", &old);
    let (_d, w) = writes();
    let mut c = copy_of(&w, &sharer, "f", base);
    assert!(!c.is_dirty());
    assert_eq!(c.push(&sharer, &p("f"), NEVER).unwrap(), Pushed::Clean);
    c.write_at(10, b"abc").unwrap();
    c.write_at(12, b"XY").unwrap();
    assert_eq!(c.changed(), &[10..14]);
    assert_eq!(c.read_at(9, 6).unwrap(), [9, b'a', b'b', b'X', b'Y', 14]);
    let Pushed::Written(v) = c.push(&sharer, &p("f"), NEVER).unwrap() else {
        panic!("not written")
    };
    let mut want = old.clone();
    want[10..14].copy_from_slice(b"abXY");
    assert_eq!(sharer.content("f"), want);
    assert_eq!(c.base(), Some(v));
    assert!(!c.is_dirty() && c.changed().is_empty());
    assert_eq!(
        sharer.sent.lock().unwrap().last().unwrap(),
        &Some(vec![10..14])
    );
}

#[test]
fn appends_truncates_and_holes_reach_the_sharer_exactly() {
    let sharer = FakeSharer::default();
    let base = sharer.set("f", &[7u8; 50]);
    let (_d, w) = writes();
    let mut c = copy_of(&w, &sharer, "f", base);
    c.set_len(20).unwrap();
    // Grown again: the bytes from 20 are zeros now, not the base's sevens.
    c.set_len(30).unwrap();
    c.write_at(40, b"end").unwrap();
    assert_eq!(c.size(), 43);
    c.push(&sharer, &p("f"), NEVER).unwrap();
    let mut want = vec![7u8; 20];
    want.resize(40, 0);
    want.extend_from_slice(b"end");
    assert_eq!(sharer.content("f"), want);
    // An append on the pushed version.
    c.write_at(43, b"+").unwrap();
    assert_eq!(c.changed(), &[43..44]);
    c.push(&sharer, &p("f"), NEVER).unwrap();
    want.push(b'+');
    assert_eq!(sharer.content("f"), want);
    // Truncated to nothing: no range at all.
    c.set_len(0).unwrap();
    assert!(c.changed().is_empty());
    c.push(&sharer, &p("f"), NEVER).unwrap();
    assert_eq!(sharer.content("f"), b"");
}

#[test]
fn holes_punched_and_ranges_zeroed_are_changes_and_reach_the_sharer() {
    let sharer = FakeSharer::default();
    let base = sharer.set("f", &[7u8; 100]);
    let (_d, w) = writes();
    let mut c = copy_of(&w, &sharer, "f", base);
    // Growing to a smaller end changes nothing.
    c.grow(60).unwrap();
    assert!(!c.is_dirty() && c.size() == 100);
    c.zero(10..20, true).unwrap();
    assert_eq!(c.changed(), &[10..20]);
    assert_eq!(c.read_at(8, 4).unwrap(), [7, 7, 0, 0]);
    // Kept to the size: only up to the end counts.
    c.zero(95..200, true).unwrap();
    assert_eq!((c.size(), c.changed()), (100, &[10..20, 95..100][..]));
    // Not kept: the file grows to the range's end.
    c.zero(98..120, false).unwrap();
    assert_eq!((c.size(), c.changed()), (120, &[10..20, 95..120][..]));
    c.grow(130).unwrap();
    assert_eq!(sharer.sent.lock().unwrap().len(), 0);
    c.push(&sharer, &p("f"), NEVER).unwrap();
    let mut want = vec![7u8; 100];
    want[10..20].fill(0);
    want[95..].fill(0);
    want.resize(130, 0);
    assert_eq!(sharer.content("f"), want);
    // The end grown past the zeroed range is the sharer's zero-extension of its base: not sent.
    assert_eq!(
        sharer.sent.lock().unwrap().last().unwrap(),
        &Some(vec![10..20, 95..120])
    );
}

#[test]
fn a_new_file_is_sent_whole_and_a_changed_one_conflicts_keeping_both() {
    let sharer = FakeSharer::default();
    let (_d, w) = writes();
    let mut c = w.create(&p("n"), None, 0o600).unwrap();
    c.write_at(0, b"mine").unwrap();
    assert!(matches!(
        c.push(&sharer, &p("n"), NEVER).unwrap(),
        Pushed::Written(_)
    ));
    assert_eq!(sharer.sent.lock().unwrap().last().unwrap(), &None);
    assert_eq!(sharer.content("n"), b"mine");
    // The sharer changes it behind the copy's back.
    sharer.set("n", b"theirs");
    c.write_at(4, b"!").unwrap();
    let pushed = c.push(&sharer, &p("n"), NEVER).unwrap();
    assert_eq!(pushed, Pushed::Conflicted(b"n.conflict".to_vec()));
    assert_eq!(sharer.content("n"), b"theirs");
    assert_eq!(sharer.content("n.conflict"), b"mine!");
    assert!(!c.is_dirty());
}

#[test]
fn a_failed_push_keeps_everything_for_the_next_one() {
    let sharer = FakeSharer::default();
    let base = sharer.set("f", b"0123456789");
    let (_d, w) = writes();
    let mut c = copy_of(&w, &sharer, "f", base);
    c.write_at(3, b"x").unwrap();
    let gone = Refusing(true.into());
    assert_eq!(
        c.push(&gone, &p("f"), NEVER).unwrap_err().errno(),
        libc::EIO
    );
    assert!(c.is_dirty());
    c.push(&sharer, &p("f"), NEVER).unwrap();
    assert_eq!(sharer.content("f"), b"012x456789");
}

#[test]
fn a_refused_push_is_tried_again_less_and_less_often_and_one_the_link_lost_at_once() {
    let sharer = FakeSharer::default();
    let base = sharer.set("f", b"0123456789");
    let (_d, w) = writes();
    let mut c = copy_of(&w, &sharer, "f", base);
    c.write_at(3, b"x").unwrap();
    assert!(c.is_due(Duration::ZERO));
    let refusing = Refusing(false.into());
    // Each refusal waits twice as long before the next try, up to MAX_REFUSED_WAIT.
    let mut waits = Vec::new();
    for _ in 0..8 {
        let before = Instant::now();
        assert_eq!(
            c.push(&refusing, &p("f"), NEVER).unwrap_err().errno(),
            libc::ENOSPC
        );
        assert!(!c.is_due(Duration::ZERO), "tried again at once");
        waits.push((c.refused.1.unwrap() - before).as_secs_f64().round() as u64);
    }
    assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    // A lost link is tried again as soon as the push thread looks (it fails fast until the link is back),
    // and the waits start over.
    refusing.0.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        c.push(&refusing, &p("f"), NEVER).unwrap_err().errno(),
        libc::EIO
    );
    assert!(c.is_due(Duration::ZERO));
    // A push that lands starts the waits over.
    refusing
        .0
        .store(false, std::sync::atomic::Ordering::Relaxed);
    c.push(&refusing, &p("f"), NEVER).unwrap_err();
    c.push(&refusing, &p("f"), NEVER).unwrap_err();
    assert_eq!(c.refused.0, 2);
    c.push(&sharer, &p("f"), NEVER).unwrap();
    c.write_at(4, b"y").unwrap();
    let before = Instant::now();
    c.push(&refusing, &p("f"), NEVER).unwrap_err();
    assert_eq!((c.refused.1.unwrap() - before).as_secs_f64().round(), 1.0);
    assert!(c.is_dirty());
    c.push(&sharer, &p("f"), NEVER).unwrap();
    assert_eq!(sharer.content("f"), b"012xy56789");
}

#[test]
fn the_copy_shows_its_size_mode_and_time_and_goes_with_its_file() {
    let (_d, w) = writes();
    let mut c = w.create(&p("f"), None, 0o644).unwrap();
    c.write_at(0, b"12345").unwrap();
    c.set_mode(0o100755).unwrap();
    c.set_mtime(Time {
        secs: 1_600_000_000,
        nanos: 5,
    })
    .unwrap();
    let mut e = file_entry(b"f", 0);
    c.overlay(&mut e);
    assert_eq!(
        (e.size, e.mode, e.mtime, e.mtime_nsec),
        (5, 0o100755, 1_600_000_000, 5)
    );
    let ino = 7;
    let shared = w.insert(ino, c);
    let path = super::lock(&shared).path.clone();
    assert!(path.exists());
    assert!(w.get(ino).is_some());
    let sharer = FakeSharer::default();
    super::lock(&shared).push(&sharer, &p("f"), NEVER).unwrap();
    w.remove(ino, &shared);
    assert!(w.get(ino).is_none());
    drop(shared);
    assert!(!path.exists(), "a pushed working copy's file goes with it");
    assert_eq!(std::fs::read_dir(&w.dir).unwrap().count(), 0);
}

#[test]
fn copies_a_stopped_mount_left_unpushed_are_pushed_by_the_next_one_and_never_lost() {
    let sharer = FakeSharer::default();
    let base = sharer.set("kept.txt", b"old content");
    sharer.set("changed.txt", b"v1");
    let changed_base = Version {
        root: root(1),
        size: 2,
    };
    let (d, w) = writes();
    // A new file, an edit of an existing one, one changed on the sharer meanwhile, one whose directory is
    // gone on the sharer, and one that was pushed (clean): the mount stops before the dirty ones' push.
    let mut new = w.create(&p("new.txt"), None, 0o600).unwrap();
    new.set_len(0).unwrap();
    new.write_at(0, b"made before the crash").unwrap();
    new.set_mode(0o640).unwrap();
    let mut edit = copy_of(&w, &sharer, "kept.txt", base);
    edit.write_at(0, b"NEW").unwrap();
    let mut conflicting = w
        .create(&p("changed.txt"), Some(changed_base), 0o644)
        .unwrap();
    conflicting.load(0, b"v1").unwrap();
    conflicting.write_at(2, b"+mine").unwrap();
    let mut orphan = w.create(&p("gone/x"), None, 0o644).unwrap();
    orphan.write_at(0, b"nowhere to go").unwrap();
    let mut clean = w.create(&p("clean.txt"), None, 0o644).unwrap();
    clean.write_at(0, b"pushed").unwrap();
    clean.push(&sharer, &p("clean.txt"), NEVER).unwrap();
    sharer.set("changed.txt", b"v2 on the sharer");
    // A crash drops nothing (forget); a stop drops them: both leave the dirty copies on disk.
    std::mem::forget(new);
    drop(edit);
    drop(conflicting);
    drop(orphan);
    drop(clean);
    drop(w);

    let w = Writes::new(&d.path().join("writes")).unwrap();
    assert_eq!(w.left_behind(), 4);
    let mut said = w.push_left_behind(&sharer);
    said.sort_by_key(|r| format!("{r:?}"));
    assert_eq!(sharer.content("new.txt"), b"made before the crash");
    assert_eq!(sharer.files.lock().unwrap()[&p("new.txt")].2, 0o640);
    assert_eq!(sharer.content("kept.txt"), b"NEW content");
    assert_eq!(sharer.content("changed.txt"), b"v2 on the sharer");
    assert_eq!(sharer.content("changed.txt.conflict"), b"v1+mine");
    assert!(said.contains(&Recovered::Written(p("new.txt"))));
    assert!(said.contains(&Recovered::Written(p("kept.txt"))));
    assert!(said.contains(&Recovered::Conflicted(
        p("changed.txt"),
        b"changed.txt.conflict".to_vec()
    )));
    // The one the sharer refuses stays, said once, and is tried again by the next mount.
    let kept: Vec<_> = said
        .iter()
        .filter_map(|r| match r {
            Recovered::Kept(path, _, file) => Some((path.clone(), file.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].0, p("gone/x"));
    assert_eq!(std::fs::read(&kept[0].1).unwrap(), b"nowhere to go");
    assert_eq!(w.left_behind(), 1);
    let sent = sharer.sent.lock().unwrap().len();
    assert!(w.push_left_behind(&sharer).is_empty(), "said once");
    assert_eq!(
        sharer.sent.lock().unwrap().len(),
        sent,
        "not sent again by this mount"
    );
    drop(w);
    let w = Writes::new(&d.path().join("writes")).unwrap();
    assert_eq!(w.left_behind(), 1);
    let said = w.push_left_behind(&sharer);
    assert_eq!(
        sharer.sent.lock().unwrap().len(),
        sent + 1,
        "tried by the next mount"
    );
    assert!(matches!(&said[..], [Recovered::Kept(path, _, _)] if *path == p("gone/x")));
}

#[test]
fn a_journal_reads_back_as_written_and_a_cut_one_is_refused() {
    let j = super::Journal {
        path: p("dir/a name"),
        base: Some(Version {
            root: [0xab; 32],
            size: 12,
        }),
        mode: 0o4755,
        mtime: Some(Time {
            secs: -5,
            nanos: 999_999_999,
        }),
    };
    let text = j.encode();
    assert_eq!(super::Journal::decode(&text), Some(j.clone()));
    let none = super::Journal {
        base: None,
        mtime: None,
        ..j.clone()
    };
    assert_eq!(super::Journal::decode(&none.encode()), Some(none));
    for cut in 0..text.len() - 1 {
        // Cut within the last line's number it may read, but never as another path, base or mode.
        if let Some(d) = super::Journal::decode(&text[..cut]) {
            assert_eq!(
                (&d.path, d.base, d.mode),
                (&j.path, j.base, j.mode),
                "cut at {cut}"
            );
        }
    }
}

#[test]
fn the_files_written_in_a_directory_are_found_by_their_paths_until_removed() {
    let (_d, w) = writes();
    for (ino, path) in [
        (2, "a.txt"),
        (3, "dir/b.txt"),
        (4, "dir/sub/c.txt"),
        (5, "dirt/d"),
    ] {
        let c = w.create(&p(path), None, 0o644).unwrap();
        w.insert(ino, c);
    }
    let names = |dir: &str| {
        let mut found = w.inside(&p(dir));
        found.sort();
        found
    };
    assert_eq!(names(""), [(2, b"a.txt".to_vec())]);
    assert_eq!(names("dir"), [(3, b"b.txt".to_vec())]);
    assert_eq!(names("dir/sub"), [(4, b"c.txt".to_vec())]);
    assert!(names("di").is_empty());
    assert!(w.any_beneath(&p("dir")) && w.any_beneath(&p("dir/sub")));
    assert!(!w.any_beneath(&p("dir/sub/c.txt")) && !w.any_beneath(&p("d")));
    // A copy whose file was removed (or renamed over) is no file of the directory.
    super::lock(&w.get(4).unwrap()).orphan();
    assert!(names("dir/sub").is_empty());
    assert!(!w.any_beneath(&p("dir/sub")));
    // A renamed directory takes its files along.
    w.renamed(&p("dir"), &p("moved"));
    assert_eq!(names("moved"), [(3, b"b.txt".to_vec())]);
    assert!(names("dir").is_empty());
    assert_eq!(names("dirt"), [(5, b"d".to_vec())]);
}

#[test]
fn what_a_copy_shows_is_read_while_its_lock_is_held_by_a_push() {
    let (_d, w) = writes();
    let w = std::sync::Arc::new(w);
    let c = w.insert(7, w.create(&p("f"), None, 0o644).unwrap());
    let mut held = super::lock(&c);
    held.write_at(0, b"0123456789").unwrap();
    held.set_mode(0o600).unwrap();
    // The lock stays held (as by a push waiting for the sharer) while another thread stats the file.
    let (tx, rx) = std::sync::mpsc::channel();
    let w2 = std::sync::Arc::clone(&w);
    std::thread::spawn(move || {
        let mut e = file_entry(b"f", 0);
        let found = w2.overlay(7, &mut e);
        let _ = tx.send((found, e.size, e.mode, e.mtime));
    });
    let shown = rx.recv_timeout(std::time::Duration::from_secs(10));
    drop(held);
    let (found, size, mode, mtime) = shown.expect("the overlay waited for the copy's lock");
    assert!(found);
    assert_eq!((size, mode), (10, 0o100600));
    assert!(mtime > 0);
    let mut e = file_entry(b"g", 3);
    assert!(!w.overlay(8, &mut e));
    assert_eq!(e.size, 3);
}

#[test]
fn a_grown_end_is_not_sent_and_a_size_past_the_limit_is_efbig_at_once() {
    let sharer = FakeSharer::default();
    let base = sharer.set("f", &[7u8; 10]);
    let (_d, w) = writes();
    let mut c = copy_of(&w, &sharer, "f", base);
    // truncate -s: zeros past the base's end are the sharer's own zero-extension, never sent.
    c.set_len(1 << 20).unwrap();
    assert!(c.is_dirty() && c.changed().is_empty());
    // A write far past the end sends its bytes only.
    c.write_at(2 << 20, b"x").unwrap();
    assert_eq!(c.changed(), &[(2 << 20)..(2 << 20) + 1]);
    c.push(&sharer, &p("f"), NEVER).unwrap();
    assert_eq!(
        sharer.sent.lock().unwrap().last().unwrap().as_deref(),
        Some(&[(2 << 20)..(2 << 20) + 1][..])
    );
    let mut want = vec![7u8; 10];
    want.resize(2 << 20, 0);
    want.push(b'x');
    assert_eq!(sharer.content("f"), want);
    // Cut below the base's end and grown again: the base's bytes there are changes (zeros now).
    c.set_len(4).unwrap();
    c.set_len(20).unwrap();
    assert_eq!(c.changed(), &[4..20]);
    for huge in [super::MAX_FILE + 1, 999_999_999_999_999] {
        assert_eq!(
            c.set_len(huge).unwrap_err().raw_os_error(),
            Some(libc::EFBIG)
        );
        assert_eq!(
            c.write_at(huge, b"x").unwrap_err().raw_os_error(),
            Some(libc::EFBIG)
        );
    }
    assert_eq!(c.size(), 20, "nothing of a refused size stays");
}
