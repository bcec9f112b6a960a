//! Arbitrary 34-byte hellos, the first bytes any stranger sends a relay: `Request::parse` and `Hello::parse`
//! must never panic, agree with each other and with the prefix checks the relay makes before reading the
//! rest, and what they accept encodes to exactly the bytes they read.
#![no_main]

use ferry_relay::protocol::{Hello, Request, HELLO_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let mut bytes = [0u8; HELLO_LEN];
    let n = input.len().min(HELLO_LEN);
    bytes[..n].copy_from_slice(&input[..n]);
    let prefix = [bytes[0], bytes[1]];
    let request = Request::parse(&bytes);
    let hello = Hello::parse(&bytes);
    if request.is_some() {
        assert!(
            Request::valid_prefix(prefix),
            "parsed past a refused prefix"
        );
    }
    assert_eq!(hello.is_some(), Hello::parse_prefix(prefix).is_some());
    assert_eq!(
        hello.map(Request::Session),
        request.filter(|r| matches!(r, Request::Session(_)))
    );
    if let Some(h) = hello {
        assert_eq!(h.encode(), bytes, "hello not canonical");
    }
    if let Some(r) = request {
        assert_eq!(r.encode(), bytes, "request not canonical");
    }
});
