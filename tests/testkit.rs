//! The test kit (`fuse_wire::testing`) on its own: typed requests through
//! the fake kernel to the node layer and to a raw filesystem, as chosen
//! callers, at a chosen minor, INTERRUPT; and the protocol checker, one
//! test per rule, each against a filesystem with the one bug that breaks
//! it (`testkit_support/buggy.rs`), and the same filesystem without it.
//! No root, no mount: CI runs this file as an unprivileged user too.

#[path = "testkit_support/buggy.rs"]
mod buggy;
#[allow(dead_code)]
#[path = "../examples/nodefs/tree.rs"]
mod tree;

use buggy::{Bug, Buggy};
use fuse_wire::node::NodeFs;
use fuse_wire::proto::Opcode;
use fuse_wire::proto::abi::{
    Attr, AttrOut, EntryOut, ForgetIn, GetattrIn, InHeader, LinkIn, MkdirIn, OpenIn, OpenOut, OutHeader,
    ReadIn,
};
use fuse_wire::proto::flags::InitFlags;
use fuse_wire::proto::reply::{DirentWriter, Reply};
use fuse_wire::proto::request::ParseConfig;
use fuse_wire::reply::{ReplyData, ReplyEntry};
use fuse_wire::testing::battery::{self, Battery, Outcome};
use fuse_wire::testing::{Caller, Checker, KitError, ReplyBody, Rule, Setup, TestKernel, Violation, Xattr};
use fuse_wire::{Errno, FileHandle, Filesystem, Inode, ReadRequest, RequestContext};
use std::ffi::CStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zerocopy::IntoBytes;

const REG: u32 = libc::S_IFREG;

fn nodefs() -> TestKernel<NodeFs> {
    TestKernel::start(NodeFs::new(tree::root())).expect("the kit starts")
}

fn finish_nodefs(k: TestKernel<NodeFs>) {
    if let Err(r) = k.finish_with(Some(&|fs: &NodeFs| fs.lookup_counts())) {
        panic!("{r}");
    }
}

fn names<T>(v: &[T], name: impl Fn(&T) -> String) -> Vec<String> {
    v.iter().map(name).collect()
}

#[test]
fn typed_requests_reach_a_node_layer_filesystem() {
    let k = nodefs();
    let d = Inode(k.mkdir(Inode::ROOT, "d", 0o755).unwrap().nodeid);
    let (e, o) = k.create(d, "f", REG | 0o644, libc::O_RDWR).unwrap();
    let (f, fh) = (Inode(e.nodeid), FileHandle(o.fh));
    assert_eq!(k.write(f, fh, 0, b"hello world").unwrap(), 11);
    assert_eq!(k.read(f, fh, 6, 100).unwrap(), b"world");
    assert_eq!(k.getattr(f, Some(fh)).unwrap().attr.size, 11);
    assert_eq!(k.truncate(f, 5, None).unwrap().attr.size, 5);
    assert_eq!(k.read(f, fh, 0, 100).unwrap(), b"hello");
    k.release(f, fh).unwrap();

    let g = k.link(f, d, "g").unwrap();
    assert_eq!((g.nodeid, g.attr.nlink), (f.0, 2));
    k.symlink(d, "s", "f").unwrap();
    let s = Inode(k.lookup(d, "s").unwrap().nodeid);
    assert_eq!(k.readlink(s).unwrap(), b"f");
    k.rename(d, "g", d, "s", 0).unwrap(); // over an existing name
    assert_eq!(k.lookup(d, "s").unwrap().nodeid, f.0);
    k.unlink(d, "f").unwrap();
    assert_eq!(k.lookup(d, "f").unwrap_err(), Errno::ENOENT);

    k.setxattr(f, "user.k", b"v1", 0).unwrap();
    assert_eq!(k.getxattr(f, "user.k", 0).unwrap(), Xattr::Size(2));
    assert_eq!(k.getxattr(f, "user.k", 64).unwrap(), Xattr::Data(b"v1".to_vec()));
    assert_eq!(k.listxattr(f, 64).unwrap(), Xattr::Data(b"user.k\0".to_vec()));
    k.removexattr(f, "user.k").unwrap();
    assert_eq!(k.getxattr(f, "user.k", 64).unwrap_err(), Errno::ENODATA);

    // A listing across several calls: 32 names, 4 of them a call at most.
    for i in 0..32 {
        let (e, o) = k
            .create(d, format!("n{i:02}"), REG | 0o600, libc::O_WRONLY)
            .unwrap();
        k.release(Inode(e.nodeid), FileHandle(o.fh)).unwrap();
    }
    let small = 4 * 32;
    let listed = k.list_dir(d, small).unwrap();
    assert_eq!(
        listed.len(),
        2 + 1 + 32,
        "{:?}",
        names(&listed, |e| e.name_lossy())
    );
    let plus = k.list_dir_plus(d, 3 * 160).unwrap();
    assert_eq!(plus.len(), listed.len());
    let n00 = plus
        .iter()
        .find(|p| p.dirent.name == b"n00")
        .unwrap()
        .entry
        .nodeid;
    assert_eq!(k.lookups_of(Inode(n00)), 2, "CREATE and the READDIRPLUS record");
    k.forget(Inode(n00), 2);
    k.compare_lookup_counts(|fs| fs.lookup_counts());
    finish_nodefs(k);
}

/// Records who sent each LOOKUP.
#[derive(Default)]
struct Who(Mutex<Vec<(u32, u32, u32)>>);

impl Filesystem for Who {
    fn lookup(&self, ctx: &RequestContext<'_>, _: Inode, _: &CStr, reply: ReplyEntry) {
        self.0.lock().unwrap().push((ctx.uid(), ctx.gid(), ctx.pid()));
        reply.error(Errno::ENOENT)
    }
}

#[test]
fn requests_carry_the_chosen_caller() {
    let k = TestKernel::start(Who::default()).unwrap();
    let _ = k.lookup(Inode::ROOT, "a");
    let alice = Caller::new(1000, 100, 77);
    k.as_caller(alice, |k| k.lookup(Inode::ROOT, "b")).unwrap_err();
    let before = k.set_caller(Caller::new(1001, 101, 78));
    assert_eq!(before, Caller::current());
    let _ = k.lookup(Inode::ROOT, "c");
    let me = Caller::current();
    assert_eq!(
        *k.fs().0.lock().unwrap(),
        [(me.uid, me.gid, me.pid), (1000, 100, 77), (1001, 101, 78)]
    );
    k.finish().unwrap();
}

#[test]
fn init_at_the_chosen_minor_and_capabilities() {
    let setup = Setup {
        minor: 12,
        offered: InitFlags::ASYNC_READ | InitFlags::BIG_WRITES,
        ..Setup::default()
    };
    let k = TestKernel::start_with(Arc::new(NodeFs::new(tree::root())), setup).unwrap();
    assert_eq!(k.minor(), 12);
    assert_eq!(
        k.negotiated().flags,
        InitFlags::ASYNC_READ | InitFlags::BIG_WRITES
    );
    assert!(!k.negotiated().flags.contains(InitFlags::DO_READDIRPLUS));
    // Requests and replies at 7.12 sizes.
    let d = k.mkdir(Inode::ROOT, "d", 0o755).unwrap();
    assert_eq!(k.getattr(Inode(d.nodeid), None).unwrap().attr.ino, d.attr.ino);
    finish_nodefs(k);

    let old = Setup {
        minor: 11,
        ..Setup::default()
    };
    let r = TestKernel::start_with(Arc::new(NodeFs::new(tree::root())), old);
    assert!(matches!(r, Err(KitError::Minor(11))), "{:?}", r.err());
}

/// A READ that waits until the kernel interrupts it.
struct Slow;

impl Filesystem for Slow {
    fn read(&self, _: &RequestContext<'_>, _: Inode, _: FileHandle, _: ReadRequest, reply: ReplyData) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !reply.is_interrupted() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if reply.is_interrupted() {
            reply.error(Errno::EINTR)
        } else {
            reply.data(b"never interrupted")
        }
    }
}

#[test]
fn interrupt_reaches_a_waiting_handler() {
    let k = TestKernel::start(Slow).unwrap();
    let fh = FileHandle(k.open(Inode::ROOT, libc::O_RDONLY).unwrap().fh);
    let read = fuse_wire::proto::abi::ReadIn {
        fh: fh.0,
        size: 10,
        ..Default::default()
    };
    let p = k.send(Opcode::Read, 1, &[read.as_bytes()]);
    assert_eq!(k.interrupt(p).unwrap_err(), Errno::EINTR);
    k.release(Inode::ROOT, fh).unwrap();
    k.finish().unwrap();
}

// ---- the checker, one rule at a time ----

fn buggy(bug: Bug) -> TestKernel<Buggy> {
    // A reply that does not come is awaited this long: long enough that
    // every other reply comes in time on a loaded machine.
    let timeout = if bug == Bug::LostReply { 2 } else { 10 };
    let setup = Setup {
        timeout: Duration::from_secs(timeout),
        ..Setup::default()
    };
    TestKernel::start_with(Arc::new(Buggy::new(bug)), setup).unwrap()
}

/// Runs `scenario` on the filesystem with `bug` and without: without, no
/// violation; with, only violations of `rule`, at least one, each naming a
/// request. Returns them.
fn seeded(bug: Bug, rule: Rule, scenario: impl Fn(&TestKernel<Buggy>)) -> Vec<Violation> {
    let clean = buggy(Bug::None);
    scenario(&clean);
    if let Err(r) = clean.finish_with(Some(&|fs: &Buggy| fs.lookup_counts())) {
        panic!("without the bug: {r}");
    }
    let k = buggy(bug);
    scenario(&k);
    k.fs().release_hang();
    let v = match k.finish_with(Some(&|fs: &Buggy| fs.lookup_counts())) {
        Ok(_) => Vec::new(),
        Err(r) => r.violations,
    };
    assert!(!v.is_empty(), "{bug:?}: no violation reported");
    for x in &v {
        assert_eq!(x.rule, rule, "{bug:?}: {x}");
        assert!(x.to_string().starts_with(&format!("[{}]", rule.name())), "{x}");
    }
    v
}

/// CREATE `name` in the root, then RELEASE: the new node.
fn created(k: &TestKernel<Buggy>, name: &str) -> Inode {
    let (f, fh) = new_file(k, name);
    k.release(f, fh).unwrap();
    f
}

fn new_file(k: &TestKernel<Buggy>, name: &str) -> (Inode, FileHandle) {
    let (e, o) = k.create(Inode::ROOT, name, REG | 0o644, libc::O_RDWR).unwrap();
    (Inode(e.nodeid), FileHandle(o.fh))
}

#[test]
fn lookup_count_a_node_id_reused_while_the_kernel_holds_it() {
    let v = seeded(Bug::ForgetsAtUnlink, Rule::LookupCount, |k| {
        created(k, "a");
        k.unlink(Inode::ROOT, "a").unwrap(); // the kernel still holds a
        created(k, "b");
    });
    assert!(v[0].request.starts_with("CREATE #"), "{}", v[0]);
    assert!(v[0].detail.contains("forgot it too early"), "{}", v[0]);
}

#[test]
fn lookup_count_the_filesystems_counts_against_the_kernels() {
    let k = buggy(Bug::None);
    let a = created(&k, "a");
    k.lookup(Inode::ROOT, "a").unwrap();
    k.compare_lookup_counts(|fs| fs.lookup_counts());
    assert_eq!(k.take_violations(), []);
    // A count the kernel does not hold.
    k.compare_lookup_counts(|_| vec![(a, 3)]);
    let v = k.take_violations();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].rule, Rule::LookupCount);
    assert!(
        v[0].detail
            .contains(&format!("node {a}: the kernel holds 2, the filesystem counts 3")),
        "{}",
        v[0]
    );
    k.finish_with(Some(&|fs: &Buggy| fs.lookup_counts())).unwrap();
}

#[test]
fn readdir_cookie_a_name_skipped_after_an_unlink_during_the_listing() {
    let v = seeded(Bug::PositionCookies, Rule::ReaddirCookie, |k| {
        for n in ["a", "b", "c", "d"] {
            created(k, n);
        }
        let dir = FileHandle(k.opendir(Inode::ROOT).unwrap().fh);
        // ".", ".." and "a" (32 bytes a record).
        let first = k.readdir(Inode::ROOT, dir, 0, 96).unwrap();
        assert_eq!(first.len(), 3);
        k.unlink(Inode::ROOT, "a").unwrap();
        let mut off = first[2].offset;
        loop {
            let more = k.readdir(Inode::ROOT, dir, off, 96).unwrap();
            let Some(last) = more.last() else { break };
            off = last.offset;
        }
        k.releasedir(Inode::ROOT, dir).unwrap();
    });
    assert!(v[0].detail.contains("ended without [\"b\"]"), "{}", v[0]);
}

#[test]
fn entry_attr_a_file_that_getattr_calls_a_directory() {
    let v = seeded(Bug::WrongType, Rule::EntryAttr, |k| {
        let (f, fh) = new_file(k, "a");
        if let Err(e) = k.getattr(f, None) {
            assert_eq!(e, Errno::EIO, "as the kernel answers the caller");
        }
        k.release(f, fh).unwrap();
    });
    assert!(v[0].request.starts_with("GETATTR #"), "{}", v[0]);
    assert!(
        v[0].detail
            .contains("changed its file type from regular file to directory"),
        "{}",
        v[0]
    );
}

#[test]
fn reply_size_a_read_longer_than_asked() {
    let v = seeded(Bug::LongRead, Rule::ReplySize, |k| {
        let (f, fh) = new_file(k, "a");
        k.write(f, fh, 0, b"abc").unwrap();
        let r = k.read(f, fh, 0, 4096);
        if r != Ok(b"abc".to_vec()) {
            assert_eq!(r.unwrap_err(), Errno::EIO, "as the kernel answers the caller");
        }
        k.release(f, fh).unwrap();
    });
    assert!(v[0].request.starts_with("READ #"), "{}", v[0]);
    assert!(v[0].detail.contains("4106 bytes, more than the 4096"), "{}", v[0]);
}

#[test]
fn errno_a_number_linux_does_not_know() {
    let v = seeded(Bug::UnknownErrno, Rule::Errno, |k| {
        let e = k.lookup(Inode::ROOT, "missing").unwrap_err();
        assert!(e == Errno::ENOENT || e.get() == 300);
    });
    assert!(
        v[0].request.starts_with("LOOKUP #") && v[0].request.ends_with("\"missing\""),
        "{}",
        v[0]
    );
}

#[test]
fn answer_a_request_never_answered() {
    let v = seeded(Bug::LostReply, Rule::Answer, |k| {
        assert!(k.lookup(Inode::ROOT, "hang").is_err());
        // The kit waited its timeout, reported it, and goes on.
        created(k, "a");
        k.fs().release_hang();
    });
    assert!(v[0].detail.contains("no reply came"), "{}", v[0]);
}

/// The rules a Filesystem cannot break through fuse-session's reply
/// handles (one reply each, errno in range), on the bytes of a server
/// that speaks the protocol itself.
#[test]
fn answer_and_errno_on_a_raw_conversation() {
    let mut c = Checker::new(ParseConfig::new(45));
    let request = |unique: u64| {
        let mut v = InHeader {
            len: 40 + 2,
            opcode: 1,
            unique,
            nodeid: 1,
            ..InHeader::default()
        }
        .as_bytes()
        .to_vec();
        v.extend_from_slice(b"a\0");
        v
    };
    let reply = |unique: u64, error: i32| {
        OutHeader {
            len: 16,
            error,
            unique,
        }
        .as_bytes()
        .to_vec()
    };
    c.request(&request(2));
    c.request(&request(4));
    assert!(c.reply(&reply(2, -libc::ENOENT)).is_some());
    assert!(
        c.reply(&reply(2, -libc::ENOENT)).is_none(),
        "a second reply answers nothing"
    );
    assert!(
        c.reply(&reply(6, -libc::ENOENT)).is_none(),
        "nor does one to an unknown request"
    );
    assert!(c.reply(&reply(4, -600)).is_some());
    let v: Vec<(Rule, String)> = c
        .take_violations()
        .into_iter()
        .map(|v| (v.rule, v.to_string()))
        .collect();
    assert_eq!(v.len(), 3, "{v:?}");
    assert_eq!(v[0].0, Rule::Answer);
    assert!(v[0].1.contains("already answered"), "{}", v[0].1);
    assert_eq!(v[1].0, Rule::Answer);
    assert!(v[1].1.contains("never sent"), "{}", v[1].1);
    assert_eq!(v[2].0, Rule::Errno);
    assert!(
        v[2].1
            .starts_with("[errno] LOOKUP #4 on node 1 \"a\": error -600"),
        "{}",
        v[2].1
    );
}

/// A raw conversation for the checker: requests from the kernel's structs,
/// replies from fuse-proto's encoder.
struct Raw {
    c: Checker,
    unique: u64,
}

impl Raw {
    fn new() -> Raw {
        Raw {
            c: Checker::new(ParseConfig::new(45)),
            unique: 0,
        }
    }

    /// Sends a request; returns its unique.
    fn request(&mut self, opcode: Opcode, nodeid: u64, args: &[&[u8]]) -> u64 {
        self.unique += 2;
        let body: usize = args.iter().map(|a| a.len()).sum();
        let mut v = InHeader {
            len: (40 + body) as u32,
            opcode: opcode as u32,
            unique: self.unique,
            nodeid,
            ..InHeader::default()
        }
        .as_bytes()
        .to_vec();
        for a in args {
            v.extend_from_slice(a);
        }
        self.c.request(&v);
        self.unique
    }

    /// Sends a reply; returns what the caller gets.
    fn reply(&mut self, r: Reply<'_>) -> Option<Result<ReplyBody, Errno>> {
        self.c.reply(&r.to_vec()).map(|a| a.result)
    }

    /// OPENDIR of the root, answered with handle `fh`.
    fn opendir(&mut self, fh: u64) {
        let u = self.request(Opcode::Opendir, 1, &[OpenIn::default().as_bytes()]);
        self.reply(Reply::open(
            u,
            &OpenOut {
                fh,
                ..OpenOut::default()
            },
        ));
    }

    /// READDIR (or READDIRPLUS) of the root through `fh` from 0, answered
    /// with `records`.
    fn listed(&mut self, opcode: Opcode, fh: u64, records: &[u8]) {
        let read = ReadIn {
            fh,
            size: 4096,
            ..ReadIn::default()
        };
        let u = self.request(opcode, 1, &[read.as_bytes()]);
        self.reply(Reply::data(u, records).unwrap());
    }

    /// The violations so far, each as "[rule] ...".
    fn found(&mut self) -> Vec<String> {
        self.c.take_violations().iter().map(|v| v.to_string()).collect()
    }
}

fn file_entry(nodeid: u64, ino: u64) -> EntryOut {
    EntryOut {
        nodeid,
        generation: 1,
        attr: Attr {
            ino,
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            ctime: 100,
            ..Attr::default()
        },
        ..EntryOut::default()
    }
}

/// Looks `name` up in the root and answers with `e`; what the caller gets.
fn looked_up(r: &mut Raw, name: &str, e: &EntryOut) -> Option<Result<ReplyBody, Errno>> {
    let u = r.request(Opcode::Lookup, 1, &[name.as_bytes(), b"\0"]);
    r.reply(Reply::entry(u, e, 45))
}

#[track_caller]
fn one(found: Vec<String>, want: &str) {
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains(want), "{} does not say {want:?}", found[0]);
}

#[test]
fn entry_attr_every_check_on_a_raw_conversation() {
    let mut r = Raw::new();
    let mut e = file_entry(5, 50);
    looked_up(&mut r, "a", &e);
    assert_eq!(r.found(), Vec::<String>::new());

    e.attr.mode = 0o644; // no type bits
    assert_eq!(
        looked_up(&mut r, "a", &e),
        Some(Err(Errno::EIO)),
        "as the kernel answers"
    );
    one(
        r.found(),
        "[entry-attr] LOOKUP #4 on node 1 \"a\": node 5 has mode 644, which is no file type",
    );

    let mut big = file_entry(6, 60);
    big.attr.size = u64::MAX;
    looked_up(&mut r, "b", &big);
    one(r.found(), "beyond what the kernel accepts");

    let mut zero_links = file_entry(7, 70);
    zero_links.attr.nlink = 0;
    looked_up(&mut r, "c", &zero_links);
    one(r.found(), "node 7 reached by a name has nlink 0");

    let u = r.request(
        Opcode::Mkdir,
        1,
        &[
            MkdirIn {
                mode: 0o755,
                umask: 0,
            }
            .as_bytes(),
            b"d\0",
        ],
    );
    assert_eq!(
        r.reply(Reply::entry(u, &EntryOut::default(), 45)),
        Some(Err(Errno::EIO))
    );
    one(r.found(), "[entry-attr] MKDIR");

    let u = r.request(Opcode::Link, 1, &[LinkIn { oldnodeid: 5 }.as_bytes(), b"l\0"]);
    r.reply(Reply::entry(u, &file_entry(8, 80), 45));
    one(r.found(), "LINK answered node 8, not the linked node 5");

    let mut other_ino = file_entry(5, 51);
    other_ino.attr.nlink = 2;
    let u = r.request(Opcode::Link, 1, &[LinkIn { oldnodeid: 5 }.as_bytes(), b"m\0"]);
    r.reply(Reply::entry(u, &other_ino, 45));
    one(r.found(), "node 5 reports st_ino 51 after 50");

    // A READDIRPLUS record whose d_type disagrees with its entry.
    r.opendir(9);
    let mut buf = [0u8; 4096];
    let mut w = DirentWriter::new(&mut buf);
    w.add_plus(&file_entry(5, 51), 1, libc::DT_DIR as u32, b"a")
        .unwrap();
    r.listed(Opcode::Readdirplus, 9, w.as_bytes());
    one(
        r.found(),
        "the record \"a\" has d_type directory but its entry says regular file",
    );
}

#[test]
fn readdir_cookie_zero_and_repeated_cookies_on_a_raw_conversation() {
    for (cookies, want) in [
        ([1, 0], "has cookie 0: continuing from it starts the listing over"),
        ([1, 1], "cookie 1 given twice in one listing"),
    ] {
        let mut r = Raw::new();
        r.opendir(3);
        let mut buf = [0u8; 4096];
        let mut w = DirentWriter::new(&mut buf);
        w.add(10, cookies[0], libc::DT_REG as u32, b"x").unwrap();
        w.add(11, cookies[1], libc::DT_REG as u32, b"y").unwrap();
        r.listed(Opcode::Readdir, 3, w.as_bytes());
        one(r.found(), want);
    }
}

#[test]
fn reply_size_lookup_count_attr_backwards_and_answer_on_a_raw_conversation() {
    let mut r = Raw::new();
    looked_up(&mut r, "a", &file_entry(5, 50));
    // A GETATTR answered with a fuse_entry_out: the wrong struct.
    let u = r.request(Opcode::Getattr, 5, &[GetattrIn::default().as_bytes()]);
    r.reply(Reply::entry(u, &file_entry(5, 50), 45));
    one(
        r.found(),
        "[reply-size] GETATTR #4 on node 5: fuse_attr_out of 128 bytes, the kernel expects exactly 104",
    );

    // An error with a body.
    let u = r.request(Opcode::Getattr, 5, &[GetattrIn::default().as_bytes()]);
    let mut bytes = Reply::error(u, Errno::ENOENT).to_vec();
    bytes.extend_from_slice(&[0; 8]);
    bytes[..4].copy_from_slice(&24u32.to_ne_bytes());
    r.c.reply(&bytes);
    one(r.found(), "an error reply with 8 bytes of body");

    // A ctime that goes back.
    let mut older = file_entry(5, 50);
    older.attr.ctime = 99;
    let u = r.request(Opcode::Getattr, 5, &[GetattrIn::default().as_bytes()]);
    r.reply(Reply::attr(
        u,
        &AttrOut {
            attr: older.attr,
            ..AttrOut::default()
        },
        45,
    ));
    one(
        r.found(),
        "[attr-backwards] GETATTR #8 on node 5: node 5's ctime went back from 100.000000000 to 99.000000000",
    );

    // A FORGET of more than the kernel holds (the kit's own mistake).
    r.request(Opcode::Forget, 5, &[ForgetIn { nlookup: 2 }.as_bytes()]);
    one(
        r.found(),
        "FORGET of 2 references to node 5, which the kernel holds 1 times",
    );

    // A reply to INTERRUPT that means nothing.
    let mut bytes = Reply::error(r.unique + 2, Errno::EIO).to_vec();
    bytes[8..16].copy_from_slice(&(r.unique | 1).to_ne_bytes());
    r.c.reply(&bytes);
    one(r.found(), "[answer] INTERRUPT of");
}

#[test]
fn handle_after_release_ebadf_for_a_handle_still_open() {
    let v = seeded(Bug::FlushFrees, Rule::HandleAfterRelease, |k| {
        let (f, fh) = new_file(k, "a");
        k.write(f, fh, 0, b"abc").unwrap();
        k.flush(f, fh).unwrap(); // close() of a dup: the file stays open
        let _ = k.read(f, fh, 0, 10);
        k.release(f, fh).unwrap();
    });
    assert!(v[0].request.starts_with("READ #"), "{}", v[0]);
    assert!(v[0].detail.contains("EBADF for handle"), "{}", v[0]);
}

#[test]
fn handle_after_release_a_request_on_a_released_handle() {
    let k = buggy(Bug::None);
    let (f, fh) = new_file(&k, "a");
    k.release(f, fh).unwrap();
    let _ = k.read(f, fh, 0, 10);
    let v = k.take_violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].rule, Rule::HandleAfterRelease);
    assert!(v[0].detail.contains("was released"), "{}", v[0]);
    k.finish().unwrap();
}

#[test]
fn attr_backwards_a_size_that_forgets_earlier_writes() {
    let v = seeded(Bug::SizeOfLastWrite, Rule::AttrBackwards, |k| {
        let (f, fh) = new_file(k, "a");
        k.write(f, fh, 0, b"0123456789").unwrap();
        k.write(f, fh, 0, b"ab").unwrap();
        k.getattr(f, Some(fh)).unwrap();
        // A truncate makes a smaller size right.
        k.truncate(f, 1, Some(fh)).unwrap();
        k.getattr(f, Some(fh)).unwrap();
        k.release(f, fh).unwrap();
    });
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].detail
            .contains("shrank from 10 to 2 bytes without a truncate"),
        "{}",
        v[0]
    );
}

// ---- the conformance battery (memfs, nodefs, pathfs and passthrough_ll
// run it in their own tests) ----

#[test]
fn the_battery_reports_what_is_not_implemented_as_unsupported_and_fails_on_a_seeded_bug() {
    let k = buggy(Bug::None);
    let report = battery::run(&k);
    report.assert_passed();
    // Buggy has no MKDIR, LINK, RENAME nor xattrs.
    let unsupported: Vec<&str> = report.unsupported().map(|r| r.name).collect();
    assert_eq!(
        unsupported,
        [
            "hard_link",
            "rename_over_existing",
            "xattrs",
            "permissions",
            "race_lookup_rename",
            "race_readdir_create"
        ],
        "{report}"
    );
    assert_eq!(
        report.outcome("readdir_during_unlink"),
        Some(&Outcome::Passed),
        "{report}"
    );
    k.finish().unwrap();

    for (bug, scenario) in [
        (Bug::PositionCookies, "readdir_during_unlink"),
        (Bug::SizeOfLastWrite, "sparse_write"),
        (Bug::LongRead, "create_write_read"),
    ] {
        let k = buggy(bug);
        let report = battery::run(&k);
        let failed: Vec<&str> = report.failed().map(|r| r.name).collect();
        assert!(failed.contains(&scenario), "{bug:?}: {report}");
        // The report's findings stay in the checker: finish reports them.
        assert!(k.finish().unwrap_err().breaks(Rule::Battery), "{bug:?}");
    }
}

#[test]
fn the_battery_runs_again_in_a_directory_of_its_own() {
    let k = TestKernel::start(NodeFs::new(tree::root())).unwrap();
    let battery = Battery {
        default_permissions: true,
        ..Battery::default()
    };
    for _ in 0..2 {
        let report = battery.run(&k);
        report.assert_passed();
        assert_eq!(report.passed().count(), report.results.len(), "{report}");
    }
    assert!(k.lookup(Inode::ROOT, "battery.1").is_ok());
    finish_nodefs(k);
}

// ---- nothing hides a failure ----

#[test]
fn a_handler_panic_is_a_violation_naming_the_request() {
    let v = seeded(Bug::Panics, Rule::Panic, |k| {
        // EIO with the panic; ENOENT without the bug.
        assert!(k.lookup(Inode::ROOT, "boom").is_err());
    });
    assert!(
        v[0].request.starts_with("LOOKUP #") && v[0].request.ends_with("\"boom\""),
        "{}",
        v[0]
    );
    assert!(v[0].detail.contains("a seeded panic"), "{}", v[0]);
}

#[test]
fn finish_with_compares_lookup_counts_before_it_forgets_and_blames_the_request() {
    let v = seeded(Bug::UndercountsLookup, Rule::LookupCount, |k| {
        created(k, "a");
        k.lookup(Inode::ROOT, "a").unwrap();
    });
    // One line for the one node, at the end of the test, blaming the
    // LOOKUP (the last request that moved the count) and naming the
    // CREATE before it.
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].request.starts_with("LOOKUP #"), "{}", v[0]);
    assert!(
        v[0].detail
            .starts_with("at the end of the test: node 2: the kernel holds 2, the filesystem counts 1"),
        "{}",
        v[0]
    );
    assert!(v[0].detail.contains("CREATE #"), "{}", v[0]);
}

#[test]
fn the_battery_s_findings_stay_in_the_checker_and_the_report_prints_readably() {
    let k = buggy(Bug::SizeOfLastWrite);
    let _ = battery::run(&k); // the report dropped unread
    let r = k.finish().unwrap_err();
    assert!(r.breaks(Rule::Battery), "{r}");
    assert!(r.breaks(Rule::AttrBackwards), "{r}");
    // What unwrap() prints is the readable report.
    assert_eq!(format!("{r:?}"), r.to_string());
    assert!(
        r.to_string()
            .contains("[battery] battery scenario sparse_write: size after a write past the end"),
        "{r}"
    );
}

#[test]
fn the_reply_timeout_is_settable() {
    let k = buggy(Bug::LostReply);
    assert_eq!(k.timeout(), Duration::from_secs(2));
    assert_eq!(k.set_timeout(Duration::from_millis(200)), Duration::from_secs(2));
    assert_eq!(k.lookup(Inode::ROOT, "hang").unwrap_err(), Errno::EIO);
    k.fs().release_hang();
    let v = k.take_violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].detail.contains("no reply came"), "{}", v[0]);
    k.finish().unwrap();
}

// ---- semantic rules, through the session ----

#[test]
fn posix_enoent_for_a_name_the_kernel_holds() {
    let v = seeded(Bug::LookupEnoent, Rule::Posix, |k| {
        created(k, "a");
        let _ = k.lookup(Inode::ROOT, "a");
        let _ = k.lookup(Inode::ROOT, "never"); // truly missing: fine
    });
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].request.ends_with("\"a\""), "{}", v[0]);
    assert!(
        v[0].detail
            .contains("ENOENT for \"a\", which the kernel holds as node 2 from CREATE #"),
        "{}",
        v[0]
    );
}

#[test]
fn posix_a_setattr_that_ignores_the_change() {
    let v = seeded(Bug::IgnoresTruncate, Rule::Posix, |k| {
        let (f, fh) = new_file(k, "a");
        k.write(f, fh, 0, b"0123456789").unwrap();
        let _ = k.truncate(f, 4, Some(fh));
        k.release(f, fh).unwrap();
    });
    assert!(v[0].request.starts_with("SETATTR #"), "{}", v[0]);
    assert!(v[0].detail.contains("size 4 asked, 10 answered"), "{}", v[0]);
}

#[test]
fn posix_a_short_read_before_the_end_of_file() {
    let v = seeded(Bug::ShortRead, Rule::Posix, |k| {
        let (f, fh) = new_file(k, "a");
        k.write(f, fh, 0, b"0123456789").unwrap();
        let _ = k.read(f, fh, 0, 4096);
        // At the end of file a short read is right.
        let _ = k.read(f, fh, 8, 4096);
        k.release(f, fh).unwrap();
    });
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].detail
            .contains("3 bytes, short of the 4096 asked for, ending at 3 before the end of file at 10"),
        "{}",
        v[0]
    );
}

#[test]
fn posix_statfs_with_block_size_zero() {
    let v = seeded(Bug::StatfsZero, Rule::Posix, |k| {
        k.statfs(Inode::ROOT).unwrap();
    });
    assert!(v[0].request.starts_with("STATFS #"), "{}", v[0]);
    assert!(v[0].detail.contains("block size 0"), "{}", v[0]);
}

#[test]
fn lookup_count_a_node_id_reused_with_its_old_generation() {
    let v = seeded(Bug::SameGeneration, Rule::LookupCount, |k| {
        let a = created(k, "a");
        k.unlink(Inode::ROOT, "a").unwrap();
        k.forget(a, 1); // the kernel lets go of it: the id may be reused...
        created(k, "b"); // ...but not with the same generation
    });
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].request.starts_with("CREATE #"), "{}", v[0]);
    assert!(
        v[0].detail
            .contains("names another file with the generation 1 it had"),
        "{}",
        v[0]
    );
}

// ---- semantic rules, on raw conversations ----

fn dir_entry(nodeid: u64, ino: u64) -> EntryOut {
    let mut e = file_entry(nodeid, ino);
    e.attr.mode = libc::S_IFDIR | 0o755;
    e.attr.nlink = 2;
    e
}

fn mkdir_in(r: &mut Raw, parent: u64, name: &str, e: &EntryOut) -> Option<Result<ReplyBody, Errno>> {
    let n = format!("{name}\0");
    let u = r.request(
        Opcode::Mkdir,
        parent,
        &[
            MkdirIn {
                mode: 0o755,
                umask: 0,
            }
            .as_bytes(),
            n.as_bytes(),
        ],
    );
    r.reply(Reply::entry(u, e, 45))
}

#[test]
fn posix_rmdir_of_a_directory_that_holds_names() {
    let mut r = Raw::new();
    mkdir_in(&mut r, 1, "d", &dir_entry(5, 50));
    mkdir_in(&mut r, 1, "e", &dir_entry(6, 60));
    mkdir_in(&mut r, 5, "inner", &dir_entry(7, 70));
    assert_eq!(r.found(), Vec::<String>::new());
    // "e" is empty: RMDIR answered 0 is right.
    let u = r.request(Opcode::Rmdir, 1, &[b"e\0"]);
    r.reply(Reply::empty(u));
    assert_eq!(r.found(), Vec::<String>::new());
    let u = r.request(Opcode::Rmdir, 1, &[b"d\0"]);
    r.reply(Reply::empty(u));
    one(
        r.found(),
        "[posix] RMDIR #10 on node 1 \"d\": RMDIR answered 0 for node 5, which still holds [\"inner\"]",
    );
}

#[test]
fn entry_attr_created_entries_of_the_wrong_type_node_id_1_and_the_root() {
    let mut r = Raw::new();
    // MKDIR answered with a regular file: the kernel answers EIO.
    assert_eq!(
        mkdir_in(&mut r, 1, "d", &file_entry(5, 50)),
        Some(Err(Errno::EIO))
    );
    one(
        r.found(),
        "the new node 5 is a regular file, not the directory asked for",
    );
    // An entry with the root's node id.
    assert_eq!(looked_up(&mut r, "x", &dir_entry(1, 10)), Some(Err(Errno::EIO)));
    one(r.found(), "node id 1, the root's, in an entry for \"x\"");
    // The root's attributes: a directory.
    let u = r.request(Opcode::Getattr, 1, &[GetattrIn::default().as_bytes()]);
    let attr = file_entry(1, 1).attr;
    assert_eq!(
        r.reply(Reply::attr(
            u,
            &AttrOut {
                attr,
                ..AttrOut::default()
            },
            45
        )),
        Some(Err(Errno::EIO))
    );
    one(
        r.found(),
        "[entry-attr] GETATTR #6 on node 1: the root is a regular file, not a directory",
    );
    // A correct root, then correct entries: nothing.
    let u = r.request(Opcode::Getattr, 1, &[GetattrIn::default().as_bytes()]);
    let attr = dir_entry(1, 1).attr;
    r.reply(Reply::attr(
        u,
        &AttrOut {
            attr,
            ..AttrOut::default()
        },
        45,
    ));
    mkdir_in(&mut r, 1, "d", &dir_entry(5, 50));
    looked_up(&mut r, "f", &file_entry(6, 60));
    assert_eq!(r.found(), Vec::<String>::new());
}

#[test]
fn entry_attr_d_ino_of_dot_dotdot_and_names() {
    let mut r = Raw::new();
    let u = r.request(Opcode::Getattr, 1, &[GetattrIn::default().as_bytes()]);
    let attr = dir_entry(1, 100).attr;
    r.reply(Reply::attr(
        u,
        &AttrOut {
            attr,
            ..AttrOut::default()
        },
        45,
    ));
    looked_up(&mut r, "f", &file_entry(5, 50));
    let list = |r: &mut Raw, dot: u64, f: u64| {
        r.opendir(3);
        let mut buf = [0u8; 4096];
        let mut w = DirentWriter::new(&mut buf);
        w.add(dot, 1, libc::DT_DIR as u32, b".").unwrap();
        w.add(100, 2, libc::DT_DIR as u32, b"..").unwrap();
        w.add(f, 3, libc::DT_REG as u32, b"f").unwrap();
        r.listed(Opcode::Readdir, 3, w.as_bytes());
        let u = r.request(
            Opcode::Releasedir,
            1,
            &[fuse_wire::proto::abi::ReleaseIn {
                fh: 3,
                ..Default::default()
            }
            .as_bytes()],
        );
        r.reply(Reply::empty(u));
    };
    list(&mut r, 100, 50);
    assert_eq!(r.found(), Vec::<String>::new());
    list(&mut r, 1, 50); // "." as the node id, not the inode number
    one(
        r.found(),
        "the record \".\" has d_ino 1, but st_ino 100 is the directory's (node 1)",
    );
    list(&mut r, 100, 5); // "f" as its node id
    one(
        r.found(),
        "the record \"f\" has d_ino 5, but st_ino 50 is node 5's",
    );
}

#[test]
fn posix_a_symlink_whose_size_is_not_its_targets_length() {
    let mut r = Raw::new();
    let mut link = file_entry(5, 50);
    link.attr.mode = libc::S_IFLNK | 0o777;
    link.attr.size = 6;
    let u = r.request(Opcode::Symlink, 1, &[b"l\0", b"target\0"]);
    r.reply(Reply::entry(u, &link, 45));
    assert_eq!(r.found(), Vec::<String>::new());
    link.attr.size = 4096;
    let u = r.request(Opcode::Symlink, 1, &[b"m\0", b"target\0"]);
    link.nodeid = 6;
    link.attr.ino = 60;
    r.reply(Reply::entry(u, &link, 45));
    one(
        r.found(),
        "[posix] SYMLINK #4 on node 1 \"m\": symlink node 6 has size 4096 but its target is 6 bytes",
    );
}

// ---- the battery: declared refusals, the owner, races ----

#[test]
fn the_battery_takes_declared_refusals_as_unsupported_and_checks_them() {
    let k = buggy(Bug::RefusesRename);
    // Undeclared, EOPNOTSUPP to RENAME is a failure...
    let report = battery::run(&k);
    assert!(
        matches!(report.outcome("rename_over_existing"), Some(Outcome::Failed(_))),
        "{report}"
    );
    let _ = k.take_violations();
    k.finish().unwrap();
    // ...declared, it is unsupported, and consistent.
    let k = buggy(Bug::RefusesRename);
    let declared = Battery::default().refuses(Opcode::Rename, Errno::EOPNOTSUPP);
    let report = declared.run(&k);
    report.assert_passed();
    for s in ["rename_over_existing", "race_lookup_rename"] {
        assert!(
            matches!(report.outcome(s), Some(Outcome::Unsupported(why)) if why.contains("EOPNOTSUPP") && why.contains("declared")),
            "{s}: {report}"
        );
    }
    assert_eq!(
        report.outcome("declared_refusals"),
        Some(&Outcome::Passed),
        "{report}"
    );
    k.finish().unwrap();

    // A refusal declared for an operation that succeeds is inconsistent.
    let k = buggy(Bug::None);
    let report = Battery::default()
        .refuses(Opcode::Create, Errno::EOPNOTSUPP)
        .run(&k);
    let Some(Outcome::Failed(why)) = report.outcome("declared_refusals") else {
        panic!("{report}")
    };
    assert!(
        why[0].starts_with("CREATE was declared refused with EOPNOTSUPP"),
        "{why:?}"
    );
    assert!(k.finish().unwrap_err().breaks(Rule::Battery));
}

#[test]
fn the_battery_s_owner_is_not_the_test_s_uid() {
    assert_ne!(battery::OWNER.uid, Caller::current().uid);
    let k = buggy(Bug::OwnUid);
    let report = battery::run(&k);
    let Some(Outcome::Failed(why)) = report.outcome("create_write_read") else {
        panic!("{report}")
    };
    assert!(why.iter().any(|d| d.starts_with("owner after CREATE")), "{why:?}");
    let _ = k.finish();
}

#[test]
fn the_battery_runs_every_step_and_reports_each_difference() {
    let k = buggy(Bug::IgnoresTruncate);
    let report = battery::run(&k);
    let Some(Outcome::Failed(why)) = report.outcome("truncate") else {
        panic!("{report}")
    };
    // Shrinking and growing both fail, and the steps after them ran.
    assert!(
        why.iter().any(|d| d.starts_with("size after shrinking")),
        "{why:?}"
    );
    assert!(why.iter().any(|d| d.starts_with("size after growing")), "{why:?}");
    assert!(why.iter().any(|d| d.starts_with("size after RELEASE")), "{why:?}");
    let _ = k.finish();
}

#[test]
fn the_test_kernel_is_shared_by_threads() {
    fn sync<T: Send + Sync>(_: &T) {}
    let k = nodefs();
    sync(&k);
    std::thread::scope(|s| {
        for t in 0..4 {
            let k = &k;
            s.spawn(move || {
                for i in 0..20 {
                    let (e, o) = k
                        .create(Inode::ROOT, format!("t{t}.{i}"), REG | 0o644, libc::O_RDWR)
                        .unwrap();
                    k.release(Inode(e.nodeid), FileHandle(o.fh)).unwrap();
                    k.lookup(Inode::ROOT, format!("t{t}.{i}")).unwrap();
                }
            });
        }
    });
    assert_eq!(k.list_dir(Inode::ROOT, 4096).unwrap().len(), 2 + 80);
    finish_nodefs(k);
}

#[test]
fn an_old_minor_offers_only_what_a_kernel_of_that_minor_knows() {
    let setup = Setup {
        minor: 12,
        ..Setup::default()
    };
    let k = TestKernel::start_with(Arc::new(NodeFs::new(tree::root())), setup).unwrap();
    let offered = k.negotiated().offered;
    for newer in [
        InitFlags::DO_READDIRPLUS,
        InitFlags::SETXATTR_EXT,
        InitFlags::INIT_EXT,
        InitFlags::FLOCK_LOCKS,
    ] {
        assert!(!offered.contains(newer), "{newer:?} is newer than 7.12");
    }
    assert!(offered.contains(InitFlags::DONT_MASK | InitFlags::BIG_WRITES));
    finish_nodefs(k);
}

// ---- the explorer ----

#[test]
fn the_explorer_finds_an_ordering_bug_no_battery_scenario_covers_and_shrinks_it() {
    use fuse_wire::testing::explorer::{Explorer, Op};
    // The battery passes with the bug...
    let k = buggy(Bug::WriteAfterTruncateLost);
    battery::run(&k).assert_passed();
    // ...the explorer finds it, in at most 5 operations.
    let found = Explorer::default().run(&k).unwrap_err();
    assert!(found.ops.len() <= 5, "{found}");
    assert!(
        found.ops.iter().any(|op| matches!(op, Op::Truncate(..))),
        "{found}"
    );
    assert!(found.ops.iter().any(|op| matches!(op, Op::Write(..))), "{found}");
    let text = found.to_string();
    assert!(
        text.contains("#[test]") && text.contains("Explorer::replay(&k, &ops)"),
        "{text}"
    );
    // The test it prints fails on the bug, and passes without it.
    assert!(Explorer::replay(&k, &found.ops).is_err());
    // The checker saw it too: the lost write shrinks the file.
    assert!(k.take_violations().iter().all(|v| v.rule == Rule::AttrBackwards));
    k.finish().unwrap();
    let clean = buggy(Bug::None);
    assert_eq!(Explorer::replay(&clean, &found.ops), Ok(()));
    clean.finish().unwrap();
    // Deterministic from its seed.
    let again = buggy(Bug::WriteAfterTruncateLost);
    assert_eq!(Explorer::default().run(&again).unwrap_err(), found);
    let _ = again.take_violations();
    again.finish().unwrap();
}

#[test]
fn the_explorer_runs_ten_thousand_sequences_on_a_correct_filesystem() {
    use fuse_wire::testing::explorer::Explorer;
    let k = buggy(Bug::None);
    let explorer = Explorer {
        sequences: std::env::var("EXPLORER_N").map_or(10_000, |n| n.parse().unwrap()),
        length: 6,
        ..Explorer::default()
    };
    if let Err(f) = explorer.run(&k) {
        panic!("{f}");
    }
    k.finish().unwrap();
}
