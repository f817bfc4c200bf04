//! `vm-virtiofs`: the read-only file server of one host mount as a vhost-user backend, for
//! the tcg driver's QEMU (`vmm::virtio::fs::vhost_user`: the same server `vm-vmm` runs
//! in-process on the kvm road).
//!
//! `vm-virtiofs --socket VHOST_USER_SOCKET --share PATH [--max-inodes N]`: opens the share (a
//! directory, or one regular file), creates the socket, serves one QEMU connection and exits 0
//! when QEMU hangs up (1 on an error, 2 on bad arguments). Its soft `RLIMIT_NOFILE` is raised
//! to fit the inode cap (one descriptor each) when the hard limit allows, else the cap is
//! lowered to fit. The launcher jails it (the share bound read-only, nothing else of the
//! host's files) and installs its seccomp filter (`vm_jail::seccomp::vhost`) before `exec`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use vm_virtiofs::Limits;
use vm_virtiofs::fs::MIN_INODES;
use vmm::virtio::fs::vhost_user::{self, BackendConfig};

const USAGE: &str = "usage: vm-virtiofs --socket VHOST_USER_SOCKET --share PATH [--max-inodes N]";

/// Descriptors kept for itself beyond the inodes: stdio, the socket, QEMU's memory-region fds,
/// two eventfds per queue, the event loop's.
const OWN_FDS: u64 = 64;

fn parse(args: Vec<OsString>) -> Result<BackendConfig, String> {
    let (mut socket, mut share) = (None, None);
    let mut limits = Limits::default();
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{} needs a value", flag.to_string_lossy()))?;
        match flag.to_str() {
            Some("--socket") => socket = Some(PathBuf::from(value)),
            Some("--share") => share = Some(PathBuf::from(value)),
            Some("--max-inodes") => {
                let v = value.to_str().and_then(|v| v.parse::<usize>().ok());
                limits.max_inodes = v
                    .filter(|n| *n as u64 >= MIN_INODES)
                    .ok_or(format!("--max-inodes: a number, at least {MIN_INODES}"))?;
            }
            _ => return Err(format!("unknown argument {}", flag.to_string_lossy())),
        }
    }
    match (socket, share) {
        (Some(socket), Some(share)) => Ok(BackendConfig {
            socket,
            share,
            limits,
        }),
        _ => Err("--socket and --share are both required".into()),
    }
}

/// Raises the soft descriptor limit toward what the inode cap needs; lowers the cap to what
/// the hard limit leaves.
fn fit_descriptors(limits: &mut Limits) -> Result<(), String> {
    let (soft, hard) =
        getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| format!("getrlimit(NOFILE): {e}"))?;
    let want = (limits.max_inodes as u64 + OWN_FDS).min(hard);
    if want > soft {
        setrlimit(Resource::RLIMIT_NOFILE, want, hard)
            .map_err(|e| format!("setrlimit(NOFILE, {want}): {e}"))?;
    }
    *limits = limits
        .fit(want.max(soft), OWN_FDS)
        .ok_or_else(|| format!("RLIMIT_NOFILE {soft}/{hard} leaves no room for inodes"))?;
    Ok(())
}

fn main() -> ExitCode {
    vmm::logger::init();
    let mut cfg = match parse(std::env::args_os().skip(1).collect()) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = fit_descriptors(&mut cfg.limits) {
        tracing::error!("{e}");
        return ExitCode::from(1);
    }
    match vhost_user::run(&cfg) {
        Ok(c) => {
            tracing::info!(
                replies = c.replies,
                errors = c.errors,
                malformed = c.malformed,
                "vm-virtiofs: QEMU hung up"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{}", vm_error_chain::error_chain(&e));
            ExitCode::from(1)
        }
    }
}
