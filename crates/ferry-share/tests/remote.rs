//! `remote::Remote` against the real sharer (`io::serve` on a thread per connection) over real encrypted
//! channels on loopback TCP: many threads at once, many reads in flight, cancels, changes, a sharer that
//! dies or goes silent, and one that comes back on another listener.

mod common;

use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{channel, start_sharer_with, Sharer, Tap};
use ferry_channel::IdentityKey;
use ferry_share::io::Changes;
use ferry_share::remote::{
    Dial, LinkState, PutContent, PutOutcome, ReadPiece, Remote, RemoteConfig, RemoteError,
};
use ferry_share::server::ServerConfig;
use ferry_share::wire::{ErrorCode, Kind, SharePath, Time};
use ferry_testkit::{pseudo_random, TempDir};

const BIG: usize = 3 * 1024 * 1024 + 777;

/// A share, its sharer (replaceable: the dial reaches whichever is current, or fails when there is none), and
/// the client's sockets, to cut them.
struct World {
    dir: TempDir,
    me: [u8; 32],
    current: Arc<Mutex<Option<Arc<Sharer>>>>,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
    changes: Changes,
    _watch: ferry_share::watch::Watcher,
    /// The sharer's settings (writable or not).
    config: ServerConfig,
}

impl World {
    fn new() -> World {
        World::with(ServerConfig::default())
    }

    /// A world whose sharer lets the client write.
    fn writable() -> World {
        World::with(ServerConfig {
            writable: true,
            peer: "bob".into(),
            ..ServerConfig::default()
        })
    }

    fn with(config: ServerConfig) -> World {
        let dir = ferry_testkit::temp_dir("ferry-remote-");
        let share = dir.path().join("share");
        std::fs::create_dir_all(share.join("docs")).unwrap();
        std::fs::write(share.join("big.bin"), pseudo_random(BIG, 5)).unwrap();
        std::fs::write(share.join("docs/note.txt"), b"hello from the sharer").unwrap();
        for i in 0..20 {
            let name = format!("docs/small-{i:02}");
            std::fs::write(share.join(name), pseudo_random(1000 + i * 4099, i as u64)).unwrap();
        }
        let changes = Changes::default();
        let publisher = changes.clone();
        let watch = ferry_share::watch::watch(
            &share,
            Duration::from_millis(20),
            move |paths| publisher.publish(paths),
            |_| {},
        )
        .unwrap();
        let me = IdentityKey::generate();
        let world = World {
            dir,
            me: *me.seed(),
            current: Arc::default(),
            sockets: Arc::default(),
            changes,
            _watch: watch,
            config,
        };
        world.restart();
        world
    }

    fn share(&self) -> PathBuf {
        self.dir.path().join("share")
    }

    /// A new sharer of the same share on a new listener (with a new key); the dial reaches it from now on.
    fn restart(&self) -> Arc<Sharer> {
        self.restart_with(self.config.clone())
    }

    /// [`World::restart`] with other settings (another share's name, ...).
    fn restart_with(&self, config: ServerConfig) -> Arc<Sharer> {
        let sharer = Arc::new(start_sharer_with(
            &self.share(),
            &self.dir.path().join("cache"),
            IdentityKey::from_seed(self.me).public(),
            self.changes.clone(),
            config,
        ));
        *self.current.lock().unwrap() = Some(Arc::clone(&sharer));
        sharer
    }

    /// The dial fails from now on.
    fn stop(&self) {
        *self.current.lock().unwrap() = None;
    }

    /// Cuts every connection the client made.
    fn cut(&self) {
        for s in self.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn dial(&self) -> Dial {
        let (current, sockets, me) = (
            Arc::clone(&self.current),
            Arc::clone(&self.sockets),
            self.me,
        );
        Box::new(move || {
            let sharer = current
                .lock()
                .unwrap()
                .clone()
                .ok_or("the sharer is gone")?;
            let (reader, writer) =
                channel(&sharer, IdentityKey::from_seed(me)).map_err(|e| e.to_string())?;
            sockets
                .lock()
                .unwrap()
                .push(writer.get_ref().try_clone().unwrap());
            Ok((reader, writer))
        })
    }

    fn connect(&self, config: RemoteConfig) -> Connected {
        let (changed_tx, changed) = mpsc::channel();
        let (link_tx, link) = mpsc::channel();
        let (changed_tx, link_tx) = (Mutex::new(changed_tx), Mutex::new(link_tx));
        let remote = Remote::connect(
            self.dial(),
            config,
            Box::new(move |paths| {
                let _ = changed_tx.lock().unwrap().send(paths);
            }),
            Box::new(move |state| {
                let _ = link_tx.lock().unwrap().send(state);
            }),
        )
        .unwrap();
        Connected {
            remote,
            changed,
            link,
        }
    }

    fn file(&self, path: &str) -> Vec<u8> {
        std::fs::read(self.share().join(path)).unwrap()
    }
}

struct Connected {
    remote: Remote,
    changed: mpsc::Receiver<Vec<SharePath>>,
    link: mpsc::Receiver<LinkState>,
}

impl Connected {
    /// Waits (10 s at most) for a link state matching `want`.
    fn link_until(&self, want: impl Fn(&LinkState) -> bool) -> LinkState {
        loop {
            let state = self
                .link
                .recv_timeout(Duration::from_secs(10))
                .expect("a link state");
            if want(&state) {
                return state;
            }
        }
    }

    /// Waits (10 s at most) for a change notification naming `path`.
    fn changed_until(&self, path: &SharePath) {
        loop {
            let paths = self
                .changed
                .recv_timeout(Duration::from_secs(10))
                .expect("a change");
            if paths.contains(path) {
                return;
            }
        }
    }
}

fn p(s: &str) -> SharePath {
    SharePath::new(s.as_bytes()).unwrap()
}

fn config(max_in_flight: u32, deadline: Duration) -> RemoteConfig {
    RemoteConfig {
        max_in_flight,
        deadline,
        redial_backoff: (Duration::from_millis(10), Duration::from_millis(200)),
        ..RemoteConfig::default()
    }
}

/// Makes the sharer's next connection write nothing more once `at` bytes went out, until the returned
/// sender is dropped (nothing is closed: the sharer just goes silent).
fn go_silent_at(sharer: &Sharer, at: u64) -> mpsc::Sender<()> {
    let (release, hold) = mpsc::channel::<()>();
    let hold = Mutex::new(hold);
    sharer.taps.lock().unwrap().push_back(Tap {
        at,
        action: Box::new(move || {
            let _ = hold.lock().unwrap().recv();
            Ok(())
        }),
    });
    release
}

/// The bytes of `path` from `offset`, `len` long, through a read handle.
fn read_all(remote: &Remote, path: &SharePath, offset: u64, len: u64) -> Vec<u8> {
    let mut handle = remote.read(path, None, offset, len).unwrap();
    let mut out = Vec::new();
    let mut version = None;
    while let Some(piece) = handle.next().unwrap() {
        match piece {
            ReadPiece::Version(v) => version = Some(v),
            ReadPiece::Data {
                offset: o, bytes, ..
            } => {
                assert!(version.is_some(), "data before the version");
                assert_eq!(o, offset + out.len() as u64, "pieces in order");
                out.extend_from_slice(&bytes);
            }
        }
    }
    out
}

fn slice(data: &[u8], offset: u64, len: u64) -> &[u8] {
    let start = (offset as usize).min(data.len());
    &data[start..(start + len as usize).min(data.len())]
}

#[test]
fn eight_threads_stat_list_and_read_what_the_files_hold() {
    let world = World::new();
    let c = world.connect(config(4, Duration::from_secs(10)));
    assert_eq!(c.link.recv().unwrap(), LinkState::Up);
    let big = world.file("big.bin");
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (remote, world, big) = (c.remote.clone(), &world, &big);
            s.spawn(move || {
                let mut seed = t + 1;
                for round in 0..25 {
                    let names: Vec<String> = remote
                        .list(&p("docs"))
                        .unwrap()
                        .into_iter()
                        .map(|e| String::from_utf8(e.name).unwrap())
                        .collect();
                    assert_eq!(names.len(), 21);
                    let name = &names[round % names.len()];
                    let path = format!("docs/{name}");
                    let entry = remote.stat(&p(&path)).unwrap();
                    let data = world.file(&path);
                    assert_eq!((entry.kind, entry.size), (Kind::File, data.len() as u64));
                    let mut buf = vec![0; data.len() + 10];
                    let (version, n) = remote.read_into(&p(&path), None, 0, &mut buf).unwrap();
                    assert_eq!((version.size, &buf[..n]), (data.len() as u64, &data[..]));
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let offset = (seed >> 20) % (BIG as u64 + 1);
                    let len = (seed >> 8) % 300_000;
                    let got = read_all(&remote, &p("big.bin"), offset, len);
                    assert_eq!(got, slice(big, offset, len), "{offset} {len}");
                }
            });
        }
    });
}

#[test]
fn the_share_s_space_comes_back_and_the_link_goes_on() {
    let world = World::new();
    let c = world.connect(config(4, Duration::from_secs(10)));
    assert_eq!(c.link.recv().unwrap(), LinkState::Up);
    let st = rustix::fs::statvfs(world.share()).unwrap();
    for _ in 0..3 {
        let space = c.remote.space().unwrap();
        assert_eq!(
            (u64::from(space.block), space.blocks, space.files),
            (st.f_frsize, st.f_blocks, st.f_files)
        );
        assert!(space.available <= space.free && space.free <= space.blocks);
        // The answer is routed like any other: the link's reader goes on serving.
        assert_eq!(c.remote.stat(&p("docs")).unwrap().kind, Kind::Dir);
    }
}

#[test]
fn sixty_four_reads_in_flight_each_get_their_bytes() {
    let world = World::new();
    let c = world.connect(config(64, Duration::from_secs(10)));
    let big = world.file("big.bin");
    let mut handles: Vec<_> = (0..64u64)
        .map(|i| {
            let offset = i * 49_000;
            (
                offset,
                c.remote
                    .read(&p("big.bin"), None, offset, 4096 + i * 1000)
                    .unwrap(),
            )
        })
        .collect();
    // Taken in reverse, so the last issued waits longest.
    while let Some((offset, mut handle)) = handles.pop() {
        let mut got = Vec::new();
        while let Some(piece) = handle.next().unwrap() {
            if let ReadPiece::Data { bytes, .. } = piece {
                got.extend_from_slice(&bytes);
            }
        }
        let len = 4096 + (offset / 49_000) * 1000;
        assert_eq!(got, slice(&big, offset, len));
    }
}

#[test]
fn requests_beyond_the_limit_wait_for_a_slot() {
    let world = World::new();
    // One slot: every other request of 8 threads waits for it, none fails busy.
    let c = world.connect(config(1, Duration::from_secs(10)));
    let note = world.file("docs/note.txt");
    std::thread::scope(|s| {
        for _ in 0..8 {
            let (remote, note) = (c.remote.clone(), &note);
            s.spawn(move || {
                for _ in 0..50 {
                    let mut buf = [0u8; 100];
                    let (_, n) = remote
                        .read_into(&p("docs/note.txt"), None, 0, &mut buf)
                        .unwrap();
                    assert_eq!(&buf[..n], &note[..]);
                    assert_eq!(remote.stat(&p("docs")).unwrap().kind, Kind::Dir);
                }
            });
        }
    });
}

#[test]
fn a_dropped_read_is_cancelled_and_frees_its_slot() {
    let world = World::new();
    let c = world.connect(config(2, Duration::from_secs(10)));
    // Twenty large reads dropped after their version: had a dropped read kept its slot, the third would wait
    // out the deadline.
    for _ in 0..20 {
        let mut handle = c.remote.read(&p("big.bin"), None, 0, BIG as u64).unwrap();
        assert!(matches!(
            handle.next().unwrap(),
            Some(ReadPiece::Version(_))
        ));
        drop(handle);
    }
    let big = world.file("big.bin");
    assert_eq!(
        read_all(&c.remote, &p("big.bin"), 1000, 70_000),
        &big[1000..71_000]
    );
    assert_eq!(c.remote.stat(&p("big.bin")).unwrap().size, BIG as u64);
}

#[test]
fn refusals_come_back_with_their_code_and_errno() {
    let world = World::new();
    let c = world.connect(config(8, Duration::from_secs(10)));
    let e = c.remote.stat(&p("missing")).unwrap_err();
    assert!(
        matches!(e, RemoteError::Remote(ErrorCode::NotFound, _)),
        "{e:?}"
    );
    assert_eq!(e.errno(), rustix::io::Errno::NOENT.raw_os_error());
    let e = c.remote.list(&p("docs/note.txt")).unwrap_err();
    assert!(
        matches!(e, RemoteError::Remote(ErrorCode::WrongKind, _)),
        "{e:?}"
    );
    assert_eq!(e.errno(), rustix::io::Errno::NOTDIR.raw_os_error());
    // From the end: an empty read; past it, a refusal.
    let mut buf = [0u8; 10];
    let (version, n) = c
        .remote
        .read_into(&p("docs/note.txt"), None, 21, &mut buf)
        .unwrap();
    assert_eq!((version.size, n), (21, 0));
    let e = c
        .remote
        .read_into(&p("docs/note.txt"), None, 22, &mut buf)
        .unwrap_err();
    assert!(
        matches!(e, RemoteError::Remote(ErrorCode::BadRequest, _)),
        "{e:?}"
    );
    assert_eq!(c.remote.share(), b"");
}

#[test]
fn a_changed_file_is_announced_and_read_at_its_new_version_never_mixed() {
    let world = World::new();
    let c = world.connect(config(8, Duration::from_secs(10)));
    let path = p("docs/note.txt");
    let mut buf = [0u8; 64];
    let (old, n) = c.remote.read_into(&path, None, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello from the sharer");
    std::fs::write(
        world.share().join("docs/note.txt"),
        b"changed on the sharer!",
    )
    .unwrap();
    c.changed_until(&path);
    let e = c
        .remote
        .read_into(&path, Some(old.root), 0, &mut buf)
        .unwrap_err();
    assert!(
        matches!(e, RemoteError::Remote(ErrorCode::Changed, _)),
        "{e:?}"
    );
    assert_eq!(e.errno(), rustix::io::Errno::STALE.raw_os_error());
    let (new, n) = c.remote.read_into(&path, None, 0, &mut buf).unwrap();
    assert_ne!(new, old);
    assert_eq!(&buf[..n], b"changed on the sharer!");
}

/// A sharer whose connection is cut 256 KiB into a read, and that cannot be dialled again.
#[test]
fn a_read_in_flight_fails_when_the_sharer_dies() {
    let world = World::new();
    let sharer = world.restart();
    sharer.taps.lock().unwrap().push_back(Tap {
        at: 256 << 10,
        action: Box::new(|| Err(std::io::ErrorKind::BrokenPipe.into())),
    });
    let c = world.connect(config(8, Duration::from_millis(500)));
    world.stop();
    let mut buf = vec![0u8; BIG];
    let e = c
        .remote
        .read_into(&p("big.bin"), None, 0, &mut buf)
        .unwrap_err();
    assert!(matches!(e, RemoteError::Disconnected(_)), "{e:?}");
    assert_eq!(e.errno(), rustix::io::Errno::IO.raw_os_error());
    assert!(matches!(
        c.link_until(|s| matches!(s, LinkState::Lost(_))),
        LinkState::Lost(_)
    ));
    // While it is down, a request waits for the redial until its deadline, then fails.
    let e = c.remote.stat(&p("docs")).unwrap_err();
    assert!(matches!(e, RemoteError::Disconnected(_)), "{e:?}");
}

/// A sharer that stops answering mid-read without closing anything: the read fails within the deadline.
#[test]
fn a_read_in_flight_fails_when_the_sharer_goes_silent() {
    let world = World::new();
    let sharer = world.restart();
    // Silent until the test ends.
    let release = go_silent_at(&sharer, 256 << 10);
    let c = world.connect(config(8, Duration::from_millis(500)));
    world.stop();
    let mut handle = c.remote.read(&p("big.bin"), None, 0, BIG as u64).unwrap();
    let e = loop {
        match handle.next() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the whole read arrived"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(e, RemoteError::Deadline | RemoteError::Disconnected(_)),
        "{e:?}"
    );
    drop(release);
}

#[test]
fn the_link_comes_back_on_a_new_listener_and_says_so() {
    let world = World::new();
    let c = world.connect(config(8, Duration::from_secs(10)));
    assert_eq!(c.link.recv().unwrap(), LinkState::Up);
    assert_eq!(c.remote.stat(&p("docs")).unwrap().kind, Kind::Dir);
    let first = world.current.lock().unwrap().clone().unwrap();
    world.restart();
    world.cut();
    assert!(matches!(c.link_until(|_| true), LinkState::Lost(_)));
    assert_eq!(c.link_until(|_| true), LinkState::Back);
    c.changed_until(&SharePath::root());
    let big = world.file("big.bin");
    assert_eq!(
        read_all(&c.remote, &p("big.bin"), 5, 200_000),
        &big[5..200_005]
    );
    // The new connection went to the new sharer; the change subscription is renewed.
    assert_ne!(
        world.current.lock().unwrap().as_ref().unwrap().addr,
        first.addr
    );
    std::fs::write(world.share().join("docs/new.txt"), b"new").unwrap();
    c.changed_until(&p("docs/new.txt"));
}

#[test]
fn requests_in_flight_when_the_link_drops_are_retried_on_the_new_one() {
    let world = World::new();
    let c = world.connect(config(8, Duration::from_secs(10)));
    let big = world.file("big.bin");
    let (remote, expected) = (c.remote.clone(), big.clone());
    let reader = std::thread::spawn(move || {
        for _ in 0..20 {
            let mut buf = vec![0u8; BIG];
            let (_, n) = remote.read_into(&p("big.bin"), None, 0, &mut buf).unwrap();
            assert_eq!(&buf[..n], &expected[..]);
        }
    });
    c.link_until(|s| *s == LinkState::Up);
    world.cut();
    assert_eq!(c.link_until(|s| *s == LinkState::Back), LinkState::Back);
    reader.join().unwrap();
}

/// A link that is idle is probed; a sharer that stops answering is found lost by the probe, and the link
/// comes back by itself.
#[test]
fn an_idle_link_to_a_silent_sharer_is_found_lost_and_redialled() {
    let world = World::new();
    let sharer = world.restart();
    // After its hello the sharer writes nothing more on this connection (the next ones are left alone).
    let release = go_silent_at(&sharer, 1);
    let c = world.connect(RemoteConfig {
        keepalive: Duration::from_millis(50),
        ..config(8, Duration::from_millis(300))
    });
    assert_eq!(c.link_until(|_| true), LinkState::Up);
    assert!(matches!(c.link_until(|_| true), LinkState::Lost(_)));
    assert_eq!(c.link_until(|_| true), LinkState::Back);
    assert_eq!(c.remote.stat(&p("docs")).unwrap().kind, Kind::Dir);
    drop(release);
}

/// Dropping the last clone closes: a read waiting on a silent sharer ends with `Closed`, not after its
/// deadline, and other clones work until then.
#[test]
fn dropping_the_last_clone_closes_the_remote() {
    let world = World::new();
    let sharer = world.restart();
    let release = go_silent_at(&sharer, 256 << 10);
    let c = world.connect(config(8, Duration::from_secs(30)));
    let other = c.remote.clone();
    drop(c.remote);
    let mut handle = other.read(&p("big.bin"), None, 0, BIG as u64).unwrap();
    assert!(matches!(
        handle.next().unwrap(),
        Some(ReadPiece::Version(_))
    ));
    drop(other);
    let e = loop {
        match handle.next() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the whole read arrived"),
            Err(e) => break e,
        }
    };
    assert_eq!(e, RemoteError::Closed);
    drop(release);
}

#[test]
fn a_remote_is_send_sync_and_a_read_handle_send() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Remote>();
    send::<ferry_share::remote::ReadHandle>();
}

/// CPU (both sides: this process holds the sharer too) per random 4 KiB read, `Session` against `Remote`,
/// one at a time and 64 in flight. Run with `cargo test --release -p ferry-share --test remote -- --ignored
/// --nocapture cpu_per_4k_read`; a figure, not a check.
#[test]
#[ignore = "a measurement"]
fn cpu_per_4k_read_session_against_remote() {
    let world = World::new();
    let path = p("big.bin");
    let count = 30_000u64;
    let offsets: Vec<u64> = (0..count)
        .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) % (BIG as u64 / 4096) * 4096)
        .collect();
    let (reader, writer) = world.dial()().unwrap();
    let mut session = ferry_share::io::Session::open(reader, writer, 64).unwrap();
    for depth in [1usize, 64] {
        let cpu = cpu_per(count, || {
            let mut issued = 0;
            let mut done = 0;
            while done < offsets.len() {
                while issued < offsets.len() && issued - done < depth {
                    let client = session.client();
                    client
                        .read(path.clone(), None, offsets[issued], 4096)
                        .unwrap();
                    issued += 1;
                }
                match session.next_event().unwrap() {
                    ferry_share::client::Event::Done { .. } => done += 1,
                    ferry_share::client::Event::Failed { failure, .. } => panic!("{failure:?}"),
                    _ => {}
                }
            }
        });
        eprintln!("Session, {depth:2} in flight: {cpu:5.1} µs CPU per 4 KiB read");
    }
    let c = world.connect(config(64, Duration::from_secs(10)));
    let cpu = cpu_per(count, || {
        let mut buf = [0u8; 4096];
        for &offset in &offsets {
            c.remote.read_into(&path, None, offset, &mut buf).unwrap();
        }
    });
    eprintln!("Remote,   1 in flight: {cpu:5.1} µs CPU per 4 KiB read (read_into)");
    let cpu = cpu_per(count, || {
        let mut window = std::collections::VecDeque::new();
        let drain = |mut h: ferry_share::remote::ReadHandle| while h.next().unwrap().is_some() {};
        for &offset in &offsets {
            if window.len() == 64 {
                drain(window.pop_front().unwrap());
            }
            window.push_back(c.remote.read(&path, None, offset, 4096).unwrap());
        }
        window.into_iter().for_each(drain);
    });
    eprintln!(
        "Remote,  64 in flight: {cpu:5.1} µs CPU per 4 KiB read (one thread, a window of handles)"
    );
    let cpu = cpu_per(count, || {
        std::thread::scope(|s| {
            for chunk in offsets.chunks(offsets.len() / 64) {
                let (remote, path) = (c.remote.clone(), &path);
                s.spawn(move || {
                    let mut buf = [0u8; 4096];
                    for &offset in chunk {
                        remote.read_into(path, None, offset, &mut buf).unwrap();
                    }
                });
            }
        });
    });
    eprintln!("Remote,  64 threads:   {cpu:5.1} µs CPU per 4 KiB read (read_into on each)");
}

/// The process's CPU time (user + system) spent in `work`, per one of `count`, in µs.
fn cpu_per(count: u64, work: impl FnOnce()) -> f64 {
    fn cpu_ticks() -> u64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    }
    let before = cpu_ticks();
    work();
    // Clock ticks are 10 ms on Linux (USER_HZ = 100).
    (cpu_ticks() - before) as f64 * 10_000.0 / count as f64
}

/// The callbacks run on a thread of their own: one may use the remote (the mount stats a changed path).
#[test]
fn a_change_callback_may_use_the_remote() {
    let world = World::new();
    let slot: Arc<Mutex<Option<Remote>>> = Arc::default();
    let (tx, stats) = mpsc::channel();
    let (tx, in_callback) = (Mutex::new(tx), Arc::clone(&slot));
    let remote = Remote::connect(
        world.dial(),
        config(8, Duration::from_secs(5)),
        Box::new(move |paths| {
            let remote = in_callback.lock().unwrap().clone();
            for path in paths {
                if let Some(remote) = &remote {
                    let _ = tx.lock().unwrap().send((path.clone(), remote.stat(&path)));
                }
            }
        }),
        Box::new(|_| {}),
    )
    .unwrap();
    *slot.lock().unwrap() = Some(remote.clone());
    std::fs::write(world.share().join("docs/new.txt"), b"new").unwrap();
    let (_, stat) = std::iter::from_fn(|| stats.recv_timeout(Duration::from_secs(10)).ok())
        .find(|(path, _)| *path == p("docs/new.txt"))
        .expect("a change of docs/new.txt");
    assert_eq!(stat.unwrap().size, 3);
    // No cycle left behind: the callback's clone goes.
    slot.lock().unwrap().take();
}

/// A request made while the link is down waits for the redial (within its deadline) and then succeeds.
#[test]
fn a_request_made_while_the_link_is_down_waits_for_it() {
    let world = World::new();
    let c = world.connect(config(8, Duration::from_secs(10)));
    assert_eq!(c.link_until(|_| true), LinkState::Up);
    world.stop();
    world.cut();
    assert!(matches!(c.link_until(|_| true), LinkState::Lost(_)));
    assert!(!c.remote.is_up());
    let remote = c.remote.clone();
    let waiting = std::thread::spawn(move || remote.stat(&p("docs/note.txt")));
    world.restart();
    assert_eq!(waiting.join().unwrap().unwrap().size, 21);
    assert_eq!(c.link_until(|_| true), LinkState::Back);
    assert!(c.remote.is_up());
}

/// Once the sharer has been out of reach for a whole deadline, requests fail at once instead of each waiting
/// a deadline of its own; the link still comes back by itself, and requests go through again.
#[test]
fn requests_fail_at_once_once_the_sharer_was_out_of_reach_for_a_deadline() {
    let deadline = Duration::from_secs(3);
    let world = World::new();
    let c = world.connect(config(8, deadline));
    assert_eq!(c.link_until(|_| true), LinkState::Up);
    world.stop();
    world.cut();
    assert!(matches!(c.link_until(|_| true), LinkState::Lost(_)));
    std::thread::sleep(deadline + Duration::from_millis(300));
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let e = c.remote.stat(&p("docs/note.txt")).unwrap_err();
        assert!(matches!(e, RemoteError::Disconnected(_)), "{e:?}");
        // At once: far less than the deadline each request used to wait.
        assert!(started.elapsed() < deadline / 2, "{:?}", started.elapsed());
        let read = c.remote.read(&p("big.bin"), None, 0, 10);
        assert!(matches!(read, Err(RemoteError::Disconnected(_))));
    }
    world.restart();
    assert_eq!(c.link_until(|_| true), LinkState::Back);
    assert_eq!(c.remote.stat(&p("docs/note.txt")).unwrap().size, 21);
}

// ---- Writes ----

fn errno_of(r: Result<(), RemoteError>) -> rustix::io::Errno {
    rustix::io::Errno::from_raw_os_error(r.unwrap_err().errno())
}

/// A local file holding `data` (the client's copy that a put sends).
fn local(world: &World, name: &str, data: &[u8]) -> std::fs::File {
    let path = world.dir.path().join(name);
    std::fs::write(&path, data).unwrap();
    std::fs::File::open(path).unwrap()
}

fn root_of(data: &[u8]) -> [u8; 32] {
    *blake3::hash(data).as_bytes()
}

#[test]
fn writes_land_and_fail_with_the_errno_a_file_system_gives() {
    use rustix::io::Errno;
    let world = World::writable();
    let c = world.connect(config(8, Duration::from_secs(10)));
    let r = &c.remote;

    // A new file, then two small changes sent alone, then a truncate: each answer is the base of the next.
    let v1 = pseudo_random(2 * 1024 * 1024 + 3, 40);
    let out = r.put(
        &p("docs/new.bin"),
        None,
        PutContent::new(&local(&world, "v1", &v1), None, 0o640, None),
    );
    let PutOutcome::Written { version } = out.unwrap() else {
        panic!("not written");
    };
    assert_eq!(
        (version.size, version.root),
        (v1.len() as u64, root_of(&v1))
    );
    assert_eq!(world.file("docs/new.bin"), v1);
    assert_eq!(read_all(r, &p("docs/new.bin"), 0, u64::MAX), v1);
    let mut v2 = v1.clone();
    v2[5..9].copy_from_slice(b"edit");
    v2[2_000_000..2_000_004].copy_from_slice(b"more");
    let ranges = [5..9, 2_000_000..2_000_004];
    let file = local(&world, "v2", &v2);
    let out = r.put(
        &p("docs/new.bin"),
        Some(version.root),
        PutContent::new(&file, Some(&ranges), 0o640, None),
    );
    assert!(matches!(out.unwrap(), PutOutcome::Written { .. }));
    assert_eq!(world.file("docs/new.bin"), v2);
    let v3 = v2[..100].to_vec();
    let mtime = Some(Time {
        secs: 1_650_000_000,
        nanos: 0,
    });
    let file = local(&world, "v3", &v3);
    let out = r.put(
        &p("docs/new.bin"),
        Some(root_of(&v2)),
        PutContent::new(&file, Some(&[]), 0o640, mtime),
    );
    assert!(matches!(out.unwrap(), PutOutcome::Written { .. }));
    assert_eq!(world.file("docs/new.bin"), v3);
    assert_eq!(r.stat(&p("docs/new.bin")).unwrap().mtime, 1_650_000_000);

    // The sharer changed it meanwhile: a whole put and a partial one both keep the two versions.
    std::fs::write(world.share().join("docs/new.bin"), b"the sharer's").unwrap();
    let first = 0..3;
    for ranges in [None, Some(std::slice::from_ref(&first))] {
        let file = local(&world, "v4", b"the client's");
        let out = r.put(
            &p("docs/new.bin"),
            Some(root_of(&v3)),
            PutContent::new(&file, ranges, 0o640, None),
        );
        let PutOutcome::Conflicted { name } = out.unwrap() else {
            panic!("no conflict");
        };
        let name = String::from_utf8(name).unwrap();
        assert!(name.starts_with("new.bin.conflict-bob-"), "{name}");
        assert_eq!(world.file(&format!("docs/{name}")), b"the client's");
    }
    assert_eq!(world.file("docs/new.bin"), b"the sharer's");
    let stale = r.unlink(&p("docs/new.bin"), Some(root_of(&v3)));
    assert_eq!(errno_of(stale), Errno::STALE);
    assert_eq!(world.file("docs/new.bin"), b"the sharer's");

    // Directories, renames, attributes, symlinks.
    r.mkdir(&p("made"), 0o755).unwrap();
    assert_eq!(errno_of(r.mkdir(&p("made"), 0o755)), Errno::EXIST);
    let renamed = r.rename(&p("docs/new.bin"), &p("made/moved.bin"), false, None);
    assert_eq!(renamed.unwrap(), None);
    assert_eq!(world.file("made/moved.bin"), b"the sharer's");
    // A rename over a file that is no longer the version named: that file stays, the moved one goes
    // beside it; over the version named, it replaces it.
    std::fs::write(world.share().join("made/tmp"), b"an editor's save").unwrap();
    let kept = r.rename(
        &p("made/tmp"),
        &p("made/moved.bin"),
        true,
        Some(root_of(&v3)),
    );
    let kept = String::from_utf8(kept.unwrap().expect("kept beside")).unwrap();
    assert!(kept.starts_with("moved.bin.conflict-bob-"), "{kept}");
    assert_eq!(world.file("made/moved.bin"), b"the sharer's");
    assert_eq!(world.file(&format!("made/{kept}")), b"an editor's save");
    let over = r.rename(
        &p(&format!("made/{kept}")),
        &p("made/moved.bin"),
        true,
        Some(root_of(b"the sharer's")),
    );
    assert_eq!(over.unwrap(), None);
    assert_eq!(world.file("made/moved.bin"), b"an editor's save");
    std::fs::write(world.share().join("made/moved.bin"), b"the sharer's").unwrap();
    r.set_attr(&p("made/moved.bin"), Some(0o600), None).unwrap();
    assert_eq!(r.stat(&p("made/moved.bin")).unwrap().mode & 0o777, 0o600);
    r.symlink(&p("made/link"), b"moved.bin").unwrap();
    assert_eq!(r.stat(&p("made/link")).unwrap().kind, Kind::Symlink);
    let out = r.symlink(&p("made/out"), b"../../secret");
    assert_eq!(errno_of(out), Errno::ACCESS);
    assert_eq!(errno_of(r.rmdir(&p("made"))), Errno::NOTEMPTY);
    assert_eq!(errno_of(r.unlink(&p("made/none"), None)), Errno::NOENT);
    r.unlink(&p("made/link"), None).unwrap();
    r.unlink(&p("made/moved.bin"), Some(root_of(b"the sharer's")))
        .unwrap();
    r.rmdir(&p("made")).unwrap();
    assert!(!world.share().join("made").exists());
}

#[test]
fn a_share_that_is_not_writable_answers_erofs() {
    let world = World::new();
    let c = world.connect(config(8, Duration::from_secs(10)));
    let file = local(&world, "mine", b"mine");
    let e = c
        .remote
        .put(
            &p("docs/x"),
            None,
            PutContent::new(&file, None, 0o644, None),
        )
        .unwrap_err();
    assert!(
        matches!(e, RemoteError::Remote(ErrorCode::ReadOnly, _)),
        "{e:?}"
    );
    assert_eq!(e.errno(), rustix::io::Errno::ROFS.raw_os_error());
    let e = c.remote.mkdir(&p("d"), 0o755);
    assert_eq!(errno_of(e), rustix::io::Errno::ROFS);
    assert!(!world.share().join("docs/x").exists());
    // The link goes on.
    assert_eq!(c.remote.stat(&p("docs")).unwrap().kind, Kind::Dir);
}

#[test]
fn eight_threads_write_and_read_back_at_once() {
    let world = World::writable();
    let c = world.connect(config(4, Duration::from_secs(10)));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let remote = c.remote.clone();
            let data = pseudo_random(1024 * 1024 + t as usize * 1000, 50 + t);
            let file = local(&world, &format!("t{t}"), &data);
            std::thread::spawn(move || {
                let path = p(&format!("docs/t{t}.bin"));
                // New, then replaced twice from the version just written.
                let mut base = None;
                for _ in 0..3 {
                    let out = remote.put(&path, base, PutContent::new(&file, None, 0o644, None));
                    let PutOutcome::Written { version } = out.unwrap() else {
                        panic!("not written");
                    };
                    base = Some(version.root);
                    assert_eq!(read_all(&remote, &path, 0, u64::MAX), data);
                }
                data
            })
        })
        .collect();
    for (t, thread) in threads.into_iter().enumerate() {
        let data = thread.join().unwrap();
        assert_eq!(world.file(&format!("docs/t{t}.bin")), data);
    }
}

#[test]
fn a_put_whose_link_is_cut_lands_once_on_the_next_link() {
    let world = World::writable();
    let c = world.connect(config(8, Duration::from_secs(10)));
    let data = pseudo_random(32 * 1024 * 1024, 60);
    let file = local(&world, "big", &data);
    let remote = c.remote.clone();
    let put = std::thread::spawn(move || {
        remote.put(
            &p("docs/cut.bin"),
            None,
            PutContent::new(&file, None, 0o644, None),
        )
    });
    // Cut once the sharer holds part of it (its temp file exists).
    let docs = world.share().join("docs");
    let has_temp = || {
        std::fs::read_dir(&docs).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".ferry-put-")
        })
    };
    while !has_temp() && !put.is_finished() {
        std::thread::yield_now();
    }
    world.cut();
    let out = put.join().unwrap().unwrap();
    assert!(matches!(out, PutOutcome::Written { .. }), "{out:?}");
    assert_eq!(world.file("docs/cut.bin"), data);
    // Landed once: no conflict copy, and the cut put's temp file is gone with its session.
    let names: Vec<String> = std::fs::read_dir(&docs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.contains(".conflict-")), "{names:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while has_temp() {
        assert!(std::time::Instant::now() < deadline, "a temp file stayed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_redial_that_reaches_another_share_is_refused() {
    let world = World::with(ServerConfig {
        share: b"docs".to_vec(),
        ..ServerConfig::default()
    });
    let c = world.connect(config(8, Duration::from_secs(2)));
    assert_eq!(c.link.recv().unwrap(), LinkState::Up);
    assert_eq!(c.remote.share(), b"docs");
    // Where the share was, a sharer of another share answers now.
    world.restart_with(ServerConfig {
        share: b"photos".to_vec(),
        ..ServerConfig::default()
    });
    world.cut();
    assert!(matches!(c.link_until(|_| true), LinkState::Lost(_)));
    // It is never taken: the link stays down and a request fails with the reason.
    let e = c.remote.stat(&p("docs")).unwrap_err();
    assert!(
        matches!(&e, RemoteError::Disconnected(why) if why.contains("\"photos\", not \"docs\"")),
        "{e}"
    );
    assert!(c.link.recv_timeout(Duration::from_millis(300)).is_err());
    // The share itself back at a new listener: the link comes back.
    world.restart();
    assert_eq!(c.link_until(|_| true), LinkState::Back);
    assert_eq!(c.remote.stat(&p("docs")).unwrap().kind, Kind::Dir);
}
