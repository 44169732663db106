//! Experiment 2: decoders learn positions without them.

use posenc_viz::sources::QUIZ;
use serde_json::json;

use posenc_lab::bpe::Tokenization;

use super::{diverged, f4, jnum, pct, pm, Ctx, ExpOutput, Experiment, RunRecord, RunSpec, Table};
use crate::claims::experiments as rules;
use crate::claims::Stat;
use crate::corpus::Tokenized;
use crate::figures::{BarSpec, Fig, FigSpec, LineSpec};
use crate::preset::{Preset, Stage};
use crate::Result;

experiment!(2, "lm", "lm.rs", |p| json!({"lm": p.lm, "seeds": p.seeds}));

/// Every run this experiment trains: each encoding at the preset's size,
/// the trend's smaller sizes, the second tokenization.
fn runs(p: &Preset) -> Vec<RunSpec> {
    let mut v = super::grid_specs(&p.lm.encodings, &p.seeds, |pe, s| lm_spec(p, pe, s));
    let mut sizes: Vec<(&Stage, &[String])> = Vec::new();
    if let Some(t) = &p.lm.trend {
        sizes.extend(t.sizes.iter().map(|st| (st, &t.encodings[..])));
    }
    if let Some(sec) = &p.lm.second {
        sizes.push((&sec.run, &sec.encodings[..]));
    }
    for (stage, encodings) in sizes {
        v.extend(super::grid_specs(encodings, &p.seeds, |pe, s| {
            size_spec(stage, pe, s)
        }));
    }
    v
}

/// A run of the trend or of the second tokenization: evaluated at its L
/// only.
fn size_spec(stage: &Stage, pe: &str, seed: u64) -> RunSpec {
    RunSpec::new("lm", pe, stage, seed)
}

/// The language-model run shared by experiments 2 and 4 (same spec, so the
/// run cache trains it once): evaluated at L and 2L, the loss per position
/// at 2L, with the probe and the shuffle test.
pub fn lm_spec(p: &Preset, pe: &str, seed: u64) -> RunSpec {
    let mut s = RunSpec::new("lm", pe, &p.lm.run, seed);
    s.eval_lengths = vec![p.lm.run.train_len, 2 * p.lm.run.train_len];
    s.position_lengths = vec![2 * p.lm.run.train_len];
    s.probe_and_shuffle = true;
    s
}

/// Trains every (encoding, seed) of `encodings` at the preset's size
/// (`plan`: also declare the runs to the progress bar).
pub fn lm_runs(
    ctx: &mut Ctx,
    encodings: &[String],
    plan: bool,
) -> Result<Vec<(String, Vec<RunRecord>)>> {
    let p = ctx.preset.clone();
    if plan {
        ctx.plan(encodings.len() * p.seeds.len());
    }
    super::train_grid(ctx, encodings, &p.seeds, |pe, seed| lm_spec(&p, pe, seed))
}

/// Every encoding's runs over the seeds.
type Runs = Vec<(String, Vec<RunRecord>)>;

/// A smaller size of the trend: evaluated at its L only.
fn trend_runs(
    ctx: &mut Ctx,
    stage: &Stage,
    encodings: &[String],
) -> Result<Vec<(String, Vec<RunRecord>)>> {
    let seeds = ctx.preset.seeds.clone();
    super::train_grid(ctx, encodings, &seeds, |pe, seed| {
        size_spec(stage, pe, seed)
    })
}

/// Parameters of a model's blocks (attention and MLP, 12·d² per layer),
/// the size axis of the trend.
fn block_params(s: &Stage) -> usize {
    12 * s.layers * s.d_model * s.d_model
}

/// At one size: NoPE's gap to the best positional encoding (chosen by the
/// mean over seeds), per seed, and the best's name.
fn gap_at(runs: &[(String, Vec<RunRecord>)], l: usize) -> (Stat, String, Vec<f64>) {
    let loss = |rs: &[RunRecord]| rs.iter().map(|r| r.loss(l)).collect::<Vec<f64>>();
    let Some(nope) = runs.iter().find(|r| r.0 == "nope") else {
        return (Stat::of(&[]), String::new(), Vec::new());
    };
    let best = runs.iter().filter(|r| r.0 != "nope").min_by(|a, b| {
        Stat::of(&loss(&a.1))
            .mean
            .total_cmp(&Stat::of(&loss(&b.1)).mean)
    });
    let Some(best) = best else {
        return (Stat::of(&[]), String::new(), Vec::new());
    };
    let gaps: Vec<f64> = loss(&nope.1)
        .iter()
        .zip(loss(&best.1))
        .map(|(n, b)| n - b)
        .collect();
    (Stat::of(&gaps), best.0.clone(), gaps)
}

/// The unit of a loss in `tokens`.
fn unit_of(tokens: Tokenization) -> &'static str {
    if tokens.is_chars() {
        "nats per character"
    } else {
        "nats per token"
    }
}

/// "characters (75 distinct)" or "byte-level BPE tokens (vocabulary 1024,
/// 3.61 characters per token, trained on the training part only)".
fn tokens_phrase(tk: &Tokenized) -> String {
    if tk.tokens == "chars" {
        format!("characters ({} distinct)", tk.vocab)
    } else {
        format!(
            "byte-level BPE tokens (vocabulary {}, {:.2} characters per token, the tokenizer trained on the training part only)",
            tk.vocab, tk.chars_per_token
        )
    }
}

/// One tokenization's NoPE-against-the-best numbers at length `l`.
struct Side {
    tokens: String,
    vocab: usize,
    chars_per_token: f64,
    l: usize,
    unigram: f64,
    unigram_bpc: f64,
    nope: Stat,
    nope_bpc: f64,
    best: String,
    best_loss: Stat,
    best_bpc: f64,
    closed: f64,
    gap: Stat,
}

impl Side {
    fn json(&self) -> serde_json::Value {
        json!({
            "tokens": self.tokens, "vocabulary": self.vocab, "chars_per_token": jnum(self.chars_per_token),
            "train_len_tokens": self.l, "unigram": jnum(self.unigram), "unigram_bits_per_char": jnum(self.unigram_bpc),
            "nope": jnum(self.nope.mean), "nope_sd": jnum(self.nope.sd), "nope_bits_per_char": jnum(self.nope_bpc),
            "best": self.best, "best_loss": jnum(self.best_loss.mean), "best_bits_per_char": jnum(self.best_bpc),
            "closed_fraction": jnum(self.closed), "gap": jnum(self.gap.mean), "gap_sd": jnum(self.gap.sd),
        })
    }
}

/// NoPE against the best positional encoding of `runs` at `l`, in the
/// tokenization `tk`.
fn side(runs: &[(String, Vec<RunRecord>)], l: usize, tk: &Tokenized) -> Side {
    let (gap, best, _) = gap_at(runs, l);
    let of = |name: &str, f: &dyn Fn(&RunRecord) -> f64| {
        runs.iter()
            .find(|r| r.0 == name)
            .map(|r| Stat::of(&r.1.iter().map(f).collect::<Vec<_>>()))
            .unwrap_or(Stat::of(&[]))
    };
    let nope = of("nope", &|r| r.loss(l));
    let best_loss = of(&best, &|r| r.loss(l));
    Side {
        tokens: tk.tokens.clone(),
        vocab: tk.vocab,
        chars_per_token: tk.chars_per_token,
        l,
        unigram: tk.unigram_entropy,
        unigram_bpc: tk.unigram_bits_per_char,
        nope,
        nope_bpc: of("nope", &|r| r.bpc(l)).mean,
        best_bpc: of(&best, &|r| r.bpc(l)).mean,
        closed: rules::closed_fraction(tk.unigram_entropy, nope.mean, best_loss.mean),
        best,
        best_loss,
        gap,
    }
}

fn run(ctx: &mut Ctx) -> Result<ExpOutput> {
    let p = ctx.preset.clone();
    let l = p.lm.run.train_len;
    let mut o = ExpOutput::new(2, "Decoders learn positions without them");
    let tokens = p.lm.run.tokens;
    let tk = ctx.corpus.tokenized(tokens)?;
    let unigram = tk.unigram_entropy;
    let unit = unit_of(tokens);
    o.text = format!(
        "From {QUIZ}: *can GPT work without a positional encoding?* A causal decoder can \
         count: position t attends to t + 1 tokens, so it can infer where it is. Language \
         modelling on {}, in {} ({}); context {l} tokens (about {:.0} characters), d_model {}, \
         {} layers, {} steps, seeds {:?}; validation loss on windows of the validation text, \
         against the unigram entropy {:.4} {unit} (the loss of a model that ignores context; \
         {:.4} bits per character). Every loss is also given in bits per character (the \
         window's total nats over its characters, / ln 2), the unit every tokenization shares. \
         Then, per model: a ridge probe of the absolute position from the activations after \
         the embedding and after each block (Haviv et al. 2022 §4), and the shuffle test: loss \
         on the last L/4 tokens with the prefix in order or shuffled, against the unigram \
         entropy.",
        ctx.corpus.description(),
        tokens_phrase(&tk),
        tokens.label(),
        l as f64 * tk.chars_per_token,
        p.lm.run.d_model,
        p.lm.run.layers,
        p.lm.run.steps,
        p.seeds,
        unigram,
        tk.unigram_bits_per_char,
    );
    if let Some(t) = &p.lm.trend {
        o.text.push_str(&format!(
            "\n\n**NoPE's gap with scale.** Haviv et al. find NoPE's gap to the positional \
             models narrowing as the models grow, so the same run is repeated at {} smaller \
             size(s) ({}) with {}; at every size the gap is NoPE's validation loss minus the \
             best of those positional encodings', per seed.",
            t.sizes.len(),
            t.sizes
                .iter()
                .map(|s| format!(
                    "d_model {}, {} layer(s), {} steps",
                    s.d_model, s.layers, s.steps
                ))
                .collect::<Vec<_>>()
                .join("; "),
            t.encodings.join(", ")
        ));
    }
    let trend_total =
        p.lm.trend
            .as_ref()
            .map_or(0, |t| t.sizes.len() * t.encodings.len());
    let second_total = p.lm.second.as_ref().map_or(0, |s| s.encodings.len());
    ctx.plan((p.lm.encodings.len() + trend_total + second_total) * p.seeds.len());
    let runs = lm_runs(ctx, &p.lm.encodings, false)?;
    let stats: Vec<(String, f64, f64)> = runs
        .iter()
        .map(|(pe, rs)| {
            let st = Stat::of(&rs.iter().map(|r| r.loss(l)).collect::<Vec<_>>());
            (pe.clone(), st.mean, st.sd)
        })
        .collect();
    o.tables.push(Table {
        title: format!(
            "Validation loss at length {l} ({unit}, tokens {}), mean ± sd over seeds, and in bits per character",
            tokens.label()
        ),
        header: vec![
            "encoding".into(),
            "loss".into(),
            "sd".into(),
            "bits/char".into(),
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
                    f4(Stat::of(&rs.iter().map(|r| r.bpc(l)).collect::<Vec<_>>()).mean),
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
            y_label: format!("loss ({unit})"),
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
        .filter(|s| s.0 != "nope")
        .min_by(|a, b| a.1.total_cmp(&b.1));
    // The trend with scale: smaller sizes, then this one.
    let mut sizes: Vec<(Stage, Runs)> = Vec::new();
    if let Some(t) = p.lm.trend.clone() {
        for st in &t.sizes {
            sizes.push((st.clone(), trend_runs(ctx, st, &t.encodings)?));
        }
        let largest: Vec<(String, Vec<RunRecord>)> = runs
            .iter()
            .filter(|r| t.encodings.contains(&r.0))
            .cloned()
            .collect();
        sizes.push((p.lm.run.clone(), largest));
    }
    let gaps: Vec<(Stat, String, Vec<f64>)> = sizes
        .iter()
        .map(|(st, rs)| gap_at(rs, st.train_len))
        .collect();
    let trend_diverged = diverged(sizes.iter().flat_map(|s| &s.1).flat_map(|r| &r.1));
    if !sizes.is_empty() {
        o.tables.push(Table {
            title: format!("NoPE's gap to the best positional encoding at each size (validation loss at L, {unit}; gap mean ± sd over seeds)"),
            header: vec![
                "size".into(),
                "block parameters".into(),
                "steps".into(),
                "NoPE".into(),
                "best positional".into(),
                "gap".into(),
                "gap per seed".into(),
            ],
            rows: sizes
                .iter()
                .zip(&gaps)
                .map(|((st, rs), (g, best, per_seed))| {
                    let mean_of = |name: &str| {
                        rs.iter()
                            .find(|r| r.0 == name)
                            .map(|r| {
                                Stat::of(&r.1.iter().map(|x| x.loss(st.train_len)).collect::<Vec<_>>())
                            })
                            .unwrap_or(Stat::of(&[]))
                    };
                    vec![
                        format!("d_model {}, {} layers, {} heads", st.d_model, st.layers, st.heads),
                        block_params(st).to_string(),
                        st.steps.to_string(),
                        pm(mean_of("nope")),
                        format!("{best}: {}", pm(mean_of(best))),
                        pm(*g),
                        per_seed.iter().map(|x| f4(*x)).collect::<Vec<_>>().join(", "),
                    ]
                })
                .collect(),
        });
        o.figures.push(Fig::new(
            "e2-nope-gap.png",
            "Experiment 2: NoPE's validation loss minus the best positional encoding's, against model size (mean ± sd over seeds as three lines).",
            FigSpec::Line {
                title: "NoPE's gap to the best positional encoding".into(),
                x_label: "block parameters (12 · layers · d_model²)".into(),
                y_label: format!("gap ({unit})"),
                series: [("mean", 0.0), ("mean + sd", 1.0), ("mean − sd", -1.0)]
                    .iter()
                    .map(|(name, k)| LineSpec {
                        name: name.to_string(),
                        points: sizes
                            .iter()
                            .zip(&gaps)
                            .map(|((st, _), (g, _, _))| (block_params(st) as f64, g.mean + k * g.sd))
                            .collect(),
                        markers: *k == 0.0,
                    })
                    .collect(),
                log_y: false,
            },
        ));
    } else {
        o.text.push_str(
            "\n\nThis preset has no `lm.trend` section: NoPE's gap is measured at one size only, so its trend with scale is not measured (e2.nope-close cannot be reproduced without it).",
        );
    }
    // Both tokenizations side by side.
    let first_side = side(&runs, l, &tk);
    let mut second_side = None;
    if let Some(sec) = p.lm.second.clone() {
        let stk = ctx.corpus.tokenized(sec.run.tokens)?;
        let sruns = trend_runs(ctx, &sec.run, &sec.encodings)?;
        second_side = Some((side(&sruns, sec.run.train_len, &stk), sec.run.clone()));
        o.text.push_str(&format!(
            "\n\n**Both tokenizations.** The same comparison in {} ({}): context {} tokens, \
             d_model {}, {} layers, {} steps, with {}; each tokenization's closed fraction is \
             measured against its own unigram baseline. The claims' verdicts are those of the \
             first tokenization ({}); the numbers of both are in each claim.",
            tokens_phrase(&stk),
            sec.run.tokens.label(),
            sec.run.train_len,
            sec.run.d_model,
            sec.run.layers,
            sec.run.steps,
            sec.encodings.join(", "),
            tokens.label(),
        ));
    } else {
        o.text.push_str(&format!(
            "\n\nThis preset has no `lm.second` section: only {} tokens are measured.",
            tokens.label()
        ));
    }
    let sides: Vec<&Side> = std::iter::once(&first_side)
        .chain(second_side.as_ref().map(|s| &s.0))
        .collect();
    o.tables.push(Table {
        title: "NoPE against the best positional encoding, per tokenization (validation at L, mean over seeds; nats per token and bits per character)".into(),
        header: [
            "tokens",
            "vocabulary",
            "chars/token",
            "L (tokens)",
            "unigram",
            "NoPE",
            "best positional",
            "closed fraction",
            "gap (nats/token)",
            "unigram bits/char",
            "NoPE bits/char",
            "best bits/char",
        ]
        .map(String::from)
        .to_vec(),
        rows: sides
            .iter()
            .map(|sd| {
                vec![
                    sd.tokens.clone(),
                    sd.vocab.to_string(),
                    format!("{:.2}", sd.chars_per_token),
                    sd.l.to_string(),
                    f4(sd.unigram),
                    pm(sd.nope),
                    format!("{}: {}", sd.best, pm(sd.best_loss)),
                    pct(sd.closed),
                    pm(sd.gap),
                    f4(sd.unigram_bpc),
                    f4(sd.nope_bpc),
                    f4(sd.best_bpc),
                ]
            })
            .collect(),
    });
    // Each claim carries both tokenizations' numbers, flat.
    let both = |mut v: serde_json::Value| {
        let m = v.as_object_mut().expect("an object");
        m.insert("nope_bits_per_char".into(), jnum(first_side.nope_bpc));
        m.insert("best_bits_per_char".into(), jnum(first_side.best_bpc));
        if let Some((sd, _)) = &second_side {
            for (k, x) in sd.json().as_object().expect("an object") {
                m.insert(format!("second_{k}"), x.clone());
            }
        }
        v
    };
    if let (Some(n), Some(b)) = (nope, best) {
        let closed = rules::closed_fraction(unigram, n.1, b.1);
        let main_runs: Vec<&RunRecord> = runs
            .iter()
            .filter(|r| r.0 == "nope" || r.0 == b.0)
            .flat_map(|r| &r.1)
            .collect();
        let mut dv = diverged(main_runs);
        dv.extend(trend_diverged.iter().cloned());
        dv.dedup();
        let (first, last) = match (gaps.first(), gaps.last()) {
            (Some(f), Some(l)) if gaps.len() >= 2 => (f.0, l.0),
            _ => (Stat::of(&[]), Stat::of(&[])),
        };
        o.claim(
            ctx,
            &rules::NOPE_CLOSE,
            "closed fraction of the unigram-to-best gap at the largest size, and NoPE's gap to the best at the smallest and largest sizes (nats)",
            both(json!({"tokens": tokens.label(), "nope": jnum(n.1), "best": b.0, "best_loss": jnum(b.1), "unigram": jnum(unigram), "closed_fraction": jnum(closed), "relative_gap": jnum((n.1 - b.1) / b.1), "gap_smallest": jnum(first.mean), "gap_smallest_sd": jnum(first.sd), "gap_largest": jnum(last.mean), "gap_largest_sd": jnum(last.sd), "sizes": gaps.len()})),
            json!("within a few % in perplexity (Haviv et al. Table 1), the gap narrowing with scale"),
            rules::nope_close(closed, first, last),
            p.seeds.clone(),
            dv.clone(),
        );
        if gaps.len() >= 2 {
            o.claim(
                ctx,
                &rules::NOPE_GAP_SHRINKS,
                "NoPE's validation loss minus the best positional encoding's (nats, per seed) at each size, smallest first",
                both(json!({"tokens": tokens.label(), "sizes": sizes
                    .iter()
                    .zip(&gaps)
                    .map(|((st, _), (g, best, _))| json!({"block_parameters": block_params(st), "best": best, "gap": jnum(g.mean), "sd": jnum(g.sd)}))
                    .collect::<Vec<_>>()})),
                json!("the gap narrows from 125M to 1.3B parameters (Haviv et al. 2022)"),
                rules::nope_gap_shrinks(&gaps.iter().map(|g| g.0).collect::<Vec<_>>()),
                p.seeds.clone(),
                trend_diverged.clone(),
            );
        }
        o.claim(
            ctx,
            &rules::QUIZ_DECODER_WORKS,
            "fraction of the gap between the unigram entropy and the best positional encoding's validation loss that NoPE closes (largest size, mean over seeds)",
            both(json!({"tokens": tokens.label(), "nope": jnum(n.1), "best": b.0, "best_loss": jnum(b.1), "unigram": jnum(unigram), "closed_fraction": jnum(closed)})),
            json!(format!("GPT works without positional encoding ({QUIZ}); NoPE within a few % of the positional models (Haviv et al. Table 1)")),
            rules::quiz_decoder_works(closed),
            p.seeds.clone(),
            dv,
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
    let nope_runs: Vec<RunRecord> = runs
        .iter()
        .find(|r| r.0 == "nope")
        .map(|r| r.1.clone())
        .unwrap_or_default();
    if let Some(d) = nope_runs.first().and_then(|r| r.diverged_label()) {
        o.claim(
            ctx,
            &rules::PROBE,
            "position-probe error ratios (NoPE, first seed)",
            json!(null),
            json!("embedding layer at baseline; error falls within 1–3 layers"),
            crate::claims::Verdict::Nan,
            vec![p.seeds[0]],
            vec![d],
        );
    }
    if let Some(pr) = nope_runs.first().and_then(|r| r.probe.clone()) {
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
            &rules::PROBE,
            "position-probe mean absolute error / error of predicting the mean, at the embedding layer and the best later layer (NoPE, first seed)",
            json!({"embedding_ratio": jnum(first), "best_later_ratio": jnum(later), "mae": pr.mae.iter().map(|&x| jnum(x)).collect::<Vec<_>>(), "baseline_mae": jnum(pr.baseline_mae)}),
            json!("embedding layer at baseline; error falls within 1–3 layers"),
            rules::probe(first, later),
            vec![p.seeds[0]],
            vec![],
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
        let sh: Vec<_> = rs
            .iter()
            .map(|r| r.shuffle.clone())
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
        let a = Stat::of(&sh.iter().map(|s| s.in_order).collect::<Vec<_>>()).mean;
        let b = Stat::of(&sh.iter().map(|s| s.shuffled).collect::<Vec<_>>()).mean;
        let u = unigram;
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
            &rules::SHUFFLE,
            "(shuffled − in order) / (unigram − in order) for NoPE, mean over seeds",
            json!({"in_order": jnum(ino[i]), "shuffled": jnum(shuf[i]), "unigram": jnum(uni[i]), "fraction": jnum(r)}),
            json!("loss rises toward the unigram level"),
            rules::shuffle(r),
            p.seeds.clone(),
            diverged(&nope_runs),
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
