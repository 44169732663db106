//! Experiment 3: RoPE past its training length, with every scaling.

use posenc::rope::RopeConfig;
use posenc::tensor::rope::Rope;
use posenc_lab::model::EvalScaling;
use posenc_lab::train::Lab;
use posenc_lab::{ScalingKind, ScalingSpec};
use serde_json::json;

use super::{eval_points, f4, jnum, verdict3, Ctx, ExpOutput, Experiment, RunSpec, Table};
use crate::report::figures::{Fig, FigSpec, LineSpec};
use crate::CliResult;

pub const EXPERIMENT: Experiment = Experiment {
    id: 3,
    slug: "rope-length",
    source: include_str!("rope.rs"),
    config: |p| json!({"rope": p.rope, "seed": p.seeds[0]}),
    run,
};

/// A RoPE scaling built from a Hugging Face `rope_scaling` object, with
/// `max_position_embeddings` = `max_pos` (the lab's `EvalScaling::new` sets
/// it to L × factor, which leaves dynamic NTK switched off at every length
/// up to L × factor; dynamic NTK needs it at L).
fn scaling(lab: &Lab, name: String, max_pos: usize, rope_scaling: &str) -> CliResult<EvalScaling> {
    let m = &lab.meta.model;
    let json = format!(
        r#"{{"head_dim": {}, "num_attention_heads": {}, "rope_theta": 10000.0, "max_position_embeddings": {max_pos}, "rope_scaling": {rope_scaling}}}"#,
        m.head_dim(),
        m.n_heads,
    );
    let rc = RopeConfig::from_hf_json_str(&json)?;
    Ok(EvalScaling::from_rope(name, Rope::new(rc)?))
}

fn yarn(
    lab: &Lab,
    factor: f64,
    l: usize,
    beta_fast: f64,
    beta_slow: f64,
) -> CliResult<EvalScaling> {
    scaling(
        lab,
        format!("yarn ×{factor}"),
        (l as f64 * factor).ceil() as usize,
        &format!(
            r#"{{"rope_type": "yarn", "factor": {factor}, "original_max_position_embeddings": {l}, "beta_fast": {beta_fast}, "beta_slow": {beta_slow}}}"#
        ),
    )
}

fn dynamic(lab: &Lab, factor: f64, l: usize) -> CliResult<EvalScaling> {
    scaling(
        lab,
        format!("dynamic ×{factor}"),
        l,
        &format!(r#"{{"rope_type": "dynamic", "factor": {factor}}}"#),
    )
}

fn run(ctx: &mut Ctx) -> CliResult<ExpOutput> {
    let p = ctx.preset.rope.clone();
    let seed = ctx.preset.seeds[0];
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
    o.text = format!(
        "Seed 001's quiz: *can a decoder with RoPE trained on 1024 tokens generate 2048?* Only \
         with extrapolation or interpolation. A RoPE language model (head dimension {hd}, \
         base 10000) is trained at L = {l} for {} steps (seed {seed}) and evaluated at {} with: \
         no scaling; Position Interpolation (PI, positions × L/length) zero-shot; PI after {} \
         fine-tuning steps at 2L with factor 2; plain fine-tuning at 2L for the same steps; NTK-aware \
         (base × α^(d/(d−2))); dynamic NTK (the base recomputed from the current length n as base × (f·n/L − (f − 1))^(d/(d−2)) once n > L, as in transformers); and \
         YaRN.\n\n**YaRN's β at small L.** YaRN leaves pairs that turn more than β_fast times \
         over the original context unscaled and fully interpolates those turning fewer than \
         β_slow times. The Hugging Face defaults (β_fast = 32, β_slow = 1) are tuned for L in \
         the thousands: here the pairs turn {} times over L, so with β_fast = 32 {} of {} pairs \
         would be left unscaled and YaRN would reduce to PI with an attention temperature. We \
         use β_fast = {}, β_slow = {} (preset `rope.yarn_beta_*`), which leaves {unscaled} \
         pair(s) unscaled, interpolates {interpolated} fully and ramps the rest — the same \
         split into fast, middle and slow pairs that the defaults make at L = 4096.",
        p.run.steps,
        p.factors.iter().map(|f| (f * l).to_string()).collect::<Vec<_>>().join(", "),
        p.finetune_steps,
        turns.iter().map(|t| format!("{t:.2}")).collect::<Vec<_>>().join(", "),
        default_unscaled,
        turns.len(),
        p.yarn_beta_fast,
        p.yarn_beta_slow,
    );
    ctx.plan(1);
    let mut spec = RunSpec::new("lm", "rope", &p.run, seed);
    spec.eval_lengths = p.factors.iter().map(|f| f * l).collect();
    let (rec, dir) = super::train_run(ctx, &spec)?;
    let lab = Lab::load(&dir)?;
    let lengths = spec.eval_lengths.clone();
    let b = (p.run.eval_batches, p.run.batch);
    let mut curves: Vec<(String, Vec<f64>)> = Vec::new();
    curves.push((
        "no scaling".into(),
        lengths.iter().map(|&n| rec.loss(n)).collect(),
    ));
    for (name, kind) in [
        ("PI zero-shot", "linear"),
        ("NTK", "ntk"),
        ("dynamic NTK", "dynamic"),
        ("YaRN", "yarn"),
    ] {
        let mut v = Vec::new();
        for &f in &p.factors {
            let s = if f == 1 {
                None
            } else if kind == "yarn" {
                Some(yarn(&lab, f as f64, l, p.yarn_beta_fast, p.yarn_beta_slow)?)
            } else if kind == "dynamic" {
                Some(dynamic(&lab, f as f64, l)?)
            } else {
                Some(EvalScaling::new(&lab.meta.model, kind, f as f64, l)?)
            };
            let e = eval_points(&lab, &[f * l], b.0, b.1, s.as_ref())?;
            v.push(e[0].loss.unwrap_or(f64::NAN));
        }
        curves.push((name.into(), v));
    }
    // Fine-tuning at 2L: PI (linear ×2 in training) and plain.
    let ft_len = 2 * l;
    let mut pi = Lab::load(&dir)?;
    let s2 = ScalingSpec::for_length(ScalingKind::Linear, ft_len, l)?;
    super::finetune(&mut pi, Some(s2), ft_len, p.finetune_steps, p.finetune_lr)?;
    let mut v = Vec::new();
    for &f in &p.factors {
        let s = EvalScaling::new(&pi.meta.model, "linear", f.max(2) as f64, l)?;
        v.push(
            eval_points(&pi, &[f * l], b.0, b.1, Some(&s))?[0]
                .loss
                .unwrap_or(f64::NAN),
        );
    }
    curves.push((format!("PI + {} fine-tune steps", p.finetune_steps), v));
    let mut plain = Lab::load(&dir)?;
    super::finetune(&mut plain, None, ft_len, p.finetune_steps, p.finetune_lr)?;
    let v = lengths
        .iter()
        .map(|&n| {
            Ok(eval_points(&plain, &[n], b.0, b.1, None)?[0]
                .loss
                .unwrap_or(f64::NAN))
        })
        .collect::<CliResult<Vec<f64>>>()?;
    curves.push((format!("plain fine-tune ({} steps)", p.finetune_steps), v));
    let unigram = lab
        .task
        .corpus()
        .map(|c| c.unigram_entropy())
        .unwrap_or(f64::NAN);

    let get = |name: &str| {
        curves
            .iter()
            .find(|c| c.0.starts_with(name))
            .map(|c| c.1.clone())
            .unwrap_or_default()
    };
    let last = lengths.len() - 1;
    let none = get("no scaling");
    let pi0 = get("PI zero-shot");
    let ntk = get("NTK");
    let dynm = get("dynamic NTK");
    let yrn = get("YaRN");
    let pift = get("PI +");
    let base = none[0];
    o.claim(
        ctx,
        "no-scaling-blows-up",
        "Without scaling, RoPE's loss blows up past the training length.",
        "seed 001 (quiz); Chen et al. 2023 (PI), Fig. 1 and Table 1",
        "loss at the largest evaluation length / loss at L, no scaling",
        json!({"loss_L": jnum(base), "loss_max": jnum(none[last]), "ratio": jnum(none[last] / base), "max_length": lengths[last]}),
        json!("perplexity > 10^3 past L (Chen et al. Fig. 1)"),
        "reproduced if the ratio ≥ 1.25; partly if ≥ 1.05",
        verdict3(none[last] / base >= 1.25, none[last] / base >= 1.05),
        vec![seed],
    );
    o.claim(
        ctx,
        "pi-zero-shot-finite",
        "Position Interpolation keeps the loss finite zero-shot, below no scaling.",
        "Chen et al. 2023, §2.3 and Table 1",
        "loss at the largest length, PI zero-shot vs no scaling",
        json!({"pi": jnum(pi0[last]), "none": jnum(none[last])}),
        json!("PI finite where extrapolation explodes"),
        "reproduced if PI's loss is finite and lower than no scaling's; partly if finite and within 5% of it",
        verdict3(pi0[last].is_finite() && pi0[last] < none[last], pi0[last].is_finite() && pi0[last] <= 1.05 * none[last]),
        vec![seed],
    );
    let i2 = lengths.iter().position(|&n| n == 2 * l).unwrap_or(last);
    o.claim(
        ctx,
        "pi-finetune-recovers",
        "After a short fine-tune, PI recovers the in-distribution loss at the longer length.",
        "Chen et al. 2023, Table 1 and §3.2 (1000 steps suffice)",
        "loss at 2L after PI fine-tuning vs PI zero-shot and the loss at L",
        json!({"pi_finetuned_2L": jnum(pift[i2]), "pi_zero_shot_2L": jnum(pi0[i2]), "loss_L": jnum(base)}),
        json!("within a few % of the original after ≈1000 steps"),
        "reproduced if the fine-tuned loss at 2L ≤ 1.1 × the loss at L and below PI zero-shot; partly if below PI zero-shot",
        verdict3(pift[i2] <= 1.1 * base && pift[i2] < pi0[i2], pift[i2] < pi0[i2]),
        vec![seed],
    );
    let best_dy = dynm[last].min(yrn[last]);
    let best_other = none[last].min(pi0[last]).min(ntk[last]);
    o.claim(
        ctx,
        "dynamic-yarn-best",
        "Dynamic NTK and YaRN are the best zero-shot scalings past L.",
        "Peng et al. 2023 (YaRN), Table 1 and Fig. 4",
        "loss at the largest length: min(dynamic, YaRN) vs min(no scaling, PI, NTK), all zero-shot",
        json!({"dynamic": jnum(dynm[last]), "yarn": jnum(yrn[last]), "none": jnum(none[last]), "pi": jnum(pi0[last]), "ntk": jnum(ntk[last])}),
        json!("YaRN / dynamic lowest zero-shot perplexity"),
        "reproduced if min(dynamic, YaRN) is the lowest; partly if it is below no scaling and PI",
        verdict3(best_dy <= best_other, best_dy < none[last].min(pi0[last])),
        vec![seed],
    );
    let mut series: Vec<LineSpec> = curves
        .iter()
        .map(|(n, v)| LineSpec {
            name: n.clone(),
            points: lengths
                .iter()
                .zip(v)
                .map(|(&x, &y)| (x as f64, y))
                .collect(),
            markers: true,
        })
        .collect();
    series.push(LineSpec {
        name: "unigram entropy".into(),
        points: lengths.iter().map(|&x| (x as f64, unigram)).collect(),
        markers: false,
    });
    o.figures.push(Fig::new(
        "e3-rope-scaling.png",
        "Experiment 3: validation loss against evaluation length for each RoPE scaling (trained at L).",
        FigSpec::Line {
            title: format!("RoPE trained at L = {l}: loss past L"),
            x_label: "evaluation length".into(),
            y_label: "loss (nats/char)".into(),
            series,
            log_y: true,
        },
    ));
    let mut header = vec!["scaling".to_string()];
    header.extend(lengths.iter().map(|n| format!("{n}")));
    o.tables.push(Table {
        title: "Validation loss per evaluation length".into(),
        header,
        rows: curves
            .iter()
            .map(|(n, v)| {
                let mut r = vec![n.clone()];
                r.extend(v.iter().map(|&x| f4(x)));
                r
            })
            .collect(),
    });
    Ok(o)
}
