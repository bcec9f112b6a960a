//! What the user sees: a progress bar on a terminal, or one JSON event per line with `--json`.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use ferry_transfer::{Entry, EntryKind, Offer, Progress, ProgressState, Totals};
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
    /// When the offer was accepted: rate, ETA and the total time count from here, not from the offer
    /// (the time a person spends at the question is no transfer time).
    started: Instant,
    /// When the bar's rate and ETA were last computed.
    last_rate: Option<Instant>,
    /// Entries the walk skipped before the offer (counted in the summary with those skipped later).
    pub skipped_before: u64,
    /// Whether the text line saying how the peer was reached is shown (`ferry ls` shows it with `-v` only:
    /// its output is the listing).
    pub show_path: bool,
}

/// Bytes per second, counting only bytes moved in this run (not those kept from an earlier one, nor
/// identical files skipped).
fn rate(state: &ProgressState, secs: f64) -> f64 {
    let moved = state
        .bytes_done
        .saturating_sub(state.bytes_resumed + state.bytes_skipped);
    moved as f64 / secs.max(1e-3)
}

/// The bar's words after the byte counts: rate, ETA and files.
fn bar_message(state: &ProgressState, secs: f64) -> String {
    let rate = rate(state, secs);
    let left = state.totals.bytes.saturating_sub(state.bytes_done);
    let eta = if rate >= 1.0 {
        format!(
            "{:#}",
            indicatif::HumanDuration(Duration::from_secs_f64(left as f64 / rate))
        )
    } else {
        "?".to_string()
    };
    format!(
        "{}/s ETA {eta} {}/{} files",
        human_bytes(rate as u64),
        state.files_done,
        state.totals.files
    )
}

/// `n` and the noun, plural unless `n` is 1: "1 file", "0 files", "2 directories".
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// "3 directories", and ", 1 symlink" after it when there are any (most offers hold none).
pub fn dirs_and_symlinks(t: &Totals) -> String {
    let dirs = count(t.dirs, "directory", "directories");
    match t.symlinks {
        0 => dirs,
        n => format!("{dirs}, {}", count(n, "symlink", "symlinks")),
    }
}

/// Whether `c` must not reach a terminal as it is: C0 controls (newline included: a peer's
/// newline could start a fake line), DEL, C1 controls (U+0080-U+009F, CSI among them), the
/// bidirectional controls that reorder what is shown (U+061C, U+200E/F, U+202A-U+202E,
/// U+2066-U+2069), and the Unicode line and paragraph separators.
fn unsafe_on_terminal(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// `s` made safe to show on a terminal: every character of [`unsafe_on_terminal`] becomes a
/// visible escape (`\x1b`, `\u{202e}`). The one function for every string a peer can influence
/// (its error text, offered names, messages); JSON output is not escaped here (serde does).
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_on_terminal) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if !unsafe_on_terminal(c) {
            out.push(c);
        } else if (c as u32) < 0x100 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:04x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// Bytes a peer or a file system named (a file name: any bytes but `/` and NUL) shown as [`escape`] shows
/// text, with each byte that is not part of valid UTF-8 as `\\xNN`, so that the name can be typed back
/// (`$'bad\\xffname'` in bash) and two different names never look the same for that reason.
pub fn escape_bytes(b: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(b) {
        return escape(s);
    }
    let mut out = String::with_capacity(b.len() + 16);
    for chunk in b.utf8_chunks() {
        out.push_str(&escape(chunk.valid()));
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02x}");
        }
    }
    Cow::Owned(out)
}

/// [`escape`] for text of several lines: each line escaped, the line breaks kept.
fn escape_lines(s: &str) -> String {
    s.split('\n').map(escape).collect::<Vec<_>>().join("\n")
}

/// Shows a received text message: a `text` event with `--json` (invalid UTF-8 replaced by U+FFFD);
/// on a terminal, escaped like any peer text except that line breaks and tabs stay, ending with a
/// line break; to a pipe or file, its exact bytes and nothing else.
pub fn show_text(ui: &Ui, text: &[u8]) {
    if ui.is_json() {
        ui.event("text", json!({ "text": String::from_utf8_lossy(text) }));
        return;
    }
    let mut out = std::io::stdout().lock();
    if !out.is_terminal() {
        let _ = out.write_all(text).and_then(|_| out.flush());
        return;
    }
    let lossy = String::from_utf8_lossy(text);
    let mut shown = lossy
        .split('\n')
        .map(|line| line.split('\t').map(escape).collect::<Vec<_>>().join("\t"))
        .collect::<Vec<_>>()
        .join("\n");
    if !shown.ends_with('\n') {
        shown.push('\n');
    }
    let _ = out.write_all(shown.as_bytes()).and_then(|_| out.flush());
}

/// Prints one JSON event on stdout.
pub fn print_event(event: &str, mut fields: Value) {
    if let Value::Object(map) = &mut fields {
        map.insert("event".to_string(), Value::String(event.to_string()));
    }
    stdout_line(&fields.to_string());
}

/// Writes `line` and a newline to stdout. A closed or broken stdout (`| head`) loses the line and
/// nothing else: unlike `println!`, this never panics.
pub fn stdout_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|_| out.flush());
}

/// Writes `text` to stderr as it is (no newline added); never panics, unlike `eprint!`.
pub fn stderr_text(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|_| err.flush());
}

/// Writes `line` and a newline to stderr; never panics, unlike `eprintln!`.
pub fn stderr_line(line: &str) {
    stderr_text(&format!("{line}\n"));
}

/// How many top-level names the offer prompt shows before "and N more".
const PROMPT_NAMES: usize = 5;

/// The receiver's view of an offer: the JSON `offer` event (with `--json`) or the text shown
/// before the question, which names what would appear in the destination; with `list`, every
/// entry too (the JSON event's `entries`, exact paths; the text's lines, escaped, with file sizes).
pub fn show_offer(offer: &Offer<'_>, json: bool, list: bool) -> String {
    let t = offer.totals;
    if json {
        let names: Vec<_> = offer
            .top_level
            .iter()
            .map(|n| String::from_utf8_lossy(n))
            .collect();
        let mut fields = json!({
            "files": t.files, "dirs": t.dirs, "symlinks": t.symlinks, "bytes": t.bytes,
            "names": names,
            "names_total": offer.top_level_count,
            "resumable_bytes": offer.resumable_bytes,
            "text": offer.text,
        });
        if list {
            let entries: Vec<String> = offer.entries.iter().map(Entry::path_lossy).collect();
            fields["entries"] = json!(entries);
        }
        print_event("offer", fields);
    }
    if offer.text {
        return format!("Text message, {}", human_bytes(t.bytes));
    }
    let resumable = if offer.resumable_bytes > 0 {
        format!(
            ", {} already here from an earlier run",
            human_bytes(offer.resumable_bytes)
        )
    } else {
        String::new()
    };
    let shown: Vec<String> = offer
        .top_level
        .iter()
        .take(PROMPT_NAMES)
        .map(|n| escape_bytes(n).into_owned())
        .collect();
    let more = offer.top_level_count.saturating_sub(shown.len() as u64);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    let mut text = format!(
        "Offer: {}, {}, {}{resumable}\n  {}{more}",
        count(t.files, "file", "files"),
        dirs_and_symlinks(&t),
        human_bytes(t.bytes),
        shown.join(", "),
    );
    if list {
        for entry in offer.entries {
            text.push('\n');
            text.push_str(&list_line(entry));
        }
    }
    text
}

/// One line of `--list`: the size of a file, then the path (escaped, [`escape_bytes`]); a directory ends
/// in `/`, a symlink shows its target.
fn list_line(entry: &Entry) -> String {
    let path = escape_bytes(&entry.path);
    match entry.kind {
        EntryKind::File => format!("{:>12}  {path}", human_bytes(entry.size)),
        EntryKind::Dir => format!("{:>12}  {path}/", ""),
        EntryKind::Symlink => {
            format!("{:>12}  {path} -> {}", "", escape_bytes(&entry.target))
        }
    }
}

/// `text` as a QR code drawn with Unicode half blocks, two rows of modules per line, light modules
/// drawn in the terminal's (light) text colour on its dark background, with the quiet zone around.
pub fn qr_code(text: &str) -> String {
    use qrcode::render::unicode::Dense1x2;
    match qrcode::QrCode::new(text.as_bytes()) {
        Ok(code) => {
            let drawn = code
                .render::<Dense1x2>()
                .dark_color(Dense1x2::Light)
                .light_color(Dense1x2::Dark)
                .build();
            drawn + "\n"
        }
        // Only a text too long for any QR code fails; a command line never is.
        Err(e) => format!("(no QR code: {e})\n"),
    }
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
            last_rate: None,
            skipped_before: 0,
            show_path: true,
        }
    }

    /// True in `--json` mode.
    pub fn is_json(&self) -> bool {
        self.json
    }

    /// Emits one JSON event (in JSON mode) on stdout.
    pub fn event(&self, event: &str, fields: Value) {
        if self.json {
            print_event(event, fields);
        }
    }

    /// Information for people: stderr in text mode (escaped, line breaks kept), nothing in JSON
    /// mode.
    pub fn info(&self, text: &str) {
        if !self.json {
            let text = escape_lines(text);
            self.suspend(|| stderr_line(&text));
        }
    }

    /// A warning: stderr in text mode (escaped), a `warning` event in JSON mode.
    pub fn warn(&self, line: &str) {
        if self.json {
            self.event("warning", json!({ "message": line }));
        } else {
            let line = escape(line);
            self.suspend(|| stderr_line(&format!("warning: {line}")));
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
            // What arrived stays on the line; a rate and an ETA would be stale.
            bar.abandon_with_message("stopped");
        }
        if self.json {
            self.event("error", json!({ "code": code, "message": message }));
        } else {
            stderr_line(&format!("ferry: {}", escape(message)));
        }
    }

    /// Shows a spinner with `what` and the time waited so far ("Waiting for the sender... 12s") on a
    /// terminal, not with `--json`, until [`Ui::waited`]; warnings meanwhile are printed above it.
    pub fn waiting(&mut self, what: &str) {
        if self.json || self.bar.is_some() {
            return;
        }
        let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(10));
        spinner.set_style(
            ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("valid template"),
        );
        spinner.set_message(what.to_string());
        spinner.enable_steady_tick(Duration::from_millis(100));
        self.bar = Some(spinner);
    }

    /// Ends what [`Ui::waiting`] shows, leaving no trace on the terminal.
    pub fn waited(&mut self) {
        if let Some(spinner) = self.bar.take() {
            spinner.finish_and_clear();
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
            ProgressStyle::with_template("{bar:30.cyan/blue} {bytes}/{total_bytes} {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        self.bar = Some(bar);
    }
}

impl Ui {
    /// Moves the bar; its rate and ETA are recomputed at most ten times a second (this runs once per
    /// file, tens of thousands of times a second for small files).
    fn update_bar(&mut self, state: &ProgressState) {
        let Some(bar) = self.bar.as_ref().filter(|b| !b.is_hidden()) else {
            return;
        };
        bar.set_position(state.bytes_done);
        let now = Instant::now();
        if self
            .last_rate
            .is_some_and(|t| now.duration_since(t) < Duration::from_millis(100))
        {
            return;
        }
        self.last_rate = Some(now);
        bar.set_message(bar_message(
            state,
            now.duration_since(self.started).as_secs_f64(),
        ));
    }
}

/// Reaching the peer: warnings and the wait show as any other; announcements are withdrawn also when a signal
/// ends the process.
impl ferry_session::Events for Ui {
    fn warn(&mut self, message: &str) {
        Ui::warn(self, message);
    }

    fn waiting(&mut self, what: &str) {
        Ui::waiting(self, what);
    }

    fn keep_until_exit(
        &mut self,
        value: Box<dyn std::any::Any + Send>,
    ) -> Box<dyn std::any::Any + Send> {
        Box::new(crate::interrupt::keep_until_exit(value))
    }
}

impl Progress for Ui {
    fn offer(&mut self, state: &ProgressState) {
        // The receiver's offer event, with the names, comes from the question ([`show_offer`]).
        if self.verb != "received" {
            self.event("offer", Self::offer_fields(&state.totals));
        }
    }

    fn accepted(&mut self, state: &ProgressState) {
        // No bar before: a declined offer draws none.
        self.started = Instant::now();
        self.start_bar(&state.totals);
    }

    fn checking(&mut self, _state: &ProgressState, files: u64, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.set_message(format!(
                "checking {} already there",
                count(files, "file", "files")
            ));
        }
        self.event("checking", json!({ "files": files, "bytes": bytes }));
    }

    fn progress(&mut self, state: &ProgressState, current: &Entry) {
        self.update_bar(state);
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
        self.update_bar(state);
        if self.json {
            self.event(
                "file-done",
                json!({ "path": entry.path_lossy(), "bytes": entry.size, "files_done": state.files_done }),
            );
        }
    }

    fn skipped(&mut self, _state: &ProgressState, entry: &Entry, reason: &str) {
        let who = if self.verb == "pulled" {
            "sharer"
        } else {
            "sender"
        };
        self.warn(&format!(
            "skipping {}: the {who} cannot open it ({reason})",
            entry.path_lossy()
        ));
    }

    fn done(&mut self, state: &ProgressState) {
        let skipped = self.skipped_before + state.skipped;
        let secs = self.started.elapsed().as_secs_f64();
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let rate = rate(state, secs);
        if self.json {
            self.event(
                "done",
                json!({
                    "files": state.totals.files,
                    "bytes": state.totals.bytes,
                    "bytes_resumed": state.bytes_resumed,
                    "files_resumed": state.files_resumed,
                    "files_skipped": state.files_skipped,
                    "bytes_skipped": state.bytes_skipped,
                    "seconds": secs,
                    "skipped": skipped,
                }),
            );
        } else if state.text {
            // The receiver's output is the text itself ("Text message, 28 B" came before it).
            if self.verb == "sent" {
                stderr_line(&format!(
                    "done: sent the text message ({}), verified",
                    human_bytes(state.totals.bytes)
                ));
            }
        } else {
            stderr_line(&summary(self.verb, state, secs, rate, skipped));
        }
    }
}

/// The text summary: what moved in this run, then what was kept from an earlier one and what was already
/// there, so that the three add up to the offer (`not_sent`: files the sender left out).
fn summary(verb: &str, state: &ProgressState, secs: f64, rate: f64, not_sent: u64) -> String {
    let moved_files = state
        .totals
        .files
        .saturating_sub(state.files_skipped + state.files_resumed);
    let moved_bytes = state
        .totals
        .bytes
        .saturating_sub(state.bytes_skipped + state.bytes_resumed);
    let mut tail = String::new();
    if state.bytes_resumed > 0 {
        let whole = match state.files_resumed {
            0 => String::new(),
            n => format!(": {}", count(n, "whole file", "whole files")),
        };
        tail += &format!(
            "; {} kept from before{whole}",
            human_bytes(state.bytes_resumed)
        );
    }
    if state.files_skipped > 0 {
        tail += &format!(
            "; {} skipped ({})",
            count(state.files_skipped, "identical file", "identical files"),
            human_bytes(state.bytes_skipped)
        );
    }
    if not_sent > 0 {
        tail += &format!("; {not_sent} not sent (see the warnings)");
    }
    format!(
        "done: {verb} {}, {} in {secs:.2} s ({}/s), verified{tail}",
        count(moved_files, "file", "files"),
        human_bytes(moved_bytes),
        human_bytes(rate as u64),
    )
}

#[cfg(test)]
mod tests {
    use super::{bar_message, count, escape, escape_bytes, rate, show_offer, summary};
    use ferry_transfer::{Entry, EntryKind, Offer, ProgressState, Totals};

    #[test]
    fn escape_leaves_text_and_shows_controls() {
        assert_eq!(escape("plain ünïcødé 名前"), "plain ünïcødé 名前");
        assert_eq!(
            escape("a\u{1b}[2J\r\n\u{7f}\u{9b}b\u{202e}c\u{2066}"),
            "a\\x1b[2J\\x0d\\x0a\\x7f\\x9bb\\u{202e}c\\u{2066}"
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_are_shown_as_escapes() {
        assert_eq!(escape_bytes("名前.txt".as_bytes()), "名前.txt");
        assert_eq!(escape_bytes(b"bad\xffname"), "bad\\xffname");
        assert_eq!(
            escape_bytes(b"\xc3\x28\x1b\xe5\x90\x8d\xe5"),
            "\\xc3(\\x1b名\\xe5"
        );
    }

    #[test]
    fn an_offer_shows_names_that_are_not_utf8_as_escapes() {
        let file = |path: &[u8]| Entry {
            path: path.to_vec(),
            kind: EntryKind::File,
            size: 3,
            mode: 0o644,
            mtime: 0,
            mtime_nsec: 0,
            target: Vec::new(),
        };
        let entries = [file(b"bad\xffname"), file(b"bad\xef\xbf\xbdname")];
        let top: Vec<&[u8]> = entries.iter().map(|e| &e.path[..]).collect();
        let offer = Offer {
            totals: Totals {
                files: 2,
                bytes: 6,
                ..Default::default()
            },
            offer_id: [0; 32],
            entries: &entries,
            resumable_bytes: 0,
            top_level: &top,
            top_level_count: 2,
            text: false,
        };
        let shown = show_offer(&offer, false, true);
        assert!(
            shown.contains("\n  bad\\xffname, bad\u{fffd}name\n"),
            "{shown}"
        );
        assert!(
            shown.ends_with("3 B  bad\\xffname\n         3 B  bad\u{fffd}name"),
            "{shown}"
        );
    }

    #[test]
    fn a_resumed_transfer_counts_only_the_bytes_it_moved() {
        let state = ProgressState {
            totals: Totals {
                files: 1,
                bytes: 300 << 20,
                ..Default::default()
            },
            bytes_done: 200 << 20,
            bytes_resumed: 100 << 20,
            ..Default::default()
        };
        // 100 MiB kept from before, 100 MiB moved in 4 s: 25 MiB/s, and 100 MiB left take 4 s more.
        assert_eq!(rate(&state, 4.0), (25 << 20) as f64);
        assert_eq!(bar_message(&state, 4.0), "25.00 MiB/s ETA 4s 0/1 files");
    }

    #[test]
    fn a_resumed_summary_adds_up_to_the_offer() {
        let state = ProgressState {
            totals: Totals {
                files: 20_000,
                bytes: 100 << 20,
                ..Default::default()
            },
            bytes_resumed: 40 << 20,
            files_resumed: 9_138,
            files_skipped: 161,
            bytes_skipped: 10 << 20,
            ..Default::default()
        };
        assert_eq!(
            summary("received", &state, 2.0, (25 << 20) as f64, 0),
            "done: received 10701 files, 50.00 MiB in 2.00 s (25.00 MiB/s), verified; \
             40.00 MiB kept from before: 9138 whole files; 161 identical files skipped (10.00 MiB)"
        );
    }

    #[test]
    fn counts_read_as_english() {
        assert_eq!(count(1, "file", "files"), "1 file");
        assert_eq!(count(0, "file", "files"), "0 files");
        assert_eq!(count(2, "directory", "directories"), "2 directories");
    }
}
