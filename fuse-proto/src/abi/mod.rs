//! The `#[repr(C)]` structs of the kernel ABI (`include/uapi/linux/fuse.h`, 7.45).
//!
//! One file per family. Every type derives zerocopy's `FromBytes`, `IntoBytes`,
//! `KnownLayout` and `Immutable`, names its C struct in its doc line, asserts its
//! size at compile time and describes its fields through [`CStruct`], which the
//! `abi_dump` example and the layout tests read. Field names are the kernel's
//! (`__reserved` loses its underscores, `type` is `r#type`). Integers are in the
//! host's byte order, as the kernel writes them.

/// Name, offset and size of one field of a C struct, for layout checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldInfo {
    /// The C field name.
    pub name: &'static str,
    /// Byte offset in the struct.
    pub offset: usize,
    /// Size in bytes; 0 for a flexible array member.
    pub size: usize,
}

/// Layout metadata of an ABI struct.
pub trait CStruct {
    /// The C struct name, e.g. `fuse_entry_out`.
    const C_NAME: &'static str;
    /// The fields in declaration order.
    const FIELDS: &'static [FieldInfo];
}

/// One row of [`ALL_STRUCTS`]: a struct's C name, size and fields.
#[derive(Clone, Copy, Debug)]
pub struct StructInfo {
    /// The C struct name.
    pub name: &'static str,
    /// `sizeof` the struct.
    pub size: usize,
    /// Its fields.
    pub fields: &'static [FieldInfo],
}

macro_rules! abi_struct {
    (
        $(#[$meta:meta])*
        $cname:literal $name:ident = $size:literal {
            $( $field:ident : $ty:ty = $cfield:literal , )*
            $( @flex $flex:ident = $cflex:literal , )?
        }
    ) => {
        $(#[$meta])*
        #[doc = ""]
        #[doc = concat!("C: `struct ", $cname, "`, ", stringify!($size), " bytes.")]
        #[repr(C)]
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, Hash,
            zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable,
        )]
        pub struct $name {
            $(
                #[doc = concat!("C field `", $cfield, "`.")]
                pub $field: $ty,
            )*
        }

        const _: () = assert!(core::mem::size_of::<$name>() == $size);

        impl Default for $name {
            fn default() -> Self {
                <Self as zerocopy::FromZeros>::new_zeroed()
            }
        }

        impl $crate::abi::CStruct for $name {
            const C_NAME: &'static str = $cname;
            const FIELDS: &'static [$crate::abi::FieldInfo] = &[
                $(
                    $crate::abi::FieldInfo {
                        name: $cfield,
                        offset: core::mem::offset_of!($name, $field),
                        size: core::mem::size_of::<$ty>(),
                    },
                )*
                $(
                    $crate::abi::FieldInfo { name: $cflex, offset: $size, size: 0 },
                )?
            ];
        }
    };
}

mod attr;
mod dax;
mod dir;
mod entry;
mod ext;
mod header;
mod init;
mod ioctl;
mod lock;
mod notify;
mod open;
mod rw;
mod uring;
mod xattr;

pub use attr::*;
pub use dax::*;
pub use dir::*;
pub use entry::*;
pub use ext::*;
pub use header::*;
pub use init::*;
pub use ioctl::*;
pub use lock::*;
pub use notify::*;
pub use open::*;
pub use rw::*;
pub use uring::*;
pub use xattr::*;

macro_rules! registry {
    ($($t:ident),* $(,)?) => {
        /// Every struct of the 7.45 ABI, in the order of the kernel header.
        pub const ALL_STRUCTS: &[StructInfo] = &[
            $(StructInfo {
                name: <$t as CStruct>::C_NAME,
                size: core::mem::size_of::<$t>(),
                fields: <$t as CStruct>::FIELDS,
            },)*
        ];
    };
}

registry!(
    Attr,
    SxTime,
    Statx,
    Kstatfs,
    FileLock,
    EntryOut,
    ForgetIn,
    ForgetOne,
    BatchForgetIn,
    GetattrIn,
    AttrOut,
    StatxIn,
    StatxOut,
    MknodIn,
    MkdirIn,
    RenameIn,
    Rename2In,
    LinkIn,
    SetattrIn,
    OpenIn,
    CreateIn,
    OpenOut,
    ReleaseIn,
    FlushIn,
    ReadIn,
    WriteIn,
    WriteOut,
    StatfsOut,
    FsyncIn,
    SetxattrIn,
    GetxattrIn,
    GetxattrOut,
    LkIn,
    LkOut,
    AccessIn,
    InitIn,
    InitOut,
    CuseInitIn,
    CuseInitOut,
    InterruptIn,
    BmapIn,
    BmapOut,
    IoctlIn,
    IoctlIovec,
    IoctlOut,
    PollIn,
    PollOut,
    NotifyPollWakeupOut,
    FallocateIn,
    InHeader,
    OutHeader,
    Dirent,
    Direntplus,
    NotifyInvalInodeOut,
    NotifyInvalEntryOut,
    NotifyDeleteOut,
    NotifyStoreOut,
    NotifyRetrieveOut,
    NotifyRetrieveIn,
    NotifyPruneOut,
    BackingMap,
    LseekIn,
    LseekOut,
    CopyFileRangeIn,
    CopyFileRangeOut,
    SetupmappingIn,
    RemovemappingIn,
    RemovemappingOne,
    SyncfsIn,
    Secctx,
    SecctxHeader,
    ExtHeader,
    SuppGroups,
    UringEntInOut,
    UringReqHeader,
    UringCmdReq,
);
