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
use posenc::kernels::Element;
use posenc::tensor::rope::Rope;
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
pub(crate) fn _rope_ptr(
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
            let (q, k) = ((q, oq, q_shape, nq), (k, ok, k_shape, nk));
            if bf16 {
                rope_at::<half::bf16>(r, q, k, pos, inverse)
            } else {
                rope_at::<f32>(r, q, k, pos, inverse)
            }
        }
    })
}

/// A buffer given by address: `(input, output, shape, elements)`.
type Addressed = (usize, usize, [usize; 4], usize);

/// Rotates the queries `q` and then the keys `k`, each from its input
/// buffer of `T` into its output buffer.
///
/// # Safety
/// `_rope_ptr`'s contract: each address is that of a live, contiguous
/// buffer of that many `T`, outputs overlap no input, and nothing else
/// touches them during the call.
unsafe fn rope_at<T: Element>(
    rope: &Rope,
    q: Addressed,
    k: Addressed,
    pos: BufferPositions<'_>,
    inverse: bool,
) -> PyResult<()> {
    for ((x, out, shape, n), key) in [(q, false), (k, true)] {
        // SAFETY: this function's contract.
        let (xs, outs) = unsafe {
            (
                std::slice::from_raw_parts(x as *const T, n),
                std::slice::from_raw_parts_mut(out as *mut T, n),
            )
        };
        buffers::rope_apply(rope, xs, outs, shape, pos, key, inverse).py()?;
    }
    Ok(())
}

/// The inputs `[q, k, v]` of an attention call: float32 arrays
/// `(B, H_q, T_q, D)`, `(B, H_k, T_k, D)` and `(B, H_k, T_k, D)`.
pub(crate) type Qkv<'py> = [PyReadonlyArrayDyn<'py, f32>; 3];

/// The shape of an attention call on `qkv` (from `q` and `k`, checked
/// against `v`) and the inputs' data.
fn inputs<'a>(qkv: &'a Qkv<'_>) -> PyResult<(AttentionShape, [&'a [f32]; 3])> {
    let [q, k, v] = qkv.each_ref().map(|a| a.shape());
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
    let [q, k, v] = qkv;
    let data = [slice("q", q)?, slice("k", k)?, slice("v", v)?];
    Ok((AttentionShape::new(b, hq, hk, tq, tk, d), data))
}

/// What an attention call reads besides its buffers, as `posenc.torch`
/// passes it: the tuple `(causal, scale, rope, alibi, offset, ids)`, built
/// once per forward and kept for the backward.
#[derive(FromPyObject)]
pub(crate) struct AttentionArgs<'py> {
    /// Whether a query sees only the keys at or before its position.
    #[pyo3(item(0))]
    causal: bool,
    /// The logits' scale (None: `1/√D`).
    #[pyo3(item(1))]
    scale: Option<f64>,
    /// The rotation of queries and keys, if any.
    #[pyo3(item(2))]
    rope: Option<PyRef<'py, PyRopeConfig>>,
    /// ALiBi's per-head slopes `(H_q,)` as float32, if any.
    #[pyo3(item(3))]
    alibi: Option<PyReadonlyArray1<'py, f32>>,
    /// The position of the first key (without `ids`).
    #[pyo3(item(4))]
    offset: usize,
    /// The keys' position ids `(B, T_k)`, if any.
    #[pyo3(item(5))]
    ids: Option<PyReadonlyArray2<'py, i64>>,
}

impl AttentionArgs<'_> {
    /// The call's position ids and attention.
    fn setup(&self) -> PyResult<(Option<Vec<i64>>, BufferAttention<'_>)> {
        let rope = match &self.rope {
            Some(r) => Some(r.rope()?),
            None => None,
        };
        let alibi = match &self.alibi {
            Some(a) => Some(a.as_slice().map_err(|_| err("alibi: not contiguous"))?),
            None => None,
        };
        let attn = BufferAttention {
            causal: self.causal,
            scale: self.scale,
            rope,
            alibi,
        };
        Ok((ids_of(&self.ids)?, attn))
    }
}

/// The logits a fused forward kept for its backward
/// ([`BufferAttention::forward_keeping`]): an opaque buffer, given back to
/// posenc's pool of idle ones when Python drops it.
#[pyclass(module = "posenc._posenc", name = "_KeptLogits", frozen)]
pub(crate) struct KeptLogits(buffers::KeptBuffer);

#[pymethods]
impl KeptLogits {
    /// Bytes held.
    #[getter]
    fn nbytes(&self) -> usize {
        self.0.bytes()
    }
}

/// Bytes of the live kept-logit buffers and of the idle ones posenc holds
/// for reuse (together at most [`buffers::KEPT_POOL_BYTES`] once dropped).
#[pyfunction]
pub(crate) fn _kept_pool_bytes() -> (usize, usize) {
    buffers::KeptBuffer::pool_bytes()
}

/// Fused attention forward on `qkv` (`[q, k, v]`): writes `out`
/// `(B, H_q, T_q, D)` and `lse` `(B, H_q, T_q)`. Where the call's logits
/// fit in `keep_bytes` with those every live call keeps, it keeps them and
/// returns them for [`_attention_backward`]; else `None`.
#[pyfunction]
#[pyo3(signature = (qkv, out, lse, attention, keep_bytes=0))]
pub(crate) fn _attention_forward(
    py: Python<'_>,
    qkv: Qkv<'_>,
    mut out: PyReadwriteArrayDyn<'_, f32>,
    mut lse: PyReadwriteArrayDyn<'_, f32>,
    attention: AttentionArgs<'_>,
    keep_bytes: usize,
) -> PyResult<Option<KeptLogits>> {
    let (s, [qs, ks, vs]) = inputs(&qkv)?;
    let (ids, attn) = attention.setup()?;
    let (o, l) = (slice_mut("out", &mut out)?, slice_mut("lse", &mut lse)?);
    // The layout's size only where logits may be kept (not on the
    // inference calls, which keep none).
    let floats = match keep_bytes {
        0 => None,
        _ => Some(attn.kept_logits_len(s).py()?),
    };
    detached(py, || {
        let pos = positions(attention.offset, &ids);
        // (A fresh buffer's pages fault in here, without the GIL.)
        match floats.and_then(|n| buffers::KeptBuffer::take(n, keep_bytes)) {
            Some(mut kept) => {
                attn.forward_keeping([qs, ks, vs], s, pos, [o, l], kept.as_mut_slice())
                    .py()?;
                Ok(Some(KeptLogits(kept)))
            }
            None => {
                attn.forward(qs, ks, vs, s, pos, o, l).py()?;
                Ok(None)
            }
        }
    })
}

/// Fused attention backward on `qkv` (`[q, k, v]`): writes `grads`
/// (`[dq, dk, dv]`) from the forward's `out`, `lse` and `kept` logits (if
/// it kept them) and the output gradient `dout`.
#[pyfunction]
#[pyo3(signature = (qkv, out, lse, dout, grads, attention, kept=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn _attention_backward(
    py: Python<'_>,
    qkv: Qkv<'_>,
    out: PyReadonlyArrayDyn<'_, f32>,
    lse: PyReadonlyArrayDyn<'_, f32>,
    dout: PyReadonlyArrayDyn<'_, f32>,
    grads: [PyReadwriteArrayDyn<'_, f32>; 3],
    attention: AttentionArgs<'_>,
    kept: Option<PyRef<'_, KeptLogits>>,
) -> PyResult<()> {
    let (s, inputs) = inputs(&qkv)?;
    let (ids, attn) = attention.setup()?;
    let (os, ls, dos) = (
        slice("out", &out)?,
        slice("lse", &lse)?,
        slice("dout", &dout)?,
    );
    let [mut dq, mut dk, mut dv] = grads;
    let grads = [
        slice_mut("dq", &mut dq)?,
        slice_mut("dk", &mut dk)?,
        slice_mut("dv", &mut dv)?,
    ];
    let kept = kept.as_ref().map(|k| k.0.as_slice());
    detached(py, || {
        let pos = positions(attention.offset, &ids);
        attn.backward(inputs, os, ls, kept, dos, s, pos, grads).py()
    })
}

/// A training-free method's fused forward (causal, keys at `0..T_k`) on
/// `qkv` (`[q, k, v]`): writes `out` `(B, H_q, T_q, D)`, or `(B, T_q, H_q,
/// D)` when `bthd` (a transformers layer's layout, no transpose after).
#[pyfunction]
#[pyo3(signature = (rope, qkv, out, bthd=false))]
pub(crate) fn _method_forward(
    py: Python<'_>,
    rope: PyRef<'_, PyRopeConfig>,
    qkv: Qkv<'_>,
    mut out: PyReadwriteArrayDyn<'_, f32>,
    bthd: bool,
) -> PyResult<()> {
    let (s, [qs, ks, vs]) = inputs(&qkv)?;
    let method = rope
        .context_method()
        .ok_or_else(|| err("this RopeConfig has no attention method"))?;
    let (r, lengths) = (rope.rope()?, rope.lengths());
    let (layout, want) = if bthd {
        let shape = [s.batch, s.q_len, s.q_heads, s.head_dim];
        (buffers::OutLayout::Bthd, shape)
    } else {
        let shape = [s.batch, s.q_heads, s.q_len, s.head_dim];
        (buffers::OutLayout::Bhtd, shape)
    };
    if out.shape() != want {
        return Err(err(format!(
            "out: expected shape {want:?}, got {:?}",
            out.shape()
        )));
    }
    let o = slice_mut("out", &mut out)?;
    detached(py, || {
        buffers::method_forward(method, r, lengths, qs, ks, vs, s, o, layout).py()
    })
}

/// ALiBi's slopes for `heads` heads as float32 (the kernels' values).
#[pyfunction]
pub(crate) fn _alibi_slopes_f32(
    py: Python<'_>,
    heads: usize,
) -> PyResult<Bound<'_, numpy::PyArray1<f32>>> {
    Ok(numpy::PyArray1::from_vec(
        py,
        buffers::alibi_slopes_f32(heads).py()?,
    ))
}

/// The SIMD level the kernels run at on this CPU (`avx512`, `avx2`,
/// `neon`, `scalar`).
#[pyfunction]
pub(crate) fn simd_level() -> &'static str {
    posenc::kernels::SimdLevel::detect().as_str()
}
