//! Arbitrary bytes as one packet from a share client (the sharer's side): `Request::decode` must never panic,
//! whatever it decodes must encode to bytes that decode to it again, and the sharer's shortcuts that read a
//! packet without decoding it whole (`put_data`, `request_path`, `is_put_data`, `only_looks`) must agree
//! with the full decoder.
#![no_main]

use ferry_share::wire::{self, Request};
use libfuzzer_sys::fuzz_target;

/// The id and path `request_path` must find in a decoded request, if it has a path.
fn id_and_path(req: &Request) -> Option<(u32, &[u8])> {
    Some(match req {
        Request::List { id, path, .. }
        | Request::Stat { id, path }
        | Request::Read { id, path, .. }
        | Request::Pull { id, path }
        | Request::Mkdir { id, path, .. }
        | Request::Rmdir { id, path }
        | Request::Unlink { id, path, .. }
        | Request::SetAttr { id, path, .. }
        | Request::Symlink { id, path, .. } => (*id, path.as_bytes()),
        Request::Rename { id, from, .. } => (*id, from.as_bytes()),
        Request::Put { id, put } => (*id, put.path.as_bytes()),
        Request::Hello(_)
        | Request::Subscribe { .. }
        | Request::Cancel { .. }
        | Request::PutData { .. }
        | Request::PutEnd { .. }
        | Request::SpaceOf { .. } => return None,
    })
}

fuzz_target!(|data: &[u8]| {
    let decoded = Request::decode(data);
    // The server reads put data without a copy: it must accept exactly what the decoder accepts.
    let borrowed = wire::put_data(data);
    match (&decoded, &borrowed) {
        (Ok(Request::PutData { id, offset, bytes }), Ok((i, o, b))) => {
            assert_eq!((id, offset, bytes.as_slice()), (i, o, *b));
        }
        (Ok(Request::PutData { .. }), Err(_)) | (_, Ok(_)) => {
            panic!("put_data and decode disagree: {decoded:?} / {borrowed:?}")
        }
        _ => {}
    }
    let Ok(req) = decoded else {
        return;
    };
    assert_eq!(
        wire::is_put_data(data),
        matches!(req, Request::PutData { .. })
    );
    assert_eq!(
        wire::only_looks(data),
        matches!(
            req,
            Request::List { .. }
                | Request::Stat { .. }
                | Request::Read { .. }
                | Request::SpaceOf { .. }
        )
    );
    assert_eq!(wire::request_path(data), id_and_path(&req));
    let mut again = Vec::new();
    req.encode(&mut again);
    assert_eq!(
        again.len(),
        data.len(),
        "every byte of a request is a field"
    );
    assert_eq!(Request::decode(&again).as_ref(), Ok(&req), "round trip");
});
