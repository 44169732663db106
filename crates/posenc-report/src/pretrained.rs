//! Pretrained decoders in the report: the figure of loss against position
//! for each RoPE scaling (also `posenc perplexity --out`), and the
//! experiment "the third quiz answer on a pretrained model".

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use posenc_models::generate::{self, Sampling};
use posenc_models::perplexity::{self, Study};
use posenc_models::{Decoder, DecoderConfig, KvCache, ModelFiles, Scaling, Step};
use posenc_plot::{LinePlot, Series};

use crate::claims::experiments as ce;
use crate::corpus::fnv;
use crate::experiments::{ExpOutput, Table};
use crate::figures::{Fig, FigSpec, LineSpec};
use crate::finetuned::{self, Finetuned};
use crate::{num, ReportError, Result};

/// The curves of a [`Study`]: one per scaling, each band's mean loss at the
/// band's middle position, and a vertical segment at the trained length
/// spanning the curves' range.
pub fn loss_series(study: &Study) -> Vec<LineSpec> {
    let mut series: Vec<LineSpec> = study
        .runs
        .iter()
        .map(|r| LineSpec {
            name: r.name.clone(),
            points: r
                .bands
                .iter()
                .map(|b| {
                    let end = b.end.min(r.loss.len());
                    ((b.start + end) as f64 / 2.0, b.loss)
                })
                .collect(),
            markers: r.bands.len() <= 32,
        })
        .collect();
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
        if y.is_finite() {
            (a.min(y), b.max(y))
        } else {
            (a, b)
        }
    });
    let l = study.trained_length;
    if lo.is_finite() && l < study.length {
        series.push(LineSpec {
            name: format!("trained length L = {l}"),
            points: vec![(l as f64, lo), (l as f64, hi)],
            markers: false,
        });
    }
    series
}

fn title(study: &Study) -> String {
    format!(
        "loss per position, bands of {} ({} tokens, trained length {})",
        study.band, study.length, study.trained_length
    )
}

/// The figure as the report stores it (PNG).
pub fn loss_figure(study: &Study, file: &str, caption: &str) -> Fig {
    Fig::new(
        file,
        caption,
        FigSpec::Line {
            title: title(study),
            x_label: "position i (loss of token i + 1)".into(),
            y_label: "loss (nats)".into(),
            series: loss_series(study),
            log_y: false,
        },
    )
}

/// The same figure as a [`LinePlot`], for SVG or PNG files.
pub fn loss_plot(study: &Study) -> LinePlot {
    let mut p = LinePlot::new()
        .title(title(study))
        .x_label("position i (loss of token i + 1)")
        .y_label("loss (nats)");
    for s in loss_series(study) {
        let pts: Vec<(f64, f64)> = s
            .points
            .into_iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        if !pts.is_empty() {
            p = p.series(Series::new(s.name, pts).markers(s.markers));
        }
    }
    p
}

/// Scalings of experiment 8, in its tables' order.
pub const SCALINGS: [&str; 4] = ["none", "linear:2", "dynamic:2", "yarn:2"];

/// New tokens generated after the window, per scaling.
pub const CONTINUATION: usize = 40;

/// Needle depths of the retrieval grid.
pub const PASSKEY_DEPTHS: [f64; 3] = [0.0, 0.5, 1.0];

/// Prompt lengths of the retrieval grid for a model trained on `l`:
/// L/4, L/2, L, 1.5 L, 2 L.
pub fn passkey_lengths(l: usize) -> Vec<usize> {
    vec![l / 4, l / 2, l, 3 * l / 2, 2 * l]
}

/// Scalings and methods of the retrieval grid: no scaling, PI, dynamic
/// NTK, YaRN (factor 2 each) and Self-Extend with group 4 and a
/// neighbour window of L/8 (Jin et al. 2024 extend Llama 2's 4k by
/// groups of 4–8 with windows of 512–1,024 tokens).
pub fn passkey_methods(l: usize) -> Vec<String> {
    let w = ((l / 8).max(4) / 4) * 4;
    let mut v: Vec<String> = SCALINGS.iter().map(|s| s.to_string()).collect();
    v.push(format!("self-extend:4:{w}"));
    v
}

/// Accuracy per method and length of the retrieval grid.
pub(crate) struct Retrieval {
    pub(crate) methods: Vec<String>,
    pub(crate) lengths: Vec<usize>,
    /// `[method][length]`: accuracy over depths and trials.
    pub(crate) accuracy: Vec<Vec<f64>>,
    /// `[method][length]`: mean log-probability of the answer.
    pub(crate) logprob: Vec<Vec<f64>>,
    /// `[method][length][depth]`: accuracy over trials.
    pub(crate) by_depth: Vec<Vec<Vec<f64>>>,
    pub(crate) trials_per_length: usize,
    /// Seconds of the trials (logged ones included).
    pub(crate) seconds: f64,
}

impl Retrieval {
    /// What a claim on the accuracy at 2L measured, in words.
    fn metric_at_2l(&self) -> String {
        format!(
            "greedy passkey accuracy at 2L ({} prompts per length)",
            self.trials_per_length
        )
    }

    /// Method `i`'s accuracy at the longest length (2L); NaN without one.
    fn at_2l(&self, i: usize) -> f64 {
        self.accuracy[i].last().copied().unwrap_or(f64::NAN)
    }

    /// The method from `first` on with the highest accuracy at 2L (the
    /// last of equals; 0 if there is none).
    fn best_at_2l(&self, first: usize) -> usize {
        (first..self.methods.len())
            .max_by(|&a, &b| self.at_2l(a).total_cmp(&self.at_2l(b)))
            .unwrap_or(0)
    }

    /// Every method's accuracy at 2L, as `"METHOD, 2L": accuracy`.
    fn values_at_2l(&self) -> serde_json::Map<String, serde_json::Value> {
        (self.methods.iter().enumerate())
            .map(|(i, m)| (format!("{m}, 2L"), serde_json::json!(self.at_2l(i))))
            .collect()
    }
}

/// The trial log the report's retrieval grids share (experiments 8 and 9,
/// and successive runs): `log` if given (a `posenc passkey --log` file of
/// the same model, whose trials of the report's cells are read instead of
/// run), else one in `cache` per model file and probe code, so that a trial
/// is run once and a stopped report resumes.
pub(crate) fn trial_log(
    cache: &Path,
    log: Option<&Path>,
    model: &Path,
    source: &str,
    tk: &posenc_models::TextTokenizer,
) -> Result<posenc_models::passkey::TrialLog> {
    use posenc_models::passkey::{Haystack, LogHeader, TrialLog};
    let path = match log {
        Some(p) => p.to_path_buf(),
        None => {
            let id = model_identity(model)?;
            let code = fnv(include_str!("../../posenc-models/src/passkey/mod.rs").as_bytes());
            std::fs::create_dir_all(cache)?;
            cache.join(format!("passkey-{id:016x}-{code:016x}.jsonl"))
        }
    };
    TrialLog::open(
        &path,
        &LogHeader::for_run(model, source, tk, &Haystack::Landmark, 0, "f32"),
    )
    .map_err(err)
}

/// Runs the landmark passkey grid on `decoder` (see [`passkey_lengths`],
/// [`PASSKEY_DEPTHS`]) for each of `methods`, `trials` keys per cell,
/// reading and appending trials through `log`; `id` names the experiment
/// in the progress line.
pub(crate) fn retrieval(
    decoder: &posenc_models::Decoder,
    tk: &posenc_models::TextTokenizer,
    l: usize,
    trials: usize,
    methods: &[String],
    log: &mut posenc_models::passkey::TrialLog,
    id: usize,
) -> Result<Retrieval> {
    use posenc_models::passkey::{Haystack, ProbeGrid, Prober, PromptBuilder};
    let haystack = Haystack::Landmark;
    let builder = PromptBuilder::new(tk, &haystack);
    // Lengths too short for the needle and the question (L/4 of a model
    // trained on few tokens, or a tokenizer that spends many tokens on
    // them) are left out.
    let shortest = builder
        .shortest()
        .map_err(err)?
        .max(posenc_models::passkey::MIN_LENGTH);
    let grid = ProbeGrid {
        lengths: passkey_lengths(l)
            .into_iter()
            .filter(|&n| n >= shortest)
            .collect(),
        depths: PASSKEY_DEPTHS.to_vec(),
        trials,
        seed: 0,
    };
    if grid.lengths.is_empty() {
        return Ok(Retrieval {
            methods: methods.to_vec(),
            lengths: Vec::new(),
            accuracy: vec![Vec::new(); methods.len()],
            logprob: vec![Vec::new(); methods.len()],
            by_depth: vec![Vec::new(); methods.len()],
            trials_per_length: grid.depths.len() * trials,
            seconds: 0.0,
        });
    }
    let sizes: Vec<usize> = grid
        .lengths
        .iter()
        .map(|&n| builder.calibrate(n))
        .collect::<posenc_models::Result<_>>()
        .map_err(err)?;
    let (mut accuracy, mut logprob, mut by_depth) = (Vec::new(), Vec::new(), Vec::new());
    let total = methods.len() * grid.lengths.len() * grid.depths.len() * trials;
    let mut done = 0;
    let mut seconds = 0.0;
    for name in methods {
        let scaling: Scaling = name.parse().map_err(err)?;
        let mut prober = Prober::new(decoder, &scaling, tk.eos()).map_err(err)?;
        let (mut acc, mut lp, mut bd) = (Vec::new(), Vec::new(), Vec::new());
        for (li, &length) in grid.lengths.iter().enumerate() {
            prober.reset();
            let (mut hits, mut sum, mut n) = (0usize, 0f64, 0usize);
            let mut depth_acc = Vec::new();
            for &depth in &grid.depths {
                let mut depth_hits = 0usize;
                for trial in 0..trials {
                    done += 1;
                    let (key, word) = grid.key(&haystack, length, depth, trial);
                    let r = match log.get(name, length, depth, trial) {
                        Some(r) if r.key == key => r.clone(),
                        _ => {
                            eprint!("\rposenc report: experiment {id}: passkey {name} at {length} tokens ({done}/{total})   ");
                            let prompt = builder
                                .prompt_within(length, sizes[li], depth, key, &word)
                                .map_err(err)?;
                            let r = prober.trial(tk, &prompt, length, depth).map_err(err)?;
                            log.append(name, trial, &r).map_err(err)?;
                            r
                        }
                    };
                    hits += usize::from(r.correct);
                    depth_hits += usize::from(r.correct);
                    sum += r.logprob;
                    seconds += r.seconds;
                    n += 1;
                }
                depth_acc.push(depth_hits as f64 / trials as f64);
            }
            acc.push(hits as f64 / n as f64);
            lp.push(sum / n as f64);
            bd.push(depth_acc);
        }
        accuracy.push(acc);
        logprob.push(lp);
        by_depth.push(bd);
    }
    eprintln!();
    Ok(Retrieval {
        methods: methods.to_vec(),
        lengths: grid.lengths,
        accuracy,
        logprob,
        by_depth,
        trials_per_length: grid.depths.len() * trials,
        seconds,
    })
}

/// The experiment number.
pub const ID: usize = 8;

/// The experiment's title.
pub const TITLE: &str = "the third quiz answer on a pretrained model";

pub(crate) fn err(e: posenc_models::ModelError) -> ReportError {
    ReportError(e.to_string())
}

/// A cheap identity of a model file or directory: FNV-1a of its size and
/// of its first and last MiB (a GGUF's header holds its metadata and
/// tensor table).
pub(crate) fn model_identity(path: &Path) -> Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let io = |e: std::io::Error| ReportError(format!("{}: {e}", file.display()));
    let mut f = std::fs::File::open(&file).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut head = vec![0u8; len.min(1 << 20) as usize];
    f.read_exact(&mut head).map_err(io)?;
    let mut tail = vec![0u8; len.min(1 << 20) as usize];
    f.seek(SeekFrom::Start(len - tail.len() as u64))
        .map_err(io)?;
    f.read_exact(&mut tail).map_err(io)?;
    let mut bytes = len.to_le_bytes().to_vec();
    bytes.extend(head);
    bytes.extend(tail);
    Ok(fnv(&bytes))
}

/// Unigram entropy (nats) of a token sequence.
pub fn unigram_entropy(tokens: &[u32]) -> f64 {
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for &t in tokens {
        *counts.entry(t).or_default() += 1;
    }
    let n = tokens.len() as f64;
    counts
        .values()
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.ln()
        })
        .sum()
}

fn one_line(s: &str) -> String {
    s.replace('\n', "⏎").replace('|', "\\|")
}

/// A model opened for a report experiment over one window of 2L tokens:
/// its files (weights not read yet), config, tokenizer, the text's tokens
/// and the window (their first 2L).
pub(crate) struct Opened {
    pub(crate) files: ModelFiles,
    pub(crate) cfg: posenc_models::DecoderConfig,
    pub(crate) tk: posenc_models::TextTokenizer,
    pub(crate) all: Vec<u32>,
    pub(crate) window: Vec<u32>,
}

/// Opens `model` for experiment `id` over the first 2L tokens of `text`,
/// checking that the window and `extra_kv` more positions of KV cache fit
/// in memory.
pub(crate) fn open(
    model: &Path,
    text: &str,
    text_name: &str,
    id: usize,
    extra_kv: usize,
) -> Result<Opened> {
    let mut files = ModelFiles::open(model).map_err(err)?;
    let cfg = files.config().map_err(err)?;
    let t = 2 * cfg.trained_length();
    let budget = if extra_kv > 0 {
        let kv = posenc_models::llama::kv_bytes_per_position(&cfg) * (t + extra_kv) as u64;
        posenc_models::available_memory().map(|m| m.saturating_sub(kv))
    } else {
        None
    };
    posenc_models::check_memory(&cfg, t + extra_kv, budget).map_err(err)?;
    let tk = files.tokenizer_for(None, &cfg).map_err(err)?;
    let all = tk.encode(text).map_err(err)?;
    let window = perplexity::window(&all, t)
        .map_err(|e| {
            ReportError(format!(
                "experiment {id} needs 2L = {t} tokens of text ({text_name}): {e}"
            ))
        })?
        .to_vec();
    Ok(Opened {
        files,
        cfg,
        tk,
        all,
        window,
    })
}

/// Where an experiment's output is cached: `cache/PREFIX-KEY.json`, KEY the
/// FNV-1a of the model's identity, the text's hash, `settings` and the
/// hashes of `code` (the sources whose change must rerun it).
pub(crate) fn cache_path(
    cache: &Path,
    prefix: &str,
    model: &Path,
    text: &str,
    settings: &str,
    code: &[&str],
) -> Result<std::path::PathBuf> {
    let mut k = format!(
        "{:016x} {:016x} {settings}",
        model_identity(model)?,
        fnv(text.as_bytes())
    );
    for c in code {
        k.push_str(&format!(" {:016x}", fnv(c.as_bytes())));
    }
    Ok(cache.join(format!("{prefix}-{:016x}.json", fnv(k.as_bytes()))))
}

/// The cached output at `path`, marked as read from the cache.
pub(crate) fn cached(path: &Path) -> Option<ExpOutput> {
    let mut o: ExpOutput = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    o.cached = true;
    Some(o)
}

/// Writes `o` to the cache at `path`.
fn store(path: &Path, o: &ExpOutput) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    crate::write_atomic(path, serde_json::to_string(o)?.as_bytes())
}

/// The output cached at `path`, or else `body`'s on the model's weights
/// (read only then) and their description, timed and cached there.
pub(crate) fn cached_run(
    path: &Path,
    files: ModelFiles,
    cfg: DecoderConfig,
    body: impl FnOnce(Decoder, String) -> Result<ExpOutput>,
) -> Result<ExpOutput> {
    if let Some(o) = cached(path) {
        return Ok(o);
    }
    let start = Instant::now();
    let (decoder, source) = files.load(cfg).map_err(err)?;
    let mut o = body(decoder, source)?;
    o.seconds = start.elapsed().as_secs_f64();
    store(path, &o)?;
    Ok(o)
}

/// The losses of `r`'s bands that start at or past the trained length `l`.
pub(crate) fn losses_beyond(r: &perplexity::ScalingRun, l: usize) -> Vec<f64> {
    r.bands
        .iter()
        .filter(|b| b.start >= l)
        .map(|b| b.loss)
        .collect()
}

/// Passkey retrieval of `methods` on the loaded model of `run` (see
/// [`retrieval`]) through its trial log; none without trials, or where 2L
/// is shorter than a passkey prompt.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_retrieval(
    run: &ModelRun,
    decoder: &posenc_models::Decoder,
    source: &str,
    tk: &posenc_models::TextTokenizer,
    l: usize,
    methods: &[String],
    id: usize,
) -> Result<Option<Retrieval>> {
    if run.passkey_trials == 0 || 2 * l < posenc_models::passkey::MIN_LENGTH {
        return Ok(None);
    }
    let mut log = trial_log(run.cache, run.passkey_log, run.model, source, tk)?;
    let r = retrieval(decoder, tk, l, run.passkey_trials, methods, &mut log, id)?;
    Ok(Some(r))
}

/// Numbers separated by commas, as a command line takes them.
pub(crate) fn comma_list(values: &[usize]) -> String {
    values
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The table of a study's band losses, with the means inside and past L,
/// their ratio to `at_l` and each run's speed.
pub(crate) fn loss_table(study: &Study, at_l: f64, at_l_name: &str, title: String) -> Table {
    let (l, t) = (study.trained_length, study.length);
    let mut header = vec!["positions".to_string()];
    header.extend(study.runs.iter().map(|r| r.name.clone()));
    let mut rows: Vec<Vec<String>> = (0..study.runs[0].bands.len())
        .map(|i| {
            let b = &study.runs[0].bands[i];
            let mut r = vec![format!("{}–{}", b.start, b.end.min(t - 1))];
            r.extend(study.runs.iter().map(|run| num(run.bands[i].loss, 3)));
            r
        })
        .collect();
    let opt = |x: Option<f64>| x.map_or("–".into(), |v| num(v, 3));
    let mut inside = vec![format!("mean, 0–{l}")];
    inside.extend(study.runs.iter().map(|r| opt(r.mean_inside)));
    let mut past = vec![format!("mean, {l}–{}", t - 1)];
    past.extend(study.runs.iter().map(|r| opt(r.mean_beyond)));
    let mut ratio = vec![format!("mean past L ÷ {at_l_name}")];
    ratio.extend(
        study
            .runs
            .iter()
            .map(|r| opt(r.mean_beyond.map(|b| b / at_l))),
    );
    let mut speed = vec!["tokens/s".to_string()];
    speed.extend(study.runs.iter().map(|r| num(r.tokens_per_second, 0)));
    rows.extend([inside, past, ratio, speed]);
    Table {
        title,
        header,
        rows,
    }
}

/// The table of a retrieval grid: accuracy per method and length, and the
/// mean log-probability of the answer at the longest length.
pub(crate) fn retrieval_table(r: &Retrieval, first: &str, title: String) -> Table {
    let mut header = vec![first.to_string()];
    header.extend(r.lengths.iter().map(|n| format!("{n} tokens")));
    header.push("log p(answer) at 2L".into());
    Table {
        title,
        header,
        rows: r
            .methods
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let mut row = vec![m.clone()];
                row.extend(r.accuracy[i].iter().map(|a| num(*a, 2)));
                row.push(num(r.logprob[i].last().copied().unwrap_or(f64::NAN), 2));
                row
            })
            .collect(),
    }
}

/// Checks `--finetune-steps` against the model and the text before any
/// experiment runs ([`finetuned::check`]).
///
/// # Errors
/// Those of [`finetuned::check`]; a model or text that experiment 8 cannot
/// open.
pub fn check_finetune(model: &Path, text: &str, text_name: &str, steps: usize) -> Result<()> {
    let o = open(model, text, text_name, ID, CONTINUATION)?;
    finetuned::check(steps, &o.all, &o.cfg)
}

/// What experiments 8 and 9 run on (`posenc report --model`).
#[derive(Debug, Clone, Copy)]
pub struct ModelRun<'a> {
    /// The model: a GGUF file or a Hugging Face checkpoint directory.
    pub model: &'a Path,
    /// The text of the windows.
    pub text: &'a str,
    /// Its name in captions.
    pub text_name: &'a str,
    /// The preset's name (recorded with each claim).
    pub preset: &'a str,
    /// Passkey prompts per length and depth (0: no retrieval).
    pub passkey_trials: usize,
    /// The report's cache directory.
    pub cache: &'a Path,
    /// A `posenc passkey --log` file shared with the retrieval grids.
    pub passkey_log: Option<&'a Path>,
    /// Experiment 8 also fine-tunes PI and YaRN for this many steps
    /// (0: not; [`crate::finetuned`]).
    pub finetune_steps: usize,
}

/// The sources whose change reruns the experiment (see
/// [`ModelRun::cache_path`]).
const CODE: [&str; 6] = [
    include_str!("pretrained.rs"),
    include_str!("finetuned.rs"),
    include_str!("../../posenc-viz/src/claims/experiments.rs"),
    include_str!("../../posenc-models/src/passkey/mod.rs"),
    include_str!("../../posenc-tune/src/train.rs"),
    include_str!("../../posenc-tune/src/model.rs"),
];

impl ModelRun<'_> {
    /// The model's files and window for experiment `id` (see [`open`]).
    pub(crate) fn open(&self, id: usize, extra: usize) -> Result<Opened> {
        open(self.model, self.text, self.text_name, id, extra)
    }

    /// Where experiment output over this model and text is cached (see
    /// [`cache_path`]).
    pub(crate) fn cache_path(
        &self,
        prefix: &str,
        settings: &str,
        code: &[&str],
    ) -> Result<std::path::PathBuf> {
        cache_path(self.cache, prefix, self.model, self.text, settings, code)
    }
}

/// Experiment 8: a pretrained RoPE decoder (GGUF or safetensors) over one
/// window of twice its trained length `L` of `text` (its first `2L`
/// tokens), zero-shot, for each of [`SCALINGS`]: loss per position, the
/// rules of [`claims::experiments::PRETRAINED`], and [`CONTINUATION`]
/// greedy tokens generated after the window. The result is cached under
/// `cache` by model, text and code.
///
/// # Errors
/// A model that cannot be read or run, a text shorter than `2L` tokens, a
/// window that does not fit in memory.
pub fn experiment(run: &ModelRun) -> Result<ExpOutput> {
    let &ModelRun {
        model,
        text_name,
        preset,
        passkey_trials,
        cache,
        finetune_steps,
        ..
    } = run;
    let Opened {
        files,
        cfg,
        tk,
        all,
        window,
    } = run.open(ID, CONTINUATION)?;
    let l = cfg.trained_length();
    let t = 2 * l;
    if finetune_steps > 0 {
        finetuned::check(finetune_steps, &all, &cfg)?;
    }
    let unigram = unigram_entropy(&all);
    let path = run.cache_path(
        "pretrained",
        &format!("{t} {CONTINUATION} {passkey_trials} {finetune_steps}"),
        &CODE,
    )?;
    let layers = cfg.num_layers;
    cached_run(&path, files, cfg, |decoder, source| {
        let mut runs = Vec::new();
        let mut continuations = Vec::new();
        for (si, name) in SCALINGS.iter().enumerate() {
            let scaling: Scaling = name.parse().map_err(err)?;
            let mut kv = KvCache::new(decoder.config());
            let (scaled, last) = perplexity::run_scaling_cached(
                &decoder,
                &window,
                &scaling,
                1024,
                Some(&mut kv),
                &mut |step| {
                    if let Step::Done(li) = step {
                        eprint!(
                            "\rposenc report: experiment {ID}: {name} ({}/{}), layer {}/{layers}   ",
                            si + 1,
                            SCALINGS.len(),
                            li + 1
                        );
                    }
                },
            )
            .map_err(err)?;
            let rcfg = scaling.rope_config(decoder.config()).map_err(err)?;
            let rope = perplexity::rope_of(rcfg).map_err(err)?;
            let new = generate::continue_from(
                &decoder,
                &mut kv,
                last,
                generate::Decoding {
                    max_new: CONTINUATION,
                    rope: &rope,
                    sampling: Sampling::Greedy,
                    stop: tk.eos(),
                },
                |_| {},
            )
            .map_err(err)?;
            continuations.push(tk.decode(&new).map_err(err)?);
            runs.push(scaled);
        }
        eprintln!();
        let found = run_retrieval(run, &decoder, &source, &tk, l, &passkey_methods(l), ID)?;
        let tuned = if finetune_steps > 0 {
            Some(finetuned::run(
                model,
                &decoder,
                &source,
                &tk,
                &all,
                finetune_steps,
                passkey_trials,
                cache,
            )?)
        } else {
            None
        };
        let study = Study {
            model: source.clone(),
            trained_length: l,
            length: t,
            band: 1024,
            runs,
        };
        let mut o = ExpOutput::new(ID, TITLE);
        o.figures.push(loss_figure(
        &study,
        "e8_pretrained_loss.png",
        &format!("Loss per band of 1,024 positions over one window of 2L = {t} tokens of {text_name}, for each RoPE scaling, zero-shot; the vertical segment marks the trained length L = {l}."),
    ));
        let beyond = |i: usize| losses_beyond(&study.runs[i], l);
        let (none, pi, dynamic, yarn) = (beyond(0), beyond(1), beyond(2), beyond(3));
        let at_l = study.runs[0].mean_inside.unwrap_or(f64::NAN);
        let m = |i: usize| study.runs[i].mean_beyond.unwrap_or(f64::NAN);
        let values = serde_json::json!({
            "loss at L (no scaling, positions 0..L)": at_l,
            "none, L..2L": m(0),
            "linear:2 (PI), L..2L": m(1),
            "dynamic:2, L..2L": m(2),
            "yarn:2, L..2L": m(3),
        });
        let chen = serde_json::json!("LLaMA 7B without scaling: perplexity > 10^3 past L (Fig. 1)");
        o.push_claim(
            &ce::PRETRAINED_QUIZ,
            preset,
            "mean loss (nats)",
            values.clone(),
            chen.clone(),
            ce::pretrained_quiz(&none, &[&pi, &dynamic, &yarn], at_l),
        );
        o.push_claim(
            &ce::PRETRAINED_NO_SCALING_BLOWS_UP,
            preset,
            "mean loss (nats)",
            serde_json::json!({"none, L..2L": m(0), "loss at L": at_l, "unigram entropy": unigram}),
            chen,
            ce::no_scaling_blows_up(m(0), at_l, unigram),
        );
        o.push_claim(
            &ce::PRETRAINED_PI_ZERO_SHOT,
            preset,
            "mean loss on L..2L (nats)",
            serde_json::json!({"linear:2": m(1), "none": m(0)}),
            serde_json::json!("finite, below no scaling (Table 1)"),
            ce::pretrained_pi_zero_shot(&pi, &none),
        );
        o.push_claim(
            &ce::PRETRAINED_DYNAMIC_YARN_BEST,
            preset,
            "mean loss on L..2L (nats)",
            serde_json::json!({"dynamic:2": m(2), "yarn:2": m(3), "linear:2": m(1), "none": m(0)}),
            serde_json::json!(
                "YaRN and dynamic scaling lowest without fine-tuning (Table 1, Fig. 4)"
            ),
            ce::pretrained_dynamic_yarn_best(&dynamic, &yarn, &pi, &none),
        );
        if let Some(r) = &found {
            let best = r.best_at_2l(1);
            o.push_claim(
            &ce::PRETRAINED_RETRIEVAL,
            preset,
            &r.metric_at_2l(),
            serde_json::Value::Object(r.values_at_2l()),
            serde_json::json!("LLaMA 7B + PI/YaRN fine-tuned: 0.5–1.0 up to 32k; no scaling: 0 past L (Chen et al. 2023 §3.4; YaRN data/passkey-32k.csv)"),
            ce::pretrained_retrieval(r.at_2l(0), r.at_2l(best)),
        );
            o.tables.push(retrieval_table(
            r,
            "scaling or method",
            format!(
                "Passkey retrieval (landmark prompts, greedy exact match over depths {:?}, {} prompts per length; the last column: mean teacher-forced log-probability of the key's tokens at 2L)",
                PASSKEY_DEPTHS, r.trials_per_length
            ),
        ));
        }
        o.tables.push(loss_table(
        &study,
        at_l,
        "loss at L",
        "Loss (nats) per band of 1,024 positions (band A–B: mean over positions i in [A, B) of the loss of token i + 1)".into(),
    ));
        if let Some(f) = &tuned {
            finetuned_claims(&mut o, f, found.as_ref(), preset, &study, text_name)?;
        }
        let tail: String = {
            let text = tk.decode(&window[t.saturating_sub(48)..]).map_err(err)?;
            one_line(&text)
        };
        o.tables.push(Table {
        title: format!("Greedy continuation ({CONTINUATION} tokens) after the whole window of {t} tokens (> L = {l}), which ends «…{tail}»"),
        header: vec!["scaling".into(), "continuation".into()],
        rows: SCALINGS
            .iter()
            .zip(&continuations)
            .map(|(s, c)| vec![s.to_string(), one_line(c)])
            .collect(),
    });
        o.text = format!(
        "The quiz's third question is about a trained model's context window, and the lab's two-layer character models of experiment 3 are too small to show it: Press et al. 2022 measured rotary models of 247M parameters losing little past L, while models of 1B parameters and more blow up (Chen et al. 2023). This experiment runs a real pretrained decoder through posenc's RoPE and fused attention: **{source}** ({} layers, {} query and {} key/value heads, head dimension {}, RoPE base {}, trained length L = {l}).\n\n\
         One window: the first 2L = {t} tokens of {text_name}, tokenized as one string by the model's own tokenizer ({}). Loss of token i + 1 given tokens 0..i at every position, zero-shot (no fine-tuning), with each scaling set as transformers sets it: `none` (plain RoPE), `linear:2` (Position Interpolation, every frequency halved), `dynamic:2` (dynamic NTK, the base rescaled from the window's length), `yarn:2` (YaRN, factor 2, original length L, β_fast 32, β_slow 1, attention factor 0.1 ln 2 + 1). The claims compare the mean loss on positions L..2L with the loss at L (no scaling, positions 0..L), with e3's thresholds; with one model and one window there are no seeds, so two scalings are compared band by band over the bands beyond L (paired differences, twice the standard error). The unigram entropy of the text's tokens is {}. Then each scaling continues the window greedily by {CONTINUATION} tokens, through the KV cache: the question is whether the model can *generate* past L.\n\n\
         Generation is also judged as the papers judge it, by retrieval: landmark passkey prompts (YaRN's `eval/passkey.py` format) of L/4 to 2L tokens with the key at depths 0, 0.5 and 1, read greedily; each scaling as above, and Self-Extend (Jin et al. 2024), which keeps the model's RoPE for the nearest keys and groups the positions of the far ones.\n\n\
         Reproduce one scaling's curve with `posenc perplexity --model {} --length {t}`, and the retrieval with `posenc passkey --model {} --lengths {} --depths 0,0.5,1 --scaling {}`.",
        decoder.config().num_layers,
        decoder.config().num_heads,
        decoder.config().num_kv_heads,
        decoder.config().head_dim,
        decoder.config().rope.theta(),
        tk.source(),
        num(unigram, 3),
        model.display(),
        model.display(),
        comma_list(&passkey_lengths(l)),
        passkey_methods(l).join(","),
    );
        Ok(o)
    })
}

/// Experiment 8's fine-tuned arm in the output: the held-out band table,
/// the retrieval table of the fine-tuned models beside the same scalings
/// zero-shot, and the two claims of [`ce::PRETRAINED_FINETUNE`].
fn finetuned_claims(
    o: &mut ExpOutput,
    f: &Finetuned,
    zero_shot: Option<&Retrieval>,
    preset: &str,
    study: &Study,
    text_name: &str,
) -> Result<()> {
    let (l, t) = (study.trained_length, study.length);
    let held = Study {
        model: study.model.clone(),
        trained_length: l,
        length: t,
        band: study.band,
        runs: f.runs.clone(),
    };
    let run = |name: &str| -> Result<&perplexity::ScalingRun> {
        held.runs
            .iter()
            .find(|r| r.name == name)
            .ok_or_else(|| ReportError(format!("experiment 8: no held-out run {name}")))
    };
    let beyond = |r: &perplexity::ScalingRun| losses_beyond(r, l);
    let at_l = run("none")?.mean_inside.unwrap_or(f64::NAN);
    let (pi, pi_ft) = (run("linear:2")?, run(&finetuned::tuned_name("linear:2"))?);
    let mb = |r: &perplexity::ScalingRun| r.mean_beyond.unwrap_or(f64::NAN);
    let mut values = serde_json::Map::new();
    values.insert(
        "loss at L (held out, no scaling, positions 0..L)".into(),
        at_l.into(),
    );
    for r in &held.runs {
        values.insert(format!("{}, L..2L", r.name), mb(r).into());
    }
    o.push_claim(
        &ce::PI_FINETUNE_CLOSES_GAP,
        preset,
        "mean loss on held-out text (nats)",
        serde_json::Value::Object(values),
        serde_json::json!("LLaMA 7B, PI + 1,000 steps: perplexity at 8,192 at or below the original at 2,048 (Table 1)"),
        ce::pi_finetune_closes_gap(&beyond(pi_ft), &beyond(pi), at_l),
    );
    if let (Some(r), Some(z)) = (&f.retrieval, zero_shot) {
        // The better fine-tune at 2L, against its scaling zero-shot.
        let best = r.best_at_2l(0);
        let scaling = finetuned::SCALINGS[best.min(finetuned::SCALINGS.len() - 1)];
        let zero = z
            .methods
            .iter()
            .position(|m| m == scaling)
            .map_or(f64::NAN, |i| z.at_2l(i));
        let mut value = r.values_at_2l();
        for s in finetuned::SCALINGS {
            if let Some(i) = z.methods.iter().position(|m| m == s) {
                value.insert(format!("{s} zero-shot, 2L"), z.at_2l(i).into());
            }
        }
        o.push_claim(
            &ce::FINETUNE_RETRIEVES,
            preset,
            &r.metric_at_2l(),
            serde_json::Value::Object(value),
            serde_json::json!("LLaMA 7B fine-tuned 2k → 32k: YaRN 0.98–1.0, PI 0.44–0.54 at 2k–16k (YaRN data/passkey-32k.csv)"),
            ce::finetune_retrieves(r.at_2l(best), zero),
        );
        o.tables.push(retrieval_table(
            r,
            "fine-tuned",
            format!(
                "Passkey retrieval after {} fine-tuning steps (as the zero-shot table above; {} prompts per length)",
                f.steps, r.trials_per_length
            ),
        ));
    }
    o.tables.push(loss_table(
        &held,
        at_l,
        "loss at L (held out)",
        format!(
            "Held-out loss (nats) per band of 1,024 positions: one window of 2L = {t} tokens from the last 10% of {text_name} (never trained on), the base model without scaling and with PI ×2 and YaRN ×2 zero-shot, and each after {} steps of LoRA fine-tuning on PoSE windows of {} tokens covering 2L positions ({})",
            f.steps,
            f.window,
            f.training
                .iter()
                .zip(finetuned::SCALINGS)
                .map(|((secs, loss), s)| format!("{s}: {secs:.0} s, last step's loss {loss:.3}"))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    ));
    Ok(())
}
