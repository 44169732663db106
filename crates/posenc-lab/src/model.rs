//! The lab transformer, in one file: pre-LayerNorm blocks of multi-head
//! attention and an MLP, with the positional encoding plugged in at its hook.
//!
//! ```text
//! tokens (B, T) ──embedding──▶ x (B, T, D)
//!                  + input hook: absolute encoding (sinusoidal, learned, FLOATER)
//! N × [ x = x + Attn(LN(x)) ; x = x + MLP(LN(x)) ]
//!        Attn: q, k, v (B, H, T, hd)
//!              query/key hook: rotate q, k (RoPE, xPos)
//!              logits (B, H, T, T) = q·kᵀ/√hd
//!              logits hook: + bias (ALiBi, T5), + q·a^K (Shaw)
//!              causal mask (decoder), softmax
//!              out = α·v ; values hook: + Σ α·a^V (Shaw)
//! LN(x) ──▶ decoder, token encoder: logits (B, T, V)
//!           encoder: mean over T ──▶ (B, C)
//! ```
//! The three modes ([`Mode`]): a decoder (causal attention, next-token
//! logits), an encoder (bidirectional attention, mean-pooled class logits)
//! and a token encoder (bidirectional attention, one vocabulary
//! distribution per position: masked language modelling).
//! NoPE uses no hook at all.

use candle_core::{Device, Module, Tensor};
use candle_nn::{embedding, linear, Embedding, Linear, VarBuilder};
use posenc::absolute::floater::FloaterConfig;
use posenc::absolute::sinusoidal::{Sinusoidal, SinusoidalLayout};
use posenc::relative::alibi::{Alibi, AlibiMode};
use posenc::rope::RopeConfig;
use posenc::tensor::absolute::{
    FloaterEmbedding, LearnedEmbedding, Positions, SinusoidalEmbedding,
};
use posenc::tensor::bias::{alibi_bias, ShawRelative, T5RelativeBias};
use posenc::tensor::rope::Rope;

use crate::config::{Mode, ModelConfig, PeConfig};
use crate::LabError;

/// The input hook.
enum InputPe {
    None,
    Sinusoidal(SinusoidalEmbedding),
    Learned(LearnedEmbedding),
    Floater(FloaterEmbedding),
}

/// A trained input encoding, as plain Rust (see [`Transformer::trained_input`]).
pub enum TrainedInput {
    /// A learned absolute table.
    Learned(posenc::absolute::LearnedTable),
    /// FLOATER with its trained parameters.
    Floater(posenc::absolute::floater::Floater),
}

/// How token embeddings start and enter the model: drawn from
/// N(0, `init_std`²) and multiplied by `scale` before the input encoding is
/// added (see [`token_embedding_recipe`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenRecipe {
    /// Standard deviation of the initial token embeddings.
    pub init_std: f64,
    /// Factor the embeddings are multiplied by in the forward pass.
    pub scale: f64,
}

/// The token-embedding recipe each input encoding is trained with.
///
/// - Sinusoidal: Vaswani et al. §3.4 multiply the embeddings by √d_model,
///   and their implementations (tensor2tensor's `embedding`, fairseq's
///   `Embedding` with `embed_scale`) draw them from N(0, 1/d_model), so a
///   token enters at about 1 per dimension, level with the unit-amplitude
///   sinusoids (≈ 0.71 per dimension). Taking the √d_model factor alone
///   with GPT-2's 0.02 (tokens at 0.02·√d_model ≈ 0.11 per dimension for
///   d_model = 32) leaves the fixed encoding six times louder than the
///   tokens. Measured with `posenc train --task mlm --pe sinusoidal
///   --d-model 32 --layers 1 --train-len 32 --symbols 8 --steps 2000
///   --warmup 200`: a masked LM stayed at the unigram level with 0.02 (loss
///   2.65 nats) and reaches 0.82 with 1/√d_model (learned positions: 0.52).
/// - Every other encoding: GPT-2's N(0, 0.02²), not scaled; a learned
///   table or FLOATER's initial state starts as small as the tokens.
pub fn token_embedding_recipe(cfg: &ModelConfig) -> TokenRecipe {
    match cfg.pe {
        PeConfig::Sinusoidal { .. } => TokenRecipe {
            init_std: 1.0 / (cfg.d_model as f64).sqrt(),
            scale: (cfg.d_model as f64).sqrt(),
        },
        _ => TokenRecipe {
            init_std: 0.02,
            scale: 1.0,
        },
    }
}

/// The logits hook shared by all layers.
enum SharedBias {
    None,
    Alibi(Alibi),
    T5(T5RelativeBias),
}

/// A RoPE scaling chosen at evaluation time (train with plain RoPE, evaluate
/// with PI, NTK, dynamic NTK or YaRN at a longer length).
pub struct EvalScaling {
    /// Human-readable name, e.g. `yarn ×4`.
    pub name: String,
    rope: Rope,
}

impl EvalScaling {
    /// Builds the scaling `kind` (`none`, `linear`, `ntk`, `dynamic`,
    /// `yarn`) with `factor` for a model trained at `train_len`, through
    /// the same Hugging Face config path users take.
    pub fn new(
        cfg: &ModelConfig,
        kind: &str,
        factor: f64,
        train_len: usize,
    ) -> Result<Self, LabError> {
        let PeConfig::Rope {
            theta,
            partial,
            interleaved,
        } = cfg.pe
        else {
            return Err(LabError::Invalid(format!(
                "--scaling needs a RoPE model; this one uses {}",
                cfg.pe.label()
            )));
        };
        let hd = cfg.head_dim();
        let scaling = match kind {
            "none" => String::new(),
            "linear" => {
                format!(r#", "rope_scaling": {{"rope_type": "linear", "factor": {factor}}}"#)
            }
            "ntk" => format!(r#", "rope_scaling": {{"rope_type": "ntk", "factor": {factor}}}"#),
            "dynamic" => format!(
                r#", "rope_scaling": {{"rope_type": "dynamic", "factor": {factor}, "original_max_position_embeddings": {train_len}}}"#
            ),
            "yarn" => format!(
                r#", "rope_scaling": {{"rope_type": "yarn", "factor": {factor}, "original_max_position_embeddings": {train_len}}}"#
            ),
            other => {
                return Err(LabError::Invalid(format!(
                    "unknown scaling {other:?}; known: none, linear, ntk, dynamic, yarn"
                )))
            }
        };
        let json = format!(
            r#"{{"head_dim": {hd}, "num_attention_heads": {}, "rope_theta": {theta}, "partial_rotary_factor": {partial}, "max_position_embeddings": {}{scaling}}}"#,
            cfg.n_heads,
            // Dynamic NTK reads the training length from
            // max_position_embeddings (as transformers does) and rescales
            // only beyond it; the others take the extended context.
            if kind == "dynamic" {
                train_len
            } else {
                (train_len as f64 * factor.max(1.0)).ceil() as usize
            },
        );
        let mut rc = RopeConfig::from_hf_json_str(&json)?;
        if interleaved {
            rc = rc.with_layout(posenc::rope::PairLayout::Interleaved);
        }
        Ok(EvalScaling {
            name: if kind == "none" {
                "none".into()
            } else {
                format!("{kind} ×{factor}")
            },
            rope: Rope::new(rc)?,
        })
    }
}

impl EvalScaling {
    /// An evaluation-time RoPE built from any configuration (for scalings
    /// whose parameters [`EvalScaling::new`] does not expose, e.g. YaRN's
    /// `beta_fast`/`beta_slow`), shown as `name`.
    pub fn from_rope(name: impl Into<String>, rope: Rope) -> Self {
        EvalScaling {
            name: name.into(),
            rope,
        }
    }
}

struct Attention {
    qkv: Linear,
    proj: Linear,
    n_heads: usize,
    head_dim: usize,
    causal: bool,
    shaw: Option<ShawRelative>,
}

impl Attention {
    fn forward(
        &self,
        x: &Tensor,
        offset: usize,
        rope: Option<&Rope>,
        bias: &SharedBias,
    ) -> Result<Tensor, LabError> {
        let (b, t, d) = x.dims3()?;
        let (h, hd) = (self.n_heads, self.head_dim);
        // (B, T, 3D) → 3 × (B, H, T, hd)
        let qkv = self
            .qkv
            .forward(x)?
            .reshape((b, t, 3, h, hd))?
            .permute((2, 0, 3, 1, 4))?;
        let mut q = qkv.get(0)?.contiguous()?;
        let mut k = qkv.get(1)?.contiguous()?;
        let v = qkv.get(2)?.contiguous()?;
        // Query/key hook.
        if let Some(rope) = rope {
            (q, k) = rope.apply(&q, &k, offset)?;
        }
        let scale = 1.0 / (hd as f64).sqrt();
        // (B, H, T, T)
        let mut logits = (q.matmul(&k.t()?)? * scale)?;
        // Logits hook.
        if let Some(shaw) = &self.shaw {
            let o = offset as u64;
            logits = (logits + (shaw.key_logits(&q, t, o, o)? * scale)?)?;
        }
        match bias {
            SharedBias::None => {}
            SharedBias::Alibi(a) => {
                let o = offset as u64;
                let bias = alibi_bias(a, t, t, o, o, x.device())?; // (H, T, T)
                logits = logits.broadcast_add(&bias.unsqueeze(0)?)?;
            }
            SharedBias::T5(tb) => {
                let o = offset as u64;
                logits = logits.broadcast_add(&tb.forward(t, t, o, o)?.unsqueeze(0)?)?;
            }
        }
        if self.causal {
            logits = logits.broadcast_add(&causal_mask(t, x.device())?)?;
        }
        // candle-nn's fused `softmax_last_dim` has no backward pass; the
        // composed softmax does.
        let att = candle_nn::ops::softmax(&logits, candle_core::D::Minus1)?;
        let mut out = att.matmul(&v)?; // (B, H, T, hd)
                                       // Values hook.
        if let Some(shaw) = &self.shaw {
            let o = offset as u64;
            out = (out + shaw.relative_values(&att, o, o)?)?;
        }
        let out = out.transpose(1, 2)?.reshape((b, t, d))?;
        Ok(self.proj.forward(&out)?)
    }
}

/// LayerNorm from composed ops. candle-nn's `LayerNorm` takes a fused
/// kernel without a backward pass on contiguous inputs, which silently drops
/// every gradient below it; this one is differentiable.
struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

fn layer_norm(d: usize, eps: f64, vb: VarBuilder) -> candle_core::Result<LayerNorm> {
    Ok(LayerNorm {
        weight: vb.get_with_hints(d, "weight", candle_nn::Init::Const(1.0))?,
        bias: vb.get_with_hints(d, "bias", candle_nn::Init::Const(0.0))?,
        eps,
    })
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let d = x.dim(candle_core::D::Minus1)? as f64;
        let mean = (x.sum_keepdim(candle_core::D::Minus1)? / d)?;
        let xc = x.broadcast_sub(&mean)?;
        let var = (xc.sqr()?.sum_keepdim(candle_core::D::Minus1)? / d)?;
        let xn = xc.broadcast_div(&(var + self.eps)?.sqrt()?)?;
        xn.broadcast_mul(&self.weight)?.broadcast_add(&self.bias)
    }
}

/// `(T, T)` additive mask: 0 on and below the diagonal, −∞ above.
fn causal_mask(t: usize, dev: &Device) -> Result<Tensor, LabError> {
    let m: Vec<f32> = (0..t)
        .flat_map(|i| (0..t).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Ok(Tensor::from_vec(m, (t, t), dev)?)
}

struct Block {
    ln1: LayerNorm,
    attn: Attention,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl Block {
    fn forward(
        &self,
        x: &Tensor,
        offset: usize,
        rope: Option<&Rope>,
        bias: &SharedBias,
    ) -> Result<Tensor, LabError> {
        let x = (x + self
            .attn
            .forward(&self.ln1.forward(x)?, offset, rope, bias)?)?;
        let h = self.fc1.forward(&self.ln2.forward(&x)?)?.gelu()?;
        Ok((&x + self.fc2.forward(&h)?)?)
    }
}

/// A lab transformer.
pub struct Transformer {
    cfg: ModelConfig,
    tok: Embedding,
    input_pe: InputPe,
    rope: Option<Rope>,
    bias: SharedBias,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Option<Linear>,
}

impl Transformer {
    /// Builds the model; parameters are created through `vb` (a `VarMap`
    /// for training). `seed` initialises encodings with their own random
    /// tables (T5, Shaw).
    pub fn new(cfg: &ModelConfig, seed: u64, vb: VarBuilder) -> Result<Self, LabError> {
        cfg.validate()?;
        let dev = vb.device().clone();
        let (d, h, hd) = (cfg.d_model, cfg.n_heads, cfg.head_dim());
        let tok = embedding(cfg.vocab_size, d, vb.pp("tok"))?;
        let input_pe = match &cfg.pe {
            PeConfig::Sinusoidal { concatenated } => {
                let layout = if *concatenated {
                    SinusoidalLayout::Concatenated
                } else {
                    SinusoidalLayout::Interleaved
                };
                InputPe::Sinusoidal(SinusoidalEmbedding::new(
                    Sinusoidal::new(d)?.with_layout(layout),
                    &dev,
                )?)
            }
            PeConfig::Learned { max_positions } => InputPe::Learned(LearnedEmbedding::new(
                *max_positions,
                d,
                vb.pp("pe.learned"),
            )?),
            PeConfig::Floater => InputPe::Floater(FloaterEmbedding::new(
                FloaterConfig::new(d, d.min(64)),
                vb.pp("pe.floater"),
            )?),
            _ => InputPe::None,
        };
        let rope = match &cfg.pe {
            PeConfig::Rope {
                theta,
                partial,
                interleaved,
            } => {
                let rd = (hd as f64 * partial) as usize;
                let mut rc = RopeConfig::new(*theta, rd)?.with_head_dim(hd);
                if *interleaved {
                    rc = rc.with_layout(posenc::rope::PairLayout::Interleaved);
                }
                Some(Rope::new(rc)?)
            }
            PeConfig::Xpos { theta, scale_base } => Some(
                Rope::new(RopeConfig::new(*theta, hd)?.with_head_dim(hd))?
                    .with_xpos(*scale_base)?,
            ),
            _ => None,
        };
        let bias = match &cfg.pe {
            PeConfig::Alibi => SharedBias::Alibi(Alibi::new(
                h,
                if cfg.mode == Mode::Decoder {
                    AlibiMode::Causal
                } else {
                    AlibiMode::Bidirectional
                },
            )?),
            PeConfig::T5 {
                buckets,
                max_distance,
            } => SharedBias::T5(T5RelativeBias::new(
                posenc::relative::t5::T5Buckets::new(
                    *buckets,
                    *max_distance,
                    cfg.mode != Mode::Decoder,
                )?,
                h,
                vb.pp("pe.t5"),
            )?),
            _ => SharedBias::None,
        };
        let mut blocks = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let vb = vb.pp(format!("blocks.{l}"));
            let shaw = match &cfg.pe {
                PeConfig::Shaw { k } => Some(ShawRelative::new(*k, hd, vb.pp("shaw"))?),
                _ => None,
            };
            blocks.push(Block {
                ln1: layer_norm(d, 1e-5, vb.pp("ln1"))?,
                attn: Attention {
                    qkv: linear(d, 3 * d, vb.pp("attn.qkv"))?,
                    proj: linear(d, d, vb.pp("attn.proj"))?,
                    n_heads: h,
                    head_dim: hd,
                    causal: cfg.mode == Mode::Decoder,
                    shaw,
                },
                ln2: layer_norm(d, 1e-5, vb.pp("ln2"))?,
                fc1: linear(d, cfg.d_ff, vb.pp("mlp.fc1"))?,
                fc2: linear(cfg.d_ff, d, vb.pp("mlp.fc2"))?,
            });
        }
        let ln_f = layer_norm(d, 1e-5, vb.pp("ln_f"))?;
        // A per-token head over the vocabulary (decoder, token encoder) may
        // share the token embedding; a class head cannot.
        let head = if cfg.tied && cfg.mode != Mode::Encoder && cfg.num_outputs == cfg.vocab_size {
            None
        } else {
            Some(linear(d, cfg.num_outputs, vb.pp("head"))?)
        };
        let _ = seed;
        Ok(Transformer {
            cfg: cfg.clone(),
            tok,
            input_pe,
            rope,
            bias,
            blocks,
            ln_f,
            head,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Checks that the model can run at `len` positions (a learned table
    /// cannot go past its rows).
    pub fn check_length(&self, len: usize) -> Result<(), LabError> {
        if let InputPe::Learned(l) = &self.input_pe {
            if len > l.max_positions() {
                return Err(posenc::Error::PositionOutOfRange {
                    position: len as u64 - 1,
                    limit: l.max_positions() as u64,
                    what: "learned position table",
                }
                .into());
            }
        }
        Ok(())
    }

    /// The trained input encoding as a plain-Rust encoding, for pictures and
    /// analysis: a learned table's rows or FLOATER's trained vector field
    /// (`None` for other encodings).
    pub fn trained_input(&self) -> Result<Option<TrainedInput>, LabError> {
        Ok(match &self.input_pe {
            InputPe::Learned(l) => {
                let rows = l
                    .weight()
                    .to_dtype(candle_core::DType::F64)?
                    .to_vec2::<f64>()?;
                Some(TrainedInput::Learned(
                    posenc::absolute::LearnedTable::from_rows(rows)?,
                ))
            }
            InputPe::Floater(f) => Some(TrainedInput::Floater(f.to_plain()?)),
            _ => None,
        })
    }

    /// Embeddings plus the input encoding: `(B, T)` → `(B, T, D)`.
    fn embed(&self, input: &Tensor, offset: usize) -> Result<Tensor, LabError> {
        let x = self.tok.forward(input)?;
        let scale = token_embedding_recipe(&self.cfg).scale;
        let x = if scale == 1.0 { x } else { (x * scale)? };
        let p = Positions::Offset(offset);
        Ok(match &self.input_pe {
            InputPe::None => x,
            InputPe::Sinusoidal(s) => s.forward(&x, p)?,
            InputPe::Learned(l) => l.forward(&x, p)?,
            InputPe::Floater(f) => f.forward(&x, p)?,
        })
    }

    /// The model's output: `(B, T, V)` next-token logits (decoder),
    /// `(B, T, V)` per-position logits (token encoder: the masked tokens),
    /// or `(B, C)` class logits (encoder, mean-pooled). `scaling` replaces
    /// the model's RoPE for this call (evaluation-time scaling).
    pub fn forward(
        &self,
        input: &Tensor,
        offset: usize,
        scaling: Option<&EvalScaling>,
    ) -> Result<Tensor, LabError> {
        self.check_length(offset + input.dim(1)?)?;
        let rope = scaling.map(|s| &s.rope).or(self.rope.as_ref());
        let mut x = self.embed(input, offset)?;
        for b in &self.blocks {
            x = b.forward(&x, offset, rope, &self.bias)?;
        }
        let x = self.ln_f.forward(&x)?;
        let x = match self.cfg.mode {
            Mode::Decoder | Mode::TokenEncoder => x,
            Mode::Encoder => x.mean(1)?,
        };
        Ok(match &self.head {
            Some(h) => h.forward(&x)?,
            None => x.broadcast_matmul(&self.tok.embeddings().t()?)?,
        })
    }

    /// The pooled representation of an encoder (before the head), `(B, D)`.
    pub fn pooled(&self, input: &Tensor) -> Result<Tensor, LabError> {
        let mut x = self.embed(input, 0)?;
        for b in &self.blocks {
            x = b.forward(&x, 0, self.rope.as_ref(), &self.bias)?;
        }
        Ok(self.ln_f.forward(&x)?.mean(1)?)
    }

    /// Activations after the input layer and after each block, each
    /// `(B, T, D)`, for probes.
    pub fn hidden_states(&self, input: &Tensor, offset: usize) -> Result<Vec<Tensor>, LabError> {
        let mut x = self.embed(input, offset)?;
        let mut out = vec![x.clone()];
        for b in &self.blocks {
            x = b.forward(&x, offset, self.rope.as_ref(), &self.bias)?;
            out.push(x.clone());
        }
        Ok(out)
    }
}
