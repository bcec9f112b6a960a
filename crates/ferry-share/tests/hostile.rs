//! Hostile peers through the sans-IO core: a real share on disk ([`ShareRoot`], [`OutboardCache`], [`Files`])
//! behind a real [`Server`], fed crafted packets; and a real [`Client`] fed a lying sharer's packets. Every
//! packet goes through the real encoders and decoders; no sockets.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferry_share::client::{Client, ClientError, Event, Failure, Listing, ENTRY_COST};
use ferry_share::fs::{OutboardCache, ShareRoot};
use ferry_share::io::Files;
use ferry_share::server::{Server, ServerConfig, ServerError, DEFAULT_PIECE};
use ferry_share::tree::{encode_piece, Outboard, GROUP};
use ferry_share::wire::{self, Entry, ErrorCode, Kind, RequestId, Response, SharePath, END};
use ferry_testkit::pseudo_random;
use ferry_wire::Put;

/// What lies outside every share: no answer may ever contain it.
const SECRET: &[u8] = b"SECRET-OUTSIDE-THE-SHARE";

fn p(s: &str) -> SharePath {
    SharePath::new(s.as_bytes()).unwrap()
}

/// A share on disk with a secret beside it, and a server session over it.
struct Sharer {
    dir: ferry_testkit::TempDir,
    root: ShareRoot,
    cache: OutboardCache,
}

impl Sharer {
    fn new() -> Sharer {
        let dir = ferry_testkit::temp_dir("ferry-hostile-");
        let share = dir.path().join("share");
        std::fs::create_dir_all(share.join("sub")).unwrap();
        std::fs::create_dir_all(dir.path().join("outside")).unwrap();
        std::fs::write(dir.path().join("secret"), SECRET).unwrap();
        std::fs::write(dir.path().join("outside/secret"), SECRET).unwrap();
        std::fs::write(share.join("inside.txt"), b"inside").unwrap();
        std::fs::write(share.join("sub/secret"), b"inside too").unwrap();
        let root = ShareRoot::open(&share).unwrap();
        let cache = OutboardCache::new(dir.path().join("cache"));
        Sharer { dir, root, cache }
    }

    fn share(&self) -> std::path::PathBuf {
        self.dir.path().join("share")
    }
}

/// A greeted server session over a sharer, fed raw packets; every answer's bytes are kept.
struct Session<'a> {
    server: Server,
    files: Files<'a>,
    answers: Vec<Vec<u8>>,
}

impl<'a> Session<'a> {
    fn new(s: &'a Sharer) -> Session<'a> {
        let mut server = Server::new(ServerConfig::default());
        // A client's hello, from a client.
        server
            .handle(&Client::new(64).poll_transmit().unwrap())
            .unwrap();
        Session {
            server,
            files: Files::new(&s.root, &s.cache),
            answers: Vec::new(),
        }
    }

    /// A session and a client that read each other's hello.
    fn connected(s: &'a Sharer) -> (Session<'a>, Client) {
        let mut session = Session::new(s);
        let mut client = Client::new(8);
        client.poll_transmit();
        session.run();
        for a in session.answers.drain(..) {
            assert!(matches!(client.handle(&a), Ok(Some(Event::Ready { .. }))));
        }
        (session, client)
    }

    /// Feeds one packet and runs the session until it has nothing more to do.
    fn feed(&mut self, packet: &[u8]) {
        self.server.handle(packet).expect("the session goes on");
        self.run();
    }

    fn run(&mut self) {
        let mut buf = vec![0u8; (DEFAULT_PIECE + 2 * GROUP) as usize];
        loop {
            // As `serve` does: the jobs that arrived together, reads of one path sharing its open.
            self.files.run_all(&mut self.server);
            while let Some(out) = self.server.poll_transmit() {
                self.answers.push(out);
            }
            let Some(piece) = self.server.next_piece() else {
                return;
            };
            match self.files.build_piece(&piece, &mut buf) {
                Ok(len) => {
                    self.answers.push(buf[..len].to_vec());
                    self.server.piece_sent(&piece);
                }
                Err((code, msg)) => self.server.fail(piece.id, code, &msg),
            }
            self.files.forget_done(&self.server);
        }
    }

    /// The error code the request `id` ended with, if it failed.
    fn error_of(&self, id: RequestId) -> Option<ErrorCode> {
        self.answers
            .iter()
            .find_map(|a| match Response::decode(a).unwrap() {
                Response::Error { id: i, code, .. } if i == id => Some(code),
                _ => None,
            })
    }

    fn leaked(&self) -> bool {
        self.answers
            .iter()
            .any(|a| a.windows(SECRET.len()).any(|w| w == SECRET))
    }
}

/// A STAT, LIST and READ of `path`, unchecked: what a hostile client can put on the wire.
fn raw_requests(id: RequestId, path: &[u8]) -> [Vec<u8>; 3] {
    let mut stat = vec![wire::STAT];
    stat.put_u32(id);
    stat.put_bytes16(path);
    let mut list = vec![wire::LIST];
    list.put_u32(id + 1);
    list.put_bytes16(path);
    list.put_u64(0);
    list.put_u32(100);
    let mut read = vec![wire::READ];
    read.put_u32(id + 2);
    read.put_bytes16(path);
    read.put_u8(0);
    read.put(&[0; 32]);
    read.put_u64(0);
    read.put_u64(1 << 20);
    [stat, list, read]
}

#[test]
fn a_hostile_clients_escapes_are_refused_as_unsafe_paths_and_nothing_is_read() {
    let s = Sharer::new();
    let share = s.share();
    std::os::unix::fs::symlink("../secret", share.join("out")).unwrap();
    std::os::unix::fs::symlink("../outside", share.join("outdir")).unwrap();
    std::os::unix::fs::symlink(s.dir.path().join("secret"), share.join("abs")).unwrap();
    std::os::unix::fs::symlink("..", share.join("sub/up")).unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        share.join("fifo"),
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
    )
    .unwrap();
    let device = make_device(&share.join("null"));
    let mut session = Session::new(&s);
    let mut escapes: Vec<&[u8]> = vec![
        b"..",
        b"../secret",
        b"/etc/passwd",
        b"sub/../../secret",
        b"sub/..",
        b"inside.txt\0../../secret",
        b"a\0b",
        b"out",
        b"abs",
        b"outdir/secret",
        b"sub/up/../secret",
        b"fifo",
    ];
    if device {
        escapes.push(b"null");
    }
    let mut id = 1;
    for path in &escapes {
        let [stat, list, read] = raw_requests(id, path);
        session.feed(&stat);
        session.feed(&read);
        assert_eq!(
            session.error_of(id + 2),
            Some(ErrorCode::UnsafePath),
            "read {:?}",
            String::from_utf8_lossy(path)
        );
        session.feed(&list);
        let list_error = session.error_of(id + 1);
        assert!(
            matches!(
                list_error,
                Some(ErrorCode::UnsafePath | ErrorCode::WrongKind)
            ),
            "list {:?}: {list_error:?}",
            String::from_utf8_lossy(path)
        );
        // A stat describes a symlink (its target is just text) but never follows one out.
        let stat_error = session.error_of(id);
        let is_link = [&b"out"[..], b"abs", b"outdir/secret"].contains(path);
        assert!(
            stat_error == Some(ErrorCode::UnsafePath) || (is_link && stat_error.is_none()),
            "stat {:?}: {stat_error:?}",
            String::from_utf8_lossy(path)
        );
        id += 3;
    }
    assert!(!session.leaked(), "a byte from outside the share was sent");
    // Each refusal is logged, and the session still serves what is inside.
    let mut refusals = 0;
    while session.server.next_refusal().is_some() {
        refusals += 1;
    }
    assert!(refusals >= 2 * escapes.len(), "{refusals} refusals");
    let [_, _, read] = raw_requests(id, b"inside.txt");
    session.feed(&read);
    assert_eq!(session.error_of(id + 2), None);
    assert!(session.answers.iter().any(|a| a.ends_with(b"inside")));
}

/// Makes a character device (/dev/null's numbers) at `path`; false, after saying so, when not permitted.
fn make_device(path: &Path) -> bool {
    let made = rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        rustix::fs::makedev(1, 3),
    );
    match made {
        Ok(()) => true,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI needs mknod for the device case: {e}"
            );
            println!("SKIPPED: the device-node case: mknod: {e}");
            false
        }
    }
}

#[test]
fn a_symlink_swapped_in_during_requests_never_leads_out() {
    let s = Sharer::new();
    let share = s.share();
    // `flip` and `flipdir` keep changing between a target inside and one outside the share, each change
    // one atomic rename.
    std::os::unix::fs::symlink("inside.txt", share.join("flip")).unwrap();
    std::os::unix::fs::symlink("sub", share.join("flipdir")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (stop, share) = (Arc::clone(&stop), share.clone());
        std::thread::spawn(move || {
            let mut flips = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (file, dir) = if flips.is_multiple_of(2) {
                    ("../secret", "../outside")
                } else {
                    ("inside.txt", "sub")
                };
                for (name, target) in [("flip", file), ("flipdir", dir)] {
                    let temp = share.join(format!(".{name}.new"));
                    let _ = std::fs::remove_file(&temp);
                    std::os::unix::fs::symlink(target, &temp).unwrap();
                    std::fs::rename(&temp, share.join(name)).unwrap();
                }
                flips += 1;
            }
            flips
        })
    };
    let mut session = Session::new(&s);
    let (mut served, mut refused) = (0, 0);
    let mut id = 1;
    while id < 3 * 4000 || served == 0 || refused == 0 {
        assert!(id < 3 * 400_000, "the race was never seen both ways");
        for path in [&b"flip"[..], b"flipdir/secret"] {
            let [_, _, read] = raw_requests(id, path);
            session.feed(&read);
            match session.error_of(id + 2) {
                None => served += 1,
                Some(ErrorCode::UnsafePath) => refused += 1,
                Some(other) => panic!("{other:?}"),
            }
            id += 3;
        }
        assert!(!session.leaked(), "a byte from outside the share was sent");
        session.answers.clear();
    }
    stop.store(true, Ordering::Relaxed);
    let flips = flipper.join().unwrap();
    println!("{served} reads served, {refused} refused, {flips} flips");
}

#[test]
fn a_file_changed_during_a_read_fails_it_and_the_next_read_gets_the_new_version() {
    let s = Sharer::new();
    let path = s.share().join("big");
    let old = pseudo_random(3 * DEFAULT_PIECE as usize + 5000, 1);
    std::fs::write(&path, &old).unwrap();
    let (mut session, mut client) = Session::connected(&s);
    let mut events = Vec::new();
    let id = client.read(p("big"), None, 0, u64::MAX).unwrap();
    session
        .server
        .handle(&client.poll_transmit().unwrap())
        .unwrap();
    // One piece goes out, then the file changes (same size), then the read goes on.
    let job = session.server.next_job().unwrap();
    session.files.run(&mut session.server, job);
    while let Some(out) = session.server.poll_transmit() {
        events.extend(client.handle(&out).unwrap());
    }
    let piece = session.server.next_piece().unwrap();
    let mut buf = vec![0u8; (DEFAULT_PIECE + 2 * GROUP) as usize];
    let len = session.files.build_piece(&piece, &mut buf).unwrap();
    session.server.piece_sent(&piece);
    events.extend(client.handle(&buf[..len]).unwrap());
    let new = pseudo_random(old.len(), 2);
    std::fs::write(&path, &new).unwrap();
    session.run();
    for a in session.answers.drain(..) {
        events.extend(client.handle(&a).unwrap());
    }
    let mut got = Vec::new();
    let mut failed = None;
    for e in &events {
        match e {
            Event::Data { id: i, bytes, .. } if *i == id => got.extend_from_slice(bytes),
            Event::Failed { id: i, failure } if *i == id => failed = Some(failure.clone()),
            Event::Done { id: i } if *i == id => panic!("a read across two versions completed"),
            _ => {}
        }
    }
    // The sharer sees the change before the next piece and says so (a change it cannot see, between its
    // check and its read, would still fail the client's verification).
    assert!(
        matches!(failed, Some(Failure::Remote(ErrorCode::Changed, _))),
        "{failed:?}"
    );
    assert!(!got.is_empty() && old.starts_with(&got), "only old bytes");
    // Asked again, the sharer names the new version and serves it whole.
    let again = client.read(p("big"), None, 0, u64::MAX).unwrap();
    session.feed(&client.poll_transmit().unwrap());
    let mut fresh = Vec::new();
    let mut version = None;
    for a in session.answers.drain(..) {
        match client.handle(&a).unwrap() {
            Some(Event::Version { id, version: v }) if id == again => version = Some(v),
            Some(Event::Data { id, bytes, .. }) if id == again => fresh.extend_from_slice(&bytes),
            _ => {}
        }
    }
    assert_eq!(version.unwrap().root, *blake3::hash(&new).as_bytes());
    assert_eq!(fresh, new);
}

#[test]
fn a_ten_thousand_file_listing_comes_in_bounded_pages() {
    let s = Sharer::new();
    let dir = s.share().join("many");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..10_000 {
        std::fs::write(dir.join(format!("f{i:05}")), b"").unwrap();
    }
    let (mut session, mut client) = Session::connected(&s);
    let mut names = Vec::new();
    let (mut cursor, mut pages) = (0, 0);
    while cursor != END {
        let id = client
            .list(p("many"), cursor, wire::MAX_PAGE_ENTRIES)
            .unwrap();
        session.feed(&client.poll_transmit().unwrap());
        for a in session.answers.drain(..) {
            assert!(a.len() < 1 << 20, "a page fits in a packet");
            match client.handle(&a).unwrap() {
                Some(Event::Entries {
                    id: i,
                    entries,
                    next,
                }) if i == id => {
                    assert!(entries.len() <= wire::MAX_PAGE_ENTRIES as usize);
                    names.extend(entries.into_iter().map(|e| e.name));
                    cursor = next;
                    pages += 1;
                }
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(pages, 3);
    let want: Vec<Vec<u8>> = (0..10_000)
        .map(|i| format!("f{i:05}").into_bytes())
        .collect();
    assert_eq!(names, want, "every name once, in order");
}

/// A peer running another ferry release (another share protocol version) is told so, on both sides, and
/// nothing else is taken from it.
#[test]
fn a_peer_of_another_protocol_version_is_named_as_such() {
    let other = wire::PROTOCOL_VERSION + 1;
    let hello = |version| wire::Hello {
        version,
        max_in_flight: 8,
        share: Vec::new(),
    };
    let mut client = Client::new(8);
    let mut b = Vec::new();
    Response::Hello(hello(other)).encode(&mut b);
    let e = client.handle(&b).unwrap_err();
    assert_eq!(e, ClientError::Version { theirs: other });
    assert!(e.to_string().contains("same ferry release"), "{e}");
    // `ferry ls` and `pull` exit with the channel's version mismatch (4), not a broken protocol (8).
    assert_eq!(
        ferry_share::io::SessionError::from(e).code(),
        ferry_wire::ErrorCode::VersionMismatch
    );
    // Anything but a hello first is no version at all.
    assert_eq!(
        client
            .handle(&packet(Response::Done { id: 1 }))
            .unwrap_err(),
        ClientError::Hello
    );

    let mut server = Server::new(ServerConfig::default());
    b.clear();
    wire::Request::Hello(hello(other)).encode(&mut b);
    let e = server.handle(&b).unwrap_err();
    assert_eq!(e, ServerError::Version { theirs: other });
    assert!(e.to_string().contains(&format!("version {other}")), "{e}");
    // The current version is taken.
    b.clear();
    wire::Request::Hello(hello(wire::PROTOCOL_VERSION)).encode(&mut b);
    Server::new(ServerConfig::default()).handle(&b).unwrap();
}

/// A client that has read the sharer's hello.
fn greeted_client() -> Client {
    let mut client = Client::new(8);
    client.poll_transmit();
    let hello = Server::new(ServerConfig::default())
        .poll_transmit()
        .unwrap();
    client.handle(&hello).unwrap();
    client
}

fn packet(rsp: Response<'_>) -> Vec<u8> {
    let mut b = Vec::new();
    rsp.encode(&mut b);
    b
}

/// The honest packets for a whole read of `data` as request `id`: its version, pieces, done.
fn honest_read(id: RequestId, data: &[u8]) -> Vec<Vec<u8>> {
    let ob = Outboard::compute(data, data.len() as u64).unwrap();
    let v = ob.version();
    let mut out = vec![packet(Response::Version {
        id,
        size: v.size,
        root: v.root,
    })];
    let mut at = 0;
    while at < v.size {
        let end = (at + 4 * GROUP).min(v.size);
        let mut piece = Vec::new();
        wire::data_header(&mut piece, id, at, (end - at) as u32);
        encode_piece(data, &ob, at..end, &mut piece).unwrap();
        out.push(piece);
        at = end;
    }
    out.push(packet(Response::Done { id }));
    out
}

#[test]
fn a_lying_sharer_is_caught_and_nothing_is_handed_on() {
    let data = pseudo_random(10 * GROUP as usize + 123, 9);
    let other = pseudo_random(data.len(), 10);
    type Lie = fn(&mut Vec<Vec<u8>>, &[u8]);
    let lies: [(&str, Lie); 7] = [
        ("a flipped data byte", |ps, _| {
            let last = ps[2].len() - 1;
            ps[2][last] ^= 1;
        }),
        ("a flipped proof byte", |ps, _| {
            ps[2][wire::DATA_HEADER_LEN + 3] ^= 1;
        }),
        ("another file's bytes under this root", |ps, other| {
            let honest = honest_read(1, other);
            ps[2] = honest[2].clone();
        }),
        ("a piece for another range", |ps, _| {
            ps.swap(2, 3);
        }),
        ("a piece with a wrong length field", |ps, _| {
            ps[2][wire::DATA_HEADER_LEN - 4] ^= 1;
        }),
        ("done before the last piece", |ps, _| {
            let n = ps.len();
            ps.remove(n - 2);
        }),
        ("pieces past the end", |ps, _| {
            let extra = ps[ps.len() - 2].clone();
            let n = ps.len();
            ps.insert(n - 1, extra);
        }),
    ];
    for (what, lie) in lies {
        let mut client = greeted_client();
        let id = client.read(p("f"), None, 0, u64::MAX).unwrap();
        let mut packets = honest_read(id, &data);
        lie(&mut packets, &other);
        let mut failed = false;
        for pk in &packets {
            match client.handle(pk) {
                Ok(Some(Event::Data { offset, bytes, .. })) => {
                    assert_eq!(
                        &data[offset as usize..offset as usize + bytes.len()],
                        &bytes[..],
                        "{what}: only true bytes"
                    );
                }
                Ok(Some(Event::Failed {
                    failure: Failure::Integrity,
                    ..
                })) => failed = true,
                Ok(Some(Event::Done { .. })) => panic!("{what}: the read completed"),
                Ok(_) => {}
                Err(e) => panic!("{what}: {e}"),
            }
        }
        assert!(failed, "{what}: not detected");
    }
}

#[test]
fn a_read_of_one_version_takes_no_data_of_another() {
    let data = pseudo_random(10 * GROUP as usize + 123, 11);
    let other = pseudo_random(data.len(), 12);
    let asked = Outboard::compute(&data[..], data.len() as u64)
        .unwrap()
        .version()
        .root;
    let mut client = greeted_client();
    let id = client.read(p("f"), Some(asked), 0, u64::MAX).unwrap();
    // The sharer announces another version (as it must, before refusing with `Changed`), then sends that
    // version's pieces, each of which verifies against the root it announced.
    let mut failed = false;
    for pk in honest_read(id, &other) {
        match client.handle(&pk) {
            Ok(Some(Event::Version { version, .. })) => assert_ne!(version.root, asked),
            Ok(Some(Event::Failed {
                failure: Failure::Integrity,
                ..
            })) => failed = true,
            Ok(Some(Event::Data { .. })) => panic!("data of a version not asked for was handed on"),
            Ok(Some(Event::Done { .. })) => panic!("the read completed"),
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert!(failed, "not detected");
    // The same packets for a read that named no version are taken.
    let mut client = greeted_client();
    let id = client.read(p("f"), None, 0, u64::MAX).unwrap();
    let mut got = Vec::new();
    for pk in honest_read(id, &other) {
        if let Ok(Some(Event::Data { bytes, .. })) = client.handle(&pk) {
            got.extend_from_slice(&bytes);
        }
    }
    assert_eq!(got, other);
}

#[test]
fn a_hostile_sharers_listings_and_floods_end_the_session_or_are_dropped() {
    // Unsafe names in a listing: the packet is refused as a whole, no entry handed on.
    for bad in [&b".."[..], b".", b"a/b", b"x\0y", b""] {
        let mut client = greeted_client();
        let id = client.list(SharePath::root(), 0, 10).unwrap();
        let entry = file_entry;
        let pk = packet(Response::Entries {
            id,
            entries: vec![entry(b"fine"), entry(bad)],
            next: END,
        });
        assert!(
            matches!(client.handle(&pk), Err(ClientError::Malformed(_))),
            "{bad:?}"
        );
    }
    // More entries than a page may hold.
    let mut client = greeted_client();
    let id = client.list(SharePath::root(), 0, 10).unwrap();
    let mut pk = vec![wire::ENTRIES];
    pk.put_u32(id);
    pk.put_u32(wire::MAX_PAGE_ENTRIES + 1);
    pk.extend(std::iter::repeat_n(
        0u8,
        40 * (wire::MAX_PAGE_ENTRIES as usize + 1),
    ));
    assert!(client.handle(&pk).is_err());
    // Answers nobody asked for, and a change notification without a subscription.
    let mut client = greeted_client();
    assert!(client.handle(&packet(Response::Done { id: 77 })).is_err());
    assert!(client
        .handle(&packet(Response::Changed {
            id: 1,
            paths: vec![SharePath::root()]
        }))
        .is_err());
    // An endless stream of pieces for a read the client gave up on: each dropped, nothing kept.
    let mut client = greeted_client();
    let data = pseudo_random(4 * GROUP as usize, 3);
    let id = client.read(p("f"), None, 0, u64::MAX).unwrap();
    let packets = honest_read(id, &data);
    client.handle(&packets[0]).unwrap();
    client.cancel(id);
    for _ in 0..100_000 {
        assert_eq!(client.handle(&packets[1]).unwrap(), None);
    }
    // An endless stream of pieces past the end of a read: the first fails it, the rest are dropped.
    let mut client = greeted_client();
    let id = client.read(p("f"), None, 0, GROUP).unwrap();
    let packets = honest_read(id, &data);
    client.handle(&packets[0]).unwrap();
    let mut piece = Vec::new();
    let ob = Outboard::compute(&data[..], data.len() as u64).unwrap();
    wire::data_header(&mut piece, id, 0, GROUP as u32);
    encode_piece(&data[..], &ob, 0..GROUP, &mut piece).unwrap();
    assert!(matches!(
        client.handle(&piece).unwrap(),
        Some(Event::Data { .. })
    ));
    assert!(matches!(
        client.handle(&piece).unwrap(),
        Some(Event::Failed {
            failure: Failure::Integrity,
            ..
        })
    ));
    for _ in 0..10_000 {
        assert_eq!(client.handle(&piece).unwrap(), None);
    }
}

#[test]
fn reads_that_arrive_together_share_an_open_and_a_later_one_sees_a_replaced_file() {
    let s = Sharer::new();
    let path = s.share().join("big");
    let old = pseudo_random(5 * GROUP as usize, 3);
    std::fs::write(&path, &old).unwrap();
    let (mut session, mut client) = Session::connected(&s);
    // Many reads of one path in one batch: each gets exactly its bytes, verified.
    let mut want = std::collections::HashMap::new();
    for k in 0..5u64 {
        let offset = k * GROUP + 100 * k;
        want.insert(client.read(p("big"), None, offset, 4096).unwrap(), offset);
    }
    // A read of another path in the same batch is not served from that open.
    let other = client.read(p("inside.txt"), None, 0, 6).unwrap();
    while let Some(packet) = client.poll_transmit() {
        session.server.handle(&packet).unwrap();
    }
    session.run();
    let mut got = std::collections::HashMap::new();
    let mut versions = std::collections::HashSet::new();
    for a in session.answers.drain(..) {
        match client.handle(&a).unwrap() {
            Some(Event::Data { id, bytes, .. }) => got
                .entry(id)
                .or_insert_with(Vec::new)
                .extend_from_slice(&bytes),
            Some(Event::Version { id, version }) if id != other => {
                versions.insert(version);
            }
            Some(Event::Failed { id, failure }) => panic!("read {id} failed: {failure:?}"),
            _ => {}
        }
    }
    for (id, offset) in &want {
        let at = *offset as usize;
        assert_eq!(got[id], &old[at..at + 4096], "read at {offset}");
    }
    assert_eq!(got[&other], b"inside");
    assert_eq!(versions.len(), 1);
    // The file replaced (a new inode under the same name): the next batch opens the path again.
    let new = pseudo_random(old.len(), 4);
    let tmp = s.share().join("big.new");
    std::fs::write(&tmp, &new).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let again = client.read(p("big"), None, GROUP, 4096).unwrap();
    session.feed(&client.poll_transmit().unwrap());
    let mut fresh = Vec::new();
    let mut version = None;
    for a in session.answers.drain(..) {
        match client.handle(&a).unwrap() {
            Some(Event::Version { id, version: v }) if id == again => version = Some(v),
            Some(Event::Data { id, bytes, .. }) if id == again => fresh.extend_from_slice(&bytes),
            _ => {}
        }
    }
    assert_eq!(fresh, &new[GROUP as usize..GROUP as usize + 4096]);
    assert!(version.is_some() && !versions.contains(&version.unwrap()));
}

/// `packet` at `contents` of a larger buffer, as a channel reader hands over the buffer it was received in.
fn in_buffer(packet: &[u8]) -> (Vec<u8>, std::ops::Range<usize>) {
    let mut buf = vec![0xEE; 7];
    buf.extend_from_slice(packet);
    buf.extend_from_slice(&[0xEE; 5]);
    (buf, 7..7 + packet.len())
}

/// The version packet and one piece for `at..end` of `data` (honest) as read `id`.
fn version_and_piece(id: RequestId, data: &[u8], at: u64, end: u64) -> (Vec<u8>, Vec<u8>) {
    let ob = Outboard::compute(data, data.len() as u64).unwrap();
    let v = ob.version();
    let version = packet(Response::Version {
        id,
        size: v.size,
        root: v.root,
    });
    let mut piece = Vec::new();
    wire::data_header(&mut piece, id, at, (end - at) as u32);
    encode_piece(data, &ob, at..end, &mut piece).unwrap();
    (version, piece)
}

/// A piece that brings a whole read, handed over in its buffer, is verified where it lies and handed on in
/// that buffer, cut to the bytes asked for, and the buffer goes back to the pool when they are dropped; a
/// read in two pieces is gathered as before; a piece with one bad byte hands nothing on.
#[test]
fn a_whole_read_in_one_owned_packet_is_handed_on_in_place_and_a_lie_is_still_caught() {
    use ferry_share::bytes::Pool;
    let mib = 1u64 << 20;
    let data = pseudo_random(3 * mib as usize + 123, 21);
    let pool = Pool::new(4);
    let mut client = greeted_client();
    // A whole 1 MiB read, and one cut 5 bytes in at both ends.
    for (offset, len) in [(mib, mib), (mib + 5, mib - 10)] {
        let id = client.read(p("f"), None, offset, len).unwrap();
        let (version, piece) = version_and_piece(id, &data, mib, 2 * mib);
        assert!(matches!(
            client.handle(&version).unwrap(),
            Some(Event::Version { .. })
        ));
        let (buf, contents) = in_buffer(&piece);
        match client.handle_owned(buf, contents, &pool).unwrap() {
            Some(Event::Data {
                offset: o,
                bytes,
                cvs,
                ..
            }) => {
                assert_eq!(o, offset);
                assert!(bytes.is_in_packet(), "handed on where it lies");
                assert_eq!(bytes, data[offset as usize..(offset + len) as usize]);
                let whole = len == mib;
                assert_eq!(cvs.len(), if whole { 128 } else { 0 });
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            pool.idle(),
            1,
            "the buffer went back when the bytes were dropped"
        );
        assert!(pool.take(0).len() > piece.len());
        assert_eq!(
            client.handle(&packet(Response::Done { id })).unwrap(),
            Some(Event::Done { id })
        );
    }
    // Two pieces of one read: the first is held, the second brings the read, gathered in a buffer of its own.
    let id = client.read(p("f"), None, 0, mib).unwrap();
    let (version, first) = version_and_piece(id, &data, 0, mib / 2);
    let (_, second) = version_and_piece(id, &data, mib / 2, mib);
    client.handle(&version).unwrap();
    let (buf, contents) = in_buffer(&first);
    assert_eq!(client.handle_owned(buf, contents, &pool).unwrap(), None);
    let (buf, contents) = in_buffer(&second);
    match client.handle_owned(buf, contents, &pool).unwrap() {
        Some(Event::Data { bytes, cvs, .. }) => {
            assert!(!bytes.is_in_packet());
            assert_eq!(bytes, data[..mib as usize]);
            assert_eq!(cvs.len(), 128);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        pool.idle(),
        2,
        "both buffers free again: their bytes were copied out"
    );
    client.handle(&packet(Response::Done { id })).unwrap();
    // One bad byte (counted from the piece's end) in the last group, the middle, the first group or the
    // parents before the data: nothing handed on.
    let m = mib as usize;
    for flip in [1, 600_000, m, m + 100] {
        let id = client.read(p("f"), None, 2 * mib, mib).unwrap();
        let (version, mut piece) = version_and_piece(id, &data, 2 * mib, 3 * mib);
        client.handle(&version).unwrap();
        let at = piece.len() - flip;
        piece[at] ^= 1;
        let (buf, contents) = in_buffer(&piece);
        assert_eq!(
            client.handle_owned(buf, contents, &pool).unwrap(),
            Some(Event::Failed {
                id,
                failure: Failure::Integrity
            }),
            "byte {flip} from the end"
        );
    }
    // A piece past the read's end (here: the right bytes, but 1 MiB later than asked) fails it too.
    let id = client.read(p("f"), None, 0, mib).unwrap();
    let (version, piece) = version_and_piece(id, &data, mib, 2 * mib);
    client.handle(&version).unwrap();
    let (buf, contents) = in_buffer(&piece);
    assert!(matches!(
        client.handle_owned(buf, contents, &pool).unwrap(),
        Some(Event::Failed { .. })
    ));
}

/// A file's entry named `name`, as a sharer sends it.
fn file_entry(name: &[u8]) -> Entry {
    Entry {
        name: name.to_vec(),
        kind: Kind::File,
        size: 1,
        mode: 0o644,
        mtime: 0,
        mtime_nsec: 0,
        target: Vec::new(),
    }
}

/// A page of `n` entries named from `first` on, as a lying sharer sends them.
fn page(id: RequestId, first: usize, n: usize, next: u64) -> Vec<u8> {
    let entries = (first..first + n)
        .map(|i| file_entry(format!("entry-{i:09}").as_bytes()))
        .collect();
    packet(Response::Entries { id, entries, next })
}

#[test]
fn a_sharers_listing_cursor_must_move_on() {
    // The attack: every page full and the same cursor again, for ever. The first such page ends it.
    for (asked, next) in [(0, 0), (7, 7), (7, 3)] {
        let mut client = greeted_client();
        let id = client.list(SharePath::root(), asked, 10).unwrap();
        assert!(
            matches!(
                client.handle(&page(id, 0, 10, next)),
                Err(ClientError::Cursor { .. })
            ),
            "cursor {asked} then {next}"
        );
    }
    // More entries than asked for is refused too; a cursor that moves on, or the end, is fine.
    let mut client = greeted_client();
    let id = client.list(SharePath::root(), 0, 10).unwrap();
    assert!(client.handle(&page(id, 0, 11, 11)).is_err());
    let mut client = greeted_client();
    let id = client.list(SharePath::root(), 5, 10).unwrap();
    assert!(client.handle(&page(id, 0, 10, 6)).unwrap().is_some());
    let id = client.list(SharePath::root(), 6, 10).unwrap();
    assert!(client.handle(&page(id, 0, 3, END)).unwrap().is_some());
}

#[test]
fn a_listing_that_never_ends_stops_at_its_limit() {
    // A cursor that moves on by one while each page is full: the total is what bounds it.
    let max = 1 << 20;
    let mut listing = Listing::new(max);
    let mut client = greeted_client();
    let mut cursor = 0;
    let err = loop {
        let id = client
            .list(SharePath::root(), cursor, wire::MAX_PAGE_ENTRIES)
            .unwrap();
        let pk = page(
            id,
            cursor as usize,
            wire::MAX_PAGE_ENTRIES as usize,
            cursor + 1,
        );
        let Ok(Some(Event::Entries { entries, next, .. })) = client.handle(&pk) else {
            panic!("an honest-looking page was refused");
        };
        if let Err(e) = listing.add(entries) {
            break e;
        }
        cursor = next;
        assert!(cursor < 1000, "the listing never stopped");
    };
    assert!(matches!(err, ClientError::ListingTooLarge { max: m, .. } if m == max));
    let held = listing.into_entries();
    let bytes: u64 = held.iter().map(|e| ENTRY_COST + e.name.len() as u64).sum();
    assert!(bytes <= max, "{bytes} bytes held");
    assert!(err.to_string().contains("more than 1048576 bytes"), "{err}");
}
