//! The journal of requests in flight, on the fake kernel: a session plays
//! a daemon that stops for good at a chosen point of a request (the fault
//! hook's freeze), and a second session on the same journal plays its
//! successor, receiving the requests as the kernel sends them again after
//! `FUSE_NOTIFY_RESEND` (bit 63 of the unique set). The same for an
//! async filesystem, whose futures see the replay and set their notes
//! through [`AsyncContext`].

mod common_fake;

use common_fake::*;
use fuse_wire::asyncfs::{AsyncContext, AsyncFilesystem, AsyncFs, Spawn};
use fuse_wire::proto::consts::UNIQUE_RESEND;
use fuse_wire::session::journal::{Journal, Replay};
use fuse_wire::session::region::SharedRegion;
use fuse_wire::session::reply::ReplyEntry;
use fuse_wire::session::{Entry, Errno, Filesystem, Inode, MknodRequest, RequestContext, SessionConfig};
use std::ffi::CStr;
use std::future::Future;
use std::sync::{Arc, Mutex, Once};

const OP_SYMLINK: u32 = 6;
const OP_MKNOD: u32 = 8;
const OP_MKDIR: u32 = 9;

/// The fault plan of this process (one for all its tests): the workers
/// stop for good after carrying out a MKDIR or a MKNOD (before the answer
/// is recorded) and after recording a SYMLINK's answer (before it is
/// written).
fn freeze_plan() {
    static PLAN: Once = Once::new();
    PLAN.call_once(|| {
        assert!(fuse_wire::session::fault::freeze_at(
            "effect:MKDIR,reply:SYMLINK,effect:MKNOD"
        ))
    });
}

/// Records every request it carries out, with how it reached it.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<(String, Replay, Option<u64>)>>,
}

impl Recorder {
    fn carried_out(&self) -> Vec<(String, Replay, Option<u64>)> {
        self.seen.lock().unwrap().clone()
    }
    fn note(&self, ctx: &RequestContext<'_>, what: String) {
        self.seen
            .lock()
            .unwrap()
            .push((what, ctx.replay(), ctx.journal_note()));
    }
}

impl Filesystem for Recorder {
    fn mkdir(&self, ctx: &RequestContext<'_>, _: Inode, name: &CStr, _: u32, reply: ReplyEntry) {
        self.note(ctx, format!("mkdir {}", name.to_str().unwrap()));
        ctx.set_journal_note(0xabc);
        reply.entry(&entry(ctx.unique() & !UNIQUE_RESEND));
    }
    fn symlink(&self, ctx: &RequestContext<'_>, _: Inode, name: &CStr, _: &CStr, reply: ReplyEntry) {
        self.note(ctx, format!("symlink {}", name.to_str().unwrap()));
        reply.entry(&entry(ctx.unique() & !UNIQUE_RESEND));
    }
}

fn mkdir(unique: u64, name: &str) -> Vec<u8> {
    let body = B::new()
        .u32(0o755)
        .u32(0o022)
        .bytes(name.as_bytes())
        .bytes(b"\0")
        .done();
    request(OP_MKDIR, unique, 1, &body)
}

fn symlink(unique: u64, name: &str) -> Vec<u8> {
    let body = B::new()
        .bytes(name.as_bytes())
        .bytes(b"\0")
        .bytes(b"target")
        .bytes(b"\0")
        .done();
    request(OP_SYMLINK, unique, 1, &body)
}

fn journaled(region: &SharedRegion, fresh: bool) -> SessionConfig {
    let mine = SharedRegion::from_fd(region.fd().try_clone_to_owned().unwrap()).unwrap();
    SessionConfig {
        journal: Some(Arc::new(Journal::open(mine, fresh, None).unwrap())),
        ..SessionConfig::default()
    }
}

#[test]
fn a_successor_answers_what_was_done_once_and_carries_out_the_rest() {
    // The predecessor's workers stop for good after carrying out a MKDIR
    // (before its answer is recorded) and after recording a SYMLINK's
    // answer (before it is written).
    freeze_plan();
    let region = SharedRegion::create("journal-test", Journal::bytes_needed()).unwrap();

    let dead = Fake::start(Arc::new(Recorder::default()), journaled(&region, true));
    dead.init_ready(45, 0);
    dead.send(mkdir(10, "made"));
    dead.send(symlink(12, "linked"));
    dead.expect_silence("the predecessor stops before either answer reaches the kernel");
    let mut done = dead.fs.carried_out();
    done.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        done,
        vec![
            ("mkdir made".to_string(), Replay::Fresh, None),
            ("symlink linked".to_string(), Replay::Fresh, None)
        ],
        "both were carried out"
    );
    // Its frozen workers never end: leave them.
    std::mem::forget(dead);

    let next = Fake::start(Arc::new(Recorder::default()), journaled(&region, false));
    next.init_ready(45, 0);
    // The SYMLINK was answered: the same answer, byte for byte, and the
    // filesystem never sees it again.
    let resent = 12 | UNIQUE_RESEND;
    assert_bytes(
        "resent SYMLINK",
        &next.roundtrip(symlink(resent, "linked")),
        &ok_reply(resent, &entry_bytes(12)),
    );
    // The MKDIR was started: the filesystem decides, told so, with the note
    // the predecessor left.
    let resent = 10 | UNIQUE_RESEND;
    assert_bytes(
        "resent MKDIR",
        &next.roundtrip(mkdir(resent, "made")),
        &ok_reply(resent, &entry_bytes(10)),
    );
    // One the predecessor never took (sent again all the same): carried out.
    let resent = 14 | UNIQUE_RESEND;
    assert_bytes(
        "resent MKDIR never started",
        &next.roundtrip(mkdir(resent, "unseen")),
        &ok_reply(resent, &entry_bytes(14)),
    );
    assert_eq!(
        next.fs.carried_out(),
        vec![
            ("mkdir made".to_string(), Replay::MaybeDone, Some(0xabc)),
            ("mkdir unseen".to_string(), Replay::Fresh, None),
        ]
    );
}

/// The async filesystem: records each MKNOD its future carries out, with
/// how the request reached it, and notes one word before the effect.
#[derive(Default)]
struct AsyncRecorder {
    seen: Mutex<Vec<(String, Replay, Option<u64>)>>,
}

impl AsyncFilesystem for AsyncRecorder {
    fn mknod(
        &self,
        ctx: &AsyncContext,
        _: Inode,
        name: &CStr,
        _: MknodRequest,
    ) -> impl Future<Output = Result<Entry, Errno>> + Send {
        let what = format!("mknod {}", name.to_str().unwrap());
        let (replay, note, unique) = (ctx.replay(), ctx.journal_note(), ctx.unique());
        ctx.set_journal_note(0xdef);
        self.seen.lock().unwrap().push((what, replay, note));
        async move { Ok(entry(unique & !UNIQUE_RESEND)) }
    }
}

/// Runs each future to its end on a thread of its own (they never wait).
struct Inline;
impl Spawn for Inline {
    fn spawn<T: Future<Output = ()> + Send + 'static>(&self, task: T) {
        std::thread::spawn(move || {
            let mut task = std::pin::pin!(task);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(task.as_mut().poll(&mut cx).is_ready(), "a future waited");
        });
    }
}

fn mknod(unique: u64, name: &str) -> Vec<u8> {
    let body = B::new()
        .u32(0o100644)
        .u32(0)
        .u32(0o022)
        .u32(0)
        .bytes(name.as_bytes())
        .bytes(b"\0")
        .done();
    request(OP_MKNOD, unique, 1, &body)
}

#[test]
fn an_async_successor_sees_the_replay_and_the_note_its_predecessor_left() {
    freeze_plan();
    let region = SharedRegion::create("journal-async-test", Journal::bytes_needed()).unwrap();
    let fs = Arc::new(AsyncRecorder::default());
    let dead = Fake::start(
        Arc::new(AsyncFs::from_arc(fs.clone(), Inline)),
        journaled(&region, true),
    );
    dead.init_ready(45, 0);
    dead.send(mknod(20, "made"));
    dead.expect_silence("the predecessor stops before the answer reaches the kernel");
    assert_eq!(
        fs.seen.lock().unwrap().clone(),
        vec![("mknod made".to_string(), Replay::Fresh, None)],
        "the MKNOD was carried out"
    );
    std::mem::forget(dead);

    let fs = Arc::new(AsyncRecorder::default());
    let next = Fake::start(
        Arc::new(AsyncFs::from_arc(fs.clone(), Inline)),
        journaled(&region, false),
    );
    next.init_ready(45, 0);
    let resent = 20 | UNIQUE_RESEND;
    assert_bytes(
        "resent MKNOD",
        &next.roundtrip(mknod(resent, "made")),
        &ok_reply(resent, &entry_bytes(20)),
    );
    assert_eq!(
        fs.seen.lock().unwrap().clone(),
        vec![("mknod made".to_string(), Replay::MaybeDone, Some(0xdef))],
        "the successor's future is told the request may be done, with the note"
    );
}
