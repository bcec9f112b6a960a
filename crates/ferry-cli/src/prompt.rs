//! Asking for the code at a terminal: `ferry receive` without CODE, with Tab completion of the code words.
//!
//! The line editor is rustyline (without its history, file and custom-binding features): it reads from
//! the terminal itself (`/dev/tty`), so the prompt never mixes with what goes to stdout, and it turns
//! Ctrl-C and Ctrl-D into answers instead of signals.

use rustyline::completion::Completer;
use rustyline::config::{Behavior, CompletionType, Config};
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::DefaultHistory;
use rustyline::validate::Validator;
use rustyline::{Context, Editor, Helper};

use ferry_rendezvous::{Code, WORDS, WORD_COUNT};

use crate::failure::{InterruptedAtPrompt, Usage};

/// What the prompt says.
const PROMPT: &str = "Enter the code: ";

/// Completes the code word under the cursor (never the nameplate number before the first word).
struct CodeWords;

impl Completer for CodeWords {
    type Candidate = String;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        _ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<String>)> {
        Ok(complete_word(&line[..pos]))
    }
}

impl Hinter for CodeWords {
    type Hint = String;
}

impl Highlighter for CodeWords {}

impl Validator for CodeWords {}

impl Helper for CodeWords {}

/// The completions of the word that ends `before` (the line up to the cursor) and where that word
/// starts: the code words it begins. A single match that is not the code's last word gets the `-` that
/// starts the next one. Nothing for the nameplate, for an empty word, or past the last word.
fn complete_word(before: &str) -> (usize, Vec<String>) {
    let start = before.rfind(['-', ' ']).map_or(0, |i| i + 1);
    let prefix = before[start..].to_ascii_lowercase();
    let earlier = before[..start]
        .split(['-', ' '])
        .filter(|p| !p.is_empty())
        .count();
    // `earlier` counts the nameplate and the words before this one: this is word number `earlier`.
    if prefix.is_empty() || earlier == 0 || earlier > WORD_COUNT {
        return (start, Vec::new());
    }
    let mut found: Vec<String> = WORDS
        .iter()
        .filter(|w| w.starts_with(&prefix))
        .map(|w| w.to_string())
        .collect();
    if let [only] = found.as_mut_slice() {
        if earlier < WORD_COUNT {
            only.push('-');
        }
    }
    (start, found)
}

/// Asks for the code at the terminal, with Tab completion of the code words, and checks it like a
/// code given on the command line. Ctrl-C is an interruption (exit 130); Ctrl-D gives no code (a bad
/// command line, exit 2).
pub fn ask_code() -> anyhow::Result<Code> {
    let config = Config::builder()
        .completion_type(CompletionType::List)
        .behavior(Behavior::PreferTerm)
        .auto_add_history(false)
        .build();
    let mut editor: Editor<CodeWords, DefaultHistory> = Editor::with_config(config)?;
    editor.set_helper(Some(CodeWords));
    // The editor puts the terminal in raw mode and back; a signal that ends the process meanwhile exits
    // without unwinding, so the settings from before are also kept until exit (put back either way).
    let _restore = saved_terminal().map(crate::interrupt::keep_until_exit);
    match editor.readline(PROMPT) {
        Ok(line) => Ok(line.parse::<Code>()?),
        Err(ReadlineError::Interrupted) => Err(InterruptedAtPrompt.into()),
        Err(ReadlineError::Eof) => Err(Usage(
            "no code given: type the code the sender printed, or give it: ferry receive CODE"
                .into(),
        )
        .into()),
        Err(e) => Err(anyhow::Error::new(e).context("cannot read the code from the terminal")),
    }
}

/// The controlling terminal's settings as they were, put back when dropped.
struct TerminalSettings(std::fs::File, rustix::termios::Termios);

impl Drop for TerminalSettings {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(&self.0, rustix::termios::OptionalActions::Now, &self.1);
    }
}

/// The settings of the terminal the editor uses (`/dev/tty`, as `Behavior::PreferTerm` does), if any.
fn saved_terminal() -> Option<TerminalSettings> {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok()?;
    let settings = rustix::termios::tcgetattr(&tty).ok()?;
    Some(TerminalSettings(tty, settings))
}

#[cfg(test)]
mod tests {
    use super::complete_word;

    fn words(v: &[&str]) -> Vec<String> {
        v.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn completes_code_words_after_the_nameplate() {
        // A unique word gets the dash for the next word, except the last word.
        assert_eq!(complete_word("7-orbi"), (2, words(&["orbit-"])));
        assert_eq!(
            complete_word("7 apple orbit viol"),
            (14, words(&["violin"]))
        );
        // Several matches: all of them, left to the editor to list.
        let (start, found) = complete_word("12-app");
        assert_eq!(start, 3);
        assert!(found.len() > 1 && found.iter().all(|w| w.starts_with("app")));
        // Case does not matter, as for the parser.
        assert_eq!(complete_word("7-ORBI"), (2, words(&["orbit-"])));
    }

    #[test]
    fn completes_nothing_where_no_word_goes() {
        assert_eq!(complete_word("7"), (0, vec![]));
        assert_eq!(complete_word("7-"), (2, vec![]));
        assert_eq!(complete_word("7-apple-orbit-violin-vi"), (21, vec![]));
        assert_eq!(complete_word("7-zzz"), (2, vec![]));
    }
}
