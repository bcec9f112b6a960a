//! `ferry pull`'s library over real encrypted channels on loopback TCP: the sharer is `io::serve` on a
//! thread per client, the client `pull::pull` (the transfer protocol after a PULL) or `pull::read_range`.

mod common;

use std::fs;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{channel, handshake, start_sharer, Sharer, Tap};
use ferry_channel::blocking::split_tcp;
use ferry_channel::{IdentityKey, Role};
use ferry_share::io::{Changes, Session, SessionError};
use ferry_share::pull::{pull, read_range, RANGE_PIECE};
use ferry_share::wire::{self, ErrorCode, Request, Response, SharePath};
use ferry_testkit::{assert_same_tree, pseudo_random, TempDir};
use ferry_transfer::{PacketSink, ReceiveOptions, ReceiveReport, TransferError};
use ferry_wire::ErrorCode as Code;

struct World {
    dir: TempDir,
    me: IdentityKey,
    sharer: Sharer,
}

impl World {
    /// A share with a tree (nested directories, modes, times with nanoseconds, a symlink inside, an empty
    /// directory, an empty file), a big file, and a secret next to the share.
    fn new() -> World {
        let dir = ferry_testkit::temp_dir("ferry-pull-");
        let share = dir.path().join("share");
        let tree = share.join("tree");
        fs::create_dir_all(tree.join("sub/deeper")).unwrap();
        fs::create_dir_all(tree.join("empty-dir")).unwrap();
        fs::write(tree.join("a.txt"), b"alpha").unwrap();
        fs::write(tree.join("empty"), b"").unwrap();
        fs::write(tree.join("sub/b.bin"), pseudo_random(3 << 20, 2)).unwrap();
        fs::write(tree.join("sub/deeper/c"), pseudo_random(70_000, 3)).unwrap();
        fs::set_permissions(tree.join("a.txt"), fs::Permissions::from_mode(0o640)).unwrap();
        fs::set_permissions(tree.join("sub/deeper"), fs::Permissions::from_mode(0o750)).unwrap();
        symlink("../a.txt", tree.join("sub/to-a")).unwrap();
        fs::write(share.join("big.bin"), pseudo_random((24 << 20) + 123, 4)).unwrap();
        fs::write(dir.path().join("secret"), b"not shared").unwrap();
        symlink("../secret", share.join("escape")).unwrap();
        symlink("tree", share.join("tree-link")).unwrap();
        for (i, p) in [
            "tree/a.txt",
            "tree/sub/b.bin",
            "tree/sub/to-a",
            "tree/sub/deeper",
            "tree/sub",
            "tree",
        ]
        .iter()
        .enumerate()
        {
            set_mtime(&share.join(p), 1_700_000_000 + i as i64, 123_456_789);
        }
        let me = IdentityKey::generate();
        let sharer = start_sharer(
            &share,
            &dir.path().join("cache"),
            me.public(),
            Changes::default(),
        );
        World { dir, me, sharer }
    }

    fn share(&self) -> PathBuf {
        self.dir.path().join("share")
    }

    fn options(&self, dest: &str) -> ReceiveOptions {
        let mut o = ReceiveOptions::new(self.dir.path().join(dest));
        o.partial_dir = Some(self.dir.path().join("partial"));
        o
    }

    fn key(&self) -> IdentityKey {
        IdentityKey::from_seed(*self.me.seed())
    }

    fn pull(&self, path: &str, opts: &ReceiveOptions) -> Result<ReceiveReport, SessionError> {
        let (reader, writer) = channel(&self.sharer, self.key()).unwrap();
        pull(reader, writer, &p(path), opts, &mut ())
    }

    fn session(&self) -> Session<TcpStream, TcpStream> {
        let (reader, writer) = channel(&self.sharer, self.key()).unwrap();
        Session::open(reader, writer, 64).unwrap()
    }

    fn log(&self) -> Vec<String> {
        self.sharer.log.lock().unwrap().clone()
    }
}

/// Sets the modification time of `path` itself (a symlink's own), with nanoseconds.
fn set_mtime(path: &Path, secs: i64, nsec: u32) {
    let t = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: secs,
            tv_nsec: nsec as _,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: secs,
            tv_nsec: nsec as _,
        },
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &t,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

fn mkfifo(path: &Path) {
    let mode = rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR;
    rustix::fs::mkfifoat(rustix::fs::CWD, path, mode).unwrap();
}

fn p(s: &str) -> SharePath {
    SharePath::new(s.as_bytes()).unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

#[test]
fn a_pulled_tree_equals_the_source() {
    let w = World::new();
    let report = w.pull("tree", &w.options("out")).unwrap();
    assert_same_tree(&w.share().join("tree"), &w.dir.path().join("out/tree"));
    assert_eq!(report.totals.files, 4);
    assert_eq!(names(&w.dir.path().join("out")), ["tree"]);
    // Through a symlink that stays inside the share, named as asked.
    w.pull("tree-link", &w.options("via-link")).unwrap();
    assert_same_tree(
        &w.share().join("tree"),
        &w.dir.path().join("via-link/tree-link"),
    );
    assert!(
        names(&w.dir.path().join("partial")).is_empty(),
        "no resume state left"
    );
}

#[test]
fn the_whole_share_is_pulled_without_what_leads_out() {
    let w = World::new();
    mkfifo(&w.share().join("fifo"));
    w.pull("", &w.options("out")).unwrap();
    let got = w.dir.path().join("out/share");
    // The symlink out of the share and the FIFO are skipped (and logged); everything else is there.
    assert_eq!(names(&got), ["big.bin", "tree", "tree-link"]);
    assert_same_tree(&w.share().join("tree"), &got.join("tree"));
    let log = w.log().join("\n");
    assert!(log.contains("escape") && log.contains("fifo"), "{log}");
}

#[test]
fn one_file_is_pulled_verified_with_its_mode_and_time() {
    let w = World::new();
    let report = w.pull("tree/sub/b.bin", &w.options("out")).unwrap();
    assert_eq!(report.bytes_received, 3 << 20);
    assert_same_tree(
        &w.share().join("tree/sub/b.bin"),
        &w.dir.path().join("out/b.bin"),
    );
    // The identical file is left as it is; another is not replaced without overwrite.
    assert_eq!(
        w.pull("tree/sub/b.bin", &w.options("out"))
            .unwrap()
            .files_skipped,
        1
    );
    fs::write(w.dir.path().join("out/b.bin"), b"mine").unwrap();
    let err = w.pull("tree/sub/b.bin", &w.options("out")).unwrap_err();
    assert_eq!(err.code(), Code::Conflict, "{err}");
    assert_eq!(fs::read(w.dir.path().join("out/b.bin")).unwrap(), b"mine");
    let mut o = w.options("out");
    o.overwrite = true;
    w.pull("tree/sub/b.bin", &o).unwrap();
    assert_same_tree(
        &w.share().join("tree/sub/b.bin"),
        &w.dir.path().join("out/b.bin"),
    );
    // Under another name (`-o NAME`): the offer names the file so, and that is what was asked.
    let mut o = w.options("out");
    o.output = ferry_transfer::Output::Named(b"renamed.bin".to_vec());
    w.pull("tree/sub/b.bin", &o).unwrap();
    assert_same_tree(
        &w.share().join("tree/sub/b.bin"),
        &w.dir.path().join("out/renamed.bin"),
    );
}

#[test]
fn a_cut_pull_resumes_with_only_what_is_missing() {
    let w = World::new();
    let size = fs::metadata(w.share().join("big.bin")).unwrap().len();
    // The sharer's connection dies after 10 MiB, as when its process is killed.
    w.sharer.taps.lock().unwrap().push_back(Tap {
        at: 10 << 20,
        action: Box::new(|| Err(io::Error::other("cut"))),
    });
    let err = w.pull("big.bin", &w.options("out")).unwrap_err();
    assert!(
        matches!(err.code(), Code::PeerGone | Code::Io | Code::Protocol),
        "{err}"
    );
    assert!(
        names(&w.dir.path().join("out"))
            .iter()
            .all(|n| n != "big.bin"),
        "nothing under the final name"
    );
    let report = w.pull("big.bin", &w.options("out")).unwrap();
    assert!(report.bytes_resumed >= 4 << 20, "{report:?}");
    assert_eq!(report.bytes_resumed + report.bytes_received, size);
    assert!(
        fs::read(w.dir.path().join("out/big.bin")).unwrap()
            == fs::read(w.share().join("big.bin")).unwrap()
    );
}

/// The client's socket, dead after `left` bytes read, as when the client is killed.
struct CutReader {
    inner: TcpStream,
    left: usize,
}

impl io::Read for CutReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            let _ = self.inner.shutdown(std::net::Shutdown::Both);
            return Err(io::Error::other("cut"));
        }
        let n = buf.len().min(self.left);
        let n = self.inner.read(&mut buf[..n])?;
        self.left -= n;
        Ok(n)
    }
}

#[test]
fn a_pull_cut_on_the_clients_side_resumes_too() {
    let w = World::new();
    let stream = TcpStream::connect(w.sharer.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let est = handshake(
        stream.try_clone().unwrap(),
        Role::Initiator,
        w.key(),
        w.sharer.key,
    )
    .unwrap();
    let cut = CutReader {
        inner: stream.try_clone().unwrap(),
        left: 9 << 20,
    };
    let reader = ferry_channel::blocking::SecureReader::new(cut, est.opener);
    let writer = ferry_channel::blocking::SecureWriter::new(stream, est.sealer);
    let err = pull(reader, writer, &p("big.bin"), &w.options("out"), &mut ()).unwrap_err();
    assert!(matches!(err.code(), Code::PeerGone | Code::Io), "{err}");
    assert!(!w.dir.path().join("out/big.bin").exists());
    let report = w.pull("big.bin", &w.options("out")).unwrap();
    assert!(report.bytes_resumed >= 4 << 20, "{report:?}");
    assert_same_tree(
        &w.share().join("big.bin"),
        &w.dir.path().join("out/big.bin"),
    );
}

#[test]
fn a_file_changed_during_a_pull_fails_clearly_and_the_next_pull_gets_the_new_version() {
    let w = World::new();
    let tree = w.share().join("tree");
    fs::write(tree.join("a.txt"), pseudo_random(12 << 20, 9)).unwrap();
    let b = tree.join("sub/b.bin");
    let new = pseudo_random((3 << 20) + 1, 10);
    let new2 = new.clone();
    let b2 = b.clone();
    // While a.txt is on its way, sub/b.bin is rewritten.
    w.sharer.taps.lock().unwrap().push_back(Tap {
        at: 4 << 20,
        action: Box::new(move || fs::write(&b2, &new2)),
    });
    let err = w.pull("tree", &w.options("out")).unwrap_err();
    assert_eq!(err.code(), Code::SourceChanged, "{err}");
    assert!(
        !w.dir.path().join("out/tree/sub/b.bin").exists(),
        "no mix under the final name"
    );
    let mut o = w.options("out");
    o.overwrite = true;
    w.pull("tree", &o).unwrap();
    assert!(fs::read(w.dir.path().join("out/tree/sub/b.bin")).unwrap() == new);
    assert_same_tree(&tree.join("a.txt"), &w.dir.path().join("out/tree/a.txt"));
}

#[test]
fn two_clients_pull_at_once() {
    let w = World::new();
    std::thread::scope(|s| {
        let pulls: Vec<_> = ["one", "two"]
            .map(|dest| {
                let w = &w;
                s.spawn(move || w.pull("tree", &w.options(dest)).unwrap())
            })
            .into_iter()
            .collect();
        for h in pulls {
            h.join().unwrap();
        }
    });
    for dest in ["one", "two"] {
        assert_same_tree(
            &w.share().join("tree"),
            &w.dir.path().join(dest).join("tree"),
        );
    }
}

/// Sends raw PULL requests (paths no client would build) and returns each answer.
fn raw_pulls(w: &World, paths: &[&[u8]]) -> Vec<(ErrorCode, String)> {
    let (mut reader, mut writer) = channel(&w.sharer, w.key()).unwrap();
    let mut hello = Vec::new();
    Request::Hello(wire::Hello {
        version: wire::PROTOCOL_VERSION,
        max_in_flight: 8,
        share: Vec::new(),
    })
    .encode(&mut hello);
    writer.send(&hello).unwrap();
    writer.flush().unwrap();
    let first = reader.recv().unwrap().unwrap().to_vec();
    assert!(matches!(
        Response::decode(&first).unwrap(),
        Response::Hello(_)
    ));
    let mut answers = Vec::new();
    for (id, path) in paths.iter().enumerate() {
        let mut packet = vec![wire::PULL];
        packet.extend_from_slice(&(id as u32).to_le_bytes());
        ferry_wire::Put::put_bytes16(&mut packet, path);
        writer.send(&packet).unwrap();
        writer.flush().unwrap();
        let answer = reader.recv().unwrap().unwrap().to_vec();
        match Response::decode(&answer).unwrap() {
            Response::Error {
                id: i,
                code,
                message,
            } if i == id as u32 => answers.push((code, message)),
            other => panic!("{path:?}: {other:?}"),
        }
    }
    answers
}

#[test]
fn pulls_that_leave_the_share_are_refused_and_nothing_is_read() {
    let w = World::new();
    mkfifo(&w.share().join("fifo"));
    symlink("/dev/null", w.share().join("dev")).unwrap();
    // A device node itself, where this test may make one.
    let node = rustix::fs::mknodat(
        rustix::fs::CWD,
        w.share().join("null"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        rustix::fs::makedev(1, 3),
    )
    .is_ok();
    let mut bad: Vec<&[u8]> = vec![
        b"..",
        b"/etc/passwd",
        b"tree/../../secret",
        b"a\0b",
        b"escape",
        b"escape/x",
        b"fifo",
        b"dev",
    ];
    if node {
        bad.push(b"null");
    }
    let answers = raw_pulls(&w, &bad);
    for (path, (code, message)) in bad.iter().zip(&answers) {
        assert_eq!(*code, ErrorCode::UnsafePath, "{path:?}: {message}");
    }
    let log = w.log().join("\n");
    assert!(log.contains("refused") && log.contains("escape"), "{log}");
    assert!(!log.contains("pull \""), "no pull was sent: {log}");
    // Through the client API: refused with unsafe-path, nothing received.
    let err = w.pull("escape", &w.options("out")).unwrap_err();
    assert_eq!(err.code(), Code::UnsafePath, "{err}");
    assert!(names(&w.dir.path().join("out")).is_empty());
}

#[test]
fn a_directory_swapped_for_a_symlink_after_the_walk_leaks_nothing() {
    let w = World::new();
    let tree = w.share().join("tree");
    fs::write(tree.join("a.txt"), pseudo_random(12 << 20, 9)).unwrap();
    let outside = w.dir.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    // Same names and sizes as the walk saw; the open below the pulled directory meets the symlink.
    fs::copy(tree.join("sub/b.bin"), outside.join("b.bin")).unwrap();
    let (sub, outside2) = (tree.join("sub"), outside.clone());
    w.sharer.taps.lock().unwrap().push_back(Tap {
        at: 4 << 20,
        action: Box::new(move || {
            fs::rename(&sub, sub.with_extension("moved"))?;
            symlink(&outside2, &sub)
        }),
    });
    let err = w.pull("tree", &w.options("out")).unwrap_err();
    assert_eq!(err.code(), Code::SourceChanged, "{err}");
    assert!(!w.dir.path().join("out/tree/sub/b.bin").exists());
}

/// A sink that corrupts or repeats the engine's data packets: a hostile sharer.
struct Hostile<K> {
    inner: K,
    buf: Vec<u8>,
    repeat: bool,
}

impl<K: PacketSink> PacketSink for Hostile<K> {
    fn send(&mut self, payload: &[u8]) -> io::Result<()> {
        self.inner.send(payload)
    }
    fn payload_buf(&mut self, len: usize) -> &mut [u8] {
        self.buf.resize(len, 0);
        &mut self.buf
    }
    fn send_payload_buf(&mut self, len: usize) -> io::Result<()> {
        if self.repeat {
            // The same data again and again, more than any file holds.
            for _ in 0..64 {
                self.inner.send(&self.buf[..len])?;
            }
            Ok(())
        } else {
            let last = len - 1;
            self.buf[last] ^= 0x40;
            self.inner.send(&self.buf[..len])
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A sharer that answers a pull with `dir/name` sent through [`Hostile`].
fn hostile_sharer(
    dir: &Path,
    name: &str,
    repeat: bool,
    client: [u8; 32],
) -> (std::net::SocketAddr, [u8; 32]) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let key = IdentityKey::generate();
    let public = key.public();
    let path = dir.join(name);
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let est = handshake(stream.try_clone().unwrap(), Role::Responder, key, client).unwrap();
        let (mut reader, mut writer) = split_tcp(stream, est).unwrap();
        let mut out = Vec::new();
        Response::Hello(wire::Hello {
            version: wire::PROTOCOL_VERSION,
            max_in_flight: 8,
            share: Vec::new(),
        })
        .encode(&mut out);
        writer.send(&out).unwrap();
        writer.flush().unwrap();
        let _hello = reader.recv().unwrap();
        let pull = reader.recv().unwrap().unwrap().to_vec();
        let Ok(Request::Pull { id, .. }) = Request::decode(&pull) else {
            panic!("not a pull")
        };
        out.clear();
        Response::Transfer { id }.encode(&mut out);
        writer.send(&out).unwrap();
        let walked = ferry_transfer::walk(&[&path]).unwrap();
        let mut sink = Hostile {
            inner: ferry_transfer::secure::ChannelSink(writer),
            buf: Vec::new(),
            repeat,
        };
        let mut source = ferry_transfer::secure::ChannelSource(reader);
        let _ = ferry_transfer::send(
            &mut sink,
            &mut source,
            &walked.manifest,
            &Default::default(),
            &mut (),
        );
    });
    (addr, public)
}

#[test]
fn a_hostile_sharer_sending_wrong_or_endless_bytes_is_caught_and_nothing_is_kept() {
    let dir = ferry_testkit::temp_dir("ferry-pull-hostile-");
    fs::write(
        dir.path().join("data.bin"),
        pseudo_random((2 << 20) + 5, 11),
    )
    .unwrap();
    for repeat in [false, true] {
        let me = IdentityKey::generate();
        let (addr, key) = hostile_sharer(dir.path(), "data.bin", repeat, me.public());
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let est = handshake(stream.try_clone().unwrap(), Role::Initiator, me, key).unwrap();
        let (reader, writer) = split_tcp(stream, est).unwrap();
        let dest = dir.path().join(format!("out-{repeat}"));
        let mut opts = ReceiveOptions::new(&dest);
        opts.partial_dir = Some(dir.path().join("partial"));
        let err = pull(reader, writer, &p("data.bin"), &opts, &mut ()).unwrap_err();
        let code = err.code();
        assert!(
            matches!(code, Code::Integrity | Code::SizeMismatch | Code::Protocol),
            "repeat {repeat}: {err}"
        );
        assert!(
            matches!(err, SessionError::Transfer(ref e) if !matches!(e, TransferError::Remote { .. })),
            "found by the client: {err}"
        );
        assert!(
            !dest.join("data.bin").exists(),
            "nothing under the final name"
        );
    }
}

#[test]
fn verified_ranges_equal_the_source_and_a_range_past_the_end_is_refused() {
    let w = World::new();
    let data = fs::read(w.share().join("big.bin")).unwrap();
    let size = data.len() as u64;
    let mut session = w.session();
    let group = ferry_share::tree::GROUP;
    for (offset, len) in [
        (0, 10),
        (group - 5, 10),
        (3 * group + 1, 2 * group),
        (size - 7, 7),
        (size, 0),
        (1000, 2 * RANGE_PIECE + 12345),
        (0, size),
    ] {
        let mut out = Vec::new();
        let v = read_range(&mut session, &p("big.bin"), offset, len, &mut out).unwrap();
        assert_eq!(v.size, size);
        assert!(
            out == data[offset as usize..(offset + len) as usize],
            "{offset}+{len}"
        );
    }
    for (offset, len) in [(size - 3, 10), (size + 1, 0)] {
        let mut out = Vec::new();
        let err = read_range(&mut session, &p("big.bin"), offset, len, &mut out).unwrap_err();
        assert!(
            matches!(err, SessionError::PastEnd { size: s } if s == size),
            "{err}"
        );
        assert!(out.is_empty(), "nothing written");
    }
    // The session goes on after a refused range.
    let mut out = Vec::new();
    read_range(&mut session, &p("tree/a.txt"), 1, 3, &mut out).unwrap();
    assert_eq!(out, b"lph");
}
