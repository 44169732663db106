//! The RoPE scaling a run applies on top of a pretrained model, chosen by
//! name: `model` (the config's own), `none`, `linear:F` (Position
//! Interpolation, Chen et al. 2023), `dynamic:F` (dynamic NTK, as
//! transformers' `dynamic` rope type), `ntk:F` (NTK-aware base scaling,
//! bloc97 2023), `yarn:F` (Peng et al. 2023, with the paper's and
//! transformers' defaults β_fast = 32, β_slow = 1, attention factor
//! 0.1·ln F + 1), optionally with a training-free attention method. Every
//! factor is relative to the model's trained length
//! ([`DecoderConfig::trained_length`]).
//!
//! The names are posenc's [`NamedScaling`] (parser, canonical form, serde);
//! [`Scaling`] adds the name as the user wrote it, which tables and JSON
//! keys use.

use std::fmt;
use std::str::FromStr;

use posenc::extend::ContextMethod;
use posenc::rope::{NamedScaling, RopeConfig};

use crate::config::DecoderConfig;
use crate::error::{ModelError, Result};

pub use posenc::rope::scaling::named::MAX_FACTOR;
/// What a run does to the model's RoPE (posenc's
/// [`ScalingKind`](posenc::rope::ScalingKind)).
pub use posenc::rope::ScalingKind;

/// A scaling with the name it was given (kept for tables and JSON keys),
/// and optionally a training-free attention method
/// ([`posenc::extend::ContextMethod`]) run with it.
///
/// Syntax ([`NamedScaling`]'s): a scaling (`yarn:2`), a method
/// (`self-extend:4:512`, over the model's own RoPE, as the authors' patches
/// use the model's rotary embedding; dual chunk attention over plain RoPE,
/// as ChunkLlama rebuilds its tables from the base), or both joined by `+`
/// (`dca:6144:1024+yarn:2`).
#[derive(Debug, Clone, PartialEq)]
pub struct Scaling {
    /// The name as written (`yarn:2`); [`Scaling::named`]'s `to_string()`
    /// is the canonical form.
    pub name: String,
    /// What it does to the frequencies.
    pub kind: ScalingKind,
    /// The attention method, if any.
    pub method: Option<ContextMethod>,
}

impl Scaling {
    /// The scaling without its name as written.
    pub fn named(&self) -> NamedScaling {
        NamedScaling {
            kind: self.kind,
            method: self.method,
        }
    }
}

impl From<NamedScaling> for Scaling {
    /// Named by its canonical form.
    fn from(n: NamedScaling) -> Scaling {
        Scaling {
            name: n.to_string(),
            kind: n.kind,
            method: n.method,
        }
    }
}

impl fmt::Display for Scaling {
    /// The name as written.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl FromStr for Scaling {
    type Err = ModelError;

    /// Parses with [`NamedScaling`]'s `FromStr`, keeping the trimmed name;
    /// a list (a comma: [`parse_list`]'s) is refused as such.
    ///
    /// # Errors
    /// [`ModelError::Invalid`] with posenc's message.
    fn from_str(s: &str) -> Result<Scaling> {
        if s.contains(',') {
            return Err(ModelError::Invalid(format!(
                "scaling {} is a list: generate and finetune take one scaling (such as yarn:2 or self-extend:4:1024+yarn:2); a comma-separated list is for perplexity and passkey",
                crate::safe::quote(s.trim())
            )));
        }
        let n: NamedScaling = s
            .parse()
            .map_err(|e: posenc::Error| ModelError::Invalid(e.to_string()))?;
        Ok(Scaling {
            name: s.trim().to_string(),
            ..Scaling::from(n)
        })
    }
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
    /// (except for [`ScalingKind::Model`]); see
    /// [`ScalingKind::rope_config`](posenc::rope::ScalingKind::rope_config).
    ///
    /// # Errors
    /// posenc's validation of the scaling.
    pub fn rope_config(&self, cfg: &DecoderConfig) -> Result<RopeConfig> {
        Ok(self.kind.rope_config(&cfg.rope, cfg.trained_length())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_name_as_written_and_posencs_messages() {
        let s: Scaling = " pi:2 ".parse().unwrap();
        assert_eq!(s.name, "pi:2");
        assert_eq!(s.kind, ScalingKind::Linear(2.0));
        assert_eq!(s.named().to_string(), "linear:2");
        assert_eq!(s.to_string(), "pi:2");
        let s: Scaling = "dca:64:16".parse().unwrap();
        assert_eq!(s.kind, ScalingKind::None);
        assert!(s.method.is_some());
        assert_eq!(Scaling::from(s.named()), s);
        for bad in ["rope:2", "yarn", "yarn:0", "a+b+c", "self-extend:0:8"] {
            let e = bad.parse::<Scaling>().unwrap_err();
            let want = bad.parse::<NamedScaling>().unwrap_err().to_string();
            assert!(
                matches!(&e, ModelError::Invalid(m) if *m == want),
                "{bad}: {e}"
            );
        }
        let list = parse_list("none, yarn:2,dca:64:16+ntk:2").unwrap();
        assert_eq!(list[1].name, "yarn:2");
        assert!(parse_list("yarn:2,yarn:2").is_err());
        assert!(parse_list(",").is_err());
    }
}
