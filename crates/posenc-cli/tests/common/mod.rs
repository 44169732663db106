//! Helpers shared by the CLI's integration tests (`mod common;` in each).

// Each test binary uses its own subset of these.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `posenc` binary with `args`, not yet run.
pub fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_posenc"));
    cmd.args(args);
    cmd
}

/// Runs `cmd` (the `posenc` binary with `args`) with no input and its
/// output captured, failing the test when it still runs after `limit` (it
/// is killed then); its output and how long it took.
pub fn output_within(mut cmd: Command, limit: Duration, args: &[&str]) -> (Output, Duration) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            return (child.wait_with_output().unwrap(), start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "posenc {args:?} still running after {} s: {}",
                limit.as_secs(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
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

/// Runs the `posenc` binary with `args` in the environment as it is.
pub fn posenc(args: &[&str]) -> Output {
    run(args, &[])
}

/// The JSON standard output of a run that must succeed.
pub fn ok_json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&stdout_ok(posenc(args), args)).expect("stdout is JSON")
}

/// The JSON file at `path`.
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A JSON array of numbers as f64s.
pub fn f64s(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// The `metrics.jsonl` of the run written to `dir`, after checking that
/// `dir` holds it and each of `files`.
pub fn run_log(dir: &std::path::Path, files: &[&str]) -> String {
    for f in files.iter().chain(&["metrics.jsonl"]) {
        assert!(dir.join(f).is_file(), "{f} missing in {}", dir.display());
    }
    std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap()
}

/// A new empty directory `posenc-{prefix}-XXXXXX` in the temp dir, removed
/// with everything in it when the guard returned is dropped: the test keeps
/// it for as long as it uses the paths inside.
pub fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("posenc-{prefix}-"))
        .tempdir()
        .unwrap()
}

/// The path `name` (not created) in a new [`tempdir`], and that directory's
/// guard.
pub fn scratch(prefix: &str, name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempdir(prefix);
    let path = dir.path().join(name);
    (dir, path)
}

/// [`scratch`], the directory `name` created (empty).
pub fn fresh_dir(prefix: &str, name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let (dir, path) = scratch(prefix, name);
    std::fs::create_dir(&path).unwrap();
    (dir, path)
}

/// The whitespace-separated words of `line`: a command line's fixed flags
/// and values (none of them with a space in it) as arguments.
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// A word-level `tokenizer.json` over the 256 ids of the tiny models:
/// words `w0`..`w254` and `[UNK]` (255), split on white space.
pub fn word_tokenizer_json() -> String {
    let mut vocab = serde_json::Map::new();
    for i in 0..255 {
        vocab.insert(format!("w{i}"), serde_json::Value::from(i));
    }
    vocab.insert("[UNK]".into(), serde_json::Value::from(255));
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    })
    .to_string()
}

/// `contents` as the file `name` in the directory of input files the tests
/// share, `posenc-cli-inputs` in Cargo's scratch directory for integration
/// tests (under `target/`, kept between runs, not in the system's temp
/// dir). Written to a temporary file beside it, then renamed over it: a
/// test of another process reading it at the same time sees the whole of
/// the old file or the whole of the new one (the same bytes), never a part.
fn shared_input_file(name: &str, contents: &[u8]) -> std::path::PathBuf {
    use std::io::Write;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("posenc-cli-inputs");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let mut tmp = tempfile::NamedTempFile::new_in(&dir).unwrap();
    tmp.write_all(contents).unwrap();
    tmp.persist(&path).unwrap();
    path
}

/// [`word_tokenizer_json`] as a file, written once for every test of this
/// process (the tests run side by side; see [`shared_input_file`]).
pub fn word_tokenizer_file() -> std::path::PathBuf {
    static PATH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| shared_input_file("words-tokenizer.json", word_tokenizer_json().as_bytes()))
        .clone()
}

/// A text of `words` of [`word_tokenizer_json`]'s words with period 97
/// (`w{((i mod 97)·89 + 13) mod 255}`), as a file written once per length
/// for every test of this process.
pub fn word_text_file(words: usize) -> std::path::PathBuf {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static FILES: OnceLock<Mutex<HashMap<usize, std::path::PathBuf>>> = OnceLock::new();
    let mut files = FILES.get_or_init(Default::default).lock().unwrap();
    files
        .entry(words)
        .or_insert_with(|| {
            let text: Vec<String> = (0..words)
                .map(|i| format!("w{}", ((i % 97) * 89 + 13) % 255))
                .collect();
            shared_input_file(&format!("words-{words}.txt"), text.join(" ").as_bytes())
        })
        .clone()
}

/// Starts `posenc args`, lets `started` read its standard error until the
/// run is under way (its Ctrl-C handler set), sends it SIGINT and returns
/// its exit status.
#[cfg(unix)]
pub fn interrupted(
    args: &[&str],
    started: impl FnOnce(&mut dyn std::io::BufRead),
) -> std::process::ExitStatus {
    use std::process::Stdio;
    let mut child = command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    started(&mut stderr);
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    child.wait().unwrap()
}

/// The arguments of the command line `line`, split at white space, each
/// `{}` in it standing for the next of `vars`, whole (a path may hold a
/// space).
pub fn argv<'a>(line: &'a str, vars: &[&'a str]) -> Vec<&'a str> {
    let mut vars = vars.iter();
    let args = line
        .split_whitespace()
        .map(|w| match w {
            "{}" => *vars.next().expect("a value for each {}"),
            w => w,
        })
        .collect();
    assert!(vars.next().is_none(), "a {{}} for each value");
    args
}
