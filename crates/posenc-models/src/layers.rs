//! The decoder's layers, typed: a linear layer, RMSNorm, the gated MLP, and
//! the [`Backend`] that computes them.
//!
//! Activations are `f32` row-major buffers `(T, width)`. Whether a layer
//! runs posenc's fused kernels or the composed reference (candle's
//! matmul, the attention's reference path with its whole `T × T` logits)
//! is one [`Backend`] value, chosen once per model
//! ([`crate::llama::Decoder::set_reference`]) and handed to every layer: the
//! choice is made here, in the backend's few methods, never inside a
//! model's forward. The fine-tuner's differentiable forward (posenc-tune,
//! on candle tensors) takes the same value for its rotation, attention,
//! RMSNorm, SwiGLU and cross-entropy ([`Backend::rope`] and the methods
//! after it).

use candle_core::{Device, Tensor};
use posenc::kernels::matmul::MatmulPolicy;
use posenc::tensor::attention::{Attention, AttentionHooks, AttnPositions};
use posenc::tensor::extend::MethodAttention;
use posenc::tensor::rope::Rope;
use posenc::tensor::Positions;
use rayon::prelude::*;

use crate::error::Result;

/// Which code computes the layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// posenc's kernels: the one matmul dispatch
    /// ([`MatmulPolicy::DECODER`]), the fused attention.
    #[default]
    Fused,
    /// Composed candle ops and the attention's reference path, for tests.
    Reference,
}

impl Backend {
    /// `x (t, k) · Wᵀ`, `W` `(n, k)` row-major: `(t, n)`.
    ///
    /// # Errors
    /// Candle's, on the reference path.
    pub fn matmul_xwt(
        self,
        x: &[f32],
        t: usize,
        k: usize,
        w: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        match self {
            Backend::Fused => {
                let mut y = vec![0f32; t * n];
                gemm_xwt(&mut y, x, t, k, w, n);
                Ok(y)
            }
            Backend::Reference => {
                let xt = Tensor::from_slice(x, (t, k), &Device::Cpu)?;
                let wt = Tensor::from_slice(w, (n, k), &Device::Cpu)?;
                vec_of(xt.matmul(&wt.t()?)?)
            }
        }
    }

    /// Causal attention over a packed projection `(B, T, (H_q + 2·H_k)·Dh)`:
    /// `(B, T, H_q·Dh)`.
    ///
    /// # Errors
    /// The attention's.
    pub fn attention_packed(
        self,
        attn: &Attention,
        qkv: &Tensor,
        (hq, hk): (usize, usize),
        hooks: &AttentionHooks<'_>,
        positions: AttnPositions<'_>,
    ) -> Result<Tensor> {
        Ok(match self {
            Backend::Fused => attn.forward_packed(qkv, hq, hk, hooks, positions)?,
            Backend::Reference => attn.forward_packed_reference(qkv, hq, hk, hooks, positions)?,
        })
    }

    /// Attention of queries `q` over keys and values `k`, `v` in the
    /// attention's layout.
    ///
    /// # Errors
    /// The attention's.
    pub fn attention(
        self,
        attn: &Attention,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        hooks: &AttentionHooks<'_>,
        positions: AttnPositions<'_>,
    ) -> Result<Tensor> {
        Ok(match self {
            Backend::Fused => attn.forward(q, k, v, hooks, positions)?,
            Backend::Reference => attn.forward_reference(q, k, v, hooks, positions)?,
        })
    }

    /// A training-free method's attention over a packed projection.
    ///
    /// # Errors
    /// The method's.
    pub fn method_packed(
        self,
        method: &MethodAttention,
        qkv: &Tensor,
        (hq, hk): (usize, usize),
    ) -> Result<Tensor> {
        Ok(match self {
            Backend::Fused => method.forward_packed(qkv, hq, hk)?,
            Backend::Reference => method.forward_packed_reference(qkv, hq, hk)?,
        })
    }

    /// A training-free method's attention of new queries over a cache's
    /// keys and values `(B, T, H, Dh)`.
    ///
    /// # Errors
    /// The method's.
    pub fn method(
        self,
        method: &MethodAttention,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
    ) -> Result<Tensor> {
        Ok(match self {
            Backend::Fused => method.forward(q, k, v)?,
            Backend::Reference => method.forward_reference(q, k, v)?,
        })
    }

    /// Whether this is [`Backend::Fused`] (the shared ops of posenc-nn
    /// take it as their `fused` flag).
    pub fn is_fused(self) -> bool {
        self == Backend::Fused
    }

    /// `rope` on queries and keys `(B, T, H, Dh)` at `positions`, as candle
    /// tensors (differentiable): the fused rotation or its composed
    /// reference.
    ///
    /// # Errors
    /// posenc's.
    pub fn rope(
        self,
        rope: &Rope,
        q: &Tensor,
        k: &Tensor,
        positions: Positions<'_>,
    ) -> Result<(Tensor, Tensor)> {
        Ok(match self {
            Backend::Fused => rope.apply(q, k, positions)?,
            Backend::Reference => rope.apply_reference(q, k, positions)?,
        })
    }

    /// RMSNorm of `x` over its last axis, times `weight`, as a candle
    /// tensor (differentiable; [`posenc_nn::ops::rms_norm`]).
    ///
    /// # Errors
    /// posenc-nn's.
    pub fn rms_norm(self, x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
        Ok(posenc_nn::ops::rms_norm(x, weight, eps, self.is_fused())?)
    }

    /// `silu(gate) ⊙ up`, as a candle tensor (differentiable;
    /// [`posenc_nn::ops::swiglu`]).
    ///
    /// # Errors
    /// posenc-nn's.
    pub fn swiglu(self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        Ok(posenc_nn::ops::swiglu(gate, up, self.is_fused())?)
    }

    /// The mean of `−log softmax(logits[c])[targets[c]]` over the rows of
    /// `logits` `(C, V)`, one target each (differentiable;
    /// [`posenc_nn::ops::cross_entropy`]).
    ///
    /// # Errors
    /// posenc-nn's.
    pub fn cross_entropy(self, logits: &Tensor, targets: &[u32]) -> Result<Tensor> {
        let targets = Tensor::from_slice(targets, targets.len(), logits.device())?;
        Ok(posenc_nn::ops::cross_entropy(
            logits,
            &targets,
            -1,
            self.is_fused(),
        )?)
    }
}

/// `y = x · Wᵀ (+ b)`: a linear layer with Hugging Face's `(out, in)`
/// weight.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `(out, in)` row-major.
    pub weight: Vec<f32>,
    /// `(out)`, if the layer has one.
    pub bias: Option<Vec<f32>>,
    /// Input width.
    pub inputs: usize,
    /// Output width.
    pub outputs: usize,
}

impl Linear {
    /// `x (t, in)` → `(t, out)`.
    ///
    /// # Errors
    /// The backend's.
    pub fn forward(&self, backend: Backend, x: &[f32], t: usize) -> Result<Vec<f32>> {
        let n = self.outputs;
        let mut y = backend.matmul_xwt(x, t, self.inputs, &self.weight, n)?;
        if let Some(b) = &self.bias {
            y.par_chunks_mut(n).for_each(|row| {
                for (v, bv) in row.iter_mut().zip(b) {
                    *v += bv;
                }
            });
        }
        Ok(y)
    }
}

/// RMSNorm: `x / sqrt(mean(x²) + ε) · w`, in `f32` as transformers'
/// `LlamaRMSNorm`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// `(D)`.
    pub weight: Vec<f32>,
    /// ε.
    pub eps: f32,
}

impl RmsNorm {
    /// Each row of `x` `(t, D)` into the same row of `out`.
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        let (w, eps) = (&self.weight, self.eps);
        let d = w.len();
        out.par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .for_each(|(o, xr)| {
                let ss: f32 = xr.iter().map(|v| v * v).sum();
                let inv = 1.0 / (ss / d as f32 + eps).sqrt();
                for ((ov, xv), wv) in o.iter_mut().zip(xr).zip(w) {
                    *ov = wv * (xv * inv);
                }
            });
    }
}

/// The gated MLP: `(silu(h · W_gateᵀ) ⊙ h · W_upᵀ) · W_downᵀ`, gate and up
/// in one GEMM.
#[derive(Debug, Clone)]
pub struct GatedMlp {
    /// `(2·I, D)`: gate rows then up rows.
    pub gate_up: Linear,
    /// `(D, I)`.
    pub down: Linear,
}

impl GatedMlp {
    /// `h (t, D)` → `(t, D)`.
    ///
    /// # Errors
    /// The backend's.
    pub fn forward(&self, backend: Backend, h: &[f32], t: usize) -> Result<Vec<f32>> {
        self.forward_observed(backend, h, t, &mut || {})
    }

    /// [`GatedMlp::forward`], calling `between()` between its two products
    /// (a place where a long pass can stop).
    ///
    /// # Errors
    /// The backend's.
    pub fn forward_observed(
        &self,
        backend: Backend,
        h: &[f32],
        t: usize,
        between: &mut dyn FnMut(),
    ) -> Result<Vec<f32>> {
        let gu = self.gate_up.forward(backend, h, t)?; // (T, 2·I)
        let act = swiglu(&gu, t, self.down.inputs); // (T, I)
        drop(gu);
        between();
        self.down.forward(backend, &act, t) // (T, D)
    }
}

/// `silu(g) ⊙ u` of each row `[g | u]` of `gu` `(t, 2·i)`.
fn swiglu(gu: &[f32], t: usize, i: usize) -> Vec<f32> {
    let mut out = vec![0f32; t * i];
    out.par_chunks_mut(i)
        .zip(gu.par_chunks(2 * i))
        .for_each(|(o, row)| {
            let (g, u) = row.split_at(i);
            for ((ov, gv), uv) in o.iter_mut().zip(g).zip(u) {
                *ov = gv / (1.0 + (-gv).exp()) * uv;
            }
        });
    out
}

/// `x += y`, element by element (the residual connections).
pub fn add_into(x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(4096)
        .zip(y.par_chunks(4096))
        .for_each(|(a, b)| {
            for (av, bv) in a.iter_mut().zip(b) {
                *av += bv;
            }
        });
}

/// A tensor's values, flattened.
pub(crate) fn vec_of(t: Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

/// `y (t, n) = x (t, k) · Wᵀ`, `W` `(n, k)` row-major: posenc's one
/// dispatch with the decoders' policy ([`MatmulPolicy::DECODER`]: the
/// `gemm` crate, threaded from 2^16 multiply-adds).
fn gemm_xwt(y: &mut [f32], x: &[f32], t: usize, k: usize, w: &[f32], n: usize) {
    debug_assert!(y.len() >= t * n && x.len() >= t * k && w.len() >= n * k);
    posenc::kernels::matmul::matmul(
        posenc::kernels::SimdLevel::detect(),
        MatmulPolicy::DECODER,
        t,
        n,
        k,
        y,
        (n as isize, 1),
        false,
        x,
        (k as isize, 1),
        w,
        (1, k as isize),
    );
}
