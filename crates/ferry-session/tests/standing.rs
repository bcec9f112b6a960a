//! A `Standing` waiting side behind a real relay on loopback: it serves peer after peer under several hashes,
//! reports each peer's identity, is found by a looking side through a meeting's other hashes, and registers
//! again when the relay restarts.

use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use ferry_channel::{Auth, IdentityKey, PeerKey};
use ferry_relay::{Relay, RelayConfig, RelayHandle};
use ferry_rendezvous::NameplateHash;
use ferry_session::{connect, Meeting, MeetingAuth, PeerOptions, Standing};

/// Far more than any step needs: only a hang goes past it.
const WAIT: Duration = Duration::from_secs(30);

fn relay_on(addr: &str) -> (SocketAddr, RelayHandle) {
    let config = RelayConfig {
        print_stats: false,
        worker_threads: 1,
        shutdown_grace: Duration::from_millis(100),
        ..RelayConfig::default()
    };
    // The port of a relay that just stopped may take a moment to be free again.
    let relay = (0..100)
        .find_map(|_| {
            Relay::bind(addr, config.clone())
                .map_err(|_| thread::sleep(Duration::from_millis(50)))
                .ok()
        })
        .expect("bind the relay");
    let (at, handle) = (relay.local_addr(), relay.shutdown_handle());
    thread::spawn(move || relay.run_blocking());
    (at, handle)
}

fn identity(key: [u8; 32], pinned: Option<[u8; 32]>) -> MeetingAuth {
    MeetingAuth::Other(Arc::new(move || Auth::Identity {
        key: IdentityKey::from_seed(key),
        peer: pinned.map_or(PeerKey::Any, PeerKey::Pinned),
    }))
}

fn opts(relay: SocketAddr) -> PeerOptions {
    PeerOptions {
        relay: Some(relay.to_string()),
        force_relay: true,
        no_discovery: true,
    }
}

/// A client with key `seed` looks for the server (pinned) under `hash`, then `also`; returns the server's key
/// as the client saw it.
fn look(
    relay: SocketAddr,
    seed: [u8; 32],
    server: [u8; 32],
    hash: NameplateHash,
    also: Vec<NameplateHash>,
) -> thread::JoinHandle<Option<[u8; 32]>> {
    thread::spawn(move || {
        let meeting = Meeting {
            hash,
            also,
            label: "test".into(),
            waited_for: "sharer".into(),
            other_side: "a test's standing side".into(),
            auth: identity(seed, Some(server)),
        };
        let c = connect(&meeting, &opts(relay), None, WAIT, &mut ()).expect("client connects");
        c.established.peer_identity
    })
}

#[test]
fn a_standing_side_serves_peer_after_peer_and_outlives_a_relay_restart() {
    let (relay, handle) = relay_on("127.0.0.1:0");
    let (server, alice, bob) = ([1u8; 32], [2u8; 32], [3u8; 32]);
    let server_key = IdentityKey::from_seed(server).public();
    let (h_alice, h_bob) = (NameplateHash([10; 32]), NameplateHash([11; 32]));
    let source = Arc::new(move || vec![h_alice, h_bob]);
    let mut standing = Standing::start(source, identity(server, None), &opts(relay), None, &mut ())
        .expect("standing side starts");
    assert_eq!(standing.hashes().len(), 2);
    assert!(standing.listen.is_none(), "relay only");

    let (tx, rx) = mpsc::channel();
    let server_thread = thread::spawn(move || {
        for _ in 0..3 {
            let c = standing.accept(&mut ()).expect("accept");
            tx.send(c.established.peer_identity).unwrap();
        }
        standing
    });
    // Alice under her hash; Bob under an unknown hash first and his own among the others.
    let seen = look(relay, alice, server_key, h_alice, vec![])
        .join()
        .unwrap();
    assert_eq!(seen, Some(server_key));
    let unknown = NameplateHash([99; 32]);
    let seen = look(relay, bob, server_key, unknown, vec![h_bob])
        .join()
        .unwrap();
    assert_eq!(seen, Some(server_key));
    let mut peers = vec![rx.recv().unwrap().unwrap(), rx.recv().unwrap().unwrap()];
    peers.sort();
    let mut want = vec![
        IdentityKey::from_seed(alice).public(),
        IdentityKey::from_seed(bob).public(),
    ];
    want.sort();
    assert_eq!(peers, want, "each peer's key is reported");

    // The relay restarts on the same address: the standing side registers again and Alice finds it.
    handle.shutdown();
    let (again, handle) = relay_on(&relay.to_string());
    assert_eq!(again, relay);
    let seen = look(relay, alice, server_key, h_alice, vec![])
        .join()
        .unwrap();
    assert_eq!(seen, Some(server_key));
    assert_eq!(
        rx.recv().unwrap(),
        Some(IdentityKey::from_seed(alice).public())
    );
    drop(server_thread.join().unwrap());
    handle.shutdown();
}

#[test]
fn a_standing_side_follows_its_hashes_as_they_change() {
    let (relay, handle) = relay_on("127.0.0.1:0");
    let (server, alice) = ([4u8; 32], [5u8; 32]);
    let server_key = IdentityKey::from_seed(server).public();
    let (old, new) = (NameplateHash([20; 32]), NameplateHash([21; 32]));
    let current = Arc::new(Mutex::new(vec![old]));
    let source = {
        let current = Arc::clone(&current);
        Arc::new(move || current.lock().unwrap().clone())
    };
    let mut standing =
        Standing::start(source, identity(server, None), &opts(relay), None, &mut ()).unwrap();
    standing.renew_every(Duration::from_millis(50));
    let (tx, rx) = mpsc::channel();
    let server_thread = thread::spawn(move || {
        let c = standing.accept(&mut ()).expect("accept");
        tx.send(c.established.peer_identity).unwrap();
        standing
    });
    // The window turns: the new hash is announced, the old one withdrawn.
    *current.lock().unwrap() = vec![new];
    let seen = look(relay, alice, server_key, new, vec![]).join().unwrap();
    assert_eq!(seen, Some(server_key));
    assert_eq!(
        rx.recv().unwrap(),
        Some(IdentityKey::from_seed(alice).public())
    );
    let standing = server_thread.join().unwrap();
    assert_eq!(standing.hashes(), &[new][..]);
    let meeting = Meeting {
        hash: old,
        also: vec![],
        label: "the old window".into(),
        waited_for: "sharer".into(),
        other_side: "a test's standing side".into(),
        auth: identity(alice, Some(server_key)),
    };
    let stale = connect(&meeting, &opts(relay), None, Duration::ZERO, &mut ());
    assert!(stale.is_err(), "nobody waits under the old hash");
    drop(standing);
    handle.shutdown();
}
