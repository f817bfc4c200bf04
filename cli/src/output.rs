//! Output formatting: aligned text tables and JSON.

use std::io::{self, Write};

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
    io::stdout().lock().write_all(t.render().as_bytes())
}

/// Prints a value as pretty JSON to stdout.
pub fn print_json(v: &serde_json::Value) -> io::Result<()> {
    let mut out = io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v)?;
    out.write_all(b"\n")
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
