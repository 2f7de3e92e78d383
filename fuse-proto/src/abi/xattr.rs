//! Extended attributes.
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// Body of SETXATTR (16 bytes with SETXATTR_EXT, else the first 8).
    "fuse_setxattr_in" SetxattrIn = 16 {
        size: u32 = "size",
        flags: u32 = "flags",
        setxattr_flags: u32 = "setxattr_flags",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Body of GETXATTR and LISTXATTR.
    "fuse_getxattr_in" GetxattrIn = 8 {
        size: u32 = "size",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Reply to a size probe (size 0) of GETXATTR or LISTXATTR.
    "fuse_getxattr_out" GetxattrOut = 8 {
        size: u32 = "size",
        padding: u32 = "padding",
    }
}
