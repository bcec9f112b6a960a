//! The named paths of the matrix.

use std::time::Duration;

use crate::link::LinkSpec;

/// A named network path between two peers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Path {
    /// Its name in tables and on the command line.
    pub name: &'static str,
    /// The emulated link; `None`: this host's loopback, not emulated.
    pub link: Option<LinkSpec>,
    /// Whether the peers meet through `ferry relay` in a third namespace.
    pub relay: bool,
}

const fn link(mbit: u64, rtt_us: u64, loss: f64) -> Option<LinkSpec> {
    Some(LinkSpec {
        rate_bps: mbit * 1_000_000,
        rtt: Duration::from_micros(rtt_us),
        loss,
        queue_bytes: None,
    })
}

/// Every path, in the matrix's order.
pub const PATHS: [Path; 6] = [
    Path {
        name: "loopback",
        link: None,
        relay: false,
    },
    Path {
        name: "lan",
        link: link(1000, 500, 0.0),
        relay: false,
    },
    Path {
        name: "wan",
        link: link(500, 24_000, 0.0),
        relay: false,
    },
    Path {
        name: "wan-relay",
        link: link(500, 24_000, 0.0),
        relay: true,
    },
    Path {
        name: "high-bdp",
        link: link(1000, 100_000, 0.0),
        relay: false,
    },
    Path {
        name: "lossy-wan",
        link: link(500, 24_000, 0.005),
        relay: false,
    },
];

impl Path {
    /// The path called `name`.
    pub fn by_name(name: &str) -> Option<Path> {
        PATHS.iter().find(|p| p.name == name).copied()
    }

    /// The wire's rate in bytes per second, if it is emulated.
    pub fn wire_bytes_per_sec(&self) -> Option<f64> {
        self.link.map(|l| l.rate_bps as f64 / 8.0)
    }

    /// A short description: "500 Mbit/s, 24 ms RTT, 0.5 % loss, through a relay".
    pub fn describe(&self) -> String {
        let Some(l) = self.link else {
            return "this host's loopback".into();
        };
        let mut s = format!(
            "{} Mbit/s, {} ms RTT",
            l.rate_bps / 1_000_000,
            l.rtt.as_secs_f64() * 1e3
        );
        if l.loss > 0.0 {
            s += &format!(", {} % loss", l.loss * 100.0);
        }
        if self.relay {
            s += ", through a relay";
        }
        s
    }
}
