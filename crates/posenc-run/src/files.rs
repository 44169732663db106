//! Result files and directories, checked before any work.

use std::path::{Path, PathBuf};

use crate::{Result, RunError};

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Whether a file can be created in the directory `dir` (a probe file is
/// created and removed).
fn probe_dir(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".posenc-probe-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// `path` if it exists, else its nearest ancestor that does (at the most
/// `.`, even when that does not).
fn nearest_existing(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    while std::fs::symlink_metadata(&existing).is_err() {
        let up = parent_of(&existing);
        if up == existing {
            break;
        }
        existing = up;
    }
    existing
}

/// `/proc` or `/sys` when `dir` (its nearest existing ancestor, links
/// resolved) is under one of them.
fn system_dir(dir: &Path) -> Option<&'static str> {
    let existing = nearest_existing(dir);
    let real = existing.canonicalize().unwrap_or(existing);
    ["/proc", "/sys"].into_iter().find(|s| real.starts_with(s))
}

/// Checks, before any work, that a result file `path` (given as `flag`)
/// can be written: its directory exists, is not under `/proc` or `/sys`,
/// and takes a new file (a probe file is created and removed), and `path`
/// is not a directory. Errors name the flag and the path.
///
/// # Errors
/// [`RunError::Invalid`], `"{flag} {path}: why"`.
pub fn check_writable(path: &Path, flag: &str) -> Result<()> {
    let dir = parent_of(path);
    let fail = |why: String| RunError::Invalid(format!("{flag} {}: {why}", path.display()));
    if let Some(system) = system_dir(&dir) {
        return Err(fail(format!("is under {system}: not a place for results")));
    }
    if path.is_dir() {
        return Err(fail("is a directory".into()));
    }
    takes_files(&dir, fail)
}

/// Checks that `dir` is a directory that takes a new file (a probe file is
/// created and removed); `fail` words each reason as an error.
fn takes_files(dir: &Path, fail: impl Fn(String) -> RunError) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(fail(format!("{} is not a directory", dir.display()))),
        Err(e) => {
            return Err(fail(format!(
                "the directory {} cannot be used: {e}",
                dir.display()
            )))
        }
    }
    probe_dir(dir).map_err(|e| fail(format!("cannot create a file in {}: {e}", dir.display())))
}

/// Checks, before any work, that a log `path` (given as `flag`), read back
/// and appended to, is a regular file or can be created
/// ([`check_writable`]), and is not under `/proc` or `/sys`.
///
/// # Errors
/// [`RunError::Invalid`], `"{flag} {path}: why"`; a special file's.
pub fn check_log(path: &Path, flag: &str) -> Result<()> {
    if std::fs::symlink_metadata(path).is_err() {
        return check_writable(path, flag);
    }
    if let Some(system) = system_dir(path) {
        return Err(RunError::Invalid(format!(
            "{flag} {}: is under {system}: not a place for results",
            path.display()
        )));
    }
    posenc_models::input::check_regular(path)
        .map_err(|e| RunError::Invalid(format!("{flag}: {e}")))?;
    Ok(())
}

/// Checks, before any work, that `dir` (given as `flag`) can be an output
/// directory: it is a directory or does not exist yet, it is not under
/// `/proc` or `/sys`, and its nearest existing ancestor (itself if it
/// exists) is a directory that takes a new file.
///
/// # Errors
/// [`RunError::Invalid`], `"{flag} {dir}: why"`.
pub fn check_out_dir(dir: &Path, flag: &str) -> Result<()> {
    let fail = |why: String| RunError::Invalid(format!("{flag} {}: {why}", dir.display()));
    if let Ok(m) = std::fs::metadata(dir) {
        if !m.is_dir() {
            return Err(fail("exists and is not a directory".into()));
        }
    }
    if let Some(system) = system_dir(dir) {
        return Err(fail(format!("is under {system}: not a place for results")));
    }
    takes_files(&nearest_existing(dir), fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message of a check that must fail, which must start with
    /// `start`.
    fn refused(r: Result<()>, start: &str) -> String {
        let e = r.unwrap_err().to_string();
        assert!(e.starts_with(start), "{e}");
        e
    }

    #[test]
    fn output_directories_are_checked_first() {
        let tmp = tempfile::Builder::new()
            .prefix("posenc-run-files-")
            .tempdir()
            .unwrap();
        let dir = tmp.path();
        check_out_dir(&dir.join("a/b/c"), "--out").unwrap();
        let file = dir.join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = refused(check_out_dir(&file, "--out"), "--out ");
        assert!(e.contains("not a directory"), "{e}");
        let e = refused(check_out_dir(&file.join("sub"), "--out"), "--out ");
        assert!(e.contains("not a directory"), "{e}");
        for p in ["/proc/posenc-x", "/sys/kernel/posenc"] {
            refused(check_out_dir(Path::new(p), "--out"), &format!("--out {p}"));
        }
        let log = Path::new("/proc/self/x.log");
        refused(
            check_writable(log, "--log"),
            "--log /proc/self/x.log: is under /proc",
        );
        let status = Path::new("/proc/self/status");
        refused(
            check_log(status, "--log"),
            "--log /proc/self/status: is under /proc",
        );
        let e = refused(check_log(dir, "--log"), "--log: ");
        assert!(e.contains("directory"), "{e}");
        refused(check_writable(&dir.join("none/x.svg"), "--out"), "--out ");
    }
}
