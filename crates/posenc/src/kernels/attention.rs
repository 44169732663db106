//! Fused scaled-dot-product attention on the CPU, forward and backward, with
//! the positional hooks inside: rotary queries and keys, additive logits
//! biases (ALiBi, bucketed tables such as T5's, Shaw et al.'s relative keys,
//! a dense bias, a cumulative forget-gate bias) and Shaw et al.'s relative
//! values.
//!
//! For query `i` and key `j` of one head, with `r = pos_k(j) − pos_q(i)`:
//!
//! ```text
//! q̃_i = R(pos_q(i))·q_i · scale          k̃_j = R(pos_k(j))·k_j   (R: RoPE/xPos, or 1)
//! s_ij = q̃_i·k̃_j + q̃_i·a^K[idx(r)]     (Shaw keys)
//!      + m_h·r  or  −m_h·|r|              (ALiBi, causal / symmetric)
//!      + table[idx(r), h]                (bucketed scalar table, e.g. T5)
//!      + dense[b, h, i, j]               (any bias tensor)
//!      + c_q[b, h, i] − c_k[b, h, j]     (cumulative, e.g. forget gates)
//! s_ij = −∞ where j > i + (T_k − T_q)    (causal, bottom-right aligned)
//! p_ij = softmax_j(s_ij)
//! o_i  = Σ_j p_ij·(v_j + a^V[idx(r)])    (Shaw values)
//! ```
//!
//! The forward pass streams over key tiles with an online softmax
//! (FlashAttention, Dao et al. 2022): no `(T_q × T_k)` matrix is kept, only
//! the output and the log-sum-exp of each row. The backward pass recomputes
//! the probabilities tile by tile from that log-sum-exp (FlashAttention-2's
//! order: key tiles outside, query tiles inside) and writes the gradients of
//! queries, keys, values and every bias parameter.
//!
//! Threads: the forward pass splits over (batch, query head, query tile), the
//! backward pass over (batch, key/value head); every output element is
//! computed by one task in a fixed order, and partial sums of shared
//! parameters (tables) are added in task order, so results do not depend on
//! the number of threads. Work below a small threshold runs on the calling
//! thread. [`reference_forward`] is the plain `f64` triple loop the kernel is
//! tested against.

use rayon::prelude::*;

use super::rope::{RopeTables, RowMap};
use super::tile;
use super::SimdLevel;
use crate::extend::KeyRange;
use crate::rope::PairLayout;

/// Queries per forward tile on short sequences. A causal tile computes its
/// key range up to its last query's keys: with 32 rows, a 128-token causal
/// head computes 10,240 of the logits matrix's entries (8,256 visible) where
/// 64 rows computed 12,288. The hidden entries only ever added exact zeros,
/// so the results keep their bits (a lab training run writes the same
/// checkpoint with either).
const BQ: usize = 32;
/// Queries per tile of the backward pass (9,216 of the 128-token head's
/// entries; its five products per tile, against the forward's two, make
/// the smaller tile pay there). Same bits, for the same reason.
const BQ_BWD: usize = 16;
/// Keys per tile.
const BK: usize = 128;
/// Keys per tile of the forward pass on long sequences (more than
/// [`LONG_KEYS`] keys). Short sequences (every lab model) keep [`BK`], so
/// their results do not change.
///
/// With AVX-512 the long tiles' products run on posenc's tile kernel: 512
/// keys and 96 queries ran one layer of SmolLM2's attention (9 query heads,
/// 3 key/value heads, head_dim 64, 2 threads, AMD EPYC Zen 4) at 4,096
/// tokens in 116 ms, against 119 ms with 256 keys and 125–128 ms with the
/// `gemm` crate's products on 256-key tiles; at 16,384 tokens in
/// 1,983–2,282 ms against 2,070–2,143 ms with the `gemm` crate, the same
/// within this machine's spread (`cargo run --release -p posenc-models
/// --example attention_time -- 4096 3`, `-- 16384 2`). At lower levels they
/// run on the `gemm` crate, which beat the AVX2 tile kernel on an AVX2-only
/// CPU; larger tiles amortise the crate's packing.
const BK_LONG: usize = 512;
/// Queries per tile of the forward pass on long sequences (96 and 64 ran
/// within 1% of each other at 4,096 tokens with 512 keys; 128 was 3%
/// slower). Each row's softmax runs over the same key tiles for any value.
const BQ_LONG: usize = 96;
/// Keys beyond which the forward pass takes the long-sequence tiles.
const LONG_KEYS: usize = 1024;

/// Queries per forward tile for `k_len` keys.
#[inline(always)]
fn query_tile(k_len: usize) -> usize {
    if k_len > LONG_KEYS {
        BQ_LONG
    } else {
        BQ
    }
}

/// Keys per forward tile for `k_len` keys.
#[inline(always)]
fn key_tile(k_len: usize) -> usize {
    if k_len > LONG_KEYS {
        BK_LONG
    } else {
        BK
    }
}
/// Multiply-adds below which a pass runs on the calling thread.
const PARALLEL_WORK: usize = 1 << 17;

/// Where the vectors of a `(B, H, T, D)`-shaped buffer are: element
/// `(b, h, t, d)` is at `offset + b·sb + h·sh + t·st + d` (the last axis is
/// contiguous; any other strides, so `(B, T, H, D)` buffers and heads packed
/// side by side in one projection output are read in place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    /// Index of element `(0, 0, 0, 0)`.
    pub offset: usize,
    /// Stride of the batch axis.
    pub sb: usize,
    /// Stride of the head axis.
    pub sh: usize,
    /// Stride of the time axis.
    pub st: usize,
}

impl Rows {
    /// Contiguous `(B, H, T, D)`.
    pub fn bhtd(heads: usize, len: usize, dim: usize) -> Rows {
        Rows {
            offset: 0,
            sb: heads * len * dim,
            sh: len * dim,
            st: dim,
        }
    }

    /// Contiguous `(B, T, H, D)`.
    pub fn bthd(heads: usize, len: usize, dim: usize) -> Rows {
        Rows {
            offset: 0,
            sb: len * heads * dim,
            sh: dim,
            st: heads * dim,
        }
    }

    #[inline(always)]
    fn at(&self, b: usize, h: usize, t: usize) -> usize {
        self.offset + b * self.sb + h * self.sh + t * self.st
    }

    /// The largest index touched by a `(b, h, t, d)` buffer of these sizes, plus one.
    pub fn extent(&self, batch: usize, heads: usize, len: usize, dim: usize) -> usize {
        if batch == 0 || heads == 0 || len == 0 || dim == 0 {
            return 0;
        }
        self.at(batch - 1, heads - 1, len - 1) + dim
    }
}

/// Sizes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Batch size `B`.
    pub batch: usize,
    /// Query heads `H_q`.
    pub q_heads: usize,
    /// Key/value heads `H_k` (divides `H_q`: grouped-query attention).
    pub kv_heads: usize,
    /// Queries `T_q`.
    pub q_len: usize,
    /// Keys `T_k`.
    pub k_len: usize,
    /// Head dimension `D` (queries, keys and values).
    pub head_dim: usize,
}

/// Positions of the time steps, for the relative biases.
#[derive(Debug, Clone, Copy)]
pub enum Pos<'a> {
    /// Step `t` is at `offset + t` in every batch entry.
    Offset(i64),
    /// Step `t` of batch entry `b` is at `ids[b·T + t]`.
    Ids(&'a [i64]),
}

impl Pos<'_> {
    #[inline(always)]
    fn at(&self, b: usize, t: usize, len: usize) -> i64 {
        match *self {
            Pos::Offset(o) => o + t as i64,
            Pos::Ids(ids) => ids[b * len + t],
        }
    }
}

/// Rotary queries and keys: pair `p` of the first `rotary_dim` entries of a
/// vector at time step `(b, t)` is rotated with row `rows.row(b, t)` of the
/// tables (cos and sin already carry any attention or xPos factor; keys have
/// their own tables with xPos).
#[derive(Debug, Clone, Copy)]
pub struct Rotation<'a> {
    /// Rotated entries (even, at most `head_dim`).
    pub rotary_dim: usize,
    /// Which entries form a pair.
    pub pairs: PairLayout,
    /// Query tables.
    pub q: RopeTables<'a>,
    /// Key tables.
    pub k: RopeTables<'a>,
    /// Table row of each query step.
    pub q_rows: RowMap<'a>,
    /// Table row of each key step.
    pub k_rows: RowMap<'a>,
}

impl Rotation<'_> {
    /// Writes `scale·R·src` (`scale·Rᵀ·src` with `inverse`) into `dst`, the
    /// rotation of row `row` of the query (`query`) or key tables.
    #[inline(always)]
    fn row(
        &self,
        query: bool,
        row: usize,
        src: &[f32],
        dst: &mut [f32],
        inverse: bool,
        scale: f32,
    ) {
        let t = if query { &self.q } else { &self.k };
        let nf = t.n_freq;
        rotate_row(
            src,
            dst,
            &t.cos[row * nf..][..nf],
            &t.sin[row * nf..][..nf],
            self.rotary_dim,
            self.pairs,
            inverse,
            scale,
        );
    }
}

/// A map from relative distance `r` to a table row that saturates: rows of
/// `clamp(r, −r_max, r_max)` (T5 buckets past `max_distance`, Shaw's
/// clipping at `k`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelIndex {
    r_max: i64,
    rows: Vec<u32>,
    n: usize,
}

impl RelIndex {
    /// The map `r ↦ f(r)` for `|r| ≤ r_max`, clamped outside; `f` must
    /// return rows below `n`.
    ///
    /// # Panics
    /// If `f` returns a row ≥ `n` (a programming error of the caller).
    pub fn new(r_max: usize, n: usize, f: impl Fn(i64) -> usize) -> RelIndex {
        let r_max = r_max as i64;
        let rows: Vec<u32> = (-r_max..=r_max)
            .map(|r| {
                let v = f(r);
                assert!(v < n, "relative index {v} out of {n} rows");
                v as u32
            })
            .collect();
        RelIndex { r_max, rows, n }
    }

    /// Number of rows of the tables it indexes.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// The row of distance `r`.
    #[inline(always)]
    pub fn get(&self, r: i64) -> usize {
        self.rows[(r.clamp(-self.r_max, self.r_max) + self.r_max) as usize] as usize
    }
}

/// ALiBi: `m_h·r` (causal) or `−m_h·|r|` (symmetric) for query head `h`.
#[derive(Debug, Clone, Copy)]
pub struct AlibiBias<'a> {
    /// One slope per query head.
    pub slopes: &'a [f32],
    /// `−m·|r|` instead of `m·r`.
    pub symmetric: bool,
}

/// A learned scalar per (relative row, query head): `table[idx(r)·H_q + h]`.
#[derive(Debug, Clone, Copy)]
pub struct ScalarTable<'a> {
    /// Row of each distance.
    pub index: &'a RelIndex,
    /// `(rows, H_q)`, row-major.
    pub table: &'a [f32],
}

/// Shaw et al.'s relative key and value tables, `(rows, D)` each, shared by
/// all heads.
#[derive(Debug, Clone, Copy)]
pub struct VectorTables<'a> {
    /// Row of each distance.
    pub index: &'a RelIndex,
    /// `a^K`, or `None`.
    pub keys: Option<&'a [f32]>,
    /// `a^V`, or `None`.
    pub values: Option<&'a [f32]>,
}

/// A dense bias: element `(b, h, i, j)` at `offset + b·sb + h·sh + i·si +
/// j·sj` (zero strides broadcast).
#[derive(Debug, Clone, Copy)]
pub struct DenseBias<'a> {
    /// The values.
    pub data: &'a [f32],
    /// Index of `(0, 0, 0, 0)`.
    pub offset: usize,
    /// Batch stride.
    pub sb: usize,
    /// Head stride.
    pub sh: usize,
    /// Query stride.
    pub si: usize,
    /// Key stride.
    pub sj: usize,
}

/// A bias `c_q[b, h, i] − c_k[b, h, j]` from contiguous `(B, H_q, T_q)` and
/// `(B, H_q, T_k)` vectors (forgetting attention's cumulative log forget
/// gates, Lin et al. 2025).
#[derive(Debug, Clone, Copy)]
pub struct CumulativeBias<'a> {
    /// `c` at the query steps.
    pub q: &'a [f32],
    /// `c` at the key steps.
    pub k: &'a [f32],
}

/// Everything one call reads.
#[derive(Debug, Clone, Copy)]
pub struct Problem<'a> {
    /// Sizes.
    pub dims: Dims,
    /// Multiplies `q·k` (usually `1/√D`).
    pub scale: f32,
    /// Hide keys after each query (bottom-right aligned).
    pub causal: bool,
    /// Queries.
    pub q: &'a [f32],
    /// Their layout.
    pub q_rows: Rows,
    /// Keys.
    pub k: &'a [f32],
    /// Their layout.
    pub k_rows: Rows,
    /// Values.
    pub v: &'a [f32],
    /// Their layout.
    pub v_rows: Rows,
    /// Rotary queries and keys.
    pub rotation: Option<Rotation<'a>>,
    /// Query positions (relative biases).
    pub q_pos: Pos<'a>,
    /// Key positions (relative biases).
    pub k_pos: Pos<'a>,
    /// ALiBi.
    pub alibi: Option<AlibiBias<'a>>,
    /// A bucketed scalar table (T5).
    pub scalar: Option<ScalarTable<'a>>,
    /// Shaw's relative keys and values.
    pub vector: Option<VectorTables<'a>>,
    /// A dense bias.
    pub dense: Option<DenseBias<'a>>,
    /// A cumulative bias.
    pub cumulative: Option<CumulativeBias<'a>>,
    /// The precision of the long-sequence forward tiles' products.
    pub products: Products,
    /// Restricts each query to one run of keys (inside the causal mask),
    /// for the ranges of a training-free context method
    /// ([`crate::extend`]); the query at step `i` is at key position `i +
    /// T_k − T_q`. Forward pass only: [`backward`] refuses it.
    pub window: Option<KeyRange>,
}

/// The precision of the attention's products `q·k` and `p·v` in the forward
/// pass's long-sequence tiles (more than 1,024 keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Products {
    /// `f32` throughout (the default): every path, every length.
    #[default]
    F32,
    /// Queries, keys, probabilities and values rounded to bfloat16, products
    /// summed in `f32` ([`super::bf16`]), on CPUs with AVX-512 and
    /// AVX512_BF16 and no Shaw relative tables; the softmax stays `f32`.
    /// Shorter sequences, the backward pass and other CPUs run `f32`.
    Bf16,
}

/// A raw pointer that may cross threads: tasks write disjoint elements.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// Gradients written by [`backward`]. `dq`, `dk`, `dv` may point into one
/// buffer (a packed projection) as long as their elements are disjoint; every
/// element of the three is written. Parameter gradients are overwritten.
pub struct Grads<'a> {
    /// `∂L/∂q`, laid out as `dq_rows`.
    pub dq: *mut f32,
    /// Layout of `dq`.
    pub dq_rows: Rows,
    /// `∂L/∂k`.
    pub dk: *mut f32,
    /// Layout of `dk`.
    pub dk_rows: Rows,
    /// `∂L/∂v`.
    pub dv: *mut f32,
    /// Layout of `dv`.
    pub dv_rows: Rows,
    /// `(rows, H_q)` gradient of the scalar table.
    pub scalar: Option<&'a mut [f32]>,
    /// `(rows, D)` gradient of `a^K`.
    pub keys: Option<&'a mut [f32]>,
    /// `(rows, D)` gradient of `a^V`.
    pub values: Option<&'a mut [f32]>,
    /// Contiguous `(B, H_q, T_q, T_k)` gradient of the dense bias (before any
    /// broadcast is summed out).
    pub dense: Option<&'a mut [f32]>,
    /// `(B, H_q, T_q)` gradient of `c_q`.
    pub cumulative_q: Option<&'a mut [f32]>,
    /// `(B, H_q, T_k)` gradient of `c_k`.
    pub cumulative_k: Option<&'a mut [f32]>,
}

impl Problem<'_> {
    fn group(&self) -> usize {
        self.dims.q_heads / self.dims.kv_heads
    }

    fn shift(&self) -> i64 {
        self.dims.k_len as i64 - self.dims.q_len as i64
    }

    /// Keys visible to query `i`: `0..visible(i)`.
    #[inline(always)]
    fn visible(&self, i: usize) -> usize {
        if self.causal {
            (i as i64 + self.shift() + 1).clamp(0, self.dims.k_len as i64) as usize
        } else {
            self.dims.k_len
        }
    }

    /// The keys `lo..hi` query `i` may see (the causal mask and the window).
    #[inline(always)]
    fn span(&self, i: usize) -> (usize, usize) {
        let vis = self.visible(i);
        match self.window {
            None => (0, vis),
            Some(w) => {
                let a = (i as i64 + self.shift()).max(0) as usize;
                let (lo, hi) = w.range(a);
                (lo, hi.min(vis))
            }
        }
    }

    /// The first key tile start (a multiple of `bk`) and the end of the keys
    /// the queries `i0..i0 + rows` see together.
    #[inline(always)]
    fn tile_span(&self, i0: usize, rows: usize, bk: usize) -> (usize, usize) {
        let (_, end) = self.span(i0 + rows - 1);
        match self.window {
            None => (0, end),
            Some(_) => {
                // Both ends of a window are non-decreasing in the query.
                let (lo, _) = self.span(i0);
                let lo = lo.min(end);
                (lo / bk * bk, end)
            }
        }
    }

    fn n_vec_rows(&self) -> usize {
        self.vector.map_or(0, |v| v.index.rows())
    }

    /// Work of one pass, in multiply-adds.
    fn work(&self) -> usize {
        let d = self.dims;
        d.batch * d.q_heads * d.q_len * d.k_len * d.head_dim.max(4)
    }

    /// Adds every bias to `s[..n]` for query `i` against keys `j0..j0+n`.
    #[inline(always)]
    fn add_bias(&self, b: usize, h: usize, i: usize, j0: usize, s: &mut [f32], qa: &[f32]) {
        let d = self.dims;
        let qp = self.q_pos.at(b, i, d.q_len);
        let n = s.len();
        if let Some(a) = self.alibi {
            let m = a.slopes[h];
            for (c, v) in s.iter_mut().enumerate() {
                let r = (self.k_pos.at(b, j0 + c, d.k_len) - qp) as f32;
                *v += if a.symmetric { -m * r.abs() } else { m * r };
            }
        }
        if let Some(t) = self.scalar {
            for (c, v) in s.iter_mut().enumerate() {
                let r = self.k_pos.at(b, j0 + c, d.k_len) - qp;
                *v += t.table[t.index.get(r) * d.q_heads + h];
            }
        }
        if let Some(vt) = self.vector {
            if vt.keys.is_some() {
                for (c, v) in s.iter_mut().enumerate() {
                    let r = self.k_pos.at(b, j0 + c, d.k_len) - qp;
                    *v += qa[vt.index.get(r)];
                }
            }
        }
        if let Some(db) = self.dense {
            let base = db.offset + b * db.sb + h * db.sh + i * db.si;
            for (c, v) in s.iter_mut().enumerate() {
                *v += db.data[base + (j0 + c) * db.sj];
            }
        }
        if let Some(cb) = self.cumulative {
            let cq = cb.q[(b * d.q_heads + h) * d.q_len + i];
            let ck = &cb.k[(b * d.q_heads + h) * d.k_len + j0..][..n];
            for (v, k) in s.iter_mut().zip(ck) {
                *v += cq - k;
            }
        }
    }
}

/// Rotates `src` (length `D`) into `dst`, times `scale`; `inverse` applies
/// the transpose (the backward pass).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn rotate_row(
    src: &[f32],
    dst: &mut [f32],
    cos: &[f32],
    sin: &[f32],
    rd: usize,
    pairs: PairLayout,
    inverse: bool,
    scale: f32,
) {
    let nf = rd / 2;
    let sg = if inverse { -1.0f32 } else { 1.0 };
    let (cos, sin) = (&cos[..nf], &sin[..nf]);
    // Eight pairs at a time into registers, then stored: the loops
    // vectorise whatever the compiler knows of `dst` (written in place, a
    // destination from a raw pointer kept them scalar behind alias checks).
    // One pair: (x, y) rotated by the angle of (c, s), times `scale`.
    let pair = |x: f32, y: f32, c: f32, s: f32| {
        let s = sg * s;
        ((x * c - y * s) * scale, (y * c + x * s) * scale)
    };
    const W: usize = 8;
    match pairs {
        PairLayout::HalfSplit => {
            let (x0, x1) = src[..rd].split_at(nf);
            let (d0, d1) = dst[..rd].split_at_mut(nf);
            let full = nf / W * W;
            for k in (0..full).step_by(W) {
                // Slices of length W: no bounds checks, the loop vectorises.
                let (x, y) = (&x0[k..k + W], &x1[k..k + W]);
                let (c, sn) = (&cos[k..k + W], &sin[k..k + W]);
                let (mut a, mut b) = ([0f32; W], [0f32; W]);
                for l in 0..W {
                    (a[l], b[l]) = pair(x[l], y[l], c[l], sn[l]);
                }
                d0[k..k + W].copy_from_slice(&a);
                d1[k..k + W].copy_from_slice(&b);
            }
            for p in full..nf {
                (d0[p], d1[p]) = pair(x0[p], x1[p], cos[p], sin[p]);
            }
        }
        PairLayout::Interleaved => {
            for (((o, xy), c), s) in dst[..rd]
                .chunks_exact_mut(2)
                .zip(src[..rd].chunks_exact(2))
                .zip(cos)
                .zip(sin)
            {
                (o[0], o[1]) = pair(xy[0], xy[1], *c, *s);
            }
        }
    }
    for (o, x) in dst[rd..src.len()].iter_mut().zip(&src[rd..]) {
        *o = x * scale;
    }
}

/// Rows ahead of the one being read that the row loops ask the CPU to
/// fetch: the rows of `(b, h)` lie one token's stride apart in the packed
/// projections, an access the hardware prefetchers followed poorly (the
/// rotation loops stalled on their loads in `perf`).
const PREFETCH_AHEAD: usize = 8;

/// Asks the CPU to start loading `data[at..at + len]` into cache (a hint:
/// no effect on results; nothing past the slice).
#[inline(always)]
fn prefetch(data: &[f32], at: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let end = at.saturating_add(len).min(data.len());
        let mut i = at;
        while i < end {
            // SAFETY: a prefetch of an address inside the slice.
            #[allow(unused_unsafe)]
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(data.as_ptr().add(i) as *const i8)
            };
            i += 16;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, at, len);
}

/// [`prefetch`] of query `(b, h, t)` when it exists.
#[inline(always)]
fn prefetch_q(p: &Problem, b: usize, h: usize, t: usize) {
    if t < p.dims.q_len {
        prefetch(p.q, p.q_rows.at(b, h, t), p.dims.head_dim);
    }
}

/// [`prefetch`] of key and value `(b, h, t)` when they exist.
#[inline(always)]
fn prefetch_kv(p: &Problem, b: usize, h: usize, t: usize) {
    if t < p.dims.k_len {
        prefetch(p.k, p.k_rows.at(b, h, t), p.dims.head_dim);
        prefetch(p.v, p.v_rows.at(b, h, t), p.dims.head_dim);
    }
}

/// Copies query `(b, h, t)` into `dst`, rotated and scaled.
#[inline(always)]
fn load_q(p: &Problem, b: usize, h: usize, t: usize, dst: &mut [f32]) {
    let d = p.dims.head_dim;
    let src = &p.q[p.q_rows.at(b, h, t)..][..d];
    match &p.rotation {
        Some(rot) => {
            let row = rot.q_rows.row(b, t, p.dims.q_len);
            rot.row(true, row, src, dst, false, p.scale);
        }
        None => {
            for (o, i) in dst.iter_mut().zip(src) {
                *o = i * p.scale;
            }
        }
    }
}

/// Copies key `(b, h, t)` into `dst`, rotated.
#[inline(always)]
fn load_k(p: &Problem, b: usize, h: usize, t: usize, dst: &mut [f32]) {
    let d = p.dims.head_dim;
    let src = &p.k[p.k_rows.at(b, h, t)..][..d];
    match &p.rotation {
        Some(rot) => {
            let row = rot.k_rows.row(b, t, p.dims.k_len);
            rot.row(false, row, src, dst, false, 1.0);
        }
        None => dst.copy_from_slice(src),
    }
}

/// Runs `f` for each task, on rayon's threads if the pass is large enough;
/// returns the results in task order.
fn run_tasks<R: Send>(n: usize, parallel: bool, f: impl Fn(usize) -> R + Sync + Send) -> Vec<R> {
    if parallel && n > 1 && super::threads() > 1 {
        (0..n).into_par_iter().map(f).collect()
    } else {
        (0..n).map(f).collect()
    }
}

/// The forward pass: writes `out` (laid out as `out_rows`, `(B, H_q, T_q,
/// D)`) and the log-sum-exp of every row, `lse` (contiguous `(B, H_q, T_q)`;
/// `−∞` for a query that sees no key, whose output is 0).
///
/// # Panics
/// On buffers too short for their layouts (the tensor API checks them
/// before calling).
pub fn forward(p: &Problem, out: &mut [f32], out_rows: Rows, lse: &mut [f32], level: SimdLevel) {
    let dm = p.dims;
    assert!(out.len() >= out_rows.extent(dm.batch, dm.q_heads, dm.q_len, dm.head_dim));
    assert!(lse.len() >= dm.batch * dm.q_heads * dm.q_len);
    #[cfg(target_arch = "x86_64")]
    if bf16_forward(p, level) {
        forward_bf16(p, out, out_rows, lse, level);
        return;
    }
    let parallel = p.work() >= PARALLEL_WORK;
    let q_tiles = dm.q_len.div_ceil(query_tile(dm.k_len));
    // Every key is read by each query tile of each query head of its group:
    // rotate and transpose the keys once, not once per task (that repeated
    // packing cost as much as the logits' GEMM on long sequences). The
    // buffer is the size of the keys.
    let shared: Vec<f32> = if q_tiles * p.group() > 1 {
        let bk = key_tile(dm.k_len);
        let per = dm.head_dim * dm.k_len.div_ceil(bk) * bk;
        let mut kt = vec![0f32; dm.batch * dm.kv_heads * per];
        let pack = |(task, dst): (usize, &mut [f32])| {
            pack_dispatch(level, p, task / dm.kv_heads, task % dm.kv_heads, dst)
        };
        if parallel && dm.batch * dm.kv_heads > 1 && super::threads() > 1 {
            kt.par_chunks_mut(per).enumerate().for_each(pack);
        } else {
            kt.chunks_mut(per).enumerate().for_each(pack);
        }
        kt
    } else {
        Vec::new()
    };
    let shared = &shared[..];
    let out_ptr = SendPtr(out.as_mut_ptr());
    let lse_ptr = SendPtr(lse.as_mut_ptr());
    run_tasks(dm.batch * dm.q_heads * q_tiles, parallel, |task| {
        let (out_ptr, lse_ptr) = (out_ptr, lse_ptr);
        forward_dispatch(
            level, p, task, q_tiles, shared, out_ptr, out_rows, lse_ptr, level,
        )
    });
}

crate::multiversion!(fn forward_dispatch => forward_task(
    p: &Problem, task: usize, q_tiles: usize, shared: &[f32], out: SendPtr, out_rows: Rows, lse: SendPtr,
    level: SimdLevel) -> ());

crate::multiversion!(fn pack_dispatch => pack_all_keys(
    p: &Problem, b: usize, hk: usize, dst: &mut [f32]) -> ());

/// Packs every key of `(b, hk)` rotated and transposed into `dst`, tile by
/// tile: keys `j0..j0 + bk` as a contiguous `(D, bk)` block (a power-of-two
/// leading dimension of `T_k` would map a tile's rows onto the same cache
/// sets).
#[inline(always)]
fn pack_all_keys(p: &Problem, b: usize, hk: usize, dst: &mut [f32]) {
    let d = p.dims.head_dim;
    let bk = key_tile(p.dims.k_len);
    let mut rows = vec![0f32; bk * d];
    for (jt, block) in dst.chunks_mut(d * bk).enumerate() {
        let j0 = jt * bk;
        let n = bk.min(p.dims.k_len - j0);
        for t in 0..n {
            prefetch_kv(p, b, hk, j0 + t + PREFETCH_AHEAD);
            load_k(p, b, hk, j0 + t, &mut rows[t * d..][..d]);
        }
        // SAFETY: `rows` holds n × d, `block` d × bk.
        unsafe { tile::transpose(n, d, rows.as_ptr(), d, block.as_mut_ptr(), bk) };
    }
}

crate::multiversion!(fn backward_dispatch => backward_task(
    p: &Problem, task: usize, o: &[f32], o_rows: Rows, d_o: &[f32], do_rows: Rows,
    lse: &[f32], g: GradRows, ptrs: &BwdPtrs, want: (bool, bool, bool), level: SimdLevel) -> Partial);

/// Packs the keys `0..n` of `(b, hk)` rotated and transposed: `kt` is
/// `(D, ld)`, column `t` holding key `t`.
#[inline(always)]
fn pack_kt(p: &Problem, b: usize, hk: usize, n: usize, kt: &mut [f32], rows: &mut [f32]) {
    let d = p.dims.head_dim;
    for t in 0..n {
        prefetch_kv(p, b, hk, t + PREFETCH_AHEAD);
        load_k(p, b, hk, t, &mut rows[t * d..][..d]);
    }
    // SAFETY: `rows` holds n × d, `kt` d × n.
    unsafe { tile::transpose(n, d, rows.as_ptr(), d, kt.as_mut_ptr(), n) };
}

/// `C[m×n] (+)= A[m×k] · B[k×n]` for the long-sequence tiles, `[m, n, k]`,
/// each matrix row-major as (pointer, leading dimension);
/// `accumulate = false` overwrites `C`. On the gemm crate's kernel
/// (`crate_gemm`, one thread) or on [`tile::gemm_nn`] at `level`.
///
/// # Safety
/// As [`tile::gemm_nn`].
#[inline(always)]
unsafe fn block_product(
    crate_gemm: bool,
    level: SimdLevel,
    [m, n, k]: [usize; 3],
    (a, lda): (*const f32, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc): (*mut f32, usize),
    accumulate: bool,
) {
    if crate_gemm {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            accumulate,
            a,
            1,
            lda as isize,
            b,
            1,
            ldb as isize,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    } else {
        tile::gemm_nn(level, m, n, k, a, lda, b, ldb, c, ldc, accumulate)
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn forward_task(
    p: &Problem,
    task: usize,
    q_tiles: usize,
    shared: &[f32],
    out: SendPtr,
    out_rows: Rows,
    lse: SendPtr,
    level: SimdLevel,
) {
    let dm = p.dims;
    let d = dm.head_dim;
    let qt = task % q_tiles;
    let h = (task / q_tiles) % dm.q_heads;
    let b = task / (q_tiles * dm.q_heads);
    let hk = h / p.group();
    let bq = query_tile(dm.k_len);
    let i0 = qt * bq;
    let rows = bq.min(dm.q_len - i0);
    let nv = p.n_vec_rows();
    let keys = p.vector.and_then(|v| v.keys);
    let values = p.vector.and_then(|v| v.values);
    let bk = key_tile(dm.k_len);
    let (k_start, k_end) = p.tile_span(i0, rows, bk);
    let nqa = if keys.is_some() { rows * nv } else { 0 };
    let nwv = if values.is_some() { rows * nv } else { 0 };
    let nakt = if keys.is_some() { d * nv } else { 0 };
    // Keys of (b, hk), rotated and transposed: from `shared` (all of them,
    // leading dimension T_k), else packed here (0..k_end).
    let nk = if shared.is_empty() { d * k_end } else { 0 };
    // The long tiles' products on the `gemm` crate below AVX-512 (see
    // BK_LONG).
    let crate_gemm = bk == BK_LONG && level != SimdLevel::Avx512;
    let mut scratch = tile::Scratch::take();
    let [kt, krow, q, qa, wv, m, l, acc, s, akt] = scratch.split([
        nk,
        nk,
        rows * d,
        nqa,
        nwv,
        rows,
        rows,
        rows * d,
        rows * bk,
        nakt,
    ]);
    {
        {
            // Key tile j0's block: at kt[j0_off..], leading dimension ldk.
            let (kt, ldk, tiled): (&[f32], usize, bool) = if shared.is_empty() {
                pack_kt(p, b, hk, k_end, kt, krow);
                (kt, k_end, false)
            } else {
                let per = d * dm.k_len.div_ceil(bk) * bk;
                (&shared[(b * dm.kv_heads + hk) * per..][..per], bk, true)
            };
            for r in 0..rows {
                prefetch_q(p, b, h, i0 + r + PREFETCH_AHEAD);
                load_q(p, b, h, i0 + r, &mut q[r * d..][..d]);
            }
            if let Some(ak) = keys {
                // q̃·a^K for every table row: (rows, nv).
                unsafe {
                    tile::transpose(nv, d, ak.as_ptr(), d, akt.as_mut_ptr(), nv);
                    tile::gemm_nn(
                        level,
                        rows,
                        nv,
                        d,
                        q.as_ptr(),
                        d,
                        akt.as_ptr(),
                        nv,
                        qa.as_mut_ptr(),
                        nv,
                        false,
                    )
                };
            }
            m.fill(f32::NEG_INFINITY);
            l.fill(0.0);
            acc.fill(0.0);
            wv.fill(0.0);
            let mut j0 = k_start;
            while j0 < k_end {
                let n = bk.min(k_end - j0);
                let kb = unsafe { kt.as_ptr().add(if tiled { j0 * d } else { j0 }) };
                // SAFETY: q holds rows × d, the key block d × n with
                // leading dimension ldk, s rows × n.
                unsafe {
                    block_product(
                        crate_gemm,
                        level,
                        [rows, n, d],
                        (q.as_ptr(), d),
                        (kb, ldk),
                        (s.as_mut_ptr(), n),
                        false,
                    )
                };
                for r in 0..rows {
                    let i = i0 + r;
                    let sr = &mut s[r * n..][..n];
                    let qar = if qa.is_empty() {
                        &qa[..]
                    } else {
                        &qa[r * nv..][..nv]
                    };
                    let wvr = if wv.is_empty() {
                        &mut wv[..]
                    } else {
                        &mut wv[r * nv..][..nv]
                    };
                    let vis = softmax_step(
                        p,
                        (b, h, i, j0),
                        sr,
                        qar,
                        (&mut m[r], &mut l[r]),
                        &mut acc[r * d..][..d],
                        wvr,
                    );
                    if vis == 0 {
                        continue;
                    }
                    if let (Some(vt), false) = (p.vector, wv.is_empty()) {
                        let qp = p.q_pos.at(b, i, dm.q_len);
                        let w = &mut wv[r * nv..][..nv];
                        for (c, pv) in sr[..vis].iter().enumerate() {
                            let rel = p.k_pos.at(b, j0 + c, dm.k_len) - qp;
                            w[vt.index.get(rel)] += pv;
                        }
                    }
                }
                let v0 = p.v_rows.at(b, hk, j0);
                let vb = unsafe { p.v.as_ptr().add(v0) };
                // SAFETY: s holds rows × n, the values n rows of d at
                // stride st, acc rows × d.
                unsafe {
                    block_product(
                        crate_gemm,
                        level,
                        [rows, d, n],
                        (s.as_ptr(), n),
                        (vb, p.v_rows.st),
                        (acc.as_mut_ptr(), d),
                        true,
                    )
                };
                j0 += n;
            }
            for r in 0..rows {
                let i = i0 + r;
                let o =
                    unsafe { std::slice::from_raw_parts_mut(out.0.add(out_rows.at(b, h, i)), d) };
                let lse_i = unsafe { &mut *lse.0.add((b * dm.q_heads + h) * dm.q_len + i) };
                let Some(inv) = finish_row(o, &acc[r * d..][..d], m[r], l[r], lse_i) else {
                    continue;
                };
                if let Some(av) = values {
                    for (t, w) in wv[r * nv..][..nv].iter().enumerate() {
                        if *w != 0.0 {
                            tile::axpy(w * inv, &av[t * d..][..d], o);
                        }
                    }
                }
            }
        }
    }
}

/// One row's step of the online softmax over a key tile: adds the biases to
/// the row's logits `sr` (keys `j0..`), turns the visible ones into
/// `exp(s − m)` with the row's running maximum `m` (the rest of `sr` into
/// zeros), updates `m` and the running sum `l`, and rescales the row's
/// accumulators `acc` and `wv` (Shaw's value weights, or empty) when the
/// maximum moved. Returns the number of visible keys; 0 when the row adds
/// nothing (no key visible, or every one masked by a −∞ bias).
#[inline(always)]
fn softmax_step(
    p: &Problem,
    (b, h, i, j0): (usize, usize, usize, usize),
    sr: &mut [f32],
    qar: &[f32],
    (m, l): (&mut f32, &mut f32),
    acc: &mut [f32],
    wv: &mut [f32],
) -> usize {
    let (lo, hi) = p.span(i);
    let vis = hi.saturating_sub(j0).min(sr.len());
    if vis == 0 || lo >= j0 + vis {
        sr.fill(0.0);
        return 0;
    }
    p.add_bias(b, h, i, j0, &mut sr[..vis], qar);
    // Keys before the window's start (a context method's range).
    sr[..lo.saturating_sub(j0)].fill(f32::NEG_INFINITY);
    let mx = tile::max(&sr[..vis]);
    let m_new = if mx > *m { mx } else { *m };
    if m_new == f32::NEG_INFINITY {
        // Every key so far is masked by a −∞ bias.
        sr.fill(0.0);
        return 0;
    }
    let alpha = tile::exp(*m - m_new);
    for v in sr[..vis].iter_mut() {
        *v = tile::exp(*v - m_new);
    }
    sr[vis..].fill(0.0);
    *l = *l * alpha + tile::sum(&sr[..vis]);
    *m = m_new;
    if alpha != 1.0 {
        tile::scale(alpha, acc);
        if !wv.is_empty() {
            tile::scale(alpha, wv);
        }
    }
    vis
}

/// Writes row `i`'s output `acc / l` and its log-sum-exp `m + ln l` (zeros
/// and −∞ for a row that saw no key).
#[inline(always)]
fn finish_row(o: &mut [f32], acc: &[f32], m: f32, l: f32, lse: &mut f32) -> Option<f32> {
    if l == 0.0 {
        o.fill(0.0);
        *lse = f32::NEG_INFINITY;
        return None;
    }
    let inv = 1.0 / l;
    for (ov, av) in o.iter_mut().zip(acc) {
        *ov = av * inv;
    }
    *lse = m + l.ln();
    Some(inv)
}

/// Whether the forward pass runs its long tiles' products in bfloat16.
#[cfg(target_arch = "x86_64")]
fn bf16_forward(p: &Problem, level: SimdLevel) -> bool {
    p.products == Products::Bf16
        && p.dims.k_len > LONG_KEYS
        && level == SimdLevel::Avx512
        && p.vector.is_none()
        && p.dims.head_dim > 0
        && super::bf16::supported()
}

/// The forward pass with [`Products::Bf16`]: keys (rotated) and values of
/// every `(b, h_k)` rounded to bfloat16 pairs once, then tasks of
/// [`BQ_LONG`] queries as in [`forward_task`], the softmax in `f32`.
#[cfg(target_arch = "x86_64")]
fn forward_bf16(p: &Problem, out: &mut [f32], out_rows: Rows, lse: &mut [f32], level: SimdLevel) {
    let dm = p.dims;
    let (d, bk) = (dm.head_dim, BK_LONG);
    let n_tiles = dm.k_len.div_ceil(bk);
    let per_k = d.div_ceil(2) * bk * n_tiles;
    let per_v = bk / 2 * d * n_tiles;
    let mut kp = vec![0u32; dm.batch * dm.kv_heads * per_k];
    let mut vp = vec![0u32; dm.batch * dm.kv_heads * per_v];
    let parallel = p.work() >= PARALLEL_WORK && super::threads() > 1;
    let pack = |(task, (kd, vd)): (usize, (&mut [u32], &mut [u32]))| {
        pack_bf16_dispatch(level, p, task / dm.kv_heads, task % dm.kv_heads, kd, vd)
    };
    if parallel {
        kp.par_chunks_mut(per_k)
            .zip(vp.par_chunks_mut(per_v))
            .enumerate()
            .for_each(pack);
    } else {
        kp.chunks_mut(per_k)
            .zip(vp.chunks_mut(per_v))
            .enumerate()
            .for_each(pack);
    }
    let q_tiles = dm.q_len.div_ceil(BQ_LONG);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let lse_ptr = SendPtr(lse.as_mut_ptr());
    let (kp, vp) = (&kp[..], &vp[..]);
    run_tasks(dm.batch * dm.q_heads * q_tiles, parallel, |task| {
        let (out_ptr, lse_ptr) = (out_ptr, lse_ptr);
        let hk = (task / q_tiles) % dm.q_heads / p.group();
        let bh = task / (q_tiles * dm.q_heads) * dm.kv_heads + hk;
        forward_bf16_dispatch(
            level,
            p,
            task,
            q_tiles,
            &kp[bh * per_k..][..per_k],
            &vp[bh * per_v..][..per_v],
            out_ptr,
            out_rows,
            lse_ptr,
        )
    });
}

#[cfg(target_arch = "x86_64")]
crate::multiversion!(fn pack_bf16_dispatch => pack_bf16(
    p: &Problem, b: usize, hk: usize, kd: &mut [u32], vd: &mut [u32]) -> ());

#[cfg(target_arch = "x86_64")]
crate::multiversion!(fn forward_bf16_dispatch => forward_task_bf16(
    p: &Problem, task: usize, q_tiles: usize, kp: &[u32], vp: &[u32], out: SendPtr, out_rows: Rows,
    lse: SendPtr) -> ());

/// Packs the keys of `(b, hk)`, rotated, into `kd` (per tile of
/// [`BK_LONG`] keys, `(⌈D/2⌉, BK_LONG)` pairs along the head dimension) and
/// its values into `vd` (per tile, `(BK_LONG/2, D)` pairs along the keys);
/// both zeroed by the caller.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn pack_bf16(p: &Problem, b: usize, hk: usize, kd: &mut [u32], vd: &mut [u32]) {
    use super::bf16::{pack_pairs, to_bf16};
    let d = p.dims.head_dim;
    let (dp, bk) = (d.div_ceil(2), BK_LONG);
    let mut row = vec![0f32; d];
    let mut pairs = vec![0u32; dp];
    for t in 0..p.dims.k_len {
        let (jt, j) = (t / bk, t % bk);
        load_k(p, b, hk, t, &mut row);
        pack_pairs(&row, &mut pairs);
        let blk = &mut kd[jt * dp * bk..][..dp * bk];
        for (q, v) in pairs.iter().enumerate() {
            blk[q * bk + j] = *v;
        }
        let v = &p.v[p.v_rows.at(b, hk, t)..][..d];
        let shift = if j % 2 == 0 { 0 } else { 16 };
        let vrow = &mut vd[(jt * (bk / 2) + j / 2) * d..][..d];
        for (o, x) in vrow.iter_mut().zip(v) {
            *o |= (to_bf16(*x) as u32) << shift;
        }
    }
}

/// [`forward_task`] with the products in bfloat16 (keys and values packed
/// by [`pack_bf16`] for this task's `(b, h_k)`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn forward_task_bf16(
    p: &Problem,
    task: usize,
    q_tiles: usize,
    kp: &[u32],
    vp: &[u32],
    out: SendPtr,
    out_rows: Rows,
    lse: SendPtr,
) {
    use super::bf16::pack_pairs;
    let dm = p.dims;
    let d = dm.head_dim;
    let (dp, bk) = (d.div_ceil(2), BK_LONG);
    let qt = task % q_tiles;
    let h = (task / q_tiles) % dm.q_heads;
    let b = task / (q_tiles * dm.q_heads);
    let i0 = qt * BQ_LONG;
    let rows = BQ_LONG.min(dm.q_len - i0);
    let (k_start, k_end) = p.tile_span(i0, rows, bk);
    let mut q = vec![0f32; d];
    let mut qp = vec![0u32; rows * dp];
    let mut pp = vec![0u32; rows * bk / 2];
    let mut scratch = tile::Scratch::take();
    let [m, l, acc, s] = scratch.split([rows, rows, rows * d, rows * bk]);
    for r in 0..rows {
        load_q(p, b, h, i0 + r, &mut q);
        pack_pairs(&q, &mut qp[r * dp..][..dp]);
    }
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    acc.fill(0.0);
    let mut j0 = k_start;
    while j0 < k_end {
        let n = bk.min(k_end - j0);
        let np = n.div_ceil(2);
        let jt = j0 / bk;
        // SAFETY: bf16_forward checked the CPU; qp holds rows × dp pairs,
        // the key tile dp × bk, s rows × n.
        unsafe {
            super::bf16::gemm(
                rows,
                n,
                dp,
                qp.as_ptr(),
                dp,
                kp.as_ptr().add(jt * dp * bk),
                bk,
                s.as_mut_ptr(),
                n,
                false,
            )
        };
        for r in 0..rows {
            let sr = &mut s[r * n..][..n];
            let acc_r = &mut acc[r * d..][..d];
            softmax_step(
                p,
                (b, h, i0 + r, j0),
                sr,
                &[],
                (&mut m[r], &mut l[r]),
                acc_r,
                &mut [],
            );
            pack_pairs(sr, &mut pp[r * np..][..np]);
        }
        // SAFETY: as above; pp holds rows × np pairs, the value tile np
        // (≤ bk/2) × d pairs, acc rows × d.
        unsafe {
            super::bf16::gemm(
                rows,
                d,
                np,
                pp.as_ptr(),
                np,
                vp.as_ptr().add(jt * (bk / 2) * d),
                d,
                acc.as_mut_ptr(),
                d,
                true,
            )
        };
        j0 += n;
    }
    for r in 0..rows {
        let i = i0 + r;
        // SAFETY: each task writes its own rows.
        let o = unsafe { std::slice::from_raw_parts_mut(out.0.add(out_rows.at(b, h, i)), d) };
        let lse_i = unsafe { &mut *lse.0.add((b * dm.q_heads + h) * dm.q_len + i) };
        finish_row(o, &acc[r * d..][..d], m[r], l[r], lse_i);
    }
}

/// Per-task partial gradients of the shared tables.
#[derive(Default)]
struct Partial {
    scalar: Vec<f32>,
    keys: Vec<f32>,
    values: Vec<f32>,
}

/// The backward pass: from the output `o`, its gradient `d_o` (both laid out
/// as their `Rows`) and the forward pass's `lse`, writes every gradient in
/// `g`.
///
/// # Panics
/// On buffers too short for their layouts (the tensor API checks them
/// before calling).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    p: &Problem,
    o: &[f32],
    o_rows: Rows,
    d_o: &[f32],
    do_rows: Rows,
    lse: &[f32],
    g: Grads,
    level: SimdLevel,
) {
    let dm = p.dims;
    assert!(
        p.window.is_none(),
        "the backward pass has no key windows (context methods are forward-only)"
    );
    assert!(o.len() >= o_rows.extent(dm.batch, dm.q_heads, dm.q_len, dm.head_dim));
    assert!(d_o.len() >= do_rows.extent(dm.batch, dm.q_heads, dm.q_len, dm.head_dim));
    assert!(lse.len() >= dm.batch * dm.q_heads * dm.q_len);
    let nv = p.n_vec_rows();
    let d = dm.head_dim;
    let ns = p.scalar.map_or(0, |s| s.index.rows());
    let mut g = g;
    if let Some(dd) = g.dense.as_deref_mut() {
        assert!(dd.len() >= dm.batch * dm.q_heads * dm.q_len * dm.k_len);
        dd.fill(0.0);
    }
    if let Some(c) = g.cumulative_q.as_deref_mut() {
        assert!(c.len() >= dm.batch * dm.q_heads * dm.q_len);
        c.fill(0.0);
    }
    if let Some(c) = g.cumulative_k.as_deref_mut() {
        assert!(c.len() >= dm.batch * dm.q_heads * dm.k_len);
        c.fill(0.0);
    }
    let ptrs = BwdPtrs {
        dq: SendPtr(g.dq),
        dk: SendPtr(g.dk),
        dv: SendPtr(g.dv),
        dense: g.dense.as_ref().map(|x| SendPtr(x.as_ptr() as *mut f32)),
        cq: g
            .cumulative_q
            .as_ref()
            .map(|x| SendPtr(x.as_ptr() as *mut f32)),
        ck: g
            .cumulative_k
            .as_ref()
            .map(|x| SendPtr(x.as_ptr() as *mut f32)),
    };
    let want = (g.scalar.is_some(), g.keys.is_some(), g.values.is_some());
    let parallel = p.work() >= PARALLEL_WORK / 2;
    let rows = GradRows {
        dq_rows: g.dq_rows,
        dk_rows: g.dk_rows,
        dv_rows: g.dv_rows,
    };
    let parts = run_tasks(dm.batch * dm.kv_heads, parallel, |task| {
        let ptrs = &ptrs;
        backward_dispatch(
            level, p, task, o, o_rows, d_o, do_rows, lse, rows, ptrs, want, level,
        )
    });
    // Shared tables: add the partial sums in task order.
    let add = |dst: Option<&mut [f32]>, pick: fn(&Partial) -> &Vec<f32>, len: usize| {
        if let Some(dst) = dst {
            dst[..len].fill(0.0);
            for part in &parts {
                for (a, b) in dst.iter_mut().zip(pick(part)) {
                    *a += b;
                }
            }
        }
    };
    add(g.scalar, |x| &x.scalar, ns * dm.q_heads);
    add(g.keys, |x| &x.keys, nv * d);
    add(g.values, |x| &x.values, nv * d);
}

/// Layouts of the q, k, v gradients.
#[derive(Clone, Copy)]
struct GradRows {
    dq_rows: Rows,
    dk_rows: Rows,
    dv_rows: Rows,
}

struct BwdPtrs {
    dq: SendPtr,
    dk: SendPtr,
    dv: SendPtr,
    dense: Option<SendPtr>,
    cq: Option<SendPtr>,
    ck: Option<SendPtr>,
}

/// Writes `scale·Rᵀ·src` (the adjoint of the rotation) into `dst`.
#[inline(always)]
fn unrotate(
    rot: Option<&Rotation>,
    tables: bool,
    row: usize,
    src: &[f32],
    dst: &mut [f32],
    scale: f32,
) {
    match rot {
        Some(rot) => rot.row(tables, row, src, dst, true, scale),
        None => {
            for (o, i) in dst.iter_mut().zip(src) {
                *o = i * scale;
            }
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn backward_task(
    p: &Problem,
    task: usize,
    o: &[f32],
    o_rows: Rows,
    d_o: &[f32],
    do_rows: Rows,
    lse: &[f32],
    g: GradRows,
    ptrs: &BwdPtrs,
    want: (bool, bool, bool),
    level: SimdLevel,
) -> Partial {
    let dm = p.dims;
    let d = dm.head_dim;
    let (tq, tk) = (dm.q_len, dm.k_len);
    let (b, hk) = (task / dm.kv_heads, task % dm.kv_heads);
    let nv = p.n_vec_rows();
    let ns = p.scalar.map_or(0, |s| s.index.rows());
    let mut part = Partial {
        scalar: vec![0f32; if want.0 { ns * dm.q_heads } else { 0 }],
        keys: vec![0f32; if want.1 { nv * d } else { 0 }],
        values: vec![0f32; if want.2 { nv * d } else { 0 }],
    };
    let keys = p.vector.and_then(|v| v.keys);
    let values = p.vector.and_then(|v| v.values);
    let nk = if keys.is_some() { tq * nv } else { 0 };
    let nvv = if values.is_some() { tq * nv } else { 0 };
    let nakt = if keys.is_some() { d * nv } else { 0 };
    let navt = if values.is_some() { d * nv } else { 0 };
    let mut scratch = tile::Scratch::take();
    let [kr, kt, vt, dkr, dv, qs, dqs, dvec, pm, dp, qa, doa, wk, wv, akt, avt] = scratch.split([
        tk * d,      // kr: rotated keys (T_k, D)
        d * tk,      // kt: their transpose
        d * tk,      // vt: values transposed
        tk * d,      // dkr
        tk * d,      // dv
        tq * d,      // qs: rotated, scaled queries
        tq * d,      // dqs
        tq,          // dvec
        BQ_BWD * BK, // P
        BQ_BWD * BK, // dP, then dS
        nk,          // qa
        nvv,         // doa
        nk,          // wk
        nvv,         // wv
        nakt,        // a^K transposed
        navt,        // a^V transposed
    ]);
    {
        {
            for t in 0..tk {
                prefetch_kv(p, b, hk, t + PREFETCH_AHEAD);
                load_k(p, b, hk, t, &mut kr[t * d..][..d]);
            }
            dkr.fill(0.0);
            dv.fill(0.0);
            unsafe {
                tile::transpose(tk, d, kr.as_ptr(), d, kt.as_mut_ptr(), tk);
                tile::transpose(
                    tk,
                    d,
                    p.v.as_ptr().add(p.v_rows.at(b, hk, 0)),
                    p.v_rows.st,
                    vt.as_mut_ptr(),
                    tk,
                );
            }
            if let Some(ak) = keys {
                unsafe { tile::transpose(nv, d, ak.as_ptr(), d, akt.as_mut_ptr(), nv) };
            }
            if let Some(av) = values {
                unsafe { tile::transpose(nv, d, av.as_ptr(), d, avt.as_mut_ptr(), nv) };
            }
            for h in hk * p.group()..(hk + 1) * p.group() {
                let bh = b * dm.q_heads + h;
                let do0 = do_rows.at(b, h, 0);
                for t in 0..tq {
                    let ahead = t + PREFETCH_AHEAD;
                    prefetch_q(p, b, h, ahead);
                    if ahead < tq {
                        prefetch(d_o, do_rows.at(b, h, ahead), d);
                        prefetch(o, o_rows.at(b, h, ahead), d);
                    }
                    load_q(p, b, h, t, &mut qs[t * d..][..d]);
                    let dor = &d_o[do_rows.at(b, h, t)..][..d];
                    dvec[t] = tile::dot(dor, &o[o_rows.at(b, h, t)..][..d]);
                }
                dqs.fill(0.0);
                if keys.is_some() {
                    unsafe {
                        tile::gemm_nn(
                            level,
                            tq,
                            nv,
                            d,
                            qs.as_ptr(),
                            d,
                            akt.as_ptr(),
                            nv,
                            qa.as_mut_ptr(),
                            nv,
                            false,
                        )
                    };
                    wk.fill(0.0);
                }
                if values.is_some() {
                    unsafe {
                        tile::gemm(
                            level,
                            tq,
                            nv,
                            d,
                            d_o.as_ptr().add(do0),
                            do_rows.st,
                            1,
                            avt.as_ptr(),
                            nv,
                            doa.as_mut_ptr(),
                            nv,
                            false,
                        )
                    };
                    wv.fill(0.0);
                }
                let lse_h = &lse[bh * tq..][..tq];
                let mut i0 = 0;
                while i0 < tq {
                    let rows = BQ_BWD.min(tq - i0);
                    let k_end = p.visible(i0 + rows - 1);
                    let mut j0 = 0;
                    while j0 < k_end {
                        let n = BK.min(k_end - j0);
                        unsafe {
                            // S (rows × n) = Q̃[i0..] · K̃ᵀ[:, j0..]
                            tile::gemm_nn(
                                level,
                                rows,
                                n,
                                d,
                                qs.as_ptr().add(i0 * d),
                                d,
                                kt.as_ptr().add(j0),
                                tk,
                                pm.as_mut_ptr(),
                                BK,
                                false,
                            );
                            // dP (rows × n) = dO[i0..] · Vᵀ[:, j0..]
                            tile::gemm(
                                level,
                                rows,
                                n,
                                d,
                                d_o.as_ptr().add(do0 + i0 * do_rows.st),
                                do_rows.st,
                                1,
                                vt.as_ptr().add(j0),
                                tk,
                                dp.as_mut_ptr(),
                                BK,
                                false,
                            );
                        }
                        for r in 0..rows {
                            let i = i0 + r;
                            let vis = p.visible(i).saturating_sub(j0).min(n);
                            let pr = &mut pm[r * BK..][..n];
                            let dpr = &mut dp[r * BK..][..n];
                            if vis == 0 || lse_h[i] == f32::NEG_INFINITY {
                                pr.fill(0.0);
                                dpr.fill(0.0);
                                continue;
                            }
                            let qar = if qa.is_empty() {
                                &qa[..]
                            } else {
                                &qa[i * nv..][..nv]
                            };
                            p.add_bias(b, h, i, j0, &mut pr[..vis], qar);
                            let li = lse_h[i];
                            for v in pr[..vis].iter_mut() {
                                *v = tile::exp(*v - li);
                            }
                            pr[vis..].fill(0.0);
                            let qp = p.q_pos.at(b, i, tq);
                            if let (Some(vt_), false) = (p.vector, doa.is_empty()) {
                                let dar = &doa[i * nv..][..nv];
                                let w = &mut wv[i * nv..][..nv];
                                for c in 0..vis {
                                    let idx = vt_.index.get(p.k_pos.at(b, j0 + c, tk) - qp);
                                    dpr[c] += dar[idx];
                                    w[idx] += pr[c];
                                }
                            }
                            // dS = P ∘ (dP − D_i), in place of dP.
                            let di = dvec[i];
                            for (dv_, pv) in dpr.iter_mut().zip(pr.iter()) {
                                *dv_ = pv * (*dv_ - di);
                            }
                            let dsr = &dpr[..vis];
                            if let (Some(t), true) = (p.scalar, want.0) {
                                for (c, v) in dsr.iter().enumerate() {
                                    let idx = t.index.get(p.k_pos.at(b, j0 + c, tk) - qp);
                                    part.scalar[idx * dm.q_heads + h] += v;
                                }
                            }
                            if let (Some(vt_), false) = (p.vector, wk.is_empty()) {
                                let w = &mut wk[i * nv..][..nv];
                                for (c, v) in dsr.iter().enumerate() {
                                    w[vt_.index.get(p.k_pos.at(b, j0 + c, tk) - qp)] += v;
                                }
                            }
                            if let Some(ptr) = ptrs.dense {
                                let base = ((bh * tq) + i) * tk + j0;
                                for (c, v) in dpr.iter().enumerate() {
                                    unsafe { *ptr.0.add(base + c) = *v };
                                }
                            }
                            if let Some(ptr) = ptrs.cq {
                                unsafe { *ptr.0.add(bh * tq + i) += tile::sum(dsr) };
                            }
                            if let Some(ptr) = ptrs.ck {
                                for (c, v) in dsr.iter().enumerate() {
                                    unsafe { *ptr.0.add(bh * tk + j0 + c) -= v };
                                }
                            }
                        }
                        unsafe {
                            // dV[j0..] += Pᵀ · dO[i0..]
                            tile::gemm(
                                level,
                                n,
                                d,
                                rows,
                                pm.as_ptr(),
                                1,
                                BK,
                                d_o.as_ptr().add(do0 + i0 * do_rows.st),
                                do_rows.st,
                                dv.as_mut_ptr().add(j0 * d),
                                d,
                                true,
                            );
                            // dK̃[j0..] += dSᵀ · Q̃[i0..]
                            tile::gemm(
                                level,
                                n,
                                d,
                                rows,
                                dp.as_ptr(),
                                1,
                                BK,
                                qs.as_ptr().add(i0 * d),
                                d,
                                dkr.as_mut_ptr().add(j0 * d),
                                d,
                                true,
                            );
                            // dQ̃[i0..] += dS · K̃[j0..]
                            tile::gemm_nn(
                                level,
                                rows,
                                d,
                                n,
                                dp.as_ptr(),
                                BK,
                                kr.as_ptr().add(j0 * d),
                                d,
                                dqs.as_mut_ptr().add(i0 * d),
                                d,
                                true,
                            );
                        }
                        j0 += n;
                    }
                    i0 += rows;
                }
                // Shaw's tables: dQ̃ += Wk·a^K, d a^K += Wkᵀ·Q̃, d a^V += Wvᵀ·dO.
                if let Some(ak) = keys {
                    unsafe {
                        tile::gemm_nn(
                            level,
                            tq,
                            d,
                            nv,
                            wk.as_ptr(),
                            nv,
                            ak.as_ptr(),
                            d,
                            dqs.as_mut_ptr(),
                            d,
                            true,
                        );
                        if want.1 {
                            tile::gemm(
                                level,
                                nv,
                                d,
                                tq,
                                wk.as_ptr(),
                                1,
                                nv,
                                qs.as_ptr(),
                                d,
                                part.keys.as_mut_ptr(),
                                d,
                                true,
                            );
                        }
                    }
                }
                if values.is_some() && want.2 {
                    unsafe {
                        tile::gemm(
                            level,
                            nv,
                            d,
                            tq,
                            wv.as_ptr(),
                            1,
                            nv,
                            d_o.as_ptr().add(do0),
                            do_rows.st,
                            part.values.as_mut_ptr(),
                            d,
                            true,
                        )
                    };
                }
                // dq = scale·Rᵀ·dQ̃.
                for t in 0..tq {
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(ptrs.dq.0.add(g.dq_rows.at(b, h, t)), d)
                    };
                    let row = p.rotation.as_ref().map_or(0, |r| r.q_rows.row(b, t, tq));
                    unrotate(
                        p.rotation.as_ref(),
                        true,
                        row,
                        &dqs[t * d..][..d],
                        dst,
                        p.scale,
                    );
                }
            }
            for t in 0..tk {
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(ptrs.dk.0.add(g.dk_rows.at(b, hk, t)), d)
                };
                let row = p.rotation.as_ref().map_or(0, |r| r.k_rows.row(b, t, tk));
                unrotate(
                    p.rotation.as_ref(),
                    false,
                    row,
                    &dkr[t * d..][..d],
                    dst,
                    1.0,
                );
                let dvd = unsafe {
                    std::slice::from_raw_parts_mut(ptrs.dv.0.add(g.dv_rows.at(b, hk, t)), d)
                };
                dvd.copy_from_slice(&dv[t * d..][..d]);
            }
        }
    }
    part
}

/// The plain `f64` reference: the whole `(T_q × T_k)` logits matrix per head,
/// exact softmax, the formula of the [module docs](self). Returns the output
/// as contiguous `(B, H_q, T_q, D)`.
pub fn reference_forward(p: &Problem) -> Vec<f64> {
    let dm = p.dims;
    let d = dm.head_dim;
    let mut out = vec![0f64; dm.batch * dm.q_heads * dm.q_len * d];
    let nv = p.n_vec_rows();
    let rot_f64 = |src: &[f32], tables: &RopeTables, row: usize, rot: &Rotation| -> Vec<f64> {
        let nf = tables.n_freq;
        let mut y: Vec<f64> = src.iter().map(|&v| v as f64).collect();
        for pi in 0..rot.rotary_dim / 2 {
            let (a, bb) = match rot.pairs {
                PairLayout::HalfSplit => (pi, pi + rot.rotary_dim / 2),
                PairLayout::Interleaved => (2 * pi, 2 * pi + 1),
            };
            let (c, s) = (
                tables.cos[row * nf + pi] as f64,
                tables.sin[row * nf + pi] as f64,
            );
            let (x0, x1) = (src[a] as f64, src[bb] as f64);
            y[a] = x0 * c - x1 * s;
            y[bb] = x1 * c + x0 * s;
        }
        y
    };
    for b in 0..dm.batch {
        for h in 0..dm.q_heads {
            let hk = h / p.group();
            let qv: Vec<Vec<f64>> = (0..dm.q_len)
                .map(|t| {
                    let src = &p.q[p.q_rows.at(b, h, t)..][..d];
                    match &p.rotation {
                        Some(rot) => rot_f64(src, &rot.q, rot.q_rows.row(b, t, dm.q_len), rot),
                        None => src.iter().map(|&v| v as f64).collect(),
                    }
                })
                .collect();
            let kv: Vec<Vec<f64>> = (0..dm.k_len)
                .map(|t| {
                    let src = &p.k[p.k_rows.at(b, hk, t)..][..d];
                    match &p.rotation {
                        Some(rot) => rot_f64(src, &rot.k, rot.k_rows.row(b, t, dm.k_len), rot),
                        None => src.iter().map(|&v| v as f64).collect(),
                    }
                })
                .collect();
            for i in 0..dm.q_len {
                let qp = p.q_pos.at(b, i, dm.q_len);
                let (lo, vis) = p.span(i);
                let mut s = vec![f64::NEG_INFINITY; dm.k_len];
                for (j, sj) in s.iter_mut().enumerate().take(vis).skip(lo) {
                    let r = p.k_pos.at(b, j, dm.k_len) - qp;
                    let mut x: f64 = (0..d).map(|x| qv[i][x] * kv[j][x]).sum();
                    if let Some(ak) = p.vector.and_then(|v| v.keys) {
                        let idx = p.vector.map(|v| v.index.get(r)).unwrap_or(0);
                        x += (0..d)
                            .map(|x| qv[i][x] * ak[idx * d + x] as f64)
                            .sum::<f64>();
                    }
                    x *= p.scale as f64;
                    if let Some(a) = p.alibi {
                        let m = a.slopes[h] as f64;
                        x += if a.symmetric {
                            -m * (r as f64).abs()
                        } else {
                            m * r as f64
                        };
                    }
                    if let Some(t) = p.scalar {
                        x += t.table[t.index.get(r) * dm.q_heads + h] as f64;
                    }
                    if let Some(db) = p.dense {
                        x += db.data[db.offset + b * db.sb + h * db.sh + i * db.si + j * db.sj]
                            as f64;
                    }
                    if let Some(cb) = p.cumulative {
                        x += cb.q[(b * dm.q_heads + h) * dm.q_len + i] as f64
                            - cb.k[(b * dm.q_heads + h) * dm.k_len + j] as f64;
                    }
                    *sj = x;
                }
                if vis <= lo {
                    continue;
                }
                let mx = s[..vis].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s[..vis].iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                let o = &mut out[((b * dm.q_heads + h) * dm.q_len + i) * d..][..d];
                for (j, ej) in e.iter().enumerate() {
                    let pj = ej / z;
                    let vrow = &p.v[p.v_rows.at(b, hk, j)..][..d];
                    for x in 0..d {
                        o[x] += pj * vrow[x] as f64;
                    }
                    if let Some(av) = p.vector.and_then(|v| v.values) {
                        let r = p.k_pos.at(b, j, dm.k_len) - qp;
                        let idx = p.vector.map(|v| v.index.get(r)).unwrap_or(0);
                        debug_assert!(idx < nv);
                        for x in 0..d {
                            o[x] += pj * av[idx * d + x] as f64;
                        }
                    }
                }
            }
        }
    }
    out
}
