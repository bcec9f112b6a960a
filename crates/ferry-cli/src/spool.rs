//! `ferry send -` and `ferry send --text`: data that is not a file, made into one.
//!
//! The offer announces every file's size before any data moves, and a file is verified (and can be
//! resumed) by its hash, so standard input is first copied ("spooled") into an unnamed temporary
//! file in `$TMPDIR` (`O_TMPFILE`: nothing to clean up, whatever way the process ends) and sent as
//! one file. A streaming mode without a size up front would save the copy but lose the size in
//! the question, the resume and the progress bar's total. The engine opens its sources by path:
//! the unnamed file is reached as `/proc/self/fd/N` while this process holds it open.

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, IsTerminal, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use ferry_transfer::manifest::{Source, MODE_MASK};
use ferry_transfer::wire::MAX_TEXT;
use ferry_transfer::{Entry, EntryKind, Manifest, TransferError, Walk};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::failure::Usage;

/// The name standard input gets without `--name`.
pub const STDIN_NAME: &str = "stdin";
/// The name of a text message's one file (seen only when the receiver writes it, with `-o NAME`).
const TEXT_NAME: &str = "text";

/// `PATH` arguments that mean standard input.
pub fn is_stdin(paths: &[PathBuf]) -> bool {
    paths.iter().any(|p| p.as_os_str() == "-")
}

/// Checks the command line of `ferry send` for standard input and text before anything happens:
/// `-` alone, `--name` only with `-` and a valid name, and no terminal on standard input.
pub fn check_args(
    paths: &[PathBuf],
    text: Option<&str>,
    name: Option<&OsStr>,
) -> Result<(), Usage> {
    let stdin = is_stdin(paths) || text == Some("-");
    if is_stdin(paths) && paths.len() > 1 {
        return Err(Usage(
            "`-` (standard input) is sent alone; send the other paths from another command".into(),
        ));
    }
    if let Some(name) = name {
        if !is_stdin(paths) {
            return Err(Usage(
                "--name names the data of `ferry send -` (standard input) and goes only with `-`"
                    .into(),
            ));
        }
        check_file_name("--name", name)?;
    }
    if stdin && io::stdin().is_terminal() {
        return Err(Usage(
            "stdin is a terminal; pipe data in or give a path".into(),
        ));
    }
    Ok(())
}

/// Checks a name given on the command line (`send --name`, `receive -o`) as a received name is
/// checked, and that it is one name, without `/`.
pub fn check_file_name(flag: &str, name: &OsStr) -> Result<(), Usage> {
    let problem = match ferry_tree::path::check_name(name.as_bytes()) {
        Err(problem) => problem.to_string(),
        Ok(()) if name.as_bytes().contains(&b'/') => "a name has no `/`".into(),
        Ok(()) => return Ok(()),
    };
    Err(Usage(format!(
        "{flag} {name:?} is not a file name: {problem}"
    )))
}

/// What `ferry send` offers when it is not a walk of paths: one spooled file, which must stay open
/// until the send ends.
pub struct Spooled {
    /// The offer: one file.
    pub walked: Walk,
    /// The unnamed file the manifest's source names.
    _file: File,
}

/// Spools standard input as one file named `name` (default [`STDIN_NAME`]), with a progress line
/// on a terminal's stderr unless `quiet`.
pub fn stdin(name: Option<&OsStr>, quiet: bool) -> anyhow::Result<Spooled> {
    let name = name.unwrap_or(OsStr::new(STDIN_NAME));
    spool(&mut io::stdin().lock(), name, None, quiet)
}

/// How much of a text message over the limit is read to say its size.
const MEASURED_MOST: u64 = 1 << 30;

/// A text message (`-`: read from standard input) as one file of at most [`MAX_TEXT`] bytes.
pub fn text(text: &str, quiet: bool) -> anyhow::Result<Spooled> {
    let name = OsStr::new(TEXT_NAME);
    if text == "-" {
        spool(&mut io::stdin().lock(), name, Some(MAX_TEXT), quiet)
    } else {
        spool(&mut text.as_bytes(), name, Some(MAX_TEXT), quiet)
    }
}

/// Copies `input` into an unnamed temporary file (at most `limit` bytes) and makes it an offer of
/// one file named `name`.
fn spool(
    input: &mut dyn Read,
    name: &OsStr,
    limit: Option<u64>,
    quiet: bool,
) -> anyhow::Result<Spooled> {
    let dir = std::env::temp_dir();
    let mut file = unnamed_file(&dir).with_context(|| {
        format!(
            "cannot create a temporary file in {} to hold standard input (set TMPDIR)",
            dir.display()
        )
    })?;
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(10));
        bar.set_style(
            ProgressStyle::with_template("reading standard input: {bytes} ({bytes_per_sec})")
                .expect("valid template"),
        );
        bar
    };
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(anyhow::Error::new(e).context("cannot read standard input")),
        };
        size += n as u64;
        if let Some(limit) = limit.filter(|&l| size > l) {
            bar.finish_and_clear();
            // The whole size, not the part read when the limit was passed; an endless input is not
            // read for ever.
            while size < MEASURED_MOST {
                match input.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => size += n as u64,
                }
            }
            return Err(TransferError::TextTooLarge { size, limit }.into());
        }
        file.write_all(&buf[..n]).map_err(|e| {
            let full = matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT));
            let why = if full {
                format!(
                    "the temporary space in {} ran out after {size} bytes of standard input (set TMPDIR to a larger file system)",
                    dir.display()
                )
            } else {
                format!("cannot write standard input to a temporary file in {}", dir.display())
            };
            anyhow::Error::new(e).context(why)
        })?;
        bar.set_position(size);
    }
    bar.finish_and_clear();
    // The file's own times: the sender checks them again after the last byte, as for any file.
    let meta = file
        .metadata()
        .context("cannot stat the temporary copy of standard input")?;
    let manifest = Manifest {
        entries: vec![Entry {
            path: name.as_bytes().to_vec(),
            kind: EntryKind::File,
            size,
            // As a shell's `> file` makes it under the usual umask; the receiver applies its own.
            mode: 0o644 & MODE_MASK,
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec().clamp(0, 999_999_999) as u32,
            target: Vec::new(),
        }],
        sources: vec![Source::new(
            PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())),
            &meta,
        )],
        ..Default::default()
    };
    Ok(Spooled {
        walked: Walk {
            manifest,
            warnings: Vec::new(),
        },
        _file: file,
    })
}

/// An unnamed file in `dir` (`O_TMPFILE`), or, where the file system has none, a named one removed
/// at once.
fn unnamed_file(dir: &Path) -> io::Result<File> {
    let unnamed = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE | libc::O_EXCL)
        .mode(0o600)
        .open(dir);
    match unnamed {
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
            ) => {}
        other => return other,
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut path = OsString::from(format!(".ferry-stdin-{}-{nanos}", std::process::id()));
    path = dir.join(path).into_os_string();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}
