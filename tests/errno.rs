//! `Errno` against the C library: every named constant has the number libc
//! gives it, its message is the C library's `strerror`, and it round-trips
//! through `std::io::Error`.

use fuse_wire::Errno;
use std::io;

#[test]
fn names_have_the_c_library_numbers() {
    let pairs = [
        (Errno::EPERM, libc::EPERM),
        (Errno::ENOENT, libc::ENOENT),
        (Errno::EIO, libc::EIO),
        (Errno::E2BIG, libc::E2BIG),
        (Errno::EAGAIN, libc::EAGAIN),
        (Errno::EWOULDBLOCK, libc::EWOULDBLOCK),
        (Errno::EACCES, libc::EACCES),
        (Errno::EXDEV, libc::EXDEV),
        (Errno::EROFS, libc::EROFS),
        (Errno::ENOSPC, libc::ENOSPC),
        (Errno::EFBIG, libc::EFBIG),
        (Errno::EDEADLK, libc::EDEADLK),
        (Errno::EDEADLOCK, libc::EDEADLOCK),
        (Errno::ENAMETOOLONG, libc::ENAMETOOLONG),
        (Errno::ENOLCK, libc::ENOLCK),
        (Errno::ENOSYS, libc::ENOSYS),
        (Errno::ELOOP, libc::ELOOP),
        (Errno::ENODATA, libc::ENODATA),
        (Errno::EOVERFLOW, libc::EOVERFLOW),
        (Errno::EOPNOTSUPP, libc::EOPNOTSUPP),
        (Errno::ENOTSUP, libc::ENOTSUP),
        (Errno::ETIMEDOUT, libc::ETIMEDOUT),
        (Errno::ESTALE, libc::ESTALE),
        (Errno::EDQUOT, libc::EDQUOT),
        (Errno::ECANCELED, libc::ECANCELED),
        (Errno::EOWNERDEAD, libc::EOWNERDEAD),
        (Errno::ERFKILL, libc::ERFKILL),
        (Errno::EHWPOISON, libc::EHWPOISON),
    ];
    for (e, n) in pairs {
        assert_eq!(e.get(), n, "{e:?}");
    }
}

#[test]
fn every_named_errno_has_the_c_library_message_and_round_trips() {
    let mut named = 0;
    for n in 1..=511 {
        let e = Errno::new(n).unwrap();
        let io = io::Error::from(e);
        assert_eq!(io.raw_os_error(), Some(n));
        assert_eq!(Errno::from(io), e, "round trip of {n}");
        let Some(name) = e.name() else {
            assert_eq!(e.to_string(), format!("errno {n}"));
            continue;
        };
        named += 1;
        let msg = e.message().unwrap();
        // std formats an OS error as "<strerror> (os error N)".
        let os = io::Error::from_raw_os_error(n).to_string();
        assert_eq!(os, format!("{msg} (os error {n})"), "message of {name}");
        assert_eq!(e.to_string(), format!("{name} ({msg})"));
    }
    assert_eq!(named, 131, "Linux names 1..=133 except 41 and 58");
}

#[test]
fn io_errors_without_an_os_error_become_eio_or_their_kind() {
    assert_eq!(Errno::from(io::Error::other("no errno")), Errno::EIO);
    assert_eq!(Errno::from(io::ErrorKind::NotFound), Errno::ENOENT);
    assert_eq!(Errno::from(io::Error::from_raw_os_error(0)), Errno::EIO);
    assert_eq!(Errno::from(io::Error::from_raw_os_error(4096)), Errno::EIO);
    let as_error: Box<dyn std::error::Error> = Box::new(Errno::ENOENT);
    assert_eq!(as_error.to_string(), "ENOENT (No such file or directory)");
}
