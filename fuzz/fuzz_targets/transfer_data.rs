//! Arbitrary packets (cut by u16 lengths) as the sender's file data after a valid, fixed offer, into
//! a real `receive` in a scratch directory: the early part (early packets of file records, its end
//! marker, its bound), then file records (start, data, chunk hashes, end, finish) and whatever else
//! arrives where data should. The receiver must never panic; when it reports
//! success, every file is in place with exactly its offered size and the sender was told Done.
#![no_main]

use ferry_channel_fuzz::transfer::{packets, Packets, Sent};
use ferry_transfer::manifest::{Entry, EntryKind, Manifest};
use ferry_transfer::wire::{self, OfferHeader};
use ferry_transfer::{receive, ReceiveOptions, Totals};
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;

fn entry(path: &str, kind: EntryKind, size: u64, target: &str) -> Entry {
    Entry {
        path: path.as_bytes().to_vec(),
        kind,
        size,
        mode: 0o644,
        mtime: 1_600_000_000,
        mtime_nsec: 5,
        target: target.as_bytes().to_vec(),
    }
}

/// The offer: a directory, three small files (one empty) and a symlink inside.
fn offer() -> (Manifest, Vec<Vec<u8>>) {
    let m = Manifest {
        entries: vec![
            entry("d", EntryKind::Dir, 0, ""),
            entry("d/a", EntryKind::File, 5, ""),
            entry("d/empty", EntryKind::File, 0, ""),
            entry("d/l", EntryKind::Symlink, 0, "a"),
            entry("c", EntryKind::File, 300, ""),
        ],
        ..Default::default()
    };
    let mut header = Vec::new();
    OfferHeader {
        entries: m.entries.len() as u64,
        manifest_bytes: m.encoded_len(),
        totals: Totals::of(&m.entries).expect("totals"),
        bytes_allocated: 0,
        offer_id: m.offer_id(),
        text: false,
    }
    .encode(&mut header);
    let mut page = Vec::new();
    m.encode_page(&mut 0, wire::MAX_PAGE, &mut page);
    (m, vec![header, page])
}

fn scratch() -> PathBuf {
    std::path::Path::new("/dev/shm").join(format!("ferry-fuzz-data-{}", std::process::id()))
}

fuzz_target!(|data: &[u8]| {
    let (m, mut stream) = offer();
    stream.extend(packets(data));
    let root = scratch();
    let _ = std::fs::remove_dir_all(&root);
    let mut opts = ReceiveOptions::new(root.join("out"));
    opts.partial_dir = Some(root.join("partial"));
    let mut sink = Sent::default();
    let result = receive(
        &mut Packets::new(stream),
        &mut sink,
        &opts,
        &mut |_| true,
        &mut (),
    );
    if result.is_ok() {
        for e in m.entries.iter().filter(|e| e.kind == EntryKind::File) {
            let path = root.join("out").join(e.path_lossy());
            let len = std::fs::metadata(&path).expect("a received file").len();
            assert_eq!(len, e.size, "{}", path.display());
        }
        assert_eq!(sink.types.last(), Some(&wire::MSG_DONE));
    }
});
