//! The log's writer: one sanitized, bounded record per write, and write errors ignored.
//!
//! A record (one formatted event) reaches the log as one line: every control byte inside it
//! (a newline, an escape, the [`super::METRICS_PREFIX`] separator) is escaped as `\xNN`, so
//! no text — guest-influenced text included — can start a line of its own or forge a metrics
//! reply; it is cut to [`MAX_RECORD`] bytes, so each record is one `write` no larger than a
//! pipe's atomic size and records of different threads never interleave. A failing write (a
//! closed pipe: `EPIPE`; a regular file under `RLIMIT_FSIZE` 0: `EFBIG`; a closed descriptor)
//! loses the record and nothing else: the VMM never panics or exits over its log, unlike the
//! std print macros.

use std::io::{self, Write};

/// The longest record written (bytes, newline included); below `PIPE_BUF` (4096), so one
/// record is one atomic pipe write.
pub const MAX_RECORD: usize = 2048;

/// The marker that ends a record cut at [`MAX_RECORD`].
const CUT: &[u8] = b"...\n";

/// `record` as one log line: control bytes but a final newline escaped, at most
/// [`MAX_RECORD`] bytes, always ending in a newline.
pub fn sanitize(record: &[u8]) -> Vec<u8> {
    let body = record.strip_suffix(b"\n").unwrap_or(record);
    let mut out = Vec::with_capacity(body.len().min(MAX_RECORD) + 1);
    for &b in body {
        let escape = b < 0x20 && b != b'\t' || b == 0x7f;
        let need = if escape { 4 } else { 1 };
        if out.len() + need > MAX_RECORD - 1 {
            out.truncate(MAX_RECORD - CUT.len());
            out.extend_from_slice(CUT);
            return out;
        }
        if escape {
            let _ = write!(out, "\\x{b:02x}");
        } else {
            out.push(b);
        }
    }
    out.push(b'\n');
    out
}

/// Writes each `write` call's bytes to `W` as one [`sanitize`]d record and reports success
/// whatever happened (the caller, the tracing formatter, then never sees an error).
#[derive(Debug)]
pub struct RecordWriter<W: Write> {
    inner: W,
}

impl<W: Write> RecordWriter<W> {
    /// Records to `inner`.
    pub fn new(inner: W) -> Self {
        RecordWriter { inner }
    }
}

impl<W: Write> Write for RecordWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = self.inner.write_all(&sanitize(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = self.inner.flush();
        Ok(())
    }
}

/// Writes `bytes` to this process's stderr as they are, ignoring every error (the raw side
/// channel for lines the VMM builds itself, such as a metrics reply).
pub fn write_raw_stderr(bytes: &[u8]) {
    let _ = io::stderr().lock().write_all(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink that fails every write, as a closed pipe or a file under `RLIMIT_FSIZE` 0 does.
    struct Broken(io::ErrorKind);

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(self.0.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(self.0.into())
        }
    }

    #[test]
    fn a_record_is_one_escaped_line() {
        assert_eq!(sanitize(b"plain\n"), b"plain\n");
        assert_eq!(sanitize(b"no newline"), b"no newline\n");
        assert_eq!(
            sanitize(b"a\nforged line\x1emetrics {}\x1b[31m\n"),
            b"a\\x0aforged line\\x1emetrics {}\\x1b[31m\n"
        );
        assert_eq!(sanitize(b"tab\tkept\n"), b"tab\tkept\n");
    }

    #[test]
    fn a_record_is_bounded() {
        for input in [vec![b'a'; 100_000], vec![b'\n'; 100_000]] {
            let out = sanitize(&input);
            assert!(out.len() <= MAX_RECORD, "{}", out.len());
            assert!(out.ends_with(CUT));
            assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1);
        }
        let fits = vec![b'b'; MAX_RECORD - 1];
        assert_eq!(sanitize(&fits).len(), MAX_RECORD);
    }

    #[test]
    fn write_errors_are_swallowed() {
        for kind in [
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::FileTooLarge,
            io::ErrorKind::Other,
        ] {
            let mut w = RecordWriter::new(Broken(kind));
            assert_eq!(w.write(b"lost\n").unwrap(), 5);
            w.write_all(b"lost too\n").unwrap();
            w.flush().unwrap();
        }
        let mut w = RecordWriter::new(Vec::new());
        w.write_all(b"one\ntwo\n").unwrap();
        assert_eq!(w.inner, b"one\\x0atwo\n");
    }
}
