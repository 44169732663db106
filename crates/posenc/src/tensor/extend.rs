//! Training-free context methods ([`crate::extend`]: Self-Extend, ReRoPE,
//! leaky ReRoPE, dual chunk attention, attention sinks) run inside posenc's
//! fused attention, on candle tensors.
//!
//! [`MethodAttention`] runs one streaming pass of the fused kernel per range
//! of the method ([`View`]): the queries and keys are rotated inside at the
//! range's remapped positions, key tiles outside the range are skipped, and
//! each pass returns its outputs and per-row log-sum-exp, which are merged
//! exactly as one softmax over all the logits (`o = Σ_v e^{lse_v − lse}
//! o_v`). Memory grows linearly with the length (no `T × T` tensor); the
//! work is plain causal attention's plus the key tiles a range boundary
//! crosses. [`MethodAttention::forward_reference`] writes every logit out
//! (`f64`, for short windows): what the fused path is tested against.
//!
//! Forward only (inference: perplexity, retrieval, generation with a KV
//! cache); the gradients of these rules are not implemented.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use posenc::extend::{ContextMethod, ModelLengths};
//! use posenc::rope::{PairLayout, RopeFrequencies};
//! use posenc::tensor::extend::MethodAttention;
//! use posenc::tensor::rope::Rope;
//!
//! let freqs = RopeFrequencies::plain(10_000.0, 16, PairLayout::HalfSplit)?;
//! let rope = Rope::new(freqs)?;
//! let method: ContextMethod = "self-extend:4:16".parse()?;
//! let attn = MethodAttention::new(method, &rope, ModelLengths::default())?;
//! // A packed projection: 2 query heads, 1 key/value head, head_dim 16.
//! let qkv = Tensor::randn(0f32, 1.0, (1, 100, (2 + 2) * 16), &Device::Cpu)?;
//! let fused = attn.forward_packed(&qkv, 2, 1)?;
//! let reference = attn.forward_packed_reference(&qkv, 2, 1)?;
//! let diff = (fused - reference)?.abs()?.max_all()?.to_scalar::<f32>()?;
//! assert!(diff < 1e-4);
//! # Ok::<(), posenc::Error>(())
//! ```

use candle_core::{DType, Device, Tensor};

use super::rope::{Rope, RotationTables};
use crate::error::{Error, Result};
use crate::extend::{ContextMethod, ModelLengths, View};
use crate::kernels::attention::{self as k, Products};
use crate::kernels::SimdLevel;
use crate::rope::PairLayout;

/// A training-free context method bound to a model's RoPE (see the [module
/// docs](self)).
pub struct MethodAttention<'r> {
    method: ContextMethod,
    lengths: ModelLengths,
    base: &'r Rope,
    /// The rope of views whose frequencies are divided (leaky ReRoPE).
    scaled: Option<Rope>,
    views: Vec<View>,
    level: SimdLevel,
    products: Products,
}

impl std::fmt::Debug for MethodAttention<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MethodAttention")
            .field("method", &self.method)
            .field("lengths", &self.lengths)
            .field("views", &self.views)
            .finish()
    }
}

/// Where one call's queries, keys and values are.
struct Call<'a> {
    dims: k::Dims,
    q: &'a [f32],
    q_rows: k::Rows,
    k: &'a [f32],
    k_rows: k::Rows,
    v: &'a [f32],
    v_rows: k::Rows,
}

impl<'a> Call<'a> {
    /// Contiguous `(B, H, T, D)` buffers of `dims`.
    fn bhtd(q: &'a [f32], k: &'a [f32], v: &'a [f32], dims: k::Dims) -> Call<'a> {
        let d = dims.head_dim;
        Call {
            dims,
            q,
            q_rows: k::Rows::bhtd(dims.q_heads, dims.q_len, d),
            k,
            k_rows: k::Rows::bhtd(dims.kv_heads, dims.k_len, d),
            v,
            v_rows: k::Rows::bhtd(dims.kv_heads, dims.k_len, d),
        }
    }
}

impl<'r> MethodAttention<'r> {
    /// `method` over `rope` (any frequency scaling; the method remaps the
    /// positions it rotates at). `lengths` gives ReRoPE's training length
    /// and DCA's `max_position_embeddings`.
    ///
    /// # Errors
    /// [`Error::InvalidValue`] for invalid parameters
    /// ([`ContextMethod::validate`]) or a rope with xPos.
    pub fn new(method: ContextMethod, rope: &'r Rope, lengths: ModelLengths) -> Result<Self> {
        method.validate()?;
        if rope.xpos_scale_base().is_some() {
            return Err(Error::invalid(
                "attention method",
                "xPos scales keys by their position: no context method remaps it",
            ));
        }
        let views = method.views();
        let scaled = match views.iter().find(|v| v.freq_divisor != 1.0) {
            Some(v) => {
                let mut f = rope.frequencies();
                for x in f.inv_freq.iter_mut() {
                    *x = (*x as f64 / v.freq_divisor) as f32;
                }
                Some(Rope::new(f)?.with_layout(rope.layout()))
            }
            None => None,
        };
        Ok(MethodAttention {
            method,
            lengths,
            base: rope,
            scaled,
            views,
            level: SimdLevel::detect(),
            products: Products::F32,
        })
    }

    /// The precision of the long-sequence tiles' products (see
    /// [`crate::tensor::attention::Attention::with_products`]).
    ///
    /// # Errors
    /// As [`crate::tensor::attention::Attention::with_products`].
    pub fn with_products(mut self, products: Products) -> Result<Self> {
        super::attention::Attention::new(true).with_products(products)?;
        self.products = products;
        Ok(self)
    }

    /// Runs the kernel at `level` (for tests comparing levels).
    ///
    /// # Errors
    /// [`Error::InvalidValue`] if this CPU lacks the level.
    pub fn with_simd_level(mut self, level: SimdLevel) -> Result<Self> {
        super::attention::Attention::new(true).with_simd_level(level)?;
        self.level = level;
        Ok(self)
    }

    /// The method.
    pub fn method(&self) -> ContextMethod {
        self.method
    }

    /// Causal attention over a packed projection `(B, T, (H_q + 2·H_k)·D)`
    /// (queries, keys, values), positions `0..T`; returns `(B, T, H_q·D)`.
    ///
    /// # Errors
    /// [`Error::Shape`] for a tensor that is not 3-d or a width that is not
    /// `(H_q + 2·H_k)·D`; [`Error::DType`] for a tensor that is not `f32`
    /// on the CPU; the rope's errors.
    pub fn forward_packed(&self, qkv: &Tensor, q_heads: usize, kv_heads: usize) -> Result<Tensor> {
        self.packed(qkv, q_heads, kv_heads, false)
    }

    /// [`forward_packed`](Self::forward_packed) with every logit written out
    /// (`f64`, `O(T²)`: for tests on short windows).
    ///
    /// # Errors
    /// As [`forward_packed`](Self::forward_packed).
    pub fn forward_packed_reference(
        &self,
        qkv: &Tensor,
        q_heads: usize,
        kv_heads: usize,
    ) -> Result<Tensor> {
        self.packed(qkv, q_heads, kv_heads, true)
    }

    /// `T_q` new queries `(B, T_q, H_q, D)` over every key `(B, T_k, H_k, D)`
    /// and value of a KV cache (unrotated; the new ones last): the queries
    /// are at positions `T_k − T_q..T_k`, the keys at `0..T_k`. Returns
    /// `(B, T_q, H_q, D)`.
    ///
    /// # Errors
    /// [`Error::Shape`] for tensors that are not 4-d, disagree in batch or
    /// head dimension, heads that do not group, or more queries than keys;
    /// otherwise as [`forward_packed`](Self::forward_packed).
    pub fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        self.cached(q, k, v, false)
    }

    /// [`forward`](Self::forward) with every logit written out.
    ///
    /// # Errors
    /// As [`forward`](Self::forward).
    pub fn forward_reference(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        self.cached(q, k, v, true)
    }

    fn packed(&self, qkv: &Tensor, hq: usize, hk: usize, reference: bool) -> Result<Tensor> {
        let (b, t, w) = super::attention::packed_dims(qkv)?;
        let heads = hq + 2 * hk;
        if hq == 0 || hk == 0 || w == 0 || !w.is_multiple_of(heads) || !hq.is_multiple_of(hk) {
            return Err(Error::Shape {
                what: "packed qkv",
                expected: format!(
                    "width divisible by q_heads + 2·kv_heads = {heads}, kv_heads dividing q_heads"
                ),
                got: format!("{:?}, {hq} q heads, {hk} kv heads", qkv.dims()),
            });
        }
        let d = w / heads;
        let data = host_f32(qkv)?;
        let [q_rows, k_rows, v_rows] = super::attention::packed_rows(hq, hk, t, d);
        let call = Call {
            dims: k::Dims::new(b, hq, hk, t, t, d),
            q: &data,
            q_rows,
            k: &data,
            k_rows,
            v: &data,
            v_rows,
        };
        let out = self.run(&call, reference)?;
        Ok(Tensor::from_vec(out, (b, t, hq * d), &Device::Cpu)?)
    }

    fn cached(&self, q: &Tensor, kt: &Tensor, v: &Tensor, reference: bool) -> Result<Tensor> {
        let dims4 = |x: &Tensor, what: &'static str| -> Result<(usize, usize, usize, usize)> {
            x.dims4().map_err(|_| Error::Shape {
                what,
                expected: "(batch, seq_len, heads, head_dim)".into(),
                got: format!("{:?}", x.dims()),
            })
        };
        let (b, tq, hq, d) = dims4(q, "queries")?;
        let (bk, tk, hk, dk) = dims4(kt, "keys")?;
        if (bk, tk, hk, dk) != dims4(v, "values")? || b != bk || d != dk {
            return Err(Error::Shape {
                what: "keys and values",
                expected: format!("batch and head_dim as the queries' {:?}", q.dims()),
                got: format!("k {:?}, v {:?}", kt.dims(), v.dims()),
            });
        }
        if hk == 0 || !hq.is_multiple_of(hk) || tq > tk || tq == 0 || d == 0 || b == 0 {
            return Err(Error::Shape {
                what: "attention heads and lengths",
                expected: "kv heads dividing q heads, 1 ≤ T_q ≤ T_k, non-zero sizes".into(),
                got: format!("q {:?}, k {:?}", q.dims(), kt.dims()),
            });
        }
        let (qd, kd, vd) = (host_f32(q)?, host_f32(kt)?, host_f32(v)?);
        let call = Call {
            dims: k::Dims::new(b, hq, hk, tq, tk, d),
            q: &qd,
            q_rows: k::Rows::bthd(hq, tq, d),
            k: &kd,
            k_rows: k::Rows::bthd(hk, tk, d),
            v: &vd,
            v_rows: k::Rows::bthd(hk, tk, d),
        };
        let out = self.run(&call, reference)?;
        Ok(Tensor::from_vec(out, (b, tq, hq, d), &Device::Cpu)?)
    }

    /// The queries with ReRoPE's log-n factor applied (`None`: every factor
    /// is 1).
    fn scaled_queries(&self, c: &Call) -> Option<Vec<f32>> {
        let dm = c.dims;
        let shift = dm.k_len - dm.q_len;
        let factors: Vec<f32> = (0..dm.q_len)
            .map(|t| self.method.query_scale(shift + t, &self.lengths))
            .collect();
        if factors.iter().all(|&f| f == 1.0) {
            return None;
        }
        let mut q = c.q.to_vec();
        for b in 0..dm.batch {
            for h in 0..dm.q_heads {
                for (t, f) in factors.iter().enumerate() {
                    let at = c.q_rows.offset + b * c.q_rows.sb + h * c.q_rows.sh + t * c.q_rows.st;
                    for x in &mut q[at..at + dm.head_dim] {
                        *x *= f;
                    }
                }
            }
        }
        Some(q)
    }

    /// The rotation tables of one range for `T_q` queries at the last
    /// `T_q` of `T_k` keys at `0..T_k` (every batch entry alike).
    fn view_tables(
        &self,
        view: &View,
        batch: usize,
        q_len: usize,
        k_len: usize,
    ) -> Result<RotationTables> {
        let rope = if view.freq_divisor != 1.0 {
            self.scaled.as_ref().unwrap_or(self.base)
        } else {
            self.base
        };
        let shift = k_len - q_len;
        let q_ids: Vec<u32> = (0..batch)
            .flat_map(|_| (0..q_len).map(|t| view.query.at(shift + t)))
            .map(to_u32)
            .collect::<Result<_>>()?;
        let k_ids: Vec<u32> = (0..batch)
            .flat_map(|_| (0..k_len).map(|j| view.key.at(j)))
            .map(to_u32)
            .collect::<Result<_>>()?;
        let q_ids = Tensor::from_vec(q_ids, (batch, q_len), &Device::Cpu)?;
        let k_ids = Tensor::from_vec(k_ids, (batch, k_len), &Device::Cpu)?;
        rope.attention_tables_at_ids(&q_ids, &k_ids)
    }

    /// The method as data, for an attention written elsewhere (the
    /// PyTorch path of the Python package): for `T_q` queries at the last
    /// `T_q` of `T_k` keys at `0..T_k`, each range's rotation tables and
    /// the keys `lo..hi` each query sees in it, the factor of each query
    /// (ReRoPE's log-n) and the factor of every logit (DCA's `mscale²`).
    /// Attention over it: in each range, rotate with its tables, scale,
    /// mask outside `lo..hi`, and take one softmax over all ranges.
    ///
    /// # Errors
    /// [`Error::Shape`] for `T_q` of 0 or above `T_k`; the rope's errors.
    pub fn plan(&self, q_len: usize, k_len: usize) -> Result<MethodPlan> {
        if q_len == 0 || q_len > k_len {
            return Err(Error::Shape {
                what: "attention method",
                expected: "1 ≤ T_q ≤ T_k".into(),
                got: format!("T_q {q_len}, T_k {k_len}"),
            });
        }
        let shift = k_len - q_len;
        let mut views = Vec::with_capacity(self.views.len());
        for view in &self.views {
            let (lo, hi): (Vec<usize>, Vec<usize>) = (0..q_len)
                .map(|t| {
                    let (lo, hi) = view.keys.range(shift + t);
                    (lo.min(hi), hi)
                })
                .unzip();
            views.push(ViewPlan {
                tables: self.view_tables(view, 1, q_len, k_len)?,
                lo,
                hi,
            });
        }
        Ok(MethodPlan {
            views,
            query_scale: (0..q_len)
                .map(|t| self.method.query_scale(shift + t, &self.lengths))
                .collect(),
            logit_scale: self.method.logit_scale(k_len, &self.lengths),
        })
    }

    /// [`forward`](Self::forward) on contiguous `(B, H, T, D)` buffers
    /// (queries `(B, H_q, T_q, D)`, keys and values `(B, H_k, T_k, D)`,
    /// unrotated, keys at `0..T_k`); returns `(B, T_q, H_q, D)` row-major.
    ///
    /// # Errors
    /// [`Error::Shape`] for buffers shorter than `dims`; as
    /// [`forward`](Self::forward).
    pub fn forward_buffers(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dims: k::Dims,
    ) -> Result<Vec<f32>> {
        self.run(&Call::bhtd(q, k, v, dims), false)
    }

    /// [`forward_buffers`](Self::forward_buffers) writing its output into
    /// `out`, laid out as `out_rows` (`k::Rows::bhtd` or `k::Rows::bthd` of
    /// `(H_q, T_q, D)`): a one-range method's pass writes there directly,
    /// the ranges of the others are merged there.
    ///
    /// # Errors
    /// [`Error::Shape`] for an `out` shorter than `out_rows` needs; as
    /// [`forward_buffers`](Self::forward_buffers).
    pub fn forward_buffers_into(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dims: k::Dims,
        out: &mut [f32],
        out_rows: k::Rows,
    ) -> Result<()> {
        let need = out_rows.extent(dims.batch, dims.q_heads, dims.q_len, dims.head_dim);
        if need > out.len() {
            return Err(Error::Shape {
                what: "output",
                expected: format!("{need} elements"),
                got: format!("{}", out.len()),
            });
        }
        let call = Call::bhtd(q, k, v, dims);
        self.check(&call)?;
        self.fused_into(&call, out, out_rows)
    }

    /// Output `(B, T_q, H_q, D)` row-major.
    fn run(&self, c: &Call, reference: bool) -> Result<Vec<f32>> {
        self.check(c)?;
        let dm = c.dims;
        if reference {
            let scaled_q = self.scaled_queries(c);
            let q = scaled_q.as_deref().unwrap_or(c.q);
            return self.reference(c, q, self.scale(dm));
        }
        let mut out = vec![0f32; dm.batch * dm.q_heads * dm.q_len * dm.head_dim];
        let out_rows = k::Rows::bthd(dm.q_heads, dm.q_len, dm.head_dim);
        self.fused_into(c, &mut out, out_rows)?;
        Ok(out)
    }

    /// The factor of every logit: the method's (DCA's `mscale²`) over `√D`.
    fn scale(&self, dm: k::Dims) -> f64 {
        self.method.logit_scale(dm.k_len, &self.lengths) / (dm.head_dim as f64).sqrt()
    }

    /// The buffers of `c` hold its shapes; the rope rotates at most
    /// `head_dim` entries.
    fn check(&self, c: &Call) -> Result<()> {
        let dm = c.dims;
        for (what, data, rows, heads, len) in [
            ("queries", c.q, c.q_rows, dm.q_heads, dm.q_len),
            ("keys", c.k, c.k_rows, dm.kv_heads, dm.k_len),
            ("values", c.v, c.v_rows, dm.kv_heads, dm.k_len),
        ] {
            let need = rows.extent(dm.batch, heads, len, dm.head_dim);
            if need > data.len() {
                return Err(Error::Shape {
                    what,
                    expected: format!("{need} elements"),
                    got: format!("{}", data.len()),
                });
            }
        }
        let rd = self.base.rotary_dim();
        if rd > dm.head_dim {
            return Err(Error::InvalidDimension {
                what: "rotary_dim",
                value: rd,
                reason: "must be at most head_dim",
            });
        }
        Ok(())
    }

    /// The fused passes of `c` (checked), their output written into `out`
    /// laid out as `out_rows`.
    fn fused_into(&self, c: &Call, out: &mut [f32], out_rows: k::Rows) -> Result<()> {
        let dm = c.dims;
        let scaled_q = self.scaled_queries(c);
        let q = scaled_q.as_deref().unwrap_or(c.q);
        let scale = self.scale(dm);
        let shift = dm.k_len - dm.q_len;
        let n_out = dm.batch * dm.q_heads * dm.q_len;
        // The ranges some query sees a key in (Self-Extend's grouped range
        // is empty while the input fits its window): an empty one adds
        // nothing to the merge but its pass's packing.
        let views: Vec<&View> = self
            .views
            .iter()
            .filter(|v| {
                (shift..dm.k_len).any(|a| {
                    let (lo, hi) = v.keys.range(a);
                    lo < hi.min(a + 1)
                })
            })
            .collect();
        // One range: its pass is the output (the merge of one part would
        // multiply each row by exactly 1: the same bits).
        let Some(last) = views.len().checked_sub(1) else {
            // No query sees a key (no method's ranges leave the diagonal
            // out; kept for safety): every row is zeros.
            for (b, h, t) in (0..dm.batch).flat_map(|b| {
                (0..dm.q_heads).flat_map(move |h| (0..dm.q_len).map(move |t| (b, h, t)))
            }) {
                let at = out_rows.offset + b * out_rows.sb + h * out_rows.sh + t * out_rows.st;
                out[at..at + dm.head_dim].fill(0.0);
            }
            return Ok(());
        };
        let direct = last == 0;
        let part_rows = k::Rows::bthd(dm.q_heads, dm.q_len, dm.head_dim);
        let mut parts: Vec<(Vec<f32>, Vec<f32>)> = Vec::with_capacity(last);
        for (index, view) in views.into_iter().enumerate() {
            let tables = self.view_tables(view, dm.batch, dm.q_len, dm.k_len)?;
            let prob = k::Problem {
                dims: dm,
                scale: scale as f32,
                causal: true,
                q,
                q_rows: c.q_rows,
                k: c.k,
                k_rows: c.k_rows,
                v: c.v,
                v_rows: c.v_rows,
                rotation: Some(tables.rotation()),
                q_pos: k::Pos::Offset(shift as i64),
                k_pos: k::Pos::Offset(0),
                alibi: None,
                scalar: None,
                vector: None,
                dense: None,
                cumulative: None,
                products: self.products,
                window: Some(view.keys),
            };
            let mut lse = vec![0f32; n_out];
            if direct {
                k::forward(&prob, out, out_rows, &mut lse, self.level);
                return Ok(());
            }
            if index == last {
                // The last range's pass merges every range's output into
                // `out` as it finishes each row.
                let earlier: Vec<(&[f32], &[f32])> =
                    parts.iter().map(|(o, l)| (&o[..], &l[..])).collect();
                let earlier = k::Parts {
                    parts: &earlier,
                    rows: part_rows,
                };
                k::forward_merging(&prob, out, out_rows, &mut lse, earlier, self.level);
                return Ok(());
            }
            let mut part = vec![0f32; n_out * dm.head_dim];
            k::forward(&prob, &mut part, part_rows, &mut lse, self.level);
            parts.push((part, lse));
        }
        Ok(())
    }

    /// Every logit written out, in `f64`.
    fn reference(&self, c: &Call, q: &[f32], scale: f64) -> Result<Vec<f32>> {
        let dm = c.dims;
        let d = dm.head_dim;
        let shift = dm.k_len - dm.q_len;
        let freqs = self.base.frequencies();
        let att = freqs.attention_factor;
        let rotate = |x: &[f32], pos: usize, divisor: f64| -> Vec<f64> {
            let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let half = freqs.rotary_dim / 2;
            for (i, &f) in freqs.inv_freq.iter().enumerate() {
                let (a, b) = match freqs.layout {
                    PairLayout::HalfSplit => (i, i + half),
                    PairLayout::Interleaved => (2 * i, 2 * i + 1),
                };
                let f = ((f as f64 / divisor) as f32) as f64;
                let ang = pos as f64 * f;
                let (cs, sn) = (ang.cos() * att, ang.sin() * att);
                let (x0, x1) = (x[a] as f64, x[b] as f64);
                y[a] = x0 * cs - x1 * sn;
                y[b] = x1 * cs + x0 * sn;
            }
            y
        };
        let at = |rows: k::Rows, b: usize, h: usize, t: usize| {
            rows.offset + b * rows.sb + h * rows.sh + t * rows.st
        };
        let group = dm.q_heads / dm.kv_heads;
        let mut out = vec![0f32; dm.batch * dm.q_len * dm.q_heads * d];
        for b in 0..dm.batch {
            for h in 0..dm.q_heads {
                let hk = h / group;
                for t in 0..dm.q_len {
                    let a = shift + t;
                    let qv = &q[at(c.q_rows, b, h, t)..][..d];
                    let mut s = vec![f64::NEG_INFINITY; a + 1];
                    for (j, sj) in s.iter_mut().enumerate() {
                        let Some(vi) = self.method.view_of(&self.views, a, j) else {
                            continue;
                        };
                        let view = &self.views[vi];
                        let qr = rotate(qv, view.query.at(a), view.freq_divisor);
                        let kv = &c.k[at(c.k_rows, b, hk, j)..][..d];
                        let kr = rotate(kv, view.key.at(j), view.freq_divisor);
                        *sj = qr.iter().zip(&kr).map(|(x, y)| x * y).sum::<f64>() * scale;
                    }
                    let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    if mx == f64::NEG_INFINITY {
                        continue;
                    }
                    let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                    let z: f64 = e.iter().sum();
                    let mut o = vec![0f64; d];
                    for (j, ej) in e.iter().enumerate() {
                        if *ej == 0.0 {
                            continue;
                        }
                        let vv = &c.v[at(c.v_rows, b, hk, j)..][..d];
                        for (ox, vx) in o.iter_mut().zip(vv) {
                            *ox += ej / z * *vx as f64;
                        }
                    }
                    let dst = &mut out[((b * dm.q_len + t) * dm.q_heads + h) * d..][..d];
                    for (dx, ox) in dst.iter_mut().zip(&o) {
                        *dx = *ox as f32;
                    }
                }
            }
        }
        Ok(out)
    }
}

/// One range of a [`MethodPlan`].
#[derive(Debug, Clone)]
pub struct ViewPlan {
    /// Rotation tables of the queries and keys at this range's positions
    /// (batch 1).
    pub tables: RotationTables,
    /// First key of the range, per query.
    pub lo: Vec<usize>,
    /// One past the last key of the range, per query (`lo == hi`: none).
    pub hi: Vec<usize>,
}

/// A method as data ([`MethodAttention::plan`]).
#[derive(Debug, Clone)]
pub struct MethodPlan {
    /// The ranges.
    pub views: Vec<ViewPlan>,
    /// Factor of each query before rotation.
    pub query_scale: Vec<f32>,
    /// Factor of every logit besides the `1/√D` scale.
    pub logit_scale: f64,
}

fn to_u32(p: usize) -> Result<u32> {
    u32::try_from(p)
        .map_err(|_| Error::invalid("attention method", format!("position {p} exceeds u32")))
}

fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    if !matches!(t.device(), Device::Cpu) || t.dtype() != DType::F32 {
        return Err(Error::DType {
            what: "context methods run on f32 CPU tensors",
            dtype: format!("{:?} on {:?}", t.dtype(), t.device()),
        });
    }
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}
