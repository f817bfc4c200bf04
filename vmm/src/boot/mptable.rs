//! A minimal Intel MultiProcessor Specification 1.4 table (no ACPI in our guests).
//!
//! It tells the kernel how many CPUs exist (one processor entry per vCPU, APIC id = index), where
//! the IOAPIC is, that ISA IRQ n is IOAPIC pin n, and that LINT0/LINT1 carry ExtINT/NMI. It lives
//! in the EBDA (0x9fc00), which the kernel scans, and the e820 map marks reserved.

use vm_memory::{Bytes, GuestAddress};

use crate::layout::{EBDA_START, IOAPIC_ADDR, LAPIC_ADDR, LEGACY_HOLE_START, MAX_GSI};
use crate::memory::GuestMemoryMmap;

/// Most vCPUs whose entries fit in the EBDA.
pub const MAX_CPUS: u8 = 32;

const FLOATING_LEN: usize = 16;
const HEADER_LEN: usize = 44;
const APIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;

/// Errors of writing the table.
#[derive(Debug, thiserror::Error)]
pub enum MpTableError {
    /// Too many vCPUs for the EBDA.
    #[error("{0} vCPUs do not fit in the MP table (max {MAX_CPUS})")]
    TooManyCpus(u8),
    /// No vCPU at all.
    #[error("the MP table needs at least one vCPU")]
    NoCpus,
    /// Guest memory write failed.
    #[error("cannot write the MP table")]
    Write(#[source] vm_memory::GuestMemoryError),
}

fn checksum(bytes: &[u8]) -> u8 {
    let sum = bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b));
    0u8.wrapping_sub(sum)
}

/// Build the table bytes (floating pointer followed by the configuration table) for `cpus`
/// processors, to be placed at `base`.
pub fn build(cpus: u8, base: u64) -> Result<Vec<u8>, MpTableError> {
    if cpus == 0 {
        return Err(MpTableError::NoCpus);
    }
    if cpus > MAX_CPUS {
        return Err(MpTableError::TooManyCpus(cpus));
    }
    let ioapic_id = cpus;
    let mut entries: Vec<u8> = Vec::new();
    let mut count: u16 = 0;
    for id in 0..cpus {
        let flags = if id == 0 { 0x3 } else { 0x1 }; // enabled, BSP
        entries.extend_from_slice(&[0, id, APIC_VERSION, flags]);
        entries.extend_from_slice(&0x600u32.to_le_bytes()); // family 6 signature
        entries.extend_from_slice(&0x201u32.to_le_bytes()); // FPU | APIC
        entries.extend_from_slice(&[0; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[1, 0]);
    entries.extend_from_slice(b"ISA   ");
    count += 1;
    entries.extend_from_slice(&[2, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend_from_slice(&(IOAPIC_ADDR as u32).to_le_bytes());
    count += 1;
    for irq in 0..=MAX_GSI as u8 {
        // type 3 (I/O interrupt), INT, default polarity/trigger, ISA bus, irq -> pin irq.
        entries.extend_from_slice(&[3, 0, 0, 0, 0, irq, ioapic_id, irq]);
        count += 1;
    }
    // type 4 (local interrupt): ExtINT -> LINT0 of all, NMI -> LINT1 of all.
    entries.extend_from_slice(&[4, 3, 0, 0, 0, 0, 0xff, 0]);
    entries.extend_from_slice(&[4, 1, 0, 0, 0, 0, 0xff, 1]);
    count += 2;

    let table_len = HEADER_LEN + entries.len();
    let mut header = Vec::with_capacity(table_len);
    header.extend_from_slice(b"PCMP");
    header.extend_from_slice(&(table_len as u16).to_le_bytes());
    header.extend_from_slice(&[4, 0]); // spec rev 1.4, checksum placeholder
    header.extend_from_slice(b"VMMCORE ");
    header.extend_from_slice(b"MICROVM     ");
    header.extend_from_slice(&0u32.to_le_bytes()); // OEM table pointer
    header.extend_from_slice(&0u16.to_le_bytes()); // OEM table size
    header.extend_from_slice(&count.to_le_bytes());
    header.extend_from_slice(&(LAPIC_ADDR as u32).to_le_bytes());
    header.extend_from_slice(&[0; 4]); // extended table length/checksum, reserved
    header.extend_from_slice(&entries);
    header[7] = checksum(&header);

    let table_addr = base + FLOATING_LEN as u64;
    let mut out = Vec::with_capacity(FLOATING_LEN + table_len);
    out.extend_from_slice(b"_MP_");
    out.extend_from_slice(&(table_addr as u32).to_le_bytes());
    out.extend_from_slice(&[1, 4, 0, 0, 0, 0, 0, 0]); // length 1 paragraph, rev 1.4
    out[10] = checksum(&out);
    out.extend_from_slice(&header);
    Ok(out)
}

/// Write the table for `cpus` vCPUs at the EBDA.
pub fn write(mem: &GuestMemoryMmap, cpus: u8) -> Result<(), MpTableError> {
    let bytes = build(cpus, EBDA_START)?;
    debug_assert!(EBDA_START + bytes.len() as u64 <= LEGACY_HOLE_START);
    mem.write_slice(&bytes, GuestAddress(EBDA_START))
        .map_err(MpTableError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_and_sizes() {
        for cpus in [1u8, 2, MAX_CPUS] {
            let t = build(cpus, EBDA_START).unwrap();
            assert!(t.len() as u64 <= LEGACY_HOLE_START - EBDA_START);
            assert_eq!(&t[..4], b"_MP_");
            assert_eq!(t[..16].iter().fold(0u8, |a, b| a.wrapping_add(*b)), 0);
            let ptr = u32::from_le_bytes(t[4..8].try_into().unwrap()) as u64;
            assert_eq!(ptr, EBDA_START + 16);
            let table = &t[16..];
            assert_eq!(&table[..4], b"PCMP");
            let len = u16::from_le_bytes([table[4], table[5]]) as usize;
            assert_eq!(len, table.len());
            assert_eq!(table.iter().fold(0u8, |a, b| a.wrapping_add(*b)), 0);
            let count = u16::from_le_bytes([table[34], table[35]]);
            assert_eq!(count as usize, cpus as usize + 2 + 24 + 2);
            // Processor entries carry APIC ids 0..cpus, the first one is the BSP.
            for id in 0..cpus as usize {
                let e = &table[44 + id * 20..];
                assert_eq!((e[0], e[1] as usize), (0, id));
                assert_eq!(e[3] & 2 != 0, id == 0);
            }
        }
        assert!(matches!(
            build(MAX_CPUS + 1, EBDA_START),
            Err(MpTableError::TooManyCpus(_))
        ));
        assert!(matches!(build(0, EBDA_START), Err(MpTableError::NoCpus)));
    }
}
