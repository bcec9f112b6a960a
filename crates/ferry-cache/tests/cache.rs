//! The cache on real files in a temporary directory, with versions made by the share protocol's tree.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_cache::{Cache, CacheError, Entry};
use ferry_share::tree::{
    covering, encode_piece, verify_piece_cvs, GroupCv, Outboard, Version, GROUP,
};

const G: usize = GROUP as usize;

/// Test data and its version (root from the share protocol's own tree).
fn file(len: usize, seed: u64) -> (Vec<u8>, Version) {
    let data = ferry_testkit::pseudo_random(len, seed);
    let version = Outboard::compute(&data[..], len as u64).unwrap().version();
    (data, version)
}

/// Inserts groups `groups` of `data`.
fn put(entry: &Entry, data: &[u8], groups: std::ops::Range<usize>) -> bool {
    let from = groups.start * G;
    let to = (groups.end * G).min(data.len());
    entry.insert(from as u64, &data[from..to]).unwrap()
}

fn read(entry: &Entry, offset: usize, len: usize) -> Result<Vec<u8>, CacheError> {
    let mut buf = vec![0u8; len];
    let n = entry.read_at(&mut buf, offset as u64)?;
    buf.truncate(n);
    Ok(buf)
}

/// The cache's files of one version (data, record).
fn files_of(dir: &Path, v: &Version) -> (PathBuf, PathBuf) {
    let hex: String = v.root.iter().map(|b| format!("{b:02x}")).collect();
    let base = dir.join(format!("{hex}-{}", v.size));
    (base.with_extension("data"), base.with_extension("record"))
}

/// Flips one byte of a file on disk, as a stray program or a bad disk would.
fn flip(path: &Path, at: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x40;
    f.write_all_at(&b, at).unwrap();
}

#[test]
fn inserted_groups_read_back_and_the_rest_is_missing() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let dir = t.path().join("peer/share");
    let cache = Cache::open(&dir, 1 << 30).unwrap();
    assert_eq!(
        fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(
        fs::metadata(t.path().join("peer"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    let (data, v) = file(5 * G + 777, 1);
    let size = v.size;
    let e = cache.entry(v).unwrap();
    assert_eq!(e.version(), v);
    assert_eq!(e.missing(0..size), vec![0..size]);
    assert!(put(&e, &data, 1..3));
    assert_eq!(cache.used(), 2 * GROUP);
    assert_eq!(e.missing(0..size), vec![0..GROUP, 3 * GROUP..size]);
    assert_eq!(e.missing(GROUP + 5..2 * GROUP), vec![]);
    // Clamped to the size and rounded out to groups.
    assert_eq!(e.missing(3 * GROUP + 1..u64::MAX), vec![3 * GROUP..size]);
    assert_eq!(e.missing(size..size + 10), vec![]);
    assert_eq!(read(&e, G + 100, G).unwrap(), &data[G + 100..2 * G + 100]);
    assert!(matches!(read(&e, G, 2 * G + 1), Err(CacheError::Missing)));
    assert!(matches!(read(&e, 0, 1), Err(CacheError::Missing)));
    // The short last group, and a read past the end clamped.
    assert!(put(&e, &data, 5..6));
    assert_eq!(read(&e, 5 * G + 700, 1000).unwrap(), &data[5 * G + 700..]);
    assert_eq!(read(&e, data.len(), 10).unwrap(), b"");
    assert_eq!(cache.used(), 2 * GROUP + 777);
    // Only whole groups at group offsets inside the file.
    for (at, len) in [
        (1, G),
        (0, G - 1),
        (0, 2 * G + 1),
        (5 * G, 776),
        (5 * G, 778),
    ] {
        let bytes = vec![0; len];
        assert!(
            matches!(e.insert(at as u64, &bytes), Err(CacheError::Range)),
            "{at} {len}"
        );
    }
    // Inserting present groups again changes nothing.
    assert!(put(&e, &data, 0..3));
    assert_eq!(cache.used(), 3 * GROUP + 777);
    assert!(!e.is_complete());
    assert!(e.backing().unwrap().is_none());
}

#[test]
fn a_complete_entry_makes_the_root_and_hands_out_its_file() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let cache = Cache::open(t.path(), 1 << 30).unwrap();
    for len in [0, 1, G, G + 1, 7 * G - 3] {
        let (data, v) = file(len, len as u64);
        let e = cache.entry(v).unwrap();
        let groups = len.div_ceil(G);
        // Out of order, the last group first.
        for g in (0..groups).rev() {
            assert!(!e.is_complete());
            assert!(put(&e, &data, g..g + 1));
        }
        assert!(e.is_complete(), "len {len}");
        let mut f = e.backing().unwrap().expect("complete");
        let mut back = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut back).unwrap();
        assert_eq!(back, data, "len {len}");
        assert!(f.metadata().unwrap().permissions().readonly() || f.set_len(0).is_err());
    }
}

#[test]
fn groups_that_do_not_make_the_root_are_refused_whole() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let cache = Cache::open(t.path(), 1 << 30).unwrap();
    let (data, v) = file(4 * G + 9, 2);
    let e = cache.entry(v).unwrap();
    let mut wrong = data.clone();
    wrong[2 * G + 3] ^= 1;
    // The cache trusts its caller per group (the share client verified them); the whole catches a lie.
    assert!(put(&e, &wrong, 0..4));
    assert!(matches!(
        e.insert(4 * GROUP, &data[4 * G..]),
        Err(CacheError::Mismatch)
    ));
    assert!(!e.is_complete());
    assert!(e.backing().unwrap().is_none());
    assert_eq!(e.missing(0..v.size), vec![0..v.size]);
    assert_eq!(cache.used(), 0);
    // The right bytes are taken afterwards.
    assert!(put(&e, &data, 0..5));
    assert!(e.is_complete());
    assert_eq!(read(&e, 0, data.len()).unwrap(), data);
}

/// `data`'s groups `groups` verified as the share client verifies them: the bytes and each group's value.
fn verified(data: &[u8], groups: std::ops::Range<usize>) -> (u64, Vec<u8>, Vec<GroupCv>) {
    let ob = Outboard::compute(data, data.len() as u64).unwrap();
    let range = covering(
        data.len() as u64,
        (groups.start * G) as u64,
        (groups.len() * G) as u64,
    );
    let mut piece = Vec::new();
    encode_piece(data, &ob, range.clone(), &mut piece).unwrap();
    let (mut bytes, mut cvs) = (Vec::new(), Vec::new());
    verify_piece_cvs(&ob.version(), range.clone(), &piece, &mut bytes, &mut cvs).unwrap();
    (range.start, bytes, cvs)
}

#[test]
fn groups_inserted_with_their_verified_values_complete_and_are_checked_like_hashed_ones() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    for len in [1, G, 5 * G + 9] {
        let cache = Cache::open(t.path(), 1 << 30).unwrap();
        let (data, v) = file(len, 40 + len as u64);
        let (data_path, _) = files_of(t.path(), &v);
        let e = cache.entry(v).unwrap();
        let groups = len.div_ceil(G);
        let (at, bytes, cvs) = verified(&data, groups / 2..groups);
        assert!(e.insert_verified(at, &bytes, &cvs).unwrap());
        let (at, bytes, cvs) = verified(&data, 0..groups / 2);
        assert!(e.insert_verified(at, &bytes, &cvs).unwrap());
        assert!(e.is_complete(), "len {len}");
        assert_eq!(read(&e, 0, len).unwrap(), data);
        // The values kept are the bytes' own: an altered byte is found, the rest still verifies.
        flip(&data_path, (len - 1) as u64);
        assert!(matches!(read(&e, len - 1, 1), Err(CacheError::Missing)));
        assert_eq!(
            e.missing(0..v.size),
            vec![((groups - 1) * G) as u64..v.size]
        );
        drop((e, cache));
        let cache = Cache::open(t.path(), 1 << 30).unwrap();
        let e = cache.entry(v).unwrap();
        assert_eq!(
            e.missing(0..v.size),
            vec![((groups - 1) * G) as u64..v.size]
        );
        cache.remove(v).unwrap();
    }
}

#[test]
fn a_value_that_is_not_its_groups_is_refused() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let (data, v) = file(6 * G + 1, 50);
    {
        let cache = Cache::open(t.path(), 1 << 30).unwrap();
        let e = cache.entry(v).unwrap();
        let (at, bytes, mut cvs) = verified(&data, 0..3);
        // One value too few or too many.
        assert!(matches!(
            e.insert_verified(at, &bytes, &cvs[..2]),
            Err(CacheError::Range)
        ));
        cvs[1][5] ^= 1;
        assert!(e.insert_verified(at, &bytes, &cvs).unwrap());
        // Kept until checked: the next process hashes the group again and drops it.
        assert_eq!(e.missing(0..3 * GROUP), vec![]);
    }
    let cache = Cache::open(t.path(), 1 << 30).unwrap();
    let e = cache.entry(v).unwrap();
    assert_eq!(e.missing(0..3 * GROUP), vec![GROUP..2 * GROUP]);
    // A wrong value that completes the entry fails its root: nothing of it is kept.
    let (at, bytes, mut cvs) = verified(&data, 1..7);
    cvs[5][0] ^= 1;
    assert!(matches!(
        e.insert_verified(at, &bytes, &cvs),
        Err(CacheError::Mismatch)
    ));
    assert_eq!(e.missing(0..v.size), vec![0..v.size]);
    assert_eq!(cache.used(), 0);
}

#[test]
fn a_reopened_cache_finds_its_entries_and_ranges() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let (a, va) = file(10 * G, 3);
    let (b, vb) = file(3 * G + 1, 4);
    {
        let cache = Cache::open(t.path(), 1 << 30).unwrap();
        let ea = cache.entry(va).unwrap();
        assert!(put(&ea, &a, 2..5));
        assert!(put(&ea, &a, 7..8));
        let eb = cache.entry(vb).unwrap();
        assert!(put(&eb, &b, 0..4));
        assert!(eb.is_complete());
    }
    let cache = Cache::open(t.path(), 1 << 30).unwrap();
    assert_eq!(cache.used(), 4 * GROUP + 3 * GROUP + 1);
    let ea = cache.entry(va).unwrap();
    assert_eq!(
        ea.missing(0..va.size),
        vec![0..2 * GROUP, 5 * GROUP..7 * GROUP, 8 * GROUP..10 * GROUP]
    );
    assert_eq!(read(&ea, 2 * G, 3 * G).unwrap(), &a[2 * G..5 * G]);
    let eb = cache.entry(vb).unwrap();
    assert!(eb.is_complete());
    assert!(eb.backing().unwrap().is_some());
    assert_eq!(read(&eb, 0, b.len()).unwrap(), b);
}

#[test]
fn the_least_recently_used_entries_go_first_even_after_a_restart() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let files: Vec<(Vec<u8>, Version)> = (0..5).map(|i| file(2 * G, 10 + i)).collect();
    let limit = 6 * GROUP;
    {
        let cache = Cache::open(t.path(), limit).unwrap();
        for (data, v) in &files[..3] {
            let e = cache.entry(*v).unwrap();
            assert!(put(&e, data, 0..2));
        }
        assert_eq!(cache.used(), limit);
        // 0 used last: 1 is now the oldest.
        let e0 = cache.entry(files[0].1).unwrap();
        read(&e0, 0, 10).unwrap();
        drop(e0);
        let e3 = cache.entry(files[3].1).unwrap();
        assert!(put(&e3, &files[3].0, 0..1));
        assert_eq!(cache.used(), 5 * GROUP);
        let (data1, record1) = files_of(t.path(), &files[1].1);
        assert!(!data1.exists() && !record1.exists(), "eviction deletes");
        assert!(files_of(t.path(), &files[2].1).0.exists());
        assert!(put(&e3, &files[3].0, 1..2));
        assert_eq!(cache.used(), limit);
    }
    // Order kept on disk: 2, then 0, then 3.
    let cache = Cache::open(t.path(), limit).unwrap();
    assert_eq!(cache.used(), limit);
    let e4 = cache.entry(files[4].1).unwrap();
    assert!(put(&e4, &files[4].0, 0..2));
    assert!(!files_of(t.path(), &files[2].1).0.exists());
    for i in [0, 3] {
        let e = cache.entry(files[i].1).unwrap();
        assert_eq!(e.missing(0..2 * GROUP), vec![], "file {i}");
    }
    // A smaller limit at open evicts at once, oldest first: 4, inserted before 0 and 3 were used again.
    drop((e4, cache));
    let cache = Cache::open(t.path(), 4 * GROUP).unwrap();
    assert_eq!(cache.used(), 4 * GROUP);
    assert!(!files_of(t.path(), &files[4].1).0.exists());
    assert!(files_of(t.path(), &files[0].1).0.exists());
    assert!(files_of(t.path(), &files[3].1).0.exists());
}

#[test]
fn a_file_larger_than_the_cache_is_read_through_it_dropping_what_is_behind() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let limit = 16 * GROUP;
    let (data, v) = file(100 * G + 7, 60);
    let (data_path, _) = files_of(t.path(), &v);
    {
        let cache = Cache::open(t.path(), limit).unwrap();
        let e = cache.entry(v).unwrap();
        for g in (0..101).step_by(4) {
            assert!(put(&e, &data, g..(g + 4).min(101)), "group {g}");
            assert!(cache.used() <= limit);
            // What was just stored reads back; what is far behind was let go, its blocks freed.
            let to = ((g + 4) * G).min(data.len());
            assert_eq!(read(&e, g * G, to - g * G).unwrap(), &data[g * G..to]);
        }
        assert_eq!(e.missing(0..GROUP), vec![0..GROUP]);
        assert!(fs::metadata(&data_path).unwrap().blocks() * 512 <= limit + 4 * GROUP);
        // Bytes larger than the whole cache are not stored.
        assert!(!e.insert(0, &data[..17 * G]).unwrap());
    }
    // What is kept still verifies in the next process: nothing was dropped on its check.
    let cache = Cache::open(t.path(), limit).unwrap();
    let e = cache.entry(v).unwrap();
    assert_eq!(e.missing(96 * GROUP..v.size), vec![]);
    assert_eq!(
        read(&e, 96 * G, data.len() - 96 * G).unwrap(),
        &data[96 * G..]
    );
}

#[test]
fn pinned_entries_are_never_evicted() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let cache = Cache::open(t.path(), 3 * GROUP).unwrap();
    let (a, va) = file(2 * G, 20);
    let (b, vb) = file(2 * G, 21);
    let ea = cache.entry(va).unwrap();
    assert!(put(&ea, &a, 0..2));
    let eb = cache.entry(vb).unwrap();
    assert!(put(&eb, &b, 0..1));
    // Full of pinned entries: the entry makes room in itself, the other one keeps all it has.
    assert!(put(&eb, &b, 1..2));
    assert_eq!(eb.missing(0..vb.size), vec![0..GROUP]);
    assert_eq!(cache.used(), 3 * GROUP);
    assert_eq!(read(&ea, 0, 2 * G).unwrap(), a);
    // More than the cache holds is not stored: the caller serves the bytes from memory.
    let (c, vc) = file(4 * G, 22);
    assert!(!put(&cache.entry(vc).unwrap(), &c, 0..4));
    assert_eq!(read(&ea, 0, 2 * G).unwrap(), a);
    // Unpinned, the older one makes room.
    drop(ea);
    assert!(put(&eb, &b, 0..1));
    assert_eq!(cache.used(), 2 * GROUP);
    assert_eq!(
        cache.entry(va).unwrap().missing(0..va.size),
        vec![0..va.size]
    );
}

#[test]
fn a_byte_altered_on_disk_is_never_read_and_is_fetched_again() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let cache = Cache::open(t.path(), 1 << 30).unwrap();
    let (data, v) = file(6 * G + 5, 30);
    let (data_path, _) = files_of(t.path(), &v);
    let e = cache.entry(v).unwrap();
    assert!(put(&e, &data, 0..7));
    assert!(e.backing().unwrap().is_some());
    flip(&data_path, 3 * GROUP + 17);
    assert!(matches!(read(&e, 3 * G, 1), Err(CacheError::Missing)));
    assert!(e.backing().unwrap().is_none());
    assert!(!e.is_complete());
    assert_eq!(e.missing(0..v.size), vec![3 * GROUP..4 * GROUP]);
    assert_eq!(cache.used(), v.size - GROUP);
    assert_eq!(read(&e, 2 * G, G).unwrap(), &data[2 * G..3 * G]);
    assert!(put(&e, &data, 3..4));
    let mut back = vec![0u8; data.len()];
    e.backing()
        .unwrap()
        .expect("complete again")
        .read_exact_at(&mut back, 0)
        .unwrap();
    assert_eq!(back, data);

    // Altered while no process held it: found on the first use after a restart.
    drop((e, cache));
    flip(&data_path, 6 * GROUP + 1);
    let cache = Cache::open(t.path(), 1 << 30).unwrap();
    let e = cache.entry(v).unwrap();
    assert_eq!(e.missing(0..v.size), vec![6 * GROUP..v.size]);
    assert!(e.backing().unwrap().is_none());
    assert_eq!(cache.used(), 6 * GROUP);
}

#[test]
fn a_cache_file_replaced_or_cut_on_disk_loses_what_it_no_longer_holds() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let cache = Cache::open(t.path(), 1 << 30).unwrap();
    let (data, v) = file(4 * G, 31);
    let (data_path, _) = files_of(t.path(), &v);
    let e = cache.entry(v).unwrap();
    assert!(put(&e, &data, 0..4));
    // Cut in the middle of group 2.
    OpenOptions::new()
        .write(true)
        .open(&data_path)
        .unwrap()
        .set_len(2 * GROUP + 10)
        .unwrap();
    assert_eq!(e.missing(0..v.size), vec![2 * GROUP..4 * GROUP]);
    assert_eq!(read(&e, 0, 2 * G).unwrap(), &data[..2 * G]);
    // Replaced by another file holding the same bytes but one: only that group is lost.
    let mut other = data.clone();
    other[G] ^= 1;
    let tmp = t.path().join("other");
    fs::write(&tmp, &other).unwrap();
    fs::rename(&tmp, &data_path).unwrap();
    assert!(put(&e, &data, 2..4));
    assert_eq!(e.missing(0..v.size), vec![GROUP..2 * GROUP]);
    assert!(put(&e, &data, 1..2));
    assert!(e.is_complete());
    assert_eq!(read(&e, 0, data.len()).unwrap(), data);
    // Deleted: nothing is left.
    fs::remove_file(&data_path).unwrap();
    assert_eq!(e.missing(0..v.size), vec![0..v.size]);
    assert_eq!(cache.used(), 0);
}

#[test]
fn a_damaged_record_is_an_empty_entry() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let (a, va) = file(3 * G, 40);
    let (b, vb) = file(3 * G, 41);
    {
        let cache = Cache::open(t.path(), 1 << 30).unwrap();
        for (d, v) in [(&a, va), (&b, vb)] {
            let e = cache.entry(v).unwrap();
            assert!(put(&e, d, 0..3));
        }
    }
    let (_, record_a) = files_of(t.path(), &va);
    let (_, record_b) = files_of(t.path(), &vb);
    flip(&record_a, 70);
    let len = fs::metadata(&record_b).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&record_b)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    fs::write(t.path().join("not-ours.txt"), b"kept").unwrap();
    let cache = Cache::open(t.path(), 1 << 30).unwrap();
    assert_eq!(cache.used(), 0);
    for v in [va, vb] {
        assert!(!files_of(t.path(), &v).0.exists());
        let e = cache.entry(v).unwrap();
        assert_eq!(e.missing(0..v.size), vec![0..v.size]);
    }
    assert!(t.path().join("not-ours.txt").exists());
}

#[test]
fn a_removed_entry_is_gone_and_its_handles_store_nothing() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let cache = Cache::open(t.path(), 1 << 30).unwrap();
    let (data, v) = file(3 * G, 50);
    let e = cache.entry(v).unwrap();
    assert!(put(&e, &data, 0..2));
    e.flush().unwrap();
    let (data_path, record_path) = files_of(t.path(), &v);
    assert!(record_path.exists());
    cache.remove(v).unwrap();
    assert!(!data_path.exists() && !record_path.exists());
    assert_eq!(cache.used(), 0);
    assert!(matches!(read(&e, 0, 1), Err(CacheError::Missing)));
    assert!(!put(&e, &data, 2..3));
    let fresh = cache.entry(v).unwrap();
    assert_eq!(fresh.missing(0..v.size), vec![0..v.size]);
    assert!(put(&fresh, &data, 0..3));
    assert!(fresh.is_complete());
}

#[test]
fn threads_read_and_insert_at_once() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let cache = Arc::new(Cache::open(t.path(), 1 << 30).unwrap());
    let files: Arc<Vec<(Vec<u8>, Version)>> = Arc::new(
        (0..3)
            .map(|i| file(40 * G + 100 * i, 60 + i as u64))
            .collect(),
    );
    let threads: Vec<_> = (0..6u64)
        .map(|n| {
            let cache = cache.clone();
            let files = files.clone();
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_u64 + n;
                for _ in 0..400 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let (data, v) = &files[(x % 3) as usize];
                    let e = cache.entry(*v).unwrap();
                    let groups = data.len().div_ceil(G);
                    let g = (x >> 8) as usize % groups;
                    let n = 1 + (x >> 20) as usize % 4;
                    if x & 1 == 0 {
                        assert!(put(&e, data, g..(g + n).min(groups)));
                    } else {
                        let at = (g * G + (x >> 30) as usize % G).min(data.len() - 1);
                        let len = 1 + (x >> 40) as usize % (3 * G);
                        match read(&e, at, len) {
                            Ok(got) => assert_eq!(got, &data[at..(at + len).min(data.len())]),
                            Err(CacheError::Missing) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut used = 0;
    for (data, v) in files.iter() {
        let e = cache.entry(*v).unwrap();
        for r in e.missing(0..v.size) {
            assert!(put(
                &e,
                data,
                (r.start / GROUP) as usize..(r.end.div_ceil(GROUP)) as usize
            ));
        }
        assert!(e.is_complete());
        assert_eq!(read(&e, 0, data.len()).unwrap(), *data);
        used += v.size;
    }
    assert_eq!(cache.used(), used);
}

#[test]
fn a_large_entry_checked_again_on_every_core_loses_exactly_its_altered_groups() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    // Large enough to be hashed by several threads, with a short last group.
    let (data, v) = file(12 << 20 | 5, 70);
    let (data_path, _) = files_of(t.path(), &v);
    {
        let cache = Cache::open(t.path(), 1 << 30).unwrap();
        let e = cache.entry(v).unwrap();
        for (i, piece) in data.chunks(1 << 20).enumerate() {
            assert!(e.insert((i << 20) as u64, piece).unwrap());
        }
        assert!(e.is_complete());
    }
    let altered = [5u64, 64, 65, 400, 768];
    for g in altered {
        flip(&data_path, (g * GROUP + g).min(v.size - 1));
    }
    let cache = Cache::open(t.path(), 1 << 30).unwrap();
    let e = cache.entry(v).unwrap();
    let want: Vec<_> = [5..6u64, 64..66, 400..401, 768..769]
        .into_iter()
        .map(|r| r.start * GROUP..(r.end * GROUP).min(v.size))
        .collect();
    assert_eq!(e.missing(0..v.size), want);
    assert!(!e.is_complete());
    assert_eq!(read(&e, 0, 5 * G).unwrap(), &data[..5 * G]);
}

#[test]
fn one_cache_directory_serves_one_mount_at_a_time() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    assert!(!Cache::in_use(&t.path().join("not-yet")).unwrap());
    assert!(!Cache::in_use(t.path()).unwrap());
    let cache = Cache::open(t.path(), 1 << 30).unwrap();
    let (data, v) = file(G, 80);
    let e = cache.entry(v).unwrap();
    assert!(matches!(
        Cache::open(t.path(), 1 << 30),
        Err(CacheError::Busy)
    ));
    assert!(Cache::in_use(t.path()).unwrap());
    // Its entries keep the directory until they are gone too.
    drop(cache);
    assert!(matches!(
        Cache::open(t.path(), 1 << 30),
        Err(CacheError::Busy)
    ));
    assert!(Cache::in_use(t.path()).unwrap());
    assert!(put(&e, &data, 0..1));
    drop(e);
    // Asking takes nothing: it opens after.
    assert!(!Cache::in_use(t.path()).unwrap());
    let cache = Cache::open(t.path(), 1 << 30).unwrap();
    assert!(cache.entry(v).unwrap().is_complete());
}

/// Copies the cache's files as they are on disk now: what a crash of the process would leave.
fn snapshot(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for item in fs::read_dir(from).unwrap() {
        let item = item.unwrap();
        fs::copy(item.path(), to.join(item.file_name())).unwrap();
    }
}

#[test]
fn a_crash_loses_at_most_the_inserts_since_the_record_was_last_written() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let live = t.path().join("live");
    let (data, v) = file(6 * G, 90);
    let cache = Cache::open(&live, 1 << 30).unwrap();
    let e = cache.entry(v).unwrap();
    assert!(put(&e, &data, 0..2));
    e.flush().unwrap();
    // Batched: these are not in the record yet.
    assert!(put(&e, &data, 3..5));
    let crashed = t.path().join("crashed");
    snapshot(&live, &crashed);
    {
        let after = Cache::open(&crashed, 1 << 30).unwrap();
        assert_eq!(after.used(), 2 * GROUP);
        let e = after.entry(v).unwrap();
        assert_eq!(e.missing(0..v.size), vec![2 * GROUP..6 * GROUP]);
        assert_eq!(read(&e, 0, 2 * G).unwrap(), &data[..2 * G]);
    }
    // A power loss can leave a record naming data that never reached the disk (a hole: zeros).
    e.flush().unwrap();
    let lost = t.path().join("lost");
    snapshot(&live, &lost);
    let (data_path, _) = files_of(&lost, &v);
    let f = OpenOptions::new().write(true).open(&data_path).unwrap();
    f.write_all_at(&vec![0u8; 2 * G], 3 * GROUP).unwrap();
    let after = Cache::open(&lost, 1 << 30).unwrap();
    let e = after.entry(v).unwrap();
    assert_eq!(e.missing(0..v.size), vec![2 * GROUP..6 * GROUP]);
    assert_eq!(after.used(), 2 * GROUP);
}

#[test]
fn reads_during_alterations_on_disk_give_the_right_bytes_or_missing() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let cache = Arc::new(Cache::open(t.path(), 1 << 30).unwrap());
    let groups = 256;
    let (data, v) = file(groups * G, 100);
    let data = Arc::new(data);
    let (data_path, _) = files_of(t.path(), &v);
    let e = cache.entry(v).unwrap();
    assert!(put(&e, &data, 0..groups));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|n| {
            let (e, data, stop) = (e.clone(), data.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = n;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    let at = (i * 7919) % ((groups - 1) * G);
                    match read(&e, at, G) {
                        Ok(got) => assert_eq!(got, &data[at..at + G], "bytes at {at}"),
                        Err(CacheError::Missing) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        })
        .collect();
    // Bytes flipped in a fifth of the groups, while the readers read.
    for i in 0..50u64 {
        flip(&data_path, i * 5 * GROUP + (i * 313) % GROUP);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    let want: Vec<_> = (0..50u64)
        .map(|i| i * 5 * GROUP..(i * 5 + 1) * GROUP)
        .collect();
    assert_eq!(e.missing(0..v.size), want);
}

#[test]
fn a_file_written_elsewhere_is_adopted_whole_without_a_copy() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let dir = t.path().join("cache");
    let cache = Cache::open(&dir, 1 << 30).unwrap();
    let mut used = 0;
    // Across the hashing's 1 MiB batches, with a short last group; one with groups present already.
    for (i, len) in [1, G, G + 1, 7 * G - 3, 130 * G + 5]
        .into_iter()
        .enumerate()
    {
        let (data, v) = file(len, 100 + i as u64);
        let e = cache.entry(v).unwrap();
        if len > 2 * G {
            assert!(put(&e, &data, 1..2));
        }
        let from = t.path().join(format!("written-{i}"));
        fs::write(&from, &data).unwrap();
        let ino = fs::metadata(&from).unwrap().ino();
        assert!(e.adopt(&from).unwrap(), "len {len}");
        assert!(!from.exists(), "the file moved, len {len}");
        let (data_path, _) = files_of(&dir, &v);
        assert_eq!(fs::metadata(&data_path).unwrap().ino(), ino, "no copy");
        assert_eq!(
            fs::metadata(&data_path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(e.is_complete(), "len {len}");
        assert!(e.missing(0..len as u64).is_empty());
        assert_eq!(read(&e, 0, len).unwrap(), data, "len {len}");
        let mut back = Vec::new();
        std::io::Read::read_to_end(&mut e.backing().unwrap().expect("complete"), &mut back)
            .unwrap();
        assert_eq!(back, data);
        used += len as u64;
        assert_eq!(cache.used(), used, "len {len}");
    }
    // The record says so: a restart finds the entries whole.
    drop(cache);
    let cache = Cache::open(&dir, 1 << 30).unwrap();
    assert_eq!(cache.used(), used);
    for (i, len) in [1, G, G + 1, 7 * G - 3, 130 * G + 5]
        .into_iter()
        .enumerate()
    {
        let (data, v) = file(len, 100 + i as u64);
        let e = cache.entry(v).unwrap();
        assert!(e.is_complete(), "len {len}");
        assert_eq!(read(&e, 0, len).unwrap(), data);
    }
}

#[test]
fn a_file_that_is_not_the_version_or_finds_no_room_is_left_where_it_is() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let dir = t.path().join("cache");
    let cache = Cache::open(&dir, 64 * GROUP).unwrap();
    let (data, v) = file(9 * G + 100, 7);
    let e = cache.entry(v).unwrap();
    assert!(put(&e, &data, 2..4));
    let from = t.path().join("written");
    let refused = |bytes: &[u8], why: &str| {
        fs::write(&from, bytes).unwrap();
        assert!(!e.adopt(&from).unwrap(), "{why}");
        assert_eq!(fs::read(&from).unwrap(), bytes, "{why}: left as it was");
        assert_eq!(cache.used(), 2 * GROUP, "{why}");
        assert_eq!(
            e.missing(0..v.size),
            vec![0..2 * GROUP, 4 * GROUP..v.size],
            "{why}"
        );
        assert_eq!(read(&e, 2 * G, G).unwrap(), &data[2 * G..3 * G], "{why}");
    };
    let mut other = data.clone();
    other[5 * G + 17] ^= 1;
    refused(&other, "one byte differs");
    refused(&data[..data.len() - 1], "one byte short");
    let mut longer = data.clone();
    longer.push(0);
    refused(&longer, "one byte more");
    // A version larger than the whole cache.
    let (big, bv) = file(65 * G, 8);
    let be = cache.entry(bv).unwrap();
    fs::write(&from, &big).unwrap();
    assert!(!be.adopt(&from).unwrap());
    assert!(from.exists());
    drop(be);
    // A complete entry takes nothing more.
    fs::write(&from, &data).unwrap();
    assert!(e.adopt(&from).unwrap());
    fs::write(&from, &data).unwrap();
    assert!(!e.adopt(&from).unwrap());
    assert!(from.exists());
    assert_eq!(cache.used(), data.len() as u64);
}

#[test]
fn a_version_grown_by_an_append_takes_the_old_one_s_file_and_an_open_descriptor_reads_it() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let dir = t.path().join("cache");
    let cache = Cache::open(&dir, 1 << 30).unwrap();
    // From one group to several, across a group's end, with a short and a long tail.
    let cases = [
        (1, 5),
        (G, 1),
        (G - 1, 2),
        (G + 1, 3 * G),
        (7 * G - 3, 10),
        (130 * G + 5, 2 * G + 1),
    ];
    let mut used = 0;
    for (i, (old_len, tail_len)) in cases.into_iter().enumerate() {
        let (data, new) = file(old_len + tail_len, 300 + i as u64);
        let old = Outboard::compute(&data[..old_len], old_len as u64)
            .unwrap()
            .version();
        let oe = cache.entry(old).unwrap();
        assert!(put(&oe, &data[..old_len], 0..old_len.div_ceil(G)));
        assert!(oe.is_complete());
        // What FUSE passthrough holds: a descriptor of the old version's file.
        let held = oe.backing().unwrap().expect("complete");
        let ne = cache.entry(new).unwrap();
        // A new version of one group may be whole already (its tail's fetch brought its only group).
        if data.len() <= G {
            assert!(put(&ne, &data, 0..1));
        }
        assert!(oe.extend(&ne, &data[old_len..]).unwrap(), "case {i}");
        let mut back = Vec::new();
        std::io::Read::read_to_end(&mut &held, &mut back).unwrap();
        assert!(
            back == data,
            "case {i}: the descriptor reads the new version"
        );
        assert!(ne.is_complete(), "case {i}");
        assert_eq!(read(&ne, 0, data.len()).unwrap(), data, "case {i}");
        let (new_data, _) = files_of(&dir, &new);
        assert_eq!(
            fs::metadata(&new_data).unwrap().ino(),
            held.metadata().unwrap().ino(),
            "case {i}: the same file"
        );
        let (old_data, old_record) = files_of(&dir, &old);
        assert!(!old_data.exists() && !old_record.exists(), "case {i}");
        assert!(!oe.is_complete(), "case {i}: the old entry is gone");
        used += data.len() as u64;
        assert_eq!(cache.used(), used, "case {i}");
    }
    // The record says so: a restart finds the new versions whole.
    drop(cache);
    let cache = Cache::open(&dir, 1 << 30).unwrap();
    assert_eq!(cache.used(), used);
    for (i, (old_len, tail_len)) in cases.into_iter().enumerate() {
        let (data, new) = file(old_len + tail_len, 300 + i as u64);
        assert_eq!(
            read(&cache.entry(new).unwrap(), 0, data.len()).unwrap(),
            data
        );
    }
}

#[test]
fn a_version_that_is_not_an_append_leaves_both_entries_as_they_were() {
    let t = ferry_testkit::temp_dir("ferry-cache-");
    let dir = t.path().join("cache");
    let cache = Cache::open(&dir, 1 << 30).unwrap();
    let len = 9 * G + 100;
    let (data, old) = file(len, 9);
    let oe = cache.entry(old).unwrap();
    assert!(put(&oe, &data, 0..10));
    let held = oe.backing().unwrap().expect("complete");
    let refused = |new_data: &[u8], tail: &[u8], why: &str| {
        let new = Outboard::compute(new_data, new_data.len() as u64)
            .unwrap()
            .version();
        let ne = cache.entry(new).unwrap();
        assert!(!oe.extend(&ne, tail).unwrap(), "{why}");
        assert!(!ne.is_complete(), "{why}");
        assert!(oe.is_complete(), "{why}");
        assert_eq!(read(&oe, 0, len).unwrap(), data, "{why}");
        assert_eq!(held.metadata().unwrap().len(), len as u64, "{why}");
    };
    // Changed before the old end (in a whole group, then in the last one), then appended.
    for at in [3 * G + 5, 9 * G + 50] {
        let mut other = data.clone();
        other[at] ^= 1;
        other.extend_from_slice(b"appended");
        refused(&other, b"appended", "changed inside");
    }
    // A tail that is not the new version's.
    let mut longer = data.clone();
    longer.extend_from_slice(b"appended");
    refused(&longer, b"appendeX", "another tail");
    refused(&longer, b"append", "a tail of the wrong length");
    // The right one still goes.
    let new = Outboard::compute(&longer[..], longer.len() as u64)
        .unwrap()
        .version();
    assert!(oe.extend(&cache.entry(new).unwrap(), b"appended").unwrap());
}
