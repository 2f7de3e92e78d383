//! Golden-bytes reply and notification tests: each encoder's output is compared
//! with a byte vector written out field by field here, in native byte order,
//! the way the kernel reads it from `/dev/fuse`. `parts()` is checked too: the
//! header and fixed structs come as one slice, payloads as further slices that
//! are the caller's own memory (same pointer), never copies.

mod proto_support;
use fuse_wire::proto::abi::*;
use fuse_wire::proto::flags::InvalEntryFlags;
use fuse_wire::proto::reply::{self, DirentError, EncodeError, notify};
use fuse_wire::proto::{DirentWriter, Errno, Reply};
use proto_support::W;

const UNIQUE: u64 = 0x0000_0000_dead_0002;

/// `fuse_out_header` followed by `rest`.
fn msg(error: i32, unique: u64, rest: &W) -> Vec<u8> {
    let mut v = W::new().u32((16 + rest.len()) as u32).i32(error).u64(unique).0;
    v.extend_from_slice(&rest.0);
    v
}

/// Checks the whole encoding, the header accessors, `copy_to`, and that
/// `parts()` is the head (header + fixed structs, `head_len` bytes) followed
/// by exactly `payloads`, each pointer-equal to the caller's slice.
fn check(r: &Reply<'_>, expected: &[u8], head_len: usize, payloads: &[&[u8]]) {
    assert_eq!(r.to_vec(), expected, "encoded bytes differ");
    assert_eq!(r.len(), expected.len());
    assert!(!r.is_empty());
    let h = r.header();
    assert_eq!(h.len as usize, expected.len());
    assert_eq!(&h.error.to_ne_bytes()[..], &expected[4..8]);
    assert_eq!(&h.unique.to_ne_bytes()[..], &expected[8..16]);

    let parts: Vec<&[u8]> = r.parts().collect();
    assert_eq!(parts.len(), 1 + payloads.len(), "number of parts");
    assert_eq!(parts[0].len(), head_len, "head part length");
    assert_eq!(parts[0], &expected[..head_len]);
    assert_eq!(r.head(), parts[0]);
    for (got, want) in parts[1..].iter().zip(payloads) {
        assert_eq!(got.len(), want.len());
        assert_eq!(got.as_ptr(), want.as_ptr(), "payload was copied, not borrowed");
    }

    let mut out = vec![0xeeu8; expected.len() + 3];
    assert_eq!(r.copy_to(&mut out), Some(expected.len()));
    assert_eq!(&out[..expected.len()], expected);
    assert_eq!(r.copy_to(&mut out[..expected.len() - 1]), None);
}

// ---------------------------------------------------------------- test values

fn attr() -> Attr {
    Attr {
        ino: 0x1001,
        size: 0x1002,
        blocks: 0x1003,
        atime: 0x1004,
        mtime: 0x1005,
        ctime: 0x1006,
        atimensec: 0x2001,
        mtimensec: 0x2002,
        ctimensec: 0x2003,
        mode: 0o100_644,
        nlink: 0x2005,
        uid: 0x2006,
        gid: 0x2007,
        rdev: 0x2008,
        blksize: 0x2009,
        flags: 0x200a,
    }
}
fn attr_bytes() -> W {
    W::new()
        .u64(0x1001)
        .u64(0x1002)
        .u64(0x1003)
        .u64(0x1004)
        .u64(0x1005)
        .u64(0x1006)
        .u32(0x2001)
        .u32(0x2002)
        .u32(0x2003)
        .u32(0o100_644)
        .u32(0x2005)
        .u32(0x2006)
        .u32(0x2007)
        .u32(0x2008)
        .u32(0x2009)
        .u32(0x200a)
}
fn entry() -> EntryOut {
    EntryOut {
        nodeid: 0x3001,
        generation: 0x3002,
        entry_valid: 0x3003,
        attr_valid: 0x3004,
        entry_valid_nsec: 0x3005,
        attr_valid_nsec: 0x3006,
        attr: attr(),
    }
}
fn entry_bytes() -> W {
    W::new()
        .u64(0x3001)
        .u64(0x3002)
        .u64(0x3003)
        .u64(0x3004)
        .u32(0x3005)
        .u32(0x3006)
        .bytes(&attr_bytes().0)
}
fn open_out() -> OpenOut {
    OpenOut {
        fh: 0x4001,
        open_flags: 0x83,
        backing_id: -7,
    }
}
fn open_out_bytes() -> W {
    W::new().u64(0x4001).u32(0x83).i32(-7)
}

// ---------------------------------------------------------------- replies

#[test]
fn error_reply_is_header_only_with_negative_errno() {
    let r = Reply::error(UNIQUE, Errno::ENOENT);
    check(&r, &msg(-2, UNIQUE, &W::new()), 16, &[]);
    let r = Reply::error(7, Errno::new(511).unwrap());
    check(&r, &msg(-511, 7, &W::new()), 16, &[]);
    assert_eq!(r.payload(), [&[][..], &[][..]]);
}

#[test]
fn empty_reply() {
    check(&Reply::empty(UNIQUE), &msg(0, UNIQUE, &W::new()), 16, &[]);
}

#[test]
fn data_reply_borrows_the_data() {
    let data = b"file contents\x00\x01".to_vec();
    let r = Reply::data(UNIQUE, &data).unwrap();
    check(&r, &msg(0, UNIQUE, &W::new().bytes(&data)), 16, &[&data]);
    assert_eq!(r.payload()[0].as_ptr(), data.as_ptr());
    // Empty data: header only, no empty part.
    let r = Reply::data(UNIQUE, &[]).unwrap();
    check(&r, &msg(0, UNIQUE, &W::new()), 16, &[]);
}

#[test]
fn with_struct_reply() {
    let r = Reply::with_struct(
        UNIQUE,
        &WriteOut {
            size: 4096,
            padding: 0x11,
        },
    );
    check(&r, &msg(0, UNIQUE, &W::new().u32(4096).u32(0x11)), 24, &[]);

    let r = Reply::with_struct(
        UNIQUE,
        &LkOut {
            lk: FileLock {
                start: 1,
                end: 2,
                r#type: 2,
                pid: 99,
            },
        },
    );
    check(
        &r,
        &msg(0, UNIQUE, &W::new().u64(1).u64(2).u32(2).u32(99)),
        40,
        &[],
    );
    // The largest fixed reply, STATX (288 bytes), fits the inline head.
    let r = Reply::with_struct(UNIQUE, &StatxOut::default());
    check(&r, &msg(0, UNIQUE, &W::new().zeros(288)), 16 + 288, &[]);
}

#[test]
fn entry_reply_full_and_compat() {
    let e = entry();
    for minor in [9, 12, 45] {
        let r = Reply::entry(UNIQUE, &e, minor);
        let body = entry_bytes();
        assert_eq!(body.len(), 128);
        check(&r, &msg(0, UNIQUE, &body), 16 + 128, &[]);
    }
    // Before 7.9 fuse_attr ended at rdev: blksize and flags are not sent.
    let r = Reply::entry(UNIQUE, &e, 8);
    check(&r, &msg(0, UNIQUE, &entry_bytes().cut(120)), 16 + 120, &[]);
    assert_eq!(r.len(), 136);
}

#[test]
fn attr_reply_full_and_compat() {
    let a = AttrOut {
        attr_valid: 0x5001,
        attr_valid_nsec: 0x5002,
        dummy: 0x5003,
        attr: attr(),
    };
    let body = W::new()
        .u64(0x5001)
        .u32(0x5002)
        .u32(0x5003)
        .bytes(&attr_bytes().0);
    assert_eq!(body.len(), 104);
    check(
        &Reply::attr(UNIQUE, &a, 45),
        &msg(0, UNIQUE, &body),
        16 + 104,
        &[],
    );
    check(&Reply::attr(UNIQUE, &a, 9), &msg(0, UNIQUE, &body), 16 + 104, &[]);
    let r = Reply::attr(UNIQUE, &a, 8);
    check(&r, &msg(0, UNIQUE, &body.cut(96)), 16 + 96, &[]);
    assert_eq!(r.len(), 112);
}

#[test]
fn create_reply_is_entry_then_open() {
    let body = W::new().bytes(&entry_bytes().0).bytes(&open_out_bytes().0);
    check(
        &Reply::create(UNIQUE, &entry(), &open_out(), 45),
        &msg(0, UNIQUE, &body),
        16 + 144,
        &[],
    );
    // Compat: the entry part shrinks to 120, the open part stays 16.
    let body = W::new()
        .bytes(&entry_bytes().cut(120).0)
        .bytes(&open_out_bytes().0);
    check(
        &Reply::create(UNIQUE, &entry(), &open_out(), 8),
        &msg(0, UNIQUE, &body),
        16 + 136,
        &[],
    );
}

#[test]
fn open_reply() {
    check(
        &Reply::open(UNIQUE, &open_out()),
        &msg(0, UNIQUE, &open_out_bytes()),
        32,
        &[],
    );
}

#[test]
fn statfs_reply_full_and_compat() {
    let st = StatfsOut {
        st: Kstatfs {
            blocks: 0x6001,
            bfree: 0x6002,
            bavail: 0x6003,
            files: 0x6004,
            ffree: 0x6005,
            bsize: 0x6006,
            namelen: 255,
            frsize: 0x6008,
            padding: 0x6009,
            spare: [1, 2, 3, 4, 5, 6],
        },
    };
    let mut body = W::new()
        .u64(0x6001)
        .u64(0x6002)
        .u64(0x6003)
        .u64(0x6004)
        .u64(0x6005)
        .u32(0x6006)
        .u32(255)
        .u32(0x6008)
        .u32(0x6009);
    for s in 1..=6 {
        body = body.u32(s);
    }
    assert_eq!(body.len(), 80);
    check(&Reply::statfs(UNIQUE, &st, 45), &msg(0, UNIQUE, &body), 96, &[]);
    check(&Reply::statfs(UNIQUE, &st, 4), &msg(0, UNIQUE, &body), 96, &[]);
    // Before 7.4 the struct ended after namelen.
    let r = Reply::statfs(UNIQUE, &st, 3);
    check(&r, &msg(0, UNIQUE, &body.cut(48)), 64, &[]);
}

#[test]
fn init_reply_full_and_compat() {
    let mut unused = [0u16; 11];
    for (i, u) in unused.iter_mut().enumerate() {
        *u = 0x700 + i as u16;
    }
    let out = InitOut {
        major: 7,
        minor: 45,
        max_readahead: 0x2_0000,
        flags: 0xc000_0001,
        max_background: 0x0101,
        congestion_threshold: 0x0202,
        max_write: 0x10_0000,
        time_gran: 1,
        max_pages: 256,
        map_alignment: 0x0303,
        flags2: 0x25,
        max_stack_depth: 2,
        request_timeout: 0x0404,
        unused,
    };
    let mut body = W::new()
        .u32(7)
        .u32(45)
        .u32(0x2_0000)
        .u32(0xc000_0001)
        .u16(0x0101)
        .u16(0x0202)
        .u32(0x10_0000)
        .u32(1)
        .u16(256)
        .u16(0x0303)
        .u32(0x25)
        .u32(2)
        .u16(0x0404);
    for u in unused {
        body = body.u16(u);
    }
    assert_eq!(body.len(), 64);
    check(&Reply::init(UNIQUE, &out, 45), &msg(0, UNIQUE, &body), 80, &[]);
    check(&Reply::init(UNIQUE, &out, 23), &msg(0, UNIQUE, &body), 80, &[]);
    // A 7.22 kernel reads 24 bytes: up to and including max_write.
    check(
        &Reply::init(UNIQUE, &out, 22),
        &msg(0, UNIQUE, &body.clone().cut(24)),
        40,
        &[],
    );
    check(
        &Reply::init(UNIQUE, &out, 5),
        &msg(0, UNIQUE, &body.clone().cut(24)),
        40,
        &[],
    );
    // A 7.4 kernel reads major and minor only.
    check(
        &Reply::init(UNIQUE, &out, 4),
        &msg(0, UNIQUE, &body.cut(8)),
        24,
        &[],
    );
}

#[test]
fn cuse_init_reply_borrows_device_info() {
    let mut spare = [0u32; 10];
    for (i, s) in spare.iter_mut().enumerate() {
        *s = 0x800 + i as u32;
    }
    let out = CuseInitOut {
        major: 7,
        minor: 45,
        unused: 0x77,
        flags: 1,
        max_read: 0x2_0000,
        max_write: 0x2_0000,
        dev_major: 240,
        dev_minor: 3,
        spare,
    };
    let info = b"DEVNAME=mydev\0".to_vec();
    let mut body = W::new()
        .u32(7)
        .u32(45)
        .u32(0x77)
        .u32(1)
        .u32(0x2_0000)
        .u32(0x2_0000)
        .u32(240)
        .u32(3);
    for s in spare {
        body = body.u32(s);
    }
    assert_eq!(body.len(), 72);
    let r = Reply::cuse_init(UNIQUE, &out, &info).unwrap();
    check(&r, &msg(0, UNIQUE, &body.bytes(&info)), 16 + 72, &[&info]);
}

#[test]
fn ioctl_reply_borrows_output() {
    let out = IoctlOut {
        result: -3,
        flags: 4,
        in_iovs: 1,
        out_iovs: 2,
    };
    let data = vec![9u8; 33];
    let r = Reply::ioctl(UNIQUE, &out, &data).unwrap();
    check(
        &r,
        &msg(0, UNIQUE, &W::new().i32(-3).u32(4).u32(1).u32(2).bytes(&data)),
        32,
        &[&data],
    );
    // Without data: one part.
    let r = Reply::ioctl(UNIQUE, &out, &[]).unwrap();
    check(
        &r,
        &msg(0, UNIQUE, &W::new().i32(-3).u32(4).u32(1).u32(2)),
        32,
        &[],
    );
}

// ---------------------------------------------------------------- errno range

#[test]
fn errno_range_is_1_to_511() {
    for bad in [0, 512, -1, -511, i32::MIN, i32::MAX, 1000] {
        assert_eq!(Errno::new(bad), Err(EncodeError::InvalidErrno(bad)), "{bad}");
        assert_eq!(Errno::new_or_eio(bad), Errno::EIO);
    }
    for good in [1, 2, 38, 510, 511] {
        assert_eq!(Errno::new(good).map(Errno::get), Ok(good));
        assert_eq!(Errno::new_or_eio(good).get(), good);
    }
    assert_eq!(Errno::EPERM.get(), 1);
    assert_eq!(Errno::ENOSYS.get(), 38);
}

// ---------------------------------------------------------------- notifications

#[test]
fn notify_poll_wakeup() {
    check(
        &notify::poll_wakeup(0xabc),
        &msg(1, 0, &W::new().u64(0xabc)),
        24,
        &[],
    );
}

#[test]
fn notify_inval_inode() {
    check(
        &notify::inval_inode(0x42, -1, 0),
        &msg(2, 0, &W::new().u64(0x42).i64(-1).i64(0)),
        40,
        &[],
    );
    check(
        &notify::inval_inode(0x42, 4096, -5),
        &msg(2, 0, &W::new().u64(0x42).i64(4096).i64(-5)),
        40,
        &[],
    );
}

#[test]
fn notify_inval_entry_with_and_without_expire_only() {
    let name = b"entry-name".to_vec();
    for (flags, bits) in [
        (InvalEntryFlags::empty(), 0u32),
        (InvalEntryFlags::EXPIRE_ONLY, 1),
    ] {
        let r = notify::inval_entry(0x51, &name, flags).unwrap();
        let body = W::new().u64(0x51).u32(10).u32(bits).bytes(&name).bytes(&[0]);
        // Three parts: head, the caller's name, a NUL.
        let parts: Vec<&[u8]> = r.parts().collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0], &msg(3, 0, &body)[..32]);
        assert_eq!(parts[1].as_ptr(), name.as_ptr());
        assert_eq!(parts[1].len(), name.len());
        assert_eq!(parts[2], &[0]);
        assert_eq!(r.to_vec(), msg(3, 0, &body));
        assert_eq!(r.header().len as usize, 16 + 16 + 10 + 1);
    }
}

#[test]
fn notify_delete() {
    let name = b"victim".to_vec();
    let r = notify::delete(0x61, 0x62, &name).unwrap();
    let body = W::new()
        .u64(0x61)
        .u64(0x62)
        .u32(6)
        .u32(0)
        .bytes(&name)
        .bytes(&[0]);
    let parts: Vec<&[u8]> = r.parts().collect();
    assert_eq!(parts.len(), 3);
    assert_eq!(parts[1].as_ptr(), name.as_ptr());
    assert_eq!(parts[2], &[0]);
    assert_eq!(r.to_vec(), msg(6, 0, &body));
    assert_eq!(r.head().len(), 40);
}

#[test]
fn notify_names_are_checked() {
    let flags = InvalEntryFlags::empty();
    assert_eq!(
        notify::inval_entry(1, b"", flags).unwrap_err(),
        EncodeError::InvalidName("empty")
    );
    assert_eq!(
        notify::inval_entry(1, b"a\0b", flags).unwrap_err(),
        EncodeError::InvalidName("contains NUL")
    );
    assert!(notify::delete(1, 2, b"").is_err());
    assert!(notify::delete(1, 2, &[b'x'; 4096]).is_err());
    assert!(notify::delete(1, 2, &[b'x'; 4095]).is_ok());
}

#[test]
fn notify_store_borrows_data() {
    let data = vec![0x5au8; 100];
    let r = notify::store(0x71, 8192, &data).unwrap();
    let body = W::new().u64(0x71).u64(8192).u32(100).u32(0).bytes(&data);
    check(&r, &msg(4, 0, &body), 40, &[&data]);
}

#[test]
fn notify_retrieve() {
    let r = notify::retrieve(0x91, 0x81, 4096, 65536);
    let body = W::new().u64(0x91).u64(0x81).u64(4096).u32(65536).u32(0);
    check(&r, &msg(5, 0, &body), 48, &[]);
}

#[test]
fn notify_resend_and_inc_epoch_are_header_only() {
    check(&notify::resend(), &msg(7, 0, &W::new()), 16, &[]);
    check(&notify::inc_epoch(), &msg(8, 0, &W::new()), 16, &[]);
}

#[test]
fn notify_prune_borrows_the_ids() {
    let ids = vec![10u64, 20, 0xffff_ffff_ffff_fffe];
    let r = notify::prune(&ids).unwrap();
    let body = W::new()
        .u32(3)
        .u32(0)
        .u64(0)
        .u64(10)
        .u64(20)
        .u64(0xffff_ffff_ffff_fffe);
    let id_bytes = &r.payload()[0];
    assert_eq!(id_bytes.as_ptr(), ids.as_ptr().cast::<u8>());
    assert_eq!(id_bytes.len(), 24);
    check(&r, &msg(9, 0, &body), 32, &[id_bytes]);
    // No ids: header and the fixed struct only.
    check(
        &notify::prune(&[]).unwrap(),
        &msg(9, 0, &W::new().u32(0).u32(0).u64(0)),
        32,
        &[],
    );
}

// ---------------------------------------------------------------- directory records

fn dirent_bytes(ino: u64, off: u64, typ: u32, name: &[u8]) -> W {
    let w = W::new()
        .u64(ino)
        .u64(off)
        .u32(name.len() as u32)
        .u32(typ)
        .bytes(name);
    let pad = w.len().next_multiple_of(8) - w.len();
    w.zeros(pad)
}

#[test]
fn readdir_records_are_packed_and_zero_padded() {
    // Pre-fill with garbage so that padding must be written, not assumed.
    let mut buf = vec![0xffu8; 4096];
    let mut w = DirentWriter::new(&mut buf);
    assert!(w.is_empty());
    w.add(1, 1, 4, b".").unwrap();
    w.add(1, 2, 4, b"..").unwrap();
    w.add(0x1234, 3, 8, b"exactly8").unwrap();
    w.add(0x1235, u64::MAX, 10, b"nine-byte").unwrap();
    let expected = W::new()
        .bytes(&dirent_bytes(1, 1, 4, b".").0)
        .bytes(&dirent_bytes(1, 2, 4, b"..").0)
        .bytes(&dirent_bytes(0x1234, 3, 8, b"exactly8").0)
        .bytes(&dirent_bytes(0x1235, u64::MAX, 10, b"nine-byte").0);
    assert_eq!(expected.len(), 32 + 32 + 32 + 40);
    assert_eq!(w.len(), expected.len());
    assert_eq!(w.as_bytes(), &expected.0[..]);
    // The padding is zeros: byte 25..32 of the first record.
    assert_eq!(&w.as_bytes()[25..32], &[0; 7]);
    assert_eq!(reply::dirent_size(1), 32);
    assert_eq!(reply::dirent_size(8), 32);
    assert_eq!(reply::dirent_size(9), 40);
    // Bytes past the records are untouched.
    let n = w.len();
    assert!(buf[n..].iter().all(|&b| b == 0xff));
}

#[test]
fn readdirplus_records_carry_the_entry() {
    let mut buf = vec![0xffu8; 4096];
    let mut w = DirentWriter::new(&mut buf);
    let e = entry();
    w.add_plus(&e, 7, 8, b"file").unwrap();
    w.add_plus(&EntryOut::default(), 8, 4, b"sixteen-byte-nam")
        .unwrap();
    let rec1 = W::new()
        .bytes(&entry_bytes().0)
        .bytes(&dirent_bytes(0x1001, 7, 8, b"file").0);
    assert_eq!(rec1.len(), 160);
    let rec2 = W::new()
        .zeros(128)
        .bytes(&dirent_bytes(0, 8, 4, b"sixteen-byte-nam").0);
    assert_eq!(rec2.len(), 168);
    assert_eq!(w.as_bytes(), &[rec1.0, rec2.0].concat()[..]);
    assert_eq!(reply::direntplus_size(4), 160);
    assert_eq!(reply::direntplus_size(16), 168);
}

#[test]
fn full_buffer_is_reported_and_left_unchanged() {
    // Room for one 32-byte record and 31 more bytes.
    let mut buf = vec![0xaau8; 63];
    let mut w = DirentWriter::new(&mut buf);
    w.add(5, 1, 8, b"first").unwrap();
    let before = w.as_bytes().to_vec();
    assert_eq!(w.add(6, 2, 8, b"second"), Err(DirentError::Full));
    assert_eq!(w.add_plus(&entry(), 2, 8, b"s"), Err(DirentError::Full));
    assert_eq!(w.len(), 32);
    assert_eq!(w.as_bytes(), &before[..]);
    assert_eq!(&buf[..32], &before[..]);
    assert!(buf[32..].iter().all(|&b| b == 0xaa), "a failed add wrote bytes");

    // Exactly fitting records are accepted.
    let mut buf = vec![0u8; 64];
    let mut w = DirentWriter::new(&mut buf);
    w.add(1, 1, 8, b"a").unwrap();
    w.add(2, 2, 8, b"b").unwrap();
    assert_eq!(w.add(3, 3, 8, b"c"), Err(DirentError::Full));
    assert_eq!(w.len(), 64);

    // A READDIRPLUS record needs 160 bytes for a 1..=8-byte name.
    let mut buf = vec![0u8; 159];
    let mut w = DirentWriter::new(&mut buf);
    assert_eq!(w.add_plus(&entry(), 1, 8, b"x"), Err(DirentError::Full));
    assert!(w.is_empty());
}

#[test]
fn invalid_names_are_rejected() {
    let mut buf = vec![0u8; 8192];
    let mut w = DirentWriter::new(&mut buf);
    let long = vec![b'n'; 1025];
    for bad in [&b""[..], b"a/b", b"/", b"a\0b", b"\0", &long] {
        assert_eq!(w.add(1, 1, 8, bad), Err(DirentError::InvalidName), "{bad:?}");
        assert_eq!(w.add_plus(&entry(), 1, 8, bad), Err(DirentError::InvalidName));
    }
    assert!(w.is_empty());
    let max = vec![b'n'; 1024];
    w.add(1, 1, 8, &max).unwrap();
    assert_eq!(w.len(), 24 + 1024);
    w.add_plus(&entry(), 2, 8, &max).unwrap();
    assert_eq!(w.len(), 24 + 1024 + 152 + 1024);
}
