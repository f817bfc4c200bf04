//! Resolving flags into what the library takes: [`VmOpts`] and [`CmdOpts`] into a
//! `vm_spec::Spec`, its trust and its policy, before anything boots. No policy is decided
//! here (validation, admission and selection are the library's); exit codes are
//! [`crate::exit`]'s.

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
pub fn flags(vm: &VmOpts, cmd: &CmdOpts) -> anyhow::Result<Resolved> {
    Ok(Resolved {
        spec: spec(vm, env(&cmd.env), cmd.env_allow.clone())?,
        trust: vm.trust.into(),
        policy: policy(vm),
    })
}

/// Refuses a `-w` that is not relative to the guest root or under it (the sandbox's rule,
/// [`vm_sandbox::confine::workdir`]), before anything boots.
pub fn check_workdir(spec: &Spec, workdir: Option<&str>) -> anyhow::Result<()> {
    if let Some(w) = workdir {
        vm_sandbox::confine::workdir(&spec.root, w).map_err(|e| exit::usage(format!("-w: {e}")))?;
    }
    Ok(())
}

/// Resolves `-e` flags against this process's environment. The default guest `PATH` is not
/// added here: [`spec`] writes `vm_spec`'s default environment into the spec, where
/// `--dry-run` shows it.
pub fn env(args: &[EnvArg]) -> Vec<(String, String)> {
    parse::resolve_env(args, |k| std::env::var(k).ok())
}
