//! The cache's files: names derived from versions, opening, stamps of identity, reading records.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use ferry_share::tree::Version;

use crate::record;

/// What identifies the content of a cache file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
}

impl Stamp {
    pub(crate) fn of(m: &fs::Metadata) -> Option<Stamp> {
        m.is_file().then(|| Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            ctime: (m.ctime(), m.ctime_nsec()),
            mtime: (m.mtime(), m.mtime_nsec()),
        })
    }

    pub(crate) fn at(path: &Path) -> Option<Stamp> {
        fs::symlink_metadata(path).ok().as_ref().and_then(Stamp::of)
    }
}

/// File names of a version: derived from its root and size only, never from a peer's path.
pub(crate) fn base_name(version: &Version) -> String {
    let mut s = String::with_capacity(64 + 21);
    for b in version.root {
        s.push_str(&format!("{b:02x}"));
    }
    s.push('-');
    s.push_str(&version.size.to_string());
    s
}

/// The kind of file a name in the cache directory is, and its version.
pub(crate) fn parse_name(name: &str) -> Option<(Version, &str)> {
    let (stem, kind) = name.split_once('.')?;
    let (hex, size) = stem.split_once('-')?;
    if hex.len() != 64 || size.is_empty() || !size.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut root = [0u8; 32];
    for (i, b) in root.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    let version = Version {
        size: size.parse().ok()?,
        root,
    };
    // Only names this cache writes (lower-case hex, no leading zeros) are its own.
    (base_name(&version) == stem).then_some((version, kind))
}

pub(crate) fn remove_if_present(path: &Path) {
    // Best effort: a file left behind is found again by the next open and dealt with there.
    let _ = fs::remove_file(path);
}

pub(crate) fn open_data(path: &Path, size: u64) -> io::Result<File> {
    let file = create_in(
        path,
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW),
    )?;
    if file.metadata()?.len() != size {
        file.set_len(size)?;
    }
    Ok(file)
}

/// Opens `path` with `options` (which create it); when the directory it is in was removed under the cache
/// (a user clearing `~/.cache` while mounted), makes that directory again (0700) and opens once more: what
/// the cache had there is gone, and is found missing and fetched again. The lock taken at
/// [`Cache::open`](crate::Cache::open) stays on the removed directory.
pub(crate) fn create_in(path: &Path, options: &OpenOptions) -> io::Result<File> {
    use std::os::unix::fs::DirBuilderExt;
    match options.open(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)?;
            }
            options.open(path)
        }
        r => r,
    }
}

/// Reads into `buf` at `offset` until it is full or the file ends; returns the bytes read.
pub(crate) fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// The record of `version` in cache directory `dir`; `None` when missing or damaged.
pub(crate) fn read_record(dir: &Path, version: &Version) -> Option<record::Record> {
    let file = File::open(dir.join(base_name(version)).with_extension("record")).ok()?;
    let max = record::max_len(version);
    if file.metadata().ok()?.len() > max {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes).ok()?;
    record::decode(version, &bytes)
}
