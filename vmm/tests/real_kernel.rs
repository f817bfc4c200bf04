//! Boots the project's guest kernel (`<images dir>/current/vmlinux`) under KVM, each VM in its
//! own `vm-vmm` process as the kvm driver runs it (`proc_harness`).
//!
//! The fast test checks the banner, our command line and the e820 memory cap within 30 s, then
//! stops the VM and checks the process (and with it every vCPU thread) is gone. The `#[ignore]`d slow tier boots a bzImage
//! to its banner and a vmlinux with the baseline profile to `/init`, its root a read-only erofs
//! image served by our virtio-blk device (plus a virtio-vsock device), and a two-vCPU boot whose
//! second CPU the guest starts through INIT/SIPI; on this PVM host guest kernel code is
//! interpreted, so these take minutes.

mod proc_harness;
mod tiny_harness;

use std::path::PathBuf;
use std::time::Duration;

use proc_harness::VmProc;
use tiny_harness::{skip, skip_without_kvm};
use vmm::process::{ExitKind, ProcessExit};
use vmm::virtio::DeviceConfig;
use vmm::{CpuProfile, VmConfig};

fn images_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("VM_IMAGES_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    cache.join("vm/images")
}

/// The image file, or None after printing the skip line.
fn image(test: &str, file: &str) -> Option<PathBuf> {
    if skip_without_kvm(test) {
        return None;
    }
    let p = images_dir().join("current").join(file);
    if p.is_file() {
        Some(p)
    } else {
        skip(
            test,
            &format!(
                "{} is absent (build images with images/build.sh)",
                p.display()
            ),
        );
        None
    }
}

/// Sum of the `usable` ranges of the kernel's `BIOS-e820:` lines.
fn e820_usable(console: &str) -> u64 {
    console
        .lines()
        .filter(|l| l.contains("BIOS-e820: [mem ") && l.trim_end().ends_with("usable"))
        .filter_map(|l| {
            let r = l.split("[mem ").nth(1)?.split(']').next()?;
            let (a, b) = r.split_once('-')?;
            let a = u64::from_str_radix(a.trim_start_matches("0x"), 16).ok()?;
            let b = u64::from_str_radix(b.trim_start_matches("0x"), 16).ok()?;
            Some(b + 1 - a)
        })
        .sum()
}

#[test]
fn vmlinux_prints_banner_and_cmdline_then_stops_cleanly() {
    let test = "vmlinux_prints_banner_and_cmdline_then_stops_cleanly";
    let Some(kernel) = image(test, "vmlinux") else {
        return;
    };
    let marker = format!("vmm.test.marker={}", std::process::id());
    let cfg = VmConfig {
        mem_mib: 64,
        vcpus: 1,
        kernel,
        cmdline: marker.clone(),
        ..VmConfig::default()
    };
    let mut vm = VmProc::start(cfg);
    // Returns as soon as all three are seen (~1 s on hardware); the bound is generous because
    // an emulating host (kvm_pvm) at a load of 10 took 25 s, and at a load of 11 (2026-12-04)
    // 83 s, and 122 s for the kernel with memory hotplug and ZONE_DEVICE (virtio-fs DAX).
    let seen = vm.wait_console(
        Duration::from_secs(300),
        &["Linux version 6.12", &marker, "BIOS-e820"],
    );
    // Give the remaining e820 lines a moment to be printed.
    std::thread::sleep(Duration::from_millis(500));
    let console = vm.console();
    assert!(
        seen,
        "banner/cmdline not seen within 300 s; console:\n{console}"
    );
    assert!(
        vm.thread_names().iter().any(|t| t == "vm0-vcpu0"),
        "vCPU thread running: {:?}",
        vm.thread_names()
    );
    // Memory cap: the kernel sees exactly 64 MiB minus the EBDA/legacy hole as usable RAM.
    assert_eq!(
        e820_usable(&console),
        (64 << 20) - (0x10_0000 - 0x9_fc00),
        "console:\n{console}"
    );
    vm.stop();
    assert_eq!(
        vm.wait_timeout(Duration::from_secs(10)),
        Some(ProcessExit::Exited(ExitKind::Ended)),
        "console:\n{}",
        vm.console()
    );
    assert_eq!(
        vm.thread_names(),
        Vec::<String>::new(),
        "the vm process and its vCPU threads are gone"
    );
}

#[test]
#[ignore = "slow: the bzImage decompressor runs interpreted on PVM (minutes)"]
fn slow_bzimage_boots_to_banner() {
    let test = "slow_bzimage_boots_to_banner";
    let Some(kernel) = image(test, "bzImage") else {
        return;
    };
    let cfg = VmConfig {
        mem_mib: 128,
        kernel,
        ..VmConfig::default()
    };
    let mut vm = VmProc::start(cfg);
    let seen = vm.wait_console(Duration::from_secs(900), &["Linux version 6.12"]);
    vm.stop();
    let outcome = vm.wait_timeout(Duration::from_secs(10));
    let console = vm.console();
    assert!(seen, "no banner; outcome {outcome:?}; console:\n{console}");
}

/// A read-only erofs root filesystem holding only `/init` (its content never runs: on a PVM
/// host the first guest system call faults), or None after printing the skip line.
fn erofs_root(test: &str, dir: &std::path::Path) -> Option<PathBuf> {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("init"), b"#!/bin/sh\n").unwrap();
    let img = dir.join("root.erofs");
    match std::process::Command::new("mkfs.erofs")
        .arg("--quiet")
        .arg(&img)
        .arg(&root)
        .status()
    {
        Ok(s) if s.success() => Some(img),
        Ok(s) => panic!("mkfs.erofs failed: {s}"),
        Err(e) => {
            skip(
                test,
                &format!("mkfs.erofs unavailable ({e}); ci/setup.sh installs erofs-utils"),
            );
            None
        }
    }
}

#[test]
#[ignore = "slow: interpreted guest kernel boot to /init takes ~2 minutes on PVM"]
fn slow_vmlinux_baseline_mounts_erofs_root_from_virtio_blk_and_runs_init() {
    let test = "slow_vmlinux_baseline_mounts_erofs_root_from_virtio_blk_and_runs_init";
    let Some(kernel) = image(test, "vmlinux") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = erofs_root(test, dir.path()) else {
        return;
    };
    let disk_before = std::fs::read(&disk).unwrap();
    let cfg = VmConfig {
        mem_mib: 256,
        kernel,
        cmdline: "root=/dev/vda ro rootfstype=erofs init=/init".into(),
        cpu_profile: CpuProfile::Baseline,
        devices: vec![
            DeviceConfig::Block {
                path: disk.clone(),
                read_only: true,
                id: "rootdisk".into(),
            },
            DeviceConfig::Vsock {
                guest_cid: 3,
                uds_path: dir.path().join("vsock.sock"),
            },
        ],
        ..VmConfig::default()
    };
    let mut vm = VmProc::start(cfg);
    let seen = vm.wait_console(
        Duration::from_secs(600),
        &[
            "virtio_blk virtio0: [vda]",
            "NET: Registered PF_VSOCK protocol family",
            "VFS: Mounted root (erofs filesystem) readonly",
            "Run /init as init process",
        ],
    );
    let early = vm.try_exit();
    vm.stop();
    let outcome = vm.wait_timeout(Duration::from_secs(10));
    let console = vm.console();
    assert!(seen, "outcome {outcome:?}; console:\n{console}");
    for l in console.lines().filter(|l| {
        [
            "virtio-mmio",
            "virtio_blk",
            "PF_VSOCK",
            "VFS: Mounted",
            "Run /init",
        ]
        .iter()
        .any(|m| l.contains(m))
    }) {
        eprintln!("{l}");
    }
    let before_init = console
        .split("Run /init as init process")
        .next()
        .unwrap_or_default();
    assert!(!before_init.contains("INTERNAL_ERROR") && !before_init.contains("internal error"));
    // A vCPU fault (or the process dying) before /init fails; a guest reset after it does not.
    assert!(
        matches!(
            early,
            None | Some(ProcessExit::Exited(
                ExitKind::Ended | ExitKind::TripleFault | ExitKind::Halted
            ))
        ),
        "the vm process failed before /init: {early:?}"
    );
    assert_eq!(
        std::fs::read(&disk).unwrap(),
        disk_before,
        "the read-only root disk changed on the host"
    );
}

#[test]
#[ignore = "slow tier: a real kernel boot with two vCPUs under KVM"]
fn slow_two_vcpus_the_guest_starts_the_second_through_init_sipi() {
    let test = "slow_two_vcpus_the_guest_starts_the_second_through_init_sipi";
    let Some(kernel) = image(test, "vmlinux") else {
        return;
    };
    let cfg = VmConfig {
        mem_mib: 128,
        vcpus: 2,
        kernel,
        cpu_profile: CpuProfile::Baseline,
        ..VmConfig::default()
    };
    let mut vm = VmProc::start(cfg);
    // The kernel finds both CPUs in our MP table, then the boot CPU wakes the second one with
    // INIT/SIPI through the in-kernel LAPIC; "Brought up" counts the CPUs that answered.
    let seen = vm.wait_console(
        Duration::from_secs(600),
        &["smp: Brought up 1 node, 2 CPUs"],
    );
    vm.stop();
    let outcome = vm.wait_timeout(Duration::from_secs(10));
    let console = vm.console();
    assert!(seen, "outcome {outcome:?}; console:\n{console}");
    assert!(
        console.contains("Allowing 2 present CPUs") || console.contains("2 Processors"),
        "the MP table did not announce two CPUs:\n{console}"
    );
}
