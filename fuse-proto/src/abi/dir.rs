//! Directory listing records of READDIR and READDIRPLUS.
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// Fixed part of one READDIR record; the name follows, padded to 8 bytes.
    "fuse_dirent" Dirent = 24 {
        ino: u64 = "ino",
        off: u64 = "off",
        namelen: u32 = "namelen",
        r#type: u32 = "type",
        @flex name = "name",
    }
}

abi_struct! {
    /// Fixed part of one READDIRPLUS record; the name follows, padded to 8 bytes.
    "fuse_direntplus" Direntplus = 152 {
        entry_out: EntryOut = "entry_out",
        dirent: Dirent = "dirent",
    }
}
