//! This installation's identity key (`identity`, mode 0600) and its fingerprint.
//!
//! The file is two lines, `ferry identity v1` and `seed` followed by the Ed25519 seed in hex. It is created on
//! first use with `O_EXCL` under a temporary name and linked into place, so two ferry processes starting at once
//! end up with the same key. A file that other users may read or change is refused, as ssh refuses such a key.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ferry_channel::{IdentityKey, PUBLIC_KEY_LEN};
use ferry_rendezvous::WORDS;

use crate::PeersError;

/// File name of the identity key in the config directory.
pub const IDENTITY_FILE: &str = "identity";
const HEADER: &str = "ferry identity v1";
/// A valid file is about 90 bytes; anything much larger is not ours.
const MAX_FILE: u64 = 4096;

/// Loads the identity key from `dir`, creating `dir` (0700) and the key (0600) when there is none.
/// Returns the key and whether it was created now.
pub fn load_or_create(dir: &Path) -> Result<(IdentityKey, bool), PeersError> {
    let path = dir.join(IDENTITY_FILE);
    match open_private(&path) {
        Ok(file) => return Ok((read_key(file, &path)?, false)),
        Err(PeersError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    create_private_dir(dir)?;
    check_private_dir(dir)?;
    let key = IdentityKey::generate();
    let temp = dir.join(format!(".{IDENTITY_FILE}.{}.tmp", std::process::id()));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .map_err(|e| PeersError::io(&temp, e))?;
    let text = format!("{HEADER}\nseed {}\n", crate::to_hex(key.seed()));
    let written = file
        .write_all(text.as_bytes())
        .and_then(|()| file.sync_all());
    // The link fails if another process created the key meanwhile: then theirs is the key.
    let linked = written.and_then(|()| fs::hard_link(&temp, &path));
    let _ = fs::remove_file(&temp);
    match linked {
        Ok(()) => Ok((key, true)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let file = open_private(&path)?;
            Ok((read_key(file, &path)?, false))
        }
        Err(e) => Err(PeersError::io(&path, e)),
    }
}

/// Loads the identity key from `dir` when there is one, creating nothing.
pub(crate) fn load_existing(dir: &Path) -> Result<Option<IdentityKey>, PeersError> {
    let path = dir.join(IDENTITY_FILE);
    match open_private(&path) {
        Ok(file) => Ok(Some(read_key(file, &path)?)),
        Err(PeersError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn read_key(file: File, path: &Path) -> Result<IdentityKey, PeersError> {
    let mut text = String::new();
    file.take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| PeersError::io(path, e))?;
    let damaged = |problem: &str| PeersError::Damaged {
        path: path.to_path_buf(),
        problem: problem.to_string(),
    };
    if text.len() as u64 > MAX_FILE {
        return Err(damaged("larger than 4 KiB"));
    }
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(damaged("the first line is not \"ferry identity v1\""));
    }
    let seed = lines
        .next()
        .and_then(|l| l.strip_prefix("seed "))
        .and_then(crate::from_hex32)
        .ok_or_else(|| damaged("no \"seed\" line with 64 hex digits"))?;
    if lines.any(|l| !l.trim().is_empty()) {
        return Err(damaged("unexpected lines after the seed"));
    }
    Ok(IdentityKey::from_seed(seed))
}

/// Creates `dir` with mode 0700 when it does not exist (parents as `mkdir -p` would).
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), PeersError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| PeersError::io(dir, e))
}

/// Opens a file that holds secrets for reading, refusing one that another user owns or that others may read or
/// write. The checks are made on the open file, so a swap after them changes nothing.
pub(crate) fn open_private(path: &Path) -> Result<File, PeersError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|e| PeersError::io(path, e))?;
    check_private(&file, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        check_private_dir(dir)?;
    }
    Ok(file)
}

/// Refuses a directory of secrets that another user owns or may write (and so could swap files in). Others
/// may read and enter it: the files themselves are 0600. A symlinked directory is judged by its target.
pub(crate) fn check_private_dir(dir: &Path) -> Result<(), PeersError> {
    let st = rustix::fs::stat(dir).map_err(|e| PeersError::io(dir, e.into()))?;
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me {
        return Err(PeersError::NotOwned {
            path: dir.to_path_buf(),
            owner: st.st_uid,
        });
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(PeersError::ExposedDir {
            path: dir.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// Refuses a file that is not a regular file of ours, private to us.
pub(crate) fn check_private(file: &File, path: &Path) -> Result<(), PeersError> {
    let st = rustix::fs::fstat(file).map_err(|e| PeersError::io(path, e.into()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(PeersError::Damaged {
            path: path.to_path_buf(),
            problem: "not a regular file".into(),
        });
    }
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me {
        return Err(PeersError::NotOwned {
            path: PathBuf::from(path),
            owner: st.st_uid,
        });
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o077 != 0 {
        return Err(PeersError::Exposed {
            path: PathBuf::from(path),
            mode,
        });
    }
    Ok(())
}

/// Words in a fingerprint.
pub const FINGERPRINT_WORDS: usize = 8;
const FINGERPRINT_CONTEXT: &str = "ferry 2026 identity fingerprint v1";

/// A public key as eight code words (88 bits), to compare aloud: `ferry id` on one machine, the pairing
/// output on the other.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u16; FINGERPRINT_WORDS]);

impl Fingerprint {
    /// The fingerprint of an Ed25519 public key.
    pub fn of(public: &[u8; PUBLIC_KEY_LEN]) -> Self {
        let digest = blake3::derive_key(FINGERPRINT_CONTEXT, public);
        // 11 bits per word from the first 88 bits of the digest.
        let mut bits = u128::from_be_bytes(digest[..16].try_into().expect("16 bytes"));
        let mut words = [0u16; FINGERPRINT_WORDS];
        for w in &mut words {
            *w = (bits >> (128 - 11)) as u16;
            bits <<= 11;
        }
        Fingerprint(words)
    }

    /// The words, in order.
    pub fn words(&self) -> [&'static str; FINGERPRINT_WORDS] {
        self.0.map(|i| WORDS[i as usize])
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.words().join(" "))
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_key_is_created_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("a/ferry");
        let (first, created) = load_or_create(&conf).unwrap();
        assert!(created);
        let (again, created) = load_or_create(&conf).unwrap();
        assert!(!created);
        assert_eq!(first.public(), again.public());
        let meta = fs::metadata(conf.join(IDENTITY_FILE)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            fs::metadata(&conf).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(fs::read_dir(&conf).unwrap().count(), 1, "no temp file left");
    }

    #[test]
    fn a_config_directory_others_may_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("ferry");
        load_or_create(&conf).unwrap();
        fs::set_permissions(&conf, fs::Permissions::from_mode(0o777)).unwrap();
        let err = load_or_create(&conf).map(|_| ()).unwrap_err();
        assert!(
            matches!(err, PeersError::ExposedDir { mode: 0o777, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("chmod go-w"), "{err}");
        // Readable by others is fine: the files are 0600.
        fs::set_permissions(&conf, fs::Permissions::from_mode(0o755)).unwrap();
        load_or_create(&conf).unwrap();
    }

    #[test]
    fn an_exposed_or_damaged_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        load_or_create(dir.path()).unwrap();
        let path = dir.path().join(IDENTITY_FILE);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = load_or_create(dir.path()).err().unwrap();
        assert!(
            matches!(err, PeersError::Exposed { mode: 0o644, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("chmod 600"), "{err}");

        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&path, "ferry identity v1\nseed 00\n").unwrap();
        let err = load_or_create(dir.path()).err().unwrap();
        assert!(matches!(err, PeersError::Damaged { .. }), "{err}");
    }

    #[test]
    fn a_symlinked_key_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        load_or_create(elsewhere.path()).unwrap();
        std::os::unix::fs::symlink(
            elsewhere.path().join(IDENTITY_FILE),
            dir.path().join(IDENTITY_FILE),
        )
        .unwrap();
        let err = load_or_create(dir.path()).err().unwrap();
        assert!(matches!(err, PeersError::Io { .. }), "{err}");
    }

    #[test]
    fn fingerprints_are_eight_words_and_differ_per_key() {
        let a = IdentityKey::from_seed([1; 32]).public();
        let b = IdentityKey::from_seed([2; 32]).public();
        let fa = Fingerprint::of(&a);
        assert_eq!(fa.to_string().split(' ').count(), FINGERPRINT_WORDS);
        assert_eq!(fa, Fingerprint::of(&a));
        assert_ne!(fa, Fingerprint::of(&b));
        // Every word is a code word, so it can be read aloud and typed back.
        assert!(fa.words().iter().all(|w| WORDS.contains(w)));
    }
}
