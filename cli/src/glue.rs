//! Glue between flags and the library types: turning [`VmOpts`] into a `vm_spec::Spec`,
//! and mapping library errors to exit codes. No policy is decided here.

use std::path::PathBuf;
use std::time::Duration;

use vm_spec::{Guarantees, Image, ImageDigests, Limits, Mount, Policy, Spec, Trust};

use crate::args::{TrustArg, VmOpts};
use crate::exit;
use crate::parse::{self, EnvArg};

/// Default guest memory when `--memory` is not given.
pub const DEFAULT_MEM_MIB: i64 = 256;
/// Default process limit when `--pids` is not given.
pub const DEFAULT_PIDS: i64 = 256;

impl From<TrustArg> for Trust {
    fn from(t: TrustArg) -> Trust {
        match t {
            TrustArg::Trusted => Trust::Trusted,
            TrustArg::Semi => Trust::Semi,
            TrustArg::Untrusted => Trust::Untrusted,
        }
    }
}

/// The admission policy the flags ask for.
pub fn policy(opts: &VmOpts) -> Policy {
    Policy {
        allow_emulation: opts.allow_emulation,
    }
}

/// The image to boot: the built-in image (`<images dir>/current/`) with any of
/// `--kernel`/`--initrd`/`--rootfs` replacing its parts. When both `--kernel` and
/// `--initrd` are given the built-in image is not needed.
pub fn image(opts: &VmOpts) -> anyhow::Result<Image> {
    let mut image = match (&opts.kernel, &opts.initrd) {
        (Some(kernel), Some(initrd)) => Image {
            kernel: kernel.clone(),
            bz_image: None,
            initrd: Some(initrd.clone()),
            rootfs: None,
            digests: ImageDigests::default(),
        },
        _ => vm_sandbox::images::default_spec_image().map_err(|e| {
            anyhow::Error::new(e).context(
                "no built guest image (run `vm images build`, or pass --kernel and --initrd)",
            )
        })?,
    };
    if let Some(kernel) = &opts.kernel {
        image.kernel = kernel.clone();
        image.bz_image = None;
    }
    if let Some(initrd) = &opts.initrd {
        image.initrd = Some(initrd.clone());
    }
    image.rootfs = opts.rootfs.clone();
    Ok(image)
}

/// Builds the spec for `opts` with the guest environment `env` (already resolved).
pub fn spec(
    opts: &VmOpts,
    env: Vec<(String, String)>,
    env_allow: Vec<String>,
) -> anyhow::Result<Spec> {
    let limits = Limits {
        vcpus: opts.cpus.unwrap_or(1),
        mem_mib: opts.memory.unwrap_or(DEFAULT_MEM_MIB),
        pids: opts.pids.unwrap_or(DEFAULT_PIDS),
        wall: opts.timeout.unwrap_or(Duration::ZERO),
    };
    let mounts = opts
        .volumes
        .iter()
        .map(|v| Mount {
            host_path: PathBuf::from(&v.host),
            guest_path: v.guest.clone(),
            read_only: v.read_only,
        })
        .collect();
    let guarantees = Guarantees {
        egress_denied: true,
        limits,
        mounts,
        env,
        env_allow,
    };
    Ok(Spec::new(image(opts)?, guarantees))
}

/// `PATH` given to guest commands unless `-e PATH=…` is passed: the guest environment is
/// exactly what the spec lists (nothing is inherited), and an argv is looked up in `PATH`
/// only when the environment has one.
pub const DEFAULT_GUEST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Resolves `-e` flags against this process's environment, adding the default `PATH`.
pub fn env(args: &[EnvArg]) -> Vec<(String, String)> {
    let mut env = parse::resolve_env(args, |k| std::env::var(k).ok());
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.insert(0, ("PATH".to_string(), DEFAULT_GUEST_PATH.to_string()));
    }
    env
}

/// Maps a library error type found in an error's cause chain to its exit code.
pub fn classify_library_error(e: &(dyn std::error::Error + 'static)) -> Option<u8> {
    if e.is::<vm_spec::SpecError>() {
        return Some(exit::REFUSED);
    }
    if let Some(a) = e.downcast_ref::<vm_spec::AdmitError>() {
        return Some(match a {
            vm_spec::AdmitError::NoneAdmissible { .. } => exit::NO_DRIVER,
            vm_spec::AdmitError::Forbidden { .. } => exit::REFUSED,
        });
    }
    if e.is::<vm_drivers::NoDriverError>() {
        return Some(exit::NO_DRIVER);
    }
    if let Some(s) = e.downcast_ref::<vm_sandbox::SelectError>() {
        use vm_sandbox::SelectError;
        return Some(match s {
            SelectError::NoDriver { .. } => exit::NO_DRIVER,
            SelectError::Unknown { .. } => exit::USAGE,
            SelectError::Unusable(d) if d.available => exit::REFUSED,
            SelectError::Unusable(_) => exit::NO_DRIVER,
        });
    }
    if let Some(s) = e.downcast_ref::<vm_sandbox::SandboxError>() {
        use vm_sandbox::SandboxError;
        match s {
            // Transparent variants hide the inner error from the cause chain: map it here.
            SandboxError::Select(inner) => return classify_library_error(inner),
            SandboxError::Path(_) | SandboxError::Glob(_) => return Some(exit::USAGE),
            SandboxError::Unsupported(_) => return Some(exit::FAILED),
            SandboxError::Machine { source, .. } => return classify_library_error(source),
            _ => {}
        }
    }
    if e.is::<vm_sandbox::PublishError>() {
        return Some(exit::USAGE);
    }
    if let Some(vm_drivers::MachineError::WallExpired { .. }) =
        e.downcast_ref::<vm_drivers::MachineError>()
    {
        return Some(exit::TIMEOUT);
    }
    if e.is::<crate::state::StateError>() {
        return Some(exit::FAILED);
    }
    None
}
