//! Where two paired machines meet: a rendezvous hash only the pair can compute, new every time window.
//!
//! Paired sessions use the same paths as codes (same-host registry, mDNS, relay), which all see a
//! [`NameplateHash`]. For a pair it is `BLAKE3-keyed(secret, "ferry 2026 pair meeting v1" || 0 || purpose || 0
//! || window)`, with the window number `unix_time / WINDOW_SECS` as 8 little-endian bytes. It carries no key
//! and no name, changes every window, and two purposes (a `send` and a `share:photos`) never collide, so an
//! observer cannot link two sessions of one pair, or tell them from code sessions.
//!
//! A listener registers under the current window's hash (and registers again when the window turns); a seeker
//! tries the current window first and then its neighbours, so clocks up to one window apart still meet.

use ferry_rendezvous::NameplateHash;

use crate::PairSecret;

/// Length of one window, in seconds.
pub const WINDOW_SECS: u64 = 3600;
const CONTEXT: &[u8] = b"ferry 2026 pair meeting v1";

/// The window that `unix_secs` falls in.
pub fn window_of(unix_secs: u64) -> u64 {
    unix_secs / WINDOW_SECS
}

/// The rendezvous hash of the pair with `secret`, for `purpose`, in `window`.
pub fn meeting_hash(secret: &PairSecret, purpose: &str, window: u64) -> NameplateHash {
    let mut h = blake3::Hasher::new_keyed(&secret.0);
    h.update(CONTEXT);
    h.update(&[0]);
    h.update(purpose.as_bytes());
    h.update(&[0]);
    h.update(&window.to_le_bytes());
    NameplateHash(*h.finalize().as_bytes())
}

/// The hashes a seeker tries at `unix_secs`, most likely first: this window, the previous, the next.
pub fn hashes_to_try(secret: &PairSecret, purpose: &str, unix_secs: u64) -> [NameplateHash; 3] {
    let w = window_of(unix_secs);
    [w, w.saturating_sub(1), w + 1].map(|w| meeting_hash(secret, purpose, w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_depend_on_secret_purpose_and_window_only() {
        let (s1, s2) = (PairSecret([1; 32]), PairSecret([2; 32]));
        let now = 1_795_000_000;
        let h = meeting_hash(&s1, "send", window_of(now));
        assert_eq!(h, meeting_hash(&s1, "send", window_of(now + 1)));
        assert_ne!(h, meeting_hash(&s2, "send", window_of(now)));
        assert_ne!(h, meeting_hash(&s1, "share:photos", window_of(now)));
        assert_ne!(h, meeting_hash(&s1, "send", window_of(now) + 1));
        // The purpose is delimited: ("a", window) and ("a\0...", ...) cannot collide by concatenation.
        assert_ne!(meeting_hash(&s1, "ab", 0), meeting_hash(&s1, "a", 0));
    }

    #[test]
    fn a_seeker_meets_a_listener_one_window_off() {
        let s = PairSecret([9; 32]);
        let listener_time = 1_795_000_000;
        let registered = meeting_hash(&s, "send", window_of(listener_time));
        for skew in [0i64, 3599, -3599, WINDOW_SECS as i64 - 1] {
            let seeker = (listener_time as i64 + skew) as u64;
            assert!(
                hashes_to_try(&s, "send", seeker).contains(&registered),
                "skew {skew}"
            );
        }
        assert!(!hashes_to_try(&s, "send", listener_time + 3 * WINDOW_SECS).contains(&registered));
    }
}
