//! What the user sees: a progress bar on a terminal, or one JSON event per line with `--json`.

use std::io::Write;
use std::time::{Duration, Instant};

use ferry_transfer::{Entry, Progress, ProgressState, Totals};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

/// Progress events are rate-limited to this interval in JSON mode (`FERRY_PROGRESS_MS` overrides it).
const JSON_PROGRESS_EVERY: Duration = Duration::from_millis(200);

fn json_progress_interval() -> Duration {
    std::env::var("FERRY_PROGRESS_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
        .unwrap_or(JSON_PROGRESS_EVERY)
}

/// The output mode of one command.
pub struct Ui {
    json: bool,
    bar: Option<ProgressBar>,
    last_json: Option<Instant>,
    json_every: Duration,
    /// "sent" or "received", for the summary line.
    verb: &'static str,
    started: Instant,
}

/// `n` and the noun, plural unless `n` is 1: "1 file", "0 files", "2 directories".
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Human-readable bytes (binary units).
pub fn human_bytes(n: u64) -> String {
    indicatif::HumanBytes(n).to_string()
}

impl Ui {
    /// A UI printing JSON lines (`json`) or text and a progress bar.
    pub fn new(json: bool, verb: &'static str) -> Self {
        Ui {
            json,
            bar: None,
            last_json: None,
            json_every: json_progress_interval(),
            verb,
            started: Instant::now(),
        }
    }

    /// True in `--json` mode.
    pub fn is_json(&self) -> bool {
        self.json
    }

    /// Emits one JSON event (in JSON mode) on stdout.
    pub fn event(&self, event: &str, mut fields: Value) {
        if !self.json {
            return;
        }
        if let Value::Object(map) = &mut fields {
            map.insert("event".to_string(), Value::String(event.to_string()));
        }
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{fields}");
        let _ = out.flush();
    }

    /// A line of information for people: stderr in text mode, nothing in JSON mode.
    pub fn info(&self, line: &str) {
        if !self.json {
            self.suspend(|| eprintln!("{line}"));
        }
    }

    /// A warning: stderr in text mode, a `warning` event in JSON mode.
    pub fn warn(&self, line: &str) {
        if self.json {
            self.event("warning", json!({ "message": line }));
        } else {
            self.suspend(|| eprintln!("warning: {line}"));
        }
    }

    fn suspend(&self, f: impl FnOnce()) {
        match &self.bar {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    /// Reports a failure: an `error` event with its stable code, or one clear line.
    pub fn error(&mut self, code: &str, message: &str) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
        }
        if self.json {
            self.event("error", json!({ "code": code, "message": message }));
        } else {
            eprintln!("ferry: {message}");
        }
    }

    fn offer_fields(totals: &Totals) -> Value {
        json!({ "files": totals.files, "dirs": totals.dirs, "symlinks": totals.symlinks, "bytes": totals.bytes })
    }

    fn start_bar(&mut self, totals: &Totals) {
        if self.json || self.bar.is_some() {
            return;
        }
        let bar = ProgressBar::with_draw_target(
            Some(totals.bytes),
            ProgressDrawTarget::stderr_with_hz(10),
        );
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        self.bar = Some(bar);
    }
}

impl Progress for Ui {
    fn offer(&mut self, state: &ProgressState) {
        self.event("offer", Self::offer_fields(&state.totals));
        self.start_bar(&state.totals);
        self.started = Instant::now();
    }

    fn progress(&mut self, state: &ProgressState, current: &Entry) {
        if let Some(bar) = self.bar.as_ref().filter(|b| !b.is_hidden()) {
            bar.set_position(state.bytes_done);
            bar.set_message(format!("{}/{} files", state.files_done, state.totals.files));
        }
        if self.json {
            let now = Instant::now();
            if self
                .last_json
                .is_some_and(|t| now.duration_since(t) < self.json_every)
            {
                return;
            }
            self.last_json = Some(now);
            self.event(
                "progress",
                json!({
                    "bytes_done": state.bytes_done,
                    "bytes_total": state.totals.bytes,
                    "bytes_resumed": state.bytes_resumed,
                    "files_done": state.files_done,
                    "files_total": state.totals.files,
                    "current": current.path_lossy(),
                }),
            );
        }
    }

    fn file_done(&mut self, state: &ProgressState, entry: &Entry) {
        // Called once per file, tens of thousands of times a second for small files: nothing is
        // formatted that nobody will see.
        if let Some(bar) = self.bar.as_ref().filter(|b| !b.is_hidden()) {
            bar.set_position(state.bytes_done);
            bar.set_message(format!("{}/{} files", state.files_done, state.totals.files));
        }
        if self.json {
            self.event(
                "file-done",
                json!({ "path": entry.path_lossy(), "bytes": entry.size, "files_done": state.files_done }),
            );
        }
    }

    fn done(&mut self, state: &ProgressState) {
        let secs = self.started.elapsed().as_secs_f64();
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let rate = state.bytes_done as f64 / secs.max(1e-9);
        if self.json {
            self.event(
                "done",
                json!({
                    "files": state.totals.files,
                    "bytes": state.totals.bytes,
                    "bytes_resumed": state.bytes_resumed,
                    "seconds": secs,
                }),
            );
        } else {
            let resumed = if state.bytes_resumed > 0 {
                format!(
                    " ({} kept from an earlier run)",
                    human_bytes(state.bytes_resumed)
                )
            } else {
                String::new()
            };
            eprintln!(
                "done: {} {}, {}{resumed} in {secs:.2} s ({}/s), verified",
                self.verb,
                count(state.totals.files, "file", "files"),
                human_bytes(state.totals.bytes),
                human_bytes(rate as u64),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn counts_read_as_english() {
        assert_eq!(count(1, "file", "files"), "1 file");
        assert_eq!(count(0, "file", "files"), "0 files");
        assert_eq!(count(2, "directory", "directories"), "2 directories");
    }
}
