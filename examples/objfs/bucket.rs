//! The object store objfs serves: a flat bucket of objects, read by
//! ranges and written whole (a PUT replaces an object at once, as object
//! stores do). This one keeps the bucket in a local directory, one file an
//! object, so that the example runs anywhere; a PUT writes a temporary
//! file, syncs it and renames it over the object, so a reader sees the old
//! object or the new one, never a part. Every call blocks: objfs runs them
//! off the async runtime's threads, as it would a network client's.

use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::SystemTime;

/// Names of PUTs in progress start so; they are not objects.
const PUTTING: &[u8] = b".objfs-put-";

/// A bucket in a directory.
pub struct Bucket {
    dir: PathBuf,
    puts: AtomicU64,
}

/// What a HEAD answers.
pub struct Head {
    pub size: u64,
    pub mtime: SystemTime,
}

impl Bucket {
    pub fn open(dir: PathBuf) -> io::Result<Bucket> {
        if !std::fs::metadata(&dir)?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                "the bucket is not a directory",
            ));
        }
        // What a dead daemon left half put.
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            if e.file_name().as_bytes().starts_with(PUTTING) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        Ok(Bucket {
            dir,
            puts: AtomicU64::new(0),
        })
    }

    /// Whether `name` can name an object here.
    pub fn valid(name: &[u8]) -> bool {
        !name.is_empty()
            && name.len() <= 255
            && !name.contains(&b'/')
            && !name.starts_with(PUTTING)
            && name != b"."
            && name != b".."
    }

    fn path(&self, name: &[u8]) -> PathBuf {
        self.dir.join(OsStr::from_bytes(name))
    }

    pub fn head(&self, name: &[u8]) -> io::Result<Option<Head>> {
        match std::fs::metadata(self.path(name)) {
            Ok(m) if m.is_file() => Ok(Some(Head {
                size: m.len(),
                mtime: m.modified()?,
            })),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Up to `len` bytes of `name` from `offset`.
    pub fn get(&self, name: &[u8], offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let f = std::fs::File::open(self.path(name))?;
        let mut buf = vec![0; len];
        let mut got = 0;
        while got < len {
            match f.read_at(&mut buf[got..], offset + got as u64)? {
                0 => break,
                n => got += n,
            }
        }
        buf.truncate(got);
        Ok(buf)
    }

    /// Replaces (or makes) `name` with `data`, at once.
    pub fn put(&self, name: &[u8], data: &[u8]) -> io::Result<()> {
        let mut tmp = PUTTING.to_vec();
        tmp.extend_from_slice(
            format!("{}-{}", std::process::id(), self.puts.fetch_add(1, Relaxed)).as_bytes(),
        );
        let tmp = self.path(&tmp);
        let mut f = std::fs::File::create(&tmp)?;
        let done = f.write_all(data).and_then(|_| f.sync_data());
        drop(f);
        match done.and_then(|_| std::fs::rename(&tmp, self.path(name))) {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Makes `name` empty unless it exists; whether it did.
    pub fn create_empty(&self, name: &[u8]) -> io::Result<bool> {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.path(name))
        {
            Ok(_) => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Removes `name`; whether it was there.
    pub fn delete(&self, name: &[u8]) -> io::Result<bool> {
        match std::fs::remove_file(self.path(name)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Moves `from` to `to` (replacing it unless `noreplace`).
    pub fn rename(&self, from: &[u8], to: &[u8], noreplace: bool) -> io::Result<()> {
        let (from, to) = (self.path(from), self.path(to));
        if !noreplace {
            return std::fs::rename(from, to);
        }
        let c = |p: &PathBuf| {
            std::ffi::CString::new(p.as_os_str().as_bytes())
                .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
        };
        let (from, to) = (c(&from)?, c(&to)?);
        // SAFETY: renameat2 with two valid C strings.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Every object's name.
    pub fn list(&self) -> io::Result<Vec<Vec<u8>>> {
        let mut names = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            let e = e?;
            let name = e.file_name().as_bytes().to_vec();
            if Self::valid(&name) && e.file_type()?.is_file() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }
}
