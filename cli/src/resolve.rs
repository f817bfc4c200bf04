//! Resolving flags into what the library takes: [`VmOpts`] and [`CmdOpts`] into a
//! `vm_spec::Spec`, its trust and its policy, before anything boots. No policy is decided
//! here (validation, admission and selection are the library's); exit codes are
//! [`crate::exit`]'s.

use std::path::PathBuf;

use vm_spec::{Guarantees, Image, ImageConfig, ImageDigests, Limits, Mount, Policy, Spec, Trust};

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
        allow_weaker_jail: opts.allow_weaker_jail,
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
            config: ImageConfig::default(),
            source: None,
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
        wall: opts.timeout,
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
    // The guest environment is exactly the spec's: the image's Env under the `-e` values,
    // plus vm-spec's documented default (`PATH` = vm_spec::DEFAULT_GUEST_PATH unless `-e` or
    // the image sets it), which [`flags`] writes in once the image is known.
    let guarantees = Guarantees {
        egress_denied: true,
        limits,
        mounts,
        env,
        env_allow,
        mount_secret_allow: opts.allow_mount_secret.clone(),
    };
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

/// The spec, trust and policy of a booting command's options. `--image` is resolved here
/// (from the OCI store, pulled when missing), so the spec records the digest it boots.
pub async fn flags(vm: &VmOpts, cmd: &CmdOpts) -> anyhow::Result<Resolved> {
    let mut spec = spec(vm, env(&cmd.env), cmd.env_allow.clone())?;
    spec.user = cmd.user.clone();
    if let Some(reference) = &vm.image {
        let dir = vm_sandbox::oci::default_dir().ok_or(vm_sandbox::oci::Error::NoDir)?;
        let store = vm_sandbox::oci::Store::open(dir)?;
        vm_sandbox::resolve_oci(&store, &mut spec, reference).await?;
    }
    let spec = spec.with_default_env();
    Ok(Resolved {
        spec,
        trust: vm.trust.into(),
        policy: policy(vm),
    })
}

/// Refuses (usage) an empty command when the image has no `Entrypoint`/`Cmd` to run
/// instead, before anything boots.
pub fn require_command(spec: &Spec, command: &[String]) -> anyhow::Result<()> {
    if command.is_empty() && spec.image.config.default_command().is_empty() {
        return Err(exit::usage(
            "no command given (after --) and the image has no Entrypoint or Cmd",
        ));
    }
    Ok(())
}

/// Refuses a `-w` the sandbox's rule refuses ([`vm_sandbox::confine::workdir`]: `..`, NUL, too
/// long; a relative one is under the guest root, an absolute one anywhere in the guest), before
/// anything boots.
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
