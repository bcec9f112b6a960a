//! BIP324's official test vectors, read at test time from `../shared/vectors/bip324/` (or `FERRY_BIP324_VECTORS`).
//!
//! Every test here has `bip324_vector` in its name, so `cargo test bip324_vector` runs exactly these.

use std::path::PathBuf;

use ferry_channel::keys::{ellswift_decode_x, EphemeralKey, SessionKeys};
use ferry_channel::{Role, Sealer, Suite, BITCOIN_MAINNET_MAGIC, HEADER_DECOY};

fn vectors_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("FERRY_BIP324_VECTORS") {
        return PathBuf::from(dir);
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // crates/ferry-channel -> repository root -> ../shared
    manifest.join("../../../shared/vectors/bip324")
}

/// Reads a CSV file of the vectors as rows of (column name -> value).
fn read_csv(name: &str) -> Vec<std::collections::HashMap<String, String>> {
    let path = vectors_dir().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e} (set FERRY_BIP324_VECTORS)", path.display()));
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().expect("header").split(',').map(String::from).collect();
    lines
        .filter(|l| !l.is_empty())
        .map(|l| header.iter().cloned().zip(l.split(',').map(String::from)).collect())
        .collect()
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn arr<const N: usize>(s: &str) -> [u8; N] {
    hex(s).try_into().expect("vector field of the right length")
}

#[test]
fn bip324_vector_packet_encoding() {
    let rows = read_csv("packet_encoding_test_vectors.csv");
    assert_eq!(rows.len(), 7, "the official file has 7 packet vectors");
    for row in &rows {
        let role = if row["in_initiating"] == "1" { Role::Initiator } else { Role::Responder };
        let ours: [u8; 64] = arr(&row["in_ellswift_ours"]);
        let theirs: [u8; 64] = arr(&row["in_ellswift_theirs"]);
        assert_eq!(ellswift_decode_x(&ours), arr::<32>(&row["mid_x_ours"]));
        assert_eq!(ellswift_decode_x(&theirs), arr::<32>(&row["mid_x_theirs"]));

        let key = EphemeralKey::from_parts(arr(&row["in_priv_ours"]), ours).expect("valid private key");
        let secret = key.shared_secret(&theirs, role);
        assert_eq!(secret, arr::<32>(&row["mid_shared_secret"]), "shared secret of vector {}", row["in_idx"]);

        let keys = SessionKeys::derive(&secret, BITCOIN_MAINNET_MAGIC, role);
        let (init, resp) = match role {
            Role::Initiator => (&keys.send, &keys.recv),
            Role::Responder => (&keys.recv, &keys.send),
        };
        assert_eq!(init.length, arr::<32>(&row["mid_initiator_l"]));
        assert_eq!(init.packet, arr::<32>(&row["mid_initiator_p"]));
        assert_eq!(resp.length, arr::<32>(&row["mid_responder_l"]));
        assert_eq!(resp.packet, arr::<32>(&row["mid_responder_p"]));
        assert_eq!(keys.send_terminator, arr::<16>(&row["mid_send_garbage_terminator"]));
        assert_eq!(keys.recv_terminator, arr::<16>(&row["mid_recv_garbage_terminator"]));
        assert_eq!(keys.session_id, arr::<32>(&row["out_session_id"]));

        // Encrypt `in_idx` empty decoys first, then the packet under test, as the BIP's reference does.
        let idx: usize = row["in_idx"].parse().expect("in_idx");
        let multiply: usize = row["in_multiply"].parse().expect("in_multiply");
        let contents = hex(&row["in_contents"]).repeat(multiply);
        let aad = hex(&row["in_aad"]);
        let mut sealer = Sealer::new(&keys.send, Suite::ChaCha20Poly1305, Vec::new(), 1 << 24);
        let mut scratch = Vec::new();
        for _ in 0..idx {
            scratch.clear();
            sealer.seal_into(&mut scratch, HEADER_DECOY, &[]).expect("empty packet");
        }
        let header = if row["in_ignore"] == "1" { HEADER_DECOY } else { 0 };
        let mut out = Vec::new();
        sealer
            .seal_into_with_aad(&mut out, header, &contents, &aad)
            .expect("vector packet fits");
        let expected = &row["out_ciphertext"];
        if !expected.is_empty() {
            assert_eq!(out, hex(expected), "ciphertext of vector {idx}");
        } else {
            let tail = hex(&row["out_ciphertext_endswith"]);
            assert!(out.ends_with(&tail), "ciphertext tail of vector {idx}");
        }
    }
}

#[test]
fn bip324_vector_ellswift_decode() {
    let rows = read_csv("ellswift_decode_test_vectors.csv");
    assert_eq!(rows.len(), 76, "the official file has 76 decode vectors");
    for row in &rows {
        let enc: [u8; 64] = arr(&row["ellswift"]);
        assert_eq!(ellswift_decode_x(&enc), arr::<32>(&row["x"]), "{}", row["comment"]);
    }
}

/// libsecp256k1 does not export the inverse map (`xswiftec_inv`), so we cannot ask it for `t` given `(u, x)`.
/// What it does expose is the forward map through decoding: for every case where the vector gives a `t`,
/// `xswiftec(u, t)` must equal `x`, and we check exactly that. Cases without a `t` (no preimage) cannot be
/// checked through the forward map.
#[test]
fn bip324_vector_xswiftec_inv_forward_map() {
    let rows = read_csv("xswiftec_inv_test_vectors.csv");
    assert_eq!(rows.len(), 32, "the official file has 32 inverse-map vectors");
    let mut checked = 0;
    for row in &rows {
        let u = hex(&row["u"]);
        let x: [u8; 32] = arr(&row["x"]);
        for case in 0..8 {
            let t = &row[&format!("case{case}_t")];
            if t.is_empty() {
                continue;
            }
            let mut enc = [0u8; 64];
            enc[..32].copy_from_slice(&u);
            enc[32..].copy_from_slice(&hex(t));
            assert_eq!(ellswift_decode_x(&enc), x, "u={} case{case}", row["u"]);
            checked += 1;
        }
    }
    assert!(checked > 0, "no inverse-map case had a t to check");
}
