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

use std::sync::Arc;

use candle_core::{Module, Tensor};
use candle_nn::{embedding, linear, Embedding, VarBuilder};
use posenc::absolute::floater::FloaterConfig;
use posenc::absolute::sinusoidal::{Sinusoidal, SinusoidalLayout};
use posenc::relative::alibi::{Alibi, AlibiMode};
use posenc::rope::{RopeConfig, RopeScaling, ScalingKind};
use posenc::tensor::absolute::{
    FloaterEmbedding, LearnedEmbedding, Positions, SinusoidalEmbedding,
};
use posenc::tensor::attention::{AttentionHooks, AttnPositions};
use posenc::tensor::bias::{ShawRelative, T5RelativeBias};
use posenc::tensor::cope::CopeBias;
use posenc::tensor::fire::FireBias;
use posenc::tensor::forgetting::ForgettingBias;
use posenc::tensor::hooks::{
    CumulativeBias, DenseBias, InputHook, LogitsHook, QueryKeyHook, ValuesHook,
};
use posenc::tensor::rope::Rope;

use crate::config::{Mode, ModelConfig, PeConfig};
use crate::error::LabError;
use crate::ops;

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

/// A RoPE scaling chosen at evaluation time (train with plain RoPE, evaluate
/// with PI, NTK, dynamic NTK or YaRN at a longer length).
pub struct EvalScaling {
    /// Human-readable name, e.g. `yarn ×4`.
    pub name: String,
    rope: Rope,
}

impl EvalScaling {
    /// Builds the scaling `kind` (posenc's [`ScalingKind`]: `none`,
    /// `linear:F` — Chen et al. 2023 —, `ntk:F` — bloc97 2023 —,
    /// `dynamic:F`, `yarn:F` — Peng et al. 2023 —; `model` is the model's
    /// own plain RoPE, as `none`) for a RoPE (or iRoPE) model trained at
    /// `train_len`, with the same defaults a Hugging Face config would get
    /// ([`FactorScaling::rope_scaling`](posenc::rope::FactorScaling::rope_scaling)):
    /// YaRN's β_fast 32 and β_slow 1 with the attention factor derived from
    /// the factor; dynamic NTK rescales only past `train_len`.
    ///
    /// # Errors
    /// [`LabError::Invalid`] for a model without RoPE; the scaling's own
    /// checks (a factor that is not finite and positive).
    pub fn new(cfg: &ModelConfig, kind: ScalingKind, train_len: usize) -> Result<Self, LabError> {
        let (theta, partial, interleaved) = match cfg.pe {
            PeConfig::Rope {
                theta,
                partial,
                interleaved,
            } => (theta, partial, interleaved),
            PeConfig::Irope { theta, .. } => (theta, 1.0, false),
            _ => {
                return Err(LabError::Invalid(format!(
                    "--scaling needs a RoPE model; this one uses {}",
                    cfg.pe.label()
                )))
            }
        };
        let hd = cfg.head_dim();
        // transformers: int(head_dim · partial_rotary_factor).
        let rd = (hd as f64 * partial) as usize;
        let scaling = kind.rope_scaling(train_len).unwrap_or(RopeScaling::Default);
        // Dynamic NTK reads the training length from max_position_embeddings
        // (as transformers does) and rescales only beyond it; the others
        // record the extended context.
        let max_positions = match kind {
            ScalingKind::Dynamic(_) => train_len,
            k => (train_len as f64 * k.factor().unwrap_or(1.0).max(1.0)).ceil() as usize,
        };
        let mut rc = RopeConfig::new(theta, rd)?
            .with_head_dim(hd)
            .with_max_position_embeddings(max_positions)
            .with_scaling(scaling)?;
        if interleaved {
            rc = rc.with_layout(posenc::rope::PairLayout::Interleaved);
        }
        Ok(EvalScaling {
            name: match kind.factor_scaling() {
                Some((family, factor)) => format!("{family} ×{factor}"),
                None => kind.to_string(),
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

/// A linear layer's parameters (created by candle-nn's `linear`, so names
/// and initialisation are candle-nn's, a bias included), applied by
/// [`ops::linear`].
struct Lin {
    w: Tensor,
    b: Tensor,
}

impl Lin {
    fn new(d_in: usize, d_out: usize, vb: VarBuilder) -> candle_core::Result<Lin> {
        let l = linear(d_in, d_out, vb)?;
        let b = l
            .bias()
            .cloned()
            .ok_or_else(|| candle_core::Error::Msg("candle-nn's linear has a bias".into()))?;
        Ok(Lin {
            w: l.weight().clone(),
            b,
        })
    }

    fn forward(&self, x: &Tensor, fused: bool) -> Result<Tensor, LabError> {
        Ok(ops::linear(x, &self.w, Some(&self.b), fused)?)
    }
}

/// The hooks of one attention call.
struct CallHooks<'a> {
    query_key: Option<&'a dyn QueryKeyHook>,
    logits: Option<&'a dyn LogitsHook>,
}

/// A layer's own logits hook computed from its input each call (CoPE from
/// the queries and keys, forgetting attention from the layer's input).
enum LayerBias {
    Cope(CopeBias),
    Fox(ForgettingBias),
}

struct Attention {
    qkv: Lin,
    proj: Lin,
    n_heads: usize,
    attn: posenc::tensor::attention::Attention,
    /// Whether the model's query/key hook acts in this layer (iRoPE leaves
    /// it out of every k-th layer).
    rotary: bool,
    /// Shaw et al.'s tables are per layer: the logits and values hooks of
    /// this layer.
    shaw: Option<Arc<ShawRelative>>,
    /// CoPE or forgetting attention, per layer.
    learned: Option<LayerBias>,
}

impl Attention {
    /// `x + Attention(LN(x))`: when fused, LayerNorm and the query, key and
    /// value projection in one op, and the output projection and the
    /// addition in another.
    fn forward_residual(
        &self,
        x: &Tensor,
        ln: &LayerNorm,
        offset: usize,
        hooks: &CallHooks,
        fused: bool,
    ) -> Result<Tensor, LabError> {
        let residual = x;
        // (B, T, D) → (B, T, 3D): queries, keys and values of every head.
        // Forgetting attention also reads the normalised input itself: its
        // gates c (B, H, T), for the bias c_i − c_j.
        let (qkv, fox_gates) = match &self.learned {
            Some(LayerBias::Fox(f)) => {
                let h = ln.forward(x, fused)?;
                let c = f.cumulative(&h, None)?;
                (self.qkv.forward(&h, fused)?, Some(c))
            }
            _ => {
                let wb = (&self.qkv.w, &self.qkv.b);
                let qkv = ops::ln_linear(x, &ln.weight, &ln.bias, ln.eps, wb, fused)?;
                (qkv, None)
            }
        };
        let pos = AttnPositions::same(Positions::Offset(offset));
        let own: Option<Box<dyn LogitsHook>> = match &self.learned {
            None => None,
            Some(LayerBias::Cope(c)) => {
                // (B, T, 3D) → q, k (B, H, T, hd): the gates need q·k.
                let (b, t, _) = qkv.dims3()?;
                let d = qkv.dim(2)? / 3;
                let split = |i: usize| -> Result<Tensor, LabError> {
                    Ok(qkv
                        .narrow(2, i * d, d)?
                        .reshape((b, t, self.n_heads, d / self.n_heads))?
                        .transpose(1, 2)?
                        .contiguous()?)
                };
                let p = Positions::Offset(offset);
                Some(Box::new(DenseBias(c.bias(&split(0)?, &split(1)?, p, p)?)))
            }
            Some(LayerBias::Fox(_)) => fox_gates
                .map(|c| Box::new(CumulativeBias { q: c.clone(), k: c }) as Box<dyn LogitsHook>),
        };
        let shaw_logits = self.shaw.as_deref().map(|s| s as &dyn LogitsHook);
        let call = AttentionHooks {
            query_key: if self.rotary { hooks.query_key } else { None },
            logits: shaw_logits.or(own.as_deref()).or(hooks.logits),
            values: self.shaw.as_deref().map(|s| s as &dyn ValuesHook),
        };
        // (B, T, 3D) → (B, T, D): rotation, biases, mask, softmax and the
        // weighted values in one op (fused), or composed (reference).
        let out = if fused {
            self.attn
                .forward_packed(&qkv, self.n_heads, self.n_heads, &call, pos)?
        } else {
            self.attn
                .forward_packed_reference(&qkv, self.n_heads, self.n_heads, &call, pos)?
        };
        Ok(ops::linear_residual(
            &out,
            &self.proj.w,
            &self.proj.b,
            residual,
            fused,
        )?)
    }
}

/// LayerNorm parameters, applied by [`ops::layer_norm`].
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

impl LayerNorm {
    fn forward(&self, x: &Tensor, fused: bool) -> Result<Tensor, LabError> {
        Ok(ops::layer_norm(
            x,
            &self.weight,
            &self.bias,
            self.eps,
            fused,
        )?)
    }
}

struct Block {
    ln1: LayerNorm,
    attn: Attention,
    ln2: LayerNorm,
    fc1: Lin,
    fc2: Lin,
}

impl Block {
    fn forward(
        &self,
        x: &Tensor,
        offset: usize,
        hooks: &CallHooks,
        fused: bool,
    ) -> Result<Tensor, LabError> {
        // x = x + Attn(LN(x))
        let x = self
            .attn
            .forward_residual(x, &self.ln1, offset, hooks, fused)?;
        // x = x + MLP(LN(x)): (B, T, D) → (B, T, d_ff) → (B, T, D), in one op
        // when fused.
        Ok(ops::mlp_residual(
            &x,
            &self.ln2.weight,
            &self.ln2.bias,
            self.ln2.eps,
            (&self.fc1.w, &self.fc1.b),
            (&self.fc2.w, &self.fc2.b),
            fused,
        )?)
    }
}

/// A lab transformer: one optional hook per place (input, queries and
/// keys, logits; Shaw et al.'s per-layer tables are each block's logits and
/// values hooks).
pub struct Transformer {
    cfg: ModelConfig,
    tok: Embedding,
    /// The input hook (absolute encodings).
    input: Option<Arc<dyn InputHook>>,
    /// The same learned table or FLOATER module, for [`Transformer::trained_input`].
    learned: Option<Arc<LearnedEmbedding>>,
    floater: Option<Arc<FloaterEmbedding>>,
    /// The query/key hook (RoPE, xPos).
    query_key: Option<Arc<dyn QueryKeyHook>>,
    /// The logits hook shared by all layers (ALiBi, T5).
    logits: Option<Arc<dyn LogitsHook>>,
    /// FIRE, shared by all layers: its bias is computed once per call.
    fire: Option<FireBias>,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Option<Lin>,
    /// Run the fused ops (default) or the composed reference.
    fused: bool,
}

impl Transformer {
    /// Builds the model; parameters are created through `vb` (a `VarMap`
    /// for training, whose backend draws every initial value, see
    /// `Lab::new`).
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self, LabError> {
        cfg.validate()?;
        let dev = vb.device().clone();
        let (d, h, hd) = (cfg.d_model, cfg.n_heads, cfg.head_dim());
        let tok = embedding(cfg.vocab_size, d, vb.pp("tok"))?;
        let (mut learned, mut floater) = (None, None);
        let input: Option<Arc<dyn InputHook>> = match &cfg.pe {
            PeConfig::Sinusoidal { concatenated } => {
                let layout = if *concatenated {
                    SinusoidalLayout::Concatenated
                } else {
                    SinusoidalLayout::Interleaved
                };
                Some(Arc::new(SinusoidalEmbedding::new(
                    Sinusoidal::new(d)?.with_layout(layout),
                    &dev,
                )?))
            }
            PeConfig::Learned { max_positions } => {
                let l = Arc::new(LearnedEmbedding::new(
                    *max_positions,
                    d,
                    vb.pp("pe.learned"),
                )?);
                learned = Some(l.clone());
                Some(l)
            }
            PeConfig::Floater => {
                let f = Arc::new(FloaterEmbedding::new(
                    FloaterConfig::new(d, d.min(64)),
                    vb.pp("pe.floater"),
                )?);
                floater = Some(f.clone());
                Some(f)
            }
            _ => None,
        };
        let query_key: Option<Arc<dyn QueryKeyHook>> = match &cfg.pe {
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
                Some(Arc::new(Rope::new(rc)?))
            }
            PeConfig::Xpos { theta, scale_base } => Some(Arc::new(
                Rope::new(RopeConfig::new(*theta, hd)?.with_head_dim(hd))?
                    .with_xpos(*scale_base)?,
            )),
            PeConfig::Irope { theta, .. } => Some(Arc::new(Rope::new(
                RopeConfig::new(*theta, hd)?.with_head_dim(hd),
            )?)),
            _ => None,
        };
        // iRoPE: which layers rotate (Llama 4's `no_rope_layer_interval`).
        let rotary_layers = match &cfg.pe {
            PeConfig::Irope { interval, .. } => {
                posenc::rope::layers::irope_layers(cfg.n_layers, *interval)?
            }
            _ => vec![true; cfg.n_layers],
        };
        let fire = match &cfg.pe {
            PeConfig::Fire => {
                let mut fc = posenc::relative::fire::FireConfig::new(h)?;
                if cfg.mode != Mode::Decoder {
                    fc.mode = posenc::relative::fire::FireMode::Bidirectional;
                }
                Some(FireBias::new(fc, vb.pp("pe.fire"))?)
            }
            _ => None,
        };
        let logits: Option<Arc<dyn LogitsHook>> = match &cfg.pe {
            PeConfig::Alibi => Some(Arc::new(Alibi::new(
                h,
                if cfg.mode == Mode::Decoder {
                    AlibiMode::Causal
                } else {
                    AlibiMode::Bidirectional
                },
            )?)),
            PeConfig::T5 {
                buckets,
                max_distance,
            } => Some(Arc::new(T5RelativeBias::new(
                posenc::relative::t5::T5Buckets::new(
                    *buckets,
                    *max_distance,
                    cfg.mode != Mode::Decoder,
                )?,
                h,
                vb.pp("pe.t5"),
            )?)),
            _ => None,
        };
        let mut blocks = Vec::with_capacity(cfg.n_layers);
        for (l, &rotary) in rotary_layers.iter().enumerate() {
            let vb = vb.pp(format!("blocks.{l}"));
            let shaw = match &cfg.pe {
                PeConfig::Shaw { k } => Some(Arc::new(ShawRelative::new(*k, hd, vb.pp("shaw"))?)),
                _ => None,
            };
            let learned = match &cfg.pe {
                PeConfig::Cope { npos_max } => Some(LayerBias::Cope(CopeBias::new(
                    posenc::relative::cope::CopeConfig::new(hd, *npos_max)?
                        .with_causal(cfg.mode == Mode::Decoder),
                    vb.pp("cope"),
                )?)),
                PeConfig::Fox => Some(LayerBias::Fox(ForgettingBias::new(
                    posenc::relative::forgetting::ForgetGateConfig::new(d, h)?,
                    vb.pp("fox"),
                )?)),
                _ => None,
            };
            blocks.push(Block {
                ln1: layer_norm(d, 1e-5, vb.pp("ln1"))?,
                attn: Attention {
                    qkv: Lin::new(d, 3 * d, vb.pp("attn.qkv"))?,
                    proj: Lin::new(d, d, vb.pp("attn.proj"))?,
                    n_heads: h,
                    attn: posenc::tensor::attention::Attention::new(cfg.mode == Mode::Decoder),
                    rotary,
                    shaw,
                    learned,
                },
                ln2: layer_norm(d, 1e-5, vb.pp("ln2"))?,
                fc1: Lin::new(d, cfg.d_ff, vb.pp("mlp.fc1"))?,
                fc2: Lin::new(cfg.d_ff, d, vb.pp("mlp.fc2"))?,
            });
        }
        let ln_f = layer_norm(d, 1e-5, vb.pp("ln_f"))?;
        // A per-token head over the vocabulary (decoder, token encoder) may
        // share the token embedding; a class head cannot.
        let head = if cfg.tied && cfg.mode != Mode::Encoder && cfg.num_outputs == cfg.vocab_size {
            None
        } else {
            Some(Lin::new(d, cfg.num_outputs, vb.pp("head"))?)
        };
        Ok(Transformer {
            cfg: cfg.clone(),
            tok,
            input,
            learned,
            floater,
            query_key,
            logits,
            fire,
            blocks,
            ln_f,
            head,
            fused: true,
        })
    }

    /// Runs the fused ops (`true`, the default) or the composed candle
    /// reference (`false`: candle-nn's linear layers, composed LayerNorm,
    /// candle's GELU and the reference attention; the same parameters and
    /// the same function, for tests and comparisons).
    pub fn set_fused(&mut self, fused: bool) {
        self.fused = fused;
    }

    /// Whether the fused ops run.
    pub fn is_fused(&self) -> bool {
        self.fused
    }

    /// An upper estimate of the bytes a forward pass without gradients
    /// (a [`frozen`](crate::train::Lab::frozen) model) holds at its peak for
    /// `batch` sequences of `len` tokens, and what dominates it. Activations
    /// of one block at a time (the fused attention keeps no `T × T`
    /// matrix), the logits, and the `T × T` biases of the encodings that
    /// build one (FIRE once per call, CoPE per layer).
    pub fn eval_bytes(&self, batch: usize, len: usize) -> (u128, &'static str) {
        let c = &self.cfg;
        let (b, t) = (batch as u128, len as u128);
        let (d, f, v, h) = (
            c.d_model as u128,
            c.d_ff as u128,
            c.num_outputs.max(c.vocab_size) as u128,
            c.n_heads as u128,
        );
        // Per token: the residual stream and LayerNorm (3D), the packed
        // projection and attention output (4D), the MLP (2·d_ff), the logits
        // and their host copy (2V), with a factor 2 for allocator slack.
        let tokens = 2 * 4 * b * t * (7 * d + 2 * f + 2 * v);
        let square = match c.pe {
            // FIRE: the bias and the MLP's inputs and outputs per distance.
            PeConfig::Fire => 4 * 4 * h * t * t,
            // CoPE: gates, counts, interpolation weights and the bias.
            PeConfig::Cope { .. } => 6 * 4 * b * h * t * t,
            _ => 0,
        };
        let why = if square > tokens {
            "its T × T positional bias"
        } else {
            "activations and logits"
        };
        (tokens + square, why)
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Checks that the model can run at `len` positions (a learned table
    /// cannot go past its rows).
    pub fn check_length(&self, len: usize) -> Result<(), LabError> {
        if let Some(l) = &self.learned {
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
        if let Some(l) = &self.learned {
            {
                let rows = l
                    .weight()
                    .to_dtype(candle_core::DType::F64)?
                    .to_vec2::<f64>()?;
                return Ok(Some(TrainedInput::Learned(
                    posenc::absolute::LearnedTable::from_rows(rows)?,
                )));
            }
        }
        Ok(match &self.floater {
            Some(f) => Some(TrainedInput::Floater(f.to_plain()?)),
            None => None,
        })
    }

    /// Embeddings plus the input encoding: `(B, T)` → `(B, T, D)`.
    fn embed(&self, input: &Tensor, offset: usize) -> Result<Tensor, LabError> {
        let x = self.tok.forward(input)?;
        let scale = token_embedding_recipe(&self.cfg).scale;
        let x = if scale == 1.0 { x } else { (x * scale)? };
        Ok(match &self.input {
            None => x,
            Some(h) => h.add_positions(&x, Positions::Offset(offset))?,
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
        let fire = self.fire_bias(input.dim(1)?, offset)?;
        let hooks = self.call_hooks(scaling, fire.as_ref());
        let mut x = self.embed(input, offset)?;
        for b in &self.blocks {
            x = b.forward(&x, offset, &hooks, self.fused)?;
        }
        let x = self.ln_f.forward(&x, self.fused)?;
        let x = match self.cfg.mode {
            Mode::Decoder | Mode::TokenEncoder => x,
            Mode::Encoder => x.mean(1)?,
        };
        // (…, D) → (…, outputs); a tied head multiplies by the token table.
        match &self.head {
            Some(h) => h.forward(&x, self.fused),
            None => Ok(ops::linear(&x, self.tok.embeddings(), None, self.fused)?),
        }
    }

    /// The hooks of a call: the model's, or `scaling`'s RoPE in place of its
    /// own; `fire` is this call's FIRE bias.
    fn call_hooks<'a>(
        &'a self,
        scaling: Option<&'a EvalScaling>,
        fire: Option<&'a DenseBias>,
    ) -> CallHooks<'a> {
        CallHooks {
            query_key: scaling
                .map(|s| &s.rope as &dyn QueryKeyHook)
                .or(self.query_key.as_deref()),
            logits: fire
                .map(|f| f as &dyn LogitsHook)
                .or(self.logits.as_deref()),
        }
    }

    /// FIRE's `(1, H, T, T)` bias for `t` positions from `offset`, shared by
    /// every layer of one call.
    fn fire_bias(&self, t: usize, offset: usize) -> Result<Option<DenseBias>, LabError> {
        Ok(match &self.fire {
            Some(f) => {
                let p = Positions::Offset(offset);
                Some(DenseBias(f.forward(t, t, p, p)?))
            }
            None => None,
        })
    }

    /// The pooled representation of an encoder (before the head), `(B, D)`.
    pub fn pooled(&self, input: &Tensor) -> Result<Tensor, LabError> {
        let fire = self.fire_bias(input.dim(1)?, 0)?;
        let hooks = self.call_hooks(None, fire.as_ref());
        let mut x = self.embed(input, 0)?;
        for b in &self.blocks {
            x = b.forward(&x, 0, &hooks, self.fused)?;
        }
        Ok(self.ln_f.forward(&x, self.fused)?.mean(1)?)
    }

    /// Activations after the input layer and after each block, each
    /// `(B, T, D)`, for probes.
    pub fn hidden_states(&self, input: &Tensor, offset: usize) -> Result<Vec<Tensor>, LabError> {
        let fire = self.fire_bias(input.dim(1)?, offset)?;
        let hooks = self.call_hooks(None, fire.as_ref());
        let mut x = self.embed(input, offset)?;
        let mut out = vec![x.clone()];
        for b in &self.blocks {
            x = b.forward(&x, offset, &hooks, self.fused)?;
            out.push(x.clone());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;

    /// The typed scalings give the frequencies that the same settings give
    /// through a Hugging Face config (the path users take).
    #[test]
    fn eval_scalings_equal_the_hf_config_path() {
        for (pe, partial) in [
            (PeConfig::parse("rope", 32, 2).unwrap(), 1.0),
            (
                PeConfig::Rope {
                    theta: 500.0,
                    partial: 0.5,
                    interleaved: false,
                },
                0.5,
            ),
        ] {
            let cfg = ModelConfig {
                mode: Mode::Decoder,
                vocab_size: 10,
                num_outputs: 10,
                d_model: 32,
                n_layers: 1,
                n_heads: 2,
                d_ff: 64,
                tied: true,
                pe: pe.clone(),
            };
            let theta = match pe {
                PeConfig::Rope { theta, .. } => theta,
                _ => unreachable!(),
            };
            for kind in ["linear", "ntk", "dynamic", "yarn"] {
                let (factor, len) = (4.0, 32usize);
                let family = posenc::rope::FactorScaling::from_name(kind).unwrap();
                let typed = EvalScaling::new(&cfg, family.with_factor(factor), len).unwrap();
                let mpe = if kind == "dynamic" { len } else { 4 * len };
                let mut scaling = serde_json::json!({"rope_type": kind, "factor": factor});
                if kind == "dynamic" || kind == "yarn" {
                    scaling["original_max_position_embeddings"] = len.into();
                }
                let json = serde_json::json!({
                    "head_dim": 16,
                    "num_attention_heads": 2,
                    "rope_theta": theta,
                    "partial_rotary_factor": partial,
                    "max_position_embeddings": mpe,
                    "rope_scaling": scaling,
                });
                let hf = RopeConfig::from_hf_json_str(&json.to_string()).unwrap();
                assert_eq!(
                    typed.rope.frequencies(),
                    Rope::new(hf.clone()).unwrap().frequencies(),
                    "{kind}"
                );
                // Past the training length (dynamic NTK grows its base).
                for seq in [16, 64, 200] {
                    let x = candle_core::Tensor::zeros(
                        (1, 1, seq, 16),
                        candle_core::DType::F32,
                        &candle_core::Device::Cpu,
                    )
                    .unwrap();
                    let (a, _) = typed.rope.apply(&x.ones_like().unwrap(), &x, 0).unwrap();
                    let (b, _) = Rope::new(hf.clone())
                        .unwrap()
                        .apply(&x.ones_like().unwrap(), &x, 0)
                        .unwrap();
                    let values =
                        |t: candle_core::Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    assert_eq!(values(a), values(b), "{kind} at {seq}");
                }
            }
        }
    }
}
