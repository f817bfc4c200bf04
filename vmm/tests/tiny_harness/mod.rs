//! Harness for tiny guest programs: a few bytes of 64-bit code loaded as a raw image and run
//! through the VMM's normal boot path (page tables, GDT, long-mode registers, CPUID, MSRs).

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};
use vm_sync::Lock;
use vmm::bus::BusDevice;
use vmm::{CpuProfile, KernelFormat, RunningVm, Vm, VmConfig};

/// Where tiny guests write their results.
pub const RESULT_ADDR: u64 = 0x3000;

/// `mov al, 0xfe ; out 0x64, al ; hlt`: reset through the i8042, ending the VM.
pub const RESET: &[u8] = &[0xb0, 0xfe, 0xe6, 0x64, 0xf4];

/// Print the skip line (and log it) and return true when KVM is unusable here.
pub fn skip_without_kvm(test: &str) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => false,
        Err(e) => {
            skip(test, &format!("/dev/kvm unavailable: {e}"));
            true
        }
    }
}

/// Report a skipped test as the project's rules require.
#[allow(unused_imports)] // not every test binary that includes this module skips
pub use vm_test_support::skip;

/// One recorded access to a probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// Offset inside the probe's range.
    pub offset: u64,
    /// Bytes written (for reads: the length, zero filled).
    pub data: Vec<u8>,
    /// Whether it was a write.
    pub write: bool,
}

/// A bus device recording every access and answering reads with a fixed pattern.
#[derive(Clone, Default)]
pub struct Probe {
    /// Everything the guest did.
    pub log: Arc<Mutex<Vec<Access>>>,
    /// Byte pattern returned on reads (little endian, repeated as needed).
    pub read_value: u64,
}

impl Probe {
    /// A probe answering reads with `read_value`.
    pub fn new(read_value: u64) -> Self {
        Self {
            log: Arc::default(),
            read_value,
        }
    }

    /// The recorded accesses.
    pub fn accesses(&self) -> Vec<Access> {
        self.log.locked().clone()
    }
}

/// A [`Probe`] as a bus device (for tests that place it themselves).
pub struct ProbeOf(pub Probe);

impl BusDevice for ProbeOf {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let v = self.0.read_value.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            *b = v[i % 8];
        }
        self.0.log.locked().push(Access {
            offset,
            data: vec![0; data.len()],
            write: false,
        });
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        self.0.log.locked().push(Access {
            offset,
            data: data.to_vec(),
            write: true,
        });
    }
}

/// How to build a tiny guest.
pub struct Tiny<'a> {
    /// Machine code.
    pub code: &'a [u8],
    /// vCPUs (every one starts at the code).
    pub vcpus: u8,
    /// CPU profile.
    pub profile: CpuProfile,
    /// Probe on the port bus: (probe, base, len).
    pub pio_probe: Option<(Probe, u64, u64)>,
    /// Probe on the MMIO bus: (probe, base, len).
    pub mmio_probe: Option<(Probe, u64, u64)>,
}

impl<'a> Tiny<'a> {
    /// One vCPU, automatic profile, no probes.
    pub fn new(code: &'a [u8]) -> Self {
        Self {
            code,
            vcpus: 1,
            profile: CpuProfile::Auto,
            pio_probe: None,
            mmio_probe: None,
        }
    }

    /// The VM's config, its code written to `dir/tiny.bin` (16 MiB, no devices).
    pub fn config(&self, dir: &std::path::Path) -> VmConfig {
        let path = dir.join("tiny.bin");
        std::fs::write(&path, self.code).unwrap();
        VmConfig {
            mem_mib: 16,
            vcpus: self.vcpus,
            kernel: path,
            kernel_format: KernelFormat::Raw,
            cpu_profile: self.profile,
            ..VmConfig::default()
        }
    }

    /// Create and start the VM.
    pub fn start(self) -> RunningVm {
        self.create().start().expect("start tiny VM")
    }

    /// Create the VM (with its probes) without starting it.
    pub fn create(self) -> Vm {
        let dir = tempfile::tempdir().unwrap();
        let mut vm = Vm::create(self.config(dir.path())).expect("create tiny VM");
        if let Some((p, base, len)) = self.pio_probe {
            vm.add_pio_device(Arc::new(Mutex::new(ProbeOf(p))), base, len)
                .unwrap();
        }
        if let Some((p, base, len)) = self.mmio_probe {
            vm.add_mmio_device(Arc::new(Mutex::new(ProbeOf(p))), base, len)
                .unwrap();
        }
        vm
    }
}

/// Read a little-endian u32 from guest memory.
pub fn read_u32(vm: &RunningVm, addr: u64) -> u32 {
    vm.memory()
        .expect("vm alive")
        .read_obj(GuestAddress(addr))
        .unwrap()
}

/// Read a u64 from guest memory.
pub fn read_u64(vm: &RunningVm, addr: u64) -> u64 {
    vm.memory()
        .expect("vm alive")
        .read_obj(GuestAddress(addr))
        .unwrap()
}

/// Poll `cond` until it holds or `timeout` passes.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    cond()
}

/// Concatenate code fragments.
pub fn code(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// CPU time (user + sys, in clock ticks) of this process's thread named `name`.
pub fn thread_cpu_ticks(name: &str) -> Option<u64> {
    for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
        // Fields after the ")" of the comm: state is field 3; utime and stime are 14 and 15.
        let rest = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let utime: u64 = f.get(11)?.parse().ok()?;
        let stime: u64 = f.get(12)?.parse().ok()?;
        return Some(utime + stime);
    }
    None
}

/// `mov dword [rbx + off], v` (a register of the MMIO window whose base is in `rbx`).
pub fn mmio(off: u32, v: u32) -> Vec<u8> {
    [&[0xc7, 0x83][..], &off.to_le_bytes(), &v.to_le_bytes()].concat()
}
