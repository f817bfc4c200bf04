//! Resolving flags into what the library takes: [`VmOpts`] and [`CmdOpts`] into a
//! `vm_spec::Spec`, its trust and its policy, before anything boots. No policy is decided
//! here (validation, admission and selection are the library's); exit codes are
//! [`crate::exit`]'s.

use std::path::PathBuf;

use vm_spec::{Mount, Policy, Spec, Trust};

use crate::args::{CmdOpts, TrustArg, VmOpts};
use crate::exit;
use crate::parse::{self, EnvArg};

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

/// The library's request for `opts` with the guest environment `env` (already resolved) and
/// the user `user`: the one flag → spec path, shared with the Python SDK
/// ([`vm_sandbox::Request`]).
pub fn request(
    opts: &VmOpts,
    env: Vec<(String, String)>,
    env_allow: Vec<String>,
    user: Option<String>,
) -> vm_sandbox::Request {
    let mounts = opts
        .volumes
        .iter()
        .map(|v| Mount {
            host_path: PathBuf::from(&v.host),
            guest_path: v.guest.clone(),
            read_only: v.read_only,
            via: if v.erofs {
                vm_spec::MountVia::Erofs
            } else {
                vm_spec::MountVia::Share
            },
        })
        .collect();
    vm_sandbox::Request {
        memory_mib: opts.memory,
        cpus: opts.cpus,
        pids: opts.pids,
        timeout: opts.timeout,
        mounts,
        env,
        env_allow,
        mount_secret_allow: opts.allow_mount_secret.clone(),
        kernel: opts.kernel.clone(),
        initrd: opts.initrd.clone(),
        rootfs: opts.rootfs.clone(),
        image: opts.image.clone(),
        user,
    }
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
    let req = request(vm, env(&cmd.env), cmd.env_allow.clone(), cmd.user.clone());
    Ok(Resolved {
        spec: req.resolve().await?,
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
/// added here: [`vm_sandbox::Request::resolve`] writes `vm_spec`'s default environment into the spec, where
/// `--dry-run` shows it.
pub fn env(args: &[EnvArg]) -> Vec<(String, String)> {
    parse::resolve_env(args, |k| std::env::var(k).ok())
}
