//! Training-free context extension inside the attention: position rules
//! that remap which relative distance a query sees for each key, so that a
//! RoPE model trained on `L` tokens reads far more.
//!
//! Each method splits the keys a query `a` sees (causal: `j ≤ a`) into
//! contiguous ranges ([`KeyRange`]); in each range the query and the keys
//! are rotated at remapped positions ([`PosMap`]), and one softmax runs over
//! all the logits together:
//!
//! ```text
//! s_aj = scale_v · R(qpos_v(a))·q_a · R(kpos_v(j))·k_j     for j in range_v(a)
//! o_a  = Σ_j softmax_j(s_aj) · v_j
//! ```
//!
//! | method | paper (authors' code) | ranges |
//! |---|---|---|
//! | [`SelfExtend`](ContextMethod::SelfExtend) `self-extend:G:W` | Jin et al. 2024, "LLM Maybe LongLM" (datamllab/LongLM) | neighbours `a − j < W` at true positions; beyond, grouped positions `⌊a/G⌋ + W − W/G`, `⌊j/G⌋` |
//! | [`ReRope`](ContextMethod::ReRope) `rerope:W` | Su 2023, "Rectified rotary position embeddings" (bojone/rerope) | `a − j < W` true; beyond, the distance clipped at `W` |
//! | [`LeakyReRope`](ContextMethod::LeakyReRope) `leaky-rerope:W:K` | Su 2023 (bojone/rerope) | beyond `W`, the distance `W + (a − j − W)/K` |
//! | [`Dca`](ContextMethod::Dca) `dca:CHUNK:LOCAL` | An et al. 2024, "Training-free long-context scaling" (HKUNLP/ChunkLlama) | intra-chunk, successive-chunk and inter-chunk position maps over chunks of `CHUNK − LOCAL` keys |
//! | [`Sinks`](ContextMethod::Sinks) `sinks:S:WINDOW` | Xiao et al. 2024, "Efficient streaming language models with attention sinks" (mit-han-lab/streaming-llm) | the first `S` keys and the recent `WINDOW − S`, positions numbered by cache slot |
//!
//! Every rule here is a function of absolute positions, so a prefill and a
//! KV-cache decode compute the same logits. The fused path
//! ([`crate::tensor::extend`]) runs one streaming pass per range (key tiles
//! outside a range are skipped, so the work is about plain attention's plus
//! the tiles a range boundary crosses) and merges them by their log-sum-exp;
//! its reference path writes the logits out.

use std::fmt;
use std::str::FromStr;

use crate::error::{ensure, Error, Result};

mod dca;
mod rerope;
mod self_extend;
mod sinks;

/// Largest window, chunk or group a method takes (positions are `usize`
/// ids into RoPE tables; this bounds the tables a rule can ask for).
pub const MAX_PARAM: usize = 1 << 24;

/// A training-free attention method (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ContextMethod {
    /// Self-Extend: group size `group`, neighbour window `window`.
    SelfExtend {
        /// `G`: positions beyond the window are grouped by `G`.
        group: usize,
        /// `W`: the neighbour window kept at true positions.
        window: usize,
    },
    /// ReRoPE: the relative distance clipped at `window`.
    ReRope {
        /// `w`.
        window: usize,
    },
    /// Leaky ReRoPE: beyond `window`, the distance grows with slope `1/k`.
    LeakyReRope {
        /// `w`.
        window: usize,
        /// `k` (bojone's `scaling_factor`): the slope beyond the window is `1/k`.
        k: f64,
    },
    /// Dual chunk attention.
    Dca {
        /// ChunkLlama's `chunk_size`.
        chunk: usize,
        /// ChunkLlama's `local_window`; chunks hold `chunk − local` keys.
        local: usize,
    },
    /// Attention sinks (StreamingLLM).
    Sinks {
        /// `S`: the first keys, always kept (`start_size`).
        sinks: usize,
        /// The cache size `S + recent_size`.
        window: usize,
    },
}

/// Keys a query at absolute position `a` sees in one range: a contiguous
/// run `lo..hi` of key positions, always within the causal `0..=a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRange {
    /// `a − j < w`: the `w` most recent keys (the query's own included).
    Near(usize),
    /// `a − j ≥ w`: every key at least `w` back.
    Far(usize),
    /// The keys `j < sinks` with `a − j > recent`.
    SinksFar {
        /// Sink keys.
        sinks: usize,
        /// Distances up to `recent` belong to the recent window.
        recent: usize,
    },
    /// The keys of chunk `⌊a/len⌋ − back` (chunks of `len` keys).
    Chunk {
        /// Keys per chunk.
        len: usize,
        /// 0: the query's own chunk, 1: the one before.
        back: usize,
    },
    /// Every key in chunks `≤ ⌊a/len⌋ − back`.
    ChunksBefore {
        /// Keys per chunk.
        len: usize,
        /// How many chunks back the run ends.
        back: usize,
    },
}

impl KeyRange {
    /// `(lo, hi)`: the keys `lo..hi` (empty when `lo ≥ hi`) a query at
    /// `a` sees in this range, `hi ≤ a + 1`. Both ends are non-decreasing
    /// in `a`.
    #[inline(always)]
    pub fn range(&self, a: usize) -> (usize, usize) {
        let end = a + 1;
        let (lo, hi) = match *self {
            KeyRange::Near(w) => (end.saturating_sub(w), end),
            KeyRange::Far(w) => (0, end.saturating_sub(w)),
            KeyRange::SinksFar { sinks, recent } => (0, sinks.min(a.saturating_sub(recent))),
            KeyRange::Chunk { len, back } => {
                let c = a / len;
                if c < back {
                    (0, 0)
                } else {
                    ((c - back) * len, (c - back + 1) * len)
                }
            }
            KeyRange::ChunksBefore { len, back } => {
                let c = a / len;
                if c < back {
                    (0, 0)
                } else {
                    (0, (c - back + 1) * len)
                }
            }
        };
        (lo, hi.min(end))
    }

    /// Whether key `j` is in the range of query `a`.
    pub fn contains(&self, a: usize, j: usize) -> bool {
        let (lo, hi) = self.range(a);
        j >= lo && j < hi
    }
}

/// A map from an absolute position to the RoPE position a range rotates
/// with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PosMap {
    /// `p`.
    Identity,
    /// `c` for every position.
    Const(usize),
    /// `min(p, c)`.
    Min(usize),
    /// `⌊p/g⌋ + shift`.
    Group {
        /// `g`.
        g: usize,
        /// Added after the division.
        shift: usize,
    },
    /// `p + o`.
    Add(usize),
    /// `p mod c`.
    Mod(usize),
    /// `min(p mod c + add, max)`.
    ModAddMin {
        /// `c`.
        c: usize,
        /// Added to the remainder.
        add: usize,
        /// Upper clamp.
        max: usize,
    },
}

impl PosMap {
    /// The mapped position of `p`.
    #[inline(always)]
    pub fn at(&self, p: usize) -> usize {
        match *self {
            PosMap::Identity => p,
            PosMap::Const(c) => c,
            PosMap::Min(c) => p.min(c),
            PosMap::Group { g, shift } => p / g + shift,
            PosMap::Add(o) => p + o,
            PosMap::Mod(c) => p % c,
            PosMap::ModAddMin { c, add, max } => (p % c + add).min(max),
        }
    }

    /// The largest mapped position of `0..n` (`n ≥ 1`).
    pub fn max_of(&self, n: usize) -> usize {
        let last = n.saturating_sub(1);
        match *self {
            PosMap::Mod(c) => last.min(c - 1),
            PosMap::ModAddMin { c, add, max } => (last.min(c - 1) + add).min(max),
            _ => self.at(last),
        }
    }
}

/// One range of a method: which keys, at which positions, with which
/// frequencies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct View {
    /// The keys of each query.
    pub keys: KeyRange,
    /// Query positions.
    pub query: PosMap,
    /// Key positions.
    pub key: PosMap,
    /// Every RoPE frequency divided by this (1: the model's own; leaky
    /// ReRoPE's `k` beyond the window, as bojone's linear-scaling table).
    pub freq_divisor: f64,
}

/// Per-call settings a method reads from the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelLengths {
    /// The context the model was trained on: ReRoPE's log-n query scaling
    /// (`training_length` in bojone/rerope) starts past it.
    pub trained: Option<usize>,
    /// The config's `max_position_embeddings`: dual chunk attention scales
    /// its logits past it (ChunkLlama's `mscale`).
    pub max_position_embeddings: Option<usize>,
}

impl ContextMethod {
    /// Checks the parameters.
    ///
    /// # Errors
    /// [`Error::InvalidValue`] for a zero or oversized window, group or
    /// chunk, `k ≤ 0` (or a `k` whose query shift `w·(k − 1)` is not a
    /// whole number), a Self-Extend window that `G` does not divide, a DCA
    /// local window not below the chunk, more sinks than the window.
    pub fn validate(&self) -> Result<()> {
        let check = |what: &'static str, v: usize| -> Result<()> {
            if v == 0 || v > MAX_PARAM {
                return Err(Error::invalid(
                    what,
                    format!("{v} is out of range (1..={MAX_PARAM})"),
                ));
            }
            Ok(())
        };
        match *self {
            ContextMethod::SelfExtend { group, window } => {
                check("Self-Extend group size G", group)?;
                check("Self-Extend neighbour window W", window)?;
                self_extend::validate(group, window)
            }
            ContextMethod::ReRope { window } => check("ReRoPE window w", window),
            ContextMethod::LeakyReRope { window, k } => {
                check("leaky ReRoPE window w", window)?;
                rerope::validate_leaky(window, k)
            }
            ContextMethod::Dca { chunk, local } => {
                check("DCA chunk size", chunk)?;
                check("DCA local window", local)?;
                ensure(local < chunk, "dual chunk attention", || {
                    format!("the local window {local} must be below the chunk size {chunk}")
                })
            }
            ContextMethod::Sinks { sinks, window } => {
                check("sinks S", sinks)?;
                check("sinks window", window)?;
                ensure(sinks < window, "attention sinks", || {
                    format!("{sinks} sinks leave no recent keys in a window of {window}")
                })
            }
        }
    }

    /// The ranges of this method.
    pub fn views(&self) -> Vec<View> {
        match *self {
            ContextMethod::SelfExtend { group, window } => self_extend::views(group, window),
            ContextMethod::ReRope { window } => rerope::views(window),
            ContextMethod::LeakyReRope { window, k } => rerope::views_leaky(window, k),
            ContextMethod::Dca { chunk, local } => dca::views(chunk, local),
            ContextMethod::Sinks { sinks, window } => sinks::views(sinks, window),
        }
    }

    /// The factor query `p` is multiplied by before rotation (ReRoPE's
    /// log-n scaling: `max(1, ln(p + 1)/ln(L))` past the trained length
    /// `L`; 1 elsewhere).
    pub fn query_scale(&self, p: usize, lengths: &ModelLengths) -> f32 {
        match (self, lengths.trained) {
            (ContextMethod::ReRope { .. } | ContextMethod::LeakyReRope { .. }, Some(l)) => {
                rerope::logn(p, l)
            }
            _ => 1.0,
        }
    }

    /// The factor every logit is multiplied by (besides `1/√D`) when the
    /// call holds `k_len` keys: DCA's `mscale²` past
    /// `max_position_embeddings`; 1 elsewhere.
    pub fn logit_scale(&self, k_len: usize, lengths: &ModelLengths) -> f64 {
        match (self, lengths.max_position_embeddings) {
            (ContextMethod::Dca { .. }, Some(m)) => dca::logit_scale(k_len, m),
            _ => 1.0,
        }
    }

    /// The view holding key `j` of query `a` (`None`: masked), for the
    /// reference path.
    pub fn view_of(&self, views: &[View], a: usize, j: usize) -> Option<usize> {
        views.iter().position(|v| v.keys.contains(a, j))
    }
}

impl fmt::Display for ContextMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ContextMethod::SelfExtend { group, window } => {
                write!(f, "self-extend:{group}:{window}")
            }
            ContextMethod::ReRope { window } => write!(f, "rerope:{window}"),
            ContextMethod::LeakyReRope { window, k } => write!(f, "leaky-rerope:{window}:{k}"),
            ContextMethod::Dca { chunk, local } => write!(f, "dca:{chunk}:{local}"),
            ContextMethod::Sinks { sinks, window } => write!(f, "sinks:{sinks}:{window}"),
        }
    }
}

/// The method names [`ContextMethod::from_str`] knows, with their syntax.
pub const SYNTAX: &str =
    "self-extend:G:W, rerope:W, leaky-rerope:W:K, dca:CHUNK:LOCAL, sinks:S:WINDOW";

impl FromStr for ContextMethod {
    type Err = Error;

    /// Parses `self-extend:G:W`, `rerope:W`, `leaky-rerope:W:K`,
    /// `dca:CHUNK:LOCAL` or `sinks:S:WINDOW`, and validates it.
    fn from_str(s: &str) -> Result<ContextMethod> {
        let s = s.trim();
        let mut parts = s.split(':');
        let name = parts.next().unwrap_or("").trim();
        let args: Vec<&str> = parts.map(str::trim).collect();
        let bad = |why: String| Error::invalid("attention method", format!("{s:?}: {why}"));
        let int = |i: usize, what: &str| -> Result<usize> {
            let arg = args[i];
            arg.parse::<usize>().map_err(|_| {
                // A number that is not a usize: say whether it is out of
                // range or not whole, rather than only "not a whole number".
                match arg.parse::<f64>() {
                    Ok(v) if v.is_finite() && v.fract() == 0.0 => bad(format!(
                        "{what} {arg:?} = {v} is out of range (1..={MAX_PARAM})"
                    )),
                    Ok(v) if v.is_finite() => bad(format!(
                        "{what} {arg:?} is not a whole number (1..={MAX_PARAM} accepted)"
                    )),
                    Ok(_) => bad(format!("{what} {arg:?} is out of range (1..={MAX_PARAM})")),
                    Err(_) => bad(format!(
                        "{what} {arg:?} is not a whole number (1..={MAX_PARAM} accepted)"
                    )),
                }
            })
        };
        let arity = |n: usize, syntax: &str| -> Result<()> {
            if args.len() != n {
                return Err(bad(format!("expected {syntax}")));
            }
            Ok(())
        };
        // two whole numbers, named `a` and `b` in `syntax`
        let two = |syntax: &str, a: &str, b: &str| -> Result<(usize, usize)> {
            arity(2, syntax)?;
            Ok((int(0, a)?, int(1, b)?))
        };
        let m = match name {
            "self-extend" | "selfextend" => {
                let (group, window) = two("self-extend:G:W", "G", "W")?;
                ContextMethod::SelfExtend { group, window }
            }
            "rerope" => {
                arity(1, "rerope:W")?;
                ContextMethod::ReRope {
                    window: int(0, "W")?,
                }
            }
            "leaky-rerope" | "leaky" => {
                arity(2, "leaky-rerope:W:K")?;
                let k: f64 = args[1]
                    .parse()
                    .map_err(|_| bad(format!("K {:?} is not a number", args[1])))?;
                ContextMethod::LeakyReRope {
                    window: int(0, "W")?,
                    k,
                }
            }
            "dca" => {
                let (chunk, local) = two("dca:CHUNK:LOCAL", "CHUNK", "LOCAL")?;
                ContextMethod::Dca { chunk, local }
            }
            "sinks" => {
                let (sinks, window) = two("sinks:S:WINDOW", "S", "WINDOW")?;
                ContextMethod::Sinks { sinks, window }
            }
            _ => return Err(bad(format!("unknown method: use {SYNTAX}"))),
        };
        m.validate()?;
        Ok(m)
    }
}

/// Whether `name` (before its first `:`) names an attention method.
pub fn is_method_name(name: &str) -> bool {
    let head = name.trim().split(':').next().unwrap_or("");
    matches!(
        head,
        "self-extend" | "selfextend" | "rerope" | "leaky-rerope" | "leaky" | "dca" | "sinks"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        for s in [
            "self-extend:4:512",
            "rerope:512",
            "leaky-rerope:512:16",
            "dca:6144:1024",
            "sinks:4:1024",
        ] {
            let m: ContextMethod = s.parse().unwrap();
            assert_eq!(m.to_string(), s);
        }
    }

    #[test]
    fn refuses_bad_parameters() {
        for s in [
            "self-extend:0:512",
            "self-extend:4:0",
            "self-extend:3:512",
            "rerope:0",
            "leaky-rerope:512:0",
            "leaky-rerope:512:-1",
            "leaky-rerope:512:nan",
            "dca:1024:1024",
            "dca:0:1",
            "sinks:8:4",
            "sinks:0:4",
            "rope:2",
            "rerope",
            "rerope:1:2",
        ] {
            assert!(s.parse::<ContextMethod>().is_err(), "{s}");
        }
        // A number past MAX_PARAM is out of range, not "not a whole number".
        let msg = |s: &str| s.parse::<ContextMethod>().unwrap_err().to_string();
        for s in [
            "self-extend:1e9:1024",
            "rerope:99999999999999999999",
            "dca:-5:1",
        ] {
            let e = msg(s);
            assert!(
                e.contains(&format!("is out of range (1..={MAX_PARAM})")),
                "{s}: {e}"
            );
            assert!(!e.contains("not a whole number"), "{s}: {e}");
        }
        assert!(msg("self-extend:1e9:1024").contains("= 1000000000"));
        for s in ["self-extend:2.5:1024", "rerope:x"] {
            let e = msg(s);
            assert!(e.contains("is not a whole number (1..="), "{s}: {e}");
        }
    }

    /// Every causal key of every query lies in exactly one range, except
    /// the keys sinks evict.
    #[test]
    fn ranges_partition_the_causal_keys() {
        for m in [
            "self-extend:4:16",
            "rerope:16",
            "leaky-rerope:16:4",
            "dca:48:16",
            "sinks:4:32",
        ] {
            let m: ContextMethod = m.parse().unwrap();
            let views = m.views();
            for a in 0..200 {
                for j in 0..=a {
                    let n = views.iter().filter(|v| v.keys.contains(a, j)).count();
                    let evicted = match m {
                        ContextMethod::Sinks { sinks, window } => {
                            a > window && j >= sinks && a - j > window - sinks
                        }
                        _ => false,
                    };
                    assert_eq!(n, usize::from(!evicted), "{m} a={a} j={j}");
                }
                for v in &views {
                    let (lo, hi) = v.keys.range(a);
                    assert!(hi <= a + 1 && (lo <= hi || hi == 0));
                }
            }
        }
    }
}
