//! Experiment 3: RoPE past its training length, with every scaling.

use posenc::rope::ScalingKind;
use posenc::rope::{HfRopeConfig, HfRopeParameters, HfRopeParametersField, RopeConfig};
use posenc::tensor::rope::Rope;
use posenc_lab::model::EvalScaling;
use posenc_lab::train::Lab;
use posenc_lab::{FactorScaling, ScalingSpec};
use posenc_viz::sources::QUIZ;
use serde_json::json;

use super::{diverged, f4, jnum, load_for_eval, pm, Ctx, ExpOutput, Experiment, RunSpec, Table};
use crate::claims::experiments as rules;
use crate::claims::Stat;
use crate::figures::{Fig, FigSpec, LineSpec};
use crate::Result;

experiment!(
    3,
    "rope-length",
    "rope.rs",
    |p| json!({"rope": p.rope, "seeds": p.first_seeds(p.rope.n_seeds)})
);

/// The RoPE language models, one per seed, evaluated at L.
fn runs(preset: &crate::preset::Preset) -> Vec<RunSpec> {
    let p = &preset.rope;
    preset
        .first_seeds(p.n_seeds)
        .iter()
        .map(|&seed| {
            let mut spec = RunSpec::new("lm", "rope", &p.run, seed);
            spec.eval_lengths = vec![p.run.train_len];
            spec
        })
        .collect()
}

/// The zero-shot scalings, in table order: name and family (`None`: no
/// scaling).
const ZERO_SHOT: [(&str, Option<FactorScaling>); 5] = [
    ("no scaling", None),
    ("PI zero-shot", Some(FactorScaling::Linear)),
    ("NTK", Some(FactorScaling::Ntk)),
    ("dynamic NTK", Some(FactorScaling::Dynamic)),
    ("YaRN", Some(FactorScaling::Yarn)),
];

/// One model's measurements under one scaling: the loss per position at
/// each factor's length.
type Curves = Vec<posenc_lab::PositionLoss>;

/// A RoPE scaling built from a Hugging Face `rope_scaling` object, with
/// `max_position_embeddings` = `max_pos` (the lab's `EvalScaling::new` sets
/// it to L × factor, which leaves dynamic NTK switched off at every length
/// up to L × factor; dynamic NTK needs it at L).
fn scaling(
    lab: &Lab,
    name: String,
    max_pos: usize,
    rope_scaling: HfRopeParameters,
) -> Result<EvalScaling> {
    let m = &lab.meta.model;
    let hf = HfRopeConfig {
        head_dim: Some(m.head_dim()),
        num_attention_heads: Some(m.n_heads),
        rope_theta: Some(10000.0),
        max_position_embeddings: Some(max_pos),
        rope_scaling: Some(HfRopeParametersField::Flat(Box::new(rope_scaling))),
        ..HfRopeConfig::default()
    };
    let rc = RopeConfig::from_hf(&hf)?;
    Ok(EvalScaling::from_rope(name, Rope::new(rc)?))
}

fn yarn(lab: &Lab, factor: f64, l: usize, beta_fast: f64, beta_slow: f64) -> Result<EvalScaling> {
    scaling(
        lab,
        format!("yarn ×{factor}"),
        (l as f64 * factor).ceil() as usize,
        HfRopeParameters {
            rope_type: Some("yarn".into()),
            factor: Some(factor),
            original_max_position_embeddings: Some(l),
            beta_fast: Some(beta_fast),
            beta_slow: Some(beta_slow),
            ..HfRopeParameters::default()
        },
    )
}

fn dynamic(lab: &Lab, factor: f64, l: usize) -> Result<EvalScaling> {
    scaling(
        lab,
        format!("dynamic ×{factor}"),
        l,
        HfRopeParameters {
            rope_type: Some("dynamic".into()),
            factor: Some(factor),
            ..HfRopeParameters::default()
        },
    )
}

/// The scaling `kind` for evaluation at `f × l` (factor `f`), `None` at
/// f = 1 or for no scaling; YaRN with the preset's β_fast and β_slow.
fn scaling_for(
    lab: &Lab,
    kind: Option<FactorScaling>,
    f: usize,
    l: usize,
    beta: (f64, f64),
) -> Result<Option<EvalScaling>> {
    let factor = f as f64;
    Ok(match kind {
        _ if f == 1 => None,
        None => None,
        Some(FactorScaling::Yarn) => Some(yarn(lab, factor, l, beta.0, beta.1)?),
        Some(FactorScaling::Dynamic) => Some(dynamic(lab, factor, l)?),
        Some(k) => Some(EvalScaling::new(&lab.meta.model, k.with_factor(factor), l)?),
    })
}

fn run(ctx: &mut Ctx) -> Result<ExpOutput> {
    let p = ctx.preset.rope.clone();
    let seeds: Vec<u64> = ctx.preset.first_seeds(p.n_seeds);
    let l = p.run.train_len;
    let mut o = ExpOutput::new(3, "RoPE past its training length");
    let hd = p.run.d_model / p.run.heads;
    let turns: Vec<f64> = (0..hd / 2)
        .map(|i| {
            l as f64 * 10000f64.powf(-2.0 * i as f64 / hd as f64) / (2.0 * std::f64::consts::PI)
        })
        .collect();
    let unscaled = turns.iter().filter(|&&t| t > p.yarn_beta_fast).count();
    let interpolated = turns.iter().filter(|&&t| t < p.yarn_beta_slow).count();
    let default_unscaled = turns.iter().filter(|&&t| t > 32.0).count();
    let lengths: Vec<usize> = p.factors.iter().map(|f| f * l).collect();
    let n_max = *p.factors.iter().max().unwrap_or(&1);
    let tokens = p.run.tokens;
    let unigram = ctx.corpus.tokenized(tokens)?.unigram_entropy;
    let unit = super::loss_unit(tokens);
    o.text =
        format!(
        "From {QUIZ}: *can a decoder with RoPE trained on 1024 tokens generate 2048?* Only \
         with extrapolation or interpolation. RoPE language models (head dimension {hd}, base \
         10000) are trained at L = {l} for {} steps (seeds {seeds:?}) on {}. They are evaluated on \
         validation windows of {} with: no scaling; Position Interpolation (PI, positions × \
         L/length) zero-shot; PI after {} fine-tuning steps at 2L with factor 2; plain \
         fine-tuning at 2L for the same steps; NTK-aware (base × α^(d/(d−2))); dynamic NTK (the \
         base recomputed from the current length n as base × (f·n/L − (f − 1))^(d/(d−2)) once \
         n > L, as in transformers); and YaRN.\n\n**Past L means positions L..nL.** A mean \
         over a whole window of 2L mixes the L positions the model was trained at with the L \
         past them; every \"past L\" number here is the mean loss on positions L..nL of \
         windows of nL only (the lab's `loss_per_position`), and the figure shows the loss at \
         each position with L marked. The loss at L is the unscaled model's on windows of L; the \
         unigram entropy ({unigram:.4} {unit}, tokens {}) is the loss of a model that ignores the context.\n\n\
         **YaRN's β at small L.** YaRN leaves pairs that turn more than β_fast times over the \
         original context unscaled and fully interpolates those turning fewer than β_slow times. \
         The Hugging Face defaults (β_fast = 32, β_slow = 1) are tuned for L in the thousands: \
         here the pairs turn {} times over L, so with β_fast = 32 {} of {} pairs would be left \
         unscaled and YaRN would reduce to PI with an attention temperature. We use β_fast = {}, \
         β_slow = {} (preset `rope.yarn_beta_*`), which leaves {unscaled} pair(s) unscaled, \
         interpolates {interpolated} fully and ramps the rest — the same split into fast, middle \
         and slow pairs that the defaults make at L = 4096.",
        p.run.steps,
        ctx.corpus.description(),
        lengths.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", "),
        p.finetune_steps,
        tokens.label(),
        turns.iter().map(|t| format!("{t:.2}")).collect::<Vec<_>>().join(", "),
        default_unscaled,
        turns.len(),
        p.yarn_beta_fast,
        p.yarn_beta_slow,
    );
    ctx.plan(seeds.len());
    let b = (p.run.eval_batches, p.run.batch);
    let beta = (p.yarn_beta_fast, p.yarn_beta_slow);
    let ft_len = 2 * l;
    let pi_ft_name = format!("PI + {} fine-tune steps", p.finetune_steps);
    let plain_ft_name = format!("plain fine-tune ({} steps)", p.finetune_steps);
    let names: Vec<String> = ZERO_SHOT
        .iter()
        .map(|(n, _)| n.to_string())
        .chain([pi_ft_name.clone(), plain_ft_name.clone()])
        .collect();
    let specs: Vec<RunSpec> = runs(ctx.preset);
    super::train_runs(ctx, &specs)?;
    let mut trained = Vec::new();
    for spec in &specs {
        let (rec, dir) = super::train_run(ctx, spec)?;
        trained.push((rec, dir));
    }
    // Per seed, side by side (one thread each): the loss at L and every
    // scaling's curves at every length; None for a diverged seed.
    let evaluated = super::par_map(ctx, &trained, |(rec, dir)| {
        let Some(lab) = load_for_eval(rec, dir)? else {
            return Ok((f64::NAN, None));
        };
        let curve = |lab: &Lab, n: usize, s: Option<&EvalScaling>| {
            posenc_lab::loss_per_position(lab, n, b.0, b.1, s)
        };
        let at_l = curve(&lab, l, None)?.mean();
        let mut all: Vec<Curves> = Vec::new();
        for (_, kind) in ZERO_SHOT {
            let mut v = Vec::new();
            for &f in &p.factors {
                let s = scaling_for(&lab, kind, f, l, beta)?;
                v.push(curve(&lab, f * l, s.as_ref())?);
            }
            all.push(v);
        }
        // Fine-tuning at 2L on the training text: PI (linear ×2 kept in
        // training) and plain; then evaluated on the validation text.
        let mut pi = Lab::load(dir)?;
        let s2 = ScalingSpec::for_length(FactorScaling::Linear, ft_len, l)?;
        super::finetune(&mut pi, Some(s2), ft_len, p.finetune_steps, p.finetune_lr)?;
        pi.task = pi.task.validation();
        let mut v = Vec::new();
        for &f in &p.factors {
            let s = EvalScaling::new(&pi.meta.model, ScalingKind::Linear(f.max(2) as f64), l)?;
            v.push(curve(&pi, f * l, Some(&s))?);
        }
        all.push(v);
        let mut plain = Lab::load(dir)?;
        super::finetune(&mut plain, None, ft_len, p.finetune_steps, p.finetune_lr)?;
        plain.task = plain.task.validation();
        let mut v = Vec::new();
        for &f in &p.factors {
            v.push(curve(&plain, f * l, None)?);
        }
        all.push(v);
        Ok((at_l, Some(all)))
    })?;
    let (at_l, per_seed): (Vec<f64>, Vec<Option<Vec<Curves>>>) = evaluated.into_iter().unzip();
    let records: Vec<_> = trained.into_iter().map(|(rec, _)| rec).collect();
    let runs_diverged = diverged(&records);
    let at_l_stat = Stat::of(&at_l);
    // past[scaling][factor]: loss on positions L..fL of windows of fL, over
    // seeds (NaN for a diverged seed); whole[..]: the whole window's mean.
    let measure = |si: usize, fi: usize, whole: bool| -> Stat {
        Stat::of(
            &per_seed
                .iter()
                .map(|c| match c {
                    Some(c) => {
                        let pl = &c[si][fi];
                        if whole || p.factors[fi] == 1 {
                            pl.mean()
                        } else {
                            pl.mean_over(l..pl.length)
                        }
                    }
                    None => f64::NAN,
                })
                .collect::<Vec<_>>(),
        )
    };
    let last = p.factors.len() - 1;
    let i2 = p.factors.iter().position(|&f| f == 2);
    let past = |si: usize, fi: usize| measure(si, fi, false);
    let (none, pi0, _ntk, dynm, yrn) = (
        past(0, last),
        past(1, last),
        past(2, last),
        past(3, last),
        past(4, last),
    );
    let pift_2 = i2.map(|i| past(5, i)).unwrap_or(Stat::of(&[]));
    let pi0_2 = i2.map(|i| past(1, i)).unwrap_or(Stat::of(&[]));
    let none_2 = i2.map(|i| past(0, i)).unwrap_or(Stat::of(&[]));
    let num = |s: Stat| json!({"mean": jnum(s.mean), "sd": jnum(s.sd)});
    let max_len = n_max * l;
    o.claim(
        ctx,
        &rules::NO_SCALING_BLOWS_UP,
        &format!("mean loss on positions {l}..{max_len} of validation windows of {max_len}, no scaling, against the loss at L and the unigram entropy"),
        json!({"loss_past_L": num(none), "loss_L": num(at_l_stat), "ratio_to_L": jnum(none.mean / at_l_stat.mean), "unigram": jnum(unigram), "max_length": max_len}),
        json!("perplexity > 10^3 past L (Chen et al. Fig. 1)"),
        rules::no_scaling_blows_up(none.mean, at_l_stat.mean, unigram),
        seeds.clone(),
        runs_diverged.clone(),
    );
    o.claim(
        ctx,
        &rules::PI_ZERO_SHOT_FINITE,
        &format!("mean loss on positions {l}..{max_len} of windows of {max_len}, PI zero-shot vs no scaling (mean ± sd over seeds)"),
        json!({"pi": num(pi0), "none": num(none)}),
        json!("PI finite where extrapolation explodes"),
        rules::pi_zero_shot_finite(pi0, none),
        seeds.clone(),
        runs_diverged.clone(),
    );
    o.claim(
        ctx,
        &rules::PI_FINETUNE_RECOVERS,
        &format!("mean loss on positions {l}..{ft_len} of windows of {ft_len} after PI fine-tuning, vs PI zero-shot there and the loss at L"),
        json!({"pi_finetuned_past_L": num(pift_2), "pi_zero_shot_past_L": num(pi0_2), "loss_L": num(at_l_stat), "ratio_to_L": jnum(pift_2.mean / at_l_stat.mean)}),
        json!("within a few % of the original after ≈1000 steps"),
        rules::pi_finetune_recovers(pift_2, pi0_2, at_l_stat.mean),
        seeds.clone(),
        runs_diverged.clone(),
    );
    o.claim(
        ctx,
        &rules::DYNAMIC_YARN_BEST,
        &format!("mean loss on positions {l}..{max_len} of windows of {max_len}, zero-shot (mean ± sd over seeds)"),
        json!({"dynamic": num(dynm), "yarn": num(yrn), "none": num(none), "pi": num(pi0), "ntk": num(past(2, last))}),
        json!("YaRN / dynamic lowest zero-shot perplexity"),
        rules::dynamic_yarn_best(dynm, yrn, pi0, none),
        seeds.clone(),
        runs_diverged.clone(),
    );
    o.claim(
        ctx,
        &rules::QUIZ_ROPE_NEEDS_INTERPOLATION,
        &format!("mean loss on positions {l}..{ft_len} of windows of {ft_len}: no scaling, and PI after {} fine-tuning steps, against the loss at L", p.finetune_steps),
        json!({"none_past_L": num(none_2), "pi_finetuned_past_L": num(pift_2), "loss_L": num(at_l_stat), "none_ratio": jnum(none_2.mean / at_l_stat.mean), "pi_finetuned_ratio": jnum(pift_2.mean / at_l_stat.mean)}),
        json!(format!("only after extrapolation/interpolation ({QUIZ}); PI + fine-tune recovers (Chen et al.)")),
        rules::quiz_rope_needs_interpolation(none_2, pift_2, at_l_stat.mean),
        seeds.clone(),
        runs_diverged.clone(),
    );
    // Figure: loss against position at the longest length, mean over the
    // seeds, with L marked.
    let mut series: Vec<LineSpec> = Vec::new();
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for (si, name) in names.iter().enumerate() {
        let points: Vec<(f64, f64)> = (0..max_len)
            .map(|t| {
                let v: Vec<f64> = per_seed
                    .iter()
                    .map(|c| c.as_ref().map_or(f64::NAN, |c| c[si][last].loss[t]))
                    .collect();
                (t as f64, Stat::of(&v).mean)
            })
            .collect();
        for &(_, y) in &points {
            if y.is_finite() {
                lo = lo.min(y);
                hi = hi.max(y);
            }
        }
        series.push(LineSpec {
            name: name.clone(),
            points,
            markers: false,
        });
    }
    series.push(LineSpec {
        name: "unigram entropy".into(),
        points: vec![(0.0, unigram), ((max_len - 1) as f64, unigram)],
        markers: false,
    });
    if lo.is_finite() {
        series.push(LineSpec {
            name: format!("L = {l}"),
            points: vec![(l as f64, lo.min(unigram)), (l as f64, hi.max(unigram))],
            markers: false,
        });
    }
    o.figures.push(Fig::new(
        "e3-loss-per-position.png",
        &format!("Experiment 3: validation loss at each position of windows of {max_len} (mean over seeds {seeds:?}) for each RoPE scaling; the model was trained at L = {l} (the vertical line)."),
        FigSpec::Line {
            title: format!("RoPE trained at L = {l}: loss against position"),
            x_label: "position in the window".into(),
            y_label: format!("loss ({unit})"),
            series,
            log_y: false,
        },
    ));
    let mut header = vec!["scaling".to_string(), format!("loss at L = {l}")];
    header.extend(
        p.factors
            .iter()
            .filter(|&&f| f > 1)
            .map(|f| format!("positions {l}..{} of {}", f * l, f * l)),
    );
    o.tables.push(Table {
        title: format!(
            "Validation loss ({unit}, mean ± sd over seeds {seeds:?}); past L: positions L..nL of windows of nL only"
        ),
        header,
        rows: names
            .iter()
            .enumerate()
            .map(|(si, n)| {
                let mut r = vec![n.clone(), pm(if si == 0 { at_l_stat } else { measure(si, 0, true) })];
                r.extend(
                    p.factors
                        .iter()
                        .enumerate()
                        .filter(|(_, &f)| f > 1)
                        .map(|(fi, _)| pm(past(si, fi))),
                );
                r
            })
            .collect(),
    });
    o.tables.push(Table {
        title: "Per seed: loss at L and on positions L..nL at the largest n, no scaling / PI zero-shot / dynamic NTK / YaRN / PI fine-tuned at 2L".into(),
        header: vec![
            "seed".into(),
            "at L".into(),
            "none".into(),
            "PI".into(),
            "dynamic".into(),
            "YaRN".into(),
            "PI + fine-tune (2L)".into(),
        ],
        rows: seeds
            .iter()
            .zip(&per_seed)
            .zip(&at_l)
            .map(|((seed, c), a)| {
                let v = |si: usize, fi: usize| {
                    c.as_ref()
                        .map_or(f64::NAN, |c| c[si][fi].mean_over(l..c[si][fi].length))
                };
                vec![
                    seed.to_string(),
                    f4(*a),
                    f4(v(0, last)),
                    f4(v(1, last)),
                    f4(v(3, last)),
                    f4(v(4, last)),
                    i2.map_or("—".into(), |i| f4(v(5, i))),
                ]
            })
            .collect(),
    });
    Ok(o)
}
