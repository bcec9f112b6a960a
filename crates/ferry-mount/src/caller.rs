//! Whether the process behind a request is being killed. fuser 0.18 drops `FUSE_INTERRUPT`, and the kernel
//! keeps the caller of a request it already handed over waiting until the answer, even through SIGKILL: a
//! request that may take long (a push) asks `/proc` instead and gives up when its caller is dying.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// `/proc` is read at most this often by one request.
const EVERY: Duration = Duration::from_millis(20);

/// SIGKILL's bit in the pending masks: the kernel turns any signal that kills (not caught, not blocked) into
/// a SIGKILL pending for every thread of the process, so only this bit is looked at. A caught signal waits
/// for the answer, as on a local disk.
const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);

/// `PF_EXITING` in `/proc/TID/stat`'s flags: the thread is in exit(2), closing its files.
const PF_EXITING: u64 = 0x4;

/// The thread that made one request.
#[derive(Debug)]
pub struct Caller {
    tid: u32,
    next: Cell<Instant>,
    dying: Cell<bool>,
}

impl Caller {
    /// The thread `tid` (a request's `pid`: 0 when the kernel made it, which is never dying).
    pub fn new(tid: u32) -> Self {
        Caller {
            tid,
            next: Cell::new(Instant::now()),
            dying: Cell::new(false),
        }
    }

    /// Whether the caller is being killed: SIGKILL pending, or in exit(2) because of a signal (its files'
    /// last flushes). A process ending normally is waited for: whoever waits for its exit may read what it
    /// wrote on the sharer next.
    pub fn dying(&self) -> bool {
        if self.dying.get() || self.tid == 0 {
            return self.dying.get();
        }
        let now = Instant::now();
        if now < self.next.get() {
            return false;
        }
        self.next.set(now + EVERY);
        let dying = killed(self.tid).unwrap_or(false);
        self.dying.set(dying);
        dying
    }
}

/// From `/proc`; `None` when it cannot be read (a thread that is gone waits for nothing, but a caller in
/// another PID namespace cannot be looked at either: neither stops a push).
fn killed(tid: u32) -> Option<bool> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let mask = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    if (mask("SigPnd:") | mask("ShdPnd:")) & SIGKILL_BIT != 0 {
        return Some(true);
    }
    let stat = std::fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    Some(exiting_on_a_signal(&stat))
}

/// Whether a `/proc/TID/stat` line says the thread is exiting because of a signal: the flags (field 9)
/// hold `PF_EXITING` and the exit code (field 52, as wait(2) gives it) a signal number.
fn exiting_on_a_signal(stat: &str) -> bool {
    // The command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    match (field(9), field(52)) {
        (Some(flags), Some(code)) => flags & PF_EXITING != 0 && code & 0x7f != 0,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(flags: u64, exit_code: u64) -> String {
        let mut fields = vec!["0".to_string(); 50];
        fields[0] = "S".into();
        fields[9 - 3] = flags.to_string();
        fields[52 - 3] = exit_code.to_string();
        format!("42 (a (b) c) {}", fields.join(" "))
    }

    #[test]
    fn only_an_exit_on_a_signal_counts() {
        assert!(exiting_on_a_signal(&stat(PF_EXITING | 0x40, 9)));
        assert!(!exiting_on_a_signal(&stat(PF_EXITING, 1 << 8)));
        assert!(!exiting_on_a_signal(&stat(0x40, 9)));
        assert!(!exiting_on_a_signal("garbage"));
    }

    #[test]
    fn a_live_thread_is_not_dying_and_the_kernel_never_is() {
        let me = std::process::id();
        assert!(!Caller::new(me).dying());
        assert!(!Caller::new(0).dying());
        assert_eq!(killed(me), Some(false));
    }
}
