//! Experiment 4: learned ≈ sinusoidal in distribution; only sinusoidal runs
//! past the learned table, and how well it does there.

use serde_json::json;

use super::{diverged, jnum, pm, Ctx, ExpOutput, Experiment, Table};
use crate::claims::experiments as rules;
use crate::claims::Stat;
use crate::figures::{Fig, FigSpec, LineSpec};
use crate::Result;

experiment!(
    4,
    "learned-vs-sinusoidal",
    "learned_sin.rs",
    |p| json!({"lm": p.lm.run, "seeds": p.seeds})
);

/// The encodings this experiment reads (experiment 2's runs of them).
const ENCODINGS: [&str; 2] = ["learned", "sinusoidal"];

/// Experiment 2's language models of [`ENCODINGS`].
fn runs(p: &crate::preset::Preset) -> Vec<super::RunSpec> {
    super::grid_specs(&ENCODINGS.map(String::from), &p.seeds, |pe, s| {
        super::lm::lm_spec(p, pe, s)
    })
}

fn run(ctx: &mut Ctx) -> Result<ExpOutput> {
    let p = ctx.preset.clone();
    let l = p.lm.run.train_len;
    let tokens = p.lm.run.tokens;
    let unigram = ctx.corpus.tokenized(tokens)?.unigram_entropy;
    let unit = super::loss_unit(tokens);
    let mut o = ExpOutput::new(4, "Learned ≈ sinusoidal, within the table");
    o.text = format!(
        "Vaswani et al. (Table 3, row E) found learned positional embeddings and sinusoids \
         equally good (perplexity 4.92 both), and chose the sinusoid because it «may allow the \
         model to extrapolate to sequence lengths longer than the ones encountered during \
         training» (§3.5). The same language-model runs as experiment 2 (learned table of {l} \
         rows = the training length), seeds {:?}; then both at 2L = {}: the learned table has no \
         rows there (it cannot run, by construction), the sinusoid is defined everywhere, and \
         its loss on positions L..2L of validation windows of 2L — the positions it never saw — \
         is compared with its loss at L and the unigram entropy ({unigram:.4} {unit}, tokens {}).",
        p.seeds,
        2 * l,
        tokens.label()
    );
    let runs = super::lm::lm_runs(ctx, &ENCODINGS.map(String::from), true)?;
    let st = |i: usize, f: &dyn Fn(&super::RunRecord) -> f64| {
        Stat::of(&runs[i].1.iter().map(f).collect::<Vec<_>>())
    };
    let learned = st(0, &|r| r.loss(l));
    let sin = st(1, &|r| r.loss(l));
    let all_diverged = diverged(runs.iter().flat_map(|r| &r.1));
    o.claim(
        ctx,
        &rules::IN_DISTRIBUTION,
        "mean validation loss at L over seeds, learned vs sinusoidal",
        json!({"learned": jnum(learned.mean), "learned_sd": jnum(learned.sd), "sinusoidal": jnum(sin.mean), "sinusoidal_sd": jnum(sin.sd), "abs_diff": jnum((learned.mean - sin.mean).abs())}),
        json!({"learned_ppl": 4.92, "sinusoidal_ppl": 4.92}),
        rules::in_distribution(learned, sin),
        p.seeds.clone(),
        all_diverged.clone(),
    );
    let learned_err = runs[0].1[0]
        .at(2 * l)
        .and_then(|e| e.error.clone())
        .unwrap_or_default();
    let sin_2l = st(1, &|r| r.loss(2 * l));
    let sin_past = st(1, &|r| r.loss_over(2 * l, l..2 * l));
    o.claim(
        ctx,
        &rules::PAST_THE_TABLE,
        "whether each model runs at 2L, and sinusoidal's loss there",
        json!({"learned_runs": learned_err.is_empty(), "learned_error": learned_err, "sinusoidal_loss_2L": jnum(sin_2l.mean), "sinusoidal_loss_L": jnum(sin.mean)}),
        json!("learned: undefined past its table; sinusoidal: defined"),
        rules::past_the_table(!learned_err.is_empty(), sin_2l.mean),
        p.seeds.clone(),
        all_diverged.clone(),
    );
    o.claim(
        ctx,
        &rules::SINUSOIDAL_EXTRAPOLATES,
        &format!("sinusoidal model: mean loss on positions {l}..{} of validation windows of {}, its loss at L, the unigram entropy", 2 * l, 2 * l),
        json!({"loss_past_L": jnum(sin_past.mean), "loss_past_L_sd": jnum(sin_past.sd), "loss_L": jnum(sin.mean), "ratio_to_L": jnum(sin_past.mean / sin.mean), "unigram": jnum(unigram)}),
        json!("«may allow the model to extrapolate» (no number given)"),
        rules::sinusoidal_extrapolates(sin_past.mean, sin.mean, unigram),
        p.seeds.clone(),
        diverged(&runs[1].1),
    );
    o.tables.push(Table {
        title: "Validation loss (mean ± sd over seeds)".into(),
        header: vec![
            "encoding".into(),
            format!("at L = {l}"),
            format!("windows of 2L = {}", 2 * l),
            format!("positions {l}..{} of them", 2 * l),
        ],
        rows: (0..2)
            .map(|i| {
                let a = st(i, &|r| r.loss(l));
                let b = st(i, &|r| r.loss(2 * l));
                let c = st(i, &|r| r.loss_over(2 * l, l..2 * l));
                let cannot = |s: Stat| {
                    if s.mean.is_finite() {
                        pm(s)
                    } else {
                        "cannot run (no table rows)".into()
                    }
                };
                vec![runs[i].0.clone(), pm(a), cannot(b), cannot(c)]
            })
            .collect(),
    });
    // The sinusoid's loss per position at 2L, mean over the seeds.
    let curve: Vec<(f64, f64)> = (0..2 * l)
        .map(|t| {
            let v: Vec<f64> = runs[1]
                .1
                .iter()
                .map(|r| r.positions_at(2 * l).map_or(f64::NAN, |p| p.loss[t]))
                .collect();
            (t as f64, Stat::of(&v).mean)
        })
        .collect();
    let top = curve
        .iter()
        .map(|x| x.1)
        .filter(|y| y.is_finite())
        .fold(unigram, f64::max);
    o.figures.push(Fig::new(
        "e4-sinusoidal-per-position.png",
        &format!("Experiment 4: the sinusoidal model's validation loss at each position of windows of 2L = {} (mean over seeds); it was trained at L = {l} (the vertical line).", 2 * l),
        FigSpec::Line {
            title: format!("Sinusoidal, trained at L = {l}: loss against position"),
            x_label: "position in the window".into(),
            y_label: format!("loss ({unit})"),
            series: vec![
                LineSpec { name: "sinusoidal".into(), points: curve, markers: false },
                LineSpec {
                    name: "unigram entropy".into(),
                    points: vec![(0.0, unigram), ((2 * l - 1) as f64, unigram)],
                    markers: false,
                },
                LineSpec {
                    name: format!("L = {l}"),
                    points: vec![(l as f64, 0.0), (l as f64, top)],
                    markers: false,
                },
            ],
            log_y: false,
        },
    ));
    Ok(o)
}
