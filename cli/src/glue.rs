//! Glue between flags and the library types: turning [`VmOpts`] into a `vm_spec::Spec`,
//! and mapping library errors to exit codes. No policy is decided here.

use std::path::PathBuf;
use std::time::Duration;

use vm_spec::{Guarantees, Image, ImageDigests, Limits, Mount, Policy, Spec, Trust};

use crate::args::{CmdOpts, TrustArg, VmOpts};
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
    // The guest environment is exactly the spec's: `-e` values plus vm-spec's documented
    // default (`PATH` = vm_spec::DEFAULT_GUEST_PATH unless `-e PATH=…` is given).
    let guarantees = Guarantees {
        egress_denied: true,
        limits,
        mounts,
        env,
        env_allow,
        mount_secret_allow: opts.allow_mount_secret.clone(),
    }
    .with_default_env();
    Ok(Spec::new(image(opts)?, guarantees))
}

/// What `exec`, `run` and `serve` resolve from their options before anything boots.
pub struct Resolved {
    /// The spec the options describe (not yet validated).
    pub spec: Spec,
    /// The trust level of the work.
    pub trust: Trust,
    /// The policy the options allow (`--allow-emulation`).
    pub policy: Policy,
}

/// The spec, trust and policy of a booting command's options.
pub fn resolve(vm: &VmOpts, cmd: &CmdOpts) -> anyhow::Result<Resolved> {
    Ok(Resolved {
        spec: spec(vm, env(&cmd.env), cmd.env_allow.clone())?,
        trust: vm.trust.into(),
        policy: policy(vm),
    })
}

/// Resolves `-e` flags against this process's environment. The default guest `PATH` is not
/// added here: [`spec`] writes `vm_spec`'s default environment into the spec, where
/// `--dry-run` shows it.
pub fn env(args: &[EnvArg]) -> Vec<(String, String)> {
    parse::resolve_env(args, |k| std::env::var(k).ok())
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
            // Select/Admit/Machine carry their cause in the chain; `classify` reaches it.
            SandboxError::Path(_) | SandboxError::Glob(_) => return Some(exit::USAGE),
            SandboxError::Unsupported(_) => return Some(exit::FAILED),
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

#[cfg(test)]
mod tests {
    use vm_sandbox::{SandboxError, SelectError};
    use vm_spec::{AdmitError, Containment, Trust};

    use crate::exit;

    /// Library errors wrapped in `SandboxError` keep their cause in the chain, so the exit
    /// code comes from the cause (and the one-line message names it).
    #[test]
    fn sandbox_errors_classify_by_their_cause() {
        let select = SandboxError::Select(SelectError::Unknown {
            name: "nope".into(),
            known: "kvm, tcg".into(),
        });
        let err = anyhow::Error::new(select).context("booting");
        assert_eq!(exit::classify(&err), exit::USAGE);
        assert!(
            exit::one_line(&err).contains("\"nope\" is not registered"),
            "{}",
            exit::one_line(&err)
        );

        let admit = SandboxError::Admit(AdmitError::Forbidden {
            tier: "tcg".into(),
            trust: Trust::Untrusted,
            provided: Containment::UserKernel,
            required: Containment::MicroVm,
            allowed_by: Some("--allow-emulation"),
        });
        let err = anyhow::Error::new(admit);
        assert_eq!(exit::classify(&err), exit::REFUSED);
        assert!(exit::one_line(&err).contains("--allow-emulation"));
    }
}
