//! [`MicroVm`]: the sandbox tier over a driver's [`Machine`].
//!
//! `create` runs the whole pipeline in one direction: validate the spec -> select an
//! available, admissible driver -> prepare the read-only disks -> build the `BootPlan` ->
//! `driver.boot`. Every guest operation afterwards goes through the machine's agent client,
//! with host-side checks first: file paths must be relative to the root (no `..`, no
//! absolute path, no NUL; the agent checks again beneath the root) and every process gets
//! exactly `Guarantees.env` as its environment.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use guest_agent::client::ExecStream;
use guest_agent::protocol::{Command, ErrorKind, ExecOutput, ExecRequest};
use thiserror::Error;
use vm_drivers::{BootPlan, Driver, DriverError, ImagePaths, Machine, MachineError, Registry};
use vm_spec::{Containment, Policy, Spec, SpecError, Trust, ValidSpec};

use crate::confine::{self, PathError};
use crate::glob::{Glob, GlobError};
use crate::mounts::{DEFAULT_MAX_DIR_BYTES, MountCache, MountError};
use crate::select::{SelectError, select_driver, select_named};
use crate::serving::{ServeError, ServeSpec, Serving};

/// `PATH` for the runtime's own setup commands (never for the caller's work, whose
/// environment is exactly `Guarantees.env`).
const SETUP_PATH: &str = vm_spec::DEFAULT_GUEST_PATH;

/// How to create a [`MicroVm`]. `Options::default()` is untrusted work under the strict
/// policy on the first available admissible driver.
#[derive(Debug, Clone)]
pub struct Options {
    pub trust: Trust,
    pub policy: Policy,
    /// Use this driver (still admitted and detected) instead of the first available.
    pub driver: Option<String>,
    /// A name for logs and the guest hostname.
    pub name: String,
    /// How long to wait for the guest agent after starting the VM.
    pub boot_timeout: Duration,
    /// The erofs cache for directory mounts; `None` = `<cache home>/vm/mounts`.
    pub mount_cache: Option<PathBuf>,
    /// Cap on the total size of a mounted directory.
    pub max_mount_bytes: u64,
    /// Where the per-VM run directory is created (the parent is created 0700 if missing, once
    /// the spec has been accepted); `None` = the system temp dir. Each run directory names its
    /// owner so [`crate::rundir::sweep`] can remove it after a `SIGKILL`.
    pub run_dir_parent: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            trust: Trust::Untrusted,
            policy: Policy::default(),
            driver: None,
            name: "vm".into(),
            boot_timeout: Duration::from_secs(300),
            mount_cache: None,
            max_mount_bytes: DEFAULT_MAX_DIR_BYTES,
            run_dir_parent: None,
        }
    }
}

/// One command to run with more control than [`MicroVm::exec`]/[`MicroVm::capture`].
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub command: Command,
    /// Written to stdin, then closed (the way to pass a secret: never on the command line).
    pub stdin: Vec<u8>,
    /// Working directory relative to the root; `None` = the root.
    pub cwd: Option<String>,
    /// Kill the process tree after this long; `None` = the client default.
    pub timeout: Option<Duration>,
}

/// Errors of creating and using a [`MicroVm`].
#[derive(Debug, Error)]
pub enum SandboxError {
    #[error("spec refused")]
    Spec(#[from] SpecError),
    /// No driver was selected; the [`SelectError`] (the cause) lists every diagnosis.
    #[error("selecting a driver")]
    Select(#[from] SelectError),
    /// The booted machine's containment was refused by the admission gate (the cause).
    #[error("admission refused")]
    Admit(#[from] vm_spec::AdmitError),
    #[error("preparing mounts")]
    Mount(#[from] MountError),
    #[error("{0}")]
    Unsupported(&'static str),
    #[error("creating run directory")]
    RunDir(#[source] std::io::Error),
    #[error("boot on {driver} failed")]
    Boot {
        driver: &'static str,
        #[source]
        source: DriverError,
    },
    #[error(transparent)]
    Path(#[from] PathError),
    #[error(transparent)]
    Glob(#[from] GlobError),
    #[error("{op} failed")]
    Machine {
        op: &'static str,
        #[source]
        source: MachineError,
    },
    #[error("serve failed")]
    Serve(#[from] ServeError),
    #[error("cannot create the guest root: {0}")]
    Root(String),
    #[error("a blocking boot task failed: {0}")]
    Join(String),
}

/// A guest with its own kernel, confined to a validated [`Spec`]. See the crate docs for
/// an example. Dropping it kills the VM and removes its run directory; prefer
/// [`MicroVm::close`], which first asks the guest to power off.
#[derive(Debug)]
pub struct MicroVm {
    machine: Arc<Machine>,
    spec: ValidSpec,
    /// The per-VM run directory (removed by `close`/drop; the path stays for callers).
    run_dir_path: PathBuf,
    run_dir: Mutex<Option<tempfile::TempDir>>,
    root_ready: tokio::sync::OnceCell<()>,
}

impl MicroVm {
    /// Validate, select, prepare and boot on the default registry. Blocks until the agent
    /// answers (minutes on an emulated driver); from async code use [`MicroVm::boot`].
    pub fn create(spec: &Spec, options: &Options) -> Result<MicroVm, SandboxError> {
        MicroVm::create_with(&Registry::with_defaults(), spec, options)
    }

    /// [`MicroVm::create`] in a blocking task.
    pub async fn boot(spec: Spec, options: Options) -> Result<MicroVm, SandboxError> {
        tokio::task::spawn_blocking(move || MicroVm::create(&spec, &options))
            .await
            .map_err(|e| SandboxError::Join(e.to_string()))?
    }

    /// [`MicroVm::create`] over an explicit registry (tests pass fakes).
    pub fn create_with(
        registry: &Registry,
        spec: &Spec,
        options: &Options,
    ) -> Result<MicroVm, SandboxError> {
        let valid = spec.validate()?;
        let driver = match &options.driver {
            Some(name) => select_named(registry, name, options.trust, &options.policy)?,
            None => select_driver(registry, options.trust, &options.policy)?,
        };
        MicroVm::create_on(driver, valid, options)
    }

    fn create_on(
        driver: &dyn Driver,
        spec: ValidSpec,
        options: &Options,
    ) -> Result<MicroVm, SandboxError> {
        let image = spec.image();
        if image.rootfs.is_some() {
            return Err(SandboxError::Unsupported(
                "image.rootfs is not supported yet",
            ));
        }
        let Some(initramfs) = image.initrd.clone() else {
            return Err(SandboxError::Unsupported(
                "image.initrd is required (it holds the agent)",
            ));
        };
        let cache = match &options.mount_cache {
            Some(dir) => MountCache::new(dir),
            None => MountCache::default_location()?,
        }
        .with_max_dir_bytes(options.max_mount_bytes);
        let disks = cache.prepare(spec.mounts())?;
        let parent = options
            .run_dir_parent
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&parent)
                .map_err(SandboxError::RunDir)?;
        }
        let run_dir = tempfile::Builder::new()
            .prefix(crate::rundir::RUN_DIR_PREFIX)
            .tempdir_in(parent)
            .map_err(SandboxError::RunDir)?;
        // So a later sweep can tell this directory's owner died (crate::rundir).
        crate::rundir::claim(run_dir.path()).map_err(SandboxError::RunDir)?;
        let limits = spec.limits();
        let plan = BootPlan {
            name: options.name.clone(),
            images: ImagePaths {
                vmlinux: image.kernel.clone(),
                bz_image: image
                    .bz_image
                    .clone()
                    .unwrap_or_else(|| image.kernel.clone()),
                initramfs,
            },
            vcpus: limits.vcpus,
            mem_mib: limits.mem_mib,
            pids_max: limits.pids,
            disks,
            run_dir: run_dir.path().to_path_buf(),
            wall: limits.wall,
            boot_timeout: options.boot_timeout,
        };
        let name = driver.name();
        let machine = driver.boot(plan).map_err(|source| SandboxError::Boot {
            driver: name,
            source,
        })?;
        // The machine reports its own containment; re-check it so a driver that booted
        // something weaker than it claimed is never used.
        if let Err(e) = vm_spec::admit_level(
            machine.driver(),
            machine.containment(),
            options.trust,
            &options.policy,
        ) {
            machine.close_now();
            return Err(SandboxError::Admit(e));
        }
        Ok(MicroVm {
            machine: Arc::new(machine),
            spec,
            run_dir_path: run_dir.path().to_path_buf(),
            run_dir: Mutex::new(Some(run_dir)),
            root_ready: tokio::sync::OnceCell::new(),
        })
    }

    /// The containment the guest runs under, as the driver reports it.
    pub fn containment(&self) -> Containment {
        self.machine.containment()
    }

    /// The driver that booted the guest.
    pub fn driver(&self) -> &'static str {
        self.machine.driver()
    }

    /// The guest working root.
    pub fn root(&self) -> &str {
        self.spec.root()
    }

    /// The validated spec the guest runs under.
    pub fn spec(&self) -> &ValidSpec {
        &self.spec
    }

    /// The underlying machine (console tail, host pids, liveness).
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// The per-VM run directory the driver keeps its sockets in: a fresh `vm-*` directory
    /// under [`Options::run_dir_parent`]. It exists until [`MicroVm::close`] (or drop)
    /// removes it.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir_path
    }

    /// The host Unix socket of the guest agent ([`Machine::agent_socket`]), inside
    /// [`MicroVm::run_dir`]. Another process can drive the same guest through it (for the
    /// real drivers it is a hybrid-vsock socket: `CONNECT <guest_agent::AGENT_PORT>`).
    /// It exists while the VM runs.
    pub fn agent_socket(&self) -> &Path {
        self.machine.agent_socket()
    }

    fn machine_err(op: &'static str) -> impl FnOnce(MachineError) -> SandboxError {
        move |source| SandboxError::Machine { op, source }
    }

    /// Create the guest root once, before the first operation that needs it.
    async fn ensure_root(&self) -> Result<(), SandboxError> {
        self.root_ready
            .get_or_try_init(|| async {
                let req = ExecRequest {
                    command: Command::Argv(vec!["mkdir".into(), "-p".into(), self.root().into()]),
                    env: vec![("PATH".into(), SETUP_PATH.into())],
                    timeout: Some(Duration::from_secs(60)),
                    ..Default::default()
                };
                let out = self
                    .machine
                    .exec(req)
                    .await
                    .map_err(Self::machine_err("creating root"))?;
                if !out.status.success() {
                    return Err(SandboxError::Root(
                        String::from_utf8_lossy(&out.output).into(),
                    ));
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    fn request(&self, run: Run) -> Result<ExecRequest, SandboxError> {
        let cwd = match run.cwd.as_deref() {
            Some(rel) => join(self.root(), &confine::relative(rel, true)?),
            None => self.root().to_string(),
        };
        Ok(ExecRequest {
            command: run.command,
            stdin: run.stdin,
            env: self.spec.env().to_vec(),
            cwd: Some(cwd),
            timeout: run.timeout,
            max_output: None,
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

    /// Run with stdin, a working directory or a timeout.
    pub async fn run(&self, run: Run) -> Result<ExecOutput, SandboxError> {
        let req = self.request(run)?;
        self.ensure_root().await?;
        self.machine
            .exec(req)
            .await
            .map_err(Self::machine_err("exec"))
    }

    /// Start a command and stream its stdout/stderr; dropping the stream kills it.
    pub async fn exec_stream(&self, run: Run) -> Result<ExecStream, SandboxError> {
        let req = self.request(run)?;
        self.ensure_root().await?;
        self.machine
            .exec_stream(req)
            .await
            .map_err(Self::machine_err("exec stream"))
    }

    /// Read a file relative to the root.
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, SandboxError> {
        let rel = confine::relative(path, false)?;
        self.ensure_root().await?;
        self.machine
            .read_file(self.root(), &rel)
            .await
            .map_err(Self::machine_err("read file"))
    }

    /// Write a file relative to the root (parents are created).
    pub async fn write_file(&self, path: &str, data: &[u8]) -> Result<(), SandboxError> {
        let rel = confine::relative(path, false)?;
        self.ensure_root().await?;
        self.machine
            .write_file(self.root(), &rel, data)
            .await
            .map_err(Self::machine_err("write file"))
    }

    /// Regular files under `dir` (relative to the root; `""` = the root), as sorted paths
    /// relative to the root.
    pub async fn walk(&self, dir: &str) -> Result<Vec<String>, SandboxError> {
        let rel = confine::relative(dir, true)?;
        self.ensure_root().await?;
        let entries = match self.machine.list(self.root(), &rel).await {
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

    /// Start a long-lived process and forward a host loopback port to its guest port.
    pub async fn serve(&self, spec: ServeSpec) -> Result<Serving, SandboxError> {
        self.ensure_root().await?;
        let cwd = self.root().to_string();
        let env = self.spec.env().to_vec();
        Ok(Serving::start(self.machine.clone(), spec, env, cwd).await?)
    }

    /// Power the guest off, kill what is left, and remove the run directory. Idempotent.
    pub async fn close(&self) {
        self.machine.close().await;
        self.remove_run_dir();
    }

    fn remove_run_dir(&self) {
        let dir = self
            .run_dir
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(dir) = dir {
            let path = dir.path().to_path_buf();
            if let Err(e) = dir.close() {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove run dir");
            }
        }
    }
}

impl Drop for MicroVm {
    fn drop(&mut self) {
        self.machine.close_now();
        self.remove_run_dir();
    }
}

fn join(root: &str, rel: &str) -> String {
    match (root, rel) {
        (_, "") => root.to_string(),
        ("/", r) => format!("/{r}"),
        (root, r) => format!("{root}/{r}"),
    }
}

fn join_rel(dir: &str, path: &str) -> String {
    if dir.is_empty() {
        path.to_string()
    } else {
        format!("{dir}/{path}")
    }
}
