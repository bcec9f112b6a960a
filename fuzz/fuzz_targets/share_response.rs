//! Arbitrary bytes as one packet from a sharer (the client's side, and the mount's, which may run as root):
//! `Response::decode` must never panic, every bound the protocol states must hold for what it decodes, and
//! whatever it decodes must encode to bytes that decode to it again.
#![no_main]

use ferry_share::wire::{self, Response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(rsp) = Response::decode(data) else {
        return;
    };
    match &rsp {
        Response::Entries { entries, .. } => {
            assert!(entries.len() <= wire::MAX_PAGE_ENTRIES as usize);
            assert!(entries.iter().all(|e| !e.name.is_empty()));
        }
        Response::Changed { paths, .. } => assert!(paths.len() <= wire::MAX_CHANGED as usize),
        Response::Error { message, .. } => {
            assert!(message.len() <= wire::MAX_MESSAGE, "message over its bound")
        }
        Response::Data {
            offset, len, piece, ..
        } => {
            assert!(offset.checked_add(u64::from(*len)).is_some());
            assert!(piece.len() < data.len());
        }
        _ => {}
    }
    let mut again = Vec::new();
    rsp.encode(&mut again);
    assert_eq!(Response::decode(&again).as_ref(), Ok(&rsp), "round trip");
});
