//! `ferry share` and `ferry ls` between installations paired with real `ferry pair` processes: listings equal
//! to the source, who is refused (unpaired, removed, not allowed, a stolen peer list) before any request,
//! several clients, a real relay, signals.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Stdio;

use common::*;
use serde_json::Value;

fn a_tree(w: &World) {
    let src = w.src();
    fs::create_dir_all(src.join("docs/deep")).unwrap();
    fs::write(src.join("big.bin"), pseudo_random(1_000_000, 3)).unwrap();
    fs::write(src.join("docs/note.txt"), b"hello share\n").unwrap();
    fs::write(src.join("docs/deep/empty"), b"").unwrap();
    std::os::unix::fs::symlink("docs/note.txt", src.join("link")).unwrap();
    set_mtime(&src.join("big.bin"), 1_700_000_000, 123_456_789);
}

/// Asserts the listing `got` of the directory `dir` is its contents: names, kinds, sizes, modes, mtimes,
/// symlink targets.
fn assert_listing(dir: &Path, got: &BTreeMap<String, Value>) {
    let mut want = BTreeMap::new();
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = fs::symlink_metadata(e.path()).unwrap();
        let kind = if m.is_dir() {
            "dir"
        } else if m.file_type().is_symlink() {
            "symlink"
        } else {
            "file"
        };
        want.insert(e.file_name().into_string().unwrap(), (kind, m));
    }
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "names in {}",
        dir.display()
    );
    for (name, (kind, m)) in &want {
        let e = &got[name];
        assert_eq!(e["kind"], *kind, "kind of {name}");
        assert_eq!(e["mtime"], m.mtime(), "mtime of {name}");
        match *kind {
            "symlink" => assert_eq!(
                e["target"],
                fs::read_link(dir.join(name)).unwrap().to_str().unwrap(),
                "target of {name}"
            ),
            "file" => {
                assert_eq!(e["size"], m.len(), "size of {name}");
                assert_eq!(e["mode"], m.mode() & 0o777, "mode of {name}");
                assert_eq!(e["mtime_nsec"], m.mtime_nsec(), "mtime_nsec of {name}");
            }
            _ => {}
        }
    }
}

#[test]
fn ls_lists_the_shared_tree_as_it_is() {
    let w = World::new();
    w.pair("a", "b");
    a_tree(&w);
    let (sharer, ready) = w.share("a", &[]);
    assert_eq!(ready["share"], "default");
    assert_eq!(ready["peers"], 1);
    for (target, dir) in [
        ("a", w.src()),
        ("a:docs", w.src().join("docs")),
        ("a:/docs/deep/", w.src().join("docs/deep")),
    ] {
        let out = w.ls("b", target, &[]);
        assert_success(target, &out);
        assert_listing(&dir, &entries(&out));
    }
    // A file shows its one entry.
    let out = w.ls("b", "a:docs/note.txt", &[]);
    assert_success("ls of a file", &out);
    let one = entries(&out);
    assert_eq!(one.len(), 1);
    assert_eq!(one["note.txt"]["size"], 12);
    // A path that is not there: a clear error, nothing listed.
    let out = w.ls("b", "a:nothing/here", &[]);
    assert_failure("ls of a missing path", &out, 1, "io");
    assert!(String::from_utf8_lossy(&out.stdout).contains("not-found"));
    assert!(entries(&out).is_empty());
    // A path out of the share is refused before anything is asked.
    let out = w.ls("b", "a:../etc", &[]);
    assert_failure("ls out of the share", &out, 2, "usage");
    // A symlink out of the share is listed, never followed: a request through it is refused and logged.
    fs::create_dir_all(w.path("secret")).unwrap();
    fs::write(w.path("secret/key"), b"private").unwrap();
    std::os::unix::fs::symlink(w.path("secret"), w.src().join("out")).unwrap();
    let listed = entries(&w.ls("b", "a", &[]));
    assert_eq!(listed["out"]["kind"], "symlink");
    let out = w.ls("b", "a:out/key", &[]);
    assert_failure(
        "ls through a symlink out of the share",
        &out,
        8,
        "unsafe-path",
    );
    assert!(entries(&out).is_empty());
    // A change in the share is seen by the next listing.
    fs::write(w.src().join("docs/new.txt"), b"new").unwrap();
    let out = w.ls("b", "a:docs", &[]);
    assert!(entries(&out).contains_key("new.txt"));

    let log = events(&stop_share(sharer).stdout);
    let connected: Vec<_> = log
        .iter()
        .filter(|e| e["event"] == "client-connected")
        .collect();
    assert!(connected.len() >= 5 && connected.iter().all(|e| e["peer"] == "b"));
    let refused: Vec<_> = log.iter().filter(|e| e["event"] == "refused").collect();
    assert_eq!(
        refused.len(),
        1,
        "only the request through the symlink: {log:?}"
    );
    assert!(refused[0]["reason"]
        .as_str()
        .unwrap()
        .contains("outside the share"));
}

#[test]
fn a_stolen_peer_list_without_the_identity_key_gets_nothing() {
    let w = World::new();
    w.pair("a", "b");
    a_tree(&w);
    // c holds b's peers (a's key and the pair's secret, in the clear); its own identity key is not b's.
    w.steal_peer_list("b", "c");
    let (mut sharer, _) = w.share("a", &[]);
    // c finds the share under the pair's hash, but its key is nobody a paired with.
    let out = w.ls("c", "a", &[]);
    assert!(!out.status.success(), "{out:?}");
    assert!(entries(&out).is_empty(), "nothing listed");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("is not paired there"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let refused = sharer.wait_for(|e| e["event"] == "refused");
    assert!(
        refused["reason"].as_str().unwrap().contains("not paired"),
        "{refused}"
    );
    // b, the real peer, is still served.
    assert_success("ls by the paired peer", &w.ls("b", "a", &[]));
    let log = events(&stop_share(sharer).stdout);
    assert_eq!(
        log.iter()
            .filter(|e| e["event"] == "client-connected")
            .count(),
        1,
        "only b was served: {log:?}"
    );
}

#[test]
fn an_unpaired_identity_at_the_address_is_refused_before_any_request() {
    let w = World::new();
    w.pair("a", "b");
    a_tree(&w);
    let (mut sharer, ready) = w.share("a", &[]);
    let addr = ready["listen"].as_str().unwrap().to_string();
    // c pins a's real key (copied from b's list) but shares no secret with a: it dials the address.
    let key = {
        let text = fs::read_to_string(w.path("config-b/ferry/peers.toml")).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("key"))
            .unwrap()
            .to_string();
        line
    };
    let dir = w.config_dir("c");
    let secret = "cd".repeat(32);
    fs::write(
        dir.join("peers.toml"),
        format!("[[peer]]\nname = \"a\"\n{key}\nsecret = \"{secret}\"\npaired_at = 1\n"),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir.join("peers.toml"), fs::Permissions::from_mode(0o600)).unwrap();
    let out = w.ls("c", "a", &["--peer", &addr]);
    assert!(!out.status.success());
    assert!(entries(&out).is_empty(), "nothing listed");
    let refused = sharer.wait_for(|e| e["event"] == "refused");
    assert!(refused["reason"].as_str().unwrap().contains("not paired"));
    let log = events(&stop_share(sharer).stdout);
    assert!(
        log.iter().all(|e| e["event"] != "client-connected"),
        "{log:?}"
    );
}

#[test]
fn a_stranger_learns_no_identity_from_a_share_and_the_paired_peer_still_connects() {
    use ferry_channel::{
        blocking, Auth, ChannelError, Config, Handshake, IdentityKey, PeerKey, Role,
    };
    let w = World::new();
    w.pair("a", "b");
    a_tree(&w);
    let (mut sharer, ready) = w.share("a", &[]);
    let addr = ready["listen"].as_str().unwrap().to_string();
    // A stranger with a fresh key, taking any key it is shown, completes the key exchange at the port.
    let stranger = Handshake::new(
        Role::Initiator,
        Config::ferry(),
        Auth::Identity {
            key: IdentityKey::generate(),
            peer: PeerKey::Any,
        },
    );
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let got = blocking::handshake_until(&mut stream, stranger, deadline);
    // What it received: a bare refusal (any identity message would have completed the handshake with the
    // sharer's key in `peer_identity`), so no key and no fingerprint.
    match got {
        Err(ChannelError::NotAdmitted) => {}
        Ok(est) => panic!(
            "a stranger completed the handshake and learned the sharer's key {:?}",
            est.peer_identity
        ),
        Err(e) => panic!("the stranger failed otherwise: {e}"),
    }
    let refused = sharer.wait_for(|e| e["event"] == "refused");
    assert!(
        refused["reason"].as_str().unwrap().contains("not paired"),
        "{refused}"
    );
    // The paired peer still connects, at the address and by its meeting.
    assert_success("ls at the address", &w.ls("b", "a", &["--peer", &addr]));
    assert_success("ls", &w.ls("b", "a", &[]));
    stop_share(sharer);
}

#[test]
fn allow_holds_the_key_of_the_name_it_was_given() {
    let w = World::new();
    w.pair("a", "b");
    w.pair("a", "c");
    a_tree(&w);
    let (sharer, ready) = w.share("a", &["--allow", "c"]);
    let addr = ready["listen"].as_str().unwrap().to_string();
    // Renamed on the sharer's side, c is still the peer it allowed; b renamed to c's old name is not.
    for (old, new) in [("c", "carol"), ("b", "c")] {
        let out = w
            .as_("a")
            .args(["peers", "rename", old, new])
            .output()
            .unwrap();
        assert_success("peers rename", &out);
    }
    assert_success("ls by the allowed key", &w.ls("c", "a", &[]));
    let out = w.ls("b", "a", &["--peer", &addr]);
    assert!(entries(&out).is_empty(), "b got in under c's old name");
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(
        events(&out.stdout)
            .iter()
            .any(|e| e["code"] == "not-admitted"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    stop_share(sharer);
}

#[test]
fn a_removed_or_not_allowed_peer_is_refused() {
    let w = World::new();
    w.pair("a", "b");
    w.pair("a", "c");
    a_tree(&w);
    let (mut sharer, ready) = w.share("a", &["--allow", "c"]);
    assert_eq!(ready["peers"], 1, "only c's meeting is announced");
    let addr = ready["listen"].as_str().unwrap().to_string();
    // b is paired but not allowed: even at the address, it gets nothing.
    let out = w.ls("b", "a", &["--peer", &addr]);
    assert!(!out.status.success() && entries(&out).is_empty());
    let refused = sharer.wait_for(|e| e["event"] == "refused");
    assert!(refused["reason"].as_str().unwrap().contains("--allow"));
    assert_success("ls by the allowed peer", &w.ls("c", "a", &[]));
    // Once removed, c is refused at once: the list is read again for every connection.
    let removed = w.as_("a").args(["peers", "remove", "c"]).output().unwrap();
    assert_success("peers remove", &removed);
    let out = w.ls("c", "a", &["--peer", &addr]);
    assert!(!out.status.success() && entries(&out).is_empty());
    let refused = sharer.wait_for(|e| e["event"] == "refused");
    assert!(refused["reason"].as_str().unwrap().contains("not paired"));
    stop_share(sharer);
}

#[test]
fn two_clients_list_at_once() {
    let w = World::new();
    w.pair("a", "b");
    w.pair("a", "c");
    a_tree(&w);
    for i in 0..200 {
        fs::write(w.src().join(format!("docs/file-{i:03}")), vec![b'x'; i]).unwrap();
    }
    let (sharer, _) = w.share("a", &[]);
    let lister = |who: &'static str| {
        let mut cmd = w.as_(who);
        cmd.args(["ls", "--json", "a:docs"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        finish_in_background(cmd.spawn().unwrap())
    };
    let (b, c) = (lister("b"), lister("c"));
    for out in [b.join().unwrap(), c.join().unwrap()] {
        assert_success("one of two clients", &out);
        assert_listing(&w.src().join("docs"), &entries(&out));
    }
    stop_share(sharer);
}

#[test]
fn a_share_behind_a_relay_serves_client_after_client() {
    let w = World::new();
    w.pair("a", "b");
    a_tree(&w);
    let mut relay = w.cmd();
    relay.args(["relay", "--listen", "127.0.0.1:0", "--stats-interval", "0"]);
    let relay = RelayProcess::spawn(relay);
    let at = relay.addr.to_string();
    let via = ["--relay", at.as_str(), "--force-relay"];
    let (sharer, ready) = w.share("a", &via);
    assert!(
        ready["listen"].is_null(),
        "no direct listener with --force-relay"
    );
    for _ in 0..2 {
        let out = w.ls("b", "a", &via);
        assert_success("ls through the relay", &out);
        assert_listing(&w.src(), &entries(&out));
    }
    let log = events(&stop_share(sharer).stdout);
    assert_eq!(connected_paths(&log), ["relay", "relay"]);
}

#[test]
fn sigterm_withdraws_every_announcement_and_sigusr1_prints_stats() {
    let w = World::new();
    w.pair("a", "b");
    a_tree(&w);
    let (mut sharer, _) = w.share("a", &[]);
    let registry = w.path("runtime/ferry/rendezvous");
    let announced = || -> Vec<_> {
        list_all(&registry)
            .into_iter()
            .filter(|p| !p.is_dir())
            .collect()
    };
    assert_eq!(announced().len(), 1, "the share is announced on this host");
    assert_success("ls", &w.ls("b", "a", &[]));
    sharer.signal(libc::SIGUSR1);
    let stats = sharer.wait_for(|e| e["event"] == "stats");
    assert_eq!(stats["sessions"], 1);
    assert!(stats["bytes_sent"].as_u64().unwrap() > 0);
    let log = events(&stop_share(sharer).stdout);
    assert!(event(&log, "stopped").is_some());
    assert!(
        announced().is_empty(),
        "registry entries left: {:?}",
        announced()
    );
}

/// A share session opened in this process as installation `who`'s ferry would: its identity, its pairing
/// with `sharer`, the meeting of the share `share`, dialled at `addr` (what `ferry mount` will write through).
fn session_as(
    w: &World,
    who: &str,
    sharer: &str,
    share: &str,
    addr: &str,
) -> ferry_share::io::Session<std::net::TcpStream, std::net::TcpStream> {
    use ferry_channel::{Auth, IdentityKey};
    let dir = w.config_dir(who);
    let (key, _) = ferry_peers::identity::load_or_create(&dir).unwrap();
    let peer = ferry_peers::PeerStore::load(&dir)
        .unwrap()
        .get(sharer)
        .unwrap()
        .clone();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (hash, also) =
        ferry_peers::meeting::hashes_to_try(&peer.secret, &format!("share:{share}"), now);
    let (seed, pinned) = (*key.seed(), peer.key);
    let meeting = ferry_session::Meeting {
        hash,
        also: also.to_vec(),
        label: format!("share:{share} with {sharer}"),
        waited_for: "sharer".into(),
        other_side: "`ferry share`".into(),
        auth: ferry_session::MeetingAuth::Other(std::sync::Arc::new(move || Auth::Identity {
            key: IdentityKey::from_seed(seed),
            peer: ferry_channel::PeerKey::Pinned(pinned),
        })),
    };
    let opts = ferry_session::PeerOptions {
        relay: None,
        force_relay: false,
        no_discovery: true,
    };
    let addr = addr.parse().unwrap();
    let wait = std::time::Duration::from_secs(10);
    let connected = ferry_session::connect(&meeting, &opts, Some(addr), wait, &mut ()).unwrap();
    let (reader, writer) =
        ferry_channel::blocking::split_tcp(connected.stream, connected.established).unwrap();
    ferry_share::io::Session::open(reader, writer, 8).unwrap()
}

#[test]
fn a_writable_share_takes_writes_from_a_paired_peer_and_keeps_both_sides_of_a_conflict() {
    use ferry_share::server::PutOutcome;
    use ferry_share::wire::{ErrorCode, SharePath};
    let w = World::new();
    w.pair("a", "b");
    a_tree(&w);
    let (mut sharer, ready) = w.share("a", &["--writable"]);
    assert_eq!(ready["writable"], true, "{ready}");
    let mut session = session_as(&w, "b", "a", "default", ready["listen"].as_str().unwrap());
    let path = |s: &str| SharePath::new(s.as_bytes()).unwrap();
    let local = w.path("local.txt");

    // A new file, a directory, a rename.
    fs::write(&local, b"written by b\n").unwrap();
    let file = fs::File::open(&local).unwrap();
    let out = session.put_file(path("docs/from-b.txt"), None, &file, 0o644, None);
    assert_eq!(out.unwrap(), PutOutcome::Written);
    assert_eq!(
        fs::read(w.src().join("docs/from-b.txt")).unwrap(),
        b"written by b\n"
    );
    session.mkdir(path("made"), 0o755).unwrap();
    session
        .rename(path("docs/from-b.txt"), path("made/b.txt"), false)
        .unwrap();
    assert_eq!(
        fs::read(w.src().join("made/b.txt")).unwrap(),
        b"written by b\n"
    );

    // The sharer's file changed after b's copy was taken: both stay, and the sharer logs it.
    let base = *blake3::hash(b"hello share\n").as_bytes();
    fs::write(w.src().join("docs/note.txt"), b"changed by a\n").unwrap();
    let out = session.put_file(path("docs/note.txt"), Some(base), &file, 0o644, None);
    let PutOutcome::Conflicted(name) = out.unwrap() else {
        panic!("no conflict");
    };
    let name = String::from_utf8(name).unwrap();
    assert!(name.starts_with("note.txt.conflict-b-"), "{name}");
    assert_eq!(
        fs::read(w.src().join("docs/note.txt")).unwrap(),
        b"changed by a\n"
    );
    assert_eq!(
        fs::read(w.src().join("docs").join(&name)).unwrap(),
        b"written by b\n"
    );
    let conflict = sharer.wait_for(|e| e["event"] == "conflict");
    assert_eq!(conflict["peer"], "b");
    assert!(
        conflict["message"].as_str().unwrap().contains(&name),
        "{conflict}"
    );
    drop(session);
    stop_share(sharer);

    // Without --writable, every write is refused.
    let (sharer, ready) = w.share("a", &[]);
    assert_eq!(ready["writable"], false, "{ready}");
    let mut session = session_as(&w, "b", "a", "default", ready["listen"].as_str().unwrap());
    match session.mkdir(path("again"), 0o755) {
        Err(ferry_share::io::SessionError::Remote(ErrorCode::ReadOnly, _)) => {}
        other => panic!("{other:?}"),
    }
    let out = session.put_file(path("docs/note.txt"), None, &file, 0o644, None);
    assert!(matches!(
        out,
        Err(ferry_share::io::SessionError::Remote(
            ErrorCode::ReadOnly,
            _
        ))
    ));
    assert!(!w.src().join("again").exists());
    drop(session);
    stop_share(sharer);
}

#[test]
fn a_sharer_of_another_share_at_the_address_is_refused() {
    let w = World::new();
    w.pair("a", "b");
    a_tree(&w);
    let (sharer, ready) = w.share("a", &[]);
    assert_eq!(ready["share"], "default");
    let addr = ready["listen"].as_str().unwrap().to_string();
    let (pulled, mnt) = (w.path("pulled"), w.path("mnt"));
    fs::create_dir_all(&mnt).unwrap();
    // Asked for "photos" at the address where "default" runs: ls, pull and mount each refuse it (mount
    // before anything is mounted) instead of serving the other share.
    let ls = w.ls("b", "a", &["--share", "photos", "--peer", &addr]);
    let mut pull = w.as_("b");
    pull.args([
        "pull",
        "--json",
        "--share",
        "photos",
        "--peer",
        &addr,
        "a:docs/note.txt",
    ]);
    let pull = finish(pull.arg(&pulled).stdout(Stdio::piped()).spawn().unwrap());
    let mut mount = w.as_("b");
    mount.args(["mount", "--json", "--peer", &addr, "a:photos"]);
    let mount = finish(mount.arg(&mnt).stdout(Stdio::piped()).spawn().unwrap());
    for (what, out) in [("ls", &ls), ("pull", &pull), ("mount", &mount)] {
        assert_failure(what, out, 1, "error");
        let evs = events(&out.stdout);
        let message = event(&evs, "error").unwrap()["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            message.contains("\"default\", not \"photos\""),
            "{what}: {message}"
        );
    }
    assert!(entries(&ls).is_empty());
    assert!(!pulled.exists(), "nothing pulled");
    assert!(
        fs::read_dir(&mnt).unwrap().next().is_none(),
        "nothing mounted"
    );
    // The share's own name still works at the same address.
    assert_success(
        "ls of the share that runs there",
        &w.ls("b", "a", &["--peer", &addr]),
    );
    stop_share(sharer);
}

#[test]
fn a_sharer_whose_directory_is_removed_stops_and_says_why() {
    let w = World::new();
    w.pair("a", "b");
    a_tree(&w);
    let (sharer, _) = w.share("a", &[]);
    assert_success("ls before", &w.ls("b", "a", &[]));
    // Served on, the share would list an empty, deleted directory (even once DIR is made again).
    fs::remove_dir_all(w.src()).unwrap();
    let out = sharer.finish();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let ev = events(&out.stdout);
    let error = event(&ev, "error").expect("an error event");
    assert_eq!(error["code"], "io");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "the shared directory {} was removed: stopped sharing it",
            w.src().display()
        )),
        "{message}"
    );
    fs::create_dir_all(w.src()).unwrap();
    assert_failure(
        "ls after",
        &w.ls("b", "a", &["--wait", "1"]),
        4,
        "peer-not-found",
    );
}

/// Issue 45: `ferry ls` prints the listing only (how the sharer was reached with `-v`), sizes in binary
/// units on a terminal, and exact bytes to a pipe or with `--bytes`.
#[test]
fn ls_shows_human_sizes_on_a_terminal_and_the_path_with_v() {
    let w = World::new();
    w.pair("a", "b");
    fs::File::create(w.src().join("big.img"))
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let (sharer, _) = w.share("a", &[]);
    let ls = |extra: &[&str]| {
        let out = w.as_("b").arg("ls").arg("a").args(extra).output().unwrap();
        assert_success("ls", &out);
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (listing, said) = ls(&[]);
    assert!(listing.contains(" 2147483648 "), "{listing}");
    assert!(!said.contains("Connected"), "{said}");
    let (_, said) = ls(&["-v"]);
    assert!(said.contains("Connected directly"), "{said}");

    let on_terminal = |extra: &str| {
        let b = |dir: &str| shell_quote(&w.path(&format!("{dir}-b")).display().to_string());
        let line = format!(
            "XDG_CONFIG_HOME={} XDG_CACHE_HOME={} {} ls a{extra}",
            b("config"),
            b("cache"),
            shell_quote(&ferry().display().to_string())
        );
        let (status, text) = Pty::spawn_line(&w, &line).finish();
        assert_eq!(status, Some(0), "{text}");
        text
    };
    let text = on_terminal("");
    assert!(
        text.contains("2.00 GiB") && !text.contains("2147483648") && !text.contains("Connected"),
        "{text}"
    );
    assert!(on_terminal(" --bytes").contains(" 2147483648 "));
    stop_share(sharer);
}

#[test]
fn ls_refuses_a_listing_larger_than_max_listing() {
    let w = World::new();
    w.pair("a", "b");
    for i in 0..100 {
        fs::write(w.src().join(format!("file-{i:03}")), b"x").unwrap();
    }
    let (sharer, _) = w.share("a", &[]);
    let out = w.ls("b", "a", &["--max-listing", "4KiB"]);
    assert_failure("ls over --max-listing", &out, 8, "protocol");
    assert!(entries(&out).is_empty(), "nothing listed");
    assert!(String::from_utf8_lossy(&out.stdout).contains("more than 4096 bytes"));
    assert_eq!(entries(&w.ls("b", "a", &[])).len(), 100);
    stop_share(sharer);
}
