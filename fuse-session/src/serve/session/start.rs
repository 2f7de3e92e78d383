//! Binding a filesystem to a connection and INIT: the constructors of a
//! [`Session`] (a channel, a mount, a descriptor handed over, a connection
//! resumed), the handshake (INIT read, negotiated, answered, resent for a
//! successor) and the state the workers share once it is done.

use super::config::{SPLICE_WRITE_MIN, SessionConfig, StartStep};
use super::handle::{HandleInner, SessionHandle};
use super::serving::unmount_guard;
use super::{Session, SessionError};
use crate::buffer::AlignedBuf;
use crate::conn::Shared;
use crate::credentials::CallerPolicy;
use crate::deferred::Helpers;
use crate::filesystem::Filesystem;
use crate::init::{InitConfig, InitOutcome, Negotiated, check_version, negotiate};
use crate::interrupt::{InflightTable, PendingInterrupts};
use crate::mount::{Mount, MountOptions};
use crate::notify::Notifier;
use crate::pool::{Pool, PoolConfig};
use crate::ring_worker;
use crate::signal::Threads;
use crate::stats::{PanicLog, StatsTable};
use crate::transport::uring::{self, Unavailable};
use crate::transport::{Channel, Transport};
use fuse_proto::abi::InitIn;
use fuse_proto::flags::{FopenFlags, InitFlags};
use fuse_proto::request::{ParseConfig, peek_unique};
use fuse_proto::{Errno, Opcode, Operation, Reply, Request};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

impl<F: Filesystem> Session<F> {
    /// Binds `fs` to the connection behind `chan` (a mounted `/dev/fuse` fd,
    /// or the fake kernel).
    pub fn new(fs: F, chan: Arc<dyn Channel>, config: SessionConfig) -> std::io::Result<Self> {
        Self::from_arc(Arc::new(fs), chan, config)
    }

    /// Like [`Session::new`] for a filesystem the caller keeps a reference to.
    pub fn from_arc(fs: Arc<F>, chan: Arc<dyn Channel>, config: SessionConfig) -> std::io::Result<Self> {
        let (notifier, notify_thread) = Notifier::start(chan.clone())?;
        let handle = SessionHandle(Arc::new(HandleInner {
            shared: OnceLock::new(),
            transport: OnceLock::new(),
            notifier,
            stop: AtomicBool::new(false),
            threads: Arc::new(Threads::default()),
            on_stop: Mutex::new(None),
            ring_waker: Mutex::new(None),
            retiring: AtomicBool::new(false),
        }));
        Ok(Self {
            fs,
            chan,
            config,
            handle,
            notify_thread: Some(notify_thread),
            uring: false,
            mount: None,
            handed_over: false,
            resumed: None,
            mount_left: Arc::new(Mutex::new(None)),
            mount_default_permissions: false,
            resend_before_init: false,
        })
    }

    /// Goes on serving a connection a predecessor handed over
    /// ([`crate::handover::Handover`]): no INIT (the kernel negotiates once
    /// per connection; `negotiated` is what it granted, so the filesystem's
    /// `init` is not called and it must restore its own state first), and
    /// before serving, the kernel is asked to send again the requests the
    /// predecessor read and left unanswered (`FUSE_NOTIFY_RESEND`, when the
    /// kernel offered `HAS_RESEND`). Such a session never unmounts: the
    /// mount belongs to whoever mounted it (a keeper).
    ///
    /// It serves over `/dev/fuse`; a connection INIT put on io_uring is
    /// refused (`ErrorKind::Unsupported`): the kernel sends its requests to
    /// ring entries only, and the entries of a daemon that ends fail what
    /// they are handed meanwhile (`docs/recovery.md`). The successor is expected in the pid namespace
    /// of the process that mounted (a keeper starts it so): callers'
    /// credentials are read from `/proc` as for a session that mounted.
    pub fn resume(
        fs: Arc<F>,
        dev: std::os::fd::OwnedFd,
        negotiated: Negotiated,
        config: SessionConfig,
    ) -> std::io::Result<Self> {
        if negotiated.flags.contains(InitFlags::OVER_IO_URING) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "the connection is on FUSE-over-io_uring, which cannot be taken over: the kernel sends its \
                 requests only to ring entries, and fails with ECANCELED those it hands to the entries of \
                 a daemon that ends (see docs/recovery.md)",
            ));
        }
        let chan: Arc<dyn Channel> = Arc::new(crate::transport::dev_fuse::DevFuse::from_fd(dev));
        let mut s = Self::from_arc(fs, chan, config)?;
        s.mount_default_permissions = negotiated.default_permissions;
        s.resumed = Some(negotiated);
        Ok(s)
    }

    /// Mounts `fs` at `mountpoint` with `opts` (privileged `mount(2)` as
    /// root, else through `fusermount3`; a mountpoint `/dev/fd/N` serves an
    /// fd handed over by a privileged helper) and binds a session to it. The
    /// session unmounts when it ends or is stopped, touching only its own
    /// mount (see [`MountGuard::unmount`](crate::mount::MountGuard::unmount)).
    pub fn mount(
        fs: F,
        mountpoint: impl AsRef<std::path::Path>,
        opts: &MountOptions,
        config: SessionConfig,
    ) -> Result<Self, SessionError> {
        Self::mount_arc(Arc::new(fs), mountpoint, opts, config)
    }

    /// Like [`Session::mount`] for a filesystem the caller keeps a reference to.
    pub fn mount_arc(
        fs: Arc<F>,
        mountpoint: impl AsRef<std::path::Path>,
        opts: &MountOptions,
        config: SessionConfig,
    ) -> Result<Self, SessionError> {
        let m = Mount::new(mountpoint, opts)?;
        Self::from_mount(fs, m, opts, config)
    }

    /// Binds a session to a mount made with `opts` (its fd and its guard):
    /// the session unmounts when it ends or is stopped, but not when it
    /// retires ([`SessionHandle::retire`]).
    pub fn from_mount(
        fs: Arc<F>,
        m: Mount,
        opts: &MountOptions,
        mut config: SessionConfig,
    ) -> Result<Self, SessionError> {
        if m.allow_root() && config.deny_others.is_none() {
            config.deny_others = Some(nix::unistd::getuid().as_raw());
        }
        let handed_over = m.method() == crate::mount::MountMethod::HandedOver;
        let (dev, guard) = m.into_parts();
        let mut s = Self::from_arc(fs, Arc::new(dev), config)?;
        s.handed_over = handed_over;
        s.mount_default_permissions = opts.default_permissions;
        let guard = Arc::new(Mutex::new(Some(guard)));
        let on_stop = guard.clone();
        let left = s.mount_left.clone();
        s.handle.set_on_stop(move || unmount_guard(&on_stop, &left));
        s.mount = Some(guard);
        Ok(s)
    }

    /// Whether the mount has `default_permissions` (the kernel checks
    /// permissions itself), for a session bound to a connection another
    /// process mounted.
    pub(crate) fn set_default_permissions(&mut self, on: bool) {
        self.mount_default_permissions = on;
    }

    /// Before waiting for INIT, asks the kernel to send again what was read
    /// and not answered (`FUSE_NOTIFY_RESEND`): a predecessor on a new
    /// connection may have read INIT and died before answering it. The
    /// kernel sends nothing else before INIT is answered; one without RESEND
    /// refuses the notification, which is then of no matter.
    pub(crate) fn resend_before_init(&mut self) {
        self.resend_before_init = true;
    }

    /// The handle (statistics, notifier, stop).
    pub fn handle(&self) -> SessionHandle {
        self.handle.clone()
    }

    /// The handshake: what io_uring needs is checked before INIT, so that
    /// the flag is only asked for when the rings can be built; then INIT is
    /// answered. Returns what was negotiated, the first worker's buffer
    /// (sized for it), the number of ring queues to start (0: none) and why
    /// io_uring is not used when it was asked for. On error the notifier is
    /// closed and our mount unmounted.
    pub(super) fn handshake_phase(
        &mut self,
    ) -> Result<(Negotiated, AlignedBuf, usize, Option<Unavailable>), SessionError> {
        let mut fallback: Option<Unavailable> = None;
        let mut nr_queues = 0;
        if self.config.transport != Transport::DevFuse {
            match uring::probe() {
                Ok(n) => nr_queues = n,
                Err(why) => fallback = Some(why),
            }
        }
        self.uring = self.config.transport != Transport::DevFuse && fallback.is_none();
        let mut buf = AlignedBuf::receive(crate::init::DEFAULT_MAX_WRITE as usize + 4096);
        if self.resend_before_init
            && let Err(e) = self.chan.send(&fuse_proto::reply::notify::resend())
        {
            log::debug!("RESEND before INIT: {e}");
        }
        let negotiated = match self.handshake(buf.as_mut_slice()) {
            Ok(n) => n,
            Err(e) => {
                self.finish_notifier();
                if let Some(g) = &self.mount {
                    unmount_guard(g, &self.mount_left);
                }
                return Err(e);
            }
        };
        if self.uring && !negotiated.flags.contains(InitFlags::OVER_IO_URING) {
            fallback = Some(ring_worker::why_not_granted(&negotiated));
        }
        if fallback.is_some() || !self.uring {
            nr_queues = 0;
        }
        if buf.len() != negotiated.buffer_size() {
            buf = AlignedBuf::receive(negotiated.buffer_size());
        }
        Ok((negotiated, buf, nr_queues, fallback))
    }

    /// The state every worker (and ring entry) shares, fixed after INIT,
    /// published to the handle and the notifier.
    pub(super) fn shared_state(
        &self,
        negotiated: &Negotiated,
        pool_cfg: PoolConfig,
        nr_queues: usize,
    ) -> Arc<Shared> {
        let slots = pool_cfg.slots();
        let shared = Arc::new(Shared {
            parse: ParseConfig {
                minor: negotiated.minor,
                setxattr_ext: negotiated.flags.contains(InitFlags::SETXATTR_EXT),
                atomic_open: self.config.atomic_open,
            },
            negotiated: negotiated.clone(),
            tables: (0..slots + nr_queues).map(|_| InflightTable::new()).collect(),
            stats: StatsTable::new(slots + nr_queues, self.config.track_inflight),
            pool: Pool::new(pool_cfg),
            helpers: Helpers::new(
                self.config.max_deferred,
                self.config.max_deferred_per_uid,
                self.config.idle_timeout,
            ),
            pending: PendingInterrupts::default(),
            notifier: self.handle.0.notifier.clone(),
            shutdown: AtomicBool::new(self.handle.0.stop.load(Ordering::Acquire)),
            destroyed: AtomicBool::new(false),
            deny_others: self.config.deny_others,
            journal: self.config.journal.clone(),
            splice_write: self
                .config
                .splice_write
                .then_some(match self.config.splice_write_min {
                    0 => SPLICE_WRITE_MIN,
                    n => n,
                }),
            uring_base: slots,
            o_direct: if self.config.o_direct_parallel_writes {
                negotiated.o_direct_flags()
            } else {
                FopenFlags::empty()
            },
            callers: CallerPolicy::new(
                self.config.proc_credentials,
                self.handed_over,
                negotiated.default_permissions,
            ),
            panics: PanicLog::default(),
        });
        // The notifier learns the negotiation before the handle publishes it,
        // so that nobody who sees `negotiated()` gets `NotReady` from it.
        self.handle.0.notifier.set_negotiated(negotiated.clone());
        self.step(StartStep::SharedMade);
        let _ = self.handle.0.shared.set(shared.clone());
        // A stop (or retire) that came between reading `stop` above and
        // publishing found no shared state to mark: it is seen here.
        // (Pairs with the fence in `SessionHandle::stop`.)
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.handle.0.stop.load(Ordering::SeqCst) {
            shared.shutdown.store(true, Ordering::Release);
        }
        shared
    }

    /// Reads until INIT, answers it, and returns what was negotiated.
    fn handshake(&mut self, buf: &mut [u8]) -> Result<Negotiated, SessionError> {
        loop {
            if self.handle.0.stop.load(Ordering::Acquire) {
                return Err(SessionError::EndedBeforeInit);
            }
            let n = match self.chan.receive(buf) {
                Ok(n) => n,
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR | libc::EAGAIN) => continue,
                    Some(libc::ENODEV | libc::ECONNABORTED) => return Err(SessionError::EndedBeforeInit),
                    _ => return Err(SessionError::Io(e)),
                },
            };
            let msg = &buf[..n];
            let init = match Request::parse(msg, 0) {
                Ok(Request {
                    op: Operation::Init { arg },
                    header,
                    ..
                }) => (header.unique, arg),
                // The kernel sends nothing before INIT is answered: any
                // other request means someone answered INIT already.
                // Answering it (or the ones after it) with errors would
                // fail every caller of a live mount for good.
                Ok(req) => {
                    return Err(SessionError::AlreadyInitialised(req.op.opcode()));
                }
                Err(e) => {
                    log::error!("malformed request before INIT: {e}");
                    if let Some(u) = peek_unique(msg) {
                        self.send(Opcode::Init, &Reply::error(u, Errno::EIO));
                    }
                    continue;
                }
            };
            let (unique, arg) = init;
            match self.init(unique, &arg)? {
                Some(n) => return Ok(n),
                None => continue,
            }
        }
    }

    fn send(&self, op: Opcode, msg: &Reply<'_>) {
        crate::transport::send_reply(&*self.chan, op, msg.header().unique, msg);
    }

    fn init(&mut self, unique: u64, arg: &InitIn) -> Result<Option<Negotiated>, SessionError> {
        match check_version(arg) {
            Some(InitOutcome::NewerMajor(out)) => {
                log::info!(
                    "kernel speaks protocol {}.{}; offering 7.{}",
                    arg.major,
                    arg.minor,
                    out.minor
                );
                self.send(
                    Opcode::Init,
                    &Reply::init(unique, &out, fuse_proto::consts::KERNEL_MINOR_VERSION),
                );
                return Ok(None);
            }
            Some(InitOutcome::Reject(why)) => {
                log::error!("{why}");
                self.send(
                    Opcode::Init,
                    &Reply::error(unique, Errno::new_or_eio(libc::EPROTO)),
                );
                return Err(SessionError::Unsupported(why));
            }
            None => {}
        }
        let mut cfg = InitConfig::new(arg);
        cfg.default_permissions = self.mount_default_permissions;
        if self.uring {
            cfg.want(InitFlags::OVER_IO_URING);
        }
        if let Err(e) = self.fs.init(&mut cfg) {
            self.send(Opcode::Init, &Reply::error(unique, e));
            return Err(SessionError::FilesystemRefused(e));
        }
        let (n, out) = negotiate(&cfg, self.uring, self.config.atomic_open);
        log::info!(
            "INIT: protocol 7.{} (kernel 7.{}), max_write {}, granted {:?}",
            n.minor,
            n.kernel_minor,
            n.max_write,
            n.flags
        );
        let resent = unique & fuse_proto::consts::UNIQUE_RESEND != 0;
        crate::fault::point(Opcode::Init, crate::fault::Point::Effect, resent);
        if let Some(hook) = &self.config.on_negotiated {
            (hook.0)(&n);
        }
        crate::fault::point(Opcode::Init, crate::fault::Point::Reply, resent);
        self.send(Opcode::Init, &Reply::init(unique, &out, arg.minor));
        Ok(Some(n))
    }
}
