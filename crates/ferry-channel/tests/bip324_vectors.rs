//! BIP324's official test vectors, read at test time from `tests/vectors/bip324/` (or `FERRY_BIP324_VECTORS`),
//! a copy kept in the repository (its README says where from).
//!
//! Every vector test has `bip324_vector` in its name, so `cargo test bip324_vector` runs exactly these. Each
//! check is a function of the vector directory, so the same checks also run on a deliberately corrupted copy
//! (`mutated_vector_copy_is_rejected`), which shows they really compare against the files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ferry_channel::keys::{ellswift_decode_x, EphemeralKey, SessionKeys};
use ferry_channel::{Role, Sealer, Suite, BITCOIN_MAINNET_MAGIC, HEADER_DECOY};

const PACKET_FILE: &str = "packet_encoding_test_vectors.csv";
const DECODE_FILE: &str = "ellswift_decode_test_vectors.csv";
const INVERSE_FILE: &str = "xswiftec_inv_test_vectors.csv";

type Row = HashMap<String, String>;
type Check = fn(&Path) -> Result<(), String>;

/// Every check, with the file it reads.
const CHECKS: [(&str, Check); 3] = [
    (PACKET_FILE, check_packet_encoding),
    (DECODE_FILE, check_ellswift_decode),
    (INVERSE_FILE, check_xswiftec_inv_forward_map),
];

/// Fails the enclosing check (returns `Err`) when the two sides differ.
macro_rules! ensure_eq {
    ($left:expr, $right:expr, $($what:tt)+) => {{
        let (l, r) = (&$left, &$right);
        if l != r {
            return Err(format!("{}: {:02x?} != {:02x?}", format!($($what)+), l, r));
        }
    }};
}

fn vectors_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("FERRY_BIP324_VECTORS") {
        return PathBuf::from(dir);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/bip324")
}

/// Reads a CSV file of the vectors as rows of (column name -> value).
fn read_csv(dir: &Path, name: &str) -> Vec<Row> {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e} (set FERRY_BIP324_VECTORS)",
            path.display()
        )
    });
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .expect("header")
        .split(',')
        .map(String::from)
        .collect();
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split(',').map(String::from))
                .collect()
        })
        .collect()
}

fn hex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err(format!("odd hex length: {s}"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| format!("bad hex {s}: {e}")))
        .collect()
}

fn arr<const N: usize>(s: &str) -> Result<[u8; N], String> {
    hex(s)?
        .try_into()
        .map_err(|_| format!("vector field of the wrong length: {s}"))
}

fn check_packet_encoding(dir: &Path) -> Result<(), String> {
    let rows = read_csv(dir, PACKET_FILE);
    ensure_eq!(rows.len(), 7, "the official file has 7 packet vectors");
    for row in &rows {
        let idx: usize = row["in_idx"].parse().map_err(|e| format!("in_idx: {e}"))?;
        let role = if row["in_initiating"] == "1" {
            Role::Initiator
        } else {
            Role::Responder
        };
        let ours: [u8; 64] = arr(&row["in_ellswift_ours"])?;
        let theirs: [u8; 64] = arr(&row["in_ellswift_theirs"])?;
        ensure_eq!(
            ellswift_decode_x(&ours),
            arr::<32>(&row["mid_x_ours"])?,
            "x ours of vector {idx}"
        );
        ensure_eq!(
            ellswift_decode_x(&theirs),
            arr::<32>(&row["mid_x_theirs"])?,
            "x theirs of vector {idx}"
        );

        let key = EphemeralKey::from_parts(arr(&row["in_priv_ours"])?, ours)
            .ok_or("invalid private key")?;
        let secret = key.shared_secret(&theirs, role);
        ensure_eq!(
            secret,
            arr::<32>(&row["mid_shared_secret"])?,
            "shared secret of vector {idx}"
        );

        let keys = SessionKeys::derive(&secret, BITCOIN_MAINNET_MAGIC, role);
        let (init, resp) = match role {
            Role::Initiator => (&keys.send, &keys.recv),
            Role::Responder => (&keys.recv, &keys.send),
        };
        ensure_eq!(
            init.length,
            arr::<32>(&row["mid_initiator_l"])?,
            "initiator L of vector {idx}"
        );
        ensure_eq!(
            init.packet,
            arr::<32>(&row["mid_initiator_p"])?,
            "initiator P of vector {idx}"
        );
        ensure_eq!(
            resp.length,
            arr::<32>(&row["mid_responder_l"])?,
            "responder L of vector {idx}"
        );
        ensure_eq!(
            resp.packet,
            arr::<32>(&row["mid_responder_p"])?,
            "responder P of vector {idx}"
        );
        let send_terminator = arr::<16>(&row["mid_send_garbage_terminator"])?;
        ensure_eq!(
            keys.send_terminator,
            send_terminator,
            "send terminator of vector {idx}"
        );
        let recv_terminator = arr::<16>(&row["mid_recv_garbage_terminator"])?;
        ensure_eq!(
            keys.recv_terminator,
            recv_terminator,
            "recv terminator of vector {idx}"
        );
        ensure_eq!(
            keys.session_id,
            arr::<32>(&row["out_session_id"])?,
            "session id of vector {idx}"
        );

        // Encrypt `in_idx` empty decoys first, then the packet under test, as the BIP's reference does.
        let multiply: usize = row["in_multiply"]
            .parse()
            .map_err(|e| format!("in_multiply: {e}"))?;
        let contents = hex(&row["in_contents"])?.repeat(multiply);
        let aad = hex(&row["in_aad"])?;
        let mut sealer = Sealer::new(&keys.send, Suite::ChaCha20Poly1305, Vec::new(), 1 << 24);
        let mut scratch = Vec::new();
        for _ in 0..idx {
            scratch.clear();
            sealer
                .seal_into(&mut scratch, HEADER_DECOY, &[])
                .map_err(|e| e.to_string())?;
        }
        let header = if row["in_ignore"] == "1" {
            HEADER_DECOY
        } else {
            0
        };
        let mut out = Vec::new();
        sealer
            .seal_into_with_aad(&mut out, header, &contents, &aad)
            .map_err(|e| e.to_string())?;
        let expected = &row["out_ciphertext"];
        if !expected.is_empty() {
            ensure_eq!(out, hex(expected)?, "ciphertext of vector {idx}");
        } else {
            let tail = hex(&row["out_ciphertext_endswith"])?;
            ensure_eq!(
                out[out.len().saturating_sub(tail.len())..],
                tail[..],
                "ciphertext tail of vector {idx}"
            );
        }
    }
    Ok(())
}

fn check_ellswift_decode(dir: &Path) -> Result<(), String> {
    let rows = read_csv(dir, DECODE_FILE);
    ensure_eq!(rows.len(), 76, "the official file has 76 decode vectors");
    for row in &rows {
        let enc: [u8; 64] = arr(&row["ellswift"])?;
        ensure_eq!(
            ellswift_decode_x(&enc),
            arr::<32>(&row["x"])?,
            "{}",
            row["comment"]
        );
    }
    Ok(())
}

/// libsecp256k1 does not export the inverse map (`xswiftec_inv`), so we cannot ask it for `t` given `(u, x)`.
/// What it does expose is the forward map through decoding: for every case where the vector gives a `t`,
/// `xswiftec(u, t)` must equal `x`, and we check exactly that. Cases without a `t` (no preimage) cannot be
/// checked through the forward map.
fn check_xswiftec_inv_forward_map(dir: &Path) -> Result<(), String> {
    let rows = read_csv(dir, INVERSE_FILE);
    ensure_eq!(
        rows.len(),
        32,
        "the official file has 32 inverse-map vectors"
    );
    let mut checked = 0;
    for row in &rows {
        let u = hex(&row["u"])?;
        let x: [u8; 32] = arr(&row["x"])?;
        for case in 0..8 {
            let t = &row[&format!("case{case}_t")];
            if t.is_empty() {
                continue;
            }
            let mut enc = [0u8; 64];
            enc[..32].copy_from_slice(&u);
            enc[32..].copy_from_slice(&hex(t)?);
            ensure_eq!(ellswift_decode_x(&enc), x, "u={} case{case}", row["u"]);
            checked += 1;
        }
    }
    if checked == 0 {
        return Err("no inverse-map case had a t to check".into());
    }
    Ok(())
}

#[test]
fn bip324_vector_packet_encoding() {
    check_packet_encoding(&vectors_dir()).unwrap();
}

#[test]
fn bip324_vector_ellswift_decode() {
    check_ellswift_decode(&vectors_dir()).unwrap();
}

#[test]
fn bip324_vector_xswiftec_inv_forward_map() {
    check_xswiftec_inv_forward_map(&vectors_dir()).unwrap();
}

/// A copy of the official vectors in a fresh temporary directory.
fn copy_of_vectors() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("temporary directory");
    for (file, _) in CHECKS {
        std::fs::copy(vectors_dir().join(file), tmp.path().join(file)).expect("copy a vector file");
    }
    tmp
}

/// Changes one hex digit of `column` in the first data row (after `skip` rows) where it is not empty.
fn mutate(dir: &Path, file: &str, column: &str, skip: usize) {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.split('\n').map(String::from).collect();
    let col = lines[0]
        .trim_end()
        .split(',')
        .position(|c| c == column)
        .expect("column exists");
    let (i, line) = lines
        .iter_mut()
        .enumerate()
        .skip(1 + skip)
        .find(|(_, l)| {
            l.split(',')
                .nth(col)
                .is_some_and(|f| !f.trim_end().is_empty())
        })
        .expect("a row with this field");
    let mut fields: Vec<String> = line.split(',').map(String::from).collect();
    let field = &mut fields[col];
    // The last hex digit: in a ciphertext, a byte of the tag.
    let at = field.trim_end().len() - 1;
    let digit = if field.as_bytes()[at] == b'0' {
        "1"
    } else {
        "0"
    };
    field.replace_range(at..at + 1, digit);
    *line = fields.join(",");
    std::fs::write(&path, lines.join("\n")).unwrap();
    eprintln!("mutated {file} line {} column {column}", i + 1);
}

#[test]
fn unmutated_vector_copy_passes() {
    let copy = copy_of_vectors();
    for (file, check) in CHECKS {
        check(copy.path()).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
}

#[test]
fn mutated_vector_copy_is_rejected() {
    let mutations = [
        (PACKET_FILE, "out_ciphertext", 0),
        (PACKET_FILE, "out_ciphertext_endswith", 0),
        (PACKET_FILE, "out_session_id", 2),
        (PACKET_FILE, "mid_responder_p", 5),
        (DECODE_FILE, "x", 10),
        (INVERSE_FILE, "x", 3),
        (INVERSE_FILE, "case3_t", 0),
    ];
    for (file, column, skip) in mutations {
        let copy = copy_of_vectors();
        mutate(copy.path(), file, column, skip);
        for (checked_file, check) in CHECKS {
            let result = check(copy.path());
            if checked_file == file {
                assert!(result.is_err(), "{file}: changing {column} went unnoticed");
            } else {
                assert!(result.is_ok(), "{checked_file} was not touched: {result:?}");
            }
        }
    }
}
