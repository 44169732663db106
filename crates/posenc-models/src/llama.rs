//! The Llama-family decoder (Llama 2/3, SmolLM2, TinyLlama, Mistral, Qwen2),
//! on posenc's RoPE and fused attention.
//!
//! ```text
//! x      = embed[tokens]                                   (T, D)
//! for each layer:
//!   h    = RMSNorm(x) · w_attn_norm                        (T, D)
//!   qkv  = h · W_qkvᵀ (+ b_qkv)                            (T, (H_q + 2·H_k)·Dh)
//!   a    = attention(RoPE(q), RoPE(k), v), causal          (T, H_q·Dh)   grouped-query, no T×T tensor
//!   x    = x + a · W_oᵀ                                    (T, D)
//!   h    = RMSNorm(x) · w_mlp_norm                         (T, D)
//!   g, u = h · W_gateᵀ, h · W_upᵀ                          (T, I) each, one GEMM
//!   x    = x + (silu(g) ⊙ u) · W_downᵀ                     (T, D)
//! logits = RMSNorm(x) · w_norm · Eᵀ                        (T, V)        E: lm_head or the embedding
//! ```
//!
//! Activations are `f32` row-major buffers; the linear layers run on the
//! `gemm` crate (runtime SIMD, rayon threads), the attention on
//! [`posenc::tensor::attention::Attention::forward_packed`], which reads the
//! packed projection in place and rotates queries and keys inside with the
//! [`Rope`] given to the call: the RoPE (and its scaling) is chosen per
//! call, not baked into the model. The layers are typed
//! ([`crate::layers`]); [`Decoder::set_reference`] picks their
//! [`Backend`] once: composed candle ops (matmul, the attention's reference
//! path) for tests.

use candle_core::{Device, Tensor};
use posenc::extend::{ContextMethod, ModelLengths};
pub use posenc::kernels::attention::Products;
use posenc::tensor::attention::{Attention, AttentionHooks, AttnPositions};
use posenc::tensor::extend::MethodAttention;
use posenc::tensor::rope::Rope;
use rayon::prelude::*;

use crate::config::DecoderConfig;
use crate::error::{ModelError, Result};
use crate::layers::{add_into, vec_of, Backend, GatedMlp, Linear, RmsNorm};
use crate::weights::WeightSource;

/// One decoder layer's parameters (row-major `f32`, Hugging Face order).
struct Layer {
    attn_norm: RmsNorm,
    /// `(D)` → `((H_q + 2·H_k)·Dh)`: q, k and v projections stacked.
    qkv: Linear,
    /// `(H_q·Dh)` → `(D)`.
    o: Linear,
    mlp_norm: RmsNorm,
    mlp: GatedMlp,
}

/// One parameter of a [`Decoder`] (see [`Decoder::named_weights`]).
#[derive(Debug, Clone)]
pub struct NamedWeight<'a> {
    /// The Hugging Face name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// Its shape (a linear layer's weight is `(out, in)`).
    pub shape: Vec<usize>,
    /// Its values, row-major.
    pub data: &'a [f32],
}

/// Where a forward pass stands when it calls its observer
/// ([`Decoder::hidden_states_observed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Between two parts of layer `l` (after its projections, its
    /// attention and the MLP's first product): nothing new to report, a
    /// place to stop.
    Inside(usize),
    /// Layer `l` is done.
    Done(usize),
}

impl Step {
    /// Layers finished so far: `l` inside layer `l`, `l + 1` after it.
    pub fn layers_done(self) -> usize {
        match self {
            Step::Inside(l) => l,
            Step::Done(l) => l + 1,
        }
    }
}

/// Queries per attention call in a long pass, by default: the last block
/// of a 3,000-token pass of SmolLM2-135M takes about a third of its
/// layer's attention.
pub const DEFAULT_BLOCK_ROWS: usize = 512;

/// A pretrained decoder, ready to run.
pub struct Decoder {
    cfg: DecoderConfig,
    /// `(V, D)`.
    embed: Vec<f32>,
    layers: Vec<Layer>,
    norm: RmsNorm,
    /// `(V, D)`; `None`: tied to `embed`.
    lm_head: Option<Vec<f32>>,
    backend: Backend,
    products: Products,
    /// A training-free attention method run in every layer.
    method: Option<ContextMethod>,
    /// Queries per attention call in a long pass ([`Decoder::set_block_rows`]).
    block_rows: usize,
}

debug_summary!(Decoder {
    "config": |s| &s.cfg,
});

/// Bytes of the model's parameters once loaded as `f32`.
pub fn weight_bytes(cfg: &DecoderConfig) -> u64 {
    cfg.parameters() * 4
}

/// The per-key/value-cache bytes of one position (all layers, k and v).
pub fn kv_bytes_per_position(cfg: &DecoderConfig) -> u64 {
    (2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4) as u64
}

impl Decoder {
    /// Loads every parameter of `cfg` from `src` (shapes checked against
    /// the config before each read).
    ///
    /// # Errors
    /// [`ModelError::BadFile`] for a missing tensor or one of another shape.
    pub fn load(cfg: DecoderConfig, src: &mut dyn WeightSource) -> Result<Decoder> {
        let d = cfg.hidden_size;
        let (hq, hk, dh) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let i = cfg.intermediate_size;
        let v = cfg.vocab_size;
        let eps = cfg.rms_norm_eps as f32;
        let norm = |weight: Vec<f32>| RmsNorm { weight, eps };
        let embed = vec_of(src.load("model.embed_tokens.weight", &[v, d])?)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            let mut load = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
                vec_of(src.load(&p(name), shape)?)
            };
            let attn_norm = load("input_layernorm.weight", &[d])?;
            let mut wqkv = load("self_attn.q_proj.weight", &[hq * dh, d])?;
            wqkv.extend(load("self_attn.k_proj.weight", &[hk * dh, d])?);
            wqkv.extend(load("self_attn.v_proj.weight", &[hk * dh, d])?);
            let bqkv = if cfg.qkv_bias {
                let mut b = load("self_attn.q_proj.bias", &[hq * dh])?;
                b.extend(load("self_attn.k_proj.bias", &[hk * dh])?);
                b.extend(load("self_attn.v_proj.bias", &[hk * dh])?);
                Some(b)
            } else {
                None
            };
            let wo = load("self_attn.o_proj.weight", &[d, hq * dh])?;
            let bo = if cfg.o_bias {
                Some(load("self_attn.o_proj.bias", &[d])?)
            } else {
                None
            };
            let mlp_norm = load("post_attention_layernorm.weight", &[d])?;
            let mut w_gate_up = load("mlp.gate_proj.weight", &[i, d])?;
            w_gate_up.extend(load("mlp.up_proj.weight", &[i, d])?);
            let (b_gate_up, b_down) = if cfg.mlp_bias {
                let mut b = load("mlp.gate_proj.bias", &[i])?;
                b.extend(load("mlp.up_proj.bias", &[i])?);
                (Some(b), Some(load("mlp.down_proj.bias", &[d])?))
            } else {
                (None, None)
            };
            let w_down = load("mlp.down_proj.weight", &[d, i])?;
            let linear = |weight, bias, inputs, outputs| Linear {
                weight,
                bias,
                inputs,
                outputs,
            };
            layers.push(Layer {
                attn_norm: norm(attn_norm),
                qkv: linear(wqkv, bqkv, d, cfg.qkv_width()),
                o: linear(wo, bo, hq * dh, d),
                mlp_norm: norm(mlp_norm),
                mlp: GatedMlp {
                    gate_up: linear(w_gate_up, b_gate_up, d, 2 * i),
                    down: linear(w_down, b_down, i, d),
                },
            });
        }
        let norm = norm(vec_of(src.load("model.norm.weight", &[d])?)?);
        let lm_head = if cfg.tie_word_embeddings && !src.contains("lm_head.weight") {
            None
        } else if src.contains("lm_head.weight") {
            Some(vec_of(src.load("lm_head.weight", &[v, d])?)?)
        } else {
            return Err(ModelError::Config(
                "no lm_head.weight and tie_word_embeddings is false".into(),
            ));
        };
        Ok(Decoder {
            cfg,
            embed,
            layers,
            norm,
            lm_head,
            backend: Backend::Fused,
            products: Products::F32,
            method: None,
            block_rows: DEFAULT_BLOCK_ROWS,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DecoderConfig {
        &self.cfg
    }

    /// Every parameter as loaded (`f32`, dequantized from the file), by its
    /// Hugging Face name and shape, in the order of [`Decoder::load`]: the
    /// embedding, each layer's norms, projections and biases, the final
    /// norm, and `lm_head.weight` only when the head is not tied to the
    /// embedding. Views into the model's own buffers (the stacked q/k/v and
    /// gate/up matrices are split back per projection), for code that
    /// rebuilds the network elsewhere (posenc-tune's trainable copy).
    pub fn named_weights(&self) -> Vec<NamedWeight<'_>> {
        let cfg = &self.cfg;
        let d = cfg.hidden_size;
        let (q, kv) = (
            cfg.num_heads * cfg.head_dim,
            cfg.num_kv_heads * cfg.head_dim,
        );
        let i = cfg.intermediate_size;
        fn w(name: String, shape: Vec<usize>, data: &[f32]) -> NamedWeight<'_> {
            NamedWeight { name, shape, data }
        }
        let mut out = vec![w(
            "model.embed_tokens.weight".into(),
            vec![cfg.vocab_size, d],
            &self.embed,
        )];
        for (l, layer) in self.layers.iter().enumerate() {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            out.push(w(
                p("input_layernorm.weight"),
                vec![d],
                &layer.attn_norm.weight,
            ));
            let (wq, rest) = layer.qkv.weight.split_at(q * d);
            let (wk, wv) = rest.split_at(kv * d);
            out.push(w(p("self_attn.q_proj.weight"), vec![q, d], wq));
            out.push(w(p("self_attn.k_proj.weight"), vec![kv, d], wk));
            out.push(w(p("self_attn.v_proj.weight"), vec![kv, d], wv));
            if let Some(b) = &layer.qkv.bias {
                let (bq, rest) = b.split_at(q);
                let (bk, bv) = rest.split_at(kv);
                out.push(w(p("self_attn.q_proj.bias"), vec![q], bq));
                out.push(w(p("self_attn.k_proj.bias"), vec![kv], bk));
                out.push(w(p("self_attn.v_proj.bias"), vec![kv], bv));
            }
            out.push(w(p("self_attn.o_proj.weight"), vec![d, q], &layer.o.weight));
            if let Some(b) = &layer.o.bias {
                out.push(w(p("self_attn.o_proj.bias"), vec![d], b));
            }
            out.push(w(
                p("post_attention_layernorm.weight"),
                vec![d],
                &layer.mlp_norm.weight,
            ));
            let (wg, wu) = layer.mlp.gate_up.weight.split_at(i * d);
            out.push(w(p("mlp.gate_proj.weight"), vec![i, d], wg));
            out.push(w(p("mlp.up_proj.weight"), vec![i, d], wu));
            if let Some(b) = &layer.mlp.gate_up.bias {
                let (bg, bu) = b.split_at(i);
                out.push(w(p("mlp.gate_proj.bias"), vec![i], bg));
                out.push(w(p("mlp.up_proj.bias"), vec![i], bu));
            }
            out.push(w(
                p("mlp.down_proj.weight"),
                vec![d, i],
                &layer.mlp.down.weight,
            ));
            if let Some(b) = &layer.mlp.down.bias {
                out.push(w(p("mlp.down_proj.bias"), vec![d], b));
            }
        }
        out.push(w("model.norm.weight".into(), vec![d], &self.norm.weight));
        if let Some(h) = &self.lm_head {
            out.push(w("lm_head.weight".into(), vec![cfg.vocab_size, d], h));
        }
        out
    }

    /// Replaces the parameter `name` (a name of
    /// [`named_weights`](Self::named_weights), in the model's own row order:
    /// for interleaved GGUF Llama files, q and k rows permuted) by `values`
    /// (`f32`, row-major, the same number of values): how posenc-tune merges
    /// a LoRA adapter's `W + s·B·A` or a retrained embedding or norm into a
    /// loaded model. With a tied head, `model.embed_tokens.weight` is the
    /// head too, and `lm_head.weight` does not exist.
    ///
    /// # Errors
    /// [`ModelError::Invalid`] for a name the model does not have, or
    /// values of another size or not finite (nothing is changed then).
    pub fn set_weight(&mut self, name: &str, values: &[f32]) -> Result<()> {
        let cfg = &self.cfg;
        let (d, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (q, kv) = (
            cfg.num_heads * cfg.head_dim,
            cfg.num_kv_heads * cfg.head_dim,
        );
        let unknown = || ModelError::Invalid(format!("the model has no parameter {name}"));
        let slot: &mut [f32] = match name {
            "model.embed_tokens.weight" => &mut self.embed,
            "model.norm.weight" => &mut self.norm.weight,
            "lm_head.weight" => self.lm_head.as_deref_mut().ok_or_else(unknown)?,
            _ => {
                let rest = name.strip_prefix("model.layers.").ok_or_else(unknown)?;
                let (l, field) = rest.split_once('.').ok_or_else(unknown)?;
                let l: usize = l.parse().map_err(|_| unknown())?;
                let layer = self.layers.get_mut(l).ok_or_else(unknown)?;
                fn opt(b: &mut Option<Vec<f32>>) -> Option<&mut [f32]> {
                    b.as_deref_mut()
                }
                match field {
                    "input_layernorm.weight" => &mut layer.attn_norm.weight,
                    "post_attention_layernorm.weight" => &mut layer.mlp_norm.weight,
                    "self_attn.q_proj.weight" => &mut layer.qkv.weight[..q * d],
                    "self_attn.k_proj.weight" => &mut layer.qkv.weight[q * d..(q + kv) * d],
                    "self_attn.v_proj.weight" => &mut layer.qkv.weight[(q + kv) * d..],
                    "self_attn.q_proj.bias" => {
                        &mut opt(&mut layer.qkv.bias).ok_or_else(unknown)?[..q]
                    }
                    "self_attn.k_proj.bias" => {
                        &mut opt(&mut layer.qkv.bias).ok_or_else(unknown)?[q..q + kv]
                    }
                    "self_attn.v_proj.bias" => {
                        &mut opt(&mut layer.qkv.bias).ok_or_else(unknown)?[q + kv..]
                    }
                    "self_attn.o_proj.weight" => &mut layer.o.weight,
                    "self_attn.o_proj.bias" => opt(&mut layer.o.bias).ok_or_else(unknown)?,
                    "mlp.gate_proj.weight" => &mut layer.mlp.gate_up.weight[..i * d],
                    "mlp.up_proj.weight" => &mut layer.mlp.gate_up.weight[i * d..],
                    "mlp.gate_proj.bias" => {
                        &mut opt(&mut layer.mlp.gate_up.bias).ok_or_else(unknown)?[..i]
                    }
                    "mlp.up_proj.bias" => {
                        &mut opt(&mut layer.mlp.gate_up.bias).ok_or_else(unknown)?[i..]
                    }
                    "mlp.down_proj.weight" => &mut layer.mlp.down.weight,
                    "mlp.down_proj.bias" => opt(&mut layer.mlp.down.bias).ok_or_else(unknown)?,
                    _ => return Err(unknown()),
                }
            }
        };
        if slot.len() != values.len() {
            return Err(ModelError::Invalid(format!(
                "{name} holds {} values, {} given",
                slot.len(),
                values.len()
            )));
        }
        if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::Invalid(format!(
                "{name}: value {bad} is not finite"
            )));
        }
        slot.copy_from_slice(values);
        Ok(())
    }

    /// Runs the composed reference path (candle matmuls, the attention's
    /// reference path: the whole `T × T` logits) instead of the fused one.
    pub fn set_reference(&mut self, on: bool) {
        self.backend = if on {
            Backend::Reference
        } else {
            Backend::Fused
        };
    }

    /// The precision of the attention's products on windows of more than
    /// 1,024 tokens ([`Products::F32`] by default; see
    /// [`posenc::tensor::attention::Attention::with_products`]).
    ///
    /// # Errors
    /// [`Products::Bf16`] on a CPU without AVX-512 and AVX512_BF16.
    pub fn set_products(&mut self, products: Products) -> Result<()> {
        check_products(products)?;
        self.products = products;
        Ok(())
    }

    /// Runs every layer's attention with a training-free context method
    /// (Self-Extend, ReRoPE, dual chunk attention, sinks: see
    /// [`posenc::extend`]) on top of the RoPE given to each call; `None`
    /// (the default) for plain attention.
    ///
    /// # Errors
    /// The method's parameter checks.
    pub fn set_method(&mut self, method: Option<ContextMethod>) -> Result<()> {
        if let Some(m) = method {
            m.validate()
                .map_err(|e| ModelError::Invalid(e.to_string()))?;
        }
        self.method = method;
        Ok(())
    }

    /// Queries per attention call when a pass has more than that many
    /// ([`DEFAULT_BLOCK_ROWS`] by default, at least 1): a long pass runs its
    /// plain attention in blocks of query rows, each over the keys up to its
    /// last position, and can stop between two blocks (Ctrl-C from Python).
    /// The rows' values are those of one call, bit for bit: past
    /// [`posenc::kernels::attention::LONG_KEYS`] keys, the first block reaches
    /// past them and every block is rounded up to a multiple of
    /// [`posenc::kernels::attention::LONG_QUERY_TILE`] rows, so every block
    /// runs one call's tiles.
    /// A training-free method's attention stays one call per layer (its
    /// views pack every key at each call).
    ///
    /// # Errors
    /// [`ModelError::Invalid`] for 0.
    pub fn set_block_rows(&mut self, rows: usize) -> Result<()> {
        if rows == 0 {
            return Err(ModelError::Invalid(
                "an attention block needs at least one query".into(),
            ));
        }
        self.block_rows = rows;
        Ok(())
    }

    /// The attention method set by [`set_method`](Self::set_method).
    pub fn method(&self) -> Option<ContextMethod> {
        self.method
    }

    /// The lengths the context methods read from this model's config.
    pub fn model_lengths(&self) -> ModelLengths {
        ModelLengths {
            trained: Some(self.cfg.trained_length()),
            max_position_embeddings: Some(self.cfg.max_position_embeddings),
        }
    }

    /// The attention of this model's forward passes.
    fn attention(&self) -> Result<Attention> {
        Ok(Attention::new(true).with_products(self.products)?)
    }

    /// The output projection `(V, D)`.
    fn head(&self) -> &[f32] {
        self.lm_head.as_deref().unwrap_or(&self.embed)
    }

    /// Final hidden states (after the last RMSNorm), `(T, D)` row-major, of
    /// `tokens` at positions `offset..offset + T`, with `rope` rotating
    /// queries and keys; `cache`, if given, receives every layer's keys and
    /// values and supplies the earlier ones (its length must be `offset`).
    ///
    /// # Errors
    /// [`ModelError::Invalid`] for an empty input or a token outside the
    /// vocabulary; attention errors.
    pub fn hidden_states(
        &self,
        tokens: &[u32],
        rope: &Rope,
        cache: Option<&mut KvCache>,
    ) -> Result<Vec<f32>> {
        self.hidden_states_observed(tokens, rope, cache, &mut |_| {})
    }

    /// [`Decoder::hidden_states`], calling `on_layer` after each layer
    /// ([`Step::Done`]: for progress bars) and between the parts of a
    /// layer ([`Step::Inside`]: places where a long pass can stop).
    ///
    /// # Errors
    /// As [`Decoder::hidden_states`].
    pub fn hidden_states_observed(
        &self,
        tokens: &[u32],
        rope: &Rope,
        cache: Option<&mut KvCache>,
        on_layer: &mut dyn FnMut(Step),
    ) -> Result<Vec<f32>> {
        self.hidden_states_with(tokens, rope, self.method, cache, on_layer)
    }

    /// [`Decoder::hidden_states_observed`] with `method` (instead of the
    /// one [`set_method`](Self::set_method) gave) in every layer's
    /// attention.
    ///
    /// # Errors
    /// As [`Decoder::hidden_states`]; the method's checks.
    pub fn hidden_states_with(
        &self,
        tokens: &[u32],
        rope: &Rope,
        method: Option<ContextMethod>,
        mut cache: Option<&mut KvCache>,
        on_layer: &mut dyn FnMut(Step),
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let method = match method {
            Some(m) => Some(
                MethodAttention::new(m, rope, self.model_lengths())?
                    .with_products(self.products)?,
            ),
            None => None,
        };
        let t = tokens.len();
        if t == 0 {
            return Err(ModelError::Invalid("no tokens to run".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= cfg.vocab_size) {
            return Err(ModelError::Invalid(format!(
                "token id {bad} is outside the vocabulary of {}",
                cfg.vocab_size
            )));
        }
        let offset = cache.as_ref().map_or(0, |c| c.len());
        if let Some(c) = cache.as_ref() {
            if c.layers.len() != cfg.num_layers {
                return Err(ModelError::Invalid("KV cache of another model".into()));
            }
        }
        let d = cfg.hidden_size;
        let (hq, hk, dh) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let be = self.backend;
        let mut x = vec![0f32; t * d]; // (T, D)
        x.par_chunks_mut(d)
            .zip(tokens.par_iter())
            .for_each(|(row, &id)| {
                row.copy_from_slice(&self.embed[id as usize * d..][..d]);
            });
        let mut h = vec![0f32; t * d]; // (T, D)
        for (li, layer) in self.layers.iter().enumerate() {
            layer.attn_norm.forward(&x, &mut h);
            let qkv = layer.qkv.forward(be, &h, t)?; // (T, (H_q + 2·H_k)·Dh)
            on_layer(Step::Inside(li));
            let between = &mut || on_layer(Step::Inside(li));
            // A method's views pack and rotate every key at each call: its
            // attention stays one call (in blocks of 512, SmolLM2's 2,049
            // tokens took 1.4 times as long).
            let rows = if method.is_some() { t } else { self.block_rows };
            let a = match cache.as_deref_mut() {
                Some(c) => {
                    c.append(li, &qkv, t, hq, hk, dh);
                    let (kc, vc) = &c.layers[li];
                    let kv = (&kc[..], &vc[..]);
                    let m = method.as_ref();
                    self.attend_blocks(&qkv, t, kv, rope, m, (offset, rows), between)?
                }
                None if t > rows => {
                    let (mut kc, mut vc) = (Vec::new(), Vec::new());
                    push_kv((&mut kc, &mut vc), &qkv, t, (hq, hk, dh));
                    let kv = (&kc[..], &vc[..]);
                    self.attend_blocks(&qkv, t, kv, rope, None, (0, rows), between)?
                }
                None => self.attend(qkv, t, rope, method.as_ref())?,
            }; // (T, H_q·Dh)
            on_layer(Step::Inside(li));
            add_into(&mut x, &layer.o.forward(be, &a, t)?);
            drop(a);
            layer.mlp_norm.forward(&x, &mut h);
            let mlp = layer
                .mlp
                .forward_observed(be, &h, t, &mut || on_layer(Step::Inside(li)))?;
            add_into(&mut x, &mlp);
            on_layer(Step::Done(li));
        }
        if let Some(c) = cache {
            c.len += t;
        }
        self.norm.forward(&x, &mut h);
        Ok(h)
    }

    /// Logits `(rows, V)` of `rows` final hidden states.
    ///
    /// # Errors
    /// Candle's, on the reference path.
    pub fn logits(&self, hidden: &[f32], rows: usize) -> Result<Vec<f32>> {
        let d = self.cfg.hidden_size;
        self.backend.matmul_xwt(
            &hidden[..rows * d],
            rows,
            d,
            self.head(),
            self.cfg.vocab_size,
        )
    }

    /// Causal attention over one packed projection `(T, W)`: positions
    /// `0..T`.
    fn attend(
        &self,
        qkv: Vec<f32>,
        t: usize,
        rope: &Rope,
        method: Option<&MethodAttention>,
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let w = cfg.qkv_width();
        let qkv = Tensor::from_vec(qkv, (1, t, w), &Device::Cpu)?;
        let heads = (cfg.num_heads, cfg.num_kv_heads);
        if let Some(ma) = method {
            return vec_of(self.backend.method_packed(ma, &qkv, heads)?);
        }
        let hooks = AttentionHooks {
            query_key: Some(rope),
            ..Default::default()
        };
        let attn = self.attention()?;
        let out =
            self.backend
                .attention_packed(&attn, &qkv, heads, &hooks, AttnPositions::default())?;
        vec_of(out)
    }

    /// Attention of `t` new queries at `offset..offset + t` (the query
    /// columns of `qkv`, `(T, W)`) over the keys and values `kv`, each
    /// `(S, H_k, Dh)` with `S ≥ offset + t` (the new ones included), in
    /// blocks of at most `rows` queries, each over the keys up to its last
    /// position; `between()` runs between two blocks (where a long pass can
    /// stop).
    #[allow(clippy::too_many_arguments)]
    fn attend_blocks(
        &self,
        qkv: &[f32],
        t: usize,
        (kc, vc): (&[f32], &[f32]),
        rope: &Rope,
        method: Option<&MethodAttention>,
        (offset, rows): (usize, usize),
        between: &mut dyn FnMut(),
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let (hq, hk, dh) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let w = cfg.qkv_width();
        let hooks = AttentionHooks {
            query_key: Some(rope),
            ..Default::default()
        };
        let attn = self
            .attention()?
            .with_layout(posenc::kernels::HeadLayout::Bthd);
        debug_assert!(rows > 0, "set_block_rows refuses 0, and t > 0");
        let mut out = Vec::with_capacity(t * hq * dh); // (T, H_q·Dh)
                                                       // Blocks that keep one call's bits (the kernels' tiles decide where).
        let (rows, first_end) = posenc::kernels::attention::query_blocks(offset, t, rows);
        let mut start = 0;
        while start < t {
            if start > 0 {
                between();
            }
            let end = if start == 0 { first_end } else { start + rows }.min(t);
            let n = end - start;
            let mut q = Vec::with_capacity(n * hq * dh);
            for r in start..end {
                q.extend_from_slice(&qkv[r * w..][..hq * dh]);
            }
            let tk = offset + end;
            let q = Tensor::from_vec(q, (1, n, hq, dh), &Device::Cpu)?;
            let k = Tensor::from_slice(&kc[..tk * hk * dh], (1, tk, hk, dh), &Device::Cpu)?;
            let v = Tensor::from_slice(&vc[..tk * hk * dh], (1, tk, hk, dh), &Device::Cpu)?;
            let block = match method {
                Some(ma) => self.backend.method(ma, (&q, &k, &v))?,
                None => {
                    let pos = AttnPositions::offsets(offset + start, 0);
                    self.backend.attention(&attn, (&q, &k, &v), &hooks, pos)?
                }
            };
            out.extend_from_slice(&vec_of(block)?);
            start = end;
        }
        Ok(out)
    }
}

/// Checks that this CPU runs the attention's products at `products`
/// (before any model is read).
///
/// # Errors
/// [`Products::Bf16`] on a CPU without AVX-512 and AVX512_BF16.
pub fn check_products(products: Products) -> Result<()> {
    Attention::new(true).with_products(products)?;
    Ok(())
}

/// Keys and values of every layer, unrotated (the attention rotates them at
/// their positions at each call), for generation.
#[derive(Debug, Clone)]
pub struct KvCache {
    /// Per layer: keys and values, `(len, H_k, Dh)` row-major each.
    layers: Vec<(Vec<f32>, Vec<f32>)>,
    len: usize,
}

impl KvCache {
    /// An empty cache for `cfg`'s model.
    pub fn new(cfg: &DecoderConfig) -> KvCache {
        KvCache {
            layers: vec![(Vec::new(), Vec::new()); cfg.num_layers],
            len: 0,
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the first `len` positions (no-op when it holds fewer).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for (k, v) in self.layers.iter_mut() {
            let per = k.len().checked_div(self.len).unwrap_or(0);
            k.truncate(len * per);
            v.truncate(len * per);
        }
        self.len = len;
    }

    fn append(&mut self, layer: usize, qkv: &[f32], t: usize, hq: usize, hk: usize, dh: usize) {
        let (k, v) = &mut self.layers[layer];
        push_kv((k, v), qkv, t, (hq, hk, dh));
    }
}

/// Appends the key and value columns of the `t` rows of a packed projection
/// `qkv` `(T, (H_q + 2·H_k)·Dh)` to `k` and `v`, each `(·, H_k, Dh)`.
fn push_kv(
    (k, v): (&mut Vec<f32>, &mut Vec<f32>),
    qkv: &[f32],
    t: usize,
    (hq, hk, dh): (usize, usize, usize),
) {
    let w = (hq + 2 * hk) * dh;
    for row in qkv[..t * w].chunks_exact(w) {
        k.extend_from_slice(&row[hq * dh..][..hk * dh]);
        v.extend_from_slice(&row[(hq + hk) * dh..][..hk * dh]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Safetensors;

    /// The tiny decoders of `tests/fixtures`.
    const FIXTURES: [&str; 2] = ["tiny-qwen25", "tiny-llama31"];

    /// The config and the weights of the fixture `name`.
    fn fixture(name: &str) -> (DecoderConfig, Safetensors) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let cfg = DecoderConfig::from_hf_json_str(&text).unwrap();
        (cfg, Safetensors::open_dir(&dir).unwrap())
    }

    /// `named_weights` gives back every tensor of the file, split out of
    /// the stacked buffers, under its own name and shape (Qwen2.5: q/k/v
    /// biases and a tied head; Llama 3.1: an untied head).
    #[test]
    fn named_weights_are_the_files_tensors() {
        for name in FIXTURES {
            let (cfg, mut st) = fixture(name);
            let decoder = Decoder::load(cfg.clone(), &mut st).unwrap();
            let named = decoder.named_weights();
            let expected: Vec<(String, Vec<usize>)> = cfg
                .expected_tensors()
                .into_iter()
                .filter(|(n, _)| st.contains(n))
                .collect();
            assert_eq!(named.len(), expected.len(), "{name}");
            for (hf, shape) in expected {
                let w = named.iter().find(|w| w.name == hf).unwrap();
                assert_eq!(w.shape, shape, "{hf}");
                let file = vec_of(st.load(&hf, &shape).unwrap()).unwrap();
                assert_eq!(w.data, &file[..], "{hf}");
            }
        }
    }

    /// `set_weight` replaces exactly the named parameter (inside the
    /// stacked buffers too), and refuses unknown names, a tied head, wrong
    /// sizes and non-finite values without changing anything.
    #[test]
    fn set_weight_replaces_one_parameter() {
        for name in FIXTURES {
            let (cfg, mut st) = fixture(name);
            let mut decoder = Decoder::load(cfg, &mut st).unwrap();
            let before: Vec<(String, Vec<f32>)> = decoder
                .named_weights()
                .iter()
                .map(|w| (w.name.clone(), w.data.to_vec()))
                .collect();
            for (target, values) in &before {
                let new: Vec<f32> = values.iter().map(|v| v + 1.0).collect();
                decoder.set_weight(target, &new).unwrap();
                for w in decoder.named_weights() {
                    let old = &before.iter().find(|(n, _)| *n == w.name).unwrap().1;
                    if w.name == *target {
                        assert_eq!(w.data, &new[..], "{name}: {target}");
                    } else {
                        assert_eq!(w.data, &old[..], "{name}: {} moved with {target}", w.name);
                    }
                }
                decoder.set_weight(target, values).unwrap();
                let short = &values[..values.len() - 1];
                assert!(decoder.set_weight(target, short).is_err());
                let mut nan = values.clone();
                nan[0] = f32::NAN;
                assert!(decoder.set_weight(target, &nan).is_err());
            }
            let q = &before[2].1;
            for bad in [
                "model.layers.9.self_attn.q_proj.weight",
                "model.layers.0.attn.weight",
                "x",
            ] {
                assert!(decoder.set_weight(bad, q).is_err(), "{bad}");
            }
            if name == "tiny-qwen25" {
                // Tied head: only the embedding exists.
                assert!(decoder.set_weight("lm_head.weight", &before[0].1).is_err());
            }
        }
    }

    /// Past the kernels' long-tile threshold, blocks of query rows keep one
    /// call's bits: a 2,100-token pass, and its tokens after 1,000 or 1,026
    /// in a KV cache (blocks that straddle the threshold, or start past it),
    /// in blocks of 7, 300 and 512 rows, equal one call to the bit.
    #[test]
    fn long_attention_in_blocks_keeps_the_bits() {
        use crate::perplexity::rope_of;
        use crate::scaling::Scaling;
        let (cfg, mut st) = fixture(FIXTURES[0]);
        let mut decoder = Decoder::load(cfg.clone(), &mut st).unwrap();
        let tokens: Vec<u32> = (0..2100)
            .map(|i| (i * 7 + 3) % cfg.vocab_size as u32)
            .collect();
        let sc: Scaling = "none".parse().unwrap();
        let rope = rope_of(sc.rope_config(&cfg).unwrap()).unwrap();
        let run = |d: &Decoder, split: Option<usize>| {
            let mut cache = KvCache::new(&cfg);
            match split {
                None => d
                    .hidden_states_observed(&tokens, &rope, None, &mut |_| {})
                    .unwrap(),
                Some(at) => {
                    d.hidden_states_observed(&tokens[..at], &rope, Some(&mut cache), &mut |_| {})
                        .unwrap();
                    d.hidden_states_observed(&tokens[at..], &rope, Some(&mut cache), &mut |_| {})
                        .unwrap()
                }
            }
        };
        for split in [None, Some(1000), Some(1026)] {
            decoder.set_block_rows(usize::MAX).unwrap();
            let one = run(&decoder, split);
            for rows in [7, 300, DEFAULT_BLOCK_ROWS] {
                decoder.set_block_rows(rows).unwrap();
                assert!(run(&decoder, split) == one, "{split:?} in blocks of {rows}");
            }
        }
    }

    /// A pass whose plain attention runs in blocks of query rows (with and
    /// without a KV cache) gives the hidden states of one call to the bit
    /// and calls its observer between the blocks; with a method (one call
    /// per layer) the block size changes nothing.
    #[test]
    fn attention_in_blocks_equals_one_call() {
        use crate::perplexity::rope_of;
        use crate::scaling::Scaling;
        for name in FIXTURES {
            let (cfg, mut st) = fixture(name);
            let mut decoder = Decoder::load(cfg.clone(), &mut st).unwrap();
            let tokens: Vec<u32> = (0..40)
                .map(|i| (i * 7 + 3) % cfg.vocab_size as u32)
                .collect();
            for scaling in [
                "none",
                "self-extend:2:8+none",
                "rerope:8+none",
                "sinks:2:8+none",
                "dca:16:4+none",
            ] {
                let sc: Scaling = scaling.parse().unwrap();
                let rope = rope_of(sc.rope_config(&cfg).unwrap()).unwrap();
                decoder.set_method(sc.method).unwrap();
                for cached in [false, true] {
                    let run = |d: &Decoder| {
                        let mut steps = Vec::new();
                        let mut cache = KvCache::new(&cfg);
                        let h = d
                            .hidden_states_observed(
                                &tokens,
                                &rope,
                                cached.then_some(&mut cache),
                                &mut |s| steps.push(s),
                            )
                            .unwrap();
                        (h, steps)
                    };
                    decoder.set_block_rows(DEFAULT_BLOCK_ROWS).unwrap();
                    let (one, steps_one) = run(&decoder);
                    decoder.set_block_rows(7).unwrap();
                    let (blocks, steps_blocks) = run(&decoder);
                    let diff = one
                        .iter()
                        .zip(&blocks)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(diff < 1e-5, "{name} {scaling} cached {cached}: {diff}");
                    assert_eq!(one, blocks, "{name} {scaling} cached {cached}");
                    // 40 rows in blocks of 7: six blocks, five places between them.
                    let inside =
                        |v: &[Step]| v.iter().filter(|s| matches!(s, Step::Inside(0))).count();
                    let extra = if sc.method.is_none() { 5 } else { 0 };
                    assert_eq!(
                        inside(&steps_blocks),
                        inside(&steps_one) + extra,
                        "{name} {scaling}"
                    );
                    if sc.method.is_some() {
                        assert_eq!(one, blocks, "{name} {scaling}");
                    }
                    assert_eq!(steps_blocks.last(), Some(&Step::Done(cfg.num_layers - 1)));
                }
            }
        }
        let (cfg, mut st) = fixture(FIXTURES[0]);
        let mut decoder = Decoder::load(cfg, &mut st).unwrap();
        assert!(decoder.set_block_rows(0).is_err());
    }
}
