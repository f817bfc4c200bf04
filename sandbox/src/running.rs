//! [`RunningVm`]: a VM that is already running and held by another process (a `vm run -d`
//! supervisor), attached through the host socket of its guest agent. It offers the same
//! [`Guest`] operations as a [`crate::MicroVm`], with the same request building, path
//! confinement and environment checks; it does not own the VM, so dropping it leaves the
//! VM running.

use std::ops::Deref;
use std::path::PathBuf;

use vm_spec::Spec;
use vm_spec::paths::normalize_guest_path;

use crate::error::SandboxError;
use crate::guest::{Confinement, Guest, ProcessDefaults};
use crate::link::Link;

/// What attaching needs, as a VM's record keeps it.
#[derive(Debug, Clone)]
pub struct Attach {
    /// The VM's hybrid-vsock socket ([`crate::MicroVm::agent_socket`] of the booted VM).
    pub agent_socket: PathBuf,
    /// The spec the VM was booted from: its root, environment (the image's `Env` under
    /// `Guarantees.env`), `env_allow`, user and image defaults apply to every operation. Its image is not checked again (the VM is already running).
    pub spec: Spec,
}

/// A running VM attached by its agent socket (see the module docs). It dereferences to
/// [`Guest`] for `exec`, `run`, `exec_stream`, files, `walk`, `glob` and `serve`.
#[derive(Debug)]
pub struct RunningVm {
    guest: Guest,
    agent_socket: PathBuf,
}

impl RunningVm {
    /// Attaches to the VM behind `attach.agent_socket`. Checks the root and the environment
    /// recorded in the spec (the rules a boot applies); connects only when an operation runs.
    /// The root is taken to exist already (the VM's boot created it).
    pub fn attach(attach: Attach) -> Result<RunningVm, SandboxError> {
        let spec = &attach.spec;
        let g = &spec.guarantees;
        let image = &spec.image.config;
        let root = normalize_guest_path("root", &spec.root)?;
        vm_spec::env::check_env(&g.env, &g.env_allow)?;
        let user = spec.user.clone().or_else(|| image.user.clone());
        if let Some(u) = &user {
            vm_spec::imageconfig::check_user("user", u)?;
        }
        let working_dir = image
            .working_dir
            .as_deref()
            .map(|w| normalize_guest_path("image.config.working_dir", w))
            .transpose()?;
        let confinement = Confinement {
            root,
            env: vm_spec::imageconfig::merge_env(&image.env, &g.env),
            env_allow: g.env_allow.clone(),
            defaults: ProcessDefaults {
                user,
                working_dir,
                command: image.default_command(),
            },
        };
        // The boot left its agent token beside the socket; without it the agent answers nothing.
        let client =
            vm_drivers::attach_client(&attach.agent_socket).map_err(SandboxError::Attach)?;
        Ok(RunningVm {
            guest: Guest::new(Link::Attached(client), confinement, true),
            agent_socket: attach.agent_socket,
        })
    }

    /// The agent socket this handle connects through.
    pub fn agent_socket(&self) -> &std::path::Path {
        &self.agent_socket
    }
}

impl Deref for RunningVm {
    type Target = Guest;

    fn deref(&self) -> &Guest {
        &self.guest
    }
}
