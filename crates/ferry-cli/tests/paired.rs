//! `ferry send --to NAME` / `ferry receive --from NAME` between installations paired with real `ferry pair`
//! processes (each its own config directory, one rendezvous directory): no code, either side first, and an
//! impostor holding a copy of the pair's secret is refused.

mod common;

use std::fs;
use std::process::{Child, Stdio};

use common::*;

fn send_to(w: &World, who: &str, peer: &str) -> Child {
    w.as_(who)
        .args(["send", "--json", "--to", peer])
        .arg(w.src())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn receive_from(w: &World, who: &str, peer: &str, wait: &str) -> Child {
    w.as_(who)
        .args([
            "receive", "--json", "--yes", "--wait", wait, "--from", peer, "--out",
        ])
        .arg(w.out())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn some_files(w: &World) {
    fs::create_dir_all(w.src().join("sub")).unwrap();
    fs::write(
        w.src().join("a.bin"),
        ferry_testkit::pseudo_random(300_000, 1),
    )
    .unwrap();
    fs::write(w.src().join("sub/b.txt"), b"paired\n").unwrap();
}

#[test]
fn the_sender_waits_and_the_receiver_finds_it_without_a_code() {
    let w = World::new();
    w.pair("a", "b");
    some_files(&w);
    let mut sender = Watched::new(send_to(&w, "a", "b"));
    let waiting = sender.wait_for(|e| e["event"] == "waiting");
    assert_eq!(waiting["peer"], "b");
    let received = finish(receive_from(&w, "b", "a", "30s"));
    let sent = sender.finish();
    assert_success("receive --from", &received);
    assert_success("send --to", &sent);
    assert!(event(&events(&sent.stdout), "code").is_none(), "no code");
    assert_same_tree(&w.src(), &w.out().join("src"));
    // Both sides recorded the session.
    let peers = w.as_("b").args(["peers", "--json"]).output().unwrap();
    let peers: serde_json::Value = serde_json::from_slice(&peers.stdout).unwrap();
    assert!(peers["peers"][0]["last_address"].is_string(), "{peers}");
}

#[test]
fn the_receiver_may_look_first_and_waits_for_the_sender() {
    let w = World::new();
    w.pair("a", "b");
    some_files(&w);
    let receiver = Watched::new(receive_from(&w, "b", "a", "60s"));
    // Time for the receiver's first rounds to find nobody (an order, not an assertion).
    std::thread::sleep(std::time::Duration::from_secs(2));
    let sent = finish(send_to(&w, "a", "b"));
    assert_success("send --to", &sent);
    let received = receiver.finish();
    assert_success("receive --from", &received);
    assert_same_tree(&w.src(), &w.out().join("src"));
}

#[test]
fn an_unknown_peer_name_is_a_usage_error_pointing_at_ferry_peers() {
    let w = World::new();
    some_files(&w);
    for args in [
        vec!["send", "--json", "--to", "nobody", "."],
        vec!["receive", "--json", "--from", "nobody"],
    ] {
        let out = w.as_("a").args(&args).output().unwrap();
        assert_failure("an unknown name", &out, 2, "usage");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("ferry peers"),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

#[test]
fn the_peer_lists_hold_no_pair_secret_and_a_copied_list_opens_nowhere_else() {
    let w = World::new();
    w.pair("a", "b");
    some_files(&w);
    let (dir_a, dir_b) = (w.config_dir("a"), w.config_dir("b"));
    // The pair secret, as each side opens it with its own identity key: the same on both.
    let secret = |dir: &std::path::Path, peer: &str| {
        let store = ferry_peers::PeerStore::load(dir).unwrap();
        let s = store.get(peer).unwrap().secret.0;
        s.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    let shared = secret(&dir_a, "b");
    assert_eq!(shared, secret(&dir_b, "a"));
    let (file_a, file_b) = (
        fs::read(dir_a.join("peers.toml")).unwrap(),
        fs::read(dir_b.join("peers.toml")).unwrap(),
    );
    let sealed = |file: &[u8]| -> Vec<String> {
        let text = String::from_utf8_lossy(file);
        assert!(
            !text.contains(&shared) && !text.contains(&shared.to_uppercase()),
            "the pair secret is in the clear:\n{text}"
        );
        assert!(!text.contains("secret ="), "{text}");
        text.lines()
            .filter_map(|l| l.strip_prefix("sealed = "))
            .map(str::to_string)
            .collect()
    };
    let (sealed_a, sealed_b) = (sealed(&file_a), sealed(&file_b));
    assert_eq!((sealed_a.len(), sealed_b.len()), (1, 1));
    assert_ne!(sealed_a, sealed_b, "each side seals with its own key");

    // The sealed lists still meet.
    let sender = send_to(&w, "a", "b");
    let received = finish(receive_from(&w, "b", "a", "30s"));
    assert_success("receive --from", &received);
    assert_success("send --to", &finish(sender));
    assert_same_tree(&w.src(), &w.out().join("src"));

    // A copy of a's list on another machine opens nothing, and says which peer and what to do.
    w.copy_peer_list("a", "c");
    for args in [
        vec!["peers", "--json"],
        vec!["send", "--json", "--to", "b", "."],
    ] {
        let out = w.as_("c").args(&args).output().unwrap();
        assert_failure("a copied peer list", &out, 1, "error");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("peer b does not open") && text.contains("ferry peers remove b"),
            "{args:?}: {text}"
        );
    }
    // Removing the peer is the way out.
    assert_success(
        "peers remove",
        &w.as_("c").args(["peers", "remove", "b"]).output().unwrap(),
    );
    assert_success("peers", &w.as_("c").args(["peers"]).output().unwrap());
}

#[test]
fn an_impostor_with_a_stolen_peer_list_is_refused_by_identity() {
    let w = World::new();
    w.pair("a", "b");
    some_files(&w);
    // c holds a's peers (b's key and the pair's secret, in the clear), but not a's identity key.
    w.steal_peer_list("a", "c");
    // c meets b under the pair's hash, as a would...
    let mut impostor = Watched::new(send_to(&w, "c", "b"));
    impostor.wait_for(|e| e["event"] == "waiting");
    // ...but b pins a's key, and c cannot sign as a.
    let received = finish(receive_from(&w, "b", "a", "0"));
    assert_failure(
        "receive --from a, met by c",
        &received,
        5,
        "identity-mismatch",
    );
    assert!(list_all(&w.out()).is_empty(), "nothing received");
    // The impostor's handshake may end before b checks its signature; b then hangs up on it.
    let impostor = impostor.finish();
    assert!(!impostor.status.success(), "the impostor sent nothing");
    assert!(event(&events(&impostor.stdout), "done").is_none());
}

#[test]
fn a_man_in_the_middle_of_the_pairing_shows_in_the_fingerprints_and_never_joins_the_real_pair() {
    let w = World::new();
    some_files(&w);
    // m holds a's code and answers it as if it were b; to b it offers a code of its own, as if it were a.
    let (a_side, a_code) = w.start_pairing("a", &["--name", "b"]);
    let m_to_a = w
        .as_("m")
        .args(["pair", &a_code, "--json", "--name", "a"])
        .output()
        .unwrap();
    assert_success("m pairs with a", &m_to_a);
    let a_side = a_side.finish();
    let (m_side, m_code) = w.start_pairing("m", &["--name", "b"]);
    let b_to_m = w
        .as_("b")
        .args(["pair", &m_code, "--json", "--name", "a"])
        .output()
        .unwrap();
    assert_success("b pairs with m", &b_to_m);
    m_side.finish();
    // What the two people compare aloud differs: each was shown m's fingerprint, not the other's.
    let [fa, fb, fm] = ["a", "b", "m"].map(|who| w.identity(who).0);
    let shown = |out: &std::process::Output| {
        event(&events(&out.stdout), "paired").unwrap()["fingerprint"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (at_a, at_b) = (shown(&a_side), shown(&b_to_m));
    assert_eq!((&at_a, &at_b), (&fm, &fm));
    assert!(at_a != fb && at_b != fa);
    // a and b never meet each other: they hold different secrets and pin m's key.
    let sender = Watched::new(send_to(&w, "a", "b"));
    let received = finish(receive_from(&w, "b", "a", "2s"));
    assert_failure("b looking for a", &received, 4, "peer-not-found");
    assert!(list_all(&w.out()).is_empty());
    sender.signal(libc::SIGTERM);
    let sent = sender.finish();
    assert!(event(&events(&sent.stdout), "connected").is_none());
}
