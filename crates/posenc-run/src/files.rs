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

/// `/proc` or `/sys` when `dir` (its nearest existing ancestor, links
/// resolved) is under one of them.
fn system_dir(dir: &Path) -> Option<&'static str> {
    let mut existing = dir.to_path_buf();
    while std::fs::symlink_metadata(&existing).is_err() {
        let up = parent_of(&existing);
        if up == existing {
            break;
        }
        existing = up;
    }
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
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(fail(format!("{} is not a directory", dir.display()))),
        Err(e) => {
            return Err(fail(format!(
                "the directory {} cannot be used: {e}",
                dir.display()
            )))
        }
    }
    if path.is_dir() {
        return Err(fail("is a directory".into()));
    }
    probe_dir(&dir).map_err(|e| fail(format!("cannot create a file in {}: {e}", dir.display())))
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
    let mut existing = dir.to_path_buf();
    while std::fs::symlink_metadata(&existing).is_err() {
        existing = parent_of(&existing);
    }
    match std::fs::metadata(&existing) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(fail(format!("{} is not a directory", existing.display()))),
        Err(e) => {
            return Err(fail(format!(
                "the directory {} cannot be used: {e}",
                existing.display()
            )))
        }
    }
    probe_dir(&existing).map_err(|e| {
        fail(format!(
            "cannot create a file in {}: {e}",
            existing.display()
        ))
    })
}

/// Whether two paths name the same directory (compared as given when
/// either does not exist yet); as `posenc_lab::finetune::same_dir`, which
/// this crate may not depend on.
pub(crate) fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a.components().eq(b.components()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_directories_are_checked_first() {
        let dir = std::env::temp_dir().join(format!("posenc-run-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        check_out_dir(&dir.join("a/b/c"), "--out").unwrap();
        let file = dir.join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = check_out_dir(&file, "--out").unwrap_err().to_string();
        assert!(
            e.starts_with("--out ") && e.contains("not a directory"),
            "{e}"
        );
        let e = check_out_dir(&file.join("sub"), "--out")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a directory"), "{e}");
        for p in ["/proc/posenc-x", "/sys/kernel/posenc"] {
            let e = check_out_dir(Path::new(p), "--out")
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&format!("--out {p}")), "{e}");
        }
        let e = check_writable(Path::new("/proc/self/x.log"), "--log")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--log /proc/self/x.log: is under /proc"),
            "{e}"
        );
        let e = check_log(Path::new("/proc/self/status"), "--log")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--log /proc/self/status: is under /proc"),
            "{e}"
        );
        let e = check_log(&dir, "--log").unwrap_err().to_string();
        assert!(e.starts_with("--log: ") && e.contains("directory"), "{e}");
        let e = check_writable(&dir.join("none/x.svg"), "--out")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--out "), "{e}");
        assert!(same_dir(&dir, &dir.join(".")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
