//! Readable tables for the terminal.

/// Formats a number compactly with `prec` decimals (the report's format).
pub use posenc_report::num;

/// Renders rows of cells as an aligned text table with a header line.
pub fn table(header: &[String], rows: &[Vec<String>]) -> String {
    let cols = header
        .len()
        .max(rows.iter().map(Vec::len).max().unwrap_or(0));
    let mut width = vec![0usize; cols];
    for r in std::iter::once(header).chain(rows.iter().map(|r| r.as_slice())) {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let line = |r: &[String]| -> String {
        let cells: Vec<String> = (0..cols)
            .map(|i| {
                let c = r.get(i).map(String::as_str).unwrap_or("");
                format!("{c:>w$}", w = width[i])
            })
            .collect();
        cells.join("  ").trim_end().to_string()
    };
    let mut out = String::new();
    out.push_str(&line(header));
    out.push('\n');
    out.push_str(
        &width
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  "),
    );
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let t = table(
            &["a".into(), "bb".into()],
            &[
                vec!["1".into(), "22".into()],
                vec!["333".into(), "4".into()],
            ],
        );
        assert_eq!(t, "  a  bb\n---  --\n  1  22\n333   4\n");
    }

    #[test]
    fn numbers_are_compact() {
        assert_eq!(num(0.0, 3), "0");
        assert_eq!(num(0.5, 3), "0.500");
        assert_eq!(num(1e-7, 2), "1.00e-7");
    }
}
