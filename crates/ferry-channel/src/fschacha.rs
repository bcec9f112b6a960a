//! FSChaCha20: the forward-secure stream cipher that encrypts BIP324 packet lengths.
//!
//! Every packet uses 3 bytes of keystream; after [`REKEY_INTERVAL`] packets the next 32 bytes of keystream become
//! the new key. One epoch therefore needs exactly `224 * 3 + 32 = 704` bytes = 11 ChaCha20 blocks, which we make
//! in one call when the epoch starts, so the per-packet cost is a 3-byte XOR.

use crate::REKEY_INTERVAL;

const LEN_BYTES: usize = 3;
const EPOCH_KEYSTREAM: usize = REKEY_INTERVAL as usize * LEN_BYTES + 32;

/// Raw ChaCha20 (RFC 8439) keystream XOR from aws-lc.
pub(crate) fn chacha20_xor(key: &[u8; 32], nonce: &[u8; 12], counter: u32, buf: &mut [u8]) {
    // SAFETY: `buf` is valid for reads and writes of `buf.len()` bytes; aws-lc allows `out == in`.
    // `key` is 32 bytes and `nonce` 12 bytes, as CRYPTO_chacha_20 requires.
    unsafe {
        aws_lc_sys::CRYPTO_chacha_20(
            buf.as_mut_ptr(),
            buf.as_ptr(),
            buf.len(),
            key.as_ptr(),
            nonce.as_ptr(),
            counter,
        );
    }
}

/// The BIP324 length cipher.
pub struct FsChaCha20 {
    key: [u8; 32],
    epoch: u64,
    keystream: [u8; EPOCH_KEYSTREAM],
    used: u32,
}

impl FsChaCha20 {
    /// Starts the cipher with its initial key.
    pub fn new(key: [u8; 32]) -> Self {
        let mut c = FsChaCha20 {
            key,
            epoch: 0,
            keystream: [0; EPOCH_KEYSTREAM],
            used: 0,
        };
        c.refill();
        c
    }

    fn refill(&mut self) {
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&self.epoch.to_le_bytes());
        self.keystream = [0; EPOCH_KEYSTREAM];
        chacha20_xor(&self.key, &nonce, 0, &mut self.keystream);
    }

    /// Encrypts or decrypts one 3-byte length in place.
    pub fn crypt(&mut self, len: &mut [u8; 3]) {
        let at = self.used as usize * LEN_BYTES;
        for (b, k) in len.iter_mut().zip(&self.keystream[at..at + LEN_BYTES]) {
            *b ^= k;
        }
        self.used += 1;
        if self.used == REKEY_INTERVAL {
            let at = EPOCH_KEYSTREAM - 32;
            self.key.copy_from_slice(&self.keystream[at..]);
            self.epoch += 1;
            self.used = 0;
            self.refill();
        }
    }
}

impl Drop for FsChaCha20 {
    fn drop(&mut self) {
        self.key = [0; 32];
        self.keystream = [0; EPOCH_KEYSTREAM];
    }
}
