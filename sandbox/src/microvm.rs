//! [`MicroVm`]: the sandbox tier over a driver's [`Machine`].
//!
//! `create` runs the whole pipeline in one direction: validate the spec -> select an
//! available, admissible driver -> prepare the read-only disks -> build the `BootPlan` ->
//! `driver.boot`. Every guest operation afterwards is a [`Guest`] operation over the
//! machine (see [`crate::guest`] for the host-side checks it applies first).

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vm_drivers::{BootPlan, DiskFs, DiskPlan, Driver, ImagePaths, Machine, Registry, RootfsPlan};
use vm_spec::{Containment, Policy, RootfsFormat, Spec, Trust, ValidImage, ValidSpec};
use vm_sync::Lock;

use crate::error::SandboxError;
use crate::guest::{Confinement, Guest, ProcessDefaults};
use crate::link::Link;
use crate::mounts::{DEFAULT_MAX_DIR_BYTES, MountCache};
use crate::select::select;

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
    /// Create the guest working root (and the image's working directory) with a setup
    /// command (`mkdir`, `chown`) inside the guest before the first operation. `false` for a
    /// caller whose processes run only in directories the image itself provides (the
    /// containerd shim: an image without `mkdir` still runs); its file operations under the
    /// root then fail where the root does not exist.
    pub prepare_root: bool,
    /// Allow [`MicroVm::snapshot`] (refused before booting on a driver without snapshots,
    /// with its reason): the VM's snapshot is staged in a private directory made
    /// under this one at boot (created 0700 if missing; the snapshot's final path must be on
    /// the same filesystem). `None` (the default) keeps the snapshot's system calls and file
    /// writes out of the VM process's jail and filters.
    pub snapshots: Option<PathBuf>,
    /// Raw read-only disks the VM boots with beside its mounts: sparse files the caller
    /// fills later (a pod's spare disks, the containerd shim), each at a guest path where
    /// the agent links its block device. Not a user mount: every user mount is a share.
    pub raw_disks: Vec<RawDisk>,
    /// Each host mount's DAX window in MiB on a driver with DAX (kvm): `None`, the driver's
    /// default; `Some(0)`, none (the guest reads through its own page cache).
    pub dax_window_mib: Option<u32>,
}

/// A raw read-only disk ([`Options::raw_disks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawDisk {
    /// The host file (opened read-only by the driver).
    pub host_path: PathBuf,
    /// Where the agent links the block device in the guest.
    pub guest_path: String,
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
            prepare_root: true,
            snapshots: None,
            raw_disks: Vec::new(),
            dax_window_mib: None,
        }
    }
}

/// The checks [`MicroVm::create`] runs before anything is created — validate the spec,
/// select an available, admissible driver — on the default registry, for a caller that
/// boots later or elsewhere (`vm run -d` refuses before it starts its supervisor).
pub fn preflight(spec: &Spec, options: &Options) -> Result<ValidSpec, SandboxError> {
    let valid = spec.validate()?;
    let registry = Registry::with_defaults();
    let driver = select(
        &registry,
        options.driver.as_deref(),
        options.trust,
        &options.policy,
    )?;
    check_options(driver, &valid, options)?;
    Ok(valid)
}

/// What `options` ask of `driver` beyond containment, refused before anything is created:
/// snapshots where it has none, a DAX window it cannot give.
fn check_options(
    driver: &dyn Driver,
    spec: &ValidSpec,
    options: &Options,
) -> Result<(), SandboxError> {
    if options.snapshots.is_some() {
        let can = driver.snapshots();
        if !can.ok {
            return Err(crate::snapshots::SnapshotError::Unsupported {
                driver: driver.name(),
                reason: can.detail,
            }
            .into());
        }
    }
    driver
        .dax_window_mib(options.dax_window_mib, spec.limits().mem_mib)
        .map_err(|source| SandboxError::DaxWindow {
            driver: driver.name(),
            source,
        })?;
    Ok(())
}

/// Most disks (the root included) a VM booted with `options` can have: the limit of the
/// driver they select (see [`vm_drivers::Driver::max_disks`]).
pub fn max_disks(options: &Options) -> Result<usize, SandboxError> {
    let registry = Registry::with_defaults();
    let d = select(
        &registry,
        options.driver.as_deref(),
        options.trust,
        &options.policy,
    )?;
    Ok(d.max_disks())
}

/// A guest with its own kernel, confined to a validated [`Spec`]. See the crate docs for
/// an example. Dropping it kills the VM and removes its run directory; prefer
/// [`MicroVm::close`], which first asks the guest to power off.
///
/// It dereferences to [`Guest`], which holds the operations (`exec`, `run`, `exec_stream`,
/// files, `walk`, `glob`, `serve`) it shares with [`crate::RunningVm`].
#[derive(Debug)]
pub struct MicroVm {
    guest: Guest,
    machine: Arc<Machine>,
    spec: ValidSpec,
    /// The spec as the caller gave it (a snapshot records it).
    pub(crate) source: Spec,
    /// The plan's block devices, in attachment order (a snapshot records their identity).
    pub(crate) devices: Vec<vm_drivers::BlockDevice>,
    /// The plan's shares, in order (a snapshot records their identity).
    pub(crate) shares: Vec<vm_drivers::SharePlan>,
    /// The DAX window size the VM was asked for (a snapshot records it).
    pub(crate) dax_window_mib: Option<u32>,
    /// The snapshot staging directory ([`Options::snapshots`]), until a snapshot takes it.
    pub(crate) staging: Mutex<Option<tempfile::TempDir>>,
    /// 0 when booted; a restored VM's is its snapshot's plus one ([`MicroVm::generation`]).
    pub(crate) generation: u64,
    /// The per-VM run directory (removed by `close`/drop; the path stays for callers).
    run_dir_path: PathBuf,
    run_dir: Mutex<Option<tempfile::TempDir>>,
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
        let driver = select(
            registry,
            options.driver.as_deref(),
            options.trust,
            &options.policy,
        )?;
        MicroVm::create_on(driver, valid, spec.clone(), options)
    }

    fn create_on(
        driver: &dyn Driver,
        spec: ValidSpec,
        source: Spec,
        options: &Options,
    ) -> Result<MicroVm, SandboxError> {
        check_options(driver, &spec, options)?;
        let prepared = Prepared::new(&spec, options)?;
        let name = driver.name();
        let machine = driver
            .boot(prepared.plan.clone())
            .map_err(|source| SandboxError::Boot {
                driver: name,
                source,
            })?;
        MicroVm::wrap(machine, spec, source, options, prepared)
    }

    /// The sandbox over a machine `driver` booted or restored from `prepared`'s plan: its
    /// containment re-checked, its confinement the spec's.
    pub(crate) fn wrap(
        machine: Machine,
        spec: ValidSpec,
        source: Spec,
        options: &Options,
        prepared: Prepared,
    ) -> Result<MicroVm, SandboxError> {
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
        let machine = Arc::new(machine);
        let confinement = Confinement {
            root: spec.root().to_string(),
            env: spec.env().to_vec(),
            env_allow: source.guarantees.env_allow.clone(),
            defaults: ProcessDefaults {
                user: spec.user().map(str::to_string),
                working_dir: spec.working_dir().map(str::to_string),
                command: spec.default_command(),
            },
        };
        Ok(MicroVm {
            guest: Guest::new(
                Link::Booted(machine.clone()),
                confinement,
                !options.prepare_root,
            ),
            machine,
            spec,
            source,
            devices: prepared.plan.block_devices(),
            shares: prepared.plan.shares.clone(),
            dax_window_mib: prepared.plan.dax_window_mib,
            staging: Mutex::new(prepared.staging),
            generation: 0,
            run_dir_path: prepared.run_dir.path().to_path_buf(),
            run_dir: Mutex::new(Some(prepared.run_dir)),
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

    /// How many restores lie behind this VM: 0 when it was booted, 1 when restored from a
    /// snapshot of a booted VM, and so on. The guest reads the same number in
    /// `/run/vm/generation`, written as its kernel's CRNG was reseeded with this host's
    /// entropy: a guest process that seeded a generator before the snapshot must seed it
    /// again once the number changes (docs/usage.md).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The validated spec the guest runs under.
    pub fn spec(&self) -> &ValidSpec {
        &self.spec
    }

    pub(crate) fn machine_arc(&self) -> Arc<Machine> {
        self.machine.clone()
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
    /// real drivers it is a hybrid-vsock socket: `CONNECT <vm_agent_protocol::AGENT_PORT>`).
    /// It exists while the VM runs.
    pub fn agent_socket(&self) -> &Path {
        self.machine.agent_socket()
    }

    /// Pauses the VM: every one of its host processes stopped (see
    /// [`Machine::pause`]); guest operations fail until [`MicroVm::resume`].
    pub fn pause(&self) -> Result<(), SandboxError> {
        self.machine.pause().map_err(SandboxError::machine("pause"))
    }

    /// Lets a paused VM run again.
    pub fn resume(&self) -> Result<(), SandboxError> {
        self.machine
            .resume()
            .map_err(SandboxError::machine("resume"))
    }

    /// Power the guest off, kill what is left, and remove the run directory. Idempotent.
    pub async fn close(&self) {
        self.machine.close().await;
        self.remove_run_dir();
    }

    pub(crate) fn remove_run_dir(&self) {
        let dir = self.run_dir.locked().take();
        if let Some(dir) = dir {
            let path = dir.path().to_path_buf();
            if let Err(e) = dir.close() {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove run dir");
            }
        }
    }
}

impl Deref for MicroVm {
    type Target = Guest;

    fn deref(&self) -> &Guest {
        &self.guest
    }
}

impl Drop for MicroVm {
    fn drop(&mut self) {
        self.machine.close_now();
        self.remove_run_dir();
    }
}

/// What a boot or a restore needs before the driver runs: the plan, its run directory and
/// the snapshot staging directory when [`Options::snapshots`] asks for one.
pub(crate) struct Prepared {
    pub(crate) plan: BootPlan,
    pub(crate) run_dir: tempfile::TempDir,
    pub(crate) staging: Option<tempfile::TempDir>,
}

impl Prepared {
    /// Prepares the read-only disks and the run directory of `spec`, and the plan.
    pub(crate) fn new(spec: &ValidSpec, options: &Options) -> Result<Prepared, SandboxError> {
        let image = spec.image();
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
        let (mut disks, shares) = cache.prepare(spec.mounts())?;
        disks.extend(options.raw_disks.iter().map(|d| DiskPlan {
            host_path: d.host_path.clone(),
            guest_path: d.guest_path.clone(),
            fs: DiskFs::Raw,
        }));
        let parent = options
            .run_dir_parent
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        private_dir(&parent).map_err(SandboxError::RunDir)?;
        let run_dir = tempfile::Builder::new()
            .prefix(crate::rundir::RUN_DIR_PREFIX)
            .tempdir_in(parent)
            .map_err(SandboxError::RunDir)?;
        // So a later sweep can tell this directory's owner died (crate::rundir).
        crate::rundir::claim(run_dir.path()).map_err(SandboxError::RunDir)?;
        let staging = match &options.snapshots {
            Some(dir) => Some(crate::snapshots::staging_dir(dir)?),
            None => None,
        };
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
            shares,
            dax_window_mib: options.dax_window_mib,
            rootfs: rootfs_plan(image),
            run_dir: run_dir.path().to_path_buf(),
            wall: limits.wall,
            boot_timeout: options.boot_timeout,
            allow_weaker_jail: options.policy.allow_weaker_jail
                || options.trust != vm_spec::Trust::Untrusted,
            snapshot_dir: staging.as_ref().map(|d| d.path().to_path_buf()),
        };
        Ok(Prepared {
            plan,
            run_dir,
            staging,
        })
    }
}

/// Creates `dir` and its missing parents, mode 0700.
pub(crate) fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// The root disk of a validated image: its file and filesystem.
fn rootfs_plan(image: &ValidImage) -> Option<RootfsPlan> {
    let fs = match image.rootfs_format? {
        RootfsFormat::Erofs => DiskFs::Erofs,
        RootfsFormat::Ext4 => DiskFs::Ext4,
    };
    Some(RootfsPlan {
        host_path: image.rootfs.clone()?,
        fs,
    })
}
