//! Property: any sequence of packet sizes (empty to the 1 MiB maximum, mostly small) survives any way of cutting
//! the byte stream into reads and writes (single bytes to several MiB), through the sans-IO opener and through the
//! blocking adapter, byte for byte and in order.

use std::io::{self, Read, Write};

use ferry_channel::blocking::{SecureReader, SecureWriter};
use ferry_channel::{Auth, Config, Established, Suite, DEFAULT_MAX_PAYLOAD};
use proptest::collection::vec;
use proptest::prelude::*;

use crate::common::*;

fn packet_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        10 => 0usize..64,
        4 => 64usize..4096,
        1 => 4096usize..=DEFAULT_MAX_PAYLOAD,
        1 => Just(DEFAULT_MAX_PAYLOAD),
    ]
}

/// Read and write sizes; every cycle also has one large piece, so single-byte pieces cannot make a case slow.
fn cuts() -> impl Strategy<Value = Vec<usize>> {
    let cut = prop_oneof![4 => 1usize..=3, 3 => 4usize..64, 2 => 64usize..70_000, 1 => 70_000usize..=(4 << 20)];
    vec(cut, 1..12).prop_map(|mut v| {
        v.push(1 << 20);
        v
    })
}

/// Gives out at most the next cut's worth of bytes per call, cyclically.
struct Choppy<T> {
    inner: T,
    cuts: Vec<usize>,
    next: usize,
}

impl<T> Choppy<T> {
    fn new(inner: T, cuts: &[usize]) -> Self {
        Choppy {
            inner,
            cuts: cuts.to_vec(),
            next: 0,
        }
    }

    fn cut(&mut self, len: usize) -> usize {
        let c = self.cuts[self.next % self.cuts.len()];
        self.next += 1;
        c.min(len)
    }
}

impl Read for Choppy<&[u8]> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.cut(buf.len());
        self.inner.read(&mut buf[..n])
    }
}

impl Write for Choppy<Vec<u8>> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.cut(buf.len());
        self.inner.write(&buf[..n])
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn pair(aes: bool) -> (Established, Established) {
    let cfg = if aes { aes_config() } else { chacha_config() };
    let cfg = Config {
        suites: cfg.suites | Suite::ChaCha20Poly1305.bit(),
        ..cfg
    };
    establish(
        initiator(cfg.clone(), Auth::Unauthenticated),
        responder(cfg, Auth::Unauthenticated),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn packets_survive_any_stream_boundaries(
        sizes in vec(packet_size(), 1..20),
        read_cuts in cuts(),
        write_cuts in cuts(),
        aes in any::<bool>(),
    ) {
        let payloads: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| payload(i, n)).collect();
        let (mut a, mut b) = pair(aes);

        // Sans-IO: Sealer -> byte stream -> Opener::feed in pieces.
        let wire = seal_all(&mut a.sealer, &payloads, true);
        let got = receive_chopped(&mut b.opener, &wire, &read_cuts);
        prop_assert!(got.error.is_none(), "{:?}", got.error);
        prop_assert!(got.closed);
        prop_assert!(got.packets == payloads, "packets differ");

        // Blocking adapter: SecureWriter over short writes -> SecureReader over short reads.
        let mut writer = SecureWriter::new(Choppy::new(Vec::new(), &write_cuts), b.sealer);
        for p in &payloads {
            writer.send(p).unwrap();
        }
        let wire = writer.close().unwrap().inner;
        let mut reader = SecureReader::new(Choppy::new(&wire[..], &read_cuts), a.opener);
        for (i, p) in payloads.iter().enumerate() {
            let d = reader.recv().unwrap();
            prop_assert!(d.as_deref() == Some(&p[..]), "packet {} of {} bytes", i, p.len());
        }
        prop_assert!(reader.recv().unwrap().is_none());
    }
}
