//! Every other family's numbers as numpy arrays: the sinusoidal table,
//! ALiBi's slopes and biases, T5's buckets and biases, Shaw et al.'s
//! clipped indices, xPos's scales, FIRE's normalised distances and CoPE's
//! contextual positions. Each function calls the formula of the `posenc`
//! crate (`posenc::absolute`, `posenc::relative`, `posenc::rope::XPos`).

use numpy::{
    PyArray1, PyArray2, PyArray3, PyArrayMethods, PyReadonlyArray2, PyUntypedArrayMethods,
};
use posenc::absolute::{FrequencySpacing, Sinusoidal, SinusoidalLayout};
use posenc::relative::{
    Alibi, AlibiMode, Cope, CopeConfig, Fire, FireConfig, Shaw, T5Bias, T5Buckets,
};
use posenc::rope::XPos;
use posenc::AttentionBias;
use pyo3::prelude::*;

use crate::error::{err, IntoPy};
use crate::model::count;

/// Largest number of elements one function returns (2^28).
pub const MAX_ELEMENTS: usize = 1 << 28;

fn bounded(what: &str, dims: &[usize]) -> PyResult<()> {
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .unwrap_or(usize::MAX);
    if n > MAX_ELEMENTS {
        return Err(err(format!(
            "{what}: {dims:?} is {n} elements, more than the {MAX_ELEMENTS} one call returns"
        )));
    }
    Ok(())
}

fn grid<'py, T: numpy::Element + Copy>(
    py: Python<'py>,
    rows: Vec<Vec<T>>,
    width: usize,
) -> PyResult<Bound<'py, PyArray2<T>>> {
    let n = rows.len();
    let flat: Vec<T> = rows.into_iter().flatten().collect();
    PyArray1::from_vec(py, flat).reshape([n, width])
}

/// The `(q_len, k_len)` matrix (`k_len` None: `q_len`) that
/// `matrix(q_len, k_len)` computes with the GIL released; `what` names the
/// function in the error of a too large matrix.
fn pair_grid<'py, T: numpy::Element + Copy + Send>(
    py: Python<'py>,
    what: &str,
    q_len: usize,
    k_len: Option<usize>,
    matrix: impl FnOnce(usize, usize) -> posenc::Result<Vec<Vec<T>>> + Send,
) -> PyResult<Bound<'py, PyArray2<T>>> {
    let k_len = k_len.unwrap_or(q_len);
    bounded(what, &[q_len, k_len])?;
    let rows = py.detach(|| matrix(q_len, k_len)).py()?;
    grid(py, rows, k_len)
}

/// An index matrix as int64 (numpy's index type).
fn int64(m: Vec<Vec<usize>>) -> Vec<Vec<i64>> {
    m.into_iter()
        .map(|r| r.into_iter().map(|x| x as i64).collect())
        .collect()
}

/// Every head's (queries × keys) matrix of `bias`
/// ([`AttentionBias::bias_matrix`]) for `q_len` queries from `q_start` and
/// `k_len` keys from `k_start`, as `(heads, q_len, k_len)`.
fn bias_cube<'py>(
    py: Python<'py>,
    bias: &(dyn AttentionBias + Sync),
    heads: usize,
    (q_start, q_len): (u64, usize),
    (k_start, k_len): (u64, usize),
) -> PyResult<Bound<'py, PyArray3<f64>>> {
    let queries: Vec<u64> = (0..q_len as u64).map(|i| q_start + i).collect();
    let keys: Vec<u64> = (0..k_len as u64).map(|j| k_start + j).collect();
    let flat = py
        .detach(|| -> posenc::Result<Vec<f64>> {
            let mut out = Vec::with_capacity(heads * q_len * k_len);
            for h in 0..heads {
                out.extend(bias.bias_matrix(h, &queries, &keys)?.into_iter().flatten());
            }
            Ok(out)
        })
        .py()?;
    PyArray1::from_vec(py, flat).reshape([heads, q_len, k_len])
}

/// The sinusoidal encoding of Vaswani et al., "Attention Is All You Need"
/// (2017): rows for positions `offset..offset + length`, `dim` columns;
/// `layout` `interleaved` (sin in even columns, cos in odd: the paper) or
/// `concatenated` (all sines then all cosines: tensor2tensor, fairseq);
/// `spacing` `paper` (`ω_i = base^(−2i/D)`) or `endpoint` (last frequency
/// `1/base`). Returns `(length, dim)` float64.
#[pyfunction]
#[pyo3(signature = (length, dim, base = 10000.0, offset = 0, layout = "interleaved", spacing = "paper"))]
pub(crate) fn sinusoidal<'py>(
    py: Python<'py>,
    length: i64,
    dim: i64,
    base: f64,
    offset: i64,
    layout: &str,
    spacing: &str,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let length: usize = count(length, "length")?;
    let dim: usize = count(dim, "dim")?;
    let offset: u64 = count(offset, "offset")?;
    bounded("sinusoidal", &[length, dim])?;
    let layout = match layout {
        "interleaved" => SinusoidalLayout::Interleaved,
        "concatenated" => SinusoidalLayout::Concatenated,
        o => {
            return Err(err(format!(
                "layout {o:?}: use \"interleaved\" or \"concatenated\""
            )))
        }
    };
    let spacing = match spacing {
        "paper" => FrequencySpacing::Paper,
        "endpoint" => FrequencySpacing::Endpoint,
        o => return Err(err(format!("spacing {o:?}: use \"paper\" or \"endpoint\""))),
    };
    let s = Sinusoidal::new(dim)
        .py()?
        .with_base(base)
        .py()?
        .with_layout(layout)
        .with_spacing(spacing);
    let rows = py.detach(|| s.table_range(offset, length)).py()?;
    grid(py, rows, dim)
}

/// ALiBi's slopes for `heads` heads (Press et al., "Train Short, Test
/// Long", 2022): a geometric sequence, interleaved for a number of heads
/// that is not a power of two. Returns `(heads,)` float64.
#[pyfunction]
pub(crate) fn alibi_slopes<'py>(
    py: Python<'py>,
    heads: i64,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let heads: usize = count(heads, "heads")?;
    bounded("alibi_slopes", &[heads])?;
    Ok(PyArray1::from_vec(
        py,
        posenc::relative::alibi_slopes(heads).py()?,
    ))
}

/// ALiBi's biases `(heads, q_len, k_len)`: `m_h·(j − i)` (causal) or
/// `−m_h·|j − i|` for query `i` at `q_offset + t` (default: the last
/// `q_len` of the keys) and key `j` at `k_offset + s`.
#[pyfunction]
#[pyo3(signature = (heads, q_len, k_len = None, causal = true, q_offset = None, k_offset = 0))]
pub(crate) fn alibi_bias<'py>(
    py: Python<'py>,
    heads: i64,
    q_len: i64,
    k_len: Option<i64>,
    causal: bool,
    q_offset: Option<i64>,
    k_offset: i64,
) -> PyResult<Bound<'py, PyArray3<f64>>> {
    let heads: usize = count(heads, "heads")?;
    let q_len: usize = count(q_len, "q_len")?;
    let k_len: Option<usize> = k_len.map(|v| count(v, "k_len")).transpose()?;
    let q_offset: Option<u64> = q_offset.map(|v| count(v, "q_offset")).transpose()?;
    let k_offset: u64 = count(k_offset, "k_offset")?;
    let k_len = k_len.unwrap_or(q_len);
    bounded("alibi_bias", &[heads, q_len, k_len])?;
    let mode = if causal {
        AlibiMode::Causal
    } else {
        AlibiMode::Bidirectional
    };
    let a = Alibi::new(heads, mode).py()?;
    let qo = q_offset.unwrap_or(k_offset + k_len.saturating_sub(q_len) as u64);
    bias_cube(py, &a, heads, (qo, q_len), (k_offset, k_len))
}

/// T5's relative position buckets (Raffel et al., "Exploring the Limits of
/// Transfer Learning with a Unified Text-to-Text Transformer", 2020): the
/// `(q_len, k_len)` int64 bucket of each (query, key) pair, exactly
/// transformers' `_relative_position_bucket`.
#[pyfunction]
#[pyo3(signature = (q_len, k_len = None, num_buckets = 32, max_distance = 128, bidirectional = true, q_offset = 0, k_offset = 0))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn t5_buckets<'py>(
    py: Python<'py>,
    q_len: i64,
    k_len: Option<i64>,
    num_buckets: i64,
    max_distance: i64,
    bidirectional: bool,
    q_offset: i64,
    k_offset: i64,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    let q_len: usize = count(q_len, "q_len")?;
    let k_len: Option<usize> = k_len.map(|v| count(v, "k_len")).transpose()?;
    let num_buckets: usize = count(num_buckets, "num_buckets")?;
    let max_distance: usize = count(max_distance, "max_distance")?;
    let q_offset: u64 = count(q_offset, "q_offset")?;
    let k_offset: u64 = count(k_offset, "k_offset")?;
    pair_grid(py, "t5_buckets", q_len, k_len, |q_len, k_len| {
        let b = T5Buckets::new(num_buckets, max_distance, bidirectional)?;
        Ok(int64(b.bucket_matrix(q_len, k_len, q_offset, k_offset)?))
    })
}

/// T5's bias `(heads, q_len, k_len)` from a learned `(num_buckets, heads)`
/// table (float64): `table[bucket(j − i), h]`.
#[pyfunction]
#[pyo3(signature = (table, q_len, k_len = None, max_distance = 128, bidirectional = true))]
pub(crate) fn t5_bias<'py>(
    py: Python<'py>,
    table: PyReadonlyArray2<'py, f64>,
    q_len: i64,
    k_len: Option<i64>,
    max_distance: i64,
    bidirectional: bool,
) -> PyResult<Bound<'py, PyArray3<f64>>> {
    let q_len: usize = count(q_len, "q_len")?;
    let k_len: Option<usize> = k_len.map(|v| count(v, "k_len")).transpose()?;
    let max_distance: usize = count(max_distance, "max_distance")?;
    let k_len = k_len.unwrap_or(q_len);
    let (nb, heads) = (table.shape()[0], table.shape()[1]);
    bounded("t5_bias", &[heads, q_len, k_len])?;
    let rows: Vec<Vec<f64>> = table
        .as_array()
        .rows()
        .into_iter()
        .map(|r| r.to_vec())
        .collect();
    let bias = T5Bias::new(T5Buckets::new(nb, max_distance, bidirectional).py()?, rows).py()?;
    bias_cube(py, &bias, heads, (0, q_len), (0, k_len))
}

/// Shaw et al.'s clipped relative indices ("Self-Attention with Relative
/// Position Representations", 2018): `clip(j − i, −K, K) + K` for query
/// `i` and key `j`, the row of the learned tables `a^K`, `a^V` each pair
/// reads. Returns `(q_len, k_len)` int64.
#[pyfunction]
#[pyo3(signature = (q_len, k_len = None, max_relative = 16, q_offset = 0, k_offset = 0))]
pub(crate) fn shaw_indices<'py>(
    py: Python<'py>,
    q_len: i64,
    k_len: Option<i64>,
    max_relative: i64,
    q_offset: i64,
    k_offset: i64,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    let q_len: usize = count(q_len, "q_len")?;
    let k_len: Option<usize> = k_len.map(|v| count(v, "k_len")).transpose()?;
    let max_relative: usize = count(max_relative, "max_relative")?;
    let q_offset: u64 = count(q_offset, "q_offset")?;
    let k_offset: u64 = count(k_offset, "k_offset")?;
    pair_grid(py, "shaw_indices", q_len, k_len, |q_len, k_len| {
        // The index matrix does not read the learned tables (head_dim 2, seed 0).
        let s = Shaw::new(max_relative, 2, 0)?;
        Ok(int64(s.index_matrix(q_len, k_len, q_offset, k_offset)?))
    })
}

/// xPos's scales (Sun et al., "A Length-Extrapolatable Transformer",
/// 2023): `ζ_i^(m/scale_base)` per pair for a query at `m`
/// (`ζ_i^(−n/scale_base)` for a key with `key=True`). Returns
/// `(len(positions), head_dim/2)` float64.
#[pyfunction]
#[pyo3(signature = (positions, head_dim, scale_base = 512.0, gamma = 0.4, key = false))]
pub(crate) fn xpos_scales<'py>(
    py: Python<'py>,
    positions: Vec<i64>,
    head_dim: i64,
    scale_base: f64,
    gamma: f64,
    key: bool,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let positions: Vec<u64> = positions
        .into_iter()
        .map(|v| count(v, "positions"))
        .collect::<PyResult<_>>()?;
    let head_dim: usize = count(head_dim, "head_dim")?;
    bounded("xpos_scales", &[positions.len(), head_dim / 2])?;
    let x = XPos::new(head_dim)
        .py()?
        .with_scale_base(scale_base)
        .py()?
        .with_gamma(gamma)
        .py()?;
    let rows: Vec<Vec<f64>> = positions.iter().map(|&p| x.scales(p, key)).collect();
    grid(py, rows, head_dim / 2)
}

/// FIRE's normalised distances at its initial parameters (Li et al.,
/// "Functional Interpolation for Relative Positions Improves Long Context
/// Transformers", 2024): `ψ(|i − j|) / ψ(max(L, i))` with `ψ(x) = log(c·x +
/// 1)`, the input of its MLP. Returns `(q_len, k_len)` float64.
#[pyfunction]
#[pyo3(signature = (q_len, k_len = None, c = 0.1, threshold = 512.0))]
pub(crate) fn fire_distances<'py>(
    py: Python<'py>,
    q_len: i64,
    k_len: Option<i64>,
    c: f64,
    threshold: f64,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let q_len: usize = count(q_len, "q_len")?;
    let k_len: Option<usize> = k_len.map(|v| count(v, "k_len")).transpose()?;
    pair_grid(py, "fire_distances", q_len, k_len, |q_len, k_len| {
        let cfg = FireConfig::new(1)?.with_init(c, threshold)?;
        let f = Fire::random(cfg, 0)?;
        (0..q_len as u64)
            .map(|i| {
                (0..k_len as u64)
                    .map(|j| f.normalized_distance(i, j))
                    .collect()
            })
            .collect()
    })
}

/// CoPE's contextual positions (Golovneva et al., "Contextual Position
/// Encoding", 2024) of queries `q` `(T_q, D)` over keys `k` `(T_k, D)` at
/// positions `0..T`: `p_ij = min(Σ_{t ≥ j} σ(q_i·k_t/√D), npos_max − 1)`,
/// causal by default. Returns `(T_q, T_k)` float64.
#[pyfunction]
#[pyo3(signature = (q, k, npos_max = 64, causal = true))]
pub(crate) fn cope_positions<'py>(
    py: Python<'py>,
    q: PyReadonlyArray2<'py, f64>,
    k: PyReadonlyArray2<'py, f64>,
    npos_max: i64,
    causal: bool,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let npos_max: usize = count(npos_max, "npos_max")?;
    let (tq, d) = (q.shape()[0], q.shape()[1]);
    let tk = k.shape()[0];
    if k.shape()[1] != d {
        return Err(err(format!(
            "cope_positions: q is (T_q, {d}) but k is (T_k, {})",
            k.shape()[1]
        )));
    }
    bounded("cope_positions", &[tq, tk])?;
    let rows = |a: &PyReadonlyArray2<'py, f64>| -> Vec<Vec<f64>> {
        a.as_array()
            .rows()
            .into_iter()
            .map(|r| r.to_vec())
            .collect()
    };
    let (qv, kv) = (rows(&q), rows(&k));
    let cfg = CopeConfig::new(d, npos_max).py()?.with_causal(causal);
    let c = Cope::zeros(cfg).py()?;
    let qp: Vec<u64> = (0..tq as u64)
        .map(|i| i + (tk - tq.min(tk)) as u64)
        .collect();
    let kp: Vec<u64> = (0..tk as u64).collect();
    let m = py.detach(|| c.positions(&qv, &kv, &qp, &kp)).py()?;
    grid(py, m, tk)
}
