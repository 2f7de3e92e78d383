//! Malformed requests: each kind of damage must come back as its own
//! `ParseError` variant with the right fields, and no input at all may make
//! the parser panic or hand out a slice that is not inside the request.
//!
//! The property tests' case count comes from `PROPTEST_CASES`, else 100 000
//! when `CI` is set and 10 000 otherwise. Measured on the project's 2-core
//! machine in a debug build: 100 000 cases of both property tests take about
//! 6 s of wall time (12 s of CPU), 10 000 take under a second. Each case parses
//! its input with all four combinations of the two `ParseConfig` flags.

mod proto_support;
use fuse_wire::proto::request::Extension;
use fuse_wire::proto::{Opcode, Operation, ParseConfig, ParseError, Request};
use proptest::prelude::*;
use proto_support::W;

const UNIQUE: u64 = 0x0000_0000_0000_1234;

/// Header with `len` = 40 + body + ext and the given `total_extlen`.
fn request(opcode: u32, body: &[u8], ext: &[u8], total_extlen: u16) -> Vec<u8> {
    let len = (40 + body.len() + ext.len()) as u32;
    let mut v = W::new()
        .u32(len)
        .u32(opcode)
        .u64(UNIQUE)
        .u64(1)
        .u32(0)
        .u32(0)
        .u32(1)
        .u16(total_extlen)
        .u16(0)
        .0;
    v.extend_from_slice(body);
    v.extend_from_slice(ext);
    v
}

fn err(buf: &[u8], minor: u32) -> ParseError {
    match Request::parse(buf, minor) {
        Ok(r) => panic!("parsed a bad request at 7.{minor}: {:?}", r.op),
        Err(e) => {
            // Every error renders as a message.
            assert!(!e.to_string().is_empty());
            e
        }
    }
}

fn op(n: u32) -> Opcode {
    Opcode::from_u32(n).unwrap()
}

// ---------------------------------------------------------------- framing

#[test]
fn truncated_header() {
    for n in [0usize, 1, 8, 16, 39] {
        let buf = request(1, b"x\0", &[], 0);
        assert_eq!(err(&buf[..n], 45), ParseError::ShortHeader { got: n });
    }
}

#[test]
fn len_disagrees_with_the_buffer() {
    let mut buf = request(17, &[], &[], 0);
    buf.extend_from_slice(&[0; 8]);
    // len says 40, 48 bytes arrived.
    assert_eq!(
        err(&buf, 45),
        ParseError::LengthMismatch {
            header_len: 40,
            buffer_len: 48
        }
    );
    // len says 100, 48 bytes arrived.
    buf[0..4].copy_from_slice(&100u32.to_ne_bytes());
    assert_eq!(
        err(&buf, 45),
        ParseError::LengthMismatch {
            header_len: 100,
            buffer_len: 48
        }
    );
    // len 0 on a bare header.
    let mut buf = request(17, &[], &[], 0);
    buf[0..4].copy_from_slice(&0u32.to_ne_bytes());
    assert_eq!(
        err(&buf, 45),
        ParseError::LengthMismatch {
            header_len: 0,
            buffer_len: 40
        }
    );
}

#[test]
fn unknown_opcodes() {
    for n in [
        0u32,
        7,
        19,
        54,
        55,
        4095,
        4097,
        9999,
        1_048_576,
        436_207_616,
        u32::MAX,
    ] {
        let buf = request(n, &[0; 16], &[], 0);
        for minor in [12, 38, 45] {
            assert_eq!(
                err(&buf, minor),
                ParseError::UnknownOpcode {
                    opcode: n,
                    unique: UNIQUE
                }
            );
        }
    }
}

// ---------------------------------------------------------------- short bodies

/// (opcode, C struct the parser reads first, its size on the wire, minor).
const FIXED: &[(u32, &str, usize, u32)] = &[
    (2, "fuse_forget_in", 8, 45),
    (3, "fuse_getattr_in", 16, 45),
    (4, "fuse_setattr_in", 88, 45),
    (8, "fuse_mknod_in", 16, 45),
    (8, "fuse_mknod_in", 16, 12),
    (8, "fuse_mknod_in", 8, 11),
    (9, "fuse_mkdir_in", 8, 45),
    (12, "fuse_rename_in", 8, 45),
    (13, "fuse_link_in", 8, 45),
    (14, "fuse_open_in", 8, 45),
    (15, "fuse_read_in", 40, 45),
    (16, "fuse_write_in", 40, 45),
    (16, "fuse_write_in", 24, 8),
    (18, "fuse_release_in", 24, 45),
    (20, "fuse_fsync_in", 16, 45),
    (21, "fuse_setxattr_in", 8, 45),
    (22, "fuse_getxattr_in", 8, 45),
    (23, "fuse_getxattr_in", 8, 45),
    (25, "fuse_flush_in", 24, 45),
    (26, "fuse_init_in", 16, 45),
    (26, "fuse_init_in", 16, 22),
    (27, "fuse_open_in", 8, 45),
    (28, "fuse_read_in", 40, 45),
    (29, "fuse_release_in", 24, 45),
    (30, "fuse_fsync_in", 16, 45),
    (31, "fuse_lk_in", 48, 45),
    (32, "fuse_lk_in", 48, 45),
    (33, "fuse_lk_in", 48, 45),
    (34, "fuse_access_in", 8, 45),
    (35, "fuse_create_in", 16, 45),
    (35, "fuse_create_in", 8, 11),
    (36, "fuse_interrupt_in", 8, 45),
    (37, "fuse_bmap_in", 16, 45),
    (39, "fuse_ioctl_in", 32, 45),
    (40, "fuse_poll_in", 24, 45),
    (41, "fuse_notify_retrieve_in", 40, 45),
    (42, "fuse_batch_forget_in", 8, 45),
    (43, "fuse_fallocate_in", 32, 45),
    (44, "fuse_read_in", 40, 45),
    (45, "fuse_rename2_in", 16, 45),
    (46, "fuse_lseek_in", 24, 45),
    (47, "fuse_copy_file_range_in", 56, 45),
    (48, "fuse_setupmapping_in", 40, 45),
    (49, "fuse_removemapping_in", 4, 45),
    (50, "fuse_syncfs_in", 8, 45),
    (51, "fuse_create_in", 16, 45),
    (52, "fuse_statx_in", 24, 45),
    (53, "fuse_copy_file_range_in", 56, 45),
    (4096, "cuse_init_in", 16, 45),
];

#[test]
fn body_shorter_than_the_opcodes_struct() {
    for &(n, what, size, minor) in FIXED {
        for got in [0, size / 2, size - 1] {
            let buf = request(n, &vec![0x41; got], &[], 0);
            assert_eq!(
                err(&buf, minor),
                ParseError::ShortBody {
                    opcode: op(n),
                    what,
                    expected: size,
                    got
                },
                "opcode {n} with {got} bytes at 7.{minor}"
            );
        }
    }
}

#[test]
fn setxattr_ext_struct_is_16_bytes_when_negotiated() {
    let buf = request(21, &[0x41; 15], &[], 0);
    let cfg = ParseConfig {
        setxattr_ext: true,
        ..ParseConfig::new(45)
    };
    assert_eq!(
        Request::parse_with(&buf, &cfg).unwrap_err(),
        ParseError::ShortBody {
            opcode: Opcode::Setxattr,
            what: "fuse_setxattr_in",
            expected: 16,
            got: 15
        }
    );
}

#[test]
fn atomic_open_short_body_reports_create() {
    let buf = request(53, &[0; 10], &[], 0);
    let cfg = ParseConfig {
        atomic_open: true,
        ..ParseConfig::new(39)
    };
    assert_eq!(
        Request::parse_with(&buf, &cfg).unwrap_err(),
        ParseError::ShortBody {
            opcode: Opcode::Create,
            what: "fuse_create_in",
            expected: 16,
            got: 10
        }
    );
}

// ---------------------------------------------------------------- names

#[test]
fn names_without_nul() {
    let cases: &[(u32, W, &str)] = &[
        (1, W::new().bytes(b"abc"), "name"),
        (1, W::new(), "name"),
        (10, W::new().bytes(b"gone"), "name"),
        (11, W::new().bytes(b"d"), "name"),
        (24, W::new().bytes(b"user.x"), "name"),
        (6, W::new().bytes(b"link"), "name"),
        (6, W::new().name("link").bytes(b"target"), "link target"),
        (8, W::new().zeros(16).bytes(b"n"), "name"),
        (9, W::new().zeros(8).bytes(b"n"), "name"),
        (12, W::new().u64(2).bytes(b"old"), "old name"),
        (12, W::new().u64(2).name("old").bytes(b"new"), "new name"),
        (45, W::new().zeros(16).bytes(b"old"), "old name"),
        (45, W::new().zeros(16).name("old").bytes(b"new"), "new name"),
        (13, W::new().u64(2).bytes(b"n"), "name"),
        (21, W::new().zeros(8).bytes(b"user.k"), "name"),
        (22, W::new().zeros(8).bytes(b"user.k"), "name"),
        (35, W::new().zeros(16).bytes(b"n"), "name"),
        (51, W::new().zeros(16), "name"),
    ];
    for (n, body, what) in cases {
        let buf = request(*n, &body.0, &[], 0);
        assert_eq!(
            err(&buf, 45),
            ParseError::MissingNul { opcode: op(*n), what },
            "opcode {n}"
        );
    }
    // The NUL must be inside the body, not in the extension area after it.
    let ext = W::new().u32(8).u32(0).0;
    let buf = request(35, &W::new().zeros(16).bytes(b"n").zeros(7).0[..17], &ext, 1);
    assert_eq!(
        err(&buf, 45),
        ParseError::MissingNul {
            opcode: Opcode::Create,
            what: "name"
        }
    );
}

// ---------------------------------------------------------------- payload sizes

fn write_body(size: u32, data: usize) -> Vec<u8> {
    W::new()
        .u64(1)
        .u64(0)
        .u32(size)
        .u32(0)
        .u64(0)
        .u32(0)
        .u32(0)
        .zeros(data)
        .0
}

#[test]
fn write_data_length_mismatch() {
    for (size, data) in [(10u32, 9usize), (10, 11), (0, 1), (1, 0), (u32::MAX, 3)] {
        let buf = request(16, &write_body(size, data), &[], 0);
        assert_eq!(
            err(&buf, 45),
            ParseError::PayloadMismatch {
                opcode: Opcode::Write,
                what: "fuse_write_in.size",
                declared: size.into(),
                got: data
            }
        );
    }
    // The compat write_in: the data starts at byte 24 of the body.
    let body = W::new().u64(1).u64(0).u32(5).u32(0).zeros(4).0;
    assert_eq!(
        err(&request(16, &body, &[], 0), 8),
        ParseError::PayloadMismatch {
            opcode: Opcode::Write,
            what: "fuse_write_in.size",
            declared: 5,
            got: 4
        }
    );
}

#[test]
fn other_payload_mismatches() {
    // SETXATTR value.
    let body = W::new().u32(4).u32(0).name("user.k").bytes(b"abc").0;
    assert_eq!(
        err(&request(21, &body, &[], 0), 45),
        ParseError::PayloadMismatch {
            opcode: Opcode::Setxattr,
            what: "fuse_setxattr_in.size",
            declared: 4,
            got: 3
        }
    );
    // NOTIFY_REPLY data.
    let body = W::new().u64(0).u64(0).u32(8).u32(0).u64(0).u64(0).zeros(9).0;
    assert_eq!(
        err(&request(41, &body, &[], 0), 45),
        ParseError::PayloadMismatch {
            opcode: Opcode::NotifyReply,
            what: "fuse_notify_retrieve_in.size",
            declared: 8,
            got: 9
        }
    );
    // IOCTL input past the end.
    let body = W::new().u64(0).u32(0).u32(0).u64(0).u32(6).u32(0).zeros(5).0;
    assert_eq!(
        err(&request(39, &body, &[], 0), 45),
        ParseError::PayloadMismatch {
            opcode: Opcode::Ioctl,
            what: "fuse_ioctl_in.in_size",
            declared: 6,
            got: 5
        }
    );
    // BATCH_FORGET count past the end: 2 entries declared, 1.5 present.
    let body = W::new().u32(2).u32(0).zeros(24).0;
    assert_eq!(
        err(&request(42, &body, &[], 0), 45),
        ParseError::PayloadMismatch {
            opcode: Opcode::BatchForget,
            what: "fuse_batch_forget_in.count",
            declared: 32,
            got: 24
        }
    );
    // A count whose byte size does not fit 32 bits.
    let body = W::new().u32(u32::MAX).u32(0).0;
    assert_eq!(
        err(&request(42, &body, &[], 0), 45),
        ParseError::PayloadMismatch {
            opcode: Opcode::BatchForget,
            what: "fuse_batch_forget_in.count",
            declared: u64::from(u32::MAX) * 16,
            got: 0
        }
    );
    // REMOVEMAPPING count past the end.
    let body = W::new().u32(1).zeros(15).0;
    assert_eq!(
        err(&request(49, &body, &[], 0), 45),
        ParseError::PayloadMismatch {
            opcode: Opcode::Removemapping,
            what: "fuse_removemapping_in.count",
            declared: 16,
            got: 15
        }
    );
}

// ---------------------------------------------------------------- extensions

fn mkdir_body() -> Vec<u8> {
    W::new().u32(0o755).u32(0).name("d").0
}

#[test]
fn extension_length_past_the_end() {
    let body = mkdir_body(); // 10 bytes
    let ext = W::new().u32(16).u32(32).u32(1).u32(5).0;
    // 26 bytes follow the header (10 of body, 16 of extension); total_extlen
    // claims 32.
    let buf = request(9, &body, &ext, 4);
    assert_eq!(
        err(&buf, 45),
        ParseError::ExtensionOutOfBounds {
            extlen_bytes: 32,
            available: 26
        }
    );
    let buf = request(9, &[], &[], 1);
    assert_eq!(
        err(&buf, 38),
        ParseError::ExtensionOutOfBounds {
            extlen_bytes: 8,
            available: 0
        }
    );
    let buf = request(9, &body, &ext, u16::MAX);
    assert_eq!(
        err(&buf, 45),
        ParseError::ExtensionOutOfBounds {
            extlen_bytes: 0xffff * 8,
            available: 26
        }
    );
    // Before 7.38 the same bytes parse: the field is not looked at.
    assert!(Request::parse(&buf, 37).is_ok());
}

fn bad_ext(ext: &[u8]) -> ParseError {
    let buf = request(9, &mkdir_body(), ext, (ext.len() / 8) as u16);
    err(&buf, 45)
}

fn bad(offset: usize, reason: &'static str) -> ParseError {
    ParseError::BadExtension { offset, reason }
}

#[test]
fn malformed_extension_records() {
    // size smaller than the 8-byte header.
    for size in [0u32, 4, 7] {
        assert_eq!(
            bad_ext(&W::new().u32(size).u32(32).zeros(8).0),
            bad(0, "size smaller than its header")
        );
    }
    // size not a multiple of 8.
    assert_eq!(
        bad_ext(&W::new().u32(12).u32(33).zeros(8).0),
        bad(0, "size not a multiple of 8")
    );
    // size past the end of the area.
    assert_eq!(
        bad_ext(&W::new().u32(24).u32(33).zeros(8).0),
        bad(0, "size runs past the end of the request")
    );
    assert_eq!(
        bad_ext(&W::new().u32(0xffff_fff8).u32(0).zeros(8).0),
        bad(0, "size runs past the end of the request")
    );
    // A groups record with no room for nr_groups.
    assert_eq!(
        bad_ext(&W::new().u32(8).u32(32).0),
        bad(0, "truncated fuse_supp_groups")
    );
    // nr_groups past the record: 2 groups declared, room for 1.
    assert_eq!(
        bad_ext(&W::new().u32(16).u32(32).u32(2).u32(7).0),
        bad(0, "nr_groups runs past the extension")
    );
    assert_eq!(
        bad_ext(&W::new().u32(16).u32(32).u32(u32::MAX).u32(7).0),
        bad(0, "nr_groups runs past the extension")
    );
    // The offset names the bad record: a good one first, then a bad one.
    let ext = W::new().u32(16).u32(32).u32(1).u32(7).u32(4).u32(0).0;
    assert_eq!(bad_ext(&ext), bad(16, "size smaller than its header"));
    let ext = W::new().u32(8).u32(0).u32(16).u32(32).u32(3).u32(0).0;
    assert_eq!(bad_ext(&ext), bad(8, "nr_groups runs past the extension"));
}

#[test]
fn well_formed_records_still_parse() {
    // Sanity check for the cases above: the same request with valid records.
    let ext = W::new().u32(8).u32(0).u32(16).u32(32).u32(1).u32(7).0;
    let buf = request(9, &mkdir_body(), &ext, 3);
    let req = Request::parse(&buf, 45).unwrap();
    assert_eq!(req.extensions.iter().count(), 2);
    assert_eq!(
        req.extensions.supp_groups().unwrap().iter().collect::<Vec<_>>(),
        [7]
    );
}

// ---------------------------------------------------------------- property test

fn cases() -> u32 {
    match std::env::var("PROPTEST_CASES") {
        Ok(v) => v.parse().expect("PROPTEST_CASES must be a number"),
        Err(_) if std::env::var_os("CI").is_some() => 100_000,
        Err(_) => 10_000,
    }
}

/// Asserts that `part` lies within `buf[..len]`.
fn within(buf: &[u8], len: usize, part: &[u8], what: &str) {
    let base = buf.as_ptr() as usize;
    let p = part.as_ptr() as usize;
    assert!(
        p >= base && p + part.len() <= base + len.min(buf.len()),
        "{what} ({} bytes at {p:#x}) is not inside the request ({len} bytes at {base:#x})",
        part.len()
    );
}

/// Every slice a parsed request borrows.
fn borrowed<'a>(op: &Operation<'a>) -> Vec<(&'static str, &'a [u8])> {
    use Operation as O;
    match *op {
        O::Lookup { name } | O::Unlink { name } | O::Rmdir { name } | O::Removexattr { name } => {
            vec![("name", name.to_bytes_with_nul())]
        }
        O::Mknod { name, .. }
        | O::Mkdir { name, .. }
        | O::Link { name, .. }
        | O::Getxattr { name, .. }
        | O::Create { name, .. }
        | O::Tmpfile { name, .. }
        | O::AtomicOpen { name, .. } => vec![("name", name.to_bytes_with_nul())],
        O::Symlink { name, target } => vec![
            ("name", name.to_bytes_with_nul()),
            ("target", target.to_bytes_with_nul()),
        ],
        O::Rename { name, newname, .. } | O::Rename2 { name, newname, .. } => vec![
            ("name", name.to_bytes_with_nul()),
            ("newname", newname.to_bytes_with_nul()),
        ],
        O::Setxattr { name, value, .. } => vec![("name", name.to_bytes_with_nul()), ("value", value)],
        O::Write { data, .. } | O::Ioctl { data, .. } | O::NotifyReply { data, .. } => {
            vec![("data", data)]
        }
        _ => vec![],
    }
}

/// The checks applied to every input: no panic (implicit), borrowed slices
/// inside the request, and a consistent result.
fn check_any(buf: &[u8], cfg: &ParseConfig) {
    let req = match Request::parse_with(buf, cfg) {
        Ok(r) => r,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let len = req.header.len as usize;
    assert_eq!(len, buf.len());
    if !req.op.is_atomic_open() {
        assert_eq!(req.op.opcode() as u32, req.header.opcode);
    }
    for (what, s) in borrowed(&req.op) {
        within(buf, len, s, what);
    }
    match req.op {
        Operation::BatchForget { arg, forgets } => {
            assert_eq!(forgets.iter().count(), forgets.len());
            assert!(forgets.len() >= arg.count as usize);
        }
        Operation::Removemapping { arg, mappings } => {
            assert_eq!(mappings.iter().count(), mappings.len());
            assert!(mappings.len() >= arg.count as usize);
        }
        Operation::Write { arg, data } => assert_eq!(data.len(), arg.size as usize),
        Operation::Setxattr { arg, value, .. } => assert_eq!(value.len(), arg.size as usize),
        _ => {}
    }
    let raw = req.extensions.raw();
    if !raw.is_empty() {
        within(buf, len, raw, "extension area");
        assert!(cfg.minor >= 38);
        assert_eq!(raw.len(), req.header.total_extlen as usize * 8);
        // Extensions end the request.
        assert_eq!(raw.as_ptr() as usize + raw.len(), buf.as_ptr() as usize + len);
    }
    for ext in req.extensions.iter() {
        match ext {
            Extension::SecurityContext(ctxs) => {
                assert!(ctxs.count() <= 31);
                for c in ctxs.iter() {
                    within(buf, len, c.name.to_bytes_with_nul(), "secctx name");
                    within(buf, len, c.value, "secctx value");
                    within(raw, raw.len(), c.value, "secctx value in extension area");
                }
            }
            Extension::SuppGroups(g) => {
                let _ = g.iter().count();
            }
            Extension::Unknown { body, .. } => within(raw, raw.len(), body, "extension body"),
        }
    }
}

/// Random bytes biased towards 0 and small values, so that names end, sizes
/// match and extension headers look plausible more often than with uniform
/// bytes. (One `u8` tree per byte, remapped afterwards: a per-byte union of
/// strategies is several times slower to generate in a debug build.)
fn biased_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max).prop_map(|v| {
        v.into_iter()
            .map(|b| match b {
                0..=127 => 0,
                128..=191 => b - 127,
                _ => b,
            })
            .collect()
    })
}

/// A value from `common` most of the time, else any `u32`.
fn mostly(common: &'static [u32]) -> impl Strategy<Value = u32> {
    (prop::sample::select(common), any::<u32>(), 0u8..8).prop_map(|(c, r, k)| if k == 0 { r } else { c })
}

/// One extension record: header (size, type), a `nr_groups`-like word, more bytes.
fn ext_record() -> impl Strategy<Value = Vec<u8>> {
    (
        mostly(&[0, 4, 8, 12, 16, 24, 32, 40]),
        mostly(&[0, 1, 2, 31, 32, 33]),
        mostly(&[0, 1, 2, 3]),
        biased_bytes(32),
    )
        .prop_map(|(size, typ, nr, rest)| {
            let mut v = W::new().u32(size).u32(typ).u32(nr).bytes(&rest).0;
            v.resize(v.len().next_multiple_of(8), 0);
            v
        })
}

/// A header that is right about everything but what follows it.
#[derive(Debug, Clone)]
struct AlmostValid {
    opcode: u32,
    body: Vec<u8>,
    ext: Vec<u8>,
    extlen: Option<u16>,
    fix_sizes: bool,
    len_delta: i8,
}

fn almost_valid() -> impl Strategy<Value = AlmostValid> {
    let opcodes: Vec<u32> = Opcode::ALL.iter().map(|o| *o as u32).collect();
    (
        prop::sample::select(opcodes),
        biased_bytes(160),
        prop::collection::vec(ext_record(), 0..3),
        (any::<u16>(), 0u8..5).prop_map(|(n, k)| (k == 0).then_some(n)),
        any::<bool>(),
        (any::<i8>(), 0u8..9).prop_map(|(d, k)| if k == 0 { d } else { 0 }),
    )
        .prop_map(|(opcode, body, ext, extlen, fix_sizes, len_delta)| AlmostValid {
            opcode,
            body,
            ext: ext.concat(),
            extlen,
            fix_sizes,
            len_delta,
        })
}

fn put_u32(v: &mut [u8], at: usize, x: u32) {
    if let Some(d) = v.get_mut(at..at + 4) {
        d.copy_from_slice(&x.to_ne_bytes());
    }
}

impl AlmostValid {
    fn bytes(&self, minor: u32) -> Vec<u8> {
        let mut body = self.body.clone();
        if self.fix_sizes {
            // Make the size fields agree with the body, to reach the success
            // paths of the opcodes with payloads.
            let n = body.len();
            let write_in = if minor < 9 { 24 } else { 40 };
            match self.opcode {
                16 => put_u32(&mut body, 16, n.saturating_sub(write_in) as u32),
                39 => put_u32(&mut body, 24, n.saturating_sub(32) as u32),
                41 => put_u32(&mut body, 16, n.saturating_sub(40) as u32),
                42 => put_u32(&mut body, 0, (n.saturating_sub(8) / 16) as u32),
                49 => put_u32(&mut body, 0, (n.saturating_sub(4) / 16) as u32),
                _ => {}
            }
        }
        let extlen = self.extlen.unwrap_or((self.ext.len() / 8) as u16);
        let mut buf = request(self.opcode, &body, &self.ext, extlen);
        let len = (buf.len() as i64 + i64::from(self.len_delta)).max(0) as u32;
        put_u32(&mut buf, 0, len);
        buf
    }
}

fn configs(minor: u32) -> [ParseConfig; 4] {
    let c = |setxattr_ext, atomic_open| ParseConfig {
        minor,
        setxattr_ext,
        atomic_open,
    };
    [c(false, false), c(true, false), c(false, true), c(true, true)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Arbitrary bytes, optionally with a `len` that matches, at any minor
    /// with any feature flags: never a panic, never an out-of-range slice.
    #[test]
    fn arbitrary_bytes_never_panic(
        mut bytes in prop::collection::vec(any::<u8>(), 0..256),
        fix_len in any::<bool>(),
        minor in 12u32..=45,
    ) {
        if fix_len {
            let n = bytes.len() as u32;
            put_u32(&mut bytes, 0, n);
        }
        for cfg in configs(minor) {
            check_any(&bytes, &cfg);
        }
    }

    /// Valid headers with a known opcode, random bodies, extension records and
    /// `total_extlen`.
    #[test]
    fn almost_valid_requests_never_panic(req in almost_valid(), minor in 12u32..=45) {
        let buf = req.bytes(minor);
        for cfg in configs(minor) {
            check_any(&buf, &cfg);
        }
    }
}

/// The generators reach the success paths, not only the errors: without this
/// the property test could pass by rejecting everything.
#[test]
fn almost_valid_generator_reaches_successful_parses() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = almost_valid();
    let (mut ok, mut with_ext, mut with_payload) = (0, 0, 0);
    for _ in 0..2000 {
        let req = strategy.new_tree(&mut runner).unwrap().current();
        let buf = req.bytes(45);
        if let Ok(r) = Request::parse(&buf, 45) {
            ok += 1;
            with_ext += usize::from(!r.extensions.is_empty());
            with_payload += usize::from(borrowed(&r.op).iter().any(|(w, _)| *w == "data"));
        }
    }
    assert!(ok > 200, "only {ok} of 2000 generated requests parsed");
    assert!(with_ext > 10, "only {with_ext} parsed requests had extensions");
    assert!(
        with_payload > 10,
        "only {with_payload} parsed requests had a payload"
    );
}
