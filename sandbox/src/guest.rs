//! [`Guest`]: the operations on a running guest, one implementation for every way of
//! reaching it. [`crate::MicroVm`] (a VM this process booted) and [`crate::RunningVm`] (a VM
//! another process holds, attached by its agent socket) both dereference to a `Guest`, so
//! request building, path confinement and the environment checks live here once.
//!
//! Host-side rules, applied before a request reaches the agent:
//! - file paths are relative to the root (no `..`, no absolute path, no NUL; see
//!   [`confine`]), or, for [`Guest::read_absolute`]/[`Guest::write_absolute`], absolute guest
//!   paths checked the same way; the agent checks again beneath its root;
//! - a working directory is relative to the root or any absolute guest path, normalized
//!   (no `..`; [`confine::workdir`]): it confines nothing, the file-path rule above does;
//! - every process gets exactly the VM's environment, plus the variables its [`Run`] sets,
//!   and that whole environment passes [`vm_spec::env::check_env`] (secret-looking values
//!   are refused unless allowed by the spec's or the run's `env_allow`).
//!
//! Files of any size stream through [`Guest::copy_in`], [`Guest::copy_out`] and the
//! `*_to`/`*_from` calls (see `transfer`); `read_file`/`write_file` hold one in memory.

use std::time::Duration;

use vm_agent_client::{ExecStream, Interactive};
use vm_agent_protocol::container::Confine;
use vm_agent_protocol::protocol::{
    Command, ErrorKind, ExecOutput, ExecRequest, InteractiveRequest, TtySize,
};
use vm_drivers::MachineError;

use crate::confine;
use crate::error::SandboxError;
use crate::glob::Glob;
use crate::link::Link;
use crate::publish::PublishSpec;
use crate::serving::{GuestProcess, ServeSpec, ServedProcess, Serving};

mod member;
mod transfer;

pub use member::MemberRoot;

pub use transfer::{CopyError, DEFAULT_COPY_CAP};

/// `PATH` for the runtime's own setup commands (never for the caller's work, whose
/// environment is exactly the VM's).
const SETUP_PATH: &str = vm_spec::DEFAULT_GUEST_PATH;

/// One command to run with more control than [`Guest::exec`]/[`Guest::capture`].
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub command: Command,
    /// Written to stdin, then closed (the way to pass a secret: never on the command line).
    pub stdin: Vec<u8>,
    /// Working directory: relative to the root, or absolute under it; `None` = the root.
    pub cwd: Option<String>,
    /// Kill the process tree after this long; `None` = the client default.
    pub timeout: Option<Duration>,
    /// Variables set for this command on top of the VM's environment (a name the VM
    /// already has is replaced).
    pub env: Vec<(String, String)>,
    /// Names in `env` allowed to look like secrets, besides the spec's `env_allow`.
    pub env_allow: Vec<String>,
    /// Run as this user instead of the VM's (`NAME`, `UID`, `NAME:GROUP`, `UID:GID`).
    pub user: Option<String>,
}

/// What an image root's config supplies to every process (empty without one).
#[derive(Debug, Clone, Default)]
pub(crate) struct ProcessDefaults {
    /// The user every process runs as (`Spec.user`, else the image's `User`).
    pub user: Option<String>,
    /// The directory a process runs in when none is given (the image's `WorkingDir`).
    pub working_dir: Option<String>,
    /// `Entrypoint` + `Cmd`: run for an empty argv.
    pub command: Vec<String>,
}

/// What a [`Guest`] is confined to: its working root and its environment.
#[derive(Debug, Clone)]
pub(crate) struct Confinement {
    /// The guest working root (absolute, normalized).
    pub root: String,
    /// The environment of every process.
    pub env: Vec<(String, String)>,
    /// Names allowed to look like secrets.
    pub env_allow: Vec<String>,
    /// The image's process defaults.
    pub defaults: ProcessDefaults,
}

/// The operations on one running guest (see the module docs).
#[derive(Debug)]
pub struct Guest {
    link: Link,
    confinement: Confinement,
    root_ready: tokio::sync::OnceCell<()>,
    /// A pod member's root: every process runs with this guest directory as `/`
    /// ([`Guest::member`]).
    member_root: Option<String>,
}

impl Guest {
    /// A guest reached through `link`. `root_exists` says the root was already created (a
    /// VM attached after its boot); otherwise it is created before the first operation.
    pub(crate) fn new(link: Link, confinement: Confinement, root_exists: bool) -> Guest {
        let root_ready = match root_exists {
            true => tokio::sync::OnceCell::new_with(Some(())),
            false => tokio::sync::OnceCell::new(),
        };
        Guest {
            link,
            confinement,
            root_ready,
            member_root: None,
        }
    }

    /// The guest working root.
    pub fn root(&self) -> &str {
        &self.confinement.root
    }

    /// The environment every process in the guest gets (before a [`Run`]'s own variables).
    pub fn env(&self) -> &[(String, String)] {
        &self.confinement.env
    }

    /// Create the guest root (and the image's working directory) once, before the first
    /// operation that needs it. With a user configured, the root is handed to that user so
    /// its work can write there (in an image root the change lands in the tmpfs upper).
    async fn ensure_root(&self) -> Result<(), SandboxError> {
        self.root_ready
            .get_or_try_init(|| async {
                let d = &self.confinement.defaults;
                match self
                    .link
                    .call(|c| c.make_dirs(self.root(), d.user.as_deref()))
                    .await
                {
                    Ok(()) => {
                        if let Some(w) = &d.working_dir {
                            self.link
                                .call(|c| c.make_dirs(w, None))
                                .await
                                .map_err(SandboxError::machine("creating root"))?;
                        }
                        return Ok(());
                    }
                    Err(MachineError::Agent(e))
                        if e.agent_kind() == Some(ErrorKind::Unsupported) =>
                    {
                        tracing::debug!(
                            "the agent predates MakeDirs: creating the root with mkdir"
                        );
                    }
                    Err(e) => return Err(SandboxError::machine("creating root")(e)),
                }
                let mut mkdir = vec!["mkdir".to_string(), "-p".into(), self.root().into()];
                mkdir.extend(d.working_dir.clone());
                self.setup(mkdir).await?;
                if let Some(user) = &d.user {
                    self.setup(vec!["chown".into(), user.clone(), self.root().into()])
                        .await?;
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Run one of the runtime's own setup commands as root with [`SETUP_PATH`].
    async fn setup(&self, argv: Vec<String>) -> Result<(), SandboxError> {
        let req = ExecRequest {
            command: Command::Argv(argv),
            env: vec![("PATH".into(), SETUP_PATH.into())],
            timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        let out = self
            .link
            .call(|c| c.exec(req))
            .await
            .map_err(SandboxError::machine("creating root"))?;
        if !out.status.success() {
            return Err(SandboxError::Root(
                String::from_utf8_lossy(&out.output).into(),
            ));
        }
        Ok(())
    }

    /// Where processes run when no directory is given: the image's working directory, else
    /// the root.
    fn default_cwd(&self) -> String {
        let d = &self.confinement.defaults;
        d.working_dir.as_deref().unwrap_or(self.root()).to_string()
    }

    /// `argv`, or the image's `Entrypoint` + `Cmd` when it is empty.
    fn argv_or_default(&self, argv: Vec<String>) -> Result<Vec<String>, SandboxError> {
        if !argv.is_empty() {
            return Ok(argv);
        }
        let command = self.confinement.defaults.command.clone();
        if command.is_empty() {
            return Err(SandboxError::NoCommand);
        }
        Ok(command)
    }

    /// The agent request for `run`: working directory confined, environment merged and
    /// checked.
    fn request(&self, run: Run) -> Result<ExecRequest, SandboxError> {
        if let Some(u) = &run.user {
            vm_spec::imageconfig::check_user("run.user", u).map_err(SandboxError::Spec)?;
        }
        let cwd = match run.cwd.as_deref() {
            Some(cwd) => confine::workdir(self.root(), cwd)?,
            None => self.default_cwd(),
        };
        let command = match run.command {
            Command::Argv(argv) => Command::Argv(self.argv_or_default(argv)?),
            c => c,
        };
        let mut env = self.confinement.env.clone();
        for (k, v) in run.env {
            env.retain(|(ek, _)| *ek != k);
            env.push((k, v));
        }
        let allow: Vec<String> = self
            .confinement
            .env_allow
            .iter()
            .chain(&run.env_allow)
            .cloned()
            .collect();
        vm_spec::env::check_env(&env, &allow).map_err(SandboxError::Env)?;
        Ok(ExecRequest {
            command,
            stdin: run.stdin,
            env,
            cwd: Some(cwd),
            timeout: run.timeout,
            max_output: None,
            user: run.user.or_else(|| self.confinement.defaults.user.clone()),
        })
    }

    /// Run a shell line (`/bin/sh -c`) in the root; a non-zero exit is a result.
    pub async fn exec(&self, line: &str) -> Result<ExecOutput, SandboxError> {
        self.run(Run {
            command: Command::Shell(line.into()),
            ..Default::default()
        })
        .await
    }

    /// Run an argv directly (no shell) in the root and collect its combined output.
    pub async fn capture<S: AsRef<str>>(&self, argv: &[S]) -> Result<ExecOutput, SandboxError> {
        let argv = argv.iter().map(|s| s.as_ref().to_string()).collect();
        self.run(Run {
            command: Command::Argv(argv),
            ..Default::default()
        })
        .await
    }

    /// Run with stdin, a working directory, a timeout or extra variables.
    pub async fn run(&self, run: Run) -> Result<ExecOutput, SandboxError> {
        self.refuse_member()?;
        let req = self.request(run)?;
        self.ensure_root().await?;
        self.link
            .call(|c| c.exec(req))
            .await
            .map_err(SandboxError::machine("exec"))
    }

    /// Start a command and stream its stdout/stderr; dropping the stream kills it.
    pub async fn exec_stream(&self, run: Run) -> Result<ExecStream, SandboxError> {
        self.refuse_member()?;
        let req = self.request(run)?;
        self.ensure_root().await?;
        self.link
            .call(|c| c.exec_stream(req))
            .await
            .map_err(SandboxError::machine("exec stream"))
    }

    /// Start a command with stdin streamed from the caller: write it through the returned
    /// [`Interactive::input`] (its end is a half-close), read output and the exit status from
    /// [`Interactive::output`]. With `tty`, the command runs on a pseudo-terminal of that size
    /// in the guest (its session's controlling terminal; output is all stdout; resize through
    /// the input half). `run.stdin` must be empty. Dropping both halves kills the command.
    /// Set `TERM` in `run.env` for programs that need it: nothing is added.
    pub async fn exec_interactive(
        &self,
        run: Run,
        tty: Option<TtySize>,
    ) -> Result<Interactive, SandboxError> {
        let req = self.interactive_request(run, tty).await?;
        let started = match &self.member_root {
            None => self.link.call(|c| c.exec_interactive(req)).await,
            Some(root) => self.link.call(|c| c.exec_interactive_in(root, req)).await,
        };
        started.map_err(SandboxError::machine("interactive exec"))
    }

    /// As [`Guest::exec_interactive`], the process confined as a container's (its
    /// capabilities, `no_new_privs`, groups, seccomp filter and namespaces; see
    /// `vm_agent_protocol::container`): in the member's root for a pod member, else in the VM's own
    /// root. Only an agent that is PID 1 runs it.
    pub async fn exec_container(
        &self,
        run: Run,
        tty: Option<TtySize>,
        confine: Confine,
    ) -> Result<Interactive, SandboxError> {
        let req = self.interactive_request(run, tty).await?;
        let root = self.member_root.as_deref();
        self.link
            .call(|c| c.exec_container(root, req, confine))
            .await
            .map_err(SandboxError::machine("container exec"))
    }

    /// The request of an interactive exec of `run` (whose stdin must be empty).
    async fn interactive_request(
        &self,
        run: Run,
        tty: Option<TtySize>,
    ) -> Result<InteractiveRequest, SandboxError> {
        if !run.stdin.is_empty() {
            return Err(SandboxError::Unsupported(
                "interactive exec: stdin is written through the input half, not Run::stdin",
            ));
        }
        let exec = self.request(run)?;
        self.ensure_root().await?;
        Ok(InteractiveRequest { exec, tty })
    }

    /// Read a file relative to the root.
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, SandboxError> {
        let rel = confine::relative(path, false)?;
        self.ensure_root().await?;
        self.read_under(self.root(), &rel).await
    }

    /// Write a file relative to the root (parents are created).
    pub async fn write_file(&self, path: &str, data: &[u8]) -> Result<(), SandboxError> {
        let rel = confine::relative(path, false)?;
        self.ensure_root().await?;
        self.write_under(self.root(), &rel, data).await
    }

    /// Read a file by its absolute guest path (anywhere in the guest, like `docker cp`).
    pub async fn read_absolute(&self, path: &str) -> Result<Vec<u8>, SandboxError> {
        let rel = confine::absolute(path)?;
        self.read_under("/", &rel).await
    }

    /// Write a file by its absolute guest path (parents are created).
    pub async fn write_absolute(&self, path: &str, data: &[u8]) -> Result<(), SandboxError> {
        let rel = confine::absolute(path)?;
        self.write_under("/", &rel, data).await
    }

    /// Mounts a fresh tmpfs of `size_bytes` at the absolute guest directory `path` (created
    /// if missing; mode 1777, `nosuid`, `nodev`): the runtime's own setup, done by the agent
    /// (an agent older than this answers `Unsupported`).
    pub async fn mount_tmpfs(&self, path: &str, size_bytes: u64) -> Result<(), SandboxError> {
        let rel = confine::absolute(path)?;
        let path = format!("/{rel}");
        self.link
            .call(|c| c.mount_tmpfs(&path, size_bytes))
            .await
            .map_err(SandboxError::machine("mount tmpfs"))
    }

    /// Sets the permission bits (`mode & 0o777`) of the regular file at the absolute guest
    /// path `path` (an agent older than this answers `Unsupported`).
    pub async fn set_mode(&self, path: &str, mode: u32) -> Result<(), SandboxError> {
        let rel = confine::absolute(path)?;
        let path = format!("/{rel}");
        self.link
            .call(|c| c.set_mode(&path, mode))
            .await
            .map_err(SandboxError::machine("set mode"))
    }

    /// Removes the file at `path` (relative to the root): a regular file, or a symlink itself
    /// (never what it points to); a directory is refused, and so is a path with nothing there
    /// (an agent older than this answers `Unsupported`).
    pub async fn remove(&self, path: &str) -> Result<(), SandboxError> {
        let rel = confine::relative(path, false)?;
        self.ensure_root().await?;
        self.link
            .call(|c| c.remove(self.root(), &rel))
            .await
            .map_err(SandboxError::machine("remove"))
    }

    async fn read_under(&self, base: &str, rel: &str) -> Result<Vec<u8>, SandboxError> {
        self.link
            .call(|c| c.read_file(base, rel))
            .await
            .map_err(SandboxError::machine("read file"))
    }

    async fn write_under(&self, base: &str, rel: &str, data: &[u8]) -> Result<(), SandboxError> {
        self.link
            .call(|c| c.write_file(base, rel, data))
            .await
            .map_err(SandboxError::machine("write file"))
    }

    /// Regular files under `dir` (relative to the root; `""` = the root), as sorted paths
    /// relative to the root.
    pub async fn walk(&self, dir: &str) -> Result<Vec<String>, SandboxError> {
        let rel = confine::relative(dir, true)?;
        self.ensure_root().await?;
        let entries = match self.link.call(|c| c.list(self.root(), &rel)).await {
            Ok(e) => e,
            Err(MachineError::Agent(e)) if e.agent_kind() == Some(ErrorKind::NotFound) => {
                Vec::new()
            }
            Err(source) => return Err(SandboxError::Machine { op: "list", source }),
        };
        let mut out: Vec<String> = entries
            .into_iter()
            .map(|e| join_rel(&rel, &e.path))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Regular files matching a glob (see [`crate::glob`]), relative to the root, sorted.
    /// Matching happens here, over the agent's listing.
    pub async fn glob(&self, pattern: &str) -> Result<Vec<String>, SandboxError> {
        let g = Glob::new(pattern)?;
        let files = self.walk(g.literal_prefix()).await?;
        Ok(files.into_iter().filter(|p| g.matches(p)).collect())
    }

    /// Start a long-lived process in the root (as the image's user, in its working
    /// directory) and forward a host loopback port to its guest port. An empty argv runs the
    /// image's `Entrypoint` + `Cmd`.
    pub async fn serve(&self, mut spec: ServeSpec) -> Result<Serving, SandboxError> {
        spec.argv = self.argv_or_default(std::mem::take(&mut spec.argv))?;
        self.ensure_root().await?;
        let process = GuestProcess {
            env: self.env().to_vec(),
            cwd: self.default_cwd(),
            user: self.confinement.defaults.user.clone(),
        };
        Ok(Serving::start(self.link.clone(), spec, process).await?)
    }

    /// Publishes a process that already runs in the guest: the server a snapshot was taken
    /// with (its record's `serving`), in a VM restored from it. Nothing starts in the guest;
    /// the host ports and the monitor are [`Guest::serve`]'s.
    pub async fn attach_served(
        &self,
        served: &ServedProcess,
        publish: &[PublishSpec],
    ) -> Result<Serving, SandboxError> {
        Ok(Serving::attach(self.link.clone(), served, publish).await?)
    }
}

fn join_rel(dir: &str, path: &str) -> String {
    if dir.is_empty() {
        path.to_string()
    } else {
        format!("{dir}/{path}")
    }
}
