//! Zero-copy request parsing: a receive buffer becomes a [`Request`] that
//! borrows names, write data and xattr values straight from it.
//!
//! Fixed-size argument structs are copied out (they are at most 88 bytes and
//! may sit unaligned in the buffer); payloads are never copied. Sizes that
//! depend on the negotiated minor come from [`crate::version`]. Every way a
//! buffer can be malformed is a [`ParseError`] that names the opcode and what
//! was expected; nothing here panics on any input.

mod error;
mod extensions;
mod operation;

use crate::abi::*;
use crate::ext::atomic_open;
use crate::opcode::Opcode;
use crate::version;
use core::ffi::CStr;
use core::mem::size_of;
pub use error::ParseError;
pub use extensions::{Extension, Extensions, SecurityContext, SecurityContexts, SuppGroupList};
pub use operation::{ForgetList, Operation, RemovemappingList};
use zerocopy::FromBytes;

/// What the parser needs to know about the session besides the minor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseConfig {
    /// The negotiated protocol minor (of major 7).
    pub minor: u32,
    /// Whether `FUSE_SETXATTR_EXT` was negotiated (16-byte `fuse_setxattr_in`).
    pub setxattr_ext: bool,
    /// Whether the session opted in to the out-of-tree atomic-open extension.
    /// Honoured only when `minor < 45`, see [`atomic_open`].
    pub atomic_open: bool,
}

impl ParseConfig {
    /// A configuration for `minor` with no optional feature negotiated.
    pub const fn new(minor: u32) -> Self {
        Self {
            minor,
            setxattr_ext: false,
            atomic_open: false,
        }
    }
}

/// One request: the header, the typed operation, and any request extensions.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The `fuse_in_header`.
    pub header: InHeader,
    /// The typed operation with its arguments.
    pub op: Operation<'a>,
    /// Request extensions (security context, supplementary groups), if any.
    pub extensions: Extensions<'a>,
}

/// A cursor over a request body.
///
/// A body read from `/dev/fuse` is one contiguous segment (`rest`). Over
/// io_uring the kernel delivers the opcode's first argument (its fixed
/// struct, if any) in a separate area; then `head` holds it, fixed structs
/// are read from `head` and names and payloads from `rest`. Everything else,
/// the per-opcode logic included, is shared.
struct Body<'a> {
    op: Opcode,
    head: Option<&'a [u8]>,
    rest: &'a [u8],
}

impl<'a> Body<'a> {
    /// Where fixed argument structs come from.
    fn fixed_src(&mut self) -> &mut &'a [u8] {
        match &mut self.head {
            Some(h) => h,
            None => &mut self.rest,
        }
    }

    /// Reads a fixed struct of which only the first `wire` bytes are on the wire
    /// (compat sizes); the rest is zero.
    fn sized<T: FromBytes + zerocopy::IntoBytes>(
        &mut self,
        wire: usize,
        what: &'static str,
    ) -> Result<T, ParseError> {
        let full = size_of::<T>();
        let wire = wire.min(full);
        let op = self.op;
        let src = self.fixed_src();
        let Some(bytes) = src.get(..wire) else {
            return Err(ParseError::ShortBody {
                opcode: op,
                what,
                expected: wire,
                got: src.len(),
            });
        };
        let mut v = T::new_zeroed();
        v.as_mut_bytes()[..wire].copy_from_slice(bytes);
        *src = &src[wire..];
        Ok(v)
    }

    /// After the opcode's arguments were read: a first-argument area must
    /// have been consumed exactly.
    fn finish_head(&self, head_len: usize) -> Result<(), ParseError> {
        match self.head {
            Some(h) if !h.is_empty() => Err(ParseError::FirstArgMismatch {
                opcode: self.op,
                expected: head_len - h.len(),
                got: head_len,
            }),
            _ => Ok(()),
        }
    }

    fn arg<T: FromBytes + zerocopy::IntoBytes>(&mut self, what: &'static str) -> Result<T, ParseError> {
        self.sized(size_of::<T>(), what)
    }

    fn name(&mut self, what: &'static str) -> Result<&'a CStr, ParseError> {
        let s = CStr::from_bytes_until_nul(self.rest).map_err(|_| ParseError::MissingNul {
            opcode: self.op,
            what,
        })?;
        self.rest = &self.rest[s.to_bytes_with_nul().len()..];
        Ok(s)
    }

    fn exact(&mut self, declared: u64, what: &'static str) -> Result<&'a [u8], ParseError> {
        if declared != self.rest.len() as u64 {
            return Err(ParseError::PayloadMismatch {
                opcode: self.op,
                what,
                declared,
                got: self.rest.len(),
            });
        }
        let d = self.rest;
        self.rest = &[];
        Ok(d)
    }

    fn at_least(&mut self, declared: u64, what: &'static str) -> Result<&'a [u8], ParseError> {
        match usize::try_from(declared).ok().and_then(|n| self.rest.get(..n)) {
            Some(d) => {
                self.rest = &self.rest[d.len()..];
                Ok(d)
            }
            None => Err(ParseError::PayloadMismatch {
                opcode: self.op,
                what,
                declared,
                got: self.rest.len(),
            }),
        }
    }
}

impl<'a> Request<'a> {
    /// Parses a request as a kernel of `minor` sends it, with no optional
    /// feature negotiated. See [`Request::parse_with`].
    pub fn parse(buf: &'a [u8], minor: u32) -> Result<Self, ParseError> {
        Self::parse_with(buf, &ParseConfig::new(minor))
    }

    /// Parses one request. `buf` must be exactly what one device read returned.
    pub fn parse_with(buf: &'a [u8], cfg: &ParseConfig) -> Result<Self, ParseError> {
        let (header, after) =
            InHeader::read_from_prefix(buf).map_err(|_| ParseError::ShortHeader { got: buf.len() })?;
        if header.len as usize != buf.len() {
            return Err(ParseError::LengthMismatch {
                header_len: header.len,
                buffer_len: buf.len(),
            });
        }
        Self::parse_parts(header, None, after, cfg)
    }

    /// Parses a request delivered in three parts, as FUSE over io_uring does
    /// (since 7.42): `header` holds the `fuse_in_header` (the ring entry's
    /// `in_out` area; only its first 40 bytes are read), `op_in` the opcode's
    /// first argument (the entry's `op_in` area, 128 bytes; how much of it is
    /// used follows from the header), and `payload` the remaining arguments
    /// and extensions (the first `payload_sz` bytes of the entry's payload
    /// buffer). Names, data and extensions are borrowed from `payload`.
    ///
    /// The size of the first argument is `len - 40 - payload.len()`; it must
    /// fit in `op_in` and be exactly what the opcode reads there for the
    /// negotiated minor, or the request is refused with
    /// [`ParseError::FirstArgMismatch`].
    pub fn parse_split(
        header: &[u8],
        op_in: &'a [u8],
        payload: &'a [u8],
        cfg: &ParseConfig,
    ) -> Result<Self, ParseError> {
        let (header, _) =
            InHeader::read_from_prefix(header).map_err(|_| ParseError::ShortHeader { got: header.len() })?;
        let fixed = size_of::<InHeader>() + payload.len();
        let arg0 = (header.len as usize).checked_sub(fixed);
        let Some(head) = arg0.and_then(|n| op_in.get(..n)) else {
            return Err(ParseError::LengthMismatch {
                header_len: header.len,
                buffer_len: fixed + arg0.map_or(0, |_| op_in.len()),
            });
        };
        Self::parse_parts(header, Some(head), payload, cfg)
    }

    /// The per-opcode part of [`Request::parse_with`] and
    /// [`Request::parse_split`]: `head` is the separately delivered first
    /// argument (io_uring) and `after` everything else that follows the header.
    fn parse_parts(
        header: InHeader,
        head: Option<&'a [u8]>,
        after: &'a [u8],
        cfg: &ParseConfig,
    ) -> Result<Self, ParseError> {
        let (body, extensions) = if version::has_request_extensions(cfg.minor) && header.total_extlen != 0 {
            let ext = header.total_extlen as usize * 8;
            if ext > after.len() {
                return Err(ParseError::ExtensionOutOfBounds {
                    extlen_bytes: ext,
                    available: after.len(),
                });
            }
            let (b, e) = after.split_at(after.len() - ext);
            (b, Extensions::validate(e)?)
        } else {
            (after, Extensions::default())
        };
        let atomic = cfg.atomic_open && cfg.minor < 45 && header.opcode == atomic_open::OPCODE;
        let opcode = match Opcode::from_u32(header.opcode) {
            Ok(op) if !atomic => op,
            Ok(_) => Opcode::Create,
            Err(_) => {
                return Err(ParseError::UnknownOpcode {
                    opcode: header.opcode,
                    unique: header.unique,
                });
            }
        };
        let head_len = head.map_or(0, <[u8]>::len);
        let mut b = Body {
            op: opcode,
            head,
            rest: body,
        };
        let m = cfg.minor;
        use Operation as O;
        let op = if atomic {
            let arg = b.sized(version::create_in_size(m), "fuse_create_in")?;
            O::AtomicOpen {
                arg,
                name: b.name("name")?,
            }
        } else {
            match opcode {
                Opcode::Lookup => O::Lookup {
                    name: b.name("name")?,
                },
                Opcode::Forget => O::Forget {
                    arg: b.arg("fuse_forget_in")?,
                },
                Opcode::Getattr => O::Getattr {
                    arg: if version::getattr_has_body(m) {
                        b.arg("fuse_getattr_in")?
                    } else {
                        GetattrIn::default()
                    },
                },
                Opcode::Setattr => O::Setattr {
                    arg: b.arg("fuse_setattr_in")?,
                },
                Opcode::Readlink => O::Readlink,
                Opcode::Symlink => {
                    let name = b.name("name")?;
                    O::Symlink {
                        name,
                        target: b.name("link target")?,
                    }
                }
                Opcode::Mknod => {
                    let arg = b.sized(version::mknod_in_size(m), "fuse_mknod_in")?;
                    O::Mknod {
                        arg,
                        name: b.name("name")?,
                    }
                }
                Opcode::Mkdir => {
                    let arg = b.arg("fuse_mkdir_in")?;
                    O::Mkdir {
                        arg,
                        name: b.name("name")?,
                    }
                }
                Opcode::Unlink => O::Unlink {
                    name: b.name("name")?,
                },
                Opcode::Rmdir => O::Rmdir {
                    name: b.name("name")?,
                },
                Opcode::Rename => {
                    let arg = b.arg("fuse_rename_in")?;
                    let name = b.name("old name")?;
                    O::Rename {
                        arg,
                        name,
                        newname: b.name("new name")?,
                    }
                }
                Opcode::Link => {
                    let arg = b.arg("fuse_link_in")?;
                    O::Link {
                        arg,
                        name: b.name("name")?,
                    }
                }
                Opcode::Open => O::Open {
                    arg: b.arg("fuse_open_in")?,
                },
                Opcode::Read => O::Read {
                    arg: b.arg("fuse_read_in")?,
                },
                Opcode::Write => {
                    let arg: WriteIn = b.sized(version::write_in_size(m), "fuse_write_in")?;
                    let data = b.exact(arg.size.into(), "fuse_write_in.size")?;
                    O::Write { arg, data }
                }
                Opcode::Statfs => O::Statfs,
                Opcode::Release => O::Release {
                    arg: b.arg("fuse_release_in")?,
                },
                Opcode::Fsync => O::Fsync {
                    arg: b.arg("fuse_fsync_in")?,
                },
                Opcode::Setxattr => {
                    let arg: SetxattrIn =
                        b.sized(version::setxattr_in_size(cfg.setxattr_ext), "fuse_setxattr_in")?;
                    let name = b.name("name")?;
                    let value = b.exact(arg.size.into(), "fuse_setxattr_in.size")?;
                    O::Setxattr { arg, name, value }
                }
                Opcode::Getxattr => {
                    let arg = b.arg("fuse_getxattr_in")?;
                    O::Getxattr {
                        arg,
                        name: b.name("name")?,
                    }
                }
                Opcode::Listxattr => O::Listxattr {
                    arg: b.arg("fuse_getxattr_in")?,
                },
                Opcode::Removexattr => O::Removexattr {
                    name: b.name("name")?,
                },
                Opcode::Flush => O::Flush {
                    arg: b.arg("fuse_flush_in")?,
                },
                Opcode::Init => {
                    // INIT is parsed before a minor is known: the body says how
                    // much the kernel sent (16 bytes before 7.36, 64 since).
                    let wire = b.fixed_src().len().min(size_of::<InitIn>());
                    let arg = b.sized(wire.max(version::COMPAT_INIT_IN_SIZE), "fuse_init_in")?;
                    O::Init { arg }
                }
                Opcode::Opendir => O::Opendir {
                    arg: b.arg("fuse_open_in")?,
                },
                Opcode::Readdir => O::Readdir {
                    arg: b.arg("fuse_read_in")?,
                },
                Opcode::Releasedir => O::Releasedir {
                    arg: b.arg("fuse_release_in")?,
                },
                Opcode::Fsyncdir => O::Fsyncdir {
                    arg: b.arg("fuse_fsync_in")?,
                },
                Opcode::Getlk => O::Getlk {
                    arg: b.arg("fuse_lk_in")?,
                },
                Opcode::Setlk => O::Setlk {
                    arg: b.arg("fuse_lk_in")?,
                },
                Opcode::Setlkw => O::Setlkw {
                    arg: b.arg("fuse_lk_in")?,
                },
                Opcode::Access => O::Access {
                    arg: b.arg("fuse_access_in")?,
                },
                Opcode::Create => {
                    let arg = b.sized(version::create_in_size(m), "fuse_create_in")?;
                    O::Create {
                        arg,
                        name: b.name("name")?,
                    }
                }
                Opcode::Interrupt => O::Interrupt {
                    arg: b.arg("fuse_interrupt_in")?,
                },
                Opcode::Bmap => O::Bmap {
                    arg: b.arg("fuse_bmap_in")?,
                },
                Opcode::Destroy => O::Destroy,
                Opcode::Ioctl => {
                    let arg: IoctlIn = b.arg("fuse_ioctl_in")?;
                    let data = b.at_least(arg.in_size.into(), "fuse_ioctl_in.in_size")?;
                    O::Ioctl { arg, data }
                }
                Opcode::Poll => O::Poll {
                    arg: b.arg("fuse_poll_in")?,
                },
                Opcode::NotifyReply => {
                    let arg: NotifyRetrieveIn = b.arg("fuse_notify_retrieve_in")?;
                    let data = b.exact(arg.size.into(), "fuse_notify_retrieve_in.size")?;
                    O::NotifyReply { arg, data }
                }
                Opcode::BatchForget => {
                    let arg: BatchForgetIn = b.arg("fuse_batch_forget_in")?;
                    let n = u64::from(arg.count) * size_of::<ForgetOne>() as u64;
                    let list = b.at_least(n, "fuse_batch_forget_in.count")?;
                    O::BatchForget {
                        arg,
                        forgets: ForgetList(list),
                    }
                }
                Opcode::Fallocate => O::Fallocate {
                    arg: b.arg("fuse_fallocate_in")?,
                },
                Opcode::Readdirplus => O::Readdirplus {
                    arg: b.arg("fuse_read_in")?,
                },
                Opcode::Rename2 => {
                    let arg = b.arg("fuse_rename2_in")?;
                    let name = b.name("old name")?;
                    O::Rename2 {
                        arg,
                        name,
                        newname: b.name("new name")?,
                    }
                }
                Opcode::Lseek => O::Lseek {
                    arg: b.arg("fuse_lseek_in")?,
                },
                Opcode::CopyFileRange => O::CopyFileRange {
                    arg: b.arg("fuse_copy_file_range_in")?,
                },
                Opcode::Setupmapping => O::Setupmapping {
                    arg: b.arg("fuse_setupmapping_in")?,
                },
                Opcode::Removemapping => {
                    let arg: RemovemappingIn = b.arg("fuse_removemapping_in")?;
                    let n = u64::from(arg.count) * size_of::<RemovemappingOne>() as u64;
                    let list = b.at_least(n, "fuse_removemapping_in.count")?;
                    O::Removemapping {
                        arg,
                        mappings: RemovemappingList(list),
                    }
                }
                Opcode::Syncfs => O::Syncfs {
                    arg: b.arg("fuse_syncfs_in")?,
                },
                Opcode::Tmpfile => {
                    let arg = b.arg("fuse_create_in")?;
                    O::Tmpfile {
                        arg,
                        name: b.name("name")?,
                    }
                }
                Opcode::Statx => O::Statx {
                    arg: b.arg("fuse_statx_in")?,
                },
                Opcode::CopyFileRange64 => O::CopyFileRange64 {
                    arg: b.arg("fuse_copy_file_range_in")?,
                },
                Opcode::CuseInit => O::CuseInit {
                    arg: b.arg("cuse_init_in")?,
                },
            }
        };
        b.finish_head(head_len)?;
        Ok(Request {
            header,
            op,
            extensions,
        })
    }

    /// The request's unique id.
    pub fn unique(&self) -> u64 {
        self.header.unique
    }

    /// The target node id (the parent for name-based operations).
    pub fn nodeid(&self) -> u64 {
        self.header.nodeid
    }
}

/// Reads `unique` from a buffer whose full parse failed, so that an error can
/// still be answered. `None` if fewer than 16 bytes arrived.
pub fn peek_unique(buf: &[u8]) -> Option<u64> {
    let b: [u8; 8] = buf.get(8..16)?.try_into().ok()?;
    Some(u64::from_ne_bytes(b))
}

/// Reads the caller's uid from a buffer that holds at least a header
/// (`fuse_in_header.uid`), without parsing the rest.
pub fn peek_uid(buf: &[u8]) -> Option<u32> {
    let b: [u8; 4] = buf.get(24..28)?.try_into().ok()?;
    Some(u32::from_ne_bytes(b))
}

/// Reads the opcode number from a buffer whose full parse failed.
pub fn peek_opcode(buf: &[u8]) -> Option<u32> {
    let b: [u8; 4] = buf.get(4..8)?.try_into().ok()?;
    Some(u32::from_ne_bytes(b))
}
