//! INIT negotiation: what the kernel offers, what the filesystem wants, what
//! this library can honour, and the explicit result.
//!
//! The granted flags are `offered ∩ wanted ∩ supported`, minus combinations the
//! kernel would reject. Every wanted flag that is not granted is recorded in
//! [`Negotiated::refused`] with the reason and logged; nothing is granted
//! silently.

use fuse_proto::abi::{InitIn, InitOut};
use fuse_proto::consts::{KERNEL_MINOR_VERSION, KERNEL_VERSION, MIN_MINOR_VERSION};
use fuse_proto::flags::{FopenFlags, InitFlags};

/// Flags this library implements (what it must do for them is done). Others
/// are refused even when offered: `FILE_OPS` (never implemented by the
/// kernel), `INIT_RESERVED`, the splice flags (the device is read with
/// `read(2)`), DAX and submounts (virtio-fs only), and io_uring unless the
/// session selected the io_uring transport (`negotiate` is told so).
pub const SUPPORTED: InitFlags = InitFlags::all()
    .difference(InitFlags::FILE_OPS)
    .difference(InitFlags::INIT_RESERVED)
    .difference(InitFlags::SPLICE_WRITE)
    .difference(InitFlags::SPLICE_MOVE)
    .difference(InitFlags::SPLICE_READ)
    .difference(InitFlags::MAP_ALIGNMENT)
    .difference(InitFlags::SUBMOUNTS)
    .difference(InitFlags::HAS_INODE_DAX)
    .difference(InitFlags::OVER_IO_URING);

/// Defines a set of INIT flags from a list of flags, each with why it is
/// in the set, and lists them in the set's documentation: the constant and
/// its documented list come from the same tokens, so they cannot disagree.
macro_rules! init_flag_set {
    ($(#[$doc:meta])* pub const $name:ident = { $($flag:ident: $why:literal,)+ }) => {
        $(#[$doc])*
        ///
        /// The flags:
        $(#[doc = concat!("- [`", stringify!($flag), "`](InitFlags::", stringify!($flag), "): ", $why)])+
        pub const $name: InitFlags = InitFlags::empty()$(.union(InitFlags::$flag))+;
    };
}

init_flag_set! {
    /// Flags wanted unless the filesystem says otherwise: safe for any
    /// filesystem served by this library, and none of them changes which
    /// requests a [`crate::Filesystem`] method receives or what they carry.
    ///
    /// Flags that do are left for the filesystem to ask for, e.g.
    /// `ATOMIC_O_TRUNC` (O_TRUNC comes in OPEN instead of a SETATTR of size
    /// 0), `DO_READDIRPLUS` (READDIRPLUS instead of READDIR),
    /// `WRITEBACK_CACHE` (writes come later from the page cache, `O_WRONLY`
    /// opens as `O_RDWR`), `POSIX_LOCKS`/`FLOCK_LOCKS` (lock requests),
    /// `DONT_MASK` (the umask is not applied to create modes),
    /// `HANDLE_KILLPRIV_V2` (the filesystem clears set-ID bits). A flag is
    /// granted only if the kernel offers it too ([`Negotiated::refused`]
    /// says why one was not).
    pub const DEFAULT_WANTED = {
        ASYNC_READ: "the kernel may have several READs of a file in flight (read-ahead does not wait for each).",
        BIG_WRITES: "WRITEs of more than 4 KiB, up to `max_write`.",
        AUTO_INVAL_DATA: "the kernel drops a file's cached pages when fresh attributes show its mtime or size changed.",
        ASYNC_DIO: "direct I/O may be split into requests in flight at once.",
        PARALLEL_DIROPS: "LOOKUPs and READDIRs of one directory may run at once.",
        MAX_PAGES: "requests as large as `max_write` (up to 1 MiB) rather than 32 pages.",
        INIT_EXT: "the second word of flags (`flags2`) is exchanged.",
        SETXATTR_EXT: "SETXATTR in its extended form (with `setxattr_flags`).",
        DIRECT_IO_ALLOW_MMAP: "a file opened `DIRECT_IO` may still be mapped shared (through the page cache; the kernel refuses `MAP_SHARED` on it otherwise), so that an `O_DIRECT` descriptor the session answers `DIRECT_IO` ([`Negotiated::o_direct_flags`]) maps as before.",
        HAS_EXPIRE_ONLY: "informational: the kernel can expire a cached name without dropping it.",
        HAS_RESEND: "informational: the kernel can resend the requests in flight (NOTIFY_RESEND).",
    }
}

/// Flags that only tell the filesystem what the kernel can do; echoing them
/// changes nothing, so they are reported as offered, not refused.
const INFORMATIONAL: InitFlags = InitFlags::HAS_EXPIRE_ONLY.union(InitFlags::HAS_RESEND);

/// Default and largest `max_write`: 1 MiB (256 pages, the kernel's default
/// `max_pages_limit`).
pub const DEFAULT_MAX_WRITE: u32 = 1 << 20;
const PAGE: u32 = 4096;

/// What the filesystem sees and sets during INIT.
#[derive(Clone, Debug)]
pub struct InitConfig {
    kernel_minor: u32,
    offered: InitFlags,
    kernel_max_readahead: u32,
    /// Capabilities the filesystem wants (starts at [`DEFAULT_WANTED`]).
    pub wanted: InitFlags,
    /// Largest WRITE payload (at least 4096; at most 1 MiB here).
    pub max_write: u32,
    /// Read-ahead limit (at most what the kernel offered).
    pub max_readahead: u32,
    /// Background requests the kernel may queue (0: kernel default).
    pub max_background: u16,
    /// Background queue length at which the kernel reports congestion (0: default).
    pub congestion_threshold: u16,
    /// Timestamp granularity in nanoseconds (1 … 10⁹; 0: kernel default).
    pub time_gran: u32,
    /// Stack depth for passthrough (1 or 2; needed for `PASSTHROUGH`).
    pub max_stack_depth: u32,
    /// Seconds after which the kernel aborts a request (needs `REQUEST_TIMEOUT`; 0: none).
    pub request_timeout: u16,
    /// Whether the mount uses `default_permissions` (needed for `ALLOW_IDMAP`).
    pub default_permissions: bool,
}

impl InitConfig {
    pub(crate) fn new(init: &InitIn) -> Self {
        let offered = if init.minor >= 36 && init.flags & InitFlags::INIT_EXT.bits() as u32 != 0 {
            InitFlags::from_halves(init.flags, init.flags2)
        } else {
            InitFlags::from_halves(init.flags, 0)
        };
        Self {
            kernel_minor: init.minor,
            offered,
            kernel_max_readahead: init.max_readahead,
            wanted: DEFAULT_WANTED,
            max_write: DEFAULT_MAX_WRITE,
            max_readahead: init.max_readahead,
            max_background: 0,
            congestion_threshold: 0,
            time_gran: 1,
            max_stack_depth: 0,
            request_timeout: 0,
            default_permissions: false,
        }
    }

    /// The kernel's protocol minor.
    pub fn kernel_minor(&self) -> u32 {
        self.kernel_minor
    }

    /// What the kernel offered.
    pub fn offered(&self) -> InitFlags {
        self.offered
    }

    /// Adds `flags` to the wanted set.
    pub fn want(&mut self, flags: InitFlags) -> &mut Self {
        self.wanted |= flags;
        self
    }

    /// Removes `flags` from the wanted set.
    pub fn unwant(&mut self, flags: InitFlags) -> &mut Self {
        self.wanted -= flags;
        self
    }
}

/// Why a wanted capability was not granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The kernel did not offer it.
    NotOffered,
    /// This library does not implement it.
    Unsupported,
    /// `PASSTHROUGH` needs `max_stack_depth` 1 or 2.
    NeedsStackDepth,
    /// `PASSTHROUGH` and `WRITEBACK_CACHE` exclude each other.
    WritebackConflict,
    /// `ALLOW_IDMAP` needs the `default_permissions` mount option.
    NeedsDefaultPermissions,
    /// `INIT_EXT` is required for flags above bit 31.
    NeedsInitExt,
    /// The atomic-open extension's `FOPEN_FILE_CREATED` is `FOPEN_PASSTHROUGH`'s bit.
    AtomicOpenConflict,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::NotOffered => "the kernel did not offer it",
            Refusal::Unsupported => "fuse-wire does not implement it",
            Refusal::NeedsStackDepth => "passthrough needs max_stack_depth 1 or 2",
            Refusal::WritebackConflict => "passthrough cannot be combined with the writeback cache",
            Refusal::NeedsDefaultPermissions => "idmapped mounts need default_permissions",
            Refusal::NeedsInitExt => "flags above bit 31 need INIT_EXT, which the kernel did not offer",
            Refusal::AtomicOpenConflict => {
                "passthrough cannot be used with the atomic-open extension (FOPEN bit 7 means both)"
            }
        })
    }
}

/// The outcome of INIT, readable for the session's life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// The protocol minor in use: min(kernel's, ours).
    pub minor: u32,
    /// The kernel's own minor.
    pub kernel_minor: u32,
    /// What the kernel offered.
    pub offered: InitFlags,
    /// What was granted (and sent in the reply).
    pub flags: InitFlags,
    /// Wanted but not granted, with the reason for each flag.
    pub refused: Vec<(InitFlags, Refusal)>,
    /// Largest WRITE payload.
    pub max_write: u32,
    /// Pages per request (0 when `MAX_PAGES` is not granted).
    pub max_pages: u16,
    /// Read-ahead limit.
    pub max_readahead: u32,
    /// Background request limit (0: kernel default).
    pub max_background: u16,
    /// Congestion threshold (0: kernel default).
    pub congestion_threshold: u16,
    /// Timestamp granularity (ns).
    pub time_gran: u32,
    /// Passthrough stack depth (0 unless `PASSTHROUGH` is granted).
    pub max_stack_depth: u32,
    /// Request timeout in seconds (0 unless `REQUEST_TIMEOUT` is granted).
    pub request_timeout: u16,
    /// Whether the kernel checks permissions itself (the mount's
    /// `default_permissions`, as the filesystem's `init` or the session's
    /// mount options said).
    pub default_permissions: bool,
}

impl Negotiated {
    /// The receive buffer every worker needs: room for a WRITE of `max_write`
    /// plus headers, and at least the kernel's minimum.
    pub fn buffer_size(&self) -> usize {
        (self.max_write as usize + PAGE as usize).max(fuse_proto::consts::MIN_READ_BUFFER)
    }

    /// The open-reply flags that let `O_DIRECT` callers of one file write
    /// at once: `DIRECT_IO | PARALLEL_DIRECT_WRITES` from 7.38 on when
    /// `DIRECT_IO_ALLOW_MMAP` and `HANDLE_KILLPRIV_V2` were granted, nothing
    /// otherwise. The kernel takes the inode lock shared for non-extending
    /// writes only on files opened with both; on an `O_DIRECT` descriptor
    /// without `DIRECT_IO` every write takes it exclusively. Without
    /// `DIRECT_IO_ALLOW_MMAP` a `DIRECT_IO` descriptor could no longer be
    /// mapped shared. And a `DIRECT_IO` write does not clear set-user-ID
    /// and set-group-ID bits in the kernel, as a write through the page
    /// cache does (by a SETATTR): it only flags the WRITE
    /// (`WriteFlags::KILL_SUIDGID`) for the filesystem to clear them, which
    /// a filesystem promises by asking for `HANDLE_KILLPRIV_V2`.
    ///
    /// The session adds these to the answer of every `O_DIRECT` OPEN,
    /// CREATE and TMPFILE that is not passed through
    /// ([`crate::SessionConfig::o_direct_parallel_writes`]); a filesystem
    /// that turned that off can still add them to the opens it chooses.
    ///
    /// ```
    /// # fn doc(ctx: &fuse_session::RequestContext<'_>) {
    /// use fuse_session::proto::flags::FopenFlags;
    /// let f = ctx.negotiated().o_direct_flags();
    /// assert!(f.is_empty() || f == FopenFlags::DIRECT_IO | FopenFlags::PARALLEL_DIRECT_WRITES);
    /// # }
    /// ```
    pub fn o_direct_flags(&self) -> FopenFlags {
        if fuse_proto::version::has_parallel_direct_writes(self.minor)
            && self.flags.contains(InitFlags::DIRECT_IO_ALLOW_MMAP)
            && self.flags.contains(InitFlags::HANDLE_KILLPRIV_V2)
        {
            FopenFlags::DIRECT_IO | FopenFlags::PARALLEL_DIRECT_WRITES
        } else {
            FopenFlags::empty()
        }
    }
}

/// What the session does with a kernel's INIT.
pub(crate) enum InitOutcome {
    /// The kernel speaks a newer major: answer with our major only and wait
    /// for another INIT.
    NewerMajor(InitOut),
    /// Unsupported (major older than 7, or minor older than 7.12).
    Reject(String),
}

/// First step: versions only.
pub(crate) fn check_version(init: &InitIn) -> Option<InitOutcome> {
    if init.major > KERNEL_VERSION {
        let out = InitOut {
            major: KERNEL_VERSION,
            minor: KERNEL_MINOR_VERSION,
            ..Default::default()
        };
        return Some(InitOutcome::NewerMajor(out));
    }
    if init.major < KERNEL_VERSION || init.minor < MIN_MINOR_VERSION {
        return Some(InitOutcome::Reject(format!(
            "kernel protocol {}.{} is older than the oldest supported, 7.{MIN_MINOR_VERSION}",
            init.major, init.minor
        )));
    }
    None
}

/// Second step: intersects what the filesystem asked for in `cfg`.
pub(crate) fn negotiate(cfg: &InitConfig, uring: bool, atomic_open: bool) -> (Negotiated, InitOut) {
    let minor = cfg.kernel_minor.min(KERNEL_MINOR_VERSION);
    let supported = if uring {
        SUPPORTED | InitFlags::OVER_IO_URING
    } else {
        SUPPORTED
    };
    let mut refused = Vec::new();
    let mut granted = InitFlags::empty();
    for f in cfg.wanted.iter() {
        let why = if !cfg.offered.contains(f) {
            Some(Refusal::NotOffered)
        } else if !supported.contains(f) {
            Some(Refusal::Unsupported)
        } else {
            None
        };
        match why {
            Some(r) if !INFORMATIONAL.contains(f) => refused.push((f, r)),
            Some(_) => {}
            None => granted |= f,
        }
    }
    if granted.contains(InitFlags::PASSTHROUGH) {
        let why = if !(1..=2).contains(&cfg.max_stack_depth) {
            Some(Refusal::NeedsStackDepth)
        } else if granted.contains(InitFlags::WRITEBACK_CACHE) {
            Some(Refusal::WritebackConflict)
        } else if atomic_open {
            Some(Refusal::AtomicOpenConflict)
        } else {
            None
        };
        if let Some(r) = why {
            granted -= InitFlags::PASSTHROUGH;
            refused.push((InitFlags::PASSTHROUGH, r));
        }
    }
    if granted.contains(InitFlags::ALLOW_IDMAP) && !cfg.default_permissions {
        granted -= InitFlags::ALLOW_IDMAP;
        refused.push((InitFlags::ALLOW_IDMAP, Refusal::NeedsDefaultPermissions));
    }
    let high = InitFlags::from_bits_retain(granted.bits() & !0xffff_ffff);
    if !high.is_empty() && !granted.contains(InitFlags::INIT_EXT) {
        for f in high.iter() {
            refused.push((f, Refusal::NeedsInitExt));
        }
        granted -= high;
    }
    if granted.bits() >> 32 == 0 && !cfg.offered.contains(InitFlags::INIT_EXT) {
        granted -= InitFlags::INIT_EXT;
    }
    for (f, r) in &refused {
        log::warn!("INIT: not granting {f:?}: {r}");
    }

    let max_pages_on = granted.contains(InitFlags::MAX_PAGES);
    let limit = if max_pages_on {
        DEFAULT_MAX_WRITE
    } else {
        32 * PAGE
    };
    let max_write = cfg.max_write.clamp(PAGE, limit);
    let max_pages = if max_pages_on {
        max_write.div_ceil(PAGE) as u16
    } else {
        0
    };
    let max_readahead = cfg.max_readahead.min(cfg.kernel_max_readahead);
    let max_stack_depth = if granted.contains(InitFlags::PASSTHROUGH) {
        cfg.max_stack_depth
    } else {
        0
    };
    let request_timeout = if granted.contains(InitFlags::REQUEST_TIMEOUT) {
        cfg.request_timeout
    } else {
        0
    };
    let time_gran = if (1..=1_000_000_000).contains(&cfg.time_gran) {
        cfg.time_gran
    } else {
        1
    };
    let (flags, flags2) = granted.halves();
    let out = InitOut {
        major: KERNEL_VERSION,
        minor: KERNEL_MINOR_VERSION,
        max_readahead,
        flags,
        max_background: cfg.max_background,
        congestion_threshold: cfg.congestion_threshold,
        max_write,
        time_gran,
        max_pages,
        map_alignment: 0,
        flags2,
        max_stack_depth,
        request_timeout,
        unused: [0; 11],
    };
    let n = Negotiated {
        minor,
        kernel_minor: cfg.kernel_minor,
        offered: cfg.offered,
        flags: granted,
        refused,
        max_write,
        max_pages,
        max_readahead,
        max_background: cfg.max_background,
        congestion_threshold: cfg.congestion_threshold,
        time_gran,
        max_stack_depth,
        request_timeout,
        default_permissions: cfg.default_permissions,
    };
    (n, out)
}
