//! Experiment 5: length generalisation on copy, reverse, count, addition.

use serde_json::json;

use super::{diverged, jnum, pct, Ctx, ExpOutput, Experiment, RunSpec, Table};
use crate::claims::experiments as rules;
use crate::figures::{BarSpec, Fig, FigSpec};
use crate::Result;

experiment!(
    5,
    "length-generalisation",
    "lengthgen.rs",
    |p| json!({"lengthgen": p.lengthgen, "seed": p.seeds[0]})
);

/// A task's run of `pe`, evaluated at every length.
fn task_spec(p: &crate::preset::LengthGen, task: &str, pe: &str, seed: u64) -> RunSpec {
    let mut spec = RunSpec::new(task, pe, &p.run, seed);
    spec.eval_lengths = p.eval_lengths.clone();
    spec
}

/// Every (task, encoding) run at the preset's first seed.
fn runs(preset: &crate::preset::Preset) -> Vec<RunSpec> {
    let p = &preset.lengthgen;
    p.tasks
        .iter()
        .flat_map(|t| {
            p.encodings
                .iter()
                .map(move |pe| task_spec(p, t, pe, preset.seeds[0]))
        })
        .collect()
}

/// Kazemnejad et al. 2023, Fig. 1: mean reciprocal rank over tasks (APE is
/// the absolute sinusoidal encoding of the original transformer).
const PAPER_MRR: [(&str, f64); 5] = [
    ("nope", 0.69),
    ("t5", 0.55),
    ("alibi", 0.50),
    ("rope", 0.33),
    ("sinusoidal", 0.22),
];

/// Reciprocal ranks (ties share the better rank) of `scores`, higher is better.
fn reciprocal_ranks(scores: &[f64]) -> Vec<f64> {
    scores
        .iter()
        .map(|s| 1.0 / (1 + scores.iter().filter(|t| *t > s).count()) as f64)
        .collect()
}

fn run(ctx: &mut Ctx) -> Result<ExpOutput> {
    let p = ctx.preset.lengthgen.clone();
    let seed = ctx.preset.seeds[0];
    let l = p.run.train_len;
    let mut o = ExpOutput::new(5, "Length generalisation");
    let beyond: Vec<usize> = p.eval_lengths.iter().copied().filter(|&n| n > l).collect();
    o.text = format!(
        "Kazemnejad et al. 2023 trained small decoders on algorithmic tasks at short lengths and \
         tested them on longer ones; ranking the encodings per task by accuracy beyond the \
         training length, NoPE had the best mean reciprocal rank (0.69), then T5 (0.55), ALiBi \
         (0.50), RoPE (0.33) and absolute encodings (0.22). Here: tasks {}, trained at L = {l} \
         ({} steps, d_model {}, {} layers, seed {seed}), exact-match accuracy of the answer at \
         lengths {:?}. The learned table has L rows, so it is scored within its table only and \
         left out of the ranking. The ranking compares the paper's five encodings (APE = \
         sinusoidal); ties share the better rank. Encodings published since (FIRE, Li et \
         al. 2024, an MLP of the log distance built for length generalisation; CoPE, Golovneva \
         et al. 2024, positions counted by gates on the context; forgetting attention, Lin et \
         al. 2025, a data-dependent decay) are trained on the same tasks when the preset lists \
         them and shown beside the others, outside the paper's ranking.",
        p.tasks.join(", "),
        p.run.steps,
        p.run.d_model,
        p.run.layers,
        p.eval_lengths
    );
    ctx.plan(p.tasks.len() * p.encodings.len());
    // acc[task][enc] = (at L, mean beyond L)
    let mut acc: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut records = Vec::new();
    super::train_runs(ctx, &runs(ctx.preset))?;
    for task in &p.tasks {
        let mut row = Vec::new();
        for pe in &p.encodings {
            let (r, _) = super::train_run(ctx, &task_spec(&p, task, pe, seed))?;
            // Lengths a model cannot run at (a learned table's) are left
            // out; a diverged run's NaN stays in.
            let b: Vec<f64> = beyond
                .iter()
                .filter(|&&n| r.diverged.is_some() || r.at(n).is_some_and(|e| e.error.is_none()))
                .map(|&n| r.acc(n))
                .collect();
            let mb = if b.is_empty() {
                f64::NAN
            } else {
                b.iter().sum::<f64>() / b.len() as f64
            };
            row.push((r.acc(l), mb));
            records.push(r);
        }
        acc.push(row);
    }
    let mut header = vec!["task".to_string()];
    header.extend(p.encodings.iter().cloned());
    o.tables.push(Table {
        title: format!("Exact-match accuracy at L = {l} / mean beyond L ({beyond:?})"),
        header,
        rows: p
            .tasks
            .iter()
            .zip(&acc)
            .map(|(t, row)| {
                let mut r = vec![t.clone()];
                r.extend(
                    row.iter()
                        .map(|(a, b)| format!("{} / {}", pct(*a), pct(*b))),
                );
                r
            })
            .collect(),
    });
    o.figures.push(Fig::new(
        "e5-length-generalisation.png",
        "Experiment 5: mean exact-match accuracy beyond the training length, per task and encoding.",
        FigSpec::Bar {
            title: format!("Accuracy beyond L = {l}"),
            groups: p.tasks.clone(),
            y_label: "accuracy beyond L".into(),
            series: p
                .encodings
                .iter()
                .enumerate()
                .filter(|(_, e)| *e != "learned")
                .map(|(j, e)| BarSpec {
                    name: e.clone(),
                    values: acc.iter().map(|row| row[j].1).collect(),
                    errors: None,
                })
                .collect(),
        },
    ));
    // MRR among the paper's encodings that this preset trains, over the
    // tasks that separate them (some encoding above 0 beyond L).
    let ranked: Vec<(usize, f64)> = PAPER_MRR
        .iter()
        .filter_map(|(n, v)| p.encodings.iter().position(|e| e == n).map(|j| (j, *v)))
        .collect();
    if ranked.len() >= 2 {
        let names: Vec<String> = ranked
            .iter()
            .map(|(j, _)| p.encodings[*j].clone())
            .collect();
        let informative: Vec<usize> = (0..acc.len())
            .filter(|&t| ranked.iter().any(|(j, _)| acc[t][*j].1 > 0.0))
            .collect();
        let uninformative: Vec<String> = (0..acc.len())
            .filter(|t| !informative.contains(t))
            .map(|t| p.tasks[t].clone())
            .collect();
        let mut mrr = vec![0.0; ranked.len()];
        for &t in &informative {
            let scores: Vec<f64> = ranked.iter().map(|(j, _)| acc[t][*j].1).collect();
            for (m, r) in mrr.iter_mut().zip(reciprocal_ranks(&scores)) {
                *m += r / informative.len() as f64;
            }
        }
        if informative.is_empty() {
            mrr = vec![f64::NAN; ranked.len()];
        }
        let paper: Vec<f64> = ranked.iter().map(|x| x.1).collect();
        let rho = if informative.is_empty() {
            f64::NAN
        } else {
            posenc::analysis::spearman(&mrr, &paper)
        };
        let nope_i = names.iter().position(|n| n == "nope");
        let (nope_mrr, others): (f64, Vec<f64>) = match nope_i {
            Some(i) => (
                mrr[i],
                mrr.iter()
                    .enumerate()
                    .filter(|(k, _)| *k != i)
                    .map(|(_, m)| *m)
                    .collect(),
            ),
            None => (f64::NAN, mrr.clone()),
        };
        let ranked_runs: Vec<&super::RunRecord> = records
            .iter()
            .filter(|r| names.contains(&r.spec.pe))
            .collect();
        o.claim(
            ctx,
            &rules::RANKING,
            "mean reciprocal rank of accuracy beyond L over the tasks that separate the encodings, and Spearman ρ with the paper's",
            json!({"mrr": names.iter().zip(&mrr).map(|(n, m)| (n.clone(), jnum(*m))).collect::<serde_json::Map<_, _>>(), "spearman": jnum(rho), "tasks_ranked": informative.iter().map(|&t| p.tasks[t].clone()).collect::<Vec<_>>(), "tasks_all_zero_beyond_L": uninformative}),
            json!(PAPER_MRR.iter().map(|(n, v)| (n.to_string(), json!(v))).collect::<serde_json::Map<_, _>>()),
            rules::ranking(nope_mrr, &others, rho, informative.len()),
            vec![seed],
            diverged(ranked_runs),
        );
    }
    // The encodings published since, against RoPE and ALiBi: mean accuracy
    // beyond L over the tasks (one seed).
    let beyond_mean = |j: usize| acc.iter().map(|row| row[j].1).sum::<f64>() / acc.len() as f64;
    let at = |name: &str| p.encodings.iter().position(|e| e == name);
    let newer: Vec<(&str, usize)> = ["fire", "cope", "fox"]
        .into_iter()
        .filter_map(|n| at(n).map(|j| (n, j)))
        .collect();
    if let (false, Some(r), Some(a)) = (newer.is_empty(), at("rope"), at("alibi")) {
        let means: Vec<f64> = newer.iter().map(|&(_, j)| beyond_mean(j)).collect();
        let mut value = serde_json::Map::new();
        for (&(n, _), m) in newer.iter().zip(&means) {
            value.insert(n.into(), jnum(*m));
        }
        value.insert("rope".into(), jnum(beyond_mean(r)));
        value.insert("alibi".into(), jnum(beyond_mean(a)));
        let names: Vec<&str> = newer.iter().map(|x| x.0).chain(["rope", "alibi"]).collect();
        let runs: Vec<&super::RunRecord> = records
            .iter()
            .filter(|r| names.contains(&r.spec.pe.as_str()))
            .collect();
        o.claim(
            ctx,
            &rules::NEWER_GENERALISE,
            "exact-match accuracy beyond L, mean over the tasks, per encoding",
            serde_json::Value::Object(value),
            json!("better length generalisation than RoPE and ALiBi (each paper's own tasks)"),
            rules::newer_generalise(&means, beyond_mean(r), beyond_mean(a)),
            vec![seed],
            diverged(runs),
        );
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ties_share_the_better_rank() {
        assert_eq!(
            super::reciprocal_ranks(&[0.5, 0.9, 0.5, 0.1]),
            vec![0.5, 1.0, 0.5, 0.25]
        );
    }
}
