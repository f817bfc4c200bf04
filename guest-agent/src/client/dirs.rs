//! `MakeDirs`, `MountTmpfs`, `SetMode` and `PodMount`: the runtime's own setup in the guest (the
//! working root, handed to the image's user; a container's tmpfs; a copied file's mode; a pod
//! member's filesystems), done by the agent itself rather than by a `mkdir`, `mount` or `chmod`
//! from the guest root; and `ListeningPorts`, what a pod's runtime forwards.

use super::{AgentClient, ClientError, unexpected};
use crate::protocol::{AgentFrame, MAX_LISTENING_PORTS, PodMount, Request};

impl AgentClient {
    /// Creates the absolute guest directory `path` with its missing parents and, with an
    /// `owner` (a user as `--user` takes it), gives it to that user. An agent older than this
    /// request answers an error of kind `Unsupported`.
    pub async fn make_dirs(&self, path: &str, owner: Option<&str>) -> Result<(), ClientError> {
        let (mut c, _) = self.connect().await?;
        let req = Request::MakeDirs {
            path: path.into(),
            owner: owner.map(str::to_string),
        };
        match c.request(req, "make_dirs").await? {
            AgentFrame::Ok => Ok(()),
            f => Err(unexpected("make_dirs", &f)),
        }
    }

    /// Mounts a fresh tmpfs of `size_bytes` at the absolute guest directory `path` (created
    /// if missing). Only an agent that is PID 1 mounts; it and an agent older than this
    /// request answer an error of kind `Unsupported`.
    pub async fn mount_tmpfs(&self, path: &str, size_bytes: u64) -> Result<(), ClientError> {
        let (mut c, _) = self.connect().await?;
        let req = Request::MountTmpfs {
            path: path.into(),
            size_bytes,
        };
        match c.request(req, "mount_tmpfs").await? {
            AgentFrame::Ok => Ok(()),
            f => Err(unexpected("mount_tmpfs", &f)),
        }
    }

    /// Sets the permission bits (`mode & 0o777`) of the regular file at the absolute guest
    /// path `path`. An agent older than this request answers an error of kind `Unsupported`.
    pub async fn set_mode(&self, path: &str, mode: u32) -> Result<(), ClientError> {
        let (mut c, _) = self.connect().await?;
        let req = Request::SetMode {
            path: path.into(),
            mode,
        };
        match c.request(req, "set_mode").await? {
            AgentFrame::Ok => Ok(()),
            f => Err(unexpected("set_mode", &f)),
        }
    }

    /// The TCP ports something in the guest listens on at every address (sorted, at most
    /// [`MAX_LISTENING_PORTS`]). An agent older than this request answers an error of kind `Unsupported`.
    pub async fn listening_ports(&self) -> Result<Vec<u16>, ClientError> {
        let (mut c, _) = self.connect().await?;
        match c
            .request(Request::ListeningPorts, "listening_ports")
            .await?
        {
            AgentFrame::Ports(p) if p.len() <= MAX_LISTENING_PORTS => Ok(p),
            f => Err(unexpected("listening_ports", &f)),
        }
    }

    /// One step of a pod member's filesystems ([`PodMount`]). Only an agent that is PID 1
    /// mounts; it and an agent older than this request answer an error of kind `Unsupported`.
    pub async fn pod_mount(&self, m: PodMount) -> Result<(), ClientError> {
        let (mut c, _) = self.connect().await?;
        match c.request(Request::PodMount(m), "pod_mount").await? {
            AgentFrame::Ok => Ok(()),
            f => Err(unexpected("pod_mount", &f)),
        }
    }
}
