//! Helpers shared by the CLI's integration tests (`mod common;` in each).

// Each test binary uses its own subset of these.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::process::{Command, Output};

/// The `posenc` binary with `args`, not yet run.
pub fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_posenc"));
    cmd.args(args);
    cmd
}

/// Runs the `posenc` binary with `args` and the variables of `env` set.
pub fn run(args: &[&str], env: &[(&str, &OsStr)]) -> Output {
    let mut cmd = command(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run posenc")
}

/// The standard output of a run that must succeed.
pub fn stdout_ok(out: Output, args: &[&str]) -> String {
    assert!(
        out.status.success(),
        "posenc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The standard error of a run refused on user input: exit 2, exactly one
/// line (no trailing blank line either) starting with `posenc: error: `, no
/// panic. The strictest of the checks the test files had each written.
pub fn one_line_error(out: Output, args: &[&str]) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "posenc {args:?}: {err}");
    assert!(!err.contains("panicked"), "posenc {args:?} panicked: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.starts_with("posenc: error: "), "{err}");
    err
}

/// The standard output of a run that must succeed, when its arguments are
/// not at hand for the message.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Runs `posenc` with `args`, which must be refused as [`one_line_error`]
/// says, with a line that contains `needle`.
pub fn fails_mentioning(args: &[&str], needle: &str) -> String {
    let err = one_line_error(run(args, &[]), args);
    assert!(
        err.contains(needle),
        "posenc {args:?}: {err:?} lacks {needle:?}"
    );
    err
}

/// Runs `posenc` with `args`, which must be refused with exit status 2 and
/// no panic: either posenc's one line (as [`one_line_error`]) or clap's
/// usage error, which starts with `error:` and may show the usage below it.
pub fn refused(args: &[&str]) -> String {
    let out = run(args, &[]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    if err.starts_with("error:") {
        assert_eq!(out.status.code(), Some(2), "posenc {args:?}: {err}");
        assert!(!err.contains("panicked"), "posenc {args:?} panicked: {err}");
        return err;
    }
    one_line_error(out, args)
}
