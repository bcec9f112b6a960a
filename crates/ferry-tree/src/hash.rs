//! Streaming BLAKE3 over a file, with one chaining value per 1 MiB chunk.
//!
//! A file larger than [`CHUNK`] is hashed as a BLAKE3 tree whose 1 MiB subtrees are hashed
//! separately (`blake3::hazmat`): each subtree's chaining value is the chunk hash, and merging
//! them gives exactly `blake3::hash(file)`. A file of at most one chunk is hashed plainly and has
//! no chunk hashes. Either way every byte is hashed once, and a resume can start hashing at any
//! chunk boundary given the chaining values of the chunks before it.

use blake3::hazmat::{
    merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};
use std::io::Read;

/// Size of the chunks that carry their own hash, so that a resume can verify what it keeps (1 MiB).
pub const CHUNK: u64 = 1 << 20;

/// Incremental hash of one file's data, in order, from any chunk boundary.
pub struct FileHasher {
    size: u64,
    pos: u64,
    hasher: blake3::Hasher,
    cvs: Vec<ChainingValue>,
}

impl Default for FileHasher {
    fn default() -> Self {
        FileHasher {
            size: 0,
            pos: 0,
            hasher: blake3::Hasher::new(),
            cvs: Vec::new(),
        }
    }
}

/// Number of chunks of a file of `size` bytes (an empty file has one, empty, chunk).
pub fn chunk_count(size: u64) -> u64 {
    size.div_ceil(CHUNK).max(1)
}

/// Whether a file of `size` bytes has chunk hashes (it is larger than one chunk).
pub fn has_chunks(size: u64) -> bool {
    size > CHUNK
}

impl FileHasher {
    /// Starts a file of `size` bytes at the chunk boundary after `kept` (chunk hashes of the data
    /// before it, already verified); `kept` must be empty for a file without chunk hashes.
    pub fn start(&mut self, size: u64, kept: &[ChainingValue]) {
        debug_assert!(kept.is_empty() || has_chunks(size));
        self.size = size;
        self.pos = (kept.len() as u64 * CHUNK).min(size);
        self.cvs.clear();
        self.cvs.extend_from_slice(kept);
        self.hasher = blake3::Hasher::new();
        if self.pos > 0 && self.pos < size {
            self.hasher.set_input_offset(self.pos);
        }
    }

    /// Bytes hashed so far, counting the kept prefix.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Chunk hashes finished so far.
    pub fn chunk_hashes(&self) -> &[ChainingValue] {
        &self.cvs
    }

    /// Hashes the next bytes of the file; `data` must not go past its size.
    pub fn update(&mut self, mut data: &[u8]) {
        debug_assert!(self.pos + data.len() as u64 <= self.size);
        if !has_chunks(self.size) {
            self.hasher.update(data);
            self.pos += data.len() as u64;
            return;
        }
        while !data.is_empty() {
            let chunk_end = ((self.pos / CHUNK + 1) * CHUNK).min(self.size);
            let take = ((chunk_end - self.pos) as usize).min(data.len());
            self.hasher.update(&data[..take]);
            self.pos += take as u64;
            data = &data[take..];
            if self.pos == chunk_end {
                self.cvs.push(self.hasher.finalize_non_root());
                self.hasher = blake3::Hasher::new();
                if self.pos < self.size {
                    self.hasher.set_input_offset(self.pos);
                }
            }
        }
    }

    /// Hashes the next `len` bytes of the file as zeros (a hole of a sparse file): BLAKE3 keys
    /// every 1 KiB chunk with its position, so the zeros are really hashed, from a static buffer.
    pub fn update_zeros(&mut self, mut len: u64) {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        while len > 0 {
            let n = (ZEROS.len() as u64).min(len) as usize;
            self.update(&ZEROS[..n]);
            len -= n as u64;
        }
    }

    /// Reads `len` bytes from `file` through `scratch` and hashes them.
    pub fn update_from(
        &mut self,
        file: &mut impl Read,
        mut len: u64,
        scratch: &mut [u8],
    ) -> std::io::Result<()> {
        while len > 0 {
            let n = (scratch.len() as u64).min(len) as usize;
            file.read_exact(&mut scratch[..n])?;
            self.update(&scratch[..n]);
            len -= n as u64;
        }
        Ok(())
    }

    /// The whole file's BLAKE3, once every byte was hashed; `None` before that.
    pub fn finish(&self) -> Option<[u8; 32]> {
        if self.pos != self.size {
            return None;
        }
        if !has_chunks(self.size) {
            return Some(*self.hasher.finalize().as_bytes());
        }
        let split = left_count(self.cvs.len());
        let left = merge(&self.cvs[..split]);
        let right = merge(&self.cvs[split..]);
        Some(*merge_subtrees_root(&left, &right, Mode::Hash).as_bytes())
    }
}

/// Number of chunks in the left subtree of `n` chunks: the largest power of two below `n`
/// (BLAKE3's left-balanced tree, in units of 1 MiB subtrees).
fn left_count(n: usize) -> usize {
    debug_assert!(n >= 2);
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

/// Chaining value of the subtree made of `cvs` (non-root).
fn merge(cvs: &[ChainingValue]) -> ChainingValue {
    if cvs.len() == 1 {
        return cvs[0];
    }
    let split = left_count(cvs.len());
    merge_subtrees_non_root(&merge(&cvs[..split]), &merge(&cvs[split..]), Mode::Hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn matches_blake3_for_many_sizes() {
        let c = CHUNK as usize;
        for len in [
            0,
            1,
            1024,
            c - 1,
            c,
            c + 1,
            2 * c,
            3 * c + 5,
            5 * c,
            7 * c - 3,
        ] {
            let d = data(len);
            let mut h = FileHasher::default();
            h.start(len as u64, &[]);
            for piece in d.chunks(300_001) {
                h.update(piece);
            }
            assert_eq!(
                h.finish().unwrap(),
                *blake3::hash(&d).as_bytes(),
                "len {len}"
            );
            assert_eq!(
                h.chunk_hashes().len(),
                if has_chunks(len as u64) {
                    len.div_ceil(c)
                } else {
                    0
                }
            );
        }
    }

    #[test]
    fn zeros_hash_like_zero_bytes() {
        let c = CHUNK as usize;
        let mut d = data(3 * c + 77);
        d[c / 2..2 * c + 9].fill(0);
        let mut h = FileHasher::default();
        h.start(d.len() as u64, &[]);
        h.update(&d[..c / 2]);
        h.update_zeros((2 * c + 9 - c / 2) as u64);
        h.update(&d[2 * c + 9..]);
        assert_eq!(h.finish().unwrap(), *blake3::hash(&d).as_bytes());
    }

    #[test]
    fn resumes_from_kept_chunks() {
        let c = CHUNK as usize;
        let d = data(3 * c + 77);
        let mut full = FileHasher::default();
        full.start(d.len() as u64, &[]);
        full.update(&d);
        let mut resumed = FileHasher::default();
        resumed.start(d.len() as u64, &full.chunk_hashes()[..2]);
        assert_eq!(resumed.position(), 2 * CHUNK);
        assert_eq!(resumed.finish(), None);
        resumed.update(&d[2 * c..]);
        assert_eq!(resumed.finish(), full.finish());
        assert_eq!(resumed.chunk_hashes(), full.chunk_hashes());
    }
}
