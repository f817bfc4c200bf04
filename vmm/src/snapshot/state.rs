//! The saved state of a VM, as plain serde types: what a snapshot holds besides guest RAM.
//!
//! Pure data, testable without KVM. The KVM structures (`kvm_regs`, `kvm_sregs`, `kvm_lapic_state`,
//! `kvm_irqchip`, …) serialise through kvm-bindings' own `serde` feature, which writes each one
//! as its raw bytes (the kernel ABI is stable, so the bytes are too). Its decoder zero-fills a
//! byte string shorter than the structure and ignores the excess of a longer one: that never
//! panics, and the state file's checksum (`super::format`) is what refuses a damaged file; a
//! well-formed but crafted state is no more than arbitrary register values, which KVM
//! validates when they are set. `kvm_fpu` has no serde support there, so [`FpuState`] copies
//! its fields.
//!
//! [`VmState::validate`] holds the checks that do not need KVM: the vCPU count against
//! [`crate::boot::mptable::MAX_CPUS`] and the saved config, the memory regions against the
//! layout of the saved memory size (in order, none overlapping, exactly the layout's), and
//! the virtio devices' states against both (`crate::virtio::persist`).

use kvm_bindings::{
    kvm_clock_data, kvm_debugregs, kvm_fpu, kvm_irqchip, kvm_lapic_state, kvm_mp_state,
    kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use serde::{Deserialize, Serialize};

use super::vcpu::excluded;
use crate::boot::mptable::MAX_CPUS;
use crate::config::CpuProfile;
use crate::layout::MemoryLayout;
use crate::virtio::persist::{DeviceState, InvalidDevice, validate_devices};

/// Most MSRs one vCPU's state may list (KVM's own index list is a few hundred at most).
pub const MAX_MSRS: usize = 1024;

/// Why a decoded state is not one this VMM can restore.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidState {
    /// The saved vCPU count is 0 or above the VMM's maximum.
    #[error("vcpus {0} is outside 1..={MAX_CPUS}")]
    VcpuCount(u8),
    /// The list of vCPU states does not match the saved vCPU count.
    #[error("{found} vCPU states for vcpus {expected}")]
    VcpuStates {
        /// `config.vcpus`.
        expected: u8,
        /// States present.
        found: usize,
    },
    /// A vCPU lists more MSRs than [`MAX_MSRS`].
    #[error("vcpu {vcpu} lists {count} MSRs (at most {MAX_MSRS})")]
    TooManyMsrs {
        /// vCPU index.
        vcpu: usize,
        /// MSRs listed.
        count: usize,
    },
    /// A vCPU lists an MSR no snapshot holds (the PMU's or VMX's: a save leaves them out).
    #[error("vcpu {vcpu} lists MSR {index:#x}, which a snapshot never holds (PMU or VMX)")]
    ExcludedMsr {
        /// vCPU index.
        vcpu: usize,
        /// MSR index.
        index: u32,
    },
    /// The saved memory size has no layout (below the minimum).
    #[error("mem_mib {0} has no memory layout")]
    MemorySize(u32),
    /// Two regions overlap, or are out of order.
    #[error("memory region {index} at {start:#x} overlaps the one before it")]
    RegionOverlap {
        /// Region index.
        index: usize,
        /// Its guest start address.
        start: u64,
    },
    /// A region wraps past the end of the address space or is empty.
    #[error("memory region {index} at {start:#x} of {size:#x} bytes is not a valid range")]
    RegionRange {
        /// Region index.
        index: usize,
        /// Guest start address.
        start: u64,
        /// Size in bytes.
        size: u64,
    },
    /// The regions are not the layout of `mem_mib` (one is outside it, or one is missing).
    #[error("memory regions do not match the layout of {mem_mib} MiB")]
    RegionsOutsideLayout {
        /// The saved memory size.
        mem_mib: u32,
    },
    /// A virtio device's state is refused.
    #[error("virtio device state")]
    Device(#[source] InvalidDevice),
}

/// The facts of the `VmConfig` a restore must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigFacts {
    /// vCPUs.
    pub vcpus: u8,
    /// Guest RAM in MiB.
    pub mem_mib: u32,
    /// The CPU profile, resolved (`Auto` never appears).
    pub cpu_profile: CpuProfile,
}

/// One guest RAM region; the memory file holds the regions back to back, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionState {
    /// Guest physical start address.
    pub guest_addr: u64,
    /// Size in bytes.
    pub size: u64,
}

/// One MSR as read back from KVM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsrEntry {
    /// MSR index.
    pub index: u32,
    /// Value.
    pub data: u64,
}

/// `kvm_fpu`, field by field (kvm-bindings has no serde for it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FpuState {
    /// x87 registers.
    pub fpr: [[u8; 16]; 8],
    /// Control word.
    pub fcw: u16,
    /// Status word.
    pub fsw: u16,
    /// Abridged tag word.
    pub ftwx: u8,
    /// Last opcode.
    pub last_opcode: u16,
    /// Last instruction pointer.
    pub last_ip: u64,
    /// Last data pointer.
    pub last_dp: u64,
    /// XMM registers.
    pub xmm: [[u8; 16]; 16],
    /// MXCSR.
    pub mxcsr: u32,
}

impl From<&kvm_fpu> for FpuState {
    fn from(f: &kvm_fpu) -> Self {
        Self {
            fpr: f.fpr,
            fcw: f.fcw,
            fsw: f.fsw,
            ftwx: f.ftwx,
            last_opcode: f.last_opcode,
            last_ip: f.last_ip,
            last_dp: f.last_dp,
            xmm: f.xmm,
            mxcsr: f.mxcsr,
        }
    }
}

impl From<&FpuState> for kvm_fpu {
    fn from(f: &FpuState) -> Self {
        kvm_fpu {
            fpr: f.fpr,
            fcw: f.fcw,
            fsw: f.fsw,
            ftwx: f.ftwx,
            last_opcode: f.last_opcode,
            last_ip: f.last_ip,
            last_dp: f.last_dp,
            xmm: f.xmm,
            mxcsr: f.mxcsr,
            ..Default::default()
        }
    }
}

/// One vCPU's state, in the order a restore sets it (`super::vcpu`).
#[derive(Serialize, Deserialize)]
pub struct VcpuState {
    /// KVM_GET_MP_STATE.
    pub mp_state: kvm_mp_state,
    /// KVM_GET_REGS.
    pub regs: kvm_regs,
    /// KVM_GET_SREGS.
    pub sregs: kvm_sregs,
    /// KVM_GET_FPU.
    pub fpu: FpuState,
    /// KVM_GET_XSAVE, where KVM has `KVM_CAP_XSAVE`.
    pub xsave: Option<kvm_xsave>,
    /// KVM_GET_XCRS, where KVM has `KVM_CAP_XCRS`.
    pub xcrs: Option<kvm_xcrs>,
    /// KVM_GET_DEBUGREGS.
    pub debugregs: kvm_debugregs,
    /// KVM_GET_LAPIC.
    pub lapic: kvm_lapic_state,
    /// The MSRs KVM read back (`super::vcpu::msrs_to_save`); one it refused is not listed.
    pub msrs: Vec<MsrEntry>,
    /// KVM_GET_VCPU_EVENTS (pending exceptions, interrupts, NMIs): set last.
    pub events: kvm_vcpu_events,
}

impl std::fmt::Debug for VcpuState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VcpuState")
            .field("rip", &format_args!("{:#x}", self.regs.rip))
            .field("mp_state", &self.mp_state.mp_state)
            .field("xsave", &self.xsave.is_some())
            .field("msrs", &self.msrs.len())
            .finish_non_exhaustive()
    }
}

/// The VM-wide KVM state: the in-kernel irqchip, the PIT and the KVM clock.
#[derive(Serialize, Deserialize)]
pub struct VmWideState {
    /// KVM_GET_IRQCHIP of the master PIC.
    pub pic_master: kvm_irqchip,
    /// KVM_GET_IRQCHIP of the slave PIC.
    pub pic_slave: kvm_irqchip,
    /// KVM_GET_IRQCHIP of the IOAPIC.
    pub ioapic: kvm_irqchip,
    /// KVM_GET_PIT2.
    pub pit: kvm_pit_state2,
    /// KVM_GET_CLOCK.
    pub clock: kvm_clock_data,
}

impl std::fmt::Debug for VmWideState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmWideState")
            .field("clock", &self.clock.clock)
            .finish_non_exhaustive()
    }
}

/// Everything a snapshot's state file holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct VmState {
    /// The config facts a restore must match.
    pub config: ConfigFacts,
    /// Guest RAM regions, in memory-file order.
    pub regions: Vec<RegionState>,
    /// One state per vCPU, by index.
    pub vcpus: Vec<VcpuState>,
    /// Irqchip, PIT, clock.
    pub vm: VmWideState,
    /// The virtio devices, in config order (`crate::virtio::persist`).
    pub devices: Vec<DeviceState>,
}

impl VmState {
    /// Bytes of guest RAM the memory file must hold.
    pub fn memory_bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.size).sum()
    }

    /// The checks that need no KVM: vCPU count, MSR count, no MSR a save leaves out
    /// (`super::vcpu::excluded`: the PMU's and VMX's), regions that are exactly the
    /// layout of `config.mem_mib`, and every device against those regions
    /// ([`validate_devices`]).
    pub fn validate(&self) -> Result<(), InvalidState> {
        let c = &self.config;
        if c.vcpus == 0 || c.vcpus > MAX_CPUS {
            return Err(InvalidState::VcpuCount(c.vcpus));
        }
        if self.vcpus.len() != usize::from(c.vcpus) {
            return Err(InvalidState::VcpuStates {
                expected: c.vcpus,
                found: self.vcpus.len(),
            });
        }
        if let Some((vcpu, v)) = self
            .vcpus
            .iter()
            .enumerate()
            .find(|(_, v)| v.msrs.len() > MAX_MSRS)
        {
            return Err(InvalidState::TooManyMsrs {
                vcpu,
                count: v.msrs.len(),
            });
        }
        for (vcpu, v) in self.vcpus.iter().enumerate() {
            if let Some(m) = v.msrs.iter().find(|m| excluded(m.index)) {
                return Err(InvalidState::ExcludedMsr {
                    vcpu,
                    index: m.index,
                });
            }
        }
        check_regions(&self.regions, c.mem_mib)?;
        validate_devices(&self.devices, &self.regions).map_err(InvalidState::Device)
    }
}

/// `regions` are valid ranges, in order, disjoint, and exactly the layout of `mem_mib`.
pub fn check_regions(regions: &[RegionState], mem_mib: u32) -> Result<(), InvalidState> {
    let mut end_of_previous = 0u64;
    for (index, r) in regions.iter().enumerate() {
        let end = r.guest_addr.checked_add(r.size).filter(|_| r.size > 0);
        let Some(end) = end else {
            return Err(InvalidState::RegionRange {
                index,
                start: r.guest_addr,
                size: r.size,
            });
        };
        if index > 0 && r.guest_addr < end_of_previous {
            return Err(InvalidState::RegionOverlap {
                index,
                start: r.guest_addr,
            });
        }
        end_of_previous = end;
    }
    let layout = MemoryLayout::new(mem_mib).map_err(|_| InvalidState::MemorySize(mem_mib))?;
    let same = layout.regions.len() == regions.len()
        && layout
            .regions
            .iter()
            .zip(regions)
            .all(|(l, r)| l.start == r.guest_addr && l.len == r.size);
    if !same {
        return Err(InvalidState::RegionsOutsideLayout { mem_mib });
    }
    Ok(())
}

/// The regions of `layout`, as saved.
pub fn regions_of(layout: &MemoryLayout) -> Vec<RegionState> {
    layout
        .regions
        .iter()
        .map(|r| RegionState {
            guest_addr: r.start,
            size: r.len,
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A state with recognisable values in every part (no KVM involved).
    pub(crate) fn sample(vcpus: u8, mem_mib: u32) -> VmState {
        let vcpu = |i: u8| {
            let mut regs = kvm_regs {
                rip: 0x10_0000 + u64::from(i),
                rax: 0x1234_5678_9abc_def0,
                ..Default::default()
            };
            regs.rflags = 2;
            let mut lapic = kvm_lapic_state { regs: [0; 1024] };
            lapic.regs[0x20] = i as _;
            let mut xsave = kvm_xsave::default();
            xsave.region[0] = 0x37f;
            VcpuState {
                mp_state: kvm_mp_state { mp_state: 0 },
                regs,
                sregs: kvm_sregs {
                    efer: 0xd01,
                    ..Default::default()
                },
                fpu: FpuState {
                    fcw: 0x37f,
                    mxcsr: 0x1f80,
                    ..Default::default()
                },
                xsave: Some(xsave),
                xcrs: Some(kvm_xcrs {
                    nr_xcrs: 1,
                    ..Default::default()
                }),
                debugregs: kvm_debugregs::default(),
                lapic,
                msrs: vec![
                    MsrEntry {
                        index: 0x10,
                        data: 42,
                    },
                    MsrEntry {
                        index: 0xc000_0080,
                        data: 0xd01,
                    },
                ],
                events: kvm_vcpu_events::default(),
            }
        };
        let layout = MemoryLayout::new(mem_mib).unwrap();
        VmState {
            config: ConfigFacts {
                vcpus,
                mem_mib,
                cpu_profile: CpuProfile::Baseline,
            },
            regions: regions_of(&layout),
            vcpus: (0..vcpus).map(vcpu).collect(),
            vm: VmWideState {
                pic_master: kvm_irqchip::default(),
                pic_slave: kvm_irqchip {
                    chip_id: 1,
                    ..Default::default()
                },
                ioapic: kvm_irqchip {
                    chip_id: 2,
                    ..Default::default()
                },
                pit: kvm_pit_state2::default(),
                clock: kvm_clock_data {
                    clock: 123_456_789,
                    ..Default::default()
                },
            },
            devices: vec![crate::virtio::persist::tests::sample_rng()],
        }
    }

    #[test]
    fn sample_is_valid_and_fpu_converts_both_ways() {
        sample(2, 16).validate().unwrap();
        let f = FpuState {
            fcw: 0x37f,
            xmm: [[7; 16]; 16],
            last_ip: 9,
            ..Default::default()
        };
        assert_eq!(FpuState::from(&kvm_fpu::from(&f)), f);
    }

    #[test]
    fn vcpu_counts_are_checked() {
        let mut s = sample(1, 16);
        s.config.vcpus = 0;
        assert_eq!(s.validate(), Err(InvalidState::VcpuCount(0)));
        s.config.vcpus = MAX_CPUS + 1;
        assert_eq!(s.validate(), Err(InvalidState::VcpuCount(MAX_CPUS + 1)));
        s.config.vcpus = 2;
        assert_eq!(
            s.validate(),
            Err(InvalidState::VcpuStates {
                expected: 2,
                found: 1
            })
        );
        let mut s = sample(1, 16);
        s.vcpus[0].msrs = vec![MsrEntry { index: 1, data: 0 }; MAX_MSRS + 1];
        assert!(matches!(
            s.validate(),
            Err(InvalidState::TooManyMsrs { vcpu: 0, .. })
        ));
    }

    /// A state file that lists a PMU or VMX MSR (which a save never writes) is refused, so a
    /// restore never hands KVM one: filtered on restore as on save.
    #[test]
    fn a_pmu_or_vmx_msr_in_the_state_is_refused() {
        for index in [
            0xc001_0000,
            0xc001_0007,
            0xc001_0200,
            0xc001_020b,
            0x480,
            0x491,
        ] {
            let mut s = sample(2, 16);
            s.vcpus[1].msrs.push(MsrEntry { index, data: 1 });
            assert_eq!(
                s.validate(),
                Err(InvalidState::ExcludedMsr { vcpu: 1, index }),
                "{index:#x}"
            );
        }
        // Their neighbours are ordinary MSRs.
        for index in [0xc001_0008, 0xc001_020c, 0x47f, 0x492] {
            let mut s = sample(2, 16);
            s.vcpus[1].msrs.push(MsrEntry { index, data: 1 });
            assert_eq!(s.validate(), Ok(()), "{index:#x}");
        }
    }

    #[test]
    fn regions_must_be_the_layout() {
        let r = |guest_addr, size| RegionState { guest_addr, size };
        let mib = 1 << 20;
        assert_eq!(check_regions(&[r(0, 16 * mib)], 16), Ok(()));
        assert_eq!(
            check_regions(&[r(0, 8 * mib), r(4 * mib, 8 * mib)], 16),
            Err(InvalidState::RegionOverlap {
                index: 1,
                start: 4 * mib
            })
        );
        assert_eq!(
            check_regions(&[r(u64::MAX, 2)], 16),
            Err(InvalidState::RegionRange {
                index: 0,
                start: u64::MAX,
                size: 2
            })
        );
        assert!(matches!(
            check_regions(&[r(0, 0)], 16),
            Err(InvalidState::RegionRange { .. })
        ));
        // Larger than the layout, or in the wrong place.
        assert_eq!(
            check_regions(&[r(0, 32 * mib)], 16),
            Err(InvalidState::RegionsOutsideLayout { mem_mib: 16 })
        );
        assert_eq!(
            check_regions(&[r(0, 8 * mib), r(8 * mib, 8 * mib)], 16),
            Err(InvalidState::RegionsOutsideLayout { mem_mib: 16 })
        );
        assert_eq!(
            check_regions(&[], 16),
            Err(InvalidState::RegionsOutsideLayout { mem_mib: 16 })
        );
        assert_eq!(
            check_regions(&[r(0, mib)], 1),
            Err(InvalidState::MemorySize(1))
        );
        // Above 3.25 GiB the layout has two regions, and both must be there.
        let big = regions_of(&MemoryLayout::new(4096).unwrap());
        assert_eq!(big.len(), 2);
        assert_eq!(check_regions(&big, 4096), Ok(()));
        assert!(check_regions(&big[..1], 4096).is_err());
    }
}
