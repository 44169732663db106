//! The training pool and its run cache: one run's spec and record, training
//! (or reading back) a run, every run of the report in one pool of
//! threads, the parallel map the experiments share, loading a trained run
//! for evaluation and fine-tuning it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use posenc_lab::bpe::Tokenization;
use posenc_lab::config::{PeConfig, TrainConfig};
use posenc_lab::model::EvalScaling;
use posenc_lab::optim::AdamW;
use posenc_lab::tasks::TaskKind;
use posenc_lab::train::{self, Lab, ProbeResult, ShuffleResult, TrainOptions};
use posenc_lab::{FinetuneOptions, PositionLoss, ScalingSpec};
use serde::{Deserialize, Serialize};

use super::{Ctx, TRAINING_SOURCE};
use crate::corpus::fnv;
use crate::preset::Stage;
use crate::{ReportError, Result};

// ------------------------------------------------------------- training ---

/// One training run: everything that determines its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    /// Task name.
    pub task: String,
    /// Encoding name (`PeConfig::NAMES`).
    pub pe: String,
    /// Shaw's k.
    pub shaw_k: usize,
    /// Size of a learned table.
    pub table_len: usize,
    /// Model and run.
    pub stage: Stage,
    /// Seed.
    pub seed: u64,
    /// Lengths evaluated (validation text for `lm` and `mlm`).
    pub eval_lengths: Vec<usize>,
    /// Lengths at which the loss per position is measured (decoders and
    /// token encoders).
    #[serde(default)]
    pub position_lengths: Vec<usize>,
    /// Also run the position probe and the shuffle test (decoders).
    pub probe_and_shuffle: bool,
    /// The hash of the text a corpus task reads ([`TextCorpus::hash`]),
    /// filled in by [`train_run`].
    #[serde(default)]
    pub corpus: Option<String>,
    /// The file the lab reads that text from (not part of the key).
    #[serde(skip)]
    pub corpus_file: Option<PathBuf>,
}

/// Loss and accuracy at one length, or why the model cannot run there.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalPoint {
    /// Length.
    pub length: usize,
    /// Mean loss.
    pub loss: Option<f64>,
    /// Exact-match accuracy.
    pub accuracy: Option<f64>,
    /// Bits per character (corpus tasks): comparable across tokenizations.
    #[serde(default)]
    pub bits_per_char: Option<f64>,
    /// The error, where the model cannot run at this length.
    pub error: Option<String>,
}

/// What a run produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run.
    pub spec: RunSpec,
    /// Training loss at the end (NaN when it diverged).
    #[serde(deserialize_with = "nan_as_null")]
    pub train_loss: f64,
    /// Seconds of training.
    pub seconds: f64,
    /// Evaluations.
    pub eval: Vec<EvalPoint>,
    /// Position probe.
    pub probe: Option<ProbeResult>,
    /// Shuffle test.
    pub shuffle: Option<ShuffleResult>,
    /// Loss per position at each of `spec.position_lengths` the model can
    /// run at.
    #[serde(default)]
    pub positions: Vec<PositionLoss>,
    /// Why training stopped, when it diverged (then every number is NaN).
    #[serde(default)]
    pub diverged: Option<String>,
}

/// Reads `null` (how serde_json writes NaN) back as NaN.
fn nan_as_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

impl RunRecord {
    /// The evaluation at `len`.
    pub fn at(&self, len: usize) -> Option<&EvalPoint> {
        self.eval.iter().find(|e| e.length == len)
    }

    /// Loss at `len` (NaN when it cannot run).
    pub fn loss(&self, len: usize) -> f64 {
        self.at(len).and_then(|e| e.loss).unwrap_or(f64::NAN)
    }

    /// Bits per character at `len` (NaN when it cannot run or the task
    /// reads no corpus).
    pub fn bpc(&self, len: usize) -> f64 {
        self.at(len)
            .and_then(|e| e.bits_per_char)
            .unwrap_or(f64::NAN)
    }

    /// Accuracy at `len` (NaN when it cannot run).
    pub fn acc(&self, len: usize) -> f64 {
        self.at(len).and_then(|e| e.accuracy).unwrap_or(f64::NAN)
    }

    /// The loss per position at `len`, if measured.
    pub fn positions_at(&self, len: usize) -> Option<&PositionLoss> {
        self.positions.iter().find(|p| p.length == len)
    }

    /// The mean loss on positions `range` of windows of `len` (NaN when not
    /// measured).
    pub fn loss_over(&self, len: usize, range: std::ops::Range<usize>) -> f64 {
        self.positions_at(len)
            .map(|p| p.mean_over(range))
            .unwrap_or(f64::NAN)
    }

    /// `Some(label)` when this run diverged, for a claim's `diverged` list.
    pub fn diverged_label(&self) -> Option<String> {
        self.diverged
            .as_ref()
            .map(|why| format!("{}: {why}", self.spec.label()))
    }
}

/// The diverged runs among `runs`, named.
pub fn diverged<'a>(runs: impl IntoIterator<Item = &'a RunRecord>) -> Vec<String> {
    runs.into_iter()
        .filter_map(RunRecord::diverged_label)
        .collect()
}

impl RunSpec {
    /// A run of `pe` on `task` with `stage`.
    pub fn new(task: &str, pe: &str, stage: &Stage, seed: u64) -> Self {
        RunSpec {
            task: task.into(),
            pe: pe.into(),
            shaw_k: 4,
            table_len: stage.train_len,
            stage: stage.clone(),
            seed,
            eval_lengths: vec![stage.train_len],
            position_lengths: Vec::new(),
            probe_and_shuffle: false,
            corpus: None,
            corpus_file: None,
        }
    }

    fn key(&self) -> u64 {
        let s = serde_json::to_string(self).expect("serialisable");
        // The training helper only: the claims' rules do not change a run.
        let shared = fnv(include_str!("mod.rs").as_bytes());
        fnv(format!(
            "{}|{TRAINING_SOURCE}|{shared:016x}|{s}",
            env!("CARGO_PKG_VERSION")
        )
        .as_bytes())
    }

    /// A fresh lab for this run.
    pub fn lab(&self) -> Result<Lab> {
        let kind = TaskKind::parse(&self.task)?;
        let s = &self.stage;
        let tc = TrainConfig {
            task: kind,
            n_symbols: s.symbols,
            train_len: s.train_len,
            steps: s.steps,
            batch: s.batch,
            lr: s.lr,
            warmup: s.warmup.min(s.steps),
            min_lr_frac: 0.1,
            weight_decay: 0.01,
            grad_clip: 1.0,
            seed: self.seed,
            log_every: (s.steps / 10).max(1),
            corpus: if kind.uses_corpus() {
                self.corpus_file.clone()
            } else {
                None
            },
        };
        let tokens = if kind.uses_corpus() {
            s.tokens
        } else {
            Tokenization::Chars
        };
        let task = train::load_task_in(&tc, tokens, None)?;
        let pe = PeConfig::parse(&self.pe, self.table_len, self.shaw_k)?;
        let model = task.model_config(kind.mode(), s.d_model, s.layers, s.heads, pe);
        Ok(Lab::new(model, tc, task)?)
    }

    /// A short label for progress and tables.
    pub fn label(&self) -> String {
        let pe = if self.pe == "shaw" {
            format!("shaw-k{}", self.shaw_k)
        } else {
            self.pe.clone()
        };
        format!("{} {pe} seed {}", self.task, self.seed)
    }
}

/// The unit of a text loss with `tokens`, short: `nats/char` or
/// `nats/token`.
pub fn loss_unit(tokens: Tokenization) -> &'static str {
    if tokens.is_chars() {
        "nats/char"
    } else {
        "nats/token"
    }
}

/// Evaluates `lab` at each length, recording lengths it cannot run at.
pub fn eval_points(
    lab: &Lab,
    lengths: &[usize],
    batches: usize,
    batch: usize,
    scaling: Option<&EvalScaling>,
) -> Result<Vec<EvalPoint>> {
    let mut out = Vec::new();
    for &len in lengths {
        out.push(
            match train::evaluate(lab, &[len], batches, batch, scaling) {
                Ok(r) => EvalPoint {
                    length: len,
                    loss: Some(r.loss[0]),
                    accuracy: Some(r.accuracy[0]),
                    bits_per_char: Some(r.bits_per_char[0]).filter(|b| b.is_finite()),
                    error: None,
                },
                Err(e) => EvalPoint {
                    length: len,
                    loss: None,
                    accuracy: None,
                    bits_per_char: None,
                    error: Some(e.to_string()),
                },
            },
        );
    }
    Ok(out)
}

/// Trains (or reads from the run cache) one run; returns its record and
/// its checkpoint directory. A corpus task reads the context's text (its
/// hash joins the run's key); evaluation, the loss per position, the probe
/// and the shuffle test use the validation text only. A run whose training
/// diverges is recorded as such (every number NaN), not dropped.
pub fn train_run(ctx: &mut Ctx, spec: &RunSpec) -> Result<(RunRecord, PathBuf)> {
    let spec = ctx.resolve(spec)?;
    let dir = run_dir(&ctx.cache, &spec);
    if let Some(r) = cached_record(&dir, &spec) {
        if !ctx.fresh.remove(&spec.key()) {
            ctx.tick(&format!("{} (cached)", spec.label()));
        }
        return Ok((r, dir));
    }
    let rec = train_uncached(&dir, &spec)?;
    ctx.trained_late += 1;
    ctx.tick(&spec.label());
    Ok((rec, dir))
}

/// The run `spec(encoding, seed)` of every encoding and seed, encoding by
/// encoding: the runs [`train_grid`] trains.
pub(crate) fn grid_specs(
    encodings: &[String],
    seeds: &[u64],
    spec: impl Fn(&str, u64) -> RunSpec,
) -> Vec<RunSpec> {
    encodings
        .iter()
        .flat_map(|pe| seeds.iter().map(|&seed| spec(pe, seed)))
        .collect()
}

/// The run `spec(encoding, seed)` of every encoding and seed, trained
/// first with [`train_runs`], then read back with [`train_run`]: each
/// encoding's records in seed order.
pub(crate) fn train_grid(
    ctx: &mut Ctx,
    encodings: &[String],
    seeds: &[u64],
    spec: impl Fn(&str, u64) -> RunSpec,
) -> Result<Vec<(String, Vec<RunRecord>)>> {
    train_runs(ctx, &grid_specs(encodings, seeds, &spec))?;
    let mut out = Vec::new();
    for pe in encodings {
        let mut v = Vec::new();
        for &seed in seeds {
            v.push(train_run(ctx, &spec(pe, seed))?.0);
        }
        out.push((pe.clone(), v));
    }
    Ok(out)
}

/// Trains every run of `specs` that is not in the cache yet, one run per
/// core at a time, each on a single thread (the lab's results do not depend
/// on the thread count, so they are those of a sequential run), and writes
/// their records to the cache; the experiment then reads them back in its
/// own order with [`train_run`].
pub fn train_runs(ctx: &mut Ctx, specs: &[RunSpec]) -> Result<()> {
    let todo = untrained(ctx, specs)?;
    if todo.is_empty() {
        return Ok(());
    }
    ctx.trained_late += todo.len();
    let workers = ctx.workers(todo.len());
    let progress = std::sync::Mutex::new((&mut ctx.progress, &mut ctx.fresh));
    par_map_on(workers, &todo, |(spec, dir)| {
        train_uncached(dir, spec)?;
        let mut g = progress.lock().expect("lock");
        g.1.insert(spec.key());
        g.0.runs_done += 1;
        g.0.draw(&spec.label());
        Ok(())
    })?;
    Ok(())
}

/// The runs of `specs` (resolved to this context's text) not in the cache
/// yet, each once, in order, with their directories.
fn untrained(ctx: &Ctx, specs: &[RunSpec]) -> Result<Vec<(RunSpec, PathBuf)>> {
    let mut todo: Vec<(RunSpec, PathBuf)> = Vec::new();
    for s in specs {
        let spec = ctx.resolve(s)?;
        let dir = run_dir(&ctx.cache, &spec);
        if cached_record(&dir, &spec).is_none() && !todo.iter().any(|t| t.0.key() == spec.key()) {
            todo.push((spec, dir));
        }
    }
    Ok(todo)
}

/// A run's cost for scheduling and the time estimate, in multiply-adds of
/// its training (forward and backward: 3 × the forward's), roughly:
/// per token, 12·d² per layer, 2·T·d per layer for attention, and d·V for
/// the head (V: the BPE vocabulary, or 128 for characters and the
/// synthetic tasks' symbols).
pub fn run_cost(spec: &RunSpec) -> f64 {
    let s = &spec.stage;
    let (d, t, layers) = (s.d_model as f64, s.train_len as f64, s.layers as f64);
    let vocab = match s.tokens {
        Tokenization::Bpe { vocab } => vocab as f64,
        Tokenization::Chars => 128.0,
    };
    let per_token = layers * (12.0 * d * d + 2.0 * t * d) + d * vocab;
    3.0 * per_token * t * s.batch as f64 * s.steps as f64
}

/// Trains every run of `specs` not in the cache yet in one pool, one run
/// per core at a time on one thread each (as [`train_runs`]), the longest
/// first (by [`run_cost`]), with a progress line and an estimate of the
/// time left (the seconds per unit of cost of the runs finished so far).
/// The experiments then read the runs from the cache.
pub fn train_pool(ctx: &mut Ctx, specs: &[RunSpec]) -> Result<()> {
    let mut todo: Vec<(RunSpec, PathBuf, f64)> = untrained(ctx, specs)?
        .into_iter()
        .map(|(spec, dir)| {
            let cost = run_cost(&spec);
            (spec, dir, cost)
        })
        .collect();
    if todo.is_empty() {
        return Ok(());
    }
    // Longest first: the short runs fill the cores at the end.
    todo.sort_by(|a, b| b.2.total_cmp(&a.2));
    let workers = ctx.workers(todo.len());
    let total: f64 = todo.iter().map(|t| t.2).sum();
    ctx.progress.runs_total = todo.len();
    ctx.progress.runs_done = 0;
    // (progress, cost done, seconds it took)
    let state = std::sync::Mutex::new((&mut ctx.progress, 0.0f64, 0.0f64));
    {
        let mut g = state.lock().expect("lock");
        g.0.eta = Some(0);
        g.0.draw("");
    }
    let result = par_map_on(workers, &todo, |(spec, dir, cost)| {
        let start = Instant::now();
        train_uncached(dir, spec)?;
        let secs = start.elapsed().as_secs_f64();
        let mut g = state.lock().expect("lock");
        g.1 += cost;
        g.2 += secs;
        let rate = g.2 / g.1.max(f64::MIN_POSITIVE);
        // What is left, spread over the workers (the runs under way
        // counted whole).
        let left = (total - g.1) * rate / workers as f64;
        g.0.eta = Some(left.round() as u64);
        g.0.runs_done += 1;
        g.0.draw(&spec.label());
        Ok(())
    });
    let g = state.into_inner().expect("lock");
    g.0.eta = None;
    if g.0.tty {
        eprintln!();
    }
    result.map(|_| ())
}

/// `f` applied to each of `items`, in order, on up to `ctx.jobs` threads
/// (default: one per core), each with a one-thread rayon pool, as
/// [`train_runs`] does: the results do not depend on the number of threads.
/// The first error is returned.
pub fn par_map<T: Sync, R: Send>(
    ctx: &Ctx,
    items: &[T],
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    par_map_on(ctx.workers(items.len()), items, f)
}

/// [`par_map`] on `workers` threads (one: on the calling thread, with
/// rayon's global pool).
fn par_map_on<T: Sync, R: Send>(
    workers: usize,
    items: &[T],
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    if workers <= 1 {
        return items.iter().map(&f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out: std::sync::Mutex<Vec<Option<Result<R>>>> =
        std::sync::Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= items.len() {
                        return;
                    }
                    let r = match &pool {
                        Ok(pool) => pool.install(|| f(&items[i])),
                        Err(e) => Err(ReportError(e.to_string())),
                    };
                    let failed = r.is_err();
                    out.lock().expect("lock")[i] = Some(r);
                    if failed {
                        // Let the other workers run out of items.
                        next.store(items.len(), std::sync::atomic::Ordering::SeqCst);
                        return;
                    }
                }
            });
        }
    });
    // An error stops the workers, so items after it may not have run;
    // every item before it has (indices are handed out in order), so in
    // index order the error comes before any item that did not run.
    let mut v = Vec::with_capacity(items.len());
    for r in out.into_inner().expect("lock").into_iter().flatten() {
        v.push(r?);
    }
    debug_assert_eq!(v.len(), items.len());
    Ok(v)
}

impl Ctx<'_> {
    /// Threads for `tasks` independent tasks: `--jobs`, or one per core, at
    /// most one per task and at least one.
    fn workers(&self, tasks: usize) -> usize {
        self.jobs
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            })
            .clamp(1, tasks.max(1))
    }

    /// A run's spec with this context's text (corpus tasks).
    fn resolve(&self, spec: &RunSpec) -> Result<RunSpec> {
        let mut spec = spec.clone();
        if TaskKind::parse(&spec.task)?.uses_corpus() {
            spec.corpus = Some(self.corpus.hash.clone());
            spec.corpus_file = self.corpus.file.clone();
        }
        Ok(spec)
    }
}

fn run_dir(cache: &Path, spec: &RunSpec) -> PathBuf {
    cache.join("runs").join(format!("{:016x}", spec.key()))
}

/// The cached record of a run, if it finished (a checkpoint, or diverged).
fn cached_record(dir: &Path, spec: &RunSpec) -> Option<RunRecord> {
    let mut r = std::fs::read_to_string(dir.join("record.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<RunRecord>(&t).ok())?;
    if r.diverged.is_some() || dir.join("config.json").exists() {
        r.spec.corpus_file = spec.corpus_file.clone();
        Some(r)
    } else {
        None
    }
}

/// Trains one run into `dir` (its checkpoint and `record.json`).
fn train_uncached(dir: &Path, spec: &RunSpec) -> Result<RunRecord> {
    let rec_path = dir.join("record.json");
    let mut lab = spec.lab()?;
    let mut opt = AdamW::new(lab.params(), lab.meta.train.weight_decay)
        .map_err(posenc_lab::LabError::from)?;
    // A stale checkpoint from an interrupted run must not be resumed.
    let _ = std::fs::remove_dir_all(dir);
    let s = &spec.stage;
    let rec = match train::train(&mut lab, &mut opt, &TrainOptions::quiet(dir)) {
        Ok(summary) => {
            lab.task = lab.task.validation();
            let eval = eval_points(&lab, &spec.eval_lengths, s.eval_batches, s.batch, None)?;
            let mut positions = Vec::new();
            for &len in &spec.position_lengths {
                if lab.model.check_length(len).is_ok() {
                    positions.push(posenc_lab::loss_per_position(
                        &lab,
                        len,
                        s.eval_batches,
                        s.batch,
                        None,
                    )?);
                }
            }
            let (probe, shuffle) = if spec.probe_and_shuffle {
                let l = s.train_len;
                (
                    Some(train::probe(&lab, l, 2, s.batch)?),
                    Some(train::shuffle_test(
                        &lab,
                        l,
                        (l / 4).max(1),
                        s.eval_batches,
                        s.batch,
                    )?),
                )
            } else {
                (None, None)
            };
            RunRecord {
                spec: spec.clone(),
                train_loss: summary.final_loss,
                seconds: summary.seconds,
                eval,
                probe,
                shuffle,
                positions,
                diverged: None,
            }
        }
        Err(e @ posenc_lab::LabError::Diverged { .. }) => RunRecord {
            spec: spec.clone(),
            train_loss: f64::NAN,
            seconds: 0.0,
            eval: spec
                .eval_lengths
                .iter()
                .map(|&length| EvalPoint {
                    length,
                    loss: None,
                    accuracy: None,
                    bits_per_char: None,
                    error: Some(e.to_string()),
                })
                .collect(),
            probe: None,
            shuffle: None,
            positions: Vec::new(),
            diverged: Some(e.to_string()),
        },
        Err(e) => return Err(e.into()),
    };
    std::fs::create_dir_all(dir)?;
    crate::write_atomic(&rec_path, serde_json::to_string(&rec)?.as_bytes())?;
    Ok(rec)
}

/// The trained model of a run, for evaluation: loaded from its checkpoint,
/// drawing from the validation text. `None` for a diverged run.
pub fn load_for_eval(rec: &RunRecord, dir: &Path) -> Result<Option<Lab>> {
    if rec.diverged.is_some() {
        return Ok(None);
    }
    let mut lab = Lab::load(dir)?;
    lab.task = lab.task.validation();
    Ok(Some(lab))
}

/// Fine-tunes `lab` in memory for `steps` steps at `len` with `scaling`
/// kept in training (Position Interpolation fine-tuning when it is
/// `linear`), constant learning rate `lr`: the lab's
/// [`posenc_lab::finetune()`].
pub fn finetune(
    lab: &mut Lab,
    scaling: Option<ScalingSpec>,
    len: usize,
    steps: usize,
    lr: f64,
) -> Result {
    let mut o = FinetuneOptions::new(len, steps, lr);
    o.scaling = scaling;
    posenc_lab::finetune(lab, &o)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::TextCorpus;
    use crate::experiments::{all, run_all};
    use crate::preset::Preset;

    /// Every run an experiment trains is in its [`Experiment::runs`], so
    /// the pool trains them all: on the smoke preset (the quick and full
    /// presets' experiments build their runs with the same functions), no
    /// experiment trains one itself.
    #[test]
    fn the_pool_trains_every_run_of_the_smoke_preset() {
        let preset = Preset::load("smoke").unwrap();
        let tmp = tempfile::Builder::new()
            .prefix("posenc-pool-")
            .tempdir()
            .unwrap();
        let dir = tmp.path().join("cache");
        let corpus = TextCorpus::resolve(&preset.corpus, None, &dir).unwrap();
        let mut ctx = Ctx::new(&preset, corpus, dir.clone());
        ctx.jobs = Some(2);
        let outs = run_all(&mut ctx, None).unwrap();
        assert_eq!(outs.len(), all().len());
        assert_eq!(ctx.trained_late, 0, "runs trained outside the pool");
        let listed: std::collections::HashSet<u64> = all()
            .iter()
            .flat_map(|e| (e.runs)(&preset))
            .map(|s| ctx.resolve(&s).unwrap().key())
            .collect();
        let on_disk = std::fs::read_dir(dir.join("runs")).unwrap().count();
        assert_eq!(
            on_disk,
            listed.len(),
            "runs in the cache against runs listed"
        );
    }
}
