//! The checksum guest of the snapshot tests, shared by the in-process tests (vmm/tests/
//! snapshot.rs, which read its results from guest memory) and the `vm-vmm` process tests
//! (vmm/tests/process_snapshot.rs, which see only its console: [`console_program`]).

#![allow(dead_code)]

/// Iterations of the loop.
pub const ITERATIONS: u32 = 4096;
/// Where each vCPU waits for the gate.
pub const HALF: u32 = 2048;
/// The gate: the vCPUs pass iteration HALF once this word is not zero.
pub const GATE: u64 = 0x3100;
/// The loop's buffers: vCPU i's at BUFFER + i * 64 KiB.
pub const BUFFER: u64 = 0x20_0000;

/// The guest (assembled from the listing in the comments; every vCPU runs it):
/// vCPU `id` (its APIC id) fills its buffer and hashes it, writes its progress every 256
/// iterations to `RESULT_ADDR + 32*id`, the hash to `+8` and 1 to `+16` when done, then halts.
pub const PROGRAM: &[u8] = &[
    0xb8, 0x01, 0x00, 0x00, 0x00, //             mov eax, 1
    0x0f, 0xa2, //                               cpuid
    0xc1, 0xeb, 0x18, //                         shr ebx, 24          ; id
    0x41, 0x89, 0xd9, //                         mov r9d, ebx
    0x41, 0x89, 0xd8, //                         mov r8d, ebx
    0x41, 0xc1, 0xe0, 0x05, //                   shl r8d, 5           ; result slot
    0x89, 0xdf, //                               mov edi, ebx
    0xc1, 0xe7, 0x10, //                         shl edi, 16
    0x81, 0xc7, 0x00, 0x00, 0x20, 0x00, //       add edi, 0x200000    ; buffer
    0x48, 0xb8, 0x15, 0x7c, 0x4a, 0x7f, 0xb9, 0x79, 0x37, 0x9e, // movabs rax, SEED
    0x4c, 0x01, 0xc8, //                         add rax, r9
    0x48, 0xbb, 0x25, 0x23, 0x22, 0x84, 0xe4, 0x9c, 0xf2, 0xcb, // movabs rbx, FNV_OFFSET
    0x31, 0xc9, //                               xor ecx, ecx
    // loop (0x38):
    0x48, 0xba, 0x2d, 0x7f, 0x95, 0x4c, 0x2d, 0xf4, 0x51, 0x58, // movabs rdx, LCG_A
    0x48, 0x0f, 0xaf, 0xc2, //                   imul rax, rdx
    0x48, 0xba, 0x4f, 0x81, 0x67, 0xf7, 0x7e, 0x7b, 0x05, 0x14, // movabs rdx, LCG_C
    0x48, 0x01, 0xd0, //                         add rax, rdx
    0x89, 0xce, //                               mov esi, ecx
    0x81, 0xe6, 0xff, 0x03, 0x00, 0x00, //       and esi, 1023
    0x48, 0x31, 0x04, 0xf7, //                   xor [rdi+rsi*8], rax
    0x48, 0x8b, 0x14, 0xf7, //                   mov rdx, [rdi+rsi*8]
    0x48, 0x31, 0xd3, //                         xor rbx, rdx
    0x48, 0xba, 0xb3, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, // movabs rdx, FNV_PRIME
    0x48, 0x0f, 0xaf, 0xda, //                   imul rbx, rdx
    0xff, 0xc1, //                               inc ecx
    0xf7, 0xc1, 0xff, 0x00, 0x00, 0x00, //       test ecx, 255
    0x75, 0x07, //                               jnz gate
    0x41, 0x89, 0x88, 0x00, 0x30, 0x00, 0x00, // mov [r8+0x3000], ecx  ; progress
    // gate (0x85):
    0x81, 0xf9, 0x00, 0x08, 0x00, 0x00, //       cmp ecx, HALF
    0x75, 0x0a, //                               jne next
    0x83, 0x3c, 0x25, 0x00, 0x31, 0x00, 0x00, 0x00, // cmp dword [0x3100], 0
    0x74, 0xee, //                               je gate
    // next (0x97):
    0x81, 0xf9, 0x00, 0x10, 0x00, 0x00, //       cmp ecx, ITERATIONS
    0x72, 0x99, //                               jb loop
    0x49, 0x89, 0x98, 0x08, 0x30, 0x00, 0x00, // mov [r8+0x3008], rbx  ; hash
    0x41, 0xc7, 0x80, 0x10, 0x30, 0x00, 0x00, 0x01, 0x00, 0x00,
    0x00, // mov dword [r8+0x3010], 1
    0xfa, 0xf4, 0xeb, 0xfc, //                   idle: cli; hlt; jmp idle
];

/// What vCPU `id` computes, in Rust.
pub fn expected(id: u64) -> u64 {
    let mut buf = [0u64; 1024];
    let mut x = 0x9e37_79b9_7f4a_7c15u64.wrapping_add(id);
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for i in 0..ITERATIONS as usize {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        buf[i & 1023] ^= x;
        h = (h ^ buf[i & 1023]).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// COM1's data port and scratch register.
const COM1: u16 = 0x3f8;
const COM1_SCRATCH: u16 = 0x3ff;

/// Offsets in [`PROGRAM`]: the gate's memory test (`cmp dword [GATE], 0; je gate`, ten
/// bytes), the gate and `next` labels, and the final `cli; hlt`.
const GATE_TEST: usize = 0x8d;
const GATE_LABEL: usize = 0x85;
const NEXT_LABEL: usize = 0x97;

fn rel32(from_end: usize, to: usize) -> [u8; 4] {
    (to as i64 - from_end as i64).to_le_bytes()[..4]
        .try_into()
        .unwrap()
}

/// [`PROGRAM`] for a guest seen through its console only (one vCPU): a prologue sets COM1's
/// scratch register to 1; at iteration [`HALF`] the loop prints `G` once and waits while the
/// scratch register is not 0 — forever in the VM that booted (the test snapshots it there),
/// and not at all in a restored one, whose serial port starts at its reset values (scratch
/// 0, `crate::snapshot` docs); at the end it prints the hash as 16 hex digits and a newline,
/// then resets through the i8042 (the process exits `Ended`). Everything else is the
/// program's own code, byte for byte; the patched bytes are checked first.
pub fn console_program() -> Vec<u8> {
    let mut core = PROGRAM.to_vec();
    assert_eq!(
        &core[GATE_TEST..NEXT_LABEL],
        &[0x83, 0x3c, 0x25, 0x00, 0x31, 0x00, 0x00, 0x00, 0x74, 0xee],
        "the gate's memory test"
    );
    let idle = core.len() - 4;
    assert_eq!(
        &core[idle..],
        &[0xfa, 0xf4, 0xeb, 0xfc],
        "the final idle loop"
    );
    let prologue: &[u8] = &[
        0x66, 0xba, 0xff, 0x03, //   mov dx, COM1_SCRATCH
        0xb0, 0x01, //               mov al, 1
        0xee, //                     out dx, al
        0x45, 0x31, 0xdb, //         xor r11d, r11d   ; 'G' not printed yet
    ];
    let p = prologue.len();
    // Appended after the program: the hex print, then the console gate.
    let print_at = core.len();
    let print: &[u8] = &[
        0x66, 0xba, 0xf8, 0x03, //   mov dx, COM1
        0xb9, 0x10, 0x00, 0x00, 0x00, // mov ecx, 16
        // hex:
        0x48, 0xc1, 0xc3, 0x04, //   rol rbx, 4
        0x88, 0xd8, //               mov al, bl
        0x24, 0x0f, //               and al, 0x0f
        0x04, 0x30, //               add al, '0'
        0x3c, 0x39, //               cmp al, '9'
        0x76, 0x02, //               jbe out
        0x04, 0x27, //               add al, 'a' - '0' - 10
        // out:
        0xee, //                     out dx, al
        0xff, 0xc9, //               dec ecx
        0x75, 0xeb, //               jnz hex
        0xb0, 0x0a, //               mov al, '\n'
        0xee, //                     out dx, al
        0xb0, 0xfe, //               mov al, 0xfe
        0xe6, 0x64, //               out 0x64, al     ; reset
        0xfa, 0xf4, //               cli; hlt
    ];
    let gate_at = print_at + print.len();
    let mut gate = vec![
        0x49, 0x89, 0xc2, //         mov r10, rax     ; the LCG state
        0x4d, 0x85, 0xdb, //         test r11, r11
        0x75, 0x10, //               jnz wait
        0x66, 0xba, 0xf8, 0x03, //   mov dx, COM1
        0xb0, b'G', //               mov al, 'G'
        0xee, //                     out dx, al
        0xb0, 0x0a, //               mov al, '\n'
        0xee, //                     out dx, al
        0x41, 0xbb, 0x01, 0x00, 0x00, 0x00, // mov r11d, 1
        // wait:
        0x66, 0xba, 0xff, 0x03, //   mov dx, COM1_SCRATCH
        0xec, //                     in al, dx
        0x84, 0xc0, //               test al, al
        0x4c, 0x89, 0xd0, //         mov rax, r10     ; flags kept
        0x0f, 0x85, //               jnz gate (rel32)
    ];
    let end = gate_at + gate.len() + 4;
    gate.extend_from_slice(&rel32(end, GATE_LABEL));
    gate.push(0xe9); //              jmp next (rel32)
    gate.extend_from_slice(&rel32(end + 5, NEXT_LABEL));
    // The gate's memory test becomes a jump to the console gate; `cli; hlt` a jump to print.
    let mut jump = vec![0xe9];
    jump.extend_from_slice(&rel32(GATE_TEST + 5, gate_at));
    jump.resize(NEXT_LABEL - GATE_TEST, 0x90);
    core[GATE_TEST..NEXT_LABEL].copy_from_slice(&jump);
    core[idle..idle + 2].copy_from_slice(&[0xeb, 0x02]);
    let mut out = prologue.to_vec();
    out.extend_from_slice(&core);
    out.extend_from_slice(print);
    out.extend_from_slice(&gate);
    debug_assert_eq!(out.len(), p + gate_at + gate.len());
    out
}

/// What the console program prints at the end (vCPU 0's hash).
pub fn console_hash() -> String {
    format!("{:016x}\n", expected(0))
}
