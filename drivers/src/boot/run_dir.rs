//! The run directory of one boot (claimed files removed on drop), this boot's agent token and
//! the initrd that carries it into the guest, and attaching to a booted VM's agent with it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use vm_agent_client::AgentClient;
use vm_agent_protocol::AGENT_PORT;
use vm_agent_protocol::token::AgentToken;

use super::invalid;
use crate::{BootPlan, DriverError};

/// The per-boot agent token (hex, mode 0600), beside [`super::VSOCK_SOCKET`]: how a later `vm`
/// process attaches to a named VM ([`attach_client`]).
pub(crate) const AGENT_TOKEN: &str = "agent.token";

/// The per-boot initrd: the image's initramfs with the token archive appended (mode 0600).
pub(crate) const BOOT_INITRD: &str = "initrd.cpio";

/// The run-dir files every real backend creates besides its sockets.
pub(crate) const RUN_FILES: [&str; 2] = [AGENT_TOKEN, BOOT_INITRD];

/// Make this boot's agent token: write it to [`AGENT_TOKEN`] and write [`BOOT_INITRD`] (the
/// plan's initramfs, zero-padded to 4 bytes, then [`AgentToken::initrd_archive`]); the kernel
/// unpacks both archives, and the agent takes the token from its rootfs before it listens.
/// Returns the token and the initrd path the backend boots with.
pub(crate) fn boot_secret(
    plan: &BootPlan,
    run: &RunDir,
) -> Result<(AgentToken, PathBuf), DriverError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let token = AgentToken::generate().map_err(DriverError::Token)?;
    token
        .write_file(&run.path(AGENT_TOKEN))
        .map_err(DriverError::Token)?;
    let path = run.path(BOOT_INITRD);
    let io_err = |what, p: &Path| {
        let p = p.to_path_buf();
        move |source| DriverError::Io {
            what,
            path: p,
            source,
        }
    };
    let mut base = fs::File::open(&plan.images.initramfs)
        .map_err(io_err("opening initramfs", &plan.images.initramfs))?;
    let mut out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(io_err("creating boot initrd", &path))?;
    let n = io::copy(&mut base, &mut out).map_err(io_err("writing boot initrd", &path))?;
    let pad = [0u8; 4];
    out.write_all(&pad[..((4 - n % 4) % 4) as usize])
        .and_then(|()| out.write_all(&token.initrd_archive()))
        .map_err(io_err("writing boot initrd", &path))?;
    Ok((token, path))
}

/// Re-keys a VM restored from a snapshot: `client` (presenting the snapshot's token) hands the
/// agent a fresh token, this host's clock, fresh entropy for the guest kernel's CRNG and the
/// VM's `generation` (`Request::Resume`); the new token is written to the run directory's
/// [`AGENT_TOKEN`] for later `vm` processes. Returns the client that presents it. Runs the
/// async client on a private thread with its own runtime, as [`super::wait_for_agent`] does.
pub(crate) fn rekey(
    run: &RunDir,
    client: &AgentClient,
    generation: u64,
) -> Result<AgentClient, DriverError> {
    let token = AgentToken::generate().map_err(DriverError::Token)?;
    let resumed = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| DriverError::Spawn {
                    program: "a runtime to re-key the restored agent".into(),
                    source,
                })?;
            rt.block_on(client.resume(token.clone(), generation))
                .map_err(|source| DriverError::Resume { source })
        })
        .join()
        .unwrap_or_else(|_| {
            Err(DriverError::Spawn {
                program: "the re-keying thread".into(),
                source: io::Error::other("it panicked"),
            })
        })
    })?;
    token
        .write_file(&run.path(AGENT_TOKEN))
        .map_err(DriverError::Token)?;
    Ok(resumed)
}

/// The agent client for a VM whose hybrid-vsock socket is `agent_socket`, presenting the token
/// its boot left beside it. For a process other than the one that booted it (`vm exec NAME`).
pub fn attach_client(agent_socket: &Path) -> Result<AgentClient, DriverError> {
    let token = AgentToken::read_file(&agent_socket.with_file_name(AGENT_TOKEN))
        .map_err(DriverError::Token)?;
    Ok(AgentClient::hybrid_vsock(agent_socket, AGENT_PORT).with_token(token))
}

/// The files a driver creates in the run dir; removed (and the dir, if we created it) on drop.
#[derive(Debug)]
pub(crate) struct RunDir {
    dir: PathBuf,
    created_dir: bool,
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

impl RunDir {
    /// Creates `dir` if needed and claims `names` inside it. Refuses if any of them already
    /// exists (it may belong to another VM).
    pub(crate) fn prepare(dir: &Path, names: &[&str]) -> Result<RunDir, DriverError> {
        // Absolute, so the paths still name the same files for a process whose working
        // directory differs (a jailed VMM's is its own root).
        let dir = &std::path::absolute(dir).map_err(|source| DriverError::Io {
            what: "resolving run dir",
            path: dir.to_path_buf(),
            source,
        })?;
        let created_dir = !dir.exists();
        fs::create_dir_all(dir).map_err(|source| DriverError::Io {
            what: "creating run dir",
            path: dir.to_path_buf(),
            source,
        })?;
        let mut run = RunDir {
            dir: dir.to_path_buf(),
            created_dir,
            files: Vec::new(),
            dirs: Vec::new(),
        };
        for name in names {
            let p = dir.join(name);
            if fs::symlink_metadata(&p).is_ok() {
                return Err(invalid(format!("run_dir: {} already exists", p.display())));
            }
            run.files.push(p);
        }
        Ok(run)
    }

    /// Creates the empty directory `name` inside (refused if it exists); removed on cleanup.
    pub(crate) fn make_dir(&mut self, name: &str) -> Result<PathBuf, DriverError> {
        let p = self.dir.join(name);
        fs::create_dir(&p).map_err(|source| DriverError::Io {
            what: "creating",
            path: p.clone(),
            source,
        })?;
        self.dirs.push(p.clone());
        Ok(p)
    }

    /// The run directory (absolute).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Removes the claimed files (and `<vsock.sock>_<port>` listeners a guest connection may
    /// have looked for are never created by us, so they are left alone), then the directory if
    /// this boot created it and it is empty.
    pub(crate) fn cleanup(&mut self) {
        for f in self.files.drain(..) {
            match fs::remove_file(&f) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(path = %f.display(), error = %e, "cannot remove run file"),
            }
        }
        for d in self.dirs.drain(..) {
            if let Err(e) = fs::remove_dir(&d) {
                tracing::warn!(path = %d.display(), error = %e, "cannot remove run dir entry");
            }
        }
        if self.created_dir {
            self.created_dir = false;
            let _ = fs::remove_dir(&self.dir);
        }
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        self.cleanup();
    }
}

#[cfg(test)]
mod tests {
    use super::super::VSOCK_SOCKET;
    use super::*;
    use crate::test_support::dummy_plan;

    #[test]
    fn run_dir_refuses_existing_files_and_cleans_up() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let mut run = RunDir::prepare(&dir, &["a.sock"]).unwrap();
        fs::write(run.path("a.sock"), b"").unwrap();
        assert!(RunDir::prepare(&dir, &["a.sock"]).is_err());
        let sub = run.make_dir("root").unwrap();
        assert!(sub.is_dir());
        assert!(run.make_dir("root").is_err());
        run.cleanup();
        assert!(!dir.exists(), "created run dir was not removed");
        // A pre-existing dir is kept.
        fs::create_dir(&dir).unwrap();
        drop(RunDir::prepare(&dir, &["a.sock"]).unwrap());
        assert!(dir.exists());
    }

    #[test]
    fn boot_secret_writes_a_private_token_and_an_initrd_that_ends_with_it() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let mut plan = dummy_plan();
        plan.images.initramfs = tmp.path().join("base.cpio");
        fs::write(&plan.images.initramfs, b"0707010base").unwrap(); // 11 bytes: padded to 12
        let run = RunDir::prepare(&tmp.path().join("run"), &RUN_FILES).unwrap();
        let (token, initrd) = boot_secret(&plan, &run).unwrap();
        let bytes = fs::read(&initrd).unwrap();
        assert!(bytes.starts_with(b"0707010base\0"));
        assert_eq!(&bytes[12..], &token.initrd_archive()[..]);
        for p in [&initrd, &run.path(AGENT_TOKEN)] {
            let mode = fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", p.display());
        }
        let sock = run.path(VSOCK_SOCKET);
        let client = attach_client(&sock).unwrap();
        drop(client);
        // A second boot in the same run dir refuses to reuse the files.
        assert!(boot_secret(&plan, &run).is_err());
    }
}
