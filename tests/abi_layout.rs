//! Layout conformance: the size and every field offset of all 76 structs of
//! the 7.45 ABI equal the kernel's. The expected table in
//! `tests/data/abi_layout_7_45.txt` was produced by compiling the 7.45 header
//! with gcc on x86_64 (see docs/protocol.md); it has the format of the
//! `abi_dump` example, so a user can regenerate it from their own header.

use fuse_wire::proto::abi::ALL_STRUCTS;

fn dump() -> Vec<String> {
    let mut lines = Vec::new();
    for s in ALL_STRUCTS {
        lines.push(format!("{} {}", s.name, s.size));
        for f in s.fields {
            lines.push(format!("{}.{} {} {}", s.name, f.name, f.offset, f.size));
        }
    }
    lines
}

#[test]
fn all_76_structs_are_defined() {
    assert_eq!(ALL_STRUCTS.len(), 76);
    let mut names: Vec<_> = ALL_STRUCTS.iter().map(|s| s.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), 76, "a struct is listed twice");
}

#[test]
fn every_size_and_offset_matches_the_kernel() {
    let expected: Vec<String> = include_str!("data/abi_layout_7_45.txt")
        .lines()
        .map(str::to_owned)
        .collect();
    let got = dump();
    for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(g, e, "line {} of the layout table differs", i + 1);
    }
    assert_eq!(
        got.len(),
        expected.len(),
        "the crate describes a different number of fields"
    );
}

#[test]
fn fields_tile_each_struct_without_gaps() {
    // The kernel's structs have no implicit padding: each field starts where
    // the previous one ended and the last one ends at the struct's size.
    for s in ALL_STRUCTS {
        let mut at = 0;
        for f in s.fields {
            assert_eq!(f.offset, at, "{}.{} leaves a hole", s.name, f.name);
            at += f.size;
        }
        assert_eq!(at, s.size, "{} has trailing padding", s.name);
    }
}
