//! Zero-copy request parsing: a receive buffer becomes a [`Request`] that
//! borrows names, write data and xattr values straight from it.
//!
//! Fixed-size argument structs are copied out (they are at most 88 bytes and
//! may sit unaligned in the buffer); payloads are never copied. Sizes that
//! depend on the negotiated minor come from [`crate::version`]. Every way a
//! buffer can be malformed is a [`ParseError`] that names the opcode and what
//! was expected; nothing here panics on any input.

use crate::abi::*;
use crate::ext::atomic_open;
use crate::opcode::Opcode;
use crate::version;
use core::ffi::CStr;
use core::mem::size_of;
use zerocopy::FromBytes;

/// Why a buffer is not a valid request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Fewer bytes than a `fuse_in_header`.
    #[error("request of {got} bytes is shorter than the 40-byte fuse_in_header")]
    ShortHeader {
        /// Bytes received.
        got: usize,
    },
    /// `fuse_in_header.len` disagrees with the number of bytes received.
    #[error("fuse_in_header.len says {header_len} bytes but {buffer_len} were received")]
    LengthMismatch {
        /// The header's `len`.
        header_len: u32,
        /// Bytes received.
        buffer_len: usize,
    },
    /// The opcode is not in the table.
    #[error("unknown opcode {opcode} (unique {unique})")]
    UnknownOpcode {
        /// The number received.
        opcode: u32,
        /// The request's unique, to answer ENOSYS.
        unique: u64,
    },
    /// The body is shorter than the opcode's argument struct.
    #[error("{opcode}: body of {got} bytes is shorter than the {expected} bytes of {what}")]
    ShortBody {
        /// The opcode.
        opcode: Opcode,
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        expected: usize,
        /// Bytes available.
        got: usize,
    },
    /// A name argument has no terminating NUL inside the body.
    #[error("{opcode}: {what} is not NUL-terminated within the request")]
    MissingNul {
        /// The opcode.
        opcode: Opcode,
        /// Which name.
        what: &'static str,
    },
    /// A payload's declared size disagrees with the bytes present.
    #[error("{opcode}: {what} declares {declared} bytes but {got} follow")]
    PayloadMismatch {
        /// The opcode.
        opcode: Opcode,
        /// Which payload.
        what: &'static str,
        /// The size the argument struct declares.
        declared: u64,
        /// Bytes present.
        got: usize,
    },
    /// `total_extlen` points past the end of the request.
    #[error("total_extlen of {extlen_bytes} bytes exceeds the {available} bytes after the header")]
    ExtensionOutOfBounds {
        /// `total_extlen * 8`.
        extlen_bytes: usize,
        /// Bytes after the header.
        available: usize,
    },
    /// A request delivered in two parts (FUSE over io_uring) whose first part
    /// (`op_in`) is not exactly the opcode's first argument.
    #[error("{opcode}: the first-argument area holds {got} bytes but the opcode takes {expected} there")]
    FirstArgMismatch {
        /// The opcode.
        opcode: Opcode,
        /// Bytes of the first argument the opcode reads.
        expected: usize,
        /// Bytes the kernel put there.
        got: usize,
    },
    /// An extension record is malformed.
    #[error("malformed request extension at byte {offset}: {reason}")]
    BadExtension {
        /// Offset within the extension area.
        offset: usize,
        /// What is wrong.
        reason: &'static str,
    },
}

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

/// A list of `fuse_forget_one` read lazily from the buffer (no alignment needed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForgetList<'a>(&'a [u8]);

impl<'a> ForgetList<'a> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len() / size_of::<ForgetOne>()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The entries.
    pub fn iter(&self) -> impl Iterator<Item = ForgetOne> + use<'a> {
        self.0
            .chunks_exact(size_of::<ForgetOne>())
            .filter_map(|c| ForgetOne::read_from_bytes(c).ok())
    }
}

/// A list of `fuse_removemapping_one` read lazily from the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemovemappingList<'a>(&'a [u8]);

impl<'a> RemovemappingList<'a> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len() / size_of::<RemovemappingOne>()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The entries.
    pub fn iter(&self) -> impl Iterator<Item = RemovemappingOne> + use<'a> {
        self.0
            .chunks_exact(size_of::<RemovemappingOne>())
            .filter_map(|c| RemovemappingOne::read_from_bytes(c).ok())
    }
}

/// The operation of a request, one variant per opcode, arguments borrowed
/// from the receive buffer.
///
/// Field conventions: `arg` is the opcode's fixed argument struct (copied out
/// of the buffer, zero-extended where an old minor sent a shorter one); `name`,
/// `newname` and `target` are NUL-checked names borrowed from the buffer;
/// `data` and `value` are payloads borrowed from the buffer.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operation<'a> {
    /// LOOKUP `name` in directory `nodeid`.
    Lookup { name: &'a CStr },
    /// FORGET.
    Forget { arg: ForgetIn },
    /// GETATTR; before 7.9 the kernel sent no body and `arg` is zeroed.
    Getattr { arg: GetattrIn },
    /// SETATTR.
    Setattr { arg: SetattrIn },
    /// READLINK.
    Readlink,
    /// SYMLINK: create `name` pointing at `target`.
    Symlink { name: &'a CStr, target: &'a CStr },
    /// MKNOD (before 7.12 `umask` is zero).
    Mknod { arg: MknodIn, name: &'a CStr },
    /// MKDIR.
    Mkdir { arg: MkdirIn, name: &'a CStr },
    /// UNLINK.
    Unlink { name: &'a CStr },
    /// RMDIR.
    Rmdir { name: &'a CStr },
    /// RENAME `name` to `newname` in `arg.newdir`.
    Rename {
        arg: RenameIn,
        name: &'a CStr,
        newname: &'a CStr,
    },
    /// LINK `arg.oldnodeid` as `name` in directory `nodeid`.
    Link { arg: LinkIn, name: &'a CStr },
    /// OPEN.
    Open { arg: OpenIn },
    /// READ.
    Read { arg: ReadIn },
    /// WRITE of `data` (borrowed, `arg.size` bytes).
    Write { arg: WriteIn, data: &'a [u8] },
    /// STATFS.
    Statfs,
    /// RELEASE.
    Release { arg: ReleaseIn },
    /// FSYNC.
    Fsync { arg: FsyncIn },
    /// SETXATTR (without SETXATTR_EXT the last two words of `arg` are zero).
    Setxattr {
        arg: SetxattrIn,
        name: &'a CStr,
        value: &'a [u8],
    },
    /// GETXATTR.
    Getxattr { arg: GetxattrIn, name: &'a CStr },
    /// LISTXATTR.
    Listxattr { arg: GetxattrIn },
    /// REMOVEXATTR.
    Removexattr { name: &'a CStr },
    /// FLUSH.
    Flush { arg: FlushIn },
    /// INIT (before 7.36 only the first 16 bytes of `arg` were sent).
    Init { arg: InitIn },
    /// OPENDIR.
    Opendir { arg: OpenIn },
    /// READDIR.
    Readdir { arg: ReadIn },
    /// RELEASEDIR.
    Releasedir { arg: ReleaseIn },
    /// FSYNCDIR.
    Fsyncdir { arg: FsyncIn },
    /// GETLK.
    Getlk { arg: LkIn },
    /// SETLK.
    Setlk { arg: LkIn },
    /// SETLKW.
    Setlkw { arg: LkIn },
    /// ACCESS.
    Access { arg: AccessIn },
    /// CREATE (before 7.12 `mode` and `umask` are zero).
    Create { arg: CreateIn, name: &'a CStr },
    /// INTERRUPT of request `arg.unique`.
    Interrupt { arg: InterruptIn },
    /// BMAP.
    Bmap { arg: BmapIn },
    /// DESTROY.
    Destroy,
    /// IOCTL with `data` (`arg.in_size` bytes).
    Ioctl { arg: IoctlIn, data: &'a [u8] },
    /// POLL.
    Poll { arg: PollIn },
    /// NOTIFY_REPLY: the cached `data` a RETRIEVE asked for.
    NotifyReply { arg: NotifyRetrieveIn, data: &'a [u8] },
    /// BATCH_FORGET.
    BatchForget {
        arg: BatchForgetIn,
        forgets: ForgetList<'a>,
    },
    /// FALLOCATE.
    Fallocate { arg: FallocateIn },
    /// READDIRPLUS.
    Readdirplus { arg: ReadIn },
    /// RENAME2.
    Rename2 {
        arg: Rename2In,
        name: &'a CStr,
        newname: &'a CStr,
    },
    /// LSEEK.
    Lseek { arg: LseekIn },
    /// COPY_FILE_RANGE.
    CopyFileRange { arg: CopyFileRangeIn },
    /// SETUPMAPPING.
    Setupmapping { arg: SetupmappingIn },
    /// REMOVEMAPPING.
    Removemapping {
        arg: RemovemappingIn,
        mappings: RemovemappingList<'a>,
    },
    /// SYNCFS.
    Syncfs { arg: SyncfsIn },
    /// TMPFILE.
    Tmpfile { arg: CreateIn, name: &'a CStr },
    /// STATX.
    Statx { arg: StatxIn },
    /// COPY_FILE_RANGE_64.
    CopyFileRange64 { arg: CopyFileRangeIn },
    /// CUSE_INIT.
    CuseInit { arg: CuseInitIn },
    /// The out-of-tree atomic lookup+open (v10 wire), only when opted in;
    /// see [`crate::ext::atomic_open`].
    AtomicOpen { arg: CreateIn, name: &'a CStr },
}

impl Operation<'_> {
    /// The opcode of this operation (atomic open reports [`Opcode::Create`],
    /// whose reply it shares; see [`Operation::is_atomic_open`]).
    pub fn opcode(&self) -> Opcode {
        use Operation as O;
        match self {
            O::Lookup { .. } => Opcode::Lookup,
            O::Forget { .. } => Opcode::Forget,
            O::Getattr { .. } => Opcode::Getattr,
            O::Setattr { .. } => Opcode::Setattr,
            O::Readlink => Opcode::Readlink,
            O::Symlink { .. } => Opcode::Symlink,
            O::Mknod { .. } => Opcode::Mknod,
            O::Mkdir { .. } => Opcode::Mkdir,
            O::Unlink { .. } => Opcode::Unlink,
            O::Rmdir { .. } => Opcode::Rmdir,
            O::Rename { .. } => Opcode::Rename,
            O::Link { .. } => Opcode::Link,
            O::Open { .. } => Opcode::Open,
            O::Read { .. } => Opcode::Read,
            O::Write { .. } => Opcode::Write,
            O::Statfs => Opcode::Statfs,
            O::Release { .. } => Opcode::Release,
            O::Fsync { .. } => Opcode::Fsync,
            O::Setxattr { .. } => Opcode::Setxattr,
            O::Getxattr { .. } => Opcode::Getxattr,
            O::Listxattr { .. } => Opcode::Listxattr,
            O::Removexattr { .. } => Opcode::Removexattr,
            O::Flush { .. } => Opcode::Flush,
            O::Init { .. } => Opcode::Init,
            O::Opendir { .. } => Opcode::Opendir,
            O::Readdir { .. } => Opcode::Readdir,
            O::Releasedir { .. } => Opcode::Releasedir,
            O::Fsyncdir { .. } => Opcode::Fsyncdir,
            O::Getlk { .. } => Opcode::Getlk,
            O::Setlk { .. } => Opcode::Setlk,
            O::Setlkw { .. } => Opcode::Setlkw,
            O::Access { .. } => Opcode::Access,
            O::Create { .. } | O::AtomicOpen { .. } => Opcode::Create,
            O::Interrupt { .. } => Opcode::Interrupt,
            O::Bmap { .. } => Opcode::Bmap,
            O::Destroy => Opcode::Destroy,
            O::Ioctl { .. } => Opcode::Ioctl,
            O::Poll { .. } => Opcode::Poll,
            O::NotifyReply { .. } => Opcode::NotifyReply,
            O::BatchForget { .. } => Opcode::BatchForget,
            O::Fallocate { .. } => Opcode::Fallocate,
            O::Readdirplus { .. } => Opcode::Readdirplus,
            O::Rename2 { .. } => Opcode::Rename2,
            O::Lseek { .. } => Opcode::Lseek,
            O::CopyFileRange { .. } => Opcode::CopyFileRange,
            O::Setupmapping { .. } => Opcode::Setupmapping,
            O::Removemapping { .. } => Opcode::Removemapping,
            O::Syncfs { .. } => Opcode::Syncfs,
            O::Tmpfile { .. } => Opcode::Tmpfile,
            O::Statx { .. } => Opcode::Statx,
            O::CopyFileRange64 { .. } => Opcode::CopyFileRange64,
            O::CuseInit { .. } => Opcode::CuseInit,
        }
    }

    /// Whether this is the out-of-tree atomic-open request.
    pub fn is_atomic_open(&self) -> bool {
        matches!(self, Operation::AtomicOpen { .. })
    }
}

/// The request-extension area after the last argument (since 7.38).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extensions<'a> {
    raw: &'a [u8],
}

/// One request extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extension<'a> {
    /// Security contexts (type 0..=31 = number of contexts).
    SecurityContext(SecurityContexts<'a>),
    /// Supplementary groups (`FUSE_EXT_GROUPS`).
    SuppGroups(SuppGroupList<'a>),
    /// A type this crate does not know; its body.
    Unknown {
        /// The `fuse_ext_header.type`.
        ext_type: u32,
        /// The bytes after the header.
        body: &'a [u8],
    },
}

/// The security contexts of a creation request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecurityContexts<'a> {
    count: u32,
    body: &'a [u8],
}

/// One security context: xattr name and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecurityContext<'a> {
    /// The xattr name, e.g. `security.selinux`.
    pub name: &'a CStr,
    /// The context value.
    pub value: &'a [u8],
}

impl<'a> SecurityContexts<'a> {
    /// The number of contexts the header announced.
    pub fn count(&self) -> u32 {
        self.count
    }
    /// The contexts; malformed trailing records end the iteration.
    pub fn iter(&self) -> impl Iterator<Item = SecurityContext<'a>> + use<'a> {
        let mut rest = self.body;
        let mut left = self.count;
        core::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            left -= 1;
            let (ctx, after) = Secctx::read_from_prefix(rest).ok()?;
            let name = CStr::from_bytes_until_nul(after).ok()?;
            let nlen = name.to_bytes_with_nul().len();
            let vlen = ctx.size as usize;
            let value = after.get(nlen..nlen.checked_add(vlen)?)?;
            let rec = (size_of::<Secctx>() + nlen + vlen).next_multiple_of(8);
            rest = rest.get(rec..).unwrap_or(&[]);
            Some(SecurityContext { name, value })
        })
    }
}

/// Supplementary group ids (`fuse_supp_groups`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuppGroupList<'a>(&'a [u8]);

impl<'a> SuppGroupList<'a> {
    /// The group ids.
    pub fn iter(&self) -> impl Iterator<Item = u32> + use<'a> {
        self.0
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
    }
}

impl<'a> Extensions<'a> {
    /// The raw extension bytes.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    fn validate(raw: &'a [u8]) -> Result<Self, ParseError> {
        let mut off = 0;
        while off < raw.len() {
            let bad = |reason| ParseError::BadExtension { offset: off, reason };
            let (h, _) =
                ExtHeader::read_from_prefix(&raw[off..]).map_err(|_| bad("truncated fuse_ext_header"))?;
            let size = h.size as usize;
            if size < size_of::<ExtHeader>() {
                return Err(bad("size smaller than its header"));
            }
            if !size.is_multiple_of(8) {
                return Err(bad("size not a multiple of 8"));
            }
            if size > raw.len() - off {
                return Err(bad("size runs past the end of the request"));
            }
            if h.r#type == crate::consts::EXT_GROUPS {
                let body = &raw[off + 8..off + size];
                let (g, rest) =
                    SuppGroups::read_from_prefix(body).map_err(|_| bad("truncated fuse_supp_groups"))?;
                if (g.nr_groups as usize)
                    .checked_mul(4)
                    .is_none_or(|n| n > rest.len())
                {
                    return Err(bad("nr_groups runs past the extension"));
                }
            }
            off += size;
        }
        Ok(Self { raw })
    }

    /// The extensions in order. Records were bounds-checked by the parser.
    pub fn iter(&self) -> impl Iterator<Item = Extension<'a>> + use<'a> {
        let mut rest = self.raw;
        core::iter::from_fn(move || {
            let (h, _) = ExtHeader::read_from_prefix(rest).ok()?;
            let size = (h.size as usize).max(8);
            let rec = rest.get(..size)?;
            rest = &rest[size..];
            let body = &rec[8..];
            Some(match h.r#type {
                t if t <= crate::consts::MAX_NR_SECCTX => {
                    // The security-context header is the extension header itself:
                    // `size` then `nr_secctx`.
                    Extension::SecurityContext(SecurityContexts { count: t, body })
                }
                crate::consts::EXT_GROUPS => {
                    let n = SuppGroups::read_from_prefix(body)
                        .map(|(g, _)| g.nr_groups)
                        .unwrap_or(0);
                    let ids = body.get(4..4 + 4 * n as usize).unwrap_or(&[]);
                    Extension::SuppGroups(SuppGroupList(ids))
                }
                ext_type => Extension::Unknown { ext_type, body },
            })
        })
    }

    /// The supplementary groups, if the kernel sent them.
    pub fn supp_groups(&self) -> Option<SuppGroupList<'a>> {
        self.iter().find_map(|e| match e {
            Extension::SuppGroups(g) => Some(g),
            _ => None,
        })
    }

    /// The security contexts, if the kernel sent them.
    pub fn security_contexts(&self) -> Option<SecurityContexts<'a>> {
        self.iter().find_map(|e| match e {
            Extension::SecurityContext(s) => Some(s),
            _ => None,
        })
    }
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
