//! Differentiable attention with the positional hooks inside, fused on the
//! CPU.
//!
//! [`Attention`] computes, for every batch entry and head,
//!
//! ```text
//! s_ij = scale · R(q_i)·R(k_j) + bias_h(i, j)     (+ −∞ above the diagonal if causal)
//! o_i  = Σ_j softmax_j(s_ij) · (v_j + a^V(i, j))
//! ```
//!
//! where `R` is the [`QueryKeyHook`] (RoPE with any scaling, xPos), `bias`
//! the [`LogitsHook`] (ALiBi, T5 buckets, Shaw et al.'s relative keys, any
//! dense bias, forgetting attention's cumulative gates) and `a^V` the
//! [`ValuesHook`] (Shaw et al.'s relative values); see
//! [`crate::kernels::attention`] for the exact formula. Positions are
//! explicit ([`AttnPositions`]: offsets or per-row ids, for queries and
//! keys separately, so a KV cache or a slice of a sequence computes its own
//! part).
//!
//! # Paths
//! - [`Attention::forward`] / [`Attention::forward_packed`]: the fused CPU
//!   kernel (`f32`): streaming over key tiles (no `(T_q × T_k)` matrix is
//!   kept, so memory grows linearly with the length), rotation and biases
//!   computed inside, and a backward pass that recomputes the probabilities
//!   from the saved log-sum-exp. Gradients reach `q`, `k`, `v` and every
//!   parameter tensor of the hooks (T5 table, Shaw's tables, dense and
//!   cumulative biases). Other devices and dtypes take the reference path.
//! - [`Attention::forward_reference`]: composed candle ops (whole logits
//!   matrix, `softmax`), on any device and dtype, differentiable by candle
//!   itself: what the fused path is tested against.
//!
//! # Shapes
//! `q` `(B, H_q, T_q, D)`, `k` and `v` `(B, H_k, T_k, D)` with `H_k`
//! dividing `H_q` (grouped-query attention), or the same in `(B, T, H, D)`
//! order ([`Attention::with_layout`]); the output has `q`'s shape.
//! [`Attention::forward_packed`] reads a projection's output `(B, T, (H_q +
//! 2·H_k)·D)` in place and returns `(B, T, H_q·D)`.
//!
//! Causal masking is bottom-right aligned: query `i` sees keys `j ≤ i +
//! T_k − T_q` (with a KV cache, every cached key and the new ones up to its
//! own). A query that sees no key outputs zeros in the fused path.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use posenc::relative::{Alibi, AlibiMode};
//! use posenc::tensor::attention::{Attention, AttentionHooks, AttnPositions};
//!
//! let dev = Device::Cpu;
//! let q = Tensor::randn(0f32, 1.0, (2, 4, 16, 8), &dev)?;
//! let k = Tensor::randn(0f32, 1.0, (2, 4, 16, 8), &dev)?;
//! let v = Tensor::randn(0f32, 1.0, (2, 4, 16, 8), &dev)?;
//! let alibi = Alibi::new(4, AlibiMode::Causal)?;
//! let hooks = AttentionHooks { logits: Some(&alibi), ..Default::default() };
//! let attn = Attention::new(true);
//! let pos = AttnPositions::default();
//! let fused = attn.forward(&q, &k, &v, &hooks, pos)?;
//! let reference = attn.forward_reference(&q, &k, &v, &hooks, pos)?;
//! let diff = (fused - reference)?.abs()?.max_all()?.to_scalar::<f32>()?;
//! assert!(diff < 1e-5);
//! # Ok::<(), posenc::Error>(())
//! ```

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, DType, Device, Layout, Shape, Storage, Tensor};

use super::hooks::{
    BiasContext, CallPositions, LogitsBias, LogitsHook, QueryKeyHook, Rotation, ValueTerms,
    ValuesHook,
};
use super::Positions;
use crate::error::{Error, Result};
use crate::kernels::attention as k;
use crate::kernels::{HeadLayout, SimdLevel};

mod op;
mod reference;

use op::apply;
use reference::reference;

/// The hooks one attention call runs (any may be `None`; all `None` is NoPE).
#[derive(Clone, Copy, Default)]
pub struct AttentionHooks<'a> {
    /// Rotates queries and keys.
    pub query_key: Option<&'a dyn QueryKeyHook>,
    /// Adds a term to the logits.
    pub logits: Option<&'a dyn LogitsHook>,
    /// Adds relative terms to the values.
    pub values: Option<&'a dyn ValuesHook>,
}

impl std::fmt::Debug for AttentionHooks<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttentionHooks")
            .field("query_key", &self.query_key.is_some())
            .field("logits", &self.logits.is_some())
            .field("values", &self.values.is_some())
            .finish()
    }
}

/// Positions of the queries and keys of a call (default: both from 0).
#[derive(Debug, Clone, Copy)]
pub struct AttnPositions<'a> {
    /// Query positions.
    pub q: Positions<'a>,
    /// Key positions.
    pub k: Positions<'a>,
}

impl Default for AttnPositions<'_> {
    fn default() -> Self {
        AttnPositions {
            q: Positions::Offset(0),
            k: Positions::Offset(0),
        }
    }
}

impl<'a> AttnPositions<'a> {
    /// Queries at `q_offset..`, keys at `k_offset..` (a KV cache holding
    /// `T_k − T_q` tokens: `q_offset = T_k − T_q`, `k_offset = 0`).
    pub fn offsets(q_offset: usize, k_offset: usize) -> Self {
        AttnPositions {
            q: Positions::Offset(q_offset),
            k: Positions::Offset(k_offset),
        }
    }

    /// Queries and keys at the same positions (self-attention over one
    /// sequence).
    pub fn same(p: Positions<'a>) -> Self {
        AttnPositions { q: p, k: p }
    }
}

/// Scaled dot-product attention with positional hooks (see the [module
/// docs](self)).
#[derive(Debug, Clone, Copy)]
pub struct Attention {
    causal: bool,
    scale: Option<f64>,
    layout: HeadLayout,
    level: SimdLevel,
    products: k::Products,
}

impl Attention {
    /// Causal (decoder) or bidirectional (encoder) attention, scale
    /// `1/√D`, `(B, H, T, D)` tensors, the best SIMD level of this CPU.
    pub fn new(causal: bool) -> Self {
        Attention {
            causal,
            scale: None,
            layout: HeadLayout::Bhtd,
            level: SimdLevel::detect(),
            products: k::Products::F32,
        }
    }

    /// Multiplies `q·k` by `scale` instead of `1/√D`.
    pub fn with_scale(mut self, scale: f64) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Axis order of `q`, `k`, `v` and the output of [`forward`](Self::forward).
    pub fn with_layout(mut self, layout: HeadLayout) -> Self {
        self.layout = layout;
        self
    }

    /// Runs the kernel at `level` (for tests comparing levels).
    ///
    /// # Errors
    /// [`Error::InvalidValue`] if this CPU lacks the level.
    pub fn with_simd_level(mut self, level: SimdLevel) -> Result<Self> {
        self.level = level.supported()?;
        Ok(self)
    }

    /// The precision of the forward pass's products on sequences of more
    /// than 1,024 keys (see [`k::Products`]; `f32` by default). The
    /// reference path and the backward pass stay exact.
    ///
    /// # Errors
    /// [`Error::InvalidValue`] for [`k::Products::Bf16`] on a CPU without
    /// AVX-512 and AVX512_BF16, or with a SIMD level below AVX-512.
    pub fn with_products(mut self, products: k::Products) -> Result<Self> {
        if products == k::Products::Bf16
            && !(crate::kernels::bf16::supported() && self.level == SimdLevel::Avx512)
        {
            return Err(Error::invalid(
                "attention products",
                "bfloat16 products need AVX-512 and AVX512_BF16 (and POSENC_SIMD at avx512)",
            ));
        }
        self.products = products;
        Ok(self)
    }

    /// Whether keys after each query are hidden.
    pub fn is_causal(&self) -> bool {
        self.causal
    }

    /// Attention over `q`, `k`, `v` (see the [module docs](self) for shapes);
    /// fused on the CPU in `f32`, the reference path otherwise.
    ///
    /// # Errors
    /// Before any kernel runs: [`Error::Shape`] for tensors that are not
    /// 4-d, disagree in batch, head dimension or key length, heads that do
    /// not group, or hook tensors of the wrong shape; [`Error::DType`] for
    /// mixed dtypes or position ids that are not u32/i64;
    /// [`Error::InvalidDimension`] for a zero dimension; the hooks' own
    /// errors.
    pub fn forward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        hooks: &AttentionHooks<'_>,
        positions: AttnPositions<'_>,
    ) -> Result<Tensor> {
        if !fusable(&[q, k, v]) {
            return self.forward_reference(q, k, v, hooks, positions);
        }
        let g = self.geometry(q, k, v)?;
        let plan = self.plan(&g, hooks, positions)?;
        let qkv = vec![q.clone(), k.clone(), v.clone()];
        Shared::launch(plan, g, Inputs::Separate, qkv, q.shape().clone())
    }

    /// Attention over a packed projection `qkv` of shape `(B, T, (H_q +
    /// 2·H_k)·D)` (queries, then keys, then values, each head's `D` entries
    /// together), read in place; returns `(B, T, H_q·D)`, ready for the
    /// output projection. Gradients come back as one `(B, T, (H_q + 2·H_k)·D)`
    /// tensor.
    ///
    /// # Errors
    /// [`Error::Shape`] if `qkv` is not 3-d or its width is not `(H_q +
    /// 2·H_k)·D` for an integer `D`; otherwise as [`forward`](Self::forward).
    pub fn forward_packed(
        &self,
        qkv: &Tensor,
        q_heads: usize,
        kv_heads: usize,
        hooks: &AttentionHooks<'_>,
        positions: AttnPositions<'_>,
    ) -> Result<Tensor> {
        let (b, t, d) = packed_geometry(qkv, q_heads, kv_heads)?;
        if !fusable(&[qkv]) {
            return self.forward_packed_reference(qkv, q_heads, kv_heads, hooks, positions);
        }
        let qkv = &qkv.contiguous()?;
        let [q_rows, k_rows, v_rows] = packed_rows(q_heads, kv_heads, t, d);
        let g = Geometry {
            layout: HeadLayout::Bthd,
            dims: k::Dims::new(b, q_heads, kv_heads, t, t, d),
            q_rows,
            k_rows,
            v_rows,
            out_rows: k::Rows::bthd(q_heads, t, d),
        };
        check_dims(&g.dims)?;
        let plan = self.plan(&g, hooks, positions)?;
        let out_shape = Shape::from((b, t, q_heads * d));
        Shared::launch(plan, g, Inputs::Packed, vec![qkv.clone()], out_shape)
    }

    /// The reference path of [`forward_packed`](Self::forward_packed).
    ///
    /// # Errors
    /// As [`forward_packed`](Self::forward_packed).
    pub fn forward_packed_reference(
        &self,
        qkv: &Tensor,
        q_heads: usize,
        kv_heads: usize,
        hooks: &AttentionHooks<'_>,
        positions: AttnPositions<'_>,
    ) -> Result<Tensor> {
        let (b, t, d) = packed_geometry(qkv, q_heads, kv_heads)?;
        let (q, kk, v) = split_packed(qkv, q_heads, kv_heads, d)?;
        let out = self
            .with_layout(HeadLayout::Bthd)
            .forward_reference(&q, &kk, &v, hooks, positions)?;
        Ok(out.reshape((b, t, q_heads * d))?)
    }

    /// The reference path: composed candle ops on the whole logits matrix,
    /// any device and float dtype, differentiable by candle's autograd.
    ///
    /// # Errors
    /// As [`forward`](Self::forward).
    pub fn forward_reference(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        hooks: &AttentionHooks<'_>,
        positions: AttnPositions<'_>,
    ) -> Result<Tensor> {
        let g = self.geometry(q, k, v)?;
        let plan = self.plan(&g, hooks, positions)?;
        let to_bhtd = |x: &Tensor| -> Result<Tensor> {
            Ok(match self.layout {
                HeadLayout::Bhtd => x.clone(),
                HeadLayout::Bthd => x.transpose(1, 2)?,
            })
        };
        let out = reference(&plan, &g.dims, &to_bhtd(q)?, &to_bhtd(k)?, &to_bhtd(v)?)?;
        Ok(match self.layout {
            HeadLayout::Bhtd => out,
            HeadLayout::Bthd => out.transpose(1, 2)?.contiguous()?,
        })
    }

    fn geometry(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Geometry> {
        let dims4 = |x: &Tensor, what: &'static str| -> Result<[usize; 4]> {
            x.dims().try_into().map_err(|_| Error::Shape {
                what,
                expected: match self.layout {
                    HeadLayout::Bhtd => "4 dims (batch, heads, seq_len, head_dim)".into(),
                    HeadLayout::Bthd => "4 dims (batch, seq_len, heads, head_dim)".into(),
                },
                got: format!("{:?}", x.dims()),
            })
        };
        let split = |d: [usize; 4]| match self.layout {
            HeadLayout::Bhtd => (d[0], d[1], d[2], d[3]),
            HeadLayout::Bthd => (d[0], d[2], d[1], d[3]),
        };
        let (bq, hq, tq, dq) = split(dims4(q, "queries")?);
        let (bk, hk, tk, dk) = split(dims4(k, "keys")?);
        let (bv, hv, tv, dv) = split(dims4(v, "values")?);
        if (bk, hk, tk, dk) != (bv, hv, tv, dv) || bq != bk || dq != dk {
            return Err(Error::Shape {
                what: "keys and values (batch and head_dim as the queries', values as the keys)",
                expected: format!("q {:?}", q.dims()),
                got: format!("k {:?}, v {:?}", k.dims(), v.dims()),
            });
        }
        if q.dtype() != k.dtype() || k.dtype() != v.dtype() {
            return Err(Error::DType {
                what: "queries, keys and values must share a dtype",
                dtype: format!("{:?}, {:?}, {:?}", q.dtype(), k.dtype(), v.dtype()),
            });
        }
        let dims = k::Dims::new(bq, hq, hk, tq, tk, dq);
        check_dims(&dims)?;
        let rows = |x: &Tensor| -> Result<k::Rows> { rows_of(x, self.layout) };
        Ok(Geometry {
            dims,
            layout: self.layout,
            q_rows: rows(q)?,
            k_rows: rows(k)?,
            v_rows: rows(v)?,
            out_rows: match self.layout {
                HeadLayout::Bhtd => k::Rows::bhtd(hq, tq, dq),
                HeadLayout::Bthd => k::Rows::bthd(hq, tq, dq),
            },
        })
    }

    /// Resolves the hooks for this call.
    fn plan(
        &self,
        g: &Geometry,
        hooks: &AttentionHooks<'_>,
        positions: AttnPositions<'_>,
    ) -> Result<Plan> {
        let d = g.dims;
        let q_pos = host_positions(positions.q, d.batch, d.q_len, "query positions")?;
        let k_pos = host_positions(positions.k, d.batch, d.k_len, "key positions")?;
        let at = CallPositions {
            batch: d.batch,
            q_len: d.q_len,
            k_len: d.k_len,
            q: positions.q,
            k: positions.k,
        };
        let ctx = BiasContext {
            at,
            q_heads: d.q_heads,
            head_dim: d.head_dim,
            max_distance: max_distance(&q_pos, &k_pos),
            causal: self.causal,
        };
        let rotation = match hooks.query_key {
            Some(h) => {
                let r = h.rotation(&at)?;
                let t = &r.tables;
                if t.rotary_dim > d.head_dim || t.rotary_dim % 2 != 0 {
                    return Err(Error::InvalidDimension {
                        what: "rotary_dim",
                        value: t.rotary_dim,
                        reason: "must be even and at most head_dim",
                    });
                }
                Some(r)
            }
            None => None,
        };
        let logits = match hooks.logits {
            Some(h) => Some(h.logits_bias(&ctx)?),
            None => None,
        };
        let values = match hooks.values {
            Some(h) => Some(h.value_terms(&ctx)?),
            None => None,
        };
        let mut params = Vec::new();
        match &logits {
            Some(LogitsBias::Bucketed { index, table }) => {
                expect_shape(
                    table,
                    &[index.rows(), d.q_heads],
                    "bucketed bias table (buckets, q_heads)",
                )?;
                params.push(table.clone());
            }
            Some(LogitsBias::RelativeKeys { index, keys }) => {
                expect_shape(
                    keys,
                    &[index.rows(), d.head_dim],
                    "relative key table (rows, head_dim)",
                )?;
                params.push(keys.clone());
            }
            Some(LogitsBias::Dense(t)) => {
                dense_dims(t, &d)?;
                params.push(t.clone());
            }
            Some(LogitsBias::Cumulative { q, k }) => {
                expect_shape(
                    q,
                    &[d.batch, d.q_heads, d.q_len],
                    "cumulative bias at the queries (B, H_q, T_q)",
                )?;
                expect_shape(
                    k,
                    &[d.batch, d.q_heads, d.k_len],
                    "cumulative bias at the keys (B, H_q, T_k)",
                )?;
                params.push(q.clone());
                params.push(k.clone());
            }
            Some(LogitsBias::Alibi { slopes, .. }) if slopes.len() != d.q_heads => {
                return Err(Error::Shape {
                    what: "ALiBi slopes (one per query head)",
                    expected: format!("{}", d.q_heads),
                    got: format!("{}", slopes.len()),
                });
            }
            Some(LogitsBias::Alibi { .. }) | None => {}
        }
        if let Some(vt) = &values {
            expect_shape(
                &vt.values,
                &[vt.index.rows(), d.head_dim],
                "relative value table (rows, head_dim)",
            )?;
            params.push(vt.values.clone());
        }
        if let (Some(LogitsBias::RelativeKeys { index, .. }), Some(vt)) = (&logits, &values) {
            if **index != *vt.index {
                return Err(Error::invalid(
                    "attention hooks",
                    "relative keys and relative values must index the same table rows",
                ));
            }
        }
        Ok(Plan {
            causal: self.causal,
            scale: self.scale.unwrap_or(1.0 / (d.head_dim as f64).sqrt()),
            level: self.level,
            products: self.products,
            q_pos,
            k_pos,
            rotation,
            logits,
            values,
            params,
        })
    }
}

/// Whether every tensor is an `f32` CPU tensor.
fn fusable(ts: &[&Tensor]) -> bool {
    ts.iter()
        .all(|t| matches!(t.device(), Device::Cpu) && t.dtype() == DType::F32)
}

fn check_dims(d: &k::Dims) -> Result<()> {
    for (what, v) in [
        ("batch", d.batch),
        ("query heads", d.q_heads),
        ("key/value heads", d.kv_heads),
        ("query length", d.q_len),
        ("key length", d.k_len),
        ("head_dim", d.head_dim),
    ] {
        crate::error::check_dim(what, v, false)?;
    }
    if !d.q_heads.is_multiple_of(d.kv_heads) {
        return Err(Error::Shape {
            what: "heads (query heads must be a multiple of key/value heads)",
            expected: format!("a multiple of {}", d.kv_heads),
            got: format!("{}", d.q_heads),
        });
    }
    Ok(())
}

fn expect_shape(t: &Tensor, want: &[usize], what: &'static str) -> Result<()> {
    if t.dims() != want {
        return Err(Error::Shape {
            what,
            expected: format!("{want:?}"),
            got: format!("{:?}", t.dims()),
        });
    }
    if !matches!(
        t.dtype(),
        DType::F32 | DType::F16 | DType::BF16 | DType::F64
    ) {
        return Err(Error::DType {
            what,
            dtype: format!("{:?}", t.dtype()),
        });
    }
    Ok(())
}

/// The 4-d shape `(B|1, H|1, T_q, T_k)` of a dense bias of rank 2 to 4.
fn dense_dims(t: &Tensor, d: &k::Dims) -> Result<[usize; 4]> {
    let dims = t.dims();
    let bad = || Error::Shape {
        what: "dense bias ((T_q, T_k), (H, T_q, T_k) or (B, H, T_q, T_k), 1 broadcasts)",
        expected: format!("(…, {}, {})", d.q_len, d.k_len),
        got: format!("{dims:?}"),
    };
    let mut full = [1usize; 4];
    if dims.len() < 2 || dims.len() > 4 {
        return Err(bad());
    }
    full[4 - dims.len()..].copy_from_slice(dims);
    let ok = full[2] == d.q_len
        && full[3] == d.k_len
        && (full[0] == 1 || full[0] == d.batch)
        && (full[1] == 1 || full[1] == d.q_heads);
    if ok {
        Ok(full)
    } else {
        Err(bad())
    }
}

/// Where a 4-d tensor's vectors are, in `layout`'s axis order; the last axis
/// must be contiguous.
fn rows_of(x: &Tensor, layout: HeadLayout) -> Result<k::Rows> {
    let l = x.layout();
    let s = l.stride();
    if x.dims()[3] > 1 && s[3] != 1 {
        return Err(Error::Shape {
            what: "attention input (the head dimension must be contiguous)",
            expected: "stride 1 on the last axis".into(),
            got: format!("strides {s:?}"),
        });
    }
    let (sb, sh, st) = match layout {
        HeadLayout::Bhtd => (s[0], s[1], s[2]),
        HeadLayout::Bthd => (s[0], s[2], s[1]),
    };
    Ok(k::Rows {
        offset: l.start_offset(),
        sb,
        sh,
        st,
    })
}

/// Splits a packed `(B, T, (H_q + 2H_k)·D)` into `(B, T, H, D)` views.
fn split_packed(
    qkv: &Tensor,
    q_heads: usize,
    kv_heads: usize,
    d: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, t, _) = qkv.dims3()?;
    let q = qkv.narrow(2, 0, q_heads * d)?.reshape((b, t, q_heads, d))?;
    let k = qkv
        .narrow(2, q_heads * d, kv_heads * d)?
        .reshape((b, t, kv_heads, d))?;
    let v = qkv
        .narrow(2, (q_heads + kv_heads) * d, kv_heads * d)?
        .reshape((b, t, kv_heads, d))?;
    Ok((q, k, v))
}

/// Host positions as `i64`: an offset or `(B·T)` ids.
#[derive(Debug, Clone)]
enum HostPos {
    Offset(i64),
    Ids(Vec<i64>),
}

impl HostPos {
    fn as_kernel(&self) -> k::Pos<'_> {
        match self {
            HostPos::Offset(o) => k::Pos::Offset(*o),
            HostPos::Ids(v) => k::Pos::Ids(v),
        }
    }

    fn range(&self, len: usize) -> (i64, i64) {
        match self {
            HostPos::Offset(o) => (*o, *o + len as i64 - 1),
            HostPos::Ids(v) => (
                v.iter().copied().min().unwrap_or(0),
                v.iter().copied().max().unwrap_or(0),
            ),
        }
    }
}

fn host_positions(
    p: Positions<'_>,
    b: usize,
    t: usize,
    what: &'static str,
) -> Result<(HostPos, usize)> {
    match p {
        Positions::Offset(o) => {
            let last = o.checked_add(t).filter(|&v| v <= i64::MAX as usize).ok_or(
                Error::PositionOutOfRange {
                    position: o as u64,
                    limit: i64::MAX as u64,
                    what,
                },
            )?;
            let _ = last;
            Ok((HostPos::Offset(o as i64), t))
        }
        Positions::Ids(ids) => {
            if ids.dims() != [b, t] {
                return Err(Error::Shape {
                    what,
                    expected: format!("({b}, {t}) = (batch, seq_len)"),
                    got: format!("{:?}", ids.dims()),
                });
            }
            let flat = ids.flatten_all()?;
            let v: Vec<i64> = match ids.dtype() {
                DType::U32 => flat.to_vec1::<u32>()?.into_iter().map(i64::from).collect(),
                DType::I64 => {
                    let v = flat.to_vec1::<i64>()?;
                    if let Some(&n) = v.iter().find(|&&p| p < 0) {
                        return Err(Error::NegativePosition(n));
                    }
                    v
                }
                other => {
                    return Err(Error::DType {
                        what: "position ids (u32 or i64)",
                        dtype: format!("{other:?}"),
                    })
                }
            };
            Ok((HostPos::Ids(v), t))
        }
    }
}

/// `max |pos_k − pos_q|` over the call.
fn max_distance(q: &(HostPos, usize), k: &(HostPos, usize)) -> usize {
    let (q0, q1) = q.0.range(q.1);
    let (k0, k1) = k.0.range(k.1);
    let a = (k1 as i128 - q0 as i128).unsigned_abs();
    let b = (q1 as i128 - k0 as i128).unsigned_abs();
    a.max(b).min(usize::MAX as u128) as usize
}

/// Sizes and layouts of one call.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    dims: k::Dims,
    /// Axis order of the separate inputs and of the output.
    layout: HeadLayout,
    q_rows: k::Rows,
    k_rows: k::Rows,
    v_rows: k::Rows,
    out_rows: k::Rows,
}

/// The hooks resolved for one call.
struct Plan {
    causal: bool,
    scale: f64,
    level: SimdLevel,
    products: k::Products,
    q_pos: (HostPos, usize),
    k_pos: (HostPos, usize),
    rotation: Option<Rotation>,
    logits: Option<LogitsBias>,
    values: Option<ValueTerms>,
    /// Parameter tensors of the hooks, in input order.
    params: Vec<Tensor>,
}

/// How the first inputs hold q, k, v.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inputs {
    /// `inputs[0..3]` are q, k, v.
    Separate,
    /// `inputs[0]` is the packed projection.
    Packed,
}

/// One fused call, shared by the stages of its autograd node chain.
struct Shared {
    plan: Plan,
    g: Geometry,
    layouts: Inputs,
    /// q, k, v (or qkv), then the hook parameters.
    inputs: Vec<Tensor>,
    out_shape: Shape,
    /// Log-sum-exp of the forward pass, for the backward pass.
    lse: Mutex<Vec<f32>>,
    /// Gradients of every input, once the backward pass ran.
    grads: Mutex<Option<Vec<Option<Tensor>>>>,
}

/// The `n` elements of a contiguous CPU `f32` storage, from its layout's
/// start, without a copy.
fn cpu_f32_contiguous<'a>(s: &'a Storage, l: &Layout, n: usize) -> Result<&'a [f32]> {
    match s {
        Storage::Cpu(CpuStorage::F32(v)) if l.is_contiguous() => v
            .get(l.start_offset()..l.start_offset() + n)
            .ok_or(Error::DType {
                what: "fused attention backward (a storage shorter than its layout)",
                dtype: "f32".into(),
            }),
        _ => Err(Error::DType {
            what: "fused attention backward (contiguous CPU f32)",
            dtype: "not contiguous CPU f32".into(),
        }),
    }
}

/// A contiguous `f32` copy of a CPU tensor's data, with its layout.
fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

impl Shared {
    /// Runs the fused op on `inputs` (q, k, v, or the packed qkv, as
    /// `layouts` says) and the plan's parameter tensors after them,
    /// returning an output of `out_shape`.
    fn launch(
        plan: Plan,
        g: Geometry,
        layouts: Inputs,
        mut inputs: Vec<Tensor>,
        out_shape: Shape,
    ) -> Result<Tensor> {
        inputs.extend(plan.params.iter().cloned());
        apply(Arc::new(Shared {
            plan,
            g,
            layouts,
            inputs,
            out_shape,
            lse: Mutex::new(Vec::new()),
            grads: Mutex::new(None),
        }))
    }

    /// Kernel-ready parameter data (contiguous `f32` copies: they are small,
    /// except a dense bias).
    fn param_data(&self) -> Result<Vec<Vec<f32>>> {
        self.plan.params.iter().map(host_f32).collect()
    }

    /// ALiBi's slopes as `f32` (empty without ALiBi), for [`Shared::problem`].
    fn alibi_slopes(&self) -> Vec<f32> {
        match &self.plan.logits {
            Some(LogitsBias::Alibi { slopes, .. }) => slopes.iter().map(|&m| m as f32).collect(),
            _ => Vec::new(),
        }
    }

    /// The kernel problem over queries `q`, keys `k` and values `v` (in this
    /// call's row layouts), for the forward and the backward pass: the
    /// rotation, the logits bias and the value tables, their data read from
    /// `params` in plan order, ALiBi's from `slopes`
    /// ([`alibi_slopes`](Self::alibi_slopes)). Also returns the dense bias's
    /// full dims (`[1; 4]` without one).
    fn problem<'a>(
        &'a self,
        params: &'a [Vec<f32>],
        slopes: &'a [f32],
        [q, k, v]: [&'a [f32]; 3],
    ) -> Result<(k::Problem<'a>, [usize; 4])> {
        let d = self.g.dims;
        let rotation = self.plan.rotation.as_ref().map(|r| r.tables.rotation());
        let mut params = params.iter();
        let mut next = || -> &'a [f32] { params.next().expect("a parameter per bias table") };
        let mut prob = k::Problem {
            dims: d,
            scale: self.plan.scale as f32,
            causal: self.plan.causal,
            q,
            q_rows: self.g.q_rows,
            k,
            k_rows: self.g.k_rows,
            v,
            v_rows: self.g.v_rows,
            rotation,
            q_pos: self.plan.q_pos.0.as_kernel(),
            k_pos: self.plan.k_pos.0.as_kernel(),
            alibi: None,
            scalar: None,
            vector: None,
            dense: None,
            cumulative: None,
            products: self.plan.products,
            window: None,
        };
        let mut dense_full = [1usize; 4];
        match &self.plan.logits {
            Some(LogitsBias::Alibi { symmetric, .. }) => {
                prob.alibi = Some(k::AlibiBias {
                    slopes,
                    symmetric: *symmetric,
                });
            }
            Some(LogitsBias::Bucketed { index, .. }) => {
                prob.scalar = Some(k::ScalarTable {
                    index,
                    table: next(),
                });
            }
            Some(LogitsBias::RelativeKeys { index, .. }) => {
                prob.vector = Some(k::VectorTables {
                    index,
                    keys: Some(next()),
                    values: None,
                });
            }
            Some(LogitsBias::Dense(t)) => {
                dense_full = dense_dims(t, &d)?;
                let f = dense_full;
                let data = next();
                // contiguous (f0, f1, Tq, Tk) with zero strides on broadcast axes
                prob.dense = Some(k::DenseBias {
                    data,
                    offset: 0,
                    sb: if f[0] == 1 { 0 } else { f[1] * f[2] * f[3] },
                    sh: if f[1] == 1 { 0 } else { f[2] * f[3] },
                    si: f[3],
                    sj: 1,
                });
            }
            Some(LogitsBias::Cumulative { .. }) => {
                prob.cumulative = Some(k::CumulativeBias {
                    q: next(),
                    k: next(),
                });
            }
            None => {}
        }
        if let Some(vt) = &self.plan.values {
            let values = next();
            match &mut prob.vector {
                Some(v) => v.values = Some(values),
                None => {
                    prob.vector = Some(k::VectorTables {
                        index: &vt.index,
                        keys: None,
                        values: Some(values),
                    })
                }
            }
        }
        Ok((prob, dense_full))
    }

    fn forward(&self, qkv: &[(&[f32], &Layout)]) -> Result<(Vec<f32>, Vec<f32>)> {
        let d = self.g.dims;
        let params = self.param_data()?;
        let slopes = self.alibi_slopes();
        let inputs = match self.layouts {
            Inputs::Separate => [qkv[0].0, qkv[1].0, qkv[2].0],
            Inputs::Packed => {
                let s = &qkv[0].0[qkv[0].1.start_offset()..];
                [s, s, s]
            }
        };
        let (prob, _) = self.problem(&params, &slopes, inputs)?;
        check_extent(&prob)?;
        // SAFETY: the kernel writes every row of the output (zeros for a
        // query that sees no key) and every log-sum-exp.
        let mut out = unsafe {
            crate::kernels::tile::vec_for_overwrite(d.batch * d.q_heads * d.q_len * d.head_dim)
        };
        let mut lse =
            unsafe { crate::kernels::tile::vec_for_overwrite(d.batch * d.q_heads * d.q_len) };
        k::forward(&prob, &mut out, self.g.out_rows, &mut lse, self.plan.level);
        Ok((out, lse))
    }
}

/// The `(batch, seq_len, width)` of a packed `qkv` projection.
///
/// # Errors
/// [`Error::Shape`] for a tensor that is not 3-d.
pub(crate) fn packed_dims(qkv: &Tensor) -> Result<(usize, usize, usize)> {
    qkv.dims3().map_err(|_| Error::Shape {
        what: "packed qkv",
        expected: "(batch, seq_len, (q_heads + 2·kv_heads)·head_dim)".into(),
        got: format!("{:?}", qkv.dims()),
    })
}

/// The rows `[q, k, v]` of a contiguous packed `qkv` projection of `t`
/// steps and `q_heads` query and `kv_heads` key/value heads of `d`
/// entries: each step holds the query heads, then the key heads, then the
/// value heads, each head's `d` entries together.
pub(crate) fn packed_rows(q_heads: usize, kv_heads: usize, t: usize, d: usize) -> [k::Rows; 3] {
    let w = (q_heads + 2 * kv_heads) * d;
    let rows = |offset: usize| k::Rows {
        offset,
        sb: t * w,
        sh: d,
        st: w,
    };
    [rows(0), rows(q_heads * d), rows((q_heads + kv_heads) * d)]
}

/// The `(batch, seq_len, head_dim)` of a packed `qkv` projection of
/// `q_heads` query and `kv_heads` key/value heads.
///
/// # Errors
/// [`Error::Shape`] for a tensor that is not 3-d, or a width that is not a
/// positive multiple of `q_heads + 2·kv_heads` (or zero heads).
fn packed_geometry(qkv: &Tensor, q_heads: usize, kv_heads: usize) -> Result<(usize, usize, usize)> {
    let (b, t, w) = packed_dims(qkv)?;
    let heads = q_heads + 2 * kv_heads;
    if q_heads == 0 || kv_heads == 0 || w == 0 || !w.is_multiple_of(heads) {
        return Err(Error::Shape {
            what: "packed qkv",
            expected: format!("width divisible by q_heads + 2·kv_heads = {heads}"),
            got: format!("{:?}", qkv.dims()),
        });
    }
    Ok((b, t, w / heads))
}

fn check_extent(p: &k::Problem) -> Result<()> {
    let d = p.dims;
    for (what, data, rows, heads, len) in [
        ("queries", p.q, p.q_rows, d.q_heads, d.q_len),
        ("keys", p.k, p.k_rows, d.kv_heads, d.k_len),
        ("values", p.v, p.v_rows, d.kv_heads, d.k_len),
    ] {
        if rows.extent(d.batch, heads, len, d.head_dim) > data.len() {
            return Err(Error::Shape {
                what,
                expected: format!("{} elements", rows.extent(d.batch, heads, len, d.head_dim)),
                got: format!("{}", data.len()),
            });
        }
    }
    Ok(())
}
