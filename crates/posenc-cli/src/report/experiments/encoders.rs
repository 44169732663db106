//! Experiment 1: encoders need positions.

use candle_core::{Device, Tensor};
use posenc::analysis::SplitMix64;
use serde_json::json;

use super::{f4, jnum, pct, verdict3, Ctx, ExpOutput, Experiment, RunSpec, Table};
use crate::report::figures::{BarSpec, Fig, FigSpec};
use crate::CliResult;

pub const EXPERIMENT: Experiment = Experiment {
    id: 1,
    slug: "encoders",
    version: 2,
    config: |p| json!({"encoders": p.encoders, "seeds": p.seeds}),
    run,
};

/// Largest change of the pooled output of an untrained encoder with `pe`
/// when the tokens of each sequence are permuted.
fn permutation_gap(spec: &RunSpec) -> CliResult<f64> {
    let lab = spec.lab()?;
    let (b, t) = (4, spec.stage.train_len);
    let vocab = lab.meta.model.vocab_size as u64;
    let mut rng = SplitMix64::new(99);
    let x: Vec<Vec<u32>> = (0..b)
        .map(|_| (0..t).map(|_| rng.below(vocab) as u32).collect())
        .collect();
    let mut y = x.clone();
    for row in y.iter_mut() {
        for j in (1..t).rev() {
            row.swap(j, rng.below(j as u64 + 1) as usize);
        }
    }
    let gap = || -> Result<f64, posenc_lab::LabError> {
        let dev = Device::Cpu;
        let px = lab.model.pooled(&Tensor::new(x, &dev)?)?;
        let py = lab.model.pooled(&Tensor::new(y, &dev)?)?;
        let d = (px - py)?.abs()?.flatten_all()?.max(0)?;
        Ok(d.to_scalar::<f32>()? as f64)
    };
    Ok(gap()?)
}

fn run(ctx: &mut Ctx) -> CliResult<ExpOutput> {
    let p = ctx.preset.encoders.clone();
    let seed = ctx.preset.seeds[0];
    let mut o = ExpOutput::new(1, "Encoders need positions");
    let l = p.run.train_len;
    o.text = format!(
        "Seed 001's quiz: *can BERT work without a positional encoding?* An encoder's attention \
         is bidirectional, so without positions it sees a bag of tokens. **Exact check**: the \
         mean-pooled output of an untrained NoPE encoder is unchanged when the tokens are \
         permuted (to float rounding), while a sinusoidal one changes. **Trained**: the `order` \
         task — a sequence of {l} tokens containing one `A` and one `B`; the class is whether `A` \
         comes first — is unsolvable for a bag of tokens (chance 50%). Each encoding is trained \
         {} steps (d_model {}, {} layers, {} heads, batch {}, seed {seed}) and evaluated on {} \
         fresh batches. (Haviv et al. 2022 report the same for masked language modelling: NoPE \
         perplexity 147 against 4.1 with positions; we do not train an MLM.)",
        p.run.steps, p.run.d_model, p.run.layers, p.run.heads, p.run.batch, p.run.eval_batches
    );
    let gap_nope = permutation_gap(&RunSpec::new("order", "nope", &p.run, seed))?;
    let gap_sin = permutation_gap(&RunSpec::new("order", "sinusoidal", &p.run, seed))?;
    o.claim(
        ctx,
        "permutation-invariance",
        "A NoPE encoder's pooled output is invariant to permutations of its input.",
        "seed 001 (quiz); Haviv et al. 2022 §1",
        "max |pooled(x) − pooled(permuted x)| of an untrained encoder, 4 sequences",
        json!({"nope": jnum(gap_nope), "sinusoidal": jnum(gap_sin)}),
        json!("0 for NoPE (exact invariance)"),
        "reproduced if NoPE's gap ≤ 1e-5 while sinusoidal's is ≥ 1e-3; partly if NoPE's is ≤ 1e-5 only",
        verdict3(gap_nope <= 1e-5 && gap_sin >= 1e-3, gap_nope <= 1e-5),
        vec![seed],
    );
    ctx.plan(p.encodings.len());
    let mut rows = Vec::new();
    let mut accs = Vec::new();
    for pe in &p.encodings {
        let spec = RunSpec::new("order", pe, &p.run, seed);
        let (r, _) = super::train_run(ctx, &spec)?;
        let a = r.acc(l);
        rows.push(vec![pe.clone(), pct(a), f4(r.loss(l))]);
        accs.push((pe.clone(), a));
    }
    let nope = accs.iter().find(|(n, _)| n == "nope").map(|x| x.1);
    let positional: Vec<&(String, f64)> = accs.iter().filter(|(n, _)| n != "nope").collect();
    let min_pos = positional.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
    let failing: Vec<String> = positional
        .iter()
        .filter(|x| x.1 < 0.95 || x.1.is_nan())
        .map(|x| format!("{} {}", x.0, pct(x.1)))
        .collect();
    if let Some(n) = nope {
        o.claim(
            ctx,
            "nope-near-chance",
            "Without positions an encoder cannot solve an order-sensitive task: NoPE stays near chance.",
            "seed 001 (quiz); Haviv et al. 2022 (MLM perplexity 147 vs 4.1)",
            "NoPE accuracy on the order task (chance 50%)",
            json!({"nope_accuracy": jnum(n)}),
            json!("chance (50%)"),
            "reproduced if accuracy ≤ 60%; partly if ≤ 70%",
            verdict3(n <= 0.60, n <= 0.70),
            vec![seed],
        );
    }
    if !positional.is_empty() {
        o.claim(
            ctx,
            "positional-solve",
            "With any positional encoding the order task is solved (≥ 95%).",
            "seed 001 (quiz); Haviv et al. 2022",
            "accuracy of every positional encoding on the order task",
            json!(accs
                .iter()
                .map(|(n, a)| (n.clone(), jnum(*a)))
                .collect::<serde_json::Map<_, _>>()),
            json!("≥ 95% (every encoding)"),
            "reproduced if every positional encoding reaches ≥ 95%; partly if the worst reaches ≥ 80% or all but one reach 95%",
            verdict3(failing.is_empty(), min_pos >= 0.80 || failing.len() == 1),
            vec![seed],
        );
    }
    o.tables.push(Table {
        title: format!("Order task, length {l}: accuracy after training"),
        header: vec!["encoding".into(), "accuracy".into(), "loss".into()],
        rows,
    });
    o.figures.push(Fig::new(
        "e1-order-accuracy.png",
        "Experiment 1: accuracy on the order task (chance is 50%).",
        FigSpec::Bar {
            title: "Order task: who comes first, A or B?".into(),
            groups: accs.iter().map(|x| x.0.clone()).collect(),
            y_label: "accuracy".into(),
            series: vec![BarSpec {
                name: "accuracy".into(),
                values: accs.iter().map(|x| x.1).collect(),
                errors: None,
            }],
        },
    ));
    Ok(o)
}
