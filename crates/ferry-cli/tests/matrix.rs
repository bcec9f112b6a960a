//! `ferry bench matrix --quick` end to end: every path the lab can build here produces a number in every
//! row, every received file verifies, and the plots are written. Real `ferry` processes in namespaces this
//! test's benchmark creates (needs root; without it only the loopback rows run, and the test says so).

use std::process::Command;

use ferry_testkit::{skip, temp_dir};
use serde_json::Value;

#[test]
fn quick_matrix_measures_every_row_and_verifies_every_file() {
    let test = "matrix::quick_matrix_measures_every_row_and_verifies_every_file";
    let plots = temp_dir("ferry-matrix-plots-");
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "matrix", "--quick", "--json", "--plots"])
        .arg(plots.path())
        .output()
        .expect("run ferry bench matrix");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ferry bench matrix failed: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect();
    let skipped: Vec<&Value> = lines
        .iter()
        .filter(|l| l["note"].as_str().is_some_and(|n| n.starts_with("skipped")))
        .collect();
    let expected: Vec<&str> = if skipped.is_empty() {
        ferry_lab::PATHS.iter().map(|p| p.name).collect()
    } else {
        vec!["loopback"]
    };
    for path in &expected {
        let cells: Vec<&Value> = lines
            .iter()
            .filter(|l| l["path"] == *path && l.get("layer").is_some())
            .collect();
        let layers: Vec<String> = cells
            .iter()
            .map(|c| {
                format!(
                    "{} {}",
                    c["layer"].as_str().unwrap(),
                    c["size"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(
            layers,
            [
                "raw TCP 64 MiB",
                "ferry send 64 MiB file",
                "ferry send 1000 files"
            ],
            "the rows of {path}"
        );
        for c in cells {
            for field in ["seconds", "rate_mb_s", "first_byte_ms"] {
                let v = c[field].as_f64().unwrap_or(f64::NAN);
                assert!(v.is_finite() && v > 0.0, "{path}: {field} in {c}");
            }
            if *path != "loopback" {
                assert!(
                    c["ratio"].as_f64().is_some_and(|r| r > 0.0),
                    "{path}: ratio in {c}"
                );
            }
            if c["layer"] == "ferry send" {
                assert_eq!(
                    c["verified"], true,
                    "{path}: every received file verifies: {c}"
                );
            }
        }
    }
    for png in ["throughput.png", "waterfall.png"] {
        let bytes = std::fs::read(plots.path().join(png)).expect("the plot is written");
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{png} is a PNG");
    }
    if let Some(reason) = ferry_lab::missing_prerequisite() {
        assert_eq!(
            skipped.len(),
            ferry_lab::PATHS.len() - 1,
            "every emulated path says it was skipped"
        );
        skip(test, &format!("only the loopback rows ran: {reason}"));
    }
}
