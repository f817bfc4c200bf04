//! Entry points of the `vm-agent` binary (see main.rs).

use std::path::{Path, PathBuf};
use std::time::Duration;

use guest_agent::agent::cgroup::CgroupLimits;
use guest_agent::agent::{Agent, AgentOptions, imageroot, kmod, pid1, shares};
use vm_agent_protocol::token::{AgentToken, GUEST_TOKEN_PATH};
use vm_agent_protocol::{AgentConfig, PROTOCOL_VERSION};
use vm_error_chain::error_chain as chain;

fn init_logging(level: &str) {
    let level = level.parse().unwrap_or(tracing::Level::INFO);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .try_init();
}

pub fn main() {
    // SAFETY: first thing in main: no other thread exists yet.
    unsafe { pid1::clear_env() };
    if std::process::id() == 1 {
        let r = std::panic::catch_unwind(run_pid1);
        // Straight to the console, not through tracing: a failure before logging is set up
        // (hardening, /proc/cmdline, the configuration) must be seen too.
        match r {
            Ok(Ok(())) => tracing::info!("shutting down"),
            Ok(Err(e)) => pid1::console_line(&format!("{}{e}", vm_agent_protocol::FATAL_PREFIX)),
            Err(_) => pid1::console_line(&format!("{}panic", vm_agent_protocol::FATAL_PREFIX)),
        }
        pid1::console_line("vm-agent: powering off");
        pid1::power_off();
    }
    match run_host() {
        Ok(()) => {}
        Err(e) => {
            eprintln!("vm-agent: {e}");
            std::process::exit(1);
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))
}

fn run_pid1() -> Result<(), String> {
    // Before anything else (and before any thread): guest code must never read our memory.
    pid1::harden().map_err(|e| format!("hardening: {}", chain(&e)))?;
    let mount_errors = pid1::early_mounts();
    pid1::console_to_stdio();
    let cmdline =
        std::fs::read_to_string("/proc/cmdline").map_err(|e| format!("read /proc/cmdline: {e}"))?;
    let parsed = AgentConfig::from_cmdline(&cmdline);
    let level = parsed
        .as_ref()
        .map(|(c, _)| c.log.clone())
        .unwrap_or_else(|_| "info".into());
    init_logging(&level);
    for e in &mount_errors {
        tracing::warn!("{}", chain(e));
    }
    // A distribution kernel's drivers come as modules in the initramfs: loaded before any
    // device is looked for, then module loading is off for good.
    let modules = kmod::load_listed(Path::new(kmod::MODULE_DIR))
        .map_err(|e| format!("kernel modules: {}", chain(&e)))?;
    if modules > 0 {
        tracing::info!(modules, "kernel modules loaded; module loading off");
    }
    let (cfg, unknown) = parsed.map_err(|e| format!("configuration: {e}"))?;
    if !unknown.is_empty() {
        tracing::warn!(?unknown, "unknown vm.* keys ignored");
    }
    if let Err(e) = pid1::protect_from_oom() {
        tracing::warn!("{}", chain(&e));
    }
    if let Err(e) = pid1::raise_nofile() {
        tracing::warn!("{}", chain(&e));
    }
    if let Err(e) = pid1::loopback_up() {
        tracing::warn!("loopback: {}", chain(&e));
    }
    if let Err(e) = pid1::set_hostname(&cfg.hostname) {
        tracing::warn!("{}", chain(&e));
    }
    // The host's per-boot token, from the archive it appended to the initramfs; no token, no
    // listener (refuse rather than serve unauthenticated). Read (and unlinked) before an image
    // root replaces `/`: the file lives in the initramfs, which commands never see afterwards.
    let token = AgentToken::take_guest_file(Path::new(GUEST_TOKEN_PATH))
        .map_err(|e| format!("agent token: {}", chain(&e)))?;
    if let Some(root) = &cfg.root {
        imageroot::enter(root).map_err(|e| format!("image root {}: {}", root.id, chain(&e)))?;
    }
    for d in &cfg.disks {
        pid1::mount_disk(d).map_err(|e| format!("disk {}: {}", d.id, chain(&e)))?;
    }
    for s in &cfg.shares {
        shares::mount_share(s).map_err(|e| format!("share {}: {}", s.tag, chain(&e)))?;
    }
    let opts = AgentOptions {
        root: PathBuf::from("/"),
        hostname: cfg.hostname.clone(),
        pid1: true,
        reap_all: true,
        cgroup_base: Some(PathBuf::from("/sys/fs/cgroup")),
        limits: CgroupLimits {
            pids_max: cfg.pids_max,
            mem_limit_mib: cfg.mem_limit_mib,
        },
        token: Some(token),
        generation_dir: Some(PathBuf::from(guest_agent::agent::resume::GENERATION_DIR)),
        ..AgentOptions::default()
    };
    runtime()?.block_on(async move {
        let agent = Agent::new(opts).map_err(|e| chain(&e))?;
        if (cfg.pids_max.is_some() || cfg.mem_limit_mib.is_some()) && !agent.info().cgroups {
            return Err("limits requested but cgroup2 is unavailable".to_string());
        }
        let l = Agent::bind_vsock(cfg.port).map_err(|e| chain(&e))?;
        pid1::console_line(&format!(
            "vm-agent: ready port={} proto={PROTOCOL_VERSION}",
            cfg.port
        ));
        agent.serve_vsock(l).await;
        // Let the Shutdown reply leave before the reboot.
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(())
    })
}

struct HostArgs {
    unix: PathBuf,
    root: PathBuf,
    cmdline: String,
    io_timeout: Option<Duration>,
    cgroup_root: Option<PathBuf>,
    token_file: Option<PathBuf>,
    run_dir: Option<PathBuf>,
}

fn parse_args() -> Result<HostArgs, String> {
    let mut a = HostArgs {
        unix: PathBuf::new(),
        root: PathBuf::from("/"),
        cmdline: String::new(),
        io_timeout: None,
        cgroup_root: None,
        token_file: None,
        run_dir: None,
    };
    let mut it = std::env::args_os().skip(1);
    while let Some(flag) = it.next() {
        let flag = flag.to_string_lossy().into_owned();
        let val = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--unix" => a.unix = val.into(),
            "--root" => a.root = val.into(),
            "--cmdline" => a.cmdline = val.to_string_lossy().into_owned(),
            "--io-timeout-ms" => {
                let ms: u64 = val
                    .to_string_lossy()
                    .parse()
                    .map_err(|_| "--io-timeout-ms: not a number")?;
                a.io_timeout = Some(Duration::from_millis(ms));
            }
            "--cgroup-root" => a.cgroup_root = Some(val.into()),
            "--token-file" => a.token_file = Some(val.into()),
            "--run-dir" => a.run_dir = Some(val.into()),
            _ => {
                return Err(format!(
                    "unknown flag {flag}; usage: vm-agent --unix PATH [--root DIR] [--cmdline STR] [--io-timeout-ms N] [--cgroup-root DIR] [--token-file PATH] [--run-dir DIR]"
                ));
            }
        }
    }
    if a.unix.as_os_str().is_empty() {
        return Err("not PID 1: --unix PATH is required".into());
    }
    Ok(a)
}

fn run_host() -> Result<(), String> {
    let a = parse_args()?;
    let (cfg, _) = AgentConfig::from_cmdline(&a.cmdline).map_err(|e| e.to_string())?;
    init_logging(&cfg.log);
    guest_agent::agent::sys::proc::set_child_subreaper()
        .map_err(|e| format!("PR_SET_CHILD_SUBREAPER: {e}"))?;
    if let Err(e) = pid1::raise_nofile() {
        tracing::warn!("{}", chain(&e));
    }
    let token = match &a.token_file {
        Some(p) => Some(AgentToken::read_file(p).map_err(|e| chain(&e))?),
        None => None,
    };
    let mut opts = AgentOptions {
        root: a.root,
        token,
        hostname: cfg.hostname.clone(),
        reap_all: true,
        cgroup_base: a.cgroup_root,
        limits: CgroupLimits {
            pids_max: cfg.pids_max,
            mem_limit_mib: cfg.mem_limit_mib,
        },
        generation_dir: a.run_dir,
        ..AgentOptions::default()
    };
    if let Some(t) = a.io_timeout {
        opts.io_timeout = t;
    }
    runtime()?.block_on(async move {
        let agent = Agent::new(opts).map_err(|e| chain(&e))?;
        let _ = std::fs::remove_file(&a.unix);
        let l = tokio::net::UnixListener::bind(&a.unix)
            .map_err(|e| format!("bind {}: {e}", a.unix.display()))?;
        pid1::console_line(&format!(
            "vm-agent: ready unix={} proto={PROTOCOL_VERSION}",
            a.unix.display()
        ));
        agent.serve_unix(l).await;
        Ok(())
    })
}
