//! [`Vm`]: one guest and the operations Python calls on it — a VM booted here
//! ([`vm_sandbox::MicroVm`], owned: closing it powers it off) or a named VM a `vm run -d`
//! started ([`NamedVm`], attached: closing it only detaches). [`boot`] builds the spec with
//! [`vm_sandbox::Request`] and boots it with [`vm_sandbox::MicroVm::boot`]: validation,
//! admission and driver selection happen there, before anything is created, so a refused
//! spec boots nothing. [`attach`] finds a named VM by its record ([`vm_sandbox::state`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use vm_sandbox::agent::{Command, Plain};
use vm_sandbox::state::Runtime as StateDir;
use vm_sandbox::state::named::NamedVm;
use vm_sandbox::{DEFAULT_COPY_CAP, Guest, MicroVm, Options, Request, Run, confine};
use vm_spec::{Mount, Policy, Trust};

use crate::failure::{Failure, Kind};
use crate::serve::Server;
use crate::stream::Stream;
use crate::{blocking, runtime};

/// A trust level by name, as the CLI's `--trust` takes it.
pub(crate) fn trust(name: &str) -> Result<Trust, Failure> {
    match name {
        "untrusted" => Ok(Trust::Untrusted),
        "semi" => Ok(Trust::Semi),
        "trusted" => Ok(Trust::Trusted),
        other => Err(Failure::refused(
            "trust",
            format!("{other:?} is not one of untrusted, semi, trusted"),
        )),
    }
}

/// `HOST -> GUEST[:ro|:rw]` as a mount: read-only unless `:rw` is written out, which the
/// spec's validation then refuses, naming the field (the CLI's `-v` rule).
fn mount(host: String, guest: String) -> Mount {
    let (guest, read_only) = match guest.rsplit_once(':') {
        Some((g, "rw")) => (g.to_string(), false),
        Some((g, "ro")) => (g.to_string(), true),
        _ => (guest, true),
    };
    Mount {
        host_path: PathBuf::from(host),
        guest_path: guest,
        read_only,
        via: vm_spec::MountVia::Share,
    }
}

pub(crate) fn secs(field: &str, s: Option<f64>) -> Result<Option<Duration>, Failure> {
    s.map(|s| {
        Duration::try_from_secs_f64(s)
            .map_err(|e| Failure::refused(field, format!("{s} seconds: {e}")))
    })
    .transpose()
}

/// Boots a VM. Every argument is the CLI's flag of the same name; `mounts` are
/// `(host, guest)` pairs, `env` `(name, value)` pairs.
#[pyfunction]
#[pyo3(signature = (*, memory_mib=None, cpus=None, pids=None, timeout=None, mounts=vec![],
    env=vec![], env_allow=vec![], mount_secret_allow=vec![], kernel=None, initrd=None,
    rootfs=None, image=None, user=None, trust="untrusted", allow_emulation=false,
    allow_weaker_jail=false, driver=None, name=None, run_dir=None, boot_timeout=300.0,
    snapshots=None, dax_window_mib=None))]
#[allow(clippy::too_many_arguments)]
pub fn boot(
    py: Python<'_>,
    memory_mib: Option<i64>,
    cpus: Option<i64>,
    pids: Option<i64>,
    timeout: Option<f64>,
    mounts: Vec<(String, String)>,
    env: Vec<(String, String)>,
    env_allow: Vec<String>,
    mount_secret_allow: Vec<PathBuf>,
    kernel: Option<PathBuf>,
    initrd: Option<PathBuf>,
    rootfs: Option<PathBuf>,
    image: Option<String>,
    user: Option<String>,
    trust: &str,
    allow_emulation: bool,
    allow_weaker_jail: bool,
    driver: Option<String>,
    name: Option<String>,
    run_dir: Option<PathBuf>,
    boot_timeout: f64,
    snapshots: Option<PathBuf>,
    dax_window_mib: Option<i64>,
) -> PyResult<Vm> {
    let dax_window_mib = dax_window_mib
        .map(|m| {
            u32::try_from(m)
                .map_err(|_| Failure::refused("dax_window", format!("{m} MiB is not a size")))
        })
        .transpose()?;
    let request = Request {
        memory_mib,
        cpus,
        pids,
        timeout: secs("timeout", timeout)?,
        mounts: mounts.into_iter().map(|(h, g)| mount(h, g)).collect(),
        env,
        env_allow,
        mount_secret_allow,
        kernel,
        initrd,
        rootfs,
        image,
        user,
    };
    let options = Options {
        trust: self::trust(trust)?,
        policy: Policy {
            allow_emulation,
            allow_weaker_jail,
        },
        driver,
        name: name.unwrap_or_else(vm_name),
        boot_timeout: secs("boot_timeout", Some(boot_timeout))?.unwrap_or_default(),
        run_dir_parent: run_dir,
        snapshots,
        dax_window_mib,
        ..Options::default()
    };
    blocking(py, move || {
        // What a killed Python process left (run directories whose owner is gone), as every
        // `vm` invocation sweeps its own.
        let parent = options.run_dir_parent.clone();
        vm_sandbox::rundir::sweep(&parent.unwrap_or_else(std::env::temp_dir));
        let rt = runtime();
        let spec = rt.block_on(request.resolve())?;
        let vm = rt.block_on(MicroVm::boot(spec, options))?;
        Ok(Vm::new(Held::Booted(Arc::new(vm))))
    })
}

/// A VM's default name in this process: `sdk-PID-N`.
pub fn vm_name() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("sdk-{}-{n}", std::process::id())
}

/// Attaches to the named VM `name` that `vm run -d --name NAME` started (its record in the
/// runtime state directory the CLI uses: `$VM_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/vm`, …).
/// Raises `NoSuchVm` for an unknown name, `Paused`/`NotRunning` for a VM that is not running.
#[pyfunction]
pub fn attach(py: Python<'_>, name: String) -> PyResult<Vm> {
    blocking(py, move || {
        let dir = StateDir::from_env()?;
        let vm = NamedVm::attach(&dir, &name)?;
        Ok(Vm::new(Held::Attached(Arc::new(vm))))
    })
}

/// The guest a [`Vm`] reaches, and how it holds it.
#[derive(Debug, Clone)]
pub enum Held {
    /// Booted by this process: it owns the VM.
    Booted(Arc<MicroVm>),
    /// A named VM another process holds: attached, never owned.
    Attached(Arc<NamedVm>),
}

impl Held {
    pub fn guest(&self) -> &Guest {
        match self {
            Held::Booted(vm) => vm,
            Held::Attached(vm) => vm,
        }
    }
}

/// A guest (see the module docs). Dropping a booted one kills the VM and removes its run
/// directory (`close` first asks the guest to power off); an attached one is only detached.
#[pyclass(module = "vm_sandbox._native", frozen)]
pub struct Vm {
    vm: Held,
    /// Set by `close` on an attached VM: later guest calls are refused (the VM runs on).
    detached: AtomicBool,
}

impl Vm {
    pub(crate) fn new(vm: Held) -> Vm {
        Vm {
            vm,
            detached: AtomicBool::new(false),
        }
    }

    /// The guest, once checked usable: an attached VM must still be attached and running
    /// (a VM another command paused or stopped fails at once, with its state).
    fn guest(&self) -> Result<&Guest, Failure> {
        if let Held::Attached(vm) = &self.vm {
            if self.detached.load(Ordering::Relaxed) {
                return Err(Failure::new(
                    Kind::GuestError,
                    format!("detached from VM {}: closed", vm.name()),
                ));
            }
            vm.check()?;
        }
        Ok(self.vm.guest())
    }
}

#[pymethods]
impl Vm {
    /// Starts `argv` (empty: the image's Entrypoint + Cmd) and returns its event stream.
    #[pyo3(signature = (argv, *, stdin=None, cwd=None, timeout=None, env=vec![],
        env_allow=vec![], user=None))]
    #[allow(clippy::too_many_arguments)]
    fn exec_stream(
        &self,
        py: Python<'_>,
        argv: Vec<String>,
        stdin: Option<&Bound<'_, PyBytes>>,
        cwd: Option<String>,
        timeout: Option<f64>,
        env: Vec<(String, String)>,
        env_allow: Vec<String>,
        user: Option<String>,
    ) -> PyResult<Stream> {
        let run = Run {
            command: Command::Argv(argv),
            stdin: stdin.map(|b| b.as_bytes().to_vec()).unwrap_or_default(),
            cwd,
            timeout: secs("timeout", timeout)?,
            env,
            env_allow,
            user,
        };
        blocking(py, move || Stream::start(self.guest()?, run))
    }

    /// The bytes of the file at `path` (relative to the root, or absolute under it).
    fn read_file<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyBytes>> {
        let data = blocking(py, || {
            let guest = self.guest()?;
            let rel = confine::in_root(guest.root(), &path).map_err(path_refused)?;
            Ok(runtime().block_on(guest.read_file(&rel))?)
        })?;
        Ok(PyBytes::new(py, &data))
    }

    /// Writes `data` to `path` (relative to the root, or absolute under it; parents made).
    fn write_file(&self, py: Python<'_>, path: String, data: &Bound<'_, PyBytes>) -> PyResult<()> {
        let data = data.as_bytes().to_vec();
        blocking(py, || {
            let guest = self.guest()?;
            let rel = confine::in_root(guest.root(), &path).map_err(path_refused)?;
            Ok(runtime().block_on(guest.write_file(&rel, &data))?)
        })
    }

    /// Removes the file (or the symlink itself) at `path`, relative to the root or absolute
    /// under it; a directory, or nothing there, is a `GuestError`.
    fn remove_file(&self, py: Python<'_>, path: String) -> PyResult<()> {
        blocking(py, || {
            let guest = self.guest()?;
            let rel = confine::in_root(guest.root(), &path).map_err(path_refused)?;
            Ok(runtime().block_on(guest.remove(&rel))?)
        })
    }

    /// Streams the host file `src` into the guest file `path`, at most `max_size` bytes;
    /// returns the bytes copied. Memory stays flat whatever the size.
    #[pyo3(signature = (src, path, max_size=DEFAULT_COPY_CAP))]
    fn upload(&self, py: Python<'_>, src: PathBuf, path: String, max_size: u64) -> PyResult<u64> {
        blocking(py, || {
            let guest = self.guest()?;
            let rel = confine::in_root(guest.root(), &path).map_err(path_refused)?;
            runtime().block_on(async {
                let mut f = tokio::fs::File::open(&src)
                    .await
                    .map_err(|e| Failure::new(Kind::VmError, format!("{}: {e}", src.display())))?;
                Ok(guest.write_file_from(&rel, max_size, &mut f).await?)
            })
        })
    }

    /// Streams the guest file `path` into the host file `dst`, at most `max_size` bytes;
    /// returns the bytes copied.
    #[pyo3(signature = (path, dst, max_size=DEFAULT_COPY_CAP))]
    fn download(&self, py: Python<'_>, path: String, dst: PathBuf, max_size: u64) -> PyResult<u64> {
        blocking(py, || {
            let guest = self.guest()?;
            let rel = confine::in_root(guest.root(), &path).map_err(path_refused)?;
            runtime().block_on(async {
                let f = tokio::fs::File::create(&dst)
                    .await
                    .map_err(|e| Failure::new(Kind::VmError, format!("{}: {e}", dst.display())))?;
                let mut out = Plain(f);
                let n = guest.read_file_to(&rel, max_size, &mut out).await?;
                Ok(n)
            })
        })
    }

    /// Regular files under `dir` (relative to the root; `""` = the root), sorted, relative to
    /// the root.
    #[pyo3(signature = (dir=String::new()))]
    fn list_files(&self, py: Python<'_>, dir: String) -> PyResult<Vec<String>> {
        blocking(py, || {
            let guest = self.guest()?;
            let rel = match dir.as_str() {
                "" | "." => String::new(),
                d if d.trim_end_matches('/') == guest.root().trim_end_matches('/') => String::new(),
                d => confine::in_root(guest.root(), d).map_err(path_refused)?,
            };
            Ok(runtime().block_on(guest.walk(&rel))?)
        })
    }

    /// Starts a long-lived process with `ports` published on the host (`"0:8080"`: a free
    /// loopback port to guest 8080) and waits until it is ready (every port accepts; with
    /// `ready`, `GET ready` answers 2xx). Only loopback host addresses are accepted.
    #[pyo3(signature = (argv, ports, ready=None, ready_timeout=300.0))]
    fn serve(
        &self,
        py: Python<'_>,
        argv: Vec<String>,
        ports: Vec<String>,
        ready: Option<String>,
        ready_timeout: f64,
    ) -> PyResult<Server> {
        let ready_timeout = secs("ready_timeout", Some(ready_timeout))?.unwrap_or_default();
        blocking(py, move || {
            self.guest()?;
            Server::start(self.vm.clone(), argv, &ports, ready, ready_timeout)
        })
    }

    /// Snapshots a VM booted with `snapshots=DIR` into the new directory `path` (on DIR's
    /// filesystem) and ends it; returns what was written. Refused, the VM still running, on a
    /// driver without snapshots (tcg) and on an attached VM.
    fn snapshot<'py>(&self, py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
        let Held::Booted(vm) = &self.vm else {
            return Err(Failure::new(
                Kind::VmError,
                "an attached VM cannot be snapshotted here: its holder owns it".to_string(),
            )
            .into());
        };
        let vm = vm.clone();
        let record = blocking(py, move || Ok(runtime().block_on(vm.snapshot(&path))?))?;
        crate::snapshot::record_dict(py, &record)
    }

    /// Stops every host process of the VM until `resume`; guest calls fail meanwhile. An
    /// attached VM is paused by its holder (as `vm pause NAME`).
    fn pause(&self, py: Python<'_>) -> PyResult<()> {
        self.set_paused(py, true)
    }

    /// Lets a paused VM run again.
    fn resume(&self, py: Python<'_>) -> PyResult<()> {
        self.set_paused(py, false)
    }

    /// A booted VM: powers the guest off, kills what is left and removes the run directory.
    /// An attached VM: detaches only (the VM keeps running; `vm stop`/`vm rm -f` end it).
    /// Idempotent.
    fn close(&self, py: Python<'_>) {
        match &self.vm {
            Held::Booted(vm) => py.detach(|| runtime().block_on(vm.close())),
            Held::Attached(_) => self.detached.store(true, Ordering::Relaxed),
        }
    }

    /// The driver that booted the guest (`tcg`, `kvm`).
    #[getter]
    fn driver(&self) -> String {
        match &self.vm {
            Held::Booted(vm) => vm.driver().to_string(),
            Held::Attached(vm) => vm.record().driver.clone().unwrap_or_default(),
        }
    }

    /// How many restores lie behind this sandbox: 0 when booted, 1 when restored from a
    /// snapshot of a booted one (`Sandbox.restore`), and so on; the guest reads the same
    /// number in `/run/vm/generation`, written after its kernel's CRNG was reseeded. A
    /// guest process that seeded a generator before the snapshot seeds it again when the
    /// number changes. None for an attached VM (its guest file still says it).
    #[getter]
    fn generation(&self) -> Option<u64> {
        match &self.vm {
            Held::Booted(vm) => Some(vm.generation()),
            Held::Attached(_) => None,
        }
    }

    /// The containment the guest runs under (`microVM`, `user-kernel`).
    #[getter]
    fn containment(&self) -> String {
        match &self.vm {
            Held::Booted(vm) => vm.containment().to_string(),
            Held::Attached(vm) => vm.record().containment.clone().unwrap_or_default(),
        }
    }

    /// The guest working root (`/work`).
    #[getter]
    fn root(&self) -> String {
        self.vm.guest().root().to_string()
    }

    /// The per-VM run directory (gone once closed); an attached VM's state directory.
    #[getter]
    fn run_dir(&self) -> PathBuf {
        match &self.vm {
            Held::Booted(vm) => vm.run_dir().to_path_buf(),
            Held::Attached(vm) => vm.dir(),
        }
    }

    /// The name of an attached VM (None for one booted here).
    #[getter]
    fn name(&self) -> Option<String> {
        match &self.vm {
            Held::Booted(_) => None,
            Held::Attached(vm) => Some(vm.name().to_string()),
        }
    }

    /// The default working directory of an attached VM's commands (`vm run -d -w`).
    #[getter]
    fn workdir(&self) -> Option<String> {
        match &self.vm {
            Held::Booted(_) => None,
            Held::Attached(vm) => vm.request().workdir.clone(),
        }
    }

    /// The VM's host processes (empty once it is gone).
    fn host_pids(&self) -> Vec<u32> {
        match &self.vm {
            Held::Booted(vm) => vm.machine().host_pids(),
            Held::Attached(vm) => vm.current().map(|r| r.live_pids()).unwrap_or_default(),
        }
    }

    /// Whether the VM's wall lifetime expired (it was torn down).
    fn wall_expired(&self) -> bool {
        match &self.vm {
            Held::Booted(vm) => vm.machine().wall_expired(),
            Held::Attached(vm) => vm.current().is_ok_and(|r| r.wall_expired()),
        }
    }
}

impl Vm {
    fn set_paused(&self, py: Python<'_>, pause: bool) -> PyResult<()> {
        blocking(py, || match &self.vm {
            Held::Booted(vm) if pause => Ok(vm.pause()?),
            Held::Booted(vm) => Ok(vm.resume()?),
            Held::Attached(vm) => Ok(runtime().block_on(vm.set_paused(pause))?),
        })
    }
}

fn path_refused(e: vm_sandbox::confine::PathError) -> Failure {
    Failure::new(Kind::PathRefused, e.to_string())
}
