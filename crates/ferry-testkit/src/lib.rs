//! Helpers shared by ferry's tests (a dev-dependency only): one copy of each, instead of one per crate.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

pub use tempfile::TempDir;

/// `len` deterministic pseudo-random bytes (xorshift64, 8 bytes a step, from `seed` spread by a
/// multiplication so that neighbouring seeds give unrelated data): incompressible test data that two places
/// can regenerate alike.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&xorshift(&mut x).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The next value of the xorshift64 sequence in `x` (which must not be 0): offsets and lengths for
/// random reads that a failure can name and a rerun repeats.
pub fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A temporary directory on tmpfs (`/dev/shm`) when there is one (the disk here is slow and erratic), else
/// in the system's temporary directory.
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::Builder::new().prefix(prefix).tempdir())
        .expect("a temporary directory")
}

/// Asserts two trees are identical: names, kinds, contents, permission bits, mtimes, symlink targets.
pub fn assert_same_tree(a: &Path, b: &Path) {
    let ma = fs::symlink_metadata(a).unwrap_or_else(|e| panic!("{}: {e}", a.display()));
    let mb = fs::symlink_metadata(b).unwrap_or_else(|e| panic!("{}: {e}", b.display()));
    assert_eq!(ma.file_type(), mb.file_type(), "kind of {}", b.display());
    if ma.file_type().is_symlink() {
        assert_eq!(
            fs::read_link(a).unwrap(),
            fs::read_link(b).unwrap(),
            "target of {}",
            b.display()
        );
        return;
    }
    assert_eq!(
        ma.mode() & 0o7777,
        mb.mode() & 0o7777,
        "mode of {}",
        b.display()
    );
    assert_eq!(
        (ma.mtime(), ma.mtime_nsec()),
        (mb.mtime(), mb.mtime_nsec()),
        "mtime of {}",
        b.display()
    );
    if ma.is_file() {
        assert_eq!(ma.len(), mb.len(), "size of {}", b.display());
        assert!(
            fs::read(a).unwrap() == fs::read(b).unwrap(),
            "contents of {}",
            b.display()
        );
    } else if ma.is_dir() {
        let names = |p: &Path| {
            let mut v: Vec<_> = fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            v.sort();
            v
        };
        let (na, nb) = (names(a), names(b));
        assert_eq!(na, nb, "entries of {}", b.display());
        for n in na {
            assert_same_tree(&a.join(&n), &b.join(&n));
        }
    }
}

/// Says loudly (past the test harness's output capture) that test `test` did not run, and why; in CI
/// (`CI` set: it runs as root with the tools `.ci/run` installed) that is a failure instead.
pub fn skip(test: &str, reason: &str) {
    use std::io::Write;
    let msg = format!("SKIPPED {test}: {reason}");
    assert!(std::env::var_os("CI").is_none(), "{msg} (CI must run it)");
    let _ = writeln!(std::io::stderr(), "{msg}");
    println!("{msg}");
}

#[cfg(test)]
mod tests {
    #[test]
    fn data_is_deterministic_and_seeded() {
        assert_eq!(super::pseudo_random(64, 1), super::pseudo_random(64, 1));
        assert_ne!(super::pseudo_random(64, 1), super::pseudo_random(64, 2));
        assert_eq!(
            super::pseudo_random(13, 7),
            super::pseudo_random(64, 7)[..13]
        );
        assert!(super::temp_dir("ferry-testkit-").path().is_dir());
    }
}
