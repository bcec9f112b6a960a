//! Arbitrary text as a working copy's journal (read back at the next mount to push a copy a crash left; a
//! tampered directory is input too). Text that starts with `\u{1}` is the fields only (path, base, mode,
//! mtime, one a line), which the target puts under the journal's magic and field names, so that most inputs
//! reach the fields' own parsing; any other text is the whole journal.
//!
//! Decoding must never panic, and a journal it reads encodes to canonical text that reads back as itself (the
//! journal type is private: its encoding stands for it, and encoding is one-to-one, so this is
//! decode(encode(j)) == j).
#![no_main]

use ferry_mount::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let built;
    let text = match text.strip_prefix('\u{1}') {
        Some(fields) => {
            let mut f = fields.splitn(4, '\n');
            let mut next = || f.next().unwrap_or("none");
            built = format!(
                "ferry-working-copy 1\npath {}\nbase {}\nmode {}\nmtime {}\n",
                next(),
                next(),
                next(),
                next()
            );
            &built
        }
        None => text,
    };
    let Some(again) = fuzzing::journal(text) else {
        return;
    };
    assert_eq!(
        fuzzing::journal(&again).as_deref(),
        Some(&again[..]),
        "round trip"
    );
});
