//! What closing sends, on a real mount: the facts the traits' `flush` and
//! `release` (and the tutorial's "Committing at close") state for
//! filesystems that commit at close. bash's `echo x > f` over an existing
//! file: OPEN, the truncation, a FLUSH before any data (the `close` after
//! `dup2`), the WRITE, a second FLUSH, then RELEASE; one open, several
//! FLUSHes, the first without data. If the kernel or bash changed this,
//! the documentation would be wrong: this test says so.
//!
//! Needs root and `/dev/fuse` (skips loudly without, fails under `CI=true`).

mod common;

use fuse_wire::path::{PathFilesystem, PathFs, PathOpened};
use fuse_wire::reply::ReplyData;
use fuse_wire::{
    Errno, FileAttr, FileKind, LockOwner, OpenFlags, ReadRequest, RequestContext, SetattrRequest,
    WriteRequest,
};
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

/// One file, `/f`, whose opens, truncations, writes, FLUSHes and
/// RELEASEs are written down.
#[derive(Default)]
struct Recorder {
    data: Mutex<Vec<u8>>,
    log: Mutex<Vec<String>>,
}

impl Recorder {
    fn note(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }

    fn attr(&self) -> FileAttr {
        let size = self.data.lock().unwrap().len() as u64;
        FileAttr::fixed(2, FileKind::RegularFile, 0o666).with_size(size)
    }
}

impl PathFilesystem for Recorder {
    type File = ();

    fn getattr(
        &self,
        _: &RequestContext<'_>,
        path: Option<&Path>,
        _: Option<&()>,
    ) -> Result<FileAttr, Errno> {
        match path.and_then(Path::to_str) {
            Some("/") => Ok(FileAttr::fixed(1, FileKind::Directory, 0o777)),
            Some("/f") | None => Ok(self.attr()),
            _ => Err(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _: &RequestContext<'_>,
        _: Option<&Path>,
        _: Option<&()>,
        req: &SetattrRequest,
    ) -> Result<FileAttr, Errno> {
        if let Some(size) = req.size {
            self.data.lock().unwrap().resize(size as usize, 0);
            self.note(format!("truncate {size}"));
        }
        Ok(self.attr())
    }

    fn open(&self, _: &RequestContext<'_>, _: &Path, _: OpenFlags) -> Result<PathOpened<()>, Errno> {
        self.note("open".into());
        Ok(PathOpened::new(()).with_flush())
    }

    fn read(&self, _: &RequestContext<'_>, _: &(), req: ReadRequest, reply: ReplyData) {
        let d = self.data.lock().unwrap();
        reply.data(&d[(req.offset as usize).min(d.len())..]);
    }

    fn write(&self, _: &RequestContext<'_>, _: &(), req: WriteRequest<'_>) -> Result<u32, Errno> {
        let bytes = req.data.fetch()?;
        let mut d = self.data.lock().unwrap();
        let end = req.offset as usize + bytes.len();
        if d.len() < end {
            d.resize(end, 0);
        }
        d[req.offset as usize..end].copy_from_slice(bytes);
        drop(d);
        self.note(format!("write {}", bytes.len()));
        Ok(bytes.len() as u32)
    }

    fn flush(&self, _: &RequestContext<'_>, _: &(), _: LockOwner) -> Result<(), Errno> {
        self.note(format!("flush ({} bytes)", self.data.lock().unwrap().len()));
        Ok(())
    }

    fn release(&self, _: &RequestContext<'_>, _: ()) {
        self.note("release".into());
    }
}

#[test]
fn bash_redirection_flushes_before_the_data_and_again_after() {
    if !common::require_mount_capability() {
        return;
    }
    let mp = common::TempMountpoint::new("close-order");
    let fs = PathFs::new(Recorder {
        data: Mutex::new(b"old content\n".to_vec()),
        ..Recorder::default()
    });
    let recorder = fs.clone();
    let config = fuse_wire::SessionConfig {
        transport: common::test_transport(),
        ..fuse_wire::SessionConfig::default()
    };
    let running =
        fuse_wire::spawn(fs, mp.path(), &fuse_wire::MountOptions::default(), config).expect("mount");
    let status = Command::new("bash")
        .arg("-c")
        .arg("echo x > f")
        .current_dir(mp.path())
        .status()
        .expect("run bash");
    assert!(status.success());
    // RELEASE is sent after close returns: wait for it (bounded).
    let log = || recorder.inner().log.lock().unwrap().clone();
    let start = std::time::Instant::now();
    while !log().iter().any(|l| l == "release") && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(running);
    assert_eq!(*recorder.inner().data.lock().unwrap(), b"x\n");
    let log = log();
    assert_eq!(
        log,
        [
            "open",
            "truncate 0",
            "flush (0 bytes)",
            "write 2",
            "flush (2 bytes)",
            "release"
        ],
        "{log:?}"
    );
}
