//! [`Errno`]: the error number a reply carries, with every Linux name.
//!
//! The named constants are the complete set of `include/uapi/asm-generic/errno*.h`
//! (1 … 133) plus the C library's aliases; any other number the kernel accepts
//! in a reply (`1..=511`) can be made with [`Errno::new`]. `Display` prints
//! the symbolic name and the C library's message, e.g. `ENOENT (No such file
//! or directory)`. With the `std` feature an `Errno` is a
//! `std::error::Error` and converts from and to `std::io::Error`.

use crate::reply::EncodeError;

/// A positive errno the kernel accepts in a reply (`1..=511`).
///
/// ```
/// use fuse_proto::Errno;
///
/// assert_eq!(Errno::ENOENT.to_string(), "ENOENT (No such file or directory)");
/// assert_eq!(Errno::new(2), Ok(Errno::ENOENT));
/// assert_eq!(Errno::EWOULDBLOCK, Errno::EAGAIN);
/// # #[cfg(feature = "std")] {
/// let io = std::io::Error::from_raw_os_error(13);
/// assert_eq!(Errno::from(io), Errno::EACCES);
/// assert_eq!(std::io::Error::from(Errno::EACCES).raw_os_error(), Some(13));
/// # }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Errno(i32);

impl Errno {
    /// Accepts `1..=511`.
    pub const fn new(errno: i32) -> Result<Self, EncodeError> {
        if errno >= 1 && errno <= 511 {
            Ok(Errno(errno))
        } else {
            Err(EncodeError::InvalidErrno(errno))
        }
    }

    /// Like [`Errno::new`], but maps anything out of range to `EIO`.
    pub const fn new_or_eio(errno: i32) -> Self {
        match Self::new(errno) {
            Ok(e) => e,
            Err(_) => Errno::EIO,
        }
    }

    /// The positive value.
    pub const fn get(self) -> i32 {
        self.0
    }

    /// The symbolic name (`"ENOENT"`), or `None` for a number Linux does not name.
    pub const fn name(self) -> Option<&'static str> {
        match self.entry() {
            Some((name, _)) => Some(name),
            None => None,
        }
    }

    /// The C library's message (`"No such file or directory"`), or `None`
    /// for a number Linux does not name.
    pub const fn message(self) -> Option<&'static str> {
        match self.entry() {
            Some((_, msg)) => Some(msg),
            None => None,
        }
    }

    const fn entry(self) -> Option<(&'static str, &'static str)> {
        let i = self.0 as usize;
        if i < TABLE.len() && !TABLE[i].0.is_empty() {
            Some(TABLE[i])
        } else {
            None
        }
    }
}

impl core::fmt::Display for Errno {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.entry() {
            Some((name, msg)) => write!(f, "{name} ({msg})"),
            None => write!(f, "errno {}", self.0),
        }
    }
}

impl core::fmt::Debug for Errno {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "Errno({})", self.0),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Errno {}

/// The error's OS error number, or `EIO` when it carries none (or one the
/// kernel would not accept in a reply).
#[cfg(feature = "std")]
impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Self {
        Errno::from(&e)
    }
}

#[cfg(feature = "std")]
impl From<&std::io::Error> for Errno {
    fn from(e: &std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(n) => Errno::new_or_eio(n),
            None => Errno::EIO,
        }
    }
}

#[cfg(feature = "std")]
impl From<std::io::ErrorKind> for Errno {
    fn from(kind: std::io::ErrorKind) -> Self {
        use std::io::ErrorKind as K;
        match kind {
            K::NotFound => Errno::ENOENT,
            K::PermissionDenied => Errno::EACCES,
            K::AlreadyExists => Errno::EEXIST,
            K::WouldBlock => Errno::EAGAIN,
            K::InvalidInput | K::InvalidData => Errno::EINVAL,
            K::Interrupted => Errno::EINTR,
            K::Unsupported => Errno::EOPNOTSUPP,
            K::OutOfMemory => Errno::ENOMEM,
            K::TimedOut => Errno::ETIMEDOUT,
            K::WriteZero | K::UnexpectedEof => Errno::EIO,
            _ => Errno::EIO,
        }
    }
}

#[cfg(feature = "std")]
impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> Self {
        std::io::Error::from_raw_os_error(e.0)
    }
}

impl Errno {
    /// `EPERM` (1): Operation not permitted.
    pub const EPERM: Errno = Errno(1);
    /// `ENOENT` (2): No such file or directory.
    pub const ENOENT: Errno = Errno(2);
    /// `ESRCH` (3): No such process.
    pub const ESRCH: Errno = Errno(3);
    /// `EINTR` (4): Interrupted system call.
    pub const EINTR: Errno = Errno(4);
    /// `EIO` (5): Input/output error.
    pub const EIO: Errno = Errno(5);
    /// `ENXIO` (6): No such device or address.
    pub const ENXIO: Errno = Errno(6);
    /// `E2BIG` (7): Argument list too long.
    pub const E2BIG: Errno = Errno(7);
    /// `ENOEXEC` (8): Exec format error.
    pub const ENOEXEC: Errno = Errno(8);
    /// `EBADF` (9): Bad file descriptor.
    pub const EBADF: Errno = Errno(9);
    /// `ECHILD` (10): No child processes.
    pub const ECHILD: Errno = Errno(10);
    /// `EAGAIN` (11): Resource temporarily unavailable.
    pub const EAGAIN: Errno = Errno(11);
    /// `ENOMEM` (12): Cannot allocate memory.
    pub const ENOMEM: Errno = Errno(12);
    /// `EACCES` (13): Permission denied.
    pub const EACCES: Errno = Errno(13);
    /// `EFAULT` (14): Bad address.
    pub const EFAULT: Errno = Errno(14);
    /// `ENOTBLK` (15): Block device required.
    pub const ENOTBLK: Errno = Errno(15);
    /// `EBUSY` (16): Device or resource busy.
    pub const EBUSY: Errno = Errno(16);
    /// `EEXIST` (17): File exists.
    pub const EEXIST: Errno = Errno(17);
    /// `EXDEV` (18): Invalid cross-device link.
    pub const EXDEV: Errno = Errno(18);
    /// `ENODEV` (19): No such device.
    pub const ENODEV: Errno = Errno(19);
    /// `ENOTDIR` (20): Not a directory.
    pub const ENOTDIR: Errno = Errno(20);
    /// `EISDIR` (21): Is a directory.
    pub const EISDIR: Errno = Errno(21);
    /// `EINVAL` (22): Invalid argument.
    pub const EINVAL: Errno = Errno(22);
    /// `ENFILE` (23): Too many open files in system.
    pub const ENFILE: Errno = Errno(23);
    /// `EMFILE` (24): Too many open files.
    pub const EMFILE: Errno = Errno(24);
    /// `ENOTTY` (25): Inappropriate ioctl for device.
    pub const ENOTTY: Errno = Errno(25);
    /// `ETXTBSY` (26): Text file busy.
    pub const ETXTBSY: Errno = Errno(26);
    /// `EFBIG` (27): File too large.
    pub const EFBIG: Errno = Errno(27);
    /// `ENOSPC` (28): No space left on device.
    pub const ENOSPC: Errno = Errno(28);
    /// `ESPIPE` (29): Illegal seek.
    pub const ESPIPE: Errno = Errno(29);
    /// `EROFS` (30): Read-only file system.
    pub const EROFS: Errno = Errno(30);
    /// `EMLINK` (31): Too many links.
    pub const EMLINK: Errno = Errno(31);
    /// `EPIPE` (32): Broken pipe.
    pub const EPIPE: Errno = Errno(32);
    /// `EDOM` (33): Numerical argument out of domain.
    pub const EDOM: Errno = Errno(33);
    /// `ERANGE` (34): Numerical result out of range.
    pub const ERANGE: Errno = Errno(34);
    /// `EDEADLK` (35): Resource deadlock avoided.
    pub const EDEADLK: Errno = Errno(35);
    /// `ENAMETOOLONG` (36): File name too long.
    pub const ENAMETOOLONG: Errno = Errno(36);
    /// `ENOLCK` (37): No locks available.
    pub const ENOLCK: Errno = Errno(37);
    /// `ENOSYS` (38): Function not implemented.
    pub const ENOSYS: Errno = Errno(38);
    /// `ENOTEMPTY` (39): Directory not empty.
    pub const ENOTEMPTY: Errno = Errno(39);
    /// `ELOOP` (40): Too many levels of symbolic links.
    pub const ELOOP: Errno = Errno(40);
    /// `ENOMSG` (42): No message of desired type.
    pub const ENOMSG: Errno = Errno(42);
    /// `EIDRM` (43): Identifier removed.
    pub const EIDRM: Errno = Errno(43);
    /// `ECHRNG` (44): Channel number out of range.
    pub const ECHRNG: Errno = Errno(44);
    /// `EL2NSYNC` (45): Level 2 not synchronized.
    pub const EL2NSYNC: Errno = Errno(45);
    /// `EL3HLT` (46): Level 3 halted.
    pub const EL3HLT: Errno = Errno(46);
    /// `EL3RST` (47): Level 3 reset.
    pub const EL3RST: Errno = Errno(47);
    /// `ELNRNG` (48): Link number out of range.
    pub const ELNRNG: Errno = Errno(48);
    /// `EUNATCH` (49): Protocol driver not attached.
    pub const EUNATCH: Errno = Errno(49);
    /// `ENOCSI` (50): No CSI structure available.
    pub const ENOCSI: Errno = Errno(50);
    /// `EL2HLT` (51): Level 2 halted.
    pub const EL2HLT: Errno = Errno(51);
    /// `EBADE` (52): Invalid exchange.
    pub const EBADE: Errno = Errno(52);
    /// `EBADR` (53): Invalid request descriptor.
    pub const EBADR: Errno = Errno(53);
    /// `EXFULL` (54): Exchange full.
    pub const EXFULL: Errno = Errno(54);
    /// `ENOANO` (55): No anode.
    pub const ENOANO: Errno = Errno(55);
    /// `EBADRQC` (56): Invalid request code.
    pub const EBADRQC: Errno = Errno(56);
    /// `EBADSLT` (57): Invalid slot.
    pub const EBADSLT: Errno = Errno(57);
    /// `EBFONT` (59): Bad font file format.
    pub const EBFONT: Errno = Errno(59);
    /// `ENOSTR` (60): Device not a stream.
    pub const ENOSTR: Errno = Errno(60);
    /// `ENODATA` (61): No data available.
    pub const ENODATA: Errno = Errno(61);
    /// `ETIME` (62): Timer expired.
    pub const ETIME: Errno = Errno(62);
    /// `ENOSR` (63): Out of streams resources.
    pub const ENOSR: Errno = Errno(63);
    /// `ENONET` (64): Machine is not on the network.
    pub const ENONET: Errno = Errno(64);
    /// `ENOPKG` (65): Package not installed.
    pub const ENOPKG: Errno = Errno(65);
    /// `EREMOTE` (66): Object is remote.
    pub const EREMOTE: Errno = Errno(66);
    /// `ENOLINK` (67): Link has been severed.
    pub const ENOLINK: Errno = Errno(67);
    /// `EADV` (68): Advertise error.
    pub const EADV: Errno = Errno(68);
    /// `ESRMNT` (69): Srmount error.
    pub const ESRMNT: Errno = Errno(69);
    /// `ECOMM` (70): Communication error on send.
    pub const ECOMM: Errno = Errno(70);
    /// `EPROTO` (71): Protocol error.
    pub const EPROTO: Errno = Errno(71);
    /// `EMULTIHOP` (72): Multihop attempted.
    pub const EMULTIHOP: Errno = Errno(72);
    /// `EDOTDOT` (73): RFS specific error.
    pub const EDOTDOT: Errno = Errno(73);
    /// `EBADMSG` (74): Bad message.
    pub const EBADMSG: Errno = Errno(74);
    /// `EOVERFLOW` (75): Value too large for defined data type.
    pub const EOVERFLOW: Errno = Errno(75);
    /// `ENOTUNIQ` (76): Name not unique on network.
    pub const ENOTUNIQ: Errno = Errno(76);
    /// `EBADFD` (77): File descriptor in bad state.
    pub const EBADFD: Errno = Errno(77);
    /// `EREMCHG` (78): Remote address changed.
    pub const EREMCHG: Errno = Errno(78);
    /// `ELIBACC` (79): Can not access a needed shared library.
    pub const ELIBACC: Errno = Errno(79);
    /// `ELIBBAD` (80): Accessing a corrupted shared library.
    pub const ELIBBAD: Errno = Errno(80);
    /// `ELIBSCN` (81): .lib section in a.out corrupted.
    pub const ELIBSCN: Errno = Errno(81);
    /// `ELIBMAX` (82): Attempting to link in too many shared libraries.
    pub const ELIBMAX: Errno = Errno(82);
    /// `ELIBEXEC` (83): Cannot exec a shared library directly.
    pub const ELIBEXEC: Errno = Errno(83);
    /// `EILSEQ` (84): Invalid or incomplete multibyte or wide character.
    pub const EILSEQ: Errno = Errno(84);
    /// `ERESTART` (85): Interrupted system call should be restarted.
    pub const ERESTART: Errno = Errno(85);
    /// `ESTRPIPE` (86): Streams pipe error.
    pub const ESTRPIPE: Errno = Errno(86);
    /// `EUSERS` (87): Too many users.
    pub const EUSERS: Errno = Errno(87);
    /// `ENOTSOCK` (88): Socket operation on non-socket.
    pub const ENOTSOCK: Errno = Errno(88);
    /// `EDESTADDRREQ` (89): Destination address required.
    pub const EDESTADDRREQ: Errno = Errno(89);
    /// `EMSGSIZE` (90): Message too long.
    pub const EMSGSIZE: Errno = Errno(90);
    /// `EPROTOTYPE` (91): Protocol wrong type for socket.
    pub const EPROTOTYPE: Errno = Errno(91);
    /// `ENOPROTOOPT` (92): Protocol not available.
    pub const ENOPROTOOPT: Errno = Errno(92);
    /// `EPROTONOSUPPORT` (93): Protocol not supported.
    pub const EPROTONOSUPPORT: Errno = Errno(93);
    /// `ESOCKTNOSUPPORT` (94): Socket type not supported.
    pub const ESOCKTNOSUPPORT: Errno = Errno(94);
    /// `EOPNOTSUPP` (95): Operation not supported.
    pub const EOPNOTSUPP: Errno = Errno(95);
    /// `EPFNOSUPPORT` (96): Protocol family not supported.
    pub const EPFNOSUPPORT: Errno = Errno(96);
    /// `EAFNOSUPPORT` (97): Address family not supported by protocol.
    pub const EAFNOSUPPORT: Errno = Errno(97);
    /// `EADDRINUSE` (98): Address already in use.
    pub const EADDRINUSE: Errno = Errno(98);
    /// `EADDRNOTAVAIL` (99): Cannot assign requested address.
    pub const EADDRNOTAVAIL: Errno = Errno(99);
    /// `ENETDOWN` (100): Network is down.
    pub const ENETDOWN: Errno = Errno(100);
    /// `ENETUNREACH` (101): Network is unreachable.
    pub const ENETUNREACH: Errno = Errno(101);
    /// `ENETRESET` (102): Network dropped connection on reset.
    pub const ENETRESET: Errno = Errno(102);
    /// `ECONNABORTED` (103): Software caused connection abort.
    pub const ECONNABORTED: Errno = Errno(103);
    /// `ECONNRESET` (104): Connection reset by peer.
    pub const ECONNRESET: Errno = Errno(104);
    /// `ENOBUFS` (105): No buffer space available.
    pub const ENOBUFS: Errno = Errno(105);
    /// `EISCONN` (106): Transport endpoint is already connected.
    pub const EISCONN: Errno = Errno(106);
    /// `ENOTCONN` (107): Transport endpoint is not connected.
    pub const ENOTCONN: Errno = Errno(107);
    /// `ESHUTDOWN` (108): Cannot send after transport endpoint shutdown.
    pub const ESHUTDOWN: Errno = Errno(108);
    /// `ETOOMANYREFS` (109): Too many references: cannot splice.
    pub const ETOOMANYREFS: Errno = Errno(109);
    /// `ETIMEDOUT` (110): Connection timed out.
    pub const ETIMEDOUT: Errno = Errno(110);
    /// `ECONNREFUSED` (111): Connection refused.
    pub const ECONNREFUSED: Errno = Errno(111);
    /// `EHOSTDOWN` (112): Host is down.
    pub const EHOSTDOWN: Errno = Errno(112);
    /// `EHOSTUNREACH` (113): No route to host.
    pub const EHOSTUNREACH: Errno = Errno(113);
    /// `EALREADY` (114): Operation already in progress.
    pub const EALREADY: Errno = Errno(114);
    /// `EINPROGRESS` (115): Operation now in progress.
    pub const EINPROGRESS: Errno = Errno(115);
    /// `ESTALE` (116): Stale file handle.
    pub const ESTALE: Errno = Errno(116);
    /// `EUCLEAN` (117): Structure needs cleaning.
    pub const EUCLEAN: Errno = Errno(117);
    /// `ENOTNAM` (118): Not a XENIX named type file.
    pub const ENOTNAM: Errno = Errno(118);
    /// `ENAVAIL` (119): No XENIX semaphores available.
    pub const ENAVAIL: Errno = Errno(119);
    /// `EISNAM` (120): Is a named type file.
    pub const EISNAM: Errno = Errno(120);
    /// `EREMOTEIO` (121): Remote I/O error.
    pub const EREMOTEIO: Errno = Errno(121);
    /// `EDQUOT` (122): Disk quota exceeded.
    pub const EDQUOT: Errno = Errno(122);
    /// `ENOMEDIUM` (123): No medium found.
    pub const ENOMEDIUM: Errno = Errno(123);
    /// `EMEDIUMTYPE` (124): Wrong medium type.
    pub const EMEDIUMTYPE: Errno = Errno(124);
    /// `ECANCELED` (125): Operation canceled.
    pub const ECANCELED: Errno = Errno(125);
    /// `ENOKEY` (126): Required key not available.
    pub const ENOKEY: Errno = Errno(126);
    /// `EKEYEXPIRED` (127): Key has expired.
    pub const EKEYEXPIRED: Errno = Errno(127);
    /// `EKEYREVOKED` (128): Key has been revoked.
    pub const EKEYREVOKED: Errno = Errno(128);
    /// `EKEYREJECTED` (129): Key was rejected by service.
    pub const EKEYREJECTED: Errno = Errno(129);
    /// `EOWNERDEAD` (130): Owner died.
    pub const EOWNERDEAD: Errno = Errno(130);
    /// `ENOTRECOVERABLE` (131): State not recoverable.
    pub const ENOTRECOVERABLE: Errno = Errno(131);
    /// `ERFKILL` (132): Operation not possible due to RF-kill.
    pub const ERFKILL: Errno = Errno(132);
    /// `EHWPOISON` (133): Memory page has hardware error.
    pub const EHWPOISON: Errno = Errno(133);
    /// `ENOTSUP` (C library name), the same number as [`Errno::EOPNOTSUPP`].
    pub const ENOTSUP: Errno = Errno::EOPNOTSUPP;
    /// `EWOULDBLOCK`, the same number as [`Errno::EAGAIN`].
    pub const EWOULDBLOCK: Errno = Errno::EAGAIN;
    /// `EDEADLOCK`, the same number as [`Errno::EDEADLK`].
    pub const EDEADLOCK: Errno = Errno::EDEADLK;
}

/// Name and message of every errno with a Linux name, by number.
const TABLE: [(&str, &str); 134] = [
    ("", ""),
    ("EPERM", "Operation not permitted"),
    ("ENOENT", "No such file or directory"),
    ("ESRCH", "No such process"),
    ("EINTR", "Interrupted system call"),
    ("EIO", "Input/output error"),
    ("ENXIO", "No such device or address"),
    ("E2BIG", "Argument list too long"),
    ("ENOEXEC", "Exec format error"),
    ("EBADF", "Bad file descriptor"),
    ("ECHILD", "No child processes"),
    ("EAGAIN", "Resource temporarily unavailable"),
    ("ENOMEM", "Cannot allocate memory"),
    ("EACCES", "Permission denied"),
    ("EFAULT", "Bad address"),
    ("ENOTBLK", "Block device required"),
    ("EBUSY", "Device or resource busy"),
    ("EEXIST", "File exists"),
    ("EXDEV", "Invalid cross-device link"),
    ("ENODEV", "No such device"),
    ("ENOTDIR", "Not a directory"),
    ("EISDIR", "Is a directory"),
    ("EINVAL", "Invalid argument"),
    ("ENFILE", "Too many open files in system"),
    ("EMFILE", "Too many open files"),
    ("ENOTTY", "Inappropriate ioctl for device"),
    ("ETXTBSY", "Text file busy"),
    ("EFBIG", "File too large"),
    ("ENOSPC", "No space left on device"),
    ("ESPIPE", "Illegal seek"),
    ("EROFS", "Read-only file system"),
    ("EMLINK", "Too many links"),
    ("EPIPE", "Broken pipe"),
    ("EDOM", "Numerical argument out of domain"),
    ("ERANGE", "Numerical result out of range"),
    ("EDEADLK", "Resource deadlock avoided"),
    ("ENAMETOOLONG", "File name too long"),
    ("ENOLCK", "No locks available"),
    ("ENOSYS", "Function not implemented"),
    ("ENOTEMPTY", "Directory not empty"),
    ("ELOOP", "Too many levels of symbolic links"),
    ("", ""),
    ("ENOMSG", "No message of desired type"),
    ("EIDRM", "Identifier removed"),
    ("ECHRNG", "Channel number out of range"),
    ("EL2NSYNC", "Level 2 not synchronized"),
    ("EL3HLT", "Level 3 halted"),
    ("EL3RST", "Level 3 reset"),
    ("ELNRNG", "Link number out of range"),
    ("EUNATCH", "Protocol driver not attached"),
    ("ENOCSI", "No CSI structure available"),
    ("EL2HLT", "Level 2 halted"),
    ("EBADE", "Invalid exchange"),
    ("EBADR", "Invalid request descriptor"),
    ("EXFULL", "Exchange full"),
    ("ENOANO", "No anode"),
    ("EBADRQC", "Invalid request code"),
    ("EBADSLT", "Invalid slot"),
    ("", ""),
    ("EBFONT", "Bad font file format"),
    ("ENOSTR", "Device not a stream"),
    ("ENODATA", "No data available"),
    ("ETIME", "Timer expired"),
    ("ENOSR", "Out of streams resources"),
    ("ENONET", "Machine is not on the network"),
    ("ENOPKG", "Package not installed"),
    ("EREMOTE", "Object is remote"),
    ("ENOLINK", "Link has been severed"),
    ("EADV", "Advertise error"),
    ("ESRMNT", "Srmount error"),
    ("ECOMM", "Communication error on send"),
    ("EPROTO", "Protocol error"),
    ("EMULTIHOP", "Multihop attempted"),
    ("EDOTDOT", "RFS specific error"),
    ("EBADMSG", "Bad message"),
    ("EOVERFLOW", "Value too large for defined data type"),
    ("ENOTUNIQ", "Name not unique on network"),
    ("EBADFD", "File descriptor in bad state"),
    ("EREMCHG", "Remote address changed"),
    ("ELIBACC", "Can not access a needed shared library"),
    ("ELIBBAD", "Accessing a corrupted shared library"),
    ("ELIBSCN", ".lib section in a.out corrupted"),
    ("ELIBMAX", "Attempting to link in too many shared libraries"),
    ("ELIBEXEC", "Cannot exec a shared library directly"),
    ("EILSEQ", "Invalid or incomplete multibyte or wide character"),
    ("ERESTART", "Interrupted system call should be restarted"),
    ("ESTRPIPE", "Streams pipe error"),
    ("EUSERS", "Too many users"),
    ("ENOTSOCK", "Socket operation on non-socket"),
    ("EDESTADDRREQ", "Destination address required"),
    ("EMSGSIZE", "Message too long"),
    ("EPROTOTYPE", "Protocol wrong type for socket"),
    ("ENOPROTOOPT", "Protocol not available"),
    ("EPROTONOSUPPORT", "Protocol not supported"),
    ("ESOCKTNOSUPPORT", "Socket type not supported"),
    ("EOPNOTSUPP", "Operation not supported"),
    ("EPFNOSUPPORT", "Protocol family not supported"),
    ("EAFNOSUPPORT", "Address family not supported by protocol"),
    ("EADDRINUSE", "Address already in use"),
    ("EADDRNOTAVAIL", "Cannot assign requested address"),
    ("ENETDOWN", "Network is down"),
    ("ENETUNREACH", "Network is unreachable"),
    ("ENETRESET", "Network dropped connection on reset"),
    ("ECONNABORTED", "Software caused connection abort"),
    ("ECONNRESET", "Connection reset by peer"),
    ("ENOBUFS", "No buffer space available"),
    ("EISCONN", "Transport endpoint is already connected"),
    ("ENOTCONN", "Transport endpoint is not connected"),
    ("ESHUTDOWN", "Cannot send after transport endpoint shutdown"),
    ("ETOOMANYREFS", "Too many references: cannot splice"),
    ("ETIMEDOUT", "Connection timed out"),
    ("ECONNREFUSED", "Connection refused"),
    ("EHOSTDOWN", "Host is down"),
    ("EHOSTUNREACH", "No route to host"),
    ("EALREADY", "Operation already in progress"),
    ("EINPROGRESS", "Operation now in progress"),
    ("ESTALE", "Stale file handle"),
    ("EUCLEAN", "Structure needs cleaning"),
    ("ENOTNAM", "Not a XENIX named type file"),
    ("ENAVAIL", "No XENIX semaphores available"),
    ("EISNAM", "Is a named type file"),
    ("EREMOTEIO", "Remote I/O error"),
    ("EDQUOT", "Disk quota exceeded"),
    ("ENOMEDIUM", "No medium found"),
    ("EMEDIUMTYPE", "Wrong medium type"),
    ("ECANCELED", "Operation canceled"),
    ("ENOKEY", "Required key not available"),
    ("EKEYEXPIRED", "Key has expired"),
    ("EKEYREVOKED", "Key has been revoked"),
    ("EKEYREJECTED", "Key was rejected by service"),
    ("EOWNERDEAD", "Owner died"),
    ("ENOTRECOVERABLE", "State not recoverable"),
    ("ERFKILL", "Operation not possible due to RF-kill"),
    ("EHWPOISON", "Memory page has hardware error"),
];
