//! The on-disk chunk cache ([`ferry_cache::Cache`]) as the read path's [`Store`].

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use ferry_cache::{Cache, Entry};
use ferry_share::tree::{GroupCv, Version};

use crate::store::{Chunks, Kept, Store, StoreError};

fn failed(e: ferry_cache::CacheError) -> StoreError {
    match e {
        // Said as "cache: ..." once, by StoreError.
        ferry_cache::CacheError::Io(e) => StoreError(e.to_string()),
        e => StoreError(e.to_string()),
    }
}

impl Chunks for Entry {
    fn version(&self) -> Version {
        Entry::version(self)
    }

    fn missing(&self, range: Range<u64>) -> Vec<Range<u64>> {
        Entry::missing(self, range)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize, StoreError> {
        Entry::read_at(self, buf, offset).map_err(failed)
    }

    fn insert(&self, offset: u64, bytes: &[u8], cvs: &[GroupCv]) -> Result<Kept, StoreError> {
        let stored = if cvs.is_empty() {
            Entry::insert(self, offset, bytes)
        } else {
            Entry::insert_verified(self, offset, bytes, cvs)
        };
        let stored = stored.map_err(failed)?;
        let full = self
            .disk_full()
            .map(|why| format!("the cache's disk is full ({why})"));
        Ok(match (stored, full) {
            (true, None) => Kept::Stored,
            (true, Some(why)) => Kept::Short(why),
            (false, Some(why)) => Kept::NoRoom(why),
            // Every entry is pinned by an open file: a larger --cache-size is the way out.
            (false, None) => {
                Kept::NoRoom("the cache is full of files in use (raise --cache-size)".into())
            }
        })
    }

    fn is_complete(&self) -> bool {
        Entry::is_complete(self)
    }

    fn backing(&self) -> Option<File> {
        Entry::backing(self).ok().flatten()
    }

    fn adopt(&self, path: &Path) -> Result<bool, StoreError> {
        Entry::adopt(self, path).map_err(failed)
    }
}

impl Store for Cache {
    fn entry(&self, version: Version) -> Result<Arc<dyn Chunks>, StoreError> {
        let entry: Arc<Entry> = Cache::entry(self, version).map_err(failed)?;
        Ok(entry)
    }

    fn make_room(&self, bytes: u64) -> bool {
        Cache::make_room(self, bytes)
    }

    fn extend(&self, old: Version, new: Version, tail: &[u8]) -> Result<bool, StoreError> {
        let next = Cache::entry(self, new).map_err(failed)?;
        Cache::entry(self, old)
            .and_then(|e| e.extend(&next, tail))
            .map_err(failed)
    }
}
