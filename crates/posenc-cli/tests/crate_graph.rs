//! The crates depend on each other only downwards, as `docs/layout.md`
//! draws it: `posenc ← posenc-nn ← {posenc-lab, posenc-models}`,
//! `{posenc-nn, posenc-models} ← posenc-tune ← posenc-run` (the
//! fine-tuner does not use the lab; posenc-run uses posenc-nn too), `{posenc-lab, posenc-models} ← posenc-viz ←
//! {posenc-report, posenc-explore} ← posenc-cli`, posenc-run under
//! posenc-report and posenc-cli, `posenc-py` over posenc-run and
//! posenc-viz, with `posenc-plot` beside them. Each crate's
//! `[dependencies]` may name only the crates listed for it here.

use std::collections::BTreeMap;
use std::path::Path;

/// Each crate and the workspace crates it may depend on.
const ALLOWED: [(&str, &[&str]); 12] = [
    ("posenc", &[]),
    ("posenc-plot", &[]),
    ("posenc-nn", &["posenc"]),
    ("posenc-lab", &["posenc", "posenc-nn"]),
    ("posenc-models", &["posenc", "posenc-nn"]),
    ("posenc-tune", &["posenc", "posenc-nn", "posenc-models"]),
    (
        "posenc-run",
        &["posenc", "posenc-nn", "posenc-models", "posenc-tune"],
    ),
    (
        "posenc-py",
        &[
            "posenc",
            "posenc-models",
            "posenc-tune",
            "posenc-viz",
            "posenc-run",
        ],
    ),
    (
        "posenc-viz",
        &["posenc", "posenc-lab", "posenc-models", "posenc-plot"],
    ),
    (
        "posenc-report",
        &[
            "posenc",
            "posenc-lab",
            "posenc-models",
            "posenc-plot",
            "posenc-viz",
            "posenc-tune",
            "posenc-run",
        ],
    ),
    ("posenc-explore", &["posenc", "posenc-viz", "posenc-models"]),
    (
        "posenc-cli",
        &[
            "posenc",
            "posenc-lab",
            "posenc-models",
            "posenc-plot",
            "posenc-tune",
            "posenc-viz",
            "posenc-report",
            "posenc-explore",
            "posenc-run",
        ],
    ),
];

/// The workspace crates named in `[dependencies]` of a Cargo.toml.
fn workspace_deps(toml: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in toml.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            inside = t == "[dependencies]";
            continue;
        }
        if inside && t.starts_with("posenc") {
            if let Some(name) = t.split(['=', ' ', '.']).next() {
                out.push(name.to_string());
            }
        }
    }
    out
}

#[test]
fn crates_depend_only_downwards() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.into_iter().collect();
    let mut seen = 0;
    for entry in std::fs::read_dir(&crates).unwrap() {
        let dir = entry.unwrap().path();
        let Ok(toml) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let Some(ok) = allowed.get(name.as_str()) else {
            panic!(
                "{name}: a crate this test does not place; add it to ALLOWED and docs/layout.md"
            );
        };
        for dep in workspace_deps(&toml) {
            assert!(
                ok.contains(&dep.as_str()),
                "{name} depends on {dep}, against the layering of docs/layout.md"
            );
        }
        seen += 1;
    }
    assert_eq!(seen, ALLOWED.len());
}

#[test]
fn reads_dependency_sections() {
    let toml = "[package]\nname = \"x\"\n[dependencies]\nposenc = { path = \"../posenc\" }\nposenc-viz.workspace = true\nserde = \"1\"\n[dev-dependencies]\nposenc-lab = { path = \"../posenc-lab\" }\n";
    assert_eq!(workspace_deps(toml), ["posenc", "posenc-viz"]);
}
