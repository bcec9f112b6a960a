//! Cipher suites: the AEAD behind a small trait, and the forward-secure packet AEAD built on it.

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};

use crate::REKEY_INTERVAL;

/// Length of an AEAD tag.
pub const TAG_LEN: usize = 16;

/// A cipher suite that can protect packet contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Suite {
    /// ChaCha20-Poly1305 exactly as BIP324 (FSChaCha20Poly1305).
    ChaCha20Poly1305,
    /// AES-256-GCM with the same framing and the same rekey cadence.
    Aes256Gcm,
}

impl Suite {
    /// Every suite, in ferry's order of preference when AES instructions exist on both sides.
    pub const ALL: [Suite; 2] = [Suite::Aes256Gcm, Suite::ChaCha20Poly1305];

    /// The bit that stands for this suite in a version packet's offer.
    pub const fn bit(self) -> u8 {
        match self {
            Suite::ChaCha20Poly1305 => 0b01,
            Suite::Aes256Gcm => 0b10,
        }
    }

    /// Short name for tables and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Suite::ChaCha20Poly1305 => "chacha20-poly1305",
            Suite::Aes256Gcm => "aes-256-gcm",
        }
    }

    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Suite::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
            Suite::Aes256Gcm => &aead::AES_256_GCM,
        }
    }
}

/// True when this CPU has the instructions that make AES-256-GCM the fast choice.
pub fn has_aes_hardware() -> bool {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// The tag did not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagMismatch;

/// One AEAD key: the primitive a suite is built on, kept behind a trait so that implementations can be swapped
/// and benchmarked side by side.
pub trait AeadKey: Send {
    /// Encrypts `in_out` in place and returns the tag.
    fn seal(&self, nonce: [u8; 12], aad: &[u8], in_out: &mut [u8]) -> [u8; TAG_LEN];
    /// Decrypts `in_out` in place if `tag` verifies; on failure the contents are unspecified.
    fn open(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        in_out: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), TagMismatch>;
}

/// aws-lc-rs's AEADs (AES-256-GCM, ChaCha20-Poly1305).
pub struct AwsLcKey(LessSafeKey);

impl AwsLcKey {
    /// A key of `suite` made from 32 bytes.
    pub fn new(suite: Suite, key: &[u8; 32]) -> Self {
        let unbound =
            UnboundKey::new(suite.algorithm(), key).expect("32-byte key fits both suites");
        AwsLcKey(LessSafeKey::new(unbound))
    }
}

impl AeadKey for AwsLcKey {
    fn seal(&self, nonce: [u8; 12], aad: &[u8], in_out: &mut [u8]) -> [u8; TAG_LEN] {
        let tag = self
            .0
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), in_out)
            .expect("packet sizes are far below the AEAD limit");
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        out
    }

    fn open(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        in_out: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), TagMismatch> {
        self.0
            .open_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                tag,
                in_out,
            )
            .map(|_| ())
            .map_err(|_| TagMismatch)
    }
}

/// A packet AEAD with implicit nonces and BIP324's forward-secure rekey every [`REKEY_INTERVAL`] packets.
///
/// The nonce of packet `n` is `(n mod 224)` as 4 bytes LE followed by `(n / 224)` as 8 bytes LE; after the
/// 224th packet of an epoch the key is replaced by the first 32 bytes of the encryption of 32 zero bytes under
/// the nonce `0xFFFFFFFF || epoch`, so a key stolen later does not open earlier packets.
pub struct FsAead {
    suite: Suite,
    key: Box<dyn AeadKey>,
    counter: u64,
}

impl FsAead {
    /// Starts the AEAD of `suite` with its initial key.
    pub fn new(suite: Suite, key: &[u8; 32]) -> Self {
        FsAead {
            suite,
            key: Box::new(AwsLcKey::new(suite, key)),
            counter: 0,
        }
    }

    /// The suite in use.
    pub fn suite(&self) -> Suite {
        self.suite
    }

    fn nonce(&self) -> [u8; 12] {
        let mut n = [0u8; 12];
        let interval = u64::from(REKEY_INTERVAL);
        n[..4].copy_from_slice(&((self.counter % interval) as u32).to_le_bytes());
        n[4..].copy_from_slice(&(self.counter / interval).to_le_bytes());
        n
    }

    fn advance(&mut self, nonce: [u8; 12]) {
        if (self.counter + 1).is_multiple_of(u64::from(REKEY_INTERVAL)) {
            let mut rekey_nonce = nonce;
            rekey_nonce[..4].copy_from_slice(&[0xff; 4]);
            let mut next = [0u8; 32];
            self.key.seal(rekey_nonce, &[], &mut next);
            self.key = Box::new(AwsLcKey::new(self.suite, &next));
            next.fill(0);
        }
        self.counter += 1;
    }

    /// Seals the next packet's plaintext in place.
    pub fn seal(&mut self, aad: &[u8], in_out: &mut [u8]) -> [u8; TAG_LEN] {
        let nonce = self.nonce();
        let tag = self.key.seal(nonce, aad, in_out);
        self.advance(nonce);
        tag
    }

    /// Opens the next packet in place.
    pub fn open(
        &mut self,
        aad: &[u8],
        in_out: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), TagMismatch> {
        let nonce = self.nonce();
        self.key.open(nonce, aad, in_out, tag)?;
        self.advance(nonce);
        Ok(())
    }
}
