//! Experiment 1: encoders need positions.

use candle_core::{Device, Tensor};
use posenc::analysis::SplitMix64;
use posenc_viz::sources::QUIZ;
use serde_json::json;

use posenc_lab::tasks::MASK_RATE;

use super::{diverged, f4, jnum, pct, Ctx, ExpOutput, Experiment, RunRecord, RunSpec, Table};
use crate::claims::experiments as rules;
use crate::claims::Stat;
use crate::figures::{BarSpec, Fig, FigSpec};
use crate::preset::EncodersMlm;
use crate::Result;

experiment!(
    1,
    "encoders",
    "encoders.rs",
    |p| json!({"encoders": p.encoders, "seeds": p.seeds})
);

/// The order task's run of `pe` at the preset's first seed.
fn order_spec(p: &crate::preset::Encoders, pe: &str, seed: u64) -> RunSpec {
    RunSpec::new("order", pe, &p.run, seed)
}

/// Every run this experiment trains: the order task per encoding, then the
/// masked language models per encoding and seed.
fn runs(preset: &crate::preset::Preset) -> Vec<RunSpec> {
    let p = &preset.encoders;
    let seed = preset.seeds[0];
    let mut v: Vec<RunSpec> = p
        .encodings
        .iter()
        .map(|pe| order_spec(p, pe, seed))
        .collect();
    if let Some(m) = &p.mlm {
        let seeds = preset.first_seeds(m.n_seeds);
        v.extend(super::grid_specs(&m.encodings, &seeds, |pe, s| {
            mlm_spec(m, pe, s)
        }));
    }
    v
}

/// A masked language model's run.
fn mlm_spec(m: &EncodersMlm, pe: &str, seed: u64) -> RunSpec {
    RunSpec::new("mlm", pe, &m.run, seed)
}

/// How the tokens of each sequence are rearranged.
#[derive(Clone, Copy)]
enum Rearrange {
    /// A random permutation.
    Shuffle,
    /// Reversed.
    Reverse,
}

/// Largest change of the pooled output of an untrained encoder with `pe`
/// when the tokens of each sequence are rearranged (4 random sequences).
fn pooled_gap(spec: &RunSpec, how: Rearrange) -> Result<f64> {
    let lab = spec.lab()?;
    let (b, t) = (4, spec.stage.train_len);
    let vocab = lab.meta.model.vocab_size as u64;
    let mut rng = SplitMix64::new(99);
    let x: Vec<Vec<u32>> = (0..b)
        .map(|_| (0..t).map(|_| rng.below(vocab) as u32).collect())
        .collect();
    let mut y = x.clone();
    for row in y.iter_mut() {
        match how {
            Rearrange::Shuffle => {
                for j in (1..t).rev() {
                    row.swap(j, rng.below(j as u64 + 1) as usize);
                }
            }
            Rearrange::Reverse => row.reverse(),
        }
    }
    let gap = || -> std::result::Result<f64, posenc_lab::LabError> {
        let dev = Device::Cpu;
        let px = lab.model.pooled(&Tensor::new(x, &dev)?)?;
        let py = lab.model.pooled(&Tensor::new(y, &dev)?)?;
        let d = (px - py)?.abs()?.flatten_all()?.max(0)?;
        Ok(d.to_scalar::<f32>()? as f64)
    };
    Ok(gap()?)
}

/// Below this change of the pooled output an encoder is blind to the
/// rearrangement (float rounding of a reordered sum is ~1e-7).
const BLIND: f64 = 1e-5;

fn run(ctx: &mut Ctx) -> Result<ExpOutput> {
    let p = ctx.preset.encoders.clone();
    let seed = ctx.preset.seeds[0];
    let mut o = ExpOutput::new(1, "Encoders need positions");
    let l = p.run.train_len;
    o.text = format!(
        "From {QUIZ}: *can BERT work without a positional encoding?* An encoder's attention \
         is bidirectional, so without positions it sees a bag of tokens. **Exact check**: the \
         mean-pooled output of an untrained NoPE encoder is unchanged when the tokens are \
         permuted (to float rounding), while a sinusoidal one changes. **Trained**: the `order` \
         task — a sequence of {l} tokens containing one `A` and one `B`; the class is whether `A` \
         comes first — is unsolvable for a bag of tokens (chance 50%). Each encoding is trained \
         {} steps (d_model {}, {} layers, {} heads, batch {}, seed {seed}) and evaluated on {} \
         fresh batches.",
        p.run.steps, p.run.d_model, p.run.layers, p.run.heads, p.run.batch, p.run.eval_batches
    );
    let gap_nope = pooled_gap(
        &RunSpec::new("order", "nope", &p.run, seed),
        Rearrange::Shuffle,
    )?;
    let gap_sin = pooled_gap(
        &RunSpec::new("order", "sinusoidal", &p.run, seed),
        Rearrange::Shuffle,
    )?;
    o.claim(
        ctx,
        &rules::PERMUTATION_INVARIANCE,
        "max |pooled(x) − pooled(permuted x)| of an untrained encoder, 4 sequences",
        json!({"nope": jnum(gap_nope), "sinusoidal": jnum(gap_sin)}),
        json!("0 for NoPE (exact invariance)"),
        rules::permutation_invariance(gap_nope, gap_sin),
        vec![seed],
        vec![],
    );
    let mlm_seeds: Vec<u64> = p
        .mlm
        .as_ref()
        .map(|m| ctx.preset.first_seeds(m.n_seeds))
        .unwrap_or_default();
    ctx.plan(p.encodings.len() + p.mlm.as_ref().map_or(0, |m| m.encodings.len()) * mlm_seeds.len());
    let mut rows = Vec::new();
    let mut accs = Vec::new();
    let mut records: Vec<RunRecord> = Vec::new();
    let specs: Vec<RunSpec> = p
        .encodings
        .iter()
        .map(|pe| order_spec(&p, pe, seed))
        .collect();
    super::train_runs(ctx, &specs)?;
    for pe in &p.encodings {
        let spec = order_spec(&p, pe, seed);
        let (r, _) = super::train_run(ctx, &spec)?;
        let a = r.acc(l);
        rows.push(vec![pe.clone(), pct(a), f4(r.loss(l))]);
        accs.push((pe.clone(), a));
        records.push(r);
    }
    let nope = accs.iter().position(|(n, _)| n == "nope");
    // Encodings blind to the order by construction: their untrained pooled
    // output does not change when the sequence is reversed, and the order
    // task's label flips under reversal.
    let mut excluded = serde_json::Map::new();
    let mut judged: Vec<(String, f64)> = Vec::new();
    let mut judged_runs = Vec::new();
    for ((pe, a), r) in accs.iter().zip(&records) {
        if pe == "nope" {
            continue;
        }
        let gap = pooled_gap(&RunSpec::new("order", pe, &p.run, seed), Rearrange::Reverse)?;
        if gap <= BLIND {
            let why = if pe == "alibi" {
                "bidirectional ALiBi adds −m·|i − j|, the same for a sequence and its reverse"
            } else {
                "no position term that tells a sequence from its reverse"
            };
            excluded.insert(
                pe.clone(),
                json!(format!(
                    "cannot solve the task by construction: its untrained pooled output is unchanged when the sequence is reversed (max difference {gap:.1e} ≤ {BLIND:e}) and reversing swaps A and B's order ({why}); accuracy {}",
                    pct(*a)
                )),
            );
        } else {
            judged.push((pe.clone(), *a));
            judged_runs.push(r);
        }
    }
    if let Some(i) = nope {
        let n = accs[i].1;
        o.claim(
            ctx,
            &rules::NOPE_NEAR_CHANCE,
            "NoPE accuracy on the order task (chance 50%)",
            json!({"nope_accuracy": jnum(n)}),
            json!("chance (50%)"),
            rules::nope_near_chance(n),
            vec![seed],
            diverged([&records[i]]),
        );
    }
    if !judged.is_empty() || !excluded.is_empty() {
        let acc_map: serde_json::Map<_, _> =
            judged.iter().map(|(n, a)| (n.clone(), jnum(*a))).collect();
        o.claim(
            ctx,
            &rules::POSITIONAL_SOLVE,
            "accuracy of every positional encoding on the order task; encodings blind to the order by construction listed apart",
            json!({"accuracy": acc_map, "excluded_by_construction": excluded}),
            json!("≥ 95% (every encoding)"),
            rules::positional_solve(&judged.iter().map(|x| x.1).collect::<Vec<_>>()),
            vec![seed],
            diverged(judged_runs),
        );
    }
    if !excluded.is_empty() {
        o.text.push_str(&format!(
            "\n\n**Left out of the order-task claim, by construction:** {}.",
            excluded
                .iter()
                .map(|(k, v)| format!("{k} — {}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join("; ")
        ));
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
    let nope_order = nope.map(|i| (accs[i].1, records[i].clone()));
    match &p.mlm {
        Some(m) => masked_lm(ctx, &mut o, m, &mlm_seeds, nope_order)?,
        None => o.text.push_str(
            "\n\nThis preset has no `encoders.mlm` section, so the masked-language-model \
             comparison (and the quiz's first answer) is skipped.",
        ),
    }
    Ok(o)
}

/// One encoding's masked language models: name, per-seed losses, their
/// statistics, mean accuracy, and the runs.
type MlmRow = (String, Vec<f64>, Stat, f64, Vec<RunRecord>);

/// The masked-language-model comparison: every encoding of `m` trained on
/// `mlm` for each seed, validation masked-token loss against the unigram
/// entropy.
fn masked_lm(
    ctx: &mut Ctx,
    o: &mut ExpOutput,
    m: &EncodersMlm,
    seeds: &[u64],
    nope_order: Option<(f64, RunRecord)>,
) -> Result {
    let r = &m.run;
    let l = r.train_len;
    let tokens = r.tokens;
    let unigram = ctx.corpus.tokenized(tokens)?.unigram_entropy;
    let unit = super::loss_unit(tokens);
    o.text.push_str(&format!(
        "\n\n**Masked language modelling** (Haviv et al. 2022 §6 train RoBERTa-large MLMs with \
         and without positions). The `mlm` task: windows of {l} tokens ({}) of the text ({}); {:.0}% of the positions on average (at least \
         one) are replaced by a `[MASK]` token and predicted, by an encoder (bidirectional \
         attention) with a per-token head. All chosen positions become `[MASK]` — BERT's \
         80/10/10 split exists for fine-tuning, which we do not do, and would leave 10% of the \
         targets visible in the input. Without positions every `[MASK]` of a window has the same \
         input and sees the same bag of characters, so a NoPE encoder must give all of them the \
         same prediction. Each encoding is trained {} steps (d_model {}, {} layers, {} heads, \
         batch {}, seeds {seeds:?}) and evaluated on {} fresh batches: the masked-token loss \
         ({unit} per masked token) and its perplexity, against the unigram entropy {:.4} \
         {unit} (perplexity {:.2}), the loss of a model that ignores context. The presets train \
         the relative encodings, which learn this task within a few hundred steps, and (full \
         preset) the absolute ones, learned and sinusoidal, which need about 2000. The \
         sinusoidal MLM learns only with the token embeddings Vaswani et al.'s \
         implementations use (N(0, 1/d_model), times √d_model, so a token enters level with \
         the unit-amplitude sinusoids; see `posenc_lab::model::token_embedding_recipe`): with \
         GPT-2's N(0, 0.02²) times √d_model the sinusoids are six times louder than the tokens \
         and a 2000-step sinusoidal MLM stayed at the unigram level (2.65 nats, on the lab's \
         synthetic grammar).",
        tokens.label(),
        ctx.corpus.description(),
        100.0 * MASK_RATE,
        r.steps,
        r.d_model,
        r.layers,
        r.heads,
        r.batch,
        r.eval_batches,
        unigram,
        unigram.exp()
    ));
    let mut stats: Vec<MlmRow> = Vec::new();
    let grid = super::train_grid(ctx, &m.encodings, seeds, |pe, seed| mlm_spec(m, pe, seed))?;
    for (pe, recs) in grid {
        let losses: Vec<f64> = recs.iter().map(|rec| rec.loss(l)).collect();
        let accs: Vec<f64> = recs.iter().map(|rec| rec.acc(l)).collect();
        let st = Stat::of(&losses);
        stats.push((pe, losses, st, Stat::of(&accs).mean, recs));
    }
    o.tables.push(Table {
        title: format!(
            "Masked language modelling, windows of {l}: validation masked-token loss (nats), mean ± sd over {} seed(s)",
            seeds.len()
        ),
        header: vec![
            "encoding".into(),
            "loss".into(),
            "sd".into(),
            "perplexity".into(),
            "all masks right".into(),
            "per seed".into(),
        ],
        rows: stats
            .iter()
            .map(|(pe, ls, st, acc, _)| {
                vec![
                    pe.clone(),
                    f4(st.mean),
                    f4(st.sd),
                    f4(st.mean.exp()),
                    pct(*acc),
                    ls.iter().map(|x| f4(*x)).collect::<Vec<_>>().join(", "),
                ]
            })
            .chain(std::iter::once(vec![
                "unigram (no context)".into(),
                f4(unigram),
                "—".into(),
                f4(unigram.exp()),
                "—".into(),
                "—".into(),
            ]))
            .collect(),
    });
    let mut groups: Vec<String> = stats.iter().map(|s| s.0.clone()).collect();
    groups.push("unigram".into());
    let mut values: Vec<f64> = stats.iter().map(|s| s.2.mean).collect();
    values.push(unigram);
    let mut errors: Vec<f64> = stats.iter().map(|s| s.2.sd).collect();
    errors.push(0.0);
    o.figures.push(Fig::new(
        "e1-mlm-loss.png",
        &format!(
            "Experiment 1: masked-language-model validation loss per encoding (mean ± sd over {} seed(s)) and the unigram entropy (a model that ignores context).",
            seeds.len()
        ),
        FigSpec::Bar {
            title: "Masked language modelling: loss on the masked tokens".into(),
            groups,
            y_label: format!("masked-token loss ({unit})"),
            series: vec![BarSpec {
                name: "loss".into(),
                values,
                errors: Some(errors),
            }],
        },
    ));
    let Some(nope) = stats.iter().find(|s| s.0 == "nope") else {
        return Ok(());
    };
    let positional: Vec<&MlmRow> = stats.iter().filter(|s| s.0 != "nope").collect();
    if positional.is_empty() {
        return Ok(());
    }
    let pos_means: Vec<f64> = positional.iter().map(|s| s.2.mean).collect();
    let pos_mean = pos_means.iter().sum::<f64>() / pos_means.len() as f64;
    let worst_pos = pos_means.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let frac = rules::unigram_fraction(nope.2.mean, pos_mean, unigram);
    let runs_diverged = diverged(stats.iter().flat_map(|s| &s.4));
    let mut value = serde_json::Map::new();
    value.insert("unigram_loss".into(), jnum(unigram));
    value.insert("nope_loss".into(), jnum(nope.2.mean));
    value.insert("nope_perplexity".into(), jnum(nope.2.mean.exp()));
    value.insert("positional_mean_loss".into(), jnum(pos_mean));
    value.insert("positional_worst_loss".into(), jnum(worst_pos));
    value.insert("fraction_to_unigram".into(), jnum(frac));
    value.insert(
        "loss_ratio_nope_to_positional".into(),
        jnum(nope.2.mean / pos_mean),
    );
    value.insert(
        "perplexity_ratio_nope_to_positional".into(),
        jnum((nope.2.mean - pos_mean).exp()),
    );
    value.insert(
        "loss".into(),
        json!(stats
            .iter()
            .map(|s| (s.0.clone(), jnum(s.2.mean)))
            .collect::<serde_json::Map<_, _>>()),
    );
    o.claim(
        ctx,
        &rules::MLM_NOPE_NEAR_UNIGRAM,
        "masked-token validation loss (nats) per encoding, mean over seeds; fraction = (NoPE − mean of the positional encodings) / (unigram entropy − mean of the positional encodings)",
        serde_json::Value::Object(value),
        json!({"perplexity": {"nope": 147.18, "learned": 4.06, "sinusoidal": 4.07, "alibi": 4.00}, "loss_nats": {"nope": jnum(147.18f64.ln()), "learned": jnum(4.06f64.ln())}}),
        rules::mlm_nope_near_unigram(nope.2.mean, &pos_means, unigram),
        seeds.to_vec(),
        runs_diverged.clone(),
    );
    if let Some((order_acc, order_rec)) = nope_order {
        let mut dv = runs_diverged;
        dv.extend(diverged([&order_rec]));
        let mut all_seeds = seeds.to_vec();
        if !all_seeds.contains(&order_rec.spec.seed) {
            all_seeds.push(order_rec.spec.seed);
        }
        o.claim(
            ctx,
            &rules::QUIZ_ENCODER_FAILS,
            "NoPE's masked-LM fraction toward the unigram level (as in e1.mlm-nope-near-unigram) and NoPE's order-task accuracy",
            json!({"fraction_to_unigram": jnum(frac), "mlm_nope_loss": jnum(nope.2.mean), "mlm_positional_mean_loss": jnum(pos_mean), "unigram_loss": jnum(unigram), "order_nope_accuracy": jnum(order_acc)}),
            json!(format!("BERT without positional encoding does not work well ({QUIZ}); MLM perplexity 147 vs ≈4 with positions (Haviv et al. 2022)")),
            rules::quiz_encoder_fails(nope.2.mean, &pos_means, unigram, order_acc),
            all_seeds,
            dv,
        );
    }
    Ok(())
}
