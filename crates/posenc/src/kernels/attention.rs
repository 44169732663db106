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
//! the probabilities tile by tile from that log-sum-exp (query tiles
//! outside, key tiles inside; the gradients of a head's keys and values
//! accumulate in the task's own buffers, no atomics) and writes the
//! gradients of queries, keys, values and every bias parameter.
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

#[cfg(target_arch = "x86_64")]
mod bf16_tiles;
mod grad;
mod reference;

#[cfg(target_arch = "x86_64")]
use bf16_tiles::{bf16_forward, forward_bf16};
pub use grad::{backward, backward_extra_floats};
pub use reference::reference_forward;

/// Queries per forward tile on short sequences. A causal tile spans the
/// keys up to its last query's; where its first rows see only part of that
/// span (the diagonal, a window's edges), its products run by groups of
/// rows ([`tile::gemm_trimmed`]) on the keys each group sees, rounded up to
/// whole registers. The hidden entries only ever added exact zeros, so the
/// results keep their bits (a lab training run writes the same checkpoint
/// with any tile).
const BQ: usize = 32;
/// Queries per tile of the backward pass (9,216 of the 128-token head's
/// entries; its five products per tile, against the forward's two, make
/// the smaller tile pay there). Same bits, for the same reason.
const BQ_BWD: usize = 16;
/// Queries per tile of the backward pass on long sequences (more than
/// [`LONG_KEYS`] keys): the products' register tiles reload their
/// accumulators a quarter as often as with [`BQ_BWD`], and on the diagonal
/// they run by groups of rows on the keys each group sees
/// ([`tile::gemm_trimmed`]). Same bits.
const BQ_BWD_LONG: usize = 64;
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
/// --example attention_time -- 4096 3`, `-- 16384 2`). With AVX2 they run on
/// posenc's 6 × 16 AVX2 panel, which needs no packing: with every library at
/// AVX2 on that Zen 4 (docs/speed.md, "A Zen 3 stand-in"), one layer of
/// SmolLM2's attention at 4,096 tokens took 123.8–135.4 ms against
/// 133.9–134.3 ms on the `gemm` crate, and Self-Extend's two ranges (more,
/// partial tiles, each packed by the crate) 135.4–137.0 ms against
/// 142.2–143.8 ms (`python scripts/bench/hf_attention.py --lengths 4096`,
/// four alternated pairs); at 16,384 tokens the same within the machine's
/// spread (2,061–2,163 ms against 2,087–2,188, Self-Extend 2,175–2,184
/// against 2,160–2,205). The tile kernel's products have the same bits at
/// every level.
/// Elsewhere (no AVX2, or aarch64) they run on the `gemm` crate, whose own
/// kernels beat the portable panels; larger tiles amortise its packing.
const BK_LONG: usize = 512;
/// Queries per tile of the forward pass on long sequences (96 and 64 ran
/// within 1% of each other at 4,096 tokens with 512 keys; 128 was 3%
/// slower). Each row's softmax runs over the same key tiles for any value,
/// but the last tile's width (up to the tile's last visible key) and so the
/// products' sums depend on the tile a row falls in: a caller that splits
/// one pass's queries into several calls keeps one call's bits when each
/// call starts at a multiple of this many rows (see [`LONG_KEYS`]).
pub const LONG_QUERY_TILE: usize = BQ_LONG;
const BQ_LONG: usize = 96;
/// Keys beyond which the forward pass takes the long-sequence tiles. A
/// caller that splits one pass's queries into several calls (each with the
/// keys up to its last query) keeps one call's bits when every call has more
/// keys than this and starts at a multiple of [`LONG_QUERY_TILE`] rows, or
/// the whole pass has at most this many keys.
pub const LONG_KEYS: usize = 1024;

/// The blocks of query rows that split one causal pass of `t` queries after
/// `offset` cached keys (each block over the keys up to its last query)
/// into calls of about `rows` queries with one call's bits: `(rows,
/// first_end)`, the rows of every block after the first and the end of the
/// first. Past [`LONG_KEYS`] keys the first block reaches past them and every
/// block starts at a multiple of [`LONG_QUERY_TILE`], so each block runs the
/// tiles one call would.
pub fn query_blocks(offset: usize, t: usize, rows: usize) -> (usize, usize) {
    if offset + t > LONG_KEYS {
        let rows = rows.min(t).max(1).next_multiple_of(LONG_QUERY_TILE);
        let first = rows.max((LONG_KEYS + 1).saturating_sub(offset));
        (rows, first.next_multiple_of(LONG_QUERY_TILE))
    } else {
        (rows, rows)
    }
}

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
/// The leading dimension of a packed `(D, bk)` block of transposed keys (or
/// values): 16 more than `bk`, so that the rows a register tile reads
/// (power-of-two strides apart otherwise) spread over the cache's sets.
#[inline(always)]
fn packed_ld(bk: usize) -> usize {
    bk + 16
}

/// The alignment of a window's first key tile ([`Problem::tile_span`]):
/// 16 floats, one AVX-512 register.
const WINDOW_ALIGN: usize = 16;

/// The key tiles `(j0, n)` over keys `start..end`: the first up to the next
/// multiple of `bk`, then whole tiles of `bk` (the last one shorter). With
/// `start` a multiple of `bk` (always, without a window) these are the
/// tiles at multiples of `bk`.
fn key_tiles(start: usize, end: usize, bk: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut j0 = start;
    std::iter::from_fn(move || {
        if j0 >= end {
            return None;
        }
        let n = (bk - j0 % bk).min(end - j0);
        let tile = (j0, n);
        j0 += n;
        Some(tile)
    })
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

impl Dims {
    /// The sizes `B`, `H_q`, `H_k`, `T_q`, `T_k`, `D`, in this order.
    pub fn new(
        batch: usize,
        q_heads: usize,
        kv_heads: usize,
        q_len: usize,
        k_len: usize,
        head_dim: usize,
    ) -> Self {
        Self {
            batch,
            q_heads,
            kv_heads,
            q_len,
            k_len,
            head_dim,
        }
    }
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
pub(crate) struct SendPtr(pub(crate) *mut f32);
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

impl Grads<'_> {
    /// The gradients of `q`, `k` and `v` alone (no bias table's).
    pub fn qkv(
        (dq, dq_rows): (*mut f32, Rows),
        (dk, dk_rows): (*mut f32, Rows),
        (dv, dv_rows): (*mut f32, Rows),
    ) -> Self {
        Grads {
            dq,
            dq_rows,
            dk,
            dk_rows,
            dv,
            dv_rows,
            scalar: None,
            keys: None,
            values: None,
            dense: None,
            cumulative_q: None,
            cumulative_k: None,
        }
    }
}

impl Problem<'_> {
    /// Writes `scale·R·src` (`scale·Rᵀ·src` with `inverse`) into `dst`, `R`
    /// the rotation of time step `(b, t)` of the queries (`query`) or the
    /// keys; without a rotation `scale·src` (a copy for `scale = 1`).
    #[inline(always)]
    fn rotate(
        &self,
        query: bool,
        (b, t): (usize, usize),
        src: &[f32],
        dst: &mut [f32],
        inverse: bool,
        scale: f32,
    ) {
        match &self.rotation {
            Some(rot) => {
                let row = if query {
                    rot.q_rows.row(b, t, self.dims.q_len)
                } else {
                    rot.k_rows.row(b, t, self.dims.k_len)
                };
                rot.row(query, row, src, dst, inverse, scale);
            }
            None if scale == 1.0 => dst.copy_from_slice(src),
            None => {
                for (o, i) in dst.iter_mut().zip(src) {
                    *o = i * scale;
                }
            }
        }
    }

    fn group(&self) -> usize {
        self.dims.q_heads / self.dims.kv_heads
    }

    fn shift(&self) -> i64 {
        self.dims.k_len as i64 - self.dims.q_len as i64
    }

    /// Keys visible to query `i`: `0..visible(i)`.
    #[inline(always)]
    fn visible(&self, i: usize) -> usize {
        visible_keys(self.dims, self.causal, i)
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

    /// Whether some of the queries `i0..i0 + rows` see only part of the keys
    /// `j0..j0 + n` (the causal diagonal, a window's edges): such a tile
    /// runs its products on [`Problem::seen`]'s keys
    /// ([`tile::gemm_trimmed`]). Both ends of a query's span are
    /// non-decreasing in the query, so the first and last queries decide.
    #[inline(always)]
    fn sees_part(&self, i0: usize, rows: usize, j0: usize, n: usize) -> bool {
        self.span(i0 + rows - 1).0 > j0 || self.span(i0).1 < j0 + n
    }

    /// The keys of the tile `j0..j0 + n` that the queries `i0 + r0..i0 + r1`
    /// see together, as `lo..hi` counted from `j0` (`r0 < r1`).
    #[inline(always)]
    fn seen(&self, i0: usize, j0: usize, n: usize, r0: usize, r1: usize) -> (usize, usize) {
        let lo = self.span(i0 + r0).0.saturating_sub(j0).min(n);
        let hi = self.span(i0 + r1 - 1).1.saturating_sub(j0).min(n);
        (lo, hi)
    }

    /// The first key and the end of the keys the queries `i0..i0 + rows`
    /// see together. The first key is a multiple of [`WINDOW_ALIGN`] (0
    /// without a window): the key tiles then run from it to the next
    /// multiple of the key tile and on by whole tiles ([`key_tiles`]), so a
    /// window's tiles start where its keys do, not up to a tile before.
    #[inline(always)]
    fn tile_span(&self, i0: usize, rows: usize) -> (usize, usize) {
        let (_, end) = self.span(i0 + rows - 1);
        match self.window {
            None => (0, end),
            Some(_) => {
                // Both ends of a window are non-decreasing in the query.
                let (lo, _) = self.span(i0);
                let lo = lo.min(end);
                (lo / WINDOW_ALIGN * WINDOW_ALIGN, end)
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

/// Keys visible to query `i` of a problem of sizes `dims`: `0..` this many
/// (all of them without the causal mask, whose queries are the last `T_q`
/// keys).
#[inline(always)]
fn visible_keys(dims: Dims, causal: bool, i: usize) -> usize {
    if causal {
        let shift = dims.k_len as i64 - dims.q_len as i64;
        (i as i64 + shift + 1).clamp(0, dims.k_len as i64) as usize
    } else {
        dims.k_len
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
    let src = &p.q[p.q_rows.at(b, h, t)..][..p.dims.head_dim];
    p.rotate(true, (b, t), src, dst, false, p.scale);
}

/// Copies key `(b, h, t)` into `dst`, rotated.
#[inline(always)]
fn load_k(p: &Problem, b: usize, h: usize, t: usize, dst: &mut [f32]) {
    let src = &p.k[p.k_rows.at(b, h, t)..][..p.dims.head_dim];
    p.rotate(false, (b, t), src, dst, false, 1.0);
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

/// Runs `f` for the `per_group` tasks of each of `groups` groups (task
/// `g · per_group + i`), on rayon's threads if `parallel`: each thread
/// takes the next task when it is free, group after group, and within a
/// group from its last task to its first.
///
/// The forward pass's groups are its (batch, head) pairs and their tasks
/// its query tiles. A causal pass's last tiles see every key, its first
/// ones a few: handed out in task order by rayon's halves of the range
/// (split only where a thread steals), one thread could be left with a run
/// of long tiles while the other idled (15 of 125 ms at 4,096 tokens with 9
/// query heads on 2 threads). Taken one at a time, longest first within a
/// head, the pass ends on short tiles; a head's tiles stay together, so its
/// keys and values stay in cache. The backward pass's groups are its
/// (batch, key/value head) pairs and their tasks runs of key tiles. Each
/// task writes its own elements: the order changes no result.
fn run_in_turn(groups: usize, per_group: usize, parallel: bool, f: impl Fn(usize) + Sync + Send) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let n = groups * per_group;
    let threads = super::threads();
    if !parallel || n < 2 || threads < 2 {
        (0..n).for_each(f);
        return;
    }
    let next = AtomicUsize::new(0);
    (0..threads.min(n)).into_par_iter().for_each(|_| loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        let (g, r) = (i / per_group, i % per_group);
        f(g * per_group + per_group - 1 - r);
    });
}

/// The forward pass: writes `out` (laid out as `out_rows`, `(B, H_q, T_q,
/// D)`) and the log-sum-exp of every row, `lse` (contiguous `(B, H_q, T_q)`;
/// `−∞` for a query that sees no key, whose output is 0).
///
/// # Panics
/// On buffers too short for their layouts (the tensor API checks them
/// before calling).
pub fn forward(p: &Problem, out: &mut [f32], out_rows: Rows, lse: &mut [f32], level: SimdLevel) {
    forward_impl(p, out, out_rows, lse, Extra::None, level)
}

/// The forward pass of [`forward`] (the same bits) that also writes every
/// logit a query sees, biases added, into `kept` ([`KeptLogits`]'s layout),
/// so that [`backward`] reads them instead of multiplying the queries by the
/// keys a second time: one of the backward's five products, some 14% of a
/// causal pass's work, for `4·kept.floats()` bytes held from the forward to
/// the backward.
///
/// # Panics
/// On buffers too short for their layouts, and where
/// [`KeptLogits::new`] gives none for `p` at `level`.
pub fn forward_keeping(
    p: &Problem,
    out: &mut [f32],
    out_rows: Rows,
    lse: &mut [f32],
    kept: &mut [f32],
    level: SimdLevel,
) {
    let layout = KeptLogits::new(p, level).expect("the logits can be kept for this problem");
    assert!(kept.len() >= layout.floats());
    let kept = Extra::Keep(SendPtr(kept.as_mut_ptr()), &layout);
    forward_impl(p, out, out_rows, lse, kept, level)
}

/// The outputs of earlier passes over other key ranges of the same queries
/// (a training-free method's ranges, [`crate::extend`]), which
/// [`forward_merging`] merges with its own.
#[derive(Debug, Clone, Copy)]
pub struct Parts<'a> {
    /// Each earlier pass's output (laid out as `rows`) and log-sum-exp
    /// (contiguous `(B, H_q, T_q)`), in range order.
    pub parts: &'a [(&'a [f32], &'a [f32])],
    /// The layout of their outputs.
    pub rows: Rows,
}

/// The forward pass of the last of several ranges (`p.window`) over the
/// same queries, merged with the earlier ones' `parts` as one softmax over
/// all of them: row by row, each range's output weighed by `exp(lse − m)`
/// over the ranges' sum (`m` their largest log-sum-exp; zeros where no
/// range has a key), written into `out`; `lse` gets this pass's own. The
/// same numbers as merging every pass's output afterwards, with no buffer
/// and no memory pass for the last one.
///
/// # Panics
/// On buffers too short for their layouts; with Shaw's value tables.
pub fn forward_merging(
    p: &Problem,
    out: &mut [f32],
    out_rows: Rows,
    lse: &mut [f32],
    parts: Parts,
    level: SimdLevel,
) {
    let dm = p.dims;
    let n = dm.batch * dm.q_heads * dm.q_len;
    for (o, l) in parts.parts {
        assert!(
            o.len()
                >= parts
                    .rows
                    .extent(dm.batch, dm.q_heads, dm.q_len, dm.head_dim)
        );
        assert!(l.len() >= n);
    }
    assert!(
        p.vector.is_none(),
        "Shaw's value tables are added after the merge"
    );
    forward_impl(p, out, out_rows, lse, Extra::Parts(parts), level)
}

/// Where the logits kept by [`forward_keeping`] lie: for each `(b, h)` pair
/// in order, for each tile of [`BK`] keys, the rows of the queries that see
/// some of its keys, [`BK`] floats each (a causal pass's diagonal tiles
/// padded). The backward pass reads a tile pair's logits as one run of
/// memory, and the forward writes whole rows of a tile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptLogits {
    /// For each key tile, the first query that sees it and where its rows
    /// start within a pair's block; the block's length last.
    tiles: Vec<(usize, usize)>,
    /// `(b, h)` pairs.
    pairs: usize,
}

impl KeptLogits {
    /// The layout for `p`'s logits, or `None` where they are not kept:
    /// key windows (a forward-only context method) and the forward's
    /// bfloat16 products ([`Products::Bf16`] where the CPU takes them),
    /// whose logits are not the backward's.
    pub fn new(p: &Problem, level: SimdLevel) -> Option<KeptLogits> {
        #[cfg(target_arch = "x86_64")]
        if bf16_forward(p, level) {
            return None;
        }
        let _ = level;
        if p.window.is_some() {
            return None;
        }
        Some(Self::masked(p.dims, p.causal))
    }

    /// The layout for a problem of sizes `dims` without a key window, with
    /// or without the causal mask.
    pub fn masked(dims: Dims, causal: bool) -> KeptLogits {
        let tq = dims.q_len;
        let mut tiles = Vec::with_capacity(dims.k_len.div_ceil(BK) + 1);
        let mut at = 0usize;
        for j0 in (0..dims.k_len).step_by(BK) {
            // Visible keys grow with the query.
            let (mut first, mut past) = (0, tq);
            while first < past {
                let mid = (first + past) / 2;
                if visible_keys(dims, causal, mid) <= j0 {
                    first = mid + 1;
                } else {
                    past = mid;
                }
            }
            tiles.push((first, at));
            at = at.saturating_add((tq - first).saturating_mul(BK));
        }
        tiles.push((tq, at));
        KeptLogits {
            tiles,
            pairs: dims.batch * dims.q_heads,
        }
    }

    /// Floats of the whole buffer (saturating at `usize::MAX`).
    pub fn floats(&self) -> usize {
        self.pairs.saturating_mul(self.per_pair())
    }

    fn per_pair(&self) -> usize {
        self.tiles[self.tiles.len() - 1].1
    }

    /// Where the logit of query `i` and key `j` of pair `bh` lies (`j`
    /// visible to `i`); the keys after it up to the end of its tile follow.
    #[inline(always)]
    fn at(&self, bh: usize, i: usize, j: usize) -> usize {
        let (first, start) = self.tiles[j / BK];
        debug_assert!(i >= first);
        bh * self.per_pair() + start + (i - first) * BK + j % BK
    }

    /// Writes query `i`'s logits `s` of keys `j0..` (pair `bh`) at `base`.
    ///
    /// # Safety
    /// `base` holds [`floats`](Self::floats) floats; the keys are visible
    /// to `i`; no other thread writes these elements.
    #[inline(always)]
    unsafe fn store(&self, base: SendPtr, bh: usize, i: usize, j0: usize, s: &[f32]) {
        let mut c = 0;
        while c < s.len() {
            let j = j0 + c;
            let n = (BK - j % BK).min(s.len() - c);
            std::ptr::copy_nonoverlapping(s.as_ptr().add(c), base.0.add(self.at(bh, i, j)), n);
            c += n;
        }
    }
}

/// The logits kept by a forward pass: where they are, and their layout.
type Kept<'a> = Option<(SendPtr, &'a KeptLogits)>;

/// What a forward pass does besides its output: keep its logits, or merge
/// its output with earlier ranges'.
#[derive(Clone, Copy)]
enum Extra<'a> {
    None,
    Keep(SendPtr, &'a KeptLogits),
    Parts(Parts<'a>),
}

impl<'a> Extra<'a> {
    fn kept(self) -> Kept<'a> {
        match self {
            Extra::Keep(ptr, at) => Some((ptr, at)),
            _ => None,
        }
    }
}

/// Merges row `(b, h, i)`'s output `o` of the last range (log-sum-exp
/// `lse`) with the earlier ranges' (see [`forward_merging`]), in place: the
/// arithmetic of a merge of every range's output afterwards.
#[inline(always)]
fn merge_row(
    parts: &Parts,
    (b, h, i): (usize, usize, usize),
    dims: Dims,
    o: &mut [f32],
    lse: f32,
    cur: &mut [f32],
) {
    let li = (b * dims.q_heads + h) * dims.q_len + i;
    let at = parts.rows.at(b, h, i);
    let m = parts
        .parts
        .iter()
        .map(|(_, l)| l[li])
        .chain([lse])
        .fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        o.fill(0.0);
        return;
    }
    let z: f32 = parts
        .parts
        .iter()
        .map(|(_, l)| l[li])
        .chain([lse])
        .map(|l| (l - m).exp())
        .sum();
    cur.copy_from_slice(o);
    o.fill(0.0);
    let d = o.len();
    let rows = parts.parts.iter().map(|(po, l)| (&po[at..at + d], l[li]));
    for (row, l) in rows.chain([(&cur[..], lse)]) {
        let w = (l - m).exp();
        if w == 0.0 {
            continue;
        }
        let f = w / z;
        for (x, y) in o.iter_mut().zip(row) {
            *x += f * y;
        }
    }
}

fn forward_impl(
    p: &Problem,
    out: &mut [f32],
    out_rows: Rows,
    lse: &mut [f32],
    extra: Extra,
    level: SimdLevel,
) {
    let dm = p.dims;
    assert!(out.len() >= out_rows.extent(dm.batch, dm.q_heads, dm.q_len, dm.head_dim));
    assert!(lse.len() >= dm.batch * dm.q_heads * dm.q_len);
    #[cfg(target_arch = "x86_64")]
    if bf16_forward(p, level) {
        let parts = match extra {
            Extra::None => None,
            Extra::Parts(parts) => Some(parts),
            Extra::Keep(..) => panic!("bfloat16 products keep no logits"),
        };
        forward_bf16(p, out, out_rows, lse, parts, level);
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
        let per = dm.head_dim * dm.k_len.div_ceil(bk) * packed_ld(bk);
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
    run_in_turn(dm.batch * dm.q_heads, q_tiles, parallel, |task| {
        let (out_ptr, lse_ptr) = (out_ptr, lse_ptr);
        forward_dispatch(
            level, p, task, q_tiles, shared, out_ptr, out_rows, lse_ptr, extra, level,
        )
    });
}

crate::multiversion!(fn forward_dispatch => forward_task(
    p: &Problem, task: usize, q_tiles: usize, shared: &[f32], out: SendPtr, out_rows: Rows, lse: SendPtr,
    extra: Extra, level: SimdLevel) -> ());

crate::multiversion!(fn pack_dispatch => pack_all_keys(
    p: &Problem, b: usize, hk: usize, dst: &mut [f32]) -> ());

/// Packs every key of `(b, hk)` rotated and transposed into `dst`, tile by
/// tile: keys `j0..j0 + bk` as a contiguous `(D, bk)` block with leading
/// dimension [`packed_ld`] (a power-of-two leading dimension of `T_k` would
/// map a tile's rows onto the same cache sets).
#[inline(always)]
fn pack_all_keys(p: &Problem, b: usize, hk: usize, dst: &mut [f32]) {
    let d = p.dims.head_dim;
    let bk = key_tile(p.dims.k_len);
    let mut rows = vec![0f32; bk * d];
    let ld = packed_ld(bk);
    for (jt, block) in dst.chunks_mut(d * ld).enumerate() {
        let j0 = jt * bk;
        let n = bk.min(p.dims.k_len - j0);
        for t in 0..n {
            prefetch_kv(p, b, hk, j0 + t + PREFETCH_AHEAD);
            load_k(p, b, hk, j0 + t, &mut rows[t * d..][..d]);
        }
        // SAFETY: `rows` holds n × d, `block` d × ld.
        unsafe { tile::transpose(n, d, rows.as_ptr(), d, block.as_mut_ptr(), ld) };
    }
}

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

/// The product `g` of a forward tile: on the gemm crate's kernel
/// (`crate_gemm`, one thread, the long tiles without AVX2), else on
/// [`tile::gemm`] at `level`, on the parts `limit` gives when `trim`
/// ([`tile::gemm_maybe_trimmed`]; never with `crate_gemm`).
///
/// # Safety
/// As [`tile::gemm`].
#[inline(always)]
unsafe fn block_product(
    crate_gemm: bool,
    level: SimdLevel,
    g: tile::Gemm,
    trim: bool,
    limit: impl Fn(usize, usize) -> ([usize; 2], [usize; 2]),
) {
    debug_assert!(!(crate_gemm && trim));
    if crate_gemm {
        gemm::gemm(
            g.m,
            g.n,
            g.k,
            g.c,
            1,
            g.ldc as isize,
            g.accumulate,
            g.a.p,
            g.a.cs as isize,
            g.a.rs as isize,
            g.b,
            1,
            g.ldb as isize,
            if g.accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    } else {
        tile::gemm_maybe_trimmed(level, g, trim, limit)
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
    extra: Extra,
    level: SimdLevel,
) {
    let kept = extra.kept();
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
    let (k_start, k_end) = p.tile_span(i0, rows);
    let nqa = if keys.is_some() { rows * nv } else { 0 };
    let nwv = if values.is_some() { rows * nv } else { 0 };
    let nakt = if keys.is_some() { d * nv } else { 0 };
    // Keys of (b, hk), rotated and transposed: from `shared` (all of them,
    // leading dimension T_k), else packed here (0..k_end).
    let nk = if shared.is_empty() { d * k_end } else { 0 };
    // The long tiles' products on the `gemm` crate without AVX2 (see
    // BK_LONG).
    let crate_gemm = bk == BK_LONG && !matches!(level, SimdLevel::Avx512 | SimdLevel::Avx2);
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
                let per = d * dm.k_len.div_ceil(bk) * packed_ld(bk);
                (
                    &shared[(b * dm.kv_heads + hk) * per..][..per],
                    packed_ld(bk),
                    true,
                )
            };
            for r in 0..rows {
                prefetch_q(p, b, h, i0 + r + PREFETCH_AHEAD);
                load_q(p, b, h, i0 + r, &mut q[r * d..][..d]);
            }
            if let Some(ak) = keys {
                // q̃·a^K for every table row: (rows, nv).
                unsafe {
                    tile::transpose(nv, d, ak.as_ptr(), d, akt.as_mut_ptr(), nv);
                    let g = tile::Gemm::new(rows, nv, d)
                        .a(q.as_ptr(), d)
                        .b(akt.as_ptr(), nv);
                    tile::gemm(level, g.to(qa.as_mut_ptr(), nv))
                };
            }
            m.fill(f32::NEG_INFINITY);
            l.fill(0.0);
            acc.fill(0.0);
            wv.fill(0.0);
            for (j0, n) in key_tiles(k_start, k_end, bk) {
                // Column j0 % bk of its packed block (tiled), else column j0.
                let at = if tiled {
                    j0 / bk * d * ldk + j0 % bk
                } else {
                    j0
                };
                let kb = unsafe { kt.as_ptr().add(at) };
                // A tile that some of its rows see only in part (the causal
                // diagonal, a window's edges) runs its products on the keys
                // each group of rows sees (`Problem::seen`): the rest of a
                // row is never read (its logits) or only added zeros (its
                // probabilities), so the results keep their bits.
                let trim = !crate_gemm && p.sees_part(i0, rows, j0, n);
                // S: whole registers of columns from a multiple of 16.
                let logits = |r0, r1| {
                    let (lo, hi) = p.seen(i0, j0, n, r0, r1);
                    ([lo / 16 * 16, hi.next_multiple_of(16)], [0, d])
                };
                // SAFETY: q holds rows × d, the key block d × n with
                // leading dimension ldk, s rows × n.
                let g = tile::Gemm::new(rows, n, d).a(q.as_ptr(), d).b(kb, ldk);
                unsafe { block_product(crate_gemm, level, g.to(s.as_mut_ptr(), n), trim, logits) };
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
                    let keep = kept.map(|(ptr, at)| (ptr, at, b * dm.q_heads + h));
                    let vis = softmax_step(
                        p,
                        (b, h, i, j0),
                        sr,
                        qar,
                        (&mut m[r], &mut l[r]),
                        &mut acc[r * d..][..d],
                        wvr,
                        keep,
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
                let g = tile::Gemm::new(rows, d, n)
                    .a(s.as_ptr(), n)
                    .b(vb, p.v_rows.st);
                let steps = |r0, r1| {
                    let (lo, hi) = p.seen(i0, j0, n, r0, r1);
                    ([0, d], [lo, hi])
                };
                let g = g.add_to(acc.as_mut_ptr(), d);
                unsafe { block_product(crate_gemm, level, g, trim, steps) };
            }
            for r in 0..rows {
                let i = i0 + r;
                let o =
                    unsafe { std::slice::from_raw_parts_mut(out.0.add(out_rows.at(b, h, i)), d) };
                let lse_i = unsafe { &mut *lse.0.add((b * dm.q_heads + h) * dm.q_len + i) };
                let inv = finish_row(o, &acc[r * d..][..d], m[r], l[r], lse_i);
                if let (Some(inv), Some(av)) = (inv, values) {
                    for (t, w) in wv[r * nv..][..nv].iter().enumerate() {
                        if *w != 0.0 {
                            tile::axpy(w * inv, &av[t * d..][..d], o);
                        }
                    }
                }
                if let Extra::Parts(parts) = &extra {
                    // This row's own output, copied aside (the first row of
                    // the accumulators, finished with).
                    let cur = &mut acc[..d];
                    merge_row(parts, (b, h, i), dm, o, *lse_i, cur);
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
/// nothing (no key visible, or every one masked by a −∞ bias). With `keep`
/// (where and the row's `(b, h)` pair; no window) it keeps the logits,
/// biases added.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn softmax_step(
    p: &Problem,
    (b, h, i, j0): (usize, usize, usize, usize),
    sr: &mut [f32],
    qar: &[f32],
    (m, l): (&mut f32, &mut f32),
    acc: &mut [f32],
    wv: &mut [f32],
    keep: Option<(SendPtr, &KeptLogits, usize)>,
) -> usize {
    let (lo, hi) = p.span(i);
    let vis = hi.saturating_sub(j0).min(sr.len());
    if vis == 0 || lo >= j0 + vis {
        sr.fill(0.0);
        return 0;
    }
    p.add_bias(b, h, i, j0, &mut sr[..vis], qar);
    if let Some((ptr, at, bh)) = keep {
        // SAFETY: the forward's buffer; the row's task alone writes it.
        unsafe { at.store(ptr, bh, i, j0, &sr[..vis]) };
    }
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
