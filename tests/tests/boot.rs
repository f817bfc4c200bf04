//! Boot: the guest comes up with the agent answering, on our kernel.

use vm_tests::host::kernel_release_in;
use vm_tests::{Cases, Ctx, GuestSpec, MicroVm, boot, ensure, exec_ok, image_dir};

/// The release the built image carries: the `Linux version` banner inside `vmlinux`, checked
/// against the `config` header and `manifest.json` when the image has them.
fn image_release() -> Result<String, String> {
    let dir = image_dir()?;
    let vmlinux = std::fs::read(dir.join("vmlinux")).ctx("reading vmlinux")?;
    let release = kernel_release_in(&vmlinux).ok_or("no 'Linux version' banner in vmlinux")?;
    if let Ok(config) = std::fs::read_to_string(dir.join("config")) {
        // "# Linux/x86 6.12.48 Kernel Configuration": the base version without local suffixes.
        let header = config.lines().take(5).find_map(|l| {
            let l = l.strip_prefix("# Linux/")?;
            l.split_whitespace().nth(1).map(str::to_string)
        });
        if let Some(base) = header {
            ensure!(
                release.starts_with(&base),
                "vmlinux says {release}, its config header says {base}"
            );
        }
    }
    if let Ok(manifest) = std::fs::read_to_string(dir.join("manifest.json")) {
        // `"release": "6.12.117"` in the kernel section.
        let field = manifest
            .split("\"release\":")
            .nth(1)
            .and_then(|v| v.split('"').nth(1));
        if let Some(m) = field {
            ensure!(
                m == release,
                "vmlinux says {release}, manifest.json says {m}"
            );
        }
    }
    Ok(release)
}

async fn uname_is_our_kernel(vm: &MicroVm) -> Result<(), String> {
    let out = vm.capture(&["uname", "-r"]).await.ctx("uname -r")?;
    ensure!(out.status.success(), "uname -r: {:?}", out.status);
    let guest = String::from_utf8_lossy(&out.output).trim().to_string();
    ensure!(
        guest.starts_with("6.12."),
        "guest kernel release {guest:?} is not 6.12.x"
    );
    let built = image_release()?;
    ensure!(
        guest == built,
        "guest runs {guest:?}, the image's vmlinux is {built:?}"
    );
    eprintln!("    guest kernel {guest} == image vmlinux {built}");
    Ok(())
}

async fn agent_is_pid1(vm: &MicroVm) -> Result<(), String> {
    let info = vm.machine().agent().ping().await.ctx("ping")?;
    ensure!(info.pid1, "the agent does not run as PID 1: {info:?}");
    let comm = exec_ok(vm, "cat /proc/1/comm").await?;
    ensure!(
        comm.trim() == "init",
        "PID 1 is {comm:?}, expected the agent as /init"
    );
    Ok(())
}

/// On kvm the guest is offered no nested virtualization and no PMU (attack surface on the
/// host's KVM an untrusted guest has no use for: `vmm::cpuid`) and sees our brand string, not
/// the host's. Under tcg the CPU is QEMU's emulated `max`, whose SVM is QEMU's own emulation
/// inside its jailed process, not the host's KVM (and QEMU 7.2's `max,-svm` breaks guest user
/// space: every static binary's start-up aborts reading `/proc/self/exe`), so tcg is not held
/// to it.
async fn no_nested_virtualization(vm: &MicroVm, driver: &str) -> Result<(), String> {
    if driver != "kvm" {
        return Ok(());
    }
    let cpuinfo = exec_ok(vm, "cat /proc/cpuinfo").await?;
    let flags: Vec<&str> = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .flat_map(|l| l.split_whitespace())
        .collect();
    ensure!(
        !flags.is_empty(),
        "no flags line in /proc/cpuinfo:\n{cpuinfo}"
    );
    let offered: Vec<&&str> = flags
        .iter()
        .filter(|f| matches!(**f, "vmx" | "svm" | "npt" | "vgif" | "perfctr_core"))
        .collect();
    ensure!(
        offered.is_empty(),
        "the guest is offered {offered:?} (nested virtualization / the PMU)"
    );
    let brand = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim());
    ensure!(
        brand == Some("vm microVM vCPU"),
        "model name {brand:?}, expected our brand string"
    );
    Ok(())
}

/// On kvm the guest's LAPIC timer runs in TSC-deadline mode (`vmm::cpuid::supported_for_vm`):
/// its kernel then never calibrates the LAPIC timer against the PIT, a boot-time wait for ten
/// timer interrupts where the nested runner's guests were seen stalled.
async fn lapic_timer_is_tsc_deadline(vm: &MicroVm, driver: &str) -> Result<(), String> {
    if driver != "kvm" {
        return Ok(());
    }
    let cpuinfo = exec_ok(vm, "cat /proc/cpuinfo").await?;
    let offered = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .flat_map(|l| l.split_whitespace())
        .any(|f| f == "tsc_deadline_timer");
    ensure!(
        offered,
        "no tsc_deadline_timer flag in /proc/cpuinfo:\n{cpuinfo}"
    );
    Ok(())
}

#[test]
fn boot_and_kernel() {
    vm_tests::scenario("boot", |driver| async move {
        let vm = boot(driver, &GuestSpec::new("boot")).await?;
        let mut c = Cases::new("boot", driver);
        c.run("agent_answers_as_pid1", agent_is_pid1(&vm)).await;
        c.run("uname_is_our_kernel", uname_is_our_kernel(&vm)).await;
        c.run(
            "no_nested_virtualization",
            no_nested_virtualization(&vm, driver),
        )
        .await;
        c.run(
            "lapic_timer_is_tsc_deadline",
            lapic_timer_is_tsc_deadline(&vm, driver),
        )
        .await;
        vm.close().await;
        c.finish()
    });
}
