//! Experiment 2: decoders learn positions without them.

use serde_json::json;

use super::{f4, jnum, mean_std, verdict3, Ctx, ExpOutput, Experiment, RunRecord, RunSpec, Table};
use crate::report::figures::{BarSpec, Fig, FigSpec, LineSpec};
use crate::report::preset::Preset;
use crate::CliResult;

pub const EXPERIMENT: Experiment = Experiment {
    id: 2,
    slug: "lm",
    source: include_str!("lm.rs"),
    config: |p| json!({"lm": p.lm, "seeds": p.seeds}),
    run,
};

/// The language-model run shared by experiments 2 and 4 (same spec, so the
/// run cache trains it once): evaluated at L and 2L, with the probe and the
/// shuffle test.
pub fn lm_spec(p: &Preset, pe: &str, seed: u64) -> RunSpec {
    let mut s = RunSpec::new("lm", pe, &p.lm.run, seed);
    s.eval_lengths = vec![p.lm.run.train_len, 2 * p.lm.run.train_len];
    s.probe_and_shuffle = true;
    s
}

/// Trains every (encoding, seed) of `encodings`.
pub fn lm_runs(ctx: &mut Ctx, encodings: &[String]) -> CliResult<Vec<(String, Vec<RunRecord>)>> {
    let p = ctx.preset.clone();
    ctx.plan(encodings.len() * p.seeds.len());
    let mut out = Vec::new();
    for pe in encodings {
        let mut v = Vec::new();
        for &seed in &p.seeds {
            v.push(super::train_run(ctx, &lm_spec(&p, pe, seed))?.0);
        }
        out.push((pe.clone(), v));
    }
    Ok(out)
}

fn run(ctx: &mut Ctx) -> CliResult<ExpOutput> {
    let p = ctx.preset.clone();
    let l = p.lm.run.train_len;
    let mut o = ExpOutput::new(2, "Decoders learn positions without them");
    o.text = format!(
        "Seed 001's quiz: *can GPT work without a positional encoding?* A causal decoder can \
         count: position t attends to t + 1 tokens, so it can infer where it is. Character-level \
         language modelling on the built-in corpus (a synthetic grammar of sentences), context \
         {l}, d_model {}, {} layers, {} steps, seeds {:?}; validation loss on fresh windows. \
         Then, per model: a ridge probe of the absolute position from the activations after the \
         embedding and after each block (Haviv et al. 2022 §4), and the shuffle test: loss on \
         the last L/4 tokens with the prefix in order or shuffled, against the unigram entropy \
         (the loss of a model that ignores context).",
        p.lm.run.d_model, p.lm.run.layers, p.lm.run.steps, p.seeds
    );
    let runs = lm_runs(ctx, &p.lm.encodings)?;
    let stats: Vec<(String, f64, f64)> = runs
        .iter()
        .map(|(pe, rs)| {
            let (m, s) = mean_std(&rs.iter().map(|r| r.loss(l)).collect::<Vec<_>>());
            (pe.clone(), m, s)
        })
        .collect();
    o.tables.push(Table {
        title: format!("Validation loss at length {l} (nats per character), mean ± sd over seeds"),
        header: vec![
            "encoding".into(),
            "loss".into(),
            "sd".into(),
            "per seed".into(),
        ],
        rows: runs
            .iter()
            .zip(&stats)
            .map(|((_, rs), (pe, m, s))| {
                vec![
                    pe.clone(),
                    f4(*m),
                    f4(*s),
                    rs.iter()
                        .map(|r| f4(r.loss(l)))
                        .collect::<Vec<_>>()
                        .join(", "),
                ]
            })
            .collect(),
    });
    o.figures.push(Fig::new(
        "e2-lm-loss.png",
        "Experiment 2: validation loss per encoding (mean ± sd over seeds).",
        FigSpec::Bar {
            title: "Language modelling: validation loss".into(),
            groups: stats.iter().map(|s| s.0.clone()).collect(),
            y_label: "loss (nats/char)".into(),
            series: vec![BarSpec {
                name: "loss".into(),
                values: stats.iter().map(|s| s.1).collect(),
                errors: Some(stats.iter().map(|s| s.2).collect()),
            }],
        },
    ));
    let nope = stats.iter().find(|s| s.0 == "nope");
    let best = stats
        .iter()
        .filter(|s| s.0 != "nope" && s.1.is_finite())
        .min_by(|a, b| a.1.total_cmp(&b.1));
    if let (Some(n), Some(b)) = (nope, best) {
        let gap = (n.1 - b.1) / b.1;
        o.claim(
            ctx,
            "nope-close",
            "A decoder without positional encoding reaches nearly the loss of one with positions.",
            "Haviv et al. 2022, Table 1 (NoPE within a few % of learned/sinusoidal/ALiBi perplexity)",
            "relative gap of NoPE's mean validation loss to the best positional encoding's",
            json!({"nope": jnum(n.1), "best": b.0, "best_loss": jnum(b.1), "relative_gap": jnum(gap)}),
            json!("within a few % in perplexity"),
            "reproduced if the gap ≤ 5%; partly if ≤ 15%",
            verdict3(gap <= 0.05, gap <= 0.15),
            p.seeds.clone(),
        );
    }
    // Probe: NoPE at the embedding layer vs later layers.
    let mut series = Vec::new();
    let mut baseline = f64::NAN;
    for (pe, rs) in &runs {
        if let Some(pr) = rs[0].probe.as_ref() {
            baseline = pr.baseline_mae;
            series.push(LineSpec {
                name: pe.clone(),
                points: pr
                    .mae
                    .iter()
                    .enumerate()
                    .map(|(i, &m)| (i as f64, m))
                    .collect(),
                markers: true,
            });
        }
    }
    if let Some(pr) = runs
        .iter()
        .find(|r| r.0 == "nope")
        .and_then(|r| r.1[0].probe.clone())
    {
        series.push(LineSpec {
            name: "predict the mean".into(),
            points: (0..pr.mae.len())
                .map(|i| (i as f64, pr.baseline_mae))
                .collect(),
            markers: false,
        });
        let first = pr.mae[0] / pr.baseline_mae;
        let later = pr.mae[1..].iter().fold(f64::INFINITY, |a, &b| a.min(b)) / pr.baseline_mae;
        o.claim(
            ctx,
            "probe",
            "NoPE's embedding layer carries no position (probe at the random baseline); later layers learn it.",
            "Haviv et al. 2022, §4 and Fig. 2",
            "position-probe mean absolute error / error of predicting the mean, at the embedding layer and the best later layer (NoPE, first seed)",
            json!({"embedding_ratio": jnum(first), "best_later_ratio": jnum(later), "mae": pr.mae.iter().map(|&x| jnum(x)).collect::<Vec<_>>(), "baseline_mae": jnum(pr.baseline_mae)}),
            json!("embedding layer at baseline; error falls within 1–3 layers"),
            "reproduced if the embedding layer's ratio ≥ 0.9 and a later layer's ≤ 0.6; partly if ≥ 0.9 and a later layer's ≤ 0.85",
            verdict3(first >= 0.9 && later <= 0.6, first >= 0.9 && later <= 0.85),
            vec![p.seeds[0]],
        );
    }
    o.figures.push(Fig::new(
        "e2-probe.png",
        "Experiment 2: error of a linear probe of absolute position, per layer (0 = embeddings), first seed.",
        FigSpec::Line {
            title: format!("Position probe (baseline {:.2})", baseline),
            x_label: "layer (0 = embedding + input encoding)".into(),
            y_label: "mean absolute error (positions)".into(),
            series,
            log_y: false,
        },
    ));
    // Shuffle test.
    let mut groups = Vec::new();
    let (mut ino, mut shuf, mut uni) = (Vec::new(), Vec::new(), Vec::new());
    let mut rows = Vec::new();
    for (pe, rs) in &runs {
        let sh: Vec<_> = rs.iter().filter_map(|r| r.shuffle.clone()).collect();
        if sh.is_empty() {
            continue;
        }
        let a = mean_std(&sh.iter().map(|s| s.in_order).collect::<Vec<_>>()).0;
        let b = mean_std(&sh.iter().map(|s| s.shuffled).collect::<Vec<_>>()).0;
        let u = sh[0].unigram.unwrap_or(f64::NAN);
        groups.push(pe.clone());
        ino.push(a);
        shuf.push(b);
        uni.push(u);
        rows.push(vec![pe.clone(), f4(a), f4(b), f4(u), f4((b - a) / (u - a))]);
    }
    if let Some(i) = groups.iter().position(|g| g == "nope") {
        let r = (shuf[i] - ino[i]) / (uni[i] - ino[i]);
        o.claim(
            ctx,
            "shuffle",
            "Shuffling the prefix raises a NoPE decoder's loss toward the unigram level: it uses order it was never given.",
            "Haviv et al. 2022, §5",
            "(shuffled − in order) / (unigram − in order) for NoPE, mean over seeds",
            json!({"in_order": jnum(ino[i]), "shuffled": jnum(shuf[i]), "unigram": jnum(uni[i]), "fraction": jnum(r)}),
            json!("loss rises toward the unigram level"),
            "reproduced if the fraction ≥ 0.5; partly if ≥ 0.1",
            verdict3(r >= 0.5, r >= 0.1),
            p.seeds.clone(),
        );
    }
    o.tables.push(Table {
        title: "Shuffle test: loss on the last L/4 tokens (mean over seeds)".into(),
        header: vec![
            "encoding".into(),
            "in order".into(),
            "prefix shuffled".into(),
            "unigram".into(),
            "fraction of the way".into(),
        ],
        rows,
    });
    o.figures.push(Fig::new(
        "e2-shuffle.png",
        "Experiment 2: the shuffle test — loss with the prefix in order, shuffled, and the unigram entropy.",
        FigSpec::Bar {
            title: "Shuffle test".into(),
            groups,
            y_label: "loss on the last L/4 tokens".into(),
            series: vec![
                BarSpec { name: "in order".into(), values: ino, errors: None },
                BarSpec { name: "prefix shuffled".into(), values: shuf, errors: None },
                BarSpec { name: "unigram".into(), values: uni, errors: None },
            ],
        },
    ));
    Ok(o)
}
