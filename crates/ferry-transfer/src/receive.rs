//! The receiving side: read and check the offer, answer, write and verify every file, acknowledge.

use crate::dest::{self, Destination};
use crate::manifest::{check_tree, manifest_cost, Entry, EntryKind, Totals};
use crate::progress::{Progress, ProgressState};
use crate::resume::{self, PartialState};
use crate::wire::{self, OfferHeader, Put, Reader};
use crate::writer::{self, FileWriter};
use crate::{PacketSink, PacketSource, TransferError, CHUNK};
use blake3::hazmat::ChainingValue;
use ferry_tree::hash::{has_chunks, FileHasher};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// Default limit on the number of entries an offer may announce.
pub const DEFAULT_MAX_ENTRIES: u64 = 10_000_000;

/// Default limit on the memory an offer's manifest may take before it is accepted (64 MiB, counted
/// by [`crate::manifest::manifest_cost`]): about 400,000 entries with 30-byte names.
pub const DEFAULT_MAX_MANIFEST: u64 = 64 << 20;

/// Options of [`receive`].
#[derive(Debug, Clone)]
pub struct ReceiveOptions {
    /// Destination directory (created if missing).
    pub out_dir: PathBuf,
    /// Replace existing files, symlinks, and non-directories where a directory goes (never a
    /// directory by a file). Implies `merge`.
    pub overwrite: bool,
    /// Receive into offered top-level directories that already exist (adding what is new;
    /// existing files are still conflicts unless `overwrite`). Without it (and without
    /// `overwrite`) an offered top-level name that exists is a conflict, except a directory this
    /// receiver created in an earlier run of the same offer (recorded in the resume log).
    pub merge: bool,
    /// Refuse offers announcing more entries than this.
    pub max_entries: u64,
    /// Refuse offers whose manifest would take more memory than this
    /// ([`crate::manifest::manifest_cost`]); checked against the announced size before any page
    /// is read, and against every page as it arrives.
    pub max_manifest: u64,
    /// Refuse, before accepting, an offer whose data does not fit in the free space of
    /// `out_dir`'s file system (see [`TransferError::NoSpace`]).
    pub space_check: bool,
    /// Where partial-transfer logs live; `None` for [`resume::default_root`]. If no location can
    /// be found, resume information is not recorded.
    pub partial_dir: Option<PathBuf>,
    /// Where what is accepted goes.
    pub output: Output,
}

/// Where [`receive`] puts what it accepts.
#[derive(Debug, Clone, Default)]
pub enum Output {
    /// Into `out_dir` under the offered names. A text offer is not written: it is returned in
    /// [`ReceiveReport::text`], accepted without resume.
    #[default]
    Offered,
    /// Into `out_dir`, the offer's one top-level entry (file, directory or text) under this name
    /// (one path component; resumed like any offer). An offer of more than one top-level entry
    /// is refused with [`TransferError::OutputMismatch`] before it is accepted.
    Named(Vec<u8>),
    /// The offer's one regular file (or text) written to this file or pipe as it arrives, in
    /// order: no temporary file and no resume. Every chunk is verified as it arrives, but after it
    /// was written: on an error, what was written is not to be trusted. Any other offer is
    /// refused with [`TransferError::OutputMismatch`] before it is accepted.
    Stream(Arc<File>),
}

impl ReceiveOptions {
    /// Defaults for receiving into `out_dir`.
    pub fn new(out_dir: impl Into<PathBuf>) -> Self {
        ReceiveOptions {
            out_dir: out_dir.into(),
            overwrite: false,
            merge: false,
            max_entries: DEFAULT_MAX_ENTRIES,
            max_manifest: DEFAULT_MAX_MANIFEST,
            space_check: true,
            partial_dir: None,
            output: Output::Offered,
        }
    }
}

/// What the receiver is asked to accept (passed to the `accept` callback of [`receive`]).
#[derive(Debug, Clone, Copy)]
pub struct Offer<'a> {
    /// Counts and total size.
    pub totals: Totals,
    /// BLAKE3 of the manifest.
    pub offer_id: [u8; 32],
    /// Every entry, checked.
    pub entries: &'a [Entry],
    /// File bytes already held from an earlier run of this offer (verified).
    pub resumable_bytes: u64,
    /// The first [`OFFER_NAMES`] top-level names (what would appear in the destination), in
    /// sorted order. Raw peer bytes: escape before showing them.
    pub top_level: &'a [&'a [u8]],
    /// How many top-level names the offer has in all.
    pub top_level_count: u64,
    /// A text message: one file of at most [`wire::MAX_TEXT`] bytes.
    pub text: bool,
}

/// Most top-level names an [`Offer`] lists.
pub const OFFER_NAMES: usize = 32;

/// What a successful [`receive`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReceiveReport {
    /// Counts and total size of what is now in place.
    pub totals: Totals,
    /// File bytes that came over the channel (the holes of sparse files count, though only their
    /// length came).
    pub bytes_received: u64,
    /// File bytes kept from an earlier run instead.
    pub bytes_resumed: u64,
    /// Files kept whole from an earlier run (their bytes are in `bytes_resumed`).
    pub files_resumed: u64,
    /// A text offer received with [`Output::Offered`]: its bytes, verified (raw peer bytes:
    /// escape before showing them).
    pub text: Option<Vec<u8>>,
    /// Files that were already in place, identical (same size and BLAKE3): left untouched.
    pub files_skipped: u64,
    /// Bytes of the `files_skipped`.
    pub bytes_skipped: u64,
    /// Files of the offer the sender skipped (it could not open them); not in `totals`.
    pub skipped: u64,
}

/// What the receiver holds of one file from an earlier run, verified against the log.
struct Held {
    /// Chunk hashes of the kept prefix of the temporary file.
    chunks: Vec<ChainingValue>,
    /// Hash of the finished file under its final name.
    complete: Option<[u8; 32]>,
    /// The final file was there before this offer (not written by it): sent as
    /// [`wire::HELD_EXISTING`], and kept only if the sender finds it identical.
    existing: bool,
}

/// Receives one offer into `opts.out_dir`.
///
/// Reads and checks the whole manifest (every name, duplicates, file/directory clashes, symlink
/// targets, entry limit), checks for conflicts with what exists, asks `accept`, then writes every
/// file under a temporary name, verifies it and renames it, creates symlinks, applies directory
/// modes and times, and sends the final acknowledgement. Any error is also reported to the peer.
pub fn receive<S: PacketSource, K: PacketSink>(
    source: &mut S,
    sink: &mut K,
    opts: &ReceiveOptions,
    accept: &mut dyn FnMut(&Offer<'_>) -> bool,
    progress: &mut dyn Progress,
) -> Result<ReceiveReport, TransferError> {
    let result = receive_inner(source, sink, opts, accept, progress);
    wire::report_failure(&result, sink);
    result
}

fn recv_packet<S: PacketSource>(source: &mut S) -> Result<&mut [u8], TransferError> {
    source.recv()?.ok_or(TransferError::UnexpectedEnd)
}

/// Reads the offer and its manifest pages, checking bounds before any allocation: the announced
/// entries against `opts.max_entries`, the memory the announced manifest takes against
/// `opts.max_manifest` (before any page is read), and every page against what was announced, so
/// that a sender announcing less than it sends is stopped at the first page too many.
#[doc(hidden)]
pub fn read_offer<S: PacketSource>(
    source: &mut S,
    opts: &ReceiveOptions,
) -> Result<(OfferHeader, Vec<Entry>), TransferError> {
    let header = OfferHeader::decode(recv_packet(source)?)?;
    if header.text {
        // Checked again against the manifest through the totals.
        if header.entries != 1 || header.totals.files != 1 {
            return Err(TransferError::protocol("a text offer is exactly one file"));
        }
        if header.totals.bytes > wire::MAX_TEXT {
            return Err(TransferError::TextTooLarge {
                size: header.totals.bytes,
                limit: wire::MAX_TEXT,
            });
        }
    }
    if header.entries > opts.max_entries {
        return Err(TransferError::TooManyEntries {
            announced: header.entries,
            limit: opts.max_entries,
        });
    }
    let needed = manifest_cost(header.entries, header.manifest_bytes);
    if needed > opts.max_manifest {
        return Err(TransferError::ManifestTooLarge {
            needed,
            limit: opts.max_manifest,
        });
    }
    // Grows with what actually arrives, never with what was announced; every entry is counted
    // by its plain encoding (a compact entry may stand for a 4 KiB path in a few bytes).
    let mut entries: Vec<Entry> = Vec::new();
    let mut received = 0u64;
    let mut id = blake3::Hasher::new();
    let mut plain = Vec::with_capacity(64 * 1024);
    while (entries.len() as u64) < header.entries {
        let packet = recv_packet(source)?;
        let mut r = Reader::new(packet);
        wire::expect_type(&mut r, wire::MSG_MANIFEST, "manifest page")?;
        let count = r.u32()? as u64;
        if count == 0 || entries.len() as u64 + count > header.entries {
            return Err(TransferError::protocol("manifest page count out of range"));
        }
        for _ in 0..count {
            let e = Entry::decode_compact(entries.last(), &mut r)?;
            received += e.encoded_len() as u64;
            if received > header.manifest_bytes {
                return Err(TransferError::protocol(
                    "manifest longer than the offer announced",
                ));
            }
            e.encode(&mut plain);
            if plain.len() >= 60 * 1024 {
                id.update(&plain);
                plain.clear();
            }
            entries.push(e);
        }
        r.finish()?;
    }
    id.update(&plain);
    if received != header.manifest_bytes {
        return Err(TransferError::protocol(
            "manifest shorter than the offer announced",
        ));
    }
    if Totals::of(&entries) != Some(header.totals) {
        return Err(TransferError::protocol(
            "offer totals do not match its manifest",
        ));
    }
    if *id.finalize().as_bytes() != header.offer_id {
        return Err(TransferError::protocol(
            "offer id does not match its manifest",
        ));
    }
    Ok((header, entries))
}

fn receive_inner<S: PacketSource, K: PacketSink>(
    source: &mut S,
    sink: &mut K,
    opts: &ReceiveOptions,
    accept: &mut dyn FnMut(&Offer<'_>) -> bool,
    progress: &mut dyn Progress,
) -> Result<ReceiveReport, TransferError> {
    let (header, mut entries) = read_offer(source, opts)?;
    let order = check_tree(&entries)?;
    // The resume log of a renamed offer is its own: what one name's run created says nothing
    // about a directory that has another name.
    let mut log_key = header.offer_id;
    match &opts.output {
        Output::Stream(out) => {
            dest::check_one_file(&entries)?;
            return receive_stream(
                source,
                sink,
                &header,
                &entries,
                &mut &**out,
                accept,
                progress,
            );
        }
        Output::Offered if header.text => {
            let mut text = Vec::new();
            let report =
                receive_stream(source, sink, &header, &entries, &mut text, accept, progress)?;
            return Ok(ReceiveReport {
                text: Some(text),
                ..report
            });
        }
        Output::Named(name) => {
            dest::rename_top(&mut entries, name)?;
            log_key = *blake3::Hasher::new()
                .update(&header.offer_id)
                .update(name)
                .finalize()
                .as_bytes();
        }
        Output::Offered => {}
    }

    let mut dest = Destination::open(&opts.out_dir, opts.overwrite, opts.merge)?;
    let out = std::fs::canonicalize(&opts.out_dir)
        .map_err(|e| TransferError::file(opts.out_dir.display().to_string(), e))?;
    let root = opts.partial_dir.clone().or_else(resume::default_root);
    let mut state = root.map(|root| PartialState::open(&root, &log_key, &out, &entries));
    if let Some(state) = &state {
        dest.set_token(state.token());
    }
    let dirs_before = state.as_ref().map(|s| s.dirs.clone()).unwrap_or_default();
    let made_before = |i: u32| dirs_before.contains(&i);

    // Keep only what still verifies against the log.
    let mut held: HashMap<u32, Held> = HashMap::new();
    if let Some(state) = &state {
        let mut scratch = vec![0u8; CHUNK as usize];
        let mut logged: Vec<_> = state.files.iter().collect();
        logged.sort_by_key(|(i, _)| **i);
        for (&i, rec) in logged {
            let e = &entries[i as usize];
            if let Some(hash) = rec.done {
                if let Some(h) = dest.rehash(e, i, true, &[], &mut scratch) {
                    if h.finish() == Some(hash) {
                        held.insert(
                            i,
                            Held {
                                chunks: h.chunk_hashes().to_vec(),
                                complete: Some(hash),
                                existing: false,
                            },
                        );
                    }
                }
            } else if !rec.chunks.is_empty() && has_chunks(e.size) {
                if let Some(h) = dest.rehash(e, i, false, &rec.chunks, &mut scratch) {
                    held.insert(
                        i,
                        Held {
                            chunks: h.chunk_hashes().to_vec(),
                            complete: None,
                            existing: false,
                        },
                    );
                }
            }
        }
    }
    let same_size = dest.check_conflicts(&entries, &order, |i| {
        held.get(&i).is_some_and(|h| h.complete.is_some()) || made_before(i)
    })?;
    let (top_level, top_level_count) = top_level_names(&entries, &order);

    let resumable_bytes = held
        .iter()
        .map(|(i, h)| match h.complete {
            Some(_) => entries[*i as usize].size,
            None => (h.chunks.len() as u64 * CHUNK).min(entries[*i as usize].size),
        })
        .sum();
    if opts.space_check {
        check_space(&out, header.bytes_allocated.saturating_sub(resumable_bytes))?;
    }
    let (offer, mut pstate) = offer_of(
        &header,
        &entries,
        (&top_level, top_level_count),
        resumable_bytes,
    );
    ask(&offer, accept, progress, &pstate, sink, source)?;
    let unreadable = hash_existing(
        &mut dest, &entries, &same_size, &mut held, progress, &pstate,
    );
    // Claims make the early part void: read to its end before answering (see `wire`).
    let early = held.is_empty();
    if !early {
        drain_early(source)?;
    }
    send_accept(sink, &held)?;
    if !same_size.is_empty() {
        // What differs from the sender's file: a conflict, or replaced when overwriting.
        let mut differ = unreadable;
        if held.values().any(|h| h.existing) {
            differ.extend(read_verdict(source, &held)?);
        }
        if !differ.is_empty() && !opts.overwrite {
            let first = same_size
                .iter()
                .find(|i| differ.contains(i))
                .expect("differ is a subset of same_size");
            return Err(TransferError::Conflict {
                path: entries[*first as usize].path_lossy(),
            });
        }
        for i in differ {
            held.remove(&i);
        }
    }

    // What this run creates is on record before it exists: the directories (so that a resumed
    // run may enter them and give them their modes) and the temporary-name token. A log that
    // cannot be written costs only the resume (a later run then needs --merge).
    let log_err = |s: &PartialState, e| TransferError::file(s.dir().display().to_string(), e);
    let loggable = entries
        .iter()
        .any(|e| e.kind == EntryKind::Dir || has_chunks(e.size));
    if loggable && state.as_mut().is_some_and(|s| s.create().is_err()) {
        state = None;
    }
    let mut created = vec![false; entries.len()];
    for &i in &order {
        let e = &entries[i as usize];
        if e.kind == EntryKind::Dir {
            created[i as usize] = dest.create_dir(e)? || made_before(i);
            if let (true, Some(state)) = (created[i as usize], state.as_mut()) {
                state.log_dir(i);
            }
        }
    }
    if let Some(state) = state.as_mut() {
        state.flush().map_err(|e| log_err(state, e))?;
    }

    // The file-system work of many small files runs on a second thread, overlapping with
    // reading, decrypting and hashing; large files are written straight from the packets.
    let threaded = header.totals.files > 0
        && header.totals.bytes / header.totals.files < writer::THREAD_BELOW_MEAN_SIZE;
    let (report, done) = writer::with_writer(&mut dest, &entries, threaded, |writer| {
        let rx = Incoming::new(&entries, header.totals, held, writer, state.as_mut(), early);
        rx.run(source, progress, &mut pstate)
    })?;
    report_done(&report, done, &entries, progress, &mut pstate);

    for &i in &order {
        let e = &entries[i as usize];
        if e.kind == EntryKind::Symlink {
            dest.create_symlink(e, i)?;
        }
    }
    for &i in order.iter().rev() {
        let e = &entries[i as usize];
        if e.kind == EntryKind::Dir && created[i as usize] {
            dest.finish_dir(e)?;
        }
    }
    dest.relock()?;
    if let Some(state) = &mut state {
        let _ = state.remove();
    }
    sink.send(&[wire::MSG_DONE])?;
    sink.flush()?;
    progress.done(&pstate);
    Ok(report)
}

/// Receives an offer's one file into `out` as it arrives ([`Output::Stream`], or a text offer
/// held in memory): nothing is written to the destination and nothing is resumed.
fn receive_stream<S: PacketSource, K: PacketSink>(
    source: &mut S,
    sink: &mut K,
    header: &OfferHeader,
    entries: &[Entry],
    out: &mut dyn Write,
    accept: &mut dyn FnMut(&Offer<'_>) -> bool,
    progress: &mut dyn Progress,
) -> Result<ReceiveReport, TransferError> {
    let (top_level, top_level_count) = top_level_names(entries, &[0]);
    let (offer, mut pstate) = offer_of(header, entries, (&top_level, top_level_count), 0);
    let held = HashMap::new();
    ask(&offer, accept, progress, &pstate, sink, source)?;
    send_accept(sink, &held)?;
    let (report, done) = writer::with_stream(out, |writer| {
        Incoming::new(entries, header.totals, held, writer, None, true).run(
            source,
            progress,
            &mut pstate,
        )
    })?;
    report_done(&report, done, entries, progress, &mut pstate);
    sink.send(&[wire::MSG_DONE])?;
    sink.flush()?;
    progress.done(&pstate);
    Ok(report)
}

/// The offer to ask about (`top_level`: the first names and how many there are) and the
/// progress before any data.
fn offer_of<'a>(
    header: &OfferHeader,
    entries: &'a [Entry],
    top_level: (&'a [&'a [u8]], u64),
    resumable_bytes: u64,
) -> (Offer<'a>, ProgressState) {
    let offer = Offer {
        totals: header.totals,
        offer_id: header.offer_id,
        entries,
        resumable_bytes,
        top_level: top_level.0,
        top_level_count: top_level.1,
        text: header.text,
    };
    let pstate = ProgressState {
        totals: header.totals,
        text: header.text,
        ..Default::default()
    };
    (offer, pstate)
}

/// Shows the offer and asks `accept`: declines (tells the sender, and reads the early part to its
/// end so that the sender is not cut off while writing it), or reports the acceptance; the caller
/// then sends the answer.
fn ask<K: PacketSink, S: PacketSource>(
    offer: &Offer<'_>,
    accept: &mut dyn FnMut(&Offer<'_>) -> bool,
    progress: &mut dyn Progress,
    pstate: &ProgressState,
    sink: &mut K,
    source: &mut S,
) -> Result<(), TransferError> {
    progress.offer(pstate);
    if !accept(offer) {
        sink.send(&[wire::MSG_DECLINE])?;
        sink.flush()?;
        let _ = drain_early(source);
        return Err(TransferError::Declined);
    }
    progress.accepted(pstate);
    Ok(())
}

/// Reads the early part to its end marker and drops it (at most [`wire::MAX_EARLY`] bytes).
fn drain_early<S: PacketSource>(source: &mut S) -> Result<(), TransferError> {
    let mut early = wire::EarlyPart::new();
    while !early.ended() {
        early.take(recv_packet(source)?)?;
    }
    Ok(())
}

/// Reports the files the writer finished after the last packet.
fn report_done(
    report: &ReceiveReport,
    done: Vec<u32>,
    entries: &[Entry],
    progress: &mut dyn Progress,
    pstate: &mut ProgressState,
) {
    pstate.bytes_done = report.bytes_received + report.bytes_resumed + report.bytes_skipped;
    for i in done {
        pstate.files_done += 1;
        progress.file_done(pstate, &entries[i as usize]);
    }
}

/// Hashes the files already in place with the offered size (`same_size`, in sorted order) and
/// adds each to `held` as an existing file; returns those that could not be read (they differ).
fn hash_existing(
    dest: &mut Destination,
    entries: &[Entry],
    same_size: &[u32],
    held: &mut HashMap<u32, Held>,
    progress: &mut dyn Progress,
    pstate: &ProgressState,
) -> HashSet<u32> {
    let mut unreadable = HashSet::new();
    if same_size.is_empty() {
        return unreadable;
    }
    let bytes = same_size.iter().map(|&i| entries[i as usize].size).sum();
    progress.checking(pstate, same_size.len() as u64, bytes);
    let mut scratch = vec![0u8; CHUNK as usize];
    for &i in same_size {
        let e = &entries[i as usize];
        match dest
            .rehash(e, i, true, &[], &mut scratch)
            .and_then(|h| h.finish())
        {
            Some(hash) => {
                held.insert(
                    i,
                    Held {
                        chunks: Vec::new(),
                        complete: Some(hash),
                        existing: true,
                    },
                );
            }
            None => {
                unreadable.insert(i);
            }
        }
    }
    unreadable
}

/// Reads the sender's verdict on the existing files claimed in `held`: the indices of those that
/// differ. Every index must be such a claim, ascending across pages.
fn read_verdict<S: PacketSource>(
    source: &mut S,
    held: &HashMap<u32, Held>,
) -> Result<HashSet<u32>, TransferError> {
    let mut differ = HashSet::new();
    let mut last: Option<u32> = None;
    loop {
        let packet = recv_packet(source)?;
        let mut r = Reader::new(packet);
        wire::expect_type(&mut r, wire::MSG_VERDICT, "verdict")?;
        let final_page = match r.u8()? {
            0 => false,
            1 => true,
            _ => return Err(TransferError::protocol("bad verdict page")),
        };
        let count = r.u32()?;
        if count == 0 && !final_page {
            return Err(TransferError::protocol("empty verdict page"));
        }
        for _ in 0..count {
            let i = r.u32()?;
            if last.is_some_and(|l| i <= l) || !held.get(&i).is_some_and(|h| h.existing) {
                return Err(TransferError::protocol(
                    "verdict for a file that was not claimed",
                ));
            }
            last = Some(i);
            differ.insert(i);
        }
        r.finish()?;
        if final_page {
            return Ok(differ);
        }
    }
}

/// Fails with [`TransferError::NoSpace`] when `needed` bytes are more than the free space of
/// `out`'s file system. Sparse files count with their allocated bytes (the offer's total), and
/// what a resume keeps is already on disk; a file system that cannot tell is not checked.
fn check_space(out: &std::path::Path, needed: u64) -> Result<(), TransferError> {
    match ferry_tree::fsys::free_space(out) {
        Ok(free) if needed > free => Err(TransferError::NoSpace {
            needed,
            free,
            path: out.display().to_string(),
        }),
        _ => Ok(()),
    }
}

/// The first [`OFFER_NAMES`] top-level names in `order`, and how many there are.
fn top_level_names<'a>(entries: &'a [Entry], order: &[u32]) -> (Vec<&'a [u8]>, u64) {
    let mut names = Vec::new();
    let mut count = 0u64;
    for &i in order {
        let path = entries[i as usize].path.as_slice();
        if !path.contains(&b'/') {
            if names.len() < OFFER_NAMES {
                names.push(path);
            }
            count += 1;
        }
    }
    (names, count)
}

/// Sends Accept and the resume pages describing `held`.
fn send_accept<K: PacketSink>(
    sink: &mut K,
    held: &HashMap<u32, Held>,
) -> Result<(), TransferError> {
    let mut ids: Vec<u32> = held.keys().copied().collect();
    ids.sort_unstable();
    // Small pages fit any channel's packet limit; a long chunk list continues on the next page.
    let max = 64 * 1024;
    let mut pages: Vec<Vec<u8>> = Vec::new();
    let mut page = Vec::new();
    let mut count = 0u32;
    let close = |page: &mut Vec<u8>, count: &mut u32, pages: &mut Vec<Vec<u8>>| {
        if *count > 0 {
            page[1..5].copy_from_slice(&count.to_le_bytes());
            pages.push(std::mem::take(page));
            *count = 0;
        }
    };
    for i in ids {
        let h = &held[&i];
        let mut first = 0usize;
        loop {
            if page.is_empty() {
                page.put_u8(wire::MSG_RESUME);
                page.put_u32(0);
            }
            let room = max - page.len();
            if let Some(hash) = h.complete {
                if room < 4 + 1 + 32 {
                    close(&mut page, &mut count, &mut pages);
                    continue;
                }
                page.put_u32(i);
                page.put_u8(if h.existing {
                    wire::HELD_EXISTING
                } else {
                    wire::HELD_COMPLETE
                });
                page.put(&hash);
                count += 1;
                break;
            }
            if room < 4 + 1 + 8 + 32 {
                close(&mut page, &mut count, &mut pages);
                continue;
            }
            let n = ((room - 13) / 32).min(h.chunks.len() - first);
            page.put_u32(i);
            page.put_u8(wire::HELD_CHUNKS);
            page.put_u32(first as u32);
            page.put_u32(n as u32);
            for cv in &h.chunks[first..first + n] {
                page.put(cv);
            }
            count += 1;
            first += n;
            if first == h.chunks.len() {
                break;
            }
        }
    }
    close(&mut page, &mut count, &mut pages);
    let mut accept = Vec::new();
    wire::Answer::Accept {
        resume_pages: pages.len() as u32,
    }
    .encode(&mut accept);
    sink.send(&accept)?;
    for p in &pages {
        sink.send(p)?;
    }
    sink.flush()?;
    Ok(())
}

/// The file being received.
struct Current {
    index: u32,
    /// Whether a temporary file is being written (`false` when the sender confirmed a file
    /// finished in an earlier run).
    writing: bool,
    pos: u64,
    size: u64,
    /// An earlier run's final file is being replaced.
    replace: bool,
    /// The hash of an earlier run's file that the sender confirms without sending it.
    confirm: Option<[u8; 32]>,
    /// An identical file that was already there: left untouched, not logged.
    skipped: bool,
}

/// The data phase.
struct Incoming<'a, 'b> {
    entries: &'a [Entry],
    held: HashMap<u32, Held>,
    writer: &'a mut FileWriter<'b>,
    state: Option<&'a mut PartialState>,
    /// Position in `entries` from which the next file is searched.
    next_file: usize,
    cur: Option<Current>,
    hasher: FileHasher,
    /// Chunk hashes of the current file confirmed by the sender (or kept).
    verified: usize,
    /// Hashes of verified files whose DONE record waits until the writer has renamed them, so the
    /// resume log never claims what is not on disk yet.
    unlogged_done: HashMap<u32, [u8; 32]>,
    /// Files the sender skipped since the last packet, with its reason (for progress).
    skipped: Vec<(u32, String)>,
    /// The early part, while it is taken as the start of the data and its end not read yet.
    early: Option<wire::EarlyPart>,
    /// The final record was read.
    finished: bool,
    report: ReceiveReport,
}

impl<'a, 'b> Incoming<'a, 'b> {
    fn new(
        entries: &'a [Entry],
        totals: Totals,
        held: HashMap<u32, Held>,
        writer: &'a mut FileWriter<'b>,
        state: Option<&'a mut PartialState>,
        early: bool,
    ) -> Self {
        Incoming {
            early: early.then(wire::EarlyPart::new),
            finished: false,
            entries,
            held,
            writer,
            state,
            next_file: 0,
            cur: None,
            hasher: FileHasher::default(),
            verified: 0,
            unlogged_done: HashMap::new(),
            skipped: Vec::new(),
            report: ReceiveReport {
                totals,
                ..Default::default()
            },
        }
    }

    /// The data phase; after an error, what was written is kept or removed ([`Self::abandon`]).
    fn run<S: PacketSource>(
        mut self,
        source: &mut S,
        progress: &mut dyn Progress,
        pstate: &mut ProgressState,
    ) -> Result<ReceiveReport, TransferError> {
        let result = self.data(source, progress, pstate);
        if let Err(e) = &result {
            self.abandon(e);
        }
        result.map(|()| self.report)
    }

    fn data<S: PacketSource>(
        &mut self,
        source: &mut S,
        progress: &mut dyn Progress,
        pstate: &mut ProgressState,
    ) -> Result<(), TransferError> {
        loop {
            let packet = recv_packet(source)?;
            let body = match self.early.as_mut() {
                Some(early) => match early.take(packet)? {
                    Some(_) if self.finished => {
                        return Err(TransferError::protocol("records after the end of the data"))
                    }
                    Some(body) => body,
                    None => {
                        self.early = None;
                        if self.finished {
                            return Ok(());
                        }
                        continue;
                    }
                },
                None => {
                    let mut r = Reader::new(packet);
                    wire::expect_type(&mut r, wire::MSG_DATA, "file data")?;
                    &packet[1..]
                }
            };
            let mut r = Reader::new(body);
            let mut finished = false;
            while !r.is_empty() {
                if finished {
                    return Err(TransferError::protocol("records after the end of the data"));
                }
                match r.u8()? {
                    t @ (wire::REC_START | wire::REC_START_SPARSE) => {
                        self.start(r.u32()?, r.u64()?, t == wire::REC_START_SPARSE)?
                    }
                    wire::REC_HOLE => self.hole(r.u64()?)?,
                    wire::REC_DATA => {
                        let n = r.u32()? as usize;
                        let data = r.bytes(n)?;
                        self.write(data)?;
                    }
                    wire::REC_CHUNK => self.chunk(r.u32()?, &r.array()?)?,
                    wire::REC_END => self.end(&r.array()?)?,
                    wire::REC_SKIP => {
                        let index = r.u32()?;
                        let n = r.u16()? as usize;
                        if n > wire::MAX_SKIP_REASON {
                            return Err(TransferError::protocol("skip reason too long"));
                        }
                        let reason = String::from_utf8_lossy(r.bytes(n)?).into_owned();
                        self.skip(index)?;
                        self.skipped.push((index, reason));
                    }
                    wire::REC_FINISH => {
                        if self.cur.is_some() || self.next_file_index().is_some() {
                            return Err(TransferError::protocol(
                                "data ended before every file was sent",
                            ));
                        }
                        finished = true;
                    }
                    t => return Err(TransferError::protocol(format!("unknown data record {t}"))),
                }
            }
            self.writer.submit()?;
            self.report_to(pstate);
            for i in self.writer.take_done() {
                if let (Some(state), Some(hash)) =
                    (self.state.as_deref_mut(), self.unlogged_done.remove(&i))
                {
                    state.log_done(i, &hash);
                }
                pstate.files_done += 1;
                progress.file_done(pstate, &self.entries[i as usize]);
            }
            for (i, reason) in self.skipped.drain(..) {
                let e = &self.entries[i as usize];
                pstate.skipped += 1;
                pstate.totals.files -= 1;
                pstate.totals.bytes -= e.size;
                progress.skipped(pstate, e, &reason);
            }
            if let Some(state) = self.state.as_deref_mut() {
                state
                    .flush()
                    .map_err(|e| TransferError::file(state.dir().display().to_string(), e))?;
            }
            self.report_to(pstate);
            if let Some(cur) = &self.cur {
                progress.progress(pstate, &self.entries[cur.index as usize]);
            }
            self.finished = finished;
            if finished && self.early.is_none() {
                return Ok(());
            }
        }
    }

    /// Copies the byte counts so far into `pstate`.
    fn report_to(&self, pstate: &mut ProgressState) {
        let r = &self.report;
        pstate.bytes_done = r.bytes_received + r.bytes_resumed + r.bytes_skipped;
        pstate.bytes_resumed = r.bytes_resumed;
        pstate.files_resumed = r.files_resumed;
        pstate.bytes_skipped = r.bytes_skipped;
        pstate.files_skipped = r.files_skipped;
    }

    fn next_file_index(&self) -> Option<usize> {
        self.entries[self.next_file..]
            .iter()
            .position(|e| e.kind == EntryKind::File)
            .map(|p| p + self.next_file)
    }

    /// Starts file `index` from `offset`; a `sparse` file gets no reserved space.
    fn start(&mut self, index: u32, offset: u64, sparse: bool) -> Result<(), TransferError> {
        if self.cur.is_some() {
            return Err(TransferError::protocol("file started inside another file"));
        }
        if self.next_file_index() != Some(index as usize) {
            return Err(TransferError::protocol(format!(
                "unexpected file index {index}"
            )));
        }
        self.next_file = index as usize + 1;
        let e = &self.entries[index as usize];
        let held = self.held.remove(&index);
        let (kept, complete) = match &held {
            Some(h) => (h.chunks.as_slice(), h.complete),
            None => (&[][..], None),
        };
        let skipped = held.as_ref().is_some_and(|h| h.existing);
        if skipped && offset != e.size {
            // The sender found it identical: nothing of it may be written.
            return Err(TransferError::protocol(format!(
                "bad offset {offset} for an identical file"
            )));
        }
        let mut replace = false;
        let writing = if complete.is_some() && offset == e.size {
            // The sender agrees that the earlier run's file is whole: nothing to hash or write;
            // its END must carry the hash this side verified.
            self.hasher.start(e.size, &[]);
            false
        } else {
            // From the start, or from a chunk boundary within what this side kept.
            let k = if offset == 0 {
                0
            } else if complete.is_none() && offset.is_multiple_of(CHUNK) || offset == e.size {
                (offset.div_ceil(CHUNK)) as usize
            } else {
                usize::MAX
            };
            if k > kept.len() || (complete.is_some() && offset != 0) {
                return Err(TransferError::protocol(format!(
                    "bad resume offset {offset}"
                )));
            }
            replace = complete.is_some();
            let logged = self
                .state
                .as_ref()
                .is_some_and(|s| s.files.contains_key(&index));
            if let Some(state) = self.state.as_deref_mut() {
                if has_chunks(e.size) || logged {
                    state.log_start(index, k as u32);
                }
            }
            self.hasher.start(e.size, &kept[..k]);
            self.writer.open(index, offset, !sparse)?;
            true
        };
        if skipped {
            self.report.files_skipped += 1;
            self.report.bytes_skipped += offset;
        } else {
            self.report.bytes_resumed += offset;
            if offset == e.size && e.size > 0 {
                self.report.files_resumed += 1;
            }
        }
        self.verified = self.hasher.chunk_hashes().len();
        let confirm = if writing { None } else { complete };
        self.cur = Some(Current {
            index,
            writing,
            pos: offset,
            size: e.size,
            replace,
            confirm,
            skipped,
        });
        Ok(())
    }

    /// The sender skips file `index` (in the place of its start): it is dropped from the offer.
    fn skip(&mut self, index: u32) -> Result<(), TransferError> {
        if self.cur.is_some() {
            return Err(TransferError::protocol("file skipped inside another file"));
        }
        if self.next_file_index() != Some(index as usize) {
            return Err(TransferError::protocol(format!(
                "unexpected skipped file index {index}"
            )));
        }
        self.next_file = index as usize + 1;
        self.held.remove(&index);
        let e = &self.entries[index as usize];
        self.report.skipped += 1;
        self.report.totals.files -= 1;
        self.report.totals.bytes -= e.size;
        Ok(())
    }

    fn write(&mut self, data: &[u8]) -> Result<(), TransferError> {
        let cur = self
            .cur
            .as_mut()
            .ok_or_else(|| TransferError::protocol("data outside a file"))?;
        let e = &self.entries[cur.index as usize];
        let end = cur.pos + data.len() as u64;
        if end > cur.size {
            return Err(TransferError::SizeMismatch {
                path: e.path_lossy(),
                declared: cur.size,
                sent: end,
                more: true,
            });
        }
        if !cur.writing {
            return Err(TransferError::protocol("data for a finished file"));
        }
        self.writer.write(data)?;
        self.hasher.update(data);
        cur.pos = end;
        self.report.bytes_received += data.len() as u64;
        Ok(())
    }

    /// A hole of `len` zeros: not written (the file stays sparse), hashed as zeros.
    fn hole(&mut self, len: u64) -> Result<(), TransferError> {
        let cur = self
            .cur
            .as_mut()
            .ok_or_else(|| TransferError::protocol("hole outside a file"))?;
        if !cur.writing {
            return Err(TransferError::protocol("hole in a finished file"));
        }
        let end = cur.pos.checked_add(len).filter(|&end| end <= cur.size);
        let Some(end) = end else {
            return Err(TransferError::protocol("hole past the end of the file"));
        };
        // One record hashes at most one chunk of zeros.
        if has_chunks(cur.size) && len > CHUNK - cur.pos % CHUNK {
            return Err(TransferError::protocol("hole across a chunk boundary"));
        }
        self.writer.hole(len)?;
        self.hasher.update_zeros(len);
        cur.pos = end;
        self.report.bytes_received += len;
        Ok(())
    }

    fn chunk(&mut self, chunk: u32, cv: &ChainingValue) -> Result<(), TransferError> {
        let cur = self
            .cur
            .as_ref()
            .ok_or_else(|| TransferError::protocol("chunk hash outside a file"))?;
        let e = &self.entries[cur.index as usize];
        if chunk as usize != self.verified || self.verified >= self.hasher.chunk_hashes().len() {
            return Err(TransferError::protocol("chunk hash out of order"));
        }
        if self.hasher.chunk_hashes()[self.verified] != *cv {
            return Err(TransferError::Integrity {
                path: e.path_lossy(),
            });
        }
        self.verified += 1;
        // With the writer on another thread the chunk may not be written yet: not logged (small
        // files only; a resume re-sends them).
        if let Some(state) = self
            .state
            .as_deref_mut()
            .filter(|_| !self.writer.is_threaded())
        {
            state.log_chunk(cur.index, chunk, cv);
        }
        Ok(())
    }

    fn end(&mut self, hash: &[u8; 32]) -> Result<(), TransferError> {
        let cur = self
            .cur
            .as_ref()
            .ok_or_else(|| TransferError::protocol("file end outside a file"))?;
        let e = &self.entries[cur.index as usize];
        if cur.pos != cur.size {
            return Err(TransferError::SizeMismatch {
                path: e.path_lossy(),
                declared: cur.size,
                sent: cur.pos,
                more: false,
            });
        }
        if let Some(confirmed) = cur.confirm {
            if confirmed != *hash {
                return Err(TransferError::Integrity {
                    path: e.path_lossy(),
                });
            }
        } else if self.verified != self.hasher.chunk_hashes().len() {
            return Err(TransferError::protocol(
                "file ended without all its chunk hashes",
            ));
        } else if self.hasher.finish().as_ref() != Some(hash) {
            return Err(TransferError::Integrity {
                path: e.path_lossy(),
            });
        }
        let cur = self.cur.take().expect("checked above");
        if cur.writing {
            self.writer.finish(cur.index, cur.replace)?;
        } else {
            self.writer.done(cur.index)?;
        }
        if self.state.is_some() && !cur.skipped {
            self.unlogged_done.insert(cur.index, *hash);
        }
        Ok(())
    }

    /// After an error: keep partial data (and its log) when the transfer may be resumed; remove
    /// it when its data was wrong.
    fn abandon(&mut self, err: &TransferError) {
        if let Some(cur) = self.cur.take() {
            let bad_data = matches!(
                err,
                TransferError::SizeMismatch { .. }
                    | TransferError::Integrity { .. }
                    | TransferError::Protocol(_)
            );
            if bad_data && cur.writing {
                self.writer.remove(cur.index);
                if let Some(state) = self.state.as_deref_mut() {
                    state.log_start(cur.index, 0);
                }
            }
        }
        if let Some(state) = self.state.as_deref_mut() {
            let _ = state.flush();
        }
    }
}
