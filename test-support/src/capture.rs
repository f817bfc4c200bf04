//! [`Captured`]: an in-memory `Write` that a test keeps a handle on while another thread
//! (a log writer, a reader thread) writes into it.

use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use vm_sync::Lock;

/// A cloneable byte buffer: every clone writes to and reads from the same bytes.
#[derive(Debug, Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Everything written so far, as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.locked()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.locked().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_bytes() {
        let a = Captured::default();
        let mut b = a.clone();
        b.write_all(b"one ").unwrap();
        write!(b, "two").unwrap();
        assert_eq!(a.text(), "one two");
    }
}
