//! The trained and analytic experiments of the report: one file each, a
//! shared training helper with a per-run cache, a per-experiment cache, and
//! a progress bar on stderr.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::claims::experiments::ClaimDef;
use crate::claims::Verdict;
use crate::corpus::{fnv, TextCorpus};
use crate::figures::Fig;
use crate::preset::Preset;
use crate::{ReportError, Result};

/// A module's `pub const EXPERIMENT`: its id, slug, source file (a name
/// beside this one, read with `include_str!`) and the part of the preset
/// it reads; `runs` and `run` are the module's functions of those names.
macro_rules! experiment {
    ($id:literal, $slug:literal, $file:literal, $config:expr) => {
        #[doc = concat!("Experiment ", stringify!($id), ".")]
        pub const EXPERIMENT: Experiment = Experiment {
            id: $id,
            slug: $slug,
            source: include_str!($file),
            config: $config,
            runs,
            run,
        };
    };
}

mod analytic;
mod encoders;
mod learned_sin;
mod lengthgen;
mod lm;
mod pool;
mod rope;
mod shaw;

pub use pool::*;

/// Hash of every source file of the library and the lab (`build.rs`).
const TRAINING_SOURCE: &str = env!("POSENC_TRAINING_SOURCE_HASH");

/// This file and `pool.rs` (the training helper and the caches every
/// experiment shares)
/// and the claims' rules: a change to either re-runs the experiments.
const SHARED_SOURCE: &str = concat!(
    include_str!("mod.rs"),
    include_str!("pool.rs"),
    include_str!("../../../posenc-viz/src/claims/mod.rs"),
    include_str!("../../../posenc-viz/src/claims/experiments.rs")
);

/// One claim checked by an experiment: an entry of `results.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claim {
    /// Stable identifier, e.g. `e3.no-scaling-blows-up`.
    pub id: String,
    /// Experiment number (1–7).
    pub experiment: usize,
    /// The claim, in words.
    pub claim: String,
    /// Paper and table (or seed) it comes from.
    pub source: String,
    /// What we measured.
    pub metric: String,
    /// Our value(s).
    pub value: serde_json::Value,
    /// The paper's value(s), where it gives them.
    pub paper: serde_json::Value,
    /// The rule that turns our value into the verdict.
    pub rule: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Seeds of the runs behind the value.
    pub seeds: Vec<u64>,
    /// Runs behind the value that diverged (named; their seeds stay in the
    /// means, which are then undefined).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diverged: Vec<String>,
    /// Preset used.
    pub preset: String,
}

/// A table of an experiment's section.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Table {
    /// Caption.
    pub title: String,
    /// Column names.
    pub header: Vec<String>,
    /// Cells.
    pub rows: Vec<Vec<String>>,
}

/// What an experiment hands to the report (and to its cache).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExpOutput {
    /// Experiment number.
    pub id: usize,
    /// Title.
    pub title: String,
    /// Markdown: what was done, with the choices made.
    pub text: String,
    /// Claims with verdicts.
    pub claims: Vec<Claim>,
    /// Figures.
    pub figures: Vec<Fig>,
    /// Tables.
    pub tables: Vec<Table>,
    /// Seconds it took when it ran (not when read from the cache).
    pub seconds: f64,
    /// Whether this output came from the cache.
    #[serde(default)]
    pub cached: bool,
}

impl ExpOutput {
    pub(crate) fn new(id: usize, title: &str) -> Self {
        ExpOutput {
            id,
            title: title.into(),
            text: String::new(),
            claims: Vec::new(),
            figures: Vec::new(),
            tables: Vec::new(),
            seconds: 0.0,
            cached: false,
        }
    }

    /// Adds a claim: its id, words, source and rule come from `def`, its
    /// verdict from the rule's function (turned into
    /// [`Verdict::Diverged`] when a run behind it diverged).
    #[allow(clippy::too_many_arguments)]
    pub fn claim(
        &mut self,
        ctx: &Ctx,
        def: &ClaimDef,
        metric: &str,
        value: serde_json::Value,
        paper: serde_json::Value,
        verdict: Verdict,
        seeds: Vec<u64>,
        diverged: Vec<String>,
    ) {
        debug_assert_eq!(def.experiment, self.id, "{}", def.id);
        self.push_claim(
            def,
            &ctx.preset.name,
            metric,
            value,
            paper,
            verdict.unless_diverged(&diverged),
        );
        if let Some(c) = self.claims.last_mut() {
            c.seeds = seeds;
            c.diverged = diverged;
        }
    }

    /// Adds a claim measured without seeds (one pretrained model, one
    /// window): its id, words, source and rule from `def`.
    pub fn push_claim(
        &mut self,
        def: &ClaimDef,
        preset: &str,
        metric: &str,
        value: serde_json::Value,
        paper: serde_json::Value,
        verdict: Verdict,
    ) {
        self.claims.push(Claim {
            id: def.id.into(),
            experiment: self.id,
            claim: def.claim.into(),
            source: def.source.into(),
            metric: metric.into(),
            value,
            paper,
            rule: def.rule.into(),
            verdict,
            seeds: Vec::new(),
            diverged: Vec::new(),
            preset: preset.into(),
        });
    }
}

/// An experiment: number, short name, title, and what it depends on.
pub struct Experiment {
    /// 1–7.
    pub id: usize,
    /// Short name.
    pub slug: &'static str,
    /// Its own source file (`include_str!`), hashed into its cache key: a
    /// change to the code can never be answered from a stale cache.
    pub source: &'static str,
    /// The part of the preset it reads.
    pub config: fn(&Preset) -> serde_json::Value,
    /// The training runs it makes, known from the preset alone: the
    /// report trains those of every experiment in one pool first (longest
    /// first), so that no core waits at the end of an experiment; the
    /// experiment then reads them from the run cache (and trains any it
    /// did not list itself).
    pub runs: fn(&Preset) -> Vec<RunSpec>,
    /// Runs it.
    pub run: fn(&mut Ctx) -> Result<ExpOutput>,
}

/// Every experiment, in order.
pub fn all() -> Vec<Experiment> {
    vec![
        encoders::EXPERIMENT,
        lm::EXPERIMENT,
        rope::EXPERIMENT,
        learned_sin::EXPERIMENT,
        lengthgen::EXPERIMENT,
        shaw::EXPERIMENT,
        analytic::EXPERIMENT,
    ]
}

/// The state experiments share: the preset, the text, the cache and the
/// progress bar.
pub struct Ctx<'a> {
    /// The preset.
    pub preset: &'a Preset,
    /// The text of the language-model experiments.
    pub corpus: TextCorpus,
    /// `OUT/cache`.
    pub cache: PathBuf,
    progress: Progress,
    /// Runs [`train_runs`] trained (and counted) in this process: reading
    /// them back does not count again.
    fresh: std::collections::HashSet<u64>,
    /// Training runs at a time ([`train_runs`]; `None`: one per core).
    pub jobs: Option<usize>,
    /// Runs an experiment trained itself, after the pool: those missing
    /// from its [`Experiment::runs`] (none, in the built-in presets).
    trained_late: usize,
}

struct Progress {
    start: Instant,
    /// Seconds left in the training pool, while it runs.
    eta: Option<u64>,
    tty: bool,
    exp: usize,
    n_exp: usize,
    slug: String,
    runs_done: usize,
    runs_total: usize,
}

impl Progress {
    fn draw(&self, what: &str) {
        let width = 20;
        let runs = self.runs_done as f64 / self.runs_total.max(1) as f64;
        let frac = match self.eta {
            // The training pool, before the experiments: its own bar.
            Some(_) => runs,
            None => (self.exp as f64 - 1.0 + runs) / self.n_exp.max(1) as f64,
        };
        let filled = ((frac * width as f64).round() as usize).min(width);
        let bar = format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled));
        let t = self.start.elapsed().as_secs();
        let line = match self.eta {
            Some(eta) => {
                let left = if self.runs_done == 0 {
                    "time left known after the first run".to_string()
                } else {
                    format!("about {}:{:02} left", eta / 60, eta % 60)
                };
                format!(
                    "{bar} training run {}/{} {what} · {}:{:02} · {left}",
                    self.runs_done,
                    self.runs_total,
                    t / 60,
                    t % 60,
                )
            }
            None => format!(
                "{bar} experiment {}/{} {} · run {}/{} {what} · {}:{:02}",
                self.exp,
                self.n_exp,
                self.slug,
                self.runs_done,
                self.runs_total,
                t / 60,
                t % 60
            ),
        };
        if self.tty {
            eprint!("\r\x1b[2K{line}");
            let _ = std::io::stderr().flush();
        } else {
            eprintln!("{line}");
        }
    }
}

impl<'a> Ctx<'a> {
    /// A context writing its cache under `cache`.
    pub fn new(preset: &'a Preset, corpus: TextCorpus, cache: PathBuf) -> Self {
        Ctx {
            preset,
            corpus,
            cache,
            progress: Progress {
                start: Instant::now(),
                eta: None,
                tty: std::io::stderr().is_terminal(),
                exp: 0,
                n_exp: 0,
                slug: String::new(),
                runs_done: 0,
                runs_total: 0,
            },
            fresh: Default::default(),
            jobs: None,
            trained_late: 0,
        }
    }

    /// Declares how many training runs the current experiment will make.
    pub fn plan(&mut self, runs: usize) {
        self.progress.runs_total = runs;
        self.progress.runs_done = 0;
        self.progress.draw("");
    }

    fn tick(&mut self, what: &str) {
        self.progress.runs_done += 1;
        self.progress.draw(what);
    }
}

/// The cache file of an experiment under `cache`: preset, experiment, and a
/// hash of its part of the preset, the text's hash, the crate's version, and
/// the sources (library, lab, this file and the rules, the experiment's own
/// file).
pub fn cache_path(cache: &Path, preset: &Preset, corpus: &TextCorpus, e: &Experiment) -> PathBuf {
    let code = fnv(format!("{}|{SHARED_SOURCE}", e.source).as_bytes());
    let key = format!(
        "{}|{}|{}|{}|{}|{TRAINING_SOURCE}|{code:016x}",
        preset.name,
        e.id,
        (e.config)(preset),
        corpus.hash,
        env!("CARGO_PKG_VERSION")
    );
    cache.join(&preset.name).join(format!(
        "e{}-{}-{:016x}.json",
        e.id,
        e.slug,
        fnv(key.as_bytes())
    ))
}

/// Runs the experiments (all, or only `only`), each from the cache when its
/// key matches.
pub fn run_all(ctx: &mut Ctx, only: Option<usize>) -> Result<Vec<ExpOutput>> {
    let exps = all();
    if let Some(n) = only {
        if !(1..=exps.len()).contains(&n) {
            return Err(ReportError(format!(
                "--only {n}: there are experiments 1 to {}",
                exps.len()
            )));
        }
    }
    let chosen: Vec<&Experiment> = exps
        .iter()
        .filter(|e| only.is_none_or(|n| e.id == n))
        .collect();
    ctx.progress.n_exp = chosen.len();
    // The experiments not in the cache train their runs in one pool first.
    let pending: Vec<RunSpec> = chosen
        .iter()
        .filter(|e| !cache_path(&ctx.cache, ctx.preset, &ctx.corpus, e).exists())
        .flat_map(|e| (e.runs)(ctx.preset))
        .collect();
    train_pool(ctx, &pending)?;
    let mut out = Vec::new();
    for (i, e) in chosen.into_iter().enumerate() {
        ctx.progress.exp = i + 1;
        ctx.progress.slug = e.slug.into();
        ctx.progress.runs_total = 0;
        ctx.progress.runs_done = 0;
        let path = cache_path(&ctx.cache, ctx.preset, &ctx.corpus, e);
        let cached = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str::<ExpOutput>(&t).ok());
        let o = match cached {
            Some(mut o) => {
                o.cached = true;
                ctx.progress.draw("(cached)");
                o
            }
            None => {
                let start = Instant::now();
                let mut o = (e.run)(ctx)?;
                o.seconds = start.elapsed().as_secs_f64();
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                crate::write_atomic(&path, serde_json::to_string(&o)?.as_bytes())?;
                o
            }
        };
        out.push(o);
    }
    if ctx.progress.tty {
        eprintln!();
    }
    Ok(out)
}

// -------------------------------------------------------------- helpers ---

/// `x` with 4 significant decimals for tables (`—` for NaN).
pub fn f4(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.4}")
    } else {
        "—".into()
    }
}

/// A percentage with one decimal (`—` for NaN).
pub fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1}%", 100.0 * x)
    } else {
        "—".into()
    }
}

/// A JSON number, `null` for NaN.
pub fn jnum(x: f64) -> serde_json::Value {
    if x.is_finite() {
        serde_json::json!((x * 1e6).round() / 1e6)
    } else {
        serde_json::Value::Null
    }
}

/// `mean ± sd` for tables (`—` for NaN; the sd is left out when undefined).
pub fn pm(s: crate::claims::Stat) -> String {
    pm_as(s.mean, s.sd, f4)
}

/// `mean ± sd`, each written by `fmt`; the sd left out when undefined.
pub fn pm_as(mean: f64, sd: f64, fmt: fn(f64) -> String) -> String {
    if sd.is_finite() {
        format!("{} ± {}", fmt(mean), fmt(sd))
    } else {
        fmt(mean)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every experiment hashes its own file, and the training sources' hash
    /// came from build.rs.
    #[test]
    fn every_experiment_hashes_its_own_source() {
        for e in all() {
            assert!(
                (e.source.contains("pub const EXPERIMENT") || e.source.contains("\nexperiment!("))
                    && e.source.contains(e.slug),
                "experiment {} ({}) does not carry its own source",
                e.id,
                e.slug
            );
        }
        assert_eq!(TRAINING_SOURCE.len(), 16);
        assert!(TRAINING_SOURCE.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
