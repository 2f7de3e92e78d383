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
        k.finish().unwrap();
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
