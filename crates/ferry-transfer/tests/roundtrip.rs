//! Sender ↔ receiver over loopback TCP with the plain framing.

mod common;

use common::*;
use ferry_transfer::{TransferError, WalkWarning};
use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

fn set_mtime(p: &Path, secs: u64, nanos: u32) {
    let t = SystemTime::UNIX_EPOCH + Duration::new(secs, nanos);
    File::open(p).unwrap().set_modified(t).unwrap();
}

fn assert_same_meta(a: &Path, b: &Path) {
    let (ma, mb) = (
        fs::symlink_metadata(a).unwrap(),
        fs::symlink_metadata(b).unwrap(),
    );
    assert_eq!(
        ma.mode() & 0o777,
        mb.mode() & 0o777,
        "mode of {}",
        b.display()
    );
    assert_eq!(
        (ma.mtime(), ma.mtime_nsec()),
        (mb.mtime(), mb.mtime_nsec()),
        "mtime of {}",
        b.display()
    );
}

#[test]
fn one_file_multi_chunk_with_mode_and_mtime() {
    let t = TempDir::new("one");
    let src = t.join("big.bin");
    let content = data(3 * (1 << 20) + 12345, 1);
    fs::write(&src, &content).unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o640)).unwrap();
    set_mtime(&src, 1_600_000_000, 123_456_789);
    let out = t.join("out");
    let (s, r) = run(&[&src], &opts(&out, &t.join("cache")));
    let (s, r) = (s.unwrap(), r.unwrap());
    assert_eq!(s.bytes_sent, content.len() as u64);
    assert_eq!(r.bytes_received, content.len() as u64);
    assert_eq!(fs::read(out.join("big.bin")).unwrap(), content);
    assert_same_meta(&src, &out.join("big.bin"));
    assert_eq!(listing(&out), vec!["big.bin"]);
    assert!(
        listing(&t.join("cache")).is_empty(),
        "partial state cleaned up"
    );
}

#[test]
fn empty_file() {
    let t = TempDir::new("empty");
    let src = t.join("empty");
    fs::write(&src, b"").unwrap();
    let out = t.join("out");
    let (s, r) = run(&[&src], &opts(&out, &t.join("cache")));
    s.unwrap();
    assert_eq!(r.unwrap().totals.files, 1);
    assert_eq!(fs::read(out.join("empty")).unwrap(), b"");
    assert_eq!(listing(&out), vec!["empty"]);
}

#[test]
fn tree_with_odd_names_empty_dirs_modes_and_mtimes() {
    let t = TempDir::new("tree");
    let root = t.join("tree");
    let names = ["with space", "ünïcødé ✓", "new\nline", "a"];
    fs::create_dir_all(root.join("nested/deeper/deepest")).unwrap();
    fs::create_dir_all(root.join("empty dir")).unwrap();
    fs::create_dir_all(root.join("nested/empty")).unwrap();
    let mut files = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let p = root.join("nested").join(n);
        fs::write(&p, data(100 + i * 1000, i as u64)).unwrap();
        files.push(p);
    }
    for i in 0..300 {
        let p = root.join("nested/deeper").join(format!("small-{i}"));
        fs::write(&p, data(4096 + i * 13, 100 + i as u64)).unwrap();
        files.push(p);
    }
    let exe = root.join("nested/deeper/deepest/run.sh");
    fs::write(&exe, b"#!/bin/sh\n").unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(
        root.join("nested/deeper/deepest"),
        fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    for (i, f) in files.iter().enumerate() {
        set_mtime(f, 1_500_000_000 + i as u64, i as u32 * 7);
    }
    for (i, d) in [
        "nested/deeper/deepest",
        "nested/deeper",
        "nested/empty",
        "empty dir",
        "nested",
        "",
    ]
    .iter()
    .enumerate()
    {
        set_mtime(
            &root.join(d),
            1_400_000_000 + i as u64,
            999_999_999 - i as u32,
        );
    }

    let out = t.join("out");
    let (s, r) = run(&[&root], &opts(&out, &t.join("cache")));
    let s = s.unwrap();
    let r = r.unwrap();
    assert_eq!(r.totals.files, 305);
    assert_eq!(r.totals.dirs, 6);
    assert_eq!(s.bytes_sent, r.totals.bytes);
    assert_eq!(listing(&root), listing(&out.join("tree")));
    for rel in listing(&root) {
        let (a, b) = (root.join(&rel), out.join("tree").join(&rel));
        if a.is_file() {
            assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap(), "{rel}");
        }
        assert_same_meta(&a, &b);
    }
    assert_same_meta(&root, &out.join("tree"));
}

#[test]
fn symlinks_inside_kept_outside_skipped() {
    let t = TempDir::new("links");
    let root = t.join("top");
    fs::create_dir_all(root.join("d")).unwrap();
    fs::write(root.join("d/file"), b"x").unwrap();
    fs::write(t.join("secret"), b"s").unwrap();
    std::os::unix::fs::symlink("file", root.join("d/same-dir")).unwrap();
    std::os::unix::fs::symlink("../d/file", root.join("d/up-and-down")).unwrap();
    std::os::unix::fs::symlink("..", root.join("d/to-top")).unwrap();
    std::os::unix::fs::symlink("../../secret", root.join("d/escapes")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("absolute")).unwrap();

    let walked = ferry_transfer::walk(&[&root]).unwrap();
    let skipped: Vec<_> = walked
        .warnings
        .iter()
        .map(|w| match w {
            WalkWarning::SymlinkOutside { path, .. } => {
                path.file_name().unwrap().to_string_lossy().into_owned()
            }
            other => panic!("unexpected warning {other}"),
        })
        .collect();
    assert_eq!(skipped, vec!["absolute", "escapes"]);

    let out = t.join("out");
    let (s, r) = run(&[&root], &opts(&out, &t.join("cache")));
    s.unwrap();
    assert_eq!(r.unwrap().totals.symlinks, 3);
    assert_eq!(
        listing(&out),
        vec![
            "top",
            "top/d",
            "top/d/file",
            "top/d/same-dir",
            "top/d/to-top",
            "top/d/up-and-down"
        ]
    );
    assert_eq!(
        fs::read_link(out.join("top/d/up-and-down")).unwrap(),
        Path::new("../d/file")
    );
    assert_eq!(fs::read(out.join("top/d/same-dir")).unwrap(), b"x");
    assert!(fs::symlink_metadata(out.join("top/d/to-top"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn special_files_are_skipped_with_a_warning() {
    let t = TempDir::new("fifo");
    let root = t.join("top");
    fs::create_dir_all(&root).unwrap();
    let fifo = root.join("pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let walked = ferry_transfer::walk(&[&root]).unwrap();
    assert!(matches!(
        &walked.warnings[..],
        [WalkWarning::Special { .. }]
    ));
    assert_eq!(walked.manifest.entries.len(), 1);
}

#[test]
fn existing_file_not_overwritten_without_flag() {
    let t = TempDir::new("conflict");
    let root = t.join("top");
    fs::create_dir_all(root.join("sub")).unwrap();
    fs::write(root.join("sub/a"), b"new a").unwrap();
    fs::write(root.join("sub/b"), b"new b").unwrap();
    let out = t.join("out");
    fs::create_dir_all(out.join("top/sub")).unwrap();
    fs::write(out.join("top/sub/b"), b"old b").unwrap();

    // The existing top-level directory is a conflict unless merging; merging, the file is.
    for (merge, want) in [(false, "top"), (true, "top/sub/b")] {
        let mut o = opts(&out, &t.join("cache"));
        o.merge = merge;
        let (s, r) = run(&[&root], &o);
        match r {
            Err(TransferError::Conflict { path }) => assert_eq!(path, want),
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert!(
            matches!(s, Err(TransferError::Remote { ref code, .. }) if code == "conflict"),
            "{s:?}"
        );
        assert_eq!(fs::read(out.join("top/sub/b")).unwrap(), b"old b");
        assert_eq!(
            listing(&out),
            vec!["top", "top/sub", "top/sub/b"],
            "nothing written"
        );
    }

    let mut o = opts(&out, &t.join("cache"));
    o.overwrite = true;
    let (s, r) = run(&[&root], &o);
    s.unwrap();
    r.unwrap();
    assert_eq!(fs::read(out.join("top/sub/b")).unwrap(), b"new b");
    assert_eq!(fs::read(out.join("top/sub/a")).unwrap(), b"new a");
}

#[test]
fn symlink_in_destination_is_never_followed() {
    let t = TempDir::new("dest-link");
    let root = t.join("top");
    fs::create_dir_all(root.join("sub")).unwrap();
    fs::write(root.join("sub/f"), b"data").unwrap();
    let out = t.join("out");
    let elsewhere = t.join("elsewhere");
    fs::create_dir_all(out.join("top")).unwrap();
    fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, out.join("top/sub")).unwrap();
    for overwrite in [false, true] {
        let mut o = opts(&out, &t.join("cache"));
        o.overwrite = overwrite;
        let (_, r) = run(&[&root], &o);
        if !overwrite {
            assert!(matches!(r, Err(TransferError::Conflict { .. })), "{r:?}");
        } else {
            r.unwrap();
            assert!(fs::symlink_metadata(out.join("top/sub")).unwrap().is_dir());
        }
        assert!(
            listing(&elsewhere).is_empty(),
            "nothing written through the symlink"
        );
    }
}

#[test]
fn declined_offer_writes_nothing() {
    let t = TempDir::new("decline");
    let src = t.join("f");
    fs::write(&src, b"x").unwrap();
    let out = t.join("out");
    let (a, b) = tcp_pair();
    let walked = ferry_transfer::walk(&[&src]).unwrap();
    let sender = std::thread::spawn(move || {
        let mut sink = ferry_transfer::plain::PlainSink::new(a.try_clone().unwrap());
        let mut source = ferry_transfer::plain::PlainSource::new(a);
        ferry_transfer::send(
            &mut sink,
            &mut source,
            &walked.manifest,
            &Default::default(),
            &mut (),
        )
    });
    let mut sink = ferry_transfer::plain::PlainSink::new(b.try_clone().unwrap());
    let mut source = ferry_transfer::plain::PlainSource::new(b);
    let r = ferry_transfer::receive(
        &mut source,
        &mut sink,
        &opts(&out, &t.join("cache")),
        &mut |o| {
            assert_eq!(o.totals.files, 1);
            false
        },
        &mut (),
    );
    assert!(matches!(r, Err(TransferError::Declined)));
    assert!(matches!(
        sender.join().unwrap(),
        Err(TransferError::Declined)
    ));
    assert!(listing(&out).is_empty());
}

/// A source file that changes between the walk and its turn to be sent stops the transfer with
/// `SourceChanged`, and nothing of it reaches a final name.
#[test]
fn source_changed_after_walk_is_refused() {
    type Change = fn(&Path, &Path);
    let cases: [(&str, Change); 5] = [
        ("overwritten at the same size", |f, _| {
            let file = fs::OpenOptions::new().write(true).open(f).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&file, b"CHANGED!", 8).unwrap();
        }),
        ("grew", |f, _| {
            fs::write(f, data(5000, 9)).unwrap();
        }),
        ("shrank", |f, _| {
            fs::write(f, data(100, 9)).unwrap();
        }),
        ("emptied", |f, _| {
            fs::write(f, b"").unwrap();
        }),
        ("became a symlink", |f, outside| {
            fs::remove_file(f).unwrap();
            std::os::unix::fs::symlink(outside, f).unwrap();
        }),
    ];
    for (what, change) in cases {
        let t = TempDir::new("changed");
        let root = t.join("tree");
        fs::create_dir_all(root.join("sub")).unwrap();
        fs::write(root.join("sub/a"), data(1000, 1)).unwrap();
        fs::write(root.join("sub/b"), data(4096, 2)).unwrap();
        let outside = t.join("secret");
        fs::write(&outside, data(4096, 3)).unwrap();
        let walked = ferry_transfer::walk(&[&root]).unwrap();
        change(&root.join("sub/b"), &outside);
        let out = t.join("out");
        let (s, r) = run_walked(walked, &opts(&out, &t.join("cache")), None);
        match s {
            Err(TransferError::SourceChanged { path }) => {
                assert!(path.ends_with("sub/b"), "{what}: {path}")
            }
            other => panic!("{what}: sender gave {other:?}"),
        }
        assert!(r.is_err(), "{what}: the receiver must not succeed");
        assert!(
            !out.join("tree/sub/b").exists(),
            "{what}: a changed file reached its final name"
        );
    }
}

/// Records the size of every data packet the engine builds, passing everything on.
struct Sizes<K> {
    inner: K,
    built: Vec<usize>,
}

impl<K: ferry_transfer::PacketSink> ferry_transfer::PacketSink for Sizes<K> {
    fn send(&mut self, payload: &[u8]) -> std::io::Result<()> {
        self.inner.send(payload)
    }
    fn payload_buf(&mut self, len: usize) -> &mut [u8] {
        self.built.push(len);
        self.inner.payload_buf(len)
    }
    fn send_payload_buf(&mut self, len: usize) -> std::io::Result<()> {
        self.inner.send_payload_buf(len)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn packet_limit(&self, max: usize) -> usize {
        self.inner.packet_limit(max)
    }
}

/// Over the secure channel, the data packets start small and grow (so that the first bytes can be opened
/// while TCP's window is still small): a large file and small files, whose records and chunk hashes are
/// split across the small packets, arrive whole and verified.
#[test]
fn small_first_packets_over_the_channel_roundtrip() {
    use ferry_channel::{blocking, Auth, Config, Handshake, Role};
    use ferry_transfer::secure::{ChannelSink, ChannelSource};
    let t = TempDir::new("small-first");
    let root = t.join("tree");
    fs::create_dir_all(&root).unwrap();
    let big = data(5 * (1 << 20) + 777, 7);
    fs::write(root.join("big.bin"), &big).unwrap();
    for i in 0..50 {
        fs::write(
            root.join(format!("small{i}")),
            data(3000 + i * 101, i as u64),
        )
        .unwrap();
    }
    let out = t.join("out");
    let ropts = opts(&out, &t.join("cache"));
    let walked = ferry_transfer::walk(&[&root]).unwrap();
    let (a, b) = tcp_pair();
    let handshake = |mut s: std::net::TcpStream, role| {
        let hs = Handshake::new(role, Config::ferry(), Auth::Unauthenticated);
        let est = blocking::handshake(&mut s, hs).unwrap();
        blocking::split_tcp(s, est).unwrap()
    };
    let sender = std::thread::spawn(move || {
        let (r, w) = handshake(a, Role::Responder);
        let mut sink = Sizes {
            inner: ChannelSink(w),
            built: Vec::new(),
        };
        let report = ferry_transfer::send(
            &mut sink,
            &mut ChannelSource(r),
            &walked.manifest,
            &ferry_transfer::SendOptions::default(),
            &mut (),
        );
        sink.inner.0.close().unwrap();
        (report, sink.built)
    });
    let (r, w) = handshake(b, Role::Initiator);
    let mut sink = ChannelSink(w);
    let received = ferry_transfer::receive(
        &mut ChannelSource(r),
        &mut sink,
        &ropts,
        &mut |_| true,
        &mut (),
    );
    let (sent, built) = sender.join().unwrap();
    sent.unwrap();
    received.unwrap();
    assert_eq!(fs::read(out.join("tree/big.bin")).unwrap(), big);
    for i in 0..50 {
        let name = format!("tree/small{i}");
        assert_eq!(
            fs::read(out.join(&name)).unwrap(),
            data(3000 + i * 101, i as u64),
            "{name}"
        );
    }
    assert_eq!(built[0], ferry_channel::sizing::FIRST_PACKET, "{built:?}");
    assert!(built.contains(&ferry_transfer::MAX_PACKET), "{built:?}");
}
