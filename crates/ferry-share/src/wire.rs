//! Every message of the share protocol, in one place: its type byte, its fields and their checks.
//!
//! One message per channel packet: a type byte, then the fields, integers little-endian. Requests (client to
//! server) carry an id the client chose (`u32`, unique among its requests in flight); every response carries
//! the id of the request it answers. A path is `u16` length + bytes: `/`-separated, relative to the share,
//! checked by the receiver's name rules (`ferry_tree::path::check_path`); the empty path is the share
//! itself.
//!
//! | type | direction | fields |
//! | --- | --- | --- |
//! | [`HELLO`] | both, first | version u16, most requests in flight u32, share name (u16 + bytes, ≤ 255) |
//! | [`LIST`] | client | id, path, cursor u64 (0 = from the start), most entries u32 |
//! | [`STAT`] | client | id, path |
//! | [`READ`] | client | id, path, has version u8 (0/1), version root \[32\], offset u64, length u64 |
//! | [`SUBSCRIBE`] | client | id |
//! | [`CANCEL`] | client | id of the request to cancel |
//! | [`PULL`] | client | id, path: the file or subtree, by the transfer protocol (the connection's only request) |
//! | [`PUT`] | client | id, path, has base u8, base root \[32\], from base u8, size u64, mode u32, has mtime u8, mtime i64, nanoseconds u32 |
//! | [`PUT_DATA`] | client | id (of the put), offset u64, then the bytes (the rest, ≤ [`MAX_PUT_DATA`]) |
//! | [`PUT_END`] | client | id, root \[32\]: the put's data is complete, and its content's BLAKE3 root |
//! | [`MKDIR`] | client | id, path, mode u32 |
//! | [`RMDIR`] | client | id, path |
//! | [`UNLINK`] | client | id, path, has base u8, base root \[32\] |
//! | [`RENAME`] | client | id, from path, to path, replace u8, has base u8, base root \[32\] (of the file replaced) |
//! | [`SETATTR`] | client | id, path, has mode u8, mode u32, has mtime u8, mtime i64, nanoseconds u32 |
//! | [`SYMLINK`] | client | id, path, target (u16 + bytes, relative, staying inside the share) |
//! | [`SPACE_OF`] | client | id: the size and free space of the file system the share is on |
//! | [`ENTRIES`] | server | id, count u32, entries, next cursor u64 ([`END`] when the listing is complete) |
//! | [`ATTR`] | server | id, entry |
//! | [`VERSION`] | server | id, size u64, root \[32\]: the version a read is served from, before its data |
//! | [`DATA`] | server | id, offset u64, length u32, then the piece: its proof's parent hashes, then its bytes in one run (the rest) |
//! | [`DONE`] | server | id: the request is complete |
//! | [`CHANGED`] | server | id (of the subscription), count u32, paths |
//! | [`TRANSFER`] | server | id (of the pull): from the next packet on, the connection carries the transfer protocol |
//! | [`ERROR`] | server | id, code u8 ([`ErrorCode`]), message (u16 + UTF-8, ≤ [`MAX_MESSAGE`]) |
//! | [`CONFLICTED`] | server | id (of a put or a rename), name (u16 + bytes): the put's content (the renamed file) was kept under this sibling name (of the rename's target) |
//! | [`SPACE`] | server | id, block size u32, blocks u64, free blocks u64, blocks free to the sharer u64, files u64, free files u64 |
//!
//! An entry: name (u16 + bytes, a single checked name; empty only for the share itself), kind u8 (0 file,
//! 1 directory, 2 symlink), size u64, mode u32 (permission bits), mtime seconds i64, mtime nanoseconds u32,
//! and for a symlink its target (u16 + bytes, ≤ 4096).

use ferry_tree::path::{check_name, check_path, PathProblem, MAX_NAME, MAX_PATH, MAX_TARGET};
use ferry_wire::{Put, Reader, WireError};

/// Protocol version in [`HELLO`]. 5: a [`RENAME`] names the version of the file it replaces, and
/// [`ErrorCode::HardLinked`] is new. 4: a piece's
/// data follows all its parents in one run ([`crate::tree`]), and a sharer's packets may carry up to
/// [`MAX_PACKET`] bytes.
pub const PROTOCOL_VERSION: u16 = 5;

/// The largest contents of a packet from the sharer: a 1 MiB piece, its proof and its header (the
/// channel's default is 1 MiB, which would cut a 1 MiB read into two pieces). Both sides set it on their
/// channel when the session starts.
pub const MAX_PACKET: usize = (1 << 20) + (32 << 10);

/// Hello: the first message each way.
pub const HELLO: u8 = 1;
/// List a directory, one page.
pub const LIST: u8 = 2;
/// Attributes of one path.
pub const STAT: u8 = 3;
/// Read a byte range of a file.
pub const READ: u8 = 4;
/// Subscribe to change notifications.
pub const SUBSCRIBE: u8 = 5;
/// Cancel a request in flight.
pub const CANCEL: u8 = 6;
/// Pull a file or subtree with the transfer protocol.
pub const PULL: u8 = 7;
/// Write a file: its new content follows in [`PUT_DATA`] packets, then [`PUT_END`].
pub const PUT: u8 = 8;
/// A range of a put's content.
pub const PUT_DATA: u8 = 9;
/// A put's content is complete.
pub const PUT_END: u8 = 10;
/// Create a directory.
pub const MKDIR: u8 = 11;
/// Remove an empty directory.
pub const RMDIR: u8 = 12;
/// Remove a file or symlink.
pub const UNLINK: u8 = 13;
/// Rename a path.
pub const RENAME: u8 = 14;
/// Change a path's permission bits or modification time.
pub const SETATTR: u8 = 15;
/// Create a symlink.
pub const SYMLINK: u8 = 16;
/// The size and free space of the share's file system.
pub const SPACE_OF: u8 = 17;
/// A page of a listing.
pub const ENTRIES: u8 = 64;
/// Attributes.
pub const ATTR: u8 = 65;
/// The version a read is served from.
pub const VERSION: u8 = 66;
/// A verified piece of a read.
pub const DATA: u8 = 67;
/// A request is complete.
pub const DONE: u8 = 68;
/// Paths that changed.
pub const CHANGED: u8 = 69;
/// A request failed.
pub const ERROR: u8 = 70;
/// A pull was resolved: the transfer protocol follows.
pub const TRANSFER: u8 = 71;
/// A put met a conflict: its content was kept under another name.
pub const CONFLICTED: u8 = 72;
/// The size and free space of the share's file system.
pub const SPACE: u8 = 73;

/// Most content bytes in one [`PUT_DATA`] packet.
pub const MAX_PUT_DATA: usize = 1 << 20;
/// Bytes of a [`PUT_DATA`] header, before its content.
pub const PUT_DATA_HEADER_LEN: usize = 1 + 4 + 8;

/// The cursor of a listing's last page.
pub const END: u64 = u64::MAX;
/// Most entries in one page.
pub const MAX_PAGE_ENTRIES: u32 = 4096;
/// Most paths in one change notification.
pub const MAX_CHANGED: u32 = 1024;
/// Longest error message.
pub const MAX_MESSAGE: usize = 1024;
/// Smallest encoded entry (an empty name, no target), to bound counts by the bytes present.
const MIN_ENTRY: usize = 2 + 1 + 8 + 4 + 8 + 4;

/// Request id, chosen by the client.
pub type RequestId = u32;

/// A message that is not a valid share message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Bad framing or a field out of bounds.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A path or name breaks the name rules.
    #[error("unsafe path: {0}")]
    UnsafePath(PathProblem),
    /// An unknown message type (for its direction).
    #[error("unknown message type {0}")]
    UnknownType(u8),
}

/// A path inside the share: empty for the share itself, otherwise checked by the name rules.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SharePath(Vec<u8>);

/// Its bytes: an ordered map of paths can give a prefix's range by bytes (the derived order is the bytes').
impl std::borrow::Borrow<[u8]> for SharePath {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

impl SharePath {
    /// The share itself.
    pub fn root() -> Self {
        SharePath(Vec::new())
    }

    /// Checks `bytes` (`/`-separated, relative; empty is the share itself).
    pub fn new(bytes: &[u8]) -> Result<Self, PathProblem> {
        if !bytes.is_empty() {
            check_path(bytes)?;
        }
        Ok(SharePath(bytes.to_vec()))
    }

    /// The path's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether this is the share itself.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let bytes = r.bytes16(MAX_PATH)?;
        SharePath::new(bytes).map_err(DecodeError::UnsafePath)
    }

    fn encode(&self, out: &mut impl Put) {
        out.put_bytes16(&self.0);
    }
}

/// Defines a wire enum whose every variant names its byte: `to_u8` and `from_u8` come from the one list,
/// so reordering the variants changes nothing on the wire (the tests pin each byte).
macro_rules! wire_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$doc:meta])* $variant:ident = $byte:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $name {
            $($(#[$doc])* $variant,)*
        }

        impl $name {
            /// Every variant.
            #[cfg(test)]
            const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// Its byte on the wire.
            fn to_u8(self) -> u8 {
                match self {
                    $($name::$variant => $byte,)*
                }
            }

            /// The variant of a wire byte, `None` for an unknown one.
            fn from_u8(v: u8) -> Option<Self> {
                match v {
                    $($byte => Some($name::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

wire_enum! {
    /// What an entry is.
    pub enum Kind {
        /// A regular file.
        File = 0,
        /// A directory.
        Dir = 1,
        /// A symbolic link.
        Symlink = 2,
    }
}

/// One directory entry or the attributes of one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its name (one component; empty for the share itself).
    pub name: Vec<u8>,
    /// File, directory or symlink.
    pub kind: Kind,
    /// Size in bytes (0 unless a file).
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, seconds.
    pub mtime: i64,
    /// Modification time, nanoseconds.
    pub mtime_nsec: u32,
    /// A symlink's target, as stored (the client applies its own rules before following it).
    pub target: Vec<u8>,
}

impl Entry {
    fn encode(&self, out: &mut impl Put) {
        out.put_bytes16(&self.name);
        out.put_u8(self.kind.to_u8());
        out.put_u64(self.size);
        out.put_u32(self.mode);
        out.put_i64(self.mtime);
        out.put_u32(self.mtime_nsec);
        if self.kind == Kind::Symlink {
            out.put_bytes16(&self.target);
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let name = r.bytes16(MAX_NAME)?;
        if !name.is_empty() {
            check_name(name).map_err(DecodeError::UnsafePath)?;
            if name.contains(&b'/') {
                return Err(WireError::Invalid("name with a slash").into());
            }
        }
        let kind = Kind::from_u8(r.u8()?).ok_or(WireError::Invalid("entry kind"))?;
        let size = r.u64()?;
        let mode = r.u32()? & 0o777;
        let mtime = r.i64()?;
        let mtime_nsec = r.u32()?;
        if mtime_nsec >= 1_000_000_000 {
            return Err(WireError::Invalid("nanoseconds").into());
        }
        if kind != Kind::File && size != 0 {
            return Err(WireError::Invalid("size of a non-file").into());
        }
        let target = if kind == Kind::Symlink {
            let t = r.bytes16(MAX_TARGET)?;
            if t.is_empty() || t.contains(&0) {
                return Err(WireError::Invalid("symlink target").into());
            }
            t.to_vec()
        } else {
            Vec::new()
        };
        Ok(Entry {
            name: name.to_vec(),
            kind,
            size,
            mode,
            mtime,
            mtime_nsec,
            target,
        })
    }
}

wire_enum! {
    /// Why a request failed.
    pub enum ErrorCode {
        /// No such path.
        NotFound = 1,
        /// A directory operation on a non-directory, or the reverse.
        WrongKind = 2,
        /// The path leaves the share (a symlink out of it, a device, ...): refused and logged.
        UnsafePath = 3,
        /// The file is no longer the version the request named.
        Changed = 4,
        /// The sharer may not read it.
        Permission = 5,
        /// Too many requests in flight.
        Busy = 6,
        /// The sharer hit an I/O error.
        Io = 7,
        /// The request is not valid (a duplicate id, a range past the end, ...).
        BadRequest = 8,
        /// The request was cancelled.
        Cancelled = 9,
        /// A write to a share that is not writable.
        ReadOnly = 10,
        /// The path changed on the sharer since the version the write names; nothing was changed.
        Conflict = 11,
        /// A put's content does not match the root it named; nothing was changed.
        Integrity = 12,
        /// The sharer's disk has no room for it.
        DiskFull = 13,
        /// The path exists already.
        Exists = 14,
        /// The directory is not empty.
        NotEmpty = 15,
        /// A mode change of a file with other hard links, which would change it outside the share too.
        HardLinked = 16,
    }
}

impl ErrorCode {
    /// The stable code scripts see (`--json`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not-found",
            ErrorCode::WrongKind => "wrong-kind",
            ErrorCode::UnsafePath => "unsafe-path",
            ErrorCode::Changed => "changed",
            ErrorCode::Permission => "permission",
            ErrorCode::Busy => "busy",
            ErrorCode::Io => "io",
            ErrorCode::BadRequest => "bad-request",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::ReadOnly => "read-only",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Integrity => "integrity",
            ErrorCode::DiskFull => "disk-full",
            ErrorCode::Exists => "exists",
            ErrorCode::NotEmpty => "not-empty",
            ErrorCode::HardLinked => "hard-linked",
        }
    }
}

/// The first message each way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`].
    pub version: u16,
    /// Most requests the sender of this hello keeps (client) or accepts (server) in flight.
    pub max_in_flight: u32,
    /// The share's name (server), empty from a client.
    pub share: Vec<u8>,
}

/// The size and free space of the file system a share is on, as `statvfs` gives them: what `df` shows
/// of a mount. Counts are in blocks of `block` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Space {
    /// Bytes per block: a power of two from 512 to 16 MiB.
    pub block: u32,
    /// Blocks in the file system.
    pub blocks: u64,
    /// Free blocks (at most `blocks`).
    pub free: u64,
    /// Free blocks the sharer's user may take (at most `free`).
    pub available: u64,
    /// File slots (inodes) in the file system; 0 when it has no such limit.
    pub files: u64,
    /// Free file slots (at most `files`).
    pub files_free: u64,
}

impl Space {
    fn encode(&self, out: &mut impl Put) {
        out.put_u32(self.block);
        out.put_u64(self.blocks);
        out.put_u64(self.free);
        out.put_u64(self.available);
        out.put_u64(self.files);
        out.put_u64(self.files_free);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let space = Space {
            block: r.u32()?,
            blocks: r.u64()?,
            free: r.u64()?,
            available: r.u64()?,
            files: r.u64()?,
            files_free: r.u64()?,
        };
        let block_ok = space.block.is_power_of_two() && (512..=16 << 20).contains(&space.block);
        if !block_ok
            || space.free > space.blocks
            || space.available > space.free
            || space.files_free > space.files
        {
            return Err(WireError::Invalid("space").into());
        }
        Ok(space)
    }
}

/// A client's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// The client's hello.
    Hello(Hello),
    /// One page of a directory listing.
    List {
        /// Request id.
        id: RequestId,
        /// The directory.
        path: SharePath,
        /// Where the page starts (0, or a previous page's `next`).
        cursor: u64,
        /// Most entries wanted (at most [`MAX_PAGE_ENTRIES`]).
        max: u32,
    },
    /// The attributes of one path.
    Stat {
        /// Request id.
        id: RequestId,
        /// The path.
        path: SharePath,
    },
    /// A byte range of a file, verified against its version.
    Read {
        /// Request id.
        id: RequestId,
        /// The file.
        path: SharePath,
        /// The version the client expects (its root hash); another version is [`ErrorCode::Changed`].
        version: Option<[u8; 32]>,
        /// First byte.
        offset: u64,
        /// Bytes wanted (the range is cut at the end of the file).
        len: u64,
    },
    /// Change notifications from now on.
    Subscribe {
        /// Request id.
        id: RequestId,
    },
    /// Stop answering a request.
    Cancel {
        /// The request to cancel.
        id: RequestId,
    },
    /// The file or subtree `path`, sent with the transfer protocol once the sharer answers
    /// [`Response::Transfer`]: the connection's only request.
    Pull {
        /// Request id.
        id: RequestId,
        /// The file or directory (the share itself when empty).
        path: SharePath,
    },
    /// Write the file `path`: its content follows in [`Request::PutData`] packets (ranges inside `0..size`),
    /// then [`Request::PutEnd`]. Answered [`Response::Done`] once the file was replaced, or
    /// [`Response::Conflicted`] when the sharer's file changed meanwhile and the content was kept beside it.
    Put {
        /// Request id.
        id: RequestId,
        /// What it writes.
        put: PutHeader,
    },
    /// A range of a put's content.
    PutData {
        /// The put.
        id: RequestId,
        /// Where the bytes go.
        offset: u64,
        /// The bytes (at most [`MAX_PUT_DATA`]).
        bytes: Vec<u8>,
    },
    /// A put's content is complete: verify it against `root` and make it visible. The root comes last so
    /// that the client hashes the content as it sends it, not in a pass of its own before.
    PutEnd {
        /// The put.
        id: RequestId,
        /// The BLAKE3 root of the new content, checked before anything becomes visible.
        root: [u8; 32],
    },
    /// Create the directory `path`.
    Mkdir {
        /// Request id.
        id: RequestId,
        /// The new directory.
        path: SharePath,
        /// Its permission bits.
        mode: u32,
    },
    /// Remove the empty directory `path`.
    Rmdir {
        /// Request id.
        id: RequestId,
        /// The directory.
        path: SharePath,
    },
    /// Remove the file or symlink `path`.
    Unlink {
        /// Request id.
        id: RequestId,
        /// The file or symlink.
        path: SharePath,
        /// The root of the version the client means to remove: a file that is another version now stays, and
        /// the answer is [`ErrorCode::Conflict`]. `None`: whatever is there.
        base: Option<[u8; 32]>,
    },
    /// Rename `from` to `to`.
    Rename {
        /// Request id.
        id: RequestId,
        /// The path renamed.
        from: SharePath,
        /// Its new path.
        to: SharePath,
        /// Whether an existing `to` is replaced (otherwise it is [`ErrorCode::Exists`]).
        replace: bool,
        /// The version of the file at `to` the client last saw, when it replaces one it saw: a `to` that
        /// changed since stays, and `from` is kept beside it ([`Response::Conflicted`]).
        base: Option<[u8; 32]>,
    },
    /// Change the permission bits or modification time of `path` (a file or directory).
    SetAttr {
        /// Request id.
        id: RequestId,
        /// The path.
        path: SharePath,
        /// New permission bits.
        mode: Option<u32>,
        /// New modification time.
        mtime: Option<Time>,
    },
    /// The size and free space of the share's file system: answered [`Response::Space`].
    SpaceOf {
        /// Request id.
        id: RequestId,
    },
    /// Create a symlink at `path` pointing to `target`.
    Symlink {
        /// Request id.
        id: RequestId,
        /// The new symlink.
        path: SharePath,
        /// Its target, stored as given: relative, and never leading out of the share.
        target: Vec<u8>,
    },
}

/// What a [`Request::Put`] writes, all but its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutHeader {
    /// The file.
    pub path: SharePath,
    /// The root of the sharer's version the client's copy derives from; `None`: the client believes the path
    /// does not exist.
    pub base: Option<[u8; 32]>,
    /// Start from the base's content (cut or zero-extended to `size`) and apply only the ranges sent;
    /// otherwise the content is exactly the ranges sent, holes are zeros.
    pub from_base: bool,
    /// The new content's size.
    pub size: u64,
    /// Permission bits of the new file.
    pub mode: u32,
    /// Its modification time (`None`: the time it lands).
    pub mtime: Option<Time>,
}

/// A modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Time {
    /// Seconds since the epoch.
    pub secs: i64,
    /// Nanoseconds (below 1,000,000,000).
    pub nanos: u32,
}

/// Whether a symlink at `link` with `target` stays inside the share: the target is relative, free of NUL,
/// and resolved lexically from the link's directory it never climbs above the share. Every `..` must come
/// before the first name (`../../a/b`, not `a/../b`), so the `..`s only climb the real directories of the
/// link's own path.
pub fn link_target_inside_share(link: &[u8], target: &[u8]) -> bool {
    if target.is_empty() || target.len() > MAX_TARGET || target[0] == b'/' || target.contains(&0) {
        return false;
    }
    let (parent, _) = ferry_tree::path::split_parent(link);
    let mut depth = match parent.is_empty() {
        true => 0,
        false => parent.split(|&b| b == b'/').count(),
    };
    let mut seen_name = false;
    for comp in target.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." if seen_name || depth == 0 => return false,
            b".." => depth -= 1,
            _ => seen_name = true,
        }
    }
    true
}

/// A server's message. `Data` borrows its piece from the packet it was decoded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response<'a> {
    /// The server's hello.
    Hello(Hello),
    /// One page of a listing.
    Entries {
        /// The request.
        id: RequestId,
        /// The entries.
        entries: Vec<Entry>,
        /// Cursor of the next page, or [`END`].
        next: u64,
    },
    /// The attributes a stat asked for.
    Attr {
        /// The request.
        id: RequestId,
        /// The attributes.
        entry: Entry,
    },
    /// The version a read is served from.
    Version {
        /// The request.
        id: RequestId,
        /// The file's size in this version.
        size: u64,
        /// Its BLAKE3 root hash.
        root: [u8; 32],
    },
    /// A piece of a read: `len` bytes from `offset`, with their proof, encoded as the verification tree
    /// defines.
    Data {
        /// The request.
        id: RequestId,
        /// First byte of the piece.
        offset: u64,
        /// Data bytes in the piece.
        len: u32,
        /// The encoded piece.
        piece: &'a [u8],
    },
    /// The request is complete.
    Done {
        /// The request.
        id: RequestId,
    },
    /// Paths that changed.
    Changed {
        /// The subscription.
        id: RequestId,
        /// Changed paths.
        paths: Vec<SharePath>,
    },
    /// The request failed.
    Error {
        /// The request.
        id: RequestId,
        /// Why.
        code: ErrorCode,
        /// For people (untrusted text: escape before showing).
        message: String,
    },
    /// A pull's path was resolved: the next packets are the transfer protocol's (the sharer sends).
    Transfer {
        /// The pull.
        id: RequestId,
    },
    /// A put's content was verified but the sharer's file changed since its base: the sharer's file stayed
    /// and the content was kept beside it under `name` (in the same directory).
    Conflicted {
        /// The put, or the rename.
        id: RequestId,
        /// The sibling's name.
        name: Vec<u8>,
    },
    /// The size and free space of the share's file system.
    Space {
        /// The request.
        id: RequestId,
        /// The figures.
        space: Space,
    },
}

impl Hello {
    fn encode(&self, out: &mut impl Put) {
        out.put_u8(HELLO);
        out.put_u16(self.version);
        out.put_u32(self.max_in_flight);
        out.put_bytes16(&self.share);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Hello {
            version: r.u16()?,
            max_in_flight: r.u32()?,
            share: r.bytes16(MAX_NAME)?.to_vec(),
        })
    }
}

impl Request {
    /// Appends the message.
    pub fn encode(&self, out: &mut impl Put) {
        match self {
            Request::Hello(h) => h.encode(out),
            Request::List {
                id,
                path,
                cursor,
                max,
            } => {
                out.put_u8(LIST);
                out.put_u32(*id);
                path.encode(out);
                out.put_u64(*cursor);
                out.put_u32(*max);
            }
            Request::Stat { id, path } => {
                out.put_u8(STAT);
                out.put_u32(*id);
                path.encode(out);
            }
            Request::Read {
                id,
                path,
                version,
                offset,
                len,
            } => {
                out.put_u8(READ);
                out.put_u32(*id);
                path.encode(out);
                out.put_u8(u8::from(version.is_some()));
                out.put(&version.unwrap_or_default());
                out.put_u64(*offset);
                out.put_u64(*len);
            }
            Request::Subscribe { id } => {
                out.put_u8(SUBSCRIBE);
                out.put_u32(*id);
            }
            Request::Cancel { id } => {
                out.put_u8(CANCEL);
                out.put_u32(*id);
            }
            Request::Pull { id, path } => {
                out.put_u8(PULL);
                out.put_u32(*id);
                path.encode(out);
            }
            Request::Put { id, put } => {
                out.put_u8(PUT);
                out.put_u32(*id);
                put.path.encode(out);
                put_root(out, &put.base);
                out.put_u8(u8::from(put.from_base));
                out.put_u64(put.size);
                out.put_u32(put.mode);
                put_time(out, &put.mtime);
            }
            Request::PutData { id, offset, bytes } => {
                out.put(&put_data_header(*id, *offset));
                out.put(bytes);
            }
            Request::PutEnd { id, root } => {
                out.put_u8(PUT_END);
                out.put_u32(*id);
                out.put(root);
            }
            Request::Mkdir { id, path, mode } => {
                out.put_u8(MKDIR);
                out.put_u32(*id);
                path.encode(out);
                out.put_u32(*mode);
            }
            Request::Rmdir { id, path } => {
                out.put_u8(RMDIR);
                out.put_u32(*id);
                path.encode(out);
            }
            Request::Unlink { id, path, base } => {
                out.put_u8(UNLINK);
                out.put_u32(*id);
                path.encode(out);
                put_root(out, base);
            }
            Request::Rename {
                id,
                from,
                to,
                replace,
                base,
            } => {
                out.put_u8(RENAME);
                out.put_u32(*id);
                from.encode(out);
                to.encode(out);
                out.put_u8(u8::from(*replace));
                put_root(out, base);
            }
            Request::SetAttr {
                id,
                path,
                mode,
                mtime,
            } => {
                out.put_u8(SETATTR);
                out.put_u32(*id);
                path.encode(out);
                out.put_u8(u8::from(mode.is_some()));
                out.put_u32(mode.unwrap_or_default());
                put_time(out, mtime);
            }
            Request::Symlink { id, path, target } => {
                out.put_u8(SYMLINK);
                out.put_u32(*id);
                path.encode(out);
                out.put_bytes16(target);
            }
            Request::SpaceOf { id } => {
                out.put_u8(SPACE_OF);
                out.put_u32(*id);
            }
        }
    }

    /// Decodes one packet.
    pub fn decode(packet: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(packet);
        let req = match r.u8()? {
            HELLO => Request::Hello(Hello::decode(&mut r)?),
            LIST => {
                let id = r.u32()?;
                let path = SharePath::decode(&mut r)?;
                let cursor = r.u64()?;
                let max = r.u32()?;
                if max == 0 || max > MAX_PAGE_ENTRIES {
                    return Err(WireError::Invalid("page size").into());
                }
                Request::List {
                    id,
                    path,
                    cursor,
                    max,
                }
            }
            STAT => Request::Stat {
                id: r.u32()?,
                path: SharePath::decode(&mut r)?,
            },
            READ => {
                let id = r.u32()?;
                let path = SharePath::decode(&mut r)?;
                let has = r.u8()?;
                let root: [u8; 32] = r.array()?;
                let version = match has {
                    0 => None,
                    1 => Some(root),
                    _ => return Err(WireError::Invalid("version flag").into()),
                };
                let offset = r.u64()?;
                let len = r.u64()?;
                if offset.checked_add(len).is_none() {
                    return Err(WireError::Invalid("range").into());
                }
                Request::Read {
                    id,
                    path,
                    version,
                    offset,
                    len,
                }
            }
            SUBSCRIBE => Request::Subscribe { id: r.u32()? },
            SPACE_OF => Request::SpaceOf { id: r.u32()? },
            CANCEL => Request::Cancel { id: r.u32()? },
            PULL => Request::Pull {
                id: r.u32()?,
                path: SharePath::decode(&mut r)?,
            },
            PUT => {
                let id = r.u32()?;
                let path = SharePath::decode(&mut r)?;
                let base = get_root(&mut r)?;
                let from_base = get_flag(&mut r)?;
                let size = r.u64()?;
                let mode = r.u32()?;
                let mtime = get_time(&mut r)?;
                if from_base && base.is_none() {
                    return Err(WireError::Invalid("a put from no base").into());
                }
                let put = PutHeader {
                    path,
                    base,
                    from_base,
                    size,
                    mode,
                    mtime,
                };
                Request::Put { id, put }
            }
            PUT_DATA => {
                let (id, offset, bytes) = put_data(packet)?;
                return Ok(Request::PutData {
                    id,
                    offset,
                    bytes: bytes.to_vec(),
                });
            }
            PUT_END => Request::PutEnd {
                id: r.u32()?,
                root: r.array()?,
            },
            MKDIR => Request::Mkdir {
                id: r.u32()?,
                path: SharePath::decode(&mut r)?,
                mode: r.u32()?,
            },
            RMDIR => Request::Rmdir {
                id: r.u32()?,
                path: SharePath::decode(&mut r)?,
            },
            UNLINK => Request::Unlink {
                id: r.u32()?,
                path: SharePath::decode(&mut r)?,
                base: get_root(&mut r)?,
            },
            RENAME => Request::Rename {
                id: r.u32()?,
                from: SharePath::decode(&mut r)?,
                to: SharePath::decode(&mut r)?,
                replace: get_flag(&mut r)?,
                base: get_root(&mut r)?,
            },
            SETATTR => {
                let id = r.u32()?;
                let path = SharePath::decode(&mut r)?;
                let has_mode = get_flag(&mut r)?;
                let mode = r.u32()?;
                Request::SetAttr {
                    id,
                    path,
                    mode: has_mode.then_some(mode),
                    mtime: get_time(&mut r)?,
                }
            }
            SYMLINK => {
                let id = r.u32()?;
                let path = SharePath::decode(&mut r)?;
                let target = r.bytes16(MAX_TARGET)?.to_vec();
                if !link_target_inside_share(path.as_bytes(), &target) {
                    return Err(DecodeError::UnsafePath(PathProblem::Absolute));
                }
                Request::Symlink { id, path, target }
            }
            t => return Err(DecodeError::UnknownType(t)),
        };
        r.finish()?;
        Ok(req)
    }
}

/// Whether a client's packet is a [`PUT_DATA`] one (the bulk of a put), by its kind alone.
pub fn is_put_data(packet: &[u8]) -> bool {
    packet.first() == Some(&PUT_DATA)
}

/// Whether a client's packet, by its kind alone, is a request that only looks: a listing, a stat, a read or
/// the space. Such a request may be served before put data that came ahead of it (no one sees a put's
/// content before its end). Its content is checked when it is decoded, as any packet's. The jobs these
/// requests become are the ones [`crate::server::Server::next_job`] lets overtake put data: keep both lists
/// alike.
pub fn only_looks(packet: &[u8]) -> bool {
    matches!(packet.first(), Some(&(LIST | STAT | READ | SPACE_OF)))
}

/// The header of a [`PUT_DATA`] packet; its bytes follow.
pub fn put_data_header(id: RequestId, offset: u64) -> [u8; PUT_DATA_HEADER_LEN] {
    let mut h = [0u8; PUT_DATA_HEADER_LEN];
    h[0] = PUT_DATA;
    h[1..5].copy_from_slice(&id.to_le_bytes());
    h[5..13].copy_from_slice(&offset.to_le_bytes());
    h
}

/// A [`PUT_DATA`] packet's put, offset and bytes, borrowed (the server's path, without a copy).
pub fn put_data(packet: &[u8]) -> Result<(RequestId, u64, &[u8]), DecodeError> {
    let mut r = Reader::new(packet);
    if r.u8()? != PUT_DATA {
        return Err(WireError::Invalid("not put data").into());
    }
    let id = r.u32()?;
    let offset = r.u64()?;
    let bytes = r.rest();
    if bytes.len() > MAX_PUT_DATA {
        return Err(WireError::Invalid("put data too large").into());
    }
    if offset.checked_add(bytes.len() as u64).is_none() {
        return Err(WireError::Invalid("range").into());
    }
    Ok((id, offset, bytes))
}

fn put_root(out: &mut impl Put, root: &Option<[u8; 32]>) {
    out.put_u8(u8::from(root.is_some()));
    out.put(&root.unwrap_or_default());
}

fn get_flag(r: &mut Reader<'_>) -> Result<bool, DecodeError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(WireError::Invalid("flag").into()),
    }
}

fn get_root(r: &mut Reader<'_>) -> Result<Option<[u8; 32]>, DecodeError> {
    let has = get_flag(r)?;
    let root: [u8; 32] = r.array()?;
    Ok(has.then_some(root))
}

fn put_time(out: &mut impl Put, time: &Option<Time>) {
    out.put_u8(u8::from(time.is_some()));
    let t = time.unwrap_or(Time { secs: 0, nanos: 0 });
    out.put_i64(t.secs);
    out.put_u32(t.nanos);
}

fn get_time(r: &mut Reader<'_>) -> Result<Option<Time>, DecodeError> {
    let has = get_flag(r)?;
    let secs = r.i64()?;
    let nanos = r.u32()?;
    if nanos >= 1_000_000_000 {
        return Err(WireError::Invalid("nanoseconds").into());
    }
    Ok(has.then_some(Time { secs, nanos }))
}

impl Response<'_> {
    /// Appends the message. A `Data` message is usually built in place instead: [`data_header`] then the
    /// piece.
    pub fn encode(&self, out: &mut impl Put) {
        match self {
            Response::Hello(h) => h.encode(out),
            Response::Entries { id, entries, next } => {
                out.put_u8(ENTRIES);
                out.put_u32(*id);
                out.put_u32(entries.len() as u32);
                for e in entries {
                    e.encode(out);
                }
                out.put_u64(*next);
            }
            Response::Attr { id, entry } => {
                out.put_u8(ATTR);
                out.put_u32(*id);
                entry.encode(out);
            }
            Response::Version { id, size, root } => {
                out.put_u8(VERSION);
                out.put_u32(*id);
                out.put_u64(*size);
                out.put(root);
            }
            Response::Data {
                id,
                offset,
                len,
                piece,
            } => {
                data_header(out, *id, *offset, *len);
                out.put(piece);
            }
            Response::Done { id } => {
                out.put_u8(DONE);
                out.put_u32(*id);
            }
            Response::Changed { id, paths } => {
                out.put_u8(CHANGED);
                out.put_u32(*id);
                out.put_u32(paths.len() as u32);
                for p in paths {
                    p.encode(out);
                }
            }
            Response::Error { id, code, message } => {
                out.put_u8(ERROR);
                out.put_u32(*id);
                out.put_u8(code.to_u8());
                out.put_bytes16(ferry_wire::truncate_text(message, MAX_MESSAGE).as_bytes());
            }
            Response::Transfer { id } => {
                out.put_u8(TRANSFER);
                out.put_u32(*id);
            }
            Response::Conflicted { id, name } => {
                out.put_u8(CONFLICTED);
                out.put_u32(*id);
                out.put_bytes16(name);
            }
            Response::Space { id, space } => {
                out.put_u8(SPACE);
                out.put_u32(*id);
                space.encode(out);
            }
        }
    }
}

/// The id and raw path of a request with a path (a [`LIST`], [`STAT`], [`READ`], [`PULL`] or a write), read
/// without checking the path: to refuse a request whose path breaks the rules by its id.
pub fn request_path(packet: &[u8]) -> Option<(RequestId, &[u8])> {
    let mut r = Reader::new(packet);
    match r.u8().ok()? {
        LIST | STAT | READ | PULL | PUT | MKDIR | RMDIR | UNLINK | RENAME | SETATTR | SYMLINK => {
            Some((r.u32().ok()?, r.bytes16(MAX_PATH).ok()?))
        }
        _ => None,
    }
}

/// Writes the header of a [`DATA`] message; the encoded piece follows.
pub fn data_header(out: &mut impl Put, id: RequestId, offset: u64, len: u32) {
    out.put(&data_header_bytes(id, offset, len));
}

/// The header of a [`DATA`] message, to place in front of a piece built in place.
pub fn data_header_bytes(id: RequestId, offset: u64, len: u32) -> [u8; DATA_HEADER_LEN] {
    let mut h = [0u8; DATA_HEADER_LEN];
    h[0] = DATA;
    h[1..5].copy_from_slice(&id.to_le_bytes());
    h[5..13].copy_from_slice(&offset.to_le_bytes());
    h[13..].copy_from_slice(&len.to_le_bytes());
    h
}

/// Bytes of a [`DATA`] header.
pub const DATA_HEADER_LEN: usize = 1 + 4 + 8 + 4;

impl<'a> Response<'a> {
    /// Decodes one packet; a `Data` piece borrows from it.
    pub fn decode(packet: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(packet);
        let rsp = match r.u8()? {
            HELLO => Response::Hello(Hello::decode(&mut r)?),
            ENTRIES => {
                let id = r.u32()?;
                let n = r.count(MAX_PAGE_ENTRIES, MIN_ENTRY)?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    let e = Entry::decode(&mut r)?;
                    if e.name.is_empty() {
                        return Err(DecodeError::UnsafePath(PathProblem::Empty));
                    }
                    entries.push(e);
                }
                Response::Entries {
                    id,
                    entries,
                    next: r.u64()?,
                }
            }
            ATTR => Response::Attr {
                id: r.u32()?,
                entry: Entry::decode(&mut r)?,
            },
            VERSION => Response::Version {
                id: r.u32()?,
                size: r.u64()?,
                root: r.array()?,
            },
            DATA => {
                let id = r.u32()?;
                let offset = r.u64()?;
                let len = r.u32()?;
                if offset.checked_add(len as u64).is_none() {
                    return Err(WireError::Invalid("range").into());
                }
                Response::Data {
                    id,
                    offset,
                    len,
                    piece: r.rest(),
                }
            }
            DONE => Response::Done { id: r.u32()? },
            CHANGED => {
                let id = r.u32()?;
                let n = r.count(MAX_CHANGED, 2)?;
                let mut paths = Vec::with_capacity(n);
                for _ in 0..n {
                    paths.push(SharePath::decode(&mut r)?);
                }
                Response::Changed { id, paths }
            }
            ERROR => {
                let id = r.u32()?;
                let code = ErrorCode::from_u8(r.u8()?).ok_or(WireError::Invalid("error code"))?;
                // Each invalid byte becomes a three-byte replacement character: cut again, so that what is
                // decoded keeps the bound too (and encodes to itself).
                let lossy = String::from_utf8_lossy(r.bytes16(MAX_MESSAGE)?);
                let message = ferry_wire::truncate_text(&lossy, MAX_MESSAGE).to_owned();
                Response::Error { id, code, message }
            }
            TRANSFER => Response::Transfer { id: r.u32()? },
            SPACE => Response::Space {
                id: r.u32()?,
                space: Space::decode(&mut r)?,
            },
            CONFLICTED => {
                let id = r.u32()?;
                let name = r.bytes16(MAX_NAME)?;
                check_name(name).map_err(DecodeError::UnsafePath)?;
                if name.contains(&b'/') {
                    return Err(WireError::Invalid("name with a slash").into());
                }
                Response::Conflicted {
                    id,
                    name: name.to_vec(),
                }
            }
            t => return Err(DecodeError::UnknownType(t)),
        };
        r.finish()?;
        Ok(rsp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &[u8], kind: Kind) -> Entry {
        Entry {
            name: name.to_vec(),
            kind,
            size: if kind == Kind::File { 12345 } else { 0 },
            mode: 0o644,
            mtime: 1_795_000_000,
            mtime_nsec: 123,
            target: if kind == Kind::Symlink {
                b"../x".to_vec()
            } else {
                Vec::new()
            },
        }
    }

    fn requests() -> Vec<Request> {
        let p = SharePath::new(b"photos/2026/a.jpg").unwrap();
        vec![
            Request::Hello(Hello {
                version: PROTOCOL_VERSION,
                max_in_flight: 64,
                share: Vec::new(),
            }),
            Request::List {
                id: 1,
                path: SharePath::root(),
                cursor: 0,
                max: 100,
            },
            Request::Stat {
                id: 2,
                path: p.clone(),
            },
            Request::Read {
                id: 3,
                path: p.clone(),
                version: Some([9; 32]),
                offset: 4096,
                len: 4096,
            },
            Request::Read {
                id: 4,
                path: p,
                version: None,
                offset: 0,
                len: u64::MAX,
            },
            Request::Subscribe { id: 5 },
            Request::Cancel { id: 3 },
            Request::Pull {
                id: 6,
                path: SharePath::new(b"photos/2026").unwrap(),
            },
            Request::Put {
                id: 7,
                put: PutHeader {
                    path: SharePath::new(b"a/b.txt").unwrap(),
                    base: Some([3; 32]),
                    from_base: true,
                    size: 1 << 33,
                    mode: 0o640,
                    mtime: Some(Time {
                        secs: -5,
                        nanos: 999_999_999,
                    }),
                },
            },
            Request::Put {
                id: 8,
                put: PutHeader {
                    path: SharePath::new(b"new").unwrap(),
                    base: None,
                    from_base: false,
                    size: 0,
                    mode: 0o600,
                    mtime: None,
                },
            },
            Request::PutData {
                id: 7,
                offset: 4096,
                bytes: b"xyz".to_vec(),
            },
            Request::PutEnd {
                id: 7,
                root: [4; 32],
            },
            Request::Mkdir {
                id: 9,
                path: SharePath::new(b"d").unwrap(),
                mode: 0o755,
            },
            Request::Rmdir {
                id: 10,
                path: SharePath::new(b"d").unwrap(),
            },
            Request::Unlink {
                id: 11,
                path: SharePath::new(b"f").unwrap(),
                base: Some([1; 32]),
            },
            Request::Rename {
                id: 12,
                from: SharePath::new(b"f").unwrap(),
                to: SharePath::new(b"d/g").unwrap(),
                replace: true,
                base: Some([2; 32]),
            },
            Request::SetAttr {
                id: 13,
                path: SharePath::new(b"f").unwrap(),
                mode: Some(0o600),
                mtime: None,
            },
            Request::Symlink {
                id: 14,
                path: SharePath::new(b"d/l").unwrap(),
                target: b"../f".to_vec(),
            },
            Request::SpaceOf { id: 15 },
        ]
    }

    fn responses() -> Vec<Response<'static>> {
        vec![
            Response::Hello(Hello {
                version: PROTOCOL_VERSION,
                max_in_flight: 256,
                share: b"photos".to_vec(),
            }),
            Response::Entries {
                id: 1,
                entries: vec![
                    entry(b"a.jpg", Kind::File),
                    entry(b"dir", Kind::Dir),
                    entry(b"link", Kind::Symlink),
                ],
                next: END,
            },
            Response::Attr {
                id: 2,
                entry: entry(b"", Kind::Dir),
            },
            Response::Version {
                id: 3,
                size: 1 << 40,
                root: [7; 32],
            },
            Response::Data {
                id: 3,
                offset: 16384,
                len: 3,
                piece: b"abc",
            },
            Response::Done { id: 3 },
            Response::Changed {
                id: 5,
                paths: vec![SharePath::root(), SharePath::new(b"a/b").unwrap()],
            },
            Response::Error {
                id: 4,
                code: ErrorCode::Changed,
                message: "photos/a.jpg changed".into(),
            },
            Response::Transfer { id: 6 },
            Response::Conflicted {
                id: 7,
                name: b"b.txt.conflict-bob-20261124-130000".to_vec(),
            },
            Response::Space {
                id: 8,
                space: SPACE_SAMPLE,
            },
        ]
    }

    const SPACE_SAMPLE: Space = Space {
        block: 4096,
        blocks: 6_171_023,
        free: 5_055_879,
        available: 5_000_000,
        files: 3_085_511,
        files_free: 3_065_022,
    };

    #[test]
    fn space_out_of_bounds_is_refused() {
        let bad = [
            Space {
                block: 0,
                ..SPACE_SAMPLE
            },
            Space {
                block: 4095,
                ..SPACE_SAMPLE
            },
            Space {
                block: 256,
                ..SPACE_SAMPLE
            },
            Space {
                block: 32 << 20,
                ..SPACE_SAMPLE
            },
            Space {
                free: SPACE_SAMPLE.blocks + 1,
                ..SPACE_SAMPLE
            },
            Space {
                available: SPACE_SAMPLE.free + 1,
                ..SPACE_SAMPLE
            },
            Space {
                files_free: SPACE_SAMPLE.files + 1,
                ..SPACE_SAMPLE
            },
        ];
        for space in bad {
            let mut buf = Vec::new();
            Response::Space { id: 1, space }.encode(&mut buf);
            assert!(Response::decode(&buf).is_err(), "{space:?}");
        }
        // The edges are taken.
        for space in [
            Space {
                block: 512,
                ..SPACE_SAMPLE
            },
            Space {
                block: 16 << 20,
                ..SPACE_SAMPLE
            },
            Space {
                files: 0,
                files_free: 0,
                ..SPACE_SAMPLE
            },
            Space {
                free: SPACE_SAMPLE.blocks,
                available: SPACE_SAMPLE.blocks,
                ..SPACE_SAMPLE
            },
        ] {
            let mut buf = Vec::new();
            Response::Space { id: 1, space }.encode(&mut buf);
            assert_eq!(
                Response::decode(&buf).unwrap(),
                Response::Space { id: 1, space }
            );
        }
    }

    #[test]
    fn every_message_round_trips() {
        for req in requests() {
            let mut buf = Vec::new();
            req.encode(&mut buf);
            assert_eq!(Request::decode(&buf).unwrap(), req);
            if matches!(req, Request::PutData { .. }) {
                continue; // its bytes are the rest of the packet
            }
            for cut in 0..buf.len() {
                assert!(
                    Request::decode(&buf[..cut]).is_err(),
                    "{req:?} cut at {cut}"
                );
            }
            buf.push(0);
            assert!(
                Request::decode(&buf).is_err(),
                "trailing byte after {req:?}"
            );
        }
        for rsp in responses() {
            let mut buf = Vec::new();
            rsp.encode(&mut buf);
            assert_eq!(Response::decode(&buf).unwrap(), rsp);
            // A Data piece is the rest of the packet: every other message refuses a cut.
            if !matches!(rsp, Response::Data { .. }) {
                for cut in 0..buf.len() {
                    assert!(
                        Response::decode(&buf[..cut]).is_err(),
                        "{rsp:?} cut at {cut}"
                    );
                }
            }
        }
        for &code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_u8(code.to_u8()), Some(code));
        }
        assert_eq!(ErrorCode::from_u8(0), None);
    }

    /// Every wire value, written out: a reordered or renumbered list fails here, not in a peer.
    #[test]
    fn wire_values_are_pinned() {
        use ErrorCode as E;
        let codes = [
            (E::NotFound, 1),
            (E::WrongKind, 2),
            (E::UnsafePath, 3),
            (E::Changed, 4),
            (E::Permission, 5),
            (E::Busy, 6),
            (E::Io, 7),
            (E::BadRequest, 8),
            (E::Cancelled, 9),
            (E::ReadOnly, 10),
            (E::Conflict, 11),
            (E::Integrity, 12),
            (E::DiskFull, 13),
            (E::Exists, 14),
            (E::NotEmpty, 15),
            (E::HardLinked, 16),
        ];
        assert_eq!(codes.len(), ErrorCode::ALL.len(), "a code without a pin");
        for (code, byte) in codes {
            assert_eq!((code, code.to_u8()), (code, byte));
            assert_eq!(ErrorCode::from_u8(byte), Some(code));
            let mut buf = Vec::new();
            Response::Error {
                id: 7,
                code,
                message: "m".into(),
            }
            .encode(&mut buf);
            assert_eq!(buf[5], byte, "{code:?} on the wire");
        }
        let kinds = [(Kind::File, 0), (Kind::Dir, 1), (Kind::Symlink, 2)];
        assert_eq!(kinds.len(), Kind::ALL.len(), "a kind without a pin");
        for (kind, byte) in kinds {
            assert_eq!((kind, kind.to_u8()), (kind, byte));
            assert_eq!(Kind::from_u8(byte), Some(kind));
        }
        let types = [
            (HELLO, 1),
            (LIST, 2),
            (STAT, 3),
            (READ, 4),
            (SUBSCRIBE, 5),
            (CANCEL, 6),
            (PULL, 7),
            (PUT, 8),
            (PUT_DATA, 9),
            (PUT_END, 10),
            (MKDIR, 11),
            (RMDIR, 12),
            (UNLINK, 13),
            (RENAME, 14),
            (SETATTR, 15),
            (SYMLINK, 16),
            (SPACE_OF, 17),
            (ENTRIES, 64),
            (ATTR, 65),
            (VERSION, 66),
            (DATA, 67),
            (DONE, 68),
            (CHANGED, 69),
            (ERROR, 70),
            (TRANSFER, 71),
            (CONFLICTED, 72),
            (SPACE, 73),
        ];
        for (constant, byte) in types {
            assert_eq!(constant, byte);
        }
    }

    /// Found by the `share_response` fuzz target: invalid UTF-8 in an error message grew past the bound as it
    /// was replaced, and the message no longer encoded to itself.
    #[test]
    fn an_error_message_of_invalid_utf8_keeps_its_bound_and_round_trips() {
        let mut buf = vec![ERROR, 1, 0, 0, 0, ErrorCode::Io.to_u8()];
        buf.put_bytes16(&[0xff; MAX_MESSAGE]);
        let rsp = Response::decode(&buf).unwrap();
        let Response::Error { message, .. } = &rsp else {
            panic!("{rsp:?}");
        };
        assert!(message.len() <= MAX_MESSAGE, "{} bytes", message.len());
        let mut again = Vec::new();
        rsp.encode(&mut again);
        assert_eq!(Response::decode(&again).unwrap(), rsp);
    }

    #[test]
    fn hostile_paths_and_fields_are_refused() {
        for bad in [&b"../etc"[..], b"/etc", b"a//b", b"a/./b", b"a\0b", b"a/.."] {
            for kind in [STAT, PULL] {
                let mut buf = vec![kind, 1, 0, 0, 0];
                buf.put_bytes16(bad);
                assert!(
                    matches!(Request::decode(&buf), Err(DecodeError::UnsafePath(_))),
                    "{bad:?}"
                );
                assert_eq!(request_path(&buf), Some((1, bad)));
            }
        }
        // An entry named "..", or with a slash, in a listing.
        for bad in [&b".."[..], b"a/b", b""] {
            let mut e = entry(b"x", Kind::File);
            e.name = bad.to_vec();
            let mut buf = Vec::new();
            Response::Entries {
                id: 1,
                entries: vec![e],
                next: END,
            }
            .encode(&mut buf);
            assert!(Response::decode(&buf).is_err(), "{bad:?}");
        }
        // A directory with a size, a bad kind, a huge count.
        let mut dir = entry(b"d", Kind::Dir);
        dir.size = 1;
        let mut buf = Vec::new();
        Response::Attr { id: 1, entry: dir }.encode(&mut buf);
        assert!(Response::decode(&buf).is_err());
        let mut buf = vec![ENTRIES, 1, 0, 0, 0];
        buf.put_u32(MAX_PAGE_ENTRIES);
        assert!(Response::decode(&buf).is_err());
        // A read whose range overflows, a page of zero entries.
        let mut buf = Vec::new();
        Request::Read {
            id: 1,
            path: SharePath::root(),
            version: None,
            offset: u64::MAX,
            len: 2,
        }
        .encode(&mut buf);
        assert!(Request::decode(&buf).is_err());
        let mut buf = Vec::new();
        Request::List {
            id: 1,
            path: SharePath::root(),
            cursor: 0,
            max: 0,
        }
        .encode(&mut buf);
        assert!(Request::decode(&buf).is_err());
    }

    #[test]
    fn hostile_writes_are_refused() {
        // Symlinks out of the share, absolute or climbing past it.
        for (link, target) in [
            (&b"l"[..], &b"../x"[..]),
            (b"l", b"/etc"),
            (b"d/l", b"../../x"),
            (b"d/l", b"a/../../x"),
            (b"d/l", b""),
        ] {
            let mut buf = Vec::new();
            Request::Symlink {
                id: 1,
                path: SharePath::new(link).unwrap(),
                target: target.to_vec(),
            }
            .encode(&mut buf);
            assert!(
                matches!(Request::decode(&buf), Err(DecodeError::UnsafePath(_))),
                "{target:?}"
            );
            assert_eq!(request_path(&buf), Some((1, link)));
        }
        for (link, target) in [
            (&b"l"[..], &b"a/b"[..]),
            (b"d/l", b"../x"),
            (b"d/e/l", b"../../x"),
        ] {
            assert!(link_target_inside_share(link, target), "{target:?}");
        }
        // Too much data in one packet, a range that overflows, a put from no base.
        let mut big = put_data_header(1, 0).to_vec();
        big.resize(PUT_DATA_HEADER_LEN + MAX_PUT_DATA + 1, 0);
        assert!(Request::decode(&big).is_err());
        let mut wrap = put_data_header(1, u64::MAX).to_vec();
        wrap.push(0);
        assert!(Request::decode(&wrap).is_err());
        let mut buf = Vec::new();
        Request::Put {
            id: 1,
            put: PutHeader {
                path: SharePath::new(b"f").unwrap(),
                base: Some([0; 32]),
                from_base: true,
                size: 0,
                mode: 0,
                mtime: None,
            },
        }
        .encode(&mut buf);
        let flag = 1 + 4 + 2 + 1;
        buf[flag] = 0; // no base, yet from it
        assert!(Request::decode(&buf).is_err());
        // A conflict name with a slash or `..`.
        for bad in [&b"a/b"[..], b"..", b""] {
            let mut buf = vec![CONFLICTED, 1, 0, 0, 0];
            buf.put_bytes16(bad);
            assert!(Response::decode(&buf).is_err(), "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn decoding_any_bytes_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            let _ = Request::decode(&bytes);
            let _ = Response::decode(&bytes);
        }
    }
}
