//! `posenc.Model` and `posenc.finetune`: pretrained decoders (GGUF,
//! safetensors) and their probes, over `posenc_run` (the calls the
//! `posenc` command makes, so a result equals its `--json` output).
//!
//! Every call that reads weights or runs the model releases the GIL; each
//! reports to a [`Watch`], which checks for Ctrl-C (`KeyboardInterrupt`)
//! and calls the user's `progress(done, total, what)` at least once per
//! layer, trial or step, and stops the call within about a second when
//! either raises.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use posenc_run::finetune::FinetuneOptions;
use posenc_run::{
    GenerateRequest, HaystackSource, OpenOptions, PasskeyRequest, PerplexityRequest, Products,
    Progress, ProgressFn, PromptSource, RunError, Session, Text,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use serde_json::Value;

use crate::convert::to_python;
use crate::error::{detached, err, IntoPy};
use crate::passkey::grid_request;
use crate::progress::Watch;

/// A text argument: a `str` is the text itself (`string`), an
/// `os.PathLike` a file (`file`).
fn text_arg<T>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    string: fn(String) -> T,
    file: fn(PathBuf) -> T,
) -> PyResult<T> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(string(s.extract::<String>()?));
    }
    if obj.hasattr("__fspath__")? {
        return Ok(file(obj.extract::<PathBuf>()?));
    }
    Err(err(format!(
        "{what}: give a str (the text itself) or a path (pathlib.Path, os.PathLike), not {}",
        obj.get_type().name()?
    )))
}

/// `scalings`: one scaling name or a list of them (`None`: `none` alone).
fn scalings_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(obj) = obj else {
        return Ok(vec!["none".into()]);
    };
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(vec![s.extract::<String>()?]);
    }
    if let Ok(list) = obj.extract::<Vec<String>>() {
        return Ok(list);
    }
    Err(err(
        "scalings: give a name (\"yarn:2\") or a list of names".to_string()
    ))
}

/// A count, size or position from Python: an int of at least 0 (a
/// negative one is a `PosencError` naming the argument, where a Rust
/// unsigned parameter would raise an `OverflowError` without its name).
pub(crate) fn count<T: TryFrom<i64>>(v: i64, what: &str) -> PyResult<T> {
    T::try_from(v).map_err(|_| err(format!("{what} must be at least 0, not {v}")))
}

/// Counts from Python, each as [`count`].
pub(crate) fn counts(values: Vec<i64>, what: &str) -> PyResult<Vec<usize>> {
    values.into_iter().map(|v| count(v, what)).collect()
}

/// `max_memory`: bytes (an int) or a size such as "900M" or "2G" (as the
/// commands' `--max-memory`).
fn memory_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(obj) = obj else { return Ok(None) };
    let s = if let Ok(n) = obj.extract::<i64>() {
        n.to_string()
    } else if let Ok(s) = obj.extract::<String>() {
        s
    } else {
        return Err(err(
            "max_memory: give bytes (an int) or a size such as \"900M\" or \"2G\"".to_string(),
        ));
    };
    posenc_run::memory::parse_size(&s)
        .map(Some)
        .map_err(|e| err(e.to_string().replacen("--max-memory", "max_memory", 1)))
}

fn products_arg(s: &str) -> PyResult<Products> {
    match s {
        "f32" => Ok(Products::F32),
        "bf16" => Ok(Products::Bf16),
        other => Err(err(format!("products {other:?}: use \"f32\" or \"bf16\""))),
    }
}

/// The error of a call that `watch` may have stopped: its pending
/// exception (KeyboardInterrupt, the callback's), else a `PosencError`.
fn finish<T>(watch: Watch, r: Result<T, RunError>) -> PyResult<T> {
    watch.finish(r.py())
}

/// `call`'s JSON as Python objects: run with the GIL released, its
/// progress reported to the `progress` callback (which, like Ctrl-C, can
/// stop it).
fn watched(
    py: Python<'_>,
    progress: Option<Py<PyAny>>,
    call: impl FnOnce(&mut ProgressFn<'_>) -> Result<Value, RunError> + Send,
) -> PyResult<Py<PyAny>> {
    let watch = Watch::new(progress)?;
    let r = detached(py, || {
        Ok(call(&mut |p: Progress<'_>| {
            watch.tick(p.done, p.total, p.what)
        }))
    })?;
    let v = finish(watch, r)?;
    to_python(py, &v)
}

/// A pretrained decoder (GGUF file or Hugging Face checkpoint directory),
/// loaded once and probed as the `posenc` command probes it.
#[pyclass(name = "Model", module = "posenc")]
pub struct Model {
    session: Mutex<Session>,
}

impl Model {
    fn session(&self) -> MutexGuard<'_, Session> {
        self.session.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl Model {
    /// Opens and loads the model at `path` (a `.gguf` file, a checkpoint
    /// directory or its `config.json`), with `tokenizer` (a
    /// `tokenizer.json`) instead of its own if given, and the attention's
    /// `products` ("f32" or "bf16") past 1,024 tokens. Checks as `posenc`
    /// does; reads the weights with the GIL released.
    #[staticmethod]
    #[pyo3(signature = (path, tokenizer=None, products="f32"))]
    fn load(
        py: Python<'_>,
        path: PathBuf,
        tokenizer: Option<PathBuf>,
        products: &str,
    ) -> PyResult<Model> {
        let options = OpenOptions {
            tokenizer,
            products: products_arg(products)?,
            adapter: None,
        };
        let session = detached(py, || {
            let mut s = Session::open(&path, &options).py()?;
            s.load().py()?;
            Ok(s)
        })?;
        Ok(Model {
            session: Mutex::new(session),
        })
    }

    /// The loss at every position of a window, per scaling: the dict
    /// `posenc perplexity --json` prints. `text`: a str (the text itself)
    /// or a path (read only as far as the window needs); default: the
    /// built-in Pride and Prejudice. `scalings`: one name or a list.
    /// `adapter`: a LoRA adapter directory merged for this call only.
    #[pyo3(signature = (text=None, length=None, scalings=None, adapter=None, band=1024,
                        held_out=false, per_position=false, progress=None, max_memory=None))]
    #[allow(clippy::too_many_arguments)]
    fn perplexity(
        &self,
        py: Python<'_>,
        text: Option<&Bound<'_, PyAny>>,
        length: Option<i64>,
        scalings: Option<&Bound<'_, PyAny>>,
        adapter: Option<PathBuf>,
        band: i64,
        held_out: bool,
        per_position: bool,
        progress: Option<Py<PyAny>>,
        max_memory: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let text = match text {
            None => Text::Default,
            Some(t) => text_arg(t, "text", Text::String, Text::File)?,
        };
        let request = PerplexityRequest {
            text,
            length: length.map(|l| count(l, "length")).transpose()?,
            scalings: scalings_arg(scalings)?,
            band: count(band, "band")?,
            held_out,
            per_position,
            adapter,
            max_memory: memory_arg(max_memory)?,
        };
        watched(py, progress, |on| self.session().perplexity(&request, on))
    }

    /// Passkey retrieval over `lengths` × `depths` (`trials` keys per
    /// cell) for each scaling: the dict `posenc passkey --json` prints.
    /// `haystack`: None (the landmark passkey prompt), a str (RULER's
    /// needle hidden in that text) or a path to such a text.
    #[pyo3(signature = (lengths, depths, trials=1, scalings=None, haystack=None, seed=0,
                        progress=None, max_memory=None))]
    #[allow(clippy::too_many_arguments)]
    fn passkey(
        &self,
        py: Python<'_>,
        lengths: Vec<i64>,
        depths: Vec<f64>,
        trials: i64,
        scalings: Option<&Bound<'_, PyAny>>,
        haystack: Option<&Bound<'_, PyAny>>,
        seed: i64,
        progress: Option<Py<PyAny>>,
        max_memory: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let seed: u64 = count(seed, "seed")?;
        let haystack = match haystack {
            None => HaystackSource::Landmark,
            Some(h) => text_arg(h, "haystack", HaystackSource::String, HaystackSource::File)?,
        };
        let grid = grid_request(lengths, depths, trials, scalings_arg(scalings)?)?;
        let request = PasskeyRequest {
            haystack,
            seed,
            log: None,
            adapter: None,
            max_memory: memory_arg(max_memory)?,
            ..grid
        };
        watched(py, progress, |on| self.session().passkey(&request, on))
    }

    /// Text generated after `prompt` (a str, or a path to a UTF-8 file):
    /// at most `max_new_tokens` new tokens with one `scaling`, greedy at
    /// `temperature` 0, else sampled (nucleus `top_p`, `seed`). The same
    /// text as `posenc generate --json`'s "text".
    #[pyo3(signature = (prompt, max_new_tokens=32, scaling="none", temperature=0.0, top_p=1.0,
                        seed=0, max_memory=None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        max_new_tokens: i64,
        scaling: &str,
        temperature: f64,
        top_p: f64,
        seed: i64,
        max_memory: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<String> {
        let seed: u64 = count(seed, "seed")?;
        let prompt = text_arg(prompt, "prompt", PromptSource::String, PromptSource::File)?;
        let request = GenerateRequest {
            prompt,
            prompt_tokens: None,
            max_new_tokens: count(max_new_tokens, "max_new_tokens")?,
            scaling: scaling.to_owned(),
            sampling: posenc_run::generate::sampling(temperature, top_p, seed),
            adapter: None,
            stream_text: false,
            max_memory: memory_arg(max_memory)?,
        };
        // Ctrl-C only: no progress display for a generation.
        let quiet = pyo3::types::PyBool::new(py, false)
            .to_owned()
            .into_any()
            .unbind();
        let watch = Watch::new(Some(quiet))?;
        let r = detached(py, || {
            Ok(self
                .session()
                .generate(&request, &mut |_: Progress<'_>| watch.poll()))
        })?;
        let v = finish(watch, r)?;
        Ok(v["text"].as_str().unwrap_or_default().to_owned())
    }

    /// The model's configuration: the fields posenc reads from the GGUF
    /// metadata or `config.json`.
    #[getter]
    fn config(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let s = self.session();
        let c = s.config();
        let d = PyDict::new(py);
        d.set_item("arch", format!("{:?}", c.arch).to_lowercase())?;
        d.set_item("vocab_size", c.vocab_size)?;
        d.set_item("hidden_size", c.hidden_size)?;
        d.set_item("intermediate_size", c.intermediate_size)?;
        d.set_item("num_layers", c.num_layers)?;
        d.set_item("num_heads", c.num_heads)?;
        d.set_item("num_kv_heads", c.num_kv_heads)?;
        d.set_item("head_dim", c.head_dim)?;
        d.set_item("rms_norm_eps", c.rms_norm_eps)?;
        d.set_item("max_position_embeddings", c.max_position_embeddings)?;
        d.set_item("tie_word_embeddings", c.tie_word_embeddings)?;
        d.set_item("sliding_window", c.sliding_window)?;
        d.set_item("trained_length", c.trained_length())?;
        d.set_item("bos_token_id", c.bos_token_id)?;
        d.set_item("eos_token_ids", PyList::new(py, &c.eos_token_ids)?)?;
        d.set_item("rope_type", c.rope.rope_type())?;
        d.set_item("head_dim_rotated", c.rope.head_dim())?;
        Ok(d.into_any().unbind())
    }

    /// The length the model was trained at (`L`).
    #[getter]
    fn trained_length(&self) -> usize {
        self.session().trained_length()
    }

    /// One line on the model's files: format and tensor types.
    #[getter]
    fn source(&self) -> String {
        self.session().source().unwrap_or_default().to_owned()
    }

    /// The tokenizer's description.
    #[getter]
    fn tokenizer(&self) -> String {
        self.session()
            .tokenizer()
            .map_or(String::new(), |t| t.source().to_owned())
    }

    fn __repr__(&self) -> String {
        let s = self.session();
        format!(
            "posenc.Model({:?}, trained_length={})",
            s.path().display().to_string(),
            s.trained_length()
        )
    }
}

/// LoRA fine-tuning of the pretrained model at `model` at a new context
/// length, into `out`: what `posenc finetune --model MODEL --out OUT
/// --json` does and prints (options as its flags, `_` for `-`). `text`
/// and `tokenizer` are paths. Returns the summary dict; Ctrl-C stops after
/// the step in progress with a checkpoint (resume with `resume=True`) and
/// raises KeyboardInterrupt.
#[pyfunction]
#[pyo3(signature = (model, out, *, length=None, steps=None, pose=None, text=None,
                    tokenizer=None, scaling=None, lr=None, warmup=None, batch=None, seed=None,
                    lora=8, alpha=8.0, dropout=0.0, targets="q_proj,v_proj", train=None,
                    schedule="linear", weight_decay=0.01, clip=1.0, checkpoint_every=0,
                    checkpoint_layers=false, merge=false, resume=false, progress=None,
                    max_memory=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn finetune(
    py: Python<'_>,
    model: Option<PathBuf>,
    out: PathBuf,
    length: Option<i64>,
    steps: Option<i64>,
    pose: Option<i64>,
    text: Option<PathBuf>,
    tokenizer: Option<PathBuf>,
    scaling: Option<String>,
    lr: Option<f64>,
    warmup: Option<i64>,
    batch: Option<i64>,
    seed: Option<u64>,
    lora: i64,
    alpha: f64,
    dropout: f64,
    targets: &str,
    train: Option<String>,
    schedule: &str,
    weight_decay: f64,
    clip: f64,
    checkpoint_every: i64,
    checkpoint_layers: bool,
    merge: bool,
    resume: bool,
    progress: Option<Py<PyAny>>,
    max_memory: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let opt = |v: Option<i64>, what: &str| v.map(|v| count(v, what)).transpose();
    let options = FinetuneOptions {
        model,
        out,
        resume,
        text,
        tokenizer,
        length: opt(length, "length")?,
        pose: opt(pose, "pose")?,
        steps: opt(steps, "steps")?,
        scaling,
        lr,
        warmup: opt(warmup, "warmup")?,
        batch: opt(batch, "batch")?,
        seed,
        lora: count(lora, "lora")?,
        alpha,
        dropout,
        targets: targets.to_owned(),
        train,
        schedule: schedule.to_owned(),
        weight_decay,
        clip,
        checkpoint_every: count(checkpoint_every, "checkpoint_every")?,
        checkpoint_layers,
        merge,
        print_progress: false,
        max_memory: memory_arg(max_memory)?,
    };
    watched(py, progress, |on| posenc_run::finetune(&options, on))
}
