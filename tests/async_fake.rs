//! Fake-kernel tests of the async adapter (`fuse_wire::asyncfs`): an
//! INTERRUPT drops the request's future (seen by a drop guard) before the
//! one `EINTR` answer, also when the future completes at that moment; the
//! bound on futures in flight holds; a panicking future answers `EIO` and
//! the session serves on; RELEASE is never cancelled; stopping the session
//! drops what runs.
//!
//! The executor is a thread per task (`Threads`), so that the tests do not
//! depend on a runtime.

mod common_fake;

use common_fake::*;
use fuse_wire::asyncfs::{AsyncContext, AsyncFilesystem, AsyncFs, Data, Spawn};
use fuse_wire::{Errno, FileAttr, FileHandle, Inode, ReadRequest, ReleaseRequest, SessionConfig};
use std::future::{Future, poll_fn};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

const GETATTR: u32 = 3;
const READ: u32 = 15;
const RELEASE: u32 = 18;
const INTERRUPT: u32 = 36;

/// Node whose READ waits for the gate.
const SLOW: u64 = 5;
/// Node whose READ panics.
const PANICS: u64 = 6;
/// Node whose READ completes in the poll during which it sees the INTERRUPT.
const RACES: u64 = 7;

// ---- an executor: a thread per task ----

struct Unpark(std::thread::Thread);
impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark()
    }
}

fn block_on<T: Future>(f: T) -> T::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(&waker)) {
            return v;
        }
        std::thread::park();
    }
}

struct Threads;
impl Spawn for Threads {
    fn spawn<T: Future<Output = ()> + Send + 'static>(&self, task: T) {
        std::thread::spawn(move || block_on(task));
    }
}

// ---- the filesystem ----

/// A condition futures wait for; `open` lets them all through.
#[derive(Default)]
struct Gate(Mutex<(bool, Vec<Waker>)>);

impl Gate {
    async fn wait(&self) {
        poll_fn(|cx| {
            let mut g = self.0.lock().unwrap();
            if g.0 {
                Poll::Ready(())
            } else {
                g.1.push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }

    fn open(&self) {
        let wakers = {
            let mut g = self.0.lock().unwrap();
            g.0 = true;
            std::mem::take(&mut g.1)
        };
        wakers.into_iter().for_each(Waker::wake);
    }
}

#[derive(Default)]
struct Slow {
    gate: Gate,
    /// Futures started, running now, most at once, dropped.
    started: AtomicUsize,
    running: AtomicUsize,
    peak: AtomicUsize,
    dropped: AtomicUsize,
}

/// Counts a future as running while it lives (the drop guard).
struct Alive<'a>(&'a Slow);

impl Slow {
    fn enter(&self) -> Alive<'_> {
        self.started.fetch_add(1, SeqCst);
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.peak.fetch_max(now, SeqCst);
        Alive(self)
    }
}

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, SeqCst);
        self.0.dropped.fetch_add(1, SeqCst);
    }
}

impl AsyncFilesystem for Slow {
    async fn getattr(
        &self,
        _: &AsyncContext,
        ino: Inode,
        _: Option<FileHandle>,
    ) -> Result<(Duration, FileAttr), Errno> {
        Ok((ATTR_TTL, file_attr(ino.0)))
    }

    async fn read(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        _: FileHandle,
        _: ReadRequest,
    ) -> Result<Data, Errno> {
        let _alive = self.enter();
        match ino.0 {
            PANICS => panic!("a read that panics"),
            RACES => {
                // Complete within the poll that runs while the INTERRUPT
                // arrives: it marks the request, then wakes the task.
                let until = Instant::now() + TIMEOUT;
                while !ctx.is_interrupted() && Instant::now() < until {
                    std::thread::yield_now();
                }
                Ok(Data::from("done"))
            }
            _ => {
                self.gate.wait().await;
                Ok(Data::from("data"))
            }
        }
    }

    async fn release(
        &self,
        _: &AsyncContext,
        _: Inode,
        _: FileHandle,
        _: ReleaseRequest,
    ) -> Result<(), Errno> {
        let _alive = self.enter();
        self.gate.wait().await;
        Ok(())
    }
}

// ---- the session ----

type Served = AsyncFs<Slow, Threads>;

fn start(max_in_flight: usize, config: SessionConfig) -> (Fake<Served>, Arc<Slow>) {
    let slow = Arc::new(Slow::default());
    let fs = AsyncFs::from_arc(slow.clone(), Threads).max_in_flight(max_in_flight);
    let fake = Fake::start(Arc::new(fs), config);
    fake.init_ready(45, 0);
    (fake, slow)
}

fn read(unique: u64, ino: u64) -> Vec<u8> {
    let body = B::new()
        .u64(1)
        .u64(0)
        .u32(4096)
        .u32(0)
        .u64(0)
        .u32(0)
        .u32(0)
        .done();
    request(READ, unique, ino, &body)
}

fn interrupt(unique: u64, target: u64) -> Vec<u8> {
    request(INTERRUPT, unique, 0, &B::new().u64(target).done())
}

fn wait_count(what: &str, counter: &AtomicUsize, n: usize) {
    wait_until(what, || counter.load(SeqCst) == n);
}

#[test]
fn an_interrupt_drops_the_future_then_answers_eintr_once() {
    let (fake, slow) = start(16, SessionConfig::default());
    fake.send(read(20, SLOW));
    wait_count("the READ's future to start", &slow.started, 1);
    fake.expect_silence("a READ waiting for its gate");

    fake.send(interrupt(21, 20));
    let got = fake.recv();
    // Already gone when the answer went out.
    assert_eq!(
        slow.dropped.load(SeqCst),
        1,
        "the future was not dropped before the answer"
    );
    assert_eq!(slow.running.load(SeqCst), 0);
    assert_bytes("the interrupted READ", &got, &err_reply(20, libc::EINTR));
    // Neither a second answer, nor one when the gate opens later.
    slow.gate.open();
    fake.expect_silence("an interrupted READ after its EINTR");
    assert_eq!(slow.started.load(SeqCst), 1);
}

#[test]
fn a_future_completing_as_the_interrupt_arrives_is_answered_once() {
    let (fake, slow) = start(16, SessionConfig::default());
    let (mut eintr, mut done) = (0, 0);
    for i in 0..10u64 {
        let u = 100 + 4 * i;
        fake.send(read(u, RACES));
        wait_count("the READ's future to start", &slow.started, i as usize + 1);
        fake.send(interrupt(u + 1, u));
        let got = fake.recv();
        if got == err_reply(u, libc::EINTR) {
            eintr += 1;
        } else {
            assert_bytes(
                "the READ completed as it was interrupted",
                &got,
                &ok_reply(u, b"done"),
            );
            done += 1;
        }
        if let Some(more) = fake.recv_within(SILENCE) {
            panic!("READ {u} was answered twice: then {}", hex(&more));
        }
        wait_count("the future to be dropped", &slow.dropped, i as usize + 1);
    }
    assert_eq!(eintr + done, 10);
}

#[test]
fn the_bound_on_futures_in_flight_holds_and_the_rest_wait() {
    let config = SessionConfig {
        workers: 2,
        max_workers: 2,
        ..SessionConfig::default()
    };
    let (fake, slow) = start(3, config);
    let uniques: Vec<u64> = (0..8).map(|i| 200 + 2 * i).collect();
    for &u in &uniques {
        fake.send(read(u, SLOW));
    }
    wait_count("three futures to run", &slow.running, 3);
    fake.expect_silence("READs waiting for the gate or for room");
    assert_eq!(slow.started.load(SeqCst), 3, "futures started beyond the bound");
    assert_eq!(fake.fs.in_flight(), 3);

    slow.gate.open();
    let mut answered: Vec<u64> = Vec::new();
    for _ in &uniques {
        let got = fake.recv();
        let u = u64::from_ne_bytes(got[8..16].try_into().unwrap());
        assert_bytes("a READ", &got, &ok_reply(u, b"data"));
        answered.push(u);
    }
    answered.sort();
    assert_eq!(answered, uniques);
    assert_eq!(slow.started.load(SeqCst), 8);
    assert_eq!(
        slow.peak.load(SeqCst),
        3,
        "more futures ran at once than the bound"
    );
    assert_eq!(fake.fs.peak_in_flight(), 3);
    wait_until("every place to be given back", || fake.fs.in_flight() == 0);
}

#[test]
fn a_panicking_future_answers_eio_and_the_session_serves_on() {
    let (fake, slow) = start(16, SessionConfig::default());
    let got = fake.roundtrip(read(30, PANICS));
    assert_bytes("the READ that panicked", &got, &err_reply(30, libc::EIO));
    // Recorded as a handler's panic is, for the test kit to report.
    let panics = fake.handle.take_panics();
    assert_eq!(
        panics.iter().map(|p| (p.opcode, p.unique)).collect::<Vec<_>>(),
        [(fuse_wire::proto::Opcode::Read, 30)],
        "{panics:?}"
    );
    wait_count("the panicked future to be dropped", &slow.dropped, 1);
    let got = fake.roundtrip(request(GETATTR, 32, 9, &[0; 16]));
    assert_bytes(
        "a GETATTR after the panic",
        &got,
        &ok_reply(32, &attr_out_bytes(9)),
    );
    // A place is given back just after the answer goes out.
    wait_until("every place to be given back", || fake.fs.in_flight() == 0);
}

#[test]
fn release_is_never_cancelled() {
    let (fake, slow) = start(16, SessionConfig::default());
    let body = B::new().u64(7).u32(0).u32(0).u64(0).done();
    fake.send(request(RELEASE, 40, SLOW, &body));
    wait_count("the RELEASE's future to start", &slow.started, 1);
    fake.send(interrupt(41, 40));
    fake.expect_silence("an interrupted RELEASE");
    assert_eq!(slow.dropped.load(SeqCst), 0, "the RELEASE's future was dropped");
    slow.gate.open();
    assert_bytes("the RELEASE", &fake.recv(), &ok_reply(40, &[]));
}

#[test]
fn stopping_the_session_drops_the_futures_in_flight() {
    let (fake, slow) = start(16, SessionConfig::default());
    fake.send(read(50, SLOW));
    wait_count("the READ's future to start", &slow.started, 1);
    // The adapter outlives the session here: its end, not the adapter's
    // drop, must cancel the future.
    let adapter = fake.fs.clone();
    fake.unmount_and_join().expect("the session ends cleanly");
    wait_count("the READ's future to be dropped", &slow.dropped, 1);
    assert_eq!(slow.running.load(SeqCst), 0);
    assert_eq!(adapter.in_flight(), 0);
}

#[test]
fn an_unmount_frees_the_readers_waiting_at_the_bound() {
    let config = SessionConfig {
        workers: 2,
        max_workers: 2,
        ..SessionConfig::default()
    };
    let (fake, slow) = start(1, config);
    fake.send(read(60, SLOW));
    fake.send(read(62, SLOW));
    wait_count("the first READ's future to start", &slow.started, 1);
    fake.expect_silence("a READ running, another waiting for room");
    // The second READ's worker waits for room that its gate never makes:
    // the unmount must free it, and drop the future that holds the room.
    let adapter = fake.fs.clone();
    fake.unmount_and_join().expect("the session ends cleanly");
    wait_count("the running future to be dropped", &slow.dropped, 1);
    assert_eq!(
        slow.started.load(SeqCst),
        1,
        "the waiting READ started after the unmount"
    );
    assert_eq!(adapter.in_flight(), 0);
}
