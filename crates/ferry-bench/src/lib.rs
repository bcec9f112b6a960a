//! ferry's layered benchmark suite: each layer measured against its own baseline in the same run.
//!
//! Every case is run A/B interleaved (baseline, candidate, baseline, candidate, ...) several times and the
//! medians are reported, so a noisy neighbour on this shared machine shifts both sides alike.
#![warn(missing_docs, unreachable_pub)]

pub mod channel;
pub mod create;
pub mod matrix;
pub mod pull;
pub mod relay;
pub mod report;
pub mod sftp;
pub mod share;
pub mod transfer;

pub use report::{Report, Row};
