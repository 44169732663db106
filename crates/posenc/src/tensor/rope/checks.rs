//! The checks every rope on candle tensors makes before a kernel runs.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

use super::HeadLayout;
use crate::error::{Error, Result};
use crate::kernels::RopeGeometry;
use crate::rope::PairLayout;

/// The checks every rope on candle tensors makes before a kernel runs
/// ([`Rope`](super::Rope) and the multi-axis
/// [`AxialRope`](crate::tensor::axial::AxialRope)): the tensors' layout and the
/// frequencies' rotary dimension and pair layout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TensorChecks {
    pub(crate) layout: HeadLayout,
    pub(crate) rotary_dim: usize,
    pub(crate) pairs: PairLayout,
}

impl TensorChecks {
    /// A 4-d tensor's geometry under these settings.
    pub(crate) fn geometry(&self, x: &Tensor, what: &'static str) -> Result<RopeGeometry> {
        let dims: [usize; 4] = x.dims().try_into().map_err(|_| Error::Shape {
            what,
            expected: match self.layout {
                HeadLayout::Bhtd => "4 dims (batch, heads, seq_len, head_dim)".into(),
                HeadLayout::Bthd => "4 dims (batch, seq_len, heads, head_dim)".into(),
            },
            got: format!("{:?}", x.dims()),
        })?;
        let g = RopeGeometry::from_dims(dims, self.layout, self.rotary_dim, self.pairs);
        g.check()?;
        Ok(g)
    }

    /// One tensor for the fused paths: on the CPU, f32/f16/bf16.
    pub(crate) fn fused(&self, x: &Tensor, what: &'static str) -> Result<RopeGeometry> {
        if !matches!(x.device(), Device::Cpu) {
            return Err(Error::invalid(
                "device",
                format!(
                    "the fused rope runs on the CPU; {what} are on {:?} (use apply_reference)",
                    x.device().location()
                ),
            ));
        }
        match x.dtype() {
            DType::F32 | DType::F16 | DType::BF16 => {}
            other => {
                return Err(Error::DType {
                    what: "fused rope (f32, f16 or bf16)",
                    dtype: format!("{other:?}"),
                })
            }
        }
        self.geometry(x, what)
    }

    /// One tensor for the reference paths: f32/f16/bf16/f64, any device.
    pub(crate) fn reference(&self, x: &Tensor, what: &'static str) -> Result<RopeGeometry> {
        match x.dtype() {
            DType::F32 | DType::F16 | DType::BF16 | DType::F64 => {}
            other => {
                return Err(Error::DType {
                    what: "rope (f32, f16, bf16 or f64)",
                    dtype: format!("{other:?}"),
                })
            }
        }
        self.geometry(x, what)
    }

    /// Queries and keys for the reference paths: each as
    /// [`reference`](Self::reference), and the pair as [`check_pair`].
    pub(crate) fn reference_pair(&self, q: &Tensor, k: &Tensor) -> Result<()> {
        let gq = self.reference(q, "queries")?;
        let gk = self.reference(k, "keys")?;
        check_pair(q, &gq, k, &gk)
    }

    /// The in-place contract for one tensor (see [`Rope::apply_inplace`](super::Rope::apply_inplace));
    /// returns its geometry and its buffer's address.
    pub(crate) fn inplace(&self, x: &Tensor, what: &'static str) -> Result<(RopeGeometry, usize)> {
        let g = self.fused(x, what)?;
        let contract = |reason: String| Error::invalid(format!("in-place rope on {what}"), reason);
        if x.track_op() {
            return Err(contract(
                "the tensor is tracked by autograd (a Var or computed from one); \
                 writing it in place would corrupt the gradients: use apply"
                    .into(),
            ));
        }
        let (storage, layout) = x.storage_and_layout();
        let (len, addr) = match &*storage {
            Storage::Cpu(CpuStorage::F32(v)) => (v.len(), v.as_ptr() as usize),
            Storage::Cpu(CpuStorage::F16(v)) => (v.len(), v.as_ptr() as usize),
            Storage::Cpu(CpuStorage::BF16(v)) => (v.len(), v.as_ptr() as usize),
            _ => return Err(contract("not a CPU f32/f16/bf16 tensor".into())),
        };
        if !layout.is_contiguous() || layout.start_offset() != 0 || len != x.elem_count() {
            return Err(contract(format!(
                "the tensor must be contiguous and own its whole buffer (a view of a larger \
                 buffer, such as a narrow or a transpose, shares it): layout stride {:?}, \
                 offset {}, {} elements in a buffer of {len}",
                layout.stride(),
                layout.start_offset(),
                x.elem_count()
            )));
        }
        Ok((g, addr))
    }
}

/// `offset + seq_len`, the end of a call at an offset.
///
/// # Errors
/// [`Error::PositionOutOfRange`] when it overflows.
pub(crate) fn offset_end(offset: usize, seq_len: usize) -> Result<usize> {
    offset
        .checked_add(seq_len)
        .ok_or(Error::PositionOutOfRange {
            position: u64::MAX,
            limit: usize::MAX as u64,
            what: "rope offset + seq_len",
        })
}

/// Queries and keys of one call agree: same dtype, batch, seq_len and
/// head_dim.
pub(crate) fn check_pair(
    q: &Tensor,
    gq: &RopeGeometry,
    k: &Tensor,
    gk: &RopeGeometry,
) -> Result<()> {
    if q.dtype() != k.dtype() {
        return Err(Error::DType {
            what: "keys (must have the queries' dtype)",
            dtype: format!("{:?} vs queries {:?}", k.dtype(), q.dtype()),
        });
    }
    if (gq.batch, gq.seq_len, gq.head_dim) != (gk.batch, gk.seq_len, gk.head_dim) {
        return Err(Error::Shape {
            what: "keys (batch, seq_len and head_dim must match the queries')",
            expected: format!("{:?}", q.dims()),
            got: format!("{:?}", k.dims()),
        });
    }
    Ok(())
}
