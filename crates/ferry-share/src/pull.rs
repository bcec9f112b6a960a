//! The client side of `ferry pull`: a whole file or subtree by the transfer protocol ([`pull`]), or a byte
//! range by verified reads ([`read_range`]).
//!
//! A pull opens a share session, asks [`crate::wire::Request::Pull`] as its only request and, once the sharer
//! answers [`crate::wire::Response::Transfer`], runs [`ferry_transfer::receive`] on the same channel: the
//! receiver's rules hold as for `ferry receive` (names checked, temporary file, BLAKE3 verified before the
//! final name, nothing replaced without `overwrite`, resume of what an earlier, cut pull left, source
//! changes detected by the sharer). The offer is accepted without asking (the client asked for it) when it
//! is what was asked for: one top-level entry, named as the pulled path.

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read, Write};

use ferry_channel::blocking::{SecureReader, SecureWriter};
use ferry_transfer::secure::{ChannelSink, ChannelSource};
use ferry_transfer::{Progress, ReceiveOptions, ReceiveReport, TransferError};

use crate::client::Event;
use crate::io::{busy, failed, Session, SessionError};
use crate::tree::Version;
use crate::wire::{RequestId, SharePath};

/// Pulls `remote` (a file or directory of the share; the share itself when empty) into
/// `options.out_dir`, over an established channel to the sharer.
pub fn pull<R: Read, W: Write>(
    reader: SecureReader<R>,
    writer: SecureWriter<W>,
    remote: &SharePath,
    options: &ReceiveOptions,
    progress: &mut dyn Progress,
) -> Result<ReceiveReport, SessionError> {
    pull_session(Session::open(reader, writer, 1)?, remote, options, progress)
}

/// [`pull`] on a session already open (its hellos exchanged) and with no request of its own in flight: the
/// pull is the session's last request.
pub fn pull_session<R: Read, W: Write>(
    mut session: Session<R, W>,
    remote: &SharePath,
    options: &ReceiveOptions,
    progress: &mut dyn Progress,
) -> Result<ReceiveReport, SessionError> {
    let id = session.client().pull(remote.clone()).map_err(|_| busy())?;
    loop {
        match session.next_event()? {
            Event::Transfer { id: i } if i == id => break,
            Event::Failed { id: i, failure } if i == id => return Err(failed(failure)),
            _ => {}
        }
    }
    let (reader, writer) = session.into_parts();
    let (mut source, mut sink) = (ChannelSource(reader), ChannelSink(writer));
    // The offer names its entry as the receiver will write it: under `-o NAME` when one is given.
    let wanted = match &options.output {
        ferry_transfer::Output::Named(name) => name.clone(),
        _ => ferry_tree::path::split_parent(remote.as_bytes()).1.to_vec(),
    };
    let mut unexpected = false;
    let mut accept = |offer: &ferry_transfer::Offer<'_>| {
        let fits = offer.top_level_count == 1
            && !offer.text
            && (wanted.is_empty() || offer.top_level.first() == Some(&wanted.as_slice()));
        unexpected = !fits;
        fits
    };
    let received = ferry_transfer::receive(&mut source, &mut sink, options, &mut accept, progress);
    let report = match received {
        Err(TransferError::Declined) if unexpected => {
            return Err(TransferError::Protocol(
                "the sharer offered something other than the pulled path".into(),
            )
            .into())
        }
        r => r?,
    };
    // The sharer has its confirmation; a failed close changes nothing here.
    let _ = sink.0.close();
    Ok(report)
}

/// Bytes asked for by one read of a range.
pub const RANGE_PIECE: u64 = 4 << 20;
/// Reads of one range in flight at once.
pub const RANGE_WINDOW: usize = 4;

/// Writes `len` bytes from `offset` of the file `path` to `out`, in order, every byte verified against one
/// version of the file before it is written. Large ranges are read in several requests in flight at once
/// (at most [`RANGE_WINDOW`] of [`RANGE_PIECE`] bytes held), every one after the first pinned to the first's
/// version, so the bytes never mix two versions. A range that ends past the end of the file fails before
/// anything is written. Returns the version read.
pub fn read_range<R: Read, W: Write>(
    session: &mut Session<R, W>,
    path: &SharePath,
    offset: u64,
    len: u64,
    out: &mut dyn Write,
) -> Result<Version, SessionError> {
    let end = offset
        .checked_add(len)
        .ok_or(SessionError::PastEnd { size: u64::MAX })?;
    let first = RANGE_PIECE.min(len);
    let client = session.client();
    let mut ids: VecDeque<RequestId> = VecDeque::new();
    ids.push_back(
        client
            .read(path.clone(), None, offset, first)
            .map_err(|_| busy())?,
    );
    let mut next = offset + first;
    let mut version: Option<Version> = None;
    // Bytes of the reads in flight, by id, and whether each is complete.
    let mut held: BTreeMap<RequestId, (Vec<u8>, bool)> = BTreeMap::new();
    while !ids.is_empty() {
        match session.next_event()? {
            Event::Version { id, version: v } if ids.contains(&id) => {
                if v.size < end {
                    for id in ids.drain(..) {
                        session.client().cancel(id);
                    }
                    return Err(SessionError::PastEnd { size: v.size });
                }
                version.get_or_insert(v);
            }
            Event::Data { id, bytes, .. } if ids.contains(&id) => {
                held.entry(id).or_default().0.extend_from_slice(&bytes);
            }
            Event::Done { id } if ids.contains(&id) => held.entry(id).or_default().1 = true,
            Event::Failed { id, failure } if ids.contains(&id) => return Err(failed(failure)),
            _ => {}
        }
        // Write what is complete, in order; then keep the window full, pinned to the version.
        while let Some(&front) = ids.front() {
            if !held.get(&front).is_some_and(|(_, done)| *done) {
                break;
            }
            let (bytes, _) = held.remove(&front).expect("present");
            out.write_all(&bytes)?;
            ids.pop_front();
        }
        if let Some(v) = version {
            while next < end && ids.len() < RANGE_WINDOW {
                let n = RANGE_PIECE.min(end - next);
                let id = session
                    .client()
                    .read(path.clone(), Some(v.root), next, n)
                    .map_err(|_| busy())?;
                ids.push_back(id);
                next += n;
            }
        }
    }
    out.flush()?;
    version.ok_or(SessionError::Integrity)
}
