//! `posenc report`: the seeds' walk-through, seven experiments (models
//! trained here, and analytic checks), and every encoding family with its
//! formula, values and measured properties — each claim with a verdict
//! computed from the measurement by a rule stated beside it. Writes
//! `index.html` (self-contained), `report.md` with `figures/*.png`, and
//! `results.json`; trained results are cached under `cache/`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::{CliError, CliResult};

mod experiments;
mod families;
mod figures;
mod html;
mod preset;
mod walkthrough;

use experiments::{Claim, ExpOutput};

/// Arguments of `posenc report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Output directory.
    #[arg(long, default_value = "report")]
    pub out: PathBuf,
    /// Experiment preset: quick, full, smoke, or a path to a JSON preset.
    #[arg(long, default_value = "quick")]
    pub preset: String,
    /// Run only experiment N (1–7).
    #[arg(long)]
    pub only: Option<usize>,
}

/// The outcome of comparing a measurement with a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// The measurement meets the claim's rule.
    #[serde(rename = "reproduced")]
    Reproduced,
    /// The measurement meets a weaker form of the rule.
    #[serde(rename = "partly")]
    Partly,
    /// The measurement does not meet the rule.
    #[serde(rename = "not reproduced")]
    NotReproduced,
}

impl Verdict {
    /// The verdict as written in reports (`reproduced`, `partly`, `not reproduced`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::Partly => "partly",
            Verdict::NotReproduced => "not reproduced",
        }
    }

    /// `Reproduced` when `ok`, otherwise `NotReproduced`.
    pub fn from_bool(ok: bool) -> Self {
        if ok {
            Verdict::Reproduced
        } else {
            Verdict::NotReproduced
        }
    }
}

/// The rule for seed 001's claim that the similarity of PE(p) and PE(p + k)
/// decreases with k, from the fraction of non-increasing steps and
/// Spearman's ρ between k and the cosine; shared by the report and
/// `posenc analyze`.
pub fn similarity_verdict(monotone_fraction: f64, spearman: f64) -> (Verdict, &'static str) {
    let rule = "reproduced if strictly non-increasing (fraction 1.0); partly if Spearman ρ(k, cos) ≤ −0.9 (falls overall, with ripples); else not reproduced";
    let v = if monotone_fraction >= 1.0 {
        Verdict::Reproduced
    } else if spearman <= -0.9 {
        Verdict::Partly
    } else {
        Verdict::NotReproduced
    };
    (v, rule)
}

/// One measured property with its verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Property {
    /// Stable identifier, e.g. `sinusoidal.linear-map`.
    pub id: String,
    /// The claim, in words.
    pub claim: String,
    /// Where the claim comes from (paper, section; seed).
    pub source: String,
    /// What was measured, in words.
    pub metric: String,
    /// The measured value(s).
    pub value: serde_json::Value,
    /// The value the source gives, where it gives one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<serde_json::Value>,
    /// The rule that turns the value into the verdict.
    pub rule: String,
    /// The verdict.
    pub verdict: Verdict,
}

/// One encoding family's section.
#[derive(Debug, Clone, Serialize)]
pub struct Family {
    /// Identifier, e.g. `sinusoidal`.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Paper(s).
    pub paper: String,
    /// Where the position enters the transformer.
    pub hooks: Vec<String>,
    /// The formula, as plain text.
    pub formula: String,
    /// Markdown body: explanation and a small table of values.
    #[serde(skip)]
    pub body: String,
    /// Measured properties.
    pub properties: Vec<Property>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Tool and version.
    pub generated_by: String,
    /// Seconds it took.
    pub seconds: f64,
    /// Every family.
    pub families: Vec<Family>,
}

impl Report {
    fn verdict_counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for p in self.families.iter().flat_map(|f| &f.properties) {
            match p.verdict {
                Verdict::Reproduced => c.0 += 1,
                Verdict::Partly => c.1 += 1,
                Verdict::NotReproduced => c.2 += 1,
            }
        }
        c
    }

    fn markdown(&self) -> String {
        let mut s = String::new();
        s.push_str("# posenc report: positional encodings, measured\n\n");
        s.push_str(
            "Attention treats its input as a set: permute the tokens and the outputs are permuted \
             the same way. A positional encoding gives the model the order back, at one of three \
             places — the **input** (absolute encodings added to the embeddings), the **queries \
             and keys** (rotary encodings), or the **attention logits and values** (relative \
             encodings). This report states, for each family, its formula, a few of its values, and \
             properties measured by `posenc` itself; every verdict is computed from the measurement \
             by the rule printed next to it.\n\n",
        );
        let (r, p, n) = self.verdict_counts();
        s.push_str(&format!(
            "Generated by `{}` in {:.1} s: **{r} reproduced, {p} partly, {n} not reproduced**. \
             Regenerate with `cargo run --release -- report`.\n\n",
            self.generated_by, self.seconds
        ));
        s.push_str("| family | enters at | properties | verdicts |\n|---|---|---|---|\n");
        for f in &self.families {
            let v: Vec<&str> = f.properties.iter().map(|p| p.verdict.as_str()).collect();
            s.push_str(&format!(
                "| [{}](#{}) | {} | {} | {} |\n",
                f.name,
                f.id,
                f.hooks.join(", "),
                f.properties.len(),
                summarize(&v)
            ));
        }
        s.push('\n');
        for f in &self.families {
            s.push_str(&format!("<a id=\"{}\"></a>\n## {}\n\n", f.id, f.name));
            s.push_str(&format!(
                "*{}* — enters at: {}.\n\n",
                f.paper,
                f.hooks.join(", ")
            ));
            s.push_str(&format!("```text\n{}\n```\n\n", f.formula.trim_end()));
            s.push_str(f.body.trim_end());
            s.push_str("\n\n");
            if !f.properties.is_empty() {
                s.push_str("| property | measured | rule | verdict |\n|---|---|---|---|\n");
                for p in &f.properties {
                    s.push_str(&format!(
                        "| **{}** — {} <br><sub>{}; `{}`</sub> | {} | {} | **{}** |\n",
                        cell(&p.claim),
                        cell(&p.metric),
                        cell(&p.source),
                        p.id,
                        cell(&compact_json(&p.value)),
                        cell(&p.rule),
                        p.verdict.as_str()
                    ));
                }
                s.push('\n');
            }
        }
        s
    }
}

/// Escapes a Markdown table cell (`|` would end the cell).
pub fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn summarize(v: &[&str]) -> String {
    let mut out: Vec<String> = Vec::new();
    for name in ["reproduced", "partly", "not reproduced"] {
        let c = v.iter().filter(|x| **x == name).count();
        if c > 0 {
            out.push(format!("{c} {name}"));
        }
    }
    out.join(", ")
}

fn compact_json(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Number(n) => n
            .as_f64()
            .map(|x| crate::output::num(x, 4))
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
        other => other.to_string(),
    }
}

/// Builds the analytic family sections (no I/O).
pub fn build() -> CliResult<Report> {
    let start = Instant::now();
    let families = families::all()?;
    Ok(Report {
        generated_by: format!("posenc {}", env!("CARGO_PKG_VERSION")),
        seconds: start.elapsed().as_secs_f64(),
        families,
    })
}

/// `results.json`.
#[derive(Serialize)]
struct Results<'a> {
    generated_by: &'a str,
    preset: &'a preset::Preset,
    only: Option<usize>,
    seconds: f64,
    verdict_rule: &'static str,
    claims: Vec<&'a Claim>,
    experiments: Vec<serde_json::Value>,
    families: &'a [Family],
}

fn claims_table(claims: &[&Claim]) -> String {
    let mut s = String::from(
        "| claim | source | ours | paper | rule | verdict |\n|---|---|---|---|---|---|\n",
    );
    for c in claims {
        s.push_str(&format!(
            "| **{}** <br><sub>`{}`</sub> | {} | {}: {} | {} | {} | **{}** |\n",
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

fn count(v: impl Iterator<Item = Verdict>) -> (usize, usize, usize) {
    let mut c = (0, 0, 0);
    for x in v {
        match x {
            Verdict::Reproduced => c.0 += 1,
            Verdict::Partly => c.1 += 1,
            Verdict::NotReproduced => c.2 += 1,
        }
    }
    c
}

pub fn run(a: ReportArgs) -> CliResult {
    let start = Instant::now();
    let preset = preset::Preset::load(&a.preset)?;
    eprintln!(
        "posenc report: preset {} ({}); writing to {}",
        preset.name,
        preset.description,
        a.out.display()
    );
    std::fs::create_dir_all(a.out.join("figures"))
        .map_err(|e| CliError(format!("cannot create {}: {e}", a.out.display())))?;
    let report = build()?;
    let walk = walkthrough::build_section()?;
    let mut ctx = experiments::Ctx::new(&preset, a.out.join("cache"));
    let exps = experiments::run_all(&mut ctx, a.only)?;
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
    let (r, p, n) = count(claims.iter().map(|c| c.verdict));
    let (fr, fp, fn_) = report.verdict_counts();
    let seconds = start.elapsed().as_secs_f64();
    // Markdown.
    let mut md = String::new();
    md.push_str("# posenc report: positional encodings, explained and measured\n\n");
    md.push_str(
        "Attention treats its input as a set: permute the tokens and the outputs are permuted \
         the same way. A positional encoding gives the model the order back, at one of three \
         places — the **input** (absolute encodings added to the embeddings), the **queries \
         and keys** (rotary encodings), or the **attention logits and values** (relative \
         encodings). This page walks through the idea with the seeds' own example, then checks \
         what the papers claim on models trained here, then lists every family with its \
         formula and measured properties. Every verdict is computed from a measurement by the \
         rule printed next to it; a claim that does not reproduce at our scale says so, with \
         the numbers.\n\n",
    );
    md.push_str(&format!(
        "Generated by `posenc {}` with preset **{}** in {:.1} s{}: experiments **{r} reproduced, {p} partly, {n} not reproduced**; encoding families {fr} reproduced, {fp} partly, {fn_} not reproduced. Regenerate with `cargo run --release -- report` (`--preset full` for longer runs, `--only N` for one experiment).\n\n",
        env!("CARGO_PKG_VERSION"),
        preset.name,
        seconds,
        a.only.map(|n| format!(" (only experiment {n})")).unwrap_or_default(),
    ));
    md.push_str(&section_md(&walk, "##"));
    md.push_str("## The claims at a glance\n\n");
    md.push_str(&claims_table(&claims));
    md.push('\n');
    for e in &exps {
        md.push_str(&section_md(e, "##"));
    }
    md.push_str("# Encoding families\n\n");
    let fam = report.markdown();
    let fam_body = fam.split_once("\n\n").map(|x| x.1).unwrap_or(&fam);
    md.push_str(fam_body);
    write_atomic(&a.out.join("report.md"), md.as_bytes())?;
    let page = html::page("posenc report", &md, &|p| pngs.get(p).cloned());
    write_atomic(&a.out.join("index.html"), page.as_bytes())?;
    let generated_by = format!("posenc {}", env!("CARGO_PKG_VERSION"));
    let results = Results {
        generated_by: &generated_by,
        preset: &preset,
        only: a.only,
        seconds,
        verdict_rule: "each claim's verdict is computed from `value` by its `rule`: reproduced, partly, or not reproduced",
        claims,
        experiments: exps
            .iter()
            .map(|e| serde_json::json!({"id": e.id, "title": e.title, "seconds": e.seconds, "cached": e.cached, "figures": e.figures.iter().map(|f| format!("figures/{}", f.file)).collect::<Vec<_>>()}))
            .collect(),
        families: &report.families,
    };
    write_atomic(
        &a.out.join("results.json"),
        serde_json::to_string_pretty(&results)?.as_bytes(),
    )?;
    println!(
        "wrote {} (index.html, report.md, results.json, {} figures) in {:.1} s: claims {r} reproduced, {p} partly, {n} not reproduced; families {fr}/{fp}/{fn_}",
        a.out.display(),
        pngs.len(),
        seconds
    );
    Ok(())
}

/// Writes a file through a temporary file and a rename, so a reader never
/// sees half a report (the lab's checkpoint writer).
fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> CliResult {
    Ok(posenc_lab::train::write_atomic(path, bytes)?)
}
