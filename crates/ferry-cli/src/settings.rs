//! `$XDG_CONFIG_HOME/ferry/config.toml`: defaults that flags and environment variables override.
//!
//! ```toml
//! relay = "relay.example.net:7440"   # used when neither --relay nor FERRY_RELAY is given
//! no_discovery = true                # same as FERRY_NO_DISCOVERY=1
//! ```

use std::path::PathBuf;

use anyhow::Context;
use serde::Deserialize;

/// Settings read from the config file; every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Default relay, `HOST:PORT`.
    pub relay: Option<String>,
    /// Keep multicast discovery off.
    pub no_discovery: Option<bool>,
}

/// Largest config file read.
const MAX_CONFIG: u64 = 64 << 10;

/// The config directory: `$XDG_CONFIG_HOME/ferry` or `~/.config/ferry`.
pub fn config_dir() -> Option<PathBuf> {
    match std::env::var_os("XDG_CONFIG_HOME") {
        Some(d) if !d.is_empty() => Some(PathBuf::from(d).join("ferry")),
        _ => std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/ferry")),
    }
}

/// ferry's cache directory: `$XDG_CACHE_HOME/ferry` or `~/.cache/ferry`.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("XDG_CACHE_HOME") {
        Some(d) if !d.is_empty() => Some(PathBuf::from(d).join("ferry")),
        _ => std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ferry")),
    }
}

impl Settings {
    /// Reads the config file; a missing file gives the defaults, a broken one a clear error.
    pub fn load() -> anyhow::Result<Settings> {
        let Some(path) = config_dir().map(|d| d.join("config.toml")) else {
            return Ok(Settings::default());
        };
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Settings::default()),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
            Ok(m) if m.len() > MAX_CONFIG => {
                anyhow::bail!("{} is larger than 64 KiB", path.display())
            }
            Ok(_) => {}
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        toml::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "invalid config file {}{}",
                path.display(),
                one_line_toml_error(&text, &e)
            )
        })
    }
}

/// A TOML error on one line, `, line L, column C: WHAT`: its own rendering spans several lines (the line
/// quoted, a caret under it), which an error line would show as `\x0a` escapes.
fn one_line_toml_error(text: &str, e: &toml::de::Error) -> String {
    let at = e.span().map_or(String::new(), |span| {
        let before = &text.as_bytes()[..span.start.min(text.len())];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
        format!(", line {line}, column {column}")
    });
    let what: Vec<&str> = e
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    format!("{at}: {}", what.join("; "))
}

#[cfg(test)]
mod tests {
    use super::{one_line_toml_error, Settings};

    #[test]
    fn a_toml_error_is_one_line_with_its_position() {
        let text = "relay = \"r.example:7440\"\nno_discovery = maybe\n";
        let e = toml::from_str::<Settings>(text).unwrap_err();
        let line = one_line_toml_error(text, &e);
        assert!(line.starts_with(", line 2, column 16: "), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }
}
