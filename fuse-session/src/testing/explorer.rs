//! The explorer: random but valid request sequences, deterministic from a
//! seed, run through a [`TestKernel`] and on a model of what POSIX says
//! they do; every answer is compared (error, file type, size, nlink,
//! contents, listings). On a difference it shrinks the sequence to the
//! shortest that still differs and reports it as a test to paste.
//!
//! Each sequence works on names of its own (`x{n}.a`, `x{n}.b`, …) in
//! one directory, so that sequences need no fresh filesystem: a shrunk
//! sequence runs again under new names. Every operation is sent as the
//! kernel sends it for the system call (a LOOKUP, then OPEN, WRITE,
//! RELEASE…), and what the kernel answers itself without asking the
//! filesystem (`unlink` of a directory, `rename` onto a name of another
//! type) is not generated. After each sequence the kernel forgets every
//! node it holds, as after an unmount.

use super::kernel::TestKernel;
use crate::filesystem::Filesystem;
use crate::types::{FileHandle, Inode};
use fuse_proto::Errno;
use std::collections::BTreeMap;
use std::fmt;

/// One operation of a sequence, on the sequence's names `a`, `b`, `c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `open(name, O_CREAT | O_EXCL | O_RDWR)` then `close`.
    Create(&'static str),
    /// `mkdir(name)`.
    Mkdir(&'static str),
    /// `pwrite(name, [byte; len], offset)` through a new descriptor.
    Write(&'static str, u64, u32, u8),
    /// `truncate(name, size)`.
    Truncate(&'static str, u64),
    /// The whole file read through a new descriptor.
    Read(&'static str),
    /// `stat(name)`: type, size, nlink.
    Stat(&'static str),
    /// `unlink(name)` of a file.
    Unlink(&'static str),
    /// `rmdir(name)` of a directory.
    Rmdir(&'static str),
    /// `rename(from, to)` onto nothing or a name of the same type.
    Rename(&'static str, &'static str),
    /// The directory's listing (the sequence's names in it).
    List,
}

const NAMES: [&str; 3] = ["a", "b", "c"];

/// What the model holds for a name.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Obj {
    File(Vec<u8>),
    Dir,
}

/// An answer, as both sides give it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Out {
    Done,
    Err(Errno),
    Stat { dir: bool, size: u64, nlink: u32 },
    Data(Vec<u8>),
    Names(Vec<String>),
}

/// A sequence whose answers differ from the model's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The seed that generated it.
    pub seed: u64,
    /// The shortest sequence found that still differs.
    pub ops: Vec<Op>,
    /// Its last step: what the filesystem answered, and the model.
    pub difference: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "the explorer (seed {}) found: {}", self.seed, self.difference)?;
        writeln!(f, "a test to paste:")?;
        writeln!(f, "#[test]")?;
        writeln!(f, "fn explorer_seed_{}() {{", self.seed)?;
        writeln!(f, "    use fuse_wire::testing::explorer::{{Explorer, Op}};")?;
        writeln!(
            f,
            "    let k = fuse_wire::testing::TestKernel::start(/* your filesystem */).unwrap();"
        )?;
        writeln!(f, "    let ops = [")?;
        for op in &self.ops {
            writeln!(f, "        Op::{op:?},")?;
        }
        writeln!(f, "    ];")?;
        writeln!(f, "    if let Err(d) = Explorer::replay(&k, &ops) {{")?;
        writeln!(f, "        panic!(\"{{d}}\");")?;
        writeln!(f, "    }}")?;
        writeln!(f, "    k.finish().unwrap();")?;
        write!(f, "}}")
    }
}

impl std::error::Error for Finding {}

/// The explorer's settings.
#[derive(Clone, Debug)]
pub struct Explorer {
    /// The first seed (sequence `i` uses `seed + i`).
    pub seed: u64,
    /// How many sequences.
    pub sequences: usize,
    /// Operations per sequence.
    pub length: usize,
    /// The directory to work in (default the root).
    pub dir: Inode,
}

impl Default for Explorer {
    fn default() -> Self {
        Explorer {
            seed: 1,
            sequences: 1000,
            length: 8,
            dir: Inode::ROOT,
        }
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn name(&mut self) -> &'static str {
        NAMES[self.below(NAMES.len() as u64) as usize]
    }
}

/// The model: the sequence's names and what they hold.
#[derive(Default)]
struct Model(BTreeMap<&'static str, Obj>);

impl Model {
    /// What POSIX says `op` answers, applied; `None` if the kernel would
    /// answer it itself (the op is not sent).
    fn apply(&mut self, op: Op) -> Option<Out> {
        use Out::*;
        let m = &mut self.0;
        Some(match op {
            Op::Create(n) | Op::Mkdir(n) if m.contains_key(n) => Err(Errno::EEXIST),
            Op::Create(n) => {
                m.insert(n, Obj::File(Vec::new()));
                Done
            }
            Op::Mkdir(n) => {
                m.insert(n, Obj::Dir);
                Done
            }
            Op::Write(n, off, len, byte) => match m.get_mut(n) {
                None => Err(Errno::ENOENT),
                Some(Obj::Dir) => return None,
                Some(Obj::File(d)) => {
                    let end = (off + u64::from(len)) as usize;
                    if d.len() < end {
                        d.resize(end, 0);
                    }
                    d[off as usize..end].fill(byte);
                    Done
                }
            },
            Op::Truncate(n, size) => match m.get_mut(n) {
                None => Err(Errno::ENOENT),
                Some(Obj::Dir) => return None,
                Some(Obj::File(d)) => {
                    d.resize(size as usize, 0);
                    Done
                }
            },
            Op::Read(n) => match m.get(n) {
                None => Err(Errno::ENOENT),
                Some(Obj::Dir) => return None,
                Some(Obj::File(d)) => Data(d.clone()),
            },
            Op::Stat(n) => match m.get(n) {
                None => Err(Errno::ENOENT),
                Some(Obj::Dir) => Stat {
                    dir: true,
                    size: 0,
                    nlink: 0,
                },
                Some(Obj::File(d)) => Stat {
                    dir: false,
                    size: d.len() as u64,
                    nlink: 1,
                },
            },
            Op::Unlink(n) => match m.get(n) {
                None => Err(Errno::ENOENT),
                Some(Obj::Dir) => return None,
                Some(Obj::File(_)) => {
                    m.remove(n);
                    Done
                }
            },
            Op::Rmdir(n) => match m.get(n) {
                None => Err(Errno::ENOENT),
                Some(Obj::File(_)) => return None,
                Some(Obj::Dir) => {
                    m.remove(n);
                    Done
                }
            },
            Op::Rename(a, b) => {
                let from = m.get(a)?.clone();
                if a == b {
                    return None;
                }
                match (&from, m.get(b)) {
                    (_, None) | (Obj::File(_), Some(Obj::File(_))) | (Obj::Dir, Some(Obj::Dir)) => {
                        m.remove(a);
                        m.insert(b, from);
                        Done
                    }
                    _ => return None,
                }
            }
            Op::List => Names(m.keys().map(|n| n.to_string()).collect()),
        })
    }
}

/// Runs `ops` through `k` under `prefix`; the first difference from the
/// model, if any.
fn run_ops<F: Filesystem>(k: &TestKernel<F>, dir: Inode, prefix: &str, ops: &[Op]) -> Result<(), String> {
    let mut model = Model::default();
    let name = |n: &str| format!("{prefix}{n}");
    for (i, &op) in ops.iter().enumerate() {
        // A RENAME of a missing name: the kernel's LOOKUP answers ENOENT.
        let want = match (
            op,
            model.0.get(match op {
                Op::Rename(a, _) => a,
                _ => "",
            }),
        ) {
            (Op::Rename(..), None) => Some(Out::Err(Errno::ENOENT)),
            _ => model.apply(op),
        };
        let Some(want) = want else { continue };
        let got = send(k, dir, &name, op);
        if got != want {
            clean(k, dir, &name, &model);
            return Err(format!(
                "step {} {op:?}: the filesystem answered {got:?}, POSIX says {want:?}",
                i + 1
            ));
        }
    }
    clean(k, dir, &name, &model);
    Ok(())
}

/// Removes what the sequence made (so that the directory stays small) and
/// forgets every node, as after an unmount.
fn clean<F: Filesystem>(k: &TestKernel<F>, dir: Inode, name: &dyn Fn(&str) -> String, model: &Model) {
    for (n, obj) in &model.0 {
        let _ = match obj {
            Obj::File(_) => k.unlink(dir, name(n)),
            Obj::Dir => k.rmdir(dir, name(n)),
        };
    }
    k.forget_all();
}

/// `op` as the kernel sends it.
fn send<F: Filesystem>(k: &TestKernel<F>, dir: Inode, name: &dyn Fn(&str) -> String, op: Op) -> Out {
    let err = Out::Err;
    let node = |n: &str| k.lookup(dir, name(n)).map(|e| Inode(e.nodeid));
    let with_file = |n: &str, flags: i32, f: &dyn Fn(Inode, FileHandle) -> Out| -> Out {
        let ino = match node(n) {
            Ok(i) => i,
            Err(e) => return err(e),
        };
        let fh = match k.open(ino, flags) {
            Ok(o) => FileHandle(o.fh),
            Err(e) => return err(e),
        };
        let r = f(ino, fh);
        match k.release(ino, fh) {
            Ok(()) => r,
            Err(e) => err(e),
        }
    };
    match op {
        Op::Create(n) => match k.create(dir, name(n), libc::S_IFREG | 0o644, libc::O_RDWR | libc::O_EXCL) {
            Ok((e, o)) => match k.release(Inode(e.nodeid), FileHandle(o.fh)) {
                Ok(()) => Out::Done,
                Err(e) => err(e),
            },
            Err(e) => err(e),
        },
        Op::Mkdir(n) => k.mkdir(dir, name(n), 0o755).map_or_else(err, |_| Out::Done),
        Op::Write(n, off, len, byte) => with_file(n, libc::O_WRONLY, &|ino, fh| match k.write(
            ino,
            fh,
            off,
            &vec![byte; len as usize],
        ) {
            Ok(w) if w == len => Out::Done,
            Ok(w) => Out::Data(vec![0; w as usize]),
            Err(e) => err(e),
        }),
        Op::Truncate(n, size) => match node(n) {
            Ok(ino) => k.truncate(ino, size, None).map_or_else(err, |_| Out::Done),
            Err(e) => err(e),
        },
        Op::Read(n) => with_file(n, libc::O_RDONLY, &|ino, fh| {
            k.read(ino, fh, 0, 1 << 16).map_or_else(err, Out::Data)
        }),
        Op::Stat(n) => match k.lookup(dir, name(n)) {
            Ok(e) => {
                let dir = e.attr.mode & libc::S_IFMT == libc::S_IFDIR;
                Out::Stat {
                    dir,
                    size: if dir { 0 } else { e.attr.size },
                    nlink: if dir { 0 } else { e.attr.nlink },
                }
            }
            Err(e) => err(e),
        },
        Op::Unlink(n) => k.unlink(dir, name(n)).map_or_else(err, |()| Out::Done),
        Op::Rmdir(n) => k.rmdir(dir, name(n)).map_or_else(err, |()| Out::Done),
        Op::Rename(a, b) => k
            .rename(dir, name(a), dir, name(b), 0)
            .map_or_else(err, |()| Out::Done),
        Op::List => {
            let prefix = name("");
            match k.list_dir(dir, 4096) {
                Ok(l) => {
                    let mut v: Vec<String> = l
                        .iter()
                        .map(|e| e.name_lossy())
                        .filter_map(|n| n.strip_prefix(&prefix).map(str::to_string))
                        .collect();
                    v.sort();
                    Out::Names(v)
                }
                Err(e) => err(e),
            }
        }
    }
}

/// What the filesystem implements of what the explorer sends.
#[derive(Clone, Copy)]
struct Can {
    create: bool,
    mkdir: bool,
    rename: bool,
}

impl Can {
    /// Tries MKDIR and RENAME once (what fails there is left out).
    fn probe<F: Filesystem>(k: &TestKernel<F>, dir: Inode) -> Can {
        let mkdir = k.mkdir(dir, "x.probe.d", 0o755).is_ok() && k.rmdir(dir, "x.probe.d").is_ok();
        let mut create = false;
        let rename = match k.create(dir, "x.probe.f", libc::S_IFREG | 0o644, libc::O_RDWR) {
            Ok((e, o)) => {
                create = true;
                let _ = k.release(Inode(e.nodeid), FileHandle(o.fh));
                let moved = k.rename(dir, "x.probe.f", dir, "x.probe.g", 0).is_ok();
                let _ = k.unlink(dir, if moved { "x.probe.g" } else { "x.probe.f" });
                moved
            }
            Err(_) => false,
        };
        k.forget_all();
        Can {
            create,
            mkdir,
            rename,
        }
    }
}

impl Explorer {
    /// The sequence of seed `seed` (`mkdir`: whether to use directories).
    fn generate(&self, seed: u64, can: Can) -> Vec<Op> {
        let mut r = Rng::new(seed);
        let mut ops = Vec::with_capacity(self.length);
        while ops.len() < self.length {
            let op = match r.below(11) {
                0 | 1 => Op::Create(r.name()),
                2 => Op::Write(
                    r.name(),
                    r.below(3) * 4096 + r.below(8),
                    1 + r.below(6000) as u32,
                    b'a' + r.below(26) as u8,
                ),
                3 => Op::Truncate(r.name(), r.below(3) * 3000),
                4 => Op::Read(r.name()),
                5 => Op::Stat(r.name()),
                6 => Op::Unlink(r.name()),
                7 => Op::Rename(r.name(), r.name()),
                8 => Op::List,
                9 => Op::Mkdir(r.name()),
                _ => Op::Rmdir(r.name()),
            };
            let allowed = match op {
                Op::Mkdir(_) | Op::Rmdir(_) => can.mkdir,
                Op::Rename(..) => can.rename,
                _ => true,
            };
            if allowed {
                ops.push(op);
            }
        }
        ops
    }

    /// Runs the sequences on `k`: the first that differs from the model,
    /// shrunk, as a [`Finding`]. A directory where CREATE fails (a
    /// read-only filesystem) is not explored.
    pub fn run<F: Filesystem>(&self, k: &TestKernel<F>) -> Result<(), Finding> {
        let can = Can::probe(k, self.dir);
        if !can.create {
            return Ok(()); // read-only here: nothing to explore
        }
        let mut runs = 0u64;
        for i in 0..self.sequences as u64 {
            let seed = self.seed.wrapping_add(i);
            let ops = self.generate(seed, can);
            runs += 1;
            if let Err(d) = run_ops(k, self.dir, &format!("x{seed}.{runs}."), &ops) {
                return Err(self.shrink(k, seed, ops, d, &mut runs));
            }
        }
        Ok(())
    }

    /// Removes operations one at a time while the sequence still differs.
    fn shrink<F: Filesystem>(
        &self,
        k: &TestKernel<F>,
        seed: u64,
        mut ops: Vec<Op>,
        mut difference: String,
        runs: &mut u64,
    ) -> Finding {
        let mut progress = true;
        while progress {
            progress = false;
            for i in 0..ops.len() {
                let mut shorter = ops.clone();
                shorter.remove(i);
                *runs += 1;
                if let Err(d) = run_ops(k, self.dir, &format!("x{seed}.{runs}."), &shorter) {
                    (ops, difference) = (shorter, d);
                    progress = true;
                    break;
                }
            }
        }
        Finding {
            seed,
            ops,
            difference,
        }
    }

    /// Runs `ops` once on `k` (a [`Finding`]'s test): the difference, if
    /// any.
    pub fn replay<F: Filesystem>(k: &TestKernel<F>, ops: &[Op]) -> Result<(), String> {
        run_ops(k, Inode::ROOT, "x.", ops)
    }
}
