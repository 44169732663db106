//! `posenc report`: every encoding family with its formula, a small table of
//! values and its measured properties, each with a verdict computed from the
//! measurement by a rule stated beside it. Writes `report.md` and
//! `results.json`.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use serde::Serialize;

use crate::{CliError, CliResult};

mod families;

/// Arguments of `posenc report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Output directory.
    #[arg(long, default_value = "report")]
    pub out: PathBuf,
}

/// The outcome of comparing a measurement with a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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

/// Builds the whole report (no I/O).
pub fn build() -> CliResult<Report> {
    let start = Instant::now();
    let families = families::all()?;
    Ok(Report {
        generated_by: format!("posenc {}", env!("CARGO_PKG_VERSION")),
        seconds: start.elapsed().as_secs_f64(),
        families,
    })
}

pub fn run(a: ReportArgs) -> CliResult {
    eprintln!("posenc report: measuring every encoding family ...");
    let report = build()?;
    std::fs::create_dir_all(&a.out)
        .map_err(|e| CliError(format!("cannot create {}: {e}", a.out.display())))?;
    let md = a.out.join("report.md");
    let json = a.out.join("results.json");
    write_atomic(&md, report.markdown().as_bytes())?;
    write_atomic(&json, serde_json::to_string_pretty(&report)?.as_bytes())?;
    let (r, p, n) = report.verdict_counts();
    println!(
        "wrote {} and {} ({} families; {r} reproduced, {p} partly, {n} not reproduced) in {:.1} s",
        md.display(),
        json.display(),
        report.families.len(),
        report.seconds
    );
    Ok(())
}

/// Writes a file through a temporary file and a rename, so a reader never
/// sees half a report.
fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> CliResult {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)
        .map_err(|e| CliError(format!("cannot write {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| CliError(format!("cannot write {}: {e}", path.display())))?;
    Ok(())
}
