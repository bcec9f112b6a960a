//! What the sender does with its sources: files that change while sent, files it may not read,
//! files that report size 0 but have content, and paths that are no file, directory or symlink.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Runs a command as the unprivileged user 65534 (as root, every file is readable).
const NOBODY: &[&str] = &[
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
];

/// A world whose files belong to user 65534, or `None` (the test skipped) when this run cannot
/// switch users.
fn world_for_nobody(test: &str) -> Option<World> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        skip(test, "needs root to run ferry as another user");
        return None;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        skip(test, "setpriv (util-linux) is not installed");
        return None;
    }
    Some(World::new())
}

/// Gives everything in the world to user 65534 (call after creating the files).
fn give_to_nobody(w: &World) {
    for p in std::iter::once(w.dir.path().to_owned()).chain(list_all(w.dir.path())) {
        std::os::unix::fs::lchown(&p, Some(65534), Some(65534)).expect("chown");
    }
}

/// Starts `ferry ARGS...` (JSON events) as user 65534.
fn spawn_as_nobody(w: &World, args: &[&str], paths: &[&Path]) -> Child {
    w.cmd_via(NOBODY)
        .args(args)
        .args(paths)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ferry as nobody")
}

/// The `warning` events' messages.
fn warnings(stdout: &[u8]) -> Vec<String> {
    events(stdout)
        .iter()
        .filter(|e| e["event"] == "warning")
        .map(|e| e["message"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn assert_warned(what: &str, stdout: &[u8], names: &[&str]) {
    let warned = warnings(stdout);
    for name in names {
        assert!(
            warned.iter().any(|w| w.contains(name)),
            "{what}: no warning names {name}: {warned:?}"
        );
    }
}

/// The `skipped` count of the `done` event.
fn done_skipped(stdout: &[u8]) -> u64 {
    let ev = events(stdout);
    event(&ev, "done").expect("a done event")["skipped"]
        .as_u64()
        .expect("skipped")
}

/// A same-size overwrite of a file's last bytes while it is being sent ends the send with
/// `source-changed`, and the receiver keeps no verified file.
#[test]
fn a_same_size_overwrite_while_sending_is_source_changed() {
    let w = World::new();
    let big = w.src().join("big");
    let len = 256u64 << 20;
    fs::write(&big, vec![7u8; len as usize]).unwrap();
    let code = "31-apple-orbit-violin";
    let mut send = Watched::new(w.spawn_send(code, &[&big]));
    send.wait_for(|e| e["event"] == "code");
    let recv = finish_in_background(w.spawn_receive(code, &w.out()));
    // The first packet is out: the sender is a few MiB into the file, far from its end.
    send.wait_for(|e| e["event"] == "progress" && e["bytes_done"].as_u64() > Some(0));
    let f = fs::OpenOptions::new().write(true).open(&big).unwrap();
    f.write_all_at(b"CHANGED!", len - 100).unwrap();
    drop(f);
    let (send, recv) = (send.finish(), recv.join().unwrap());
    assert_failure("sender", &send, 1, "source-changed");
    assert_failure("receiver", &recv, 1, "source-changed");
    assert_only_verified_finals(&w.out(), &[]);
}

/// `ferry send FIFO` is refused at once with exit status 2 (it waited forever before).
#[test]
fn a_top_level_fifo_is_refused() {
    let w = World::new();
    let fifo = w.src().join("pipe");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    // `finish` kills the process after PROCESS_DEADLINE: a hang fails the test.
    let out = finish(w.spawn_send("32-apple-orbit-violin", &[&fifo]));
    assert_failure("send FIFO", &out, 2, "usage");
    let ev = events(&out.stdout);
    assert!(event(&ev, "code").is_none(), "a code was printed");
    let msg = event(&ev, "error").unwrap()["message"].as_str().unwrap();
    assert_eq!(
        msg,
        format!(
            "{} is a FIFO; ferry sends regular files, directories and symlinks",
            fifo.display()
        )
    );
}

/// A procfs file (size 0 in stat, content on read) arrives with the content a read gives.
#[test]
fn a_procfs_file_arrives_with_its_content() {
    let w = World::new();
    let version = Path::new("/proc/version");
    let expected = fs::read(version).unwrap();
    assert!(!expected.is_empty());
    assert_eq!(fs::metadata(version).unwrap().len(), 0);
    let (send, recv) = w.transfer("33-apple-orbit-violin", &[version], &w.out());
    assert_success("send", &send);
    assert_success("receive", &recv);
    assert_eq!(fs::read(w.out().join("version")).unwrap(), expected);
}

/// Inside a tree, an unreadable file, an unlistable directory and a FIFO are skipped with a
/// warning before the offer; the rest arrives, and the sender ends with exit status 9 `partial`.
#[test]
fn what_cannot_be_read_is_skipped_before_the_offer() {
    let Some(w) = world_for_nobody("what_cannot_be_read_is_skipped_before_the_offer") else {
        return;
    };
    let tree = w.src().join("tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    fs::create_dir_all(tree.join("locked")).unwrap();
    fs::write(tree.join("a.txt"), b"first").unwrap();
    fs::write(tree.join("sub/b.txt"), b"second").unwrap();
    fs::write(tree.join("secret"), b"not for nobody").unwrap();
    fs::write(tree.join("locked/inside"), b"not for nobody either").unwrap();
    let c = std::ffi::CString::new(tree.join("pipe").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    give_to_nobody(&w);
    // Root's, and closed to others: the mode says no before anything is opened.
    for p in ["secret", "locked"] {
        std::os::unix::fs::chown(tree.join(p), Some(0), Some(0)).unwrap();
    }
    fs::set_permissions(tree.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(tree.join("locked"), fs::Permissions::from_mode(0o700)).unwrap();

    let code = "34-apple-orbit-violin";
    let send = spawn_as_nobody(&w, &["send", "--json", "--code", code], &[&tree]);
    let send = finish_in_background(send);
    let out = w.out();
    let recv = spawn_as_nobody(&w, &["receive", "--json", "--yes", code, "--out"], &[&out]);
    let (send, recv) = (send.join().unwrap(), finish(recv));
    assert_failure("sender", &send, 9, "partial");
    assert_warned("sender", &send.stdout, &["secret", "locked", "pipe"]);
    assert_eq!(done_skipped(&send.stdout), 3);
    // The receiver got all it was offered.
    assert_success("receiver", &recv);
    assert_eq!(fs::read(out.join("tree/a.txt")).unwrap(), b"first");
    assert_eq!(fs::read(out.join("tree/sub/b.txt")).unwrap(), b"second");
    for p in ["secret", "locked", "pipe"] {
        assert!(!out.join("tree").join(p).exists(), "{p} arrived");
    }
    // Named on the command line, an unreadable file is an error before any code is printed.
    let secret = tree.join("secret");
    let alone = spawn_as_nobody(&w, &["send", "--json", "--code", code], &[&secret]);
    let alone = finish(alone);
    assert_failure("send an unreadable file", &alone, 1, "permission");
    assert!(event(&events(&alone.stdout), "code").is_none());
}

/// A file that was readable at the walk and cannot be opened when its turn comes is skipped with
/// a record the receiver understands: both sides warn, everything else arrives verified, and both
/// end with exit status 9 `partial`.
#[test]
fn a_file_that_fails_to_open_after_the_offer_is_skipped_on_both_sides() {
    let Some(w) = world_for_nobody("a_file_that_fails_to_open_after_the_offer_is_skipped") else {
        return;
    };
    let tree = w.src().join("tree");
    fs::create_dir_all(&tree).unwrap();
    for (name, content) in [("a.txt", "first"), ("b.txt", "second"), ("c.txt", "third")] {
        fs::write(tree.join(name), content).unwrap();
    }
    give_to_nobody(&w);
    let code = "35-apple-orbit-violin";
    let mut send = Watched::new(spawn_as_nobody(
        &w,
        &["send", "--json", "--code", code],
        &[&tree],
    ));
    // The code comes after the walk: b.txt was readable then.
    send.wait_for(|e| e["event"] == "code");
    fs::set_permissions(tree.join("b.txt"), fs::Permissions::from_mode(0o000)).unwrap();
    let out = w.out();
    let recv = spawn_as_nobody(&w, &["receive", "--json", "--yes", code, "--out"], &[&out]);
    let (send, recv) = (send.finish(), finish(recv));
    for (side, out) in [("sender", &send), ("receiver", &recv)] {
        assert_failure(side, out, 9, "partial");
        assert_warned(side, &out.stdout, &["tree/b.txt"]);
        assert_eq!(done_skipped(&out.stdout), 1, "{side}");
    }
    assert_eq!(fs::read(out.join("tree/a.txt")).unwrap(), b"first");
    assert_eq!(fs::read(out.join("tree/c.txt")).unwrap(), b"third");
    assert_only_verified_finals(&out, &["tree/a.txt", "tree/c.txt"]);
}
