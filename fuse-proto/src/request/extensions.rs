//! The request-extension area after the last argument (since 7.38):
//! security contexts and supplementary groups, read in place.

use super::ParseError;
use crate::abi::*;
use core::ffi::CStr;
use core::mem::size_of;
use zerocopy::FromBytes;

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

    pub(super) fn validate(raw: &'a [u8]) -> Result<Self, ParseError> {
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
