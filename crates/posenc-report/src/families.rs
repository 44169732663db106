//! Every encoding family's section of the report: formula, values, and
//! measured properties, each judged by a rule of [`crate::claims`] (the
//! rules `posenc analyze` applies too).

use posenc::absolute::floater::{Floater, FloaterConfig, Integrator};
use posenc::absolute::learned::LearnedTable;
use posenc::absolute::sinusoidal::Sinusoidal;
use posenc::analysis;
use posenc::relative::alibi::{alibi_slopes, Alibi, AlibiMode};
use posenc::relative::shaw::Shaw;
use posenc::relative::t5::T5Buckets;
use posenc::rope::{
    HfRopeConfig, HfRopeParameters, HfRopeParametersField, PairLayout, RopeConfig, RopeFrequencies,
};
use posenc::{AbsoluteEncoding, AttentionBias, PositionalEncoding};
use posenc_viz::sources::{INTRO_RU, NOPE_ROPE_RU};
use serde_json::json;

use serde::Serialize;

use crate::claims::{properties as rules, Judged, Judgement, Verdict};
use crate::{cell, compact_json, num, Result};

/// One measured property with its verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Property {
    /// Stable identifier, e.g. `sinusoidal.linear-map`.
    pub id: String,
    /// What was measured, in words.
    pub metric: String,
    /// The measured value(s).
    pub value: serde_json::Value,
    /// The claim, its source, the rule and the verdict.
    #[serde(flatten)]
    pub judgement: Judgement,
}

/// One encoding family's section.
#[derive(Debug, Clone, Serialize)]
pub struct Family {
    /// Identifier, e.g. `sinusoidal`.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Paper(s).
    pub paper: String,
    /// Where the position enters the transformer.
    pub hooks: Vec<String>,
    /// The formula, as plain text.
    pub formula: String,
    /// Markdown body: explanation and a small table of values.
    #[serde(skip)]
    pub body: String,
    /// Measured properties.
    pub properties: Vec<Property>,
}

/// The verdicts of every family's properties.
pub fn verdicts(families: &[Family]) -> impl Iterator<Item = Verdict> + '_ {
    families
        .iter()
        .flat_map(|f| &f.properties)
        .map(|p| p.judgement.verdict)
}

/// The families' part of the report, in Markdown: a summary table, then one
/// section per family.
pub fn markdown(families: &[Family]) -> String {
    let mut s = String::new();
    s.push_str("| family | enters at | properties | verdicts |\n|---|---|---|---|\n");
    for f in families {
        s.push_str(&format!(
            "| [{}](#{}) | {} | {} | {} |\n",
            f.name,
            f.id,
            f.hooks.join(", "),
            f.properties.len(),
            crate::claims::summarize(f.properties.iter().map(|p| p.judgement.verdict))
        ));
    }
    s.push('\n');
    for f in families {
        s.push_str(&format!("<a id=\"{}\"></a>\n## {}\n\n", f.id, f.name));
        s.push_str(&format!(
            "*{}* — enters at: {}.\n\n",
            f.paper,
            f.hooks.join(", ")
        ));
        s.push_str(&format!("```text\n{}\n```\n\n", f.formula.trim_end()));
        s.push_str(f.body.trim_end());
        s.push_str("\n\n");
        if !f.properties.is_empty() {
            s.push_str("| property | measured | rule | verdict |\n|---|---|---|---|\n");
            for p in &f.properties {
                let j = &p.judgement;
                s.push_str(&format!(
                    "| **{}** — {} <br><sub>{}; `{}`</sub> | {} | {} | **{}** |\n",
                    cell(&j.claim),
                    cell(&p.metric),
                    cell(&j.source),
                    p.id,
                    cell(&compact_json(&p.value)),
                    cell(&j.rule),
                    j.verdict.as_str()
                ));
            }
            s.push('\n');
        }
    }
    s
}

/// Every family, in the order of the report.
pub fn all() -> Result<Vec<Family>> {
    Ok(vec![
        nope()?,
        sinusoidal()?,
        learned()?,
        floater()?,
        shaw()?,
        alibi()?,
        t5()?,
        rope()?,
        rope_scalings()?,
    ])
}

/// One property row judged by a shared rule.
fn judged(
    id: &str,
    claim: &str,
    source: &str,
    metric: &str,
    value: serde_json::Value,
    expected: Option<serde_json::Value>,
    judged: Judged,
) -> Property {
    Property {
        id: id.into(),
        metric: metric.into(),
        value,
        judgement: Judgement::new(claim, source, expected, judged),
    }
}

/// A property row with no expected value: reproduced if `holds`, by `rule`.
fn holds(
    id: &str,
    claim: &str,
    source: &str,
    metric: &str,
    value: serde_json::Value,
    rule: &str,
    holds: bool,
) -> Property {
    let verdict = Judged::new(rule, Verdict::from_bool(holds));
    judged(id, claim, source, metric, value, None, verdict)
}

fn sci(v: f64) -> String {
    format!("{v:.2e}")
}

fn hooks_of(e: &dyn PositionalEncoding) -> Vec<String> {
    let h = e.hooks().list();
    if h.is_empty() {
        return vec!["nowhere (no hook)".into()];
    }
    h.iter()
        .map(|h| {
            match h {
                posenc::Hook::Input => "input embeddings",
                posenc::Hook::QueryKey => "queries and keys",
                posenc::Hook::Logits => "attention logits",
                posenc::Hook::Values => "attention values",
            }
            .to_string()
        })
        .collect()
}

fn matrix_md(
    header: &[String],
    rows: &[Vec<f64>],
    row_label: &dyn Fn(usize) -> String,
    prec: usize,
) -> String {
    let body: Vec<Vec<String>> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut l = vec![row_label(i)];
            // Rounding noise (sin π = 1e-16) prints as 0, not -0.000.
            l.extend(r.iter().map(|v| {
                let v = if v.abs() < 0.5 * 10f64.powi(-(prec as i32)) {
                    0.0
                } else {
                    *v
                };
                format!("{v:.prec$}")
            }));
            l
        })
        .collect();
    md_table(header, &body)
}

fn md_table(header: &[String], rows: &[Vec<String>]) -> String {
    let mut s = format!(
        "| {} |\n|{}|\n",
        header.join(" | "),
        vec!["---"; header.len()].join("|")
    );
    for r in rows {
        s.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    s
}

// ---------------------------------------------------------------- NoPE ---

fn nope() -> Result<Family> {
    let enc_gap = analysis::permutation_gap(8, 16, false, 20, 2024);
    let dec_gap = analysis::permutation_gap(8, 16, true, 20, 2024);
    let body = format!(
        "Without any positional encoding, self-attention is a function of the *set* of tokens: \
         \"the mother loves the daughter\" and \"the daughter loves the mother\" give the same \
         outputs, permuted ({INTRO_RU}). We measure it on random single-head attention layers \
         (8 tokens, d = 16, 20 draws, seed 2024): the largest difference between \
         Attn(P·X) and P·Attn(X) is {} for bidirectional attention (an encoder) and {} for \
         causal attention (a decoder). The causal mask itself breaks the symmetry — which is why \
         a decoder without positional encoding can still learn positions (Haviv et al. 2022) \
         while an encoder cannot.\n",
        num(enc_gap, 2),
        num(dec_gap, 2)
    );
    Ok(Family {
        id: "nope".into(),
        name: "NoPE — no positional encoding".into(),
        paper: "Haviv et al. 2022, Transformer Language Models without Positional Encodings Still Learn Positional Information; Kazemnejad et al. 2023".into(),
        hooks: hooks_of(&posenc::nope::NoPe),
        formula: "attention(x_1..x_T) with no position term: Attn(P X) = P Attn(X) for every permutation P (bidirectional)".into(),
        body,
        properties: vec![
            holds(
                "nope.encoder-permutation-equivariant",
                "An encoder without positions cannot see order",
                concat!(posenc_viz::src_intro_ru!(), "; ", posenc_viz::src_nope_rope_ru!(), "; Haviv et al. 2022 §1"),
                "max |Attn(PX) − P·Attn(X)|, bidirectional, 20 random layers",
                json!(enc_gap),
                "reproduced if ≤ 1e-12 (equal up to rounding)",
                enc_gap <= 1e-12,
            ),
            holds(
                "nope.causal-mask-breaks-symmetry",
                "The causal mask alone carries order",
                "Haviv et al. 2022 §5",
                "max |Attn(PX) − P·Attn(X)|, causal, 20 random layers",
                json!(dec_gap),
                "reproduced if ≥ 1e-3 (order changes the output)",
                dec_gap >= 1e-3,
            ),
        ],
    })
}

// ---------------------------------------------------------- sinusoidal ---

fn sinusoidal() -> Result<Family> {
    let seed_table = Sinusoidal::new(16)?;
    let rows = seed_table.table(&(0..6).collect::<Vec<u64>>())?;
    let header: Vec<String> = std::iter::once("pos".to_string())
        .chain((0..8).map(|d| format!("d{d}")))
        .collect();
    let rows8: Vec<Vec<f64>> = rows.iter().map(|r| r[..8].to_vec()).collect();
    let mut body = format!(
        "Each pair of dimensions (2i, 2i+1) is a point turning on a circle at angular speed \
         ω_i = 1/10000^(2i/D): fast in the first columns, slow in the last — like the bits of a \
         binary counter, where the lowest bit flips every step and higher bits ever more slowly \
         ({INTRO_RU}). The first positions of its 32 × 16 table (first 8 of 16 dimensions):\n\n",
    );
    body.push_str(&matrix_md(&header, &rows8, &|i| i.to_string(), 4));

    // The NoPE-and-RoPE post's four-number example: pairs turning at 0.5 and 0.25 cycles per position.
    let pi = std::f64::consts::PI;
    let four = Sinusoidal::with_frequencies(vec![pi, pi / 2.0])?;
    let four_rows: Vec<Vec<f64>> = (0..4u64)
        .map(|p| four.encode(p))
        .collect::<posenc::Result<_>>()?;
    body.push_str(&format!(
        "\nThe four-number example of {NOPE_ROPE_RU}: two pairs turning at 0.5 and 0.25 cycles \
         per position ([sin, cos] of each):\n\n",
    ));
    body.push_str(&matrix_md(
        &[
            "pos".into(),
            "sin π·p".into(),
            "cos π·p".into(),
            "sin π/2·p".into(),
            "cos π/2·p".into(),
        ],
        &four_rows,
        &|i| i.to_string(),
        3,
    ));
    let close =
        |row: &[f64], want: [f64; 4]| row.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12);
    let four_ok =
        close(&four_rows[0], [0.0, 1.0, 0.0, 1.0]) && close(&four_rows[1], [0.0, -1.0, 1.0, 0.0]);

    // Properties, on the D = 128 encoding.
    let d = 128;
    let enc = Sinusoidal::new(d)?;
    let distinct = analysis::distinctness(&enc, 100_000)?;
    // The similarity claim is about the Transformer's own width, D = 512.
    let enc512 = Sinusoidal::new(512)?;
    let ks: Vec<u64> = (0..=100).collect();
    let curve = analysis::similarity_curve(&enc512, 0, &ks)?;
    let mono = curve.monotone_fraction(1e-12);
    let first_up = curve.first_increase(1e-12);
    let kf: Vec<f64> = ks.iter().map(|&k| k as f64).collect();
    let rho = analysis::spearman(&kf, &curve.cosine);
    let shift_dep = analysis::similarity_shift_dependence(
        &enc,
        &[0, 17, 1000, 99_999],
        &(0..=256).collect::<Vec<u64>>(),
    )?;
    let mut lin_worst = 0.0f64;
    for k in [1u64, 7, 100, 1000] {
        let m = enc.linear_map(k as i64)?;
        let r = analysis::linear_map_residual(&enc, &m, k, &[0, 1, 5, 123, 4567, 99_999])?;
        lin_worst = lin_worst.max(r);
    }
    // The same map measured without the formula: least squares on 1000
    // positions p = 0, 41, …, 40959 (two periods of the slowest pair), tested
    // on positions never fitted.
    let small = Sinusoidal::new(16)?;
    let fit_positions: Vec<u64> = (0..1000).map(|i| i * 41).collect();
    let fit = analysis::fit_linear_map(&small, 3, &fit_positions)?;
    let fit_res = analysis::linear_map_residual(&small, &fit, 3, &[100_000, 123_457, 500_001])?;
    let wl = analysis::wavelengths(enc.frequencies());
    let (wmin, wmax) = (wl[0], wl[wl.len() - 1]);
    let wl_dev = rules::ratio_deviation(&wl);
    let two_pi = 2.0 * pi;
    body.push_str(&format!(
        "\nSimilarity of PE(0) and PE(k) for D = 512 (cosine): k = 1: {:.4}, 2: {:.4}, 4: {:.4}, \
         8: {:.4}, 16: {:.4}, 32: {:.4}, 64: {:.4}.\n",
        curve.cosine[1],
        curve.cosine[2],
        curve.cosine[4],
        curve.cosine[8],
        curve.cosine[16],
        curve.cosine[32],
        curve.cosine[64]
    ));

    let props = vec![
        judged(
            "sinusoidal.seed-four-number-example",
            "Pairs turning at 0.5 and 0.25 cycles/position give [0,1,0,1] at 0 and [0,−1,1,0] at 1",
            posenc_viz::src_nope_rope_ru!(),
            "rows 0 and 1 of the table above",
            json!({"p0": four_rows[0], "p1": four_rows[1]}),
            Some(json!({"p0": [0, 1, 0, 1], "p1": [0, -1, 1, 0]})),
            Judged::new(
                "reproduced if both rows equal the seed's within 1e-12",
                Verdict::from_bool(four_ok),
            ),
        ),
        judged(
            "sinusoidal.distinct",
            "Encodings of different positions never repeat",
            concat!(posenc_viz::src_nope_rope_ru!(), ", \"why 10000\""),
            "min ‖PE(k) − PE(0)‖ over k < 10^5, D = 128 (a shift is an isometry, so this is the min over all pairs)",
            json!({"min_distance": distinct.min_distance, "at_k": distinct.argmin}),
            None,
            rules::distinct_positions(distinct.min_distance),
        ),
        judged(
            "sinusoidal.similarity-monotone",
            "Similarity of PE(p) and PE(p+k) decreases as k grows",
            posenc_viz::src_nope_rope_ru!(),
            "cos(PE(0), PE(k)) for k ≤ 100, D = 512: fraction of non-increasing steps, first increase, Spearman ρ(k, cos)",
            json!({"fraction": mono, "first_increase_at": first_up, "spearman": rho}),
            None,
            rules::similarity_monotone(mono, rho),
        ),
        judged(
            "sinusoidal.similarity-relative",
            "PE(p)·PE(p+k) depends on k only",
            "Vaswani et al. 2017 §3.5",
            "max change of PE(p)·PE(p+k) across p ∈ {0, 17, 1000, 99999}, k ≤ 256",
            json!(shift_dep),
            None,
            rules::shift_invariant_similarity(shift_dep),
        ),
        judged(
            "sinusoidal.linear-map",
            "PE(pos+k) is a linear function of PE(pos)",
            concat!("Vaswani et al. 2017 §3.5; ", posenc_viz::src_vaswani_notes!()),
            "max |PE(p+k) − M_k·PE(p)| with M_k block-diagonal rotations, k ∈ {1,7,100,1000}, p up to 99999",
            json!(lin_worst),
            Some(json!(0.0)),
            rules::linear_map(lin_worst),
        ),
        judged(
            "sinusoidal.linear-map-fitted",
            "The same linear map, found without the formula",
            posenc_viz::src_vaswani_notes!(),
            "least-squares M_3 fitted on 1000 positions p = 41·i < 41000 (D = 16), max error on p ∈ {100000, 123457, 500001}",
            json!(fit_res),
            None,
            rules::fitted_linear_map(fit_res),
        ),
        judged(
            "sinusoidal.wavelengths",
            "Wavelengths form a geometric progression from 2π to 10000·2π",
            "Vaswani et al. 2017 §3.5",
            "shortest and longest wavelength (D = 128), in units of 2π, and the largest deviation of consecutive ratios",
            json!({"min_over_2pi": wmin / two_pi, "max_over_2pi": wmax / two_pi, "ratio_deviation": wl_dev}),
            Some(json!({"min_over_2pi": 1.0, "max_over_2pi": 10000.0})),
            rules::geometric_wavelengths(wmin / two_pi, wmax / two_pi, wl_dev, 10000.0, d, 1e-12),
        ),
    ];
    Ok(Family {
        id: "sinusoidal".into(),
        name: "Sinusoidal (absolute)".into(),
        paper: "Vaswani et al. 2017, Attention Is All You Need, §3.5".into(),
        hooks: hooks_of(&enc),
        formula: "PE(pos, 2i)   = sin(pos / 10000^(2i/D))\nPE(pos, 2i+1) = cos(pos / 10000^(2i/D))\n(concatenated layout: [sin … | cos …])".into(),
        body,
        properties: props,
    })
}

// ------------------------------------------------------------- learned ---

fn learned() -> Result<Family> {
    let table = LearnedTable::new(64, 16, 7)?;
    let past = table.encode(64);
    let past_is_error = matches!(past, Err(posenc::Error::PositionOutOfRange { .. }));
    let distinct = analysis::distinctness(&table, 64)?;
    // Untrained rows are random: similarity does not depend on distance.
    let ks: Vec<u64> = (0..32).collect();
    let curve = analysis::similarity_curve(&table, 0, &ks)?;
    let mean_abs_cos =
        curve.cosine[1..].iter().map(|c| c.abs()).sum::<f64>() / (ks.len() - 1) as f64;
    let body = format!(
        "A learned table has one trainable row per position up to `max_positions` (GPT-2, BERT). It \
         can represent anything a sinusoid can, but knows nothing about positions it was not trained \
         on — and nothing at all past its last row: asking for position 64 of a 64-row table is an \
         error in posenc (`{}`), never a silent clamp. Vaswani et al. found it performs like the \
         sinusoidal encoding in distribution (Table 3, row E); the lab reproduces that with trained \
         models. Before training, its rows are random (N(0, 0.02²), seed 7): the mean |cosine| \
         between PE(0) and PE(k), k = 1..31, is {:.3}.\n",
        match &past {
            Err(e) => e.to_string(),
            Ok(_) => "no error".into(),
        },
        mean_abs_cos
    );
    Ok(Family {
        id: "learned".into(),
        name: "Learned absolute".into(),
        paper: "Gehring et al. 2017 (ConvS2S); Vaswani et al. 2017 Table 3 (E); Devlin et al. 2019".into(),
        hooks: hooks_of(&table),
        formula: "PE(pos) = W[pos],  W ∈ R^(max_positions × D) trained with the model; pos ≥ max_positions is undefined".into(),
        body,
        properties: vec![
            holds(
                "learned.no-extrapolation",
                "A learned table cannot encode positions past its last row",
                "Vaswani et al. 2017 §3.5 (why they chose sinusoids)",
                "encode(64) on a 64-row table",
                json!({"is_error": past_is_error}),
                "reproduced if it is a PositionOutOfRange error",
                past_is_error,
            ),
            holds(
                "learned.distinct-at-init",
                "Random rows are distinct positions from the start",
                "posenc",
                "min ‖PE(k) − PE(0)‖, k < 64, seed 7",
                json!(distinct.min_distance),
                "reproduced if > 0.01",
                distinct.min_distance > 0.01,
            ),
        ],
    })
}

// ------------------------------------------------------------- FLOATER ---

fn floater() -> Result<Family> {
    let cfg = FloaterConfig::new(16, 32);
    let rk4 = Floater::random(cfg.with_integrator(Integrator::Rk4), 3)?;
    let reference = rk4.table_f64(64);
    let euler_gap = |steps: usize| -> Result<f64> {
        let e = Floater::random(cfg.with_integrator(Integrator::Euler).with_steps(steps), 3)?;
        Ok(e.table_f64(64)
            .iter()
            .zip(&reference)
            .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
            .fold(0.0f64, f64::max))
    };
    let (g16, g64, g256) = (euler_gap(16)?, euler_gap(64)?, euler_gap(256)?);
    let order = (g64 / g256).log(4.0);
    let gap = g256;
    let distinct = analysis::distinctness(&rk4, 64)?;
    let body = format!(
        "FLOATER treats the position vector as the state of a continuous dynamical system, \
         dp/dt = h(t, p(t); θ), and reads position i at time i·Δt. h is a small network trained with \
         the model, so the encoding is learned yet defined for every position, including ones never \
         seen. posenc integrates it with Euler or RK4 (Δt = {}, {} steps per position for RK4), \
         on candle tensors so that gradients reach θ (the lab trains it). For one random h (seed 3, \
         D = 16), Euler tables with 16, 64 and 256 steps per position differ from the RK4 table by \
         {}, {} and {} over 64 positions: first-order convergence (measured order {:.2}) to one \
         solution.\n",
        cfg.delta_t, cfg.steps_per_position, sci(g16), sci(g64), sci(g256), order
    );
    Ok(Family {
        id: "floater".into(),
        name: "FLOATER (continuous dynamical system)".into(),
        paper: "Liu et al. 2020, Learning to Encode Position for Transformer with Continuous Dynamical Model".into(),
        hooks: hooks_of(&rk4),
        formula: "dp/dt = h(t, p(t); θ),  p(0) = p₀ (learned),  PE(i) = p(i·Δt)\nh(t, p) = W₂ tanh(W₁ [p; t] + b₁) + b₂".into(),
        body,
        properties: vec![
            judged(
                "floater.integrators-agree",
                "The encoding is the solution of an ODE: integrators converge to it",
                "Liu et al. 2020 §3",
                "max |RK4 − Euler(n steps)| over 64 positions × 16 dims for n = 16, 64, 256, and the convergence order log₄(gap₆₄/gap₂₅₆)",
                json!({"gap_16": g16, "gap_64": g64, "gap_256": g256, "order": order}),
                Some(json!({"order": 1.0})),
                Judged::new(
                    "reproduced if the gaps shrink with order within 0.8..1.2 (Euler is first order) and gap_256 ≤ 2e-3",
                    Verdict::from_bool((0.8..=1.2).contains(&order) && gap <= 2e-3),
                ),
            ),
            judged(
                "floater.distinct",
                "Every position gets its own vector",
                "Liu et al. 2020",
                "min ‖PE(k) − PE(0)‖, k < 64 (untrained h)",
                json!(distinct.min_distance),
                None,
                rules::distinct_positions(distinct.min_distance),
            ),
        ],
    })
}

// ---------------------------------------------------------------- Shaw ---

fn shaw() -> Result<Family> {
    let k = 2;
    let sh = Shaw::new(k, 8, 1)?;
    let idx = sh.index_matrix(7, 7, 0, 0)?;
    let shifted = sh.index_matrix(7, 7, 1000, 1000)?;
    let relative_only = idx == shifted;
    let clipped = idx.iter().flatten().all(|&v| v <= 2 * k);
    let rows: Vec<Vec<String>> = idx
        .iter()
        .enumerate()
        .map(|(i, r)| {
            std::iter::once(i.to_string())
                .chain(r.iter().map(|v| format!("{}", *v as i64 - k as i64)))
                .collect()
        })
        .collect();
    let mut body = String::from(
        "Shaw et al. add learned vectors to the keys (in the logits) and to the values, one per \
         clipped relative distance clip(j − i, −k, k): distances beyond k share a vector, so the \
         model generalises to lengths it was not trained on. The clipped distance for k = 2, \
         7 tokens (query i as rows, key j as columns):\n\n",
    );
    body.push_str(&md_table(
        &std::iter::once("i \\ j".to_string())
            .chain((0..7).map(|j| j.to_string()))
            .collect::<Vec<_>>(),
        &rows,
    ));
    Ok(Family {
        id: "shaw".into(),
        name: "Shaw et al. relative positions".into(),
        paper: "Shaw, Uszkoreit & Vaswani 2018, Self-Attention with Relative Position Representations".into(),
        hooks: hooks_of(&sh),
        formula: "e_ij = q_i·(k_j + a^K_ij)/√d,  z_i = Σ_j α_ij (v_j + a^V_ij)\na^K_ij = w^K[clip(j − i, −k, k)],  a^V_ij = w^V[clip(j − i, −k, k)]".into(),
        body,
        properties: vec![holds(
            "shaw.relative-clipped",
            "The representation depends on clip(j − i) only",
            "Shaw et al. 2018 §3.2",
            "index matrix at offset 0 vs 1000, and its range (k = 2, 7 tokens)",
            json!({"shift_invariant": relative_only, "within_clip": clipped}),
            "reproduced if both hold",
            relative_only && clipped,
        )],
    })
}

// --------------------------------------------------------------- ALiBi ---

fn alibi() -> Result<Family> {
    let s8 = alibi_slopes(8)?;
    let s12 = alibi_slopes(12)?;
    // Every slope against 2^(−8h/n), for every power-of-two n up to 64.
    let mut slope_dev = 0.0f64;
    for n in [1usize, 2, 4, 8, 16, 32, 64] {
        for (i, m) in alibi_slopes(n)?.iter().enumerate() {
            let want = 2f64.powf(-8.0 * (i + 1) as f64 / n as f64);
            slope_dev = slope_dev.max((m / want - 1.0).abs());
        }
    }
    let al = Alibi::new(4, AlibiMode::Causal)?;
    let pos: Vec<u64> = (0..5).collect();
    let m = al.bias_matrix(0, &pos, &pos)?;
    let mut shift_dev = 0.0f64;
    for h in 0..4 {
        for (i, j) in [(3u64, 1u64), (10, 2), (7, 7)] {
            let a = al.bias(h, i, j)?;
            let b = al.bias(h, i + 1000, j + 1000)?;
            shift_dev = shift_dev.max((a - b).abs());
        }
    }
    let mut body = String::from(
        "ALiBi adds no vector at all: each head h adds −m_h·(i − j) to the logit of query i and key j, \
         a penalty growing linearly with distance, with head slopes m_h forming a geometric sequence.\n\n",
    );
    body.push_str(&md_table(
        &["heads".into(), "slopes".into()],
        &[
            vec![
                "8".into(),
                s8.iter().map(|v| num(*v, 5)).collect::<Vec<_>>().join(", "),
            ],
            vec![
                "12".into(),
                s12.iter()
                    .map(|v| num(*v, 5))
                    .collect::<Vec<_>>()
                    .join(", "),
            ],
        ],
    ));
    body.push_str("\nCausal bias of head 0 of 4 (slope 0.25), queries as rows:\n\n");
    body.push_str(&matrix_md(
        &std::iter::once("i \\ j".to_string())
            .chain((0..5).map(|j| j.to_string()))
            .collect::<Vec<_>>(),
        &m,
        &|i| i.to_string(),
        2,
    ));
    Ok(Family {
        id: "alibi".into(),
        name: "ALiBi (attention with linear biases)".into(),
        paper: "Press et al. 2022, Train Short, Test Long: Attention with Linear Biases Enables Input Length Extrapolation".into(),
        hooks: hooks_of(&al),
        formula: "logit_h(i, j) = q_i·k_j/√d − m_h·(i − j),  m_h = 2^(−8h/H) for H a power of two\n(otherwise: the slopes of the closest power of two, then every other slope of twice that)".into(),
        body,
        properties: vec![
            judged(
                "alibi.geometric",
                "Slopes are geometric, 2^(−8h/H) for head h of H, H a power of two",
                "Press et al. 2022 §3",
                "max relative deviation of each slope from 2^(−8h/H), H ∈ {1, 2, …, 64}; first slope for H = 8",
                json!({"slope_deviation": slope_dev, "first_slope_h8": s8[0]}),
                Some(json!({"slope_deviation": 0.0, "first_slope_h8": 0.5})),
                rules::alibi_geometric(slope_dev),
            ),
            judged(
                "alibi.relative",
                "The bias depends on i − j only",
                "Press et al. 2022 §3",
                "max |b(i, j) − b(i+1000, j+1000)| over heads and pairs",
                json!(shift_dev),
                None,
                rules::toeplitz_bias(shift_dev),
            ),
        ],
    })
}

// ------------------------------------------------------------------ T5 ---

fn t5() -> Result<Family> {
    let bi = T5Buckets::new(32, 128, true)?;
    let ca = T5Buckets::new(32, 128, false)?;
    let rel: Vec<i64> = vec![
        -200, -128, -64, -16, -8, -2, -1, 0, 1, 2, 8, 16, 64, 128, 200,
    ];
    let rows: Vec<Vec<String>> = rel
        .iter()
        .map(|&r| {
            vec![
                r.to_string(),
                bi.bucket(r).to_string(),
                ca.bucket(r).to_string(),
            ]
        })
        .collect();
    // Monotone in |distance|, per sign, and bounded.
    let mut mono = true;
    let mut bounded = true;
    for b in [&bi, &ca] {
        for sign in [-1i64, 1] {
            let mut prev = None;
            for d in 0..=1000i64 {
                let v = b.bucket(sign * d);
                bounded &= v < 32;
                if let Some(p) = prev {
                    mono &= v >= p;
                }
                prev = Some(v);
            }
        }
    }
    let mut body = String::from(
        "T5 learns one scalar per head and per *bucket* of relative position: small distances get a \
         bucket each, larger ones share logarithmically wider buckets, and everything beyond \
         max_distance shares the last. Relative position = key − query (32 buckets, max_distance 128):\n\n",
    );
    body.push_str(&md_table(
        &[
            "key − query".into(),
            "bidirectional".into(),
            "causal".into(),
        ],
        &rows,
    ));
    Ok(Family {
        id: "t5".into(),
        name: "T5 relative buckets".into(),
        paper: "Raffel et al. 2020, Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer".into(),
        hooks: vec!["attention logits".into()],
        formula: "logit_h(i, j) = q_i·k_j + b_h[bucket(j − i)]\nbucket(r): exact for |r| < B/2 (of the half used), then B/2 + log(|r|/(B/2)) / log(max_distance/(B/2)) · (B/2), capped".into(),
        body,
        properties: vec![holds(
            "t5.monotone",
            "Buckets grow with |distance| and stay below num_buckets",
            "transformers T5Attention._relative_position_bucket",
            "bucket(±d) for d ≤ 1000, both modes (causal: keys after the query all share bucket 0)",
            json!({"monotone": mono, "bounded": bounded}),
            "reproduced if monotone non-decreasing in |distance| for each sign, and < 32",
            mono && bounded,
        )],
    })
}

// ---------------------------------------------------------------- RoPE ---

fn rope() -> Result<Family> {
    let d = 128;
    let plain = RopeConfig::new(10000.0, d)?;
    let rope = posenc::rope::Rope::new(plain.clone())?;
    let draws = |max_position, seed| analysis::Draws {
        trials: 200,
        max_position,
        seed,
    };
    let norm_dev = analysis::norm_change(&rope, draws(1_000_000, 7))?;
    let rel_dev = analysis::relative_invariance(&rope, draws(100_000, 11))?;
    let rope_i = posenc::rope::Rope::new(plain.clone().with_layout(PairLayout::Interleaved))?;
    let rel_dev_i = analysis::relative_invariance(&rope_i, draws(100_000, 12))?;
    let dists = rules::ROFORMER_DECAY.map(|(r, _)| r);
    let decay = analysis::rope_decay_bound(d, 10000.0, &dists)?;
    // Precision at long context: Llama 3.1's frequencies, angle in f32 (as
    // transformers computes it) against f64.
    let llama31 = RopeConfig::from_hf_json_str(LLAMA_31_8B)?;
    let f = llama31.frequencies(None)?;
    let mut f32_err = 0.0f64;
    let mut ours_err = 0.0f64;
    for &p in &[4095u64, 1_000_000, 10_000_000] {
        let (c32, _) = f.cos_sin_table(&[p]);
        for (i, &w) in f.inv_freq.iter().enumerate() {
            let exact = (p as f64 * w as f64).cos();
            let hf = ((p as f32) * w).cos() as f64;
            if p == 1_000_000 {
                f32_err = f32_err.max((hf - exact).abs());
            }
            ours_err = ours_err.max((c32[i] as f64 - exact).abs());
        }
    }
    let xpos = posenc::rope::XPos::new(d)?;
    let xpos_rel = analysis::relative_invariance(&xpos, draws(2_000, 13))?;
    let small = RopeFrequencies::plain(10000.0, 8, PairLayout::HalfSplit)?;
    let rows: Vec<Vec<f64>> = (0..5u64)
        .map(|p| {
            let (c, s) = small.cos_sin_f64(p);
            c.into_iter().chain(s).collect()
        })
        .collect();
    let mut body = format!(
        "RoPE rotates each pair of query and key dimensions by the angle m·θ_i at position m, in \
         every layer. Rotations compose, so the score ⟨R(m)q, R(n)k⟩ = ⟨q, R(n−m)k⟩ depends on the \
         distance only ({NOPE_ROPE_RU}: the distance from token 5 to token 10 must be the same as from 10 \
         to 15). cos and sin of m·θ_i for d = 8 (pairs 0..3):\n\n",
    );
    body.push_str(&matrix_md(
        &std::iter::once("m".to_string())
            .chain((0..4).map(|i| format!("cos θ{i}")))
            .chain((0..4).map(|i| format!("sin θ{i}")))
            .collect::<Vec<_>>(),
        &rows,
        &|i| i.to_string(),
        4,
    ));
    body.push_str(&format!(
        "\nRoFormer's long-term decay bound (1/(d/2))·Σ|S_j|, d = 128, base 10000: {} at distance 0, \
         {} at 100, {} at 250.\n\nAt long context the angle m·θ_i must be computed in f64: \
         transformers' float32 angle for Llama 3.1's frequencies is off by {} in cos at position 10^6; \
         posenc's f32 table (angle in f64, then rounded) is within {} of the exact value at every \
         position up to 10^7.\n",
        num(decay[0], 3),
        num(decay[1], 3),
        num(decay[2], 3),
        num(f32_err, 2),
        num(ours_err, 2)
    ));
    Ok(Family {
        id: "rope".into(),
        name: "RoPE (rotary position embedding)".into(),
        paper: "Su et al. 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding".into(),
        hooks: hooks_of(&rope),
        formula: "θ_i = base^(−2i/d)\n(q'_{a}, q'_{b}) = (q_a cos mθ_i − q_b sin mθ_i, q_b cos mθ_i + q_a sin mθ_i)\npairs (a, b) = (i, i + d/2) half-split (Llama, GPT-NeoX) or (2i, 2i+1) interleaved (GPT-J, RoFormer)".into(),
        body,
        properties: vec![
            judged(
                "rope.norm",
                "RoPE is a rotation: it preserves norms",
                "Su et al. 2021 §3.4.2",
                "max relative change of ‖x‖, 200 random vectors, positions ≤ 10^6",
                json!(norm_dev),
                Some(json!(0.0)),
                rules::norm_preserved(norm_dev),
            ),
            judged(
                "rope.relative",
                "⟨R(m)q, R(n)k⟩ depends on m − n only (both layouts)",
                concat!("Su et al. 2021 §3.2; ", posenc_viz::src_nope_rope_ru!()),
                "max |score(m,n) − score(m+s,n+s)| / (‖q‖‖k‖), 200 draws, positions ≤ 2·10^5, over both layouts",
                json!({"half_split": rel_dev, "interleaved": rel_dev_i}),
                Some(json!(0.0)),
                rules::relative_score(rel_dev.max(rel_dev_i)),
            ),
            judged(
                "xpos.relative",
                "xPos keeps the score relative: queries scaled by ζ^(m/512), keys by ζ^(−n/512)",
                "Sun et al. 2022, A Length-Extrapolatable Transformer §3",
                "max |score(m,n) − score(m+s,n+s)| / (‖q‖‖k‖), 200 draws, positions ≤ 4000",
                json!(xpos_rel),
                Some(json!(0.0)),
                rules::relative_score(xpos_rel),
            ),
            judged(
                "rope.decay",
                "The relative upper bound decays with distance",
                "Su et al. 2021 §3.4.3, Fig. 2",
                "(1/(d/2))·Σ_j |S_j| at distances 0, 100, 250 (d = 128, base 10000)",
                json!(decay),
                Some(json!([32.5, 10.2, 6.6])),
                rules::roformer_decay([decay[0], decay[1], decay[2]]),
            ),
            holds(
                "rope.precision",
                "f32 tables are exact at long context when angles are computed in f64",
                "posenc; transformers float32 path for comparison",
                "max |cos error| of posenc's f32 table at positions 4095, 10^6, 10^7 (Llama 3.1 8B); transformers' f32 angle error at 10^6",
                json!({"posenc": ours_err, "f32_angle_at_1e6": f32_err}),
                "reproduced if posenc ≤ 2e-7",
                ours_err <= 2e-7,
            ),
        ],
    })
}

/// Llama 3.1 8B's published rope keys (config.json).
const LLAMA_31_8B: &str = r#"{
  "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
  "rope_theta": 500000.0,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}
}"#;

fn rope_scalings() -> Result<Family> {
    // One Llama-like model (head_dim 128, base 10000, trained at 4096) under
    // every scaling, 4× longer context.
    let model = |rope_scaling: Option<HfRopeParameters>| HfRopeConfig {
        hidden_size: Some(1024),
        num_attention_heads: Some(8),
        rope_theta: Some(10000.0),
        max_position_embeddings: Some(16384),
        rope_scaling: rope_scaling.map(|p| HfRopeParametersField::Flat(Box::new(p))),
        ..HfRopeConfig::default()
    };
    // `rope_type` with factor 4, trained at 4096 where the type reads it.
    let scaled = |rope_type: &str, original: Option<usize>| HfRopeParameters {
        rope_type: Some(rope_type.into()),
        factor: Some(4.0),
        original_max_position_embeddings: original,
        ..HfRopeParameters::default()
    };
    let cases: Vec<(&str, HfRopeConfig)> = vec![
        ("default", model(None)),
        ("linear (PI)", model(Some(scaled("linear", None)))),
        ("dynamic NTK", model(Some(scaled("dynamic", Some(4096))))),
        ("YaRN", model(Some(scaled("yarn", Some(4096))))),
        (
            "Llama 3",
            model(Some(HfRopeParameters {
                low_freq_factor: Some(1.0),
                high_freq_factor: Some(4.0),
                ..scaled("llama3", Some(4096))
            })),
        ),
    ];
    let pairs = [0usize, 16, 32, 48, 63];
    let default = RopeConfig::from_hf(&cases[0].1)?.frequencies(None)?;
    let mut rows = Vec::new();
    let mut props = Vec::new();
    for (name, hf) in &cases {
        let cfg = RopeConfig::from_hf(hf)?;
        let f = cfg.frequencies(Some(16384))?;
        let mut r = vec![name.to_string(), num(f.attention_factor, 4)];
        for &i in &pairs {
            r.push(num(f.inv_freq[i] as f64 / default.inv_freq[i] as f64, 4));
        }
        rows.push(r);
        let rope = posenc::rope::Rope::at_seq_len(cfg.clone(), Some(16384))?;
        let draws = analysis::Draws {
            trials: 100,
            max_position: 16384,
            seed: 99,
        };
        let dev = analysis::relative_invariance(&rope, draws)?;
        props.push(judged(
            &format!("rope-scaling.relative.{}", cfg.rope_type()),
            &format!("{name}: scores still depend on m − n only"),
            "Su et al. 2021 §3.2 (every scaling only changes θ_i)",
            "max |score(m,n) − score(m+s,n+s)| / (‖q‖‖k‖), 100 draws, positions ≤ 16384",
            json!(dev),
            Some(json!(0.0)),
            rules::relative_score(dev),
        ));
    }
    let mut body = String::from(
        "Long-context scalings keep RoPE's form and change its frequencies. Ratio θ'_i/θ_i of the \
         scaled to the original frequency for a model trained at 4096 positions, extended 4× \
         (head_dim 128, base 10000; pair 0 is the fastest), and the attention factor applied to cos/sin. \
         Position interpolation divides every frequency by the factor; NTK-style and YaRN scalings \
         leave the fast pairs (which already see every angle in training) and interpolate the slow ones.\n\n",
    );
    let mut header = vec!["scaling".to_string(), "attention factor".to_string()];
    header.extend(pairs.iter().map(|i| format!("pair {i}")));
    body.push_str(&md_table(&header, &rows));
    body.push_str(
        "\n(Printed for a sequence of 16384 positions; `posenc rope inspect --config FILE` prints the \
         same for any Hugging Face config.)\n",
    );
    Ok(Family {
        id: "rope-scalings".into(),
        name: "RoPE long-context scalings".into(),
        paper: "Chen et al. 2023 (PI); bloc97/emozilla 2023 (NTK, dynamic NTK); Peng et al. 2023 (YaRN); Meta 2024 (Llama 3.1); Ding et al. 2024 (LongRoPE)".into(),
        hooks: vec!["queries and keys".into()],
        formula: "linear: θ'_i = θ_i / s\ndynamic NTK: base' = base·((s·L/L₀) − (s − 1))^(d/(d−2)) for L > L₀\nYaRN: θ'_i = θ_i·((1 − γ_i)/s + γ_i), ramp γ_i between beta_slow and beta_fast rotations; attention factor 0.1·ln(s) + 1\nLlama 3: θ_i / s for long wavelengths, θ_i for short ones, smooth in between".into(),
        body,
        properties: props,
    })
}
