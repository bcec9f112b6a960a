//! Arbitrary packets (cut by u16 lengths) as the receiver's side of a real `send` of a small fixed
//! tree, read after the sender's early part: accept with resume pages (the early part then void) (chunk and complete claims, checked against the manifest), decline,
//! an error message, then the final done. The sender must never panic, and may finish only after an
//! accept.
#![no_main]

use ferry_channel_fuzz::transfer::{packets, Packets, Sent};
use ferry_transfer::{send, wire, SendOptions, Walk};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// A tree with a small file, an empty one and one of two chunks (so chunk claims can be valid),
/// walked once.
fn tree() -> &'static Walk {
    static TREE: OnceLock<Walk> = OnceLock::new();
    TREE.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("ferry-fuzz-answer-{}", std::process::id()));
        let t = root.join("t");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&t).expect("fixture dir");
        std::fs::write(t.join("a"), b"hello").expect("fixture file");
        std::fs::write(t.join("empty"), b"").expect("fixture file");
        std::fs::write(t.join("big"), vec![7u8; (1 << 20) + 1]).expect("fixture file");
        ferry_transfer::walk(&[&t]).expect("fixture walk")
    })
}

fuzz_target!(|data: &[u8]| {
    let answer = packets(data);
    let first = answer.first().and_then(|p| p.first()).copied();
    let mut sink = Sent::default();
    let opts = SendOptions {
        max_packet: 64 * 1024,
        ..SendOptions::default()
    };
    let result = send(
        &mut sink,
        &mut Packets::new(answer),
        &tree().manifest,
        &opts,
        &mut (),
    );
    if result.is_ok() {
        assert_eq!(first, Some(wire::MSG_ACCEPT), "finished without an accept");
    }
});
