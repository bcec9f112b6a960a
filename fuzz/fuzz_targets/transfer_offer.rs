//! Arbitrary bytes into the fixed-size message decoders of the transfer protocol: the offer header,
//! and the type check with an error message body (which every side decodes whatever it waits for).
//! A decoded offer must re-encode to exactly its input; an error message is always bounded.
#![no_main]

use ferry_transfer::wire::{self, OfferHeader, Reader};
use ferry_transfer::TransferError;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = OfferHeader::decode(data) {
        let mut again = Vec::new();
        h.encode(&mut again);
        assert_eq!(again, data, "an offer decodes from exactly its encoding");
    }
    let mut r = Reader::new(data);
    match wire::expect_type(&mut r, wire::MSG_DONE, "done") {
        Ok(()) => assert_eq!(data[0], wire::MSG_DONE),
        Err(TransferError::Remote { code, message }) => {
            assert!(code.len() <= 3 * 255, "code of {} bytes", code.len());
            assert!(
                message.len() <= 3 * wire::MAX_ERROR_MESSAGE,
                "message of {} bytes",
                message.len()
            );
        }
        Err(_) => {}
    }
});
