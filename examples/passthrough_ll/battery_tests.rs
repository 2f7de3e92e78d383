//! The test kit's conformance battery on passthrough_ll over a fresh
//! temporary directory, through the fake kernel (no mount).

use crate::fs::{FsOptions, PassthroughFs};
use crate::inode_table_tests::TempDir;
use crate::sys;
use fuse_wire::testing::TestKernel;
use fuse_wire::testing::battery;

#[test]
fn the_conformance_battery_passes_over_a_temporary_directory() {
    let dir = TempDir::new("battery");
    // As main does: each create applies the caller's umask, not ours.
    sys::set_umask(0);
    let c = std::ffi::CString::new(dir.0.as_os_str().as_encoded_bytes()).expect("no NUL");
    let root =
        sys::openat(sys::Dir::Cwd, &c, libc::O_PATH | libc::O_DIRECTORY, 0).expect("open the directory");
    let fs = PassthroughFs::new(root, FsOptions::default()).expect("passthrough_ll starts");
    let k = TestKernel::start(fs).expect("the kit starts");
    let report = battery::run(&k);
    report.assert_passed();
    if let Err(f) = fuse_wire::testing::explorer::Explorer::default().run(&k) {
        panic!("{f}");
    }
    if let Err(r) = k.finish() {
        panic!("{r}");
    }
}
