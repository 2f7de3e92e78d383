//! Mount options: the libfuse `-o` options this library understands, their
//! parsing and checking, and what they become for `mount(2)` (flags and the
//! data string) and for `fusermount3` (its `-o` list).

use super::error::MountError;
use nix::mount::MsFlags;
use std::os::fd::RawFd;

/// Default fsname (mount source) when neither `fsname` nor `subtype` is set.
pub const DEFAULT_FSNAME: &str = "fuse-wire";

/// Mount options: the standard libfuse `-o` options this library understands.
///
/// Build one with [`MountOptions::default`] and set fields, or parse a
/// comma-separated `-o` list with [`MountOptions::parse_opts`] /
/// [`MountOptions::parse_known`].
///
/// Like libfuse and `fusermount3`, the default is `nosuid,nodev`; the options
/// `suid` and `dev` clear them (`fusermount3` forces both for non-root users).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOptions {
    /// Mount source shown in `/proc/mounts` (`fsname=`); default: the subtype, or `fuse-wire`.
    pub fsname: Option<String>,
    /// Filesystem subtype (`subtype=`): the type becomes `fuse.<subtype>`.
    pub subtype: Option<String>,
    /// Let users other than the mounting one access the filesystem (`allow_other`).
    /// For `fusermount3`, needs `user_allow_other` in `/etc/fuse.conf`.
    pub allow_other: bool,
    /// Let the mounting user and root access the filesystem (`allow_root`).
    ///
    /// The kernel has no such option: the mount is made with `allow_other` and
    /// the session must refuse requests from other uids. Exclusive with `allow_other`.
    pub allow_root: bool,
    /// Let the kernel check permissions from the file modes (`default_permissions`).
    pub default_permissions: bool,
    /// Mount read-only (`ro`; `rw` clears it).
    pub read_only: bool,
    /// Ignore set-user/group-id bits (`nosuid`; `suid` clears it). Default: on.
    pub nosuid: bool,
    /// Do not interpret device files (`nodev`; `dev` clears it). Default: on.
    pub nodev: bool,
    /// Do not allow executing files (`noexec`; `exec` clears it).
    pub noexec: bool,
    /// Do not update access times (`noatime`; `atime` clears it).
    pub noatime: bool,
    /// Do not update directory access times (`nodiratime`; `diratime` clears it).
    pub nodiratime: bool,
    /// Synchronous writes (`sync`; `async` clears it).
    pub sync: bool,
    /// Synchronous directory changes (`dirsync`).
    pub dirsync: bool,
    /// Largest READ request the kernel sends (`max_read=`).
    pub max_read: Option<u32>,
    /// Block size of a `fuseblk` filesystem (`blksize=`); only valid with [`blkdev`](Self::blkdev).
    pub blksize: Option<u32>,
    /// Mount as `fuseblk`: the fsname must then be a block device (`blkdev`).
    pub blkdev: bool,
    /// Unmount when this process dies without unmounting (`auto_unmount`).
    ///
    /// [`Mount::new`](super::Mount::new) forks a small watchdog process that waits on a socket
    /// the [`MountGuard`](super::MountGuard) holds. When the guard has dealt with the mount it
    /// tells the watchdog, which exits. When the socket closes without that,
    /// this process died: the watchdog then unmounts **only if the topmost
    /// mount on the mountpoint is still ours** (same mount id as recorded
    /// right after mounting); a mount placed over ours, or a new mount after
    /// ours was unmounted, is left alone.
    ///
    /// As root the watchdog detaches exactly our mount
    /// (`umount2("/proc/self/fd/N", MNT_DETACH)` on an `O_PATH` fd of it),
    /// whatever the path resolves to meanwhile. A non-root user may not call
    /// `umount2`; the watchdog then runs `fusermount3 -u -z`, which
    /// unmounts whatever is topmost on the path, so between the watchdog's
    /// check and `fusermount3`'s own lookup (a fork and exec apart) a mount
    /// placed over ours would be detached in its place. That window cannot be
    /// closed without privileges: `fusermount3` takes only a path. (The
    /// `auto_unmount` of `fusermount3` itself is not used: it unmounts the
    /// path's topmost mount if it is any dead FUSE mount of our type.)
    ///
    /// The watchdog is a child process: it shows in `ps` as
    /// `fuse-wire-unmnt`, blocks all signals and runs in its own session.
    /// It writes one line to stderr when it acts. Unlike `fusermount3`'s
    /// helper it also works for non-root users without `allow_other` on
    /// libfuse before 3.15. See docs/security.md, "Unmounting only our own
    /// mount".
    pub auto_unmount: bool,
    /// Refuse to mount over a non-empty directory (`-o nonempty_check`). Off
    /// by default (FUSE and libfuse 3 allow it); without it, mounting over
    /// a non-empty directory is logged, since its entries are hidden while
    /// mounted.
    pub nonempty_check: bool,
    /// Mount even where something is mounted already (`-o stack`), on top
    /// of it, hiding it until this mount goes. Off by default: a second
    /// instance started on the same mountpoint is refused with
    /// [`MountError::AlreadyMounted`] instead of silently covering the
    /// first, whose files would vanish from view.
    pub stack: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            fsname: None,
            subtype: None,
            allow_other: false,
            allow_root: false,
            default_permissions: false,
            read_only: false,
            nosuid: true,
            nodev: true,
            noexec: false,
            noatime: false,
            nodiratime: false,
            sync: false,
            dirsync: false,
            max_read: None,
            blksize: None,
            blkdev: false,
            auto_unmount: false,
            nonempty_check: false,
            stack: false,
        }
    }
}

/// Options the library computes itself; given in an `-o` list they are refused.
const RESERVED: &[&str] = &["fd", "rootmode", "user_id", "group_id"];

impl MountOptions {
    /// Parses a libfuse-style `-o` list (`"ro,allow_other,fsname=x"`) on top
    /// of the defaults. Any option not listed in [`MountOptions::apply`] is an
    /// error naming it.
    pub fn parse_opts(opts: &str) -> Result<Self, MountError> {
        let mut o = Self::default();
        o.apply(opts)?;
        Ok(o)
    }

    /// Like [`MountOptions::parse_opts`], but returns the options it does not
    /// know instead of failing on them, in their order, for the caller to
    /// interpret. Known options with bad values are still errors.
    pub fn parse_known(opts: &str) -> Result<(Self, Vec<String>), MountError> {
        let mut o = Self::default();
        let rest = o.apply_known(opts)?;
        Ok((o, rest))
    }

    /// Applies a comma-separated `-o` list to `self`; later options win.
    ///
    /// Known: `fsname=`, `subtype=`, `allow_other`, `allow_root`,
    /// `default_permissions`, `ro`, `rw`, `nosuid`, `suid`, `nodev`, `dev`,
    /// `noexec`, `exec`, `noatime`, `atime`, `nodiratime`, `diratime`, `sync`,
    /// `async`, `dirsync`, `max_read=`, `blksize=`, `blkdev`, `auto_unmount`,
    /// `nonempty_check`, `stack` (the last two are the library's, not
    /// passed to the kernel).
    /// Empty items are ignored.
    pub fn apply(&mut self, opts: &str) -> Result<(), MountError> {
        match self.apply_known(opts)?.into_iter().next() {
            Some(unknown) => Err(MountError::UnknownOption(unknown)),
            None => Ok(()),
        }
    }

    fn apply_known(&mut self, opts: &str) -> Result<Vec<String>, MountError> {
        let mut unknown = Vec::new();
        for item in opts.split(',').filter(|s| !s.is_empty()) {
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            let flag = |v: Option<&str>| match v {
                None => Ok(true),
                Some(_) => Err(invalid(key, "takes no value")),
            };
            match key {
                "fsname" => self.fsname = Some(string_value(key, value)?),
                "subtype" => self.subtype = Some(string_value(key, value)?),
                "max_read" => self.max_read = Some(u32_value(key, value)?),
                "blksize" => self.blksize = Some(u32_value(key, value)?),
                "allow_other" => self.allow_other = flag(value)?,
                "allow_root" => self.allow_root = flag(value)?,
                "default_permissions" => self.default_permissions = flag(value)?,
                "ro" => self.read_only = flag(value)?,
                "rw" => self.read_only = !flag(value)?,
                "nosuid" => self.nosuid = flag(value)?,
                "suid" => self.nosuid = !flag(value)?,
                "nodev" => self.nodev = flag(value)?,
                "dev" => self.nodev = !flag(value)?,
                "noexec" => self.noexec = flag(value)?,
                "exec" => self.noexec = !flag(value)?,
                "noatime" => self.noatime = flag(value)?,
                "atime" => self.noatime = !flag(value)?,
                "nodiratime" => self.nodiratime = flag(value)?,
                "diratime" => self.nodiratime = !flag(value)?,
                "sync" => self.sync = flag(value)?,
                "async" => self.sync = !flag(value)?,
                "dirsync" => self.dirsync = flag(value)?,
                "blkdev" => self.blkdev = flag(value)?,
                "auto_unmount" => self.auto_unmount = flag(value)?,
                "nonempty_check" => self.nonempty_check = flag(value)?,
                "stack" => self.stack = flag(value)?,
                k if RESERVED.contains(&k) => {
                    return Err(invalid(k, "is computed by the library and cannot be given"));
                }
                _ => unknown.push(item.to_string()),
            }
        }
        Ok(unknown)
    }

    /// Checks values and combinations: no commas or NUL in values, a
    /// non-empty subtype without `.`, `allow_other`/`allow_root` exclusive,
    /// `blksize` only with `blkdev`, non-zero sizes.
    pub fn validate(&self) -> Result<(), MountError> {
        for (name, v) in [("fsname", &self.fsname), ("subtype", &self.subtype)] {
            if let Some(v) = v {
                check_value(name, v)?;
            }
        }
        if let Some(st) = &self.subtype
            && st.contains(['.', '/', ' '])
        {
            return Err(invalid("subtype", "must not contain '.', '/' or spaces"));
        }
        if self.allow_other && self.allow_root {
            return Err(invalid(
                "allow_root",
                "allow_other and allow_root are mutually exclusive",
            ));
        }
        if self.blksize.is_some() && !self.blkdev {
            return Err(invalid(
                "blksize",
                "only valid for block-device (fuseblk) mounts: set blkdev as well",
            ));
        }
        if let Some(b) = self.blksize
            && (b < 512 || !b.is_power_of_two())
        {
            return Err(invalid("blksize", "must be a power of two of at least 512"));
        }
        if self.max_read == Some(0) {
            return Err(invalid("max_read", "must be greater than 0"));
        }
        if self.blkdev && self.fsname.is_none() {
            return Err(invalid("blkdev", "needs fsname= naming the block device"));
        }
        Ok(())
    }

    /// The mount source: `fsname`, else the subtype, else [`DEFAULT_FSNAME`].
    pub fn source(&self) -> &str {
        self.fsname
            .as_deref()
            .or(self.subtype.as_deref())
            .unwrap_or(DEFAULT_FSNAME)
    }

    /// The filesystem type for `mount(2)`: `fuse`, `fuse.<subtype>`, `fuseblk`
    /// or `fuseblk.<subtype>`.
    pub fn fstype(&self) -> String {
        let base = if self.blkdev { "fuseblk" } else { "fuse" };
        match &self.subtype {
            Some(st) => format!("{base}.{st}"),
            None => base.to_string(),
        }
    }

    /// The `mount(2)` data string for a privileged mount:
    /// `fd=N,rootmode=<octal>,user_id=U,group_id=G` then, when set,
    /// `allow_other` (also for `allow_root`), `default_permissions`,
    /// `max_read=N`, `blksize=N`.
    pub fn kernel_data(&self, fd: RawFd, rootmode: u32, uid: u32, gid: u32) -> Result<String, MountError> {
        self.validate()?;
        let mut s = format!("fd={fd},rootmode={rootmode:o},user_id={uid},group_id={gid}");
        if self.allow_other || self.allow_root {
            s.push_str(",allow_other");
        }
        if self.default_permissions {
            s.push_str(",default_permissions");
        }
        if let Some(n) = self.max_read {
            s.push_str(&format!(",max_read={n}"));
        }
        if let Some(n) = self.blksize {
            s.push_str(&format!(",blksize={n}"));
        }
        Ok(s)
    }

    /// The `MS_*` flags for `mount(2)`.
    pub(super) fn ms_flags(&self) -> MsFlags {
        let mut f = MsFlags::empty();
        for (on, flag) in [
            (self.read_only, MsFlags::MS_RDONLY),
            (self.nosuid, MsFlags::MS_NOSUID),
            (self.nodev, MsFlags::MS_NODEV),
            (self.noexec, MsFlags::MS_NOEXEC),
            (self.noatime, MsFlags::MS_NOATIME),
            (self.nodiratime, MsFlags::MS_NODIRATIME),
            (self.sync, MsFlags::MS_SYNCHRONOUS),
            (self.dirsync, MsFlags::MS_DIRSYNC),
        ] {
            if on {
                f |= flag;
            }
        }
        f
    }

    /// The `-o` argument for `fusermount3` (which computes `fd`, `rootmode`,
    /// `user_id` and `group_id` itself): `rw` or `ro`, the set flags,
    /// `fsname=`, `subtype=`, `allow_other` (also for `allow_root`),
    /// `default_permissions`, `max_read=`, `blkdev`, `blksize=`, `auto_unmount`.
    pub fn fusermount_opts(&self) -> Result<String, MountError> {
        self.validate()?;
        let mut v: Vec<String> = vec![if self.read_only { "ro" } else { "rw" }.into()];
        for (on, name) in [
            (self.nosuid, "nosuid"),
            (self.nodev, "nodev"),
            (self.noexec, "noexec"),
            (self.noatime, "noatime"),
            (self.nodiratime, "nodiratime"),
            (self.sync, "sync"),
            (self.dirsync, "dirsync"),
        ] {
            if on {
                v.push(name.into());
            }
        }
        v.push(format!("fsname={}", self.source()));
        if let Some(st) = &self.subtype {
            v.push(format!("subtype={st}"));
        }
        if self.allow_other || self.allow_root {
            v.push("allow_other".into());
        }
        if self.default_permissions {
            v.push("default_permissions".into());
        }
        if let Some(n) = self.max_read {
            v.push(format!("max_read={n}"));
        }
        if self.blkdev {
            v.push("blkdev".into());
        }
        if let Some(n) = self.blksize {
            v.push(format!("blksize={n}"));
        }
        if self.auto_unmount {
            v.push("auto_unmount".into());
        }
        Ok(v.join(","))
    }
}

fn invalid(option: &str, reason: &str) -> MountError {
    MountError::InvalidOption {
        option: option.to_string(),
        reason: reason.to_string(),
    }
}

fn check_value(name: &str, v: &str) -> Result<(), MountError> {
    if v.is_empty() {
        return Err(invalid(name, "value must not be empty"));
    }
    if v.contains(',') {
        return Err(invalid(name, "value must not contain a comma"));
    }
    if v.contains('\0') {
        return Err(invalid(name, "value must not contain NUL"));
    }
    Ok(())
}

fn string_value(key: &str, value: Option<&str>) -> Result<String, MountError> {
    let v = value.ok_or_else(|| invalid(key, "needs a value (key=value)"))?;
    check_value(key, v)?;
    Ok(v.to_string())
}

fn u32_value(key: &str, value: Option<&str>) -> Result<u32, MountError> {
    let v = value.ok_or_else(|| invalid(key, "needs a value (key=value)"))?;
    v.parse()
        .map_err(|_| invalid(key, "value must be an unsigned 32-bit integer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let o = MountOptions::default();
        assert!(o.nosuid && o.nodev);
        assert_eq!(o.source(), "fuse-wire");
        assert_eq!(o.fstype(), "fuse");
        assert_eq!(
            o.kernel_data(5, 0o40755, 0, 0).unwrap(),
            "fd=5,rootmode=40755,user_id=0,group_id=0"
        );
        assert_eq!(o.fusermount_opts().unwrap(), "rw,nosuid,nodev,fsname=fuse-wire");
        assert_eq!(o.ms_flags(), MsFlags::MS_NOSUID | MsFlags::MS_NODEV);
    }

    #[test]
    fn parse_full_list() {
        let o = MountOptions::parse_opts(
            "ro,fsname=myfs,subtype=hello,allow_other,default_permissions,max_read=65536,noexec,\
             noatime,nodiratime,sync,dirsync,suid,dev,auto_unmount",
        )
        .unwrap();
        assert_eq!(o.fsname.as_deref(), Some("myfs"));
        assert_eq!(o.subtype.as_deref(), Some("hello"));
        assert!(o.read_only && o.allow_other && o.default_permissions && o.auto_unmount);
        assert!(!o.nosuid && !o.nodev);
        assert_eq!(o.max_read, Some(65536));
        assert_eq!(o.fstype(), "fuse.hello");
        assert_eq!(o.source(), "myfs");
        assert_eq!(
            o.kernel_data(7, 0o40700, 1000, 100).unwrap(),
            "fd=7,rootmode=40700,user_id=1000,group_id=100,allow_other,default_permissions,max_read=65536"
        );
        assert_eq!(
            o.fusermount_opts().unwrap(),
            "ro,noexec,noatime,nodiratime,sync,dirsync,fsname=myfs,subtype=hello,allow_other,\
             default_permissions,max_read=65536,auto_unmount"
        );
        assert_eq!(
            o.ms_flags(),
            MsFlags::MS_RDONLY
                | MsFlags::MS_NOEXEC
                | MsFlags::MS_NOATIME
                | MsFlags::MS_NODIRATIME
                | MsFlags::MS_SYNCHRONOUS
                | MsFlags::MS_DIRSYNC
        );
    }

    #[test]
    fn later_options_win_and_empty_items_are_skipped() {
        let o = MountOptions::parse_opts(",ro,,rw,noexec,exec,").unwrap();
        assert!(!o.read_only && !o.noexec);
        assert_eq!(MountOptions::parse_opts("").unwrap(), MountOptions::default());
    }

    #[test]
    fn subtype_is_default_fsname() {
        let o = MountOptions::parse_opts("subtype=memfs").unwrap();
        assert_eq!(o.source(), "memfs");
        assert_eq!(
            o.fusermount_opts().unwrap(),
            "rw,nosuid,nodev,fsname=memfs,subtype=memfs"
        );
    }

    #[test]
    fn allow_root_mounts_allow_other() {
        let o = MountOptions::parse_opts("allow_root").unwrap();
        assert!(o.allow_root && !o.allow_other);
        assert_eq!(
            o.kernel_data(3, 0o40755, 0, 0).unwrap(),
            "fd=3,rootmode=40755,user_id=0,group_id=0,allow_other"
        );
        let both = MountOptions::parse_opts("allow_root,allow_other").unwrap();
        assert!(
            matches!(both.validate(), Err(MountError::InvalidOption { option, .. }) if option == "allow_root")
        );
    }

    #[test]
    fn unknown_option_is_named() {
        let e = MountOptions::parse_opts("ro,source=/x,frobnicate").unwrap_err();
        assert!(
            matches!(&e, MountError::UnknownOption(o) if o == "source=/x"),
            "{e}"
        );
        assert_eq!(e.to_string(), "unknown mount option `source=/x`");
    }

    #[test]
    fn parse_known_returns_the_rest_in_order() {
        let (o, rest) =
            MountOptions::parse_known("source=/srv,ro,timeout=1.5,fsname=pt,cache,subtype=passthrough")
                .unwrap();
        assert_eq!(rest, vec!["source=/srv", "timeout=1.5", "cache"]);
        assert!(o.read_only);
        assert_eq!(o.fsname.as_deref(), Some("pt"));
        assert_eq!(o.fstype(), "fuse.passthrough");
        // Known options with bad values are still errors.
        assert!(MountOptions::parse_known("max_read=lots,foo").is_err());
    }

    #[test]
    fn bad_values() {
        for (opts, option) in [
            ("max_read=abc", "max_read"),
            ("max_read=-1", "max_read"),
            ("max_read=0", "max_read"),
            ("fsname", "fsname"),
            ("fsname=", "fsname"),
            ("ro=1", "ro"),
            ("subtype=a.b", "subtype"),
            ("fd=3", "fd"),
            ("rootmode=40000", "rootmode"),
            ("user_id=0", "user_id"),
            ("group_id=0", "group_id"),
            ("blksize=4096", "blksize"),
        ] {
            let r = MountOptions::parse_opts(opts).and_then(|o| o.validate().map(|_| o));
            match r {
                Err(MountError::InvalidOption { option: o, .. }) => assert_eq!(o, option, "{opts}"),
                other => panic!("{opts}: expected InvalidOption({option}), got {other:?}"),
            }
        }
    }

    #[test]
    fn commas_and_nul_in_fields_are_refused() {
        let mut o = MountOptions {
            fsname: Some("a,allow_other".into()),
            ..Default::default()
        };
        assert!(matches!(
            o.kernel_data(3, 0o40755, 0, 0),
            Err(MountError::InvalidOption { .. })
        ));
        assert!(matches!(
            o.fusermount_opts(),
            Err(MountError::InvalidOption { .. })
        ));
        o.fsname = Some("a\0b".into());
        assert!(matches!(o.validate(), Err(MountError::InvalidOption { .. })));
        o.fsname = None;
        o.subtype = Some("x,y".into());
        assert!(matches!(o.validate(), Err(MountError::InvalidOption { .. })));
    }

    #[test]
    fn blksize_needs_blkdev() {
        let e = MountOptions::parse_opts("blksize=4096")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("fuseblk"), "{e}");
        let o = MountOptions::parse_opts("blkdev,fsname=/dev/loop0,blksize=4096,subtype=ext").unwrap();
        assert_eq!(o.fstype(), "fuseblk.ext");
        assert_eq!(
            o.kernel_data(4, 0o40755, 0, 0).unwrap(),
            "fd=4,rootmode=40755,user_id=0,group_id=0,blksize=4096"
        );
        assert_eq!(
            o.fusermount_opts().unwrap(),
            "rw,nosuid,nodev,fsname=/dev/loop0,subtype=ext,blkdev,blksize=4096"
        );
        let bad = MountOptions::parse_opts("blkdev,fsname=/dev/loop0,blksize=1000").unwrap();
        assert!(bad.validate().is_err());
    }
}
