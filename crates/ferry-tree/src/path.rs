//! Rules for received names (security property 7).
//!
//! A wire path is a `/`-separated relative path of raw bytes. Because the separator is `/`, a `/`
//! inside a name can only arrive as nesting, and nesting needs a declared parent directory
//! (checked in [`crate::manifest`]), so the rules here are about the components themselves.

/// Longest name of one path component, in bytes.
pub const MAX_NAME: usize = 255;
/// Longest whole path, in bytes.
pub const MAX_PATH: usize = 4096;
/// Longest symlink target, in bytes.
pub const MAX_TARGET: usize = 4096;

/// Which name rule a path breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathProblem {
    /// The path is empty.
    #[error("empty path")]
    Empty,
    /// The path starts with `/`.
    #[error("absolute path")]
    Absolute,
    /// The path has an empty component (`a//b` or a trailing `/`).
    #[error("empty component")]
    EmptyComponent,
    /// The path has a `.` component.
    #[error("`.` component")]
    Dot,
    /// The path has a `..` component.
    #[error("`..` component")]
    DotDot,
    /// A name contains a NUL byte.
    #[error("nul byte in a name")]
    Nul,
    /// A name is longer than [`MAX_NAME`] bytes.
    #[error("name longer than 255 bytes")]
    NameTooLong,
    /// The path is longer than [`MAX_PATH`] bytes.
    #[error("path longer than 4096 bytes")]
    PathTooLong,
}

/// Checks one wire path against every name rule that applies on this platform.
pub fn check_path(path: &[u8]) -> Result<(), PathProblem> {
    if path.is_empty() {
        return Err(PathProblem::Empty);
    }
    if path.len() > MAX_PATH {
        return Err(PathProblem::PathTooLong);
    }
    if path[0] == b'/' {
        return Err(PathProblem::Absolute);
    }
    for name in path.split(|&b| b == b'/') {
        check_name(name)?;
    }
    Ok(())
}

/// Checks one component (a name without `/`).
pub fn check_name(name: &[u8]) -> Result<(), PathProblem> {
    match name {
        b"" => Err(PathProblem::EmptyComponent),
        b"." => Err(PathProblem::Dot),
        b".." => Err(PathProblem::DotDot),
        _ if name.len() > MAX_NAME => Err(PathProblem::NameTooLong),
        _ if name.contains(&0) => Err(PathProblem::Nul),
        _ => Ok(()),
    }
}

/// Splits a wire path into (parent, name); the parent of a top-level entry is empty.
pub fn split_parent(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

/// Whether a symlink at `link` (a checked wire path) with `target` stays inside the tree of the
/// link's top-level entry.
///
/// The target is resolved lexically relative to the link's directory. To keep that lexical answer
/// true on disk, where a component may itself be a symlink, the target must be relative, free of
/// NUL, and every `..` must come before the first name (`../../a/b`, not `a/../b`): the `..`s then
/// only climb real directories of the link's own path, and every name below them is an entry of
/// the same tree whose own symlinks obey the same rule. A top-level symlink has no tree to stay in.
pub fn symlink_target_inside(link: &[u8], target: &[u8]) -> bool {
    if target.is_empty() || target.len() > MAX_TARGET || target[0] == b'/' || target.contains(&0) {
        return false;
    }
    let (parent, _) = split_parent(link);
    if parent.is_empty() {
        return false;
    }
    let mut depth = parent.split(|&b| b == b'/').count();
    let mut seen_name = false;
    for comp in target.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => {
                if seen_name {
                    return false;
                }
                depth -= 1;
                if depth == 0 {
                    return false;
                }
            }
            _ => seen_name = true,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_rules() {
        assert_eq!(check_path(b"a/b c/\xe2\x9c\x93\n"), Ok(()));
        assert_eq!(check_path(b""), Err(PathProblem::Empty));
        assert_eq!(check_path(b"/etc"), Err(PathProblem::Absolute));
        assert_eq!(check_path(b"a//b"), Err(PathProblem::EmptyComponent));
        assert_eq!(check_path(b"a/"), Err(PathProblem::EmptyComponent));
        assert_eq!(check_path(b"a/./b"), Err(PathProblem::Dot));
        assert_eq!(check_path(b"a/../../b"), Err(PathProblem::DotDot));
        assert_eq!(check_path(b"a\0b"), Err(PathProblem::Nul));
        assert_eq!(check_path(&[b'x'; 256]), Err(PathProblem::NameTooLong));
        let long: Vec<u8> = [&[b'x'; 200][..], b"/"].concat().repeat(21);
        assert_eq!(
            check_path(&long[..long.len() - 1]),
            Err(PathProblem::PathTooLong)
        );
    }

    #[test]
    fn symlink_rules() {
        assert!(symlink_target_inside(b"top/link", b"file"));
        assert!(symlink_target_inside(b"top/a/link", b"../b/file"));
        assert!(symlink_target_inside(b"top/a/link", b".."));
        assert!(symlink_target_inside(b"top/a/link", b"./x/"));
        assert!(!symlink_target_inside(b"top/link", b".."));
        assert!(!symlink_target_inside(b"top/a/link", b"../../x"));
        assert!(!symlink_target_inside(b"top/link", b"/etc/passwd"));
        assert!(!symlink_target_inside(b"top/a/link", b"b/../../.."));
        assert!(!symlink_target_inside(b"top/link", b"a/../b"));
        assert!(!symlink_target_inside(b"link", b"x"));
        assert!(!symlink_target_inside(b"top/link", b""));
    }
}
