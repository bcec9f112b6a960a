//! Where two paired machines meet: a rendezvous hash only the pair can compute, new every time window.
//!
//! Paired sessions use the same paths as codes (same-host registry, mDNS, relay), which all see a
//! [`NameplateHash`]. For a pair it is `BLAKE3-keyed(secret, "ferry 2026 pair meeting v1" || 0 || purpose || 0
//! || window)`, with the window number `unix_time / WINDOW_SECS` as 8 little-endian bytes. It carries no key
//! and no name, changes every window, and two purposes (a `send` and a `share:photos`) never collide, so an
//! observer cannot link two sessions of one pair, or tell them from code sessions.
//!
//! A listener registers under the current window's hash (and registers again when the window turns); a seeker
//! tries the current window and, within [`NEIGHBOUR_MARGIN`] of a window's edge, the neighbour across that
//! edge, so clocks up to that margin apart still meet. Far from an edge it sends this window's hash alone:
//! a relay that sees one visit cannot tell from it the hash of the next hour's.

use ferry_rendezvous::NameplateHash;

use crate::PairSecret;

/// Length of one window, in seconds.
pub const WINDOW_SECS: u64 = 3600;
/// How close to a window's edge a seeker also tries the neighbour across it: the clock skew tolerated.
pub const NEIGHBOUR_MARGIN: u64 = 300;
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

/// The hashes a seeker tries at `unix_secs`: this window's, and the neighbours' within
/// [`NEIGHBOUR_MARGIN`] of their edge (the previous one early in the window, the next one late in it).
pub fn hashes_to_try(
    secret: &PairSecret,
    purpose: &str,
    unix_secs: u64,
) -> (NameplateHash, Vec<NameplateHash>) {
    let w = window_of(unix_secs);
    let into = unix_secs % WINDOW_SECS;
    let mut neighbours = Vec::new();
    if into < NEIGHBOUR_MARGIN && w > 0 {
        neighbours.push(meeting_hash(secret, purpose, w - 1));
    }
    if WINDOW_SECS - into <= NEIGHBOUR_MARGIN {
        neighbours.push(meeting_hash(secret, purpose, w + 1));
    }
    (meeting_hash(secret, purpose, w), neighbours)
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

    fn tried(s: &PairSecret, at: u64) -> Vec<NameplateHash> {
        let (this, neighbours) = hashes_to_try(s, "send", at);
        std::iter::once(this).chain(neighbours).collect()
    }

    #[test]
    fn a_seeker_sends_a_neighbours_hash_only_near_its_edge() {
        let s = PairSecret([9; 32]);
        let w = 498_611; // a window; its first second:
        let start = w * WINDOW_SECS;
        let h = |w| meeting_hash(&s, "send", w);
        // Mid-window: this window's hash alone, so the next hour's is not given away.
        for into in [NEIGHBOUR_MARGIN, 1800, WINDOW_SECS - NEIGHBOUR_MARGIN - 1] {
            assert_eq!(tried(&s, start + into), [h(w)], "{into} s into the window");
        }
        // Early in it: the previous one too; late in it: the next one.
        for into in [0, NEIGHBOUR_MARGIN - 1] {
            assert_eq!(tried(&s, start + into), [h(w), h(w - 1)], "{into} s in");
        }
        for into in [WINDOW_SECS - NEIGHBOUR_MARGIN, WINDOW_SECS - 1] {
            assert_eq!(tried(&s, start + into), [h(w), h(w + 1)], "{into} s in");
        }
    }

    #[test]
    fn a_seeker_meets_a_listener_whose_clock_is_up_to_the_margin_off() {
        let s = PairSecret([9; 32]);
        let margin = NEIGHBOUR_MARGIN as i64;
        let edge = 498_611 * WINDOW_SECS as i64;
        // Listeners on either side of a window's edge, and anywhere in a window.
        for listener in [
            edge - 1,
            edge,
            edge - margin,
            edge + margin - 1,
            edge + 1800,
        ] {
            let registered = meeting_hash(&s, "send", window_of(listener as u64));
            for skew in [0, 1, -1, margin - 1, -(margin - 1), margin, -margin] {
                let seeker = (listener + skew) as u64;
                assert!(
                    tried(&s, seeker).contains(&registered),
                    "listener at {listener}, skew {skew}"
                );
            }
        }
        // Beyond the margin across an edge they miss each other (until the window turns).
        let registered = meeting_hash(&s, "send", window_of((edge - 1) as u64));
        assert!(!tried(&s, (edge - 1 + margin + 1) as u64).contains(&registered));
    }
}
