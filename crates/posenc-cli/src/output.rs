//! Readable tables for the terminal, and result files checked before the
//! work and written atomically.

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

/// Formats a number compactly with `prec` decimals (the report's format).
pub use posenc_report::num;

use crate::{CliError, CliResult};

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Checks, before any work, that a result file `path` (given as `flag`)
/// can be written (`posenc_run::check_writable`). Errors name the flag and
/// the path.
pub fn check_writable(path: &Path, flag: &str) -> CliResult {
    Ok(posenc_run::check_writable(path, flag)?)
}

/// Writes `bytes` to `path` atomically: into a temporary file beside it,
/// then renamed over it, so that `path` holds either its old content or
/// the whole new one. Errors name the path.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> CliResult {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = parent_of(path).join(format!(".posenc-{}-{name}", std::process::id()));
    let fail = |e: std::io::Error| CliError(format!("{}: {e}", path.display()));
    if let Err(e) = std::fs::write(&tmp, bytes) {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        fail(e)
    })
}

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

/// The progress bar of a long library call ([`posenc_run::Progress`]):
/// the call's first report prints its description (when `announce`) and
/// starts a bar of that many units drawn by the indicatif `template`
/// (hidden when `hidden`); each later report moves it.
pub struct RunBar {
    bar: Option<ProgressBar>,
    template: &'static str,
    hidden: bool,
    announce: bool,
}

impl RunBar {
    /// A bar not started yet.
    pub fn new(template: &'static str, hidden: bool, announce: bool) -> Self {
        RunBar {
            bar: None,
            template,
            hidden,
            announce,
        }
    }

    /// Draws `p`; always `true` (go on).
    pub fn report(&mut self, p: posenc_run::Progress<'_>) -> bool {
        match &self.bar {
            None => {
                if self.announce {
                    eprintln!("{}", p.what);
                }
                self.bar = Some(if self.hidden {
                    ProgressBar::hidden()
                } else {
                    progress_bar(p.total as u64, self.template)
                });
            }
            Some(b) => {
                b.set_message(p.what.to_string());
                b.set_position(p.done as u64);
            }
        }
        true
    }

    /// Clears the bar from the terminal.
    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

/// A progress bar of `total` steps drawn by the indicatif `template`.
fn progress_bar(total: u64, template: &str) -> ProgressBar {
    let b = ProgressBar::new(total);
    b.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    b
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
    fn result_files_are_checked_first_and_replaced_whole() {
        let tmp = tempfile::Builder::new()
            .prefix("posenc-output-")
            .tempdir()
            .unwrap();
        let dir = tmp.path();
        let missing = dir.join("no-such-dir").join("loss.svg");
        let e = check_writable(&missing, "--out").unwrap_err().0;
        assert!(e.starts_with("--out ") && e.contains("no-such-dir"), "{e}");
        let e = check_writable(Path::new("/proc/loss.svg"), "--out")
            .unwrap_err()
            .0;
        assert!(e.contains("/proc/loss.svg"), "{e}");
        let out = dir.join("loss.svg");
        check_writable(&out, "--out").unwrap();
        write_atomic(&out, b"old").unwrap();
        write_atomic(&out, b"new").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
        let left: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
    }

    #[test]
    fn numbers_are_compact() {
        assert_eq!(num(0.0, 3), "0");
        assert_eq!(num(0.5, 3), "0.500");
        assert_eq!(num(1e-7, 2), "1.00e-7");
    }
}
