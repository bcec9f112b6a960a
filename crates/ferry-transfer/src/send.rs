//! The sending side: offer, read the receiver's answer, stream every file, wait for `Done`.

use crate::manifest::{EntryKind, Manifest};
use crate::progress::{Progress, ProgressState};
use crate::wire::{self, Cursor, OfferHeader, Put, Reader};
use crate::{PacketSink, PacketSource, TransferError, CHUNK, MAX_PACKET};
use blake3::hazmat::ChainingValue;
use ferry_tree::fsys::{self, Dir, Region};
use ferry_tree::hash::{chunk_count, has_chunks, FileHasher};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Most zeros of holes one data packet covers (see [`Stream::fill`]).
const HOLE_BYTES_PER_PACKET: u64 = 16 << 20;

/// Options of [`send`].
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Largest packet to build (at least 64 KiB; [`MAX_PACKET`] by default). Must not exceed what
    /// the sink and the peer's source accept.
    pub max_packet: usize,
    /// Offer the manifest as a text message ([`wire::OFFER_TEXT`]): it must be one file of at
    /// most [`wire::MAX_TEXT`] bytes.
    pub text: bool,
}

impl Default for SendOptions {
    fn default() -> Self {
        SendOptions {
            max_packet: MAX_PACKET,
            text: false,
        }
    }
}

/// Opens the regular files of a manifest that was not made by [`crate::walk`] from local paths
/// (see [`send_from`]).
pub trait OpenSource {
    /// Opens the file of `entry` (walked as `source`) for reading, non-blocking (a FIFO put in its
    /// place fails instead of hanging). A symlink where the walk saw a directory or the file must
    /// fail with `ELOOP` (reported as [`TransferError::SourceChanged`]); a file that may not be
    /// read or is gone, with `PermissionDenied` or `NotFound` (skipped, the receiver is told).
    fn open(&self, entry: &crate::Entry, source: &crate::manifest::Source) -> io::Result<File>;
}

/// What a successful [`send`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendReport {
    /// Files the receiver verified.
    pub files: u64,
    /// File bytes sent over the channel (the holes of sparse files count, though only their
    /// length is sent).
    pub bytes_sent: u64,
    /// File bytes the receiver already held from an earlier run (verified, not sent again).
    pub bytes_resumed: u64,
    /// Files the receiver held whole from an earlier run (their bytes are in `bytes_resumed`).
    pub files_resumed: u64,
    /// Files the receiver already had, identical (not sent).
    pub files_skipped: u64,
    /// Bytes of the `files_skipped`.
    pub bytes_skipped: u64,
    /// Files skipped after the offer because they could not be opened (the receiver was told).
    pub skipped: u64,
}

/// What the receiver says it already holds of one file.
enum Claim {
    /// Chaining values of the first chunks.
    Chunks(Vec<ChainingValue>),
    /// The whole file, finished by an earlier run of this offer, with its hash.
    Complete([u8; 32]),
    /// A file the receiver already has under the final name, with its hash (not yet compared).
    Existing([u8; 32]),
    /// An [`Claim::Existing`] file found identical: not sent.
    Identical([u8; 32]),
}

/// Sends `manifest` (from [`crate::walk`]): the offer, then, if accepted, every file's data, and
/// returns once the receiver confirmed that everything arrived and verified.
///
/// Errors found locally are also reported to the peer; an error the peer reports comes back as
/// [`TransferError::Remote`], a declined offer as [`TransferError::Declined`].
pub fn send<K: PacketSink, S: PacketSource>(
    sink: &mut K,
    source: &mut S,
    manifest: &Manifest,
    opts: &SendOptions,
    progress: &mut dyn Progress,
) -> Result<SendReport, TransferError> {
    let result = send_inner(sink, source, manifest, None, opts, progress);
    wire::report_failure(&result, sink);
    result
}

/// [`send`] of a manifest whose files `opener` opens (instead of opening each [`Source::path`]):
/// a share's files, reached by descriptor beneath the shared directory.
///
/// [`Source::path`]: crate::manifest::Source::path
pub fn send_from<K: PacketSink, S: PacketSource>(
    sink: &mut K,
    source: &mut S,
    manifest: &Manifest,
    opener: &dyn OpenSource,
    opts: &SendOptions,
    progress: &mut dyn Progress,
) -> Result<SendReport, TransferError> {
    let result = send_inner(sink, source, manifest, Some(opener), opts, progress);
    wire::report_failure(&result, sink);
    result
}

fn send_inner<'m, K: PacketSink, S: PacketSource>(
    sink: &mut K,
    source: &mut S,
    manifest: &'m Manifest,
    opener: Option<&'m dyn OpenSource>,
    opts: &SendOptions,
    progress: &mut dyn Progress,
) -> Result<SendReport, TransferError> {
    if opts.max_packet < 64 * 1024 {
        return Err(TransferError::protocol("max_packet below 64 KiB"));
    }
    if manifest.sources.len() != manifest.entries.len() {
        return Err(TransferError::protocol("manifest has no local sources"));
    }
    let totals = totals_of(manifest)?;
    if opts.text {
        check_text(manifest)?;
    }
    let mut state = ProgressState {
        totals,
        text: opts.text,
        ..Default::default()
    };
    progress.offer(&state);

    let mut msg = Vec::with_capacity(wire::MAX_PAGE.min(opts.max_packet));
    OfferHeader {
        entries: manifest.entries.len() as u64,
        manifest_bytes: manifest.encoded_len(),
        totals,
        bytes_allocated: manifest.bytes_allocated(),
        offer_id: manifest.offer_id(),
        text: opts.text,
    }
    .encode(&mut msg);
    sink.send(&msg)?;
    let mut next = 0;
    while next < manifest.entries.len() {
        manifest.encode_page(&mut next, opts.max_packet.min(wire::MAX_PAGE), &mut msg);
        sink.send(&msg)?;
    }
    drop(msg);

    // The early part: the data as a receiver without claims takes it, before the answer.
    let mut stream = Stream::new(manifest, HashMap::new(), opener);
    if let Err(e) = send_early(sink, &mut stream, opts.max_packet) {
        return Err(match e {
            TransferError::Io(e) => answer_error_or(source, e),
            e => e,
        });
    }

    let claims = read_answer(source, manifest)?;
    progress.accepted(&state);
    if !claims.is_empty() {
        // The receiver dropped the early part: the stream starts again, with the claims.
        stream = Stream::new(manifest, claims, opener);
    }
    let existing: Vec<u32> = stream
        .claims
        .iter()
        .filter(|(_, c)| matches!(c, Claim::Existing(_)))
        .map(|(&i, _)| i)
        .collect();
    if !existing.is_empty() {
        let bytes = existing
            .iter()
            .map(|&i| manifest.entries[i as usize].size)
            .sum();
        progress.checking(&state, existing.len() as u64, bytes);
        let differ = stream.compare_existing(existing)?;
        send_verdict(sink, &differ, opts.max_packet.min(wire::MAX_PAGE))?;
    }
    stream.report_to(&mut state, progress);
    while !stream.finished {
        let buf = sink.payload_buf(sink.packet_limit(opts.max_packet));
        let used = stream.fill(buf)?;
        if let Err(e) = sink.send_payload_buf(used) {
            return Err(peer_error_or(source, e));
        }
        stream.report_to(&mut state, progress);
    }
    if let Err(e) = sink.flush() {
        return Err(peer_error_or(source, e));
    }
    match source.recv()? {
        None => Err(TransferError::UnexpectedEnd),
        Some(packet) => {
            let mut r = Reader::new(packet);
            wire::expect_type(&mut r, wire::MSG_DONE, "done")?;
            stream.report.files = totals.files - stream.report.skipped;
            progress.done(&state);
            Ok(stream.report)
        }
    }
}

/// The early part ends when less than this is left of its budget.
const MIN_EARLY_PACKET: usize = 16 << 10;

/// Sends the early part: `stream`'s first packets as [`wire::MSG_EARLY`], at most
/// [`wire::MAX_EARLY`] bytes in all, then [`wire::MSG_EARLY_END`]; flushes.
fn send_early<K: PacketSink>(
    sink: &mut K,
    stream: &mut Stream<'_>,
    max_packet: usize,
) -> Result<(), TransferError> {
    let mut sent = 0;
    while !stream.finished {
        // The channel's small first packets (4 KiB) are what the early part is for: only the
        // budget's end stops it.
        let room = wire::MAX_EARLY - sent;
        if room < MIN_EARLY_PACKET {
            break;
        }
        let len = sink.packet_limit(max_packet).min(room);
        let buf = sink.payload_buf(len);
        let used = stream.fill(buf)?;
        buf[0] = wire::MSG_EARLY;
        sink.send_payload_buf(used)?;
        sent += used;
    }
    sink.send(&[wire::MSG_EARLY_END])?;
    sink.flush()?;
    Ok(())
}

/// After a failed write before the answer was read: the receiver may have answered and gone (a
/// decline, an error of its own): prefer what it said.
fn answer_error_or<S: PacketSource>(source: &mut S, e: io::Error) -> TransferError {
    if let Ok(Some(packet)) = source.recv() {
        match wire::Answer::decode(packet) {
            Ok(wire::Answer::Decline) => return TransferError::Declined,
            Err(remote @ TransferError::Remote { .. }) => return remote,
            _ => {}
        }
    }
    TransferError::Io(e)
}

/// A text offer is one file of at most [`wire::MAX_TEXT`] bytes (what every receiver takes).
fn check_text(manifest: &Manifest) -> Result<(), TransferError> {
    match manifest.entries.as_slice() {
        [e] if e.kind == EntryKind::File && e.size <= wire::MAX_TEXT => Ok(()),
        [e] if e.kind == EntryKind::File => Err(TransferError::TextTooLarge {
            size: e.size,
            limit: wire::MAX_TEXT,
        }),
        _ => Err(TransferError::protocol("a text offer is exactly one file")),
    }
}

fn totals_of(manifest: &Manifest) -> Result<crate::Totals, TransferError> {
    crate::Totals::of(&manifest.entries)
        .ok_or_else(|| TransferError::protocol("total size overflows"))
}

/// Sends the verdict on the receiver's existing files: the indices of those that differ, in pages
/// of at most `max` bytes.
fn send_verdict<K: PacketSink>(
    sink: &mut K,
    differ: &[u32],
    max: usize,
) -> Result<(), TransferError> {
    let per_page = (max - 6) / 4;
    let mut pages = differ.chunks(per_page).peekable();
    let mut msg = Vec::new();
    loop {
        let page = pages.next().unwrap_or(&[]);
        msg.clear();
        msg.put_u8(wire::MSG_VERDICT);
        msg.put_u8(u8::from(pages.peek().is_none()));
        msg.put_u32(page.len() as u32);
        for &i in page {
            msg.put_u32(i);
        }
        sink.send(&msg)?;
        if pages.peek().is_none() {
            break;
        }
    }
    sink.flush()?;
    Ok(())
}

/// After a failed write, the peer may have said why it stopped: prefer its error message.
fn peer_error_or<S: PacketSource>(source: &mut S, e: io::Error) -> TransferError {
    if let Ok(Some(packet)) = source.recv() {
        let mut r = Reader::new(packet);
        if let Err(remote @ TransferError::Remote { .. }) =
            wire::expect_type(&mut r, wire::MSG_DONE, "done")
        {
            return remote;
        }
    }
    TransferError::Io(e)
}

/// Reads Accept (and its resume pages) or Decline, checking every claim against the manifest.
fn read_answer<S: PacketSource>(
    source: &mut S,
    manifest: &Manifest,
) -> Result<HashMap<u32, Claim>, TransferError> {
    let packet = source.recv()?.ok_or(TransferError::UnexpectedEnd)?;
    let pages = match wire::Answer::decode(packet)? {
        wire::Answer::Decline => return Err(TransferError::Declined),
        wire::Answer::Accept { resume_pages } => u64::from(resume_pages),
    };
    let files = manifest
        .entries
        .iter()
        .filter(|e| e.kind == EntryKind::File);
    let max_pages: u64 = files.map(|e| chunk_count(e.size)).sum();
    if pages > max_pages {
        return Err(TransferError::protocol("too many resume pages"));
    }
    let mut claims = HashMap::new();
    let mut last: Option<u32> = None;
    for _ in 0..pages {
        let packet = source.recv()?.ok_or(TransferError::UnexpectedEnd)?;
        let mut r = Reader::new(packet);
        wire::expect_type(&mut r, wire::MSG_RESUME, "resume page")?;
        let count = r.u32()?;
        if count == 0 {
            return Err(TransferError::protocol("empty resume page"));
        }
        for _ in 0..count {
            let index = r.u32()?;
            let entry = manifest
                .entries
                .get(index as usize)
                .filter(|e| e.kind == EntryKind::File)
                .ok_or_else(|| TransferError::protocol("resume record for no file"))?;
            let kind = r.u8()?;
            let continuing = last == Some(index);
            if last.is_some_and(|l| index < l) || (continuing && kind != wire::HELD_CHUNKS) {
                return Err(TransferError::protocol("resume records out of order"));
            }
            last = Some(index);
            match kind {
                wire::HELD_CHUNKS => {
                    let first = r.u32()? as u64;
                    let n = r.u32()? as u64;
                    let have = match claims.get(&index) {
                        Some(Claim::Chunks(c)) => c.len() as u64,
                        Some(_) => u64::MAX,
                        None => 0,
                    };
                    if !has_chunks(entry.size)
                        || first != have
                        || first + n > chunk_count(entry.size)
                    {
                        return Err(TransferError::protocol("bad resume chunk record"));
                    }
                    let bytes = r.bytes(n as usize * 32)?;
                    let Claim::Chunks(cvs) =
                        claims.entry(index).or_insert(Claim::Chunks(Vec::new()))
                    else {
                        unreachable!("checked above");
                    };
                    cvs.extend(
                        bytes
                            .chunks_exact(32)
                            .map(|c| <[u8; 32]>::try_from(c).expect("32")),
                    );
                }
                wire::HELD_COMPLETE | wire::HELD_EXISTING => {
                    if continuing {
                        return Err(TransferError::protocol("resume records out of order"));
                    }
                    let hash = r.array()?;
                    let claim = if kind == wire::HELD_COMPLETE {
                        Claim::Complete(hash)
                    } else {
                        Claim::Existing(hash)
                    };
                    claims.insert(index, claim);
                }
                k => return Err(TransferError::protocol(format!("unknown resume kind {k}"))),
            }
        }
        r.finish()?;
    }
    Ok(claims)
}

/// The file being streamed.
struct Current<'m> {
    index: usize,
    file: Option<Reading<'m>>,
    size: u64,
    /// Offset of the next byte to send.
    pos: u64,
    started: bool,
    /// The file's hash when known without hashing it here (an identical existing file).
    hash: Option<[u8; 32]>,
    /// A sparse file: its data and holes are found with `SEEK_DATA`/`SEEK_HOLE`.
    sparse: bool,
    /// The data (or, with `in_hole`, the hole) from `pos` ends here; a sparse file asks the file
    /// system again once `pos` reaches it.
    region_end: u64,
    in_hole: bool,
}

/// The data phase as a state machine that fills one packet at a time, in place.
struct Stream<'m> {
    manifest: &'m Manifest,
    claims: HashMap<u32, Claim>,
    next_entry: usize,
    cur: Option<Current<'m>>,
    /// A file that could not be opened, with why: its [`wire::REC_SKIP`] is due.
    skip: Option<(usize, String)>,
    /// Files skipped since the last packet, with why (for progress).
    skipped: Vec<(usize, String)>,
    hasher: FileHasher,
    /// Chunk hashes of the current file already sent (or kept by the receiver).
    emitted: usize,
    scratch: Vec<u8>,
    dirs: SourceDirs,
    opener: Option<&'m dyn OpenSource>,
    finished: bool,
    report: SendReport,
    completed: Vec<usize>,
}

impl<'m> Stream<'m> {
    fn new(
        manifest: &'m Manifest,
        claims: HashMap<u32, Claim>,
        opener: Option<&'m dyn OpenSource>,
    ) -> Self {
        Stream {
            manifest,
            claims,
            next_entry: 0,
            cur: None,
            hasher: FileHasher::default(),
            emitted: 0,
            scratch: Vec::new(),
            dirs: SourceDirs::default(),
            opener,
            skip: None,
            finished: false,
            report: SendReport::default(),
            completed: Vec::new(),
            skipped: Vec::new(),
        }
    }

    /// Reports what was sent since the last call (the early part's packets are reported once the
    /// receiver accepted them).
    fn report_to(&mut self, state: &mut ProgressState, progress: &mut dyn Progress) {
        let manifest = self.manifest;
        let r = &self.report;
        state.bytes_done = r.bytes_sent + r.bytes_resumed + r.bytes_skipped;
        state.bytes_resumed = r.bytes_resumed;
        state.files_resumed = r.files_resumed;
        state.bytes_skipped = r.bytes_skipped;
        state.files_skipped = r.files_skipped;
        if let Some(i) = self.cur.as_ref().map(|c| c.index).or(self.last_index()) {
            progress.progress(state, &manifest.entries[i]);
        }
        for &i in &self.completed {
            state.files_done += 1;
            progress.file_done(state, &manifest.entries[i]);
        }
        self.completed.clear();
        for (i, reason) in self.skipped.drain(..) {
            state.skipped += 1;
            state.totals.files -= 1;
            state.totals.bytes -= manifest.entries[i].size;
            progress.skipped(state, &manifest.entries[i], &reason);
        }
    }

    fn last_index(&self) -> Option<usize> {
        self.completed.last().copied()
    }

    fn path(&self, index: usize) -> String {
        self.manifest.sources[index].path.display().to_string()
    }

    /// Hashes the files of the receiver's [`Claim::Existing`] claims `existing`; returns those
    /// that differ (ascending), and keeps the others as [`Claim::Identical`]. A file that cannot
    /// be opened differs (it is skipped when its turn comes).
    fn compare_existing(&mut self, mut existing: Vec<u32>) -> Result<Vec<u32>, TransferError> {
        existing.sort_unstable();
        let mut differ = Vec::new();
        for i in existing {
            let Some(Claim::Existing(theirs)) = self.claims.remove(&i) else {
                unreachable!("only existing claims are compared");
            };
            let index = i as usize;
            let size = self.manifest.entries[index].size;
            let Some(mut file) = self.open_source(index)? else {
                self.skip = None;
                differ.push(i);
                continue;
            };
            if let Reading::File(f) = &file {
                unchanged(self.manifest, index, f)?;
            }
            self.hasher.start(size, &[]);
            self.hash_prefix(&mut file, size, index)?;
            if self.hasher.finish() == Some(theirs) {
                self.claims.insert(i, Claim::Identical(theirs));
            } else {
                differ.push(i);
            }
        }
        Ok(differ)
    }

    /// The source of entry `index`: what the walk read of it, or the file. `Ok(None)` when the
    /// file cannot be opened (no permission, gone): `self.skip` is set and the file is skipped.
    fn open_source(&mut self, index: usize) -> Result<Option<Reading<'m>>, TransferError> {
        let manifest = self.manifest;
        let entry = &manifest.entries[index];
        let source = &manifest.sources[index];
        if let Some(held) = &source.held {
            // Read at the walk: sent as read then.
            return Ok(Some(Reading::Held(io::Cursor::new(&held[..]))));
        }
        // Inside a directory the walk saw a regular file: a symlink there now is not followed.
        let inside = entry.path.contains(&b'/');
        let opened = match self.opener {
            Some(opener) => opener.open(entry, source),
            None => self.dirs.open(&source.path, inside),
        };
        match opened {
            Ok(f) => Ok(Some(Reading::File(f))),
            // A symlink where the walk saw a regular file.
            Err(e) if inside && e.raw_os_error() == Some(libc::ELOOP) => {
                Err(TransferError::SourceChanged {
                    path: self.path(index),
                })
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::PermissionDenied | io::ErrorKind::NotFound
                ) =>
            {
                self.skip = Some((index, crate::walk::reason(&e)));
                Ok(None)
            }
            Err(e) => Err(TransferError::file(source.path.display().to_string(), e)),
        }
    }

    /// Opens the next file and settles where its data starts, checking any resume claim. A file
    /// that cannot be opened (no permission, gone) is to be skipped: `self.skip` is set instead.
    fn open(&mut self, index: usize) -> Result<(), TransferError> {
        let size = self.manifest.entries[index].size;
        let manifest = self.manifest;
        let err = |e| TransferError::file(manifest.sources[index].path.display().to_string(), e);
        let claim = self.claims.remove(&(index as u32));
        self.hasher.start(size, &[]);
        if let Some(Claim::Identical(hash)) = claim {
            // Hashed (and checked) just before the data: nothing to open or send.
            self.report.files_skipped += 1;
            self.report.bytes_skipped += size;
            self.emitted = 0;
            self.cur = Some(Current {
                index,
                file: None,
                size,
                pos: size,
                started: false,
                hash: Some(hash),
                sparse: false,
                region_end: size,
                in_hole: false,
            });
            return Ok(());
        }
        let Some(mut file) = self.open_source(index)? else {
            return Ok(());
        };
        // Any change shows in one stat after the last byte was read (see `unchanged`); a resume
        // reads from the middle, so it checks first too.
        if let (Some(_), Reading::File(f)) = (&claim, &file) {
            unchanged(manifest, index, f)?;
        }
        let mut pos = 0;
        match claim {
            None => {}
            Some(Claim::Identical(_)) => unreachable!("handled above"),
            Some(Claim::Existing(_)) => unreachable!("compared before the data"),
            Some(Claim::Complete(hash)) => {
                self.hash_prefix(&mut file, size, index)?;
                if self.hasher.finish() == Some(hash) {
                    pos = size;
                } else {
                    file.seek(SeekFrom::Start(0)).map_err(err)?;
                    self.hasher.start(size, &[]);
                }
            }
            Some(Claim::Chunks(theirs)) => {
                // Hash the claimed prefix locally (the whole-file hash needs it anyway) and keep
                // it only up to the first chunk that differs.
                let mut agreed = 0;
                for (k, cv) in theirs.iter().enumerate() {
                    let len = CHUNK.min(size - k as u64 * CHUNK);
                    self.hash_prefix(&mut file, len, index)?;
                    if self.hasher.chunk_hashes().get(k) != Some(cv) {
                        break;
                    }
                    agreed = k + 1;
                }
                pos = (agreed as u64 * CHUNK).min(size);
                self.hasher.start(size, &theirs[..agreed]);
                file.seek(SeekFrom::Start(pos)).map_err(err)?;
            }
        }
        self.report.bytes_resumed += pos;
        if pos == size && size > 0 {
            self.report.files_resumed += 1;
        }
        self.emitted = self.hasher.chunk_hashes().len();
        let sparse = self.manifest.is_sparse(index);
        self.cur = Some(Current {
            index,
            file: Some(file),
            size,
            pos,
            started: false,
            hash: None,
            sparse,
            region_end: if sparse { pos } else { size },
            in_hole: false,
        });
        Ok(())
    }

    fn hash_prefix(
        &mut self,
        file: &mut Reading<'_>,
        len: u64,
        index: usize,
    ) -> Result<(), TransferError> {
        if self.scratch.is_empty() {
            self.scratch = vec![0; CHUNK as usize];
        }
        self.hasher
            .update_from(file, len, &mut self.scratch)
            .map_err(|e| TransferError::file(self.path(index), e))
    }

    /// Fills `buf` with one data packet; returns its length. Sets `finished` after the last file.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, TransferError> {
        let min_piece = (buf.len() / 4).min(16 * 1024);
        let mut c = Cursor { buf, pos: 0 };
        // Zeros of holes hashed for this packet: a long hole is spread over packets, so that the
        // receiver hashes one packet's zeros while this side hashes the next.
        let mut hole_bytes = 0u64;
        let manifest = self.manifest;
        let file_err = |index: usize, e| {
            TransferError::file(manifest.sources[index].path.display().to_string(), e)
        };
        c.put_u8(wire::MSG_DATA);
        loop {
            if let Some((index, reason)) = &self.skip {
                let reason = wire::truncate_text(reason, wire::MAX_SKIP_REASON);
                if c.room() < wire::SKIP_LEN + reason.len() {
                    return Ok(c.pos);
                }
                c.put_u8(wire::REC_SKIP);
                c.put_u32(*index as u32);
                c.put_u16(reason.len() as u16);
                c.put(reason.as_bytes());
                self.report.skipped += 1;
                self.skipped.extend(self.skip.take());
            }
            if self.cur.is_none() {
                let next = self.manifest.entries[self.next_entry..]
                    .iter()
                    .position(|e| e.kind == EntryKind::File);
                match next {
                    None => {
                        if c.room() >= 1 {
                            c.put_u8(wire::REC_FINISH);
                            self.finished = true;
                        }
                        return Ok(c.pos);
                    }
                    Some(off) => {
                        let index = self.next_entry + off;
                        self.next_entry = index + 1;
                        self.open(index)?;
                        continue;
                    }
                }
            }
            let cur = self.cur.as_mut().expect("opened above");
            if !cur.started {
                if c.room() < wire::START_LEN {
                    return Ok(c.pos);
                }
                c.put_u8(if cur.sparse {
                    wire::REC_START_SPARSE
                } else {
                    wire::REC_START
                });
                c.put_u32(cur.index as u32);
                c.put_u64(cur.pos);
                cur.started = true;
            }
            let cvs = self.hasher.chunk_hashes();
            while self.emitted < cvs.len() {
                if c.room() < wire::CHUNK_LEN {
                    return Ok(c.pos);
                }
                c.put_u8(wire::REC_CHUNK);
                c.put_u32(self.emitted as u32);
                c.put(&cvs[self.emitted]);
                self.emitted += 1;
            }
            let remaining = cur.size - cur.pos;
            if remaining > 0 && cur.sparse {
                if cur.pos == cur.region_end {
                    let Some(Reading::File(file)) = cur.file.as_ref() else {
                        unreachable!("a sparse file is read from disk, never held");
                    };
                    let region = fsys::region_at(file, cur.pos);
                    let region = region.map_err(|e| file_err(cur.index, e))?;
                    (cur.in_hole, cur.region_end) = match region {
                        Region::Data(end) => (false, end),
                        Region::Hole(end) => (true, end),
                    };
                    cur.region_end = cur.region_end.clamp(cur.pos + 1, cur.size);
                }
                if cur.in_hole {
                    if hole_bytes >= HOLE_BYTES_PER_PACKET || c.room() < wire::HOLE_LEN {
                        return Ok(c.pos);
                    }
                    let mut n = cur.region_end - cur.pos;
                    if has_chunks(cur.size) {
                        n = n.min(CHUNK - cur.pos % CHUNK);
                    }
                    c.put_u8(wire::REC_HOLE);
                    c.put_u64(n);
                    self.hasher.update_zeros(n);
                    hole_bytes += n;
                    cur.pos += n;
                    self.report.bytes_sent += n;
                    continue;
                }
            }
            if remaining > 0 {
                let room = c.room().saturating_sub(wire::DATA_HEADER_LEN);
                if room < min_piece.min(remaining as usize).max(1) {
                    return Ok(c.pos);
                }
                // End a record at each chunk boundary so that the chunk's hash can follow in the
                // same packet: a cut connection then loses at most the chunks of one packet.
                let mut n = room.min(remaining as usize);
                if cur.sparse {
                    n = n.min((cur.region_end - cur.pos) as usize);
                }
                if has_chunks(cur.size) {
                    n = n.min((CHUNK - cur.pos % CHUNK) as usize);
                }
                c.put_u8(wire::REC_DATA);
                c.put_u32(n as u32);
                let file = cur.file.as_mut().expect("open while data remains");
                // The last piece asks for one byte more when the packet has room for it: getting
                // it means the file grew, getting less than the piece that it shrank (or is no
                // longer a regular file), all in the one read the piece needs anyway.
                let probe = usize::from(n as u64 == remaining && c.room() > n);
                let got = match read_piece(file, &mut c.buf[c.pos..c.pos + n + probe], n) {
                    Ok(got) => got,
                    Err(e) => {
                        let index = cur.index;
                        return Err(TransferError::file(self.path(index), e));
                    }
                };
                if got != n {
                    let index = cur.index;
                    return Err(TransferError::SourceChanged {
                        path: self.path(index),
                    });
                }
                let data = &c.buf[c.pos..c.pos + n];
                self.hasher.update(data);
                c.pos += n;
                cur.pos += n as u64;
                self.report.bytes_sent += n as u64;
                continue;
            }
            if c.room() < wire::END_LEN {
                return Ok(c.pos);
            }
            if let Some(Reading::File(file)) = &cur.file {
                // Any change since the walk shows in one stat after the last byte (for a sparse
                // file ending in a hole, also a change of size).
                unchanged(self.manifest, cur.index, file)?;
            }
            let hash = cur
                .hash
                .unwrap_or_else(|| self.hasher.finish().expect("all bytes hashed"));
            c.put_u8(wire::REC_END);
            c.put(&hash);
            self.completed.push(cur.index);
            self.cur = None;
        }
    }
}

/// Reads at least `n` bytes into `buf` (which is `n` or `n + 1` long) unless the file ends first;
/// returns the bytes read. Each read asks for all of `buf`, so the probe byte of a last piece costs
/// no extra system call: a read that stops short of it, having delivered the piece, met the end.
fn read_piece(file: &mut impl Read, buf: &mut [u8], n: usize) -> io::Result<usize> {
    let mut got = 0;
    while got < n {
        match file.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Fails with [`TransferError::SourceChanged`] unless the open `file` (of entry `index`) is still
/// what the walk saw ([`crate::manifest::Source::unchanged`]): one stat after its last byte was
/// read shows a change made at any time before.
fn unchanged(manifest: &Manifest, index: usize, file: &File) -> Result<(), TransferError> {
    let source = &manifest.sources[index];
    let meta = file
        .metadata()
        .map_err(|e| TransferError::file(source.path.display().to_string(), e))?;
    if source.unchanged(&manifest.entries[index], &meta) {
        Ok(())
    } else {
        Err(TransferError::SourceChanged {
            path: source.path.display().to_string(),
        })
    }
}

/// Where a file's bytes come from: the file, or what the walk read of it.
enum Reading<'m> {
    File(File),
    Held(io::Cursor<&'m [u8]>),
}

impl Read for Reading<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Reading::File(f) => f.read(buf),
            Reading::Held(h) => h.read(buf),
        }
    }
}

impl Seek for Reading<'_> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        match self {
            Reading::File(f) => f.seek(pos),
            Reading::Held(h) => h.seek(pos),
        }
    }
}

/// The directory of the last source file opened: the next file of the same directory is opened
/// relative to it rather than by walking its whole path again.
#[derive(Default)]
struct SourceDirs {
    path: PathBuf,
    dir: Option<Dir>,
}

impl SourceDirs {
    /// Opens the source file at `path` for reading; when `no_follow`, a symlink there is an error.
    /// Non-blocking, so that a FIFO put in a file's place fails rather than hangs.
    fn open(&mut self, path: &Path, no_follow: bool) -> io::Result<File> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return File::open(path);
        };
        if parent.as_os_str().is_empty() {
            return File::open(path);
        }
        if self.dir.is_none() || self.path != parent {
            self.dir = None;
            self.dir = Some(Dir::open(parent)?);
            self.path = parent.to_path_buf();
        }
        let dir = self.dir.as_ref().expect("opened above");
        dir.open_source(name.as_encoded_bytes(), no_follow)
    }
}
