//! # posenc-lab — tiny transformers that show what each positional encoding does
//!
//! Encoder and decoder transformers small enough to train on a laptop CPU,
//! with any positional encoding of [`posenc`] plugged in at its hook, and the
//! built-in tasks that test the introductory articles' claims ([`tasks`]), trained with
//! [`train::train`], fine-tuned at a new length with [`finetune()`], and
//! measured position by position with [`eval::loss_per_position`].
//!
//! ## Layers
//!
//! Each module uses only the modules above it in this list; a test reads
//! the sources and fails on an import that goes up, so the modules never
//! import each other in a circle:
//!
//! 1. `error` (private, re-exported: [`LabError`]);
//! 2. `fsio` (private: files written through a rename, safetensors read
//!    with their path in the error), [`ops`] (fused CPU ops beside their
//!    references) and [`optim`] (AdamW, gradient clipping), both
//!    re-exported from [`posenc_nn`], [`config`] (model, run and task kind);
//! 3. [`bpe`] (subword tokens; the vocabulary limits);
//! 4. [`tasks`] (the generators and corpora);
//! 5. [`model`] (the transformer);
//! 6. [`checkpoint`] (what a checkpoint records; the batch seeds);
//! 7. `lab` (private, re-exported from [`train`]: [`train::Lab`], a model
//!    with its parameters, loaded and saved, and its batches);
//! 8. [`eval`] (the measurements of a trained model);
//! 9. [`train`] (the training loop);
//! 10. [`finetune`](mod@finetune) (fine-tuning at a new length).
#![warn(missing_docs)]

pub mod bpe;
pub mod checkpoint;
pub mod config;
mod error;
pub mod eval;
pub mod finetune;
mod fsio;
mod lab;
pub mod model;
pub mod tasks;
pub mod train;

pub use error::LabError;
pub use eval::{loss_per_position, PositionLoss};
pub use finetune::{finetune, FactorScaling, FinetuneOptions, FinetuneRecord, ScalingSpec};
/// The fused CPU ops beside their references (from posenc-nn, shared with
/// the pretrained decoders and the fine-tuner).
pub use posenc_nn::ops;
/// AdamW and gradient clipping (from posenc-nn).
pub use posenc_nn::optim;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    /// The layers of the crate docs, lowest first: a module may use the
    /// modules of earlier layers only.
    const LAYERS: &[&[&str]] = &[
        &["error"],
        &["fsio", "ops", "optim", "config"],
        &["bpe"],
        &["tasks"],
        &["model"],
        &["checkpoint"],
        &["lab"],
        &["eval"],
        &["train"],
        &["finetune"],
    ];

    /// A source file: its path below `src/` and its text.
    macro_rules! source {
        ($path:literal) => {
            ($path, include_str!($path))
        };
    }

    /// Every source file below `src/` but `lib.rs`.
    const SOURCES: &[(&str, &str)] = &[
        source!("bpe.rs"),
        source!("checkpoint.rs"),
        source!("config.rs"),
        source!("error.rs"),
        source!("eval.rs"),
        source!("finetune.rs"),
        source!("fsio.rs"),
        source!("lab.rs"),
        source!("model.rs"),
        source!("tasks.rs"),
        source!("train.rs"),
    ];

    /// The module a source file belongs to: `ops` for `ops/linear.rs`,
    /// `bpe` for `bpe.rs`.
    fn module(path: &str) -> &str {
        path.split('/')
            .next()
            .unwrap_or(path)
            .trim_end_matches(".rs")
    }

    /// The modules `src` uses through `crate::module` paths, comments
    /// (docs' links included) left out.
    fn imports(src: &str) -> Vec<String> {
        let mut out = Vec::new();
        for line in src.lines() {
            let code = line.split("//").next().unwrap_or("");
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        }
        out
    }

    /// The module graph: each module and the modules it uses.
    fn graph() -> BTreeMap<&'static str, Vec<String>> {
        let mut g: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for &(file, src) in SOURCES {
            let module = module(file);
            assert!(
                !src.contains("crate::{"),
                "{file}: name each module with its own `crate::module` path (the test reads them)"
            );
            let deps = g.entry(module).or_default();
            deps.extend(imports(src).into_iter().filter(|d| d != module));
            deps.sort();
            deps.dedup();
        }
        g
    }

    #[test]
    fn every_source_file_is_read() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut on_disk = Vec::new();
        let mut dirs = vec![src.clone()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let rel = p
                        .strip_prefix(&src)
                        .unwrap()
                        .to_string_lossy()
                        .replace('\\', "/");
                    if rel != "lib.rs" {
                        on_disk.push(rel);
                    }
                }
            }
        }
        on_disk.sort();
        let mut listed: Vec<String> = SOURCES.iter().map(|s| s.0.to_string()).collect();
        listed.sort();
        assert_eq!(on_disk, listed, "SOURCES must list every file below src/");
    }

    #[test]
    fn modules_form_no_cycle() {
        let g = graph();
        // Depth-first search; a module met again while on the path closes a cycle.
        fn visit<'a>(
            m: &'a str,
            g: &'a BTreeMap<&'static str, Vec<String>>,
            path: &mut Vec<&'a str>,
            done: &mut Vec<&'a str>,
        ) {
            if done.contains(&m) {
                return;
            }
            if let Some(i) = path.iter().position(|&p| p == m) {
                panic!(
                    "modules import each other in a circle: {} -> {m}",
                    path[i..].join(" -> ")
                );
            }
            path.push(m);
            for d in g.get(m).into_iter().flatten() {
                visit(d, g, path, done);
            }
            path.pop();
            done.push(m);
        }
        let mut done = Vec::new();
        for m in g.keys() {
            visit(m, &g, &mut Vec::new(), &mut done);
        }
    }

    #[test]
    fn modules_use_only_lower_layers() {
        let layer = |m: &str| {
            LAYERS
                .iter()
                .position(|l| l.contains(&m))
                .unwrap_or_else(|| {
                    panic!("module {m} is in no layer of LAYERS (and the crate docs)")
                })
        };
        for (m, deps) in graph() {
            for d in deps {
                assert!(
                    layer(&d) < layer(m),
                    "{m} (layer {}) uses {d} (layer {}): a module may use lower layers only",
                    layer(m) + 1,
                    layer(&d) + 1
                );
            }
        }
    }
}
