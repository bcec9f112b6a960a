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
    let aead: Vec<&Value> = lines.iter().filter(|l| l["layer"] == "AEAD").collect();
    assert_eq!(aead.len(), 1, "one AEAD row per run: {aead:?}");
    assert!(aead[0]["rate_mb_s"].as_f64().is_some_and(|r| r > 0.0));
    for path in &expected {
        let cells: Vec<&Value> = lines
            .iter()
            .filter(|l| l["path"] == *path && l.get("layer").is_some())
            .collect();
        let notes: Vec<&str> = lines
            .iter()
            .filter(|l| l["path"] == *path)
            .filter_map(|l| l["note"].as_str())
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
            layers[..6],
            [
                "raw TCP 64 MiB",
                "channel 64 MiB",
                "ferry send 64 MiB file",
                "ferry send 1000 files",
                "ferry pull 64 MiB file",
                "ferry pull 1000 files",
            ],
            "the rows of {path}"
        );
        // Each peer has its rows, or a note says why not (not installed; ssh has no relay path).
        for peer in ["scp", "rsync", "croc"] {
            let rows = layers
                .iter()
                .filter(|l| l.starts_with(&format!("{peer} ")))
                .count();
            let why = notes.iter().any(|n| {
                n.contains(peer) && (n.contains("not installed") || n.contains("no rows"))
            });
            assert!(
                rows >= 1 || why,
                "{path}: {peer} has neither a row nor a note saying why: {layers:?} {notes:?}"
            );
        }
        // The mount's reads (uncached, cached), or a note says why not (no /dev/fuse, not root).
        let mount_rows: Vec<&String> = layers
            .iter()
            .filter(|l| l.starts_with("ferry mount"))
            .collect();
        let why = notes.iter().any(|n| n.starts_with("ferry mount: no rows"));
        assert!(
            mount_rows.len() == 2 || (mount_rows.is_empty() && why),
            "{path}: the mount has neither its two rows nor a note saying why: {layers:?} {notes:?}"
        );
        if std::env::var_os("CI").is_some() {
            assert_eq!(mount_rows.len(), 2, "{path}: CI mounts (root, /dev/fuse)");
        }
        // Lanes (issue 12 item 6): parallel streams and `--lanes` on every path, CUBIC and more stream
        // counts where one stream falls short.
        let mut lane_rows = vec![
            "raw TCP ×4 64 MiB",
            "ferry send 1 lane 64 MiB file",
            "ferry send 2 lanes 64 MiB file",
            "ferry send 4 lanes 64 MiB file",
            "ferry send 1 lane 1000 files",
            "ferry send 4 lanes 1000 files",
        ];
        if ["wan", "high-bdp", "lossy-wan"].contains(path) {
            lane_rows.extend(["raw TCP ×2 64 MiB", "raw TCP ×8 64 MiB"]);
        }
        if ["wan", "high-bdp"].contains(path) {
            lane_rows.extend(["raw TCP cubic 64 MiB", "raw TCP ×4 cubic 64 MiB"]);
        }
        for row in lane_rows {
            assert!(
                layers.iter().any(|l| l == row),
                "{path}: no {row} row in {layers:?}"
            );
        }
        // The small files' bytes as one raw TCP stream: the floor the files' bound is read against.
        assert!(
            layers
                .iter()
                .any(|l| l.starts_with("raw TCP ") && l.ends_with(" MB")),
            "{path}: no raw TCP row of the small files' bytes in {layers:?}"
        );
        if *path != "loopback" {
            assert!(
                notes
                    .iter()
                    .any(|n| n.starts_with("raw TCP ") && n.contains("bound 1.2 ×")),
                "{path}: the raw stream of the files' bytes is checked against their bound: {notes:?}"
            );
        }
        // Issue 12's bound on the small files (1.2 × bytes / wire + 3 RTT), checked on every emulated path.
        if *path != "loopback" {
            assert!(
                notes
                    .iter()
                    .any(|n| n.starts_with("ferry send 1000 files: ") && n.contains("bound 1.2 ×")),
                "{path}: the small files' bound is checked: {notes:?}"
            );
        }
        if ["wan", "high-bdp"].contains(path) {
            for tuned in [
                "raw TCP sndbuf",
                "raw TCP snd+rcvbuf",
                "raw TCP lowat",
                "ferry send sndbuf",
            ] {
                assert!(
                    layers.iter().any(|l| l.starts_with(tuned)),
                    "{path}: no {tuned} row in {layers:?}"
                );
            }
            assert!(
                notes.iter().any(|n| n.contains("net.core.wmem_max")),
                "{path}: the socket-buffer limits are reported: {notes:?}"
            );
        }
        for c in cells {
            for field in ["seconds", "rate_mb_s"] {
                let v = c[field].as_f64().unwrap_or(f64::NAN);
                assert!(v.is_finite() && v > 0.0, "{path}: {field} in {c}");
            }
            let layer = c["layer"].as_str().unwrap();
            if layer.starts_with("raw TCP") || layer == "channel" || layer.starts_with("ferry ") {
                let v = c["first_byte_ms"].as_f64().unwrap_or(f64::NAN);
                assert!(v.is_finite() && v > 0.0, "{path}: first_byte_ms in {c}");
            }
            if *path != "loopback" {
                assert!(
                    c["ratio"].as_f64().is_some_and(|r| r > 0.0),
                    "{path}: ratio in {c}"
                );
            }
            // Every row that moved files says they verified (raw TCP and the channel move memory).
            if !(layer.starts_with("raw TCP") || layer == "channel") {
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
