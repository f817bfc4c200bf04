//! A pod member: one container of a pod whose VM holds them all, seen as a [`Guest`] of its
//! own. Its processes run with the member's root (set up with [`Guest::pod_mount`]) as `/`, in
//! mount namespaces of their own, with the member's environment, working directory and user
//! instead of the VM's; the agent, the link and the VM are the pod's. Also
//! [`Guest::forward_from`] and [`Guest::listening_ports`], how the pod's ports reach the VM.

use vm_agent_protocol::protocol::PodMount;

use super::{Confinement, Guest, ProcessDefaults};
use crate::error::SandboxError;

/// What a member's processes run in (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRoot {
    /// The guest directory that is the member's `/` (a [`PodMount::Root`]'s `dir/root`).
    pub dir: String,
    /// The member's whole environment (the VM's is not added).
    pub env: Vec<(String, String)>,
    /// Its working directory, inside its root.
    pub cwd: String,
    /// The user its processes run as (`UID:GID` or a name from the member's `/etc`); `None`
    /// = root.
    pub user: Option<String>,
}

impl Guest {
    /// One step of a pod member's filesystems, done by the agent (see [`PodMount`]).
    pub async fn pod_mount(&self, m: PodMount) -> Result<(), SandboxError> {
        self.link
            .call(|c| c.pod_mount(m))
            .await
            .map_err(SandboxError::machine("pod mount"))
    }

    /// The member of this VM's pod whose root is `root.dir`: interactive processes started
    /// through it run there ([`Guest::exec_interactive`]); the collecting and streaming
    /// execs are refused (a member runs what containerd asks for, interactively).
    pub fn member(&self, root: MemberRoot) -> Guest {
        let confinement = Confinement {
            root: "/".into(),
            env: root.env,
            env_allow: self.confinement.env_allow.clone(),
            defaults: ProcessDefaults {
                user: root.user,
                working_dir: Some(root.cwd),
                command: Vec::new(),
            },
        };
        let mut g = Guest::new(self.link.clone(), confinement, true);
        g.member_root = Some(root.dir);
        g
    }

    /// Forwards every connection `listener` accepts to `guest_port` in the guest, as `serve`'s
    /// published ports do (over vsock, to the guest's loopback); the task runs until it is
    /// aborted. How a pod's ports reach its VM from the pod's network namespace.
    pub fn forward_from(
        &self,
        listener: tokio::net::TcpListener,
        guest_port: u16,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(crate::serving::accept_loop(
            listener,
            self.link.clone(),
            guest_port,
        ))
    }

    /// The TCP ports something in the VM listens on at every address (see
    /// `guest_agent::agent::listening`): what a pod's runtime forwards without being told.
    pub async fn listening_ports(&self) -> Result<Vec<u16>, SandboxError> {
        self.link
            .call(|c| c.listening_ports())
            .await
            .map_err(SandboxError::machine("listening ports"))
    }

    /// Refuses a collecting or streaming exec for a member (only interactive processes run
    /// in a member's root).
    pub(super) fn refuse_member(&self) -> Result<(), SandboxError> {
        match self.member_root {
            Some(_) => Err(SandboxError::Unsupported(
                "a pod member runs interactive processes only",
            )),
            None => Ok(()),
        }
    }
}
