//! [`TokioSpawner`]: runs the futures of an
//! [`AsyncFs`](crate::layers::asyncfs::AsyncFs) on a Tokio runtime (the `tokio`
//! feature).

use crate::layers::asyncfs::task::Spawn;
use std::future::Future;
use tokio::runtime::Handle;

/// Spawns request futures on a Tokio runtime, by its [`Handle`].
///
/// The session's threads are not the runtime's: they read requests and
/// spawn, the runtime's workers run the futures. Keep the runtime alive
/// while the session serves; a runtime shut down meanwhile drops the tasks,
/// whose requests are then answered `EIO`.
///
/// ```no_run
/// # use fuse_session::asyncfs::{AsyncFilesystem, AsyncFs, TokioSpawner};
/// # struct MyFs;
/// # impl AsyncFilesystem for MyFs {}
/// /// Serves `MyFs` until it is unmounted, its futures running on the
/// /// runtime of `handle` (a multi-threaded runtime the program built).
/// fn serve_on(handle: tokio::runtime::Handle) -> Result<(), fuse_session::SessionError> {
///     let fs = AsyncFs::new(MyFs, TokioSpawner::new(handle));
///     fuse_session::serve(fs, "/mnt/my", &Default::default())?;
///     Ok(())
/// }
/// ```
#[derive(Clone, Debug)]
pub struct TokioSpawner(Handle);

impl TokioSpawner {
    /// Spawns on the runtime of `handle`.
    pub fn new(handle: Handle) -> TokioSpawner {
        TokioSpawner(handle)
    }

    /// Spawns on the runtime the caller runs in (`Handle::current`: panics
    /// outside of one).
    pub fn current() -> TokioSpawner {
        TokioSpawner(Handle::current())
    }
}

impl Spawn for TokioSpawner {
    fn spawn<T: Future<Output = ()> + Send + 'static>(&self, task: T) {
        // The task answers its request itself; nothing waits for the handle.
        drop(self.0.spawn(task));
    }

    fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        let _runtime = self.0.enter();
        f()
    }
}
