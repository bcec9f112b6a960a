//! `ferry id` and `ferry peers` against real config files.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use common::{assert_failure, events, World};
use serde_json::Value;

fn run_json(w: &World, args: &[&str]) -> Value {
    let out = w.cmd().args(args).arg("--json").output().unwrap();
    assert!(
        out.status.success(),
        "ferry {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Writes a peer list by hand, in the documented format, until pairing fills it.
fn write_peers(w: &World, names: &[(&str, u8)]) {
    let dir = w.path("config/ferry");
    fs::create_dir_all(&dir).unwrap();
    let mut text = String::new();
    for (name, k) in names {
        let key = format!("{k:02x}").repeat(32);
        let secret = format!("{:02x}", k ^ 0xff).repeat(32);
        text += &format!(
            "[[peer]]\nname = \"{name}\"\nkey = \"{key}\"\nsecret = \"{secret}\"\npaired_at = 1795000000\n"
        );
    }
    let path = dir.join("peers.toml");
    fs::write(&path, text).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn id_creates_the_key_once_and_prints_the_same_fingerprint() {
    let w = World::new();
    let first = run_json(&w, &["id"]);
    assert_eq!(first["created"], true);
    let words = first["fingerprint"].as_str().unwrap();
    assert_eq!(words.split(' ').count(), 8, "{words}");
    let again = run_json(&w, &["id"]);
    assert_eq!(again["created"], false);
    assert_eq!(again["fingerprint"], first["fingerprint"]);
    let mode = fs::metadata(w.path("config/ferry/identity"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let text = w.cmd().arg("id").output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains(words));
}

#[test]
fn an_identity_readable_by_others_is_refused() {
    let w = World::new();
    run_json(&w, &["id"]);
    let path = w.path("config/ferry/identity");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
    let out = w.cmd().args(["id", "--json"]).output().unwrap();
    assert_failure("exposed identity", &out, 1, "error");
    assert!(String::from_utf8_lossy(&out.stdout).contains("chmod 600"));
}

#[test]
fn peers_are_listed_renamed_and_removed() {
    let w = World::new();
    let empty = w.cmd().arg("peers").output().unwrap();
    assert!(String::from_utf8_lossy(&empty.stdout).contains("No paired peers"));

    write_peers(&w, &[("laptop", 1), ("nas", 2)]);
    let listed = run_json(&w, &["peers"]);
    let names: Vec<&str> = listed["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["laptop", "nas"]);
    assert_eq!(
        listed["peers"][0]["fingerprint"]
            .as_str()
            .unwrap()
            .split(' ')
            .count(),
        8
    );

    run_json(&w, &["peers", "rename", "laptop", "work"]);
    let clash = w
        .cmd()
        .args(["peers", "rename", "work", "nas", "--json"])
        .output()
        .unwrap();
    assert_failure("rename onto a taken name", &clash, 2, "usage");
    let bad = w
        .cmd()
        .args(["peers", "rename", "work", "../x", "--json"])
        .output()
        .unwrap();
    assert_failure("unsafe name", &bad, 2, "usage");

    run_json(&w, &["peers", "remove", "nas"]);
    let missing = w
        .cmd()
        .args(["peers", "remove", "nas", "--json"])
        .output()
        .unwrap();
    assert_failure("remove twice", &missing, 2, "usage");
    let left = run_json(&w, &["peers"]);
    let peers = left["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 1);
    assert_eq!(peers[0]["name"], "work");
    assert_eq!(peers[0]["key"], "01".repeat(32));
    // Nothing else in the list changed; the hand-written secret was sealed on the first read, and the file
    // stays private.
    let text = fs::read_to_string(w.path("config/ferry/peers.toml")).unwrap();
    assert!(
        !text.contains("nas") && !text.contains(&"fe".repeat(32)),
        "{text}"
    );
    let store = ferry_peers::PeerStore::load(&w.path("config/ferry")).unwrap();
    assert_eq!(store.get("work").unwrap().secret.0, [0xfe; 32]);
    let mode = fs::metadata(w.path("config/ferry/peers.toml"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_damaged_peer_list_is_reported_not_overwritten() {
    let w = World::new();
    write_peers(&w, &[("laptop", 1)]);
    let path = w.path("config/ferry/peers.toml");
    let damaged = fs::read_to_string(&path)
        .unwrap()
        .replace("laptop", "lap top");
    fs::write(&path, &damaged).unwrap();
    let out = w
        .cmd()
        .args(["peers", "remove", "lap", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let ev = events(&out.stdout);
    assert!(
        ev[0]["message"].as_str().unwrap().contains("damaged"),
        "{ev:?}"
    );
    assert_eq!(fs::read_to_string(&path).unwrap(), damaged);
}
