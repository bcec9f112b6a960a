//! The receiver's manifest limit: the memory an offer's manifest needs is checked against
//! `ReceiveOptions::max_manifest` from the announced size before any page is read, and every page
//! against the announced size.

use ferry_transfer::manifest::{Entry, EntryKind, Manifest};
use ferry_transfer::plain::PlainSource;
use ferry_transfer::wire::{self, OfferHeader};
use ferry_transfer::{read_offer, ReceiveOptions, Totals, TransferError};

fn manifest(n: usize) -> Manifest {
    Manifest {
        entries: (0..n)
            .map(|i| Entry {
                path: format!("file-{i}").into_bytes(),
                kind: EntryKind::File,
                size: 3,
                mode: 0o644,
                mtime: 1,
                mtime_nsec: 0,
                target: Vec::new(),
            })
            .collect(),
        ..Default::default()
    }
}

/// The offer of `m` announcing `manifest_bytes`, as length-prefixed packets in small pages.
fn offer_stream(m: &Manifest, manifest_bytes: u64) -> Vec<u8> {
    offer_in_pages(m, manifest_bytes, 1000)
}

/// The offer of `m` announcing `manifest_bytes`, in pages of at most `page` bytes.
fn offer_in_pages(m: &Manifest, manifest_bytes: u64, page: usize) -> Vec<u8> {
    let mut packets = Vec::new();
    let mut msg = Vec::new();
    OfferHeader {
        entries: m.entries.len() as u64,
        manifest_bytes,
        totals: Totals::of(&m.entries).unwrap(),
        bytes_allocated: 0,
        offer_id: m.offer_id(),
        text: false,
    }
    .encode(&mut msg);
    packets.push(msg.clone());
    let mut next = 0;
    while next < m.entries.len() {
        m.encode_page(&mut next, page, &mut msg);
        packets.push(msg.clone());
    }
    let mut stream = Vec::new();
    for p in packets {
        stream.extend_from_slice(&(p.len() as u32).to_le_bytes());
        stream.extend_from_slice(&p);
    }
    stream
}

fn read(stream: &[u8], max_manifest: u64) -> Result<Vec<Entry>, TransferError> {
    let mut opts = ReceiveOptions::new("unused");
    opts.max_manifest = max_manifest;
    read_offer(&mut PlainSource::new(stream), &opts).map(|(_, entries)| entries)
}

#[test]
fn the_limit_is_inclusive_and_checked_before_the_pages() {
    let m = manifest(100);
    let cost = m.received_cost();
    let stream = offer_stream(&m, m.encoded_len());
    assert_eq!(read(&stream, cost).unwrap(), m.entries);
    match read(&stream, cost - 1) {
        Err(e @ TransferError::ManifestTooLarge { needed, limit }) => {
            assert_eq!((needed, limit), (cost, cost - 1));
            assert_eq!(e.code().as_str(), "manifest-too-large");
        }
        other => panic!("{other:?}"),
    }
    // Refused from the header alone: the pages are never needed.
    let header_only = &stream[..4 + wire::OFFER_LEN];
    assert!(matches!(
        read(header_only, cost - 1),
        Err(TransferError::ManifestTooLarge { .. })
    ));
}

#[test]
fn a_manifest_longer_than_announced_is_refused_at_the_first_page_too_many() {
    let m = manifest(1000);
    let announced = 2000;
    let stream = offer_stream(&m, announced);
    // Cut the stream after the pages that fit the announced size and one more: the refusal must
    // come from that page, not from the end of the stream.
    let mut source = PlainSource::new(&stream[..]);
    let mut opts = ReceiveOptions::new("unused");
    opts.max_manifest = u64::MAX;
    let mut fed = 0usize;
    let mut cut = Vec::new();
    {
        use ferry_transfer::PacketSource;
        let header = source.recv().unwrap().unwrap().to_vec();
        cut.extend_from_slice(&(header.len() as u32).to_le_bytes());
        cut.extend_from_slice(&header);
        while fed <= announced as usize {
            let p = source.recv().unwrap().unwrap().to_vec();
            fed += p.len() - 5;
            cut.extend_from_slice(&(p.len() as u32).to_le_bytes());
            cut.extend_from_slice(&p);
        }
    }
    match read_offer(&mut PlainSource::new(&cut[..]), &opts) {
        Err(TransferError::Protocol(msg)) => assert!(msg.contains("longer"), "{msg}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_manifest_shorter_than_announced_is_refused() {
    let m = manifest(10);
    let stream = offer_stream(&m, m.encoded_len() + 1);
    match read(&stream, u64::MAX) {
        Err(TransferError::Protocol(msg)) => assert!(msg.contains("shorter"), "{msg}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn long_names_sharing_a_prefix_count_by_their_full_length() {
    // Each ~3,800-byte name differs from the one before only at its end: a few bytes each on the
    // wire, but every name is held whole, so the limit counts the plain encoding.
    // (read_offer checks each name, not the tree: the parents need not be entries.)
    let base = "d/".to_string() + &vec!["x".repeat(200); 19].join("/") + "/";
    let mut entries = vec![Entry {
        path: b"d".to_vec(),
        kind: EntryKind::Dir,
        size: 0,
        mode: 0o755,
        mtime: 1,
        mtime_nsec: 0,
        target: Vec::new(),
    }];
    entries.extend((0..200).map(|i| Entry {
        path: format!("{base}{i:04}").into_bytes(),
        kind: EntryKind::File,
        size: 3,
        mode: 0o644,
        mtime: 1,
        mtime_nsec: 0,
        target: Vec::new(),
    }));
    let m = Manifest {
        entries,
        ..Default::default()
    };
    assert!(
        m.compact_len() * 50 < m.encoded_len(),
        "{}",
        m.compact_len()
    );
    let cost = m.received_cost();
    let stream = offer_in_pages(&m, m.encoded_len(), 64 << 10);
    assert_eq!(read(&stream, cost).unwrap(), m.entries);
    assert!(matches!(
        read(&stream, cost - 1),
        Err(TransferError::ManifestTooLarge { .. })
    ));
    // Announcing the wire's size instead is a lie found at the second entry.
    let lie = offer_in_pages(&m, m.compact_len(), 64 << 10);
    match read(&lie, u64::MAX) {
        Err(TransferError::Protocol(msg)) => assert!(msg.contains("longer"), "{msg}"),
        other => panic!("{other:?}"),
    }
}
