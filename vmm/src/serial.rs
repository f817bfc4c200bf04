//! A 16450-style UART at 0x3f8 (COM1, IRQ 4) whose output goes into a bounded ring buffer.
//!
//! The guest may print without limit; the [`ConsoleRing`] keeps only the newest `capacity`
//! bytes. Output can also be streamed to a writer (flushed per line or per 1 KiB). There is no
//! input. The transmitter is always empty, so "THR empty" interrupts fire right after every
//! write when the guest enabled them.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};

use vm_sync::Lock;
use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;

/// COM1 base port.
pub const COM1_PORT: u64 = 0x3f8;
/// COM1 IRQ.
pub const COM1_IRQ: u32 = 4;
/// Default console ring size.
pub const DEFAULT_RING_BYTES: usize = 64 * 1024;

const DATA: u64 = 0;
const IER: u64 = 1;
const IIR: u64 = 2;
const LCR: u64 = 3;
const MCR: u64 = 4;
const LSR: u64 = 5;
const MSR: u64 = 6;
const SCR: u64 = 7;

const IER_THRI: u8 = 0x02;
const IIR_NONE: u8 = 0x01;
const IIR_THRI: u8 = 0x02;
const LCR_DLAB: u8 = 0x80;
const MCR_LOOP: u8 = 0x10;
const LSR_THRE_TEMT: u8 = 0x60;
/// Modem status with carrier, data set ready and clear to send asserted.
const MSR_DEFAULT: u8 = 0xb0;
const SINK_FLUSH_BYTES: usize = 1024;

/// The newest bytes the guest printed, bounded.
#[derive(Debug)]
pub struct ConsoleRing {
    buf: VecDeque<u8>,
    capacity: usize,
    total: u64,
}

impl ConsoleRing {
    /// A ring keeping at most `capacity` bytes (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            buf: VecDeque::with_capacity(capacity.min(1 << 20)),
            capacity,
            total: 0,
        }
    }

    /// Append a byte, dropping the oldest when full.
    pub fn push(&mut self, b: u8) {
        if self.buf.len() == self.capacity {
            self.buf.pop_front();
        }
        self.buf.push_back(b);
        self.total += 1;
    }

    /// The buffered bytes as (lossy) UTF-8.
    pub fn snapshot(&self) -> String {
        let (a, b) = self.buf.as_slices();
        let mut v = Vec::with_capacity(a.len() + b.len());
        v.extend_from_slice(a);
        v.extend_from_slice(b);
        String::from_utf8_lossy(&v).into_owned()
    }

    /// Bytes currently held.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Bytes ever pushed (including dropped ones).
    pub fn total(&self) -> u64 {
        self.total
    }
}

/// Shared handle to a console ring.
pub type SharedConsole = Arc<Mutex<ConsoleRing>>;

/// The UART.
pub struct Serial {
    console: SharedConsole,
    sink: Option<Box<dyn Write + Send>>,
    pending: Vec<u8>,
    irq: Option<EventFd>,
    ier: u8,
    lcr: u8,
    mcr: u8,
    scr: u8,
    dll: u8,
    dlm: u8,
    thri_pending: bool,
}

impl Serial {
    /// A UART writing into `console`, optionally streaming to `sink`, raising `irq` (an irqfd).
    pub fn new(
        console: SharedConsole,
        sink: Option<Box<dyn Write + Send>>,
        irq: Option<EventFd>,
    ) -> Self {
        Self {
            console,
            sink,
            pending: Vec::new(),
            irq,
            ier: 0,
            lcr: 0,
            mcr: 0,
            scr: 0,
            dll: 12,
            dlm: 0,
            thri_pending: false,
        }
    }

    fn raise_thri(&mut self) {
        if self.ier & IER_THRI != 0 {
            self.thri_pending = true;
            if let Some(irq) = &self.irq
                && let Err(e) = irq.write(1)
            {
                crate::warn_limited!(None, error = %e, "serial: cannot signal interrupt");
            }
        }
    }

    fn emit(&mut self, b: u8) {
        self.console.locked().push(b);
        if self.sink.is_some() {
            self.pending.push(b);
            if b == b'\n' || self.pending.len() >= SINK_FLUSH_BYTES {
                self.flush_sink();
            }
        }
    }

    fn flush_sink(&mut self) {
        if let Some(sink) = self.sink.as_mut() {
            let r = sink.write_all(&self.pending).and_then(|_| sink.flush());
            if let Err(e) = r {
                tracing::warn!(error = %e, "serial: console sink failed; streaming stopped");
                self.sink = None;
            }
        }
        self.pending.clear();
    }

    fn modem_status(&self) -> u8 {
        if self.mcr & MCR_LOOP == 0 {
            return MSR_DEFAULT;
        }
        // Loopback: DTR->DSR, RTS->CTS, OUT1->RI, OUT2->DCD.
        let m = self.mcr;
        ((m & 0x01) << 5) | ((m & 0x02) << 3) | ((m & 0x04) << 4) | ((m & 0x08) << 4)
    }
}

impl Drop for Serial {
    fn drop(&mut self) {
        self.flush_sink();
    }
}

impl BusDevice for Serial {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let dlab = self.lcr & LCR_DLAB != 0;
        let v = match offset {
            DATA if dlab => self.dll,
            DATA => 0,
            IER if dlab => self.dlm,
            IER => self.ier,
            IIR => {
                if self.thri_pending {
                    self.thri_pending = false;
                    IIR_THRI
                } else {
                    IIR_NONE
                }
            }
            LCR => self.lcr,
            MCR => self.mcr,
            LSR => LSR_THRE_TEMT,
            MSR => self.modem_status(),
            SCR => self.scr,
            _ => 0,
        };
        data.fill(0);
        if let Some(first) = data.first_mut() {
            *first = v;
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&v) = data.first() else { return };
        let dlab = self.lcr & LCR_DLAB != 0;
        match offset {
            DATA if dlab => self.dll = v,
            DATA => {
                if self.mcr & MCR_LOOP == 0 {
                    self.emit(v);
                }
                self.raise_thri();
            }
            IER if dlab => self.dlm = v,
            IER => {
                let was = self.ier & IER_THRI;
                self.ier = v & 0x0f;
                if was == 0 {
                    self.raise_thri();
                } else if self.ier & IER_THRI == 0 {
                    self.thri_pending = false;
                }
            }
            LCR => self.lcr = v,
            MCR => self.mcr = v & 0x1f,
            SCR => self.scr = v,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serial(ring: usize) -> (Serial, SharedConsole) {
        let c = Arc::new(Mutex::new(ConsoleRing::new(ring)));
        (Serial::new(c.clone(), None, None), c)
    }

    #[test]
    fn ring_keeps_only_the_newest_bytes() {
        let (mut s, c) = serial(8);
        for b in b"0123456789abcdef" {
            s.write(DATA, &[*b]);
        }
        let ring = c.locked();
        assert_eq!(ring.snapshot(), "89abcdef");
        assert_eq!(ring.len(), 8);
        assert_eq!(ring.total(), 16);
    }

    #[test]
    fn streams_to_sink_per_line() {
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl Write for Sink {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.locked().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let c = Arc::new(Mutex::new(ConsoleRing::new(4)));
        let mut s = Serial::new(c, Some(Box::new(sink.clone())), None);
        for b in b"hello\nwor" {
            s.write(DATA, &[*b]);
        }
        assert_eq!(&*sink.0.locked(), b"hello\n");
        drop(s);
        assert_eq!(&*sink.0.locked(), b"hello\nwor");
    }

    #[test]
    fn registers_behave_like_a_uart() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let c = Arc::new(Mutex::new(ConsoleRing::new(16)));
        let mut s = Serial::new(c.clone(), None, Some(irq.try_clone().unwrap()));
        let mut b = [0u8; 1];
        s.read(LSR, &mut b);
        assert_eq!(b[0], LSR_THRE_TEMT);
        s.read(IIR, &mut b);
        assert_eq!(b[0], IIR_NONE);
        s.write(SCR, &[0xa5]);
        s.read(SCR, &mut b);
        assert_eq!(b[0], 0xa5);
        // Loopback test the kernel's autoconfig does.
        s.write(MCR, &[MCR_LOOP | 0x0a]);
        s.read(MSR, &mut b);
        assert_eq!(b[0] & 0xf0, 0x90);
        s.write(DATA, b"x");
        assert!(
            c.locked().is_empty(),
            "loopback output is not console output"
        );
        s.write(MCR, &[0]);
        // THR-empty interrupt after enabling it and after a write.
        s.write(IER, &[IER_THRI]);
        assert_eq!(irq.read().unwrap(), 1);
        s.read(IIR, &mut b);
        assert_eq!(b[0], IIR_THRI);
        s.read(IIR, &mut b);
        assert_eq!(b[0], IIR_NONE);
        s.write(DATA, b"y");
        assert_eq!(irq.read().unwrap(), 1);
        // Divisor latch.
        s.write(LCR, &[LCR_DLAB]);
        s.write(DATA, &[1]);
        s.read(DATA, &mut b);
        assert_eq!(b[0], 1);
        assert_eq!(c.locked().snapshot(), "y");
    }
}
