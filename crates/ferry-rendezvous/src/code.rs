//! Short codes: a nameplate number and three words from a 2048-word list (33 bits for the PAKE).

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// Number of words in a code.
pub const WORD_COUNT: usize = 3;
/// Largest nameplate a generated code uses; typed codes may use up to [`MAX_NAMEPLATE`].
const GENERATED_NAMEPLATES: u32 = 999;
/// Largest nameplate accepted from a user.
const MAX_NAMEPLATE: u32 = 999_999;
/// Longest code accepted from a user, in bytes.
const MAX_CODE_LEN: usize = 128;

static WORD_TEXT: &str = include_str!("../data/words.txt");

/// The word list (BIP39 English, 2048 words).
pub static WORDS: std::sync::LazyLock<Vec<&'static str>> =
    std::sync::LazyLock::new(|| WORD_TEXT.split_whitespace().collect());

/// A code the user typed is not a ferry code.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CodeError {
    /// Not of the form `NUMBER-word-word-word`.
    #[error("a code looks like 7-apple-orbit-violin: a number and {WORD_COUNT} words")]
    Malformed,
    /// The nameplate is not a number in range.
    #[error("the code must start with a number from 1 to {MAX_NAMEPLATE}")]
    BadNameplate,
    /// A word is not in the list.
    #[error("{0:?} is not a code word (check the spelling)")]
    UnknownWord(String),
}

/// A short code: a nameplate for rendezvous and words for the PAKE.
#[derive(Clone, PartialEq, Eq)]
pub struct Code {
    nameplate: u32,
    words: [&'static str; WORD_COUNT],
    purpose: CodePurpose,
}

/// What a code is for. The same words meet under a different rendezvous hash and PAKE password for each
/// purpose, so a `ferry receive` given a pairing code finds no sender rather than a peer speaking another
/// protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CodePurpose {
    /// `ferry send` / `ferry receive`.
    #[default]
    Transfer,
    /// `ferry pair`.
    Pairing,
}

/// What rendezvous sees of a code: the rendezvous hash, never the number or the words.
///
/// It is an *unkeyed* hash of the nameplate and the first word (see
/// [`NameplateHash::rendezvous`]): about 2 M possible values (999 generated nameplates × 2048
/// words), so a stranger cannot find a waiting session by trying nameplates, while anyone who
/// sees a hash (a relay operator, a LAN observer) can recover nameplate and first word with
/// 2 M offline hashes. The PAKE password is the whole code, so that leaves the other two words
/// (22 bits) against the one online guess such an observer gets.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NameplateHash(pub [u8; 32]);

/// Domain of the rendezvous hash; v1 hashed the nameplate alone (999 values, enumerable).
const RENDEZVOUS_CONTEXT: &str = "ferry 2026 rendezvous v2";
/// Domain of a pairing code's rendezvous hash.
const PAIRING_CONTEXT: &str = "ferry 2026 pairing rendezvous v1";

impl NameplateHash {
    /// The rendezvous hash of a code with this nameplate and first word:
    /// `BLAKE3-derive_key("ferry 2026 rendezvous v2", decimal(nameplate) || 0x00 || first_word)`.
    pub fn rendezvous(nameplate: u32, first_word: &str) -> Self {
        Self::rendezvous_for(CodePurpose::Transfer, nameplate, first_word)
    }

    /// The rendezvous hash for a code of `purpose`: as [`NameplateHash::rendezvous`], with the context
    /// `"ferry 2026 pairing rendezvous v1"` for pairing codes.
    pub fn rendezvous_for(purpose: CodePurpose, nameplate: u32, first_word: &str) -> Self {
        let mut material = nameplate.to_string().into_bytes();
        material.push(0);
        material.extend_from_slice(first_word.as_bytes());
        let context = match purpose {
            CodePurpose::Transfer => RENDEZVOUS_CONTEXT,
            CodePurpose::Pairing => PAIRING_CONTEXT,
        };
        NameplateHash(blake3::derive_key(context, &material))
    }

    /// An arbitrary, fixed hash numbered `n`, for tests that need distinct hashes. It is not the
    /// rendezvous hash of any code: that is [`Code::nameplate_hash`].
    #[doc(hidden)]
    pub fn of(n: u32) -> Self {
        NameplateHash(blake3::derive_key(
            "ferry 2026 test hash",
            n.to_string().as_bytes(),
        ))
    }

    /// Lowercase hex, for file names and logs.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for NameplateHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NameplateHash({})", &self.to_hex()[..16])
    }
}

fn random_below(n: u32) -> u32 {
    // Rejection sampling: no modulo bias.
    let zone = u32::MAX - (u32::MAX % n);
    loop {
        let mut b = [0u8; 4];
        getrandom::fill(&mut b).expect("the system CSPRNG does not fail");
        let v = u32::from_le_bytes(b);
        if v < zone {
            return v % n;
        }
    }
}

impl Code {
    /// A fresh random code whose rendezvous hash satisfies `free` (for example: not in use on
    /// this host). The words are drawn first; the nameplate is the first, from a random start,
    /// whose hash with the first word is free (or the start itself when every one is taken).
    pub fn generate(free: impl FnMut(&NameplateHash) -> bool) -> Code {
        Self::generate_for(CodePurpose::Transfer, free)
    }

    /// A fresh random code for `purpose` (see [`Code::generate`]).
    pub fn generate_for(
        purpose: CodePurpose,
        mut free: impl FnMut(&NameplateHash) -> bool,
    ) -> Code {
        let words: [&'static str; WORD_COUNT] =
            std::array::from_fn(|_| WORDS[random_below(WORDS.len() as u32) as usize]);
        let start = random_below(GENERATED_NAMEPLATES);
        let nameplate = (0..GENERATED_NAMEPLATES)
            .map(|i| 1 + (start + i) % GENERATED_NAMEPLATES)
            .find(|&n| free(&NameplateHash::rendezvous_for(purpose, n, words[0])))
            .unwrap_or(1 + start);
        Code {
            nameplate,
            words,
            purpose,
        }
    }

    /// The same code, used for `purpose` (a code typed by the user parses as a transfer code).
    pub fn with_purpose(mut self, purpose: CodePurpose) -> Code {
        self.purpose = purpose;
        self
    }

    /// What the code is for.
    pub fn purpose(&self) -> CodePurpose {
        self.purpose
    }

    /// The nameplate number.
    pub fn nameplate(&self) -> u32 {
        self.nameplate
    }

    /// The rendezvous hash under which the two sides meet (relay, same-host registry, mDNS):
    /// nameplate and first word, see [`NameplateHash::rendezvous`].
    pub fn nameplate_hash(&self) -> NameplateHash {
        NameplateHash::rendezvous_for(self.purpose, self.nameplate, self.words[0])
    }

    /// The PAKE password: the whole normalised code, after `pair:` for a pairing code.
    pub fn password(&self) -> Vec<u8> {
        let prefix = match self.purpose {
            CodePurpose::Transfer => "",
            CodePurpose::Pairing => "pair:",
        };
        format!("{prefix}{self}").into_bytes()
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.nameplate)?;
        for w in &self.words {
            write!(f, "-{w}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The words are a secret; never print them in debug output.
        write!(f, "Code({}-…)", self.nameplate)
    }
}

impl FromStr for Code {
    type Err = CodeError;

    /// Parses `7-amber-otter-violin`; case and surrounding spaces do not matter, spaces work as separators.
    fn from_str(s: &str) -> Result<Code, CodeError> {
        if s.len() > MAX_CODE_LEN {
            return Err(CodeError::Malformed);
        }
        let lower = s.trim().to_ascii_lowercase();
        let parts: Vec<&str> = lower.split(['-', ' ']).filter(|p| !p.is_empty()).collect();
        let [plate, words @ ..] = parts.as_slice() else {
            return Err(CodeError::Malformed);
        };
        if words.len() != WORD_COUNT {
            return Err(CodeError::Malformed);
        }
        let nameplate: u32 = plate.parse().map_err(|_| CodeError::BadNameplate)?;
        if nameplate == 0 || nameplate > MAX_NAMEPLATE {
            return Err(CodeError::BadNameplate);
        }
        let mut out = [""; WORD_COUNT];
        for (slot, w) in out.iter_mut().zip(words) {
            *slot = WORDS
                .iter()
                .find(|&&known| known == *w)
                .ok_or_else(|| CodeError::UnknownWord((*w).to_string()))?;
        }
        Ok(Code {
            nameplate,
            words: out,
            purpose: CodePurpose::Transfer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_list_has_2048_unique_words() {
        let mut w = WORDS.clone();
        assert_eq!(w.len(), 2048);
        w.sort_unstable();
        w.dedup();
        assert_eq!(w.len(), 2048);
    }

    #[test]
    fn a_pairing_code_meets_and_authenticates_apart_from_a_transfer_code() {
        let transfer: Code = "7-apple-orbit-violin".parse().unwrap();
        let pairing = transfer.clone().with_purpose(CodePurpose::Pairing);
        assert_eq!(pairing.to_string(), transfer.to_string());
        assert_ne!(pairing.nameplate_hash(), transfer.nameplate_hash());
        assert_ne!(pairing.password(), transfer.password());
        let generated = Code::generate_for(CodePurpose::Pairing, |h| {
            assert_ne!(*h, NameplateHash::rendezvous(1, "x"));
            true
        });
        assert_eq!(generated.purpose(), CodePurpose::Pairing);
        let typed: Code = generated.to_string().parse().unwrap();
        assert_eq!(typed.with_purpose(CodePurpose::Pairing), generated);
    }

    #[test]
    fn generated_codes_parse_back() {
        for _ in 0..100 {
            let c = Code::generate(|_| true);
            assert!((1..=GENERATED_NAMEPLATES).contains(&c.nameplate()));
            assert_eq!(c.to_string().parse::<Code>().unwrap(), c);
        }
    }

    #[test]
    fn generate_skips_taken_nameplates() {
        // The first four candidates are taken, the fifth is free: the code is the fifth, and
        // what the check saw is the code's own rendezvous hash (nameplate and first word).
        let mut seen = Vec::new();
        let c = Code::generate(|h| {
            seen.push(*h);
            seen.len() == 5
        });
        assert_eq!(seen.len(), 5);
        assert_eq!(c.nameplate_hash(), seen[4]);
        // Everything taken: some nameplate anyway.
        let c = Code::generate(|_| false);
        assert!((1..=GENERATED_NAMEPLATES).contains(&c.nameplate()));
    }

    #[test]
    fn malformed_codes_are_rejected() {
        assert_eq!("".parse::<Code>(), Err(CodeError::Malformed));
        assert_eq!(
            "7-abandon-ability".parse::<Code>(),
            Err(CodeError::Malformed)
        );
        assert_eq!(
            "x-abandon-ability-able".parse::<Code>(),
            Err(CodeError::BadNameplate)
        );
        assert_eq!(
            "0-abandon-ability-able".parse::<Code>(),
            Err(CodeError::BadNameplate)
        );
        assert_eq!(
            "7-abandon-ability-zzz".parse::<Code>(),
            Err(CodeError::UnknownWord("zzz".into()))
        );
        assert_eq!("7-".repeat(100).parse::<Code>(), Err(CodeError::Malformed));
    }

    #[test]
    fn rendezvous_hash_is_nameplate_and_first_word_only() {
        let a: Code = "7-abandon-ability-able".parse().unwrap();
        let same_first: Code = "7-abandon-zone-youth".parse().unwrap();
        let other_first: Code = "7-zoo-ability-able".parse().unwrap();
        let other_plate: Code = "8-abandon-ability-able".parse().unwrap();
        assert_eq!(a.nameplate_hash(), same_first.nameplate_hash());
        assert_ne!(a.nameplate_hash(), other_first.nameplate_hash());
        assert_ne!(a.nameplate_hash(), other_plate.nameplate_hash());
        // The exact derivation, so every side (relay, registry, mDNS, older builds) agrees.
        assert_eq!(
            a.nameplate_hash().0,
            blake3::derive_key("ferry 2026 rendezvous v2", b"7\0abandon")
        );
        // Nameplate 1 + word "1..." cannot collide with nameplate 11 + word: the 0 separates.
        assert_ne!(
            NameplateHash::rendezvous(1, "1abandon"),
            NameplateHash::rendezvous(11, "abandon")
        );
        // Knowing the nameplate is not enough: v1's nameplate-only hash is not it.
        assert_ne!(
            a.nameplate_hash().0,
            blake3::derive_key("ferry 2026 nameplate v1", b"7")
        );
        assert!(!format!("{a:?}").contains("abandon"));
    }
}
