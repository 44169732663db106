//! RoPE scalings chosen by name, as a command line or a results table
//! writes them: `model`, `none`, `linear:F` (or `pi:F`), `dynamic:F`,
//! `ntk:F`, `yarn:F`, optionally with a training-free attention method
//! ([`ContextMethod`]) joined by `+` (`dca:6144:1024+yarn:2`).
//!
//! | name | frequencies | paper |
//! |---|---|---|
//! | `model` | the model's own RoPE, unchanged | |
//! | `none` | plain RoPE: the model's base, no scaling | Su et al. 2021 |
//! | `linear:F`, `pi:F` | every frequency divided by `F` | Chen et al. 2023 (position interpolation) |
//! | `dynamic:F` | the base grows with the length past the trained one | bloc97 / emozilla 2023 (dynamic NTK) |
//! | `ntk:F` | the base multiplied by `F^(d/(d−2))` at every length | bloc97 2023 (NTK-aware scaling) |
//! | `yarn:F` | NTK-by-parts interpolation and an attention factor `0.1·ln F + 1` (β_fast 32, β_slow 1) | Peng et al. 2023 (YaRN) |
//!
//! Every factor is relative to the model's trained length, which
//! [`ScalingKind::rope_scaling`] and [`ScalingKind::rope_config`] take as an
//! argument; the scalings are the ones [`RopeScaling::from_factor`] builds,
//! with the defaults transformers gives a config that states only
//! `rope_type` and `factor`.
//!
//! [`NamedScaling`] is the whole name (scaling and method), [`ScalingKind`]
//! its frequency part, [`FactorScaling`] the family of a scaling set by one
//! factor (the lab's fine-tuning records it apart from the factor, which
//! it stretches with the length). All three parse with [`FromStr`], print
//! with [`Display`](fmt::Display) in a canonical form that parses back to
//! the same value, and serialise with serde as that string.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{RopeScaling, YarnParams};
use crate::error::{Error, Result};
use crate::extend::{self, ContextMethod};
use crate::rope::RopeConfig;

/// Largest factor a named scaling (and any scaling factor read from a
/// model file) accepts: 1024, sixteen times the largest extension
/// published (64).
pub const MAX_FACTOR: f64 = 1024.0;

/// Smallest factor accepted: 1/1024 (0.0009765625). transformers takes any
/// float (it warns below 1); below this the tables degenerate — `θ/s`
/// overflows `f32` with `linear:1e-300`, YaRN's interpolated frequencies
/// reach 10^30 with `yarn:1e-30` — while factors from 1e-3 up (a
/// compression, as in the lab's experiments) still give usable tables.
pub const MIN_FACTOR: f64 = 1.0 / MAX_FACTOR;

/// Why a scaling name does not parse (an attention method's own errors are
/// [`Error::InvalidValue`], from [`ContextMethod`]'s parser).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ScalingNameError {
    /// Empty, or more than two parts joined by `+`.
    #[error("scaling {name:?}: expected SCALING, METHOD or METHOD+SCALING")]
    Syntax {
        /// The name given.
        name: String,
    },
    /// Two attention methods or two frequency scalings joined by `+`.
    #[error("scaling {name:?}: at most one attention method and one frequency scaling")]
    TwoOfAKind {
        /// The name given.
        name: String,
    },
    /// Dynamic NTK with an attention method.
    #[error(
        "scaling {name:?}: dynamic NTK changes the frequencies with the length, \
         which the attention methods' remapped positions do not define"
    )]
    DynamicWithMethod {
        /// The name given.
        name: String,
    },
    /// A factor that does not parse as a number.
    #[error("scaling {name:?}: factor {factor:?} is not a number")]
    FactorNotANumber {
        /// The scaling part of the name (`yarn:x`).
        name: String,
        /// The factor as written.
        factor: String,
    },
    /// A factor that is not finite or outside [`MIN_FACTOR`]..=[`MAX_FACTOR`].
    #[error(
        "scaling {name:?}: the factor must be in [{MIN_FACTOR}, {MAX_FACTOR}] (1/1024 to 1024; \
         below 1/1024 the frequency tables degenerate)"
    )]
    FactorOutOfRange {
        /// The scaling part of the name (`yarn:0`).
        name: String,
        /// The factor given.
        factor: f64,
    },
    /// A scaling set by a factor, named without one (`yarn`).
    #[error("scaling {name:?} needs a factor, as in {name}:2")]
    NeedsFactor {
        /// The scaling part of the name.
        name: String,
    },
    /// Neither a scaling nor an attention method.
    #[error(
        "unknown scaling {name:?}: use model, none, linear:F, dynamic:F, ntk:F or yarn:F, \
         or an attention method: {}",
        extend::SYNTAX
    )]
    Unknown {
        /// The scaling part of the name.
        name: String,
    },
    /// Not the name of a scaling set by one factor ([`FactorScaling`]).
    #[error("unknown scaling {name:?}: use linear (or pi), dynamic, ntk or yarn")]
    UnknownFactorScaling {
        /// The name given.
        name: String,
    },
}

/// The family of a RoPE scaling set by one factor, without the factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FactorScaling {
    /// Position interpolation (Chen et al. 2023): every frequency divided by
    /// the factor ([`RopeScaling::Linear`]).
    Linear,
    /// Dynamic NTK (bloc97, emozilla 2023): the base grows with the
    /// sequence length past the trained length ([`RopeScaling::Dynamic`]).
    Dynamic,
    /// NTK-aware scaling (bloc97 2023): the base multiplied by
    /// `F^(d/(d−2))` at every length ([`RopeScaling::Ntk`]).
    Ntk,
    /// YaRN (Peng et al. 2023): NTK-by-parts interpolation and an attention
    /// factor ([`RopeScaling::Yarn`]).
    Yarn,
}

impl FactorScaling {
    /// Every family, in the order `linear`, `dynamic`, `ntk`, `yarn`.
    pub const ALL: [FactorScaling; 4] = [
        FactorScaling::Linear,
        FactorScaling::Dynamic,
        FactorScaling::Ntk,
        FactorScaling::Yarn,
    ];

    /// The canonical name (`linear`, `dynamic`, `ntk`, `yarn`); [`FromStr`]
    /// also takes `pi` for `linear`.
    pub fn name(self) -> &'static str {
        match self {
            FactorScaling::Linear => "linear",
            FactorScaling::Dynamic => "dynamic",
            FactorScaling::Ntk => "ntk",
            FactorScaling::Yarn => "yarn",
        }
    }

    /// The family named exactly `name` (`linear` or `pi`, `dynamic`, `ntk`,
    /// `yarn`), `None` for any other name.
    pub fn from_name(name: &str) -> Option<FactorScaling> {
        match name {
            "linear" | "pi" => Some(FactorScaling::Linear),
            "dynamic" => Some(FactorScaling::Dynamic),
            "ntk" => Some(FactorScaling::Ntk),
            "yarn" => Some(FactorScaling::Yarn),
            _ => None,
        }
    }

    /// This family with `factor`.
    pub fn with_factor(self, factor: f64) -> ScalingKind {
        match self {
            FactorScaling::Linear => ScalingKind::Linear(factor),
            FactorScaling::Dynamic => ScalingKind::Dynamic(factor),
            FactorScaling::Ntk => ScalingKind::Ntk(factor),
            FactorScaling::Yarn => ScalingKind::Yarn(factor),
        }
    }

    /// The scaling extending a model trained at `trained_len` tokens by
    /// `factor`, every other parameter at the default transformers gives a
    /// config that states only `rope_type` and `factor`: dynamic NTK
    /// unscaled up to `trained_len`; NTK with `alpha = factor`; YaRN with
    /// β_fast 32, β_slow 1, the attention factor derived from `factor` and
    /// the correction range rounded outwards. Not validated yet
    /// ([`RopeConfig::with_scaling`] checks it).
    pub fn rope_scaling(self, factor: f64, trained_len: usize) -> RopeScaling {
        match self {
            FactorScaling::Linear => RopeScaling::Linear { factor },
            FactorScaling::Dynamic => RopeScaling::Dynamic {
                factor,
                max_position_embeddings: trained_len,
            },
            FactorScaling::Ntk => RopeScaling::Ntk { alpha: factor },
            FactorScaling::Yarn => RopeScaling::Yarn(YarnParams::new(factor, trained_len)),
        }
    }
}

impl fmt::Display for FactorScaling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FactorScaling {
    type Err = Error;

    /// Parses `linear` (or `pi`), `dynamic`, `ntk` or `yarn`.
    ///
    /// # Errors
    /// [`ScalingNameError::UnknownFactorScaling`] for any other name.
    fn from_str(s: &str) -> Result<FactorScaling> {
        let s = s.trim();
        FactorScaling::from_name(s).ok_or_else(|| {
            ScalingNameError::UnknownFactorScaling {
                name: s.to_string(),
            }
            .into()
        })
    }
}

/// What a named scaling does to a model's RoPE frequencies (the part of a
/// [`NamedScaling`] before or after its attention method).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScalingKind {
    /// The model's own RoPE, unchanged (`model`).
    Model,
    /// Plain RoPE: the model's base, no scaling (`none`).
    None,
    /// Position interpolation (Chen et al. 2023), `linear:F` or `pi:F`.
    Linear(f64),
    /// Dynamic NTK (bloc97, emozilla 2023; transformers' `dynamic`),
    /// `dynamic:F`.
    Dynamic(f64),
    /// NTK-aware base scaling (bloc97 2023), `ntk:F`.
    Ntk(f64),
    /// YaRN (Peng et al. 2023), `yarn:F`.
    Yarn(f64),
}

impl ScalingKind {
    /// The family and factor, `None` for [`ScalingKind::Model`] and
    /// [`ScalingKind::None`].
    pub fn factor_scaling(self) -> Option<(FactorScaling, f64)> {
        match self {
            ScalingKind::Model | ScalingKind::None => None,
            ScalingKind::Linear(f) => Some((FactorScaling::Linear, f)),
            ScalingKind::Dynamic(f) => Some((FactorScaling::Dynamic, f)),
            ScalingKind::Ntk(f) => Some((FactorScaling::Ntk, f)),
            ScalingKind::Yarn(f) => Some((FactorScaling::Yarn, f)),
        }
    }

    /// The factor, `None` for [`ScalingKind::Model`] and
    /// [`ScalingKind::None`].
    pub fn factor(self) -> Option<f64> {
        self.factor_scaling().map(|(_, f)| f)
    }

    /// The scaling that replaces a model's own for a model trained at
    /// `trained_len` tokens ([`FactorScaling::rope_scaling`]):
    /// [`RopeScaling::Default`] for `none`, `None` for `model` (the model's
    /// own scaling stays).
    pub fn rope_scaling(self, trained_len: usize) -> Option<RopeScaling> {
        match self {
            ScalingKind::Model => None,
            ScalingKind::None => Some(RopeScaling::Default),
            k => k
                .factor_scaling()
                .map(|(family, f)| family.rope_scaling(f, trained_len)),
        }
    }

    /// A model's RoPE (`own`, trained at `trained_len` tokens) with this
    /// scaling on top: `own` itself for `model`; otherwise the same base,
    /// rotary and head dimensions and pair layout, `max_position_embeddings`
    /// set to `trained_len`, and this scaling in place of the model's own.
    ///
    /// # Errors
    /// [`RopeConfig::with_scaling`]'s validation (a factor that is not
    /// finite and > 0, a rotary dimension of 2 with NTK scaling, ...).
    pub fn rope_config(self, own: &RopeConfig, trained_len: usize) -> Result<RopeConfig> {
        let Some(scaling) = self.rope_scaling(trained_len) else {
            return Ok(own.clone());
        };
        let plain = RopeConfig::new(own.theta(), own.rotary_dim())?
            .with_head_dim(own.head_dim())
            .with_layout(own.layout())
            .with_max_position_embeddings(trained_len);
        match scaling {
            RopeScaling::Default => Ok(plain),
            s => plain.with_scaling(s),
        }
    }
}

impl fmt::Display for ScalingKind {
    /// `model`, `none` or `FAMILY:F` (`linear`, never `pi`), the factor
    /// printed so that it parses back to the same `f64`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.factor_scaling() {
            Some((family, factor)) => write!(f, "{family}:{factor}"),
            None if *self == ScalingKind::Model => f.write_str("model"),
            None => f.write_str("none"),
        }
    }
}

impl FromStr for ScalingKind {
    type Err = Error;

    /// Parses one frequency scaling: `model`, `none`, `linear:F`, `pi:F`,
    /// `dynamic:F`, `ntk:F` or `yarn:F`, with `F` in
    /// [[`MIN_FACTOR`], [`MAX_FACTOR`]].
    ///
    /// # Errors
    /// [`ScalingNameError::FactorNotANumber`],
    /// [`ScalingNameError::FactorOutOfRange`],
    /// [`ScalingNameError::NeedsFactor`] or [`ScalingNameError::Unknown`].
    fn from_str(s: &str) -> Result<ScalingKind> {
        let s = s.trim();
        let (kind, factor) = match s.split_once(':') {
            Some((k, f)) => {
                let factor: f64 =
                    f.trim()
                        .parse()
                        .map_err(|_| ScalingNameError::FactorNotANumber {
                            name: s.to_string(),
                            factor: f.to_string(),
                        })?;
                if !(factor.is_finite() && (MIN_FACTOR..=MAX_FACTOR).contains(&factor)) {
                    return Err(ScalingNameError::FactorOutOfRange {
                        name: s.to_string(),
                        factor,
                    }
                    .into());
                }
                (k.trim(), Some(factor))
            }
            None => (s, None),
        };
        let family = match (kind, factor) {
            ("model", None) => return Ok(ScalingKind::Model),
            ("none", None) => return Ok(ScalingKind::None),
            _ => FactorScaling::from_name(kind).ok_or_else(|| ScalingNameError::Unknown {
                name: s.to_string(),
            })?,
        };
        let factor = factor.ok_or_else(|| ScalingNameError::NeedsFactor {
            name: s.to_string(),
        })?;
        Ok(family.with_factor(factor))
    }
}

/// A RoPE scaling by name: what it does to the frequencies and, optionally,
/// a training-free attention method run with it.
///
/// Syntax: a scaling (`yarn:2`, see [`ScalingKind`]), a method
/// (`self-extend:4:512`, see [`ContextMethod`]), or both joined by `+` in
/// either order (`dca:6144:1024+yarn:2`). A method alone runs over the
/// model's own RoPE (`model`), as the Self-Extend, ReRoPE and sinks patches
/// use the model's rotary embedding — except dual chunk attention, which
/// runs over plain RoPE (`none`), as ChunkLlama rebuilds its tables from the
/// base. Dynamic NTK takes no method: its frequencies change with the
/// length, which the methods' remapped positions do not define.
///
/// [`Display`](fmt::Display) gives the canonical form (the method first,
/// the scaling after a `+` unless it is the method's default; `linear`, not
/// `pi`), which parses back to the same value; serde writes and reads that
/// string.
///
/// ```
/// use posenc::rope::{NamedScaling, ScalingKind};
///
/// let s: NamedScaling = "yarn:2 + dca:6144:1024".parse()?;
/// assert_eq!(s.kind, ScalingKind::Yarn(2.0));
/// assert_eq!(s.to_string(), "dca:6144:1024+yarn:2");
/// assert_eq!("pi:4".parse::<NamedScaling>()?.to_string(), "linear:4");
/// # Ok::<(), posenc::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NamedScaling {
    /// What it does to the frequencies.
    pub kind: ScalingKind,
    /// The attention method, if any.
    pub method: Option<ContextMethod>,
}

impl NamedScaling {
    /// A frequency scaling with no attention method.
    pub fn new(kind: ScalingKind) -> NamedScaling {
        NamedScaling { kind, method: None }
    }

    /// The frequency scaling a method runs over when the name gives none:
    /// plain RoPE for dual chunk attention, the model's own for the others.
    pub fn default_kind(method: &ContextMethod) -> ScalingKind {
        match method {
            ContextMethod::Dca { .. } => ScalingKind::None,
            _ => ScalingKind::Model,
        }
    }

    /// The scaling that replaces a model's own
    /// ([`ScalingKind::rope_scaling`]).
    pub fn rope_scaling(&self, trained_len: usize) -> Option<RopeScaling> {
        self.kind.rope_scaling(trained_len)
    }

    /// A model's RoPE with this scaling on top
    /// ([`ScalingKind::rope_config`]).
    ///
    /// # Errors
    /// As [`ScalingKind::rope_config`].
    pub fn rope_config(&self, own: &RopeConfig, trained_len: usize) -> Result<RopeConfig> {
        self.kind.rope_config(own, trained_len)
    }
}

impl From<ScalingKind> for NamedScaling {
    fn from(kind: ScalingKind) -> NamedScaling {
        NamedScaling::new(kind)
    }
}

impl fmt::Display for NamedScaling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.method {
            None => write!(f, "{}", self.kind),
            Some(m) if self.kind == NamedScaling::default_kind(m) => write!(f, "{m}"),
            Some(m) => write!(f, "{m}+{}", self.kind),
        }
    }
}

impl FromStr for NamedScaling {
    type Err = Error;

    /// Parses `SCALING`, `METHOD`, `METHOD+SCALING` or `SCALING+METHOD`.
    ///
    /// # Errors
    /// [`ScalingNameError`]'s variants (the scaling's, and
    /// [`ScalingNameError::Syntax`], [`ScalingNameError::TwoOfAKind`],
    /// [`ScalingNameError::DynamicWithMethod`]); the method's own
    /// ([`Error::InvalidValue`]).
    fn from_str(s: &str) -> Result<NamedScaling> {
        let s = s.trim();
        let name = || s.to_string();
        let parts: Vec<&str> = s.split('+').map(str::trim).collect();
        if parts.len() > 2 || parts.iter().any(|p| p.is_empty()) {
            return Err(ScalingNameError::Syntax { name: name() }.into());
        }
        let (methods, scalings): (Vec<&str>, Vec<&str>) =
            parts.iter().partition(|p| extend::is_method_name(p));
        if methods.len() > 1 || scalings.len() > 1 {
            return Err(ScalingNameError::TwoOfAKind { name: name() }.into());
        }
        let method = methods
            .first()
            .map(|m| m.parse::<ContextMethod>())
            .transpose()?;
        let kind = match (scalings.first(), &method) {
            (Some(k), _) => k.parse::<ScalingKind>()?,
            (None, Some(m)) => NamedScaling::default_kind(m),
            // Unreachable: one part at least, a method or a scaling.
            (None, None) => return Err(ScalingNameError::Syntax { name: name() }.into()),
        };
        if method.is_some() && matches!(kind, ScalingKind::Dynamic(_)) {
            return Err(ScalingNameError::DynamicWithMethod { name: name() }.into());
        }
        Ok(NamedScaling { kind, method })
    }
}

/// Serialises and deserialises as the string form ([`Display`](fmt::Display)
/// and [`FromStr`]).
macro_rules! serde_as_string {
    ($($t:ty),*) => {$(
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    )*};
}

serde_as_string!(FactorScaling, ScalingKind, NamedScaling);

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> Error {
        s.parse::<NamedScaling>().unwrap_err()
    }

    fn name_err(s: &str) -> ScalingNameError {
        match err(s) {
            Error::ScalingName(e) => e,
            other => panic!("{s}: {other}"),
        }
    }

    #[test]
    fn parses_every_form() {
        let p = |s: &str| s.parse::<NamedScaling>().unwrap();
        assert_eq!(p("model"), NamedScaling::new(ScalingKind::Model));
        assert_eq!(p(" none "), NamedScaling::new(ScalingKind::None));
        assert_eq!(p("linear:2").kind, ScalingKind::Linear(2.0));
        assert_eq!(p("pi : 2.5").kind, ScalingKind::Linear(2.5));
        assert_eq!(p("dynamic:4").kind, ScalingKind::Dynamic(4.0));
        assert_eq!(p("ntk:8").kind, ScalingKind::Ntk(8.0));
        assert_eq!(p("yarn:1024").kind, ScalingKind::Yarn(1024.0));
        let se = ContextMethod::SelfExtend {
            group: 4,
            window: 512,
        };
        assert_eq!(
            p("self-extend:4:512"),
            NamedScaling {
                kind: ScalingKind::Model,
                method: Some(se)
            }
        );
        let dca = ContextMethod::Dca {
            chunk: 6144,
            local: 1024,
        };
        assert_eq!(p("dca:6144:1024").kind, ScalingKind::None);
        assert_eq!(p("dca:6144:1024+yarn:2"), p("yarn:2+dca:6144:1024"));
        assert_eq!(p("yarn:2 + dca:6144:1024").method, Some(dca));
    }

    #[test]
    fn display_is_canonical_and_round_trips() {
        for (name, canonical) in [
            ("model", "model"),
            ("none", "none"),
            ("linear:2", "linear:2"),
            ("pi:2", "linear:2"),
            ("linear:2.0", "linear:2"),
            ("dynamic:0.5", "dynamic:0.5"),
            ("ntk:1e1", "ntk:10"),
            ("yarn:3.3333333333333335", "yarn:3.3333333333333335"),
            ("yarn:0.1", "yarn:0.1"),
            ("self-extend:4:512", "self-extend:4:512"),
            ("self-extend:4:512+model", "self-extend:4:512"),
            ("self-extend:4:512+none", "self-extend:4:512+none"),
            ("rerope:512+linear:2", "rerope:512+linear:2"),
            ("dca:6144:1024", "dca:6144:1024"),
            ("dca:6144:1024+none", "dca:6144:1024"),
            ("dca:6144:1024+model", "dca:6144:1024+model"),
            ("yarn:2+dca:6144:1024", "dca:6144:1024+yarn:2"),
            ("sinks:4:1024+ntk:4", "sinks:4:1024+ntk:4"),
        ] {
            let s: NamedScaling = name.parse().unwrap();
            assert_eq!(s.to_string(), canonical, "{name}");
            assert_eq!(canonical.parse::<NamedScaling>().unwrap(), s, "{name}");
        }
        for k in [
            ScalingKind::Model,
            ScalingKind::None,
            ScalingKind::Linear(1.0 / 3.0),
            ScalingKind::Dynamic(1e-3),
            ScalingKind::Ntk(7.25),
            ScalingKind::Yarn(MAX_FACTOR),
        ] {
            assert_eq!(k.to_string().parse::<ScalingKind>().unwrap(), k);
        }
        for f in FactorScaling::ALL {
            assert_eq!(f.to_string().parse::<FactorScaling>().unwrap(), f);
            assert_eq!(f.with_factor(2.0).factor_scaling(), Some((f, 2.0)));
        }
        assert_eq!(
            "pi".parse::<FactorScaling>().unwrap(),
            FactorScaling::Linear
        );
    }

    #[test]
    fn serde_is_the_string_form() {
        let s: NamedScaling = "yarn:2+dca:6144:1024".parse().unwrap();
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, r#""dca:6144:1024+yarn:2""#);
        assert_eq!(serde_json::from_str::<NamedScaling>(&json).unwrap(), s);
        let all: Vec<NamedScaling> =
            serde_json::from_str(r#"["model", "none", "pi:2", "ntk:4", "rerope:64"]"#).unwrap();
        assert_eq!(
            serde_json::to_string(&all).unwrap(),
            r#"["model","none","linear:2","ntk:4","rerope:64"]"#
        );
        let k = ScalingKind::Dynamic(2.5);
        let json = serde_json::to_string(&k).unwrap();
        assert_eq!(json, r#""dynamic:2.5""#);
        assert_eq!(serde_json::from_str::<ScalingKind>(&json).unwrap(), k);
        for f in FactorScaling::ALL {
            let json = serde_json::to_string(&f).unwrap();
            assert_eq!(json, format!("\"{}\"", f.name()));
            assert_eq!(serde_json::from_str::<FactorScaling>(&json).unwrap(), f);
        }
        assert_eq!(
            serde_json::from_str::<FactorScaling>(r#""pi""#).unwrap(),
            FactorScaling::Linear
        );
        // A bad string is a serde error carrying the parser's message.
        let e = serde_json::from_str::<NamedScaling>(r#""yarn""#).unwrap_err();
        assert!(e.to_string().contains("needs a factor"), "{e}");
        let e = serde_json::from_str::<FactorScaling>(r#""magic""#).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
        assert!(serde_json::from_str::<NamedScaling>("2").is_err());
    }

    #[test]
    fn every_error_has_its_variant_and_wording() {
        // Unknown names, a factor on model or none.
        for s in ["rope:2", "foo", "model:2", "none:2", "llama3:8"] {
            assert_eq!(name_err(s), ScalingNameError::Unknown { name: s.into() });
        }
        assert_eq!(
            err("rope:2").to_string(),
            format!(
                "unknown scaling \"rope:2\": use model, none, linear:F, dynamic:F, ntk:F or \
                 yarn:F, or an attention method: {}",
                extend::SYNTAX
            )
        );
        // A missing factor.
        for s in ["linear", "pi", "dynamic", "ntk", "yarn"] {
            assert_eq!(
                name_err(s),
                ScalingNameError::NeedsFactor { name: s.into() }
            );
        }
        assert_eq!(
            err("yarn").to_string(),
            "scaling \"yarn\" needs a factor, as in yarn:2"
        );
        // A factor that is not a number.
        assert_eq!(
            name_err("yarn:x"),
            ScalingNameError::FactorNotANumber {
                name: "yarn:x".into(),
                factor: "x".into()
            }
        );
        assert_eq!(
            err("yarn:").to_string(),
            "scaling \"yarn:\": factor \"\" is not a number"
        );
        // Not finite, ≤ 0, above the maximum.
        for (s, f) in [
            ("yarn:0", 0.0),
            ("linear:-2", -2.0),
            ("ntk:1024.5", 1024.5),
            ("dynamic:inf", f64::INFINITY),
        ] {
            assert_eq!(
                name_err(s),
                ScalingNameError::FactorOutOfRange {
                    name: s.into(),
                    factor: f
                }
            );
        }
        assert!(matches!(
            name_err("yarn:NaN"),
            ScalingNameError::FactorOutOfRange { factor, .. } if factor.is_nan()
        ));
        assert_eq!(
            err("yarn:0").to_string(),
            "scaling \"yarn:0\": the factor must be in [0.0009765625, 1024] (1/1024 to 1024; \
             below 1/1024 the frequency tables degenerate)"
        );
        // Inside (0, 1024] but degenerate: refused, the range said.
        for s in [
            "yarn:1e-30",
            "linear:1e-300",
            "dynamic:0.0009",
            "ntk:5e-324",
        ] {
            let e = name_err(s);
            assert!(
                matches!(e, ScalingNameError::FactorOutOfRange { .. }),
                "{s}: {e}"
            );
            assert!(e.to_string().contains("1/1024 to 1024"), "{e}");
        }
        // Every factor from 1/1024 up is kept, and gives a finite table.
        let own = RopeConfig::new(10000.0, 64).unwrap();
        for s in [
            "yarn:0.0009765625",
            "linear:1e-3",
            "ntk:0.001",
            "dynamic:1e-3",
            "yarn:1024",
        ] {
            let k: ScalingKind = s.parse().unwrap();
            let f = k
                .rope_config(&own, 2048)
                .unwrap()
                .frequencies(None)
                .unwrap();
            assert!(f.inv_freq.iter().all(|v| v.is_finite()), "{s}");
        }
        // Syntax: empty, an empty part, three parts.
        for s in ["", "+", "yarn:2+", "rerope:8+yarn:2+none"] {
            assert_eq!(name_err(s), ScalingNameError::Syntax { name: s.into() });
        }
        assert_eq!(
            err("a+b+c").to_string(),
            "scaling \"a+b+c\": expected SCALING, METHOD or METHOD+SCALING"
        );
        // Two methods, two scalings.
        for s in ["rerope:8+sinks:4:64", "yarn:2+linear:2"] {
            assert_eq!(name_err(s), ScalingNameError::TwoOfAKind { name: s.into() });
        }
        assert_eq!(
            err("rerope:8+rerope:16").to_string(),
            "scaling \"rerope:8+rerope:16\": at most one attention method and one frequency scaling"
        );
        // Dynamic NTK with a method, in either order.
        for s in ["self-extend:4:512+dynamic:2", "dynamic:2+rerope:64"] {
            assert_eq!(
                name_err(s),
                ScalingNameError::DynamicWithMethod { name: s.into() }
            );
        }
        assert!(err("dynamic:2+rerope:64")
            .to_string()
            .contains("dynamic NTK changes the frequencies"));
        // The method's own errors pass through.
        assert!(matches!(
            err("self-extend:0:512"),
            Error::InvalidValue { .. }
        ));
        assert!(matches!(err("rerope:x+yarn:2"), Error::InvalidValue { .. }));
        // The family parser.
        assert_eq!(
            "magic".parse::<FactorScaling>().unwrap_err().to_string(),
            "unknown scaling \"magic\": use linear (or pi), dynamic, ntk or yarn"
        );
    }

    #[test]
    fn builds_the_scalings_of_from_factor() {
        let l = 4096;
        for f in FactorScaling::ALL {
            for factor in [0.5, 2.0, 8.0] {
                assert_eq!(
                    f.rope_scaling(factor, l),
                    RopeScaling::from_factor(f.name(), factor, l).unwrap()
                );
                assert_eq!(
                    f.with_factor(factor).rope_scaling(l),
                    Some(f.rope_scaling(factor, l))
                );
            }
        }
        assert_eq!(
            ScalingKind::None.rope_scaling(l),
            Some(RopeScaling::Default)
        );
        assert_eq!(ScalingKind::Model.rope_scaling(l), None);
    }

    #[test]
    fn rope_config_replaces_the_models_scaling() {
        let own = RopeConfig::new(500000.0, 64)
            .unwrap()
            .with_head_dim(128)
            .with_layout(crate::rope::PairLayout::Interleaved)
            .with_scaling(RopeScaling::Linear { factor: 8.0 })
            .unwrap();
        let l = 2048;
        let model = ScalingKind::Model.rope_config(&own, l).unwrap();
        assert_eq!(model, own);
        let none = ScalingKind::None.rope_config(&own, l).unwrap();
        assert_eq!(none.scaling(), &RopeScaling::Default);
        assert_eq!(none.theta(), own.theta());
        assert_eq!(none.rotary_dim(), 64);
        assert_eq!(none.head_dim(), 128);
        assert_eq!(none.layout(), own.layout());
        assert_eq!(none.max_position_embeddings(), Some(l));
        let yarn = ScalingKind::Yarn(4.0).rope_config(&own, l).unwrap();
        assert_eq!(
            yarn,
            none.clone()
                .with_scaling(FactorScaling::Yarn.rope_scaling(4.0, l))
                .unwrap()
        );
        let named: NamedScaling = "rerope:64+yarn:4".parse().unwrap();
        assert_eq!(named.rope_config(&own, l).unwrap(), yarn);
        assert_eq!(named.rope_scaling(l), yarn.scaling().clone().into());
        // A rotary dimension of 2 has no NTK exponent: posenc's validation.
        let tiny = RopeConfig::new(10000.0, 2).unwrap();
        assert!(ScalingKind::Ntk(2.0).rope_config(&tiny, l).is_err());
    }
}
