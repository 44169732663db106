//! `posenc passkey`: retrieval over length × depth for every scaling and
//! attention method, on a pretrained model. The work is in
//! `posenc_models::passkey`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use indicatif::ProgressBar;
use posenc_models::passkey::{
    self, Haystack, LogHeader, ProbeGrid, Prober, PromptBuilder, TrialLog, TrialResult,
};
use posenc_models::{input, scaling, ModelFiles};
use posenc_plot::{Colormap, Figure, Heatmap, Ticks, ValueRange};
use serde_json::{json, Value};

use crate::cmd_models::{figure_kind, stderr_is_tty, FigureKind};
use crate::output::{check_writable, num, table, write_atomic};
use crate::{CliError, CliResult};

/// Largest haystack file read (bytes).
pub const MAX_HAYSTACK_BYTES: u64 = 64 << 20;

/// Largest prompt length accepted before the memory check.
pub const MAX_PROMPT_LENGTH: usize = 1 << 20;

/// Arguments of `posenc passkey`.
#[derive(Args, Debug)]
pub struct PasskeyArgs {
    /// The model: a GGUF file, or a Hugging Face checkpoint directory.
    #[arg(long, value_name = "FILE")]
    pub model: PathBuf,
    /// Prompt lengths in tokens, comma-separated.
    #[arg(
        long,
        default_value = "2048,4096,8192,12288,16384",
        allow_hyphen_values = true
    )]
    pub lengths: String,
    /// Needle depths in [0, 1] (fraction of the filler before the needle),
    /// comma-separated.
    #[arg(long, default_value = "0,0.25,0.5,0.75,1", allow_hyphen_values = true)]
    pub depths: String,
    /// Trials per (length, depth) cell, each with its own key.
    #[arg(long, default_value_t = 2)]
    pub trials: usize,
    /// Scalings and attention methods, comma-separated (as `posenc
    /// perplexity --scaling`: none, linear:F, dynamic:F, ntk:F, yarn:F,
    /// self-extend:G:W, rerope:W, leaky-rerope:W:K, dca:CHUNK:LOCAL,
    /// sinks:S:WINDOW, METHOD+SCALING).
    #[arg(long, default_value = "none,yarn:2")]
    pub scaling: String,
    /// A UTF-8 text to hide RULER's needle in ("One of the special magic
    /// numbers for WORD is: NNNNNNN."); without it, the landmark passkey
    /// prompt.
    #[arg(long, value_name = "FILE")]
    pub haystack: Option<PathBuf>,
    /// Seed of the keys.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub extras: crate::cmd_models::ModelExtras,
    /// Print JSON: {"methods": {NAME: {"accuracy": {"LEN": {"DEPTH": acc}},
    /// "logprob": {...}, "trials": N, ...}}, "tokens_per_second", ...}.
    #[arg(long)]
    pub json: bool,
    /// Write a length × depth heatmap of accuracy per method (.png or
    /// .svg; the method's name is added before the extension).
    #[arg(long, value_name = "FIG")]
    pub out: Option<PathBuf>,
    /// Append each finished trial to FILE (JSON lines) and skip the trials
    /// FILE already holds, so that a long grid can be stopped and resumed,
    /// or split over runs; the tables and figures cover every trial of the
    /// grid found in FILE or run now.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// The precision of the attention's products past 1,024 tokens.
    #[arg(long, value_enum, default_value_t = crate::cmd_models::ProductsArg::F32)]
    pub products: crate::cmd_models::ProductsArg,
}

fn parse_list<T: std::str::FromStr>(s: &str, flag: &str) -> CliResult<Vec<T>> {
    let out: Vec<T> = s
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.trim()
                .parse::<T>()
                .map_err(|_| CliError(format!("{flag}: {:?} is not a number", p.trim())))
        })
        .collect::<CliResult<_>>()?;
    if out.is_empty() {
        return Err(CliError(format!("{flag}: give at least one value")));
    }
    Ok(out)
}

/// The figure path of `method` for `--out FIG`: `FIG` with the method's
/// name (characters outside `[A-Za-z0-9.-]` as `_`) before the extension.
pub fn figure_path(out: &Path, method: &str) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = out
        .extension()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let safe: String = method
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    out.with_file_name(format!("{stem}-{safe}.{ext}"))
}

fn is_svg(out: &Path) -> CliResult<bool> {
    Ok(matches!(figure_kind(out)?, FigureKind::Svg))
}

/// Runs `posenc passkey`.
pub fn passkey_cmd(a: PasskeyArgs) -> CliResult {
    // Everything checkable is checked before the model is read.
    let scalings = scaling::parse_list(&a.scaling)?;
    posenc_models::llama::check_products(a.products.into())?;
    let grid = ProbeGrid {
        lengths: parse_list(&a.lengths, "--lengths")?,
        depths: parse_list(&a.depths, "--depths")?,
        trials: a.trials,
        seed: a.seed,
    };
    grid.validate()?;
    if let Some(l) = grid.lengths.iter().find(|&&l| l > MAX_PROMPT_LENGTH) {
        return Err(CliError(format!(
            "--lengths: {l} is above {MAX_PROMPT_LENGTH} tokens"
        )));
    }
    if let Some(out) = &a.out {
        is_svg(out)?;
        for s in &scalings {
            check_writable(&figure_path(out, &s.name), "--out")?;
        }
    }
    input::check_model_path(&a.model)?;
    if let Some(p) = &a.log {
        if std::fs::symlink_metadata(p).is_ok() {
            input::check_regular(p)?;
        } else {
            check_writable(p, "--log")?;
        }
    }
    if let Some(t) = &a.extras.tokenizer {
        input::check_regular(t)?;
    }
    let haystack = match &a.haystack {
        None => Haystack::Landmark,
        Some(p) => {
            let bytes = input::read_bounded(p, MAX_HAYSTACK_BYTES)?;
            let text = String::from_utf8(bytes).map_err(|e| {
                CliError(format!(
                    "--haystack {}: not UTF-8 (byte {})",
                    p.display(),
                    e.utf8_error().valid_up_to()
                ))
            })?;
            Haystack::ruler(&text)
                .map_err(|e| CliError(format!("--haystack {}: {e}", p.display())))?
        }
    };
    let mut files = ModelFiles::open(&a.model)?;
    let cfg = files.config()?;
    let adapter = a.extras.read_adapter(&cfg)?;
    let max_len = grid.lengths.iter().copied().max().unwrap_or(0);
    posenc_models::check_memory(&cfg, max_len + passkey::MAX_NEW_TOKENS + 16, None)?;
    let tk = a.extras.tokenizer(&files, &cfg)?;
    let builder = PromptBuilder::new(&tk, &haystack);
    // Filler sizes per length (the haystack checked before any weight).
    let sizes: Vec<usize> = grid
        .lengths
        .iter()
        .map(|&l| builder.calibrate(l))
        .collect::<posenc_models::Result<_>>()
        .map_err(|e| match &a.haystack {
            Some(p) => CliError(format!("--haystack {}: {e}", p.display())),
            None => CliError(e.to_string()),
        })?;
    let (model, source) = a.extras.load(files, cfg, adapter, a.products)?;
    let eos: Vec<u32> = tk.eos().to_vec();
    let mut log = match &a.log {
        None => None,
        Some(p) => Some(TrialLog::open(
            p,
            &LogHeader::for_run(
                &a.model,
                &source,
                &tk,
                &haystack,
                grid.seed,
                &format!("{:?}", a.products).to_lowercase(),
            ),
        )?),
    };
    let total = (scalings.len() * grid.lengths.len() * grid.depths.len() * grid.trials) as u64;
    if !a.json || stderr_is_tty() {
        eprintln!(
            "{source}; tokenizer: {}; {}; trained length {}; {total} trials{}",
            tk.source(),
            haystack.name(),
            model.config().trained_length(),
            log.as_ref().map_or(String::new(), |l| format!(
                " ({} logged in {})",
                l.len(),
                a.log.as_deref().unwrap_or(Path::new("")).display()
            ))
        );
    }
    let pb = if a.quiet || (a.json && !stderr_is_tty()) {
        ProgressBar::hidden()
    } else {
        crate::cmd_models::progress_bar(
            total,
            "{msg:>24} [{bar:32}] {pos}/{len} trials, {elapsed} (eta {eta})",
        )
    };
    let t_all = Instant::now();
    let mut methods = serde_json::Map::new();
    let mut all_prompt_tokens = 0usize;
    let mut all_secs = 0.0f64;
    let mut summaries: Vec<(String, Vec<passkey::Cell>)> = Vec::new();
    for sc in &scalings {
        let t0 = Instant::now();
        let mut prober = Prober::new(&model, sc, &eos)?;
        let mut results: Vec<TrialResult> = Vec::new();
        for (li, &length) in grid.lengths.iter().enumerate() {
            prober.reset();
            for &depth in &grid.depths {
                for trial in 0..grid.trials {
                    pb.set_message(format!("{} @ {length}", sc.name));
                    let (key, word) = grid.key(&haystack, length, depth, trial);
                    if let Some(r) = log
                        .as_ref()
                        .and_then(|l| l.get(&sc.name, length, depth, trial))
                    {
                        if r.key != key {
                            return Err(CliError(format!(
                                "--log: the logged key of {} at {length} tokens, depth {depth}, \
                                 trial {trial} is {}, not the seed's {key}: the log is from \
                                 another version of the probe",
                                sc.name, r.key
                            )));
                        }
                        results.push(r.clone());
                        pb.inc(1);
                        continue;
                    }
                    let prompt = builder.prompt_within(length, sizes[li], depth, key, &word)?;
                    let r = prober.trial(&tk, &prompt, length, depth)?;
                    if let Some(l) = log.as_mut() {
                        l.append(&sc.name, trial, &r)?;
                    }
                    results.push(r);
                    pb.inc(1);
                }
            }
        }
        let run_secs = t0.elapsed().as_secs_f64();
        // The trials' own times, so that a grid resumed from a log counts
        // every trial once.
        let secs: f64 = results.iter().map(|r| r.seconds).sum();
        let cells = passkey::cells(&grid, &results);
        let prompt_tokens: usize = results.iter().map(|r| r.prompt_tokens).sum();
        let prefilled: usize = results.iter().map(|r| r.prefilled).sum();
        all_prompt_tokens += prompt_tokens;
        all_secs += secs;
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
        methods.insert(
            sc.name.clone(),
            json!({
                "accuracy": acc,
                "logprob": lp,
                "accuracy_by_length": by_length,
                "trials": results.len(),
                "trials_per_cell": grid.trials,
                "seconds": secs,
                "seconds_this_run": run_secs,
                "prompt_tokens": prompt_tokens,
                "tokens_prefilled": prefilled,
                "reuses_cache": prober.reuses_cache(),
                "results": results,
            }),
        );
        if let Some(out) = &a.out {
            let path = figure_path(out, &sc.name);
            let bytes = heatmap(&grid, &cells, &sc.name, is_svg(out)?)?;
            write_atomic(&path, &bytes)?;
        }
        summaries.push((sc.name.clone(), cells));
    }
    pb.finish_and_clear();
    let run_secs = t_all.elapsed().as_secs_f64();
    let secs = all_secs;
    if a.json {
        let v: Value = json!({
            "model": source,
            "format": haystack.name(),
            "trained_length": model.config().trained_length(),
            "lengths": grid.lengths,
            "depths": grid.depths,
            "trials_per_cell": grid.trials,
            "seed": grid.seed,
            "max_new_tokens": passkey::MAX_NEW_TOKENS,
            "seconds": secs,
            "seconds_this_run": run_secs,
            "tokens_per_second": all_prompt_tokens as f64 / secs.max(1e-9),
            "methods": methods,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for (name, cells) in &summaries {
        println!("{name}: greedy exact match (mean log-probability of the answer)");
        let mut header = vec!["length".to_string()];
        header.extend(grid.depths.iter().map(|d| format!("depth {d}")));
        let rows: Vec<Vec<String>> = grid
            .lengths
            .iter()
            .map(|&l| {
                let mut row = vec![l.to_string()];
                row.extend(grid.depths.iter().map(|&d| {
                    cells
                        .iter()
                        .find(|c| c.length == l && c.depth == d)
                        .map_or("-".into(), |c| {
                            format!("{} ({})", num(c.accuracy, 2), num(c.logprob, 2))
                        })
                }));
                row
            })
            .collect();
        print!("{}", table(&header, &rows));
        println!();
    }
    println!(
        "{} trials in {:.0} s of trials ({:.0} prompt tokens/s); this run {:.0} s",
        total,
        secs,
        all_prompt_tokens as f64 / secs.max(1e-9),
        run_secs
    );
    Ok(())
}

/// A tick on every cell, labelled with its value.
fn cell_ticks<T: ToString>(values: &[T]) -> Ticks {
    Ticks::Custom(
        values
            .iter()
            .enumerate()
            .map(|(i, v)| (i, v.to_string()))
            .collect(),
    )
}

fn heatmap(grid: &ProbeGrid, cells: &[passkey::Cell], name: &str, svg: bool) -> CliResult<Vec<u8>> {
    let data: Vec<Vec<f64>> = grid
        .depths
        .iter()
        .map(|&d| {
            grid.lengths
                .iter()
                .map(|&l| {
                    cells
                        .iter()
                        .find(|c| c.length == l && c.depth == d)
                        .map_or(0.0, |c| c.accuracy)
                })
                .collect()
        })
        .collect();
    let err = |e: posenc_plot::PlotError| CliError(format!("heatmap of {name}: {e}"));
    let map = Heatmap::new(data)
        .map_err(err)?
        .title(format!("{name}: passkey retrieval (greedy exact match)"))
        .x_label("prompt length (tokens)")
        .y_label("needle depth")
        .colorbar_label("accuracy")
        .colormap(Colormap::Viridis)
        .range(ValueRange::Fixed { min: 0.0, max: 1.0 })
        .orientation(posenc_plot::Orientation::RowsAsRows)
        .x_ticks(cell_ticks(&grid.lengths))
        .y_ticks(cell_ticks(&grid.depths))
        .cell_size(48);
    let (w, h) = map.natural_size();
    let (w, h) = (w.max(420), h.max(300));
    Ok(if svg {
        map.to_svg_string(w, h).map_err(err)?.into_bytes()
    } else {
        map.to_png_bytes(w, h).map_err(err)?
    })
}
