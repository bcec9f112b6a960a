//! A share served over a real encrypted channel on loopback TCP, both sides authenticated by pinned identity
//! keys, with real files.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use ferry_channel::IdentityKey;
use ferry_share::io::{Changes, Session, SessionError};
use ferry_share::wire::{ErrorCode, Kind, SharePath};
use ferry_testkit::pseudo_random;

struct Sharer {
    dir: ferry_testkit::TempDir,
    inner: common::Sharer,
    _watch: ferry_share::watch::Watcher,
}

impl std::ops::Deref for Sharer {
    type Target = common::Sharer;
    fn deref(&self) -> &common::Sharer {
        &self.inner
    }
}

/// Shares a fresh directory; accepts one client whose key is `client`.
fn start(client: [u8; 32]) -> Sharer {
    let dir = ferry_testkit::temp_dir("ferry-share-");
    let share = dir.path().join("share");
    std::fs::create_dir_all(share.join("docs")).unwrap();
    std::fs::write(
        share.join("big.bin"),
        pseudo_random(3 * 1024 * 1024 + 777, 5),
    )
    .unwrap();
    std::fs::write(share.join("docs/note.txt"), b"hello from the sharer").unwrap();
    std::fs::write(dir.path().join("secret"), b"not shared").unwrap();
    std::os::unix::fs::symlink("../secret", share.join("escape")).unwrap();
    let changes = Changes::default();
    let publisher = changes.clone();
    let watch = ferry_share::watch::watch(
        &share,
        Duration::from_millis(50),
        move |paths| publisher.publish(paths),
        |_| {},
    )
    .unwrap();
    let inner = common::start_sharer(&share, &dir.path().join("cache"), client, changes);
    Sharer {
        dir,
        inner,
        _watch: watch,
    }
}

fn connect(s: &Sharer, key: IdentityKey) -> Result<Session<TcpStream, TcpStream>, SessionError> {
    let (reader, writer) = common::channel(s, key)?;
    Session::open(reader, writer, 64)
}

fn p(s: &str) -> SharePath {
    SharePath::new(s.as_bytes()).unwrap()
}

#[test]
fn a_paired_client_lists_stats_and_pulls_verified_files() {
    let me = IdentityKey::generate();
    let sharer = start(me.public());
    let mut session = connect(&sharer, me).unwrap();
    let names: Vec<(String, Kind)> = session
        .list_all(SharePath::root())
        .unwrap()
        .into_iter()
        .map(|e| (String::from_utf8_lossy(&e.name).into_owned(), e.kind))
        .collect();
    assert_eq!(
        names,
        [
            ("big.bin".to_string(), Kind::File),
            ("docs".to_string(), Kind::Dir),
            ("escape".to_string(), Kind::Symlink)
        ]
    );
    assert_eq!(session.stat(p("docs/note.txt")).unwrap().size, 21);

    let out_path = sharer.dir.path().join("pulled.bin");
    let mut out = std::fs::File::create(&out_path).unwrap();
    let version = session
        .read_into(p("big.bin"), 0, u64::MAX, &mut out)
        .unwrap();
    let original = std::fs::read(sharer.dir.path().join("share/big.bin")).unwrap();
    assert_eq!(std::fs::read(&out_path).unwrap(), original);
    assert_eq!(version.root, *blake3::hash(&original).as_bytes());

    // A range from the middle, and a request that tries to leave the share.
    let mut part = std::fs::File::create(sharer.dir.path().join("part")).unwrap();
    session
        .read_into(p("big.bin"), 1_000_000, 5000, &mut part)
        .unwrap();
    let got = std::fs::read(sharer.dir.path().join("part")).unwrap();
    assert_eq!(&got[1_000_000..], &original[1_000_000..1_005_000]);
    let err = session
        .read_into(p("escape"), 0, 10, &mut part)
        .unwrap_err();
    assert!(
        matches!(err, SessionError::Remote(ErrorCode::UnsafePath, _)),
        "{err}"
    );
    assert!(sharer
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("refused") && l.contains("escape")));
}

#[test]
fn a_subscribed_client_hears_of_a_write_on_the_sharer() {
    let me = IdentityKey::generate();
    let sharer = start(me.public());
    let stream_timeout = Duration::from_secs(10);
    let mut session = connect(&sharer, me).unwrap();
    session.client().subscribe().unwrap();
    // A stat round trip makes sure the subscription is in place before the write.
    session.stat(SharePath::root()).unwrap();
    let started = Instant::now();
    std::fs::write(sharer.dir.path().join("share/docs/new.txt"), b"fresh").unwrap();
    loop {
        assert!(started.elapsed() < stream_timeout, "no change announced");
        if let ferry_share::client::Event::Changed { paths } = session.next_event().unwrap() {
            if paths.contains(&p("docs/new.txt")) {
                break;
            }
        }
    }
}

#[test]
fn an_unpaired_key_gets_nothing() {
    let paired = IdentityKey::generate();
    let sharer = start(paired.public());
    let stranger = IdentityKey::generate();
    let err = connect(&sharer, stranger).err().expect("refused");
    assert!(matches!(err, SessionError::Channel(_)), "{err}");
}

#[test]
fn two_clients_read_at_once() {
    let me = IdentityKey::generate();
    let sharer = start(me.public());
    let original = std::fs::read(sharer.dir.path().join("share/big.bin")).unwrap();
    let results: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let (sharer, key) = (&sharer, IdentityKey::from_seed(*me.seed()));
                s.spawn(move || {
                    let mut session = connect(sharer, key).unwrap();
                    let out_path = sharer.dir.path().join(format!("pulled{i}"));
                    let mut out = std::fs::File::create(&out_path).unwrap();
                    session
                        .read_into(p("big.bin"), 0, u64::MAX, &mut out)
                        .unwrap();
                    std::fs::read(&out_path).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for got in results {
        assert!(got == original, "each client got the whole file");
    }
}
