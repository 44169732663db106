//! Loss at every position of a window, for each RoPE scaling: what a model
//! does inside and beyond the context length it was trained at.
//!
//! For tokens `t_0 .. t_{T−1}`, `loss[i] = −log p(t_{i+1} | t_0..t_i)` for
//! `i = 0 .. T−2` (natural log), from one causal forward pass over the whole
//! window: position `i`'s query sees keys `0..=i`, so `loss[i]` is the loss
//! *at position i*. "Inside" the trained length `L` means `i < L`,
//! "beyond" means `i ≥ L`. Bands are means over `i ∈ [A, B)`; the last one
//! holds the remaining positions (`T − 1 − A` terms).

use std::time::Instant;

use posenc::rope::RopeConfig;
use posenc::tensor::rope::{HeadLayout, Rope};
use posenc_nn::loss::nll_rows_into;
use serde::Serialize;

use crate::error::{ModelError, Result};
use crate::llama::{Decoder, KvCache, Step};
use crate::scaling::Scaling;

/// Rows of logits computed at once (`rows × V` floats).
pub const LOGIT_ROWS: usize = 256;

/// The posenc [`Rope`] of a RoPE configuration, for the attention hook.
///
/// # Errors
/// posenc's, for an invalid configuration.
pub fn rope_of(cfg: RopeConfig) -> Result<Rope> {
    Ok(Rope::new(cfg)?.with_layout(HeadLayout::Bthd))
}

/// `loss[i]` for `i = 0 .. T−2` (see the [module docs](self)), with `rope`
/// on queries and keys.
///
/// # Errors
/// [`ModelError::Invalid`] for fewer than two tokens; the model's errors.
pub fn loss_per_position(model: &Decoder, tokens: &[u32], rope: &Rope) -> Result<Vec<f64>> {
    loss_per_position_observed(model, tokens, rope, &mut |_| {})
}

/// [`loss_per_position`], calling `on_layer` after each layer and
/// between its parts ([`Decoder::hidden_states_observed`]).
///
/// # Errors
/// As [`loss_per_position`].
pub fn loss_per_position_observed(
    model: &Decoder,
    tokens: &[u32],
    rope: &Rope,
    on_layer: &mut dyn FnMut(Step),
) -> Result<Vec<f64>> {
    if tokens.len() < 2 {
        return Err(ModelError::Invalid(
            "a window needs at least two tokens".into(),
        ));
    }
    let hidden = model.hidden_states_observed(tokens, rope, None, on_layer)?;
    losses_from_hidden(model, &hidden, tokens)
}

/// `loss[i]` for `i = 0 .. T−2` from the final hidden states `(T, D)` of
/// `tokens` (computed by any path: one pass, or a prefill into a KV cache),
/// [`LOGIT_ROWS`] rows of logits at a time.
///
/// # Errors
/// [`ModelError::Invalid`] for fewer than two tokens or hidden states of
/// another size; the model's errors.
pub fn losses_from_hidden(model: &Decoder, hidden: &[f32], tokens: &[u32]) -> Result<Vec<f64>> {
    let d = model.config().hidden_size;
    if tokens.len() < 2 || hidden.len() != tokens.len() * d {
        return Err(ModelError::Invalid(
            "losses need two tokens or more and one hidden state per token".into(),
        ));
    }
    let v = model.config().vocab_size;
    let n = tokens.len() - 1;
    let mut loss = vec![0f64; n];
    let mut r0 = 0;
    while r0 < n {
        let rows = LOGIT_ROWS.min(n - r0);
        let logits = model.logits(&hidden[r0 * d..], rows)?;
        let targets = &tokens[r0 + 1..r0 + 1 + rows];
        nll_rows_into(&logits, v, targets, &mut loss[r0..r0 + rows]);
        r0 += rows;
    }
    Ok(loss)
}

pub use posenc_nn::loss::log_sum_exp;

/// Mean loss over `[a, b)` of a per-position loss.
fn mean(loss: &[f64], a: usize, b: usize) -> Option<f64> {
    let b = b.min(loss.len());
    (a < b).then(|| loss[a..b].iter().sum::<f64>() / (b - a) as f64)
}

/// One band of positions and its mean loss.
#[derive(Debug, Clone, Serialize)]
pub struct Band {
    /// First position.
    pub start: usize,
    /// One past the last position (the band's nominal end).
    pub end: usize,
    /// Mean loss over the positions of the band that have a target.
    pub loss: f64,
}

/// The result of one scaling over one window.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingRun {
    /// The scaling's name as given.
    pub name: String,
    /// `rope_type` of the RoPE it ran with.
    pub rope_type: String,
    /// The RoPE's first and last inverse frequencies (at the window's
    /// length) and attention factor.
    pub inv_freq_first: f32,
    /// Last inverse frequency.
    pub inv_freq_last: f32,
    /// Attention factor applied to cos and sin.
    pub attention_factor: f64,
    /// `loss[i]`, `i = 0 .. T−2`.
    pub loss: Vec<f64>,
    /// Band means.
    pub bands: Vec<Band>,
    /// Mean over positions `< L`.
    pub mean_inside: Option<f64>,
    /// Mean over positions `≥ L`.
    pub mean_beyond: Option<f64>,
    /// Seconds of the forward pass and the loss.
    pub forward_seconds: f64,
    /// Tokens per second of that pass.
    pub tokens_per_second: f64,
}

/// Runs `scaling` over `tokens` and summarises it in bands of `band`
/// positions, with `trained` the model's trained length.
///
/// # Errors
/// Those of [`loss_per_position`] and of the scaling's RoPE.
pub fn run_scaling(
    model: &Decoder,
    tokens: &[u32],
    scaling: &Scaling,
    band: usize,
    on_layer: &mut dyn FnMut(Step),
) -> Result<ScalingRun> {
    Ok(run_scaling_cached(model, tokens, scaling, band, None, on_layer)?.0)
}

/// [`run_scaling`], keeping the window's keys and values in `cache` (when
/// given), and the final hidden state `(D)` of its last token: what
/// generating after the window continues from
/// ([`crate::generate::continue_from`], with the scaling's
/// [`rope_of`]).
///
/// # Errors
/// As [`run_scaling`].
pub fn run_scaling_cached(
    model: &Decoder,
    tokens: &[u32],
    scaling: &Scaling,
    band: usize,
    cache: Option<&mut KvCache>,
    on_layer: &mut dyn FnMut(Step),
) -> Result<(ScalingRun, Vec<f32>)> {
    let cfg = scaling.rope_config(model.config())?;
    let rope = rope_of(cfg.clone())?;
    let t0 = Instant::now();
    if tokens.len() < 2 {
        return Err(ModelError::Invalid(
            "a window needs at least two tokens".into(),
        ));
    }
    let hidden = model.hidden_states_with(tokens, &rope, scaling.method, cache, on_layer)?;
    let loss = losses_from_hidden(model, &hidden, tokens)?;
    let secs = t0.elapsed().as_secs_f64();
    let last = hidden[(tokens.len() - 1) * model.config().hidden_size..].to_vec(); // (D)
    drop(hidden);
    let run = summarize(
        scaling,
        &cfg,
        loss,
        tokens.len(),
        secs,
        band,
        model.config().trained_length(),
    )?;
    Ok((run, last))
}

/// A [`ScalingRun`] from the losses of one window of `len` tokens that took
/// `secs`, with `cfg` the RoPE it ran with and `trained` the model's
/// trained length.
///
/// # Errors
/// posenc's, computing the RoPE's frequencies at `len`.
pub fn summarize(
    scaling: &Scaling,
    cfg: &RopeConfig,
    loss: Vec<f64>,
    len: usize,
    secs: f64,
    band: usize,
    trained: usize,
) -> Result<ScalingRun> {
    let freqs = cfg.frequencies(Some(len))?;
    let band = band.max(1);
    let bands = (0..loss.len())
        .step_by(band)
        .filter_map(|a| {
            mean(&loss, a, a + band).map(|l| Band {
                start: a,
                end: a + band,
                loss: l,
            })
        })
        .collect();
    Ok(ScalingRun {
        name: scaling.name.clone(),
        rope_type: cfg.rope_type().to_string(),
        inv_freq_first: freqs.inv_freq.first().copied().unwrap_or(0.0),
        inv_freq_last: freqs.inv_freq.last().copied().unwrap_or(0.0),
        attention_factor: freqs.attention_factor,
        mean_inside: mean(&loss, 0, trained),
        mean_beyond: mean(&loss, trained, loss.len()),
        loss,
        bands,
        forward_seconds: secs,
        tokens_per_second: len as f64 / secs.max(1e-9),
    })
}

/// The first `length` tokens of `tokens`, or an error saying how many
/// there are.
///
/// # Errors
/// [`ModelError::Invalid`] when the text is shorter than the window or the
/// window is shorter than two tokens.
pub fn window(tokens: &[u32], length: usize) -> Result<&[u32]> {
    if length < 2 {
        return Err(ModelError::Invalid(format!(
            "a window of {length} tokens has no target to score: use --length 2 or more"
        )));
    }
    if tokens.len() < length {
        return Err(ModelError::Invalid(format!(
            "the text has {} tokens, fewer than the window of {length}",
            tokens.len()
        )));
    }
    Ok(&tokens[..length])
}

/// Every scaling over one window: what `posenc perplexity` prints.
#[derive(Debug, Clone)]
pub struct Study {
    /// One line on the model's files.
    pub model: String,
    /// The model's trained length `L`.
    pub trained_length: usize,
    /// Tokens in the window.
    pub length: usize,
    /// Positions per band.
    pub band: usize,
    /// One run per scaling, in the order given.
    pub runs: Vec<ScalingRun>,
}

/// Runs every scaling of `scalings` over `tokens`, in order; `on_layer(s,
/// step)` is called at each [`Step`] of scaling `s`'s pass.
///
/// # Errors
/// Those of [`run_scaling`].
pub fn study(
    model: &Decoder,
    source: &str,
    tokens: &[u32],
    scalings: &[Scaling],
    band: usize,
    mut on_layer: impl FnMut(usize, Step),
) -> Result<Study> {
    if band == 0 {
        return Err(ModelError::Invalid(
            "a band needs at least one position".into(),
        ));
    }
    let mut runs = Vec::with_capacity(scalings.len());
    for (i, s) in scalings.iter().enumerate() {
        runs.push(run_scaling(model, tokens, s, band, &mut |l| {
            on_layer(i, l)
        })?);
    }
    Ok(Study {
        model: source.to_string(),
        trained_length: model.config().trained_length(),
        length: tokens.len(),
        band,
        runs,
    })
}

impl Study {
    /// The JSON form: `{"model", "trained_length", "length", "band",
    /// "tokens_per_second" (of all forward passes together),
    /// "forward_seconds" (their sum), "scalings": {NAME: {"bands": {"A-B":
    /// loss, ...}, "mean_inside", "mean_beyond", "rope_type",
    /// "attention_factor", "inv_freq_first", "inv_freq_last",
    /// "forward_seconds", "tokens_per_second", "loss" (with `per_position`)}}}`;
    /// NAME as given, bands in order.
    pub fn to_json(&self, per_position: bool) -> serde_json::Value {
        use serde_json::{json, Map, Value};
        let mut scalings = Map::new();
        for r in &self.runs {
            let mut bands = Map::new();
            for b in &r.bands {
                bands.insert(format!("{}-{}", b.start, b.end), json!(b.loss));
            }
            let mut o = Map::new();
            o.insert("bands".into(), Value::Object(bands));
            o.insert("mean_inside".into(), json!(r.mean_inside));
            o.insert("mean_beyond".into(), json!(r.mean_beyond));
            o.insert("rope_type".into(), json!(r.rope_type));
            o.insert("attention_factor".into(), json!(r.attention_factor));
            o.insert("inv_freq_first".into(), json!(r.inv_freq_first));
            o.insert("inv_freq_last".into(), json!(r.inv_freq_last));
            o.insert("forward_seconds".into(), json!(r.forward_seconds));
            o.insert("tokens_per_second".into(), json!(r.tokens_per_second));
            if per_position {
                o.insert("loss".into(), json!(r.loss));
            }
            scalings.insert(r.name.clone(), Value::Object(o));
        }
        let secs: f64 = self.runs.iter().map(|r| r.forward_seconds).sum();
        json!({
            "model": self.model,
            "trained_length": self.trained_length,
            "length": self.length,
            "band": self.band,
            "forward_seconds": secs,
            "tokens_per_second": (self.length * self.runs.len()) as f64 / secs.max(1e-9),
            "scalings": Value::Object(scalings),
        })
    }
}
