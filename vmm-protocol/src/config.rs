//! What a VM is made of: memory, vCPUs, kernel, CPU model and devices, as the launcher
//! sends it ([`crate::process::ProcessConfig`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which CPU model the guest sees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CpuProfile {
    /// [`CpuProfile::Baseline`] on a PVM-native host, [`CpuProfile::Host`] otherwise (the VMM
    /// decides, on the host it runs on).
    #[default]
    Auto,
    /// Everything KVM supports.
    Host,
    /// Hides CX16 (cmpxchg16b), XSAVE, AVX*, BMI*, POPCNT, FSGSBASE, SMAP/SMEP, ERMS/FSRM, RDRAND/RDSEED, MOVBE,
    /// PCID/INVPCID, UMIP, RDPID and ABM, which KVM's emulator on a PVM host cannot execute at
    /// CPL0; the command line also gets `noxsave clearcpuid=...` and calibration shortcuts.
    Baseline,
}

impl CpuProfile {
    /// Parse `auto`, `host` or `baseline`.
    pub fn parse(s: &str) -> Option<CpuProfile> {
        match s {
            "auto" => Some(CpuProfile::Auto),
            "host" => Some(CpuProfile::Host),
            "baseline" => Some(CpuProfile::Baseline),
            _ => None,
        }
    }
}

/// How to interpret the kernel file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum KernelFormat {
    /// ELF vmlinux or bzImage, detected from the file's contents.
    #[default]
    Auto,
    /// Raw 64-bit machine code, loaded at 1 MiB and entered at its first byte. Every vCPU starts
    /// running it at once (no INIT/SIPI); meant for tiny test guests.
    Raw,
}

/// What device to build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceConfig {
    /// A virtio-blk disk backed by a raw image file.
    Block {
        /// Host path of the raw image.
        path: PathBuf,
        /// Offer `VIRTIO_BLK_F_RO`, open the file read-only and refuse every write.
        read_only: bool,
        /// The disk serial (at most 20 bytes) answered to `VIRTIO_BLK_T_GET_ID`.
        id: String,
    },
    /// A hybrid virtio-vsock device.
    Vsock {
        /// The guest's CID (3 and up).
        guest_cid: u64,
        /// The host Unix socket; guest connections to host port P go to `<uds_path>_P`.
        uds_path: PathBuf,
    },
    /// A virtio-rng device fed by getrandom(2).
    Rng,
    /// A read-only virtio-fs device: one host mount (a directory, or one regular file),
    /// served by `vm_virtiofs`.
    Fs {
        /// The tag the guest mounts it by (1-36 bytes).
        tag: String,
        /// The mount's source on the host (opened inside the jail, read-only).
        share: PathBuf,
        /// The server's inode cap (each a descriptor).
        max_inodes: usize,
        /// The DAX window's size in bytes (a multiple of 2 MiB, at most
        /// [`crate::layout::DAX_WINDOW_STRIDE`]; 0: no window).
        dax_window: u64,
    },
}

impl DeviceConfig {
    /// The device's name in log lines and counters: `virtio-blk:<id>`, `virtio-vsock`,
    /// `virtio-rng`, `virtio-fs:<tag>`.
    pub fn name(&self) -> String {
        match self {
            DeviceConfig::Block { id, .. } => format!("virtio-blk:{id}"),
            DeviceConfig::Vsock { .. } => "virtio-vsock".into(),
            DeviceConfig::Rng => "virtio-rng".into(),
            DeviceConfig::Fs { tag, .. } => format!("virtio-fs:{tag}"),
        }
    }
}

/// Everything needed to create a VM, as data. The console is not part of it: it belongs to
/// the process that runs the VM (`vm-vmm` streams it on its stdout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmConfig {
    /// Guest RAM in MiB; the guest gets exactly this much (hard cap).
    pub mem_mib: u32,
    /// vCPUs (1..=32).
    pub vcpus: u8,
    /// Kernel: ELF vmlinux or bzImage (or raw code with [`KernelFormat::Raw`]).
    pub kernel: PathBuf,
    /// How to read `kernel`.
    pub kernel_format: KernelFormat,
    /// Optional initrd.
    pub initrd: Option<PathBuf>,
    /// Appended to the default command line.
    pub cmdline: String,
    /// CPU model.
    pub cpu_profile: CpuProfile,
    /// virtio-mmio devices, in order: device `i` at 0xd000_0000 + i*0x1000, GSI 5+i (at most
    /// [`crate::layout::MAX_VIRTIO_DEVICES`]).
    pub devices: Vec<DeviceConfig>,
}

impl Default for VmConfig {
    fn default() -> Self {
        Self {
            mem_mib: 128,
            vcpus: 1,
            kernel: PathBuf::new(),
            kernel_format: KernelFormat::Auto,
            initrd: None,
            cmdline: String::new(),
            cpu_profile: CpuProfile::Auto,
            devices: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_by_name() {
        assert_eq!(CpuProfile::parse("baseline"), Some(CpuProfile::Baseline));
        assert_eq!(CpuProfile::parse("auto"), Some(CpuProfile::Auto));
        assert_eq!(CpuProfile::parse("x"), None);
    }
}
