//! End to end through a real `ferry relay` process on loopback: transfers with `--force-relay`, what the
//! relay (or anyone on its path) can see, its limits as the client reports them, and resume across a relay
//! restart.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::sync::{Arc, Mutex};

use common::strangers::{dial, Flood, Stranger};
use common::*;

fn start_relay(w: &World, listen: &str, extra: &[&str]) -> RelayProcess {
    let mut cmd = w.cmd();
    cmd.args(["relay", "--listen", listen, "--stats-interval", "0"])
        .args(extra);
    RelayProcess::spawn(cmd)
}

/// `ferry send --json --force-relay --relay RELAY --code CODE PATHS...`, output piped.
fn relay_send(w: &World, relay: &str, code: &str, paths: &[&Path]) -> Child {
    let mut cmd = w.cmd();
    cmd.args([
        "send",
        "--json",
        "--force-relay",
        "--relay",
        relay,
        "--code",
        code,
    ])
    .args(paths)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd.spawn().expect("spawn ferry send")
}

/// `ferry receive --json --yes --force-relay --relay RELAY CODE --out OUT`, output piped.
fn relay_receive(w: &World, relay: &str, code: &str, out: &Path) -> Child {
    let mut cmd = w.cmd();
    cmd.args([
        "receive",
        "--json",
        "--yes",
        "--force-relay",
        "--relay",
        relay,
        code,
        "--out",
    ])
    .arg(out)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd.spawn().expect("spawn ferry receive")
}

/// Sends `paths` and receives into `out`, both with `--force-relay` through `relay`.
fn relayed(w: &World, relay: &str, code: &str, paths: &[&Path], out: &Path) -> (Output, Output) {
    let send = finish_in_background(relay_send(w, relay, code, paths));
    let recv = finish(relay_receive(w, relay, code, out));
    (send.join().unwrap(), recv)
}

#[test]
fn file_of_256_mib_and_5000_small_files_arrive_through_the_relay() {
    let w = World::new();
    let relay = start_relay(&w, "127.0.0.1:0", &[]);
    let relay_addr = relay.addr.to_string();
    let big = w.src().join("big.bin");
    fs::write(&big, pseudo_random(256 << 20, 9)).unwrap();
    let tree = w.src().join("small");
    for i in 0..5000 {
        let d = tree.join(format!("d{}", i % 50));
        fs::create_dir_all(&d).unwrap();
        fs::write(
            d.join(format!("f{i}")),
            pseudo_random(100 + i % 3000, i as u64),
        )
        .unwrap();
    }
    let (send, recv) = relayed(
        &w,
        &relay_addr,
        "51-apple-orbit-violin",
        &[&big, &tree],
        &w.out(),
    );
    assert_success("send", &send);
    assert_success("receive", &recv);
    for out in [&send, &recv] {
        let ev = events(&out.stdout);
        assert_eq!(
            event(&ev, "connected").unwrap()["path"],
            "relay",
            "each side says which path it uses"
        );
    }
    assert_same_tree(&big, &w.out().join("big.bin"));
    set_mtime(&tree, 1_700_000_000, 0);
    set_mtime(&w.out().join("small"), 1_700_000_000, 0);
    assert_same_tree(&tree, &w.out().join("small"));
}

/// Forwards one connection to `upstream` and records every byte in both directions.
fn recording_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let record = Arc::new(Mutex::new(Vec::new()));
    let rec = record.clone();
    std::thread::spawn(move || {
        let (client, _) = listener.accept().unwrap();
        let server = TcpStream::connect(upstream).unwrap();
        let pump = |mut from: TcpStream, mut to: TcpStream, rec: Arc<Mutex<Vec<u8>>>| {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    rec.lock().unwrap().extend_from_slice(&buf[..n]);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(Shutdown::Write);
            })
        };
        let a = pump(
            client.try_clone().unwrap(),
            server.try_clone().unwrap(),
            rec.clone(),
        );
        let b = pump(server, client, rec);
        let _ = a.join();
        let _ = b.join();
    });
    (addr, record)
}

/// Pearson's chi-square statistic of the byte histogram against the uniform distribution (255 degrees of
/// freedom: mean 255, standard deviation about 22.6).
fn chi_square(bytes: &[u8]) -> f64 {
    let mut counts = [0u64; 256];
    for &b in bytes {
        counts[b as usize] += 1;
    }
    let expected = bytes.len() as f64 / 256.0;
    counts
        .iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum()
}

#[test]
fn the_relay_path_carries_no_plaintext_and_looks_random() {
    let w = World::new();
    let relay = start_relay(&w, "127.0.0.1:0", &[]);
    let (proxy, record) = recording_proxy(relay.addr);
    let marker = b"FERRY-PLAINTEXT-MARKER-4f1c2a";
    let dir = w.src().join("Quarterly Report Folder");
    fs::create_dir_all(&dir).unwrap();
    let mut names = vec!["Quarterly Report Folder".to_string()];
    for i in 0..20 {
        let name = format!("confidential-budget-{i}.txt");
        let mut body = Vec::new();
        for _ in 0..2000 {
            body.extend_from_slice(marker);
            body.extend_from_slice(b" the same plaintext line, again and again\n");
        }
        fs::write(dir.join(&name), body).unwrap();
        names.push(name);
    }
    let code = "52-oxygen-harbor-velvet";
    // The receiver reaches the relay through the recording proxy; the sender directly.
    let relay_addr = relay.addr.to_string();
    let send = finish_in_background(relay_send(&w, &relay_addr, code, &[&dir]));
    let recv = finish(relay_receive(&w, &proxy.to_string(), code, &w.out()));
    assert_success("receive", &recv);
    assert_success("send", &send.join().unwrap());
    assert_same_tree(&dir, &w.out().join("Quarterly Report Folder"));

    let rec = record.lock().unwrap().clone();
    assert!(
        rec.len() > 1 << 20,
        "the recording holds the whole session ({} bytes)",
        rec.len()
    );
    let contains = |needle: &[u8]| rec.windows(needle.len()).any(|win| win == needle);
    assert!(
        !contains(marker),
        "the plaintext marker is visible on the relay path"
    );
    assert!(
        !contains(&marker[..12]),
        "part of the plaintext marker is visible on the relay path"
    );
    for name in &names {
        assert!(
            !contains(name.as_bytes()),
            "file name {name:?} is visible on the relay path"
        );
    }
    for word in ["oxygen", "harbor", "velvet"] {
        assert!(
            !contains(word.as_bytes()),
            "code word {word:?} is visible on the relay path"
        );
    }
    let chi = chi_square(&rec);
    // p < 1e-9 for a uniform source above ~420; the plaintext itself scores in the millions.
    assert!(
        chi < 420.0,
        "recorded bytes are not uniform: chi-square {chi:.1}"
    );
    assert!(
        chi_square(&fs::read(dir.join("confidential-budget-0.txt")).unwrap()) > 10_000.0,
        "control: plaintext fails the check"
    );
}

#[test]
fn relay_rate_limit_is_a_clear_client_error() {
    let w = World::new();
    let relay = start_relay(&w, "127.0.0.1:0", &["--per-ip-per-minute", "2"]);
    let f = w.src().join("x");
    fs::write(&f, b"x").unwrap();
    let relay_addr = relay.addr.to_string();
    let spawn_sender = |code: &str| relay_send(&w, &relay_addr, code, &[&f]);
    let mut waiting = vec![
        spawn_sender("61-apple-orbit-violin"),
        spawn_sender("62-apple-orbit-violin"),
    ];
    // Give both time to register, so the third is over the limit.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let third = finish(spawn_sender("63-apple-orbit-violin"));
    for c in &mut waiting {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert_eq!(
        third.status.code(),
        Some(4),
        "stderr {}",
        String::from_utf8_lossy(&third.stderr)
    );
    let err = event(&events(&third.stdout), "error").cloned().unwrap();
    assert_eq!(err["code"], "relay");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("too many new sessions"),
        "unclear message: {err}"
    );
}

#[test]
fn a_relay_restart_during_a_transfer_resumes() {
    let w = World::new();
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let listen = format!("127.0.0.1:{port}");
    let relay = start_relay(&w, &listen, &[]);
    let f = w.src().join("data.bin");
    let size = 256u64 << 20;
    fs::write(&f, pseudo_random(size as usize, 12)).unwrap();
    let code = "53-apple-orbit-violin";
    let send = finish_in_background(relay_send(&w, &listen, code, &[&f]));
    let mut recv = relay_receive(&w, &listen, code, &w.out());
    let _events = wait_for_event(recv.stdout.take().unwrap(), |e| {
        e["event"] == "progress" && e["bytes_done"].as_u64().unwrap_or(0) >= size / 3
    });
    drop(relay); // SIGKILL: the relay dies mid-transfer.
    assert!(
        !recv.wait().unwrap().success(),
        "the receiver must report the cut"
    );
    assert!(
        !send.join().unwrap().status.success(),
        "the sender must report the cut"
    );

    let _relay = start_relay(&w, &listen, &[]);
    let (send, recv) = relayed(&w, &listen, code, &[&f], &w.out());
    assert_success("send after restart", &send);
    assert_success("receive after restart", &recv);
    assert_same_tree(&f, &w.out().join("data.bin"));
    let resumed = event(&events(&recv.stdout), "done").unwrap()["bytes_resumed"]
        .as_u64()
        .unwrap();
    assert!(
        resumed >= size / 4,
        "only what was missing is sent again (resumed {resumed})"
    );
}

#[test]
fn a_session_that_met_at_the_relay_moves_to_a_direct_path_when_one_works() {
    let w = World::new();
    let relay = start_relay(&w, "127.0.0.1:0", &[]);
    let relay_addr = relay.addr.to_string();
    let f = w.src().join("moved.bin");
    fs::write(&f, pseudo_random(8 << 20, 13)).unwrap();
    // Separate rendezvous directories: the receiver cannot find the sender on this host, only at the relay.
    let (rt_send, rt_recv) = (w.path("rt-send"), w.path("rt-recv"));
    for d in [&rt_send, &rt_recv] {
        fs::create_dir_all(d).unwrap();
    }
    let code = "54-apple-orbit-violin";
    let mut send = w.cmd();
    send.env("XDG_RUNTIME_DIR", &rt_send)
        .args([
            "send",
            "--json",
            "--listen",
            "127.0.0.1:0",
            "--relay",
            &relay_addr,
            "--code",
            code,
        ])
        .arg(&f)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let send = finish_in_background(send.spawn().unwrap());
    let recv = finish(
        w.cmd()
            .env("XDG_RUNTIME_DIR", &rt_recv)
            .args([
                "receive",
                "--json",
                "--yes",
                "--relay",
                &relay_addr,
                code,
                "--out",
            ])
            .arg(w.out())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let send = send.join().unwrap();
    assert_success("send", &send);
    assert_success("receive", &recv);
    assert_same_tree(&f, &w.out().join("moved.bin"));
    for out in [&send, &recv] {
        let paths: Vec<_> = events(&out.stdout)
            .into_iter()
            .filter(|e| e["event"] == "connected")
            .map(|e| e["path"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            paths,
            ["relay", "direct"],
            "met at the relay, then moved to the direct path"
        );
    }
}

#[test]
fn the_relay_can_come_from_the_config_file() {
    let w = World::new();
    let relay = start_relay(&w, "127.0.0.1:0", &[]);
    let config = w.path("config/ferry");
    fs::create_dir_all(&config).unwrap();
    fs::write(
        config.join("config.toml"),
        format!("relay = \"{}\"\n", relay.addr),
    )
    .unwrap();
    let f = w.src().join("configured.bin");
    fs::write(&f, pseudo_random(1 << 20, 14)).unwrap();
    let code = "55-apple-orbit-violin";
    let mut send = w.cmd();
    send.args(["send", "--json", "--force-relay", "--code", code])
        .arg(&f)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let send = finish_in_background(send.spawn().unwrap());
    let mut recv = w.cmd();
    recv.args(["receive", "--json", "--yes", "--force-relay", code, "--out"])
        .arg(w.out())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let recv = finish(recv.spawn().unwrap());
    let send = send.join().unwrap();
    assert_success("send", &send);
    assert_success("receive", &recv);
    assert_same_tree(&f, &w.out().join("configured.bin"));
    let connected = event(&events(&recv.stdout), "connected").cloned().unwrap();
    assert_eq!(connected["path"], "relay");
    assert_eq!(connected["peer"], relay.addr.to_string());

    // A broken config file is a clear error, not silently ignored.
    fs::write(config.join("config.toml"), "relay = 7\n").unwrap();
    let out = finish(
        w.cmd()
            .args(["receive", "--json", "--yes", "--force-relay", code, "--out"])
            .arg(w.out())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = event(&events(&out.stdout), "error").cloned().unwrap();
    assert!(
        err["message"].as_str().unwrap().contains("config.toml"),
        "{err}"
    );
    // Issue 45: on a terminal's line, the error is one line with where the mistake is, not TOML's drawing
    // of it with `\x0a` for its line breaks.
    let out = finish(
        w.cmd()
            .args(["receive", "--yes", "--force-relay", code, "--out"])
            .arg(w.out())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("config.toml, line 1, column 9: ") && !text.contains("\\x0a"),
        "{text}"
    );
}

/// Issue 45: on Ctrl-C a relay with paired sessions says that it waits for them, and a second Ctrl-C ends
/// them at once.
#[test]
fn a_second_ctrl_c_stops_the_relay_at_once() {
    let w = World::new();
    let mut relay = w
        .cmd()
        .args(["relay", "--listen", "127.0.0.1:0", "--stats-interval", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(relay.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut lines, &mut line).unwrap();
    let addr: SocketAddr = line.trim().rsplit(' ').next().unwrap().parse().unwrap();
    let hash = [3u8; 32];
    let receiver = std::thread::spawn(move || raw_hello(addr, 2, hash));
    let (mut s, status) = raw_hello(addr, 1, hash);
    let (_r, _) = receiver.join().unwrap();
    if status == 0 {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
    }
    // The relay counts the session as active a moment after it says PAIRED.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let signal = |sig| {
        // SAFETY: kill(2) on our own child, not waited for yet.
        assert_eq!(unsafe { libc::kill(relay.id() as libc::pid_t, sig) }, 0);
    };
    signal(libc::SIGINT);
    let mut said = String::new();
    while !said.contains("Ctrl-C again") {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut lines, &mut line).unwrap();
        assert!(n > 0, "the relay said nothing: {said:?}");
        said.push_str(&line);
    }
    assert!(said.contains("1 paired session"), "{said}");
    let second = std::time::Instant::now();
    signal(libc::SIGINT);
    let status = finish_status(&mut relay);
    assert!(
        second.elapsed() < std::time::Duration::from_secs(3),
        "the relay took {:?} after the second Ctrl-C (its grace is 5 s)",
        second.elapsed()
    );
    assert_eq!(status, Some(0));
}

/// Issue 45: a share that is only at a relay (`--force-relay`) tells the peer to use that relay, and that
/// command, pasted on the peer (which has no relay configured), lists the share.
#[test]
fn a_share_at_a_relay_names_the_relay_in_its_hint() {
    let w = World::new();
    w.pair("a", "b");
    fs::write(w.src().join("hello.txt"), b"hi").unwrap();
    let relay = start_relay(&w, "127.0.0.1:0", &[]);
    let relay_flag = format!("--relay {}", relay.addr);
    let mut sharer = w
        .as_("a")
        .args(["share", "--force-relay", "--relay", &relay.addr.to_string()])
        .arg(w.src())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(sharer.stderr.take().unwrap());
    let mut seen = String::new();
    let command = loop {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut lines, &mut line).unwrap();
        assert!(n > 0, "no hint: {seen}");
        seen.push_str(&line);
        if let Some((_, rest)) = line.split_once("run:  ferry ls ") {
            break rest.split("  ").next().unwrap().to_string();
        }
    };
    assert!(seen.contains("On a peer run:"), "{seen}");
    assert!(command.starts_with(&relay_flag), "{seen}");
    let args: Vec<&str> = command
        .split(' ')
        .map(|a| if a == "NAME[:PATH]" { "a" } else { a })
        .collect();
    let listed = w.as_("b").arg("ls").args(&args).output().unwrap();
    let _ = sharer.kill();
    let _ = sharer.wait();
    assert_success(&format!("ferry ls {command}"), &listed);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("hello.txt"),
        "{}",
        String::from_utf8_lossy(&listed.stdout)
    );
}

/// `BLAKE3-derive_key("ferry 2026 nameplate v1", "57")`: the rendezvous hash of every code with
/// nameplate 57 before issue 9, computable by anyone who knows (or enumerates) the nameplate.
const NAMEPLATE_57_ONLY: &str = "f99346d23a69605712e49a76c111413634ac68c2da8d77cd371dbc9adff9a99e";

fn from_hex(hex: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

#[test]
fn a_stranger_who_knows_the_nameplate_cannot_catch_the_sender_at_the_relay() {
    let w = World::new();
    let relay = start_relay(&w, "127.0.0.1:0", &[]);
    let relay_addr = relay.addr.to_string();
    // The stranger knows (or enumerates) the nameplate, not the words: it waits at the relay as
    // a receiver under the hash of the nameplate alone, before the sender comes.
    let mut stranger = TcpStream::connect(relay.addr).unwrap();
    stranger
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let mut hello = vec![1u8, 2];
    hello.extend_from_slice(&from_hex(NAMEPLATE_57_ONLY));
    stranger.write_all(&hello).unwrap();
    let mut status = [0u8; 1];
    stranger.read_exact(&mut status).unwrap();
    assert_eq!(status[0], 0, "the stranger is WAITING");

    let f = w.src().join("secret.bin");
    fs::write(&f, pseudo_random(1 << 20, 15)).unwrap();
    let code = "57-apple-orbit-violin";
    let send = finish_in_background(relay_send(&w, &relay_addr, code, &[&f]));
    let recv = finish(relay_receive(&w, &relay_addr, code, &w.out()));
    // Both sides registered at the relay (they met there, --force-relay) after the stranger did,
    // so had the sender's hash been the stranger's, the relay would have paired the two.
    stranger.set_nonblocking(true).unwrap();
    let paired = match stranger.read(&mut status) {
        Ok(1) => Some(status[0]),
        _ => None,
    };
    assert_eq!(
        paired, None,
        "the hash of the nameplate alone met the sender at the relay"
    );
    assert_success("receive", &recv);
    assert_success("send", &send.join().unwrap());
    assert_same_tree(&f, &w.out().join("secret.bin"));
}

/// A raw relay hello from the test; returns the stream and the first status byte.
fn raw_hello(relay: SocketAddr, role: u8, hash: [u8; 32]) -> (TcpStream, u8) {
    let mut s = TcpStream::connect(relay).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let mut hello = vec![1u8, role];
    hello.extend_from_slice(&hash);
    s.write_all(&hello).unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    (s, b[0])
}

#[test]
fn relay_per_address_limits_are_flags_and_clear_client_errors() {
    let w = World::new();
    let help = finish(
        w.cmd()
            .args(["relay", "--help"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--max-handshakes-per-ip",
        "--max-sessions-per-ip",
        "--max-listeners-per-ip",
        "--hello-timeout",
        "--min-bytes-per-window",
        "--max-lifetime",
    ] {
        assert!(help.contains(flag), "`ferry relay --help` lacks {flag}");
    }

    // One session per address: this address already waits in one, so `ferry send` is refused.
    let relay = start_relay(&w, "127.0.0.1:0", &["--max-sessions-per-ip", "1"]);
    let (_held, status) = raw_hello(relay.addr, 1, [1; 32]);
    assert_eq!(status, 0);
    let f = w.src().join("x");
    fs::write(&f, b"x").unwrap();
    let out = finish(relay_send(
        &w,
        &relay.addr.to_string(),
        "64-apple-orbit-violin",
        &[&f],
    ));
    assert_eq!(
        out.status.code(),
        Some(4),
        "stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = event(&events(&out.stdout), "error").cloned().unwrap();
    assert_eq!(err["code"], "relay");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("too many sessions from this address"),
        "unclear message: {err}"
    );
}

#[test]
fn the_relay_process_closes_a_trickling_session() {
    let w = World::new();
    // 1 s windows, 64 KiB minimum (the default); a byte every 200 ms is never idle but too slow.
    let relay = start_relay(&w, "127.0.0.1:0", &["--idle-timeout", "1"]);
    let hash = [2u8; 32];
    let addr = relay.addr;
    let receiver = std::thread::spawn(move || raw_hello(addr, 2, hash));
    let (mut s, status) = raw_hello(addr, 1, hash);
    let (mut r, r_status) = receiver.join().unwrap();
    let mut b = [0u8; 64];
    if status == 0 {
        s.read_exact(&mut b[..1]).unwrap();
        assert_eq!((b[0], r_status), (1, 1), "PAIRED");
    } else {
        r.read_exact(&mut b[..1]).unwrap();
        assert_eq!((status, r_status, b[0]), (1, 0, 1), "PAIRED");
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if s.write_all(b".").is_err() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        })
    };
    r.set_read_timeout(Some(std::time::Duration::from_millis(500)))
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let closed = loop {
        match r.read(&mut b) {
            Ok(0) => break true,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            _ if std::time::Instant::now() > deadline => break false,
            _ => continue,
        }
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    trickle.join().unwrap();
    assert!(
        closed,
        "a session moving a byte every 200 ms was never closed"
    );
}

/// Issue 46: 64 addresses x 16 silent sockets, each reopened as soon as it is closed, hold every one
/// of the relay's 1,024 hello seats (its default limits), which once closed every newcomer at once. A
/// newcomer now takes the seat of the oldest silent socket, so a transfer still meets at the relay.
#[test]
fn silent_sockets_from_64_addresses_do_not_keep_a_transfer_out_of_the_relay() {
    let limit = ferry_relay::raise_nofile_limit();
    if limit < 3000 {
        println!("skipped: open file limit is {limit}, need 3000 for the flood");
        return;
    }
    let w = World::new();
    let relay = start_relay(&w, "127.0.0.1:0", &[]);
    let plan = (0..64u8)
        .flat_map(|i| [(Ipv4Addr::new(127, 0, 1, 10 + i), Stranger::Silent); 16])
        .collect();
    let flood = Flood::start(relay.addr, plan);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while flood.opened() < 64 * 16 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} opened",
            flood.opened()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let f = w.src().join("through.bin");
    fs::write(&f, pseudo_random(1 << 20, 46)).unwrap();
    let started = std::time::Instant::now();
    let (send, recv) = relayed(
        &w,
        &relay.addr.to_string(),
        "65-apple-orbit-violin",
        &[&f],
        &w.out(),
    );
    let took = started.elapsed();
    let opened = flood.opened();
    drop(flood);
    eprintln!(
        "1024 silent sockets from 64 addresses, {opened} opened in all; transfer took {took:?}"
    );
    assert_success("receive during the flood", &recv);
    assert_success("send during the flood", &send);
    assert_same_tree(&f, &w.out().join("through.bin"));
}

/// Issue 46: a stranger with 16 addresses asks each for 16 listener seats, as many as the relay has
/// (its default limits), knowing no meeting hash. Each address gets 4, and a real share still registers
/// at the relay and a paired peer lists it.
#[test]
fn strangers_from_16_addresses_cannot_take_every_listener_seat_at_the_relay() {
    let w = World::new();
    w.pair("a", "b");
    fs::write(w.src().join("hello.txt"), b"hi").unwrap();
    let relay = start_relay(&w, "127.0.0.1:0", &[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut held = Vec::new();
    let mut refused = 0;
    for i in 0..16u8 {
        let source = Ipv4Addr::new(127, 0, 2, 10 + i);
        for _ in 0..16 {
            let mut s = rt
                .block_on(async { dial(source, relay.addr).await?.into_std() })
                .unwrap();
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
                .unwrap();
            let mut hello = vec![1u8, 3];
            hello.extend_from_slice(&[0; 32]);
            s.write_all(&hello).unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).unwrap();
            match b[0] {
                8 => held.push(s),
                7 => refused += 1,
                other => panic!("a listener hello got {other}"),
            }
        }
    }
    let relay_addr = relay.addr.to_string();
    let (sharer, _) = w.share("a", &["--force-relay", "--relay", &relay_addr]);
    let started = std::time::Instant::now();
    let out = w.ls(
        "b",
        "a",
        &["--force-relay", "--relay", &relay_addr, "--wait", "20s"],
    );
    let took = started.elapsed();
    stop_share(sharer);
    eprintln!(
        "{} strangers' listeners held, {refused} refused; ls took {took:?}",
        held.len()
    );
    assert_success("ls through the relay", &out);
    assert!(entries(&out).contains_key("hello.txt"));
    assert_eq!(held.len(), 64, "4 listeners from each of 16 addresses");
}

/// Gives installation `to` a copy of `from`'s identity key and peer list: what a thief holds who copied both
/// files (the same machine, as far as its peers can tell), or a second ferry of `from` run from a copy.
fn clone_machine(w: &World, from: &str, to: &str) {
    let (src, dst) = (w.config_dir(from), w.config_dir(to));
    for file in ["identity", "peers.toml"] {
        fs::copy(src.join(file), dst.join(file)).expect("copy a config file");
    }
}

/// a and b paired, a's files, a relay (and its address), and a2 holding a copy of a's config.
fn paired_with_a_clone() -> (World, RelayProcess, String) {
    let w = World::new();
    w.pair("a", "b");
    fs::create_dir_all(w.src()).unwrap();
    fs::write(w.src().join("f.txt"), b"the real a\n").unwrap();
    let relay = start_relay(&w, "127.0.0.1:0", &[]);
    let at = relay.addr.to_string();
    clone_machine(&w, "a", "a2");
    (w, relay, at)
}

/// The first warning of `who` that says a meeting is taken at the relay.
fn taken_warning(who: &mut Watched) -> String {
    let warning = who.wait_for(|e| {
        e["event"] == "warning" && e["message"].as_str().is_some_and(|m| m.contains("TAKEN"))
    });
    let message = warning["message"].as_str().unwrap().to_string();
    for cause in [
        "ferry share",
        "send --to",
        "peers.toml",
        "again every 5 to 30 s",
    ] {
        assert!(message.contains(cause), "{cause:?} not in {message}");
    }
    message
}

#[test]
fn a_share_whose_meeting_is_taken_at_the_relay_says_why_serves_directly_and_asks_again() {
    let (w, _relay, at) = paired_with_a_clone();
    // a2 holds a's meetings at the relay first (through the relay only, so this host's registry stays a's).
    let (thief, _) = w.share("a2", &["--relay", &at, "--force-relay"]);
    std::thread::sleep(std::time::Duration::from_secs(1)); // time to register (an order, not an assertion)
    let (mut sharer, _) = w.share("a", &["--relay", &at]);
    let message = taken_warning(&mut sharer);
    assert!(
        message.contains("direct connections are still served"),
        "{message}"
    );
    // a still serves b directly...
    let out = w.ls("b", "a", &[]);
    assert_success("ls directly while the relay meeting is taken", &out);
    assert!(entries(&out).contains_key("f.txt"));
    // ...and once a2 is gone, a holds its meetings at the relay again and b reaches it there.
    drop(thief);
    let out = w.ls(
        "b",
        "a",
        &["--relay", &at, "--force-relay", "--wait", "60s"],
    );
    assert_success("ls through the relay once the meeting is free", &out);
    assert!(entries(&out).contains_key("f.txt"));
    let log = events(&stop_share(sharer).stdout);
    assert_eq!(connected_paths(&log), ["direct", "relay"], "{log:?}");
}

#[test]
fn a_send_to_whose_meeting_is_taken_at_the_relay_waits_and_asks_again() {
    let (w, _relay, at) = paired_with_a_clone();
    let via = ["--relay", at.as_str(), "--force-relay"];
    let send = |who: &str| {
        let child = w
            .as_(who)
            .args(["send", "--json", "--to", "b"])
            .args(via)
            .arg(w.src())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Watched::new(child)
    };
    let mut thief = send("a2");
    thief.wait_for(|e| e["event"] == "waiting");
    std::thread::sleep(std::time::Duration::from_secs(1)); // time to reach the relay (an order)
                                                           // Only the relay is there: a warns and keeps waiting instead of failing.
    let mut sender = send("a");
    let message = taken_warning(&mut sender);
    assert!(!message.contains("direct connections"), "{message}");
    drop(thief);
    let received = w
        .as_("b")
        .args(["receive", "--json", "--yes", "--wait", "60s", "--from", "a"])
        .args(via)
        .arg("--out")
        .arg(w.out())
        .output()
        .unwrap();
    assert_success("receive --from through the relay", &received);
    assert_success("send --to once the meeting is free", &sender.finish());
    assert_eq!(
        fs::read(w.out().join("src/f.txt")).unwrap(),
        b"the real a\n"
    );
}
