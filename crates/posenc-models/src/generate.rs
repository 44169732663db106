//! Text generation with a KV cache: the prompt in one pass, then one token
//! at a time, every step through posenc's RoPE at the token's position.
//!
//! Keys are cached unrotated and rotated inside the attention at each step
//! with the current RoPE; for the length-dependent dynamic NTK scaling this
//! means every cached key is rotated with the frequencies of the current
//! length (transformers caches keys rotated with the frequencies of the
//! step that produced them).

use posenc::tensor::rope::Rope;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{ModelError, Result};
use crate::llama::{Decoder, KvCache, Step};

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The most likely token (ties: the lowest id).
    Greedy,
    /// Sampled from the softmax at `temperature`, restricted to the
    /// smallest set of tokens whose probability reaches `top_p`, with a
    /// seeded generator.
    Sample {
        /// Softmax temperature (> 0).
        temperature: f64,
        /// Nucleus mass in (0, 1].
        top_p: f64,
        /// Seed of the generator.
        seed: u64,
    },
}

/// What to decode and how: at most `max_new` new tokens, each step through
/// `rope`, chosen by `sampling`, stopping early at any of the `stop` ids.
#[derive(Clone, Copy)]
pub struct Decoding<'a> {
    /// The most new tokens.
    pub max_new: usize,
    /// The RoPE every step runs through.
    pub rope: &'a Rope,
    /// How the next token is chosen.
    pub sampling: Sampling,
    /// Ids that end the generation early (the stop id is returned too).
    pub stop: &'a [u32],
}

/// Generates after `prompt` as `decoding` says; returns the new ids.
///
/// # Errors
/// [`ModelError::Invalid`] for an empty prompt or bad sampling parameters;
/// the model's errors.
pub fn generate(
    model: &Decoder,
    prompt: &[u32],
    decoding: Decoding<'_>,
    on_token: impl FnMut(u32),
) -> Result<Vec<u32>> {
    generate_observed(model, prompt, decoding, &mut |_| {}, on_token)
}

/// [`generate`], calling `on_layer` at each [`Step`] of the prompt's pass
/// (the prefill, which takes seconds for a long prompt), on the caller's
/// thread: the place for progress and for a stop between layers and
/// between a layer's parts.
///
/// # Errors
/// As [`generate`].
pub fn generate_observed(
    model: &Decoder,
    prompt: &[u32],
    decoding: Decoding<'_>,
    on_layer: &mut dyn FnMut(Step),
    on_token: impl FnMut(u32),
) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        return Err(ModelError::Invalid("the prompt has no tokens".into()));
    }
    check_sampling(decoding.sampling)?;
    let d = model.config().hidden_size;
    let mut cache = KvCache::new(model.config());
    let hidden = model.hidden_states_observed(prompt, decoding.rope, Some(&mut cache), on_layer)?;
    let last = hidden[(prompt.len() - 1) * d..].to_vec();
    continue_from(model, &mut cache, last, decoding, on_token)
}

/// Generates as `decoding` says after a prefix already in `cache`, whose
/// last final hidden state is `last` (as [`Decoder::hidden_states`]
/// returned it); returns the new ids.
///
/// # Errors
/// [`ModelError::Invalid`] for an empty cache or a hidden state of another
/// width; the model's errors.
pub fn continue_from(
    model: &Decoder,
    cache: &mut KvCache,
    mut last: Vec<f32>,
    decoding: Decoding<'_>,
    mut on_token: impl FnMut(u32),
) -> Result<Vec<u32>> {
    let Decoding {
        max_new,
        rope,
        sampling,
        stop,
    } = decoding;
    if cache.is_empty() || last.len() != model.config().hidden_size {
        return Err(ModelError::Invalid(
            "continuing needs a filled cache and the last hidden state".into(),
        ));
    }
    check_sampling(sampling)?;
    let mut rng = match sampling {
        Sampling::Sample { seed, .. } => StdRng::seed_from_u64(seed),
        Sampling::Greedy => StdRng::seed_from_u64(0),
    };
    let mut out = Vec::with_capacity(max_new);
    for _ in 0..max_new {
        let logits = model.logits(&last, 1)?;
        let next = pick(&logits, sampling, &mut rng);
        out.push(next);
        on_token(next);
        if stop.contains(&next) {
            break;
        }
        last = model.hidden_states(&[next], rope, Some(cache))?;
    }
    Ok(out)
}

/// The most likely token (ties: the lowest id): greedy decoding's pick.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn pick(logits: &[f32], sampling: Sampling, rng: &mut StdRng) -> u32 {
    match sampling {
        Sampling::Greedy => argmax(logits),
        Sampling::Sample {
            temperature, top_p, ..
        } => {
            let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let mut p: Vec<(usize, f64)> = logits
                .iter()
                .enumerate()
                .map(|(i, &v)| (i, ((v as f64 - m) / temperature).exp()))
                .collect();
            let z: f64 = p.iter().map(|x| x.1).sum();
            p.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let mut kept = 0.0;
            let mut n = 0;
            for &(_, w) in &p {
                kept += w / z;
                n += 1;
                if kept >= top_p {
                    break;
                }
            }
            let total: f64 = p[..n].iter().map(|x| x.1).sum();
            let mut u = rng.random::<f64>() * total;
            for &(i, w) in &p[..n] {
                if u < w {
                    return i as u32;
                }
                u -= w;
            }
            p[n - 1].0 as u32
        }
    }
}

/// Refuses a temperature that is not a positive number and a `top_p`
/// outside (0, 1].
///
/// # Errors
/// [`ModelError::Invalid`].
pub fn check_sampling(sampling: Sampling) -> Result<()> {
    if let Sampling::Sample {
        temperature, top_p, ..
    } = sampling
    {
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(ModelError::Invalid(format!(
                "temperature {temperature} is refused: 0 (the default) decodes greedily, a finite number above 0 samples"
            )));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ModelError::Invalid(format!(
                "top_p {top_p} must be in (0, 1] (1, the default, keeps every token)"
            )));
        }
    }
    Ok(())
}
