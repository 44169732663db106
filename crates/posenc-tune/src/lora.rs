//! LoRA adapters (Hu et al. 2021, *LoRA: Low-Rank Adaptation of Large
//! Language Models*), as PEFT implements them.
//!
//! A targeted projection `y = x·Wᵀ (+ b)`, `W` `(out, in)` frozen, becomes
//!
//! ```text
//! y = x·Wᵀ (+ b) + dropout(x)·Aᵀ·Bᵀ · alpha/r        A (r, in), B (out, r) trained
//! ```
//!
//! with, as PEFT's `LoraConfig` defaults: `r = 8`, `lora_alpha = 8` (so the
//! scaling `alpha/r` is 1), no dropout, and the targets PEFT picks for the
//! Llama and Qwen2 model types when none are given (`q_proj`, `v_proj`).
//! Initialisation is PEFT's default (`init_lora_weights=True`): `A` as
//! `torch.nn.init.kaiming_uniform_(a=√5)`, i.e. uniform on `(−1/√in, 1/√in)`,
//! and `B = 0`, so the adapted model starts equal to the base model. The
//! values are drawn from a seeded [`StdRng`] (not torch's generator: same
//! distribution, other numbers).
//!
//! Parameter names follow PEFT's saved adapters
//! (`adapter_model.safetensors`, without the adapter name):
//! `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` of
//! shape `(r, in)` and `...lora_B.weight` of shape `(out, r)`
//! ([`adapter_name`]).

use std::str::FromStr;

use candle_core::Tensor;
use posenc_models::DecoderConfig;
use rand::rngs::StdRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TuneError};

/// A projection of a Llama-family decoder layer that LoRA can adapt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// The query projection `(H_q·Dh, D)`.
    QProj,
    /// The key projection `(H_k·Dh, D)`.
    KProj,
    /// The value projection `(H_k·Dh, D)`.
    VProj,
    /// The attention's output projection `(D, H_q·Dh)`.
    OProj,
    /// The SwiGLU gate `(I, D)`.
    GateProj,
    /// The SwiGLU up projection `(I, D)`.
    UpProj,
    /// The SwiGLU down projection `(D, I)`.
    DownProj,
}

impl Target {
    /// Every target, in the order of a layer's forward pass.
    pub const ALL: [Target; 7] = [
        Target::QProj,
        Target::KProj,
        Target::VProj,
        Target::OProj,
        Target::GateProj,
        Target::UpProj,
        Target::DownProj,
    ];

    /// The module name (`q_proj`).
    pub fn name(self) -> &'static str {
        match self {
            Target::QProj => "q_proj",
            Target::KProj => "k_proj",
            Target::VProj => "v_proj",
            Target::OProj => "o_proj",
            Target::GateProj => "gate_proj",
            Target::UpProj => "up_proj",
            Target::DownProj => "down_proj",
        }
    }

    /// The block holding it in a Hugging Face layer (`self_attn` or `mlp`).
    pub fn block(self) -> &'static str {
        match self {
            Target::QProj | Target::KProj | Target::VProj | Target::OProj => "self_attn",
            Target::GateProj | Target::UpProj | Target::DownProj => "mlp",
        }
    }

    /// `(in, out)` of the projection in a model of config `cfg`.
    pub fn dims(self, cfg: &DecoderConfig) -> (usize, usize) {
        let d = cfg.hidden_size;
        let q = cfg.num_heads * cfg.head_dim;
        let kv = cfg.num_kv_heads * cfg.head_dim;
        let i = cfg.intermediate_size;
        match self {
            Target::QProj => (d, q),
            Target::KProj | Target::VProj => (d, kv),
            Target::OProj => (q, d),
            Target::GateProj | Target::UpProj => (d, i),
            Target::DownProj => (i, d),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Target {
    type Err = TuneError;

    fn from_str(s: &str) -> Result<Target> {
        let s = s.trim();
        Target::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| TuneError::UnknownTarget(s.to_string()))
    }
}

/// Parses a comma-separated list of targets (`q_proj,v_proj`), in the order
/// given.
///
/// # Errors
/// [`TuneError::UnknownTarget`], [`TuneError::DuplicateTarget`],
/// [`TuneError::NoTargets`].
pub fn parse_targets(s: &str) -> Result<Vec<Target>> {
    let targets = s
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(str::parse)
        .collect::<Result<Vec<Target>>>()?;
    check_targets(&targets)?;
    Ok(targets)
}

fn check_targets(targets: &[Target]) -> Result<()> {
    if targets.is_empty() {
        return Err(TuneError::NoTargets);
    }
    for (i, t) in targets.iter().enumerate() {
        if targets[..i].contains(t) {
            return Err(TuneError::DuplicateTarget(t.name()));
        }
    }
    Ok(())
}

/// Which of the two factors of an adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Factor {
    /// `A`, `(r, in)`: the input's projection to rank `r`.
    A,
    /// `B`, `(out, r)`: back to the output width.
    B,
}

/// PEFT's name of a factor:
/// `base_model.model.model.layers.{layer}.{block}.{target}.lora_{A|B}.weight`.
pub fn adapter_name(layer: usize, target: Target, factor: Factor) -> String {
    let f = match factor {
        Factor::A => "A",
        Factor::B => "B",
    };
    format!(
        "base_model.model.model.layers.{layer}.{}.{}.lora_{f}.weight",
        target.block(),
        target.name()
    )
}

/// Smallest adapter scale (`alpha/r`, or `alpha/√r` with rsLoRA)
/// accepted: 1/1024. Below it an adapter changes nothing measurable.
pub const MIN_SCALE: f64 = 1.0 / 1024.0;
/// Largest adapter scale accepted: 256. Published adapters use 1/4 (QLoRA:
/// r 64, alpha 16) to 2 (LongLoRA, alpha = 2r) or a few times that; a
/// scale past 256 multiplies the update `B·A` beyond any trained model's
/// weights, and one like `1e38/8` overflows `f32` outright.
pub const MAX_SCALE: f64 = 256.0;

/// Checks an adapter scale (`alpha/r`, or `alpha/√r` when `rslora`)
/// against [`MIN_SCALE`] and [`MAX_SCALE`].
///
/// # Errors
/// [`TuneError::Scale`].
pub fn check_scale(scale: f64, rslora: bool) -> Result<()> {
    if !(scale.is_finite() && (MIN_SCALE..=MAX_SCALE).contains(&scale)) {
        return Err(TuneError::Scale { scale, rslora });
    }
    Ok(())
}

/// A LoRA configuration, with PEFT's `LoraConfig` defaults ([`Default`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// The rank `r` of every adapter (PEFT's `r`; default 8).
    pub rank: usize,
    /// The numerator of the scaling `alpha/r` (PEFT's `lora_alpha`;
    /// default 8).
    pub alpha: f64,
    /// Dropout probability on an adapter's input while training (PEFT's
    /// `lora_dropout`; default 0).
    pub dropout: f64,
    /// The projections adapted in every layer (PEFT's `target_modules`;
    /// default `q_proj`, `v_proj`, PEFT's choice for Llama and Qwen2).
    pub targets: Vec<Target>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 8,
            alpha: 8.0,
            dropout: 0.0,
            targets: vec![Target::QProj, Target::VProj],
        }
    }
}

impl LoraConfig {
    /// The checks that need no model: rank at least 1, alpha finite and
    /// above 0, the scale `alpha/r` in [[`MIN_SCALE`], [`MAX_SCALE`]],
    /// dropout in `[0, 1)`, targets non-empty without repeats.
    ///
    /// # Errors
    /// [`TuneError::Rank`], [`TuneError::Alpha`], [`TuneError::Scale`],
    /// [`TuneError::Dropout`], [`TuneError::NoTargets`],
    /// [`TuneError::DuplicateTarget`].
    pub fn validate(&self) -> Result<()> {
        if self.rank == 0 {
            return Err(TuneError::Rank {
                rank: 0,
                max: usize::MAX,
                target: "any layer",
            });
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(TuneError::Alpha(self.alpha));
        }
        check_scale(self.scaling(), false)?;
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(TuneError::Dropout(self.dropout));
        }
        check_targets(&self.targets)
    }

    /// [`validate`](Self::validate), and the rank against every targeted
    /// projection of `cfg`'s model: at most its smaller dimension.
    ///
    /// # Errors
    /// As [`validate`](Self::validate).
    pub fn validate_for(&self, cfg: &DecoderConfig) -> Result<()> {
        self.validate()?;
        for &t in &self.targets {
            let (i, o) = t.dims(cfg);
            let max = i.min(o);
            if self.rank > max {
                return Err(TuneError::Rank {
                    rank: self.rank,
                    max,
                    target: t.name(),
                });
            }
        }
        Ok(())
    }

    /// The factor `alpha/r` multiplying every adapter's output.
    pub fn scaling(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Whether `target` is adapted.
    pub fn targets(&self, target: Target) -> bool {
        self.targets.contains(&target)
    }
}

/// PEFT's initial factors of one adapter: `A` `(rank, d_in)` uniform on
/// `(−1/√d_in, 1/√d_in)` (kaiming-uniform with `a = √5`), `B` `(d_out,
/// rank)` zero. Row-major.
pub fn init_factors(
    rank: usize,
    d_in: usize,
    d_out: usize,
    rng: &mut StdRng,
) -> (Vec<f32>, Vec<f32>) {
    // kaiming_uniform_(a=√5): gain √(2/(1+a²)) = √(1/3), bound gain·√(3/fan_in).
    let bound = 1.0 / (d_in as f64).sqrt();
    let a = (0..rank * d_in)
        .map(|_| rng.random_range(-bound..bound) as f32)
        .collect();
    (a, vec![0f32; d_out * rank])
}

/// Inverted dropout (as `torch.nn.Dropout` in training): each element of
/// `x` kept with probability `1 − p` and scaled by `1/(1 − p)`, the others
/// zeroed. The mask is a constant: the gradient flows through the kept
/// elements only.
///
/// # Errors
/// Candle's.
pub fn dropout(x: &Tensor, p: f64, rng: &mut StdRng) -> Result<Tensor> {
    if p <= 0.0 {
        return Ok(x.clone());
    }
    let keep = (1.0 / (1.0 - p)) as f32;
    let mask: Vec<f32> = (0..x.elem_count())
        .map(|_| if rng.random::<f64>() < p { 0.0 } else { keep })
        .collect();
    let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
    Ok(x.mul(&mask)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn defaults_are_pefts() {
        let c = LoraConfig::default();
        assert_eq!((c.rank, c.alpha, c.dropout), (8, 8.0, 0.0));
        assert_eq!(c.targets, vec![Target::QProj, Target::VProj]);
        assert_eq!(c.scaling(), 1.0);
        c.validate().unwrap();
        let c = LoraConfig {
            rank: 4,
            ..Default::default()
        };
        assert_eq!(c.scaling(), 2.0);
    }

    #[test]
    fn invalid_configs_are_typed_errors() {
        let bad = |f: &dyn Fn(&mut LoraConfig)| {
            let mut c = LoraConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(matches!(
            bad(&|c| c.rank = 0),
            TuneError::Rank { rank: 0, .. }
        ));
        assert!(matches!(bad(&|c| c.alpha = 0.0), TuneError::Alpha(_)));
        assert!(matches!(bad(&|c| c.alpha = f64::NAN), TuneError::Alpha(_)));
        // Finite but implausible scales alpha/r.
        for alpha in [1e38, 8.0 * 257.0, 1e-3] {
            let e = bad(&|c| c.alpha = alpha);
            assert!(matches!(e, TuneError::Scale { .. }), "{alpha}: {e}");
            assert!(e.to_string().contains("[0.0009765625, 256]"), "{e}");
        }
        let mut ok = LoraConfig::default();
        for alpha in [8.0 / 1024.0, 8.0 * 256.0, 16.0] {
            ok.alpha = alpha;
            ok.validate().unwrap();
        }
        assert!(matches!(bad(&|c| c.dropout = 1.0), TuneError::Dropout(_)));
        assert!(matches!(bad(&|c| c.dropout = -0.1), TuneError::Dropout(_)));
        assert!(matches!(bad(&|c| c.targets.clear()), TuneError::NoTargets));
        assert!(matches!(
            bad(&|c| c.targets.push(Target::QProj)),
            TuneError::DuplicateTarget("q_proj")
        ));
    }

    #[test]
    fn targets_parse_by_module_name() {
        assert_eq!(
            parse_targets("q_proj, down_proj").unwrap(),
            vec![Target::QProj, Target::DownProj]
        );
        assert!(matches!(
            parse_targets("q_proj,lm_head"),
            Err(TuneError::UnknownTarget(n)) if n == "lm_head"
        ));
        assert!(matches!(parse_targets(""), Err(TuneError::NoTargets)));
        assert!(matches!(
            parse_targets("v_proj,v_proj"),
            Err(TuneError::DuplicateTarget("v_proj"))
        ));
        for t in Target::ALL {
            assert_eq!(t.name().parse::<Target>().unwrap(), t);
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(json, format!("\"{}\"", t.name()));
        }
    }

    #[test]
    fn names_follow_pefts_saved_adapters() {
        assert_eq!(
            adapter_name(3, Target::KProj, Factor::A),
            "base_model.model.model.layers.3.self_attn.k_proj.lora_A.weight"
        );
        assert_eq!(
            adapter_name(0, Target::UpProj, Factor::B),
            "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"
        );
    }

    #[test]
    fn initialisation_is_kaiming_uniform_and_zero_and_seeded() {
        let draw = |seed| init_factors(4, 100, 30, &mut StdRng::seed_from_u64(seed));
        let (a, b) = draw(7);
        assert_eq!((a.len(), b.len()), (400, 120));
        assert!(b.iter().all(|&v| v == 0.0));
        let bound = 0.1f32;
        assert!(a.iter().all(|v| v.abs() < bound));
        // The range is used: some values near each end, mean near 0.
        assert!(a.iter().any(|&v| v > 0.9 * bound) && a.iter().any(|&v| v < -0.9 * bound));
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert_eq!(draw(7).0, a);
        assert_ne!(draw(8).0, a);
    }

    #[test]
    fn dropout_keeps_the_expected_fraction_and_scales_it() {
        let x = Tensor::ones(10_000, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        let y = dropout(&x, 0.25, &mut rng)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let kept = y.iter().filter(|&&v| v != 0.0).count();
        assert!((7300..7700).contains(&kept), "kept {kept}");
        assert!(y.iter().all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6));
        let same = dropout(&x, 0.0, &mut rng)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert!(same.iter().all(|&v| v == 1.0));
    }
}
