//! A flat GDT for 64-bit mode and the matching KVM segment descriptors.

use kvm_bindings::kvm_segment;

/// GDT entries: null, 64-bit code, data, TSS (a placeholder KVM needs for TR).
pub const GDT: [u64; 4] = [
    0,
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x808b, 0, 0xfffff),
];
/// Selector of the code segment.
pub const CODE_SELECTOR: u16 = 0x08;
/// Selector of the data segment.
pub const DATA_SELECTOR: u16 = 0x10;
/// Selector of the TSS.
pub const TSS_SELECTOR: u16 = 0x18;

/// Encode a descriptor from flags (access byte in bits 0..8, flags nibble in 12..16),
/// base and limit.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << 32)
        | ((flags as u64 & 0xf0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << 32)
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// Decode descriptor `index` of `table` into what KVM_SET_SREGS expects.
pub fn kvm_segment_from(table: &[u64], index: usize) -> kvm_segment {
    let e = table.get(index).copied().unwrap_or(0);
    let base = ((e >> 16) & 0xff_ffff) | ((e >> 32) & 0xff00_0000);
    let limit_raw = (e & 0xffff) | ((e >> 32) & 0xf_0000);
    let g = ((e >> 55) & 1) as u8;
    // With 4 KiB granularity the effective limit covers whole pages.
    let limit = if g == 1 {
        (limit_raw << 12) | 0xfff
    } else {
        limit_raw
    };
    let type_ = ((e >> 40) & 0xf) as u8;
    let present = ((e >> 47) & 1) as u8;
    kvm_segment {
        base,
        limit: limit as u32,
        selector: (index * 8) as u16,
        type_,
        present,
        dpl: ((e >> 45) & 3) as u8,
        db: ((e >> 54) & 1) as u8,
        s: ((e >> 44) & 1) as u8,
        l: ((e >> 53) & 1) as u8,
        g,
        avl: ((e >> 52) & 1) as u8,
        unusable: u8::from(present == 0),
        padding: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_well_known_flat_descriptors() {
        assert_eq!(GDT[1], 0x00af_9b00_0000_ffff);
        assert_eq!(GDT[2], 0x00cf_9300_0000_ffff);
        assert_eq!(GDT[3], 0x008f_8b00_0000_ffff);
    }

    #[test]
    fn decodes_code64_segment() {
        let cs = kvm_segment_from(&GDT, 1);
        assert_eq!(cs.selector, CODE_SELECTOR);
        assert_eq!(
            (cs.l, cs.db, cs.g, cs.present, cs.s, cs.type_),
            (1, 0, 1, 1, 1, 0xb)
        );
        assert_eq!(cs.limit, 0xffff_ffff);
        let ds = kvm_segment_from(&GDT, 2);
        assert_eq!((ds.l, ds.db, ds.type_), (0, 1, 3));
        let tss = kvm_segment_from(&GDT, 3);
        assert_eq!((tss.selector, tss.s, tss.type_), (TSS_SELECTOR, 0, 0xb));
        assert_eq!(kvm_segment_from(&GDT, 9).unusable, 1);
    }
}
