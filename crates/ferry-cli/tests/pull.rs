//! `ferry pull` and `ferry ls` between installations paired with real `ferry pair` processes and a real
//! `ferry share`: trees equal to the source, what exists is not overwritten, resume after kill -9 of either
//! side, a file changed during a pull, two clients at once, verified ranges, a listing of 10,000 entries.
//!
//! A pull is held still mid-way by a [`Valve`] between the two processes (a forwarder that stops passing
//! the sharer's bytes after a limit), so a kill lands mid-transfer however fast the machine is.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::*;
use serde_json::Value;

/// `b` pulls `args...` from `a` (`--json`).
fn pull(w: &World, args: &[&str]) -> Output {
    pull_cmd(w, "b", args).output().unwrap()
}

/// `ferry pull --json args...` as `who`.
fn pull_cmd(w: &World, who: &str, args: &[&str]) -> Command {
    let mut c = w.as_(who);
    c.args(["pull", "--json"]).args(args);
    c
}

/// A pull of `who` started with piped output, its events read as they come.
fn spawn_pull(w: &World, who: &str, args: &[&str]) -> Watched {
    let child = pull_cmd(w, who, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Watched::new(child)
}

/// The `done` event of a successful pull.
fn done(what: &str, out: &Output) -> Value {
    assert_success(what, out);
    event(&events(&out.stdout), "done")
        .unwrap_or_else(|| panic!("{what}: no done event"))
        .clone()
}

/// The sharer's direct address from its ready event.
fn listen(ready: &Value) -> std::net::SocketAddr {
    ready["listen"].as_str().unwrap().parse().unwrap()
}

fn str_of(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A tree with what a pull must keep: nested and empty directories, an empty file, modes, mtimes with
/// nanoseconds, symlinks inside (to a file and to a directory); and, beside it in the share, a symlink out.
fn a_tree(w: &World) -> std::path::PathBuf {
    let tree = w.src().join("tree");
    fs::create_dir_all(tree.join("sub/deeper")).unwrap();
    fs::create_dir_all(tree.join("empty-dir")).unwrap();
    fs::write(tree.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(tree.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(tree.join("private"), b"mine").unwrap();
    fs::set_permissions(tree.join("private"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(tree.join("sub/data.bin"), pseudo_random(3_000_017, 5)).unwrap();
    fs::write(tree.join("sub/deeper/empty"), b"").unwrap();
    std::os::unix::fs::symlink("../run.sh", tree.join("sub/to-file")).unwrap();
    std::os::unix::fs::symlink("sub/deeper", tree.join("to-dir")).unwrap();
    for (i, p) in ["run.sh", "private", "sub/data.bin", "sub/deeper/empty"]
        .iter()
        .enumerate()
    {
        set_mtime(&tree.join(p), 1_600_000_000 + i as i64, 123_456_789);
    }
    for d in ["sub/deeper", "sub", "empty-dir", ""] {
        set_mtime(&tree.join(d), 1_650_000_000, 987_654_321);
    }
    fs::create_dir_all(w.path("secret")).unwrap();
    fs::write(w.path("secret/key"), b"private").unwrap();
    std::os::unix::fs::symlink(w.path("secret"), w.src().join("escape")).unwrap();
    tree
}

#[test]
fn a_pulled_tree_a_file_and_the_whole_share_equal_the_source() {
    let w = World::new();
    w.pair("a", "b");
    let tree = a_tree(&w);
    let (sharer, _) = w.share("a", &[]);

    let out = pull(&w, &["a:tree", str_of(&w.out())]);
    let d = done("pull of a tree", &out);
    assert_eq!(d["files"], 4, "{d}");
    assert_same_tree(&tree, &w.out().join("tree"));
    let ev = events(&out.stdout);
    assert_eq!(event(&ev, "connected").unwrap()["path"], "same-host");
    assert_eq!(
        ev.iter().filter(|e| e["event"] == "file-done").count(),
        4,
        "one file-done per file: {ev:?}"
    );

    // One file, under its own name, into a DEST that does not exist yet.
    let one = w.path("one");
    assert_success(
        "pull of one file",
        &pull(&w, &["a:tree/sub/data.bin", str_of(&one)]),
    );
    assert_same_tree(&tree.join("sub/data.bin"), &one.join("data.bin"));
    // ... and under another name.
    assert_success(
        "pull of one file with -o",
        &pull(&w, &["a:tree/run.sh", str_of(&one), "-o", "renamed.sh"]),
    );
    assert_same_tree(&tree.join("run.sh"), &one.join("renamed.sh"));

    // `a:` is the whole share, a directory named as the shared one; the symlink out is left out.
    let all = w.path("all");
    assert_success("pull of the whole share", &pull(&w, &["a:", str_of(&all)]));
    let got = all.join("src");
    assert_same_tree(&tree, &got.join("tree"));
    assert!(!got.join("escape").exists() && !got.join("escape").is_symlink());

    // What is not there, and what leads out: clear errors with their codes, nothing written.
    let nothing = w.path("nothing");
    let out = pull(&w, &["a:tree/missing", str_of(&nothing)]);
    assert_failure("pull of a missing path", &out, 1, "io");
    let message = event(&events(&out.stdout), "error").unwrap()["message"].clone();
    assert!(
        message.as_str().unwrap().contains("not in the share"),
        "{message}"
    );
    let out = pull(&w, &["a:escape/key", str_of(&nothing)]);
    assert_failure("pull through a symlink out", &out, 8, "unsafe-path");
    let out = pull(&w, &["a:escape", str_of(&nothing)]);
    assert_failure("pull of a symlink out", &out, 8, "unsafe-path");
    let out = pull(&w, &["a:../etc", str_of(&nothing)]);
    assert_failure("pull out of the share", &out, 2, "usage");
    assert!(list_all(&nothing).is_empty(), "{:?}", list_all(&nothing));

    // The sharer logs each pull, and what it left out, as `pull`; only the two requests that lead out
    // are refusals.
    let log = events(&stop_share(sharer).stdout);
    let pulls: Vec<_> = log.iter().filter(|e| e["event"] == "pull").collect();
    assert!(pulls.iter().all(|e| e["peer"] == "b"), "{log:?}");
    assert!(
        pulls
            .iter()
            .any(|e| e["message"].as_str().unwrap().contains("escape")),
        "the symlink out is logged: {log:?}"
    );
    let refused = log.iter().filter(|e| e["event"] == "refused").count();
    assert_eq!(refused, 2, "{log:?}");
}

#[test]
fn a_file_name_that_is_not_utf8_is_listed_as_its_bytes_and_pulled_by_them() {
    let w = World::new();
    w.pair("a", "b");
    let name = OsStr::from_bytes(b"bad\xffname");
    fs::write(w.src().join(name), b"bytes, not text").unwrap();
    // What a lossy display would show for it: another file.
    fs::write(w.src().join("bad\u{fffd}name"), b"another file").unwrap();
    let (sharer, _) = w.share("a", &[]);

    // `ls` shows the byte as an escape that can be typed back, unlike the other file's name.
    let out = w.as_("b").args(["ls", "a"]).output().unwrap();
    assert_success("ls", &out);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.lines().any(|l| l.ends_with(" bad\\xffname")), "{text}");
    assert!(
        text.lines().any(|l| l.ends_with(" bad\u{fffd}name")),
        "{text}"
    );

    // `ls` and `pull` take the name's bytes.
    let target = [&b"a:"[..], name.as_bytes()].concat();
    let target = OsStr::from_bytes(&target);
    let out = w.as_("b").arg("ls").arg(target).output().unwrap();
    assert_success("ls of the file", &out);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains(" 15 ") && text.ends_with(" bad\\xffname\n"),
        "{text}"
    );
    let dest = w.path("got");
    let out = w
        .as_("b")
        .args(["pull", "--json"])
        .arg(target)
        .arg(&dest)
        .output()
        .unwrap();
    done("pull of the file", &out);
    assert_eq!(fs::read(dest.join(name)).unwrap(), b"bytes, not text");
    assert_eq!(fs::read_dir(&dest).unwrap().count(), 1);

    // A peer's name is text: a usage error, nothing sought.
    let out = w
        .as_("b")
        .args(["pull", "--json", "--wait", "0"])
        .arg(OsStr::from_bytes(b"\xff:x"))
        .arg(w.path("none"))
        .output()
        .unwrap();
    assert_failure("pull from a peer name that is not text", &out, 2, "usage");
    assert!(!w.path("none").exists());
    stop_share(sharer);
}

#[test]
fn what_exists_is_not_overwritten_without_overwrite() {
    let w = World::new();
    w.pair("a", "b");
    let tree = a_tree(&w);
    let (sharer, _) = w.share("a", &[]);
    let dest = str_of(&w.out()).to_string();
    let note = w.out().join("tree/run.sh");
    done("first pull", &pull(&w, &["a:tree", &dest]));

    // The same again: everything is there and identical, nothing moves.
    let d = done("the same pull again", &pull(&w, &["a:tree", &dest]));
    assert_eq!(d["files_skipped"], 4, "{d}");

    // The sharer's file changed: the pull is refused and changes nothing.
    fs::write(tree.join("run.sh"), b"#!/bin/sh\necho changed\n").unwrap();
    let before = fs::read(&note).unwrap();
    let out = pull(&w, &["a:tree/run.sh", &format!("{dest}/tree")]);
    assert_failure("pull over a file that differs", &out, 7, "conflict");
    let out = pull(&w, &["a:tree", &dest]);
    assert_failure("pull over a tree that differs", &out, 7, "conflict");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("--overwrite"),
        "the message says how"
    );
    assert_eq!(fs::read(&note).unwrap(), before, "nothing changed");
    assert!(partial_files(&w.out()).is_empty());

    // A new file on the sharer: --merge adds it, the changed file still refuses.
    fs::write(tree.join("new.txt"), b"new").unwrap();
    let out = pull(&w, &["a:tree", &dest, "--merge"]);
    assert_failure("a merge over a file that differs", &out, 7, "conflict");
    assert_eq!(fs::read(&note).unwrap(), before, "nothing changed");

    // --overwrite replaces it.
    done(
        "pull --overwrite",
        &pull(&w, &["a:tree", &dest, "--overwrite"]),
    );
    // Every entry as on the sharer (a directory that existed before keeps its own time).
    for e in fs::read_dir(&tree).unwrap() {
        let name = e.unwrap().file_name();
        assert_same_tree(&tree.join(&name), &w.out().join("tree").join(&name));
    }
    assert_eq!(
        fs::read_dir(w.out().join("tree")).unwrap().count(),
        fs::read_dir(&tree).unwrap().count()
    );
    stop_share(sharer);
}

/// `who` starts pulling `path` into `dest` through `valve`; returns it once it reported `at` bytes.
fn pull_held(w: &World, valve: &Valve, path: &str, dest: &Path, at: u64) -> Watched {
    let mut puller = spawn_pull(
        w,
        "b",
        &[path, str_of(dest), "--peer", &valve.addr.to_string()],
    );
    puller.wait_for(|e| e["event"] == "progress" && e["bytes_done"].as_u64().unwrap() >= at);
    puller
}

#[test]
fn a_pull_killed_on_either_side_resumes_with_only_what_is_missing() {
    let w = World::new();
    w.pair("a", "b");
    let size = 256u64 << 20;
    let big = w.src().join("big.bin");
    fs::write(&big, pseudo_random(size as usize, 11)).unwrap();
    let (sharer, ready) = w.share("a", &[]);

    // kill -9 of the puller while the sharer's bytes are held after 96 MiB.
    let valve = Valve::new(listen(&ready), 96 << 20);
    let puller = pull_held(&w, &valve, "a:big.bin", &w.out(), 64 << 20);
    puller.signal(libc::SIGKILL);
    let _ = puller.finish();
    assert!(!w.out().join("big.bin").exists(), "no final name when cut");
    assert_eq!(partial_files(&w.out()).len(), 1, "partial data kept");
    // Again, through a valve that only counts: only what is missing moves.
    let counter = Valve::new(listen(&ready), u64::MAX);
    let d = done(
        "the pull after kill -9 of the puller",
        &pull(
            &w,
            &[
                "a:big.bin",
                str_of(&w.out()),
                "--peer",
                &counter.addr.to_string(),
            ],
        ),
    );
    let resumed = d["bytes_resumed"].as_u64().unwrap();
    assert!((32 << 20..=96 << 20).contains(&resumed), "{d}");
    assert!(
        counter.forwarded() < size - resumed + (4 << 20),
        "{} bytes moved for {} missing",
        counter.forwarded(),
        size - resumed
    );
    assert_same_tree(&big, &w.out().join("big.bin"));
    assert!(partial_files(&w.out()).is_empty(), "temporary file left");

    // kill -9 of the sharer mid-way: the puller says the peer is gone; a new sharer finishes the pull.
    let dest = w.path("second");
    let valve = Valve::new(listen(&ready), 96 << 20);
    let puller = pull_held(&w, &valve, "a:big.bin", &dest, 64 << 20);
    sharer.signal(libc::SIGKILL);
    let _ = sharer.finish();
    valve.open();
    assert_failure(
        "a pull whose sharer was killed",
        &puller.finish(),
        4,
        "peer-gone",
    );
    assert!(!dest.join("big.bin").exists(), "no final name when cut");
    let (sharer, ready) = w.share("a", &[]);
    let d = done(
        "the pull after kill -9 of the sharer",
        &pull(
            &w,
            &[
                "a:big.bin",
                str_of(&dest),
                "--peer",
                &listen(&ready).to_string(),
            ],
        ),
    );
    assert!(d["bytes_resumed"].as_u64().unwrap() >= 32 << 20, "{d}");
    assert_same_tree(&big, &dest.join("big.bin"));
    stop_share(sharer);
}

#[test]
fn a_file_changed_during_a_pull_is_never_mixed_and_the_next_pull_gets_the_new_version() {
    let w = World::new();
    w.pair("a", "b");
    let size = 128usize << 20;
    let f = w.src().join("changing.bin");
    fs::write(&f, pseudo_random(size, 21)).unwrap();
    let new = pseudo_random(size, 22);
    let (sharer, ready) = w.share("a", &[]);

    let valve = Valve::new(listen(&ready), 32 << 20);
    let puller = pull_held(&w, &valve, "a:changing.bin", &w.out(), 16 << 20);
    // Rewritten in place, as an editor that does not rename would.
    let mut file = fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.seek(SeekFrom::Start(0)).unwrap();
    file.write_all(&new).unwrap();
    drop(file);
    valve.open();
    let out = puller.finish();
    let got = w.out().join("changing.bin");
    if out.status.success() {
        assert!(
            fs::read(&got).unwrap() == new,
            "a pull that succeeds has the new version"
        );
    } else {
        assert_failure("a pull of a changing file", &out, 1, "source-changed");
        assert!(!got.exists(), "nothing under the final name");
    }
    // The next pull gets the new version.
    done(
        "the pull after the change",
        &pull(&w, &["a:changing.bin", str_of(&w.out())]),
    );
    assert!(fs::read(&got).unwrap() == new, "the new version");
    stop_share(sharer);
}

#[test]
fn two_clients_pull_at_once() {
    let w = World::new();
    w.pair("a", "b");
    w.pair("a", "c");
    let tree = a_tree(&w);
    fs::write(tree.join("sub/large.bin"), pseudo_random(24 << 20, 31)).unwrap();
    set_mtime(&tree.join("sub"), 1_650_000_000, 987_654_321);
    let (sharer, _) = w.share("a", &[]);
    let pulls: Vec<_> = ["b", "c"]
        .iter()
        .map(|who| {
            let mut cmd = pull_cmd(&w, who, &["a:tree", str_of(&w.path(who))]);
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            finish_in_background(cmd.spawn().unwrap())
        })
        .collect();
    for (who, p) in ["b", "c"].iter().zip(pulls) {
        done(&format!("the pull of {who}"), &p.join().unwrap());
        assert_same_tree(&tree, &w.path(who).join("tree"));
    }
    let log = events(&stop_share(sharer).stdout);
    let peers: Vec<_> = log
        .iter()
        .filter(|e| e["event"] == "client-connected")
        .map(|e| e["peer"].as_str().unwrap().to_string())
        .collect();
    assert!(
        peers.contains(&"b".into()) && peers.contains(&"c".into()),
        "{log:?}"
    );
}

#[test]
fn ranges_are_the_source_bytes_and_a_range_past_the_end_writes_nothing() {
    let w = World::new();
    w.pair("a", "b");
    let data = pseudo_random((5 << 20) + 777, 41);
    let size = data.len() as u64;
    fs::write(w.src().join("r.bin"), &data).unwrap();
    let (sharer, _) = w.share("a", &[]);
    let range = |offset: u64, len: u64| -> Output {
        w.as_("b")
            .args(["pull", "a:r.bin", "-o", "-", "--range"])
            .arg(format!("{offset}:{len}"))
            .output()
            .unwrap()
    };
    for (offset, len) in [
        (16384 - 100, 200),             // across a 16 KiB group boundary
        (size - 50, 50),                // the end of the file
        (3, size - 3),                  // across the 4 MiB pieces, to the end
        (0, size),                      // all of it
        ((4 << 20) - 1, (1 << 20) + 2), // across one piece boundary
        (size, 0),                      // nothing, at the end
    ] {
        let out = range(offset, len);
        assert_success(&format!("--range {offset}:{len}"), &out);
        assert!(
            out.stdout == data[offset as usize..(offset + len) as usize],
            "--range {offset}:{len}: {} bytes, not the source's",
            out.stdout.len()
        );
    }
    // Issue 45: a range ends with a summary line, as a whole pull does.
    let said = String::from_utf8_lossy(&range(100, 5000).stderr).into_owned();
    assert!(
        said.contains(
            "done: pulled 4.88 KiB at offset 100 of r.bin (5.00 MiB) into standard output, verified"
        ),
        "{said}"
    );
    // A whole file to stdout; a directory cannot go there, and nothing is written.
    let whole = w
        .as_("b")
        .args(["pull", "a:r.bin", "-o", "-"])
        .output()
        .unwrap();
    assert_success("pull -o -", &whole);
    assert!(whole.stdout == data, "pull -o -: not the source's bytes");
    fs::create_dir_all(w.src().join("dir")).unwrap();
    let dir = w
        .as_("b")
        .args(["pull", "a:dir", "-o", "-"])
        .output()
        .unwrap();
    assert_eq!(dir.status.code(), Some(7), "{dir:?}");
    assert!(dir.stdout.is_empty());
    assert!(!String::from_utf8_lossy(&dir.stderr).contains("incomplete"));
    // Past the end: a clear error, nothing on stdout, no file.
    let out = range(size - 10, 11);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "{} bytes written", out.stdout.len());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("past the end") && !stderr.contains("incomplete"),
        "{stderr}"
    );
    let out = pull(
        &w,
        &[
            "a:r.bin",
            str_of(&w.out()),
            "--range",
            &format!("{size}:1"),
            "-o",
            "x",
        ],
    );
    assert_failure("--range past the end into a file", &out, 1, "error");
    assert!(list_all(&w.out()).is_empty(), "{:?}", list_all(&w.out()));
    // Into a file: the range under its name, with a range event.
    let out = pull(
        &w,
        &[
            "a:r.bin",
            str_of(&w.out()),
            "--range",
            "100:5000",
            "-o",
            "x",
        ],
    );
    assert_success("--range into a file", &out);
    assert!(fs::read(w.out().join("x")).unwrap() == data[100..5100]);
    let ev = event(&events(&out.stdout), "range").unwrap().clone();
    assert_eq!(
        (ev["offset"].clone(), ev["len"].clone(), ev["size"].clone()),
        (100.into(), 5000.into(), size.into())
    );
    assert_eq!(ev["root"], blake3::hash(&data).to_hex().as_str());
    stop_share(sharer);
}

#[test]
fn a_directory_of_ten_thousand_entries_is_listed_whole() {
    let w = World::new();
    w.pair("a", "b");
    let many = w.src().join("many");
    fs::create_dir_all(&many).unwrap();
    for i in 0..10_000 {
        fs::write(many.join(format!("f-{i:05}")), i.to_string()).unwrap();
    }
    let (sharer, _) = w.share("a", &[]);
    let out = w.ls("b", "a:many", &[]);
    assert_success("ls of 10,000 entries", &out);
    let got = entries(&out);
    assert_eq!(got.len(), 10_000);
    for i in [0, 1, 4_999, 9_998, 9_999] {
        let e = &got[&format!("f-{i:05}")];
        assert_eq!(e["kind"], "file");
        assert_eq!(e["size"], i.to_string().len());
    }
    stop_share(sharer);
}
