//! A hostile sender drives the wire format directly; the receiver must refuse with the right error,
//! write nothing outside its destination, and leave no file under a final name.

mod common;

use common::*;
use ferry_transfer::manifest::{Entry, EntryKind, Manifest};
use ferry_transfer::plain::{PlainSink, PlainSource};
use ferry_transfer::wire::{self, OfferHeader, Put};
use ferry_transfer::{receive, PacketSink, PacketSource, Totals, TransferError};
use ferry_tree::path::PathProblem;

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

/// Runs a receiver against a fake sender that offers `entries` (announcing `announced` entries if
/// given) and then sends `data` packets after the receiver accepts.
fn attack(
    entries: Vec<Entry>,
    announced: Option<u64>,
    data: Vec<Vec<u8>>,
) -> (TempDir, TransferError) {
    attack_early(entries, announced, Vec::new(), data)
}

/// [`attack`] whose early part is `early` (packets sent as they are, then the end marker).
fn attack_early(
    entries: Vec<Entry>,
    announced: Option<u64>,
    early: Vec<Vec<u8>>,
    data: Vec<Vec<u8>>,
) -> (TempDir, TransferError) {
    let t = TempDir::new("evil");
    let out = t.join("out");
    let (a, b) = tcp_pair();
    let sender = std::thread::spawn(move || {
        let mut sink = PlainSink::new(a.try_clone().unwrap());
        let mut source = PlainSource::new(a.try_clone().unwrap());
        let m = Manifest {
            entries,
            ..Default::default()
        };
        let mut msg = Vec::new();
        let header = OfferHeader {
            entries: announced.unwrap_or(m.entries.len() as u64),
            manifest_bytes: m.encoded_len(),
            totals: Totals::of(&m.entries).unwrap(),
            bytes_allocated: 0,
            offer_id: m.offer_id(),
            text: false,
        };
        header.encode(&mut msg);
        sink.send(&msg).unwrap();
        let mut next = 0;
        while next < m.entries.len() {
            m.encode_page(&mut next, wire::MAX_PAGE, &mut msg);
            sink.send(&msg).unwrap();
        }
        for p in &early {
            if sink.send(p).and_then(|_| sink.flush()).is_err() {
                return;
            }
        }
        let _ = sink.send(&[wire::MSG_EARLY_END]);
        let _ = sink.flush();
        // Wait for the answer (an error message ends the attack).
        let Ok(Some(answer)) = source.recv() else {
            return;
        };
        if answer[0] != wire::MSG_ACCEPT {
            return;
        }
        for p in &data {
            if sink.send(p).and_then(|_| sink.flush()).is_err() {
                return;
            }
        }
        // End the stream cleanly at a packet boundary: whatever is missing is the sender's fault.
        let _ = a.shutdown(std::net::Shutdown::Write);
        let _ = source.recv();
    });
    let mut sink = PlainSink::new(b.try_clone().unwrap());
    let mut source = PlainSource::new(b.try_clone().unwrap());
    let r = receive(
        &mut source,
        &mut sink,
        &opts(&out, &t.join("cache")),
        &mut |_| true,
        &mut (),
    );
    let _ = b.shutdown(std::net::Shutdown::Both);
    sender.join().unwrap();
    let err = r.expect_err("the receiver must refuse");
    // Nothing outside the destination: the temp root holds only `out` (and maybe `cache`).
    let top: Vec<_> = listing(t.path())
        .into_iter()
        .filter(|p| !p.contains('/'))
        .collect();
    assert!(top.iter().all(|p| p == "out" || p == "cache"), "{top:?}");
    (t, err)
}

fn expect_unsafe(entries: Vec<Entry>, want: PathProblem) {
    let (t, err) = attack(entries, None, Vec::new());
    match err {
        TransferError::UnsafePath { problem, .. } => assert_eq!(problem, want),
        other => panic!("expected {want:?}, got {other:?}"),
    }
    assert!(listing(&t.join("out")).is_empty());
}

#[test]
fn dot_dot_is_refused() {
    expect_unsafe(vec![file(b"../evil", 0)], PathProblem::DotDot);
    expect_unsafe(
        vec![dir(b"a"), file(b"a/../../evil", 0)],
        PathProblem::DotDot,
    );
}

#[test]
fn absolute_path_is_refused() {
    expect_unsafe(vec![file(b"/tmp/ferry-evil", 0)], PathProblem::Absolute);
}

#[test]
fn nul_in_name_is_refused() {
    expect_unsafe(vec![file(b"a\0b", 0)], PathProblem::Nul);
}

#[test]
fn empty_and_dot_components_are_refused() {
    expect_unsafe(
        vec![dir(b"a"), file(b"a//b", 0)],
        PathProblem::EmptyComponent,
    );
    expect_unsafe(vec![file(b".", 0)], PathProblem::Dot);
    expect_unsafe(vec![file(&[b'x'; 256], 0)], PathProblem::NameTooLong);
}

#[test]
fn slash_in_name_without_parent_is_refused() {
    let (t, err) = attack(vec![file(b"a/b", 0)], None, Vec::new());
    assert!(
        matches!(err, TransferError::MissingParent { .. }),
        "{err:?}"
    );
    assert!(listing(&t.join("out")).is_empty());
}

#[test]
fn duplicate_names_are_refused() {
    let (t, err) = attack(vec![file(b"a", 1), file(b"a", 1)], None, Vec::new());
    assert!(
        matches!(err, TransferError::DuplicatePath { .. }),
        "{err:?}"
    );
    assert!(listing(&t.join("out")).is_empty());
}

#[test]
fn file_and_dir_with_same_name_are_refused() {
    let (_, err) = attack(vec![file(b"a", 0), dir(b"a")], None, Vec::new());
    assert!(matches!(err, TransferError::FileDirClash { .. }), "{err:?}");
    let (t, err) = attack(vec![file(b"a", 0), file(b"a/b", 0)], None, Vec::new());
    assert!(matches!(err, TransferError::FileDirClash { .. }), "{err:?}");
    assert!(listing(&t.join("out")).is_empty());
}

#[test]
fn escaping_symlink_is_refused() {
    let mut link = entry(b"d/l", EntryKind::Symlink, 0);
    link.target = b"../../outside".to_vec();
    let (t, err) = attack(vec![dir(b"d"), link], None, Vec::new());
    assert!(
        matches!(err, TransferError::SymlinkEscapes { .. }),
        "{err:?}"
    );
    assert!(listing(&t.join("out")).is_empty());
}

#[test]
fn billion_announced_entries_are_refused_at_once() {
    let (t, err) = attack(vec![file(b"a", 0)], Some(1_000_000_000), Vec::new());
    match err {
        TransferError::TooManyEntries { announced, limit } => {
            assert_eq!(announced, 1_000_000_000);
            assert_eq!(limit, ferry_transfer::DEFAULT_MAX_ENTRIES);
        }
        other => panic!("{other:?}"),
    }
    assert!(listing(&t.join("out")).is_empty());
}

fn data_packet(records: &[&[u8]]) -> Vec<u8> {
    let mut p = vec![wire::MSG_DATA];
    for r in records {
        p.put(r);
    }
    p
}

fn start(index: u32) -> Vec<u8> {
    let mut r = vec![wire::REC_START];
    r.put_u32(index);
    r.put_u64(0);
    r
}

fn bytes(data: &[u8]) -> Vec<u8> {
    let mut r = vec![wire::REC_DATA];
    r.put_u32(data.len() as u32);
    r.put(data);
    r
}

fn end(hash: &[u8; 32]) -> Vec<u8> {
    let mut r = vec![wire::REC_END];
    r.put(hash);
    r
}

fn assert_no_final_and_no_temp(t: &TempDir) {
    let left = listing(&t.join("out"));
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn more_data_than_declared_is_refused() {
    let content = [7u8; 20];
    let h = *blake3::hash(&content).as_bytes();
    let packet = data_packet(&[&start(0), &bytes(&content), &end(&h), &[wire::REC_FINISH]]);
    let (t, err) = attack(vec![file(b"f", 10)], None, vec![packet]);
    match err {
        TransferError::SizeMismatch { declared, sent, .. } => {
            assert_eq!((declared, sent), (10, 20))
        }
        other => panic!("{other:?}"),
    }
    assert_no_final_and_no_temp(&t);
}

#[test]
fn less_data_than_declared_is_refused() {
    let content = [7u8; 50];
    let h = *blake3::hash(&content).as_bytes();
    let packet = data_packet(&[&start(0), &bytes(&content), &end(&h), &[wire::REC_FINISH]]);
    let (t, err) = attack(vec![file(b"f", 100)], None, vec![packet]);
    match err {
        TransferError::SizeMismatch { declared, sent, .. } => {
            assert_eq!((declared, sent), (100, 50))
        }
        other => panic!("{other:?}"),
    }
    assert_no_final_and_no_temp(&t);
}

#[test]
fn wrong_hash_is_refused() {
    let content = [7u8; 50];
    let packet = data_packet(&[
        &start(0),
        &bytes(&content),
        &end(&[0; 32]),
        &[wire::REC_FINISH],
    ]);
    let (t, err) = attack(vec![file(b"f", 50)], None, vec![packet]);
    assert!(matches!(err, TransferError::Integrity { .. }), "{err:?}");
    assert_no_final_and_no_temp(&t);
}

#[test]
fn skipping_a_file_is_refused() {
    let content = [7u8; 5];
    let h = *blake3::hash(&content).as_bytes();
    let packet = data_packet(&[&start(0), &bytes(&content), &end(&h), &[wire::REC_FINISH]]);
    let (t, err) = attack(vec![file(b"f", 5), file(b"g", 5)], None, vec![packet]);
    assert!(matches!(err, TransferError::Protocol(_)), "{err:?}");
    // The first file was complete and verified; the offer as a whole was not.
    assert_eq!(listing(&t.join("out")), vec!["f"]);
}

fn hole(len: u64) -> Vec<u8> {
    let mut r = vec![wire::REC_HOLE];
    r.put_u64(len);
    r
}

/// Issue 10, item 12: a hole record may not reach past the announced size (nor wrap around, nor
/// cover more than the rest of its chunk, which bounds the zeros one record makes the receiver
/// hash), nor come outside a file.
#[test]
fn holes_past_the_end_or_across_a_chunk_are_refused() {
    let chunk = ferry_transfer::CHUNK;
    let cases: [(u64, Vec<Vec<u8>>, &str); 5] = [
        (
            100,
            vec![start(0), hole(101)],
            "hole past the end of the file",
        ),
        (
            100,
            vec![start(0), hole(60), hole(41)],
            "hole past the end of the file",
        ),
        (
            100,
            vec![start(0), hole(60), hole(u64::MAX)],
            "hole past the end of the file",
        ),
        (
            3 * chunk,
            vec![start(0), hole(chunk + 1)],
            "hole across a chunk boundary",
        ),
        (100, vec![hole(1)], "hole outside a file"),
    ];
    for (size, records, why) in cases {
        let records: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        let (t, err) = attack(vec![file(b"f", size)], None, vec![data_packet(&records)]);
        match err {
            TransferError::Protocol(m) => assert_eq!(m, why),
            other => panic!("{why}: {other:?}"),
        }
        assert_no_final_and_no_temp(&t);
    }
}

#[test]
fn cut_stream_is_an_error() {
    let packet = data_packet(&[&start(0), &bytes(&[1; 10])]);
    let (t, err) = attack(vec![file(b"f", 100)], None, vec![packet]);
    assert!(matches!(err, TransferError::UnexpectedEnd), "{err:?}");
    assert!(!t.join("out/f").exists());
}

fn skip_record(index: u32, reason: &[u8]) -> Vec<u8> {
    let mut r = vec![wire::REC_SKIP];
    r.put_u32(index);
    r.put_u16(reason.len() as u16);
    r.put(reason);
    r
}

/// A skip record must name the next file, outside any file, with a bounded reason.
#[test]
fn skip_records_out_of_place_are_refused() {
    let content = [7u8; 5];
    let two = || vec![file(b"f", 5), file(b"g", 5)];
    let cases: [(&str, Vec<Vec<u8>>); 4] = [
        ("a later file", vec![skip_record(1, b"x")]),
        ("no file", vec![skip_record(7, b"x")]),
        (
            "inside a file",
            vec![start(0), bytes(&content), skip_record(1, b"x")],
        ),
        (
            "a reason too long",
            vec![skip_record(0, &[b'x'; wire::MAX_SKIP_REASON + 1])],
        ),
    ];
    for (what, records) in cases {
        let records: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        let (t, err) = attack(two(), None, vec![data_packet(&records)]);
        assert!(matches!(err, TransferError::Protocol(_)), "{what}: {err:?}");
        assert_no_final_and_no_temp(&t);
    }
    // Skipping the same file twice is skipping a later one.
    let (_, err) = attack(
        two(),
        None,
        vec![data_packet(&[&skip_record(0, b"x"), &skip_record(0, b"x")])],
    );
    assert!(matches!(err, TransferError::Protocol(_)), "{err:?}");
}

/// A data packet's records as an early packet.
fn early_packet(records: &[&[u8]]) -> Vec<u8> {
    let mut p = data_packet(records);
    p[0] = wire::MSG_EARLY;
    p
}

#[test]
fn an_early_part_over_its_bound_is_refused() {
    let size = 3 << 20;
    let content = vec![5u8; size];
    let half = wire::MAX_EARLY / 2;
    // Two packets of records that are right in themselves, together over the bound.
    let early = vec![
        early_packet(&[&start(0), &bytes(&content[..half])]),
        early_packet(&[&bytes(&content[half..2 * half])]),
    ];
    let (t, err) = attack_early(vec![file(b"f", size as u64)], None, early, Vec::new());
    match err {
        TransferError::Protocol(m) => assert!(m.contains("early data over"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_no_final_and_no_temp(&t);
}

#[test]
fn early_records_after_the_final_record_or_data_inside_the_early_part_are_refused() {
    let content = [7u8; 10];
    let h = *blake3::hash(&content).as_bytes();
    let whole = [
        &start(0)[..],
        &bytes(&content),
        &end(&h),
        &[wire::REC_FINISH],
    ];
    let after_finish = vec![early_packet(&whole), early_packet(&[&[wire::REC_FINISH]])];
    let (_, err) = attack_early(vec![file(b"f", 10)], None, after_finish, Vec::new());
    assert!(
        matches!(&err, TransferError::Protocol(m) if m.contains("after the end")),
        "{err:?}"
    );
    let data_inside = vec![data_packet(&whole)];
    let (_, err) = attack_early(vec![file(b"f", 10)], None, data_inside, Vec::new());
    assert!(
        matches!(&err, TransferError::Protocol(m) if m.contains("early data or its end")),
        "{err:?}"
    );
}

#[test]
fn an_early_part_holding_the_whole_stream_is_taken() {
    // The fake sender's early part holds every record, the final one too; nothing follows.
    let content = [9u8; 100];
    let h = *blake3::hash(&content).as_bytes();
    let whole = early_packet(&[&start(0), &bytes(&content), &end(&h), &[wire::REC_FINISH]]);
    let t = TempDir::new("early-whole");
    let out = t.join("out");
    let (a, b) = tcp_pair();
    let sender = std::thread::spawn(move || {
        let mut sink = PlainSink::new(a.try_clone().unwrap());
        let mut source = PlainSource::new(a.try_clone().unwrap());
        let m = Manifest {
            entries: vec![file(b"f", 100)],
            ..Default::default()
        };
        let mut msg = Vec::new();
        OfferHeader {
            entries: 1,
            manifest_bytes: m.encoded_len(),
            totals: Totals::of(&m.entries).unwrap(),
            bytes_allocated: 0,
            offer_id: m.offer_id(),
            text: false,
        }
        .encode(&mut msg);
        sink.send(&msg).unwrap();
        let mut next = 0;
        m.encode_page(&mut next, wire::MAX_PAGE, &mut msg);
        sink.send(&msg).unwrap();
        sink.send(&whole).unwrap();
        sink.send(&[wire::MSG_EARLY_END]).unwrap();
        sink.flush().unwrap();
        let answer = source.recv().unwrap().unwrap().to_vec();
        let done = source.recv().unwrap().unwrap().to_vec();
        (answer, done)
    });
    let mut sink = PlainSink::new(b.try_clone().unwrap());
    let mut source = PlainSource::new(b);
    let r = receive(
        &mut source,
        &mut sink,
        &opts(&out, &t.join("cache")),
        &mut |_| true,
        &mut (),
    );
    let (answer, done) = sender.join().unwrap();
    r.expect("received");
    assert!(wire::Answer::decode(&answer).unwrap().uses_early());
    assert_eq!(done, [wire::MSG_DONE]);
    assert_eq!(std::fs::read(out.join("f")).unwrap(), content);
}
