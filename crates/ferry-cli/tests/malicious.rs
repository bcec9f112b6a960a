//! A lying sender against the real `ferry receive`.
//!
//! The liar runs in the test process and speaks the real protocol: it announces itself in the
//! world's same-host rendezvous, accepts the receiver on 127.0.0.1, runs the real handshake with
//! the code, and then writes a crafted offer, manifest and data through the secure channel. For
//! every lie the receiver must stop with the documented exit status and `--json` error code,
//! create nothing outside `--out`, and leave no file under a final name that was not completely
//! received and verified.

mod common;

use std::fs;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Output};
use std::time::{Duration, Instant};

use common::*;
use ferry_channel::blocking::{self, SecureReader, SecureWriter};
use ferry_channel::{Auth, Config, Handshake, Role};
use ferry_rendezvous::Code;
use ferry_transfer::manifest::{Entry, EntryKind, Manifest, ENTRY_OVERHEAD};
use ferry_transfer::wire::{self, OfferHeader, Put, Reader};
use ferry_transfer::{Totals, TransferError, DEFAULT_MAX_MANIFEST};
use ferry_tree::hash::FileHasher;
use ferry_tree::path::{MAX_NAME, MAX_PATH};

const CODE: &str = "7-apple-orbit-violin";
/// How long the liar waits for the receiver at each step (a receiver that hangs fails the test).
const LIAR_PATIENCE: Duration = Duration::from_secs(30);

/// How the liar ends after its data packets.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// Waits for the receiver's verdict (Done or an error), then closes properly.
    Verdict,
    /// Sends the authenticated end of stream: a clean close in the middle of the transfer.
    Close,
    /// Cuts the TCP connection without the authenticated end of stream.
    Cut,
}

/// One lie: an offer of `entries` (announcing `announced` entries and `manifest_bytes` bytes of
/// manifest if set), then `data` packets.
struct Lie {
    entries: Vec<Entry>,
    announced: Option<u64>,
    manifest_bytes: Option<u64>,
    /// Offered instead of `entries`: a manifest too large to hold in the test process.
    many: Option<Many>,
    data: Vec<Vec<u8>>,
    ending: Ending,
    /// Offered as a text message.
    text: bool,
}

/// A manifest of `count` entries made one at a time by `entry(i)` and encoded page by page.
#[derive(Clone, Copy)]
struct Many {
    count: u64,
    entry: fn(u64) -> Entry,
}

impl Lie {
    fn offer(entries: Vec<Entry>) -> Lie {
        Lie {
            entries,
            announced: None,
            manifest_bytes: None,
            many: None,
            data: Vec::new(),
            ending: Ending::Verdict,
            text: false,
        }
    }
}

/// What the liar saw of the receiver.
#[derive(Debug, Default)]
struct Seen {
    /// The receiver accepted the offer.
    accepted: bool,
    /// The error code the receiver sent over the channel, if any.
    error: Option<String>,
    /// The receiver acknowledged everything (MSG_DONE).
    done: bool,
}

/// The outcome of one lie.
struct Verdict {
    /// Keeps the world's directories until the checks are done.
    _world: World,
    /// The receiver's `--out`, a subdirectory of the watched `dest` directory.
    out: PathBuf,
    recv: Measured,
    seen: Seen,
}

impl Verdict {
    fn output(&self) -> &Output {
        &self.recv.output
    }

    /// Asserts the documented exit status and JSON code, and that no offer was ever shown.
    fn assert_refused_offer(&self, what: &str, exit: i32, code: &str) {
        assert_failure(what, self.output(), exit, code);
        assert!(
            event(&events(&self.output().stdout), "offer").is_none(),
            "{what}: an unsafe offer must be refused before it is shown"
        );
        assert!(!self.seen.accepted, "{what}: the receiver accepted");
        assert_eq!(
            self.seen.error.as_deref(),
            Some(code),
            "{what}: the receiver tells the sender why it stops"
        );
        let left = list_all(&self.out);
        assert!(left.is_empty(), "{what}: written into --out: {left:?}");
    }
}

fn entry(path: &[u8], kind: EntryKind, size: u64) -> Entry {
    Entry {
        path: path.to_vec(),
        kind,
        size,
        mode: 0o644,
        mtime: 1_000_000,
        mtime_nsec: 0,
        target: Vec::new(),
    }
}

fn file(path: &[u8], size: u64) -> Entry {
    entry(path, EntryKind::File, size)
}

fn dir(path: &[u8]) -> Entry {
    entry(path, EntryKind::Dir, 0)
}

/// One data packet holding `records`.
fn data_packet(records: &[&[u8]]) -> Vec<u8> {
    let mut p = vec![wire::MSG_DATA];
    for r in records {
        p.put(r);
    }
    p
}

fn rec_start(index: u32) -> Vec<u8> {
    let mut r = vec![wire::REC_START];
    r.put_u32(index);
    r.put_u64(0);
    r
}

fn rec_data(data: &[u8]) -> Vec<u8> {
    let mut r = vec![wire::REC_DATA];
    r.put_u32(data.len() as u32);
    r.put(data);
    r
}

fn rec_end(hash: &[u8; 32]) -> Vec<u8> {
    let mut r = vec![wire::REC_END];
    r.put(hash);
    r
}

/// BLAKE3 of a file of at most one chunk, as the receiver computes it.
fn file_hash(data: &[u8]) -> [u8; 32] {
    let mut h = FileHasher::default();
    h.start(data.len() as u64, &[]);
    h.update(data);
    h.finish().expect("all bytes hashed")
}

/// The whole data stream of one small file with index `index`: start, bytes, end, finish.
fn whole_file(index: u32, data: &[u8], claimed_hash: &[u8; 32]) -> Vec<u8> {
    data_packet(&[
        &rec_start(index),
        &rec_data(data),
        &rec_end(claimed_hash),
        &[wire::REC_FINISH],
    ])
}

/// Accepts one connection within [`LIAR_PATIENCE`].
fn accept_within(listener: &TcpListener) -> Result<TcpStream, String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + LIAR_PATIENCE;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(|e| e.to_string())?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err("the receiver never connected".into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
}

/// Reads the receiver's next message: `Ok(Some(type, body))`, `Ok(None)` when the stream ended.
fn next_message(rx: &mut SecureReader<TcpStream>) -> Option<Vec<u8>> {
    match rx.recv() {
        Ok(Some(p)) if !p.is_empty() => Some(p.to_vec()),
        _ => None,
    }
}

/// Records an error message from the receiver in `seen`; true if `msg` was one.
fn note_error(msg: &[u8], seen: &mut Seen) -> bool {
    if msg[0] != wire::MSG_ERROR {
        return false;
    }
    if let TransferError::Remote { code, .. } = wire::decode_error_body(&mut Reader::new(&msg[1..]))
    {
        seen.error = Some(code);
    }
    true
}

fn send_offer(tx: &mut SecureWriter<TcpStream>, lie: &Lie) -> Result<(), String> {
    if let Some(many) = lie.many {
        return send_many(tx, many, lie.manifest_bytes);
    }
    let m = Manifest {
        entries: lie.entries.clone(),
        ..Default::default()
    };
    let mut msg = Vec::new();
    OfferHeader {
        entries: lie.announced.unwrap_or(m.entries.len() as u64),
        manifest_bytes: lie.manifest_bytes.unwrap_or(m.encoded_len()),
        totals: Totals::of(&m.entries).expect("totals"),
        bytes_allocated: 0,
        offer_id: m.offer_id(),
        text: lie.text,
    }
    .encode(&mut msg);
    let err = |e: ferry_channel::ChannelError| e.to_string();
    tx.send(&msg).map_err(err)?;
    let mut next = 0;
    while next < m.entries.len() {
        m.encode_page(&mut next, wire::MAX_PAGE, &mut msg);
        tx.send(&msg).map_err(err)?;
    }
    // An empty early part: the lie's data comes after the answer.
    tx.send(&[wire::MSG_EARLY_END]).map_err(err)?;
    tx.flush().map_err(err)
}

/// Offers `many` (announcing `manifest_bytes` bytes of manifest if set, its true size if not) with
/// honest totals and offer id, streaming its pages: the liar never holds the manifest, so that the
/// receiver's memory is measured, not the test's (a spawned child starts from its parent's peak).
fn send_many(
    tx: &mut SecureWriter<TcpStream>,
    many: Many,
    manifest_bytes: Option<u64>,
) -> Result<(), String> {
    let mut totals = Totals::default();
    let mut bytes = 0u64;
    for i in 0..many.count {
        let e = (many.entry)(i);
        bytes += e.encoded_len() as u64;
        let t = Totals::of(std::slice::from_ref(&e)).expect("totals");
        totals.files += t.files;
        totals.dirs += t.dirs;
        totals.symlinks += t.symlinks;
        totals.bytes += t.bytes;
    }
    // The offer id is the BLAKE3 of the entries' encodings, which FileHasher computes as well.
    let mut id = FileHasher::default();
    id.start(bytes, &[]);
    let mut buf = Vec::new();
    for i in 0..many.count {
        buf.clear();
        (many.entry)(i).encode(&mut buf);
        id.update(&buf);
    }
    let mut msg = Vec::new();
    OfferHeader {
        entries: many.count,
        manifest_bytes: manifest_bytes.unwrap_or(bytes),
        totals,
        bytes_allocated: 0,
        offer_id: id.finish().expect("all bytes hashed"),
        text: false,
    }
    .encode(&mut msg);
    let err = |e: ferry_channel::ChannelError| e.to_string();
    tx.send(&msg).map_err(err)?;
    let mut i = 0;
    while i < many.count {
        msg.clear();
        msg.put_u8(wire::MSG_MANIFEST);
        msg.put_u32(0);
        let mut n = 0u32;
        while i < many.count {
            // The pages carry each entry relative to the one before it.
            let (e, prev) = ((many.entry)(i), i.checked_sub(1).map(many.entry));
            if msg.len() + e.compact_len(prev.as_ref()) > wire::MAX_PAGE {
                break;
            }
            e.encode_compact(prev.as_ref(), &mut msg);
            n += 1;
            i += 1;
        }
        msg[1..5].copy_from_slice(&n.to_le_bytes());
        tx.send(&msg).map_err(err)?;
    }
    tx.send(&[wire::MSG_EARLY_END]).map_err(err)?;
    tx.flush().map_err(err)
}

/// Sends one data packet the way the engine does: sealed in place in the writer's frame buffer.
fn send_data(tx: &mut SecureWriter<TcpStream>, packet: &[u8]) -> Result<(), String> {
    let buf = tx.payload_buf(packet.len()).map_err(|e| e.to_string())?;
    buf.copy_from_slice(packet);
    tx.send_payload_buf(packet.len())
        .and_then(|_| tx.flush())
        .map_err(|e| e.to_string())
}

/// The lying sender: handshake with the real receiver, then the lie. Write errors after the offer
/// are expected (a receiver that refuses goes away) and only end the lie.
fn run_liar(listener: TcpListener, code: Code, lie: Lie) -> Result<Seen, String> {
    let mut stream = accept_within(&listener)?;
    stream
        .set_read_timeout(Some(LIAR_PATIENCE))
        .map_err(|e| e.to_string())?;
    let hs = Handshake::new(
        Role::Responder,
        Config::ferry(),
        Auth::Code(code.password()),
    );
    let est = blocking::handshake(&mut stream, hs).map_err(|e| format!("handshake: {e}"))?;
    let (mut rx, mut tx) = blocking::split_tcp(stream, est).map_err(|e| e.to_string())?;
    let mut seen = Seen::default();
    // An honest sender announces its lanes first; the liar takes the session's connection alone.
    if tx.send(&ferry_channel::lanes::announcement(1)).is_err()
        || send_offer(&mut tx, &lie).is_err()
    {
        return Ok(seen);
    }
    let Some(answer) = next_message(&mut rx) else {
        return Ok(seen);
    };
    if note_error(&answer, &mut seen) || answer[0] != wire::MSG_ACCEPT {
        return Ok(seen);
    }
    seen.accepted = true;
    let resume_pages = Reader::new(&answer[1..]).u32().unwrap_or(0);
    for _ in 0..resume_pages {
        next_message(&mut rx);
    }
    for p in &lie.data {
        if send_data(&mut tx, p).is_err() {
            break;
        }
    }
    match lie.ending {
        Ending::Verdict => {}
        Ending::Close => {
            let _ = tx.close();
        }
        Ending::Cut => {
            let _ = rx.get_ref().shutdown(Shutdown::Both);
            return Ok(seen);
        }
    }
    if let Some(msg) = next_message(&mut rx) {
        if !note_error(&msg, &mut seen) && msg[0] == wire::MSG_DONE {
            seen.done = true;
        }
    }
    Ok(seen)
}

/// Runs `lie` against a real `ferry receive --json --yes` into `dest/out`, and checks that nothing
/// appeared in the world outside `--out`.
fn attack(lie: Lie) -> Verdict {
    attack_with(|_| lie)
}

/// [`attack`] with a lie that may name places in the world (`make` gets it before anything runs).
fn attack_with(make: impl FnOnce(&World) -> Lie) -> Verdict {
    let world = World::new();
    let lie = make(&world);
    let dest = world.path("dest");
    fs::create_dir(&dest).unwrap();
    let out = dest.join("out");
    let world_before = top_level(world.dir.path());

    let (recv, seen) = lie_to(&world, lie, || world.spawn_receive(CODE, &out));

    let outside: Vec<_> = list_all(&dest)
        .into_iter()
        .filter(|p| !p.starts_with(&out))
        .collect();
    assert!(outside.is_empty(), "created outside --out: {outside:?}");
    assert_eq!(
        top_level(world.dir.path()),
        world_before,
        "created next to the destination"
    );
    Verdict {
        _world: world,
        out,
        recv,
        seen,
    }
}

/// Runs `lie` against the receiver that `spawn` starts (once the liar is announced); returns the
/// receiver's output and what the liar saw.
fn lie_to(world: &World, lie: Lie, spawn: impl FnOnce() -> Child) -> (Measured, Seen) {
    let code: Code = CODE.parse().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let _announcement = world.announce(&code, listener.local_addr().unwrap());
    let liar = std::thread::spawn(move || run_liar(listener, code, lie));
    let recv = finish_measured(spawn());
    let seen = liar
        .join()
        .expect("lying sender panicked")
        .unwrap_or_else(|e| panic!("lying sender: {e}"));
    (recv, seen)
}

fn top_level(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// Offers `entries` with the first file's data after them; the receiver must refuse the offer as
/// an unsafe path before it is shown or anything is written.
fn expect_unsafe_offer(what: &str, entries: Vec<Entry>) {
    expect_unsafe_offer_with(what, |_| entries);
}

/// [`expect_unsafe_offer`] with entries that may name places in the world.
fn expect_unsafe_offer_with(what: &str, entries: impl FnOnce(&World) -> Vec<Entry>) {
    attack_with(|w| {
        let entries = entries(w);
        let index = entries.iter().position(|e| e.kind == EntryKind::File);
        let mut lie = Lie::offer(entries);
        if let Some(i) = index {
            let content = vec![b'x'; lie.entries[i].size as usize];
            lie.data = vec![whole_file(i as u32, &content, &file_hash(&content))];
        }
        lie
    })
    .assert_refused_offer(what, 8, "unsafe-path");
}

/// Control: the liar telling the truth is accepted, so every refusal below is the receiver's
/// judgement of the lie and not an artefact of the fake sender.
#[test]
fn honest_fake_sender_is_accepted() {
    let content = b"exactly what was offered".to_vec();
    let mut lie = Lie::offer(vec![dir(b"d"), file(b"d/f", content.len() as u64)]);
    lie.data = vec![whole_file(1, &content, &file_hash(&content))];
    let v = attack(lie);
    assert_success("receive from the honest fake sender", v.output());
    assert!(v.seen.accepted && v.seen.done, "{:?}", v.seen);
    assert_eq!(fs::read(v.out.join("d/f")).unwrap(), content);
    assert_eq!(
        event(&events(&v.output().stdout), "done").unwrap()["files"],
        1
    );
}

#[test]
fn dot_dot_component_is_refused() {
    expect_unsafe_offer("../escaped", vec![file(b"../escaped", 4)]);
    expect_unsafe_offer(
        "a/../../escaped",
        vec![dir(b"a"), file(b"a/../../escaped", 4)],
    );
}

#[test]
fn absolute_path_is_refused() {
    // It would land in the watched directory next to --out.
    expect_unsafe_offer_with("absolute", |w| {
        let target = w.path("dest/absolute-escape");
        vec![file(target.as_os_str().as_encoded_bytes(), 4)]
    });
}

#[test]
fn duplicate_names_are_refused() {
    expect_unsafe_offer("duplicate", vec![file(b"a", 4), file(b"a", 4)]);
}

#[test]
fn file_and_directory_with_the_same_name_are_refused() {
    expect_unsafe_offer("file then dir", vec![file(b"a", 4), dir(b"a")]);
    expect_unsafe_offer("dir then file", vec![dir(b"a"), file(b"a", 4)]);
    expect_unsafe_offer("file under a file", vec![file(b"a", 4), file(b"a/b", 4)]);
}

#[test]
fn nul_in_a_name_is_refused() {
    expect_unsafe_offer("NUL", vec![file(b"a\0b", 4)]);
}

#[test]
fn slash_in_a_name_without_its_parent_is_refused() {
    expect_unsafe_offer("orphan", vec![file(b"a/b", 4)]);
    expect_unsafe_offer("deep orphan", vec![dir(b"a"), file(b"a/b/c", 4)]);
}

#[test]
fn billion_announced_entries_fail_fast_in_little_memory() {
    let mut lie = Lie::offer(vec![file(b"a", 4)]);
    lie.announced = Some(1_000_000_000);
    let v = attack(lie);
    v.assert_refused_offer("10^9 entries", 8, "too-many-entries");
    assert!(
        v.recv.elapsed < Duration::from_secs(5),
        "refusing took {:?}",
        v.recv.elapsed
    );
    // Even 8 bytes per announced entry would be 8 GB; the receiver stays at its baseline.
    assert!(
        v.recv.max_rss_kib < 64 * 1024,
        "peak memory {} KiB",
        v.recv.max_rss_kib
    );
}

/// A path of exactly [`MAX_PATH`] bytes (17 names of at most 255 bytes), unique by `i`.
fn longest_path(i: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(MAX_PATH);
    for _ in 0..15 {
        p.extend_from_slice(&[b'd'; MAX_NAME]);
        p.push(b'/');
    }
    p.extend_from_slice(&[b'e'; 128]);
    p.push(b'/');
    p.extend_from_slice(format!("{i:0>127}").as_bytes());
    assert_eq!(p.len(), MAX_PATH);
    p
}

/// Asserts that the receiver refused with `code` and stayed within `limit_mib` of memory (the
/// liar streams its manifest, so it may not have read the receiver's reason).
fn assert_refused_in_memory(what: &str, v: &Verdict, code: &str, limit_mib: u64) {
    eprintln!("{what}: receiver peak {} KiB", v.recv.max_rss_kib);
    assert_failure(what, v.output(), 8, code);
    assert!(!v.seen.accepted, "{what}: the receiver accepted");
    assert!(
        event(&events(&v.output().stdout), "offer").is_none(),
        "{what}: shown before it was refused"
    );
    assert!(list_all(&v.out).is_empty(), "{what}: written into --out");
    assert!(
        v.recv.max_rss_kib <= limit_mib * 1024,
        "{what}: receiver peak memory {} KiB, over {limit_mib} MiB",
        v.recv.max_rss_kib
    );
}

/// Ten million entries (280 MB of manifest, about 1.1 GB as the receiver used to hold it) are
/// within the entry limit but not the manifest limit: refused from the offer header, before any
/// page is read.
#[test]
fn ten_million_entries_are_refused_before_the_manifest_is_read() {
    let mut lie = Lie::offer(Vec::new());
    lie.many = Some(Many {
        count: 10_000_000,
        entry: |_| file(b"a", 0),
    });
    let v = attack(lie);
    assert_refused_in_memory("10^7 entries", &v, "manifest-too-large", 64);
    let ev = events(&v.output().stdout);
    let message = event(&ev, "error").unwrap()["message"].to_string();
    assert!(message.contains("--max-manifest"), "{message}");
}

/// 100,000 entries with 4096-byte paths are 412 MB of manifest (404 MB of receiver memory before
/// the limit). Announced truthfully they are refused from the header; announced as a manifest that
/// fits the limit exactly, they are refused at the first page past it. Either way the receiver stays
/// within the product's 128 MiB for 100k files.
#[test]
fn hundred_thousand_longest_names_stay_within_128_mib() {
    let many = Many {
        count: 100_000,
        entry: |i| file(&longest_path(i), 0),
    };
    let mut lie = Lie::offer(Vec::new());
    lie.many = Some(many);
    let v = attack(lie);
    assert_refused_in_memory("honest 412 MB", &v, "manifest-too-large", 128);

    let mut lie = Lie::offer(Vec::new());
    lie.many = Some(many);
    lie.manifest_bytes = Some(DEFAULT_MAX_MANIFEST - many.count * ENTRY_OVERHEAD);
    let v = attack(lie);
    assert_refused_in_memory("412 MB announced as 54 MB", &v, "protocol", 128);
}

/// The smallest entries (distinct 4-byte names) filling the default manifest limit exactly pass
/// every check and are accepted; the receiver still stays within 128 MiB (what is held for an
/// entry is at most what the limit counts for it).
#[test]
fn smallest_entries_filling_the_limit_stay_within_128_mib() {
    const NAME: u64 = 4;
    let per_entry = ENTRY_OVERHEAD + file(&[b'x'; NAME as usize], 0).encoded_len() as u64;
    let mut lie = Lie::offer(Vec::new());
    lie.many = Some(Many {
        count: DEFAULT_MAX_MANIFEST / per_entry,
        entry: |i| {
            const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
            let d = |k: u32| DIGITS[(i / 62u64.pow(k) % 62) as usize];
            file(&[d(3), d(2), d(1), d(0)], 0)
        },
    });
    lie.ending = Ending::Close;
    let v = attack(lie);
    eprintln!("receiver peak {} KiB", v.recv.max_rss_kib);
    assert!(v.seen.accepted, "{:?}", v.output());
    assert_failure("no data after the offer", v.output(), 4, "peer-gone");
    assert!(
        v.recv.max_rss_kib <= 128 * 1024,
        "receiver peak memory {} KiB, over 128 MiB",
        v.recv.max_rss_kib
    );
}

#[test]
fn more_data_than_the_declared_size_is_refused() {
    let content = [7u8; 20];
    let mut lie = Lie::offer(vec![file(b"f", 10)]);
    lie.data = vec![whole_file(0, &content, &file_hash(&content))];
    let v = attack(lie);
    assert_failure("20 bytes for 10", v.output(), 8, "size-mismatch");
    assert_eq!(v.seen.error.as_deref(), Some("size-mismatch"));
    assert_only_verified_finals(&v.out, &[]);
}

#[test]
fn less_data_than_the_declared_size_is_refused() {
    let content = [7u8; 50];
    let mut lie = Lie::offer(vec![file(b"f", 100)]);
    lie.data = vec![whole_file(0, &content, &file_hash(&content))];
    let v = attack(lie);
    assert_failure("50 bytes for 100", v.output(), 8, "size-mismatch");
    assert_eq!(v.seen.error.as_deref(), Some("size-mismatch"));
    assert_only_verified_finals(&v.out, &[]);
}

/// Issue 10: a text message is held in memory until verified, so a text offer over
/// [`wire::MAX_TEXT`] is refused from its header, before it is shown, and one that is not exactly
/// one file is a protocol error.
#[test]
fn text_offers_over_the_limit_or_of_several_entries_are_refused() {
    let size = wire::MAX_TEXT + 1;
    let mut lie = Lie::offer(vec![file(b"text", size)]);
    lie.text = true;
    lie.data = vec![whole_file(0, &vec![b'x'; size as usize], &[0; 32])];
    let v = attack(lie);
    v.assert_refused_offer("a text of 1 MiB + 1", 8, "text-too-large");
    let err = String::from_utf8_lossy(&v.output().stdout);
    assert!(err.contains("1048577 bytes"), "{err}");

    let mut lie = Lie::offer(vec![dir(b"d"), file(b"d/text", 3)]);
    lie.text = true;
    attack(lie).assert_refused_offer("a text of two entries", 8, "protocol");
}

/// The sender stops after half of a file and ends the stream (cleanly or not): the receiver reports
/// the peer gone and keeps the half only under its temporary name.
fn sender_stops_after_half(ending: Ending) {
    let mut lie = Lie::offer(vec![dir(b"d"), file(b"d/f", 100)]);
    lie.data = vec![data_packet(&[&rec_start(1), &rec_data(&[9; 50])])];
    lie.ending = ending;
    let v = attack(lie);
    assert_failure(
        &format!("{ending:?} after 50 of 100 bytes"),
        v.output(),
        4,
        "peer-gone",
    );
    assert!(v.seen.accepted);
    assert!(
        !v.out.join("d/f").exists(),
        "a half file under its final name"
    );
    assert_only_verified_finals(&v.out, &[]);
    let parts = partial_files(&v.out);
    assert!(
        parts.iter().all(|p| p.starts_with(v.out.join("d"))),
        "{parts:?}"
    );
}

#[test]
fn sender_closing_before_the_declared_size_is_peer_gone() {
    sender_stops_after_half(Ending::Close);
}

#[test]
fn sender_cutting_the_connection_before_the_declared_size_is_peer_gone() {
    sender_stops_after_half(Ending::Cut);
}

fn rec_chunk(chunk: u32, cv: &[u8; 32]) -> Vec<u8> {
    let mut r = vec![wire::REC_CHUNK];
    r.put_u32(chunk);
    r.put(cv);
    r
}

/// A `ferry receive CODE --out OUT` with `args` added (no `--yes` unless given), stdin not a terminal.
fn receive_with(world: &World, out: &Path, args: &[&str]) -> Child {
    world.spawn_receive_with(args, CODE, out)
}

/// Issue 9, item 3: a run that resumes an earlier, cut run of the same offer (the sender can cut
/// it itself) still asks; with no terminal and no `--yes` it is declined like any offer.
#[test]
fn a_resumed_offer_is_not_accepted_without_the_question() {
    const MIB: usize = 1 << 20;
    let world = World::new();
    let out = world.out();
    let size = 2 * MIB + 10;
    let content = pseudo_random(size, 91);
    let entries = vec![file(b"big.bin", size as u64)];
    let mut h = FileHasher::default();
    h.start(size as u64, &[]);
    h.update(&content[..MIB]);
    let cv = h.chunk_hashes()[0];

    // The first run gets one verified chunk, then the sender cuts the connection.
    let mut lie = Lie::offer(entries.clone());
    let half = MIB / 2;
    lie.data = vec![
        data_packet(&[&rec_start(0), &rec_data(&content[..half])]),
        data_packet(&[&rec_data(&content[half..MIB]), &rec_chunk(0, &cv)]),
    ];
    lie.ending = Ending::Cut;
    let (first, seen) = lie_to(&world, lie, || world.spawn_receive(CODE, &out));
    assert_failure("the cut first run", &first.output, 4, "peer-gone");
    assert!(seen.accepted, "the first run was accepted with --yes");
    assert_eq!(partial_files(&out).len(), 1, "the first chunk is kept");

    // The same offer again, to a receiver without --yes and without a terminal.
    let mut lie = Lie::offer(entries);
    lie.ending = Ending::Close;
    let (second, seen) = lie_to(&world, lie, || receive_with(&world, &out, &["--json"]));
    assert_failure("the resumed run", &second.output, 7, "declined");
    assert!(
        !seen.accepted,
        "a resumed offer was accepted without asking"
    );
    let stderr = String::from_utf8_lossy(&second.output.stderr);
    assert!(stderr.contains("--yes"), "says how to accept: {stderr}");
}

/// Control characters, DEL, C1 controls and bidi overrides: the tools of a terminal-escape attack
/// (clear the screen, move the cursor, fake a "done ... verified" line, reorder text).
const EVIL_NAME: &str = "evil\u{1b}[2J\u{1b}[H\u{7f}\u{9b}31m\u{202e}gpj.exe\r";
const EVIL_CODE: &str = "io\u{1b}[1A";
const EVIL_ERROR: &str =
    "\u{1b}[2J\u{1b}[Hdone: received 1 file, 9 B in 0.01 s, verified\n\u{7}\u{85}\u{2066}x\u{2069}";

/// An error message from the sender, as the engine encodes it.
fn error_packet(code: &str, message: &str) -> Vec<u8> {
    let mut p = vec![wire::MSG_ERROR];
    p.put_u8(code.len() as u8);
    p.put(code.as_bytes());
    p.put_u16(message.len() as u16);
    p.put(message.as_bytes());
    p
}

/// Whether `c` may not reach a terminal raw: C0 (but newline), DEL, C1, bidi controls.
fn dangerous(c: char) -> bool {
    (c.is_control() && c != '\n')
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Issue 9, item 9: a name and an error text full of terminal escapes reach stderr escaped, and
/// `--json` carries them exactly (JSON escapes them itself).
#[test]
fn terminal_escapes_from_the_peer_are_shown_escaped() {
    let lie = || {
        let mut lie = Lie::offer(vec![dir(EVIL_NAME.as_bytes()), file(b"plain", 4)]);
        lie.data = vec![error_packet(EVIL_CODE, EVIL_ERROR)];
        lie
    };
    let world = World::new();
    let out = world.out();
    let (text, seen) = lie_to(&world, lie(), || receive_with(&world, &out, &["--yes"]));
    assert!(seen.accepted);
    assert_eq!(
        text.output.status.code(),
        Some(1),
        "an unknown peer code is exit 1"
    );
    let stderr = String::from_utf8(text.output.stderr.clone()).expect("stderr is UTF-8");
    let bad: Vec<char> = stderr.chars().filter(|&c| dangerous(c)).collect();
    assert!(
        bad.is_empty(),
        "raw control characters {bad:?} on stderr: {stderr:?}"
    );
    assert!(
        stderr.contains("peer failed") && stderr.contains("\\x1b[2J"),
        "the error is shown, escaped: {stderr}"
    );
    assert!(
        stderr.contains("evil\\x1b[2J"),
        "the offered name is shown, escaped: {stderr}"
    );

    let world = World::new();
    let out = world.out();
    let (json, _) = lie_to(&world, lie(), || world.spawn_receive(CODE, &out));
    let ev = events(&json.output.stdout);
    let offer = event(&ev, "offer").expect("offer event");
    assert_eq!(offer["names"][0], EVIL_NAME, "{offer}");
    assert_eq!(offer["names_total"], 2, "{offer}");
    let error = event(&ev, "error").expect("error event");
    assert!(
        error["message"].as_str().unwrap().contains(EVIL_ERROR),
        "{error}"
    );
}

/// Issue 10: `-o NAME` keeps its own resume log. A run with `-o a` that is cut has created `a`;
/// the same offer received with `-o b`, where `b` is the user's own directory, must not take `b`
/// for the directory the earlier run created (and so merge into it and change its mode).
#[test]
fn a_renamed_run_does_not_claim_what_a_run_under_another_name_created() {
    let world = World::new();
    let out = world.out();
    let offer = || vec![dir(b"d"), file(b"d/f", 100)];
    let mut cut = Lie::offer(offer());
    cut.data = vec![data_packet(&[&rec_start(1), &rec_data(&[9; 50])])];
    cut.ending = Ending::Cut;
    let (first, _) = lie_to(&world, cut, || {
        receive_with(&world, &out, &["--json", "--yes", "-o", "a"])
    });
    assert_failure("-o a, cut", &first.output, 4, "peer-gone");
    assert!(out.join("a").is_dir());

    fs::create_dir(out.join("b")).unwrap();
    fs::set_permissions(
        out.join("b"),
        std::os::unix::fs::PermissionsExt::from_mode(0o751),
    )
    .unwrap();
    let mut whole = Lie::offer(offer());
    whole.data = vec![whole_file(1, &[9; 100], &file_hash(&[9; 100]))];
    let (second, _) = lie_to(&world, whole, || {
        receive_with(&world, &out, &["--json", "--yes", "-o", "b"])
    });
    assert_failure("-o b into the user's b", &second.output, 7, "conflict");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &fs::metadata(out.join("b")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o7777, 0o751, "the user's directory keeps its mode");
    assert!(
        list_all(&out.join("b")).is_empty(),
        "nothing written into b"
    );
}
