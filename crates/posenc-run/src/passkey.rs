//! `posenc passkey` as a call: retrieval over prompt length × needle depth
//! for every scaling and attention method.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use posenc_models::passkey::{
    self, Cell, Haystack, LogHeader, ProbeGrid, Prober, PromptBuilder, TrialLog, TrialResult,
};
use posenc_models::{input, scaling, Scaling};
use serde_json::{json, Value};

use crate::session::Session;
use crate::{cancellable, report_or_stop, Progress, ProgressFn, Result, RunError};

/// Largest haystack file read (bytes).
pub const MAX_HAYSTACK_BYTES: u64 = 64 << 20;

/// Largest prompt length accepted before the memory check.
pub const MAX_PROMPT_LENGTH: usize = 1 << 20;

/// The text the needle hides in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HaystackSource {
    /// The landmark passkey prompt (no text).
    #[default]
    Landmark,
    /// RULER's needle in this text.
    String(String),
    /// RULER's needle in the text of this UTF-8 file.
    File(PathBuf),
}

/// The grid and options of `posenc passkey`.
#[derive(Debug, Clone)]
pub struct PasskeyRequest {
    /// Prompt lengths in tokens.
    pub lengths: Vec<usize>,
    /// Needle depths in `[0, 1]` (fraction of the filler before it).
    pub depths: Vec<f64>,
    /// Trials per (length, depth) cell, each with its own key.
    pub trials: usize,
    /// Scaling and method names, as `posenc passkey --scaling`.
    pub scalings: Vec<String>,
    /// The haystack.
    pub haystack: HaystackSource,
    /// Seed of the keys.
    pub seed: u64,
    /// A JSON-lines log: finished trials are appended, trials it holds are
    /// read back instead of run (`posenc passkey --log`).
    pub log: Option<PathBuf>,
    /// A LoRA adapter directory merged for this call only.
    pub adapter: Option<PathBuf>,
    /// The memory the run may use, bytes (`--max-memory`; default: the
    /// available memory and `RLIMIT_AS`, see [`crate::memory`]).
    pub max_memory: Option<u64>,
}

impl Default for PasskeyRequest {
    fn default() -> Self {
        PasskeyRequest {
            lengths: vec![2048, 4096, 8192, 12288, 16384],
            depths: vec![0.0, 0.25, 0.5, 0.75, 1.0],
            trials: 1,
            scalings: vec!["none".into()],
            haystack: HaystackSource::Landmark,
            seed: 0,
            log: None,
            adapter: None,
            max_memory: None,
        }
    }
}

/// A finished probe: the JSON the command prints and what its tables and
/// figures are drawn from.
#[derive(Debug, Clone)]
pub struct PasskeyRun {
    /// What `posenc passkey --json` prints.
    pub json: Value,
    /// The grid probed.
    pub grid: ProbeGrid,
    /// Each method's name and cells, in order.
    pub cells: Vec<(String, Vec<Cell>)>,
    /// Trials in the grid (all methods).
    pub trials: usize,
    /// Seconds of the trials (logged ones included).
    pub seconds: f64,
    /// Seconds of this call.
    pub seconds_this_run: f64,
    /// Prompt tokens of every trial.
    pub prompt_tokens: usize,
}

/// A request checked before any model is opened: its scalings, grid and
/// haystack (read), the log checked.
#[derive(Debug, Clone)]
pub struct PasskeyPlan {
    /// The scalings and methods, parsed.
    pub scalings: Vec<Scaling>,
    /// The grid.
    pub grid: ProbeGrid,
    /// The haystack, read and checked.
    pub haystack: Haystack,
}

impl PasskeyRequest {
    /// The scalings and the grid, parsed; every check that needs no model.
    ///
    /// # Errors
    /// The command's messages for a bad scaling, grid or length.
    pub fn check(&self) -> Result<(Vec<Scaling>, ProbeGrid)> {
        let scalings = scaling::parse_list(&self.scalings.join(","))?;
        if self.lengths.is_empty() {
            return Err(RunError::Invalid(
                "--lengths: give at least one value".into(),
            ));
        }
        if self.depths.is_empty() {
            return Err(RunError::Invalid(
                "--depths: give at least one value".into(),
            ));
        }
        let grid = ProbeGrid {
            lengths: self.lengths.clone(),
            depths: self.depths.clone(),
            trials: self.trials,
            seed: self.seed,
        };
        grid.validate()?;
        if let Some(l) = grid.lengths.iter().find(|&&l| l > MAX_PROMPT_LENGTH) {
            return Err(RunError::Invalid(format!(
                "--lengths: {l} is above {MAX_PROMPT_LENGTH} tokens"
            )));
        }
        Ok((scalings, grid))
    }

    /// [`check`](Self::check), the log (a regular file, or one that can
    /// be created) and the haystack (read, bounded): every check that
    /// needs no model.
    ///
    /// # Errors
    /// The command's messages.
    pub fn plan(&self) -> Result<PasskeyPlan> {
        let (scalings, grid) = self.check()?;
        if let Some(p) = &self.log {
            crate::files::check_log(p, "--log")?;
        }
        let haystack = read_haystack(&self.haystack)?;
        Ok(PasskeyPlan {
            scalings,
            grid,
            haystack,
        })
    }
}

/// The haystack of `source`, read bounded and checked.
fn read_haystack(source: &HaystackSource) -> Result<Haystack> {
    match source {
        HaystackSource::Landmark => Ok(Haystack::Landmark),
        HaystackSource::String(text) => {
            Haystack::ruler(text).map_err(|e| RunError::Invalid(format!("--haystack: {e}")))
        }
        HaystackSource::File(p) => {
            let bytes = input::read_bounded(p, MAX_HAYSTACK_BYTES)?;
            let text = String::from_utf8(bytes).map_err(|e| {
                RunError::Invalid(format!(
                    "--haystack {}: not UTF-8 (byte {})",
                    p.display(),
                    e.utf8_error().valid_up_to()
                ))
            })?;
            Haystack::ruler(&text)
                .map_err(|e| RunError::Invalid(format!("--haystack {}: {e}", p.display())))
        }
    }
}

/// Positions a trial holds past its prompt: the answer's tokens and the
/// new tokens.
const PASSKEY_EXTRA: usize = passkey::MAX_NEW_TOKENS + 16;

/// The haystack's bytes (0 for the landmark prompt).
fn haystack_bytes(source: &HaystackSource) -> u64 {
    match source {
        HaystackSource::Landmark => 0,
        HaystackSource::String(s) => s.len() as u64,
        HaystackSource::File(p) => std::fs::metadata(p).map_or(0, |m| m.len()),
    }
}

/// `error` as the haystack's (`--haystack FILE: ...`).
fn haystack_error(source: &HaystackSource, e: posenc_models::ModelError) -> RunError {
    match source {
        HaystackSource::File(p) => RunError::Invalid(format!("--haystack {}: {e}", p.display())),
        HaystackSource::String(_) => RunError::Invalid(format!("--haystack: {e}")),
        HaystackSource::Landmark => e.into(),
    }
}

/// The name of the products' precision in a log header.
fn products_name(p: posenc_models::llama::Products) -> String {
    format!("{p:?}").to_lowercase()
}

impl Session {
    /// Runs the grid: what `posenc passkey --json` prints.
    ///
    /// # Errors
    /// As [`Session::passkey_run`].
    pub fn passkey(
        &mut self,
        request: &PasskeyRequest,
        progress: &mut ProgressFn<'_>,
    ) -> Result<Value> {
        Ok(self.passkey_run(request, progress)?.json)
    }

    /// [`Session::passkey`] with the cells the command's tables and
    /// figures are drawn from. Every input (grid, log, haystack, memory at
    /// the longest prompt, filler sizes) is checked before the weights are
    /// read; `progress` is called first with the run's description, then
    /// after every trial.
    ///
    /// # Errors
    /// The command's messages; [`RunError::Cancelled`] when `progress`
    /// answers `false` (trials finished by then are in the log, if any).
    pub fn passkey_run(
        &mut self,
        request: &PasskeyRequest,
        progress: &mut ProgressFn<'_>,
    ) -> Result<PasskeyRun> {
        let plan = request.plan()?;
        self.passkey_planned(request, plan, progress)
    }

    /// [`Session::passkey_run`] of a request already planned (by
    /// [`PasskeyRequest::plan`]).
    ///
    /// # Errors
    /// As [`Session::passkey_run`].
    pub fn passkey_planned(
        &mut self,
        request: &PasskeyRequest,
        plan: PasskeyPlan,
        progress: &mut ProgressFn<'_>,
    ) -> Result<PasskeyRun> {
        let PasskeyPlan {
            scalings,
            grid,
            haystack,
        } = plan;
        let adapter = self.read_adapter(request.adapter.as_deref())?;
        let max_len = grid.lengths.iter().copied().max().unwrap_or(0);
        let (loaded, hay) = (self.is_loaded(), haystack_bytes(&request.haystack));
        self.check_plan(request.max_memory, max_len, 1, MAX_PROMPT_LENGTH, |l| {
            crate::memory::passkey(self.config(), l, PASSKEY_EXTRA, hay, loaded)
        })?;
        // Filler sizes per length (the haystack checked before any weight).
        let sizes: Vec<usize> = {
            let builder = PromptBuilder::new(self.read_tokenizer()?, &haystack);
            grid.lengths
                .iter()
                .map(|&l| builder.calibrate(l))
                .collect::<posenc_models::Result<_>>()
                .map_err(|e| haystack_error(&request.haystack, e))?
        };
        let path = self.path().to_path_buf();
        let products = products_name(self.products());
        self.with_model(adapter.as_ref(), |model, source, tk| {
            let builder = PromptBuilder::new(tk, &haystack);
            let eos: Vec<u32> = tk.eos().to_vec();
            let mut log = match &request.log {
                None => None,
                Some(p) => Some(TrialLog::open(
                    p,
                    &LogHeader::for_run(&path, source, tk, &haystack, grid.seed, &products),
                )?),
            };
            let total =
                scalings.len() * grid.lengths.len() * grid.depths.len() * grid.trials;
            let header = format!(
                "{source}; tokenizer: {}; {}; trained length {}; {total} trials{}",
                tk.source(),
                haystack.name(),
                model.config().trained_length(),
                log.as_ref().map_or(String::new(), |l| format!(
                    " ({} logged in {})",
                    l.len(),
                    request.log.as_deref().unwrap_or(Path::new("")).display()
                ))
            );
            if !progress(Progress::new(0, total, &header)) {
                return Err(RunError::Cancelled);
            }
            let t_all = Instant::now();
            let mut methods = serde_json::Map::new();
            let mut all_prompt_tokens = 0usize;
            let mut all_secs = 0.0f64;
            let mut summaries: Vec<(String, Vec<Cell>)> = Vec::new();
            let mut done = 0usize;
            for sc in &scalings {
                let t0 = Instant::now();
                let mut prober = Prober::new(model, sc, &eos)?;
                let mut results: Vec<TrialResult> = Vec::new();
                for (li, &length) in grid.lengths.iter().enumerate() {
                    prober.reset();
                    let what = format!("{} @ {length}", sc.name);
                    for &depth in &grid.depths {
                        for trial in 0..grid.trials {
                            let (key, word) = grid.key(&haystack, length, depth, trial);
                            let logged = log
                                .as_ref()
                                .and_then(|l| l.get(&sc.name, length, depth, trial));
                            if let Some(r) = logged {
                                if r.key != key {
                                    return Err(RunError::Invalid(format!(
                                        "--log: the logged key of {} at {length} tokens, depth {depth}, \
                                         trial {trial} is {}, not the seed's {key}: the log is from \
                                         another version of the probe",
                                        sc.name, r.key
                                    )));
                                }
                                results.push(r.clone());
                            } else {
                                let prompt =
                                    builder.prompt_within(length, sizes[li], depth, key, &word)?;
                                // Stoppable between the prefill's layers.
                                let r = cancellable(|| {
                                    Ok(prober.trial_observed(tk, &prompt, length, depth, &mut |_| {
                                        report_or_stop(progress, Progress::new(done, total, &what))
                                    })?)
                                })?;
                                if let Some(l) = log.as_mut() {
                                    l.append(&sc.name, trial, &r)?;
                                }
                                results.push(r);
                            }
                            done += 1;
                            if !progress(Progress::new(done, total, &what)) {
                                return Err(RunError::Cancelled);
                            }
                        }
                    }
                }
                let run_secs = t0.elapsed().as_secs_f64();
                let m = method_json(&grid, results, run_secs, prober.reuses_cache());
                all_prompt_tokens += m.prompt_tokens;
                all_secs += m.seconds;
                methods.insert(sc.name.clone(), m.json);
                let cells = m.cells;
                summaries.push((sc.name.clone(), cells));
            }
            let run_secs = t_all.elapsed().as_secs_f64();
            let json = run_json(
                source,
                &haystack,
                model.config().trained_length(),
                &grid,
                methods,
                all_secs,
                run_secs,
                all_prompt_tokens,
            );
            Ok(PasskeyRun {
                json,
                grid: grid.clone(),
                cells: summaries,
                trials: total,
                seconds: all_secs,
                seconds_this_run: run_secs,
                prompt_tokens: all_prompt_tokens,
            })
        })
    }
}

/// One method's entry of `posenc passkey --json`, from its trials.
#[derive(Debug, Clone)]
pub struct MethodSummary {
    /// The entry (`accuracy`, `logprob`, `accuracy_by_length`, `results`, ...).
    pub json: Value,
    /// Its cells, in the grid's order.
    pub cells: Vec<Cell>,
    /// Seconds of its trials (their own times).
    pub seconds: f64,
    /// Prompt tokens of its trials.
    pub prompt_tokens: usize,
}

/// The entry of one method in `posenc passkey --json` from its `results`
/// (in the grid's order), `run_secs` (seconds of this call) and whether
/// its prober reused the KV cache: what the command and `posenc.hf.passkey`
/// print.
pub fn method_json(
    grid: &ProbeGrid,
    results: Vec<TrialResult>,
    run_secs: f64,
    reuses_cache: bool,
) -> MethodSummary {
    // The trials' own times, so that a grid resumed from a log counts
    // every trial once.
    let secs: f64 = results.iter().map(|r| r.seconds).sum();
    let cells = passkey::cells(grid, &results);
    let prompt_tokens: usize = results.iter().map(|r| r.prompt_tokens).sum();
    let prefilled: usize = results.iter().map(|r| r.prefilled).sum();
    let mut acc: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut lp: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for c in &cells {
        acc.entry(c.length.to_string())
            .or_default()
            .insert(c.depth.to_string(), c.accuracy);
        lp.entry(c.length.to_string())
            .or_default()
            .insert(c.depth.to_string(), c.logprob);
    }
    let by_length: BTreeMap<String, f64> = grid
        .lengths
        .iter()
        .map(|&l| {
            let of: Vec<&TrialResult> = results.iter().filter(|r| r.length == l).collect();
            let n = of.len().max(1) as f64;
            (
                l.to_string(),
                of.iter().filter(|r| r.correct).count() as f64 / n,
            )
        })
        .collect();
    let json = json!({
        "accuracy": acc,
        "logprob": lp,
        "accuracy_by_length": by_length,
        "trials": results.len(),
        "trials_per_cell": grid.trials,
        "seconds": secs,
        "seconds_this_run": run_secs,
        "prompt_tokens": prompt_tokens,
        "tokens_prefilled": prefilled,
        "reuses_cache": reuses_cache,
        "results": results,
    });
    MethodSummary {
        json,
        cells,
        seconds: secs,
        prompt_tokens,
    }
}

/// The whole document of `posenc passkey --json`: the run's `source`,
/// format, grid and the `methods` entries of [`method_json`].
#[allow(clippy::too_many_arguments)]
pub fn run_json(
    source: &str,
    haystack: &Haystack,
    trained_length: usize,
    grid: &ProbeGrid,
    methods: serde_json::Map<String, Value>,
    all_secs: f64,
    run_secs: f64,
    all_prompt_tokens: usize,
) -> Value {
    json!({
        "model": source,
        "format": haystack.name(),
        "trained_length": trained_length,
        "lengths": grid.lengths,
        "depths": grid.depths,
        "trials_per_cell": grid.trials,
        "seed": grid.seed,
        "max_new_tokens": passkey::MAX_NEW_TOKENS,
        "seconds": all_secs,
        "seconds_this_run": run_secs,
        "tokens_per_second": all_prompt_tokens as f64 / all_secs.max(1e-9),
        "methods": methods,
    })
}
