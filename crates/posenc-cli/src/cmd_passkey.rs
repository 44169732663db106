//! `posenc passkey`: retrieval over length × depth for every scaling and
//! attention method, on a pretrained model. The work is in
//! `posenc_models::passkey`.

use std::path::{Path, PathBuf};

use clap::Args;
use posenc_models::passkey::{self, ProbeGrid};
use posenc_plot::{Colormap, Figure, Heatmap, Ticks, ValueRange};
use posenc_run::{HaystackSource, PasskeyRequest};

use crate::cmd_models::{figure_kind, stderr_is_tty, FigureKind};
use crate::output::{check_writable, num, table, write_atomic, RunBar};
use crate::{CliError, CliResult};

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
    /// The memory the run may use (900M, 2G, ...): the run is refused
    /// before anything large is allocated when its estimate at the longest
    /// length is over it. Default: the smaller of the available memory
    /// (MemAvailable) and RLIMIT_AS less what the process maps.
    #[arg(long = "max-memory", value_name = "SIZE")]
    pub max_memory: Option<String>,
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
    let request = PasskeyRequest {
        lengths: parse_list(&a.lengths, "--lengths")?,
        depths: parse_list(&a.depths, "--depths")?,
        trials: a.trials,
        scalings: vec![a.scaling.clone()],
        haystack: a
            .haystack
            .clone()
            .map_or(HaystackSource::Landmark, HaystackSource::File),
        seed: a.seed,
        log: a.log.clone(),
        adapter: None,
        max_memory: crate::cmd_models::max_memory(a.max_memory.as_deref())?,
    };
    let (scalings, _) = request.check()?;
    posenc_models::llama::check_products(a.products.into())?;
    if let Some(out) = &a.out {
        is_svg(out)?;
        for s in &scalings {
            check_writable(&figure_path(out, &s.name), "--out")?;
        }
    }
    posenc_models::input::check_model_path(&a.model)?;
    let plan = request.plan()?;
    let mut session = a.extras.open(&a.model, a.products)?;
    let mut bar = RunBar::new(
        "{msg:>24} [{bar:32}] {pos}/{len} trials, {elapsed} (eta {eta})",
        a.quiet || (a.json && !stderr_is_tty()),
        !a.json || stderr_is_tty(),
    );
    let run = session.passkey_planned(&request, plan, &mut |p| bar.report(p))?;
    bar.finish();
    let grid = &run.grid;
    if let Some(out) = &a.out {
        for (name, cells) in &run.cells {
            let path = figure_path(out, name);
            let bytes = heatmap(grid, cells, name, is_svg(out)?)?;
            write_atomic(&path, &bytes)?;
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&run.json)?);
        return Ok(());
    }
    let (total, secs, run_secs) = (run.trials, run.seconds, run.seconds_this_run);
    let all_prompt_tokens = run.prompt_tokens;
    let summaries = &run.cells;
    for (name, cells) in summaries {
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
