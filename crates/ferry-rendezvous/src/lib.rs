//! How two ferry peers find each other.
//!
//! [`local`] finds a sender on the same host (a private directory, no network); [`mdns`] finds one on the same
//! link (multicast DNS, `_ferry._tcp`). Both only propose an address: the PAKE decides who the peer is.
//!
//! A short code like `7-apple-orbit-violin` has two parts: the *nameplate* (`7`), which with the first word
//! says where to meet (rendezvous sees only a hash of the two, [`NameplateHash`]), and the *words*, which
//! never leave the machine: the whole code is the password of the SPAKE2 exchange inside the encrypted channel.
//!
//! ```
//! use ferry_rendezvous::Code;
//! let code: Code = "7-Apple-orbit-VIOLIN".parse().unwrap();
//! assert_eq!(code.to_string(), "7-apple-orbit-violin");
//! assert_eq!(code.nameplate(), 7);
//! ```
#![warn(missing_docs, unreachable_pub)]

mod code;
pub mod local;
pub mod mdns;
pub mod netif;

pub use code::{Code, CodeError, CodePurpose, NameplateHash, WORDS, WORD_COUNT};
