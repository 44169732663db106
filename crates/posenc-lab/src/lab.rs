//! A model with its parameters, its task and its checkpoint metadata
//! ([`Lab`]): building it (weights seeded by name), loading and saving a
//! checkpoint directory, the batches of its task ([`make_batch`]), and the
//! loss and gradients of one batch. Evaluation ([`crate::eval`]) and
//! training ([`crate::train`], which re-exports these items) both run it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{VarBuilder, VarMap};
use posenc::analysis::SplitMix64;
use rayon::prelude::*;

use crate::bpe::{Bpe, Tokenization};
use crate::checkpoint::CheckpointMeta;
use crate::config::{ModelConfig, TrainConfig};
use crate::error::LabError;
use crate::fsio::{read_safetensors, write_atomic, write_safetensors};
use crate::model::{token_embedding_recipe, EvalScaling, Transformer};
use crate::ops;
use crate::optim::{clip_grad_norm, AdamW};
use crate::tasks::{Corpus, Task, IGNORE};

/// A batch on the device.
#[derive(Debug, Clone)]
pub struct Batch {
    /// `(B, T)` u32 tokens.
    pub input: Tensor,
    /// `(B, T)` i64 next-token targets ([`IGNORE`] where not scored), or
    /// `(B,)` i64 labels for classification.
    pub target: Tensor,
}

/// Draws a batch of `batch` examples of `length` tokens.
pub fn make_batch(
    task: &Task,
    rng: &mut SplitMix64,
    batch: usize,
    length: usize,
    device: &Device,
) -> Result<Batch, LabError> {
    let mut input = Vec::with_capacity(batch * length);
    let mut target = Vec::new();
    for _ in 0..batch {
        let e = task.sample(rng, length)?;
        input.extend(e.input);
        match e.label {
            Some(l) => target.push(l as i64),
            None => target.extend(e.target),
        }
    }
    let input = Tensor::from_vec(input, (batch, length), device)?;
    let target = if task.kind.is_classification() {
        Tensor::from_vec(target, batch, device)?
    } else {
        Tensor::from_vec(target, (batch, length), device)?
    };
    Ok(Batch { input, target })
}

/// Parts a training batch is split into, trained side by side by
/// [`Lab::loss_and_grads`] (fixed, so results do not depend on the number
/// of threads).
pub const MICRO_BATCHES: usize = 2;

/// Mean cross-entropy over scored positions and the per-sequence exact-match
/// accuracy (every scored position predicted correctly), with the fused
/// cross-entropy ([`ops::cross_entropy`]).
pub fn loss_and_accuracy(logits: &Tensor, target: &Tensor) -> Result<(Tensor, f64), LabError> {
    loss_and_accuracy_with(logits, target, true)
}

/// [`loss_and_accuracy`] with the fused (`true`) or composed cross-entropy.
pub fn loss_and_accuracy_with(
    logits: &Tensor,
    target: &Tensor,
    fused: bool,
) -> Result<(Tensor, f64), LabError> {
    let v = logits.dim(D::Minus1)?;
    let flat = logits.reshape(((), v))?;
    let tgt = target.flatten_all()?.to_dtype(DType::I64)?;
    let loss = ops::cross_entropy(&flat, &tgt, IGNORE, fused)?;
    // Predictions on the host: argmax of each row.
    let rows = flat.dim(0)?;
    let lv = flat
        .detach()
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let tv = tgt.to_vec1::<i64>()?;
    let seqs = target.dim(0)?;
    let per_seq = rows / seqs.max(1);
    let mut correct = 0usize;
    for s in 0..seqs {
        let ok = (s * per_seq..(s + 1) * per_seq).all(|r| {
            let t = tv[r];
            if t == IGNORE {
                return true;
            }
            let row = &lv[r * v..][..v];
            let mut best = 0;
            for (i, x) in row.iter().enumerate() {
                if *x > row[best] {
                    best = i;
                }
            }
            best as i64 == t
        });
        correct += usize::from(ok);
    }
    Ok((loss, correct as f64 / seqs.max(1) as f64))
}

/// A model with its parameters.
pub struct Lab {
    /// The model.
    pub model: Transformer,
    /// Its parameters.
    pub varmap: VarMap,
    /// The task it is trained on.
    pub task: Task,
    /// Configuration.
    pub meta: CheckpointMeta,
}

impl Lab {
    /// A freshly initialised model for a run (weights from `train.seed`).
    pub fn new(model: ModelConfig, train: TrainConfig, task: Task) -> Result<Self, LabError> {
        model.validate()?;
        train.validate()?;
        if task.kind != train.task
            || task.vocab_size() != model.vocab_size
            || task.num_outputs() != model.num_outputs
        {
            return Err(LabError::Invalid(format!(
                "the task ({}, vocabulary {}, {} outputs) does not match the run ({}) and model (vocabulary {}, {} outputs)",
                task.kind.name(),
                task.vocab_size(),
                task.num_outputs(),
                train.task.name(),
                model.vocab_size,
                model.num_outputs
            )));
        }
        let device = Device::Cpu;
        let varmap = VarMap::new();
        let backend = SeededVarMap {
            map: varmap.clone(),
            seed: train.seed,
        };
        let vb = VarBuilder::from_backend(Box::new(backend), DType::F32, device.clone());
        let m = Transformer::new(&model, vb)?;
        init_weights(&varmap, train.seed, &model)?;
        let tokens = task.tokenization();
        Ok(Lab {
            model: m,
            varmap,
            task,
            meta: CheckpointMeta {
                model,
                train,
                step: 0,
                version: env!("CARGO_PKG_VERSION").into(),
                finetune: None,
                tokens,
            },
        })
    }

    /// Loads a checkpoint directory, checking that every file agrees.
    pub fn load(dir: &Path) -> Result<Self, LabError> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| LabError::Io {
            path: cfg_path.clone(),
            source: e,
        })?;
        let meta: CheckpointMeta = serde_json::from_str(&text).map_err(|e| {
            LabError::Invalid(format!(
                "{} is not a posenc checkpoint config: {e}",
                cfg_path.display()
            ))
        })?;
        let task = load_task_in(&meta.train, meta.tokens, Some(dir))?;
        let mut lab = Lab::new(meta.model.clone(), meta.train.clone(), task)?;
        let weights = read_safetensors(&dir.join("model.safetensors"))?;
        check_step(&weights, meta.step, &dir.join("model.safetensors"))?;
        let data = lab.varmap.data().lock().expect("varmap lock");
        for (name, var) in data.iter() {
            let t = weights.get(name).ok_or_else(|| {
                LabError::Invalid(format!(
                    "checkpoint {} does not match its config: parameter {name} is missing",
                    dir.display()
                ))
            })?;
            if t.shape() != var.as_tensor().shape() {
                return Err(LabError::Invalid(format!(
                    "checkpoint {} does not match its config: {name} has shape {:?}, expected {:?}",
                    dir.display(),
                    t.shape(),
                    var.as_tensor().shape()
                )));
            }
            var.set(t)?;
        }
        if weights.len() != data.len() + 1 {
            return Err(LabError::Invalid(format!(
                "checkpoint {} does not match its config: {} tensors for {} parameters",
                dir.display(),
                weights.len() - 1,
                data.len()
            )));
        }
        drop(data);
        lab.meta = meta;
        Ok(lab)
    }

    /// Loads a checkpoint directory with its optimiser state, to continue
    /// an interrupted run (training or fine-tuning) with [`train`](crate::train::train).
    pub fn load_resumable(dir: &Path) -> Result<(Self, AdamW), LabError> {
        let lab = Lab::load(dir)?;
        let mut opt = AdamW::new(lab.params(), lab.meta.train.weight_decay)?;
        let st = candle_core::safetensors::load(dir.join("optimizer.safetensors"), &Device::Cpu)
            .map_err(|e| {
                LabError::Invalid(format!(
                    "{}: corrupt or missing optimizer state: {e}",
                    dir.display()
                ))
            })?;
        let step = st
            .get("__step")
            .and_then(|t| t.to_vec1::<u32>().ok())
            .map(|v| v[0] as usize);
        if step != Some(lab.meta.step) {
            let from = step.map_or_else(|| "no recorded step".to_string(), |s| format!("step {s}"));
            return Err(LabError::Invalid(format!(
                "{}: optimizer state is from {from}, the model from step {}: the checkpoint is torn",
                dir.display(),
                lab.meta.step
            )));
        }
        opt.load_state(&st)?;
        Ok((lab, opt))
    }

    /// Writes a checkpoint: `model.safetensors`, `optimizer.safetensors`,
    /// then `config.json`, each through a temporary file and a rename. Each
    /// tensor file records the step, so a checkpoint torn by a crash between
    /// two renames is detected on load instead of silently mixing steps.
    pub fn save(&self, dir: &Path, opt: Option<&AdamW>) -> Result<(), LabError> {
        std::fs::create_dir_all(dir).map_err(|e| LabError::Io {
            path: dir.to_path_buf(),
            source: e,
        })?;
        let step_t = Tensor::new(&[self.meta.step as u32], &Device::Cpu)?;
        let mut weights: HashMap<String, Tensor> = self
            .varmap
            .data()
            .lock()
            .expect("varmap lock")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect();
        weights.insert("__step".into(), step_t.clone());
        write_safetensors(&dir.join("model.safetensors"), &weights)?;
        if let Some(opt) = opt {
            let mut st = opt.state()?;
            st.insert("__step".into(), step_t);
            write_safetensors(&dir.join("optimizer.safetensors"), &st)?;
        }
        if let Some(bpe) = self.task.corpus().and_then(|c| c.bpe()) {
            write_atomic(&dir.join(TOKENIZER_FILE), bpe.to_json().as_bytes())?;
        }
        let json = serde_json::to_string_pretty(&self.meta).expect("serialisable");
        write_atomic(&dir.join("config.json"), json.as_bytes())
    }

    /// The model with its parameters detached from autograd (sharing their
    /// storage): a forward pass through it records no graph, so each
    /// activation is freed as soon as the next layer has used it. For
    /// evaluation; it sees later training steps (the storage is shared).
    pub fn frozen(&self) -> Result<Transformer, LabError> {
        let tensors: HashMap<String, Tensor> = self
            .params()
            .into_iter()
            .map(|(k, v)| (k, v.as_tensor().detach()))
            .collect();
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
        let mut m = Transformer::new(&self.meta.model, vb)?;
        m.set_fused(self.model.is_fused());
        Ok(m)
    }

    /// The named parameters.
    pub fn params(&self) -> HashMap<String, candle_core::Var> {
        self.varmap.data().lock().expect("varmap lock").clone()
    }

    /// The training loss, accuracy and gradients of one batch, computed in
    /// [`MICRO_BATCHES`] parts side by side (rayon's threads; each part
    /// runs its kernels on one thread): part `i`'s mean loss is weighted by
    /// its share of the batch's scored targets before its backward pass, so
    /// the summed gradients are those of the whole batch's mean loss. The
    /// split is fixed, so the result does not depend on the thread count.
    ///
    /// # Errors
    /// Those of [`batch_loss`](Self::batch_loss); candle errors.
    pub fn loss_and_grads(
        &self,
        batch: &Batch,
        scaling: Option<&EvalScaling>,
    ) -> Result<(f64, f64, candle_core::backprop::GradStore), LabError> {
        let rows = batch.input.dim(0)?;
        let k = MICRO_BATCHES.min(rows).max(1);
        let parts: Vec<(usize, usize)> = (0..k)
            .map(|i| (i * rows / k, (i + 1) * rows / k - i * rows / k))
            .collect();
        let scored = |t: &Tensor| -> Result<usize, LabError> {
            Ok(if t.rank() == 1 {
                t.dim(0)?
            } else {
                t.flatten_all()?
                    .to_vec1::<i64>()?
                    .iter()
                    .filter(|&&v| v != IGNORE)
                    .count()
            })
        };
        let counts: Vec<usize> = parts
            .iter()
            .map(|&(s, n)| scored(&batch.target.narrow(0, s, n)?))
            .collect::<Result<_, _>>()?;
        let total = counts.iter().sum::<usize>().max(1) as f64;
        let run = |i: usize| -> Result<(f64, f64, candle_core::backprop::GradStore), LabError> {
            posenc::kernels::run_serial(|| {
                let (s, n) = parts[i];
                let input = batch.input.narrow(0, s, n)?;
                let target = batch.target.narrow(0, s, n)?;
                let logits = self.model.forward(&input, 0, scaling)?;
                let (loss, acc) = loss_and_accuracy_with(&logits, &target, self.model.is_fused())?;
                let w = counts[i] as f64 / total;
                let lv = loss.to_scalar::<f32>()? as f64;
                let g = (loss * w)?.backward()?;
                Ok((lv * w, acc * n as f64 / rows as f64, g))
            })
        };
        let results: Vec<(f64, f64, candle_core::backprop::GradStore)> =
            if posenc::kernels::threads() > 1 {
                (0..k).into_par_iter().map(run).collect::<Result<_, _>>()?
            } else {
                (0..k).map(run).collect::<Result<_, _>>()?
            };
        let mut it = results.into_iter();
        let (mut loss, mut acc, mut grads) = it.next().expect("at least one part");
        let params = self.params();
        for (l, a, g) in it {
            loss += l;
            acc += a;
            for var in params.values() {
                if let Some(g2) = g.get(var.as_tensor()) {
                    let sum = match grads.get(var.as_tensor()) {
                        Some(g1) => (g1 + g2)?,
                        None => g2.clone(),
                    };
                    grads.insert(var.as_tensor(), sum);
                }
            }
        }
        Ok((loss, acc, grads))
    }

    /// Loss and accuracy on one batch (fused or composed, as the model).
    pub fn batch_loss(
        &self,
        batch: &Batch,
        scaling: Option<&EvalScaling>,
    ) -> Result<(Tensor, f64), LabError> {
        let logits = self.model.forward(&batch.input, 0, scaling)?;
        loss_and_accuracy_with(&logits, &batch.target, self.model.is_fused())
    }

    /// One optimiser step from `grads` (clipping to `grad_clip`): the fused
    /// in-place AdamW, or the composed reference when the model runs the
    /// composed ops. Returns the gradient norm before clipping.
    pub fn optimizer_step(
        &self,
        opt: &mut AdamW,
        grads: &mut candle_core::backprop::GradStore,
        lr: f64,
    ) -> Result<f64, LabError> {
        let clip = self.meta.train.grad_clip;
        if self.model.is_fused() {
            Ok(opt.step_clipped(grads, lr, clip)?)
        } else {
            let vars: Vec<candle_core::Var> = {
                let mut v: Vec<(String, candle_core::Var)> = self.params().into_iter().collect();
                v.sort_by(|a, b| a.0.cmp(&b.0));
                v.into_iter().map(|(_, v)| v).collect()
            };
            let n = clip_grad_norm(grads, &vars, clip)?;
            opt.step(grads, lr)?;
            Ok(n)
        }
    }
}

/// A `VarMap` whose new variables are drawn from a generator seeded by
/// `(seed, name)`, following each module's own `Init` hint: candle's CPU
/// generator cannot be seeded, and drawing by name makes the weights
/// independent of the order modules are built in.
struct SeededVarMap {
    map: VarMap,
    seed: u64,
}

impl candle_nn::var_builder::SimpleBackend for SeededVarMap {
    fn get(
        &self,
        s: candle_core::Shape,
        name: &str,
        h: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let mut data = self.map.data().lock().expect("varmap lock");
        if let Some(v) = data.get(name) {
            if v.as_tensor().shape() != &s {
                candle_core::bail!(
                    "shape mismatch on {name}: {s:?} <> {:?}",
                    v.as_tensor().shape()
                )
            }
            return Ok(v.as_tensor().clone());
        }
        let n = s.elem_count();
        let name_hash = crate::bpe::fnv(name.as_bytes());
        let mut rng = SplitMix64::new(self.seed ^ name_hash);
        let vals: Vec<f64> = match h {
            candle_nn::Init::Const(c) => vec![c; n],
            candle_nn::Init::Randn { mean, stdev } => {
                (0..n).map(|_| mean + stdev * rng.normal()).collect()
            }
            candle_nn::Init::Uniform { lo, up } => {
                (0..n).map(|_| lo + (up - lo) * rng.uniform()).collect()
            }
            candle_nn::Init::Kaiming {
                dist,
                fan,
                non_linearity,
            } => {
                let std = non_linearity.gain() / (fan.for_shape(&s) as f64).sqrt();
                match dist {
                    candle_nn::init::NormalOrUniform::Normal => {
                        (0..n).map(|_| std * rng.normal()).collect()
                    }
                    candle_nn::init::NormalOrUniform::Uniform => {
                        let b = 3f64.sqrt() * std;
                        (0..n).map(|_| -b + 2.0 * b * rng.uniform()).collect()
                    }
                }
            }
        };
        let t = Tensor::from_vec(vals, s, dev)?.to_dtype(dtype)?;
        let var = candle_core::Var::from_tensor(&t)?;
        let out = var.as_tensor().clone();
        data.insert(name.to_string(), var);
        Ok(out)
    }

    fn get_unchecked(
        &self,
        name: &str,
        _dtype: DType,
        _dev: &Device,
    ) -> candle_core::Result<Tensor> {
        candle_core::bail!("the lab's parameters are created, not loaded by name ({name})")
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.map
            .data()
            .lock()
            .expect("varmap lock")
            .contains_key(name)
    }
}

/// Re-initialises the transformer's own matrices GPT-2 style, from `seed`
/// and each parameter's name: matrices N(0, 0.02²), the output projection of
/// each residual branch N(0, (0.02/√(2L))²), biases 0; the token embedding
/// as [`token_embedding_recipe`] says. Layer norms and the positional
/// encodings' parameters keep the (seeded) initialisation their modules
/// asked for.
fn init_weights(varmap: &VarMap, seed: u64, model: &ModelConfig) -> Result<(), LabError> {
    let n_layers = model.n_layers;
    let token_std = token_embedding_recipe(model).init_std;
    let data = varmap.data().lock().expect("varmap lock");
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    let mut rng = SplitMix64::new(seed ^ 0x0005_EED0_FA11_u64);
    for name in names {
        let is_pe = name.starts_with("pe.")
            || name.contains("shaw")
            || name.contains(".cope.")
            || name.contains(".fox.");
        let is_norm = name.contains(".ln") || name.starts_with("ln");
        if is_pe || is_norm {
            continue;
        }
        let var = &data[name];
        let t = var.as_tensor();
        let n = t.elem_count();
        let std = if name == "tok.weight" {
            token_std
        } else if t.rank() >= 2 {
            let resid = name.ends_with("attn.proj.weight") || name.ends_with("mlp.fc2.weight");
            if resid {
                0.02 / (2.0 * n_layers as f64).sqrt()
            } else {
                0.02
            }
        } else {
            0.0
        };
        let vals: Vec<f32> = (0..n).map(|_| (std * rng.normal()) as f32).collect();
        var.set(&Tensor::from_vec(vals, t.shape(), t.device())?)?;
    }
    Ok(())
}

/// The file beside a BPE checkpoint's `config.json` that holds its
/// tokenizer.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Builds the task a run trains on, with a character corpus.
pub fn load_task(train: &TrainConfig) -> Result<Task, LabError> {
    load_task_in(train, Tokenization::Chars, None)
}

/// Builds the task a run trains on with `tokens`; for BPE, the tokenizer
/// saved in checkpoint directory `dir` when it holds one
/// ([`TOKENIZER_FILE`], checked against the size asked), else the one
/// trained on the corpus's training part ([`Bpe::cached`]).
///
/// # Errors
/// A corpus file that cannot be read; a `tokenizer.json` that is not a
/// byte-level BPE of that size; as [`Task::from_text_with_tokens`].
pub fn load_task_in(
    train: &TrainConfig,
    tokens: Tokenization,
    dir: Option<&Path>,
) -> Result<Task, LabError> {
    let saved = match (tokens, dir) {
        (Tokenization::Bpe { vocab }, Some(dir)) if dir.join(TOKENIZER_FILE).exists() => {
            let path = dir.join(TOKENIZER_FILE);
            let json = std::fs::read_to_string(&path).map_err(|e| LabError::Io {
                path: path.clone(),
                source: e,
            })?;
            let bpe = Bpe::from_json(&json)
                .map_err(|e| LabError::Invalid(format!("{}: {e}", path.display())))?;
            if bpe.vocab_size() != vocab {
                return Err(LabError::Invalid(format!(
                    "{}: {} tokens, but the checkpoint was trained with bpe:{vocab}",
                    path.display(),
                    bpe.vocab_size()
                )));
            }
            Some(Arc::new(bpe))
        }
        _ => None,
    };
    let text = match &train.corpus {
        Some(path) => std::fs::read_to_string(path).map_err(|e| LabError::Io {
            path: path.clone(),
            source: e,
        })?,
        None if tokens.is_chars() || !train.task.uses_corpus() => {
            return Task::new_with_tokens(train.task, train.n_symbols, tokens)
        }
        None => Corpus::synthetic_text(400_000, 1234),
    };
    match saved {
        Some(bpe) => Task::with_corpus(train.task, Corpus::with_bpe(&text, bpe)?),
        None => Task::from_text_with_tokens(train.task, &text, tokens),
    }
}

fn check_step(t: &HashMap<String, Tensor>, step: usize, path: &Path) -> Result<(), LabError> {
    let s = t
        .get("__step")
        .ok_or_else(|| {
            LabError::Invalid(format!(
                "{} is not a posenc checkpoint (no step)",
                path.display()
            ))
        })?
        .to_vec1::<u32>()?[0] as usize;
    if s != step {
        return Err(LabError::Invalid(format!(
            "{} is from step {s} but config.json says step {step}: the checkpoint is torn (interrupted while saving)",
            path.display()
        )));
    }
    Ok(())
}
