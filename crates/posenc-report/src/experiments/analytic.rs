//! Experiment 7 (analytic): RoFormer's long-term decay and Position
//! Interpolation's Fig. 2.

use posenc::analysis::SplitMix64;
use serde_json::json;

use super::{f4, jnum, Ctx, ExpOutput, Experiment, Table};
use crate::claims::experiments as rules;
use crate::claims::properties::{roformer_decay, ROFORMER_DECAY};
use crate::figures::{Fig, FigSpec, LineSpec};
use crate::Result;

/// Experiment 7.
pub const EXPERIMENT: Experiment = Experiment {
    id: 7,
    slug: "analytic",
    source: include_str!("analytic.rs"),
    config: |p| json!(p.analytic),
    runs: |_| Vec::new(),
    run,
};

fn run(ctx: &mut Ctx) -> Result<ExpOutput> {
    let p = ctx.preset.analytic.clone();
    let mut o = ExpOutput::new(
        7,
        "Analytic: RoPE's long-term decay and why interpolation beats extrapolation",
    );
    // RoFormer decay.
    let dist: Vec<f64> = (0..=256).map(|r| r as f64).collect();
    let decay = posenc::analysis::rope_decay_bound(128, 10000.0, &dist)?;
    let at = |r: usize| decay[r];
    let paper = ROFORMER_DECAY.map(|(r, v)| (r as usize, v));
    let errs: Vec<f64> = paper.iter().map(|(r, v)| (at(*r) - v).abs() / v).collect();
    let worst = errs.iter().cloned().fold(0.0, f64::max);
    let judged = roformer_decay(paper.map(|(r, _)| at(r)));
    debug_assert_eq!(judged.rule, rules::ROPE_DECAY.rule);
    o.claim(
        ctx,
        &rules::ROPE_DECAY,
        "(1/(d/2)) Σ_j |Σ_{i<j} e^{i r θ_i}| at r = 0, 100, 250",
        json!({"r=0": jnum(at(0)), "r=100": jnum(at(100)), "r=250": jnum(at(250)), "worst_relative_error": jnum(worst)}),
        json!({"r=0": 32.5, "r=100": 10.2, "r=250": 6.6}),
        judged.verdict,
        vec![],
        vec![],
    );
    o.figures.push(Fig::new(
        "e7-rope-decay.png",
        "Experiment 7: RoFormer's long-term decay — the bound on |q·k| against relative distance (d = 128, base 10000).",
        FigSpec::Line {
            title: "RoPE: relative upper bound against distance".into(),
            x_label: "relative distance".into(),
            y_label: "relative upper bound".into(),
            series: vec![LineSpec {
                name: "d = 128, base 10000".into(),
                points: dist.iter().zip(&decay).map(|(&x, &y)| (x, y)).collect(),
                markers: false,
            }],
            log_y: false,
        },
    ));
    // Position Interpolation, Fig. 2.
    let (d, t) = (p.pi_dim, p.pi_trained);
    let theta: Vec<f64> = (0..d / 2)
        .map(|j| 10000f64.powf(-2.0 * j as f64 / d as f64))
        .collect();
    let basis = |s: f64| -> Vec<f64> {
        theta
            .iter()
            .flat_map(|&th| {
                let (sn, c) = (s * th).sin_cos();
                [c, sn]
            })
            .collect()
    };
    let mut rng = SplitMix64::new(7);
    let xs: Vec<Vec<f64>> = (0..=t).map(|s| basis(s as f64)).collect();
    let ys: Vec<f64> = (0..=t).map(|_| 2.0 * rng.uniform() - 1.0).collect();
    let w = posenc::analysis::ridge(&xs, &ys, 1e-9)?;
    let a = |s: f64| basis(s).iter().zip(&w).map(|(b, w)| b * w).sum::<f64>();
    let inside = (0..=t).map(|s| a(s as f64).abs()).fold(0.0, f64::max);
    let interp = (0..2 * t)
        .map(|k| a(k as f64 / 2.0 + 0.25).abs())
        .fold(0.0, f64::max);
    let extrap = (t + 1..=3 * t / 2)
        .map(|s| a(s as f64).abs())
        .fold(0.0, f64::max);
    o.text = format!(
        "**RoFormer's decay.** Su et al. bound |q·k| by max|h_(i+1) − h_i| times \
         (1/(d/2)) Σ_j |S_j|, S_j = Σ_(i<j) e^(i r θ_i), and show that it decays with the \
         relative distance r. Computed in f64 for d = 128, base 10000.\n\n**Position \
         Interpolation, Fig. 2.** An attention score as a function of the relative position, \
         a(s) = Σ_j c_j cos(s θ_j) + d_j sin(s θ_j) (head dimension {d}, base 10000), is fitted by \
         least squares (ridge 1e-9, f64) to random targets in [−1, 1] at the integer \
         positions 0..{t}. Inside the fitted range it stays small; just outside it explodes, \
         while at points between the integers (what interpolation asks for: position s/2 of a \
         context twice as long) it stays bounded. Max |a|: {} on 0..{t}, {} at interpolated \
         points, {} on {}..{}.",
        f4(inside),
        f4(interp),
        f4(extrap),
        t + 1,
        3 * t / 2
    );
    o.claim(
        ctx,
        &rules::PI_FIT,
        "max |a(s)| on the trained integers, at interpolated (quarter/three-quarter) points inside, and on the integers past the range",
        json!({"inside": jnum(inside), "interpolated": jnum(interp), "extrapolated": jnum(extrap), "extrapolated_over_inside": jnum(extrap / inside)}),
        json!({"inside": "≤ 1", "extrapolated": "up to ≈ 8000"}),
        rules::pi_fit(inside, interp, extrap),
        vec![7],
        vec![],
    );
    let step = (t / 256).max(1);
    o.figures.push(Fig::new(
        "e7-pi-fit.png",
        "Experiment 7: Position Interpolation's Fig. 2 — |a(s)| of a least-squares fit on the trained range, past it (integers) and between the integers (interpolation).",
        FigSpec::Line {
            title: format!("Fit on 0..{t}: extrapolation vs interpolation"),
            x_label: "relative position s".into(),
            y_label: "|a(s)|".into(),
            series: vec![
                LineSpec {
                    name: "integers (fit, then extrapolation)".into(),
                    points: (0..=3 * t / 2).step_by(step).map(|s| (s as f64, a(s as f64).abs())).collect(),
                    markers: false,
                },
                LineSpec {
                    name: "between integers (interpolation)".into(),
                    points: (0..t).step_by(step).map(|s| (s as f64 + 0.5, a(s as f64 + 0.5).abs())).collect(),
                    markers: false,
                },
            ],
            log_y: true,
        },
    ));
    o.tables.push(Table {
        title: "RoFormer's bound: ours against the paper's".into(),
        header: vec!["distance".into(), "ours".into(), "paper".into()],
        rows: paper
            .iter()
            .map(|(r, v)| vec![r.to_string(), f4(at(*r)), format!("{v}")])
            .collect(),
    });
    Ok(o)
}
