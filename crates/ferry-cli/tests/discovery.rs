//! LAN discovery end to end, with real `ferry` processes inside a private network namespace made by the test
//! (`unshare -n`, loopback up with multicast on): mDNS never leaves it.
//!
//! Each side gets its own rendezvous directory, so the same-host registry cannot find the peer and only
//! mDNS can.

mod common;

use std::fs;
use std::process::{Command, Stdio};

use common::*;

/// Says that a test did not run, and why; in CI (`CI` set: it runs as root with `ip` and `unshare`
/// installed by `.ci/run`) that is a failure instead.
fn skip(reason: &str) {
    ferry_testkit::skip("discovery", reason);
}

/// Runs `script` with `sh` in a fresh network namespace with loopback multicast; `None` (with the reason
/// printed) when namespaces are not available here.
fn in_private_netns(script: &str) -> Option<std::process::Output> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("network namespaces need root");
        return None;
    }
    let probe = Command::new("unshare")
        .args(["-n", "--", "ip", "link", "set", "lo", "up"])
        .output();
    if !matches!(&probe, Ok(o) if o.status.success()) {
        skip(&format!(
            "`unshare -n` with `ip` is not available: {probe:?}"
        ));
        return None;
    }
    let full =
        format!("set -u\nip link set lo up && ip link set lo multicast on || exit 97\n{script}");
    let child = Command::new("unshare")
        .args(["-n", "--", "sh", "-c", &full])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn unshare");
    Some(finish(child))
}

fn sh_quote(p: &std::path::Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

#[test]
fn sender_and_receiver_find_each_other_by_mdns() {
    let w = World::new();
    let f = w.src().join("lan.bin");
    fs::write(&f, pseudo_random(3 << 20, 21)).unwrap();
    for d in ["rt-send", "rt-recv"] {
        fs::create_dir_all(w.path(d)).unwrap();
    }
    let script = format!(
        r#"
F={ferry}
XDG_RUNTIME_DIR={rs} XDG_CACHE_HOME={cache} timeout 60 {ferry} send --json --code 71-apple-orbit-violin {file} > {slog} 2>&1 &
XDG_RUNTIME_DIR={rr} XDG_CACHE_HOME={cache} timeout 60 {ferry} receive --json --yes 71-apple-orbit-violin --out {out} > {rlog} 2>&1
rc=$?
wait
exit $rc
"#,
        ferry = sh_quote(&ferry()),
        rs = sh_quote(&w.path("rt-send")),
        rr = sh_quote(&w.path("rt-recv")),
        cache = sh_quote(&w.path("cache")),
        file = sh_quote(&f),
        out = sh_quote(&w.out()),
        slog = sh_quote(&w.path("send.log")),
        rlog = sh_quote(&w.path("recv.log")),
    );
    let Some(out) = in_private_netns(&script) else {
        return;
    };
    let rlog = fs::read(w.path("recv.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "receive failed: {:?}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&rlog),
        String::from_utf8_lossy(&out.stderr)
    );
    let ev = events(&rlog);
    assert_eq!(
        event(&ev, "connected").unwrap()["path"],
        "lan",
        "found through mDNS, not this host's registry"
    );
    assert_same_tree(&f, &w.out().join("lan.bin"));
    // As `send --help` and README say: with discovery, the sender listens on every interface.
    let slog = fs::read(w.path("send.log")).unwrap_or_default();
    let listen: std::net::SocketAddr = event(&events(&slog), "code").unwrap()["listen"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(listen.ip().is_unspecified(), "listens on {listen}");
}

#[test]
fn a_spoofing_announcer_neither_breaks_nor_hijacks_the_transfer() {
    let w = World::new();
    let real = w.src().join("real.bin");
    fs::write(&real, pseudo_random(1 << 20, 22)).unwrap();
    let fake_dir = w.path("fake");
    fs::create_dir_all(&fake_dir).unwrap();
    let fake = fake_dir.join("real.bin");
    fs::write(&fake, b"SPOOFED CONTENT").unwrap();
    for d in ["rt-send", "rt-recv", "rt-spoof"] {
        fs::create_dir_all(w.path(d)).unwrap();
    }
    // The spoofer announces the same nameplate and first word (so the same rendezvous hash) with other words: it speaks real ferry but
    // cannot know the code. It starts first so its announcement is out before the real one.
    let script = format!(
        r#"
XDG_RUNTIME_DIR={rp} XDG_CACHE_HOME={cache} timeout 60 {ferry} send --json --code 72-apple-zone-youth {fake} > {plog} 2>&1 &
spoof=$!
sleep 0.5
XDG_RUNTIME_DIR={rs} XDG_CACHE_HOME={cache} timeout 60 {ferry} send --json --code 72-apple-orbit-violin {file} > {slog} 2>&1 &
XDG_RUNTIME_DIR={rr} XDG_CACHE_HOME={cache} timeout 60 {ferry} receive --json --yes 72-apple-orbit-violin --out {out} > {rlog} 2>&1
rc=$?
kill $spoof 2>/dev/null
wait
exit $rc
"#,
        ferry = sh_quote(&ferry()),
        rp = sh_quote(&w.path("rt-spoof")),
        rs = sh_quote(&w.path("rt-send")),
        rr = sh_quote(&w.path("rt-recv")),
        cache = sh_quote(&w.path("cache")),
        fake = sh_quote(&fake),
        file = sh_quote(&real),
        out = sh_quote(&w.out()),
        plog = sh_quote(&w.path("spoof.log")),
        slog = sh_quote(&w.path("send.log")),
        rlog = sh_quote(&w.path("recv.log")),
    );
    let Some(out) = in_private_netns(&script) else {
        return;
    };
    let rlog = fs::read(w.path("recv.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "the spoofer broke the transfer: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&rlog)
    );
    assert_same_tree(&real, &w.out().join("real.bin"));
    let spoof = events(&fs::read(w.path("spoof.log")).unwrap_or_default());
    assert!(
        event(&spoof, "done").is_none(),
        "the spoofer must never complete a transfer"
    );
}

#[test]
fn spoofers_on_the_lan_get_at_most_three_guesses_from_one_receive() {
    let w = World::new();
    // Five spoofers announce the receiver's nameplate (same first word, so the same rendezvous hash) with other
    // words; there is no real sender. Each spoofer that receives the receiver's confirmation fails with
    // wrong-code: that is one guess it could check. One receive may hand out at most three.
    let spoofers = 5;
    let mut script = String::from("pids=\n");
    for i in 0..spoofers {
        fs::create_dir_all(w.path(&format!("rt-spoof{i}"))).unwrap();
        script += &format!(
            "XDG_RUNTIME_DIR={rt} XDG_CACHE_HOME={cache} timeout 60 {ferry} send --json --code 74-apple-zoo-{word} {file} > {log} 2>&1 &\npids=\"$pids $!\"\n",
            rt = sh_quote(&w.path(&format!("rt-spoof{i}"))),
            cache = sh_quote(&w.path("cache")),
            ferry = sh_quote(&ferry()),
            word = ["zone", "youth", "young", "zero", "wrist"][i],
            file = sh_quote(&w.src()),
            log = sh_quote(&w.path(&format!("spoof{i}.log"))),
        );
    }
    fs::write(w.src().join("bait.txt"), b"bait").unwrap();
    fs::create_dir_all(w.path("rt-recv")).unwrap();
    script += &format!(
        r#"sleep 1
XDG_RUNTIME_DIR={rr} XDG_CACHE_HOME={cache} timeout 60 {ferry} receive --json --yes 74-apple-orbit-violin --out {out} > {rlog} 2>&1
rc=$?
kill $pids 2>/dev/null
wait
exit $rc
"#,
        ferry = sh_quote(&ferry()),
        rr = sh_quote(&w.path("rt-recv")),
        cache = sh_quote(&w.path("cache")),
        out = sh_quote(&w.out()),
        rlog = sh_quote(&w.path("recv.log")),
    );
    let Some(out) = in_private_netns(&script) else {
        return;
    };
    let rlog = fs::read(w.path("recv.log")).unwrap_or_default();
    assert_eq!(
        out.status.code(),
        Some(3),
        "the receiver stops with wrong-code: {}",
        String::from_utf8_lossy(&rlog)
    );
    let guessed = (0..spoofers)
        .filter(|i| {
            let log = fs::read(w.path(&format!("spoof{i}.log"))).unwrap_or_default();
            events(&log)
                .iter()
                .any(|e| e["event"] == "error" && e["code"] == "wrong-code")
        })
        .count();
    assert!(
        guessed <= 3,
        "{guessed} spoofers got a confirmation to check; the receiver's log:\n{}",
        String::from_utf8_lossy(&rlog)
    );
    assert!(guessed >= 1, "the spoofers were found at all");
    assert!(
        fs::read_dir(w.out()).unwrap().next().is_none(),
        "nothing received"
    );
}

#[test]
fn a_paired_peer_finds_a_share_and_a_sender_by_mdns() {
    let w = World::new();
    w.pair("a", "b");
    fs::create_dir_all(w.src().join("docs")).unwrap();
    fs::write(w.src().join("docs/lan.txt"), b"over the LAN\n").unwrap();
    for d in ["rt-a", "rt-b"] {
        fs::create_dir_all(w.path(d)).unwrap();
    }
    // Each side its own rendezvous directory: only mDNS (under the pair's hashes) can bring them together.
    let script = format!(
        r#"
a() {{ XDG_RUNTIME_DIR={ra} XDG_CONFIG_HOME={ca} XDG_CACHE_HOME={cache} "$@"; }}
b() {{ XDG_RUNTIME_DIR={rb} XDG_CONFIG_HOME={cb} XDG_CACHE_HOME={cache} "$@"; }}
a timeout 60 {ferry} share --json {src} > {shlog} 2>&1 &
share=$!
i=0; until grep -q '"ready"' {shlog} || [ $i -ge 200 ]; do sleep 0.1; i=$((i+1)); done
b timeout 60 {ferry} ls --json --wait 30s a:docs > {lslog} 2>&1
rc=$?
kill -TERM $share; wait $share
[ $rc -eq 0 ] || exit $rc
a timeout 60 {ferry} send --json --to b {src} > {slog} 2>&1 &
b timeout 60 {ferry} receive --json --yes --wait 30s --from a --out {out} > {rlog} 2>&1
rc=$?
wait
exit $rc
"#,
        ferry = sh_quote(&ferry()),
        ra = sh_quote(&w.path("rt-a")),
        rb = sh_quote(&w.path("rt-b")),
        ca = sh_quote(&w.path("config-a")),
        cb = sh_quote(&w.path("config-b")),
        cache = sh_quote(&w.path("cache")),
        src = sh_quote(&w.src()),
        out = sh_quote(&w.out()),
        shlog = sh_quote(&w.path("share.log")),
        lslog = sh_quote(&w.path("ls.log")),
        slog = sh_quote(&w.path("send.log")),
        rlog = sh_quote(&w.path("recv.log")),
    );
    let Some(out) = in_private_netns(&script) else {
        return;
    };
    let read = |name: &str| fs::read(w.path(name)).unwrap_or_default();
    assert!(
        out.status.success(),
        "{:?}\nls: {}\nshare: {}\nreceive: {}\n{}",
        out.status,
        String::from_utf8_lossy(&read("ls.log")),
        String::from_utf8_lossy(&read("share.log")),
        String::from_utf8_lossy(&read("recv.log")),
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = events(&read("ls.log"));
    assert_eq!(event(&listed, "entry").unwrap()["name"], "lan.txt");
    let received = events(&read("recv.log"));
    assert_eq!(event(&received, "connected").unwrap()["path"], "lan");
    assert_same_tree(&w.src(), &w.out().join("src"));
}
