//! `vm-sandbox`: the public API for running work in a microVM.
//!
//! Data flows one way: caller -> [`vm_spec::Spec::validate`] -> admission ([`vm_spec::admit`])
//! -> driver selection ([`select_driver`]) -> mount preparation ([`mounts`]) ->
//! `vm_drivers::BootPlan` -> `Driver::boot` -> `vm_drivers::Machine` -> guest agent.
//!
//! # Design
//! - **No silent downgrade.** [`select_driver`] returns the first *available* driver whose
//!   containment the gate admits for the work's trust under the [`vm_spec::Policy`]. An
//!   available but weaker driver (QEMU TCG, `user-kernel`) is used for untrusted work only
//!   when `Policy::allow_emulation` is set, and the refusal names that flag
//!   (`--allow-emulation`). When nothing qualifies the error lists every driver's diagnosis.
//! - **Defense in depth on paths.** [`Guest`] file operations check paths host-side
//!   ([`confine::relative`]: relative, no `..`, no NUL) before the agent checks them again
//!   beneath the root with `openat2(RESOLVE_BENEATH)`.
//! - **Explicit environment.** Every process started in the guest gets exactly the image's
//!   `Env` (`Image.config`) under `Guarantees.env`, plus the variables its [`Run`] sets
//!   (checked by the same secret rules); nothing is inherited from the host and nothing is
//!   added here. The default guest `PATH` (`vm_spec::DEFAULT_GUEST_PATH`) applies only when
//!   written into the spec (`Spec::with_default_env`), as the CLI does.
//! - **Image roots.** `Image.rootfs` (erofs or ext4) becomes the guest's root under a tmpfs
//!   overlay: every command, file operation and mount is inside it, and writes vanish with the
//!   VM. The image's defaults apply (`WorkingDir` as the default directory, `User` unless
//!   `Spec.user`/`Run.user` says otherwise, `Entrypoint` + `Cmd` for an empty argv).
//!   [`image_root`] resolves `--image REF` through the OCI store into that root.
//! - **Read-only mounts only.** A host file becomes a raw read-only disk; a host directory
//!   an erofs image cached by content key (see [`mounts`]).
//! - **Lifetime.** The wall limit goes into the `BootPlan` and the `Machine` enforces it.
//!   [`MicroVm::close`] is idempotent and removes the per-VM run directory; `Drop` kills.
//! - **Serving.** [`Guest::serve`] publishes guest ports on host loopback addresses
//!   (never a non-loopback one unless written out, see [`PublishSpec`]; ranges as docker
//!   writes them); [`Serving::wait_ready`] waits until they accept connections and,
//!   optionally, until an HTTP path answers 2xx ([`Readiness`]).
//! - **One set of rules for every VM.** A [`MicroVm`] (booted here, owned) and a
//!   [`RunningVm`] (held by another process, e.g. a `vm run -d` supervisor, attached by its
//!   agent socket) both dereference to [`Guest`], the one implementation of request
//!   building, path confinement and environment checks.
//! - **Named VMs.** [`state`] is the runtime state directory of VMs started by `vm run -d`:
//!   one record per VM (its state, driver, processes, agent socket), listed by
//!   [`state::Runtime::ps`]; [`state::named::NamedVm::attach`] attaches to one by name (never
//!   owning it), [`state::named::set_paused`] pauses it through its holder.
//! - **Images as roots.** [`oci`] (the `vm-oci` crate) pulls or imports OCI images into
//!   cached read-only erofs files with their process defaults: `oci::Store::open(dir)`,
//!   `.pull(&Reference, &Auth)`, `.get_or_pull(name_or_ref)`, `.import(path)`, `.get(..)`,
//!   `.list()`, `.remove(..)`, `.prune()` → `oci::Image { digest, erofs, size, config, refs }`.
//! - **Roots from a runtime's snapshot.** [`SnapshotRoots`] turns a root filesystem another
//!   runtime assembled (the containerd shim's snapshot) into the same read-only erofs root,
//!   cached by the snapshot's identity, with one reference per VM using it.
//! - **One classification of errors.** [`classify`] (and [`SandboxError::class`]) says what
//!   kind of failure an error is ([`Class`]: refused, no driver, boot failed, wall expired,
//!   …) and which field a refusal names; the CLI's exit codes, the Python SDK's exceptions
//!   and the containerd shim's ttrpc codes are each one `match` over it.
//! - **Callers need only this crate and `vm-spec`.** The agent types a caller handles are
//!   re-exported in [`agent`], the driver registry in [`drivers`].
//!
//! # Example
//! ```no_run
//! use std::time::Duration;
//! use vm_sandbox::{MicroVm, Options, PublishSpec, Readiness, ServeSpec, images};
//! use vm_spec::{Guarantees, Limits, Mount, Policy, Spec, Trust};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = Limits { vcpus: 1, mem_mib: 256, pids: 256, wall: Some(Duration::from_secs(600)) };
//! let guarantees = Guarantees::untrusted(limits, vec![Mount::read_only("/srv/weights", "/weights")])
//!     .with_env("PATH", "/usr/bin:/bin");
//! let spec = Spec::new(images::default_spec_image()?, guarantees);
//! // On a host without hardware virtualization, accept QEMU emulation explicitly.
//! let options = Options {
//!     policy: Policy { allow_emulation: true, ..Policy::default() },
//!     ..Options::default()
//! };
//! assert_eq!(options.trust, Trust::Untrusted);
//! let vm = MicroVm::boot(spec, options).await?;
//! println!("running on {} ({})", vm.driver(), vm.containment());
//!
//! let out = vm.exec("echo hello > greeting && cat greeting").await?;
//! assert_eq!(out.output, b"hello\n");
//! vm.write_file("in/data.txt", b"abc").await?;
//! assert_eq!(vm.read_file("in/data.txt").await?, b"abc");
//! let txt = vm.glob("**/*.txt").await?; // ["in/data.txt"]
//! # let _ = txt;
//! let uname = vm.capture(&["uname", "-r"]).await?;
//! # let _ = uname;
//!
//! let server = vm
//!     .serve(ServeSpec {
//!         argv: vec!["httpd".into(), "-f".into(), "-p".into(), "8000".into()],
//!         publish: PublishSpec::parse_all(&["0:8000"])?, // a free loopback port -> guest 8000
//!     })
//!     .await?;
//! let ready = Readiness { http_path: Some("/".into()), timeout: Duration::from_secs(60) };
//! server.wait_ready(&ready).await?; // or the server's exit, or NotReady with what was seen
//! println!("reachable at {}", server.published()[0].url());
//! server.stop().await?;
//! vm.close().await;
//! # Ok(()) }
//! ```

mod class;
pub mod confine;
mod error;
pub mod glob;
mod guest;
pub mod image_root;
pub mod images;
mod link;
mod microvm;
pub mod mounts;
pub mod publish;
mod ready;
pub mod request;
pub mod rundir;
mod running;
mod select;
mod serving;
mod snapshot_files;
pub mod snapshot_root;
pub mod snapshots;
pub mod state;

pub use class::{Class, Classified, classify};
pub use error::SandboxError;
pub use glob::{Glob, GlobError};
pub use guest::{CopyError, DEFAULT_COPY_CAP, Guest, MemberRoot, Run};
pub use image_root::{ImageRootError, ResolvedImage, resolve_oci, use_image};
pub use microvm::{MicroVm, Options, RawDisk, max_disks, preflight};
pub use mounts::{MountCache, MountError};
pub use publish::{PublishError, PublishSpec};
pub use ready::{DEFAULT_READY_TIMEOUT, Probe, Readiness};
pub use request::{DEFAULT_MEM_MIB, DEFAULT_PIDS, NoImage, Request, RequestError};
pub use running::{Attach, RunningVm};
pub use select::{Diagnosis, SelectError, select, select_driver, select_named};
pub use serving::{
    FORWARD_BUSY_WAIT, MAX_CONNECTIONS, POLL_INTERVAL, Published, ServeError, ServeSpec,
    ServedProcess, Serving, UNREACHABLE_AFTER, describe_exit,
};
pub use snapshot_root::{SnapshotRootError, SnapshotRoots};
pub use snapshots::{SnapshotError, SnapshotRecord, SnapshotStore};
/// Confines this process as a reader of agent frames that starts nothing more (the
/// `vm-jail` reader filter): call it once every VM process is started.
pub use vm_jail::seccomp::client::confine_reader;
/// OCI images as guest roots: pull, import, list, remove (the `vm-oci` crate).
pub use vm_oci as oci;

/// The guest agent's types a caller of this API handles: the command, its output and exit
/// status, the streaming events, and the client error that carries the agent's verdict.
pub mod agent {
    pub use vm_agent_client::{
        ClientError, ExecEvent, ExecStream, Interactive, InteractiveInput, InteractiveOutput,
    };
    /// What confines a container's processes in the guest.
    pub use vm_agent_protocol::container;
    pub use vm_agent_protocol::protocol::{
        Command, ErrorKind, ExecOutput, ExitStatus, MAX_POD_UPPER_BYTES, MAX_SIGNAL, PodMount,
        TtySize, pod_member_cgroup,
    };
    pub use vm_agent_protocol::sparse::{ChunkSink, Plain, SparseWriter};
}

/// The driver registry and the driver-level errors a caller may need to tell apart.
pub mod drivers {
    pub use vm_drivers::snapshot::SnapshotError;
    pub use vm_drivers::{Availability, Driver, MachineError, NoDriverError, Registry};
}
