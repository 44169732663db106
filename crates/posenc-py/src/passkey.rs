//! `posenc._posenc.PasskeyProbe`: the prompts, keys and scoring of
//! `posenc passkey` for a model run elsewhere (`posenc.hf.passkey` on a
//! transformers model).
//!
//! Everything but the model's forward passes comes from the Rust crates the
//! command uses: the grid's checks and the haystack (`PasskeyRequest::plan`),
//! the keys ([`ProbeGrid::key`]), the filler sizes and prompts
//! ([`PromptBuilder`], on the model's own `tokenizer.json`), the reading of
//! the answer ([`passkey::first_integer`]), whether a method may reuse the
//! cache ([`passkey::reuses_cache`]) and the JSON document
//! ([`posenc_run::passkey::method_json`], [`posenc_run::passkey::run_json`]).

use std::collections::HashMap;

use posenc_models::passkey::{self, Haystack, ProbeGrid, PromptBuilder, TrialResult};
use posenc_models::tokenizer::TextTokenizer;
use posenc_models::Scaling;
use posenc_run::{HaystackSource, PasskeyRequest};
use pyo3::prelude::*;

use crate::convert::to_python;
use crate::error::{detached, err, IntoPy};
use crate::model::{count, counts};

/// A `tokenizer.json` text as posenc's tokenizer.
fn tokenizer_from_json(json: &str) -> PyResult<TextTokenizer> {
    TextTokenizer::from_json(json, "the tokenizer's tokenizer.json").map_err(err)
}

/// The prompts, keys and scoring of a `posenc passkey` grid, on a
/// tokenizer given as its `tokenizer.json` text.
#[pyclass(name = "PasskeyProbe", module = "posenc")]
pub struct PasskeyProbe {
    tokenizer: TextTokenizer,
    haystack: Haystack,
    grid: ProbeGrid,
    scalings: Vec<Scaling>,
    sizes: HashMap<usize, usize>,
    methods: serde_json::Map<String, serde_json::Value>,
    seconds: f64,
    prompt_tokens: usize,
}

#[pymethods]
impl PasskeyProbe {
    /// The grid checked as `posenc passkey` checks it (`methods`: the
    /// scaling and method names), the haystack (None: the landmark
    /// prompt; a str: RULER's needle in that text) and each length's filler
    /// size, calibrated on `tokenizer_json`.
    #[new]
    #[pyo3(signature = (tokenizer_json, lengths, depths, trials, methods, haystack=None, seed=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        tokenizer_json: &str,
        lengths: Vec<i64>,
        depths: Vec<f64>,
        trials: i64,
        methods: Vec<String>,
        haystack: Option<String>,
        seed: i64,
    ) -> PyResult<Self> {
        let seed: u64 = count(seed, "seed")?;
        let request = PasskeyRequest {
            haystack: haystack.map_or(HaystackSource::Landmark, HaystackSource::String),
            seed,
            ..grid_request(lengths, depths, trials, methods)?
        };
        let tokenizer_json = tokenizer_json.to_owned();
        detached(py, move || {
            let plan = request.plan().py()?;
            let tokenizer = tokenizer_from_json(&tokenizer_json)?;
            let builder = PromptBuilder::new(&tokenizer, &plan.haystack);
            let mut sizes = HashMap::new();
            for &l in &plan.grid.lengths {
                let n = builder.calibrate(l).map_err(|e| match &request.haystack {
                    HaystackSource::Landmark => err(e),
                    _ => err(format!("--haystack: {e}")),
                })?;
                sizes.insert(l, n);
            }
            Ok(PasskeyProbe {
                tokenizer,
                haystack: plan.haystack,
                grid: plan.grid,
                scalings: plan.scalings,
                sizes,
                methods: serde_json::Map::new(),
                seconds: 0.0,
                prompt_tokens: 0,
            })
        })
    }

    /// Checks a grid as the constructor does, without a tokenizer (before
    /// a model is loaded): the lengths, depths, trials and names.
    ///
    /// Raises `PosencError` with the command's one-line message.
    #[staticmethod]
    #[pyo3(signature = (lengths, depths, trials, methods))]
    fn check(
        py: Python<'_>,
        lengths: Vec<i64>,
        depths: Vec<f64>,
        trials: i64,
        methods: Vec<String>,
    ) -> PyResult<()> {
        let request = grid_request(lengths, depths, trials, methods)?;
        detached(py, move || request.plan().py().map(|_| ()))
    }

    /// The methods' names, as parsed.
    #[getter]
    fn methods(&self) -> Vec<String> {
        self.scalings.iter().map(|s| s.name.clone()).collect()
    }

    /// The prompt lengths.
    #[getter]
    fn lengths(&self) -> Vec<usize> {
        self.grid.lengths.clone()
    }

    /// The needle depths.
    #[getter]
    fn depths(&self) -> Vec<f64> {
        self.grid.depths.clone()
    }

    /// Trials per cell.
    #[getter]
    fn trials(&self) -> usize {
        self.grid.trials
    }

    /// The prompt format's name.
    #[getter]
    fn format(&self) -> &'static str {
        self.haystack.name()
    }

    /// Tokens generated per trial.
    #[getter]
    fn max_new_tokens(&self) -> usize {
        passkey::MAX_NEW_TOKENS
    }

    /// Whether the prompts of one length may share the KV cache of the
    /// one before under `method` (one of `methods`).
    fn reuses_cache(&self, method: &str) -> PyResult<bool> {
        let s = self
            .scalings
            .iter()
            .find(|s| s.name == method)
            .ok_or_else(|| err(format!("{method}: not one of the probe's methods")))?;
        Ok(passkey::reuses_cache(s))
    }

    /// Trial `trial` of the cell (`length`, `depth`): `(ids, answer_ids,
    /// key)`, the prompt's token ids, the answer's tokens after it and the
    /// key, as `posenc passkey` builds them.
    fn prompt(
        &self,
        py: Python<'_>,
        length: usize,
        depth: f64,
        trial: usize,
    ) -> PyResult<(Vec<u32>, Vec<u32>, u64)> {
        let n = *self
            .sizes
            .get(&length)
            .ok_or_else(|| err(format!("length {length}: not one of the grid's")))?;
        detached(py, || {
            let (key, word) = self.grid.key(&self.haystack, length, depth, trial);
            let p = PromptBuilder::new(&self.tokenizer, &self.haystack)
                .prompt_within(length, n, depth, key, &word)
                .py()?;
            Ok((p.ids, p.answer_ids, p.key))
        })
    }

    /// The generated ids' text (special tokens kept) and the first integer
    /// in it, as the command reads a trial's answer.
    fn read(&self, ids: Vec<u32>) -> PyResult<(String, Option<u64>)> {
        let text = self.tokenizer.decode(&ids).py()?;
        let read = passkey::first_integer(&text);
        Ok((text, read))
    }

    /// Records `method`'s trials (a JSON list of the command's trial
    /// records, in the grid's order) and `run_seconds`, its call's time.
    fn add_method(&mut self, method: &str, results_json: &str, run_seconds: f64) -> PyResult<()> {
        let reuse = self.reuses_cache(method)?;
        let results: Vec<TrialResult> = serde_json::from_str(results_json)
            .map_err(|e| err(format!("the trials of {method}: {e}")))?;
        let m = posenc_run::passkey::method_json(&self.grid, results, run_seconds, reuse);
        self.seconds += m.seconds;
        self.prompt_tokens += m.prompt_tokens;
        self.methods.insert(method.to_owned(), m.json);
        Ok(())
    }

    /// The dict `posenc passkey --json` prints, with `model` and
    /// `trained_length` for the run's model and `run_seconds` its time.
    fn document(
        &self,
        py: Python<'_>,
        model: &str,
        trained_length: usize,
        run_seconds: f64,
    ) -> PyResult<Py<PyAny>> {
        let v = posenc_run::passkey::run_json(
            model,
            &self.haystack,
            trained_length,
            &self.grid,
            self.methods.clone(),
            self.seconds,
            run_seconds,
            self.prompt_tokens,
        );
        to_python(py, &v)
    }
}

/// The `posenc passkey` request of a grid given from Python, on the
/// landmark prompt with seed 0 (the constructor sets its own).
pub(crate) fn grid_request(
    lengths: Vec<i64>,
    depths: Vec<f64>,
    trials: i64,
    methods: Vec<String>,
) -> PyResult<PasskeyRequest> {
    Ok(PasskeyRequest {
        lengths: counts(lengths, "lengths")?,
        depths,
        trials: count(trials, "trials")?,
        scalings: methods,
        haystack: HaystackSource::Landmark,
        seed: 0,
        ..PasskeyRequest::default()
    })
}
