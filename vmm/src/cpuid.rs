//! CPUID: normalize what KVM supports into what one vCPU of this VM reports.
//!
//! Per vCPU: APIC id in leaf 1 EBX[31:24] and in the x2APIC topology leaves 0xb/0x1f, logical
//! processor counts, the hypervisor bit, and cache leaf 4's sharing counts. Every profile hides
//! what an untrusted guest has no use for and would only be attack surface ([`ALWAYS_HIDDEN`],
//! [`ZEROED_LEAVES`]): nested virtualization (VMX, SVM and the SVM feature leaf) and the
//! performance-monitoring unit (Intel's leaf 0xa, AMD's core/NB/LLC counter extensions and
//! PerfMonV2 leaf), as Firecracker's templates do; and it reports our own brand string
//! ([`BRAND`], leaves 0x8000_0002..=4) instead of whatever the host's KVM passes through. The
//! [`Baseline`](crate::config::CpuProfile::Baseline) profile also hides features that KVM's
//! instruction emulator on a PVM host cannot execute at CPL0 (see [`BASELINE_HIDDEN`]).
//!
//! Measured on the PVM-native development hosts (tests/tiny_guests.rs,
//! `cpuid_table_reaches_the_guest`): a `cpuid` executed by the guest at CPL0 returns our table's
//! leaf 1 EBX (APIC id, logical count), but the *feature bits* of leaf 1 ECX and leaf 7 are the
//! host's, whatever KVM_SET_CPUID2 said. So on PVM the baseline profile only works because it
//! also puts `noxsave clearcpuid=...` on the kernel command line ([`baseline_clearcpuid`]).
//! `cx16` is on the list because SLUB's `cmpxchg16b` stops the emulator (seen as an internal
//! error in `___slab_alloc` when booting the 6.12 guest kernel).

use kvm_bindings::{CpuId, KVM_MAX_CPUID_ENTRIES, kvm_cpuid_entry2};
use kvm_ioctls::{Cap, Kvm};

/// A feature bit: (leaf, subleaf or None for any, register, bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeatureBit {
    /// Name as in /proc/cpuinfo or clearcpuid=.
    pub name: &'static str,
    /// Leaf.
    pub leaf: u32,
    /// Sub-leaf.
    pub index: u32,
    /// Register.
    pub reg: Reg,
    /// Bit number.
    pub bit: u32,
}

/// A CPUID output register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reg {
    /// EBX.
    Ebx,
    /// ECX.
    Ecx,
    /// EDX.
    Edx,
}

const fn fb(name: &'static str, leaf: u32, index: u32, reg: Reg, bit: u32) -> FeatureBit {
    FeatureBit {
        name,
        leaf,
        index,
        reg,
        bit,
    }
}

/// Features the baseline profile hides.
pub const BASELINE_HIDDEN: &[FeatureBit] = &[
    fb("cx16", 1, 0, Reg::Ecx, 13),
    fb("pcid", 1, 0, Reg::Ecx, 17),
    fb("movbe", 1, 0, Reg::Ecx, 22),
    fb("popcnt", 1, 0, Reg::Ecx, 23),
    fb("xsave", 1, 0, Reg::Ecx, 26),
    fb("osxsave", 1, 0, Reg::Ecx, 27),
    fb("avx", 1, 0, Reg::Ecx, 28),
    fb("rdrand", 1, 0, Reg::Ecx, 30),
    fb("fsgsbase", 7, 0, Reg::Ebx, 0),
    fb("bmi1", 7, 0, Reg::Ebx, 3),
    fb("avx2", 7, 0, Reg::Ebx, 5),
    fb("smep", 7, 0, Reg::Ebx, 7),
    fb("bmi2", 7, 0, Reg::Ebx, 8),
    fb("erms", 7, 0, Reg::Ebx, 9),
    fb("invpcid", 7, 0, Reg::Ebx, 10),
    fb("rdseed", 7, 0, Reg::Ebx, 18),
    fb("smap", 7, 0, Reg::Ebx, 20),
    fb("umip", 7, 0, Reg::Ecx, 2),
    fb("rdpid", 7, 0, Reg::Ecx, 22),
    fb("fsrm", 7, 0, Reg::Edx, 4),
    fb("abm", 0x8000_0001, 0, Reg::Ecx, 5),
];

/// Features every profile hides: nested virtualization and the PMU's extensions.
pub const ALWAYS_HIDDEN: &[FeatureBit] = &[
    fb("vmx", 1, 0, Reg::Ecx, 5),
    fb("svm", 0x8000_0001, 0, Reg::Ecx, 2),
    fb("perfctr_core", 0x8000_0001, 0, Reg::Ecx, 23),
    fb("perfctr_nb", 0x8000_0001, 0, Reg::Ecx, 24),
    fb("perfctr_llc", 0x8000_0001, 0, Reg::Ecx, 28),
];

/// Leaves every profile reports as all zeros: Intel's architectural performance monitoring
/// (0xa: version 0 = no PMU), AMD's SVM features (0x8000_000a: `npt`, `vgif`, ...) and AMD's
/// PerfMonV2 (0x8000_0022).
pub const ZEROED_LEAVES: &[u32] = &[0xa, 0x8000_000a, 0x8000_0022];

/// The processor brand string the guest sees (`model name` in its /proc/cpuinfo).
pub const BRAND: &str = "vm microVM vCPU";

/// Leaf 1 ECX: the LAPIC's TSC-deadline timer mode.
pub const TSC_DEADLINE_BIT: u32 = 24;
/// Leaf 1 ECX: hypervisor present.
const HYPERVISOR_BIT: u32 = 31;
/// Leaf 1 EDX: HTT (more than one logical processor per package).
const HTT_BIT: u32 = 28;

/// Parameters of [`normalize`].
#[derive(Clone, Copy, Debug)]
pub struct CpuidParams {
    /// This vCPU's index (= APIC id).
    pub vcpu: u8,
    /// vCPUs in the VM (one package, one thread per core).
    pub vcpus: u8,
    /// Hide [`BASELINE_HIDDEN`] and the XSAVE leaf.
    pub baseline: bool,
}

fn reg_mut(e: &mut kvm_cpuid_entry2, reg: Reg) -> &mut u32 {
    match reg {
        Reg::Ebx => &mut e.ebx,
        Reg::Ecx => &mut e.ecx,
        Reg::Edx => &mut e.edx,
    }
}

/// What KVM can offer a vCPU of this VM, before [`normalize`]: `KVM_GET_SUPPORTED_CPUID` plus the
/// TSC-deadline timer, which KVM's in-kernel LAPIC emulates but reports only as
/// `KVM_CAP_TSC_DEADLINE_TIMER` (as Firecracker and Cloud Hypervisor add it). With it the guest
/// kernel programs its timer by deadline and skips calibrating the LAPIC timer against the
/// PIT: a boot-time loop that waits for ten timer interrupts (`setup_boot_APIC_clock`), where
/// the nested-KVM runner's guests were seen stalled, and ~100 ms of every boot. Not for the
/// baseline profile: the PVM hosts it is for keep the table they were measured with.
pub fn supported_for_vm(kvm: &Kvm, baseline: bool) -> Result<CpuId, kvm_ioctls::Error> {
    let mut cpuid = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)?;
    if !baseline && kvm.check_extension(Cap::TscDeadlineTimer) {
        add_tsc_deadline(cpuid.as_mut_slice());
    }
    Ok(cpuid)
}

fn add_tsc_deadline(entries: &mut [kvm_cpuid_entry2]) {
    for e in entries.iter_mut().filter(|e| e.function == 1) {
        e.ecx |= 1 << TSC_DEADLINE_BIT;
    }
}

/// Normalize the supported CPUID entries for one vCPU, in place.
pub fn normalize(entries: &mut [kvm_cpuid_entry2], p: CpuidParams) {
    let apic_id = u32::from(p.vcpu);
    let count = u32::from(p.vcpus.max(1));
    // Bits needed to number `count` cores.
    let core_bits = 32 - (count - 1).leading_zeros();
    for e in entries.iter_mut() {
        match e.function {
            1 => {
                e.ebx = (e.ebx & 0x0000_ffff) | (apic_id << 24) | (count << 16);
                e.ecx |= 1 << HYPERVISOR_BIT;
                if count > 1 {
                    e.edx |= 1 << HTT_BIT;
                } else {
                    e.edx &= !(1 << HTT_BIT);
                }
            }
            4 => {
                // EAX[31:26] = cores per package - 1; EAX[25:14] = threads sharing - 1.
                let level = (e.eax >> 5) & 0x7;
                let sharing = if level >= 3 { count - 1 } else { 0 };
                e.eax = (e.eax & 0x3ff) | ((count - 1) << 26) | (sharing << 14);
            }
            0xb | 0x1f => {
                // Sub-leaf 0: SMT level (1 thread); sub-leaf 1: core level; others invalid.
                match e.index {
                    0 => {
                        e.eax = 0;
                        e.ebx = 1;
                        e.ecx = 1 << 8;
                    }
                    1 => {
                        e.eax = core_bits;
                        e.ebx = count;
                        e.ecx = (2 << 8) | 1;
                    }
                    _ => {
                        e.eax = 0;
                        e.ebx = 0;
                        e.ecx = e.index;
                    }
                }
                e.edx = apic_id;
            }
            0xd if p.baseline => zero(e),
            f if ZEROED_LEAVES.contains(&f) => zero(e),
            f @ 0x8000_0002..=0x8000_0004 => {
                let [eax, ebx, ecx, edx] = brand_words(f - 0x8000_0002);
                (e.eax, e.ebx, e.ecx, e.edx) = (eax, ebx, ecx, edx);
            }
            _ => {}
        }
        let hidden = ALWAYS_HIDDEN
            .iter()
            .chain(if p.baseline { BASELINE_HIDDEN } else { &[] });
        for f in hidden {
            if f.leaf == e.function && f.index == e.index {
                *reg_mut(e, f.reg) &= !(1 << f.bit);
            }
        }
    }
}

fn zero(e: &mut kvm_cpuid_entry2) {
    (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0);
}

/// The four registers of brand leaf `0x8000_0002 + part`: [`BRAND`], NUL-padded to 48 bytes.
fn brand_words(part: u32) -> [u32; 4] {
    let mut bytes = [0u8; 48];
    let brand = BRAND.as_bytes();
    bytes[..brand.len()].copy_from_slice(brand);
    let base = part as usize * 16;
    std::array::from_fn(|i| {
        let at = base + i * 4;
        u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
    })
}

/// `clearcpuid=` value naming every feature the baseline hides (minus the XSAVE pair, which the
/// kernel controls with `noxsave`).
pub fn baseline_clearcpuid() -> String {
    let names: Vec<&str> = BASELINE_HIDDEN
        .iter()
        .map(|f| f.name)
        .filter(|n| !matches!(*n, "xsave" | "osxsave"))
        .collect();
    names.join(",")
}

/// True when this host's KVM is kvm_pvm in native mode without hardware virtualization.
/// Read once per process (a start asks more than once, and a host does not change kind).
pub fn host_is_pvm_native() -> bool {
    static PVM_NATIVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PVM_NATIVE.get_or_init(|| {
        let native = std::fs::read_to_string("/sys/module/kvm_pvm/parameters/pvm_native")
            .map(|s| s.trim() == "Y")
            .unwrap_or(false);
        native && !cpu_has_hw_virt()
    })
}

/// Whether this CPU offers hardware virtualization: CPUID leaf 1 ECX bit 5 (Intel VMX) or
/// leaf 0x8000_0001 ECX bit 2 (AMD SVM). Asked of the CPU itself, not `/proc/cpuinfo`: no
/// file to read and format on every VM start.
fn cpu_has_hw_virt() -> bool {
    // `__cpuid` is a safe function since Rust 1.88; the workspace's MSRV, 1.85, needs the block.
    #[allow(unused_unsafe)]
    // SAFETY: CPUID is available on every x86-64 CPU; leaf 0 and 0x8000_0000 report the
    // highest basic and extended leaves, and no leaf above them is asked for.
    unsafe {
        use std::arch::x86_64::__cpuid;
        let vmx = __cpuid(0).eax >= 1 && __cpuid(1).ecx & (1 << 5) != 0;
        let svm =
            __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 2) != 0;
        vmx || svm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardware_virtualization_is_what_proc_cpuinfo_says() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let listed = cpuinfo
            .lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|w| w == "vmx" || w == "svm"));
        assert_eq!(cpu_has_hw_virt(), listed);
    }

    #[test]
    fn tsc_deadline_goes_into_leaf_1_only() {
        let mut e = [entry(1, 0, 0, 0, 0x11, 0), entry(7, 0, 0, 0, 0, 0)];
        add_tsc_deadline(&mut e);
        assert_eq!(e[0].ecx, 0x11 | 1 << TSC_DEADLINE_BIT);
        assert_eq!(e[1].ecx, 0);
    }

    /// On a host whose KVM has the capability (the nested runner's, real hosts; PVM too), the
    /// table for the host profile offers the TSC-deadline timer and the baseline's does not.
    #[test]
    fn supported_for_vm_offers_tsc_deadline_except_to_the_baseline() {
        let Ok(kvm) = Kvm::new() else {
            vm_test_support::skip("supported_for_vm", "/dev/kvm unavailable");
            return;
        };
        let bit = |c: CpuId| {
            let e = c.as_slice().iter().find(|e| e.function == 1).copied();
            e.unwrap().ecx & (1 << TSC_DEADLINE_BIT) != 0
        };
        let raw = bit(kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).unwrap());
        let cap = kvm.check_extension(Cap::TscDeadlineTimer);
        assert_eq!(bit(supported_for_vm(&kvm, false).unwrap()), raw || cap);
        assert_eq!(bit(supported_for_vm(&kvm, true).unwrap()), raw);
    }

    fn entry(
        function: u32,
        index: u32,
        eax: u32,
        ebx: u32,
        ecx: u32,
        edx: u32,
    ) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax,
            ebx,
            ecx,
            edx,
            ..Default::default()
        }
    }

    #[test]
    fn sets_apic_id_topology_and_hypervisor_bit() {
        let mut e = vec![
            entry(1, 0, 0, 0xff00_1234, 0, 0),
            entry(0xb, 0, 0, 0, 0, 0),
            entry(0xb, 1, 0, 0, 0, 0),
            entry(4, 0, 0x121, 0, 0, 0),
            entry(4, 3, 0x163, 0, 0, 0),
        ];
        normalize(
            &mut e,
            CpuidParams {
                vcpu: 2,
                vcpus: 3,
                baseline: false,
            },
        );
        assert_eq!(e[0].ebx, (2 << 24) | (3 << 16) | 0x1234);
        assert_ne!(e[0].ecx & (1 << 31), 0);
        assert_ne!(e[0].edx & (1 << HTT_BIT), 0);
        assert_eq!((e[1].ebx, e[1].edx), (1, 2));
        assert_eq!((e[2].eax, e[2].ebx, e[2].edx), (2, 3, 2));
        assert_eq!(e[3].eax >> 26, 2);
        assert_eq!((e[3].eax >> 14) & 0xfff, 0, "L1 is per core");
        assert_eq!((e[4].eax >> 14) & 0xfff, 2, "L3 shared by all");
    }

    #[test]
    fn baseline_hides_emulator_unsafe_features_only_in_baseline() {
        let all = entry(1, 0, 0, 0, u32::MAX, u32::MAX);
        let l7 = entry(7, 0, 0, u32::MAX, u32::MAX, u32::MAX);
        let ext = entry(0x8000_0001, 0, 0, 0, u32::MAX, 0);
        let mut e = vec![all, l7, ext, entry(0xd, 0, 7, 1, 1, 0)];
        normalize(
            &mut e,
            CpuidParams {
                vcpu: 0,
                vcpus: 1,
                baseline: true,
            },
        );
        for bit in [13, 17, 22, 23, 26, 27, 28, 30] {
            assert_eq!(e[0].ecx & (1 << bit), 0, "leaf 1 ecx bit {bit}");
        }
        assert_ne!(e[0].ecx & (1 << 31), 0);
        assert_ne!(e[0].ecx & 1, 0, "sse3 stays");
        for bit in [0, 3, 5, 7, 8, 9, 10, 18, 20] {
            assert_eq!(e[1].ebx & (1 << bit), 0, "leaf 7 ebx bit {bit}");
        }
        assert_eq!(e[1].ecx & ((1 << 2) | (1 << 22)), 0);
        assert_eq!(e[1].edx & (1 << 4), 0);
        assert_eq!(e[2].ecx & (1 << 5), 0);
        assert_eq!(e[3].eax, 0);

        let mut h = vec![all, l7];
        normalize(
            &mut h,
            CpuidParams {
                vcpu: 0,
                vcpus: 1,
                baseline: false,
            },
        );
        assert_ne!(h[0].ecx & (1 << 23), 0, "host keeps popcnt");
        assert_eq!(h[0].edx & (1 << HTT_BIT), 0);
    }

    #[test]
    fn nested_virtualization_and_the_pmu_are_hidden_in_every_profile() {
        for baseline in [false, true] {
            let mut e = vec![
                entry(1, 0, 0, 0, u32::MAX, u32::MAX),
                entry(0x8000_0001, 0, 0, 0, u32::MAX, u32::MAX),
                entry(0xa, 0, 0x0804_0002, 7, 0, 3),
                entry(0x8000_000a, 0, 1, 0x8000, 0, 0x1fff_ffff),
                entry(0x8000_0022, 0, 7, 0x4000, 0, 0),
            ];
            normalize(
                &mut e,
                CpuidParams {
                    vcpu: 0,
                    vcpus: 1,
                    baseline,
                },
            );
            assert_eq!(e[0].ecx & (1 << 5), 0, "vmx ({baseline})");
            assert_ne!(e[0].ecx & 1, 0, "sse3 stays");
            assert_eq!(e[1].ecx & (1 << 2), 0, "svm ({baseline})");
            assert_eq!(e[1].ecx & ((1 << 23) | (1 << 24) | (1 << 28)), 0, "perfctr");
            assert_ne!(e[1].ecx & 1, 0, "lahf_lm stays");
            for z in &e[2..] {
                assert_eq!(
                    (z.eax, z.ebx, z.ecx, z.edx),
                    (0, 0, 0, 0),
                    "{:#x}",
                    z.function
                );
            }
        }
    }

    #[test]
    fn the_brand_string_is_ours() {
        let mut e: Vec<_> = (0x8000_0002..=0x8000_0004)
            .map(|f| entry(f, 0, 0x6d6d_6148, 0x7265, u32::MAX, u32::MAX))
            .collect();
        normalize(
            &mut e,
            CpuidParams {
                vcpu: 0,
                vcpus: 1,
                baseline: false,
            },
        );
        let bytes: Vec<u8> = e
            .iter()
            .flat_map(|l| [l.eax, l.ebx, l.ecx, l.edx])
            .flat_map(u32::to_le_bytes)
            .collect();
        assert_eq!(bytes.len(), 48);
        assert_eq!(&bytes[..BRAND.len()], BRAND.as_bytes());
        assert!(bytes[BRAND.len()..].iter().all(|b| *b == 0), "NUL-padded");
    }

    #[test]
    fn clearcpuid_lists_names() {
        let s = baseline_clearcpuid();
        assert!(s.starts_with("cx16,pcid,movbe,popcnt,avx,"));
        assert!(s.contains("abm") && !s.contains("xsave"));
    }
}
