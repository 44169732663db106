//! RoPE and attention on caller-owned buffers: the fused kernels of
//! [`crate::kernels`] reading and writing memory that another framework
//! owns (a numpy array, a PyTorch tensor), with no candle tensor and no
//! copy of the activations.
//!
//! Every buffer is contiguous `(B, H, T, D)` (the layout of
//! `torch.nn.functional.scaled_dot_product_attention`). Positions are
//! explicit ([`BufferPositions`]): keys at `offset..offset + T_k`, or one
//! row of position ids per batch entry; the `T_q` queries are at the last
//! `T_q` key positions (bottom-right aligned, as the causal mask).
//!
//! The tables (cos and sin with any attention factor, dynamic frequencies
//! for the call's length) are those [`Rope`] builds for its candle ops, so
//! these functions compute exactly what [`Rope::apply`] and
//! [`crate::tensor::attention::Attention`] compute on the same values.
//!
//! ```
//! use posenc::buffers::{AttentionShape, BufferAttention, BufferPositions};
//! use posenc::rope::{PairLayout, RopeFrequencies};
//! use posenc::tensor::rope::Rope;
//!
//! let rope = Rope::new(RopeFrequencies::plain(10_000.0, 8, PairLayout::HalfSplit)?)?;
//! let shape = AttentionShape { batch: 1, q_heads: 2, kv_heads: 1, q_len: 5, k_len: 5, head_dim: 8 };
//! let q: Vec<f32> = (0..80).map(|i| (i as f32 * 0.37).sin()).collect();
//! let k: Vec<f32> = (0..40).map(|i| (i as f32 * 0.11).cos()).collect();
//! let v = k.clone();
//! let (mut out, mut lse) = (vec![0f32; 80], vec![0f32; 10]);
//! let attn = BufferAttention { causal: true, scale: None, rope: Some(&rope), alibi: None };
//! attn.forward(&q, &k, &v, shape, BufferPositions::Offset(0), &mut out, &mut lse)?;
//! assert!(out.iter().all(|x| x.is_finite()));
//! # Ok::<(), posenc::Error>(())
//! ```

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
use crate::extend::{ContextMethod, ModelLengths};
use crate::kernels::attention::{self as k, Products};
use crate::kernels::rope::{Element, HeadLayout, RopeGeometry};
use crate::kernels::SimdLevel;
use crate::relative::AlibiMode;
use crate::tensor::extend::MethodAttention;
use crate::tensor::rope::{Rope, RotationTables};
use crate::tensor::Positions;

/// Largest number of elements of one buffer (2^40).
pub const MAX_ELEMENTS: usize = 1 << 40;

/// Positions of the keys of one call; the queries are at the last `T_q`.
#[derive(Debug, Clone, Copy)]
pub enum BufferPositions<'a> {
    /// Key `j` of every batch entry at `offset + j` (the last at most
    /// `i64::MAX`: [`Error::PositionOutOfRange`] past it).
    Offset(usize),
    /// Key `j` of batch entry `b` at `ids[b·T_k + j]` (non-negative).
    Ids(&'a [i64]),
}

/// Sizes of an attention call on `(B, H, T, D)` buffers: the kernels'
/// [`k::Dims`], with `T_q` at most `T_k` ([`check`](k::Dims::check)).
pub type AttentionShape = k::Dims;

impl k::Dims {
    /// Checks every size and that they group.
    ///
    /// # Errors
    /// [`Error::Shape`] for zero sizes, heads that do not group, more
    /// queries than keys, or a buffer past [`MAX_ELEMENTS`].
    pub fn check(&self) -> Result<()> {
        let s = *self;
        let bad = |why: &str| Error::Shape {
            what: "attention",
            expected: why.to_string(),
            got: format!(
                "q (B={}, H={}, T={}, D={}), k/v (H={}, T={})",
                s.batch, s.q_heads, s.q_len, s.head_dim, s.kv_heads, s.k_len
            ),
        };
        if [s.batch, s.q_heads, s.kv_heads, s.q_len, s.k_len, s.head_dim].contains(&0) {
            return Err(bad("non-zero sizes"));
        }
        if !s.q_heads.is_multiple_of(s.kv_heads) {
            return Err(bad("key/value heads dividing the query heads"));
        }
        if s.q_len > s.k_len {
            return Err(bad("at most as many queries as keys (T_q ≤ T_k)"));
        }
        for (h, t) in [(s.q_heads, s.q_len), (s.kv_heads, s.k_len)] {
            let n = s
                .batch
                .checked_mul(h)
                .and_then(|x| x.checked_mul(t))
                .and_then(|x| x.checked_mul(s.head_dim));
            if n.is_none_or(|n| n > MAX_ELEMENTS) {
                return Err(bad("at most 2^40 elements per buffer"));
            }
        }
        Ok(())
    }

    /// Elements of the query (and output) buffer.
    pub fn q_elements(&self) -> usize {
        self.batch * self.q_heads * self.q_len * self.head_dim
    }

    /// Elements of the key (and value) buffer.
    pub fn kv_elements(&self) -> usize {
        self.batch * self.kv_heads * self.k_len * self.head_dim
    }

    /// Elements of the log-sum-exp buffer `(B, H_q, T_q)`.
    pub fn lse_elements(&self) -> usize {
        self.batch * self.q_heads * self.q_len
    }
}

fn check_len(what: &'static str, got: usize, need: usize) -> Result<()> {
    crate::error::check_count(what, need, got, "elements")
}

/// The `(B, T)` position-id tensors of the keys and of the last `q_len`
/// of them (the queries), checked non-negative.
fn id_tensors(ids: &[i64], batch: usize, q_len: usize, k_len: usize) -> Result<(Tensor, Tensor)> {
    check_len("position ids", ids.len(), batch * k_len)?;
    if let Some(&p) = ids.iter().find(|&&p| p < 0) {
        return Err(Error::NegativePosition(p));
    }
    let q: Vec<i64> = (0..batch)
        .flat_map(|b| {
            ids[b * k_len + k_len - q_len..(b + 1) * k_len]
                .iter()
                .copied()
        })
        .collect();
    let kt = Tensor::from_slice(ids, (batch, k_len), &Device::Cpu)?;
    let qt = Tensor::from_vec(q, (batch, q_len), &Device::Cpu)?;
    Ok((qt, kt))
}

/// Checks that keys `o .. o + k_len` are positions an `i64` holds: the
/// kernels take positions as `i64` (the relative biases subtract them).
fn check_offset(o: usize, k_len: usize) -> Result<()> {
    let limit = i64::MAX as u64 + 1;
    match (o as u64).checked_add(k_len as u64) {
        Some(end) if end <= limit => Ok(()),
        _ => Err(Error::PositionOutOfRange {
            position: (o as u64).saturating_add(k_len as u64 - 1),
            limit,
            what: "a position id (an i64)",
        }),
    }
}

/// The rotation tables of queries and keys at `pos` (see the module docs).
///
/// # Errors
/// As [`Rope::attention_tables`]; [`Error::Shape`] for ids of another
/// length than `batch · k_len`.
pub fn rotation_tables(
    rope: &Rope,
    pos: BufferPositions<'_>,
    batch: usize,
    q_len: usize,
    k_len: usize,
) -> Result<RotationTables> {
    match pos {
        BufferPositions::Offset(o) => {
            check_offset(o, k_len)?;
            let (q, k) = (Positions::Offset(o + (k_len - q_len)), Positions::Offset(o));
            rope.attention_tables(q, k, batch, q_len, k_len)
        }
        BufferPositions::Ids(ids) => {
            let (qt, kt) = id_tensors(ids, batch, q_len, k_len)?;
            rope.attention_tables_at_ids(&qt, &kt)
        }
    }
}

/// Rotates `x` (`(B, H, T, D)` contiguous) into `out` with `rope` at `pos`
/// (`T_q = T_k = T`); `key` picks the key tables (they differ only with
/// xPos); `inverse` applies the transpose (the backward pass).
///
/// # Errors
/// [`Error::Shape`] / [`Error::InvalidDimension`] for buffers that do not
/// hold `dims`, the rope's errors for the positions.
pub fn rope_apply<T: Element>(
    rope: &Rope,
    x: &[T],
    out: &mut [T],
    dims: [usize; 4],
    pos: BufferPositions<'_>,
    key: bool,
    inverse: bool,
) -> Result<()> {
    let [b, _, t, _] = dims;
    let freqs = rope.frequencies();
    let g = RopeGeometry::from_dims(dims, HeadLayout::Bhtd, freqs.rotary_dim, freqs.layout);
    g.check()?;
    if g.len() > MAX_ELEMENTS {
        return Err(Error::invalid("rope buffer", "more than 2^40 elements"));
    }
    check_len("rope input", x.len(), g.len())?;
    check_len("rope output", out.len(), g.len())?;
    let tables = rotation_tables(rope, pos, b, t, t)?;
    let (tab, rows) = if key {
        (tables.tables.key(), tables.k_rows.map())
    } else {
        (tables.tables.query(), tables.q_rows.map())
    };
    let call = crate::kernels::rope::RopeCall {
        g: &g,
        tables: tab,
        rows,
        inverse,
    };
    crate::kernels::rope::rope_out(rope.simd_level(), x, out, call)
}

/// Fused attention on `(B, H, T, D)` buffers with optional RoPE inside and
/// an ALiBi bias: [`crate::kernels::attention`]'s forward and backward.
#[derive(Debug, Clone, Copy)]
pub struct BufferAttention<'a> {
    /// Hide keys after each query (bottom-right aligned).
    pub causal: bool,
    /// Multiplies `q·k` (default `1/√D`).
    pub scale: Option<f64>,
    /// Queries and keys rotated inside at their positions.
    pub rope: Option<&'a Rope>,
    /// ALiBi slopes, one per query head (`m·r` causal, `−m·|r|` otherwise).
    pub alibi: Option<&'a [f32]>,
}

impl BufferAttention<'_> {
    fn check(&self, s: &AttentionShape) -> Result<f32> {
        s.check()?;
        if let Some(sl) = self.alibi {
            check_len("ALiBi slopes", sl.len(), s.q_heads)?;
            if sl.iter().any(|m| !m.is_finite()) {
                return Err(Error::NotFinite {
                    name: "ALiBi slope",
                    value: f64::NAN,
                });
            }
        }
        if let Some(r) = self.rope {
            if r.rotary_dim() > s.head_dim {
                return Err(Error::InvalidDimension {
                    what: "rotary_dim",
                    value: r.rotary_dim(),
                    reason: "must be at most head_dim",
                });
            }
        }
        let scale = self.scale.unwrap_or(1.0 / (s.head_dim as f64).sqrt());
        if !scale.is_finite() {
            return Err(Error::NotFinite {
                name: "attention scale",
                value: scale,
            });
        }
        Ok(scale as f32)
    }

    fn with_problem<R>(
        &self,
        [q, kk, v]: [&[f32]; 3],
        s: AttentionShape,
        pos: BufferPositions<'_>,
        f: impl FnOnce(&k::Problem) -> R,
    ) -> Result<R> {
        let scale = self.check(&s)?;
        if let BufferPositions::Offset(o) = pos {
            check_offset(o, s.k_len)?;
        }
        check_len("queries", q.len(), s.q_elements())?;
        check_len("keys", kk.len(), s.kv_elements())?;
        check_len("values", v.len(), s.kv_elements())?;
        let tables = match self.rope {
            Some(r) => Some(rotation_tables(r, pos, s.batch, s.q_len, s.k_len)?),
            None => None,
        };
        let rotation = tables.as_ref().map(RotationTables::rotation);
        // Relative positions for ALiBi: ids (queries: the last T_q of each row).
        let q_ids: Vec<i64>;
        let (q_pos, k_pos) = match pos {
            BufferPositions::Offset(o) => (
                k::Pos::Offset((o + s.k_len - s.q_len) as i64),
                k::Pos::Offset(o as i64),
            ),
            BufferPositions::Ids(ids) => {
                check_len("position ids", ids.len(), s.batch * s.k_len)?;
                q_ids = (0..s.batch)
                    .flat_map(|b| ids[b * s.k_len + s.k_len - s.q_len..(b + 1) * s.k_len].to_vec())
                    .collect();
                (k::Pos::Ids(&q_ids), k::Pos::Ids(ids))
            }
        };
        let prob = k::Problem {
            dims: s,
            scale,
            causal: self.causal,
            q,
            q_rows: k::Rows::bhtd(s.q_heads, s.q_len, s.head_dim),
            k: kk,
            k_rows: k::Rows::bhtd(s.kv_heads, s.k_len, s.head_dim),
            v,
            v_rows: k::Rows::bhtd(s.kv_heads, s.k_len, s.head_dim),
            rotation,
            q_pos,
            k_pos,
            alibi: self.alibi.map(|slopes| k::AlibiBias {
                slopes,
                symmetric: !self.causal,
            }),
            scalar: None,
            vector: None,
            dense: None,
            cumulative: None,
            products: Products::F32,
            window: None,
        };
        Ok(f(&prob))
    }

    /// Writes the output `(B, H_q, T_q, D)` and the log-sum-exp of each
    /// row `(B, H_q, T_q)` (what [`backward`](Self::backward) reads).
    ///
    /// # Errors
    /// [`Error::Shape`] for buffers that do not hold `s`,
    /// [`Error::PositionOutOfRange`] for an offset whose last key is past
    /// `i64::MAX`, the rope's errors.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        q: &[f32],
        kk: &[f32],
        v: &[f32],
        s: AttentionShape,
        pos: BufferPositions<'_>,
        out: &mut [f32],
        lse: &mut [f32],
    ) -> Result<()> {
        self.forward_into([q, kk, v], s, pos, out, lse, None)
    }

    /// [`forward`](Self::forward), or with `kept`
    /// [`forward_keeping`](Self::forward_keeping).
    fn forward_into(
        &self,
        qkv: [&[f32]; 3],
        s: AttentionShape,
        pos: BufferPositions<'_>,
        out: &mut [f32],
        lse: &mut [f32],
        kept: Option<&mut [f32]>,
    ) -> Result<()> {
        check_len("output", out.len(), s.q_elements())?;
        check_len("log-sum-exp", lse.len(), s.lse_elements())?;
        if let Some(kept) = &kept {
            check_len("kept logits", kept.len(), self.kept_logits_len(s)?)?;
        }
        let level = SimdLevel::detect();
        self.with_problem(qkv, s, pos, |p| {
            let rows = k::Rows::bhtd(s.q_heads, s.q_len, s.head_dim);
            match kept {
                Some(kept) => k::forward_keeping(p, out, rows, lse, kept, level),
                None => k::forward(p, out, rows, lse, level),
            }
        })
    }

    /// Floats of the logits [`forward_keeping`](Self::forward_keeping)
    /// keeps for a call of sizes `s` (saturating at `usize::MAX`): about
    /// `B·H_q·T_q·T_k`, half that with the causal mask.
    ///
    /// # Errors
    /// As [`forward`](Self::forward), for the sizes.
    pub fn kept_logits_len(&self, s: AttentionShape) -> Result<usize> {
        s.check()?;
        Ok(k::KeptLogits::masked(s, self.causal).floats())
    }

    /// [`forward`](Self::forward) (the same bits), keeping every logit in
    /// `kept` ([`kept_logits_len`](Self::kept_logits_len) floats) for
    /// [`backward`](Self::backward), which then skips one of its five
    /// products.
    ///
    /// # Errors
    /// As [`forward`](Self::forward); [`Error::Shape`] for a short `kept`.
    pub fn forward_keeping(
        &self,
        qkv: [&[f32]; 3],
        s: AttentionShape,
        pos: BufferPositions<'_>,
        [out, lse]: [&mut [f32]; 2],
        kept: &mut [f32],
    ) -> Result<()> {
        self.forward_into(qkv, s, pos, out, lse, Some(kept))
    }

    /// The gradients of queries, keys and values from the forward's output
    /// `o`, its log-sum-exp, the output's gradient `d_o` and, where
    /// [`forward_keeping`](Self::forward_keeping) kept them for the same
    /// inputs, the logits.
    ///
    /// # Errors
    /// As [`forward`](Self::forward); [`Error::Shape`] for a short `kept`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        [q, kk, v]: [&[f32]; 3],
        o: &[f32],
        lse: &[f32],
        kept: Option<&[f32]>,
        d_o: &[f32],
        s: AttentionShape,
        pos: BufferPositions<'_>,
        [dq, dk, dv]: [&mut [f32]; 3],
    ) -> Result<()> {
        check_len("output", o.len(), s.q_elements())?;
        check_len("output gradient", d_o.len(), s.q_elements())?;
        check_len("log-sum-exp", lse.len(), s.lse_elements())?;
        if let Some(kept) = kept {
            check_len("kept logits", kept.len(), self.kept_logits_len(s)?)?;
        }
        check_len("query gradient", dq.len(), s.q_elements())?;
        check_len("key gradient", dk.len(), s.kv_elements())?;
        check_len("value gradient", dv.len(), s.kv_elements())?;
        let level = SimdLevel::detect();
        let qr = k::Rows::bhtd(s.q_heads, s.q_len, s.head_dim);
        let kr = k::Rows::bhtd(s.kv_heads, s.k_len, s.head_dim);
        self.with_problem([q, kk, v], s, pos, |p| {
            let g = k::Grads::qkv(
                (dq.as_mut_ptr(), qr),
                (dk.as_mut_ptr(), kr),
                (dv.as_mut_ptr(), kr),
            );
            k::backward(p, o, qr, d_o, qr, lse, kept, g, level)
        })
    }
}

/// Bytes of kept-logit buffers, live and idle together, beyond which a
/// dropped one is freed rather than kept for reuse (256 MiB). A fresh
/// buffer's pages fault in on first touch: 71 MB at `(1, 8, 2048, 64)`,
/// causal, cost about 20 ms, against the 7 ms the kept logits save the
/// backward pass.
pub const KEPT_POOL_BYTES: usize = 256 << 20;

/// The kept-logit buffers: the idle ones, and the bytes of the live ones.
struct KeptPool {
    idle: Vec<Vec<f32>>,
    live: usize,
}

static KEPT_POOL: std::sync::Mutex<KeptPool> = std::sync::Mutex::new(KeptPool {
    idle: Vec::new(),
    live: 0,
});

impl KeptPool {
    fn idle_bytes(&self) -> usize {
        self.idle.iter().map(bytes_of).sum()
    }
}

/// Bytes a buffer holds.
fn bytes_of(v: &Vec<f32>) -> usize {
    v.capacity() * std::mem::size_of::<f32>()
}

/// A buffer for the logits [`BufferAttention::forward_keeping`] keeps,
/// drawn from a pool of idle ones and given back to it when dropped (while
/// live and idle buffers take at most [`KEPT_POOL_BYTES`]; past that,
/// freed).
#[derive(Debug)]
pub struct KeptBuffer(Vec<f32>);

impl KeptBuffer {
    /// A buffer of `floats` floats (contents unspecified), where the live
    /// buffers, this one included, then hold at most `budget` bytes; else
    /// `None`. The smallest idle buffer that holds them, else a new one.
    pub fn take(floats: usize, budget: usize) -> Option<KeptBuffer> {
        let need = floats.checked_mul(std::mem::size_of::<f32>())?;
        let mut v = {
            let mut pool = KEPT_POOL.lock().ok()?;
            let room = budget.saturating_sub(pool.live);
            let best = (0..pool.idle.len())
                .filter(|&i| pool.idle[i].capacity() >= floats && bytes_of(&pool.idle[i]) <= room)
                .min_by_key(|&i| pool.idle[i].capacity());
            let v = match best {
                Some(i) => pool.idle.swap_remove(i),
                None if need > room => return None,
                // Reserved, not touched: its pages fault in below.
                None => crate::kernels::mem::with_capacity_huge(floats),
            };
            pool.live += bytes_of(&v);
            v
        };
        v.resize(floats, 0.0);
        Some(KeptBuffer(v))
    }

    /// The floats.
    pub fn as_slice(&self) -> &[f32] {
        &self.0
    }

    /// The floats, to write.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.0
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        bytes_of(&self.0)
    }

    /// Bytes of the live buffers and of the idle ones the pool holds now.
    pub fn pool_bytes() -> (usize, usize) {
        KEPT_POOL
            .lock()
            .map_or((0, 0), |pool| (pool.live, pool.idle_bytes()))
    }
}

impl Drop for KeptBuffer {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        let bytes = bytes_of(&v);
        if let Ok(mut pool) = KEPT_POOL.lock() {
            pool.live = pool.live.saturating_sub(bytes);
            if pool.live + pool.idle_bytes() + bytes <= KEPT_POOL_BYTES {
                pool.idle.push(v);
            }
        }
    }
}

/// ALiBi's slopes for `heads` heads as `f32` (Press et al.).
///
/// # Errors
/// [`Error::ZeroHeads`].
pub fn alibi_slopes_f32(heads: usize) -> Result<Vec<f32>> {
    Ok(crate::relative::alibi_slopes(heads)?
        .into_iter()
        .map(|m| m as f32)
        .collect())
}

/// The ALiBi mode [`BufferAttention`] uses for `causal`.
pub fn alibi_mode(causal: bool) -> AlibiMode {
    if causal {
        AlibiMode::Causal
    } else {
        AlibiMode::Bidirectional
    }
}

/// The layout of an attention output buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutLayout {
    /// `(B, H_q, T_q, D)` row-major, as the queries.
    Bhtd,
    /// `(B, T_q, H_q, D)` row-major: the layout a transformers layer
    /// projects from, so that it needs no transpose.
    Bthd,
}

/// A training-free context method ([`crate::extend`]) on `(B, H, T, D)`
/// buffers: causal, keys at `0..T_k`, queries at the last `T_q`; writes the
/// output laid out as `layout`. Forward only.
///
/// # Errors
/// As [`MethodAttention::forward`], and [`Error::Shape`] for buffers that
/// do not hold `s`.
#[allow(clippy::too_many_arguments)]
pub fn method_forward(
    method: ContextMethod,
    rope: &Rope,
    lengths: ModelLengths,
    q: &[f32],
    kk: &[f32],
    v: &[f32],
    s: AttentionShape,
    out: &mut [f32],
    layout: OutLayout,
) -> Result<()> {
    s.check()?;
    check_len("queries", q.len(), s.q_elements())?;
    check_len("keys", kk.len(), s.kv_elements())?;
    check_len("values", v.len(), s.kv_elements())?;
    check_len("output", out.len(), s.q_elements())?;
    let attn = MethodAttention::new(method, rope, lengths)?;
    let (h, t, d) = (s.q_heads, s.q_len, s.head_dim);
    let rows = match layout {
        OutLayout::Bhtd => k::Rows::bhtd(h, t, d),
        OutLayout::Bthd => k::Rows::bthd(h, t, d),
    };
    attn.forward_buffers_into(q, kk, v, s, out, rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rope::{PairLayout, RopeFrequencies};

    /// An offset whose last key is past `i64::MAX` (from Python: any int
    /// below 2^64) is refused, with ALiBi (positions as `i64`) and with a
    /// rope; the last key at `i64::MAX` itself is served.
    #[test]
    fn offsets_past_i64_are_refused_before_any_kernel() {
        let rope =
            Rope::new(RopeFrequencies::plain(10_000.0, 8, PairLayout::HalfSplit).unwrap()).unwrap();
        let slopes = [0.5f32, 0.25];
        let shape = AttentionShape {
            batch: 1,
            q_heads: 2,
            kv_heads: 1,
            q_len: 3,
            k_len: 3,
            head_dim: 8,
        };
        let q = vec![0.1f32; 48];
        let kv = vec![0.2f32; 24];
        let (mut out, mut lse) = (vec![0f32; 48], vec![0f32; 6]);
        let last_ok = i64::MAX as usize - 2;
        for attn in [
            BufferAttention {
                causal: true,
                scale: None,
                rope: None,
                alibi: Some(&slopes),
            },
            BufferAttention {
                causal: true,
                scale: None,
                rope: Some(&rope),
                alibi: None,
            },
        ] {
            for o in [last_ok + 1, usize::MAX - 1, usize::MAX] {
                let e = attn
                    .forward(
                        &q,
                        &kv,
                        &kv,
                        shape,
                        BufferPositions::Offset(o),
                        &mut out,
                        &mut lse,
                    )
                    .unwrap_err();
                assert!(matches!(e, Error::PositionOutOfRange { .. }), "{e}");
                assert!(e.to_string().contains("an i64"), "{e}");
            }
        }
        let alibi_only = BufferAttention {
            causal: true,
            scale: None,
            rope: None,
            alibi: Some(&slopes),
        };
        alibi_only
            .forward(
                &q,
                &kv,
                &kv,
                shape,
                BufferPositions::Offset(last_ok),
                &mut out,
                &mut lse,
            )
            .unwrap();
        assert!(out.iter().all(|x| x.is_finite()));
    }

    /// Kept logits through the buffer API: the same output and gradients
    /// bit for bit (RoPE, per-row position ids, grouped heads); a kept
    /// buffer of the wrong length is a shape error, before any kernel.
    #[test]
    fn kept_logits_on_buffers() {
        let rope =
            Rope::new(RopeFrequencies::plain(10_000.0, 8, PairLayout::HalfSplit).unwrap()).unwrap();
        let s = AttentionShape::new(2, 4, 2, 40, 50, 8);
        let fill = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin()).collect::<Vec<f32>>();
        let (q, kk, v, d_o) = (
            fill(s.q_elements(), 0.37),
            fill(s.kv_elements(), 0.11),
            fill(s.kv_elements(), 0.23),
            fill(s.q_elements(), 0.05),
        );
        let ids: Vec<i64> = (0..2 * 50).map(|i| (i % 50) * 2 + i / 50).collect();
        let pos = BufferPositions::Ids(&ids);
        let attn = BufferAttention {
            causal: true,
            scale: None,
            rope: Some(&rope),
            alibi: None,
        };
        let run = |kept: Option<&mut Vec<f32>>| {
            let (mut out, mut lse) = (vec![0f32; s.q_elements()], vec![0f32; s.lse_elements()]);
            let mut kept = kept;
            match kept.as_deref_mut() {
                Some(k) => attn.forward_keeping([&q, &kk, &v], s, pos, [&mut out, &mut lse], k),
                None => attn.forward(&q, &kk, &v, s, pos, &mut out, &mut lse),
            }
            .unwrap();
            let mut g = [s.q_elements(), s.kv_elements(), s.kv_elements()].map(|n| vec![0f32; n]);
            let [dq, dk, dv] = &mut g;
            let kept = kept.as_deref().map(|k| &k[..]);
            attn.backward([&q, &kk, &v], &out, &lse, kept, &d_o, s, pos, [dq, dk, dv])
                .unwrap();
            (out, g)
        };
        let mut kept = vec![f32::NAN; attn.kept_logits_len(s).unwrap()];
        assert_eq!(run(Some(&mut kept)), run(None));
        let (mut out, mut lse) = (vec![0f32; s.q_elements()], vec![0f32; s.lse_elements()]);
        let mut short = vec![0f32; kept.len() - 1];
        let e = attn
            .forward_keeping([&q, &kk, &v], s, pos, [&mut out, &mut lse], &mut short)
            .unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
        let mut g = [s.q_elements(), s.kv_elements(), s.kv_elements()].map(|n| vec![0f32; n]);
        let [dq, dk, dv] = &mut g;
        let e = attn
            .backward(
                [&q, &kk, &v],
                &out,
                &lse,
                Some(&short),
                &d_o,
                s,
                pos,
                [dq, dk, dv],
            )
            .unwrap_err();
        assert!(e.to_string().contains("kept logits"), "{e}");
    }

    /// The pool holds a buffer from its take to its drop within the budget,
    /// and a dropped one is reused.
    #[test]
    fn kept_buffers_stay_within_their_budget() {
        // The only test of this crate that takes from the pool.
        let a = KeptBuffer::take(1000, usize::MAX).unwrap();
        assert_eq!(a.as_slice().len(), 1000);
        assert_eq!(KeptBuffer::pool_bytes(), (a.bytes(), 0));
        assert!(KeptBuffer::take(1000, a.bytes() + 3999).is_none());
        let ptr = a.as_slice().as_ptr();
        drop(a);
        let (live, idle) = KeptBuffer::pool_bytes();
        assert_eq!(live, 0);
        assert!(idle >= 4000);
        // The smallest idle buffer that holds 900 floats: the one dropped.
        let b = KeptBuffer::take(900, usize::MAX).unwrap();
        assert_eq!(b.as_slice().len(), 900);
        assert_eq!(ptr, b.as_slice().as_ptr());
        assert_eq!(KeptBuffer::pool_bytes(), (b.bytes(), 0));
        assert!(KeptBuffer::take(usize::MAX, usize::MAX).is_none());
    }
}
