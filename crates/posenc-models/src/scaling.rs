//! The RoPE scaling a run applies on top of a pretrained model, chosen by
//! name: `model` (the config's own), `none`, `linear:F` (Position
//! Interpolation, Chen et al. 2023), `dynamic:F` (dynamic NTK, as
//! transformers' `dynamic` rope type), `ntk:F` (NTK-aware base scaling,
//! bloc97 2023), `yarn:F` (Peng et al. 2023, with the paper's and
//! transformers' defaults β_fast = 32, β_slow = 1, attention factor
//! 0.1·ln F + 1). Every factor is relative to the model's trained length
//! ([`DecoderConfig::trained_length`]).

use std::str::FromStr;

use posenc::extend::ContextMethod;
use posenc::rope::{RopeConfig, RopeScaling};

use crate::config::DecoderConfig;
use crate::error::{ModelError, Result};

/// Largest scaling factor accepted.
pub const MAX_FACTOR: f64 = 1024.0;

/// What a run does to the model's RoPE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScalingKind {
    /// The config's own RoPE, unchanged.
    Model,
    /// Plain RoPE: the config's base, no scaling.
    None,
    /// Position Interpolation: every frequency divided by the factor.
    Linear(f64),
    /// Dynamic NTK: the base grows with the sequence length past the
    /// trained length (transformers' `dynamic`).
    Dynamic(f64),
    /// NTK-aware: the base multiplied by `F^(d/(d−2))`, at every length.
    Ntk(f64),
    /// YaRN: NTK-by-parts interpolation and an attention factor.
    Yarn(f64),
}

/// A scaling with the name it was given (kept for tables and JSON keys),
/// and optionally a training-free attention method
/// ([`posenc::extend::ContextMethod`]) run with it.
///
/// Syntax: a scaling (`yarn:2`), a method (`self-extend:4:512`, over the
/// model's own RoPE, as the authors' patches use the model's rotary
/// embedding; dual chunk attention over plain RoPE, as ChunkLlama rebuilds
/// its tables from the base), or both joined by `+` (`dca:6144:1024+yarn:2`).
#[derive(Debug, Clone, PartialEq)]
pub struct Scaling {
    /// The name as written (`yarn:2`).
    pub name: String,
    /// What it does to the frequencies.
    pub kind: ScalingKind,
    /// The attention method, if any.
    pub method: Option<ContextMethod>,
}

impl FromStr for Scaling {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Scaling> {
        let s = s.trim();
        let parts: Vec<&str> = s.split('+').map(str::trim).collect();
        if parts.len() > 2 || parts.iter().any(|p| p.is_empty()) {
            return Err(ModelError::Invalid(format!(
                "scaling {s:?}: expected SCALING, METHOD or METHOD+SCALING"
            )));
        }
        let (methods, scalings): (Vec<&str>, Vec<&str>) = parts
            .iter()
            .partition(|p| posenc::extend::is_method_name(p));
        if methods.len() > 1 || scalings.len() > 1 {
            return Err(ModelError::Invalid(format!(
                "scaling {s:?}: at most one attention method and one frequency scaling"
            )));
        }
        let method = match methods.first() {
            Some(m) => Some(
                m.parse::<ContextMethod>()
                    .map_err(|e| ModelError::Invalid(e.to_string()))?,
            ),
            None => None,
        };
        let kind = match scalings.first() {
            Some(k) => parse_kind(k)?,
            None => match method {
                Some(ContextMethod::Dca { .. }) => ScalingKind::None,
                _ => ScalingKind::Model,
            },
        };
        if method.is_some() && matches!(kind, ScalingKind::Dynamic(_)) {
            return Err(ModelError::Invalid(format!(
                "scaling {s:?}: dynamic NTK changes the frequencies with the length, \
                 which the attention methods' remapped positions do not define"
            )));
        }
        Ok(Scaling {
            name: s.to_string(),
            kind,
            method,
        })
    }
}

/// Parses one frequency scaling (`none`, `yarn:2`, ...).
fn parse_kind(s: &str) -> Result<ScalingKind> {
    let (kind, factor) = match s.split_once(':') {
        Some((k, f)) => {
            let f: f64 = f.trim().parse().map_err(|_| {
                ModelError::Invalid(format!("scaling {s:?}: factor {f:?} is not a number"))
            })?;
            if !(f.is_finite() && f > 0.0 && f <= MAX_FACTOR) {
                return Err(ModelError::Invalid(format!(
                    "scaling {s:?}: the factor must be in (0, {MAX_FACTOR}]"
                )));
            }
            (k.trim(), Some(f))
        }
        None => (s, None),
    };
    let need = |f: Option<f64>| {
        f.ok_or_else(|| ModelError::Invalid(format!("scaling {s:?} needs a factor, as in {s}:2")))
    };
    let kind = match kind {
        "model" if factor.is_none() => ScalingKind::Model,
        "none" if factor.is_none() => ScalingKind::None,
        "linear" | "pi" => ScalingKind::Linear(need(factor)?),
        "dynamic" => ScalingKind::Dynamic(need(factor)?),
        "ntk" => ScalingKind::Ntk(need(factor)?),
        "yarn" => ScalingKind::Yarn(need(factor)?),
        _ => {
            return Err(ModelError::Invalid(format!(
                "unknown scaling {s:?}: use model, none, linear:F, dynamic:F, ntk:F or \
                     yarn:F, or an attention method: {}",
                posenc::extend::SYNTAX
            )))
        }
    };
    Ok(kind)
}

/// Parses a comma-separated list (`none,linear:2,yarn:2`), refusing
/// duplicates.
///
/// # Errors
/// [`ModelError::Invalid`] for an empty list, a bad entry or a duplicate.
pub fn parse_list(s: &str) -> Result<Vec<Scaling>> {
    let mut out: Vec<Scaling> = Vec::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let sc: Scaling = part.parse()?;
        if out.iter().any(|o| o.name == sc.name) {
            return Err(ModelError::Invalid(format!(
                "scaling {:?} given twice",
                sc.name
            )));
        }
        out.push(sc);
    }
    if out.is_empty() {
        return Err(ModelError::Invalid("no scaling given".into()));
    }
    Ok(out)
}

impl Scaling {
    /// The model's RoPE with this scaling on top: same base, rotary and head
    /// dimensions and pair layout; the scaling replaces the config's own
    /// (except for [`ScalingKind::Model`]).
    ///
    /// # Errors
    /// posenc's validation of the scaling.
    pub fn rope_config(&self, cfg: &DecoderConfig) -> Result<RopeConfig> {
        let own = &cfg.rope;
        let l = cfg.trained_length();
        let plain = RopeConfig::new(own.theta(), own.rotary_dim())?
            .with_head_dim(own.head_dim())
            .with_layout(own.layout())
            .with_max_position_embeddings(l);
        let scaling = match self.kind {
            ScalingKind::Model => return Ok(own.clone()),
            ScalingKind::None => return Ok(plain),
            ScalingKind::Linear(f) => RopeScaling::from_factor("linear", f, l)?,
            ScalingKind::Dynamic(f) => RopeScaling::from_factor("dynamic", f, l)?,
            ScalingKind::Ntk(f) => RopeScaling::from_factor("ntk", f, l)?,
            ScalingKind::Yarn(f) => RopeScaling::from_factor("yarn", f, l)?,
        };
        Ok(plain.with_scaling(scaling)?)
    }
}
