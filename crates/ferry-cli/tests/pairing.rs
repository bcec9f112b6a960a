//! `ferry pair` between two installations on this host (two config directories, one rendezvous directory).

mod common;

use std::fs;

use common::{assert_failure, assert_success, event, events, finish, World};
use serde_json::Value;

fn peers_of(w: &World, who: &str) -> Vec<Value> {
    let out = w.as_(who).args(["peers", "--json"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["peers"].as_array().unwrap().clone()
}

#[test]
fn two_machines_pair_and_each_pins_the_others_key() {
    let w = World::new();
    let (fa, ka) = w.identity("a");
    let (fb, kb) = w.identity("b");
    let (a, code) = w.start_pairing("a", &["--name", "bob"]);
    let b = w
        .as_("b")
        .args(["pair", &code, "--json", "--name", "alice"])
        .output()
        .unwrap();
    let a = a.finish();
    for (who, out) in [("a", &a), ("b", &b)] {
        assert!(
            out.status.success(),
            "{who}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let paired_a = events(&a.stdout);
    let paired_a = event(&paired_a, "paired").unwrap();
    assert_eq!(paired_a["name"], "bob");
    assert_eq!(paired_a["fingerprint"], fb.as_str());
    assert_eq!(paired_a["own_fingerprint"], fa.as_str());
    let paired_b = events(&b.stdout);
    assert_eq!(
        event(&paired_b, "paired").unwrap()["fingerprint"],
        fa.as_str()
    );

    let at_a = peers_of(&w, "a");
    let at_b = peers_of(&w, "b");
    assert_eq!((at_a.len(), at_b.len()), (1, 1));
    assert_eq!(at_a[0]["name"], "bob");
    assert_eq!(at_a[0]["key"], kb.as_str());
    assert_eq!(at_b[0]["name"], "alice");
    assert_eq!(at_b[0]["key"], ka.as_str());
    // Both stored the same secret, which neither key determines (each sealed with its own identity key).
    let secret = |who: &str, peer: &str| {
        let store = ferry_peers::PeerStore::load(&w.path(&format!("config-{who}/ferry"))).unwrap();
        let s = store.get(peer).unwrap().secret.0;
        s.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    assert_eq!(secret("a", "bob"), secret("b", "alice"));
    assert!(secret("a", "bob") != ka && secret("a", "bob") != kb);
}

#[test]
fn a_wrong_code_pairs_nobody() {
    let w = World::new();
    let (a, code) = w.start_pairing("a", &[]);
    // The same nameplate and first word (so the two meet), other words: the PAKE fails.
    let mut parts: Vec<&str> = code.split('-').collect();
    parts[3] = if parts[3] == "zoo" { "zone" } else { "zoo" };
    let wrong = parts.join("-");
    let b = w
        .as_("b")
        .args(["pair", &wrong, "--json"])
        .output()
        .unwrap();
    let a = a.finish();
    assert_failure("joiner with a wrong code", &b, 3, "wrong-code");
    assert_failure("code holder", &a, 3, "wrong-code");
    // Issue 45: the code holder ran `ferry pair`, and that is what it must run again.
    let holder = String::from_utf8_lossy(&a.stdout);
    assert!(
        holder.contains("start a new `ferry pair`") && !holder.contains("ferry send"),
        "{holder}"
    );
    assert!(peers_of(&w, "a").is_empty());
    assert!(peers_of(&w, "b").is_empty());
}

#[test]
fn a_name_taken_on_one_side_stops_both() {
    let w = World::new();
    // b already knows another machine as "alice".
    let dir = w.path("config-b/ferry");
    fs::create_dir_all(&dir).unwrap();
    let other = "ab".repeat(32);
    fs::write(
        dir.join("peers.toml"),
        format!(
            "[[peer]]\nname = \"alice\"\nkey = \"{other}\"\nsecret = \"{other}\"\npaired_at = 1\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir.join("peers.toml"), fs::Permissions::from_mode(0o600)).unwrap();

    let (a, code) = w.start_pairing("a", &[]);
    let b = w
        .as_("b")
        .args(["pair", &code, "--json", "--name", "alice"])
        .output()
        .unwrap();
    let a = a.finish();
    assert_failure("the side with the clash", &b, 2, "usage");
    assert_eq!(
        a.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&a.stdout)
    );
    assert!(String::from_utf8_lossy(&a.stdout).contains("refused the pairing"));
    assert!(
        peers_of(&w, "a").is_empty(),
        "nothing stored on the other side"
    );
    assert_eq!(peers_of(&w, "b").len(), 1, "the existing peer is untouched");
}

/// Issue 45: a pairing that finds nobody names `ferry pair`, not `ferry send`.
#[test]
fn a_pairing_that_finds_nobody_names_ferry_pair() {
    let w = World::new();
    let out = w
        .as_("b")
        .args(["pair", "31-apple-orbit-violin", "--json", "--wait", "0"])
        .output()
        .unwrap();
    assert_failure("pair with nobody there", &out, 4, "peer-not-found");
    let message = String::from_utf8_lossy(&out.stdout);
    assert!(
        message.contains("is `ferry pair` running?") && !message.contains("ferry send"),
        "{message}"
    );
}

/// Issue 45: `pair --listen` prints the `--peer` command as `send --listen` does, and that line, pasted,
/// pairs.
#[test]
fn pair_listen_prints_a_peer_command_that_works() {
    let w = World::new();
    let mut a = w
        .as_("a")
        .args(["pair", "--listen", "127.0.0.1:0", "--name", "b"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read on a thread, so that a side that never prints the line fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = a.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = String::new();
    let command = loop {
        let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(10)) else {
            let _ = a.kill();
            panic!("no --peer command: {seen}");
        };
        seen.push_str(&line);
        seen.push('\n');
        if let Some((_, rest)) = line.split_once("(ferry pair --peer ") {
            break format!("--peer {}", rest.trim_end().trim_end_matches(')'));
        }
    };
    let args: Vec<&str> = command.split(' ').collect();
    let b = w
        .as_("b")
        .arg("pair")
        .args(&args)
        .args(["--json", "--name", "a"])
        .output()
        .unwrap();
    assert_success(&format!("ferry pair {command}"), &b);
    let a = finish(a);
    assert!(a.status.success(), "{seen}");
    assert_eq!(peers_of(&w, "a").len(), 1);
}
