//! The fused rope as a candle op: out of place with its backward, or in
//! place; and the composed rotation of the reference paths.

use std::sync::Arc;

use candle_core::{CpuStorage, DType, InplaceOp1, Layout, Shape, Tensor};

use super::super::custom::{AsCustomOp, CpuOutput, SliceGrads, SliceOp};
use super::{check_pair, HeadLayout, Role, Rows, TensorChecks};
use crate::error::{Error, Result};
use crate::kernels::rope::{rope_inplace, rope_out_uninit, RopeCall};
use crate::kernels::table::Tables;
use crate::kernels::{Element, RopeGeometry, SimdLevel};
use crate::rope::PairLayout;

/// The fused paths of every rope on candle tensors ([`Rope`](super::Rope)
/// and the multi-axis [`AxialRope`](crate::tensor::axial::AxialRope)): the checks,
/// then the tables and rows that `resolve` gives for the tensors' batch size
/// and sequence length, then the kernel ([`RopeOp`]) out of place or in
/// place. Queries are rotated with the query tables, keys with the key
/// tables (the same ones without xPos).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FusedRope {
    pub(crate) checks: TensorChecks,
    pub(crate) level: SimdLevel,
}

impl FusedRope {
    fn op(&self, tables: Arc<Tables>, rows: Arc<Rows>, role: Role, g: &RopeGeometry) -> RopeOp {
        RopeOp {
            tables,
            rows,
            role,
            layout: self.checks.layout,
            rotary_dim: g.rotary_dim,
            pairs: g.pairs,
            level: self.level,
            inverse: false,
        }
    }

    /// Queries and keys, out of place (differentiable).
    pub(crate) fn apply(
        &self,
        q: &Tensor,
        k: &Tensor,
        resolve: impl FnOnce(usize, usize) -> Result<(Arc<Tables>, Rows)>,
    ) -> Result<(Tensor, Tensor)> {
        let gq = self.checks.fused(q, "queries")?;
        let gk = self.checks.fused(k, "keys")?;
        check_pair(q, &gq, k, &gk)?;
        let (tables, rows) = resolve(gq.batch, gq.seq_len)?;
        let rows = Arc::new(rows);
        let qo = self.op(tables.clone(), rows.clone(), Role::Query, &gq);
        let ko = self.op(tables, rows, Role::Key, &gk);
        Ok((
            q.contiguous()?.apply_op1(AsCustomOp(qo))?,
            k.contiguous()?.apply_op1(AsCustomOp(ko))?,
        ))
    }

    /// One tensor, out of place (differentiable).
    pub(crate) fn rotate(
        &self,
        x: &Tensor,
        role: Role,
        resolve: impl FnOnce(usize, usize) -> Result<(Arc<Tables>, Rows)>,
    ) -> Result<Tensor> {
        let g = self.checks.fused(x, "input")?;
        let (tables, rows) = resolve(g.batch, g.seq_len)?;
        let op = self.op(tables, Arc::new(rows), role, &g);
        Ok(x.contiguous()?.apply_op1(AsCustomOp(op))?)
    }

    /// Queries and keys in place (the contract of [`Rope::apply_inplace`](super::Rope::apply_inplace));
    /// nothing is written on error.
    pub(crate) fn apply_inplace(
        &self,
        q: &Tensor,
        k: &Tensor,
        resolve: impl FnOnce(usize, usize) -> Result<(Arc<Tables>, Rows)>,
    ) -> Result<()> {
        let (gq, aq) = self.checks.inplace(q, "queries")?;
        let (gk, ak) = self.checks.inplace(k, "keys")?;
        check_pair(q, &gq, k, &gk)?;
        if aq == ak {
            return Err(Error::invalid(
                "in-place rope",
                "queries and keys share one buffer",
            ));
        }
        let (tables, rows) = resolve(gq.batch, gq.seq_len)?;
        let rows = Arc::new(rows);
        q.inplace_op1(&self.op(tables.clone(), rows.clone(), Role::Query, &gq))?;
        k.inplace_op1(&self.op(tables, rows, Role::Key, &gk))?;
        Ok(())
    }

    /// One tensor in place (the same contract).
    pub(crate) fn rotate_inplace(
        &self,
        x: &Tensor,
        role: Role,
        resolve: impl FnOnce(usize, usize) -> Result<(Arc<Tables>, Rows)>,
    ) -> Result<()> {
        let (g, _) = self.checks.inplace(x, "input")?;
        let (tables, rows) = resolve(g.batch, g.seq_len)?;
        x.inplace_op1(&self.op(tables, Arc::new(rows), role, &g))?;
        Ok(())
    }
}

/// The end of the reference paths: `cos` and `sin` are `(B', T, D/2)`
/// tables (`B'` is 1 or the batch) of any float dtype, laid out for
/// `layout` and taken to f32 (f64 for an f64 `x`) with `x`, which is
/// rotated by [`rotate_with_tables`] and returned in its own dtype.
pub(crate) fn rotate_reference_with(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    layout: HeadLayout,
    g: &RopeGeometry,
) -> Result<Tensor> {
    let (pb, t, nf) = cos.dims3()?;
    let shape = match layout {
        HeadLayout::Bhtd => (pb, 1, t, nf),
        HeadLayout::Bthd => (pb, t, 1, nf),
    };
    let cdt = if x.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let cos = cos.reshape(shape)?.to_dtype(cdt)?;
    let sin = sin.reshape(shape)?.to_dtype(cdt)?;
    let y = rotate_with_tables(&x.to_dtype(cdt)?, &cos, &sin, g.rotary_dim, g.pairs)?;
    Ok(y.to_dtype(x.dtype())?)
}

/// The composed rotation of the reference paths: `x` is `(d0, d1, d2, D)`,
/// `cos` and `sin` broadcast to `(d0, d1, d2, rotary_dim / 2)`; pairs of
/// `layout` in the first `rotary_dim` entries are rotated, the rest passes
/// through. Differentiable by candle's autograd.
pub(crate) fn rotate_with_tables(
    xf: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    rd: usize,
    pairs: PairLayout,
) -> Result<Tensor> {
    let d = xf.dim(3)?;
    let nf = rd / 2;
    let rot = xf.narrow(3, 0, rd)?;
    let y = match pairs {
        PairLayout::HalfSplit => {
            let a = rot.narrow(3, 0, nf)?;
            let b = rot.narrow(3, nf, nf)?;
            let ya = (a.broadcast_mul(cos)? - b.broadcast_mul(sin)?)?;
            let yb = (b.broadcast_mul(cos)? + a.broadcast_mul(sin)?)?;
            Tensor::cat(&[ya, yb], 3)?
        }
        PairLayout::Interleaved => {
            let (d0, d1, d2, _) = rot.dims4()?;
            let r5 = rot.reshape((d0, d1, d2, nf, 2))?;
            let a = r5.narrow(4, 0, 1)?.squeeze(4)?;
            let b = r5.narrow(4, 1, 1)?.squeeze(4)?;
            let ya = (a.broadcast_mul(cos)? - b.broadcast_mul(sin)?)?;
            let yb = (b.broadcast_mul(cos)? + a.broadcast_mul(sin)?)?;
            Tensor::stack(&[ya, yb], 4)?.reshape((d0, d1, d2, rd))?
        }
    };
    Ok(if rd < d {
        Tensor::cat(&[y, xf.narrow(3, rd, d - rd)?], 3)?
    } else {
        y
    })
}

/// The fused kernel as a candle op (out of place with backward, or in place).
#[derive(Clone)]
pub(crate) struct RopeOp {
    pub(crate) tables: Arc<Tables>,
    pub(crate) rows: Arc<Rows>,
    pub(crate) role: Role,
    pub(crate) layout: HeadLayout,
    pub(crate) rotary_dim: usize,
    pub(crate) pairs: PairLayout,
    pub(crate) level: SimdLevel,
    pub(crate) inverse: bool,
}

impl RopeOp {
    fn geometry(&self, l: &Layout) -> candle_core::Result<RopeGeometry> {
        let (a, b, c, d) = l.shape().dims4()?;
        Ok(RopeGeometry::from_dims(
            [a, b, c, d],
            self.layout,
            self.rotary_dim,
            self.pairs,
        ))
    }

    /// The kernel's arguments for buffers of geometry `g`: this role's
    /// tables and the rows.
    fn call<'a>(&'a self, g: &'a RopeGeometry) -> RopeCall<'a> {
        RopeCall {
            g,
            tables: match self.role {
                Role::Query => self.tables.query(),
                Role::Key => self.tables.key(),
            },
            rows: self.rows.map(),
            inverse: self.inverse,
        }
    }

    fn out<T: Element + candle_core::WithDType>(
        &self,
        src: &[T],
        l: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (o1, o2) = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("posenc rope: input not contiguous".into()))?;
        let src = &src[o1..o2];
        let g = self.geometry(l)?;
        let mut dst: Vec<T> = crate::kernels::mem::with_capacity_huge(src.len());
        // SAFETY: the capacity is ours and unread until rope_out_uninit fills it.
        unsafe {
            crate::kernels::mem::prefault(dst.as_mut_ptr() as *mut u8, std::mem::size_of_val(src))
        };
        rope_out_uninit(
            self.level,
            src,
            &mut dst.spare_capacity_mut()[..src.len()],
            self.call(&g),
        )
        .map_err(to_candle)?;
        // SAFETY: rope_out_uninit returned Ok, so all src.len() entries are written.
        unsafe { dst.set_len(src.len()) };
        Ok((T::to_cpu_storage_owned(dst), l.shape().clone()))
    }

    fn in_place<T: Element>(&self, x: &mut [T], l: &Layout) -> candle_core::Result<()> {
        let (o1, o2) = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("posenc rope: input not contiguous".into()))?;
        let g = self.geometry(l)?;
        rope_inplace(self.level, &mut x[o1..o2], self.call(&g)).map_err(to_candle)
    }
}

impl SliceOp for RopeOp {
    fn name(&self) -> &'static str {
        "posenc-rope"
    }

    fn cpu_fwd(&self, args: &[(&CpuStorage, &Layout)]) -> CpuOutput {
        use candle_core::backend::BackendStorage;
        let (s, l) = args[0];
        match s {
            CpuStorage::F32(v) => self.out(v, l),
            CpuStorage::F16(v) => self.out(v, l),
            CpuStorage::BF16(v) => self.out(v, l),
            other => Err(candle_core::Error::Msg(format!(
                "posenc rope: unsupported dtype {:?}",
                other.dtype()
            ))),
        }
    }

    /// `y = S·R(θ)·x` per pair (S the xPos scale, 1 without xPos), so
    /// `∂L/∂x = S·R(−θ)·∂L/∂y`: the same kernel with the sine negated.
    fn bwd(&self, _args: &[&Tensor], _res: &Tensor, grad_res: &Tensor) -> SliceGrads {
        let mut t = self.clone();
        t.inverse = !t.inverse;
        Ok(vec![Some(grad_res.contiguous()?.apply_op1(AsCustomOp(t))?)])
    }
}

impl InplaceOp1 for RopeOp {
    fn name(&self) -> &'static str {
        "posenc-rope-inplace"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> candle_core::Result<()> {
        match s {
            CpuStorage::F32(v) => self.in_place(v, l),
            CpuStorage::F16(v) => self.in_place(v, l),
            CpuStorage::BF16(v) => self.in_place(v, l),
            _ => Err(candle_core::Error::Msg(
                "posenc rope: unsupported dtype".into(),
            )),
        }
    }
}

fn to_candle(e: Error) -> candle_core::Error {
    candle_core::Error::wrap(e)
}
