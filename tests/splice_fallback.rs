//! `ReplyData::splice_from` on a channel without a device to splice into
//! (the fake kernel) reads into memory and writes exactly the bytes that
//! `ReplyData::data` with the same bytes writes; statistics count it as any
//! other READ.

mod common_fake;

use common_fake::*;
use fuse_wire::proto::Opcode;
use fuse_wire::session::context::RequestContext;
use fuse_wire::session::ops::*;
use fuse_wire::session::reply::ReplyData;
use fuse_wire::session::types::{FileHandle, Inode};
use fuse_wire::session::{Filesystem, SessionConfig};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::sync::Arc;

const OP_READ: u32 = 15;
/// fh 1: `splice_from` the file; fh 2: `data` with the same bytes, read here.
const SPLICE: u64 = 1;
const DATA: u64 = 2;

struct FileFs {
    file: File,
    content: Vec<u8>,
}

impl Filesystem for FileFs {
    fn read(
        &self,
        _ctx: &RequestContext<'_>,
        _ino: Inode,
        fh: FileHandle,
        req: ReadRequest,
        reply: ReplyData,
    ) {
        let offset = req.offset;
        let size = req.size;
        match fh.0 {
            SPLICE => reply.splice_from(self.file.as_fd(), offset, size as usize),
            _ => {
                let start = (offset as usize).min(self.content.len());
                let end = (start + size as usize).min(self.content.len());
                reply.data(&self.content[start..end])
            }
        }
    }
}

fn read_req(unique: u64, fh: u64, offset: u64, size: u32) -> Vec<u8> {
    let body = B::new()
        .u64(fh)
        .u64(offset)
        .u32(size)
        .u32(0)
        .u64(0)
        .u32(0)
        .u32(0)
        .done();
    request(OP_READ, unique, 5, &body)
}

#[test]
fn fallback_writes_the_same_bytes_as_data() {
    let content: Vec<u8> = (0..300_000u32).map(|i| (i * 31 + i / 4096) as u8).collect();
    let path = std::env::temp_dir().join(format!("fw-splice-fallback-{}", std::process::id()));
    File::create(&path).unwrap().write_all(&content).unwrap();
    let file = File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let fs = Arc::new(FileFs { file, content });
    let fake = Fake::start(
        fs,
        SessionConfig {
            workers: 1,
            max_workers: 1,
            ..Default::default()
        },
    );
    fake.init_ready(45, 0);

    let cases = [
        (0u64, 0u32),
        (0, 1),
        (1, 4095),
        (4096, 4096),
        (5, 131_072),
        (0, 1 << 20),
        (299_000, 4096),
        (300_000, 4096),
        (1 << 40, 10),
    ];
    for (unique, &(offset, size)) in (10..).zip(cases.iter()) {
        let spliced = fake.roundtrip(read_req(unique, SPLICE, offset, size));
        let plain = fake.roundtrip(read_req(unique, DATA, offset, size));
        assert_bytes(&format!("READ of {size} at {offset}"), &spliced, &plain);
    }
    let stats = fake.handle.stats();
    assert_eq!(stats.get(Opcode::Read).count, 2 * cases.len() as u64, "{stats:?}");
    assert_eq!(stats.get(Opcode::Read).errors, 0, "{stats:?}");
}
