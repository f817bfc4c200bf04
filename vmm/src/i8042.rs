//! A minimal i8042 keyboard controller: enough for the kernel's probe, and the CPU reset line.
//!
//! Writing command 0xfe to port 0x64 pulses the reset line: with `reboot=k` this is how the guest
//! reboots (and powers off, since a reset ends the VM). The device is mapped at 0x60..0x65;
//! offset 0 is the data port, offset 4 the status/command port.

use std::sync::Arc;

use crate::bus::BusDevice;

/// Base port.
pub const I8042_BASE: u64 = 0x60;
/// Ports covered (0x60..=0x64).
pub const I8042_LEN: u64 = 5;

const DATA: u64 = 0;
const CMD: u64 = 4;

const CMD_READ_CTR: u8 = 0x20;
const CMD_WRITE_CTR: u8 = 0x60;
const CMD_SELF_TEST: u8 = 0xaa;
const CMD_KBD_TEST: u8 = 0xab;
const CMD_RESET: u8 = 0xfe;

const STATUS_OBF: u8 = 0x01;
const STATUS_SYS: u8 = 0x04;
const STATUS_CMD: u8 = 0x08;

/// Called when the guest pulls the reset line.
pub type ResetCallback = Arc<dyn Fn() + Send + Sync>;

/// The controller.
pub struct I8042 {
    on_reset: ResetCallback,
    ctr: u8,
    output: Option<u8>,
    expect_ctr: bool,
    last_cmd: u8,
}

impl I8042 {
    /// A controller calling `on_reset` on a reset command.
    pub fn new(on_reset: ResetCallback) -> Self {
        Self {
            on_reset,
            ctr: 0x45,
            output: None,
            expect_ctr: false,
            last_cmd: 0,
        }
    }

    fn status(&self) -> u8 {
        let mut s = STATUS_SYS;
        if self.output.is_some() {
            s |= STATUS_OBF;
        }
        if self.last_cmd != 0 {
            s |= STATUS_CMD;
        }
        s
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let v = match offset {
            DATA => self.output.take().unwrap_or(0),
            CMD => self.status(),
            _ => 0,
        };
        data.fill(0);
        if let Some(first) = data.first_mut() {
            *first = v;
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&v) = data.first() else { return };
        match offset {
            CMD => {
                self.last_cmd = v;
                match v {
                    CMD_RESET => (self.on_reset)(),
                    CMD_READ_CTR => self.output = Some(self.ctr),
                    CMD_WRITE_CTR => self.expect_ctr = true,
                    CMD_SELF_TEST => self.output = Some(0x55),
                    CMD_KBD_TEST => self.output = Some(0x00),
                    _ => {}
                }
            }
            DATA => {
                self.last_cmd = 0;
                if self.expect_ctr {
                    self.ctr = v;
                    self.expect_ctr = false;
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn dev() -> (I8042, Arc<AtomicU32>) {
        let n = Arc::new(AtomicU32::new(0));
        let n2 = n.clone();
        (
            I8042::new(Arc::new(move || {
                n2.fetch_add(1, Ordering::SeqCst);
            })),
            n,
        )
    }

    #[test]
    fn reset_command_calls_back_once() {
        let (mut d, n) = dev();
        d.write(DATA, &[0xfe]);
        assert_eq!(
            n.load(Ordering::SeqCst),
            0,
            "0xfe on the data port is not a reset"
        );
        d.write(CMD, &[0xfe]);
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn ctr_roundtrip_and_self_test() {
        let (mut d, _) = dev();
        let mut b = [0u8; 1];
        d.read(CMD, &mut b);
        assert_eq!(b[0] & STATUS_OBF, 0);
        d.write(CMD, &[CMD_WRITE_CTR]);
        d.write(DATA, &[0x21]);
        d.write(CMD, &[CMD_READ_CTR]);
        d.read(CMD, &mut b);
        assert_ne!(b[0] & STATUS_OBF, 0);
        d.read(DATA, &mut b);
        assert_eq!(b[0], 0x21);
        d.write(CMD, &[CMD_SELF_TEST]);
        d.read(DATA, &mut b);
        assert_eq!(b[0], 0x55);
        d.read(CMD, &mut b);
        assert_eq!(b[0] & STATUS_OBF, 0);
    }
}
