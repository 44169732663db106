//! The fused CPU kernels on numpy arrays that share memory with the
//! caller's tensors (`posenc.torch` passes `tensor.numpy()` views of
//! contiguous CPU tensors): nothing is copied in or out, and the GIL is
//! released while the kernels run ([`posenc::buffers`]).
//!
//! These are the private entry points of `posenc.torch`; their checks
//! (shapes, dtypes, positions) are the Rust library's, so a bad call is a
//! `PosencError` with the library's words, never a read out of bounds.

use numpy::{
    PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArrayDyn, PyReadwriteArrayDyn,
    PyUntypedArrayMethods,
};
use posenc::buffers::{self, AttentionShape, BufferAttention, BufferPositions};
use pyo3::prelude::*;

use crate::error::{detached, err, IntoPy};
use crate::rope::PyRopeConfig;

fn dims4(what: &str, shape: &[usize]) -> PyResult<[usize; 4]> {
    <[usize; 4]>::try_from(shape).map_err(|_| {
        err(format!(
            "{what}: expected a 4-d (batch, heads, seq_len, head_dim) tensor, got shape {shape:?}"
        ))
    })
}

fn slice<'a, T: numpy::Element>(what: &str, a: &'a PyReadonlyArrayDyn<'_, T>) -> PyResult<&'a [T]> {
    a.as_slice()
        .map_err(|_| err(format!("{what}: the array is not contiguous")))
}

fn slice_mut<'a, T: numpy::Element>(
    what: &str,
    a: &'a mut PyReadwriteArrayDyn<'_, T>,
) -> PyResult<&'a mut [T]> {
    a.as_slice_mut()
        .map_err(|_| err(format!("{what}: the array is not contiguous")))
}

/// Position ids `(B, T_k)` as a vector (small; the activations are never
/// copied).
fn ids_of(ids: &Option<PyReadonlyArray2<'_, i64>>) -> PyResult<Option<Vec<i64>>> {
    match ids {
        None => Ok(None),
        Some(a) => Ok(Some(
            a.as_slice()
                .map_err(|_| err("position_ids: the array is not contiguous"))?
                .to_vec(),
        )),
    }
}

fn positions(offset: usize, ids: &Option<Vec<i64>>) -> BufferPositions<'_> {
    match ids {
        Some(v) => BufferPositions::Ids(v),
        None => BufferPositions::Offset(offset),
    }
}

/// The element count of a `(B, H, T, D)` shape, checked.
fn elements(shape: [usize; 4]) -> PyResult<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= buffers::MAX_ELEMENTS)
        .ok_or_else(|| err(format!("shape {shape:?}: too many elements")))
}

/// Rotates q and k given by address: the fast entry point of
/// `posenc.torch.apply_rope` (a call costs a few microseconds; numpy views
/// cost more than the kernel on small tensors).
///
/// Private: the caller guarantees that each address is that of a live,
/// contiguous CPU buffer of its shape (float32 when `bf16` is false,
/// bfloat16 otherwise), that outputs do not overlap inputs, and that no
/// other code touches them during the call: `posenc.torch` passes
/// `tensor.data_ptr()` of contiguous tensors it holds and outputs it has
/// just allocated.
#[pyfunction]
#[pyo3(signature = (rope, bf16, q, oq, q_shape, k, ok, k_shape, offset, ids, inverse))]
#[allow(clippy::too_many_arguments)]
fn _rope_ptr(
    py: Python<'_>,
    rope: &PyRopeConfig,
    bf16: bool,
    q: usize,
    oq: usize,
    q_shape: [usize; 4],
    k: usize,
    ok: usize,
    k_shape: [usize; 4],
    offset: usize,
    ids: Option<PyReadonlyArray2<'_, i64>>,
    inverse: bool,
) -> PyResult<()> {
    let (nq, nk) = (elements(q_shape)?, elements(k_shape)?);
    if [q, oq, k, ok].contains(&0) {
        return Err(err("rope: a null buffer address"));
    }
    let ids = ids_of(&ids)?;
    let r = rope.rope()?;
    // Addresses cross the closure as integers (plain data).
    detached(py, move || {
        let pos = positions(offset, &ids);
        // SAFETY: the caller's contract above (live, contiguous,
        // non-overlapping buffers of these shapes and dtype).
        unsafe {
            if bf16 {
                type B = half::bf16;
                let qs = std::slice::from_raw_parts(q as *const B, nq);
                let oqs = std::slice::from_raw_parts_mut(oq as *mut B, nq);
                let ks = std::slice::from_raw_parts(k as *const B, nk);
                let oks = std::slice::from_raw_parts_mut(ok as *mut B, nk);
                buffers::rope_apply(r, qs, oqs, q_shape, pos, false, inverse).py()?;
                buffers::rope_apply(r, ks, oks, k_shape, pos, true, inverse).py()
            } else {
                let qs = std::slice::from_raw_parts(q as *const f32, nq);
                let oqs = std::slice::from_raw_parts_mut(oq as *mut f32, nq);
                let ks = std::slice::from_raw_parts(k as *const f32, nk);
                let oks = std::slice::from_raw_parts_mut(ok as *mut f32, nk);
                buffers::rope_apply(r, qs, oqs, q_shape, pos, false, inverse).py()?;
                buffers::rope_apply(r, ks, oks, k_shape, pos, true, inverse).py()
            }
        }
    })
}

/// The shape of an attention call from `q` and `k`, checked against `v`.
fn shape_of(q: &[usize], k: &[usize], v: &[usize]) -> PyResult<AttentionShape> {
    let [b, hq, tq, d] = dims4("q", q)?;
    let [bk, hk, tk, dk] = dims4("k", k)?;
    if v != k {
        return Err(err(format!("v: expected the shape of k {k:?}, got {v:?}")));
    }
    if bk != b || dk != d {
        return Err(err(format!(
            "k: expected batch {b} and head_dim {d} as q {q:?}, got {k:?}"
        )));
    }
    Ok(AttentionShape::new(b, hq, hk, tq, tk, d))
}

/// What an attention call reads besides its buffers: the shape, the
/// position ids, and the attention (causal or not, its scale, rope and
/// ALiBi slopes).
type Setup<'a> = (AttentionShape, Option<Vec<i64>>, BufferAttention<'a>);

/// The [`Setup`] of an attention call.
#[allow(clippy::too_many_arguments)]
fn attention_setup<'a>(
    q: &PyReadonlyArrayDyn<'_, f32>,
    k: &PyReadonlyArrayDyn<'_, f32>,
    v: &PyReadonlyArrayDyn<'_, f32>,
    causal: bool,
    scale: Option<f64>,
    rope: &'a Option<PyRef<'_, PyRopeConfig>>,
    alibi: &'a Option<PyReadonlyArray1<'_, f32>>,
    ids: &Option<PyReadonlyArray2<'_, i64>>,
) -> PyResult<Setup<'a>> {
    let s = shape_of(q.shape(), k.shape(), v.shape())?;
    let rope = match rope {
        Some(r) => Some(r.rope()?),
        None => None,
    };
    let alibi = match alibi {
        Some(a) => Some(a.as_slice().map_err(|_| err("alibi: not contiguous"))?),
        None => None,
    };
    let attn = BufferAttention {
        causal,
        scale,
        rope,
        alibi,
    };
    Ok((s, ids_of(ids)?, attn))
}

/// Fused attention forward: writes `out` `(B, H_q, T_q, D)` and `lse`
/// `(B, H_q, T_q)`.
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, causal, scale, rope, alibi, offset, ids))]
#[allow(clippy::too_many_arguments)]
fn _attention_forward(
    py: Python<'_>,
    q: PyReadonlyArrayDyn<'_, f32>,
    k: PyReadonlyArrayDyn<'_, f32>,
    v: PyReadonlyArrayDyn<'_, f32>,
    mut out: PyReadwriteArrayDyn<'_, f32>,
    mut lse: PyReadwriteArrayDyn<'_, f32>,
    causal: bool,
    scale: Option<f64>,
    rope: Option<PyRef<'_, PyRopeConfig>>,
    alibi: Option<PyReadonlyArray1<'_, f32>>,
    offset: usize,
    ids: Option<PyReadonlyArray2<'_, i64>>,
) -> PyResult<()> {
    let (s, ids, attn) = attention_setup(&q, &k, &v, causal, scale, &rope, &alibi, &ids)?;
    let (qs, ks, vs) = (slice("q", &q)?, slice("k", &k)?, slice("v", &v)?);
    let (o, l) = (slice_mut("out", &mut out)?, slice_mut("lse", &mut lse)?);
    detached(py, || {
        attn.forward(qs, ks, vs, s, positions(offset, &ids), o, l)
            .py()
    })
}

/// Fused attention backward: writes `dq`, `dk`, `dv` from the forward's
/// `out` and `lse` and the output gradient `dout`.
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, dout, dq, dk, dv, causal, scale, rope, alibi, offset, ids))]
#[allow(clippy::too_many_arguments)]
fn _attention_backward(
    py: Python<'_>,
    q: PyReadonlyArrayDyn<'_, f32>,
    k: PyReadonlyArrayDyn<'_, f32>,
    v: PyReadonlyArrayDyn<'_, f32>,
    out: PyReadonlyArrayDyn<'_, f32>,
    lse: PyReadonlyArrayDyn<'_, f32>,
    dout: PyReadonlyArrayDyn<'_, f32>,
    mut dq: PyReadwriteArrayDyn<'_, f32>,
    mut dk: PyReadwriteArrayDyn<'_, f32>,
    mut dv: PyReadwriteArrayDyn<'_, f32>,
    causal: bool,
    scale: Option<f64>,
    rope: Option<PyRef<'_, PyRopeConfig>>,
    alibi: Option<PyReadonlyArray1<'_, f32>>,
    offset: usize,
    ids: Option<PyReadonlyArray2<'_, i64>>,
) -> PyResult<()> {
    let (s, ids, attn) = attention_setup(&q, &k, &v, causal, scale, &rope, &alibi, &ids)?;
    let (qs, ks, vs) = (slice("q", &q)?, slice("k", &k)?, slice("v", &v)?);
    let (os, ls, dos) = (
        slice("out", &out)?,
        slice("lse", &lse)?,
        slice("dout", &dout)?,
    );
    let (dqs, dks, dvs) = (
        slice_mut("dq", &mut dq)?,
        slice_mut("dk", &mut dk)?,
        slice_mut("dv", &mut dv)?,
    );
    detached(py, || {
        attn.backward(
            [qs, ks, vs],
            os,
            ls,
            dos,
            s,
            positions(offset, &ids),
            [dqs, dks, dvs],
        )
        .py()
    })
}

/// A training-free method's fused forward (causal, keys at `0..T_k`):
/// writes `out` `(B, H_q, T_q, D)`.
#[pyfunction]
fn _method_forward(
    py: Python<'_>,
    rope: PyRef<'_, PyRopeConfig>,
    q: PyReadonlyArrayDyn<'_, f32>,
    k: PyReadonlyArrayDyn<'_, f32>,
    v: PyReadonlyArrayDyn<'_, f32>,
    mut out: PyReadwriteArrayDyn<'_, f32>,
) -> PyResult<()> {
    let s = shape_of(q.shape(), k.shape(), v.shape())?;
    let method = rope
        .context_method()
        .ok_or_else(|| err("this RopeConfig has no attention method"))?;
    let (r, lengths) = (rope.rope()?, rope.lengths());
    let (qs, ks, vs) = (slice("q", &q)?, slice("k", &k)?, slice("v", &v)?);
    let o = slice_mut("out", &mut out)?;
    detached(py, || {
        buffers::method_forward(method, r, lengths, qs, ks, vs, s, o).py()
    })
}

/// ALiBi's slopes for `heads` heads as float32 (the kernels' values).
#[pyfunction]
fn _alibi_slopes_f32(py: Python<'_>, heads: usize) -> PyResult<Bound<'_, numpy::PyArray1<f32>>> {
    Ok(numpy::PyArray1::from_vec(
        py,
        buffers::alibi_slopes_f32(heads).py()?,
    ))
}

/// The SIMD level the kernels run at on this CPU (`avx512`, `avx2`,
/// `neon`, `scalar`).
#[pyfunction]
fn simd_level() -> &'static str {
    posenc::kernels::SimdLevel::detect().as_str()
}

/// Adds the kernels' entry points.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_rope_ptr, m)?)?;
    m.add_function(wrap_pyfunction!(_attention_forward, m)?)?;
    m.add_function(wrap_pyfunction!(_attention_backward, m)?)?;
    m.add_function(wrap_pyfunction!(_method_forward, m)?)?;
    m.add_function(wrap_pyfunction!(_alibi_slopes_f32, m)?)?;
    m.add_function(wrap_pyfunction!(simd_level, m)?)?;
    Ok(())
}
