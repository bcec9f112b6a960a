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
}

/// What rendezvous sees of a nameplate: a keyed hash, never the number or the words.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NameplateHash(pub [u8; 32]);

impl NameplateHash {
    /// The hash of a nameplate number.
    pub fn of(nameplate: u32) -> Self {
        NameplateHash(blake3::derive_key(
            "ferry 2026 nameplate v1",
            nameplate.to_string().as_bytes(),
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
    /// A fresh random code whose nameplate satisfies `free` (for example: not in use on this host).
    pub fn generate(mut free: impl FnMut(u32) -> bool) -> Code {
        let words = std::array::from_fn(|_| WORDS[random_below(WORDS.len() as u32) as usize]);
        // From a random start, the first free nameplate (or the start itself when every one is taken).
        let start = random_below(GENERATED_NAMEPLATES);
        let nameplate = (0..GENERATED_NAMEPLATES)
            .map(|i| 1 + (start + i) % GENERATED_NAMEPLATES)
            .find(|&n| free(n))
            .unwrap_or(1 + start);
        Code { nameplate, words }
    }

    /// The nameplate number.
    pub fn nameplate(&self) -> u32 {
        self.nameplate
    }

    /// The hash under which the two sides meet.
    pub fn nameplate_hash(&self) -> NameplateHash {
        NameplateHash::of(self.nameplate)
    }

    /// The PAKE password: the whole normalised code.
    pub fn password(&self) -> Vec<u8> {
        self.to_string().into_bytes()
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
    fn generated_codes_parse_back() {
        for _ in 0..100 {
            let c = Code::generate(|_| true);
            assert!((1..=GENERATED_NAMEPLATES).contains(&c.nameplate()));
            assert_eq!(c.to_string().parse::<Code>().unwrap(), c);
        }
    }

    #[test]
    fn generate_skips_taken_nameplates() {
        let c = Code::generate(|n| n == 42);
        assert_eq!(c.nameplate(), 42);
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
    fn nameplate_hash_depends_only_on_the_nameplate() {
        let a: Code = "7-abandon-ability-able".parse().unwrap();
        let b: Code = "7-zoo-zone-youth".parse().unwrap();
        let c: Code = "8-abandon-ability-able".parse().unwrap();
        assert_eq!(a.nameplate_hash(), b.nameplate_hash());
        assert_ne!(a.nameplate_hash(), c.nameplate_hash());
        assert!(!format!("{a:?}").contains("abandon"));
    }
}
