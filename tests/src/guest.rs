//! Booting a guest on a named driver, and small exec helpers.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use vm_agent_protocol::protocol::Command;
use vm_agent_protocol::protocol::ExecOutput;
use vm_drivers::{DriverError, Registry};
use vm_sandbox::{MicroVm, Options, Run, SandboxError, images};
use vm_spec::{Containment, Guarantees, Image, ImageConfig, Limits, Mount, Policy, Spec, Trust};

use crate::cases::{Ctx, error_chain};

/// `PATH` the suite gives its guests (busybox links its applets in `/bin`).
pub const DEFAULT_PATH: &str = "/bin:/sbin:/usr/bin:/usr/sbin";

/// How long a boot waits for the agent unless `VM_E2E_BOOT_TIMEOUT` (seconds) says otherwise.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// Safety net: every guest of the suite dies by itself after this long unless asked otherwise.
const DEFAULT_WALL: Duration = Duration::from_secs(900);

/// What a scenario asks of its guest; turned into a [`Spec`] and [`Options`].
#[derive(Debug, Clone)]
pub struct GuestSpec {
    /// Guest name (logs, hostname).
    pub name: String,
    pub mem_mib: i64,
    /// The guest process cap.
    pub pids: i64,
    pub wall: Duration,
    pub mounts: Vec<Mount>,
    /// The complete guest environment.
    pub env: Vec<(String, String)>,
    /// Where the per-VM run directory goes (`None` = the system temp dir).
    pub run_dir_parent: Option<PathBuf>,
    /// The erofs cache for directory mounts (`None` = the sandbox default).
    pub mount_cache: Option<PathBuf>,
    /// An erofs/ext4 image file to use as the guest's root (`None` = the initramfs).
    pub rootfs: Option<PathBuf>,
    /// The image defaults (env, working dir, user, entrypoint, cmd).
    pub image_config: ImageConfig,
    /// `Spec.user`: the user every command runs as, over the image's.
    pub user: Option<String>,
}

impl GuestSpec {
    /// 256 MiB, the default pid cap, a 15-minute safety wall, `PATH` only.
    pub fn new(name: &str) -> GuestSpec {
        GuestSpec {
            name: format!("e2e-{name}"),
            mem_mib: 256,
            pids: i64::from(vm_spec::DEFAULT_PIDS),
            wall: DEFAULT_WALL,
            mounts: Vec::new(),
            env: vec![("PATH".into(), DEFAULT_PATH.into())],
            run_dir_parent: None,
            mount_cache: None,
            rootfs: None,
            image_config: ImageConfig::default(),
            user: None,
        }
    }
}

/// The default guest images (`<images dir>/current`), or why they are not there.
pub fn default_image() -> Result<Image, String> {
    images::default_spec_image().ctx("guest images")
}

/// The directory the default images resolve in (`<images dir>/current`).
pub fn image_dir() -> Result<PathBuf, String> {
    Ok(images::images_dir().ctx("guest images")?.join("current"))
}

/// The [`Spec`] for `g` over the default images.
pub fn spec_for(g: &GuestSpec) -> Result<Spec, String> {
    let limits = Limits {
        vcpus: 1,
        mem_mib: g.mem_mib,
        pids: g.pids,
        wall: (!g.wall.is_zero()).then_some(g.wall),
    };
    let mut guarantees = Guarantees::untrusted(limits, g.mounts.clone());
    guarantees.env = g.env.clone();
    let mut image = default_image()?;
    image.rootfs = g.rootfs.clone();
    image.config = g.image_config.clone();
    let mut spec = Spec::new(image, guarantees);
    spec.user = g.user.clone();
    Ok(spec)
}

/// Untrusted work forced onto `driver`. Emulation is allowed only for a driver whose
/// containment is below a hardware boundary (tcg: user-kernel), which is exactly what the
/// policy flag exists for; a microVM driver runs under the strict default policy.
pub fn options_for(driver: &str, g: &GuestSpec) -> Options {
    let registry = Registry::with_defaults();
    let emulated = registry
        .get(driver)
        .is_some_and(|d| d.containment() < Containment::MicroVm);
    let boot_timeout = std::env::var("VM_E2E_BOOT_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(BOOT_TIMEOUT);
    Options {
        trust: Trust::Untrusted,
        policy: Policy {
            allow_emulation: emulated,
            allow_weaker_jail: false,
        },
        driver: Some(driver.to_string()),
        name: g.name.clone(),
        boot_timeout,
        mount_cache: g.mount_cache.clone(),
        run_dir_parent: g.run_dir_parent.clone(),
        ..Options::default()
    }
}

/// Boots `g` on `driver`, checks the guest really runs there, and prints the time from the
/// call to the agent answering: `boot+agent ready in X s [driver]`.
pub async fn boot(driver: &'static str, g: &GuestSpec) -> Result<MicroVm, String> {
    let spec = spec_for(g)?;
    let options = options_for(driver, g);
    let start = Instant::now();
    let vm = match MicroVm::boot(spec, options).await {
        Ok(vm) => vm,
        Err(e) => {
            let mut msg = format!("booting {} on {driver}: {}", g.name, error_chain(&e));
            if let SandboxError::Boot {
                source: DriverError::AgentNotReady { console_tail, .. },
                ..
            } = &e
            {
                msg.push_str(&format!(
                    "\n--- guest console tail ---\n{}",
                    tail(console_tail, 4000)
                ));
            }
            return Err(msg);
        }
    };
    eprintln!(
        "boot+agent ready in {:.1} s [{driver}]",
        start.elapsed().as_secs_f64()
    );
    if vm.driver() != driver {
        return Err(format!(
            "asked for driver {driver}, the guest runs on {}",
            vm.driver()
        ));
    }
    Ok(vm)
}

/// Runs a shell line in the guest root.
pub async fn sh(vm: &MicroVm, line: &str) -> Result<ExecOutput, String> {
    vm.exec(line).await.ctx(&format!("exec {line:?}"))
}

/// Runs a shell line that must exit 0; returns its combined output as text.
pub async fn exec_ok(vm: &MicroVm, line: &str) -> Result<String, String> {
    let out = sh(vm, line).await?;
    let text = String::from_utf8_lossy(&out.output).into_owned();
    if !out.status.success() {
        return Err(format!(
            "{line:?} ended with {:?}; output: {text:?}",
            out.status
        ));
    }
    Ok(text)
}

/// Runs a shell line as `user` (instead of the spec's user); it must exit 0. Returns its
/// combined output as text.
pub async fn exec_as(vm: &MicroVm, user: &str, line: &str) -> Result<String, String> {
    let out = vm
        .run(Run {
            command: Command::Shell(line.into()),
            user: Some(user.into()),
            ..Default::default()
        })
        .await
        .ctx(&format!("exec as {user} {line:?}"))?;
    let text = String::from_utf8_lossy(&out.output).into_owned();
    if !out.status.success() {
        return Err(format!(
            "{line:?} as {user} ended with {:?}; output: {text:?}",
            out.status
        ));
    }
    Ok(text)
}

/// The last `max` bytes of `text` (on a char boundary).
pub fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}
