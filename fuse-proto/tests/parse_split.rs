//! `Request::parse_split`: requests as FUSE over io_uring delivers them, in
//! three parts (in_out header area, op_in area, payload buffer), written out
//! byte by byte so that the layout is checked independently of the structs.

use fuse_proto::{Operation, ParseConfig, ParseError, Request};

/// A 128-byte `in_out` area holding a `fuse_in_header` (the rest is left
/// non-zero on purpose: the parser must read only the first 40 bytes).
fn in_out(len: u32, opcode: u32, unique: u64, nodeid: u64, total_extlen: u16) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&opcode.to_le_bytes());
    b.extend_from_slice(&unique.to_le_bytes());
    b.extend_from_slice(&nodeid.to_le_bytes());
    b.extend_from_slice(&1000u32.to_le_bytes()); // uid
    b.extend_from_slice(&100u32.to_le_bytes()); // gid
    b.extend_from_slice(&4242u32.to_le_bytes()); // pid
    b.extend_from_slice(&total_extlen.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    assert_eq!(b.len(), 40);
    b.resize(128, 0xee);
    b
}

/// A 128-byte `op_in` area starting with `arg0` and filled with garbage after it.
fn op_in(arg0: &[u8]) -> Vec<u8> {
    let mut b = arg0.to_vec();
    b.resize(128, 0xdd);
    b
}

const CFG: ParseConfig = ParseConfig {
    minor: 45,
    setxattr_ext: true,
    atomic_open: false,
};

#[test]
fn lookup_has_a_zero_size_first_argument() {
    // LOOKUP (1) of "hello" in directory 1: op_in unused, payload "hello\0".
    let payload = b"hello\0";
    let h = in_out(40 + 6, 1, 0x10, 1, 0);
    let o = op_in(&[]);
    let req = Request::parse_split(&h, &o, payload, &CFG).unwrap();
    assert_eq!(req.header.unique, 0x10);
    assert_eq!(req.header.nodeid, 1);
    assert_eq!(req.header.uid, 1000);
    assert_eq!(req.header.pid, 4242);
    match req.op {
        Operation::Lookup { name } => {
            assert_eq!(name.to_bytes(), b"hello");
            // Borrowed from the payload buffer, not copied.
            assert_eq!(name.as_ptr().cast::<u8>(), payload.as_ptr());
        }
        other => panic!("expected LOOKUP, got {other:?}"),
    }
    assert!(req.extensions.is_empty());
}

#[test]
fn getattr_reads_its_struct_from_op_in_and_has_no_payload() {
    #[rustfmt::skip]
    let arg0 = [
        0x01, 0x00, 0x00, 0x00,                          // getattr_flags = FUSE_GETATTR_FH
        0x00, 0x00, 0x00, 0x00,                          // dummy
        0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x00,  // fh
    ];
    let h = in_out(40 + 16, 3, 0x12, 9, 0);
    let o = op_in(&arg0);
    let req = Request::parse_split(&h, &o, &[], &CFG).unwrap();
    match req.op {
        Operation::Getattr { arg } => {
            assert_eq!(arg.getattr_flags, 1);
            assert_eq!(arg.fh, 0x0001_0203_0405_0607);
        }
        other => panic!("expected GETATTR, got {other:?}"),
    }
}

#[test]
fn write_has_write_in_in_op_in_and_data_in_the_payload() {
    #[rustfmt::skip]
    let write_in = [
        0x2a, 0, 0, 0, 0, 0, 0, 0,          // fh = 42
        0x00, 0x10, 0, 0, 0, 0, 0, 0,       // offset = 4096
        0x05, 0, 0, 0,                      // size = 5
        0x02, 0, 0, 0,                      // write_flags = LOCKOWNER
        0x99, 0, 0, 0, 0, 0, 0, 0,          // lock_owner
        0x01, 0x80, 0, 0,                   // flags = O_WRONLY|O_LARGEFILE
        0, 0, 0, 0,                         // padding
    ];
    assert_eq!(write_in.len(), 40);
    let payload = b"abcde";
    let h = in_out(40 + 40 + 5, 16, 0x14, 7, 0);
    let o = op_in(&write_in);
    let req = Request::parse_split(&h, &o, payload, &CFG).unwrap();
    match req.op {
        Operation::Write { arg, data } => {
            assert_eq!(arg.fh, 42);
            assert_eq!(arg.offset, 4096);
            assert_eq!(arg.size, 5);
            assert_eq!(arg.write_flags, 2);
            assert_eq!(arg.lock_owner, 0x99);
            assert_eq!(arg.flags, 0x8001);
            assert_eq!(data, b"abcde");
            assert_eq!(
                data.as_ptr(),
                payload.as_ptr(),
                "write data must be borrowed in place"
            );
        }
        other => panic!("expected WRITE, got {other:?}"),
    }
}

#[test]
fn write_whose_size_disagrees_with_the_payload_is_refused() {
    let mut write_in = [0u8; 40];
    write_in[16] = 9; // size = 9, but 5 bytes follow
    let h = in_out(40 + 40 + 5, 16, 0x16, 7, 0);
    let e = Request::parse_split(&h, &op_in(&write_in), b"abcde", &CFG).unwrap_err();
    assert!(
        matches!(
            e,
            ParseError::PayloadMismatch {
                declared: 9,
                got: 5,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn create_with_a_supplementary_group_extension() {
    #[rustfmt::skip]
    let create_in = [
        0x41, 0x00, 0x00, 0x00,   // flags = O_WRONLY|O_CREAT
        0xa4, 0x81, 0x00, 0x00,   // mode = 0100644
        0x12, 0x00, 0x00, 0x00,   // umask = 022
        0x00, 0x00, 0x00, 0x00,   // open_flags
    ];
    #[rustfmt::skip]
    let payload = [
        b'n', b'e', b'w', 0,                  // name "new\0"
        // fuse_ext_header { size = 16, type = FUSE_EXT_GROUPS (32) }
        0x10, 0, 0, 0, 0x20, 0, 0, 0,
        // fuse_supp_groups { nr_groups = 1, groups = [100] }
        0x01, 0, 0, 0, 0x64, 0, 0, 0,
    ];
    // The extension area must be 8-aligned at the end; "new\0" is 4 bytes,
    // so the kernel's args are: create_in (op_in), name (4), extension (16).
    let h = in_out(40 + 16 + 4 + 16, 35, 0x18, 1, 2);
    let o = op_in(&create_in);
    let req = Request::parse_split(&h, &o, &payload, &CFG).unwrap();
    match req.op {
        Operation::Create { arg, name } => {
            assert_eq!(arg.flags, 0x41);
            assert_eq!(arg.mode, 0o100644);
            assert_eq!(arg.umask, 0o22);
            assert_eq!(name.to_bytes(), b"new");
        }
        other => panic!("expected CREATE, got {other:?}"),
    }
    let groups: Vec<u32> = req.extensions.supp_groups().unwrap().iter().collect();
    assert_eq!(groups, [100]);
    assert_eq!(req.extensions.raw().as_ptr(), payload[4..].as_ptr());
}

#[test]
fn rename_reads_both_names_from_the_payload() {
    let rename_in = 5u64.to_le_bytes(); // newdir
    let payload = b"a\0bb\0";
    let h = in_out(40 + 8 + 5, 12, 0x1a, 1, 0);
    let o = op_in(&rename_in);
    let req = Request::parse_split(&h, &o, payload, &CFG).unwrap();
    match req.op {
        Operation::Rename { arg, name, newname } => {
            assert_eq!(arg.newdir, 5);
            assert_eq!(name.to_bytes(), b"a");
            assert_eq!(newname.to_bytes(), b"bb");
        }
        other => panic!("expected RENAME, got {other:?}"),
    }
}

#[test]
fn split_and_contiguous_parsing_agree() {
    // The same SETXATTR (setxattr_in 16 + "user.x\0" + "val") both ways.
    #[rustfmt::skip]
    let arg0 = [
        3, 0, 0, 0,   // size = 3
        1, 0, 0, 0,   // flags = XATTR_CREATE
        0, 0, 0, 0,   // setxattr_flags
        0, 0, 0, 0,   // padding
    ];
    let payload = b"user.x\0val";
    let len = 40 + 16 + payload.len() as u32;
    let h = in_out(len, 21, 0x1c, 3, 0);
    let o = op_in(&arg0);
    let split = Request::parse_split(&h, &o, payload, &CFG).unwrap();
    let mut flat = h[..40].to_vec();
    flat.extend_from_slice(&arg0);
    flat.extend_from_slice(payload);
    let whole = Request::parse_with(&flat, &CFG).unwrap();
    assert_eq!(split.op, whole.op);
    assert_eq!(split.header, whole.header);
}

#[test]
fn a_first_argument_the_opcode_does_not_take_is_refused() {
    // LOOKUP whose header claims 8 bytes in op_in.
    let h = in_out(40 + 8 + 2, 1, 0x1e, 1, 0);
    let e = Request::parse_split(&h, &op_in(&[0; 8]), b"x\0", &CFG).unwrap_err();
    assert!(
        matches!(
            e,
            ParseError::FirstArgMismatch {
                expected: 0,
                got: 8,
                ..
            }
        ),
        "{e:?}"
    );
    // GETATTR with a 12-byte first argument: too short for fuse_getattr_in.
    let h = in_out(40 + 12, 3, 0x20, 1, 0);
    let e = Request::parse_split(&h, &op_in(&[0; 12]), &[], &CFG).unwrap_err();
    assert!(
        matches!(
            e,
            ParseError::ShortBody {
                expected: 16,
                got: 12,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn lengths_that_do_not_add_up_are_refused() {
    // len smaller than header + payload.
    let h = in_out(40 + 2, 1, 0x22, 1, 0);
    let e = Request::parse_split(&h, &op_in(&[]), b"abc\0", &CFG).unwrap_err();
    assert!(
        matches!(e, ParseError::LengthMismatch { header_len: 42, .. }),
        "{e:?}"
    );
    // A first argument larger than the 128-byte op_in area.
    let h = in_out(40 + 200, 3, 0x24, 1, 0);
    let e = Request::parse_split(&h, &op_in(&[]), &[], &CFG).unwrap_err();
    assert!(
        matches!(e, ParseError::LengthMismatch { header_len: 240, .. }),
        "{e:?}"
    );
    // Fewer than 40 header bytes.
    let e = Request::parse_split(&[0; 20], &op_in(&[]), &[], &CFG).unwrap_err();
    assert_eq!(e, ParseError::ShortHeader { got: 20 });
}
