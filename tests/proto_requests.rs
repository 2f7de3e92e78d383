//! Golden-bytes request tests: every opcode of the table, built byte by byte
//! the way the kernel lays it out on `/dev/fuse`, parsed, and compared field by
//! field with the typed value the parser must produce.
//!
//! The bytes are assembled here with a tiny writer (`W`) that pushes integers in
//! native byte order and NUL-terminated names; nothing in this file serialises
//! the crate's own structs, so a wrong offset or size in the crate cannot cancel
//! itself out. Field values are all distinct and non-zero (padding included) so
//! that a swapped or shifted field shows up.

mod proto_support;
use fuse_wire::proto::abi::*;
use fuse_wire::proto::request::Extension;
use fuse_wire::proto::{Opcode, Operation, ParseConfig, Request};
use proto_support::W;
use std::collections::BTreeSet;
use std::ffi::CStr;

// ---------------------------------------------------------------- helpers

const UNIQUE: u64 = 0x0123_4567_89ab_cdee;
const NODEID: u64 = 0x1122_3344_5566_7788;
const UID: u32 = 1000;
const GID: u32 = 1001;
const PID: u32 = 4242;
const HDR: usize = 40;

/// A whole request: `fuse_in_header` + body + extension area; `len` and
/// `total_extlen` are computed (the extension area must be 8-aligned).
fn request(opcode: u32, body: &W, ext: &[u8]) -> Vec<u8> {
    assert_eq!(ext.len() % 8, 0, "test bug: extension area not 8-aligned");
    request_raw(opcode, body, ext, (ext.len() / 8) as u16)
}

/// Like [`request`] but with an explicit `total_extlen`.
fn request_raw(opcode: u32, body: &W, ext: &[u8], total_extlen: u16) -> Vec<u8> {
    let len = (HDR + body.len() + ext.len()) as u32;
    let mut v = W::new()
        .u32(len)
        .u32(opcode)
        .u64(UNIQUE)
        .u64(NODEID)
        .u32(UID)
        .u32(GID)
        .u32(PID)
        .u16(total_extlen)
        .u16(0)
        .0;
    v.extend_from_slice(&body.0);
    v.extend_from_slice(ext);
    v
}

fn header(opcode: u32, len: usize, total_extlen: u16) -> InHeader {
    InHeader {
        len: len as u32,
        opcode,
        unique: UNIQUE,
        nodeid: NODEID,
        uid: UID,
        gid: GID,
        pid: PID,
        total_extlen,
        padding: 0,
    }
}

fn parse(buf: &[u8], minor: u32) -> Request<'_> {
    Request::parse(buf, minor).unwrap_or_else(|e| panic!("parse at 7.{minor} failed: {e:?}"))
}

fn parse_cfg<'a>(buf: &'a [u8], cfg: &ParseConfig) -> Request<'a> {
    Request::parse_with(buf, cfg).unwrap_or_else(|e| panic!("parse with {cfg:?} failed: {e:?}"))
}

/// Checks that `part` is borrowed from `buf` starting at byte `offset`.
fn borrowed_at(buf: &[u8], part: &[u8], offset: usize) {
    let base = buf.as_ptr() as usize;
    let p = part.as_ptr() as usize;
    assert!(
        p >= base && p + part.len() <= base + buf.len(),
        "slice is not borrowed from the request buffer"
    );
    assert_eq!(p - base, offset, "slice borrowed from the wrong offset");
}

fn cstr_at(buf: &[u8], s: &CStr, offset: usize) {
    borrowed_at(buf, s.to_bytes_with_nul(), offset);
}

/// Parses `buf` at `minor`, checks the header and that there are no
/// extensions, and returns the request.
fn parse_plain(buf: &[u8], minor: u32) -> Request<'_> {
    let req = parse(buf, minor);
    let opcode = u32::from_ne_bytes(buf[4..8].try_into().unwrap());
    assert_eq!(req.header, header(opcode, buf.len(), 0));
    assert_eq!(req.unique(), UNIQUE);
    assert_eq!(req.nodeid(), NODEID);
    assert!(req.extensions.is_empty());
    assert_eq!(req.extensions.iter().count(), 0);
    req
}

// Field bodies shared by several opcodes.

fn open_in_bytes() -> W {
    W::new().u32(0o100_002).u32(0x0000_0001)
}
fn open_in() -> OpenIn {
    OpenIn {
        flags: 0o100_002,
        open_flags: 1,
    }
}
fn read_in_bytes() -> W {
    W::new()
        .u64(0xf00d_0000_0000_0001)
        .u64(0x0000_0001_0000_0000)
        .u32(131_072)
        .u32(2)
        .u64(0xdead_beef_0bad_f00d)
        .u32(0o2)
        .u32(0x5a5a_5a5a)
}
fn read_in() -> ReadIn {
    ReadIn {
        fh: 0xf00d_0000_0000_0001,
        offset: 0x0000_0001_0000_0000,
        size: 131_072,
        read_flags: 2,
        lock_owner: 0xdead_beef_0bad_f00d,
        flags: 0o2,
        padding: 0x5a5a_5a5a,
    }
}
fn release_in_bytes() -> W {
    W::new().u64(77).u32(0o2).u32(3).u64(0x0102_0304_0506_0708)
}
fn release_in() -> ReleaseIn {
    ReleaseIn {
        fh: 77,
        flags: 0o2,
        release_flags: 3,
        lock_owner: 0x0102_0304_0506_0708,
    }
}
fn fsync_in_bytes() -> W {
    W::new().u64(78).u32(1).u32(0x7777)
}
fn fsync_in() -> FsyncIn {
    FsyncIn {
        fh: 78,
        fsync_flags: 1,
        padding: 0x7777,
    }
}
fn lk_in_bytes() -> W {
    W::new()
        .u64(79)
        .u64(0xaaaa_bbbb_cccc_dddd)
        .u64(100)
        .u64(u64::MAX)
        .u32(1) // F_WRLCK
        .u32(4321)
        .u32(1)
        .u32(0x3333)
}
fn lk_in() -> LkIn {
    LkIn {
        fh: 79,
        owner: 0xaaaa_bbbb_cccc_dddd,
        lk: FileLock {
            start: 100,
            end: u64::MAX,
            r#type: 1,
            pid: 4321,
        },
        lk_flags: 1,
        padding: 0x3333,
    }
}
fn create_in_bytes() -> W {
    W::new().u32(0o100_101).u32(0o100_644).u32(0o022).u32(1)
}
fn create_in() -> CreateIn {
    CreateIn {
        flags: 0o100_101,
        mode: 0o100_644,
        umask: 0o022,
        open_flags: 1,
    }
}
fn copy_file_range_in_bytes() -> W {
    W::new()
        .u64(11)
        .u64(12)
        .u64(13)
        .u64(14)
        .u64(15)
        .u64(1 << 40)
        .u64(0x8000_0000_0000_0001)
}
fn copy_file_range_in() -> CopyFileRangeIn {
    CopyFileRangeIn {
        fh_in: 11,
        off_in: 12,
        nodeid_out: 13,
        fh_out: 14,
        off_out: 15,
        len: 1 << 40,
        flags: 0x8000_0000_0000_0001,
    }
}

// ---------------------------------------------------------------- one case per opcode
//
// Each case builds its request, checks the parse and returns the opcode it
// covered; `every_opcode_has_a_golden_case` checks that together they cover
// `Opcode::ALL`.

mod cases {
    use super::*;

    pub fn lookup() -> Opcode {
        let buf = request(1, &W::new().name("hello.txt"), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Lookup { name: c"hello.txt" });
        let Operation::Lookup { name } = req.op else {
            unreachable!()
        };
        cstr_at(&buf, name, HDR);
        req.op.opcode()
    }

    pub fn forget() -> Opcode {
        let buf = request(2, &W::new().u64(0x0000_0002_0000_0003), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Forget {
                arg: ForgetIn {
                    nlookup: 0x0000_0002_0000_0003
                }
            }
        );
        req.op.opcode()
    }

    pub fn getattr() -> Opcode {
        let buf = request(3, &W::new().u32(1).u32(0xabcd).u64(0x99), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Getattr {
                arg: GetattrIn {
                    getattr_flags: 1,
                    dummy: 0xabcd,
                    fh: 0x99
                }
            }
        );
        req.op.opcode()
    }

    pub fn setattr() -> Opcode {
        let body = W::new()
            .u32(0xfff)
            .u32(0x0101_0101)
            .u64(21)
            .u64(22)
            .u64(23)
            .u64(24)
            .u64(25)
            .u64(26)
            .u32(27)
            .u32(28)
            .u32(29)
            .u32(0o4755)
            .u32(30)
            .u32(31)
            .u32(32)
            .u32(33);
        assert_eq!(body.len(), 88);
        let buf = request(4, &body, &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Setattr {
                arg: SetattrIn {
                    valid: 0xfff,
                    padding: 0x0101_0101,
                    fh: 21,
                    size: 22,
                    lock_owner: 23,
                    atime: 24,
                    mtime: 25,
                    ctime: 26,
                    atimensec: 27,
                    mtimensec: 28,
                    ctimensec: 29,
                    mode: 0o4755,
                    unused4: 30,
                    uid: 31,
                    gid: 32,
                    unused5: 33,
                }
            }
        );
        req.op.opcode()
    }

    pub fn readlink() -> Opcode {
        let buf = request(5, &W::new(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Readlink);
        req.op.opcode()
    }

    pub fn symlink() -> Opcode {
        let buf = request(6, &W::new().name("link").name("../some/target"), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Symlink {
                name: c"link",
                target: c"../some/target"
            }
        );
        let Operation::Symlink { name, target } = req.op else {
            unreachable!()
        };
        cstr_at(&buf, name, HDR);
        cstr_at(&buf, target, HDR + 5);
        req.op.opcode()
    }

    pub fn mknod() -> Opcode {
        let buf = request(
            8,
            &W::new()
                .u32(0o020_600)
                .u32(0x0801)
                .u32(0o027)
                .u32(0x4444)
                .name("dev"),
            &[],
        );
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Mknod {
                arg: MknodIn {
                    mode: 0o020_600,
                    rdev: 0x0801,
                    umask: 0o027,
                    padding: 0x4444
                },
                name: c"dev"
            }
        );
        let Operation::Mknod { name, .. } = req.op else {
            unreachable!()
        };
        cstr_at(&buf, name, HDR + 16);
        req.op.opcode()
    }

    pub fn mkdir() -> Opcode {
        let buf = request(9, &W::new().u32(0o755).u32(0o022).name("subdir"), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Mkdir {
                arg: MkdirIn {
                    mode: 0o755,
                    umask: 0o022
                },
                name: c"subdir"
            }
        );
        let Operation::Mkdir { name, .. } = req.op else {
            unreachable!()
        };
        cstr_at(&buf, name, HDR + 8);
        req.op.opcode()
    }

    pub fn unlink() -> Opcode {
        let buf = request(10, &W::new().name("gone"), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Unlink { name: c"gone" });
        req.op.opcode()
    }

    pub fn rmdir() -> Opcode {
        let buf = request(11, &W::new().name("emptydir"), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Rmdir { name: c"emptydir" });
        req.op.opcode()
    }

    pub fn rename() -> Opcode {
        let buf = request(12, &W::new().u64(0x55).name("old").name("new name"), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Rename {
                arg: RenameIn { newdir: 0x55 },
                name: c"old",
                newname: c"new name"
            }
        );
        let Operation::Rename { name, newname, .. } = req.op else {
            unreachable!()
        };
        cstr_at(&buf, name, HDR + 8);
        cstr_at(&buf, newname, HDR + 12);
        req.op.opcode()
    }

    pub fn link() -> Opcode {
        let buf = request(13, &W::new().u64(0x66).name("hardlink"), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Link {
                arg: LinkIn { oldnodeid: 0x66 },
                name: c"hardlink"
            }
        );
        req.op.opcode()
    }

    pub fn open() -> Opcode {
        let buf = request(14, &open_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Open { arg: open_in() });
        req.op.opcode()
    }

    pub fn read() -> Opcode {
        let buf = request(15, &read_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Read { arg: read_in() });
        req.op.opcode()
    }

    pub fn write() -> Opcode {
        let data = b"some bytes to write\x00\xff";
        let body = W::new()
            .u64(0x10)
            .u64(4096)
            .u32(data.len() as u32)
            .u32(7)
            .u64(0x0bad_cafe)
            .u32(0o1)
            .u32(0x1212)
            .bytes(data);
        let buf = request(16, &body, &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Write {
                arg: WriteIn {
                    fh: 0x10,
                    offset: 4096,
                    size: data.len() as u32,
                    write_flags: 7,
                    lock_owner: 0x0bad_cafe,
                    flags: 0o1,
                    padding: 0x1212
                },
                data
            }
        );
        let Operation::Write { data: d, .. } = req.op else {
            unreachable!()
        };
        borrowed_at(&buf, d, HDR + 40);
        req.op.opcode()
    }

    pub fn statfs() -> Opcode {
        let buf = request(17, &W::new(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Statfs);
        req.op.opcode()
    }

    pub fn release() -> Opcode {
        let buf = request(18, &release_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Release { arg: release_in() });
        req.op.opcode()
    }

    pub fn fsync() -> Opcode {
        let buf = request(20, &fsync_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Fsync { arg: fsync_in() });
        req.op.opcode()
    }

    /// SETXATTR without SETXATTR_EXT: the kernel sends the 8-byte compat struct.
    pub fn setxattr() -> Opcode {
        let value = b"v\x00lue";
        let buf = request(
            21,
            &W::new()
                .u32(value.len() as u32)
                .u32(2)
                .name("user.k")
                .bytes(value),
            &[],
        );
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Setxattr {
                arg: SetxattrIn {
                    size: value.len() as u32,
                    flags: 2,
                    setxattr_flags: 0,
                    padding: 0
                },
                name: c"user.k",
                value
            }
        );
        let Operation::Setxattr { name, value: v, .. } = req.op else {
            unreachable!()
        };
        cstr_at(&buf, name, HDR + 8);
        borrowed_at(&buf, v, HDR + 8 + 7);
        req.op.opcode()
    }

    pub fn getxattr() -> Opcode {
        let buf = request(22, &W::new().u32(256).u32(0x0f0f).name("user.attr"), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Getxattr {
                arg: GetxattrIn {
                    size: 256,
                    padding: 0x0f0f
                },
                name: c"user.attr"
            }
        );
        req.op.opcode()
    }

    pub fn listxattr() -> Opcode {
        let buf = request(23, &W::new().u32(0).u32(0x0e0e), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Listxattr {
                arg: GetxattrIn {
                    size: 0,
                    padding: 0x0e0e
                }
            }
        );
        req.op.opcode()
    }

    pub fn removexattr() -> Opcode {
        let buf = request(24, &W::new().name("trusted.x"), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Removexattr { name: c"trusted.x" });
        req.op.opcode()
    }

    pub fn flush() -> Opcode {
        let buf = request(25, &W::new().u64(80).u32(0x11).u32(0x22).u64(0x33), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Flush {
                arg: FlushIn {
                    fh: 80,
                    unused: 0x11,
                    padding: 0x22,
                    lock_owner: 0x33
                }
            }
        );
        req.op.opcode()
    }

    /// INIT from a 7.45 kernel: the 64-byte `fuse_init_in` with `flags2`.
    pub fn init() -> Opcode {
        let mut body = W::new().u32(7).u32(45).u32(131_072).u32(0xfeff_ffff).u32(0x7ff);
        for i in 0..11 {
            body = body.u32(0x100 + i);
        }
        assert_eq!(body.len(), 64);
        let buf = request(26, &body, &[]);
        let req = parse_plain(&buf, 45);
        let mut unused = [0u32; 11];
        for (i, u) in unused.iter_mut().enumerate() {
            *u = 0x100 + i as u32;
        }
        assert_eq!(
            req.op,
            Operation::Init {
                arg: InitIn {
                    major: 7,
                    minor: 45,
                    max_readahead: 131_072,
                    flags: 0xfeff_ffff,
                    flags2: 0x7ff,
                    unused
                }
            }
        );
        req.op.opcode()
    }

    pub fn opendir() -> Opcode {
        let buf = request(27, &open_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Opendir { arg: open_in() });
        req.op.opcode()
    }

    pub fn readdir() -> Opcode {
        let buf = request(28, &read_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Readdir { arg: read_in() });
        req.op.opcode()
    }

    pub fn releasedir() -> Opcode {
        let buf = request(29, &release_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Releasedir { arg: release_in() });
        req.op.opcode()
    }

    pub fn fsyncdir() -> Opcode {
        let buf = request(30, &fsync_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Fsyncdir { arg: fsync_in() });
        req.op.opcode()
    }

    pub fn getlk() -> Opcode {
        let buf = request(31, &lk_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Getlk { arg: lk_in() });
        req.op.opcode()
    }

    pub fn setlk() -> Opcode {
        let buf = request(32, &lk_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Setlk { arg: lk_in() });
        req.op.opcode()
    }

    pub fn setlkw() -> Opcode {
        let buf = request(33, &lk_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Setlkw { arg: lk_in() });
        req.op.opcode()
    }

    pub fn access() -> Opcode {
        let buf = request(34, &W::new().u32(0o7).u32(0x9999), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Access {
                arg: AccessIn {
                    mask: 0o7,
                    padding: 0x9999
                }
            }
        );
        req.op.opcode()
    }

    pub fn create() -> Opcode {
        let buf = request(35, &create_in_bytes().name("new.txt"), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Create {
                arg: create_in(),
                name: c"new.txt"
            }
        );
        assert!(!req.op.is_atomic_open());
        let Operation::Create { name, .. } = req.op else {
            unreachable!()
        };
        cstr_at(&buf, name, HDR + 16);
        req.op.opcode()
    }

    /// INTERRUPT: its own unique is the target's with bit 0 set.
    pub fn interrupt() -> Opcode {
        let mut buf = request(36, &W::new().u64(UNIQUE), &[]);
        buf[8..16].copy_from_slice(&(UNIQUE | 1).to_ne_bytes());
        let req = parse(&buf, 45);
        assert_eq!(req.unique(), UNIQUE | 1);
        assert_eq!(
            req.op,
            Operation::Interrupt {
                arg: InterruptIn { unique: UNIQUE }
            }
        );
        req.op.opcode()
    }

    pub fn bmap() -> Opcode {
        let buf = request(37, &W::new().u64(1234).u32(4096).u32(0x4321), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Bmap {
                arg: BmapIn {
                    block: 1234,
                    blocksize: 4096,
                    padding: 0x4321
                }
            }
        );
        req.op.opcode()
    }

    pub fn destroy() -> Opcode {
        let buf = request(38, &W::new(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Destroy);
        req.op.opcode()
    }

    pub fn ioctl() -> Opcode {
        let data = [1u8, 2, 3, 4, 5];
        let body = W::new()
            .u64(81)
            .u32(0x14)
            .u32(0x8008_6601)
            .u64(0x7fff_0000_1000)
            .u32(data.len() as u32)
            .u32(512)
            .bytes(&data);
        let buf = request(39, &body, &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Ioctl {
                arg: IoctlIn {
                    fh: 81,
                    flags: 0x14,
                    cmd: 0x8008_6601,
                    arg: 0x7fff_0000_1000,
                    in_size: 5,
                    out_size: 512
                },
                data: &data
            }
        );
        let Operation::Ioctl { data: d, .. } = req.op else {
            unreachable!()
        };
        borrowed_at(&buf, d, HDR + 32);
        req.op.opcode()
    }

    pub fn poll() -> Opcode {
        let buf = request(40, &W::new().u64(82).u64(0x4b48).u32(1).u32(0x0019), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Poll {
                arg: PollIn {
                    fh: 82,
                    kh: 0x4b48,
                    flags: 1,
                    events: 0x0019
                }
            }
        );
        req.op.opcode()
    }

    pub fn notify_reply() -> Opcode {
        let data = [0xa5u8; 13];
        let body = W::new()
            .u64(0xd1)
            .u64(8192)
            .u32(13)
            .u32(0xd2)
            .u64(0xd3)
            .u64(0xd4)
            .bytes(&data);
        let buf = request(41, &body, &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::NotifyReply {
                arg: NotifyRetrieveIn {
                    dummy1: 0xd1,
                    offset: 8192,
                    size: 13,
                    dummy2: 0xd2,
                    dummy3: 0xd3,
                    dummy4: 0xd4
                },
                data: &data
            }
        );
        let Operation::NotifyReply { data: d, .. } = req.op else {
            unreachable!()
        };
        borrowed_at(&buf, d, HDR + 40);
        req.op.opcode()
    }

    pub fn batch_forget() -> Opcode {
        let body = W::new()
            .u32(3)
            .u32(0xbf)
            .u64(100)
            .u64(1)
            .u64(200)
            .u64(2)
            .u64(300)
            .u64(u64::MAX);
        let buf = request(42, &body, &[]);
        let req = parse_plain(&buf, 45);
        let Operation::BatchForget { arg, forgets } = req.op else {
            panic!("not BATCH_FORGET: {:?}", req.op)
        };
        assert_eq!(
            arg,
            BatchForgetIn {
                count: 3,
                dummy: 0xbf
            }
        );
        assert_eq!(forgets.len(), 3);
        assert!(!forgets.is_empty());
        let got: Vec<ForgetOne> = forgets.iter().collect();
        assert_eq!(
            got,
            [
                ForgetOne {
                    nodeid: 100,
                    nlookup: 1
                },
                ForgetOne {
                    nodeid: 200,
                    nlookup: 2
                },
                ForgetOne {
                    nodeid: 300,
                    nlookup: u64::MAX
                },
            ]
        );
        req.op.opcode()
    }

    pub fn fallocate() -> Opcode {
        let buf = request(43, &W::new().u64(83).u64(4096).u64(1 << 20).u32(3).u32(0xfa), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Fallocate {
                arg: FallocateIn {
                    fh: 83,
                    offset: 4096,
                    length: 1 << 20,
                    mode: 3,
                    padding: 0xfa
                }
            }
        );
        req.op.opcode()
    }

    pub fn readdirplus() -> Opcode {
        let buf = request(44, &read_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(req.op, Operation::Readdirplus { arg: read_in() });
        req.op.opcode()
    }

    pub fn rename2() -> Opcode {
        let buf = request(45, &W::new().u64(0x56).u32(2).u32(0x2e).name("a").name("b"), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Rename2 {
                arg: Rename2In {
                    newdir: 0x56,
                    flags: 2,
                    padding: 0x2e
                },
                name: c"a",
                newname: c"b"
            }
        );
        let Operation::Rename2 { name, newname, .. } = req.op else {
            unreachable!()
        };
        cstr_at(&buf, name, HDR + 16);
        cstr_at(&buf, newname, HDR + 18);
        req.op.opcode()
    }

    pub fn lseek() -> Opcode {
        let buf = request(46, &W::new().u64(84).u64(999).u32(3).u32(0x5e), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Lseek {
                arg: LseekIn {
                    fh: 84,
                    offset: 999,
                    whence: 3,
                    padding: 0x5e
                }
            }
        );
        req.op.opcode()
    }

    pub fn copy_file_range() -> Opcode {
        let buf = request(47, &copy_file_range_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::CopyFileRange {
                arg: copy_file_range_in()
            }
        );
        req.op.opcode()
    }

    pub fn setupmapping() -> Opcode {
        let buf = request(
            48,
            &W::new().u64(85).u64(1 << 21).u64(1 << 21).u64(3).u64(1 << 30),
            &[],
        );
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Setupmapping {
                arg: SetupmappingIn {
                    fh: 85,
                    foffset: 1 << 21,
                    len: 1 << 21,
                    flags: 3,
                    moffset: 1 << 30
                }
            }
        );
        req.op.opcode()
    }

    /// REMOVEMAPPING: a 4-byte header, so the entries sit 4 bytes off 8-byte alignment.
    pub fn removemapping() -> Opcode {
        let body = W::new().u32(2).u64(0x1000).u64(0x2000).u64(0x3000).u64(0x4000);
        let buf = request(49, &body, &[]);
        let req = parse_plain(&buf, 45);
        let Operation::Removemapping { arg, mappings } = req.op else {
            panic!("not REMOVEMAPPING: {:?}", req.op)
        };
        assert_eq!(arg, RemovemappingIn { count: 2 });
        assert_eq!(mappings.len(), 2);
        let got: Vec<RemovemappingOne> = mappings.iter().collect();
        assert_eq!(
            got,
            [
                RemovemappingOne {
                    moffset: 0x1000,
                    len: 0x2000
                },
                RemovemappingOne {
                    moffset: 0x3000,
                    len: 0x4000
                },
            ]
        );
        req.op.opcode()
    }

    pub fn syncfs() -> Opcode {
        let buf = request(50, &W::new().u64(0x5f5f), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Syncfs {
                arg: SyncfsIn { padding: 0x5f5f }
            }
        );
        req.op.opcode()
    }

    pub fn tmpfile() -> Opcode {
        let buf = request(51, &create_in_bytes().name("tmp"), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Tmpfile {
                arg: create_in(),
                name: c"tmp"
            }
        );
        req.op.opcode()
    }

    pub fn statx() -> Opcode {
        let buf = request(52, &W::new().u32(1).u32(0x5a).u64(86).u32(0x6000).u32(0xfff), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::Statx {
                arg: StatxIn {
                    getattr_flags: 1,
                    reserved: 0x5a,
                    fh: 86,
                    sx_flags: 0x6000,
                    sx_mask: 0xfff
                }
            }
        );
        req.op.opcode()
    }

    pub fn copy_file_range_64() -> Opcode {
        let buf = request(53, &copy_file_range_in_bytes(), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::CopyFileRange64 {
                arg: copy_file_range_in()
            }
        );
        req.op.opcode()
    }

    pub fn cuse_init() -> Opcode {
        let buf = request(4096, &W::new().u32(7).u32(45).u32(0xc0).u32(1), &[]);
        let req = parse_plain(&buf, 45);
        assert_eq!(
            req.op,
            Operation::CuseInit {
                arg: CuseInitIn {
                    major: 7,
                    minor: 45,
                    unused: 0xc0,
                    flags: 1
                }
            }
        );
        req.op.opcode()
    }
}

macro_rules! golden {
    ($($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                cases::$case();
            }
        )*

        #[test]
        fn every_opcode_has_a_golden_case() {
            let covered: BTreeSet<Opcode> = [$(cases::$case()),*].into_iter().collect();
            for op in Opcode::ALL {
                assert!(covered.contains(op), "no golden case for {op}");
            }
            assert_eq!(covered.len(), Opcode::COUNT);
            assert_eq!(Opcode::COUNT, 52);
        }
    };
}

golden!(
    lookup,
    forget,
    getattr,
    setattr,
    readlink,
    symlink,
    mknod,
    mkdir,
    unlink,
    rmdir,
    rename,
    link,
    open,
    read,
    write,
    statfs,
    release,
    fsync,
    setxattr,
    getxattr,
    listxattr,
    removexattr,
    flush,
    init,
    opendir,
    readdir,
    releasedir,
    fsyncdir,
    getlk,
    setlk,
    setlkw,
    access,
    create,
    interrupt,
    bmap,
    destroy,
    ioctl,
    poll,
    notify_reply,
    batch_forget,
    fallocate,
    readdirplus,
    rename2,
    lseek,
    copy_file_range,
    setupmapping,
    removemapping,
    syncfs,
    tmpfile,
    statx,
    copy_file_range_64,
    cuse_init,
);

// ---------------------------------------------------------------- old minors

#[test]
fn minor_12_mknod_and_create_are_16_bytes_and_no_extensions() {
    // MKNOD at 7.12: the full 16-byte fuse_mknod_in (umask arrived in 7.12).
    let buf = request(
        8,
        &W::new().u32(0o010_644).u32(0).u32(0o002).u32(0).name("fifo"),
        &[],
    );
    let req = parse_plain(&buf, 12);
    assert_eq!(
        req.op,
        Operation::Mknod {
            arg: MknodIn {
                mode: 0o010_644,
                rdev: 0,
                umask: 0o002,
                padding: 0
            },
            name: c"fifo"
        }
    );
    // CREATE at 7.12: 16-byte fuse_create_in.
    let buf = request(35, &create_in_bytes().name("f"), &[]);
    let req = parse_plain(&buf, 12);
    assert_eq!(
        req.op,
        Operation::Create {
            arg: create_in(),
            name: c"f"
        }
    );
    // At 7.12 the kernel had no total_extlen: whatever the field holds is not
    // an extension length, and the bytes after the name are not extensions.
    let buf = request_raw(9, &W::new().u32(0o700).u32(0o077).name("d").zeros(16), &[], 2);
    let req = parse(&buf, 12);
    assert!(req.extensions.is_empty());
    assert_eq!(
        req.op,
        Operation::Mkdir {
            arg: MkdirIn {
                mode: 0o700,
                umask: 0o077
            },
            name: c"d"
        }
    );
}

#[test]
fn minor_11_mknod_and_create_use_the_8_byte_compat_bodies() {
    for minor in [8, 11] {
        // MKNOD: fuse_mknod_in without umask and padding.
        let buf = request(8, &W::new().u32(0o060_660).u32(0x0803).name("sda3"), &[]);
        assert_eq!(buf.len(), HDR + 8 + 5);
        let req = parse_plain(&buf, minor);
        assert_eq!(
            req.op,
            Operation::Mknod {
                arg: MknodIn {
                    mode: 0o060_660,
                    rdev: 0x0803,
                    umask: 0,
                    padding: 0
                },
                name: c"sda3"
            },
            "7.{minor}"
        );
        let Operation::Mknod { name, .. } = req.op else {
            unreachable!()
        };
        cstr_at(&buf, name, HDR + 8);

        // CREATE: the kernel sent a fuse_open_in (flags, unused), so only
        // `flags` and the word after it are on the wire; mode and umask are zero.
        let buf = request(35, &W::new().u32(0o100_001).u32(0).name("c"), &[]);
        let req = parse_plain(&buf, minor);
        assert_eq!(
            req.op,
            Operation::Create {
                arg: CreateIn {
                    flags: 0o100_001,
                    mode: 0,
                    umask: 0,
                    open_flags: 0
                },
                name: c"c"
            },
            "7.{minor}"
        );
        let Operation::Create { name, .. } = req.op else {
            unreachable!()
        };
        cstr_at(&buf, name, HDR + 8);
    }
}

#[test]
fn minor_8_write_uses_the_24_byte_write_in_and_getattr_has_no_body() {
    let data = b"old kernel data";
    let body = W::new()
        .u64(0x20)
        .u64(512)
        .u32(data.len() as u32)
        .u32(1)
        .bytes(data);
    let buf = request(16, &body, &[]);
    let req = parse_plain(&buf, 8);
    assert_eq!(
        req.op,
        Operation::Write {
            arg: WriteIn {
                fh: 0x20,
                offset: 512,
                size: data.len() as u32,
                write_flags: 1,
                lock_owner: 0,
                flags: 0,
                padding: 0
            },
            data
        }
    );
    let Operation::Write { data: d, .. } = req.op else {
        unreachable!()
    };
    borrowed_at(&buf, d, HDR + 24);

    // GETATTR before 7.9: header only, the argument reads as zeros.
    let buf = request(3, &W::new(), &[]);
    let req = parse_plain(&buf, 8);
    assert_eq!(
        req.op,
        Operation::Getattr {
            arg: GetattrIn::default()
        }
    );
    // And from 7.9 on the same bytes are too short.
    assert!(Request::parse(&buf, 9).is_err());
}

#[test]
fn init_16_byte_body_from_kernels_before_7_36() {
    for kernel_minor in [22u32, 31, 35] {
        let buf = request(
            26,
            &W::new().u32(7).u32(kernel_minor).u32(65536).u32(0x03ff_fffb),
            &[],
        );
        assert_eq!(buf.len(), HDR + 16);
        // INIT is parsed before anything is negotiated; the parse minor does
        // not matter, the body's length does.
        for parse_minor in [kernel_minor, 45] {
            let req = parse_plain(&buf, parse_minor);
            assert_eq!(
                req.op,
                Operation::Init {
                    arg: InitIn {
                        major: 7,
                        minor: kernel_minor,
                        max_readahead: 65536,
                        flags: 0x03ff_fffb,
                        flags2: 0,
                        unused: [0; 11]
                    }
                }
            );
        }
    }
}

#[test]
fn init_64_byte_body_from_a_7_36_kernel() {
    let body = W::new()
        .u32(7)
        .u32(36)
        .u32(131_072)
        .u32(0x4000_0000 | 1)
        .u32(0b11)
        .zeros(44);
    assert_eq!(body.len(), 64);
    let buf = request(26, &body, &[]);
    let req = parse_plain(&buf, 36);
    assert_eq!(
        req.op,
        Operation::Init {
            arg: InitIn {
                major: 7,
                minor: 36,
                max_readahead: 131_072,
                flags: 0x4000_0001,
                flags2: 3,
                unused: [0; 11]
            }
        }
    );
}

#[test]
fn minor_31_dax_opcodes_and_fixed_bodies() {
    // 7.31 introduced SETUPMAPPING/REMOVEMAPPING; at 7.31 every fixed body is
    // already full size (no compat shrinking after 7.12 except INIT).
    let buf = request(48, &W::new().u64(1).u64(2).u64(3).u64(1).u64(5), &[]);
    let req = parse_plain(&buf, 31);
    assert_eq!(
        req.op,
        Operation::Setupmapping {
            arg: SetupmappingIn {
                fh: 1,
                foffset: 2,
                len: 3,
                flags: 1,
                moffset: 5
            }
        }
    );
    let buf = request(35, &create_in_bytes().name("x"), &[]);
    assert_eq!(
        parse_plain(&buf, 31).op,
        Operation::Create {
            arg: create_in(),
            name: c"x"
        }
    );
}

// ---------------------------------------------------------------- request extensions

const SECCTX_NAME: &str = "security.selinux";
const SECCTX_VALUE: &[u8] = b"system_u:object_r:tmp_t:s0";

/// A security-context extension with one context, as `get_security_context()`
/// lays it out: {size, nr_secctx} {ctxlen, 0} name NUL value, padded to 8.
fn secctx_ext() -> Vec<u8> {
    let rec = 8 + SECCTX_NAME.len() + 1 + SECCTX_VALUE.len();
    let total = 8 + rec.next_multiple_of(8);
    let mut v = W::new()
        .u32(total as u32)
        .u32(1)
        .u32(SECCTX_VALUE.len() as u32)
        .u32(0)
        .name(SECCTX_NAME)
        .bytes(SECCTX_VALUE);
    v = v.pad_to(total);
    v.0
}

/// A supplementary-groups extension: {size, 32} {nr_groups} gids, padded to 8.
fn groups_ext(gids: &[u32]) -> Vec<u8> {
    let total = (8 + 4 + 4 * gids.len()).next_multiple_of(8);
    let mut w = W::new().u32(total as u32).u32(32).u32(gids.len() as u32);
    for g in gids {
        w = w.u32(*g);
    }
    w = w.pad_to(total);
    w.0
}

fn check_secctx(req: &Request<'_>, buf: &[u8], ext_start: usize) {
    let ctxs = req.extensions.security_contexts().expect("no security context");
    assert_eq!(ctxs.count(), 1);
    let all: Vec<_> = ctxs.iter().collect();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].name.to_bytes(), SECCTX_NAME.as_bytes());
    assert_eq!(all[0].value, SECCTX_VALUE);
    cstr_at(buf, all[0].name, ext_start + 16);
    borrowed_at(buf, all[0].value, ext_start + 16 + SECCTX_NAME.len() + 1);
}

/// The five creation requests with a body that ends in the new entry's name.
fn creation_requests() -> Vec<(u32, W, Opcode)> {
    vec![
        (35, create_in_bytes().name("c"), Opcode::Create),
        (9, W::new().u32(0o755).u32(0o022).name("c"), Opcode::Mkdir),
        (
            8,
            W::new().u32(0o100_600).u32(0).u32(0o022).u32(0).name("c"),
            Opcode::Mknod,
        ),
        (6, W::new().name("c").name("target"), Opcode::Symlink),
        (51, create_in_bytes().name("c"), Opcode::Tmpfile),
    ]
}

fn name_of<'a>(op: &Operation<'a>) -> &'a CStr {
    match *op {
        Operation::Create { name, .. }
        | Operation::Mkdir { name, .. }
        | Operation::Mknod { name, .. }
        | Operation::Symlink { name, .. }
        | Operation::Tmpfile { name, .. } => name,
        ref other => panic!("not a creation request: {other:?}"),
    }
}

#[test]
fn creation_requests_carry_security_context_and_groups() {
    for minor in [38, 45] {
        for (opcode, body, op) in creation_requests() {
            let mut ext = secctx_ext();
            ext.extend(groups_ext(&[1234]));
            let buf = request(opcode, &body, &ext);
            let ext_start = HDR + body.len();
            let req = parse(&buf, minor);
            assert_eq!(req.header, header(opcode, buf.len(), (ext.len() / 8) as u16));
            assert_eq!(req.op.opcode(), op);
            // The name is read from the body only; the extensions are not part of it.
            assert_eq!(name_of(&req.op), c"c", "{op} at 7.{minor}");
            borrowed_at(&buf, req.extensions.raw(), ext_start);
            assert_eq!(req.extensions.raw(), &ext[..]);

            let all: Vec<Extension<'_>> = req.extensions.iter().collect();
            assert_eq!(all.len(), 2, "{op}");
            assert!(matches!(all[0], Extension::SecurityContext(_)));
            let Extension::SuppGroups(g) = all[1] else {
                panic!("second extension is {:?}", all[1])
            };
            assert_eq!(g.iter().collect::<Vec<_>>(), [1234]);
            check_secctx(&req, &buf, ext_start);
            assert_eq!(
                req.extensions.supp_groups().unwrap().iter().collect::<Vec<_>>(),
                [1234]
            );
        }
    }
}

#[test]
fn groups_only_and_several_groups() {
    let ext = groups_ext(&[10, 20, 30]);
    assert_eq!(ext.len(), 24);
    let body = W::new().u32(0o755).u32(0).name("d");
    let buf = request(9, &body, &ext);
    let req = parse(&buf, 45);
    assert!(req.extensions.security_contexts().is_none());
    assert_eq!(
        req.extensions.supp_groups().unwrap().iter().collect::<Vec<_>>(),
        [10, 20, 30]
    );
    assert_eq!(req.extensions.iter().count(), 1);
}

#[test]
fn empty_security_context_when_no_lsm_answers() {
    // With SECURITY_CTX negotiated the kernel sends a header with nr_secctx 0.
    let ext = W::new().u32(8).u32(0).0;
    let buf = request(35, &create_in_bytes().name("n"), &ext);
    let req = parse(&buf, 45);
    let ctxs = req.extensions.security_contexts().unwrap();
    assert_eq!(ctxs.count(), 0);
    assert_eq!(ctxs.iter().count(), 0);
    assert!(req.extensions.supp_groups().is_none());
}

#[test]
fn unknown_extension_types_are_kept_with_their_body() {
    let ext = W::new().u32(16).u32(33).u64(0x0102_0304_0506_0708).0;
    let buf = request(35, &create_in_bytes().name("n"), &ext);
    let req = parse(&buf, 45);
    let all: Vec<_> = req.extensions.iter().collect();
    assert_eq!(
        all,
        [Extension::Unknown {
            ext_type: 33,
            body: &0x0102_0304_0506_0708u64.to_ne_bytes()
        }]
    );
}

#[test]
fn total_extlen_is_ignored_before_7_38() {
    let mut ext = secctx_ext();
    ext.extend(groups_ext(&[1234]));
    for (opcode, body, op) in creation_requests() {
        let buf = request(opcode, &body, &ext);
        let req = parse(&buf, 37);
        assert_eq!(req.op.opcode(), op);
        assert_eq!(name_of(&req.op), c"c");
        assert!(req.extensions.is_empty(), "{op} at 7.37");
        assert_eq!(req.extensions.iter().count(), 0);
        // Even a total_extlen far past the end is not looked at.
        let buf = request_raw(opcode, &body, &[], 0xffff);
        let req = parse(&buf, 37);
        assert!(req.extensions.is_empty());
    }
}

// ---------------------------------------------------------------- SETXATTR_EXT

#[test]
fn setxattr_with_setxattr_ext_reads_16_bytes() {
    let value = b"\x01\x02\x03";
    let body = W::new()
        .u32(3)
        .u32(1) // XATTR_CREATE
        .u32(1) // SETXATTR_ACL_KILL_SGID
        .u32(0x7a7a)
        .name("system.posix_acl_access")
        .bytes(value);
    let buf = request(21, &body, &[]);
    let cfg = ParseConfig {
        setxattr_ext: true,
        ..ParseConfig::new(45)
    };
    let req = parse_cfg(&buf, &cfg);
    assert_eq!(
        req.op,
        Operation::Setxattr {
            arg: SetxattrIn {
                size: 3,
                flags: 1,
                setxattr_flags: 1,
                padding: 0x7a7a
            },
            name: c"system.posix_acl_access",
            value
        }
    );
    let Operation::Setxattr { name, value: v, .. } = req.op else {
        unreachable!()
    };
    cstr_at(&buf, name, HDR + 16);
    borrowed_at(&buf, v, HDR + 16 + 24);

    // The same bytes without SETXATTR_EXT: the name would start at byte 8,
    // where the parser finds `setxattr_flags` and stops at its first zero byte,
    // so the value length can no longer agree.
    assert!(Request::parse(&buf, 45).is_err());
}

// ---------------------------------------------------------------- atomic open

fn atomic_open_bytes() -> Vec<u8> {
    request(53, &create_in_bytes().name("maybe"), &[])
}

#[test]
fn atomic_open_decodes_only_when_enabled_below_45() {
    let buf = atomic_open_bytes();
    for minor in [12, 38, 39, 44] {
        let cfg = ParseConfig {
            atomic_open: true,
            ..ParseConfig::new(minor)
        };
        let req = parse_cfg(&buf, &cfg);
        assert_eq!(req.header, header(53, buf.len(), 0));
        assert_eq!(
            req.op,
            Operation::AtomicOpen {
                arg: create_in(),
                name: c"maybe"
            },
            "7.{minor}"
        );
        assert!(req.op.is_atomic_open());
        assert_eq!(req.op.opcode(), Opcode::Create);
        let Operation::AtomicOpen { name, .. } = req.op else {
            unreachable!()
        };
        cstr_at(&buf, name, HDR + 16);
    }
}

#[test]
fn atomic_open_carries_creation_extensions() {
    let mut ext = secctx_ext();
    ext.extend(groups_ext(&[55]));
    let buf = request(53, &create_in_bytes().name("maybe"), &ext);
    let cfg = ParseConfig {
        atomic_open: true,
        ..ParseConfig::new(39)
    };
    let req = parse_cfg(&buf, &cfg);
    assert!(req.op.is_atomic_open());
    check_secctx(&req, &buf, HDR + 16 + 6);
    assert_eq!(
        req.extensions.supp_groups().unwrap().iter().collect::<Vec<_>>(),
        [55]
    );
}

#[test]
fn opcode_53_is_copy_file_range_64_at_minor_45_even_if_enabled() {
    let buf = request(53, &copy_file_range_in_bytes(), &[]);
    for atomic_open in [true, false] {
        let cfg = ParseConfig {
            atomic_open,
            ..ParseConfig::new(45)
        };
        let req = parse_cfg(&buf, &cfg);
        assert_eq!(
            req.op,
            Operation::CopyFileRange64 {
                arg: copy_file_range_in()
            }
        );
        assert!(!req.op.is_atomic_open());
    }
}

#[test]
fn opcode_53_is_copy_file_range_64_when_not_enabled() {
    let buf = request(53, &copy_file_range_in_bytes(), &[]);
    let req = parse_cfg(&buf, &ParseConfig::new(39));
    assert_eq!(
        req.op,
        Operation::CopyFileRange64 {
            arg: copy_file_range_in()
        }
    );
    // And the atomic-open bytes, not opted in, are a too-short COPY_FILE_RANGE_64.
    assert!(Request::parse(&atomic_open_bytes(), 39).is_err());
}

#[test]
fn the_decode_rule_matches_the_extension_module() {
    use fuse_wire::proto::ext::atomic_open;
    assert_eq!(atomic_open::OPCODE, 53);
    for minor in 12..=46 {
        for enabled in [false, true] {
            let cfg = ParseConfig {
                atomic_open: enabled,
                ..ParseConfig::new(minor)
            };
            let buf = atomic_open_bytes();
            let decoded = Request::parse_with(&buf, &cfg).is_ok_and(|r| r.op.is_atomic_open());
            assert_eq!(
                decoded,
                atomic_open::decodes(enabled, minor),
                "7.{minor} enabled={enabled}"
            );
        }
    }
}

#[test]
fn writer_helper_is_native_endian() {
    // Guard for the test helper itself: a u32 lands in memory as the CPU reads it.
    let w = W::new().u32(0x0102_0304).i32(-2);
    assert_eq!(u32::from_ne_bytes(w.0[..4].try_into().unwrap()), 0x0102_0304);
    assert_eq!(i32::from_ne_bytes(w.0[4..].try_into().unwrap()), -2);
}
