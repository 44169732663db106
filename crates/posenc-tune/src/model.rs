//! A pretrained decoder as a differentiable candle graph, with LoRA
//! adapters (Hu et al. 2021) and, as LongLoRA (Chen et al. 2024), optionally
//! trainable embeddings and RMSNorm weights.
//!
//! ```text
//! x      = E[tokens]                                            (T, D)
//! for each layer:
//!   h    = RMSNorm(x) · w_attn_norm                             (T, D)
//!   q    = h·W_qᵀ (+ b_q) + h·A_qᵀ·B_qᵀ·α/r                     (T, H_q·Dh) → (1, T, H_q, Dh)
//!   k, v = likewise                                             (1, T, H_k, Dh) each
//!   q, k = RoPE(q, k) at the given position ids                 any scaling (posenc::tensor::rope)
//!   a    = softmax(q·kᵀ/√Dh, causal) · v                        (1, T, H_q, Dh) grouped-query, fused
//!   x    = x + a·W_oᵀ + a·A_oᵀ·B_oᵀ·α/r                         (T, D)
//!   h    = RMSNorm(x) · w_mlp_norm                              (T, D)
//!   x    = x + (silu(h·W_gateᵀ) ⊙ h·W_upᵀ)·W_downᵀ              (T, D)   each with its adapter
//! logits = RMSNorm(x) · w_norm · Hᵀ                             (T, V)   H: lm_head, or E when tied
//! loss   = mean_t −log softmax(logits_t)[tokens_{t+1}]          over T − 1 next tokens
//! ```
//!
//! (an adapter only on the projections [`LoraConfig::targets`] names).
//! Everything is `f32` on the CPU. The frozen weights are plain tensors,
//! the trained ones candle [`Var`]s, and [`TrainableDecoder::gradients`]
//! runs candle's autograd. The rotation is posenc's fused
//! [`Rope::apply`] (its backward is the inverse rotation), the attention
//! posenc's fused [`Attention::forward`], whose backward recomputes the
//! probabilities from the saved log-sum-exp and handles grouped-query heads;
//! RMSNorm, SwiGLU's gate and the cross-entropy are the shared fused ops
//! ([`posenc_nn::ops`]). Which of them run, the fused ops or their
//! composed candle references, is one [`Backend`] value (the decoder's own
//! switch, [`posenc_models::layers`]), chosen by
//! [`TrainableDecoder::set_reference`]; the forward only calls it.
//! Position ids are explicit, one per token, so a window may skip positions
//! (PoSE); the causal mask follows the order of the tokens, not their ids.

use std::sync::Mutex;

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use posenc::tensor::attention::{Attention, AttentionHooks, AttnPositions};
use posenc::tensor::rope::{HeadLayout, Rope};
use posenc::tensor::Positions;
use posenc_models::layers::Backend;
use posenc_models::llama::NamedWeight;
use posenc_models::{Decoder, DecoderConfig, Scaling};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TuneError};
use crate::lora::{adapter_name, dropout, init_factors, Factor, LoraConfig, Target};

/// Rows of logits formed at once by the checkpointed loss
/// ([`TrainableDecoder::loss_and_gradients`]): `HEAD_CHUNK × V` floats
/// (49,152 × 512 × 4 B = 100 MB on SmolLM2) instead of `T × V`.
pub const HEAD_CHUNK: usize = 512;

/// Mixed into the seed for the dropout masks' generator, so that they are
/// not the adapters' initial values' stream.
const DROPOUT_STREAM: u64 = 0x0D80_F0A7;

/// Which base parameters train besides the LoRA factors (LongLoRA's
/// `embed,norm`: Chen et al. 2024 train the embeddings and normalisation
/// layers with the adapters for long contexts; the output head stays
/// frozen unless it is tied to the embedding).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trainable {
    /// `model.embed_tokens.weight` (and, tied, the head, which is the same
    /// matrix: its gradient sums both uses).
    pub embed: bool,
    /// Every RMSNorm weight (`input_layernorm`, `post_attention_layernorm`,
    /// `model.norm`).
    pub norm: bool,
}

/// A parameter that is frozen or trained.
#[derive(Debug)]
enum Param {
    Frozen(Tensor),
    Trained(Var),
}

impl Param {
    fn new(t: Tensor, trained: bool) -> Result<Param> {
        Ok(if trained {
            Param::Trained(Var::from_tensor(&t)?)
        } else {
            Param::Frozen(t)
        })
    }

    fn tensor(&self) -> &Tensor {
        match self {
            Param::Frozen(t) => t,
            Param::Trained(v) => v.as_tensor(),
        }
    }
}

/// One projection: the frozen `W` `(out, in)`, its bias, its adapter.
#[derive(Debug)]
struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    /// `A` `(r, in)`, `B` `(out, r)`.
    adapter: Option<(Var, Var)>,
}

/// One decoder layer.
#[derive(Debug)]
struct Layer {
    attn_norm: Param,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    mlp_norm: Param,
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Layer {
    fn linear(&self, t: Target) -> &Linear {
        match t {
            Target::QProj => &self.q,
            Target::KProj => &self.k,
            Target::VProj => &self.v,
            Target::OProj => &self.o,
            Target::GateProj => &self.gate,
            Target::UpProj => &self.up,
            Target::DownProj => &self.down,
        }
    }
}

/// A pretrained decoder with LoRA adapters, differentiable end to end (see
/// the [module docs](self)).
pub struct TrainableDecoder {
    cfg: DecoderConfig,
    lora: LoraConfig,
    trainable: Trainable,
    embed: Param,
    layers: Vec<Layer>,
    norm: Param,
    /// `(V, D)`; `None`: tied to the embedding.
    lm_head: Option<Tensor>,
    rope: Rope,
    scaling: String,
    /// The fused ops or their composed references.
    backend: Backend,
    training: bool,
    /// Dropout masks.
    rng: Mutex<StdRng>,
    /// Every trained parameter by name, in the order of the forward pass.
    params: Vec<(String, Var)>,
}

impl std::fmt::Debug for TrainableDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainableDecoder")
            .field("config", &self.cfg)
            .field("lora", &self.lora)
            .field("trainable", &self.trainable)
            .field("scaling", &self.scaling)
            .field("parameters", &self.params.len())
            .finish()
    }
}

impl TrainableDecoder {
    /// A trainable copy of `base`: its weights as frozen `f32` tensors (a
    /// copy: `base` may be dropped afterwards), fresh adapters on `lora`'s
    /// targets initialised as PEFT does from `seed`
    /// ([`crate::lora::init_factors`], layers in order, targets in
    /// [`Target::ALL`] order), the embedding and norms trained as
    /// `trainable` says, and the model's own RoPE (see
    /// [`with_scaling`](Self::with_scaling)). Dropout, if any, is on
    /// ([`set_training`](Self::set_training)).
    ///
    /// # Errors
    /// The checks of [`LoraConfig::validate_for`]; candle's.
    pub fn new(
        base: &Decoder,
        lora: LoraConfig,
        trainable: Trainable,
        seed: u64,
    ) -> Result<TrainableDecoder> {
        let cfg = base.config().clone();
        lora.validate_for(&cfg)?;
        let weights = base.named_weights();
        let dev = Device::Cpu;
        let tensor = |name: &str| -> Result<Tensor> {
            let w: &NamedWeight = weights.iter().find(|w| w.name == name).ok_or_else(|| {
                TuneError::Input(format!("the base model has no parameter {name}"))
            })?;
            Ok(Tensor::from_slice(w.data, w.shape.as_slice(), &dev)?)
        };
        let optional = |name: &str| -> Result<Option<Tensor>> {
            if weights.iter().any(|w| w.name == name) {
                tensor(name).map(Some)
            } else {
                Ok(None)
            }
        };
        let mut rng = StdRng::seed_from_u64(seed);
        let mut params = Vec::new();
        let embed = Param::new(tensor("model.embed_tokens.weight")?, trainable.embed)?;
        if let Param::Trained(v) = &embed {
            params.push(("model.embed_tokens.weight".to_string(), v.clone()));
        }
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            // Adapters are drawn in Target::ALL order whatever the order of
            // lora.targets, so a seed gives the same factors for a set.
            let mut adapters: Vec<(Target, (Var, Var))> = Vec::new();
            for t in Target::ALL.into_iter().filter(|&t| lora.targets(t)) {
                let (d_in, d_out) = t.dims(&cfg);
                let (a, b) = init_factors(lora.rank, d_in, d_out, &mut rng);
                let a = Var::from_vec(a, (lora.rank, d_in), &dev)?;
                let b = Var::from_vec(b, (d_out, lora.rank), &dev)?;
                adapters.push((t, (a, b)));
            }
            let mut linear = |t: Target| -> Result<Linear> {
                let stem = p(&format!("{}.{}", t.block(), t.name()));
                let adapter = adapters.iter().position(|(x, _)| *x == t);
                Ok(Linear {
                    weight: tensor(&format!("{stem}.weight"))?,
                    bias: optional(&format!("{stem}.bias"))?,
                    adapter: adapter.map(|i| adapters.swap_remove(i).1),
                })
            };
            let layer = Layer {
                attn_norm: Param::new(tensor(&p("input_layernorm.weight"))?, trainable.norm)?,
                q: linear(Target::QProj)?,
                k: linear(Target::KProj)?,
                v: linear(Target::VProj)?,
                o: linear(Target::OProj)?,
                mlp_norm: Param::new(
                    tensor(&p("post_attention_layernorm.weight"))?,
                    trainable.norm,
                )?,
                gate: linear(Target::GateProj)?,
                up: linear(Target::UpProj)?,
                down: linear(Target::DownProj)?,
            };
            // Names in the order of the forward pass.
            let norm_param = |param: &Param, name: &str, params: &mut Vec<(String, Var)>| {
                if let Param::Trained(v) = param {
                    params.push((p(name), v.clone()));
                }
            };
            norm_param(&layer.attn_norm, "input_layernorm.weight", &mut params);
            for t in Target::ALL {
                if t == Target::GateProj {
                    norm_param(
                        &layer.mlp_norm,
                        "post_attention_layernorm.weight",
                        &mut params,
                    );
                }
                if let Some((a, b)) = &layer.linear(t).adapter {
                    params.push((adapter_name(l, t, Factor::A), a.clone()));
                    params.push((adapter_name(l, t, Factor::B), b.clone()));
                }
            }
            layers.push(layer);
        }
        let norm = Param::new(tensor("model.norm.weight")?, trainable.norm)?;
        if let Param::Trained(v) = &norm {
            params.push(("model.norm.weight".to_string(), v.clone()));
        }
        let lm_head = optional("lm_head.weight")?;
        let rope = Rope::new(cfg.rope.clone())?.with_layout(HeadLayout::Bthd);
        Ok(TrainableDecoder {
            cfg,
            lora,
            trainable,
            embed,
            layers,
            norm,
            lm_head,
            rope,
            scaling: "model".into(),
            backend: Backend::Fused,
            training: true,
            rng: Mutex::new(StdRng::seed_from_u64(seed ^ DROPOUT_STREAM)),
            params,
        })
    }

    /// Runs with `scaling`'s RoPE (posenc-models' syntax: `model`, `none`,
    /// `linear:4`, `yarn:4`, ...) instead of the config's own: what a
    /// long-context fine-tune trains through.
    ///
    /// # Errors
    /// [`TuneError::Scaling`] for a scaling with a training-free attention
    /// method; the scaling's own checks.
    pub fn with_scaling(mut self, scaling: &Scaling) -> Result<TrainableDecoder> {
        if scaling.method.is_some() {
            return Err(TuneError::Scaling(scaling.name.clone()));
        }
        let cfg = scaling.rope_config(&self.cfg)?;
        self.rope = Rope::new(cfg)?.with_layout(HeadLayout::Bthd);
        self.scaling = scaling.name.clone();
        Ok(self)
    }

    /// The base model's configuration.
    pub fn config(&self) -> &DecoderConfig {
        &self.cfg
    }

    /// The adapters' configuration.
    pub fn lora(&self) -> &LoraConfig {
        &self.lora
    }

    /// Which base parameters train.
    pub fn trainable(&self) -> Trainable {
        self.trainable
    }

    /// The name of the scaling the RoPE runs with (`model` by default).
    pub fn scaling(&self) -> &str {
        &self.scaling
    }

    /// Every trained parameter, by name (LoRA factors by PEFT's names,
    /// base parameters by Hugging Face's), in the order of the forward pass.
    pub fn parameters(&self) -> &[(String, Var)] {
        &self.params
    }

    /// The trained parameter `name`, if there is one.
    pub fn parameter(&self, name: &str) -> Option<&Var> {
        self.params.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Number of trained values.
    pub fn trained_values(&self) -> usize {
        self.params.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// Sets the trained parameter `name` to `values` (row-major, its shape).
    ///
    /// # Errors
    /// [`TuneError::UnknownParameter`], [`TuneError::ParameterSize`].
    pub fn set_parameter(&self, name: &str, values: &[f32]) -> Result<()> {
        let var = self
            .parameter(name)
            .ok_or_else(|| TuneError::UnknownParameter(name.to_string()))?;
        if values.len() != var.elem_count() {
            return Err(TuneError::ParameterSize {
                name: name.to_string(),
                shape: var.dims().to_vec(),
                expected: var.elem_count(),
                got: values.len(),
            });
        }
        var.set(&Tensor::from_slice(values, var.shape(), &Device::Cpu)?)?;
        Ok(())
    }

    /// Restarts the dropout masks' generator from `seed` (a training loop
    /// reseeds it every step, so that a resumed run draws the masks an
    /// uninterrupted one would).
    pub fn reseed_dropout(&self, seed: u64) {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        *rng = StdRng::seed_from_u64(seed ^ DROPOUT_STREAM);
    }

    /// Dropout on the adapters' inputs (`true`, the default) or not.
    pub fn set_training(&mut self, on: bool) {
        self.training = on;
    }

    /// Runs the composed reference paths of the rotation and the attention
    /// ([`Rope::apply_reference`], [`Attention::forward_reference`]: the
    /// whole `T × T` logits, differentiated by candle), of RMSNorm, SwiGLU
    /// and the cross-entropy instead of the fused kernels
    /// ([`Backend::Reference`]; `false`: [`Backend::Fused`]).
    pub fn set_reference(&mut self, on: bool) {
        self.backend = if on {
            Backend::Reference
        } else {
            Backend::Fused
        };
    }

    /// The final hidden states `(T, D)` (after the last RMSNorm) of
    /// `tokens` at `positions` (one id per token).
    ///
    /// # Errors
    /// [`TuneError::Input`] for no tokens, positions of another length, or
    /// a token outside the vocabulary; posenc's and candle's.
    pub fn hidden_states(&self, tokens: &[u32], positions: &[u32]) -> Result<Tensor> {
        self.check_input(tokens, positions)?;
        let t = tokens.len();
        let dev = Device::Cpu;
        let ids = Tensor::from_slice(tokens, t, &dev)?;
        let pos = Tensor::from_slice(positions, (1, t), &dev)?;
        let mut x = self.embed.tensor().index_select(&ids, 0)?; // (T, D)
        for layer in &self.layers {
            x = self.layer(layer, &x, &pos)?; // (T, D)
        }
        self.rms_norm(&x, self.norm.tensor())
    }

    /// The logits `(T, V)` of `tokens` at `positions`.
    ///
    /// # Errors
    /// As [`hidden_states`](Self::hidden_states).
    pub fn logits(&self, tokens: &[u32], positions: &[u32]) -> Result<Tensor> {
        let h = self.hidden_states(tokens, positions)?; // (T, D)
        self.head(&h) // (T, V)
    }

    /// The mean cross-entropy of each next token, `tokens[t + 1]` given
    /// `tokens[..=t]`, over the `T − 1` of them: transformers' loss with
    /// `labels = input_ids`. A scalar tensor.
    ///
    /// # Errors
    /// [`TuneError::Input`] for fewer than two tokens; as
    /// [`hidden_states`](Self::hidden_states).
    pub fn loss(&self, tokens: &[u32], positions: &[u32]) -> Result<Tensor> {
        check_loss_tokens(tokens)?;
        let logits = self.logits(tokens, positions)?;
        next_token_loss(&logits, tokens, self.backend)
    }

    /// The gradient of `loss` (a scalar computed by this model) for every
    /// trained parameter, by name, in [`parameters`](Self::parameters)'
    /// order (zeros for one the loss does not depend on).
    ///
    /// # Errors
    /// Candle's.
    pub fn gradients(&self, loss: &Tensor) -> Result<Vec<(String, Tensor)>> {
        let grads = self.param_grads(&loss.backward()?);
        self.params
            .iter()
            .zip(grads)
            .map(|((name, var), g)| {
                let g = match g {
                    Some(g) => g,
                    None => var.as_tensor().zeros_like()?,
                };
                Ok((name.clone(), g))
            })
            .collect()
    }

    /// The gradient of every trained parameter in `store`, in
    /// [`parameters`](Self::parameters)' order (`None` where it has none).
    fn param_grads(&self, store: &GradStore) -> Vec<Option<Tensor>> {
        self.params
            .iter()
            .map(|(_, v)| store.get(v.as_tensor()).cloned())
            .collect()
    }

    /// The loss of `tokens` at `positions` (as [`loss`](Self::loss)) and
    /// the gradient of every trained parameter, in
    /// [`parameters`](Self::parameters)' order (`None` for one the loss does
    /// not reach).
    ///
    /// With `checkpoint`, activation checkpointing per layer (Chen et al.
    /// 2016, "Training deep nets with sublinear memory cost"; PyTorch's
    /// `torch.utils.checkpoint` per decoder layer, as transformers'
    /// `gradient_checkpointing_enable`): the forward pass keeps only each
    /// layer's input `(T, D)`; the backward pass runs each layer again from
    /// its input, last layer first, and back-propagates the gradient that
    /// reached its output. The logits and the loss are formed
    /// [`HEAD_CHUNK`] rows at a time, so that no `(T, V)` tensor lives. Peak
    /// memory falls from every layer's activations to one layer's and
    /// the inputs; the cost is a second forward pass of every layer. Dropout
    /// masks are drawn again from the same generator state, so the gradients
    /// are the ones without checkpointing up to the order of floating-point
    /// sums (tested).
    ///
    /// # Errors
    /// As [`loss`](Self::loss).
    pub fn loss_and_gradients(
        &self,
        tokens: &[u32],
        positions: &[u32],
        checkpoint: bool,
    ) -> Result<(f64, Vec<Option<Tensor>>)> {
        if !checkpoint {
            let loss = self.loss(tokens, positions)?;
            let value = loss.to_scalar::<f32>()? as f64;
            return Ok((value, self.param_grads(&loss.backward()?)));
        }
        check_loss_tokens(tokens)?;
        self.check_input(tokens, positions)?;
        let t = tokens.len();
        let dev = Device::Cpu;
        let ids = Tensor::from_slice(tokens, t, &dev)?;
        let pos = Tensor::from_slice(positions, (1, t), &dev)?;
        let mut acc: Vec<Option<Tensor>> = vec![None; self.params.len()];
        let mut add = |store: &GradStore| add_grads(&mut acc, self.param_grads(store));
        // Forward: each layer's input, detached (no graph kept), and the
        // dropout generator's state before the layer.
        let lock = || self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut states = Vec::with_capacity(self.layers.len());
        let mut x = self.embed.tensor().index_select(&ids, 0)?.detach(); // (T, D)
        for layer in &self.layers {
            states.push(lock().clone());
            let next = self.layer(layer, &x, &pos)?.detach(); // (T, D)
            inputs.push(std::mem::replace(&mut x, next));
        }
        let after = lock().clone();
        // Head: the final norm once, the logits and the loss by row chunks.
        let x_last = Var::from_tensor(&x)?; // (T, D)
        let h = self.rms_norm(x_last.as_tensor(), self.norm.tensor())?; // (T, D)
        let h_var = Var::from_tensor(&h.detach())?;
        let n = t - 1;
        let mut loss_sum = 0f64;
        let mut g_h = Vec::new();
        let mut start = 0;
        while start < n {
            let rows = HEAD_CHUNK.min(n - start);
            let hc = h_var.as_tensor().narrow(0, start, rows)?; // (C, D)
            let logits = self.head(&hc)?; // (C, V)
            let targets = &tokens[start + 1..start + 1 + rows];
            let mean = self.backend.cross_entropy(&logits, targets)?; // scalar
            loss_sum += mean.to_scalar::<f32>()? as f64 * rows as f64;
            let store = mean.affine(rows as f64 / n as f64, 0.0)?.backward()?;
            add(&store)?;
            if let Some(g) = store.get(h_var.as_tensor()) {
                g_h.push(g.narrow(0, start, rows)?);
            }
            start += rows;
        }
        let g_h = Tensor::cat(&g_h, 0)?; // (T − 1, D)
        let g_h = Tensor::cat(
            &[&g_h, &Tensor::zeros((1, g_h.dim(1)?), g_h.dtype(), &dev)?],
            0,
        )?; // (T, D)
        let store = (h * g_h)?.sum_all()?.backward()?;
        add(&store)?;
        let mut g = store
            .get(x_last.as_tensor())
            .cloned()
            .ok_or_else(|| TuneError::Input("no gradient reached the last layer".into()))?;
        // Layers, last first: the layer again from its input, and the
        // gradient of its output pushed through it.
        for (i, layer) in self.layers.iter().enumerate().rev() {
            *lock() = states[i].clone();
            let x_in = Var::from_tensor(&inputs[i])?;
            let y = self.layer(layer, x_in.as_tensor(), &pos)?; // (T, D)
            let store = (y * &g)?.sum_all()?.backward()?;
            add(&store)?;
            g = store
                .get(x_in.as_tensor())
                .cloned()
                .ok_or_else(|| TuneError::Input("no gradient reached a layer's input".into()))?;
            inputs.pop();
        }
        // The embedding, if trained: its rows take the input's gradient.
        if let Param::Trained(e) = &self.embed {
            let store = (e.as_tensor().index_select(&ids, 0)? * &g)?
                .sum_all()?
                .backward()?;
            add(&store)?;
        }
        *lock() = after;
        Ok((loss_sum / n as f64, acc))
    }

    /// The head on final hidden states `h` `(C, D)` → logits `(C, V)`.
    fn head(&self, h: &Tensor) -> Result<Tensor> {
        match (&self.lm_head, &self.embed) {
            // A frozen head (its own, or the tied embedding when frozen).
            (Some(head), _) | (None, Param::Frozen(head)) => {
                crate::frozen::frozen_linear(h, head) // (C, V)
            }
            (None, Param::Trained(e)) => Ok(h.matmul(&e.as_tensor().t()?)?), // (C, V)
        }
    }

    fn check_input(&self, tokens: &[u32], positions: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(TuneError::Input("no tokens to run".into()));
        }
        if positions.len() != tokens.len() {
            return Err(TuneError::Input(format!(
                "{} position ids for {} tokens (one per token)",
                positions.len(),
                tokens.len()
            )));
        }
        if let Some(&bad) = tokens
            .iter()
            .find(|&&id| id as usize >= self.cfg.vocab_size)
        {
            return Err(TuneError::Input(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.cfg.vocab_size
            )));
        }
        Ok(())
    }

    /// One decoder layer on `x` `(T, D)`, queries and keys at `pos` `(1, T)`.
    fn layer(&self, l: &Layer, x: &Tensor, pos: &Tensor) -> Result<Tensor> {
        let x = (x + self.attention(l, x, pos)?)?; // (T, D)
        Ok((&x + self.mlp(l, &x)?)?) // (T, D)
    }

    /// The attention block's output `a·W_oᵀ` `(T, D)` on the residual
    /// stream `x` `(T, D)`, queries and keys at `pos` `(1, T)`.
    fn attention(&self, l: &Layer, x: &Tensor, pos: &Tensor) -> Result<Tensor> {
        let cfg = &self.cfg;
        let (t, _) = x.dims2()?;
        let (hq, hk, dh) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let h = self.rms_norm(x, l.attn_norm.tensor())?; // (T, D)
        let q = self.linear(&l.q, &h)?.reshape((1, t, hq, dh))?; // (1, T, H_q, Dh)
        let k = self.linear(&l.k, &h)?.reshape((1, t, hk, dh))?; // (1, T, H_k, Dh)
        let v = self.linear(&l.v, &h)?.reshape((1, t, hk, dh))?; // (1, T, H_k, Dh)
        let (q, k) = self.backend.rope(&self.rope, &q, &k, Positions::Ids(pos))?; // rotated
        let attn = Attention::new(true).with_layout(HeadLayout::Bthd);
        let no_hooks = AttentionHooks::default();
        let whole = AttnPositions::default(); // positions only matter to hooks
        let a = self
            .backend
            .attention(&attn, (&q, &k, &v), &no_hooks, whole)?; // (1, T, H_q, Dh)
        self.linear(&l.o, &a.reshape((t, hq * dh))?) // (T, D)
    }

    /// The feed-forward block's output (SwiGLU) `(T, D)` on the residual
    /// stream `x` `(T, D)`.
    fn mlp(&self, l: &Layer, x: &Tensor) -> Result<Tensor> {
        let h = self.rms_norm(x, l.mlp_norm.tensor())?; // (T, D)
        let gate = self.linear(&l.gate, &h)?; // (T, I)
        let up = self.linear(&l.up, &h)?; // (T, I)
        let m = self.backend.swiglu(&gate, &up)?; // (T, I)
        self.linear(&l.down, &m) // (T, D)
    }

    /// `x / √(mean(x²) + ε) · w` over the last axis, as transformers'
    /// `LlamaRMSNorm` in `f32`.
    fn rms_norm(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        Ok(self.backend.rms_norm(x, w, self.cfg.rms_norm_eps)?)
    }

    /// `x·Wᵀ (+ b) + dropout(x)·Aᵀ·Bᵀ·α/r`, `x` `(T, in)` → `(T, out)`.
    fn linear(&self, p: &Linear, x: &Tensor) -> Result<Tensor> {
        let mut y = crate::frozen::frozen_linear(x, &p.weight)?; // (T, out)
        if let Some(b) = &p.bias {
            y = y.broadcast_add(b)?;
        }
        if let Some((a, b)) = &p.adapter {
            let x = if self.training && self.lora.dropout > 0.0 {
                let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
                dropout(x, self.lora.dropout, &mut rng)?
            } else {
                x.clone()
            };
            let delta = x.matmul(&a.t()?)?.matmul(&b.t()?)?; // (T, r) → (T, out)
            y = (y + delta.affine(self.lora.scaling(), 0.0)?)?;
        }
        Ok(y)
    }
}

/// Refuses fewer than two tokens: a loss needs a next token.
fn check_loss_tokens(tokens: &[u32]) -> Result<()> {
    if tokens.len() < 2 {
        return Err(TuneError::Input(format!(
            "a loss needs at least 2 tokens, {} given",
            tokens.len()
        )));
    }
    Ok(())
}

/// Adds `grads` into `acc` slot by slot (a slot without a gradient keeps
/// what it has).
pub(crate) fn add_grads(acc: &mut [Option<Tensor>], grads: Vec<Option<Tensor>>) -> Result<()> {
    for (slot, g) in acc.iter_mut().zip(grads) {
        if let Some(g) = g {
            *slot = Some(match slot.take() {
                Some(a) => (a + g)?,
                None => g,
            });
        }
    }
    Ok(())
}

/// Mean `−log softmax(logits[t])[tokens[t + 1]]` over `t < T − 1`.
fn next_token_loss(logits: &Tensor, tokens: &[u32], backend: Backend) -> Result<Tensor> {
    let t = tokens.len();
    Ok(backend.cross_entropy(&logits.narrow(0, 0, t - 1)?, &tokens[1..])?)
}
