//! One container and the processes in it: in a microVM of its own booted through
//! `vm-sandbox`, or, for a pod's app container, in its pod's VM ([`crate::pod`]; the pod's
//! sandbox boots that VM with the pod's spare disks).
//!
//! `create` reads the bundle ([`crate::bundle`]), prepares the root ([`crate::rootfs`]),
//! records a reference on the cached root image, writes the bundle's `vm-shim.json` (what
//! `containerd-shim-vm-v1 delete` needs to clean up after a shim that died) and boots the VM
//! with the runtime's trust and policy ([`crate::options`]), then mounts the bundle's guest
//! tmpfs and copies kubelet's files in ([`crate::bundle::kubelet`]) before any process runs
//! (a pod's app container instead gets its root, volumes and files set up in the pod's VM).
//! When the init process ends its termination message (`/dev/termination-log`, when kubelet
//! gave one) is read back and the container's VM is torn down (a pod's VM goes with its
//! sandbox); `delete` drops the reference and the state file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use vm_sandbox::agent::container::{Confine, ContainerInit, SeccompProfile};
use vm_sandbox::{MicroVm, Options, SnapshotRoots};
use vm_spec::{Guarantees, Limits, Spec};
use vm_sync::Lock;

use crate::bundle::kubelet;
use crate::bundle::pod::PodRole;
use crate::bundle::{self, ContainerSpec, ProcessSpec};
use crate::discover::{self, Discovery};
use crate::error::ShimError;
use crate::options::ShimConfig;
use crate::pod::{MAX_POD_DISKS, Member, Pod, PodDisks, PodTable};
use crate::ports::{self, Forwards};
use crate::process::{Process, Stdio};
use crate::rootfs::{self, Root};

mod termination;

pub use termination::TerminationMessage;

/// The guest cgroup every process of a VM's own work runs under.
const WORK_CGROUP: &str = "/sys/fs/cgroup/work";

/// The bundle file that records what a container holds on the host.
pub const STATE_FILE: &str = "vm-shim.json";

/// What `delete` (the shim's, or the `delete` action after a crash) must undo.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostState {
    /// The snapshot root cache and the identity/holder of this container's reference.
    pub snapshot_cache: PathBuf,
    pub identity: String,
    pub holder: String,
    /// Parent of the VM's run directory (swept for directories whose owner died).
    pub run_dir_parent: PathBuf,
    /// The shim that owns the VM's run directory: `delete` waits for it to be gone before
    /// the sweep (absent in a state file written before it was recorded).
    #[serde(default)]
    pub shim: Option<vm_sandbox::rundir::ProcIdentity>,
    /// A pod sandbox's spare disks (removed with it).
    #[serde(default)]
    pub pod_dir: Option<PathBuf>,
}

impl HostState {
    pub fn read(bundle: &Path) -> Option<HostState> {
        let text = std::fs::read(bundle.join(STATE_FILE)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Releases the reference and removes the state file (idempotent).
    pub fn release(&self, bundle: &Path) {
        let cache = SnapshotRoots::new(&self.snapshot_cache);
        if let Err(e) = cache.release(&self.identity, &self.holder) {
            tracing::warn!(error = %e, "releasing the root reference");
        }
        if let Some(dir) = &self.pod_dir
            && let Err(e) = std::fs::remove_dir_all(dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), error = %e, "removing the pod's disks");
        }
        let _ = std::fs::remove_file(bundle.join(STATE_FILE));
    }
}

/// What `create` is given.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub namespace: String,
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: Vec<containerd_shim::protos::api::Mount>,
    pub stdio: Stdio,
    pub config: ShimConfig,
    /// The pods this shim serves: a sandbox adds its own, an app container finds its pod.
    pub pods: PodTable,
}

/// Where a container runs.
#[derive(Debug)]
enum Place {
    /// A VM of its own.
    Own,
    /// A pod's sandbox: the pod's VM is its VM; `pods` holds the pod until it is deleted.
    Sandbox { pods: PodTable },
    /// A pod's app container, in the pod's VM.
    Member { pod: Arc<Pod>, member: Box<Member> },
}

/// One container (see the module docs).
#[derive(Debug)]
pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub init: Arc<Process>,
    pub pid: u32,
    vm: Arc<MicroVm>,
    cwd: String,
    execs: Mutex<HashMap<String, Arc<Process>>>,
    host: HostState,
    /// The guest path of the termination message (kubelet's file's destination, or a
    /// `/dev/termination-log` copied in): read back when the init process ends.
    termination_log: Option<String>,
    /// Kubelet's host file for it: the message is written back there (kubelet reads it).
    termination_host: Option<kubelet::HostFile>,
    /// What was read back (its last 4 KiB), kept for the CRI to report.
    termination: Mutex<Option<TerminationMessage>>,
    /// `kill_all` tore the VM down: nothing is left to read back.
    torn_down: std::sync::atomic::AtomicBool,
    place: Place,
    /// Its ports' forwarding from its network namespace (stopped when it is dropped).
    _forwards: Forwards,
    /// Its seccomp profile and what its init process sets up ([`ContainerSpec`]).
    seccomp: Option<SeccompProfile>,
    setup: ContainerInit,
    /// The ports its VM's guest listens on, forwarded (a VM of its own, or a pod's sandbox).
    _discovery: Discovery,
}

/// The VM spec for a container: the image set, the root (`None` while only checking), the
/// process defaults and the bundle's limits, mounts and environment.
fn vm_spec(c: &ContainerSpec, root: Option<&Root>, config: &ShimConfig) -> Result<Spec, ShimError> {
    let mut image = match &config.images_dir {
        Some(dir) => {
            let p = vm_sandbox::images::images_in(&dir.join("current"))
                .map_err(ShimError::sandbox("guest images"))?;
            vm_spec::Image {
                kernel: p.vmlinux,
                bz_image: Some(p.bz_image),
                initrd: Some(p.initramfs),
                rootfs: None,
                digests: Default::default(),
                config: Default::default(),
                source: None,
            }
        }
        None => {
            vm_sandbox::images::default_spec_image().map_err(ShimError::sandbox("guest images"))?
        }
    };
    image.rootfs = root.map(|r| r.erofs.clone());
    image.config.working_dir = Some(c.process.cwd.clone());
    let limits = Limits {
        vcpus: c.vcpus.unwrap_or(1),
        mem_mib: c.mem_mib.unwrap_or(config.default_memory_mib()),
        pids: c.pids.unwrap_or(i64::from(vm_spec::DEFAULT_PIDS)),
        wall: config.wall_seconds.map(std::time::Duration::from_secs),
    };
    let mut guarantees = Guarantees::untrusted(limits, c.mounts.clone());
    guarantees.env = c.process.env.clone();
    guarantees.env_allow = config.env_allow.clone();
    let mut spec = Spec::new(image, guarantees);
    spec.user = c.process.user.clone();
    Ok(spec)
}

/// Before any process runs: the bundle's guest tmpfs mounts, then kubelet's files copied in
/// with their host modes (the host files were read, bounded, with the bundle).
async fn set_up_guest(vm: &MicroVm, spec: &ContainerSpec) -> Result<(), ShimError> {
    for t in &spec.tmpfs {
        vm.mount_tmpfs(&t.dest, t.size_bytes)
            .await
            .map_err(ShimError::sandbox("mounting a tmpfs in the guest"))?;
    }
    for f in &spec.files {
        vm.write_absolute(&f.dest, &f.data)
            .await
            .map_err(ShimError::sandbox("copying a kubelet file into the guest"))?;
        vm.set_mode(&f.dest, f.mode)
            .await
            .map_err(ShimError::sandbox("copying a kubelet file into the guest"))?;
    }
    Ok(())
}

/// What a container is placed in: its VM, where it runs in it, and its ports' forwarding.
type Placed = (Arc<MicroVm>, Place, Forwards);

/// The VM of a container that boots one (alone, or a pod's sandbox with the pod's disks in
/// `pod_dir`), set up before any process runs, with its declared ports forwarded from its
/// network namespace (bound before the boot).
async fn boot(
    req: &CreateRequest,
    spec: &ContainerSpec,
    root: &Root,
    mut options: Options,
    pod_dir: Option<&Path>,
) -> Result<Placed, ShimError> {
    let (pods, id) = (&req.pods, &req.id);
    let (netns, ports) = (spec.netns.clone(), spec.ports.clone());
    let bound = tokio::task::spawn_blocking(move || ports::bind_in(netns.as_deref(), &ports))
        .await
        .map_err(|e| ShimError::State(format!("binding the ports: {e}")))??;
    let boot_spec = vm_spec(spec, Some(root), &req.config)?;
    let disks = match pod_dir {
        Some(dir) => {
            let (disks, raw) = PodDisks::create(dir, spare_disks(&boot_spec, &options)?)?;
            options.raw_disks.extend(raw);
            Some(disks)
        }
        None => None,
    };
    let pod_options = options.clone();
    let vm = MicroVm::boot(boot_spec, options)
        .await
        .map_err(ShimError::sandbox("booting the VM"))?;
    let vm = Arc::new(vm);
    let placed = match set_up_guest(&vm, spec).await {
        Ok(()) => match disks {
            Some(disks) => Pod::new(vm.clone(), disks, &pod_options).map(|pod| {
                pods.locked().insert(id.clone(), Arc::new(pod));
                Place::Sandbox { pods: pods.clone() }
            }),
            None => Ok(Place::Own),
        },
        Err(e) => Err(e),
    };
    let forwarded = placed.and_then(|place| bound.forward_to(&vm).map(|f| (place, f)));
    match forwarded {
        Ok((place, forwards)) => Ok((vm, place, forwards)),
        Err(e) => {
            if pod_dir.is_some() {
                pods.locked().remove(id);
            }
            vm.close().await;
            Err(e)
        }
    }
}

/// How many spare disks a pod's VM booting `spec` gets: what its driver's device slots and
/// the spec's mount limit leave beside the root and the sandbox's own mounts, at most
/// [`MAX_POD_DISKS`].
fn spare_disks(spec: &Spec, options: &Options) -> Result<usize, ShimError> {
    let max = vm_sandbox::max_disks(options).map_err(ShimError::sandbox("checking the VM"))?;
    let own = spec.guarantees.mounts.len();
    let spare = max
        .saturating_sub(1 + own)
        .min(vm_spec::MAX_MOUNTS.saturating_sub(own))
        .min(MAX_POD_DISKS);
    match spare {
        0 => Err(ShimError::Refused(format!(
            "a pod's VM needs a spare disk for its containers; the driver takes {max} disks \
             and the sandbox already has {own} mounts beside its root"
        ))),
        n => Ok(n),
    }
}

/// The pod an app container of sandbox `sandbox` joins.
fn pod_of(pods: &PodTable, sandbox: &str) -> Result<Arc<Pod>, ShimError> {
    pods.locked().get(sandbox).cloned().ok_or_else(|| {
        ShimError::Refused(format!(
            "annotations.{:?}: no pod sandbox {sandbox:?} runs in this shim",
            bundle::pod::SANDBOX_ID
        ))
    })
}

impl Container {
    pub async fn create(req: CreateRequest) -> Result<Container, ShimError> {
        let config = req.config.clone();
        let spec = bundle::load(&req.bundle, &config.kubelet_root())?;
        let cache = match &config.snapshot_cache {
            Some(d) => SnapshotRoots::new(d),
            None => {
                SnapshotRoots::default_location().map_err(ShimError::sandbox("snapshot cache"))?
            }
        };
        // Refusals first: the spec is validated and a driver selected before any work (for a
        // pod's app container too: its mounts pass the same rules).
        let options = Options {
            trust: config.trust,
            policy: config.policy(),
            name: req.id.chars().take(63).collect(),
            run_dir_parent: Some(config.run_dir()),
            // Processes run in the image's own directories: no setup command in the image.
            prepare_root: false,
            ..Options::default()
        };
        let pod = match &spec.role {
            PodRole::Member { sandbox } => Some(pod_of(&req.pods, sandbox)?),
            PodRole::Alone | PodRole::Sandbox => None,
        };
        // An app container's limits are its cgroup's in the pod's VM, not a VM's size: the VM
        // floor (64 MiB) does not apply to them.
        let checked = match pod {
            Some(_) => &ContainerSpec {
                mem_mib: None,
                vcpus: None,
                cpu_max: None,
                pids: None,
                ..spec.clone()
            },
            None => &spec,
        };
        vm_sandbox::preflight(&vm_spec(checked, None, &config)?, &options)
            .map_err(ShimError::sandbox("checking the VM"))?;

        let target = match req.rootfs.is_empty() {
            true => spec.root_path.clone(),
            false => req.bundle.join("rootfs"),
        };
        let (root, cache) = {
            let mounts = req.rootfs.clone();
            tokio::task::spawn_blocking(move || {
                rootfs::prepare(&cache, &mounts, &target).map(|r| (r, cache))
            })
            .await
            .map_err(|e| ShimError::Rootfs(e.to_string()))??
        };
        let holder = format!("{}-{}", req.namespace, req.id);
        let pod_dir =
            (spec.role == PodRole::Sandbox).then(|| cache.dir().join("pods").join(&holder));
        let host = HostState {
            snapshot_cache: cache.dir().to_path_buf(),
            identity: root.identity.clone(),
            holder,
            run_dir_parent: config.run_dir(),
            shim: vm_sandbox::rundir::ProcIdentity::current(),
            pod_dir: pod_dir.clone(),
        };
        cache
            .hold(&host.identity, &host.holder)
            .map_err(ShimError::sandbox("holding the root image"))?;
        let state = serde_json::to_vec(&host).map_err(|e| ShimError::State(e.to_string()))?;
        let written = std::fs::write(req.bundle.join(STATE_FILE), state)
            .map_err(ShimError::io(format!("writing {STATE_FILE}")));
        let placed = match (written, pod) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(pod)) => match pod.add(&spec, &root.erofs).await {
                Ok(member) => Ok((
                    pod.vm().clone(),
                    Place::Member {
                        pod,
                        member: Box::new(member),
                    },
                    // The pod's ports are its sandbox's.
                    Forwards::default(),
                )),
                Err(e) => Err(e),
            },
            (Ok(()), None) => {
                let dir = pod_dir.as_deref();
                boot(&req, &spec, &root, options, dir).await
            }
        };
        let (vm, place, forwards) = match placed {
            Ok(x) => x,
            Err(e) => {
                host.release(&req.bundle);
                return Err(e);
            }
        };
        let discovery = match place {
            Place::Member { .. } => Discovery::default(),
            Place::Own | Place::Sandbox { .. } => {
                discover::start(vm.clone(), spec.netns.clone(), spec.ports.clone())
            }
        };
        let pid = vm.machine().host_pids().first().copied().unwrap_or(0);
        let init = Process::new(String::new(), req.stdio, spec.process.clone());
        Ok(Container {
            id: req.id,
            bundle: req.bundle,
            init,
            pid,
            vm,
            cwd: spec.process.cwd,
            execs: Mutex::new(HashMap::new()),
            host,
            termination_log: spec
                .termination_host
                .as_ref()
                .map(|h| h.dest.clone())
                .or_else(|| {
                    spec.files
                        .iter()
                        .any(|f| f.dest == kubelet::TERMINATION_LOG)
                        .then(|| kubelet::TERMINATION_LOG.to_string())
                }),
            termination_host: spec.termination_host.clone(),
            termination: Mutex::new(None),
            torn_down: Default::default(),
            place,
            _forwards: forwards,
            seccomp: spec.seccomp,
            setup: spec.init,
            _discovery: discovery,
        })
    }

    /// What this container's processes run through: its VM, or its root in the pod's VM.
    fn guest(&self) -> &vm_sandbox::Guest {
        match &self.place {
            Place::Member { member, .. } => &member.guest,
            Place::Own | Place::Sandbox { .. } => &self.vm,
        }
    }

    /// The process `exec_id` names (`""` = init).
    pub fn process(&self, exec_id: &str) -> Result<Arc<Process>, ShimError> {
        if exec_id.is_empty() {
            return Ok(self.init.clone());
        }
        self.execs
            .locked()
            .get(exec_id)
            .cloned()
            .ok_or_else(|| ShimError::NotFound(format!("exec {exec_id:?}")))
    }

    pub async fn start(&self, exec_id: &str) -> Result<Arc<Process>, ShimError> {
        let p = self.process(exec_id)?;
        if !exec_id.is_empty() && self.init.status() != crate::process::Status::Running {
            return Err(ShimError::State("the container is not running".into()));
        }
        let confine = Confine {
            seccomp: self.seccomp.clone(),
            init: exec_id.is_empty().then(|| self.setup.clone()),
            ..p.spec.confine.clone()
        };
        p.start(self.guest(), &self.cwd, confine).await?;
        Ok(p)
    }

    /// Adds an exec process (started by `start`).
    pub fn add_exec(
        &self,
        exec_id: &str,
        stdio: Stdio,
        spec: ProcessSpec,
    ) -> Result<(), ShimError> {
        let mut execs = self.execs.locked();
        if exec_id.is_empty() || execs.contains_key(exec_id) {
            return Err(ShimError::State(format!("exec id {exec_id:?} is in use")));
        }
        execs.insert(
            exec_id.to_string(),
            Process::new(exec_id.into(), stdio, spec),
        );
        Ok(())
    }

    /// After the init process ended: every exec ends with it, and the container's own VM
    /// is torn down (a pod's VM stays for its other containers until the sandbox goes).
    pub async fn init_ended(&self) {
        for p in self.execs.locked().values() {
            p.kill();
        }
        if let Some(log) = &self.termination_log
            && !self.torn_down.load(std::sync::atomic::Ordering::SeqCst)
        {
            self.read_termination_log(log).await;
        }
        if !matches!(self.place, Place::Member { .. }) {
            self.vm.close().await;
        }
        for p in self.execs.locked().values() {
            p.set_exited(crate::process::KILLED);
        }
    }

    /// `SIGKILL` to the init process: its tree dies and the container's VM goes with it (a
    /// pod's app container: the agent ends its tree and its exit is reported as usual).
    pub async fn kill_all(&self) {
        self.init.kill();
        if self.init.status() != crate::process::Status::Created
            && !matches!(self.place, Place::Member { .. })
        {
            self.torn_down
                .store(true, std::sync::atomic::Ordering::SeqCst);
            self.vm.close().await;
            self.init.set_exited(crate::process::KILLED);
        }
    }

    /// Removes an exec (`Some`) or tears the container down (`None`); returns the process.
    pub async fn delete(&self, exec_id: &str) -> Result<Arc<Process>, ShimError> {
        if !exec_id.is_empty() {
            let p = self.process(exec_id)?;
            if p.status() == crate::process::Status::Running {
                return Err(ShimError::State(format!("exec {exec_id:?} is running")));
            }
            self.execs.locked().remove(exec_id);
            return Ok(p);
        }
        if self.init.status() == crate::process::Status::Running {
            return Err(ShimError::State("the container is running".into()));
        }
        self.init.set_exited(crate::process::KILLED);
        match &self.place {
            Place::Member { pod, member } => pod.remove(member).await,
            Place::Sandbox { pods, .. } => {
                pods.locked().remove(&self.id);
                self.vm.close().await;
            }
            Place::Own => self.vm.close().await,
        }
        self.host.release(&self.bundle);
        Ok(self.init.clone())
    }

    /// Pauses the container's VM (every host process of it stopped); see
    /// `vm_sandbox::MicroVm::pause`.
    pub fn pause(&self) -> Result<(), ShimError> {
        self.refuse_member("pause")?;
        self.vm
            .pause()
            .map_err(ShimError::sandbox("pausing the VM"))
    }

    /// Lets a paused VM run again.
    pub fn resume(&self) -> Result<(), ShimError> {
        self.refuse_member("resume")?;
        self.vm
            .resume()
            .map_err(ShimError::sandbox("resuming the VM"))
    }

    /// A pod's app container cannot be paused alone: its VM is the pod's.
    fn refuse_member(&self, what: &str) -> Result<(), ShimError> {
        match self.place {
            Place::Member { .. } => Err(ShimError::Unsupported(format!(
                "{what}: a container of a pod shares the pod's VM; pause the pod"
            ))),
            Place::Own | Place::Sandbox { .. } => Ok(()),
        }
    }

    /// Whether the VM is paused.
    pub fn is_paused(&self) -> bool {
        self.vm.machine().is_paused()
    }

    /// What the container uses now: its VM's host processes, or, for a pod's app container,
    /// its cgroup in the pod's VM.
    pub async fn usage(&self) -> Result<vm_sys::control::Usage, ShimError> {
        match &self.place {
            Place::Member { member, .. } => member.usage(&self.vm).await,
            Place::Own | Place::Sandbox { .. } => Ok(self.vm.machine().host_usage()),
        }
    }

    /// Its memory limit, bytes: the guest's memory (the bundle's limit, or the default), or a
    /// pod's app container's own limit when it has one.
    pub fn memory_limit(&self) -> u64 {
        let vm = u64::from(self.vm.spec().limits().mem_mib) << 20;
        match &self.place {
            Place::Member { member, .. } => member.memory_limit.unwrap_or(vm),
            Place::Own | Place::Sandbox { .. } => vm,
        }
    }

    /// Whether the OOM killer killed one of its processes: its cgroup's in the pod's VM, or
    /// any of its own VM's work (a failed read is no; a pod's sandbox is never told so).
    pub async fn oom_killed(&self) -> bool {
        let kills = match &self.place {
            Place::Member { member, .. } => member.oom_kills(&self.vm).await,
            Place::Own => crate::pod::cgroup_file(&self.vm, WORK_CGROUP, "memory.events")
                .await
                .map(|e| crate::pod::oom_kills(&e)),
            Place::Sandbox { .. } => return false,
        };
        match kills {
            Ok(n) => n > 0,
            Err(e) => {
                tracing::debug!(container = %self.id, error = %e, "reading the OOM count");
                false
            }
        }
    }

    /// Host pids of the VM (its processes on this host).
    pub fn host_pids(&self) -> Vec<u32> {
        self.vm.machine().host_pids()
    }
}
