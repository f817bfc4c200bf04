//! `MakeDirs`, `MountTmpfs`, `SetMode` and `PodMount`: the runtime's own setup in the guest (the
//! working root, handed to the image's user; a container's tmpfs; a copied file's mode; a pod
//! member's filesystems), done by the agent itself rather than by a `mkdir`, `mount` or `chmod`
//! from the guest root; and `ListeningPorts`, what a pod's runtime forwards.

use super::{AgentClient, ClientError, unexpected};
use vm_agent_protocol::protocol::{AgentFrame, MAX_LISTENING_PORTS, PodMount, Request};

one_frame_requests! {
    /// Creates the absolute guest directory `path` with its missing parents and, with an
    /// `owner` (a user as `--user` takes it), gives it to that user. An agent older than this
    /// request answers an error of kind `Unsupported`.
    pub async fn make_dirs(&self, path: &str, owner: Option<&str>) -> () {
        Request::MakeDirs {
            path: path.into(),
            owner: owner.map(str::to_string),
        },
        AgentFrame::Ok => ()
    }

    /// Mounts a fresh tmpfs of `size_bytes` at the absolute guest directory `path` (created
    /// if missing). Only an agent that is PID 1 mounts; it and an agent older than this
    /// request answer an error of kind `Unsupported`.
    pub async fn mount_tmpfs(&self, path: &str, size_bytes: u64) -> () {
        Request::MountTmpfs {
            path: path.into(),
            size_bytes,
        },
        AgentFrame::Ok => ()
    }

    /// Sets the permission bits (`mode & 0o777`) of the regular file at the absolute guest
    /// path `path`. An agent older than this request answers an error of kind `Unsupported`.
    pub async fn set_mode(&self, path: &str, mode: u32) -> () {
        Request::SetMode {
            path: path.into(),
            mode,
        },
        AgentFrame::Ok => ()
    }

    /// The TCP ports something in the guest listens on at every address (sorted, at most
    /// [`MAX_LISTENING_PORTS`]). An agent older than this request answers an error of kind
    /// `Unsupported`.
    pub async fn listening_ports(&self) -> Vec<u16> {
        Request::ListeningPorts,
        AgentFrame::Ports(p) if p.len() <= MAX_LISTENING_PORTS => p
    }

    /// One step of a pod member's filesystems ([`PodMount`]). Only an agent that is PID 1
    /// mounts; it and an agent older than this request answer an error of kind `Unsupported`.
    pub async fn pod_mount(&self, m: PodMount) -> () {
        Request::PodMount(m), AgentFrame::Ok => ()
    }
}
