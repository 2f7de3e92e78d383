//! Async filesystems: [`AsyncFilesystem`], whose operations are `async`
//! methods returning their answer, served by [`AsyncFs`] on any executor.
//!
//! With the sync [`Filesystem`](crate::Filesystem) a handler that waits
//! (a network round trip, an object store) holds its worker thread for the
//! whole wait. An `AsyncFilesystem`'s futures hold no thread while they
//! wait: the thread that read the request polls its future once (a future
//! that completes at once is answered there, without a hand-off), hands a
//! pending one to an executor ([`Spawn`]) and goes back to reading, so a
//! handful of threads serve as many slow requests at once as the bound
//! allows.
//!
//! The core is runtime-agnostic: [`Spawn`] is one method, implemented for
//! whatever executor the program runs. With the `tokio` feature,
//! `TokioSpawner` spawns on a Tokio runtime (`examples/slowfs` uses it).
//!
//! # Answers are values
//!
//! Methods return `Result<Entry, Errno>`, `Result<Data, Errno>`,
//! `Result<Open, Errno>`… instead of taking reply handles; the adapter
//! answers. READDIR returns the entries ([`DirEntry`]) and the adapter
//! sends as many as fit; GETXATTR returns the value and the adapter answers
//! the size probe and `ERANGE`.
//!
//! # Interrupts
//!
//! When the kernel sends INTERRUPT for a request whose future is still
//! running (the caller got a signal: Ctrl-C on a blocked `cat`), the adapter
//! drops the future, so whatever it awaited is cancelled (a socket read, a
//! timer, a lock wait), and answers `EINTR`. Exactly one answer goes out
//! whatever races with it: if the future completes first, its answer is
//! sent and the INTERRUPT has no effect. RELEASE and RELEASEDIR are never
//! cancelled (the kernel does not send them again); FORGET and
//! BATCH_FORGET are plain methods, not futures. A future that panics is
//! dropped and its request answered `EIO`; the session goes on. When the
//! session stops, every future still running is dropped (its request
//! answered `EINTR`) before [`AsyncFilesystem::destroy`].
//!
//! Every other request, FLUSH and FSYNC included, is cancellable by
//! default. A future whose work must not be reported failed once done (an
//! upload at FLUSH, a commit at FSYNC) holds the guard of
//! [`AsyncContext::must_finish`] around it: an INTERRUPT then waits for
//! the section to end, and the request answers its true result (see
//! [`MustFinish`](crate::MustFinish) for why none is must-finish by
//! default).
//!
//! Every request in flight is interruptible: the in-flight table of the
//! worker that read it grows for as many as it has at once (up to 65,536
//! per worker, far above any `max_in_flight` in use; beyond that a request
//! runs to its end). A request still waiting for room at the bound gives up
//! at once with `EINTR`.
//!
//! # Backpressure
//!
//! At most [`AsyncFs::max_in_flight`] futures run at once
//! ([`DEFAULT_MAX_IN_FLIGHT`]). A request read beyond it waits on the
//! thread that read it until a future ends, or until its caller is
//! interrupted (it is then answered `EINTR`: it never started); once every
//! thread of the pool waits so, further requests are parked by the
//! session, bounded, and beyond that stay in the kernel's queue (see
//! `docs/architecture.md`). None is answered an error for want of room.
//! Futures' memory is bounded by the bound times what one request holds,
//! however many callers there are.
//!
//! # Costs
//!
//! Each request's arguments that borrow the worker's buffer are copied
//! (names, WRITE data, xattr values) and its future is boxed; a future that
//! is pending after its first poll also costs an executor task, the
//! interrupt registration and the executor's wake-ups. These are
//! allocations and hand-offs per request that the sync trait does not make;
//! `docs/performance.md` measures both traits, on operations that complete
//! at once and on a slow backend.
//!
//! ```
//! use fuse_session::asyncfs::{AsyncContext, AsyncFilesystem, AsyncFs, Data, Spawn};
//! use fuse_session::{Entry, Errno, FileAttr, FileHandle, FileKind, Inode, ReadRequest};
//! use std::{ffi::CStr, future::Future, time::Duration};
//!
//! const TTL: Duration = Duration::from_secs(1);
//! const FILE: Inode = Inode(2);
//!
//! /// A file whose content comes from a slow service.
//! struct Remote;
//!
//! async fn fetch(offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
//!     // A network round trip would be awaited here.
//!     let text = b"Hello from far away\n";
//!     let start = (offset as usize).min(text.len());
//!     Ok(text[start..(start + size as usize).min(text.len())].to_vec())
//! }
//!
//! impl AsyncFilesystem for Remote {
//!     async fn lookup(&self, _: &AsyncContext, parent: Inode, name: &CStr) -> Result<Entry, Errno> {
//!         match (parent, name.to_bytes()) {
//!             (Inode::ROOT, b"remote") => {
//!                 Ok(Entry::new(FILE, FileAttr::fixed(2, FileKind::RegularFile, 0o444).with_size(20), TTL))
//!             }
//!             _ => Err(Errno::ENOENT),
//!         }
//!     }
//!
//!     async fn read(&self, _: &AsyncContext, _: Inode, _: FileHandle, req: ReadRequest) -> Result<Data, Errno> {
//!         Ok(fetch(req.offset, req.size).await?.into())
//!     }
//! }
//!
//! /// An executor: here a thread per task, for the example; use your
//! /// runtime's (Tokio: the `tokio` feature's `TokioSpawner`).
//! struct Threads;
//! impl Spawn for Threads {
//!     fn spawn<T: Future<Output = ()> + Send + 'static>(&self, task: T) {
//!         std::thread::spawn(move || block_on(task));
//!     }
//! }
//! # fn block_on<T: Future>(f: T) -> T::Output {
//! #     use std::task::{Context, Poll, Wake, Waker};
//! #     struct Unpark(std::thread::Thread);
//! #     impl Wake for Unpark { fn wake(self: std::sync::Arc<Self>) { self.0.unpark() } }
//! #     let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
//! #     let mut f = std::pin::pin!(f);
//! #     loop {
//! #         if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(&waker)) { return v; }
//! #         std::thread::park();
//! #     }
//! # }
//!
//! let fs = AsyncFs::new(Remote, Threads).max_in_flight(256);
//! assert_eq!(fs.in_flight_limit(), 256);
//! // fuse_session::serve(fs, "/mnt/remote", &Default::default())?;
//! ```

mod adapter;
mod context;
mod filesystem;
mod task;
#[cfg(feature = "tokio")]
mod tokio_spawner;

pub use crate::layers::values::{Created, Data, DirEntry, DirEntryPlus, Ioctl, Open};
pub use adapter::{AsyncFs, DEFAULT_MAX_IN_FLIGHT};
pub use context::AsyncContext;
pub use filesystem::AsyncFilesystem;
pub use task::Spawn;
#[cfg(feature = "tokio")]
pub use tokio_spawner::TokioSpawner;
