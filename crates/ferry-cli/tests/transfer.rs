//! End to end: real `ferry send` and `ferry receive` processes over loopback.

mod common;

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::process::Stdio;

use common::*;

#[test]
fn one_file_arrives_identical_with_mode_and_mtime() {
    let w = World::new();
    let f = w.src().join("report.bin");
    fs::write(&f, pseudo_random(300_001, 1)).unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
    set_mtime(&f, 1_600_000_000, 123_456_789);
    let (send, recv) = w.transfer("11-apple-orbit-violin", &[&f], &w.out());
    assert_success("send", &send);
    assert_success("receive", &recv);
    assert_same_tree(&f, &w.out().join("report.bin"));
    let ev = events(&send.stdout);
    assert_eq!(
        ev[0]["event"], "code",
        "the sender's first event carries the code"
    );
    assert_eq!(ev[0]["code"], "11-apple-orbit-violin");
    let ev = events(&recv.stdout);
    assert_eq!(event(&ev, "offer").unwrap()["files"], 1);
    assert_eq!(event(&ev, "done").unwrap()["bytes"], 300_001);
    assert!(event(&ev, "file-done").is_some());
}

#[test]
fn empty_file_arrives() {
    let w = World::new();
    let f = w.src().join("empty");
    fs::write(&f, b"").unwrap();
    set_mtime(&f, 1_500_000_000, 5);
    let (send, recv) = w.transfer("12-apple-orbit-violin", &[&f], &w.out());
    assert_success("send", &send);
    assert_success("receive", &recv);
    assert_same_tree(&f, &w.out().join("empty"));
}

#[test]
fn file_of_256_mib_arrives_identical() {
    let w = World::new();
    let f = w.src().join("big.img");
    fs::write(&f, pseudo_random(256 << 20, 2)).unwrap();
    let (send, recv) = w.transfer("13-apple-orbit-violin", &[&f], &w.out());
    assert_success("send", &send);
    assert_success("receive", &recv);
    assert_same_tree(&f, &w.out().join("big.img"));
}

#[test]
fn tree_of_10000_small_files_with_odd_names_arrives_identical() {
    let w = World::new();
    let root = w.src().join("tree");
    let odd = [
        "with space",
        "ünïcødé-名前",
        "new\nline",
        "tab\tand 'quotes'",
    ];
    for d in 0..100 {
        let dir = root
            .join(format!("{} {d}", odd[d % odd.len()]))
            .join("nested");
        fs::create_dir_all(&dir).unwrap();
        for i in 0..100 {
            let name = format!("{}-{i}.dat", odd[i % odd.len()]);
            let p = dir.join(name);
            fs::write(
                &p,
                pseudo_random(4096 + (i * 37 + d) % 4096, (d * 100 + i) as u64),
            )
            .unwrap();
            set_mtime(&p, 1_650_000_000 + i as i64, (d * 1000) as i64);
        }
        set_mtime(&dir, 1_640_000_000, 7);
    }
    fs::create_dir_all(root.join("empty dir/also empty")).unwrap();
    symlink("with space 0/nested", root.join("link inside")).unwrap();
    fs::set_permissions(root.join("with space 0"), fs::Permissions::from_mode(0o750)).unwrap();
    for d in ["empty dir/also empty", "empty dir", "with space 0"] {
        set_mtime(&root.join(d), 1_630_000_000, 9);
    }
    let (send, recv) = w.transfer("14-apple-orbit-violin", &[&root], &w.out());
    assert_success("send", &send);
    assert_success("receive", &recv);
    set_mtime(&root, 1_620_000_000, 1);
    set_mtime(&w.out().join("tree"), 1_620_000_000, 1);
    assert_same_tree(&root, &w.out().join("tree"));
    assert_eq!(
        event(&events(&recv.stdout), "done").unwrap()["files"],
        10_000
    );
}

#[test]
fn symlink_leaving_the_tree_is_reported_and_skipped() {
    let w = World::new();
    let root = w.src().join("t");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("a"), b"a").unwrap();
    symlink("/etc/passwd", root.join("escape")).unwrap();
    symlink("../../x", root.join("up")).unwrap();
    let (send, recv) = w.transfer("15-apple-orbit-violin", &[&root], &w.out());
    // Skipped, so the sender ends with `partial`; the receiver got all it was offered.
    assert_failure("send", &send, 9, "partial");
    assert_success("receive", &recv);
    let warnings: Vec<_> = events(&send.stdout)
        .into_iter()
        .filter(|e| e["event"] == "warning")
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(w.out().join("t/a").exists());
    assert!(fs::symlink_metadata(w.out().join("t/escape")).is_err());
    assert!(fs::symlink_metadata(w.out().join("t/up")).is_err());
}

#[test]
fn wrong_code_fails_both_sides_and_writes_nothing() {
    let w = World::new();
    let f = w.src().join("secret");
    fs::write(&f, b"top secret").unwrap();
    let send = finish_in_background(w.spawn_send("16-apple-orbit-violin", &[f]));
    let recv = finish(w.spawn_receive("16-apple-orbit-zoo", &w.out()));
    let send = send.join().unwrap();
    for (side, out) in [("send", &send), ("receive", &recv)] {
        assert_eq!(
            out.status.code(),
            Some(3),
            "{side} exit status; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ev = events(&out.stdout);
        assert_eq!(event(&ev, "error").unwrap()["code"], "wrong-code", "{side}");
    }
    assert!(
        list_all(&w.out()).is_empty(),
        "nothing may be written: {:?}",
        list_all(&w.out())
    );
}

#[test]
fn existing_file_is_not_overwritten_without_the_flag() {
    let w = World::new();
    let f = w.src().join("doc.txt");
    fs::write(&f, b"new contents").unwrap();
    fs::write(w.out().join("doc.txt"), b"old contents").unwrap();
    let (_send, recv) = w.transfer("17-apple-orbit-violin", &[&f], &w.out());
    assert_eq!(
        recv.status.code(),
        Some(7),
        "stderr {}",
        String::from_utf8_lossy(&recv.stderr)
    );
    assert_eq!(
        event(&events(&recv.stdout), "error").unwrap()["code"],
        "conflict"
    );
    assert_eq!(fs::read(w.out().join("doc.txt")).unwrap(), b"old contents");

    let send = finish_in_background(w.spawn_send("17-apple-orbit-violin", &[f]));
    let recv = w
        .cmd()
        .args([
            "receive",
            "--json",
            "--yes",
            "--overwrite",
            "17-apple-orbit-violin",
            "--out",
        ])
        .arg(w.out())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert_success("receive --overwrite", &finish(recv));
    assert_success("send", &send.join().unwrap());
    assert_eq!(fs::read(w.out().join("doc.txt")).unwrap(), b"new contents");
}

#[test]
fn two_sends_at_once_reach_their_own_receivers() {
    let w = World::new();
    let (a, b) = (w.src().join("a.bin"), w.src().join("b.bin"));
    fs::write(&a, pseudo_random(3 << 20, 3)).unwrap();
    fs::write(&b, pseudo_random(2 << 20, 4)).unwrap();
    let (out_a, out_b) = (w.path("out/a"), w.path("out/b"));
    let send_a = finish_in_background(w.spawn_send("21-apple-orbit-violin", &[&a]));
    let send_b = finish_in_background(w.spawn_send("22-zoo-zone-youth", &[&b]));
    // Receivers in the opposite order, at the same time.
    let recv_b = finish_in_background(w.spawn_receive("22-zoo-zone-youth", &out_b));
    let recv_a = finish_in_background(w.spawn_receive("21-apple-orbit-violin", &out_a));
    for (what, child) in [
        ("recv b", recv_b),
        ("recv a", recv_a),
        ("send a", send_a),
        ("send b", send_b),
    ] {
        assert_success(what, &child.join().unwrap());
    }
    assert_same_tree(&a, &out_a.join("a.bin"));
    assert_same_tree(&b, &out_b.join("b.bin"));
}

/// Kills one side with SIGKILL at about half of a 256 MiB file, then runs both again: the rest arrives,
/// verified, and the second run reports the kept bytes.
fn resume_after_kill(kill_receiver: bool, nameplate: u32) {
    let w = World::new();
    let f = w.src().join("half.bin");
    let size = 256u64 << 20;
    fs::write(&f, pseudo_random(size as usize, 5)).unwrap();
    let code = format!("{nameplate}-apple-orbit-violin");

    let send = w.spawn_send(&code, &[&f]);
    let recv = w.spawn_receive(&code, &w.out());
    let (mut watched, other) = if kill_receiver {
        (recv, send)
    } else {
        (send, recv)
    };
    let other = finish_in_background(other);
    let stdout = watched.stdout.take().unwrap();
    let _rest = wait_for_event(stdout, |e| {
        e["event"] == "progress" && e["bytes_done"].as_u64().unwrap_or(0) >= size / 2
    });
    watched.kill().unwrap();
    let _ = watched.wait();
    let other = other.join().unwrap();
    assert!(
        !other.status.success(),
        "the surviving side must report the cut"
    );
    assert!(
        !w.out().join("half.bin").exists(),
        "no file under its final name before it is complete"
    );

    let (send, recv) = w.transfer(&code, &[&f], &w.out());
    assert_success("resumed send", &send);
    assert_success("resumed receive", &recv);
    assert_same_tree(&f, &w.out().join("half.bin"));
    let done = event(&events(&recv.stdout), "done").cloned().unwrap();
    let resumed = done["bytes_resumed"].as_u64().unwrap();
    assert!(
        resumed >= size / 4,
        "the second run must keep what arrived: resumed {resumed} of {size}"
    );
    assert!(
        list_all(&w.out())
            .iter()
            .all(|p| !p.to_string_lossy().contains("ferry-part")),
        "temporary files cleaned up"
    );
}

#[test]
fn receiver_killed_at_half_resumes() {
    resume_after_kill(true, 31);
}

#[test]
fn sender_killed_at_half_resumes() {
    resume_after_kill(false, 32);
}

#[test]
fn no_sender_gives_a_clear_error() {
    let w = World::new();
    let out = finish(
        w.cmd()
            .args([
                "receive",
                "--json",
                "--yes",
                "--wait",
                "1s",
                "41-apple-orbit-violin",
                "--out",
            ])
            .arg(w.out())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(
        event(&events(&out.stdout), "error").unwrap()["code"],
        "peer-not-found"
    );
}

/// `ferry receive --yes CODE --out OUT` with `extra` flags (JSON events), finished.
fn receive_flags(w: &World, code: &str, extra: &[&str]) -> std::process::Output {
    finish(
        w.cmd()
            .args(["receive", "--json", "--yes"])
            .args(extra)
            .arg(code)
            .arg("--out")
            .arg(w.out())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// Issue 9, item 2: `ferry send .ssh` must not add `authorized_keys` to the receiver's existing
/// `~/.ssh`. An offered top-level name that exists is a conflict; `--merge` adds to it, and even
/// then the existing directory keeps its own mode and times.
#[test]
fn an_existing_directory_is_not_merged_into_without_the_flag() {
    let w = World::new();
    let ssh = w.src().join(".ssh");
    fs::create_dir(&ssh).unwrap();
    fs::write(ssh.join("authorized_keys"), b"ssh-ed25519 AAAA attacker").unwrap();
    fs::set_permissions(&ssh, fs::Permissions::from_mode(0o777)).unwrap();
    set_mtime(&ssh, 1_500_000_000, 42);
    let victim = w.out().join(".ssh");
    fs::create_dir(&victim).unwrap();
    fs::write(victim.join("known_hosts"), b"host key").unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o700)).unwrap();
    let code = "18-apple-orbit-violin";

    let send = finish_in_background(w.spawn_send(code, &[&ssh]));
    let recv = receive_flags(&w, code, &[]);
    let _ = send.join().unwrap();
    assert_failure("receive into an existing directory", &recv, 7, "conflict");
    assert!(
        !victim.join("authorized_keys").exists(),
        "merged into the existing directory without --merge"
    );

    let send = finish_in_background(w.spawn_send(code, &[&ssh]));
    let recv = receive_flags(&w, code, &["--merge"]);
    assert_success("send", &send.join().unwrap());
    assert_success("receive --merge", &recv);
    assert_eq!(
        fs::read(victim.join("authorized_keys")).unwrap(),
        b"ssh-ed25519 AAAA attacker"
    );
    assert_eq!(fs::read(victim.join("known_hosts")).unwrap(), b"host key");
    let md = fs::metadata(&victim).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        md.mode() & 0o7777,
        0o700,
        "an existing directory was chmodded"
    );
    assert_ne!(
        (md.mtime(), md.mtime_nsec()),
        (1_500_000_000, 42),
        "an existing directory got the sender's mtime"
    );
}

/// Issue 9, item 2: the offer names what it would create, before the question: the prompt the
/// first few and how many more, the JSON `offer` event a bounded list and the count.
#[test]
fn the_offer_names_its_top_level_entries() {
    let w = World::new();
    let mut paths = Vec::new();
    for i in 0..12 {
        let p = w.src().join(format!("name-{i:02}"));
        fs::write(&p, b"x").unwrap();
        paths.push(p);
    }
    let code = "19-apple-orbit-violin";
    let (send, recv) = w.transfer(code, &paths, &w.out());
    assert_success("send", &send);
    assert_success("receive", &recv);
    let ev = events(&recv.stdout);
    let offer = event(&ev, "offer").unwrap();
    let want: Vec<String> = (0..12).map(|i| format!("name-{i:02}")).collect();
    assert_eq!(offer["names"], serde_json::json!(want), "{offer}");
    assert_eq!(offer["names_total"], 12, "{offer}");

    // Without a terminal and without --yes the offer is shown, then declined.
    let out = w.path("out2");
    let send = finish_in_background(w.spawn_send(code, &paths));
    let recv = finish(
        w.cmd()
            .args(["receive", code, "--out"])
            .arg(&out)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let _ = send.join().unwrap();
    assert_eq!(recv.status.code(), Some(7));
    let stderr = String::from_utf8_lossy(&recv.stderr);
    assert!(
        stderr.contains("name-00, name-01, name-02, name-03, name-04 and 7 more"),
        "{stderr}"
    );
    assert!(list_all(&out).is_empty(), "{:?}", list_all(&out));
}

/// Issue 9, item 10: the receiver's umask applies, as with cp, tar and scp: under umask 077 a
/// 0777 directory and 0666 files (one small, one larger than a chunk) arrive as 0700 and 0600.
#[test]
fn the_receivers_umask_applies() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    let w = World::new();
    let d = w.src().join("shared");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("small"), b"small").unwrap();
    fs::write(d.join("big"), pseudo_random(3 << 19, 17)).unwrap();
    for (p, mode) in [
        (d.join("small"), 0o666),
        (d.join("big"), 0o666),
        (d.clone(), 0o777),
    ] {
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    }
    let code = "20-apple-orbit-violin";
    let send = finish_in_background(w.spawn_send(code, &[&d]));
    let mut cmd = w.cmd();
    cmd.args(["receive", "--json", "--yes", code, "--out"])
        .arg(w.out())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: umask(2) is async-signal-safe and touches nothing but the child's own mask.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o077);
            Ok(())
        });
    }
    let recv = finish(cmd.spawn().unwrap());
    assert_success("send", &send.join().unwrap());
    assert_success("receive under umask 077", &recv);
    let got = w.out().join("shared");
    for (p, want) in [
        (got.clone(), 0o700),
        (got.join("small"), 0o600),
        (got.join("big"), 0o600),
    ] {
        let mode = fs::metadata(&p).unwrap().mode() & 0o7777;
        assert_eq!(mode, want, "mode of {} is {mode:o}", p.display());
    }
}

/// Issue 9, item 11: a file named like ferry's temporary file of another offered file arrives
/// intact, and one that was already in the destination is left alone.
#[test]
fn files_named_like_temporary_files_are_never_deleted() {
    let w = World::new();
    let t = w.src().join("t");
    fs::create_dir(&t).unwrap();
    let big = pseudo_random(2 << 20, 18);
    fs::write(t.join("big"), &big).unwrap();
    fs::write(t.join(".big.ferry-part"), b"offered, not temporary").unwrap();
    let (send, recv) = w.transfer("23-apple-orbit-violin", &[&t], &w.out());
    assert_success("send", &send);
    assert_success("receive", &recv);
    assert_same_tree(&t, &w.out().join("t"));

    let lone = w.src().join("lone");
    fs::write(&lone, &big).unwrap();
    let mine = w.out().join(".lone.ferry-part");
    fs::write(&mine, b"the user's own file").unwrap();
    let (send, recv) = w.transfer("24-apple-orbit-violin", &[&lone], &w.out());
    assert_success("send", &send);
    assert_success("receive", &recv);
    assert_eq!(fs::read(w.out().join("lone")).unwrap(), big);
    assert_eq!(fs::read(&mine).unwrap(), b"the user's own file");
}
