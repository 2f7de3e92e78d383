//! Request extensions after the last argument (since 7.38): security context and supplementary groups.
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// Header of one request extension.
    "fuse_ext_header" ExtHeader = 8 {
        size: u32 = "size",
        r#type: u32 = "type",
    }
}

abi_struct! {
    /// Header of the security-context extension.
    "fuse_secctx_header" SecctxHeader = 8 {
        size: u32 = "size",
        nr_secctx: u32 = "nr_secctx",
    }
}

abi_struct! {
    /// One security context, followed by its xattr name (NUL-terminated) and value.
    "fuse_secctx" Secctx = 8 {
        size: u32 = "size",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Supplementary-groups extension body; the group ids follow.
    "fuse_supp_groups" SuppGroups = 4 {
        nr_groups: u32 = "nr_groups",
        @flex groups = "groups",
    }
}
