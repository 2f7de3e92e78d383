//! Prints the layout of every ABI struct this crate defines, with the kernel's
//! names: `<c_struct_name> <size>` per struct and
//! `<c_struct_name>.<c_field_name> <offset> <size>` per field (size 0 for a
//! flexible array member). Compare it with the same dump of your kernel's
//! `include/uapi/linux/fuse.h` to check the crate against it.

use std::io::Write;

fn main() -> std::io::Result<()> {
    let out = std::io::stdout();
    let mut out = out.lock();
    for s in fuse_proto::abi::ALL_STRUCTS {
        writeln!(out, "{} {}", s.name, s.size)?;
        for f in s.fields {
            writeln!(out, "{}.{} {} {}", s.name, f.name, f.offset, f.size)?;
        }
    }
    Ok(())
}
