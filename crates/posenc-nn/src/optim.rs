//! AdamW with named, saveable state, and global-norm gradient clipping.
//!
//! candle-nn's `AdamW` keeps its moments private, so a run could not resume
//! exactly; this one stores them by parameter name so a checkpoint holds the
//! whole optimiser and `--resume` continues bit for bit.
//!
//! [`AdamW::step_clipped`] is the fused path: one pass over the gradients
//! for the global norm, then one in-place pass per parameter that updates
//! its moments and weights where they are (no tensor allocated).
//! [`clip_grad_norm`] followed by [`AdamW::step`] is the composed reference
//! (candle ops, a new tensor for every intermediate).

use std::collections::{BTreeMap, HashMap};

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, DType, InplaceOp2, Layout, Storage, Tensor, Var};

use crate::NnError;

/// AdamW (Loshchilov & Hutter 2019) with decoupled weight decay.
#[derive(Debug)]
pub struct AdamW {
    params: Vec<(String, Var)>,
    /// First moments, row-major as the parameters.
    m: HashMap<String, Vec<f32>>,
    /// Second moments.
    v: HashMap<String, Vec<f32>>,
    /// Steps taken so far.
    pub t: usize,
    /// β₁ (0.9).
    pub beta1: f64,
    /// β₂ (0.95).
    pub beta2: f64,
    /// ε (1e-8).
    pub eps: f64,
    /// Weight decay (applied to matrices only: biases, norms and 1-D
    /// parameters are not decayed).
    pub weight_decay: f64,
}

impl AdamW {
    /// An optimiser over named parameters (sorted by name, so the order of
    /// updates is deterministic).
    pub fn new(params: HashMap<String, Var>, weight_decay: f64) -> Result<Self, NnError> {
        let params: BTreeMap<String, Var> = params.into_iter().collect();
        let mut m = HashMap::new();
        let mut v = HashMap::new();
        for (name, var) in &params {
            m.insert(name.clone(), vec![0f32; var.elem_count()]);
            v.insert(name.clone(), vec![0f32; var.elem_count()]);
        }
        Ok(AdamW {
            params: params.into_iter().collect(),
            m,
            v,
            t: 0,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay,
        })
    }

    /// Counts a step and returns its bias corrections, `1 − β₁ᵗ` and
    /// `1 − β₂ᵗ`.
    fn next_step(&mut self) -> (f64, f64) {
        self.t += 1;
        let bc1 = 1.0 - self.beta1.powi(self.t as i32);
        let bc2 = 1.0 - self.beta2.powi(self.t as i32);
        (bc1, bc2)
    }

    /// The weight decay of the parameter `theta`: matrices only.
    fn decay_of(&self, theta: &Tensor) -> f64 {
        if theta.rank() >= 2 {
            self.weight_decay
        } else {
            0.0
        }
    }

    /// One update with learning rate `lr` (the composed reference: candle
    /// ops on the moments as tensors). Parameters without a gradient are
    /// left unchanged.
    pub fn step(&mut self, grads: &GradStore, lr: f64) -> Result<(), NnError> {
        let (bc1, bc2) = self.next_step();
        for (name, var) in &self.params {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            let shape = var.as_tensor().shape();
            let dev = var.as_tensor().device();
            let m0 = Tensor::from_slice(&self.m[name], shape, dev)?;
            let v0 = Tensor::from_slice(&self.v[name], shape, dev)?;
            let m = (m0.affine(self.beta1, 0.0)? + g.affine(1.0 - self.beta1, 0.0)?)?;
            let v = (v0.affine(self.beta2, 0.0)? + g.sqr()?.affine(1.0 - self.beta2, 0.0)?)?;
            let mhat = m.affine(1.0 / bc1, 0.0)?;
            let vhat = v.affine(1.0 / bc2, 0.0)?;
            let update = mhat.div(&(vhat.sqrt()? + self.eps)?)?;
            let theta = var.as_tensor();
            let decay = self.decay_of(theta);
            let next = (theta.affine(1.0 - lr * decay, 0.0)? - update.affine(lr, 0.0)?)?;
            var.set(&next)?;
            self.m
                .insert(name.clone(), m.flatten_all()?.to_vec1::<f32>()?);
            self.v
                .insert(name.clone(), v.flatten_all()?.to_vec1::<f32>()?);
        }
        Ok(())
    }

    /// One update with learning rate `lr` after clipping the gradients to a
    /// global L2 norm of `max_norm` (0: no clipping), fused: the squared
    /// norm is accumulated in `f64` over every gradient in parameter-name
    /// order, then each parameter and its moments are updated in place.
    /// Returns the norm before clipping. Parameters without a gradient are
    /// left unchanged.
    ///
    /// # Errors
    /// [`NnError::Invalid`] for parameters that are not contiguous `f32`
    /// CPU tensors; candle errors.
    pub fn step_clipped(
        &mut self,
        grads: &GradStore,
        lr: f64,
        max_norm: f64,
    ) -> Result<f64, NnError> {
        let mut sq = 0.0f64;
        for (_, var) in &self.params {
            if let Some(g) = grads.get(var.as_tensor()) {
                sq += sum_squares(g)?;
            }
        }
        let norm = sq.sqrt();
        let clip = if max_norm > 0.0 && norm > max_norm {
            max_norm / (norm + 1e-12)
        } else {
            1.0
        };
        let (bc1, bc2) = self.next_step();
        for (name, var) in &self.params {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            let theta = var.as_tensor();
            if theta.dtype() != DType::F32 || !theta.is_contiguous() {
                return Err(NnError::Invalid(format!(
                    "fused AdamW needs contiguous f32 parameters ({name}: {:?})",
                    theta.dtype()
                )));
            }
            let decay = self.decay_of(theta);
            let m = self.m.get_mut(name).expect("moments of every parameter");
            let v = self.v.get_mut(name).expect("moments of every parameter");
            let op = AdamWUpdate {
                m: m.as_mut_ptr(),
                v: v.as_mut_ptr(),
                len: m.len(),
                lr: lr as f32,
                beta1: self.beta1 as f32,
                beta2: self.beta2 as f32,
                eps: self.eps as f32,
                inv_bc1: (1.0 / bc1) as f32,
                inv_bc2: (1.0 / bc2) as f32,
                keep: (1.0 - lr * decay) as f32,
                clip: clip as f32,
            };
            theta.inplace_op2(&g.to_dtype(DType::F32)?.contiguous()?, &op)?;
        }
        Ok(norm)
    }

    /// The optimiser state as named tensors (`m.NAME`, `v.NAME`, `t`).
    pub fn state(&self) -> Result<HashMap<String, Tensor>, NnError> {
        let mut out = HashMap::new();
        for (name, var) in &self.params {
            let (shape, dev) = (var.as_tensor().shape(), var.as_tensor().device());
            out.insert(
                format!("m.{name}"),
                Tensor::from_slice(&self.m[name], shape, dev)?,
            );
            out.insert(
                format!("v.{name}"),
                Tensor::from_slice(&self.v[name], shape, dev)?,
            );
        }
        out.insert(
            "t".into(),
            Tensor::new(&[self.t as u32], &candle_core::Device::Cpu)?,
        );
        Ok(out)
    }

    /// Restores a state written by [`state`](Self::state).
    pub fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<(), NnError> {
        for (name, var) in &self.params {
            for (prefix, store) in [("m", &mut self.m), ("v", &mut self.v)] {
                let key = format!("{prefix}.{name}");
                let t = state.get(&key).ok_or_else(|| {
                    NnError::Invalid(format!("checkpoint optimiser state lacks {key}"))
                })?;
                if t.shape() != var.as_tensor().shape() {
                    return Err(NnError::Invalid(format!(
                        "checkpoint optimiser state {key} has shape {:?}, the model {:?}",
                        t.shape(),
                        var.as_tensor().shape()
                    )));
                }
                store.insert(
                    name.clone(),
                    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
                );
            }
        }
        let t = state
            .get("t")
            .ok_or_else(|| NnError::Invalid("checkpoint optimiser state lacks t".into()))?;
        self.t = t.to_vec1::<u32>()?[0] as usize;
        Ok(())
    }
}

/// `Σ g²` of one gradient, accumulated in `f64` in a fixed order.
fn sum_squares(g: &Tensor) -> Result<f64, NnError> {
    if g.dtype() == DType::F32 && g.is_contiguous() {
        let (s, l) = g.storage_and_layout();
        if let (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) = (&*s, l.contiguous_offsets()) {
            let mut acc = [0f64; 4];
            for (i, x) in v[a..b].iter().enumerate() {
                acc[i % 4] += (*x as f64) * (*x as f64);
            }
            return Ok(acc.iter().sum());
        }
    }
    Ok(g.to_dtype(DType::F64)?
        .sqr()?
        .sum_all()?
        .to_scalar::<f64>()?)
}

/// The in-place AdamW update of one parameter: reads its gradient, writes
/// its moments (buffers owned by [`AdamW`], exclusively borrowed for the
/// call) and its weights.
struct AdamWUpdate {
    m: *mut f32,
    v: *mut f32,
    len: usize,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    inv_bc1: f32,
    inv_bc2: f32,
    /// `1 − lr·weight_decay`.
    keep: f32,
    /// Gradient clipping factor.
    clip: f32,
}

impl InplaceOp2 for AdamWUpdate {
    fn name(&self) -> &'static str {
        "lab-adamw"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        let (CpuStorage::F32(theta), CpuStorage::F32(g)) = (s1, s2) else {
            candle_core::bail!("fused AdamW: f32 only");
        };
        let (Some((t0, t1)), Some((g0, g1))) = (l1.contiguous_offsets(), l2.contiguous_offsets())
        else {
            candle_core::bail!("fused AdamW: contiguous tensors only");
        };
        if t1 - t0 != self.len || g1 - g0 != self.len {
            candle_core::bail!(
                "fused AdamW: sizes {} / {} / {}",
                t1 - t0,
                g1 - g0,
                self.len
            );
        }
        // SAFETY: `m` and `v` point to `len` floats owned by the optimiser,
        // which holds `&mut` to both for the duration of this call.
        let (m, v) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.m, self.len),
                std::slice::from_raw_parts_mut(self.v, self.len),
            )
        };
        let (b1, b2) = (self.beta1, self.beta2);
        for (((w, &gr), mi), vi) in theta[t0..t1].iter_mut().zip(&g[g0..g1]).zip(m).zip(v) {
            let gc = gr * self.clip;
            *mi = b1 * *mi + (1.0 - b1) * gc;
            *vi = b2 * *vi + (1.0 - b2) * gc * gc;
            let update = (*mi * self.inv_bc1) / ((*vi * self.inv_bc2).sqrt() + self.eps);
            *w = *w * self.keep - update * self.lr;
        }
        Ok(())
    }
}

/// Scales all gradients so that their global L2 norm is at most `max_norm`;
/// returns the norm before clipping. `max_norm = 0` only measures.
pub fn clip_grad_norm(grads: &mut GradStore, vars: &[Var], max_norm: f64) -> Result<f64, NnError> {
    let mut sq = 0.0f64;
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            sq += g
                .sqr()?
                .sum_all()?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()?;
        }
    }
    let norm = sq.sqrt();
    if max_norm > 0.0 && norm > max_norm {
        let s = max_norm / (norm + 1e-12);
        for v in vars {
            if let Some(g) = grads.get(v.as_tensor()) {
                let scaled = g.affine(s, 0.0)?;
                grads.insert(v.as_tensor(), scaled);
            }
        }
    }
    Ok(norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn adamw_minimises_a_quadratic_and_round_trips_its_state() {
        let dev = Device::Cpu;
        let w = Var::from_tensor(&Tensor::new(&[[3.0f32, -2.0]], &dev).unwrap()).unwrap();
        let mut p = HashMap::new();
        p.insert("w".to_string(), w.clone());
        let mut opt = AdamW::new(p, 0.0).unwrap();
        for _ in 0..300 {
            let loss = w.as_tensor().sqr().unwrap().sum_all().unwrap();
            let g = loss.backward().unwrap();
            opt.step(&g, 0.05).unwrap();
        }
        let v = w
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert!(v.iter().all(|x| x.abs() < 0.05), "{v:?}");
        let st = opt.state().unwrap();
        let mut p2 = HashMap::new();
        p2.insert("w".to_string(), w.clone());
        let mut opt2 = AdamW::new(p2, 0.0).unwrap();
        opt2.load_state(&st).unwrap();
        assert_eq!(opt2.t, 300);
        assert!(opt2.load_state(&HashMap::new()).is_err());
    }

    #[test]
    fn clipping_bounds_the_global_norm() {
        let dev = Device::Cpu;
        let a = Var::from_tensor(&Tensor::new(&[3.0f32, 4.0], &dev).unwrap()).unwrap();
        let loss = (a.as_tensor().sqr().unwrap().sum_all().unwrap() * 0.5).unwrap();
        let mut g = loss.backward().unwrap();
        let n = clip_grad_norm(&mut g, std::slice::from_ref(&a), 1.0).unwrap();
        assert!((n - 5.0).abs() < 1e-6);
        let gv = g.get(a.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
        assert!(
            (gv[0] - 0.6).abs() < 1e-6 && (gv[1] - 0.8).abs() < 1e-6,
            "{gv:?}"
        );
    }
}
