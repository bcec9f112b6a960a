//! Arbitrary text as a line of the mount's pending-changes journal (read back at the next mount; a tampered
//! directory is input too): `Op::decode` must never panic, and a change it reads encodes to a line that
//! reads back as that change.
#![no_main]

use ferry_mount::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|line: &str| {
    let Some(op) = fuzzing::pending_op(line) else {
        return;
    };
    let again = fuzzing::pending_line(&op);
    assert!(!again.contains('\n'), "a change spans lines");
    assert_eq!(fuzzing::pending_op(&again), Some(op), "round trip");
});
