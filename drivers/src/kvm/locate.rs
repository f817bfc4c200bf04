//! Where the drivers find the binaries of this workspace they run: the kvm driver's `vm-vmm`
//! (one per VM) and the tcg driver's `vm-vsock` (its vhost-user vsock backend).
//!
//! In order: `$VM_VMM_BIN` / `$VM_VSOCK_BIN` (must name a file), the directory of the running
//! executable (an installed `vm` next to them, the kvm proof pack), and that directory's parent
//! (cargo puts test executables in `target/<profile>/deps`, the workspace's binaries one level
//! up). The tcg driver then also looks on `PATH` (`tcg::find_program`).

use std::path::{Path, PathBuf};

use crate::DriverError;

/// The environment variable that overrides the search.
pub const VMM_BIN_ENV: &str = "VM_VMM_BIN";

/// The environment variable that overrides the search for `vm-vsock`.
pub const VSOCK_BIN_ENV: &str = "VM_VSOCK_BIN";

/// The environment variable that overrides the search for `vm-virtiofs`.
pub const VIRTIOFS_BIN_ENV: &str = "VM_VIRTIOFS_BIN";

/// The `vm-vmm` binary, or an error naming every place looked at.
pub(crate) fn vmm_binary() -> Result<PathBuf, DriverError> {
    workspace_binary(vm_vmm_protocol::BINARY, VMM_BIN_ENV)
}

/// The workspace binary `name` (overridden by `$env`), or an error naming every place looked at.
pub(crate) fn workspace_binary(name: &'static str, env: &str) -> Result<PathBuf, DriverError> {
    let exe = std::env::current_exe().ok();
    find(
        name,
        env,
        std::env::var_os(env).map(PathBuf::from),
        exe.as_deref(),
    )
}

fn find(
    name: &'static str,
    env: &str,
    over: Option<PathBuf>,
    exe: Option<&Path>,
) -> Result<PathBuf, DriverError> {
    if let Some(p) = over.filter(|p| !p.as_os_str().is_empty()) {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(DriverError::MissingBinary {
                program: name,
                searched: format!("${env}={}", p.display()),
            })
        };
    }
    let dir = exe.and_then(Path::parent);
    let candidates: Vec<PathBuf> = dir
        .into_iter()
        .chain(dir.and_then(Path::parent))
        .map(|d| d.join(name))
        .collect();
    if let Some(p) = candidates.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    let searched = candidates
        .iter()
        .map(|p| p.display().to_string())
        .chain([format!("${env} (unset)")])
        .collect::<Vec<_>>()
        .join(", ");
    Err(DriverError::MissingBinary {
        program: name,
        searched,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(over: Option<PathBuf>, exe: Option<&Path>) -> Result<PathBuf, DriverError> {
        super::find(vm_vmm_protocol::BINARY, VMM_BIN_ENV, over, exe)
    }

    #[test]
    fn override_next_to_exe_then_parent() {
        let tmp = tempfile::tempdir().unwrap();
        let deps = tmp.path().join("debug/deps");
        std::fs::create_dir_all(&deps).unwrap();
        let exe = deps.join("test-bin");
        let err = find(None, Some(&exe)).unwrap_err().to_string();
        assert!(
            err.contains("vm-vmm") && err.contains("VM_VMM_BIN"),
            "{err}"
        );
        let up = tmp.path().join("debug/vm-vmm");
        std::fs::write(&up, b"").unwrap();
        assert_eq!(find(None, Some(&exe)).unwrap(), up);
        let next = deps.join("vm-vmm");
        std::fs::write(&next, b"").unwrap();
        assert_eq!(find(None, Some(&exe)).unwrap(), next);
        assert_eq!(find(Some(up.clone()), Some(&exe)).unwrap(), up);
        let err = find(Some(tmp.path().join("nope")), Some(&exe)).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }
}
