//! Which groups of one version are present, with each one's verification value: sorted runs of neighbouring
//! groups, so memory follows what is cached (32 bytes a group, 2 MiB per GiB), not the file's size.

use std::collections::BTreeMap;
use std::ops::Range;

/// A group's BLAKE3 chaining value at its place in its version's tree (the root hash for a one-group file).
pub(crate) type Cv = [u8; 32];

/// Present groups: runs keyed by their first group, disjoint and never touching (neighbours are merged).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Groups {
    runs: BTreeMap<u64, Vec<Cv>>,
    count: u64,
}

impl Groups {
    /// Groups present.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// The runs, in order: first group and values.
    pub(crate) fn runs(&self) -> impl Iterator<Item = (u64, &[Cv])> {
        self.runs.iter().map(|(k, v)| (*k, v.as_slice()))
    }

    /// Number of runs.
    pub(crate) fn run_count(&self) -> usize {
        self.runs.len()
    }

    /// Marks `cvs.len()` groups from `first` present with these values (replacing values of groups already
    /// present); returns how many were not present before. Appending to a run is amortized O(added).
    pub(crate) fn insert(&mut self, first: u64, cvs: &[Cv]) -> u64 {
        if cvs.is_empty() {
            return 0;
        }
        let end = first + cvs.len() as u64;
        // Runs that overlap or touch [first, end], highest first.
        let keys: Vec<u64> = self
            .runs
            .range(..=end)
            .rev()
            .take_while(|(k, v)| **k + v.len() as u64 >= first)
            .map(|(k, _)| *k)
            .collect();
        let mut old: Vec<(u64, Vec<Cv>)> = keys
            .iter()
            .rev()
            .map(|k| (*k, self.runs.remove(k).expect("listed")))
            .collect();
        let old_total: u64 = old.iter().map(|(_, v)| v.len() as u64).sum();
        let tail: Vec<Cv> = match old.last() {
            Some((k, v)) if k + v.len() as u64 > end => v[(end - k) as usize..].to_vec(),
            _ => Vec::new(),
        };
        let (start, mut merged) = match old.first_mut() {
            Some((k, v)) if *k <= first => {
                let mut v = std::mem::take(v);
                v.truncate((first - *k) as usize);
                (*k, v)
            }
            _ => (first, Vec::with_capacity(cvs.len() + tail.len())),
        };
        merged.extend_from_slice(cvs);
        merged.extend_from_slice(&tail);
        let added = merged.len() as u64 - old_total;
        self.count += added;
        self.runs.insert(start, merged);
        added
    }

    /// Whether every group of `range` is present.
    pub(crate) fn contains(&self, range: Range<u64>) -> bool {
        range.is_empty() || self.gaps(range).is_empty()
    }

    /// The sub-ranges of `range` (group numbers) that are not present, in order.
    pub(crate) fn gaps(&self, range: Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        if range.is_empty() {
            return out;
        }
        let from = self
            .runs
            .range(..=range.start)
            .next_back()
            .map_or(range.start, |(k, _)| *k);
        let mut cursor = range.start;
        for (k, v) in self.runs.range(from..range.end) {
            let e = k + v.len() as u64;
            if e <= cursor {
                continue;
            }
            if *k > cursor {
                out.push(cursor..*k);
            }
            cursor = e;
        }
        if cursor < range.end {
            out.push(cursor..range.end);
        }
        out
    }

    /// The values of groups `0..n` when exactly those are present.
    pub(crate) fn whole(&self, n: u64) -> Option<&[Cv]> {
        match (self.runs.len(), self.runs.get(&0)) {
            (1, Some(v)) if v.len() as u64 == n => Some(v),
            _ => None,
        }
    }

    /// Keeps only the groups for which `keep(group, value)` holds; returns the groups dropped.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u64, &Cv) -> bool) -> Vec<u64> {
        let mut dropped = Vec::new();
        let old = std::mem::take(&mut self.runs);
        self.count = 0;
        for (k, v) in old {
            let mut run_start = k;
            let mut run: Vec<Cv> = Vec::new();
            for (i, cv) in v.into_iter().enumerate() {
                let g = k + i as u64;
                if keep(g, &cv) {
                    if run.is_empty() {
                        run_start = g;
                    }
                    run.push(cv);
                } else {
                    dropped.push(g);
                    if !run.is_empty() {
                        self.count += run.len() as u64;
                        self.runs.insert(run_start, std::mem::take(&mut run));
                    }
                }
            }
            if !run.is_empty() {
                self.count += run.len() as u64;
                self.runs.insert(run_start, run);
            }
        }
        dropped
    }

    /// Forgets every group.
    pub(crate) fn clear(&mut self) {
        self.runs.clear();
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cv(g: u64) -> Cv {
        let mut c = [0u8; 32];
        c[..8].copy_from_slice(&g.to_le_bytes());
        c
    }

    fn cvs(r: Range<u64>) -> Vec<Cv> {
        r.map(cv).collect()
    }

    /// A plain model: one flag per group.
    fn check(g: &Groups, model: &[Option<Cv>]) {
        let present: Vec<u64> = (0..model.len() as u64)
            .filter(|i| model[*i as usize].is_some())
            .collect();
        assert_eq!(g.count(), present.len() as u64);
        let mut from_runs = Vec::new();
        let mut prev_end = None;
        for (k, v) in g.runs() {
            assert!(!v.is_empty());
            if let Some(e) = prev_end {
                assert!(k > e, "runs touch or overlap");
            }
            prev_end = Some(k + v.len() as u64);
            for (i, c) in v.iter().enumerate() {
                assert_eq!(Some(*c), model[k as usize + i]);
                from_runs.push(k + i as u64);
            }
        }
        assert_eq!(from_runs, present);
        let gaps: Vec<u64> = g
            .gaps(0..model.len() as u64)
            .into_iter()
            .flatten()
            .collect();
        let absent: Vec<u64> = (0..model.len() as u64)
            .filter(|i| model[*i as usize].is_none())
            .collect();
        assert_eq!(gaps, absent);
    }

    #[test]
    fn inserts_merge_overlap_and_replace_like_a_flag_per_group() {
        let mut g = Groups::default();
        let mut model = vec![None; 64];
        let mut x = 0x1234_5678_u64;
        for round in 0..2000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let a = x % 64;
            let n = 1 + (x >> 8) % 9;
            let b = (a + n).min(64);
            let mut vals = cvs(a..b);
            // Replacing values shows in the runs.
            vals.iter_mut().for_each(|c| c[31] = round as u8);
            let before = model.iter().filter(|m| m.is_some()).count() as u64;
            let added = g.insert(a, &vals);
            for (i, v) in vals.iter().enumerate() {
                model[a as usize + i] = Some(*v);
            }
            let after = model.iter().filter(|m| m.is_some()).count() as u64;
            assert_eq!(added, after - before);
            check(&g, &model);
            if round % 7 == 0 {
                let drop_at = (x >> 20) % 64;
                let dropped = g.retain(|i, _| i % 64 != drop_at && (i + round) % 11 != 0);
                for i in dropped {
                    model[i as usize] = None;
                }
                check(&g, &model);
            }
        }
    }

    #[test]
    fn gaps_of_a_sub_range_and_the_whole_file() {
        let mut g = Groups::default();
        g.insert(2, &cvs(2..4));
        g.insert(6, &cvs(6..7));
        assert_eq!(g.gaps(3..8), vec![4..6, 7..8]);
        assert_eq!(g.gaps(2..4), vec![]);
        assert!(g.contains(2..4) && !g.contains(1..3));
        assert_eq!(g.whole(7), None);
        g.insert(0, &cvs(0..7));
        assert_eq!(g.whole(7), Some(&cvs(0..7)[..]));
        assert_eq!(g.run_count(), 1);
        g.clear();
        assert_eq!((g.count(), g.run_count()), (0, 0));
    }
}
