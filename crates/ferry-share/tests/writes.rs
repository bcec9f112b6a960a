//! Writes to a share: the client and server state machines two-sided in memory over a real directory (the
//! real [`Files`] runs the jobs), and [`Session`]'s helpers over real encrypted channels on loopback TCP.

mod common;

use std::net::TcpStream;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_channel::IdentityKey;
use ferry_share::client::{Client, Event, Failure};
use ferry_share::fs::{OutboardCache, ShareRoot};
use ferry_share::io::{Changes, Files, Session, SessionError};
use ferry_share::server::{Job, PutOutcome, Server, ServerConfig};
use ferry_share::wire::{self, ErrorCode, PutHeader, Request, Response, SharePath, Time};
use ferry_testkit::pseudo_random;

fn p(s: &str) -> SharePath {
    SharePath::new(s.as_bytes()).unwrap()
}

fn root_of(data: &[u8]) -> [u8; 32] {
    *blake3::hash(data).as_bytes()
}

/// A put of a whole file (mode 0640, no time given).
fn header(path: &str, base: Option<[u8; 32]>, size: u64) -> PutHeader {
    PutHeader {
        path: p(path),
        base,
        from_base: false,
        size,
        mode: 0o640,
        mtime: None,
    }
}

fn writable() -> ServerConfig {
    ServerConfig {
        writable: true,
        peer: "bob".into(),
        ..ServerConfig::default()
    }
}

/// Names in `dir` that are put temp files.
fn temps(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".ferry-put-"))
        .collect()
}

/// A share on disk (with a file outside it) for the in-memory pair.
struct Disk {
    dir: ferry_testkit::TempDir,
    root: ShareRoot,
    cache: OutboardCache,
}

impl Disk {
    fn new() -> Disk {
        let dir = ferry_testkit::temp_dir("ferry-writes-");
        let share = dir.path().join("share");
        std::fs::create_dir_all(share.join("sub")).unwrap();
        std::fs::write(dir.path().join("secret"), b"outside").unwrap();
        std::fs::write(share.join("old.txt"), b"the sharer's words").unwrap();
        std::os::unix::fs::symlink("sub", share.join("link")).unwrap();
        let root = ShareRoot::open(&share).unwrap();
        let cache = OutboardCache::new(dir.path().join("cache"));
        Disk { dir, root, cache }
    }

    fn share(&self) -> PathBuf {
        self.dir.path().join("share")
    }
}

/// A client and a server session over a [`Disk`], packets passed in memory.
struct Pair<'a> {
    client: Client,
    server: Server,
    files: Files<'a>,
    events: Vec<Event>,
}

impl<'a> Pair<'a> {
    fn new(disk: &'a Disk, config: ServerConfig) -> Pair<'a> {
        let mut pair = Pair {
            client: Client::new(16),
            server: Server::new(config),
            files: Files::new(&disk.root, &disk.cache),
            events: Vec::new(),
        };
        pair.pump();
        assert!(matches!(pair.events.pop(), Some(Event::Ready { .. })));
        pair
    }

    /// Moves packets both ways and runs the jobs until nothing moves.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some(packet) = self.client.poll_transmit() {
                self.server.handle(&packet).expect("the session goes on");
                moved = true;
            }
            self.files.run_all(&mut self.server);
            self.files.forget_done(&self.server);
            while let Some(packet) = self.server.poll_transmit() {
                if let Some(event) = self.client.handle(&packet).unwrap() {
                    self.events.push(event);
                }
                moved = true;
            }
            if !moved {
                return;
            }
        }
    }

    /// Feeds a packet built by hand (what a hostile client may send).
    fn raw(&mut self, request: Request) {
        let mut packet = Vec::new();
        request.encode(&mut packet);
        self.server.handle(&packet).expect("the session goes on");
        self.pump();
    }

    /// The event that ended request `id`.
    fn outcome(&self, id: u32) -> &Event {
        self.events
            .iter()
            .find(|e| match e {
                Event::Done { id: i } | Event::Conflicted { id: i, .. } => *i == id,
                Event::Failed { id: i, .. } => *i == id,
                _ => false,
            })
            .unwrap_or_else(|| panic!("no outcome for {id}: {:?}", self.events))
    }

    fn code(&self, id: u32) -> ErrorCode {
        match self.outcome(id) {
            Event::Failed {
                failure: Failure::Remote(code, _),
                ..
            } => *code,
            other => panic!("request {id} did not fail: {other:?}"),
        }
    }

    /// Starts a put of `data` (whole) to `path`; its end (with the root) is the caller's.
    fn put(&mut self, path: &str, base: Option<[u8; 32]>, data: &[u8]) -> u32 {
        let size = data.len() as u64;
        let id = self.client.put(header(path, base, size)).unwrap();
        for (i, chunk) in data.chunks(100_000).enumerate() {
            self.client
                .put_data(id, (i * 100_000) as u64, chunk)
                .unwrap();
            self.pump();
        }
        id
    }
}

#[test]
fn a_put_lands_at_its_end_and_only_with_its_root() {
    let disk = Disk::new();
    let mut pair = Pair::new(&disk, writable());
    let data = pseudo_random(1_000_000, 1);
    let id = pair.put("sub/new.bin", None, &data);
    // All its data is in, not its end: the content sits in a temp file that listings leave out.
    assert!(!disk.share().join("sub/new.bin").exists());
    assert_eq!(temps(&disk.share().join("sub")).len(), 1);
    let list = pair.client.list(p("sub"), 0, 100).unwrap();
    pair.pump();
    match pair.events.pop() {
        Some(Event::Entries { id, entries, .. }) if id == list => assert!(entries.is_empty()),
        other => panic!("{other:?}"),
    }
    // Nor can it be read, or pulled with its directory.
    let temp = format!("sub/{}", temps(&disk.share().join("sub"))[0]);
    let stat = pair.client.stat(p(&temp)).unwrap();
    let read = pair.client.read(p(&temp), None, 0, 10).unwrap();
    pair.pump();
    assert_eq!(
        (pair.code(stat), pair.code(read)),
        (ErrorCode::NotFound, ErrorCode::NotFound)
    );
    let walk = ferry_share::subtree::Subtree::resolve(&disk.root, &p("sub")).unwrap();
    assert_eq!(walk.walk().manifest.entries.len(), 1, "the directory alone");
    pair.client.put_end(id, root_of(&data)).unwrap();
    pair.pump();
    assert!(matches!(pair.outcome(id), Event::Done { .. }));
    assert_eq!(
        std::fs::read(disk.share().join("sub/new.bin")).unwrap(),
        data
    );
    let mode = std::fs::metadata(disk.share().join("sub/new.bin"))
        .unwrap()
        .mode();
    assert_eq!(mode & 0o777, 0o640);
    assert!(temps(&disk.share().join("sub")).is_empty());

    // The same bytes under another root: nothing changes, and no temp file stays.
    let other = pseudo_random(1_000_000, 2);
    let id = pair.put("sub/new.bin", Some(root_of(&data)), &other);
    pair.client.put_end(id, root_of(&data[1..])).unwrap();
    pair.pump();
    assert_eq!(pair.code(id), ErrorCode::Integrity);
    assert_eq!(
        std::fs::read(disk.share().join("sub/new.bin")).unwrap(),
        data
    );
    assert!(temps(&disk.share().join("sub")).is_empty());
    assert_eq!(pair.server.in_flight(), 0);
}

#[test]
fn requests_that_only_look_run_before_a_put_s_data_and_nothing_overtakes_another_write() {
    let disk = Disk::new();
    let mut pair = Pair::new(&disk, writable());
    std::fs::write(disk.share().join("old"), b"before").unwrap();
    let data = pseudo_random(300_000, 3);
    // All queued at once, as a mount pushing a large file while someone browses it sends them.
    let put = pair.client.put(header("new", None, 300_000)).unwrap();
    pair.client.put_data(put, 0, &data[..100_000]).unwrap();
    pair.client
        .put_data(put, 100_000, &data[100_000..200_000])
        .unwrap();
    let stat = pair.client.stat(p("old")).unwrap();
    let read = pair.client.read(p("old"), None, 0, 6).unwrap();
    pair.client
        .put_data(put, 200_000, &data[200_000..])
        .unwrap();
    let mkdir = pair.client.mkdir(p("dir"), 0o755).unwrap();
    let stat_dir = pair.client.stat(p("dir")).unwrap();
    let stat_new = pair.client.stat(p("new")).unwrap();
    pair.client.put_end(put, root_of(&data)).unwrap();
    while let Some(packet) = pair.client.poll_transmit() {
        pair.server.handle(&packet).unwrap();
    }
    let mut order = Vec::new();
    while let Some(job) = pair.server.next_job() {
        order.push(match &job {
            Job::Put { id, .. } => format!("put {id}"),
            Job::PutData { offset, .. } => format!("data {offset}"),
            Job::PutEnd { id, .. } => format!("end {id}"),
            Job::Stat { id, .. } => format!("stat {id}"),
            Job::Open { id, .. } => format!("open {id}"),
            Job::Write { id, .. } => format!("write {id}"),
            other => format!("{other:?}"),
        });
        pair.files.run(&mut pair.server, job);
    }
    // The stat and the read go before the data queued ahead of them; the mkdir waits for the data before
    // it, and what came after the mkdir waits for it (the stat of the new directory finds it).
    assert_eq!(
        order,
        [
            format!("put {put}"),
            format!("stat {stat}"),
            format!("open {read}"),
            "data 0".into(),
            "data 100000".into(),
            "data 200000".into(),
            format!("write {mkdir}"),
            format!("stat {stat_dir}"),
            format!("stat {stat_new}"),
            format!("end {put}"),
        ]
    );
    pair.pump();
    assert!(pair.server.data_queued() == 0 && !pair.server.has_jobs());
    let found = |id| {
        pair.events
            .iter()
            .any(|e| matches!(e, Event::Attr { id: i, .. } if *i == id))
    };
    assert!(found(stat) && found(stat_dir), "{:?}", pair.events);
    // Before the put's end the new file is not there: it is made visible only then.
    assert_eq!(pair.code(stat_new), ErrorCode::NotFound);
    assert!(
        pair.events.iter().any(
            |e| matches!(e, Event::Version { id, version } if *id == read && version.size == 6)
        ),
        "{:?}",
        pair.events
    );
    assert!(matches!(pair.outcome(put), Event::Done { .. }));
    assert_eq!(std::fs::read(disk.share().join("new")).unwrap(), data);
}

#[test]
fn data_in_any_order_with_holes_lands_as_sent() {
    let disk = Disk::new();
    let mut pair = Pair::new(&disk, writable());
    // In order but ending early (a zero tail), and out of order with a hole in the middle.
    let mut tail = pseudo_random(300_000, 3);
    tail[200_000..].fill(0);
    let mut holed = pseudo_random(300_000, 4);
    holed[100_000..150_000].fill(0);
    type Send<'a> = (&'a str, &'a Vec<u8>, [std::ops::Range<usize>; 2]);
    let sends: [Send; 2] = [
        ("tail", &tail, [0..100_000, 100_000..200_000]),
        ("holed", &holed, [150_000..300_000, 0..100_000]),
    ];
    for (name, data, ranges) in sends {
        let size = data.len() as u64;
        let id = pair.client.put(header(name, None, size)).unwrap();
        for r in ranges {
            pair.client.put_data(id, r.start as u64, &data[r]).unwrap();
        }
        pair.client.put_end(id, root_of(data)).unwrap();
        pair.pump();
        assert!(matches!(pair.outcome(id), Event::Done { .. }), "{name}");
        assert_eq!(
            &std::fs::read(disk.share().join(name)).unwrap(),
            data,
            "{name}"
        );
    }
}

#[test]
fn a_read_only_share_refuses_every_write_and_drops_the_puts_data() {
    let disk = Disk::new();
    let mut pair = Pair::new(&disk, ServerConfig::default());
    let data = b"never written".to_vec();
    let put = pair.put("x", None, &data);
    pair.client.put_end(put, root_of(&data)).ok();
    let ids = [
        put,
        pair.client.mkdir(p("d"), 0o755).unwrap(),
        pair.client.rmdir(p("sub")).unwrap(),
        pair.client.unlink(p("old.txt"), None).unwrap(),
        pair.client
            .rename(p("old.txt"), p("o"), true, None)
            .unwrap(),
        pair.client
            .set_attr(p("old.txt"), Some(0o600), None)
            .unwrap(),
        pair.client.symlink(p("l2"), b"old.txt".to_vec()).unwrap(),
    ];
    pair.pump();
    for id in ids {
        assert_eq!(pair.code(id), ErrorCode::ReadOnly, "request {id}");
    }
    assert!(!disk.share().join("x").exists());
    assert!(disk.share().join("sub").is_dir());
    assert_eq!(
        std::fs::read(disk.share().join("old.txt")).unwrap(),
        b"the sharer's words"
    );
    assert!(temps(&disk.share()).is_empty());
    // The session goes on.
    let stat = pair.client.stat(p("old.txt")).unwrap();
    pair.pump();
    assert!(matches!(pair.events.last(), Some(Event::Attr { id, .. }) if *id == stat));
}

#[test]
fn data_outside_the_size_fails_the_put_and_a_cancel_removes_its_temp_file() {
    let disk = Disk::new();
    let mut pair = Pair::new(&disk, writable());
    let id = pair.client.put(header("f", None, 10)).unwrap();
    pair.pump();
    assert_eq!(temps(&disk.share()).len(), 1);
    // The client checks ranges; a hostile one does not.
    pair.raw(Request::PutData {
        id,
        offset: 8,
        bytes: vec![1; 3],
    });
    assert_eq!(pair.code(id), ErrorCode::BadRequest);
    assert!(temps(&disk.share()).is_empty());
    // Its remaining data and end are dropped quietly.
    pair.raw(Request::PutData {
        id,
        offset: 0,
        bytes: vec![1; 3],
    });
    pair.raw(Request::PutEnd { id, root: [0; 32] });

    let id = pair.client.put(header("f", None, 10)).unwrap();
    pair.client.put_data(id, 0, b"12345").unwrap();
    pair.pump();
    assert_eq!(temps(&disk.share()).len(), 1);
    pair.client.cancel(id);
    pair.pump();
    assert!(temps(&disk.share()).is_empty());
    assert!(!disk.share().join("f").exists());
    assert_eq!(pair.server.in_flight(), 0);
}

#[test]
fn writes_that_leave_the_share_or_go_through_a_symlink_are_refused() {
    let disk = Disk::new();
    let mut pair = Pair::new(&disk, writable());
    let data = b"mine".to_vec();
    // Through a symlink to a directory inside the share: writes take no symlink on the way.
    let through = pair.put("link/f", None, &data);
    pair.client.put_end(through, root_of(&data)).ok();
    let mkdir = pair.client.mkdir(p("link/d"), 0o755).unwrap();
    // The name of a temp file.
    let temp = pair
        .client
        .mkdir(p(".ferry-put-0123456789abcdef"), 0o755)
        .unwrap();
    // A symlink leading out, absolute or climbing past the share (the client would send it as is).
    let out = pair
        .client
        .symlink(p("sub/l"), b"../../secret".to_vec())
        .unwrap();
    let absolute = pair
        .client
        .symlink(p("l"), b"/etc/passwd".to_vec())
        .unwrap();
    pair.pump();
    for id in [through, mkdir, temp, out, absolute] {
        assert_eq!(pair.code(id), ErrorCode::UnsafePath, "request {id}");
    }
    assert!(!disk.share().join("sub/f").exists());
    assert!(!disk.share().join("sub/d").exists());
    assert!(!disk.share().join("sub/l").exists());

    // `..` and absolute paths, hand-encoded: refused by id, the session goes on.
    for (kind, bad) in [
        (wire::MKDIR, &b"../x"[..]),
        (wire::PUT, b"/x"),
        (wire::UNLINK, b"sub/../../x"),
    ] {
        let mut packet = vec![kind, 9, 0, 0, 0];
        packet.extend_from_slice(&(bad.len() as u16).to_le_bytes());
        packet.extend_from_slice(bad);
        packet.extend_from_slice(&[0; 64]);
        pair.server.handle(&packet).expect("refused, not fatal");
        pair.files.run_all(&mut pair.server);
        let answer = pair.server.poll_transmit().expect("an answer");
        match Response::decode(&answer).unwrap() {
            Response::Error { id: 9, code, .. } => assert_eq!(code, ErrorCode::UnsafePath),
            other => panic!("{other:?}"),
        }
    }
    assert!(!disk.dir.path().join("x").exists());

    // A symlink to outside swapped in for the file while its put is on the way: the put does not write
    // through it; the link stays and the content is kept beside it.
    let base = root_of(b"the sharer's words");
    let id = pair.put("old.txt", Some(base), &data);
    std::fs::remove_file(disk.share().join("old.txt")).unwrap();
    std::os::unix::fs::symlink("../secret", disk.share().join("old.txt")).unwrap();
    pair.client.put_end(id, root_of(&data)).unwrap();
    pair.pump();
    let Event::Conflicted { name, .. } = pair.outcome(id) else {
        panic!("{:?}", pair.outcome(id));
    };
    assert_eq!(
        std::fs::read(disk.dir.path().join("secret")).unwrap(),
        b"outside"
    );
    let kept = disk.share().join(String::from_utf8(name.clone()).unwrap());
    assert_eq!(std::fs::read(kept).unwrap(), data);
    // Its attributes are not changed through it either (chmod of a symlink is refused).
    let chmod = pair
        .client
        .set_attr(p("old.txt"), Some(0o777), None)
        .unwrap();
    pair.pump();
    assert_eq!(pair.code(chmod), ErrorCode::WrongKind);
    let secret = std::fs::metadata(disk.dir.path().join("secret")).unwrap();
    assert_ne!(secret.permissions().mode() & 0o777, 0o777);
}

// ---- Over real channels ----

struct Sharer {
    dir: ferry_testkit::TempDir,
    inner: common::Sharer,
}

fn start(client: [u8; 32], config: ServerConfig) -> Sharer {
    let dir = ferry_testkit::temp_dir("ferry-writes-");
    let share = dir.path().join("share");
    std::fs::create_dir_all(share.join("docs")).unwrap();
    std::fs::write(share.join("docs/note.txt"), b"hello from the sharer").unwrap();
    let changes = Changes::default();
    let cache = dir.path().join("cache");
    let inner = common::start_sharer_with(&share, &cache, client, changes, config);
    Sharer { dir, inner }
}

impl Sharer {
    fn share(&self) -> PathBuf {
        self.dir.path().join("share")
    }

    fn connect(&self, key: &IdentityKey) -> Session<TcpStream, TcpStream> {
        let (reader, writer) =
            common::channel(&self.inner, IdentityKey::from_seed(*key.seed())).unwrap();
        Session::open(reader, writer, 64).unwrap()
    }

    /// A file outside the share holding `data`, as a client's local copy.
    fn local(&self, name: &str, data: &[u8]) -> std::fs::File {
        let path = self.dir.path().join(name);
        std::fs::write(&path, data).unwrap();
        std::fs::File::open(path).unwrap()
    }
}

fn remote_code(e: SessionError) -> ErrorCode {
    match e {
        SessionError::Remote(code, _) => code,
        other => panic!("not the sharer's refusal: {other}"),
    }
}

#[test]
fn a_new_file_a_replacement_a_partial_update_and_truncations() {
    let key = IdentityKey::generate();
    let s = start(key.public(), writable());
    let mut session = s.connect(&key);
    let target = s.share().join("docs/data.bin");

    let v1 = pseudo_random(3 * 1024 * 1024 + 5, 1);
    let file = s.local("v1", &v1);
    let mtime = Some(Time {
        secs: 1_700_000_000,
        nanos: 5,
    });
    let r = session.put_file(p("docs/data.bin"), None, &file, 0o600, mtime);
    assert_eq!(r.unwrap(), PutOutcome::Written);
    assert_eq!(std::fs::read(&target).unwrap(), v1);
    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!((meta.mtime(), meta.mtime_nsec()), (1_700_000_000, 5));
    assert_eq!(meta.mode() & 0o777, 0o600);

    // Replaced whole, from the version it derives from.
    let v2 = pseudo_random(2 * 1024 * 1024, 2);
    let file = s.local("v2", &v2);
    let r = session.put_file(p("docs/data.bin"), Some(root_of(&v1)), &file, 0o644, None);
    assert_eq!(r.unwrap(), PutOutcome::Written);
    assert_eq!(std::fs::read(&target).unwrap(), v2);

    // Two small changes to it: only those ranges are sent; the rest comes from the sharer's copy.
    let mut v3 = v2.clone();
    v3[10..20].copy_from_slice(&[7; 10]);
    v3[1_500_000..1_500_100].copy_from_slice(&[9; 100]);
    let file = s.local("v3", &v3);
    let ranges = [10..20, 1_500_000..1_500_100];
    let r = session.put_ranges(
        p("docs/data.bin"),
        root_of(&v2),
        &file,
        &ranges,
        0o644,
        None,
    );
    assert_eq!(r.unwrap(), PutOutcome::Written);
    assert_eq!(std::fs::read(&target).unwrap(), v3);

    // Truncated (no range sent), then extended with zeros and a tail.
    let v4 = v3[..1000].to_vec();
    let file = s.local("v4", &v4);
    let r = session.put_ranges(p("docs/data.bin"), root_of(&v3), &file, &[], 0o644, None);
    assert_eq!(r.unwrap(), PutOutcome::Written);
    assert_eq!(std::fs::read(&target).unwrap(), v4);
    let mut v5 = v4.clone();
    v5.resize(100_000, 0);
    v5.extend_from_slice(b"tail");
    let file = s.local("v5", &v5);
    let ranges = [100_000..100_002, 100_002..100_004];
    let r = session.put_ranges(
        p("docs/data.bin"),
        root_of(&v4),
        &file,
        &ranges,
        0o644,
        None,
    );
    assert_eq!(r.unwrap(), PutOutcome::Written);
    assert_eq!(std::fs::read(&target).unwrap(), v5);

    // An empty file.
    let file = s.local("empty", b"");
    let r = session.put_file(p("empty"), None, &file, 0o644, None);
    assert_eq!(r.unwrap(), PutOutcome::Written);
    assert_eq!(std::fs::read(s.share().join("empty")).unwrap(), b"");
    assert!(temps(&s.share().join("docs")).is_empty());
}

#[test]
fn a_conflict_keeps_both_versions_and_is_logged() {
    let key = IdentityKey::generate();
    let s = start(key.public(), writable());
    let mut session = s.connect(&key);
    let target = s.share().join("docs/note.txt");
    let base = root_of(b"hello from the sharer");
    // The sharer changes its file after the client's copy was taken.
    std::fs::write(&target, b"the sharer changed it").unwrap();
    let mine = s.local("mine", b"the client's version");
    let r = session.put_file(p("docs/note.txt"), Some(base), &mine, 0o644, None);
    let PutOutcome::Conflicted(name) = r.unwrap() else {
        panic!("no conflict");
    };
    let name = String::from_utf8(name).unwrap();
    assert!(name.starts_with("note.txt.conflict-bob-"), "{name}");
    assert_eq!(std::fs::read(&target).unwrap(), b"the sharer changed it");
    let kept = s.share().join("docs").join(&name);
    assert_eq!(std::fs::read(&kept).unwrap(), b"the client's version");
    assert!(s
        .inner
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.starts_with("conflict: ") && l.contains(&name)));

    // Again, within the same second: another name, both kept.
    let r = session.put_file(p("docs/note.txt"), Some(base), &mine, 0o644, None);
    let PutOutcome::Conflicted(again) = r.unwrap() else {
        panic!("no conflict");
    };
    assert_ne!(String::from_utf8(again).unwrap(), name);
    assert!(kept.exists());

    // A new file where one exists now: a conflict too.
    let r = session.put_file(p("docs/note.txt"), None, &mine, 0o644, None);
    assert!(matches!(r.unwrap(), PutOutcome::Conflicted(_)));

    // Ranges on a base that is gone: refused before anything is written; the whole content then conflicts.
    let first = [0..2, 2..3];
    let r = session.put_ranges(p("docs/note.txt"), base, &mine, &first, 0o644, None);
    assert_eq!(remote_code(r.unwrap_err()), ErrorCode::Changed);
    assert_eq!(std::fs::read(&target).unwrap(), b"the sharer changed it");

    // Unlinking a version that is gone: the file stays.
    let r = session.unlink(p("docs/note.txt"), Some(base));
    assert_eq!(remote_code(r.unwrap_err()), ErrorCode::Conflict);
    assert!(target.exists());
    let now = root_of(b"the sharer changed it");
    session.unlink(p("docs/note.txt"), Some(now)).unwrap();
    assert!(!target.exists());
    assert!(temps(&s.share().join("docs")).is_empty());
}

#[test]
fn directories_renames_attributes_and_symlinks() {
    let key = IdentityKey::generate();
    let s = start(key.public(), writable());
    let mut session = s.connect(&key);
    let share = s.share();

    session.mkdir(p("new"), 0o750).unwrap();
    assert_eq!(
        std::fs::metadata(share.join("new")).unwrap().mode() & 0o777,
        0o750
    );
    let r = session.mkdir(p("new"), 0o750);
    assert_eq!(remote_code(r.unwrap_err()), ErrorCode::Exists);
    let r = session.mkdir(p("nowhere/new"), 0o750);
    assert_eq!(remote_code(r.unwrap_err()), ErrorCode::NotFound);

    session
        .rename(p("docs/note.txt"), p("new/note.txt"), false)
        .unwrap();
    assert_eq!(
        std::fs::read(share.join("new/note.txt")).unwrap(),
        b"hello from the sharer"
    );
    assert!(!share.join("docs/note.txt").exists());
    std::fs::write(share.join("other"), b"other").unwrap();
    let r = session.rename(p("other"), p("new/note.txt"), false);
    assert_eq!(remote_code(r.unwrap_err()), ErrorCode::Exists);
    session.rename(p("other"), p("new/note.txt"), true).unwrap();
    assert_eq!(std::fs::read(share.join("new/note.txt")).unwrap(), b"other");

    let mtime = Time {
        secs: 1_600_000_000,
        nanos: 123,
    };
    session
        .set_attr(p("new/note.txt"), Some(0o604), Some(mtime))
        .unwrap();
    let meta = std::fs::metadata(share.join("new/note.txt")).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o604);
    assert_eq!((meta.mtime(), meta.mtime_nsec()), (1_600_000_000, 123));
    session.set_attr(p("new"), None, Some(mtime)).unwrap();
    assert_eq!(
        std::fs::metadata(share.join("new")).unwrap().mtime(),
        1_600_000_000
    );

    session.symlink(p("new/link"), b"note.txt").unwrap();
    assert_eq!(
        std::fs::read_link(share.join("new/link")).unwrap(),
        Path::new("note.txt")
    );
    session.symlink(p("new/up"), b"../docs").unwrap();
    assert_eq!(
        std::fs::read_link(share.join("new/up")).unwrap(),
        Path::new("../docs")
    );

    let r = session.rmdir(p("new"));
    assert_eq!(remote_code(r.unwrap_err()), ErrorCode::NotEmpty);
    for name in ["new/link", "new/up", "new/note.txt"] {
        session.unlink(p(name), None).unwrap();
    }
    session.rmdir(p("new")).unwrap();
    assert!(!share.join("new").exists());
    let r = session.unlink(p("new/note.txt"), None);
    assert_eq!(remote_code(r.unwrap_err()), ErrorCode::NotFound);
}

#[test]
fn a_reader_on_the_sharer_side_sees_the_old_content_or_the_new_never_a_mix() {
    let key = IdentityKey::generate();
    let s = start(key.public(), writable());
    let mut session = s.connect(&key);
    let target = s.share().join("docs/big.bin");
    let versions: Vec<Vec<u8>> = (0..2u64)
        .map(|i| pseudo_random(6 * 1024 * 1024, 10 + i))
        .collect();
    std::fs::write(&target, &versions[0]).unwrap();
    let files: Vec<std::fs::File> = versions
        .iter()
        .enumerate()
        .map(|(i, v)| s.local(&format!("v{i}"), v))
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (target, stop, versions) = (target.clone(), stop.clone(), versions.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || reads == 0 {
                let seen = std::fs::read(&target).unwrap();
                assert!(
                    seen == versions[0] || seen == versions[1],
                    "a read saw {} bytes of neither version",
                    seen.len()
                );
                reads += 1;
            }
            reads
        })
    };
    for round in 1..=6 {
        let (old, new) = (&versions[(round + 1) % 2], round % 2);
        let r = session.put_file(
            p("docs/big.bin"),
            Some(root_of(old)),
            &files[new],
            0o644,
            None,
        );
        assert_eq!(r.unwrap(), PutOutcome::Written);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
}

#[test]
fn writes_are_announced_to_every_client() {
    let key = IdentityKey::generate();
    let s = start(key.public(), writable());
    let mut writer = s.connect(&key);
    let mut watcher = s.connect(&key);
    watcher.client().subscribe().unwrap();
    // The subscription is in before the write: a stat answered after it.
    watcher.stat(p("docs")).unwrap();
    let file = s.local("new", b"news");
    writer
        .put_file(p("docs/new.txt"), None, &file, 0o644, None)
        .unwrap();
    writer.mkdir(p("made"), 0o755).unwrap();
    let mut heard = Vec::new();
    while !(heard.contains(&p("docs/new.txt")) && heard.contains(&p("made"))) {
        match watcher.next_event().unwrap() {
            Event::Changed { paths } => heard.extend(paths),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_connection_dropped_mid_put_leaves_no_temp_file_and_stale_ones_are_swept() {
    let key = IdentityKey::generate();
    let s = start(key.public(), writable());
    {
        let mut session = s.connect(&key);
        let client = session.client();
        let id = client.put(header("docs/half.bin", None, 1 << 20)).unwrap();
        client.put_data(id, 0, &[5; 1000]).unwrap();
        // A stat answered after the put's start and data: its temp file exists.
        session.stat(p("docs")).unwrap();
        assert_eq!(temps(&s.share().join("docs")).len(), 1);
    }
    // The session ends when its connection drops; its temp file goes with it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !temps(&s.share().join("docs")).is_empty() {
        assert!(std::time::Instant::now() < deadline, "the temp file stayed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!s.share().join("docs/half.bin").exists());

    // What a crash leaves behind is swept at the next start, not a put in progress (newer).
    std::fs::write(s.share().join("docs/.ferry-put-0000000000000000"), b"stale").unwrap();
    std::fs::write(s.share().join(".ferry-put-1111111111111111"), b"stale").unwrap();
    let root = ShareRoot::open(&s.share()).unwrap();
    let past = std::time::SystemTime::now() - Duration::from_secs(3600);
    assert_eq!(root.sweep_temps(past), 0);
    let future = std::time::SystemTime::now() + Duration::from_secs(3600);
    assert_eq!(root.sweep_temps(future), 2);
    assert!(temps(&s.share()).is_empty() && temps(&s.share().join("docs")).is_empty());
    assert!(s.share().join("docs/note.txt").exists());
}

#[test]
fn the_share_s_space_is_its_file_system_s_writable_or_not() {
    let disk = Disk::new();
    for config in [ServerConfig::default(), writable()] {
        let mut pair = Pair::new(&disk, config);
        let id = pair.client.space().unwrap();
        pair.pump();
        let space = match pair.events.pop() {
            Some(Event::Space { id: i, space }) if i == id => space,
            other => panic!("{other:?}"),
        };
        let st = rustix::fs::statvfs(disk.share()).unwrap();
        assert_eq!(u64::from(space.block), st.f_frsize);
        assert_eq!(space.blocks, st.f_blocks);
        assert_eq!(space.files, st.f_files);
        assert!(space.available <= space.free && space.free <= space.blocks);
        // Others write to this file system meanwhile: free space within 64 MiB of this look.
        let slack = (64 << 20) / st.f_frsize;
        assert!(
            space.free.abs_diff(st.f_bfree) <= slack,
            "{space:?} vs {} {}",
            st.f_bfree,
            st.f_bavail
        );
        assert!(
            space.available.abs_diff(st.f_bavail) <= slack,
            "{space:?} vs {} {}",
            st.f_bfree,
            st.f_bavail
        );
    }
}

/// Issue 46, item 5: a symlink that stays inside where it was made cannot be moved (alone, or in a
/// directory moved closer to the share's root) to where it leads outside; a move that keeps it inside goes.
#[test]
fn a_rename_never_makes_a_symlink_lead_outside_the_share() {
    let key = IdentityKey::generate();
    let s = start(key.public(), writable());
    let mut session = s.connect(&key);
    let share = s.share();

    session.mkdir(p("x"), 0o755).unwrap();
    session.symlink(p("x/l"), b"../outside-secret.txt").unwrap();
    let r = session.rename(p("x/l"), p("l"), false);
    assert_eq!(remote_code(r.unwrap_err()), ErrorCode::UnsafePath);
    assert!(std::fs::symlink_metadata(share.join("l")).is_err());
    assert!(std::fs::symlink_metadata(share.join("x/l")).is_ok());
    session.mkdir(p("y"), 0o755).unwrap();
    session.rename(p("x/l"), p("y/l"), false).unwrap();

    session.mkdir(p("a"), 0o755).unwrap();
    session.mkdir(p("a/b"), 0o755).unwrap();
    session.mkdir(p("a/b/c"), 0o755).unwrap();
    session.symlink(p("a/b/c/deep"), b"../../../f").unwrap();
    let r = session.rename(p("a/b"), p("b"), false);
    assert_eq!(remote_code(r.unwrap_err()), ErrorCode::UnsafePath);
    assert!(share.join("a/b/c").is_dir() && !share.join("b").exists());
    // As deep as before: the links beneath stay inside.
    session.rename(p("a/b"), p("y/b"), false).unwrap();
    assert!(std::fs::symlink_metadata(share.join("y/b/c/deep")).is_ok());
}

/// Issue 46, item 7: a file of the share hard-linked from outside it keeps its mode (the link outside is
/// the same inode); its time may still change, and a file with one link changes as before.
#[test]
fn a_mode_change_of_a_hard_linked_file_is_refused() {
    let key = IdentityKey::generate();
    let s = start(key.public(), writable());
    let mut session = s.connect(&key);
    let share = s.share();
    let outside = share.parent().unwrap().join("outside-secret");
    std::fs::write(&outside, b"secret").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::hard_link(&outside, share.join("linked")).unwrap();

    let r = session.set_attr(p("linked"), Some(0o644), None);
    assert_eq!(remote_code(r.unwrap_err()), ErrorCode::HardLinked);
    assert_eq!(std::fs::metadata(&outside).unwrap().mode() & 0o777, 0o600);
    let mtime = Time {
        secs: 1_600_000_000,
        nanos: 0,
    };
    session.set_attr(p("linked"), None, Some(mtime)).unwrap();
    std::fs::remove_file(&outside).unwrap();
    session.set_attr(p("linked"), Some(0o640), None).unwrap();
    assert_eq!(
        std::fs::metadata(share.join("linked")).unwrap().mode() & 0o777,
        0o640
    );
}

// ---- Issue 46, item 7: space promised to puts in progress, and a margin kept free ----

const MIB: u64 = 1 << 20;

/// The bytes free for an unprivileged writer on the file system of `dir`, and its size.
fn free_and_total(dir: &Path) -> (u64, u64) {
    let st = rustix::fs::statvfs(dir).unwrap();
    (st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)
}

/// A share that keeps all but `room` bytes of its file system's free space free (`--min-free`). Other
/// tests write to the same file system meanwhile: the figures below leave hundreds of MiB for that.
fn share_with_room(disk: &mut Disk, room: u64) {
    let (free, _) = free_and_total(&disk.share());
    disk.root = ShareRoot::open(&disk.share())
        .unwrap()
        .with_min_free(free - room);
}

/// The message of request `id`'s failure.
fn failure_message(pair: &Pair, id: u32) -> String {
    match pair.outcome(id) {
        Event::Failed {
            failure: Failure::Remote(_, message),
            ..
        } => message.clone(),
        other => panic!("request {id} did not fail: {other:?}"),
    }
}

/// Two puts that each fit the room left but not together: the second is refused with `disk-full` before
/// anything of it is written (no temp file), and the first's promise shrinks as its data lands. Every way a
/// put ends releases its promise: a cancel, data outside its size, a wrong root, landing.
#[test]
fn a_put_is_refused_when_the_puts_in_progress_hold_the_room_and_every_end_releases_it() {
    let mut disk = Disk::new();
    share_with_room(&mut disk, 1 << 30);
    let mut pair = Pair::new(&disk, writable());
    let big = 600 * MIB;
    let first = pair.client.put(header("first.bin", None, big)).unwrap();
    pair.pump();
    assert_eq!(disk.root.promised(), (1, big));
    let data = pseudo_random(MIB as usize, 4);
    for (i, chunk) in data.chunks(100_000).enumerate() {
        pair.client
            .put_data(first, (i * 100_000) as u64, chunk)
            .unwrap();
    }
    pair.pump();
    let (puts, promised) = disk.root.promised();
    assert!(
        puts == 1 && promised <= big - MIB + 64 * 1024,
        "what landed is no longer promised: {promised}"
    );

    let second = pair.client.put(header("second.bin", None, big)).unwrap();
    pair.pump();
    assert_eq!(pair.code(second), ErrorCode::DiskFull);
    let message = failure_message(&pair, second);
    assert!(
        message.contains("promised to writes in progress") && message.contains("kept free"),
        "{message}"
    );
    assert_eq!(temps(&disk.share()).len(), 1, "only the first put's");
    assert!(!disk.share().join("second.bin").exists());

    // A cancel releases the first's promise: the same put fits now.
    pair.client.cancel(first);
    pair.pump();
    assert_eq!(disk.root.promised(), (0, 0));
    let again = pair.client.put(header("second.bin", None, big)).unwrap();
    pair.pump();
    assert_eq!(disk.root.promised(), (1, big));
    // Data outside its size fails it, and releases it.
    pair.raw(Request::PutData {
        id: again,
        offset: big,
        bytes: vec![1; 3],
    });
    assert_eq!(pair.code(again), ErrorCode::BadRequest);
    assert_eq!(disk.root.promised(), (0, 0));
    // A wrong root at its end, the same.
    let wrong = pair.put("third.bin", None, &data);
    pair.client.put_end(wrong, [7; 32]).unwrap();
    pair.pump();
    assert_eq!(pair.code(wrong), ErrorCode::Integrity);
    assert_eq!(disk.root.promised(), (0, 0));
    // And one that lands.
    let landed = pair.put("third.bin", None, &data);
    pair.client.put_end(landed, root_of(&data)).unwrap();
    pair.pump();
    assert!(matches!(pair.outcome(landed), Event::Done { .. }));
    assert_eq!(disk.root.promised(), (0, 0));
    assert!(temps(&disk.share()).is_empty());
}

/// A put that fits the free space but would take some of the margin is refused: 5 % of the file system by
/// default, `--min-free` when larger; the message says how much is kept.
#[test]
fn a_put_that_would_take_the_margin_is_refused() {
    let mut disk = Disk::new();
    let (free, total) = free_and_total(&disk.share());
    let five = total / 100 * 5;
    assert!(free > five + (1 << 30), "the test needs room: {free}");
    let mut pair = Pair::new(&disk, writable());
    // Fits the free space, not the 5 % kept.
    let id = pair.client.put(header("f", None, free - five / 2)).unwrap();
    pair.pump();
    assert_eq!(pair.code(id), ErrorCode::DiskFull);
    let message = failure_message(&pair, id);
    assert!(
        message.contains(&format!("{five} kept free: 5 % of the file system")),
        "{message}"
    );
    assert!(temps(&disk.share()).is_empty());
    drop(pair);

    share_with_room(&mut disk, 1 << 30);
    let mut pair = Pair::new(&disk, writable());
    let id = pair.client.put(header("f", None, 1536 * MIB)).unwrap();
    pair.pump();
    assert_eq!(pair.code(id), ErrorCode::DiskFull);
    assert!(temps(&disk.share()).is_empty());
    let id = pair.client.put(header("f", None, 512 * MIB)).unwrap();
    pair.pump();
    assert_eq!(temps(&disk.share()).len(), 1, "it fits");
    assert_eq!(disk.root.promised(), (1, 512 * MIB));
    pair.client.cancel(id);
    pair.pump();
}

/// A connection that drops mid-put releases the put's promise with its temp file: the next put that fits
/// only without it is taken.
#[test]
fn a_connection_dropped_mid_put_releases_its_promise() {
    let key = IdentityKey::generate();
    let dir = ferry_testkit::temp_dir("ferry-writes-");
    let share = dir.path().join("share");
    std::fs::create_dir_all(&share).unwrap();
    let (free, _) = free_and_total(&share);
    let root = ShareRoot::open(&share)
        .unwrap()
        .with_min_free(free - (1 << 30));
    let s = common::start_sharer_of(
        root,
        &dir.path().join("cache"),
        key.public(),
        Changes::default(),
        writable(),
    );
    let connect = || {
        let (reader, writer) = common::channel(&s, IdentityKey::from_seed(*key.seed())).unwrap();
        Session::open(reader, writer, 64).unwrap()
    };
    let big = 600 * MIB;
    {
        let mut session = connect();
        let id = session.client().put(header("a.bin", None, big)).unwrap();
        session.client().put_data(id, 0, &[5; 1000]).unwrap();
        // Answered after the put's start and data: its promise is held.
        session.stat(p("")).unwrap();
        assert_eq!(s.root.promised().0, 1);
        // A second put that needs the first's room is refused.
        let mut other = connect();
        let refused = other.client().put(header("b.bin", None, big)).unwrap();
        // Waited for on a thread: a put that is never refused must fail the test, not hang it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || loop {
            match other.next_event() {
                Ok(Event::Failed {
                    id,
                    failure: Failure::Remote(code, _),
                }) if id == refused => break tx.send(code),
                Ok(_) => {}
                Err(_) => break Ok(()),
            }
        });
        let code = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the second put was refused");
        assert_eq!(code, ErrorCode::DiskFull);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.root.promised() != (0, 0) {
        assert!(std::time::Instant::now() < deadline, "the promise stayed");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut session = connect();
    let id = session.client().put(header("b.bin", None, big)).unwrap();
    session.stat(p("")).unwrap();
    assert_eq!(s.root.promised(), (1, big), "{id}: taken now");
}
