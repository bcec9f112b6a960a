//! Receiving into what already exists (issue 10): the same tree received again is found identical
//! and left untouched; a changed file is a conflict, or with `--overwrite` the only file replaced;
//! `--overwrite` replaces inside a read-only directory of the receiving (non-root) user.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;

/// Inode, mtime and ctime of every file and symlink under `dir`: a file that was rewritten,
/// replaced, re-timed or chmodded shows a different triple.
fn identities(dir: &Path) -> BTreeMap<PathBuf, (u64, i64, i64, i64, i64)> {
    list_all(dir)
        .into_iter()
        .filter_map(|p| {
            let md = fs::symlink_metadata(&p).unwrap();
            (!md.is_dir()).then(|| {
                let id = (
                    md.ino(),
                    md.mtime(),
                    md.mtime_nsec(),
                    md.ctime(),
                    md.ctime_nsec(),
                );
                (p.strip_prefix(dir).unwrap().to_path_buf(), id)
            })
        })
        .collect()
}

/// A tree of three files (one larger than a chunk, one empty) and a symlink.
fn make_tree(w: &World) -> PathBuf {
    let tree = w.src().join("tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    fs::write(tree.join("a.txt"), b"first file").unwrap();
    fs::write(tree.join("sub/big.bin"), pseudo_random(3 << 20, 5)).unwrap();
    fs::write(tree.join("sub/empty"), b"").unwrap();
    std::os::unix::fs::symlink("../a.txt", tree.join("sub/link")).unwrap();
    tree
}

/// Makes the tree of [`make_tree`] and receives it once into the world's `out`.
fn received_once(w: &World, code: &str) -> PathBuf {
    let tree = make_tree(w);
    let (send, recv) = w.transfer(code, &[&tree], &w.out());
    assert_success("first send", &send);
    assert_success("first receive", &recv);
    tree
}

/// Sends `paths` and receives them with `flags` (`--json --yes` added); returns both outputs.
fn transfer_with(w: &World, code: &str, paths: &[&Path], flags: &[&str]) -> (Output, Output) {
    let send = finish_in_background(w.spawn_send(code, paths));
    let mut args = vec!["--json", "--yes"];
    args.extend_from_slice(flags);
    let recv = finish(w.spawn_receive_with(&args, code, &w.out()));
    (send.join().unwrap(), recv)
}

/// Every file and symlink of `src` is in `got`, the same (directories that existed before keep
/// their own times, so they are not compared).
fn assert_same_files(src: &Path, got: &Path) {
    for p in list_all(src) {
        if !fs::symlink_metadata(&p).unwrap().is_dir() {
            assert_same_tree(&p, &got.join(p.strip_prefix(src).unwrap()));
        }
    }
}

fn done_field(out: &Output, field: &str) -> u64 {
    event(&events(&out.stdout), "done").expect("a done event")[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in done"))
}

#[test]
fn receiving_the_same_tree_again_leaves_every_file_untouched() {
    let w = World::new();
    let code = "81-apple-orbit-violin";
    let tree = received_once(&w, code);
    let before = identities(&w.out());
    let total = 10 + (3 << 20);

    // Again, with no flag: the existing top-level directory holds the whole offer already.
    let (send, recv) = transfer_with(&w, code, &[&tree], &[]);
    assert_success("second send", &send);
    assert_success("second receive", &recv);
    assert_eq!(done_field(&recv, "files_skipped"), 3);
    assert_eq!(done_field(&recv, "bytes_skipped"), total);
    assert_eq!(done_field(&send, "files_skipped"), 3);
    assert_eq!(done_field(&send, "bytes_skipped"), total);
    assert_eq!(identities(&w.out()), before, "a file was rewritten");
    assert_same_tree(&tree, &w.out().join("tree"));

    // In text mode the summary says so.
    let send = finish_in_background(w.spawn_send(code, &[&tree]));
    let recv = finish(w.spawn_receive_with(&["--yes"], code, &w.out()));
    assert_success("third send", &send.join().unwrap());
    assert_success("third receive", &recv);
    let text = String::from_utf8_lossy(&recv.stderr);
    assert!(
        text.contains("done: received 0 files, 0 B")
            && text.contains("verified; 3 identical files skipped (3.00 MiB)"),
        "{text}"
    );
    assert_eq!(identities(&w.out()), before, "a file was rewritten");
}

#[test]
fn a_changed_file_is_a_conflict_and_overwrite_replaces_only_it() {
    let w = World::new();
    let code = "82-apple-orbit-violin";
    let tree = received_once(&w, code);
    let before = identities(&w.out());

    // The same size, one byte different in the last chunk: only the hash can tell.
    let big = tree.join("sub/big.bin");
    let mut changed = fs::read(&big).unwrap();
    *changed.last_mut().unwrap() ^= 1;
    fs::write(&big, &changed).unwrap();

    let (_send, recv) = transfer_with(&w, code, &[&tree], &[]);
    assert_failure("receive of a changed tree", &recv, 7, "conflict");
    let message = event(&events(&recv.stdout), "error").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(message.contains("tree/sub/big.bin"), "{message}");
    assert_eq!(identities(&w.out()), before, "a conflict changed something");
    assert!(partial_files(&w.out()).is_empty());

    let (send, recv) = transfer_with(&w, code, &[&tree], &["--overwrite"]);
    assert_success("send", &send);
    assert_success("receive --overwrite", &recv);
    assert_eq!(done_field(&recv, "files_skipped"), 2);
    assert_eq!(done_field(&recv, "bytes_skipped"), 10);
    assert_same_files(&tree, &w.out().join("tree"));
    let after = identities(&w.out());
    let replaced = PathBuf::from("tree/sub/big.bin");
    assert_ne!(after[&replaced].0, before[&replaced].0, "not replaced");
    for (path, id) in &before {
        if *path != replaced {
            assert_eq!(after[path], *id, "{} was touched", path.display());
        }
    }
}

/// Without `--merge`, an existing top-level directory is received into only if the offer adds
/// nothing to it: a new file in the sent tree makes the directory a conflict, as before.
#[test]
fn a_tree_that_grew_still_needs_merge() {
    let w = World::new();
    let code = "83-apple-orbit-violin";
    let tree = received_once(&w, code);
    fs::write(tree.join("sub/new.txt"), b"new").unwrap();

    let (_send, recv) = transfer_with(&w, code, &[&tree], &[]);
    assert_failure("receive of a grown tree", &recv, 7, "conflict");
    assert!(!w.out().join("tree/sub/new.txt").exists());

    let (send, recv) = transfer_with(&w, code, &[&tree], &["--merge"]);
    assert_success("send", &send);
    assert_success("receive --merge", &recv);
    assert_eq!(done_field(&recv, "files_skipped"), 3);
    assert_same_files(&tree, &w.out().join("tree"));
}

const NOBODY: u32 = 65534;

/// Runs `ferry receive --json --yes --peer PEER CODE --out OUT FLAGS` as user and group 65534 (with
/// its own cache and runtime directories, so that nothing of root's is needed).
fn receive_as_nobody(w: &World, peer: &str, code: &str, flags: &[&str]) -> Output {
    let home = w.path("nobody");
    let cmd = w.cmd();
    let mut setpriv = Command::new("setpriv");
    setpriv.args([
        &format!("--reuid={NOBODY}"),
        &format!("--regid={NOBODY}"),
        "--clear-groups",
    ]);
    setpriv
        .arg(common::ferry())
        .args(["receive", "--json", "--yes", "--peer", peer, code, "--out"])
        .arg(w.out())
        .args(flags);
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => setpriv.env(k, v),
            None => setpriv.env_remove(k),
        };
    }
    setpriv
        .env("XDG_RUNTIME_DIR", home.join("runtime"))
        .env("XDG_CACHE_HOME", home.join("cache"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    finish(setpriv.spawn().expect("setpriv"))
}

/// Sends `tree` listening on loopback and receives it as the unprivileged user with `flags`.
fn transfer_to_nobody(w: &World, code: &str, tree: &Path, flags: &[&str]) -> (Output, Output) {
    let mut send = w.cmd();
    send.args(["send", "--json", "--code", code, "--listen", "127.0.0.1:0"])
        .arg(tree)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut send = Watched::new(send.spawn().unwrap());
    let listen = send.wait_for(|e| e["event"] == "code")["listen"]
        .as_str()
        .expect("a listen address")
        .to_string();
    let recv = receive_as_nobody(w, &listen, code, flags);
    (send.finish(), recv)
}

/// Item 7: as a non-root user, `--overwrite` replaces a file inside a directory of mode 0555 that
/// this user owns (made writable for the time of the receive), and the directory gets its mode back.
#[test]
fn overwrite_replaces_inside_a_read_only_directory_of_ones_own() {
    const TEST: &str = "overwrite_replaces_inside_a_read_only_directory_of_ones_own";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip(
            TEST,
            "needs root, to run the receiver as an unprivileged user",
        );
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        return skip(TEST, "needs setpriv (util-linux)");
    }
    let w = World::new();
    // The unprivileged receiver reaches its own directories through the world's.
    fs::set_permissions(w.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let home = w.path("nobody");
    for d in [
        w.out(),
        home.clone(),
        home.join("runtime"),
        home.join("cache"),
    ] {
        fs::create_dir_all(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    fs::set_permissions(home.join("runtime"), fs::Permissions::from_mode(0o700)).unwrap();
    let tree = w.src().join("tree");
    let ro = tree.join("read-only");
    fs::create_dir_all(&ro).unwrap();
    fs::write(ro.join("f.txt"), b"version 1").unwrap();
    fs::write(ro.join("same.txt"), b"unchanged").unwrap();
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
    let code = "84-apple-orbit-violin";

    let (send, recv) = transfer_to_nobody(&w, code, &tree, &[]);
    assert_success("first send", &send);
    assert_success("first receive", &recv);
    let got = w.out().join("tree/read-only");
    assert_eq!(fs::metadata(&got).unwrap().uid(), NOBODY);
    assert_eq!(fs::metadata(&got).unwrap().mode() & 0o7777, 0o555);

    fs::set_permissions(&ro, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(ro.join("f.txt"), b"version 2, longer").unwrap();
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
    let (send, recv) = transfer_to_nobody(&w, code, &tree, &["--overwrite"]);
    assert_success("send", &send);
    assert_success("receive --overwrite into a read-only directory", &recv);
    assert_eq!(fs::read(got.join("f.txt")).unwrap(), b"version 2, longer");
    assert_eq!(done_field(&recv, "files_skipped"), 1);
    assert_eq!(
        fs::metadata(&got).unwrap().mode() & 0o7777,
        0o555,
        "the directory did not get its mode back"
    );
}
