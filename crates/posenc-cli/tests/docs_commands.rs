//! The README and `docs/` as the tests see them: every `posenc` command line
//! they show parses with the CLI's own argument parser, every relative link
//! leads to a file, every page of `docs/` is reachable from the README and
//! compiled as a doc test, and the README stays a front door (≤ 250 lines).
//!
//! A command line is checked by running the built `posenc` with its
//! arguments and `--help` appended: clap reads the arguments in order and
//! stops at `--help`, so every subcommand, flag name, value type and choice
//! before it is checked (a misspelt flag or a value that does not parse
//! exits with status 2 and clap's message), while nothing runs. Required
//! arguments are not checked this way: the help stops the parse first.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The README, then every page of `docs/`, as (path relative to the root,
/// text).
fn pages() -> Vec<(String, String)> {
    let root = root();
    let mut out = vec![(
        "README.md".to_string(),
        std::fs::read_to_string(root.join("README.md")).expect("README.md"),
    )];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    for p in docs {
        let name = format!("docs/{}", p.file_name().unwrap().to_string_lossy());
        out.push((name, std::fs::read_to_string(&p).expect("docs page")));
    }
    out
}

/// Splits a shell command line into words (single and double quotes, no
/// expansion).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    out
}

/// The arguments of the `posenc` invocation in `line`, if it has one: a
/// command (between shell operators, after `VAR=value` assignments and
/// `/usr/bin/time` with its options) that is `posenc`, a path ending in
/// `/posenc` (`./target/release/posenc`), or `cargo run --release --`
/// (optionally `-p posenc-cli`); up to the next operator or a comment.
/// `None` for lines that run something else (`cargo add posenc ...`).
fn posenc_args(line: &str) -> Option<Vec<String>> {
    let w = words(line);
    let mut commands: Vec<&[String]> = Vec::new();
    let mut rest = &w[..];
    while !rest.is_empty() {
        let end = rest
            .iter()
            .position(|t| matches!(t.as_str(), "&&" | "||" | "|" | ";") || t.starts_with('#'))
            .unwrap_or(rest.len());
        commands.push(&rest[..end]);
        if end < rest.len() && rest[end].starts_with('#') {
            break;
        }
        rest = &rest[(end + 1).min(rest.len())..];
    }
    for cmd in commands {
        let mut i = 0;
        while i < cmd.len() && cmd[i].contains('=') && !cmd[i].starts_with('-') {
            i += 1;
        }
        if i < cmd.len() && (cmd[i] == "/usr/bin/time" || cmd[i] == "time") {
            i += 1;
            while i < cmd.len() && cmd[i].starts_with('-') {
                i += if matches!(cmd[i].as_str(), "-f" | "-o") {
                    2
                } else {
                    1
                };
            }
        }
        let Some(head) = cmd.get(i) else { continue };
        let args_from = if head == "posenc" || head.ends_with("/posenc") {
            Some(i + 1)
        } else if head == "cargo" && cmd.get(i + 1).is_some_and(|t| t == "run") {
            let sep = cmd.iter().position(|t| t == "--")?;
            let opts: Vec<&str> = cmd[i + 2..sep].iter().map(String::as_str).collect();
            let ok = opts
                .iter()
                .all(|o| matches!(*o, "--release" | "-p" | "posenc-cli"));
            ok.then_some(sep + 1)
        } else {
            None
        };
        if let Some(from) = args_from {
            let args = cmd[from..]
                .iter()
                .take_while(|t| !matches!(t.as_str(), ">" | "2>" | "<"))
                .cloned()
                .collect();
            return Some(args);
        }
    }
    None
}

/// Command lines in the fenced `sh`/`bash` blocks of `text` (backslash
/// continuations joined), and the inline code spans that start a `posenc`
/// invocation (spans may wrap across lines of the Markdown source).
fn command_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    let mut pending = String::new();
    let mut prose = String::new();
    for line in text.lines() {
        if let Some(rest) = line.trim_start().strip_prefix("```") {
            match fence {
                None => fence = Some(rest.trim().to_string()),
                Some(_) => fence = None,
            }
            continue;
        }
        match fence.as_deref() {
            Some("sh" | "bash" | "shell" | "console") => {
                let l = line.trim();
                if let Some(head) = l.strip_suffix('\\') {
                    pending.push_str(head);
                    pending.push(' ');
                } else {
                    pending.push_str(l);
                    out.push(std::mem::take(&mut pending));
                }
            }
            Some(_) => {}
            None => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
    }
    // inline code spans of the prose (single backticks)
    for (i, span) in prose.split('`').enumerate() {
        if i % 2 == 1 {
            let span = span.split_whitespace().collect::<Vec<_>>().join(" ");
            if posenc_args(&span).is_some() {
                out.push(span);
            }
        }
    }
    out
}

/// A placeholder in a command shown for the reader (`FILE`, `N`, `CK`,
/// `NAME`) becomes a value that every such argument accepts.
fn fill_placeholder(arg: &str) -> String {
    let is_placeholder = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && arg.chars().next().unwrap().is_ascii_uppercase();
    if is_placeholder {
        "1".to_string()
    } else {
        arg.to_string()
    }
}

#[test]
fn every_posenc_command_in_the_readme_and_docs_parses() {
    let bin = env!("CARGO_BIN_EXE_posenc");
    let mut checked = Vec::new();
    let mut failures = Vec::new();
    for (page, text) in pages() {
        for line in command_lines(&text) {
            let Some(args) = posenc_args(&line) else {
                continue;
            };
            // a shortened command (`... --out DIR`) is not a command line
            if args.is_empty() || args.iter().any(|a| a == "..." || a.contains('…')) {
                continue;
            }
            let mut argv: Vec<String> = args.iter().map(|a| fill_placeholder(a)).collect();
            // `--help` before a `--` that passes the rest through
            let at = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
            argv.insert(at, "--help".into());
            let out = Command::new(bin)
                .args(&argv)
                .env("POSENC_SIMD", "scalar")
                .output()
                .expect("run posenc");
            let stdout = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() || !stdout.contains("Usage:") {
                failures.push(format!(
                    "{page}: `{line}`: {} {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            checked.push(format!("{page}: {}", args.join(" ")));
        }
    }
    eprintln!("{} posenc command lines checked:", checked.len());
    for c in &checked {
        eprintln!("  {c}");
    }
    assert!(
        failures.is_empty(),
        "command lines the CLI does not accept:\n{}",
        failures.join("\n")
    );
    // the two commands of a fresh machine, and each capability's page, are
    // among those checked
    for needle in [
        "README.md: report",
        "docs/report.md: report --preset full",
        "docs/models.md: perplexity --model",
        "docs/lab.md: finetune --checkpoint",
        "docs/explorer.md: explore --open",
        "docs/kernels.md: bench rope",
    ] {
        assert!(
            checked.iter().any(|c| c.starts_with(needle)),
            "no command `{needle}` checked; checked: {checked:#?}"
        );
    }
}

#[test]
fn a_misspelt_command_is_caught() {
    // the check itself: an unknown flag, a value of the wrong type and an
    // unknown subcommand fail before `--help` is reached
    let bin = env!("CARGO_BIN_EXE_posenc");
    for line in [
        "posenc perplexity --lenght 4096",
        "posenc perplexity --length many",
        "posenc reprot --out /tmp/x",
    ] {
        let mut argv = posenc_args(line).unwrap();
        argv.push("--help".into());
        let out = Command::new(bin).args(&argv).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{line} was accepted");
    }
    // and a correct one passes
    let out = Command::new(bin)
        .args(["perplexity", "--length", "4096", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
}

#[test]
fn the_command_extraction_reads_blocks_spans_and_wrappers() {
    let text = "Run\n\n```sh\nbash scripts/get-model.sh   # fetch\n./target/release/posenc perplexity --model M \\\n    --length 16384 --json\n```\n\nor `POSENC_CACHE=/tmp/c /usr/bin/time -v ./target/release/posenc\nreport --out /tmp/rq3` and `cargo run --release -- explore --open`.\n";
    let lines = command_lines(text);
    let args: Vec<Vec<String>> = lines.iter().filter_map(|l| posenc_args(l)).collect();
    assert_eq!(
        args,
        vec![
            vec!["perplexity", "--model", "M", "--length", "16384", "--json"],
            vec!["report", "--out", "/tmp/rq3"],
            vec!["explore", "--open"],
        ]
    );
    assert_eq!(
        posenc_args("cargo build --release -p posenc-cli && ./target/release/posenc bench rope"),
        Some(vec!["bench".to_string(), "rope".to_string()])
    );
    for other in [
        "cargo add posenc --path path/to/posenc/crates/posenc   # or --git",
        "cargo run -p posenc --example NAME",
        "cargo run --release -p posenc-models --example attention_time -- 4096 3",
        "posenc_lab::eval::loss_per_position",
    ] {
        assert_eq!(posenc_args(other), None, "{other}");
    }
    assert_eq!(fill_placeholder("FILE"), "1");
    assert_eq!(fill_placeholder("bpe:2048"), "bpe:2048");
}

/// The targets of the relative Markdown links `[text](target)` in `text`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            let target = &rest[..end];
            if !target.contains("://") && !target.starts_with('#') && !target.contains(' ') {
                out.push(target.split('#').next().unwrap().to_string());
            }
        }
    }
    out
}

#[test]
fn the_readme_is_a_front_door_and_every_page_is_linked() {
    let root = root();
    let pages = pages();
    let readme = &pages[0].1;
    let n = readme.lines().count();
    assert!(
        n <= 250,
        "README.md has {n} lines; the front door keeps ≤ 250"
    );
    // the two commands of a fresh machine come first
    let first: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("```sh"))
        .skip(1)
        .take(2)
        .collect();
    assert_eq!(
        first,
        ["cargo run --release -- report", "cargo test --workspace"]
    );
    // every relative link of every page leads to a file
    for (page, text) in &pages {
        let dir = root.join(page).parent().unwrap().to_path_buf();
        for target in links(text) {
            assert!(
                dir.join(&target).exists(),
                "{page}: link to {target}, which does not exist"
            );
        }
    }
    // every page of docs/ is linked from the README, and compiled as a doc
    // test of a crate (its Rust blocks run): `#[doc = include_str!(...)]` on
    // a `#[cfg(doctest)]` item of some crate's lib.rs, the crate whose API
    // the page's code uses (posenc's for the pages so far)
    let readme_links = links(readme);
    let libs: Vec<String> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.unwrap().path().join("src/lib.rs")).ok())
        .collect();
    assert!(libs.len() >= 5, "crates/*/src/lib.rs not found");
    for (page, _) in &pages[1..] {
        assert!(
            readme_links.iter().any(|l| l == page),
            "{page} is not linked from README.md"
        );
        let include = format!("include_str!(\"../../../{page}\")");
        assert!(
            libs.iter().any(|lib| lib.contains(&include)),
            "{page} is not compiled as a doc test: add `#[doc = {include}]` to the \
             `docs_doctests` module of crates/posenc/src/lib.rs (or of the crate \
             whose API its code uses)"
        );
    }
}
