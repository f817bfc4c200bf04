//! Output formatting: aligned text tables and JSON, and the CLI's only print macros.
//!
//! A reader that went away (`vm serve … | head -1`, a closed stderr) is not a crash:
//! `println!`/`eprintln!` panic when the write fails (EPIPE) and the process exits 101, so
//! the CLI writes through [`outln!`], [`out!`] and [`errln!`], which drop a failed write
//! (clippy's `print_stdout`/`print_stderr` lints keep the std macros out, see `main.rs`).
//! [`print_table`] and [`print_json`] treat a broken pipe as done.

use std::io::{self, Write};

/// `println!` to stdout, a failed write ignored (see the module docs).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `print!` to stdout, a failed write ignored.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut o = std::io::stdout().lock();
        let _ = write!(o, $($arg)*).and_then(|()| o.flush());
    }};
}

/// `eprintln!`, a failed write ignored.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

pub(crate) use {errln, out, outln};

/// `Ok` for a write that failed only because the reader went away.
fn reader_gone_is_ok(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// A text table with a header row; columns are padded to their widest cell, the last
/// column is not padded.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with the given header.
    pub fn new(header: &[&str]) -> Table {
        Table {
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
        }
    }

    /// Appends a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Renders the table, one line per row, each ending in `\n`.
    pub fn render(&self) -> String {
        let ncols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0usize; ncols];
        for row in &self.rows {
            for (i, c) in row.iter().enumerate() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, c) in row.iter().enumerate() {
                if i + 1 == row.len() {
                    line.push_str(c);
                } else {
                    line.push_str(c);
                    line.extend(std::iter::repeat_n(' ', widths[i] - c.chars().count() + 3));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Prints a table to stdout.
pub fn print_table(t: &Table) -> io::Result<()> {
    reader_gone_is_ok(io::stdout().lock().write_all(t.render().as_bytes()))
}

/// Prints a value as pretty JSON to stdout.
pub fn print_json(v: &serde_json::Value) -> io::Result<()> {
    let mut out = io::stdout().lock();
    let written = serde_json::to_writer_pretty(&mut out, v)
        .map_err(io::Error::from)
        .and_then(|()| out.write_all(b"\n"));
    reader_gone_is_ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&["NAME", "STATE"]);
        t.row(vec!["a-long-name".into(), "running".into()]);
        t.row(vec!["b".into(), "exited".into()]);
        assert_eq!(
            t.render(),
            "NAME          STATE\na-long-name   running\nb             exited\n"
        );
    }
}
