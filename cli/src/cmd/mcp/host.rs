//! What the host decided when it started `vm mcp`, and the one place a tool call's ask for a
//! VM becomes a spec the library validates, or a refusal naming the tool's argument.
//!
//! The host's flags are `vm exec`'s (trust, policy, limits, `-v`, `-e`, `--image`): a call
//! may ask for less memory or a shorter lifetime than the ceilings (`--max-memory`,
//! `--max-timeout`, by default the flags' own values), an image the host offered (`--image`,
//! `--allow-image`) and read-only mounts of host paths under an `--allow-mount` directory.
//! Everything else about the VM is the host's. Nothing here decides what the library
//! decides: the spec is still validated, admitted and given a driver by `vm-sandbox`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use vm_sandbox::Options;
use vm_sandbox::state::Runtime;
use vm_spec::Spec;

use super::McpArgs;
use super::fault::Fault;
use super::tools::{Amount, MountAsk, VmAsk};
use crate::args::{CmdOpts, VmOpts};
use crate::exit;
use crate::parse::{self, VolumeArg};
use crate::resolve;

/// The host's decisions (see the module docs).
#[derive(Debug)]
pub struct Host {
    vm: VmOpts,
    cmd: CmdOpts,
    /// The `-e` variables, resolved once against this process's environment.
    env: Vec<(String, String)>,
    allow_images: Vec<String>,
    /// Canonical directories a call's mounts must lie under.
    allow_mounts: Vec<PathBuf>,
    memory: i64,
    max_memory: i64,
    timeout: Duration,
    max_timeout: Duration,
    /// The most bytes of one output stream or file a result carries.
    pub max_output: usize,
    max_vms: u32,
    /// One permit per VM this server runs.
    vms: Arc<Semaphore>,
    /// The state directory of named VMs (kept sandboxes) and of ephemeral run directories.
    pub runtime: Runtime,
}

/// A spec the library accepted (validated, admitted, a driver selected) and how to boot it.
pub struct Admitted {
    pub spec: Spec,
    pub options: Options,
    /// What the VM was given, for the tools' listings.
    pub memory_mib: i64,
    pub wall: Duration,
    pub image: Option<String>,
}

impl Host {
    /// The host's decisions from `vm mcp`'s flags; a contradiction is a usage error.
    pub fn new(a: &McpArgs) -> anyhow::Result<Host> {
        let memory = a.vm.memory.unwrap_or(vm_sandbox::DEFAULT_MEM_MIB);
        let max_memory = a.max_memory.unwrap_or(memory);
        if max_memory < memory {
            return Err(exit::usage(format!(
                "--max-memory {max_memory}M is less than --memory {memory}M"
            )));
        }
        let timeout = a.vm.timeout.unwrap_or(super::DEFAULT_TIMEOUT);
        let max_timeout = a.max_timeout.unwrap_or(timeout);
        if max_timeout < timeout || timeout.is_zero() {
            return Err(exit::usage(format!(
                "--max-timeout {} must be at least --timeout {}, which must be positive",
                parse::fmt_duration(max_timeout),
                parse::fmt_duration(timeout)
            )));
        }
        let mut allow_mounts = Vec::new();
        for dir in &a.allow_mounts {
            let canonical = std::fs::canonicalize(dir)
                .ok()
                .filter(|p| p.is_dir())
                .ok_or_else(|| {
                    exit::usage(format!(
                        "--allow-mount {}: not an existing directory",
                        dir.display()
                    ))
                })?;
            allow_mounts.push(canonical);
        }
        Ok(Host {
            vm: a.vm.clone(),
            cmd: a.cmd.clone(),
            env: resolve::env(&a.cmd.env),
            allow_images: a.allow_images.clone(),
            allow_mounts,
            memory,
            max_memory,
            timeout,
            max_timeout,
            max_output: a.max_output,
            max_vms: a.max_vms,
            vms: Arc::new(Semaphore::new(a.max_vms as usize)),
            runtime: Runtime::from_env()?,
        })
    }

    /// The default working directory of commands (`-w`).
    pub fn workdir(&self) -> Option<String> {
        self.cmd.workdir.clone()
    }

    /// The images a call may ask for, the default first (none: the built-in image).
    pub fn images(&self) -> Vec<String> {
        self.vm
            .image
            .iter()
            .chain(&self.allow_images)
            .cloned()
            .collect()
    }

    /// How many of a spec's mounts are the host's own (`-v`, first).
    pub fn host_mounts(&self) -> usize {
        self.vm.volumes.len()
    }

    /// `--max-vms`.
    pub fn max_vms(&self) -> usize {
        self.max_vms as usize
    }

    /// How many VMs this server runs now.
    pub fn vms_in_use(&self) -> usize {
        self.max_vms() - self.vms.available_permits()
    }

    /// One VM's place among the `--max-vms` this server runs, or a refusal saying so.
    pub fn vm_permit(&self) -> Result<OwnedSemaphorePermit, Fault> {
        self.vms.clone().try_acquire_owned().map_err(|_| {
            Fault::busy(format!(
                "this server already runs {} VMs (vm mcp --max-vms); remove a sandbox or wait for a run to end",
                self.max_vms
            ))
        })
    }

    /// The spec a call asks for, validated, admitted and given a driver by the library, with
    /// the options to boot it as `name`; or a refusal naming the call's argument.
    pub async fn admit(&self, ask: &VmAsk, name: String) -> Result<Admitted, Fault> {
        let memory = self.memory(ask.memory.as_ref())?;
        let wall = self.wall(ask.timeout.as_ref())?;
        let image = self.image(ask.image.as_deref())?;
        let mut vm = self.vm.clone();
        vm.memory = Some(memory);
        vm.timeout = Some(wall);
        vm.image = image.clone();
        for (i, m) in ask.mounts.iter().enumerate() {
            vm.volumes.push(self.mount(i, m)?);
        }
        let req = resolve::request(
            &vm,
            self.env.clone(),
            self.cmd.env_allow.clone(),
            self.cmd.user.clone(),
        );
        let spec = req
            .resolve()
            .await
            .map_err(|e| Fault::from_error(&e, self.vm.volumes.len()))?;
        let options = Options {
            trust: vm.trust.into(),
            policy: resolve::policy(&vm),
            driver: vm.driver.clone(),
            name,
            run_dir_parent: Some(self.runtime.ephemeral_parent()),
            ..Options::default()
        };
        vm_sandbox::preflight(&spec, &options)
            .map_err(|e| Fault::from_error(&e, self.vm.volumes.len()))?;
        resolve::check_workdir(&spec, self.cmd.workdir.as_deref())
            .map_err(|e| Fault::failed(format!("the host's -w: {e}")))?;
        Ok(Admitted {
            spec,
            options,
            memory_mib: memory,
            wall,
            image,
        })
    }

    fn memory(&self, ask: Option<&Amount>) -> Result<i64, Fault> {
        let Some(ask) = ask else {
            return Ok(self.memory);
        };
        let mib = ask.mib("memory")?;
        if mib > self.max_memory {
            return Err(Fault::refused(
                "memory",
                format!(
                    "{mib} MiB exceeds this server's maximum {} MiB (vm mcp --max-memory)",
                    self.max_memory
                ),
            ));
        }
        Ok(mib)
    }

    fn wall(&self, ask: Option<&Amount>) -> Result<Duration, Fault> {
        let Some(ask) = ask else {
            return Ok(self.timeout);
        };
        let wall = ask.duration("timeout")?;
        if wall > self.max_timeout {
            return Err(Fault::refused(
                "timeout",
                format!(
                    "{} exceeds this server's maximum {} (vm mcp --max-timeout)",
                    parse::fmt_duration(wall),
                    parse::fmt_duration(self.max_timeout)
                ),
            ));
        }
        Ok(wall)
    }

    fn image(&self, ask: Option<&str>) -> Result<Option<String>, Fault> {
        let Some(ask) = ask.filter(|a| !a.is_empty()) else {
            return Ok(self.vm.image.clone());
        };
        if self.images().iter().any(|i| i == ask) {
            return Ok(Some(ask.to_string()));
        }
        let offered = match self.images() {
            i if i.is_empty() => "only the built-in image".to_string(),
            i => i.join(", "),
        };
        Err(Fault::refused(
            "image",
            format!(
                "{ask:?} is not offered by this server (offered: {offered}; the host adds one with vm mcp --allow-image REF)"
            ),
        ))
    }

    /// A call's mount: an absolute host path under an `--allow-mount` directory (resolved,
    /// so a link cannot lead out of it), always read-only.
    fn mount(&self, i: usize, m: &MountAsk) -> Result<VolumeArg, Fault> {
        let field = format!("mounts[{i}]");
        if self.allow_mounts.is_empty() {
            return Err(Fault::refused(
                &field,
                "this server mounts no host paths (the host allows a directory with vm mcp --allow-mount DIR)",
            ));
        }
        let host = Path::new(&m.host);
        if !host.is_absolute() {
            return Err(Fault::refused(
                &format!("{field}.host"),
                format!("{:?} refused; must be an absolute host path", m.host),
            ));
        }
        let canonical = std::fs::canonicalize(host).map_err(|e| {
            Fault::refused(&format!("{field}.host"), format!("{}: {e}", host.display()))
        })?;
        if !self.allow_mounts.iter().any(|d| canonical.starts_with(d)) {
            return Err(Fault::refused(
                &format!("{field}.host"),
                format!(
                    "{} is not under a directory this server allows (vm mcp --allow-mount)",
                    host.display()
                ),
            ));
        }
        let host = canonical.to_str().ok_or_else(|| {
            Fault::refused(&format!("{field}.host"), "the path is not valid UTF-8")
        })?;
        Ok(VolumeArg {
            host: host.to_string(),
            guest: m.guest.clone(),
            read_only: true,
        })
    }
}
