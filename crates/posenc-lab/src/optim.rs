//! AdamW with named, saveable state, and global-norm gradient clipping.
//!
//! candle-nn's `AdamW` keeps its moments private, so a run could not resume
//! exactly; this one stores them by parameter name so a checkpoint holds the
//! whole optimiser and `--resume` continues bit for bit.

use std::collections::{BTreeMap, HashMap};

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};

use crate::LabError;

/// AdamW (Loshchilov & Hutter 2019) with decoupled weight decay.
#[derive(Debug)]
pub struct AdamW {
    params: Vec<(String, Var)>,
    m: HashMap<String, Tensor>,
    v: HashMap<String, Tensor>,
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
    pub fn new(params: HashMap<String, Var>, weight_decay: f64) -> Result<Self, LabError> {
        let params: BTreeMap<String, Var> = params.into_iter().collect();
        let mut m = HashMap::new();
        let mut v = HashMap::new();
        for (name, var) in &params {
            m.insert(name.clone(), var.as_tensor().zeros_like()?);
            v.insert(name.clone(), var.as_tensor().zeros_like()?);
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

    /// One update with learning rate `lr`. Parameters without a gradient
    /// are left unchanged.
    pub fn step(&mut self, grads: &GradStore, lr: f64) -> Result<(), LabError> {
        self.t += 1;
        let bc1 = 1.0 - self.beta1.powi(self.t as i32);
        let bc2 = 1.0 - self.beta2.powi(self.t as i32);
        for (name, var) in &self.params {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            let m = (self.m[name].affine(self.beta1, 0.0)? + g.affine(1.0 - self.beta1, 0.0)?)?;
            let v = (self.v[name].affine(self.beta2, 0.0)?
                + g.sqr()?.affine(1.0 - self.beta2, 0.0)?)?;
            let mhat = m.affine(1.0 / bc1, 0.0)?;
            let vhat = v.affine(1.0 / bc2, 0.0)?;
            let update = mhat.div(&(vhat.sqrt()? + self.eps)?)?;
            let theta = var.as_tensor();
            let decay = if theta.rank() >= 2 {
                self.weight_decay
            } else {
                0.0
            };
            let next = (theta.affine(1.0 - lr * decay, 0.0)? - update.affine(lr, 0.0)?)?;
            var.set(&next)?;
            self.m.insert(name.clone(), m);
            self.v.insert(name.clone(), v);
        }
        Ok(())
    }

    /// The optimiser state as named tensors (`m.NAME`, `v.NAME`, `t`).
    pub fn state(&self) -> Result<HashMap<String, Tensor>, LabError> {
        let mut out = HashMap::new();
        for (name, _) in &self.params {
            out.insert(format!("m.{name}"), self.m[name].clone());
            out.insert(format!("v.{name}"), self.v[name].clone());
        }
        out.insert(
            "t".into(),
            Tensor::new(&[self.t as u32], &candle_core::Device::Cpu)?,
        );
        Ok(out)
    }

    /// Restores a state written by [`state`](Self::state).
    pub fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<(), LabError> {
        for (name, var) in &self.params {
            for (prefix, store) in [("m", &mut self.m), ("v", &mut self.v)] {
                let key = format!("{prefix}.{name}");
                let t = state.get(&key).ok_or_else(|| {
                    LabError::Invalid(format!("checkpoint optimiser state lacks {key}"))
                })?;
                if t.shape() != var.as_tensor().shape() {
                    return Err(LabError::Invalid(format!(
                        "checkpoint optimiser state {key} has shape {:?}, the model {:?}",
                        t.shape(),
                        var.as_tensor().shape()
                    )));
                }
                store.insert(name.clone(), t.to_dtype(DType::F32)?);
            }
        }
        let t = state
            .get("t")
            .ok_or_else(|| LabError::Invalid("checkpoint optimiser state lacks t".into()))?;
        self.t = t.to_vec1::<u32>()?[0] as usize;
        Ok(())
    }
}

/// Scales all gradients so that their global L2 norm is at most `max_norm`;
/// returns the norm before clipping. `max_norm = 0` only measures.
pub fn clip_grad_norm(grads: &mut GradStore, vars: &[Var], max_norm: f64) -> Result<f64, LabError> {
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
