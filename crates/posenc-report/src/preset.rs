//! Experiment presets: typed, stored as JSON files under `presets/` at the
//! root of the repository (compiled into the binary, so `posenc report`
//! runs from anywhere), or read from a path given to `--preset`.

use posenc_lab::bpe::Tokenization;
use serde::{Deserialize, Serialize};

use crate::{ReportError, Result};

/// The built-in presets: name and file contents.
pub const BUILT_IN: [(&str, &str); 3] = [
    ("quick", include_str!("../../../presets/quick.json")),
    ("full", include_str!("../../../presets/full.json")),
    ("smoke", include_str!("../../../presets/smoke.json")),
];

/// One training setup: the model's shape and the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// Model width.
    pub d_model: usize,
    /// Blocks.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Training length L.
    pub train_len: usize,
    /// Optimiser steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Warm-up steps.
    pub warmup: usize,
    /// Content symbols of the synthetic tasks.
    pub symbols: u32,
    /// Evaluation batches (of `batch` sequences) per length.
    pub eval_batches: usize,
    /// Tokens of the text experiments (`lm`, `mlm`): characters (absent,
    /// the default) or a byte-level BPE (`{"kind": "bpe", "vocab": N}`),
    /// trained on the training part of the text. `train_len` counts
    /// these tokens.
    #[serde(default, skip_serializing_if = "Tokenization::is_chars")]
    pub tokens: Tokenization,
}

/// Experiments 1 (encoders need positions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Encoders {
    /// Training setup.
    pub run: Stage,
    /// Encodings trained on the order task.
    pub encodings: Vec<String>,
    /// The masked-language-model comparison (absent in older preset files:
    /// the experiment then skips it and says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlm: Option<EncodersMlm>,
}

/// Experiment 1's masked language models (the `mlm` task on the report's
/// text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncodersMlm {
    /// Training setup (`train_len` is the window, `symbols` is unused).
    pub run: Stage,
    /// Encodings compared; must include `nope` and one other.
    pub encodings: Vec<String>,
    /// How many of the preset's seeds to train (the first ones).
    pub n_seeds: usize,
}

/// Experiments 2 and 4 (language modelling).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lm {
    /// Training setup (the largest size).
    pub run: Stage,
    /// Encodings compared.
    pub encodings: Vec<String>,
    /// Smaller sizes for the trend of NoPE's gap with scale (absent in
    /// older preset files: the trend is then not measured and says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trend: Option<Trend>,
    /// The same comparison in a second tokenization, beside the first
    /// (characters beside subwords): its own setup, since a window of
    /// characters holds fewer characters than one of subwords. Absent: one
    /// tokenization only, and the report says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub second: Option<LmSecond>,
}

/// Experiment 2's second tokenization.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LmSecond {
    /// Training setup, with its tokenization.
    pub run: Stage,
    /// Encodings trained (NoPE and the positional ones the best is chosen
    /// from).
    pub encodings: Vec<String>,
}

/// The NoPE gap's trend with scale: the same run at smaller sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trend {
    /// Training setups smaller than `lm.run`, smallest first; `lm.run` is
    /// the largest size.
    pub sizes: Vec<Stage>,
    /// Encodings trained at each size: NoPE and the positional encodings
    /// the best is chosen from (each also in `lm.encodings`).
    pub encodings: Vec<String>,
}

/// Experiment 3 (RoPE past its training length).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RopeExp {
    /// Training setup.
    pub run: Stage,
    /// Evaluation lengths as multiples of L.
    pub factors: Vec<usize>,
    /// Fine-tuning steps at 2L (PI and plain).
    pub finetune_steps: usize,
    /// Fine-tuning learning rate.
    pub finetune_lr: f64,
    /// YaRN β_fast (rotations above which a pair is left unscaled).
    pub yarn_beta_fast: f64,
    /// YaRN β_slow (rotations below which a pair is fully interpolated).
    pub yarn_beta_slow: f64,
    /// How many of the preset's seeds to train (the first ones); the rules
    /// compare scalings beyond the seed-to-seed spread, which needs two.
    #[serde(default = "one")]
    pub n_seeds: usize,
}

/// Experiment 5 (length generalisation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthGen {
    /// Training setup.
    pub run: Stage,
    /// Evaluation lengths (the first is L).
    pub eval_lengths: Vec<usize>,
    /// Tasks.
    pub tasks: Vec<String>,
    /// Encodings.
    pub encodings: Vec<String>,
}

/// Experiment 6 (Shaw's clipping distance).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShawExp {
    /// Training setup.
    pub run: Stage,
    /// Clipping distances.
    pub ks: Vec<usize>,
    /// How many of the preset's seeds to train per k (the first ones);
    /// default 1.
    #[serde(default = "one")]
    pub n_seeds: usize,
}

fn one() -> usize {
    1
}

fn default_corpus() -> String {
    crate::corpus::DEFAULT.into()
}

/// Experiment 7 (analytic).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Analytic {
    /// Head dimension of the Position Interpolation fit.
    pub pi_dim: usize,
    /// Trained range of the fit.
    pub pi_trained: usize,
}

/// A whole preset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    /// Name (`quick`, `full`, `smoke`, ...).
    pub name: String,
    /// What it is for.
    pub description: String,
    /// Seeds of the multi-seed experiments.
    pub seeds: Vec<u64>,
    /// The text of the language-model experiments: `pride-and-prejudice`
    /// (the default), `grammar` (the lab's synthetic grammar) or a path to
    /// a UTF-8 file; `posenc report --corpus FILE` overrides it.
    #[serde(default = "default_corpus")]
    pub corpus: String,
    /// Experiment 1.
    pub encoders: Encoders,
    /// Experiments 2 and 4.
    pub lm: Lm,
    /// Experiment 3.
    pub rope: RopeExp,
    /// Experiment 5.
    pub lengthgen: LengthGen,
    /// Experiment 6.
    pub shaw: ShawExp,
    /// Experiment 7.
    pub analytic: Analytic,
    /// Experiment 8 (`--model`): passkey trials per (length, depth) cell of
    /// the retrieval grid (lengths L/4, L/2, L, 1.5 L, 2 L; depths 0, 0.5,
    /// 1); 0 skips retrieval.
    #[serde(default = "default_passkey_trials")]
    pub passkey_trials: usize,
}

fn default_passkey_trials() -> usize {
    1
}

impl Preset {
    /// The first `n` of the preset's seeds (all of them if it has fewer).
    pub fn first_seeds(&self, n: usize) -> Vec<u64> {
        self.seeds.iter().take(n).copied().collect()
    }

    /// The longest window of text (characters) an experiment evaluates on
    /// the validation part: the language model at 2L (+1 for the next
    /// token), RoPE at its largest factor, the masked LM at its length.
    pub fn longest_text_window(&self) -> usize {
        let lm = 2 * self.lm.run.train_len + 1;
        let trend = self
            .lm
            .trend
            .iter()
            .flat_map(|t| &t.sizes)
            .map(|s| s.train_len + 1)
            .max()
            .unwrap_or(0);
        let rope =
            self.rope.factors.iter().max().copied().unwrap_or(1) * self.rope.run.train_len + 1;
        let mlm = self.encoders.mlm.as_ref().map_or(0, |m| m.run.train_len);
        lm.max(trend).max(rope).max(mlm)
    }

    /// A built-in preset by name, or a JSON file by path.
    pub fn load(name_or_path: &str) -> Result<Preset> {
        let text = match BUILT_IN.iter().find(|(n, _)| *n == name_or_path) {
            Some((_, t)) => t.to_string(),
            None if name_or_path.ends_with(".json") => std::fs::read_to_string(name_or_path)
                .map_err(|e| ReportError(format!("cannot read preset {name_or_path}: {e}")))?,
            None => {
                return Err(ReportError(format!(
                    "unknown preset {name_or_path:?}; known: {} (or a path to a .json preset)",
                    BUILT_IN.map(|(n, _)| n).join(", ")
                )))
            }
        };
        let p: Preset = serde_json::from_str(&text)
            .map_err(|e| ReportError(format!("preset {name_or_path}: {e}")))?;
        p.validate()?;
        Ok(p)
    }

    fn validate(&self) -> Result {
        let bad = |m: String| Err(ReportError(format!("preset {}: {m}", self.name)));
        // A stage that can train, and a comparison of NoPE with another.
        let trains = |what: &str, s: &Stage| {
            if s.steps == 0 || s.batch == 0 || s.train_len < 8 || s.eval_batches == 0 {
                return bad(format!(
                    "{what}: steps, batch and eval_batches must be ≥ 1 and train_len ≥ 8"
                ));
            }
            Ok(())
        };
        let nope_and_another = |what: &str, encodings: &[String]| {
            if !encodings.iter().any(|e| e == "nope") || encodings.len() < 2 {
                return bad(format!("{what}.encodings must include nope and another"));
            }
            Ok(())
        };
        if self.seeds.is_empty() {
            return bad("no seeds".into());
        }
        for (what, s) in [
            ("encoders", &self.encoders.run),
            ("lm", &self.lm.run),
            ("rope", &self.rope.run),
            ("lengthgen", &self.lengthgen.run),
            ("shaw", &self.shaw.run),
        ] {
            trains(what, s)?;
        }
        if let Some(m) = &self.encoders.mlm {
            trains("encoders.mlm", &m.run)?;
            nope_and_another("encoders.mlm", &m.encodings)?;
            if !(1..=self.seeds.len()).contains(&m.n_seeds) {
                return bad(format!(
                    "encoders.mlm.n_seeds must be in 1..={} (the preset's seeds)",
                    self.seeds.len()
                ));
            }
        }
        if let Some(t) = &self.lm.trend {
            if t.sizes.is_empty() {
                return bad("lm.trend.sizes is empty".into());
            }
            for (i, st) in t.sizes.iter().enumerate() {
                trains(&format!("lm.trend.sizes[{i}]"), st)?;
            }
            nope_and_another("lm.trend", &t.encodings)?;
            if let Some(e) = t.encodings.iter().find(|e| !self.lm.encodings.contains(e)) {
                return bad(format!(
                    "lm.trend.encodings: {e} is not in lm.encodings (the largest size)"
                ));
            }
        }
        if let Some(sec) = &self.lm.second {
            let st = &sec.run;
            trains("lm.second.run", st)?;
            nope_and_another("lm.second", &sec.encodings)?;
            if st.tokens == self.lm.run.tokens {
                return bad(format!(
                    "lm.second.run has the same tokens as lm.run ({})",
                    st.tokens.label()
                ));
            }
        }
        let text_stages = [
            Some(&self.lm.run),
            self.lm.second.as_ref().map(|s| &s.run),
            Some(&self.rope.run),
            self.encoders.mlm.as_ref().map(|m| &m.run),
        ];
        for st in text_stages
            .into_iter()
            .flatten()
            .chain(self.lm.trend.iter().flat_map(|t| &t.sizes))
        {
            if let Err(e) = st.tokens.validate() {
                return bad(e.to_string());
            }
        }
        if !(1..=self.seeds.len()).contains(&self.rope.n_seeds) {
            return bad(format!(
                "rope.n_seeds must be in 1..={} (the preset's seeds)",
                self.seeds.len()
            ));
        }
        if !(1..=self.seeds.len()).contains(&self.shaw.n_seeds) {
            return bad(format!(
                "shaw.n_seeds must be in 1..={} (the preset's seeds)",
                self.seeds.len()
            ));
        }
        if self.lengthgen.eval_lengths.first() != Some(&self.lengthgen.run.train_len) {
            return bad("lengthgen.eval_lengths must start at train_len".into());
        }
        if self.rope.factors.first() != Some(&1) {
            return bad("rope.factors must start at 1".into());
        }
        if self.analytic.pi_dim < 4 || !self.analytic.pi_dim.is_multiple_of(2) {
            return bad("analytic.pi_dim must be even and ≥ 4".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_preset_parses_and_validates() {
        for (name, _) in BUILT_IN {
            let p = Preset::load(name).unwrap();
            assert_eq!(p.name, name);
            assert!(p.encoders.mlm.is_some(), "{name} has no encoders.mlm");
        }
        assert!(Preset::load("bogus").is_err());
    }

    /// A built-in preset as JSON, changed by `f`, parsed and validated.
    fn edited(f: impl Fn(&mut serde_json::Value)) -> Result<Preset> {
        let mut v: serde_json::Value = serde_json::from_str(BUILT_IN[2].1).unwrap();
        f(&mut v);
        let p: Preset = serde_json::from_value(v).map_err(|e| ReportError(e.to_string()))?;
        p.validate()?;
        Ok(p)
    }

    #[test]
    fn the_mlm_section_is_optional_and_checked() {
        // Older preset files, without encoders.mlm, still parse.
        let p = edited(|v| {
            v["encoders"].as_object_mut().unwrap().remove("mlm");
        })
        .unwrap();
        assert_eq!(p.encoders.mlm, None);
        assert!(edited(|v| v["encoders"]["mlm"]["n_seeds"] = 0.into()).is_err());
        assert!(edited(|v| v["encoders"]["mlm"]["n_seeds"] = 9.into()).is_err());
        assert!(
            edited(|v| v["encoders"]["mlm"]["encodings"] = serde_json::json!(["rope"])).is_err()
        );
        assert!(edited(|v| v["encoders"]["mlm"]["run"]["steps"] = 0.into()).is_err());
        assert!(edited(|v| v["encoders"]["mlm"]["bogus"] = 1.into()).is_err());
    }

    #[test]
    fn shaw_seeds_default_to_one_and_are_checked() {
        let p = edited(|v| {
            v["shaw"].as_object_mut().unwrap().remove("n_seeds");
        })
        .unwrap();
        assert_eq!(p.shaw.n_seeds, 1);
        let three = edited(|v| {
            v["seeds"] = serde_json::json!([0, 1, 2]);
            v["shaw"]["n_seeds"] = 3.into();
        });
        assert_eq!(three.unwrap().shaw.n_seeds, 3);
        assert!(edited(|v| v["shaw"]["n_seeds"] = 0.into()).is_err());
        // The smoke preset has two seeds.
        assert!(edited(|v| v["shaw"]["n_seeds"] = 3.into()).is_err());
    }

    #[test]
    fn the_trend_the_rope_seeds_and_the_corpus_are_checked() {
        let p = edited(|_| {}).unwrap();
        assert_eq!(p.corpus, "pride-and-prejudice");
        assert_eq!(p.rope.n_seeds, 2);
        assert!(p.lm.trend.is_some());
        // Older preset files: no corpus (the default), no trend, one rope seed.
        let old = edited(|v| {
            let o = v.as_object_mut().unwrap();
            o.remove("corpus");
            v["lm"].as_object_mut().unwrap().remove("trend");
            v["rope"].as_object_mut().unwrap().remove("n_seeds");
        })
        .unwrap();
        assert_eq!(old.corpus, "pride-and-prejudice");
        assert_eq!(old.lm.trend, None);
        assert_eq!(old.rope.n_seeds, 1);
        assert!(edited(|v| v["rope"]["n_seeds"] = 3.into()).is_err());
        assert!(edited(|v| v["rope"]["n_seeds"] = 0.into()).is_err());
        assert!(edited(|v| v["lm"]["trend"]["sizes"] = serde_json::json!([])).is_err());
        assert!(edited(
            |v| v["lm"]["trend"]["encodings"] = serde_json::json!(["sinusoidal", "learned"])
        )
        .is_err());
        // A trend encoding must also be trained at the largest size.
        assert!(
            edited(|v| v["lm"]["trend"]["encodings"] = serde_json::json!(["nope", "alibi"]))
                .is_err()
        );
        assert!(edited(|v| v["lm"]["trend"]["sizes"][0]["steps"] = 0.into()).is_err());
        // The longest validation window: RoPE at 2 × 16, plus the next token.
        assert_eq!(p.longest_text_window(), 33);
        for (name, _) in BUILT_IN {
            let p = Preset::load(name).unwrap();
            assert!(p.rope.n_seeds >= 2, "{name}: the spread needs two seeds");
            assert!(p.lm.trend.is_some(), "{name}: no trend");
        }
    }
}
