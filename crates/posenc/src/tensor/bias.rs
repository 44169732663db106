//! Attention biases as candle tensors (ALiBi, T5, Shaw).
//!
//! Queries are at positions `q_offset..q_offset + Tq` and keys at
//! `k_offset..k_offset + Tk` (with a KV cache: `q_offset = k_offset + Tk −
//! Tq`). Biases come out as `(H, Tq, Tk)` tensors, to be broadcast-added to
//! logits of shape `(B, H, Tq, Tk)`.
//!
//! - [`alibi_bias`]: ALiBi ([`Alibi`]), causal or bidirectional, `f32`;
//! - [`T5RelativeBias`]: T5's learned bucket table `(num_buckets, H)`, as a
//!   trainable module (the gradient reaches the table through an
//!   `index_select`);
//! - [`ShawRelative`]: Shaw et al.'s `q·a^K` logits term and `Σ_j α_ij a^V_ij`
//!   values term, computed without materialising a `(Tq, Tk, d)` tensor:
//!   `q · w^K` for the `2k + 1` table rows (a `(…, Tq, 2k+1)` matmul), then
//!   each logit picks its row through a `(Tq, Tk, 2k+1)` one-hot of the
//!   clipped distance shared by all heads (a batched matmul); for values,
//!   the weights are summed per relative index through the same one-hot,
//!   then multiplied by `w^V`. Memory is `O(Tq·Tk·(2k+1))` once plus
//!   `O(Tq·Tk + Tq·(2k+1)·d)` per head, instead of `O(Tq·Tk·d)` per head;
//!   the backward pass is matmuls only, so gradients reach queries,
//!   attention weights and both tables.
//!
//! ```
//! use candle_core::Device;
//! use posenc::relative::{Alibi, AlibiMode};
//! use posenc::tensor::bias::alibi_bias;
//!
//! let alibi = Alibi::new(4, AlibiMode::Causal)?;
//! let b = alibi_bias(&alibi, 3, 5, 2, 0, &Device::Cpu)?; // queries at 2..5
//! assert_eq!(b.dims(), &[4, 3, 5]);
//! let v: Vec<Vec<Vec<f32>>> = b.to_vec3()?;
//! assert_eq!(v[0][0][0], -0.25 * 2.0); // head 0, query 2, key 0
//! # Ok::<(), posenc::Error>(())
//! ```

use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarBuilder};

use crate::encoding::AttentionBias;
use crate::error::{check_dim, Error, Result};
use crate::relative::{Alibi, Shaw, T5Bias, T5Buckets};

/// `key − query` for every (query, key) pair, row-major `(Tq, Tk)`.
fn relative_grid(q_len: usize, k_len: usize, q_offset: u64, k_offset: u64) -> Result<Vec<i64>> {
    let last_q = q_offset.saturating_add(q_len.saturating_sub(1) as u64);
    let last_k = k_offset.saturating_add(k_len.saturating_sub(1) as u64);
    crate::relative::check_signed(
        [last_q, last_k],
        "attention bias positions (subtracted as i64)",
    )?;
    let mut out = Vec::with_capacity(q_len * k_len);
    for i in 0..q_len as i64 {
        let q = q_offset as i64 + i;
        for j in 0..k_len as i64 {
            out.push(k_offset as i64 + j - q);
        }
    }
    Ok(out)
}

/// The ALiBi bias `(H, Tq, Tk)` in `f32`: `bias[h, i, j] = alibi.bias(h,
/// q_offset + i, k_offset + j)` (computed in `f64`, then rounded).
///
/// # Errors
/// [`Error::PositionOutOfRange`] for positions above `i64::MAX`; candle
/// errors.
pub fn alibi_bias(
    alibi: &Alibi,
    q_len: usize,
    k_len: usize,
    q_offset: u64,
    k_offset: u64,
    device: &Device,
) -> Result<Tensor> {
    let rel = relative_grid(q_len, k_len, q_offset, k_offset)?;
    let h = alibi.num_heads();
    let mut data = Vec::with_capacity(h * rel.len());
    for &m in alibi.slopes() {
        data.extend(rel.iter().map(|&r| alibi.bias_for_distance(m, r) as f32));
    }
    Ok(Tensor::from_vec(data, (h, q_len, k_len), device)?)
}

/// T5's relative attention bias as a trainable module: a `(num_buckets, H)`
/// table (see [`crate::relative::t5`]).
#[derive(Debug, Clone)]
pub struct T5RelativeBias {
    buckets: T5Buckets,
    num_heads: usize,
    table: Tensor,
}

impl T5RelativeBias {
    /// The table named `weight` in `vb`, `(num_buckets, num_heads)`,
    /// initialised N(0, 1) when created.
    ///
    /// # Errors
    /// [`Error::ZeroHeads`]; candle errors from `vb`.
    pub fn new(buckets: T5Buckets, num_heads: usize, vb: VarBuilder) -> Result<Self> {
        if num_heads == 0 {
            return Err(Error::ZeroHeads);
        }
        let table = vb.get_with_hints(
            (buckets.num_buckets(), num_heads),
            "weight",
            Init::Randn {
                mean: 0.0,
                stdev: 1.0,
            },
        )?;
        Ok(Self {
            buckets,
            num_heads,
            table,
        })
    }

    /// A module holding the table of a plain [`T5Bias`] as an `f32`
    /// constant tensor.
    ///
    /// # Errors
    /// Candle errors.
    pub fn from_plain(bias: &T5Bias, device: &Device) -> Result<Self> {
        let nb = bias.buckets().num_buckets();
        let h = bias.num_heads();
        let flat: Vec<f32> = bias.table().iter().flatten().map(|&v| v as f32).collect();
        Ok(Self {
            buckets: *bias.buckets(),
            num_heads: h,
            table: Tensor::from_vec(flat, (nb, h), device)?,
        })
    }

    /// The table, `(num_buckets, H)`.
    pub fn table(&self) -> &Tensor {
        &self.table
    }

    /// The bucketing parameters.
    pub fn buckets(&self) -> &T5Buckets {
        &self.buckets
    }

    /// The bias `(H, Tq, Tk)`: `table[bucket(k − q), h]`.
    ///
    /// # Errors
    /// [`Error::PositionOutOfRange`] for positions above `i64::MAX`; candle
    /// errors.
    pub fn forward(
        &self,
        q_len: usize,
        k_len: usize,
        q_offset: u64,
        k_offset: u64,
    ) -> Result<Tensor> {
        let rel = relative_grid(q_len, k_len, q_offset, k_offset)?;
        let ids: Vec<u32> = rel.iter().map(|&r| self.buckets.bucket(r) as u32).collect();
        let idx = Tensor::from_vec(ids, q_len * k_len, self.table.device())?;
        let rows = self.table.index_select(&idx, 0)?; // (Tq·Tk, H)
        Ok(rows
            .t()?
            .reshape((self.num_heads, q_len, k_len))?
            .contiguous()?)
    }
}

/// Shaw et al.'s relative key and value tables as a trainable module, with
/// the efficient logits and values terms (see the [module docs](self) and
/// [`crate::relative::shaw`]).
///
/// Queries, keys and values are `(…, T, d)` (any leading dimensions, for
/// example `(B, H, T, d)`); tables are `(2k + 1, d)`, shared by the leading
/// dimensions. Inputs of another dtype than the tables are computed in the
/// tables' dtype and cast back.
#[derive(Debug, Clone)]
pub struct ShawRelative {
    max_relative: usize,
    head_dim: usize,
    keys: Tensor,
    values: Tensor,
}

impl ShawRelative {
    /// Tables `keys` and `values` in `vb`, `(2k + 1, head_dim)`, initialised
    /// N(0, 1/d) when created.
    ///
    /// # Errors
    /// [`Error::InvalidDimension`] if `head_dim == 0`; candle errors.
    pub fn new(max_relative: usize, head_dim: usize, vb: VarBuilder) -> Result<Self> {
        check_dim("head_dim", head_dim, false)?;
        let rows = 2 * max_relative + 1;
        let init = Init::Randn {
            mean: 0.0,
            stdev: 1.0 / (head_dim as f64).sqrt(),
        };
        Ok(Self {
            max_relative,
            head_dim,
            keys: vb.get_with_hints((rows, head_dim), "keys", init)?,
            values: vb.get_with_hints((rows, head_dim), "values", init)?,
        })
    }

    /// Constant tensors (of `dtype`) holding a plain [`Shaw`]'s tables.
    ///
    /// # Errors
    /// Candle errors.
    pub fn from_plain(shaw: &Shaw, dtype: DType, device: &Device) -> Result<Self> {
        let mk = |m: &[Vec<f64>]| -> Result<Tensor> {
            let flat: Vec<f64> = m.iter().flatten().copied().collect();
            Ok(Tensor::from_vec(flat, (m.len(), shaw.head_dim()), device)?.to_dtype(dtype)?)
        };
        Ok(Self {
            max_relative: shaw.max_relative(),
            head_dim: shaw.head_dim(),
            keys: mk(shaw.key_table())?,
            values: mk(shaw.value_table())?,
        })
    }

    /// The clipping distance `k`.
    pub fn max_relative(&self) -> usize {
        self.max_relative
    }

    /// The head dimension `d`.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The key table `w^K`, `(2k + 1, d)`.
    pub fn key_table(&self) -> &Tensor {
        &self.keys
    }

    /// The value table `w^V`, `(2k + 1, d)`.
    pub fn value_table(&self) -> &Tensor {
        &self.values
    }

    /// The `(Tq, Tk)` `u32` tensor of table rows `clip(k − q, −k, k) + k`.
    ///
    /// # Errors
    /// [`Error::PositionOutOfRange`] for positions above `i64::MAX`.
    pub fn relative_index(
        &self,
        q_len: usize,
        k_len: usize,
        q_offset: u64,
        k_offset: u64,
        device: &Device,
    ) -> Result<Tensor> {
        let ids: Vec<u32> = relative_grid(q_len, k_len, q_offset, k_offset)?
            .into_iter()
            .map(|r| self.table_row(r) as u32)
            .collect();
        Ok(Tensor::from_vec(ids, (q_len, k_len), device)?)
    }

    /// The table row `clip(r, −k, k) + k` of the relative distance `r`.
    fn table_row(&self, r: i64) -> usize {
        let k = self.max_relative.min(i64::MAX as usize / 2) as i64;
        (r.clamp(-k, k) + k) as usize
    }

    fn check_last(&self, what: &'static str, t: &Tensor, last: usize) -> Result<()> {
        let dims = t.dims();
        if dims.len() < 2 || dims[dims.len() - 1] != last {
            return Err(Error::Shape {
                what,
                expected: format!("(…, T, {last})"),
                got: format!("{dims:?}"),
            });
        }
        Ok(())
    }

    /// The `(Tq, Tk, 2k + 1)` one-hot encoding of the clipped relative
    /// index: shared by every batch entry and head.
    fn onehot(
        &self,
        q_len: usize,
        k_len: usize,
        q_offset: u64,
        k_offset: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let r = 2 * self.max_relative + 1;
        let mut data = vec![0f32; q_len * k_len * r];
        for (n, rel) in relative_grid(q_len, k_len, q_offset, k_offset)?
            .into_iter()
            .enumerate()
        {
            data[n * r + self.table_row(rel)] = 1.0;
        }
        Ok(Tensor::from_vec(data, (q_len, k_len, r), device)?.to_dtype(dtype)?)
    }

    /// The relative-key logits term `q_i · a^K_ij` (not scaled), `(…, Tq,
    /// Tk)`, for queries `q` of shape `(…, Tq, d)` and `k_len` keys.
    ///
    /// # Errors
    /// [`Error::Shape`] if `q`'s last dimension is not `d`;
    /// [`Error::PositionOutOfRange`]; candle errors.
    pub fn key_logits(
        &self,
        q: &Tensor,
        k_len: usize,
        q_offset: u64,
        k_offset: u64,
    ) -> Result<Tensor> {
        self.check_last("shaw queries", q, self.head_dim)?;
        let in_dtype = q.dtype();
        let q = q.to_dtype(self.keys.dtype())?;
        let q_len = q.dims()[q.dims().len() - 2];
        let qa = q.broadcast_matmul(&self.keys.t()?)?; // (…, Tq, R), R = 2k+1
                                                       // out[…, i, j] = Σ_r qa[…, i, r]·onehot[i, j, r]
        let onehot = self.onehot(q_len, k_len, q_offset, k_offset, qa.dtype(), q.device())?;
        let out = per_query_matmul(&qa, &onehot.transpose(1, 2)?.contiguous()?)?;
        Ok(out.to_dtype(in_dtype)?)
    }

    /// The full logits `e_ij = (q_i · k_j + q_i · a^K_ij) / √d`, `(…, Tq,
    /// Tk)`, for `q` `(…, Tq, d)` and `k` `(…, Tk, d)`.
    ///
    /// # Errors
    /// As [`ShawRelative::key_logits`].
    pub fn logits(&self, q: &Tensor, k: &Tensor, q_offset: u64, k_offset: u64) -> Result<Tensor> {
        self.check_last("shaw keys", k, self.head_dim)?;
        let k_len = k.dims()[k.dims().len() - 2];
        let rel = self.key_logits(q, k_len, q_offset, k_offset)?;
        let qk = q.contiguous()?.matmul(&k.t()?.contiguous()?)?;
        Ok(((qk + rel)? / (self.head_dim as f64).sqrt())?)
    }

    /// The relative-values term `Σ_j α_ij a^V_ij`, `(…, Tq, d)`, for
    /// attention weights `α` of shape `(…, Tq, Tk)`.
    ///
    /// # Errors
    /// [`Error::Shape`] for weights of rank < 2; [`Error::PositionOutOfRange`];
    /// candle errors.
    pub fn relative_values(
        &self,
        weights: &Tensor,
        q_offset: u64,
        k_offset: u64,
    ) -> Result<Tensor> {
        let dims = weights.dims().to_vec();
        if dims.len() < 2 {
            return Err(Error::Shape {
                what: "shaw attention weights",
                expected: "(…, Tq, Tk)".into(),
                got: format!("{dims:?}"),
            });
        }
        let in_dtype = weights.dtype();
        let w = weights.to_dtype(self.values.dtype())?.contiguous()?;
        let (q_len, k_len) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        // sums[…, i, r] = Σ_j α[…, i, j]·onehot[i, j, r]; no (Tq, Tk, d) tensor
        let onehot = self.onehot(q_len, k_len, q_offset, k_offset, w.dtype(), w.device())?;
        let sums = per_query_matmul(&w, &onehot)?;
        Ok(sums.broadcast_matmul(&self.values)?.to_dtype(in_dtype)?)
    }
}

/// `x` `(…, Tq, A)` times a matrix per query, `per_query` `(Tq, A, B)`:
/// `(…, Tq, B)`, as one matmul batched over the queries, `(Tq, L, A) ×
/// (Tq, A, B) → (Tq, L, B)` with `L` the product of the leading dims.
/// Matmuls only, so the backward pass is matmuls too (candle 0.11's gather
/// backward fails when the gathered dimension changes size).
fn per_query_matmul(x: &Tensor, per_query: &Tensor) -> Result<Tensor> {
    let dims = x.dims();
    let (q_len, a) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let lead = &dims[..dims.len() - 2];
    let l: usize = lead.iter().product();
    let out = x
        .reshape((l, q_len, a))?
        .transpose(0, 1)?
        .contiguous()?
        .matmul(per_query)?
        .transpose(0, 1)?
        .contiguous()?;
    let mut shape = lead.to_vec();
    shape.extend([q_len, per_query.dim(2)?]);
    Ok(out.reshape(shape)?)
}
