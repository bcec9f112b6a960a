//! The secure channel's test suite: one test binary, one module per property (see each module's doc).
//!
//! No test here has `bip324_vector` in its name; that prefix belongs to the official vectors
//! (`tests/bip324_vectors.rs`).

mod chunking;
mod common;
mod failures;
mod guesses;
mod mitm;
mod records;
mod roundtrip;
mod tampering;
mod tcp;
