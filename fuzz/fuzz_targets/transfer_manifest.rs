//! Arbitrary bytes into the receiver's offer and manifest decoding (`read_offer`, then the whole-tree
//! checks of `check_tree`), with a small manifest limit so that it is reached too. The first byte
//! picks the mode:
//! - even: the bytes are the packets themselves (offer header, pages), cut by u16 lengths;
//! - odd: the bytes are the body of one manifest page (entries), behind a page header and an offer
//!   header made to match it (count from the second byte, plain size, offer id and totals from
//!   the entries that decode, each relative to the one before), so the fuzzer's bytes reach every
//!   entry and tree rule.
//!
//! Decoding must never panic or allocate beyond the limit; an accepted manifest has the announced
//! size and re-encodes to entries that decode to the same.
#![no_main]

use ferry_channel_fuzz::transfer::{packets, Packets};
use ferry_transfer::manifest::{check_tree, Entry, Manifest};
use ferry_transfer::wire::{self, OfferHeader, Put, Reader};
use ferry_transfer::{read_offer, ReceiveOptions, Totals};
use libfuzzer_sys::fuzz_target;

/// Small enough to be reached by a fuzzer input, large enough for many entries.
const LIMIT: u64 = 256 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let stream = if mode % 2 == 0 {
        packets(rest)
    } else {
        let Some((&count, body)) = rest.split_first() else {
            return;
        };
        // Totals, plain size and offer id from the entries that decode (each relative to the
        // one before it); the header still announces `count` of them.
        let mut r = Reader::new(body);
        let mut decodable: Vec<Entry> = Vec::new();
        while decodable.len() < usize::from(count) {
            match Entry::decode_compact(decodable.last(), &mut r) {
                Ok(e) => decodable.push(e),
                Err(_) => break,
            }
        }
        let m = Manifest {
            entries: decodable,
            ..Default::default()
        };
        let mut header = Vec::new();
        OfferHeader {
            entries: u64::from(count),
            manifest_bytes: m.encoded_len(),
            totals: Totals::of(&m.entries).unwrap_or_default(),
            bytes_allocated: 0,
            offer_id: m.offer_id(),
            text: false,
        }
        .encode(&mut header);
        let mut page = vec![wire::MSG_MANIFEST];
        page.put_u32(u32::from(count));
        page.extend_from_slice(body);
        vec![header, page]
    };
    let mut opts = ReceiveOptions::new("unused");
    opts.max_manifest = LIMIT;
    if let Ok((header, entries)) = read_offer(&mut Packets::new(stream), &opts) {
        let m = Manifest {
            entries,
            ..Default::default()
        };
        assert!(m.received_cost() <= LIMIT);
        assert_eq!(m.encoded_len(), header.manifest_bytes);
        // The pages' encoding and the plain one (the offer id's) both decode again to exactly
        // the same entries.
        let (mut again, mut next) = (Vec::new(), 0);
        let mut decoded: Vec<Entry> = Vec::new();
        while next < m.entries.len() {
            m.encode_page(&mut next, wire::MAX_PAGE, &mut again);
            let mut r = Reader::new(&again[5..]);
            while !r.is_empty() {
                decoded.push(Entry::decode_compact(decoded.last(), &mut r).expect("re-decodes"));
            }
        }
        assert_eq!(decoded, m.entries);
        let mut plain = Vec::new();
        for e in &m.entries {
            e.encode(&mut plain);
        }
        let mut r = Reader::new(&plain);
        for e in &m.entries {
            assert_eq!(&Entry::decode(&mut r).expect("re-decodes"), e);
        }
        assert!(r.is_empty());
        if let Ok(order) = check_tree(&m.entries) {
            assert_eq!(order.len(), m.entries.len());
        }
    }
});
