//! The pinned peers, `peers.toml` in the config directory.
//!
//! ```toml
//! version = 2
//!
//! [[peer]]
//! name = "laptop"
//! key = "3b6a27bc…"          # Ed25519 public key, hex
//! sealed = "5e1d…"           # the pair's shared secret, sealed (see below), hex
//! paired_at = 1795000000     # Unix seconds
//! last_seen = 1795000100     # optional
//! last_address = "192.168.1.20:7611"   # optional
//! ```
//!
//! Changes go through [`PeerStore::update`]: an exclusive lock on `peers.lock`, a fresh read, the change, and
//! an atomic replace (temporary file, fsync, rename), so two ferry processes never lose each other's writes.
//! The file is written 0600 and refused when other users may read or change it. Removing a peer is
//! revocation: its key is no longer pinned, so it is refused like any unpaired key.
//!
//! The pair secret keys every meeting hash of the pair, so it is never written in the clear: `sealed` is
//! `nonce (12 bytes) || AES-256-GCM(seal key, nonce, secret, aad = the peer's public key)`, with a fresh
//! random nonce on every write and the seal key `BLAKE3-derive_key("ferry 2026 peers.toml seal v1",
//! identity seed)`. A copy of `peers.toml` alone (a backup, a dotfiles repository) computes no meeting hash,
//! and a sealed secret moved to another peer's entry does not open. A file without `version` (written before
//! sealing) holds `secret = "<64 hex digits>"`; it is read as before and rewritten sealed by the first
//! [`PeerStore::load`] that can write it (otherwise by the next change). A sealed secret that does not open
//! (another machine's file, a changed file or identity key) fails the load with [`PeersError::Sealed`] naming
//! the peer; [`PeerStore::update`] keeps such an entry untouched so that it can be removed.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ferry_channel::{IdentityKey, PUBLIC_KEY_LEN};
use serde::{Deserialize, Serialize};

use crate::identity::{self, check_private, create_private_dir, open_private};
use crate::{Fingerprint, PairSecret, PeersError};

/// File name of the peer list in the config directory.
pub const PEERS_FILE: &str = "peers.toml";
const LOCK_FILE: &str = "peers.lock";
/// Largest peer list read (about 4,000 peers).
const MAX_FILE: u64 = 1 << 20;
/// Longest peer name.
pub const MAX_NAME: usize = 32;
/// The format written: 2 seals the pair secrets; 1 (no `version` line) held them in the clear.
const VERSION: u32 = 2;
const SEAL_CONTEXT: &str = "ferry 2026 peers.toml seal v1";
const TAG_LEN: usize = 16;
/// Bytes of a sealed secret: nonce, the 32 encrypted bytes, the tag.
const SEALED_LEN: usize = NONCE_LEN + 32 + TAG_LEN;

/// A peer's local name: 1 to [`MAX_NAME`] ASCII letters, digits, `.`, `_`, `-`, starting with a letter or
/// digit, so it is safe in a file name, a shell and `NAME:PATH` arguments.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerName(String);

impl PeerName {
    /// Checks `name`.
    pub fn new(name: &str) -> Result<Self, PeersError> {
        let ok = !name.is_empty()
            && name.len() <= MAX_NAME
            && name.as_bytes()[0].is_ascii_alphanumeric()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if ok {
            Ok(PeerName(name.to_string()))
        } else {
            Err(PeersError::BadName(name.chars().take(64).collect()))
        }
    }

    /// A usable name made from anything (a host name the peer suggested): invalid characters become `-`,
    /// cut to [`MAX_NAME`]; `peer` when nothing is left.
    pub fn sanitized(suggestion: &str) -> Self {
        let mut s: String = suggestion
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .take(MAX_NAME)
            .collect();
        while s.starts_with(['.', '_', '-']) {
            s.remove(0);
        }
        PeerName::new(&s).unwrap_or_else(|_| PeerName("peer".into()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for PeerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One paired peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Our name for it.
    pub name: PeerName,
    /// Its Ed25519 public key, pinned.
    pub key: [u8; PUBLIC_KEY_LEN],
    /// The secret the pair shares.
    pub secret: PairSecret,
    /// When the pairing happened (Unix seconds).
    pub paired_at: u64,
    /// When a session with it last succeeded (Unix seconds).
    pub last_seen: Option<u64>,
    /// The address of that session.
    pub last_address: Option<String>,
}

impl Peer {
    /// Its key's fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.key)
    }
}

#[derive(Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileForm {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<u32>,
    #[serde(default)]
    peer: Vec<PeerForm>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerForm {
    name: String,
    key: String,
    /// Version 1: the secret in the clear; read, never written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sealed: Option<String>,
    paired_at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_seen: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_address: Option<String>,
}

/// What [`PeerStore::add`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Added {
    /// A new peer.
    New,
    /// The key was paired before (under this old name); its entry was replaced.
    Replaced(PeerName),
}

/// The key that seals pair secrets at rest, derived from this machine's identity key.
struct SealKey([u8; 32]);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

impl SealKey {
    fn of(identity: &IdentityKey) -> Self {
        SealKey(blake3::derive_key(SEAL_CONTEXT, identity.seed()))
    }

    fn aead(&self) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.0).expect("a 32-byte AES-256 key"))
    }

    /// `nonce || ciphertext || tag` in hex; the peer's key is the associated data, so the result opens only
    /// in that peer's entry.
    fn seal(&self, peer_key: &[u8; PUBLIC_KEY_LEN], secret: &PairSecret) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).expect("the system CSPRNG does not fail");
        let mut body = secret.0;
        let tag = self
            .aead()
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(peer_key),
                &mut body,
            )
            .expect("sealing 32 bytes does not fail");
        let mut out = Vec::with_capacity(SEALED_LEN);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&body);
        out.extend_from_slice(tag.as_ref());
        crate::to_hex(&out)
    }

    /// The secret, or `None` when `sealed` was not sealed by this key for this peer (or was changed).
    fn open(
        &self,
        peer_key: &[u8; PUBLIC_KEY_LEN],
        sealed: &[u8; SEALED_LEN],
    ) -> Option<PairSecret> {
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut body = rest.to_vec();
        let plain = self
            .aead()
            .open_in_place(nonce, Aad::from(peer_key), &mut body)
            .ok()?;
        Some(PairSecret(plain.try_into().ok()?))
    }
}

/// The peer list.
#[derive(Debug)]
pub struct PeerStore {
    path: PathBuf,
    peers: Vec<Peer>,
    /// Peers whose sealed secret does not open (secret all zeros), each with its sealed text: written back
    /// unchanged so that they can be renamed or removed; [`PeerStore::load`] refuses a list that has any.
    shut: Vec<(Peer, String)>,
    /// Whether a secret was read in the clear (a version 1 file), to be rewritten sealed.
    plain: bool,
    /// The seal key, when the identity key was read.
    seal: Option<SealKey>,
}

impl PeerStore {
    /// Reads the peer list in `dir`; no file is an empty list. A list written before secrets were sealed is
    /// rewritten sealed now when it can be (else by the next change); a sealed secret that does not open with
    /// this machine's identity key is [`PeersError::Sealed`].
    pub fn load(dir: &Path) -> Result<Self, PeersError> {
        let store = PeerStore::read(dir)?;
        if let Some((peer, _)) = store.shut.first() {
            return Err(PeersError::Sealed {
                path: store.path.clone(),
                peer: peer.name.to_string(),
            });
        }
        if store.plain {
            // A read-only directory still reads; the next change that can write seals the file.
            let _ = PeerStore::update(dir, |_| Ok(()));
        }
        Ok(store)
    }

    fn read(dir: &Path) -> Result<Self, PeersError> {
        let path = dir.join(PEERS_FILE);
        let mut store = PeerStore {
            path,
            peers: Vec::new(),
            shut: Vec::new(),
            plain: false,
            seal: None,
        };
        let file = match open_private(&store.path) {
            Ok(f) => f,
            Err(PeersError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Ok(store)
            }
            Err(e) => return Err(e),
        };
        parse(file, dir, &mut store)?;
        Ok(store)
    }

    /// Runs `change` on a fresh copy of the list under the lock and saves the result when `change` succeeds.
    pub fn update<T>(
        dir: &Path,
        change: impl FnOnce(&mut PeerStore) -> Result<T, PeersError>,
    ) -> Result<T, PeersError> {
        create_private_dir(dir)?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&lock_path)
            .map_err(|e| PeersError::io(&lock_path, e))?;
        check_private(&lock, &lock_path)?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| PeersError::io(&lock_path, e.into()))?;
        let mut store = PeerStore::read(dir)?;
        let out = change(&mut store)?;
        store.save()?;
        Ok(out)
        // The lock is released when `lock` is closed.
    }

    /// Every peer, in the order they were paired.
    pub fn peers(&self) -> &[Peer] {
        &self.peers
    }

    /// The peer called `name`.
    pub fn get(&self, name: &str) -> Result<&Peer, PeersError> {
        self.peers
            .iter()
            .find(|p| p.name.as_str() == name)
            .ok_or_else(|| PeersError::UnknownPeer(name.chars().take(64).collect()))
    }

    /// The peer with this key, if it is pinned.
    pub fn by_key(&self, key: &[u8; PUBLIC_KEY_LEN]) -> Option<&Peer> {
        self.peers.iter().find(|p| &p.key == key)
    }

    /// Every entry, including those whose secret does not open: names and keys are unique across both.
    fn all(&self) -> impl Iterator<Item = &Peer> {
        self.peers.iter().chain(self.shut.iter().map(|(p, _)| p))
    }

    /// Pins a peer. A key paired before is replaced (pairing again renews the secret); a name that another key
    /// has is refused.
    pub fn add(&mut self, peer: Peer) -> Result<Added, PeersError> {
        if self.all().any(|p| p.name == peer.name && p.key != peer.key) {
            return Err(PeersError::NameTaken(peer.name.to_string()));
        }
        if let Some(i) = self.shut.iter().position(|(p, _)| p.key == peer.key) {
            let (was, _) = self.shut.remove(i);
            self.peers.push(peer);
            return Ok(Added::Replaced(was.name));
        }
        if let Some(old) = self.peers.iter_mut().find(|p| p.key == peer.key) {
            let was = std::mem::replace(old, peer);
            return Ok(Added::Replaced(was.name));
        }
        self.peers.push(peer);
        Ok(Added::New)
    }

    /// A free name based on `wanted` (`wanted`, `wanted-2`, `wanted-3`, ...), or `wanted` itself when `key`
    /// already has it.
    pub fn free_name(&self, wanted: &PeerName, key: &[u8; PUBLIC_KEY_LEN]) -> PeerName {
        let taken = |n: &PeerName| self.all().any(|p| &p.name == n && &p.key != key);
        if !taken(wanted) {
            return wanted.clone();
        }
        (2..)
            .map(|i| {
                let suffix = format!("-{i}");
                let base: String = wanted
                    .as_str()
                    .chars()
                    .take(MAX_NAME - suffix.len())
                    .collect();
                PeerName(base + &suffix)
            })
            .find(|n| !taken(n))
            .expect("some suffix is free")
    }

    /// Renames a peer.
    pub fn rename(&mut self, old: &str, new: PeerName) -> Result<(), PeersError> {
        if self.all().any(|p| p.name == new && p.name.as_str() != old) {
            return Err(PeersError::NameTaken(new.to_string()));
        }
        let peer = self
            .peers
            .iter_mut()
            .chain(self.shut.iter_mut().map(|(p, _)| p))
            .find(|p| p.name.as_str() == old)
            .ok_or_else(|| PeersError::UnknownPeer(old.chars().take(64).collect()))?;
        peer.name = new;
        Ok(())
    }

    /// Forgets a peer: from now on its key is refused like any unpaired key. A peer whose secret does not open
    /// is removed too (its returned secret is all zeros).
    pub fn remove(&mut self, name: &str) -> Result<Peer, PeersError> {
        if let Some(i) = self.shut.iter().position(|(p, _)| p.name.as_str() == name) {
            return Ok(self.shut.remove(i).0);
        }
        let i = self
            .peers
            .iter()
            .position(|p| p.name.as_str() == name)
            .ok_or_else(|| PeersError::UnknownPeer(name.chars().take(64).collect()))?;
        Ok(self.peers.remove(i))
    }

    /// Records a successful session with the peer holding `key`.
    pub fn seen(&mut self, key: &[u8; PUBLIC_KEY_LEN], when: u64, address: Option<String>) {
        if let Some(p) = self.peers.iter_mut().find(|p| &p.key == key) {
            p.last_seen = Some(when);
            if address.is_some() {
                p.last_address = address;
            }
        }
    }

    fn save(&mut self) -> Result<(), PeersError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        if self.seal.is_none() && !self.peers.is_empty() {
            self.seal = Some(SealKey::of(&identity::load_or_create(dir)?.0));
        }
        let form_of = |p: &Peer, sealed: String| PeerForm {
            name: p.name.to_string(),
            key: crate::to_hex(&p.key),
            secret: None,
            sealed: Some(sealed),
            paired_at: p.paired_at,
            last_seen: p.last_seen,
            last_address: p.last_address.clone(),
        };
        let seal = self.seal.as_ref();
        let form = FileForm {
            version: Some(VERSION),
            peer: self
                .peers
                .iter()
                .map(|p| {
                    let sealed = seal.expect("read above").seal(&p.key, &p.secret);
                    form_of(p, sealed)
                })
                .chain(
                    self.shut
                        .iter()
                        .map(|(p, sealed)| form_of(p, sealed.clone())),
                )
                .collect(),
        };
        let text = toml::to_string(&form).expect("the peer list serializes");
        let temp = dir.join(format!(".{PEERS_FILE}.{}.tmp", std::process::id()));
        let written = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temp)?;
            f.write_all(
                b"# ferry's paired peers: edit with `ferry peers`. Secrets sealed by this machine's key.\n",
            )?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            fs::rename(&temp, &self.path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temp);
        }
        written.map_err(|e| PeersError::io(&self.path, e))
    }
}

/// Reads the list into `store`: open secrets into `peers`, sealed ones that do not open into `shut`.
fn parse(file: File, dir: &Path, store: &mut PeerStore) -> Result<(), PeersError> {
    let path = &store.path.clone();
    let mut text = String::new();
    file.take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| PeersError::io(path, e))?;
    let damaged = |problem: String| PeersError::Damaged {
        path: path.to_path_buf(),
        problem,
    };
    if text.len() as u64 > MAX_FILE {
        return Err(damaged("larger than 1 MiB".into()));
    }
    let form: FileForm = toml::from_str(&text).map_err(|e| damaged(e.message().to_string()))?;
    match form.version {
        None | Some(1..=VERSION) => {}
        Some(v) => {
            return Err(damaged(format!(
                "format version {v} is not one this ferry reads (1 to {VERSION})"
            )))
        }
    }
    if form.peer.iter().any(|p| p.sealed.is_some()) {
        // Only a list with sealed secrets needs the identity key: a missing one opens nothing.
        store.seal = identity::load_existing(dir)?.map(|k| SealKey::of(&k));
    }
    let mut names = HashSet::new();
    let mut keys = HashSet::new();
    for p in form.peer {
        let name = PeerName::new(&p.name).map_err(|e| damaged(e.to_string()))?;
        let key = crate::from_hex32(&p.key)
            .ok_or_else(|| damaged(format!("peer {name}: key is not 64 hex digits")))?;
        if !names.insert(name.clone()) || !keys.insert(key) {
            return Err(damaged(format!("peer {name} is listed twice")));
        }
        let mut peer = Peer {
            name,
            key,
            secret: PairSecret([0; 32]),
            paired_at: p.paired_at,
            last_seen: p.last_seen,
            last_address: p.last_address,
        };
        match (p.secret, p.sealed) {
            (Some(plain), None) => {
                peer.secret = PairSecret(crate::from_hex32(&plain).ok_or_else(|| {
                    damaged(format!("peer {}: secret is not 64 hex digits", peer.name))
                })?);
                store.plain = true;
                store.peers.push(peer);
            }
            (None, Some(sealed)) => {
                let bytes = crate::from_hex::<SEALED_LEN>(&sealed).ok_or_else(|| {
                    damaged(format!(
                        "peer {}: sealed is not {} hex digits",
                        peer.name,
                        2 * SEALED_LEN
                    ))
                })?;
                match store.seal.as_ref().and_then(|s| s.open(&key, &bytes)) {
                    Some(secret) => {
                        peer.secret = secret;
                        store.peers.push(peer);
                    }
                    None => store.shut.push((peer, sealed)),
                }
            }
            _ => {
                return Err(damaged(format!(
                    "peer {}: needs exactly one of sealed and secret",
                    peer.name
                )))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn peer(name: &str, k: u8) -> Peer {
        Peer {
            name: PeerName::new(name).unwrap(),
            key: [k; 32],
            secret: PairSecret([k ^ 0xff; 32]),
            paired_at: 1_795_000_000,
            last_seen: None,
            last_address: None,
        }
    }

    #[test]
    fn names_are_checked_and_suggestions_cleaned() {
        for good in ["laptop", "a", "nas-2.home", "x_y", &"z".repeat(32)] {
            assert!(PeerName::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-x",
            ".hidden",
            "a b",
            "a/b",
            "a:b",
            "ü",
            &"z".repeat(33),
        ] {
            assert!(PeerName::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(PeerName::sanitized("Bob's Mac").as_str(), "Bob-s-Mac");
        assert_eq!(
            PeerName::sanitized("../../etc").as_str(),
            "..-..-etc".trim_start_matches(['.', '-'])
        );
        assert_eq!(PeerName::sanitized("\u{1b}[31m").as_str(), "31m");
        assert_eq!(PeerName::sanitized("").as_str(), "peer");
    }

    #[test]
    fn the_list_survives_a_round_trip_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("ferry");
        PeerStore::update(&conf, |s| {
            s.add(peer("laptop", 1))?;
            s.add(peer("nas", 2))?;
            s.seen(&[2; 32], 1_795_000_500, Some("127.0.0.1:7611".into()));
            Ok(())
        })
        .unwrap();
        let s = PeerStore::load(&conf).unwrap();
        assert_eq!(s.peers().len(), 2);
        let nas = s.get("nas").unwrap();
        assert_eq!(nas.last_seen, Some(1_795_000_500));
        assert_eq!(nas.last_address.as_deref(), Some("127.0.0.1:7611"));
        assert_eq!(nas.secret, PairSecret([0xfd; 32]));
        assert_eq!(s.by_key(&[1; 32]).unwrap().name.as_str(), "laptop");
        let mode = fs::metadata(conf.join(PEERS_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn rename_remove_and_name_clashes() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = PeerStore::load(dir.path()).unwrap();
        s.add(peer("laptop", 1)).unwrap();
        assert!(matches!(
            s.add(peer("laptop", 2)),
            Err(PeersError::NameTaken(_))
        ));
        assert_eq!(
            s.free_name(&PeerName::new("laptop").unwrap(), &[2; 32])
                .as_str(),
            "laptop-2"
        );
        assert_eq!(
            s.free_name(&PeerName::new("laptop").unwrap(), &[1; 32])
                .as_str(),
            "laptop"
        );
        // Pairing the same key again replaces its entry.
        assert_eq!(
            s.add(peer("work", 1)).unwrap(),
            Added::Replaced(PeerName::new("laptop").unwrap())
        );
        assert_eq!(s.peers().len(), 1);
        s.add(peer("nas", 2)).unwrap();
        assert!(matches!(
            s.rename("work", PeerName::new("nas").unwrap()),
            Err(PeersError::NameTaken(_))
        ));
        s.rename("work", PeerName::new("laptop").unwrap()).unwrap();
        assert!(matches!(
            s.rename("nope", PeerName::new("x").unwrap()),
            Err(PeersError::UnknownPeer(_))
        ));
        let gone = s.remove("laptop").unwrap();
        assert_eq!(gone.key, [1; 32]);
        assert!(
            s.by_key(&[1; 32]).is_none(),
            "a removed key is no longer pinned"
        );
        assert!(matches!(s.get("laptop"), Err(PeersError::UnknownPeer(_))));
    }

    #[test]
    fn a_hostile_or_exposed_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PEERS_FILE);
        let write = |text: &str, mode: u32| {
            fs::write(&path, text).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        };
        let key = "ab".repeat(32);
        let ok = format!(
            "[[peer]]\nname = \"nas\"\nkey = \"{key}\"\nsecret = \"{key}\"\npaired_at = 1\n"
        );
        write(&ok, 0o600);
        assert!(PeerStore::load(dir.path()).is_ok());
        write(&ok, 0o622);
        assert!(matches!(
            PeerStore::load(dir.path()),
            Err(PeersError::Exposed { .. })
        ));
        for bad in [
            ok.replace("nas", "../x"),
            ok.replace(&format!("key = \"{key}\""), "key = \"ab\""),
            format!("{ok}{ok}"),
            format!("{ok}extra = 1\n"),
            "[[peer]]\nname = 1\n".to_string(),
        ] {
            write(&bad, 0o600);
            let err = PeerStore::load(dir.path()).err().unwrap();
            assert!(matches!(err, PeersError::Damaged { .. }), "{bad}: {err}");
        }
        write(&"#".repeat(MAX_FILE as usize + 10), 0o600);
        assert!(matches!(
            PeerStore::load(dir.path()),
            Err(PeersError::Damaged { .. })
        ));
    }

    fn sealed_of(text: &str) -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("sealed = \""))
            .map(|l| l.trim_end_matches('"').to_string())
            .collect()
    }

    fn expect_sealed(dir: &Path, name: &str) {
        let err = PeerStore::load(dir).expect_err("the load fails");
        match &err {
            PeersError::Sealed { peer, .. } => assert_eq!(peer, name, "{err}"),
            other => panic!("not Sealed: {other}"),
        }
        let text = err.to_string();
        assert!(
            text.contains(&format!("ferry peers remove {name}")),
            "{text}"
        );
    }

    #[test]
    fn secrets_are_sealed_at_rest_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("ferry");
        PeerStore::update(&conf, |s| {
            s.add(peer("laptop", 1))?;
            s.add(peer("nas", 2))
        })
        .unwrap();
        let text = fs::read_to_string(conf.join(PEERS_FILE)).unwrap();
        for k in [1u8, 2] {
            let secret = crate::to_hex(&[k ^ 0xff; 32]);
            assert!(!text.contains(&secret), "secret {k} in the clear:\n{text}");
        }
        assert!(text.contains("version = 2"), "{text}");
        assert!(!text.contains("secret ="), "{text}");
        assert_eq!(sealed_of(&text).len(), 2, "{text}");
        let s = PeerStore::load(&conf).unwrap();
        assert_eq!(s.get("laptop").unwrap().secret, PairSecret([0xfe; 32]));
        assert_eq!(s.get("nas").unwrap().secret, PairSecret([0xfd; 32]));
        // Every write seals with a fresh nonce.
        PeerStore::update(&conf, |_| Ok(())).unwrap();
        let again = fs::read_to_string(conf.join(PEERS_FILE)).unwrap();
        assert_ne!(sealed_of(&text), sealed_of(&again));
        assert_eq!(PeerStore::load(&conf).unwrap().peers(), s.peers());
    }

    #[test]
    fn a_plain_file_is_rewritten_sealed_on_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PEERS_FILE);
        let (key, secret) = ("ab".repeat(32), "5c".repeat(32));
        fs::write(
            &path,
            format!(
                "[[peer]]\nname = \"nas\"\nkey = \"{key}\"\nsecret = \"{secret}\"\npaired_at = 1\n"
            ),
        )
        .unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let s = PeerStore::load(dir.path()).unwrap();
        assert_eq!(s.get("nas").unwrap().secret, PairSecret([0x5c; 32]));
        let bytes = fs::read(&path).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(!text.contains(&secret), "still in the clear:\n{text}");
        assert!(
            text.contains("version = 2") && sealed_of(&text).len() == 1,
            "{text}"
        );
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let s = PeerStore::load(dir.path()).unwrap();
        assert_eq!(s.get("nas").unwrap().secret, PairSecret([0x5c; 32]));
    }

    #[test]
    fn a_sealed_secret_opens_only_in_its_entry_with_this_key() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().to_path_buf();
        let path = conf.join(PEERS_FILE);
        let fill = || {
            let _ = fs::remove_file(&path);
            PeerStore::update(&conf, |s| {
                s.add(peer("laptop", 1))?;
                s.add(peer("nas", 2))
            })
            .unwrap();
            fs::read_to_string(&path).unwrap()
        };
        let rewrite = |text: String| {
            fs::write(&path, text).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        };

        // Moved to another peer's entry: both entries fail, each by name, and each can be removed.
        let text = fill();
        let [a, b] = <[String; 2]>::try_from(sealed_of(&text)).unwrap();
        rewrite(
            text.replace(&a, "A")
                .replace(&b, &a)
                .replace("\"A\"", &format!("\"{b}\"")),
        );
        expect_sealed(&conf, "laptop");
        let gone = PeerStore::update(&conf, |s| s.remove("laptop")).unwrap();
        assert_eq!(gone.key, [1; 32]);
        expect_sealed(&conf, "nas");
        PeerStore::update(&conf, |s| s.remove("nas")).unwrap();
        assert!(PeerStore::load(&conf).unwrap().peers().is_empty());

        // Changed: one digit of the ciphertext.
        let text = fill();
        let nas = sealed_of(&text)[1].clone();
        let mut changed = nas.clone().into_bytes();
        changed[40] = if changed[40] == b'0' { b'1' } else { b'0' };
        rewrite(text.replace(&nas, std::str::from_utf8(&changed).unwrap()));
        expect_sealed(&conf, "nas");
        // An untouched entry still renames, and the shut one is written back unchanged.
        PeerStore::update(&conf, |s| s.rename("laptop", PeerName::new("lap").unwrap())).unwrap();
        expect_sealed(&conf, "nas");
        // Pairing the same key again replaces the entry that does not open.
        PeerStore::update(&conf, |s| s.add(peer("nas", 2))).unwrap();
        assert_eq!(
            PeerStore::load(&conf).unwrap().get("nas").unwrap().secret,
            PairSecret([0xfd; 32])
        );

        // Opened with another machine's identity key, or with none.
        fill();
        let other = tempfile::tempdir().unwrap();
        identity::load_or_create(other.path()).unwrap();
        let id = conf.join(identity::IDENTITY_FILE);
        let mine = fs::read(&id).unwrap();
        fs::write(
            &id,
            fs::read(other.path().join(identity::IDENTITY_FILE)).unwrap(),
        )
        .unwrap();
        expect_sealed(&conf, "laptop");
        fs::remove_file(&id).unwrap();
        expect_sealed(&conf, "laptop");
        fs::write(&id, mine).unwrap();
        fs::set_permissions(&id, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(PeerStore::load(&conf).unwrap().peers().len(), 2);
    }

    #[test]
    fn concurrent_updates_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().to_path_buf();
        let threads: Vec<_> = (0..8u8)
            .map(|i| {
                let conf = conf.clone();
                std::thread::spawn(move || {
                    PeerStore::update(&conf, |s| s.add(peer(&format!("p{i}"), i + 1))).unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(PeerStore::load(&conf).unwrap().peers().len(), 8);
    }
}
