//! The agent's server side: shared state, listeners and the per-connection tasks.
//!
//! [`Agent::new`] must be called inside a tokio runtime (it starts the reaper). The same
//! [`Agent`] serves a vsock listener ([`Agent::serve_vsock`], in a guest) or a Unix listener
//! ([`Agent::serve_unix`], host tests). A connection first passes the gates in [`guard`] (host
//! peer, a bounded pool of pending handshakes where a newcomer pushes out the oldest
//! ([`pending`]), the per-boot token in `Hello` within `auth_timeout`); authenticated connections then take slots by what their request is for
//! ([`slots`]: forwards and file streams can never take the slots kept for execs and control
//! requests), and one that finds none gets a `Busy` error and is closed; each later step
//! must arrive within `io_timeout`.
//!
//! System calls std does not have go through [`sys`], where every `unsafe` block of the agent
//! lives behind a safe wrapper.

pub mod bounded;
pub mod cgroup;
mod conn;
pub mod container;
mod exec;
pub mod files;
mod forward;
pub mod guard;
pub mod imageroot;
mod interactive;
pub mod kmod;
pub mod listening;
pub mod pending;
pub mod pid1;
mod podroot;
pub mod process;
mod pty;
pub mod reaper;
pub mod resume;
mod serve;
pub mod shares;
pub mod slots;
pub mod sys;
mod tmpfs;
mod transfer;
pub mod user;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use vm_sync::{Lock, ReadWrite};

use bounded::BoundedWrites;
use cgroup::{CgroupLimits, Cgroups};
use pending::PendingPool;
use reaper::Reaper;
use serve::Serves;
use slots::{SlotLimits, Slots};

use guard::RefusalLog;
use vm_agent_protocol::protocol::{AgentInfo, ErrorKind};
use vm_agent_protocol::token::AgentToken;

/// The vsock listener's accept backlog (the crate binds with 128; the kernel caps it at
/// `net.core.somaxconn`, 4096). A burst of host connections larger than the backlog is reset
/// by the guest kernel before the agent sees it (the host client reads no `OK`), and each
/// reset connection comes back at once if a flood reopens it. The vsock device holds at most
/// 1,023 connections, but one it reset (at its cap, pushing out a silent client) stays in the
/// accept queue until the agent takes it: under a flood on a loaded guest the queue holds
/// those beside the live ones, and at 1,024 it refused a real client.
pub const LISTEN_BACKLOG: i32 = 4096;

/// A connection the agent can serve.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {}

/// Agent errors.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot open root {path}")]
    Root {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the reaper")]
    Reaper(#[source] reaper::ReaperError),
    #[error("cgroup setup failed")]
    Cgroup(#[source] cgroup::CgroupError),
    #[error("cannot listen")]
    Listen(#[source] std::io::Error),
}

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Base directory for file roots and the default working directory (`/` in a guest).
    pub root: PathBuf,
    pub hostname: String,
    /// Running as PID 1 (reported in `AgentInfo`; enables reboot on shutdown in the binary).
    pub pid1: bool,
    /// Reap with `waitpid(-1)` (PID 1 or subreaper); otherwise only registered children.
    pub reap_all: bool,
    /// cgroup2 mount to create `work` under; `None` = no cgroups.
    pub cgroup_base: Option<PathBuf>,
    pub limits: CgroupLimits,
    pub io_timeout: Duration,
    /// Connection slots, by class ([`slots`]).
    pub slots: SlotLimits,
    pub max_serves: usize,
    /// The per-boot token every `Hello` must carry. `None` only for the host test server
    /// (`vm-agent --unix` without `--token-file`); PID 1 refuses to start without one.
    pub token: Option<AgentToken>,
    /// Connections allowed to be in their handshake at once; past it the oldest is dropped
    /// ([`pending`]).
    pub max_pending: usize,
    /// Time a new connection has to present a valid `Hello`.
    pub auth_timeout: Duration,
    /// Where `Resume` writes the VM's generation ([`resume::GENERATION_FILE`]): `/run/vm`
    /// for PID 1; `None` writes nothing (the host test server without `--run-dir`).
    pub generation_dir: Option<PathBuf>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            root: PathBuf::from("/"),
            hostname: "vm".into(),
            pid1: false,
            reap_all: false,
            cgroup_base: None,
            limits: CgroupLimits::default(),
            io_timeout: Duration::from_secs(30),
            slots: SlotLimits::default(),
            max_serves: 16,
            token: None,
            max_pending: 1024,
            auth_timeout: Duration::from_secs(5),
            generation_dir: None,
        }
    }
}

/// The agent's shared state.
#[derive(Debug)]
pub struct Agent {
    opts: AgentOptions,
    base: OwnedFd,
    reaper: Reaper,
    cgroups: Option<Cgroups>,
    serves: Serves,
    next_id: AtomicU64,
    shutdown: Notify,
    slots: Slots,
    pending: Arc<PendingPool>,
    refusals: RefusalLog,
    /// The token every `Hello` must carry: `opts.token` at start, replaced by `Resume`.
    token: std::sync::RwLock<Option<AgentToken>>,
    /// A pod member's root → its cgroup group ([`podroot`]).
    pod_groups: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// Each container's namespaces, by root ([`container`]).
    namespaces: Arc<container::Namespaces>,
}

impl Agent {
    /// Open the root, start the reaper, set up cgroups. Must run inside a tokio runtime.
    pub fn new(opts: AgentOptions) -> Result<Arc<Agent>, AgentError> {
        let base = std::fs::File::open(&opts.root)
            .map_err(|source| AgentError::Root {
                path: opts.root.clone(),
                source,
            })?
            .into();
        let reaper = Reaper::start(opts.reap_all).map_err(AgentError::Reaper)?;
        let cgroups = match &opts.cgroup_base {
            Some(b) => Cgroups::setup(b, opts.limits).map_err(AgentError::Cgroup)?,
            None => None,
        };
        let slots = Slots::new(opts.slots);
        let pending = PendingPool::new(opts.max_pending);
        let token = std::sync::RwLock::new(opts.token.clone());
        Ok(Arc::new(Agent {
            token,
            opts,
            base,
            reaper,
            cgroups,
            serves: Serves::default(),
            next_id: AtomicU64::new(1),
            shutdown: Notify::new(),
            slots,
            pending,
            refusals: RefusalLog::default(),
            pod_groups: Default::default(),
            namespaces: Default::default(),
        }))
    }

    pub fn info(&self) -> AgentInfo {
        AgentInfo {
            agent_version: env!("CARGO_PKG_VERSION").into(),
            hostname: self.opts.hostname.clone(),
            pid1: self.opts.pid1,
            cgroups: self.cgroups.is_some(),
        }
    }

    /// Connections refused so far (wrong peer, wrong token, handshake pool full, …).
    pub fn refused(&self) -> u64 {
        self.refusals.total()
    }

    /// Whether `presented` is the current token (constant-time); `None` when the agent has
    /// none (the host test server without `--token-file`).
    pub(crate) fn token_matches(
        &self,
        presented: &[u8; vm_agent_protocol::token::TOKEN_LEN],
    ) -> Option<bool> {
        let token = self.token.read_locked();
        token.as_ref().map(|t| t.matches(presented))
    }
    /// Replaces the token every later `Hello` must carry.
    pub(crate) fn set_token(&self, token: AgentToken) {
        *self.token.write_locked() = Some(token);
    }
    pub(crate) fn is_pid1(&self) -> bool {
        self.opts.pid1
    }
    pub(crate) fn generation_dir(&self) -> Option<&Path> {
        self.opts.generation_dir.as_deref()
    }
    /// The handshake deadline: `auth_timeout`, or `io_timeout` when that is shorter.
    pub(crate) fn auth_timeout(&self) -> Duration {
        self.opts.auth_timeout.min(self.opts.io_timeout)
    }
    pub(crate) fn io_timeout(&self) -> Duration {
        self.opts.io_timeout
    }
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
    pub(crate) fn root_path(&self) -> &Path {
        &self.opts.root
    }
    pub(crate) fn base_fd(&self) -> BorrowedFd<'_> {
        self.base.as_fd()
    }
    pub(crate) fn reaper(&self) -> &Reaper {
        &self.reaper
    }
    pub(crate) fn cgroups(&self) -> Option<&Cgroups> {
        self.cgroups.as_ref()
    }
    /// The cgroup group of the pod member whose root is `root`, if it has one.
    pub(crate) fn pod_group(&self, root: &str) -> Option<String> {
        let groups = self.pod_groups.locked();
        groups.get(root).cloned()
    }
    fn pod_groups(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, String>> {
        self.pod_groups.locked()
    }
    /// The containers' namespaces ([`container`]).
    pub(crate) fn namespaces(&self) -> Arc<container::Namespaces> {
        self.namespaces.clone()
    }
    pub(crate) fn serves(&self) -> &Serves {
        &self.serves
    }
    pub(crate) fn slots(&self) -> &Slots {
        &self.slots
    }
    pub(crate) fn max_serves(&self) -> usize {
        self.opts.max_serves
    }
    fn request_shutdown(&self) {
        self.serves.kill_all();
        self.shutdown.notify_one();
    }

    /// Serve one accepted connection on its own task, through the gates of [`guard`].
    ///
    /// Every write on the connection goes through [`BoundedWrites`] (at most 16 KiB per
    /// `write(2)`: see [`bounded`] for the guest-kernel/vsock-backend interplay this avoids).
    pub fn spawn_conn<S: Stream>(self: &Arc<Self>, s: S) {
        let (mut pending, evicted) = self.pending.enter();
        if evicted {
            self.refusals
                .refuse("handshake pool full: its oldest connection was dropped");
        }
        let mut s = BoundedWrites::new(s);
        let agent = self.clone();
        tokio::spawn(async move {
            // Biased: a `Hello` already read wins over a later eviction.
            let authenticated = tokio::select! {
                biased;
                r = conn::authenticate(&agent, &mut s) => r,
                () = pending.evicted() => return,
            };
            if let Err(why) = authenticated {
                agent.refusals.refuse(why);
                return;
            }
            drop(pending);
            let Some(admitted) = agent.slots.admit() else {
                let t = Duration::from_secs(1);
                let _ = conn::send_error(&mut s, ErrorKind::Busy, "too many connections", t).await;
                return;
            };
            if let Err(e) = conn::handle(&agent, s, admitted).await {
                tracing::debug!(error = %vm_error_chain::error_chain(&e), "connection ended");
            }
        });
    }

    /// Accept on a Unix listener until `Shutdown` is requested.
    pub async fn serve_unix(self: &Arc<Self>, l: tokio::net::UnixListener) {
        loop {
            tokio::select! {
                _ = self.shutdown.notified() => return,
                r = l.accept() => match r {
                    Ok((s, _)) => {
                        self.spawn_conn(s);
                        tokio::task::yield_now().await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
    }

    /// Bind the vsock listener on `port` (any CID), with an accept backlog of
    /// [`LISTEN_BACKLOG`].
    pub fn bind_vsock(port: u32) -> Result<tokio_vsock::VsockListener, AgentError> {
        let addr = tokio_vsock::VsockAddr::new(tokio_vsock::VMADDR_CID_ANY, port);
        let l = tokio_vsock::VsockListener::bind(addr).map_err(AgentError::Listen)?;
        sys::net::set_backlog(l.as_fd(), LISTEN_BACKLOG).map_err(AgentError::Listen)?;
        Ok(l)
    }

    /// Accept on a vsock listener until `Shutdown` is requested.
    pub async fn serve_vsock(self: &Arc<Self>, l: tokio_vsock::VsockListener) {
        loop {
            tokio::select! {
                _ = self.shutdown.notified() => return,
                r = l.accept() => match r {
                    Ok((s, peer)) if guard::host_peer(peer.cid()) => {
                        self.spawn_conn(s);
                        // One connection accepted, then every task that is ready runs: a
                        // flood of new connections cannot starve those already made (the
                        // runtime has one thread; its own budget yields only every 128).
                        tokio::task::yield_now().await;
                    }
                    Ok((s, _)) => {
                        drop(s);
                        self.refusals.refuse("peer is not the host (CID 2)");
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
    }
}
