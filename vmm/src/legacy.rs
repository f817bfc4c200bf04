//! Legacy ports the kernel pokes that need an answer but no behavior.
//!
//! - 0x80 (POST code / I/O delay): writes ignored.
//! - 0x70/0x71 (CMOS/RTC): reads return zero (no valid RTC; the kernel falls back quietly).
//! - 0xcf8..0xcff (PCI configuration mechanism #1): reads return all ones (no PCI bus).
//!
//! The PIC, PIT and speaker ports are handled by KVM itself.

use crate::bus::BusDevice;

/// What a [`Sink`] device reads as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadValue {
    /// All zero bytes.
    Zeros,
    /// All 0xff bytes.
    Ones,
}

/// A device that absorbs writes and reads as a constant.
#[derive(Debug)]
pub struct Sink(pub ReadValue);

impl BusDevice for Sink {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(match self.0 {
            ReadValue::Zeros => 0,
            ReadValue::Ones => 0xff,
        });
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {}
}

/// A port whose write makes the vCPU thread that took the exit call `socket`, which its
/// seccomp filter does not allow (builds with the `test-hooks` feature only: the tests' way to
/// prove a vCPU thread's forbidden system call kills the VM process).
#[cfg(feature = "test-hooks")]
pub const TEST_FORBIDDEN_SYSCALL_PORT: u64 = 0x81;

/// The device at [`TEST_FORBIDDEN_SYSCALL_PORT`] (`test-hooks` only).
#[cfg(feature = "test-hooks")]
#[derive(Debug)]
pub struct ForbiddenSyscall;

#[cfg(feature = "test-hooks")]
impl BusDevice for ForbiddenSyscall {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {
        // The vCPU filter kills the process here (socket(2) is the device control thread's).
        let _ = std::os::unix::net::UnixDatagram::unbound();
    }
}

/// (base, len, read value) of every absorbed port range.
pub const ABSORBED_PORTS: &[(u64, u64, ReadValue)] = &[
    (0x80, 1, ReadValue::Zeros),
    (0x70, 2, ReadValue::Zeros),
    (0xcf8, 8, ReadValue::Ones),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinks_read_constants() {
        let mut b = [7u8; 4];
        Sink(ReadValue::Ones).read(0, &mut b);
        assert_eq!(b, [0xff; 4]);
        Sink(ReadValue::Zeros).read(1, &mut b);
        assert_eq!(b, [0; 4]);
    }
}
