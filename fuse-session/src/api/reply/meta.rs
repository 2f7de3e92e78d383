//! The answers about a node: success with nothing more (ReplyEmpty), an
//! entry, attributes, `statfs`, `statx`, extended attributes.

use super::{ReplyAttr, ReplyEmpty, ReplyEntry, ReplyStatfs, ReplyStatx, ReplyXattr};
use crate::attr::{FileAttr, Statfs};
use crate::types::Entry;
use fuse_proto::abi::{AttrOut, EntryOut, GetxattrOut, StatfsOut, Statx, StatxOut};
use fuse_proto::{Errno, Reply};
use std::time::Duration;

impl ReplyEmpty {
    /// Success.
    pub fn ok(self) {
        let u = self.core.unique;
        self.core.send(&Reply::empty(u));
    }

    /// Success or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<(), E>) {
        match r {
            Ok(()) => self.ok(),
            Err(e) => self.error(e),
        }
    }
}

impl ReplyEntry {
    /// The entry (one more lookup reference on `entry.ino`).
    pub fn entry(self, entry: &Entry) {
        self.entry_raw(&entry.to_out())
    }

    /// The entry in the kernel's form, `fuse_entry_out`.
    pub fn entry_raw(self, out: &EntryOut) {
        let r = Reply::entry(self.core.unique, out, self.core.minor());
        self.core.send(&r);
    }

    /// The entry or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<Entry, E>) {
        match r {
            Ok(e) => self.entry(&e),
            Err(e) => self.error(e),
        }
    }

    /// "No such entry", cacheable for `ttl` (a zero node id with a validity).
    pub fn negative(self, ttl: Duration) {
        let out = EntryOut {
            entry_valid: ttl.as_secs(),
            entry_valid_nsec: ttl.subsec_nanos(),
            ..Default::default()
        };
        let r = Reply::entry(self.core.unique, &out, self.core.minor());
        self.core.send(&r);
    }
}

impl ReplyAttr {
    /// The attributes, cacheable for `ttl`.
    pub fn attr(self, ttl: Duration, attr: &FileAttr) {
        self.attr_raw(ttl, &attr.to_abi())
    }

    /// The attributes (cacheable for `ttl`) or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<(Duration, FileAttr), E>) {
        match r {
            Ok((ttl, a)) => self.attr(ttl, &a),
            Err(e) => self.error(e),
        }
    }

    /// The attributes in the kernel's form, `fuse_attr`.
    pub fn attr_raw(self, ttl: Duration, attr: &fuse_proto::abi::Attr) {
        let out = AttrOut {
            attr_valid: ttl.as_secs(),
            attr_valid_nsec: ttl.subsec_nanos(),
            dummy: 0,
            attr: *attr,
        };
        let r = Reply::attr(self.core.unique, &out, self.core.minor());
        self.core.send(&r);
    }
}

impl ReplyStatfs {
    /// The statistics or the error.
    pub fn result<S: Into<Statfs>, E: Into<Errno>>(self, r: Result<S, E>) {
        match r {
            Ok(st) => self.statfs(st),
            Err(e) => self.error(e),
        }
    }

    /// The statistics: a [`Statfs`], or the kernel's raw `fuse_kstatfs`
    /// ([`Kstatfs`](fuse_proto::abi::Kstatfs)).
    pub fn statfs(self, st: impl Into<Statfs>) {
        let out = StatfsOut {
            st: st.into().to_abi(),
        };
        let r = Reply::statfs(self.core.unique, &out, self.core.minor());
        self.core.send(&r);
    }
}

impl ReplyXattr {
    /// The size the value (or name list) needs, for a request with size 0.
    pub fn size(self, size: u32) {
        let u = self.core.unique;
        self.core
            .send(&Reply::with_struct(u, &GetxattrOut { size, padding: 0 }));
    }

    /// The value (or NUL-separated name list).
    pub fn data(self, data: &[u8]) {
        match Reply::data(self.core.unique, data) {
            Ok(r) => self.core.send(&r),
            Err(_) => self.core.error(Errno::ERANGE),
        }
    }
}

impl ReplyStatx {
    /// The statx attributes, cacheable for `ttl`.
    pub fn statx(self, ttl: Duration, stat: &Statx) {
        let out = StatxOut {
            attr_valid: ttl.as_secs(),
            attr_valid_nsec: ttl.subsec_nanos(),
            flags: 0,
            spare: [0; 2],
            stat: *stat,
        };
        let u = self.core.unique;
        self.core.send(&Reply::with_struct(u, &out));
    }
}
