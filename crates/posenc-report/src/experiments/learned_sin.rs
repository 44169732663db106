//! Experiment 4: learned ≈ sinusoidal in distribution; only sinusoidal runs
//! past the learned table.

use serde_json::json;

use super::{f4, jnum, mean_std, verdict3, Ctx, ExpOutput, Experiment, Table};
use crate::CliResult;

pub const EXPERIMENT: Experiment = Experiment {
    id: 4,
    slug: "learned-vs-sinusoidal",
    source: include_str!("learned_sin.rs"),
    config: |p| json!({"lm": p.lm.run, "seeds": p.seeds}),
    run,
};

fn run(ctx: &mut Ctx) -> CliResult<ExpOutput> {
    let p = ctx.preset.clone();
    let l = p.lm.run.train_len;
    let mut o = ExpOutput::new(4, "Learned ≈ sinusoidal, within the table");
    o.text = format!(
        "Vaswani et al. (Table 3, row E) found learned positional embeddings and sinusoids \
         equally good (perplexity 4.92 both). The same language-model runs as experiment 2 \
         (learned table of {l} rows = the training length), seeds {:?}; then both at 2L = {}: \
         the learned table has no rows there, the sinusoid is defined everywhere.",
        p.seeds,
        2 * l
    );
    let runs = super::lm::lm_runs(ctx, &["learned".to_string(), "sinusoidal".to_string()])?;
    let st =
        |i: usize, len: usize| mean_std(&runs[i].1.iter().map(|r| r.loss(len)).collect::<Vec<_>>());
    let (ml, sl) = st(0, l);
    let (ms, ss) = st(1, l);
    let diff = (ml - ms).abs();
    let tol = (2.0 * sl.max(ss)).max(0.02 * ms);
    o.claim(
        ctx,
        "in-distribution",
        "Learned and sinusoidal absolute encodings are equally good within the training length.",
        "Vaswani et al. 2017, Table 3 row E (PPL 4.92 vs 4.92)",
        "mean validation loss at L over seeds, learned vs sinusoidal",
        json!({"learned": jnum(ml), "learned_sd": jnum(sl), "sinusoidal": jnum(ms), "sinusoidal_sd": jnum(ss), "abs_diff": jnum(diff)}),
        json!({"learned_ppl": 4.92, "sinusoidal_ppl": 4.92}),
        "reproduced if |difference| ≤ max(2 × the larger sd, 2% of sinusoidal's loss); partly if ≤ 5% of it",
        verdict3(diff <= tol, diff <= 0.05 * ms),
        p.seeds.clone(),
    );
    let learned_err = runs[0].1[0]
        .at(2 * l)
        .and_then(|e| e.error.clone())
        .unwrap_or_default();
    let (ms2, _) = st(1, 2 * l);
    o.claim(
        ctx,
        "past-the-table",
        "Past the learned table only the sinusoidal encoding can run at all.",
        "Vaswani et al. 2017, §3.5",
        "whether each model runs at 2L, and sinusoidal's loss there",
        json!({"learned_runs": learned_err.is_empty(), "learned_error": learned_err, "sinusoidal_loss_2L": jnum(ms2), "sinusoidal_loss_L": jnum(ms)}),
        json!("learned: undefined past its table; sinusoidal: defined"),
        "reproduced if the learned model refuses 2L and the sinusoidal one returns a finite loss; else not reproduced",
        verdict3(!learned_err.is_empty() && ms2.is_finite(), false),
        p.seeds.clone(),
    );
    o.tables.push(Table {
        title: "Validation loss (mean ± sd over seeds)".into(),
        header: vec![
            "encoding".into(),
            format!("at L = {l}"),
            format!("at 2L = {}", 2 * l),
        ],
        rows: (0..2)
            .map(|i| {
                let (a, sa) = st(i, l);
                let (b, sb) = st(i, 2 * l);
                let far = if b.is_finite() {
                    format!("{} ± {}", f4(b), f4(sb))
                } else {
                    "cannot run (no table rows)".into()
                };
                vec![runs[i].0.clone(), format!("{} ± {}", f4(a), f4(sa)), far]
            })
            .collect(),
    });
    Ok(o)
}
