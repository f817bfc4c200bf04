//! `vm-vsock`: the vsock device as a vhost-user backend, one process per VM, for the tcg
//! driver's QEMU (`vmm::virtio::vsock::vhost_user`: the same muxer, connection and `CONNECT`
//! code `vm-vmm` runs in-process).
//!
//! `vm-vsock --guest-cid CID --socket VHOST_USER_SOCKET --uds-path HYBRID_SOCKET`: creates
//! both sockets, serves one QEMU connection and exits 0 when QEMU hangs up (1 on an error,
//! 2 on bad arguments). It sets its soft `RLIMIT_NOFILE` so that the connection cap stays below
//! it with room for its own descriptors (`vhost_user::fd_budget`). The launcher jails it and
//! installs its seccomp filter (`vm_jail::seccomp::vhost`) before `exec`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use vmm::virtio::vsock::vhost_user::{self, BackendConfig};

const USAGE: &str =
    "usage: vm-vsock --guest-cid CID --socket VHOST_USER_SOCKET --uds-path HYBRID_SOCKET";

fn parse(args: Vec<OsString>) -> Result<(u64, PathBuf, PathBuf), String> {
    let (mut cid, mut socket, mut uds) = (None, None, None);
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{} needs a value", flag.to_string_lossy()))?;
        match flag.to_str() {
            Some("--guest-cid") => {
                let v = value.to_str().and_then(|v| v.parse::<u64>().ok());
                cid = Some(v.ok_or("--guest-cid: not a number")?);
            }
            Some("--socket") => socket = Some(PathBuf::from(value)),
            Some("--uds-path") => uds = Some(PathBuf::from(value)),
            _ => return Err(format!("unknown argument {}", flag.to_string_lossy())),
        }
    }
    match (cid, socket, uds) {
        (Some(c), Some(s), Some(u)) => Ok((c, s, u)),
        _ => Err("--guest-cid, --socket and --uds-path are all required".into()),
    }
}

/// Sets the soft descriptor limit and returns the connection cap it leaves room for.
fn fd_limit() -> Result<usize, String> {
    let (soft, hard) =
        getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| format!("getrlimit(NOFILE): {e}"))?;
    let (want, cap) = vhost_user::fd_budget(soft, hard)
        .ok_or_else(|| format!("RLIMIT_NOFILE {soft}/{hard} leaves no room for connections"))?;
    if want != soft {
        setrlimit(Resource::RLIMIT_NOFILE, want, hard)
            .map_err(|e| format!("setrlimit(NOFILE, {want}): {e}"))?;
    }
    Ok(cap)
}

fn main() -> ExitCode {
    vmm::logger::init();
    let (guest_cid, socket, uds_path) = match parse(std::env::args_os().skip(1).collect()) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let max_connections = match fd_limit() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(1);
        }
    };
    let cfg = BackendConfig {
        guest_cid,
        socket,
        uds_path,
        max_connections,
    };
    match vhost_user::run(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{}", vm_error_chain::error_chain(&e));
            ExitCode::from(1)
        }
    }
}
