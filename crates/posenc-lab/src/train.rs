//! Training, evaluation and checkpoints.
//!
//! Deterministic: the batch of step `s` is drawn from a generator seeded by
//! `(seed, s)`, and the weights from `seed`, so the same seed and thread
//! count give the same losses, and a resumed run continues exactly.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, IndexOp, Tensor, D};
use candle_nn::{VarBuilder, VarMap};
use posenc::analysis::SplitMix64;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::bpe::{Bpe, Tokenization};
pub use crate::checkpoint::{batch_seed, CheckpointMeta};
use crate::config::{Mode, ModelConfig, TrainConfig};
use crate::model::{token_embedding_recipe, EvalScaling, Transformer};
use crate::ops;
use crate::optim::{clip_grad_norm, AdamW};
use crate::tasks::{Corpus, Task, IGNORE};
use crate::LabError;

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
    /// an interrupted run (training or fine-tuning) with [`train`].
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
            return Err(LabError::Invalid(format!(
                "{}: optimizer state is from step {step:?}, the model from step {}: the checkpoint is torn",
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
            opt.step_clipped(grads, lr, clip)
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
        let name_hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        });
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

fn read_safetensors(path: &Path) -> Result<HashMap<String, Tensor>, LabError> {
    if !path.exists() {
        return Err(LabError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "file not found"),
        });
    }
    candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| {
        LabError::Invalid(format!(
            "{} is corrupt or not a safetensors file: {e}",
            path.display()
        ))
    })
}

fn write_safetensors(path: &Path, tensors: &HashMap<String, Tensor>) -> Result<(), LabError> {
    let tmp = tmp_path(path);
    candle_core::safetensors::save(tensors, &tmp)?;
    std::fs::rename(&tmp, path).map_err(|e| LabError::Io {
        path: path.to_path_buf(),
        source: e,
    })
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// Writes a file through a temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), LabError> {
    let tmp = tmp_path(path);
    std::fs::write(&tmp, bytes).map_err(|e| LabError::Io {
        path: tmp.clone(),
        source: e,
    })?;
    std::fs::rename(&tmp, path).map_err(|e| LabError::Io {
        path: path.to_path_buf(),
        source: e,
    })
}

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Steps completed.
    pub step: usize,
    /// Training loss of the step (mean over scored tokens).
    pub loss: f64,
    /// Exact-match accuracy of the step's batch.
    pub accuracy: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Training throughput, input tokens per second.
    pub tokens_per_s: f64,
    /// Seconds since the run (or its resumption) started.
    pub elapsed_s: f64,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Steps completed.
    pub steps: usize,
    /// Final training loss (mean over the last logging window, or over the
    /// steps since the last log line when interrupted).
    pub final_loss: f64,
    /// Final training accuracy (mean of the last logged window).
    pub final_accuracy: f64,
    /// Wall-clock seconds of this invocation.
    pub seconds: f64,
    /// Mean tokens per second.
    pub tokens_per_s: f64,
    /// Whether the run was interrupted (checkpoint written).
    pub interrupted: bool,
}

/// Options of [`train`].
pub struct TrainOptions<'a> {
    /// Checkpoint directory.
    pub out: &'a Path,
    /// Draw a progress bar (stderr) instead of log lines.
    pub progress: bool,
    /// Print anything at all.
    pub quiet: bool,
    /// Set by a Ctrl-C handler: checkpoint and stop.
    pub stop: Option<&'a AtomicBool>,
    /// Stop (with a checkpoint, as an interrupt would) once this many steps
    /// are done; the schedule still runs to `steps`.
    pub pause_at: Option<usize>,
}

impl<'a> TrainOptions<'a> {
    /// Silent training to the last step, checkpointing into `out`: no
    /// progress bar, no log lines, no interrupt flag, no pause.
    pub fn quiet(out: &'a Path) -> Self {
        TrainOptions {
            out,
            progress: false,
            quiet: true,
            stop: None,
            pause_at: None,
        }
    }
}

/// Trains `lab` until `lab.meta.train.steps`, from its current step,
/// writing `metrics.jsonl` and a checkpoint at the end (and on interrupt).
///
/// A fine-tuned checkpoint ([`CheckpointMeta::finetune`] set) continues its
/// fine-tuning: the same RoPE scaling in the forward pass and the same data
/// stream as [`finetune`](crate::finetune::finetune), so resuming an
/// interrupted fine-tune is loading it with [`Lab::load_resumable`] and
/// calling this.
pub fn train(lab: &mut Lab, opt: &mut AdamW, o: &TrainOptions) -> Result<Summary, LabError> {
    run_loop(
        lab,
        opt,
        &LoopOptions {
            out: Some(o.out),
            progress: o.progress,
            quiet: o.quiet,
            stop: o.stop,
            pause_at: o.pause_at,
        },
    )
}

/// [`TrainOptions`] with an optional output directory (`None`: train in
/// memory, write nothing).
pub(crate) struct LoopOptions<'a> {
    pub out: Option<&'a Path>,
    pub progress: bool,
    pub quiet: bool,
    pub stop: Option<&'a AtomicBool>,
    pub pause_at: Option<usize>,
}

/// The training loop of [`train`] and [`finetune`](crate::finetune::finetune).
pub(crate) fn run_loop(
    lab: &mut Lab,
    opt: &mut AdamW,
    o: &LoopOptions,
) -> Result<Summary, LabError> {
    let device = Device::Cpu;
    let cfg = lab.meta.train.clone();
    // A fine-tune keeps its scaling in the forward pass and draws its batches
    // from its own stream.
    let ft = lab.meta.finetune.clone();
    let scaling = match ft.as_ref().and_then(|f| f.scaling.as_ref()) {
        Some(s) => Some(s.build(&lab.meta.model)?),
        None => None,
    };
    let step_seed = |step: usize| match &ft {
        Some(f) => f.batch_seed(step),
        None => batch_seed(cfg.seed, step as u64, 0),
    };
    let mut metrics_text = String::new();
    if let Some(out) = o.out {
        std::fs::create_dir_all(out).map_err(|e| LabError::Io {
            path: out.to_path_buf(),
            source: e,
        })?;
        // On resume, drop metric lines past the checkpoint's step so the
        // file matches the run exactly.
        let kept: Vec<String> = std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                serde_json::from_str::<Metrics>(l)
                    .map(|m| m.step <= lab.meta.step)
                    .unwrap_or(false)
            })
            .map(str::to_owned)
            .collect();
        metrics_text = kept.join("\n");
        if !metrics_text.is_empty() {
            metrics_text.push('\n');
        }
    }
    let start = Instant::now();
    let start_step = lab.meta.step;
    let tokens_per_step = (cfg.batch * cfg.train_len) as f64;
    let (mut win_loss, mut win_acc, mut win_n) = (0.0, 0.0, 0usize);
    let (mut last_loss, mut last_acc) = (f64::NAN, f64::NAN);
    let mut interrupted = false;
    let tty = o.progress && std::io::stderr().is_terminal();
    while lab.meta.step < cfg.steps {
        if o.stop.is_some_and(|s| s.load(Ordering::SeqCst))
            || o.pause_at.is_some_and(|p| lab.meta.step >= p)
        {
            interrupted = true;
            break;
        }
        let step = lab.meta.step;
        let mut rng = SplitMix64::new(step_seed(step));
        let batch = make_batch(&lab.task, &mut rng, cfg.batch, cfg.train_len, &device)?;
        let (loss_v, acc, mut grads) = lab.loss_and_grads(&batch, scaling.as_ref())?;
        if !loss_v.is_finite() {
            return Err(LabError::Diverged { step, loss: loss_v });
        }
        let lr = cfg.lr_at(step);
        let gnorm = lab.optimizer_step(opt, &mut grads, lr)?;
        drop(grads);
        lab.meta.step += 1;
        win_loss += loss_v;
        win_acc += acc;
        win_n += 1;
        let done = lab.meta.step;
        if done.is_multiple_of(cfg.log_every) || done == cfg.steps {
            let elapsed = start.elapsed().as_secs_f64();
            let tps = tokens_per_step * (done - start_step) as f64 / elapsed.max(1e-9);
            let m = Metrics {
                step: done,
                loss: win_loss / win_n as f64,
                accuracy: win_acc / win_n as f64,
                lr,
                grad_norm: gnorm,
                tokens_per_s: tps,
                elapsed_s: elapsed,
            };
            last_loss = m.loss;
            last_acc = m.accuracy;
            if o.out.is_some() {
                metrics_text.push_str(&serde_json::to_string(&m).expect("serialisable"));
                metrics_text.push('\n');
            }
            (win_loss, win_acc, win_n) = (0.0, 0.0, 0);
            if !o.quiet {
                let eta = (cfg.steps - done) as f64 * elapsed / (done - start_step) as f64;
                let line = progress_line(done, cfg.steps, m.loss, m.accuracy, tps, eta);
                if tty {
                    eprint!("\r{line}");
                    let _ = std::io::stderr().flush();
                } else {
                    eprintln!("{line}");
                }
            }
        }
    }
    if tty && !o.quiet {
        eprintln!();
    }
    if win_n > 0 {
        // Steps since the last log line (an interrupted run).
        last_loss = win_loss / win_n as f64;
        last_acc = win_acc / win_n as f64;
    }
    if let Some(out) = o.out {
        write_atomic(&out.join("metrics.jsonl"), metrics_text.as_bytes())?;
        lab.save(out, Some(opt))?;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(Summary {
        steps: lab.meta.step,
        final_loss: last_loss,
        final_accuracy: last_acc,
        seconds,
        tokens_per_s: tokens_per_step * (lab.meta.step - start_step) as f64 / seconds.max(1e-9),
        interrupted,
    })
}

/// Times `steps` full training steps (batch, forward, backward, clipping,
/// AdamW) without writing anything; returns the seconds of each step.
pub fn time_steps(lab: &mut Lab, opt: &mut AdamW, steps: usize) -> Result<Vec<f64>, LabError> {
    let cfg = lab.meta.train.clone();
    let mut out = Vec::with_capacity(steps);
    for s in 0..steps {
        let t0 = Instant::now();
        let mut rng = SplitMix64::new(batch_seed(cfg.seed, s as u64, 5));
        let batch = make_batch(&lab.task, &mut rng, cfg.batch, cfg.train_len, &Device::Cpu)?;
        let (_, _, mut grads) = lab.loss_and_grads(&batch, None)?;
        lab.optimizer_step(opt, &mut grads, cfg.lr_at(s))?;
        out.push(t0.elapsed().as_secs_f64());
    }
    Ok(out)
}

/// `[#####.....] step 120/500 loss 1.234 acc 51.0% 12.3k tok/s ETA 0:31`.
pub fn progress_line(
    step: usize,
    total: usize,
    loss: f64,
    acc: f64,
    tps: f64,
    eta_s: f64,
) -> String {
    let width = 24;
    let filled = (width * step) / total.max(1);
    let eta = eta_s.max(0.0).round() as u64;
    format!(
        "[{}{}] step {step}/{total} loss {loss:.4} acc {:.1}% {:.1}k tok/s ETA {}:{:02}",
        "#".repeat(filled),
        ".".repeat(width - filled),
        acc * 100.0,
        tps / 1000.0,
        eta / 60,
        eta % 60
    )
}

/// Loss and accuracy per evaluation length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalResult {
    /// Evaluation lengths.
    pub lengths: Vec<usize>,
    /// Mean loss at each length.
    pub loss: Vec<f64>,
    /// Exact-match accuracy per sequence at each length.
    pub accuracy: Vec<f64>,
    /// Bits per character at each length (`lm`, `mlm`): the total nats
    /// of the scored targets over the characters they hold
    /// ([`Corpus::chars_of`]), / ln 2 — comparable across tokenizations.
    /// NaN (`null`) for tasks without a corpus.
    #[serde(default, deserialize_with = "crate::eval::nan_as_null")]
    pub bits_per_char: Vec<f64>,
}

/// Characters held by the scored targets of `target` (`(B, T)` ids,
/// [`IGNORE`] where not scored) and how many targets are scored; `None`
/// for a task without a corpus or a classification target.
pub fn scored_chars(task: &Task, target: &Tensor) -> Result<Option<(u64, usize)>, LabError> {
    let Some(c) = task.corpus() else {
        return Ok(None);
    };
    if target.rank() != 2 {
        return Ok(None);
    }
    let (mut chars, mut n) = (0u64, 0usize);
    for y in target.flatten_all()?.to_vec1::<i64>()? {
        if y != IGNORE {
            chars += c.chars_of(y as u32) as u64;
            n += 1;
        }
    }
    Ok(Some((chars, n)))
}

/// Memory a forward pass of [`evaluate`] may take (bytes); larger batches
/// are split into micro-batches that fit, and a length that does not fit
/// even one sequence is [`LabError::TooLong`].
pub const EVAL_MEMORY_BUDGET: u64 = 1 << 30;

/// Evaluates on `batches × batch` fresh sequences per length (seeded
/// independently of training), through the [`frozen`](Lab::frozen) model:
/// a batch whose forward pass would exceed [`EVAL_MEMORY_BUDGET`] runs as
/// micro-batches (the loss is the same mean over the batch's scored tokens).
///
/// # Errors
/// [`LabError::TooLong`] before any allocation for a length that does not
/// fit one sequence; a learned table too short; candle errors.
pub fn evaluate(
    lab: &Lab,
    lengths: &[usize],
    batches: usize,
    batch: usize,
    scaling: Option<&EvalScaling>,
) -> Result<EvalResult, LabError> {
    let device = Device::Cpu;
    let model = lab.frozen()?;
    let mut loss = Vec::new();
    let mut accuracy = Vec::new();
    let mut bits_per_char = Vec::new();
    for &len in lengths {
        model.check_length(len)?;
        let micro = micro_batch(&model, len, batch)?;
        let (mut l, mut a) = (0.0, 0.0);
        // Total nats and characters of the scored targets, for bits per
        // character.
        let (mut nats, mut chars) = (0.0f64, 0u64);
        for b in 0..batches {
            let mut rng =
                SplitMix64::new(batch_seed(lab.meta.train.seed, (len * 1000 + b) as u64, 1));
            let full = make_batch(&lab.task, &mut rng, batch, len, &device)?;
            let held = scored_chars(&lab.task, &full.target)?;
            if micro >= batch {
                let logits = model.forward(&full.input, 0, scaling)?;
                let (ls, acc) = loss_and_accuracy_with(&logits, &full.target, model.is_fused())?;
                let ls = ls.to_scalar::<f32>()? as f64;
                l += ls;
                a += acc;
                if let Some((c, n)) = held {
                    nats += ls * n as f64;
                    chars += c;
                }
                continue;
            }
            // Micro-batches: the mean over all scored tokens of the batch.
            let (mut sum, mut count, mut correct) = (0.0f64, 0usize, 0.0f64);
            let mut start = 0;
            while start < batch {
                let n = micro.min(batch - start);
                let input = full.input.narrow(0, start, n)?;
                let target = full.target.narrow(0, start, n)?;
                let scored = if target.rank() == 1 {
                    n
                } else {
                    target
                        .flatten_all()?
                        .to_vec1::<i64>()?
                        .iter()
                        .filter(|&&t| t != IGNORE)
                        .count()
                };
                let logits = model.forward(&input, 0, scaling)?;
                let (ls, acc) = loss_and_accuracy_with(&logits, &target, model.is_fused())?;
                sum += ls.to_scalar::<f32>()? as f64 * scored as f64;
                count += scored;
                correct += acc * n as f64;
                start += n;
            }
            l += sum / count.max(1) as f64;
            a += correct / batch as f64;
            if let Some((c, _)) = held {
                nats += sum;
                chars += c;
            }
        }
        loss.push(l / batches as f64);
        accuracy.push(a / batches as f64);
        bits_per_char.push(if chars == 0 {
            f64::NAN
        } else {
            nats / chars as f64 / std::f64::consts::LN_2
        });
    }
    Ok(EvalResult {
        lengths: lengths.to_vec(),
        loss,
        accuracy,
        bits_per_char,
    })
}

/// The largest number of sequences of `len` tokens (at most `batch`) whose
/// forward pass fits [`EVAL_MEMORY_BUDGET`].
///
/// # Errors
/// [`LabError::TooLong`] if not even one fits.
pub fn micro_batch(model: &Transformer, len: usize, batch: usize) -> Result<usize, LabError> {
    let (one, why) = model.eval_bytes(1, len);
    let budget = EVAL_MEMORY_BUDGET as u128;
    if one > budget {
        return Err(LabError::TooLong {
            len,
            need_mb: (one >> 20).min(u64::MAX as u128) as u64,
            budget_mb: EVAL_MEMORY_BUDGET >> 20,
            why,
        });
    }
    let mut n = batch.max(1);
    while n > 1 && model.eval_bytes(n, len).0 > budget {
        n = n.div_ceil(2);
    }
    Ok(n)
}

/// The shuffle test (Haviv et al. 2022 §5): loss on the last
/// `tail` positions of language-model windows with the prefix in order
/// versus randomly shuffled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShuffleResult {
    /// Mean loss with the prefix in order.
    pub in_order: f64,
    /// Mean loss with the prefix shuffled.
    pub shuffled: f64,
    /// Unigram entropy of the corpus (the loss of a context-free model).
    pub unigram: Option<f64>,
}

/// Runs the shuffle test on `batches × batch` windows of `length` tokens:
/// the first `length − tail` tokens are permuted (the last `tail` kept), and
/// the loss is measured on the last `tail` targets only.
pub fn shuffle_test(
    lab: &Lab,
    length: usize,
    tail: usize,
    batches: usize,
    batch: usize,
) -> Result<ShuffleResult, LabError> {
    if lab.meta.model.mode != Mode::Decoder {
        return Err(LabError::Invalid(
            "the shuffle test needs a decoder checkpoint".into(),
        ));
    }
    if tail == 0 || tail >= length {
        return Err(LabError::Invalid(format!(
            "tail {tail} must be in 1..{length}"
        )));
    }
    let device = Device::Cpu;
    let model = lab.frozen()?;
    let (mut a, mut b) = (0.0, 0.0);
    for i in 0..batches {
        let mut rng = SplitMix64::new(batch_seed(lab.meta.train.seed, i as u64, 2));
        let batch = make_batch(&lab.task, &mut rng, batch, length, &device)?;
        let input = batch.input.to_vec2::<u32>()?;
        let target = batch.target.to_vec2::<i64>()?;
        let keep_from = length - tail;
        let mut shuffled = input.clone();
        for row in shuffled.iter_mut() {
            for j in (1..keep_from).rev() {
                row.swap(j, rng.below(j as u64 + 1) as usize);
            }
        }
        // Score only the last `tail` targets (their inputs are unshuffled).
        let masked: Vec<Vec<i64>> = target
            .iter()
            .map(|r| {
                r.iter()
                    .enumerate()
                    .map(|(j, &y)| if j >= keep_from { y } else { IGNORE })
                    .collect()
            })
            .collect();
        let tgt = Tensor::new(masked, &device)?;
        for (inp, acc) in [(input, &mut a), (shuffled, &mut b)] {
            let x = Tensor::new(inp, &device)?;
            let logits = model.forward(&x, 0, None)?;
            let (l, _) = loss_and_accuracy(&logits, &tgt)?;
            *acc += l.to_scalar::<f32>()? as f64;
        }
    }
    Ok(ShuffleResult {
        in_order: a / batches as f64,
        shuffled: b / batches as f64,
        unigram: lab.task.corpus().map(|c| c.unigram_entropy()),
    })
}

/// A per-layer linear probe of absolute position (Haviv et al. 2022 §4):
/// for the activations after the embedding and after each block, fit a
/// ridge regression from the activation of the token at position t to t on
/// one set of sequences and report the mean absolute error on another,
/// against the error of always predicting the mean position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    /// Sequence length probed.
    pub length: usize,
    /// Mean absolute error per layer (index 0: embeddings + input encoding).
    pub mae: Vec<f64>,
    /// The error of predicting the mean position.
    pub baseline_mae: f64,
}

/// Runs the probe.
pub fn probe(
    lab: &Lab,
    length: usize,
    batches: usize,
    batch: usize,
) -> Result<ProbeResult, LabError> {
    let device = Device::Cpu;
    let model = lab.frozen()?;
    let collect = |stream: u64| -> Result<Vec<Tensor>, LabError> {
        let mut per_layer: Vec<Vec<Tensor>> = Vec::new();
        for i in 0..batches {
            let mut rng = SplitMix64::new(batch_seed(lab.meta.train.seed, i as u64, stream));
            let b = make_batch(&lab.task, &mut rng, batch, length, &device)?;
            let acts = model.hidden_states(&b.input, 0)?;
            if per_layer.is_empty() {
                per_layer = vec![Vec::new(); acts.len()];
            }
            for (l, a) in acts.into_iter().enumerate() {
                let d = a.dim(2)?;
                per_layer[l].push(a.reshape((batch * length, d))?);
            }
        }
        per_layer
            .into_iter()
            .map(|v| Ok(Tensor::cat(&v, 0)?.to_dtype(DType::F64)?))
            .collect()
    };
    let train_x = collect(3)?;
    let test_x = collect(4)?;
    let pos: Vec<f64> = (0..batches * batch)
        .flat_map(|_| (0..length).map(|t| t as f64))
        .collect();
    let y = Tensor::from_vec(pos.clone(), (pos.len(), 1), &device)?;
    let mean = pos.iter().sum::<f64>() / pos.len() as f64;
    let baseline = pos.iter().map(|p| (p - mean).abs()).sum::<f64>() / pos.len() as f64;
    let mut mae = Vec::new();
    for (xtr, xte) in train_x.iter().zip(&test_x) {
        let n = xtr.dim(0)?;
        let ones = Tensor::ones((n, 1), DType::F64, &device)?;
        let xtr1 = Tensor::cat(&[xtr, &ones], 1)?;
        let xte1 = Tensor::cat(
            &[xte, &Tensor::ones((xte.dim(0)?, 1), DType::F64, &device)?],
            1,
        )?;
        let d = xtr1.dim(1)?;
        let xtx = (xtr1.t()?.matmul(&xtr1)? + (Tensor::eye(d, DType::F64, &device)? * 1e-3)?)?;
        let xty = xtr1.t()?.matmul(&y)?;
        let w = solve_spd(&xtx, &xty)?;
        let pred = xte1.matmul(&w)?.squeeze(1)?.to_vec1::<f64>()?;
        let err = pred
            .iter()
            .zip(&pos)
            .map(|(p, t)| (p - t).abs())
            .sum::<f64>()
            / pos.len() as f64;
        mae.push(err);
    }
    Ok(ProbeResult {
        length,
        mae,
        baseline_mae: baseline,
    })
}

/// Solves `A w = b` for symmetric positive-definite `A` (Cholesky, f64:
/// [`posenc::analysis::cholesky_solve`]).
fn solve_spd(a: &Tensor, b: &Tensor) -> Result<Tensor, LabError> {
    let a = a.to_vec2::<f64>()?;
    let b: Vec<f64> = b.i((.., 0))?.to_vec1::<f64>()?;
    let n = b.len();
    let w = posenc::analysis::cholesky_solve(&a, &b)
        .map_err(|e| LabError::Invalid(format!("probe: {e}")))?;
    Ok(Tensor::from_vec(w, (n, 1), &Device::Cpu)?)
}
