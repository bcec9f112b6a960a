//! The share protocol two-sided in memory: a real client and server state machine, a share kept in memory,
//! every packet through the real encoders and decoders.

use std::collections::BTreeMap;

use ferry_share::client::{Client, Event, Failure};
use ferry_share::server::{Job, Server, ServerConfig};
use ferry_share::tree::{encode_piece, Outboard};
use ferry_share::wire::{self, Entry, ErrorCode, Kind, SharePath, END};
use ferry_testkit::pseudo_random;

/// A share held in memory: path → (entry, content).
#[derive(Default)]
struct MemShare {
    files: BTreeMap<Vec<u8>, (Entry, Vec<u8>)>,
}

impl MemShare {
    fn add(&mut self, path: &str, data: Vec<u8>) {
        let name = path.rsplit('/').next().unwrap().as_bytes().to_vec();
        let entry = Entry {
            name,
            kind: Kind::File,
            size: data.len() as u64,
            mode: 0o644,
            mtime: 1_795_000_000,
            mtime_nsec: 0,
            target: Vec::new(),
        };
        self.files.insert(path.as_bytes().to_vec(), (entry, data));
    }

    fn children(&self, dir: &[u8]) -> Vec<Entry> {
        self.files
            .iter()
            .filter(|(p, _)| {
                let (parent, _) = ferry_tree::path::split_parent(p);
                parent == dir
            })
            .map(|(_, (e, _))| e.clone())
            .collect()
    }
}

/// Changes a piece's packet on its way.
type Tamper = Box<dyn FnMut(&mut Vec<u8>)>;

/// Both ends and what passes between them.
struct Pair {
    client: Client,
    server: Server,
    share: MemShare,
    /// Corrupts a piece's packet before the client sees it.
    tamper: Option<Tamper>,
    events: Vec<Event>,
    /// Every packet the server sent, in order, by kind byte.
    sent_kinds: Vec<u8>,
    /// The packet size the server's pieces are built for (`Server::next_piece_within`).
    piece_limit: usize,
    /// The length of every piece built.
    piece_lens: Vec<u64>,
}

impl Pair {
    fn new(share: MemShare, config: ServerConfig, client_window: u32) -> Pair {
        Pair {
            client: Client::new(client_window),
            server: Server::new(config),
            share,
            tamper: None,
            events: Vec::new(),
            sent_kinds: Vec::new(),
            piece_limit: usize::MAX,
            piece_lens: Vec::new(),
        }
    }

    fn run_job(&mut self, job: Job) {
        match job {
            Job::Stat { id, path } => {
                let r = self
                    .share
                    .files
                    .get(path.as_bytes())
                    .map(|(e, _)| e.clone())
                    .ok_or((ErrorCode::NotFound, "no such file".to_string()));
                self.server.stat_done(id, r);
            }
            Job::List {
                id,
                path,
                cursor,
                max,
            } => {
                let all = self.share.children(path.as_bytes());
                let from = cursor as usize;
                let to = (from + max as usize).min(all.len());
                let next = if to == all.len() { END } else { to as u64 };
                self.server
                    .list_done(id, Ok((all[from.min(to)..to].to_vec(), next)));
            }
            Job::Open { id, path } => match self.share.files.get(path.as_bytes()) {
                Some((_, data)) => {
                    let ob = Outboard::compute(&data[..], data.len() as u64).unwrap();
                    self.server.read_opened(id, Ok(ob.version()));
                }
                None => self
                    .server
                    .read_opened(id, Err((ErrorCode::NotFound, "no such file".into()))),
            },
            Job::Pull { id, path } => {
                let r = if self.share.files.contains_key(path.as_bytes()) {
                    Ok(())
                } else {
                    Err((ErrorCode::NotFound, "no such file".into()))
                };
                self.server.pull_resolved(id, r);
            }
            job => panic!("a share that is not writable runs no {job:?}"),
        }
    }

    /// Pumps until nothing moves; `open_paths` maps read ids to paths for building pieces.
    fn pump(&mut self, paths: &BTreeMap<u32, &str>) {
        loop {
            let mut moved = false;
            while let Some(p) = self.client.poll_transmit() {
                self.server.handle(&p).unwrap();
                moved = true;
            }
            while let Some(job) = self.server.next_job() {
                self.run_job(job);
                moved = true;
            }
            while let Some(p) = self.server.poll_transmit() {
                self.deliver(p);
                moved = true;
            }
            if let Some(piece) = self.server.next_piece_within(self.piece_limit) {
                self.piece_lens.push(piece.range.end - piece.range.start);
                let (_, data) = &self.share.files[paths[&piece.id].as_bytes()];
                let ob = Outboard::compute(&data[..], data.len() as u64).unwrap();
                let mut packet = Vec::new();
                wire::data_header(
                    &mut packet,
                    piece.id,
                    piece.range.start,
                    (piece.range.end - piece.range.start) as u32,
                );
                encode_piece(&data[..], &ob, piece.range.clone(), &mut packet).unwrap();
                self.server.piece_sent(&piece);
                if let Some(t) = self.tamper.as_mut() {
                    t(&mut packet);
                }
                self.deliver(packet);
                moved = true;
            }
            if !moved {
                return;
            }
        }
    }

    fn deliver(&mut self, packet: Vec<u8>) {
        self.sent_kinds.push(packet[0]);
        if let Some(ev) = self.client.handle(&packet).unwrap() {
            self.events.push(ev);
        }
    }

    fn data_of(&self, id: u32) -> Vec<u8> {
        let mut out = Vec::new();
        for e in &self.events {
            if let Event::Data {
                id: i,
                offset,
                bytes,
                ..
            } = e
            {
                if *i == id {
                    assert_eq!(
                        *offset as usize,
                        out.len() + self.first_offset(id),
                        "in order"
                    );
                    out.extend_from_slice(bytes);
                }
            }
        }
        out
    }

    fn first_offset(&self, id: u32) -> usize {
        self.events
            .iter()
            .find_map(|e| match e {
                Event::Data { id: i, offset, .. } if *i == id => Some(*offset as usize),
                _ => None,
            })
            .unwrap_or(0)
    }
}

fn path(p: &str) -> SharePath {
    SharePath::new(p.as_bytes()).unwrap()
}

fn sample_share() -> MemShare {
    let mut share = MemShare::default();
    share.add("big.bin", pseudo_random(3 * 1024 * 1024 + 777, 1));
    share.add("small.txt", b"hello".to_vec());
    share.add("empty", Vec::new());
    share
}

#[test]
fn stat_list_and_verified_reads_of_any_range() {
    let mut pair = Pair::new(sample_share(), ServerConfig::default(), 64);
    let big = pair.share.files[&b"big.bin".to_vec()].1.clone();
    let stat = pair.client.stat(path("small.txt")).unwrap();
    let list = pair.client.list(SharePath::root(), 0, 2).unwrap();
    let whole = pair
        .client
        .read(path("big.bin"), None, 0, u64::MAX)
        .unwrap();
    let middle = pair
        .client
        .read(path("big.bin"), None, 100_000, 4096)
        .unwrap();
    let empty = pair.client.read(path("empty"), None, 0, 10).unwrap();
    let paths = BTreeMap::from([(whole, "big.bin"), (middle, "big.bin"), (empty, "empty")]);
    pair.pump(&paths);

    assert!(matches!(pair.events[0], Event::Ready { .. }));
    assert!(pair
        .events
        .iter()
        .any(|e| matches!(e, Event::Attr { id, entry } if *id == stat && entry.size == 5)));
    let page = pair.events.iter().find_map(|e| match e {
        Event::Entries { id, entries, next } if *id == list => Some((entries.clone(), *next)),
        _ => None,
    });
    let (entries, next) = page.unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(next, 2, "a second page follows");
    assert_eq!(pair.data_of(whole), big);
    assert_eq!(pair.data_of(middle), &big[100_000..104_096]);
    assert!(pair.data_of(empty).is_empty());
    for id in [whole, middle, empty] {
        assert!(pair.events.contains(&Event::Done { id }), "read {id} done");
    }
    assert_eq!(pair.server.in_flight(), 0);
}

#[test]
fn pieces_built_for_small_packets_are_whole_groups_and_verify() {
    let mut pair = Pair::new(sample_share(), ServerConfig::default(), 64);
    let big = pair.share.files[&b"big.bin".to_vec()].1.clone();
    // A fresh channel's first packets (`ferry_channel::sizing`): 4 KiB, then 48 KiB (of which 16 KiB are
    // kept for the proof).
    let group = ferry_share::tree::GROUP;
    pair.piece_limit = 4 << 10;
    let first = pair.client.read(path("big.bin"), None, 0, 100_000).unwrap();
    pair.pump(&BTreeMap::from([(first, "big.bin")]));
    pair.piece_limit = 48 << 10;
    let second = pair
        .client
        .read(path("big.bin"), None, 100_000, big.len() as u64 - 100_000)
        .unwrap();
    pair.pump(&BTreeMap::from([(second, "big.bin")]));
    assert_eq!(pair.data_of(first), &big[..100_000]);
    assert_eq!(pair.data_of(second), &big[100_000..]);
    // Reads are served in whole groups (the first read's 13 pieces cover 106,496 bytes).
    let lens = &pair.piece_lens;
    let first_pieces = 100_000u64.div_ceil(group) as usize;
    assert!(lens[..first_pieces].iter().all(|&n| n == group), "{lens:?}");
    let second = &lens[first_pieces..];
    let (last, whole) = second.split_last().unwrap();
    assert!(whole.iter().all(|&n| n == 4 * group), "{lens:?}");
    assert!(*last <= 4 * group, "{lens:?}");
}

#[test]
fn a_read_of_up_to_a_megabyte_is_handed_on_whole_however_it_was_cut() {
    let mut pair = Pair::new(sample_share(), ServerConfig::default(), 64);
    let big = pair.share.files[&b"big.bin".to_vec()].1.clone();
    let group = ferry_share::tree::GROUP;
    // Pieces of 5 groups: a 1 MiB read comes in 26 of them, a 1 MiB + 1 read in 27.
    pair.piece_limit = 7 * group as usize;
    let mib = ferry_share::client::COALESCE;
    let one = pair.client.read(path("big.bin"), None, mib, mib).unwrap();
    let cut = pair
        .client
        .read(path("big.bin"), None, 5, mib - 10)
        .unwrap();
    let longer = pair.client.read(path("big.bin"), None, 0, mib + 1).unwrap();
    pair.pump(&BTreeMap::from([
        (one, "big.bin"),
        (cut, "big.bin"),
        (longer, "big.bin"),
    ]));
    let data = |id| {
        pair.events
            .iter()
            .filter_map(|e| match e {
                Event::Data {
                    id: i,
                    offset,
                    bytes,
                    cvs,
                } if *i == id => Some((*offset, bytes.to_vec(), cvs.len())),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let mib = mib as usize;
    // One event, with every group's value.
    assert_eq!(
        data(one),
        [(mib as u64, big[mib..2 * mib].to_vec(), mib / group as usize)]
    );
    // One event, cut to the bytes asked for: the groups' values go with the cut.
    assert_eq!(data(cut), [(5, big[5..mib - 5].to_vec(), 0)]);
    // Longer than COALESCE: piece by piece until the rest fits, then the rest in one (here the first
    // piece, 5 groups, then 124 groups).
    let pieces = data(longer);
    let lens: Vec<usize> = pieces.iter().map(|(_, b, _)| b.len()).collect();
    assert_eq!(lens, [5 * group as usize, mib + 1 - 5 * group as usize]);
    assert_eq!(pair.data_of(longer), &big[..mib + 1]);
}

#[test]
fn a_small_answer_is_not_held_behind_a_large_read() {
    let mut pair = Pair::new(sample_share(), ServerConfig::default(), 64);
    let whole = pair
        .client
        .read(path("big.bin"), None, 0, u64::MAX)
        .unwrap();
    let stat = pair.client.stat(path("small.txt")).unwrap();
    pair.pump(&BTreeMap::from([(whole, "big.bin")]));
    let pos = |f: &dyn Fn(&Event) -> bool| pair.events.iter().position(f).unwrap();
    let attr = pos(&|e| matches!(e, Event::Attr { id, .. } if *id == stat));
    let done = pos(&|e| matches!(e, Event::Done { id } if *id == whole));
    let pieces = pair.events[..attr]
        .iter()
        .filter(|e| matches!(e, Event::Data { .. }))
        .count();
    assert!(attr < done, "the stat's answer came before the read ended");
    assert!(
        pieces <= 1,
        "at most one piece went before the stat's answer, got {pieces}"
    );
}

#[test]
fn a_changed_version_is_refused_with_the_new_one() {
    let mut pair = Pair::new(sample_share(), ServerConfig::default(), 64);
    let id = pair
        .client
        .read(path("small.txt"), Some([1; 32]), 0, 5)
        .unwrap();
    pair.pump(&BTreeMap::from([(id, "small.txt")]));
    let root = *blake3::hash(b"hello").as_bytes();
    assert!(pair.events.iter().any(
        |e| matches!(e, Event::Version { id: i, version } if *i == id && version.root == root)
    ));
    assert!(pair.events.iter().any(|e| matches!(e,
        Event::Failed { id: i, failure: Failure::Remote(ErrorCode::Changed, _) } if *i == id)));
    assert!(pair.data_of(id).is_empty());
}

#[test]
fn a_tampered_piece_hands_on_nothing() {
    let mut pair = Pair::new(sample_share(), ServerConfig::default(), 64);
    let mut n = 0;
    // Flip one data byte of the second piece.
    pair.tamper = Some(Box::new(move |p: &mut Vec<u8>| {
        n += 1;
        if n == 2 {
            let last = p.len() - 10;
            p[last] ^= 0x40;
        }
    }));
    let id = pair
        .client
        .read(path("big.bin"), None, 0, u64::MAX)
        .unwrap();
    let stat = pair.client.stat(path("small.txt")).unwrap();
    pair.pump(&BTreeMap::from([(id, "big.bin")]));
    let failed = pair
        .events
        .iter()
        .any(|e| matches!(e, Event::Failed { id: i, failure: Failure::Integrity } if *i == id));
    assert!(failed, "{:?}", pair.events);
    assert_eq!(
        pair.data_of(id).len() as u64,
        ferry_share::server::DEFAULT_PIECE,
        "only the first, verified piece was handed on"
    );
    // The client cancelled the rest of the read; pieces already sent were dropped, and the session goes on.
    assert!(pair
        .events
        .iter()
        .any(|e| matches!(e, Event::Attr { id: i, .. } if *i == stat)));
    assert_eq!(pair.server.in_flight(), 0);
}

#[test]
fn cancelled_reads_stop_and_the_session_goes_on() {
    let mut pair = Pair::new(sample_share(), ServerConfig::default(), 64);
    let id = pair
        .client
        .read(path("big.bin"), None, 0, u64::MAX)
        .unwrap();
    pair.client.cancel(id);
    let stat = pair.client.stat(path("small.txt")).unwrap();
    pair.pump(&BTreeMap::from([(id, "big.bin")]));
    assert!(pair.data_of(id).is_empty());
    assert!(pair
        .events
        .iter()
        .any(|e| matches!(e, Event::Attr { id: i, .. } if *i == stat)));
    assert_eq!(pair.server.in_flight(), 0);
}

#[test]
fn too_many_requests_are_answered_busy() {
    let config = ServerConfig {
        max_in_flight: 2,
        ..ServerConfig::default()
    };
    let mut pair = Pair::new(sample_share(), config, 8);
    // Before the hello the client does not know the limit: the third request is refused by the server.
    let ids: Vec<u32> = (0..3)
        .map(|_| pair.client.stat(path("small.txt")).unwrap())
        .collect();
    // Hold the server's jobs so all three are in flight at once.
    while let Some(p) = pair.client.poll_transmit() {
        pair.server.handle(&p).unwrap();
    }
    let jobs: Vec<Job> = std::iter::from_fn(|| pair.server.next_job()).collect();
    assert_eq!(jobs.len(), 2);
    for job in jobs {
        pair.run_job(job);
    }
    pair.pump(&BTreeMap::new());
    assert!(pair.events.iter().any(|e| matches!(e,
        Event::Failed { id, failure: Failure::Remote(ErrorCode::Busy, _) } if *id == ids[2])));
    // After the hello, the client keeps to the server's limit itself.
    assert!(pair.client.has_room());
    pair.client.stat(path("small.txt")).unwrap();
    pair.client.stat(path("small.txt")).unwrap();
    assert!(pair.client.stat(path("small.txt")).is_err());
}

#[test]
fn subscribers_hear_of_changes() {
    let mut pair = Pair::new(sample_share(), ServerConfig::default(), 64);
    pair.client.subscribe().unwrap();
    pair.pump(&BTreeMap::new());
    pair.server.changed(&[path("small.txt"), SharePath::root()]);
    pair.pump(&BTreeMap::new());
    assert!(pair.events.contains(&Event::Changed {
        paths: vec![path("small.txt"), SharePath::root()]
    }));
}

#[test]
fn a_client_that_breaks_the_protocol_ends_its_session() {
    let mut server = Server::new(ServerConfig::default());
    let mut stat = Vec::new();
    wire::Request::Stat {
        id: 1,
        path: SharePath::root(),
    }
    .encode(&mut stat);
    assert!(server.handle(&stat).is_err(), "no hello first");
    let mut server = Server::new(ServerConfig::default());
    let mut client = Client::new(4);
    server.handle(&client.poll_transmit().unwrap()).unwrap();
    server.handle(&stat).unwrap();
    assert!(server.handle(&stat).is_err(), "a duplicate id in flight");
}

#[test]
fn a_pull_switches_the_connection_and_goes_alone() {
    // A pull beside another request in flight is refused; the other request is answered.
    let mut pair = Pair::new(sample_share(), ServerConfig::default(), 8);
    let stat = pair.client.stat(path("small.txt")).unwrap();
    let refused = pair.client.pull(path("small.txt")).unwrap();
    while let Some(p) = pair.client.poll_transmit() {
        pair.server.handle(&p).unwrap();
    }
    pair.pump(&BTreeMap::new());
    assert!(pair
        .events
        .iter()
        .any(|e| matches!(e, Event::Attr { id, .. } if *id == stat)));
    assert!(pair.events.iter().any(|e| matches!(e,
        Event::Failed { id, failure: Failure::Remote(ErrorCode::BadRequest, _) } if *id == refused)));
    assert!(!pair.server.switched());

    // A pull of a missing path fails and the session goes on; a pull alone switches it.
    let missing = pair.client.pull(path("nope")).unwrap();
    pair.pump(&BTreeMap::new());
    assert!(pair.events.iter().any(|e| matches!(e,
        Event::Failed { id, failure: Failure::Remote(ErrorCode::NotFound, _) } if *id == missing)));
    let pull = pair.client.pull(path("big.bin")).unwrap();
    pair.pump(&BTreeMap::new());
    assert!(pair.server.switched());
    assert_eq!(pair.events.last(), Some(&Event::Transfer { id: pull }));
    assert_eq!(pair.sent_kinds.last(), Some(&wire::TRANSFER));
    // From here on the session takes no packet: they belong to the transfer protocol.
    pair.client.stat(path("small.txt")).unwrap();
    let p = pair.client.poll_transmit().unwrap();
    assert!(pair.server.handle(&p).is_err());
    assert!(pair.server.next_job().is_none());
}

#[test]
fn a_pull_that_leaves_the_share_is_refused_by_its_id() {
    let mut pair = Pair::new(sample_share(), ServerConfig::default(), 8);
    pair.pump(&BTreeMap::new());
    for bad in [&b".."[..], b"/etc/passwd", b"a/../../b", b"a\0b"] {
        let mut packet = vec![wire::PULL, 9, 0, 0, 0];
        ferry_wire::Put::put_bytes16(&mut packet, bad);
        pair.server.handle(&packet).unwrap();
        assert!(pair.server.next_job().is_none(), "nothing resolved");
        let answer = pair.server.poll_transmit().unwrap();
        assert!(matches!(
            wire::Response::decode(&answer).unwrap(),
            wire::Response::Error {
                id: 9,
                code: ErrorCode::UnsafePath,
                ..
            }
        ));
        assert!(pair.server.next_refusal().is_some());
    }
    assert!(!pair.server.switched());
}
