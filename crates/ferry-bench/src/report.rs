//! Benchmark rows and their two output forms: a table for people, JSON lines for scripts.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// One measured figure, optionally next to a baseline measured in the same run.
#[derive(Clone, Debug)]
pub struct Row {
    /// Which benchmark (`channel`, `transfer`, ...).
    pub bench: String,
    /// What was measured.
    pub case: String,
    /// The measured value (median).
    pub value: f64,
    /// Its unit.
    pub unit: String,
    /// The baseline's value in the same unit, when one exists.
    pub baseline: Option<f64>,
    /// `value / baseline` for rates, where higher is better.
    pub ratio: Option<f64>,
}

impl Row {
    /// A row without baseline.
    pub fn new(bench: &str, case: impl Into<String>, value: f64, unit: &str) -> Self {
        Row {
            bench: bench.to_string(),
            case: case.into(),
            value,
            unit: unit.to_string(),
            baseline: None,
            ratio: None,
        }
    }

    /// A row with a baseline; the ratio is `value / baseline`.
    pub fn with_baseline(mut self, baseline: f64) -> Self {
        self.baseline = Some(baseline);
        self.ratio = (baseline > 0.0).then(|| self.value / baseline);
        self
    }

    /// One JSON object: {"bench","case","value","unit"} plus "baseline" and "ratio" where they exist.
    pub fn to_json(&self) -> String {
        let mut s = format!(
            "{{\"bench\":{},\"case\":{},\"value\":{},\"unit\":{}",
            json_str(&self.bench),
            json_str(&self.case),
            json_num(self.value),
            json_str(&self.unit)
        );
        if let Some(b) = self.baseline {
            let _ = write!(s, ",\"baseline\":{}", json_num(b));
        }
        if let Some(r) = self.ratio {
            let _ = write!(s, ",\"ratio\":{}", json_num(r));
        }
        s.push('}');
        s
    }
}

fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.6}")
    } else {
        "null".to_string()
    }
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Writes one line to standard output. A closed stdout (`ferry bench | head`) drops the line instead of
/// panicking as `println!` does: nobody is left to read it, and the benchmark finishes its cleanup.
pub fn out_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_fmt(args).and_then(|()| out.write_all(b"\n"));
}

/// Where rows go as they are measured.
pub struct Report {
    json: bool,
    rows: Vec<Row>,
}

/// Width of the table's case column; a longer case name gets a line of its own.
const CASE_WIDTH: usize = 52;

/// A figure as the table shows it: three decimals, or nothing for one that is not a number (a row that only
/// heads a group of rows has no value).
fn table_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        String::new()
    }
}

/// The table's lines for `row`: one, or two when its case name is wider than its column (the name alone,
/// then the figures under their headings), so that the columns stay aligned.
fn table_lines(row: &Row) -> Vec<String> {
    let base = row.baseline.map(table_num).unwrap_or_default();
    let ratio = row.ratio.map(table_num).unwrap_or_default();
    let figures = |bench: &str, case: &str| {
        format!(
            "{bench:<10} {case:<CASE_WIDTH$} {:>12} {:<9} {base:>12} {ratio:>7}",
            table_num(row.value),
            row.unit
        )
        .trim_end()
        .to_string()
    };
    if row.case.chars().count() <= CASE_WIDTH {
        return vec![figures(&row.bench, &row.case)];
    }
    let name = format!("{:<10} {}", row.bench, row.case);
    match figures("", "") {
        // A note (no figure at all) is its name alone.
        none if none.is_empty() => vec![name],
        some => vec![name, some],
    }
}

impl Report {
    /// A report printing JSON lines (`json`) or a table.
    pub fn new(json: bool) -> Self {
        if !json {
            out_line(format_args!(
                "{:<10} {:<CASE_WIDTH$} {:>12} {:<9} {:>12} {:>7}",
                "bench", "case", "value", "unit", "baseline", "ratio"
            ));
        }
        Report {
            json,
            rows: Vec::new(),
        }
    }

    /// Prints a row at once (so long runs show progress) and keeps it.
    pub fn push(&mut self, row: Row) {
        if self.json {
            out_line(format_args!("{}", row.to_json()));
        } else {
            for line in table_lines(&row) {
                out_line(format_args!("{line}"));
            }
        }
        self.rows.push(row);
    }

    /// Everything measured so far.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }
}

/// The median of some samples (the mean of the middle two for an even count).
pub fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => samples[n / 2],
        _ => (samples[n / 2 - 1] + samples[n / 2]) / 2.0,
    }
}

/// Runs `baseline` and `candidate` alternately `runs` times; each returns a rate. Returns both medians.
pub fn interleave(
    runs: usize,
    mut baseline: impl FnMut() -> f64,
    mut candidate: impl FnMut() -> f64,
) -> (f64, f64) {
    let (mut b, mut c) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for _ in 0..runs {
        b.push(baseline());
        c.push(candidate());
    }
    (median(&mut b), median(&mut c))
}

/// The next value of a xorshift64 generator: fixed-seed, reproducible data and sizes for the benchmarks.
pub fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// Writes `bytes` of xorshift data from `seed` to a new file at `path`, 1 MiB at a time.
pub fn write_random_file(path: &std::path::Path, bytes: u64, mut seed: u64) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        fill_random(&mut buf[..n], &mut seed);
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Fills `buf` with xorshift data from `seed`.
pub fn fill_random(buf: &mut [u8], seed: &mut u64) {
    for chunk in buf.chunks_mut(8) {
        chunk.copy_from_slice(&xorshift(seed).to_le_bytes()[..chunk.len()]);
    }
}

/// The peak RSS (`VmHWM`, KiB) of process `pid`; `None` once it has exited (a zombie has no memory lines).
pub fn vm_hwm_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
}

/// CPU seconds (user + system) the calling thread used so far.
pub fn thread_cpu() -> f64 {
    rusage_cpu(libc::RUSAGE_THREAD)
}

/// CPU seconds (user + system) from `getrusage(who)`: `RUSAGE_THREAD`, `RUSAGE_SELF`, ...
pub fn rusage_cpu(who: libc::c_int) -> f64 {
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is writable.
    unsafe { libc::getrusage(who, &mut ru) };
    timeval_secs(ru.ru_utime) + timeval_secs(ru.ru_stime)
}

/// A `timeval` in seconds.
pub fn timeval_secs(t: libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 * 1e-6
}

/// Bytes per second of `bytes` moved in `elapsed`, in GB/s (10^9).
pub fn gbps(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e9
}

/// Times one call.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_row_has_the_contract_fields() {
        let row = Row::new("channel", "a \"b\"", 2.0, "GB/s").with_baseline(4.0);
        assert_eq!(
            row.to_json(),
            "{\"bench\":\"channel\",\"case\":\"a \\\"b\\\"\",\"value\":2.000000,\"unit\":\"GB/s\",\"baseline\":4.000000,\"ratio\":0.500000}"
        );
    }

    #[test]
    fn the_table_shows_no_nan_and_keeps_its_columns_for_long_case_names() {
        let heading = Row::new("mount", "uncached reads", f64::NAN, "");
        assert_eq!(table_lines(&heading), vec!["mount      uncached reads"]);
        let short = Row::new("mount", "pull", 1.5, "GB/s").with_baseline(3.0);
        let long = Row::new("mount", "x".repeat(70), 1.5, "GB/s").with_baseline(3.0);
        let lines = table_lines(&long);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0], format!("mount      {}", "x".repeat(70)));
        // The figures sit in the same columns as a short row's.
        let short = &table_lines(&short)[0];
        assert_eq!(lines[1].len(), short.len());
        assert_eq!(lines[1][10..], short[10..].replace("pull", "    "));
    }

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
