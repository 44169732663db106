//! `posenc analyze ENCODING`: measured properties, each claim with a
//! verdict computed by a stated rule, and one plot per measurement.

use std::path::Path;

use posenc::analysis;
use posenc::rope::RopeConfig;
use posenc::AttentionBias;
use posenc_plot::{Figure, LinePlot, Series};
use serde::Serialize;
use serde_json::{json, Value};

use crate::encodings::{build, parse_spec, Built, Encoding, EncodingOptions, Family};
use crate::error::{invalid, Result, VizError};

/// What to measure: the options of `posenc analyze`.
#[derive(Debug, Clone)]
pub struct AnalyzeOptions {
    /// The encoding: sinusoidal, rope, alibi, t5, shaw, learned, floater,
    /// xpos or binary (analysed as sinusoidal), optionally with
    /// `:KEY=VALUE,...`.
    pub encoding: String,
    /// Encoding options (`dim` defaults to [`DEFAULT_DIM`] = 128 here).
    pub encoding_options: EncodingOptions,
    /// Distinctness: compare all positions up to N (default 1000).
    pub n: u64,
    /// Similarity: offsets k = 0..=MAX_OFFSET (default 64).
    pub max_offset: u64,
    /// Similarity: the reference position p (default 0).
    pub from: u64,
    /// RoPE decay bound: distances 0..=DECAY_MAX (default 256).
    pub decay_max: u64,
}

impl Default for AnalyzeOptions {
    fn default() -> Self {
        AnalyzeOptions {
            encoding: "sinusoidal".into(),
            encoding_options: EncodingOptions::default(),
            n: 1000,
            max_offset: 64,
            from: 0,
            decay_max: 256,
        }
    }
}

/// The line plots of an analysis, each with its file stem.
pub type Plots = Vec<(String, LinePlot)>;

/// Default dimension of `analyze` (the papers' d = 128).
pub const DEFAULT_DIM: usize = 128;

pub use crate::claims::Judgement as Claim;
use crate::claims::{properties as rules, Judged};

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// Stable identifier, e.g. `similarity`.
    pub id: String,
    /// What was measured.
    pub metric: String,
    /// The measured value(s).
    pub value: Value,
    /// The claim it tests, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<Claim>,
    /// The plot that shows it (file stem), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plot: Option<String>,
}

/// Everything `analyze` measured.
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    /// The encoding, in words.
    pub encoding: String,
    /// Its family.
    pub family: String,
    /// The measurements.
    pub measurements: Vec<Measurement>,
}

struct Collector {
    measurements: Vec<Measurement>,
    plots: Vec<(String, LinePlot)>,
}

impl Collector {
    fn add(&mut self, id: &str, metric: impl Into<String>, value: Value, claim: Option<Claim>) {
        self.measurements.push(Measurement {
            id: id.into(),
            metric: metric.into(),
            value,
            claim,
            plot: None,
        });
    }
    fn plot(&mut self, name: &str, plot: LinePlot) {
        if let Some(m) = self.measurements.last_mut() {
            m.plot = Some(name.into());
        }
        self.plots.push((name.into(), plot));
    }
}

/// A claim judged by one of the rules the report shares.
fn claim(claim: &str, source: &str, expected: Option<Value>, judged: Judged) -> Option<Claim> {
    Some(Claim::new(claim, source, expected, judged))
}

fn pts(xs: impl IntoIterator<Item = f64>, ys: &[f64]) -> Vec<(f64, f64)> {
    xs.into_iter().zip(ys.iter().copied()).collect()
}

/// Writes one PNG and one SVG per plot, and `analysis.json` (pretty JSON,
/// ending in a newline), into the existing directory `dir`.
pub fn write_all(dir: &Path, analysis: &Analysis, plots: &[(String, LinePlot)]) -> Result<()> {
    for (name, plot) in plots {
        let (w, h) = plot.default_size();
        let png = dir.join(format!("{name}.png"));
        plot.to_png(&png, w, h)?;
        let svg = dir.join(format!("{name}.svg"));
        plot.to_svg(&svg, w, h)?;
    }
    let path = dir.join("analysis.json");
    let s = serde_json::to_string_pretty(analysis)?;
    std::fs::write(&path, s + "\n").map_err(|source| VizError::Write { path, source })
}

/// The text summary: one block per measurement.
pub fn summary(a: &Analysis) -> String {
    let mut out = format!("{}\n", a.encoding);
    for m in &a.measurements {
        let tag = m
            .claim
            .as_ref()
            .map(|c| c.verdict.as_str())
            .unwrap_or("measured");
        out.push_str(&format!("\n[{tag}] {}: {}\n", m.id, m.metric));
        out.push_str(&format!("    value: {}\n", compact(&m.value)));
        if let Some(c) = &m.claim {
            out.push_str(&format!("    claim: {} ({})\n", c.claim, c.source));
            if let Some(x) = &c.expected {
                out.push_str(&format!("    expected: {}\n", compact(x)));
            }
            out.push_str(&format!("    rule: {}\n", c.rule));
        }
    }
    out
}

/// JSON with long arrays shortened, for the terminal.
fn compact(v: &Value) -> String {
    fn shorten(v: &Value) -> Value {
        match v {
            Value::Array(a) if a.len() > 8 => {
                let mut s: Vec<Value> = a[..3].iter().map(shorten).collect();
                s.push(json!(format!("… {} values …", a.len() - 4)));
                s.push(shorten(&a[a.len() - 1]));
                Value::Array(s)
            }
            Value::Array(a) => Value::Array(a.iter().map(shorten).collect()),
            Value::Object(o) => {
                Value::Object(o.iter().map(|(k, v)| (k.clone(), shorten(v))).collect())
            }
            Value::Number(n) => match n.as_f64() {
                Some(f) if n.is_f64() => json!(format!("{:.6}", f)
                    .trim_end_matches('0')
                    .trim_end_matches('.')
                    .parse::<f64>()
                    .unwrap_or(f)),
                _ => v.clone(),
            },
            _ => v.clone(),
        }
    }
    shorten(v).to_string()
}

/// Measures everything that applies to the encoding: the analysis and its
/// line plots.
pub fn analyze(a: &AnalyzeOptions) -> Result<(Analysis, Plots)> {
    let spec = parse_spec(&a.encoding, &a.encoding_options)?;
    if a.n < 2 {
        return Err(invalid(format!(
            "invalid n = {}: need at least 2 positions",
            a.n
        )));
    }
    if a.max_offset < 1 || a.max_offset > 1_000_000 {
        return Err(invalid(format!(
            "invalid max-offset = {}: need 1 to 1000000",
            a.max_offset
        )));
    }
    if a.decay_max < 1 || a.decay_max > 1_000_000 {
        return Err(invalid(format!(
            "invalid decay-max = {}: need 1 to 1000000",
            a.decay_max
        )));
    }
    if a.n > crate::encodings::MAX_POSITIONS as u64 * 10 {
        return Err(invalid(format!(
            "invalid n = {}: at most {}",
            a.n,
            crate::encodings::MAX_POSITIONS * 10
        )));
    }
    // A learned table must hold every position measured.
    let fit = 8 * spec.opts.dim.unwrap_or(DEFAULT_DIM) as u64 + 16;
    let need =
        a.n.max(a.from + a.max_offset + 1)
            .max(100 + a.max_offset + 1)
            .max(fit) as usize;
    let positions_default = need.min(crate::encodings::MAX_POSITIONS);
    let enc = build(&spec, DEFAULT_DIM, positions_default)?;
    let mut c = Collector {
        measurements: Vec::new(),
        plots: Vec::new(),
    };
    match enc.family {
        Family::Sinusoidal | Family::Binary | Family::Learned | Family::Floater => {
            absolute(&enc, a, &mut c)?
        }
        Family::Rope | Family::XPos => rotary(&enc, a, spec.opts.theta.unwrap_or(10000.0), &mut c)?,
        Family::Alibi | Family::T5 | Family::Shaw => bias(&enc, &mut c)?,
    }
    Ok((
        Analysis {
            encoding: enc.label.clone(),
            family: enc.family.name().into(),
            measurements: c.measurements,
        },
        c.plots,
    ))
}

fn absolute(enc: &Encoding, a: &AnalyzeOptions, c: &mut Collector) -> Result<()> {
    let pe = enc
        .absolute()
        .ok_or_else(|| invalid("not an absolute encoding"))?;
    let sinusoidal = match &enc.built {
        Built::Sinusoidal(s) | Built::Binary(s) => Some(s),
        _ => None,
    };
    let d = pe.dim();

    // 1. Similarity against distance (the NoPE-and-RoPE post).
    let offsets: Vec<u64> = (0..=a.max_offset).collect();
    let curve = analysis::similarity_curve(pe, a.from, &offsets)?;
    let mono = curve.monotone_fraction(1e-12);
    let first_up = curve.first_increase(1e-12);
    let value = json!({
        "position": a.from,
        "offsets": offsets,
        "cosine": curve.cosine,
        "dot": curve.dot,
        "monotone_fraction": mono,
        "first_increase_at": first_up,
        "spearman": analysis::spearman(&offsets.iter().map(|&k| k as f64).collect::<Vec<_>>(), &curve.cosine),
    });
    let kf: Vec<f64> = offsets.iter().map(|&k| k as f64).collect();
    let rho = analysis::spearman(&kf, &curve.cosine);
    let cl = sinusoidal.and_then(|_| {
        claim(
            "The similarity of PE(p) and PE(p + k) decreases monotonically as k grows",
            crate::src_nope_rope_ru!(),
            None,
            rules::similarity_monotone(mono, rho),
        )
    });
    c.add(
        "similarity",
        format!(
            "cos(PE({p}), PE({p} + k)) and PE({p})·PE({p} + k) for k = 0..={}, D = {d}",
            a.max_offset,
            p = a.from
        ),
        value,
        cl,
    );
    let ks = offsets.iter().map(|&k| k as f64);
    c.plot(
        "similarity",
        LinePlot::new()
            .title(format!(
                "Similarity of PE({}) and PE({} + k) — {}",
                a.from, a.from, enc.label
            ))
            .x_label("offset k")
            .y_label("cosine similarity")
            .series(Series::new(
                "cos(PE(p), PE(p+k))",
                pts(ks.clone(), &curve.cosine),
            )),
    );
    c.plot(
        "dot",
        LinePlot::new()
            .title(format!(
                "Dot product PE({})·PE({} + k) — {}",
                a.from, a.from, enc.label
            ))
            .x_label("offset k")
            .y_label("dot product")
            .series(Series::new("PE(p)·PE(p+k)", pts(ks, &curve.dot))),
    );

    // 2. Dependence on the distance only (Vaswani et al. §3.5).
    let ps: Vec<u64> = [0u64, 17, 100]
        .into_iter()
        .filter(|&p| p + a.max_offset < enc.positions as u64 || sinusoidal.is_some())
        .collect();
    let dep = analysis::similarity_shift_dependence(pe, &ps, &offsets)?;
    c.add(
        "similarity-relative",
        format!(
            "max change of PE(p)·PE(p + k) across p ∈ {ps:?}, k ≤ {}",
            a.max_offset
        ),
        json!(dep),
        sinusoidal.and_then(|_| {
            claim(
                "PE(p)·PE(p + k) depends on k only",
                "Vaswani et al. 2017 §3.5",
                Some(json!(0.0)),
                rules::shift_invariant_similarity(dep),
            )
        }),
    );

    // 3. Distinctness of all positions up to N.
    let n = if sinusoidal.is_some() {
        a.n
    } else {
        a.n.min(enc.positions as u64)
    };
    let dist = analysis::distinctness(pe, n)?;
    c.add(
        "distinct",
        format!("min ‖PE(k) − PE(0)‖ over k = 1..{n}"),
        json!({"n": n, "min_distance": dist.min_distance, "at_k": dist.argmin}),
        sinusoidal.and_then(|_| {
            claim(
                "Encodings of different positions never repeat",
                concat!(crate::src_nope_rope_ru!(), ", \"why 10000\""),
                None,
                rules::distinct_positions(dist.min_distance),
            )
        }),
    );
    let mut dist_curve = Vec::new();
    let zero = pe.encode(0)?;
    for k in 1..n.min(4096) {
        let v = pe.encode(k)?;
        let dd: f64 = v.iter().zip(&zero).map(|(x, y)| (x - y) * (x - y)).sum();
        dist_curve.push((k as f64, dd.sqrt()));
    }
    c.plot(
        "distinctness",
        LinePlot::new()
            .title(format!("‖PE(k) − PE(0)‖ — {}", enc.label))
            .x_label("position k")
            .y_label("distance to PE(0)")
            .series(Series::new("‖PE(k) − PE(0)‖", dist_curve)),
    );

    // 4. The linear map M_k (the notes on Vaswani et al. §3.5).
    if let Some(s) = sinusoidal {
        let ks: Vec<u64> = [1u64, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000].to_vec();
        let probe = [0u64, 17, 1000, 99_999];
        match ks
            .iter()
            .map(|&k| {
                let m = s.linear_map(k as i64)?;
                analysis::linear_map_residual(s, &m, k, &probe)
            })
            .collect::<posenc::Result<Vec<f64>>>()
        {
            Ok(res) => {
                let worst = res.iter().cloned().fold(0.0, f64::max);
                c.add(
                    "linear-map",
                    format!("max |PE(p + k) − M_k·PE(p)| with M_k block-diagonal rotations, p ∈ {probe:?}"),
                    json!({"k": ks, "residual": res, "max": worst}),
                    claim(
                        "PE(pos + k) is a linear function of PE(pos) for every fixed k",
                        concat!("Vaswani et al. 2017 §3.5; ", crate::src_vaswani_notes!()),
                        Some(json!(0.0)),
                        rules::linear_map(worst),
                    ),
                );
                c.plot(
                    "linear-map",
                    LinePlot::new()
                        .title(format!("Residual of PE(p + k) = M_k·PE(p) — {}", enc.label))
                        .x_label("offset k")
                        .y_label("max |PE(p+k) − M_k PE(p)|")
                        .log_x(true)
                        .series(
                            Series::new("residual", pts(ks.iter().map(|&k| k as f64), &res))
                                .markers(true),
                        ),
                );
            }
            Err(err) => c.add(
                "linear-map",
                "M_k for this layout",
                json!({"error": err.to_string()}),
                None,
            ),
        }
    }
    // Fitted map (no formula): least squares on positions the map is then
    // tested beyond. For sinusoidal, 1000 positions spread over two periods
    // of the slowest pair (consecutive positions would leave the slow pairs
    // nearly constant and the normal matrix singular).
    {
        let k = 3u64;
        // Least squares in f64 over 1000 samples is well conditioned up to
        // D = 32; a wider sinusoidal table is fitted on its D = 16 version.
        let small = match sinusoidal {
            Some(s) if d > 32 => Some(
                posenc::absolute::Sinusoidal::new(16)
                    .and_then(|t| t.with_base(s.base()))
                    .map(|t| t.with_layout(s.layout()))?,
            ),
            _ => None,
        };
        let sinusoidal = small.as_ref().or(sinusoidal);
        let pe: &dyn posenc::AbsoluteEncoding = match sinusoidal {
            Some(s) => s,
            None => pe,
        };
        let d = pe.dim();
        let (fit_pos, probe): (Vec<u64>, Vec<u64>) = match sinusoidal {
            Some(s) => {
                let longest = analysis::wavelengths(s.frequencies())
                    .into_iter()
                    .fold(0.0f64, f64::max);
                let stride = ((2.0 * longest / 1000.0).ceil() as u64).max(1);
                let end = 1000 * stride;
                (
                    (0..1000).map(|i| i * stride).collect(),
                    vec![end + 17, 2 * end + 123, 5 * end + 1],
                )
            }
            None => {
                let fit_n = (8 * d as u64).max(64);
                (
                    (0..fit_n).collect(),
                    (fit_n..fit_n + 8)
                        .filter(|p| p + k < enc.positions as u64)
                        .collect(),
                )
            }
        };
        let last_fit = fit_pos.last().copied().unwrap_or(0);
        let fitted =
            if probe.is_empty() || (sinusoidal.is_none() && last_fit + k >= enc.positions as u64) {
                Err(format!(
                    "not enough positions in the table ({}) to fit on {} and test",
                    enc.positions,
                    fit_pos.len()
                ))
            } else {
                analysis::fit_linear_map(pe, k, &fit_pos)
                    .and_then(|m| analysis::linear_map_residual(pe, &m, k, &probe))
                    .map_err(|err| err.to_string())
            };
        let what = format!(
            "least-squares M_{k} fitted on {} positions p ≤ {last_fit}, max |PE(p+{k}) − M·PE(p)| on p ∈ {probe:?}, D = {d}",
            fit_pos.len()
        );
        match fitted {
            Ok(r) => c.add(
                "linear-map-fitted",
                what,
                json!(r),
                sinusoidal.and_then(|_| {
                    claim(
                        "The same linear map, found without the formula",
                        crate::src_vaswani_notes!(),
                        None,
                        rules::fitted_linear_map(r),
                    )
                }),
            ),
            Err(err) => c.add("linear-map-fitted", what, json!({"error": err}), None),
        }
    }

    // 5. Wavelengths (sinusoidal).
    if let Some(s) = sinusoidal {
        let wl = analysis::wavelengths(s.frequencies());
        let two_pi = 2.0 * std::f64::consts::PI;
        let base = s.base();
        let (wmin, wmax) = (wl[0], wl[wl.len() - 1]);
        let geo_dev = rules::ratio_deviation(&wl);
        c.add(
            "wavelengths",
            "wavelength 2π/ω_i of each frequency, in positions",
            json!({"wavelengths": wl, "min_over_2pi": wmin / two_pi, "max_over_2pi": wmax / two_pi,
                   "ratio_deviation": geo_dev}),
            claim(
                &format!("Wavelengths form a geometric progression from 2π to {base}·2π"),
                concat!("Vaswani et al. 2017 §3.5; ", crate::src_vaswani_notes!()),
                Some(json!({"min_over_2pi": 1.0, "max_over_2pi": base})),
                rules::geometric_wavelengths(wmin / two_pi, wmax / two_pi, geo_dev, base, d, 1e-12),
            ),
        );
        c.plot("wavelengths", wavelength_plot(&enc.label, &wl, None, base));
    }
    Ok(())
}

fn wavelength_plot(label: &str, wl: &[f64], reference: Option<&[f64]>, base: f64) -> LinePlot {
    let two_pi = 2.0 * std::f64::consts::PI;
    let n = wl.len();
    let mut p = LinePlot::new()
        .title(format!("Wavelength per frequency — {label}"))
        .x_label("frequency index i")
        .y_label("wavelength (positions)")
        .log_y(true)
        .series(Series::new("2π/ω_i", pts((0..n).map(|i| i as f64), wl)).markers(true));
    if let Some(r) = reference {
        p = p.series(Series::new("unscaled", pts((0..n).map(|i| i as f64), r)));
    }
    let last = (n.max(2) - 1) as f64;
    p.series(Series::new("2π", vec![(0.0, two_pi), (last, two_pi)]))
        .series(Series::new(
            format!("{base}·2π"),
            vec![(0.0, base * two_pi), (last, base * two_pi)],
        ))
}

fn rotary(enc: &Encoding, a: &AnalyzeOptions, xpos_theta: f64, c: &mut Collector) -> Result<()> {
    let (rot, theta, af, default_scaling): (&dyn posenc::RotaryEncoding, f64, f64, bool) =
        match &enc.built {
            Built::Rope {
                rope,
                freqs,
                config,
            } => (
                rope.as_ref(),
                config.theta(),
                freqs.attention_factor,
                freqs.rope_type == "default",
            ),
            Built::XPos(x) => (x, 10000.0, 1.0, true),
            _ => return Err(invalid("not a rotary encoding")),
        };
    let is_xpos = matches!(enc.built, Built::XPos(_));
    let theta = match &enc.built {
        Built::XPos(_) => xpos_theta,
        _ => theta,
    };
    let inv = enc.inv_freq().unwrap_or_default();

    // 1. Relative invariance.
    let draws = analysis::Draws {
        trials: 200,
        max_position: 4096,
        seed: 0,
    };
    let inv_err = analysis::relative_invariance(rot, draws)?;
    c.add(
        "relative-invariance",
        "max |⟨f(q, m), f(k, n)⟩ − ⟨f(q, m + s), f(k, n + s)⟩| / (‖q‖‖k‖) over 200 seeded draws, positions ≤ 4096",
        json!(inv_err),
        claim(
            "q·k after the encoding depends on the relative position m − n only",
            if is_xpos { "Sun et al. 2022 (xPos)" } else { "Su et al. 2021 (RoFormer) §3.2" },
            Some(json!(0.0)),
            rules::relative_score(inv_err),
        ),
    );

    // 2. Norm.
    let nc = analysis::norm_change(rot, draws)?;
    c.add(
        "norm-change",
        "max |‖f(x, m)‖ − ‖x‖| / ‖x‖ over 200 seeded draws",
        json!({"norm_change": nc, "attention_factor": af}),
        if !is_xpos && af == 1.0 {
            claim(
                "RoPE is a rotation: it keeps the norm",
                "Su et al. 2021 (RoFormer) §3.2",
                Some(json!(0.0)),
                rules::norm_preserved(nc),
            )
        } else {
            None
        },
    );

    // 3. Long-term decay (RoFormer §3.4.3): the reference curve and this one.
    let dists: Vec<f64> = (0..=a.decay_max).map(|r| r as f64).collect();
    let reference = analysis::rope_decay_bound(128, 10000.0, &dists)?;
    let at_paper =
        analysis::rope_decay_bound(128, 10000.0, &rules::ROFORMER_DECAY.map(|(r, _)| r))?;
    let (b0, b100, b250) = (at_paper[0], at_paper[1], at_paper[2]);
    let own = analysis::decay_bound(&inv, &dists);
    c.add(
        "decay-bound",
        format!(
            "RoFormer's relative upper bound (1/(d/2))·Σ_j |S_j| for distances 0..={}: d = 128, base 10000, and this encoding's frequencies",
            a.decay_max
        ),
        json!({"reference_d128_base10000": {"at_0": b0, "at_100": b100, "at_250": b250, "curve": reference},
               "this_encoding": {"at_0": own[0], "at_max": own[own.len() - 1], "curve": own}}),
        claim(
            "The bound decays with distance: 32.5 at 0, about 10.2 at 100 and 6.6 at 250 (d = 128, base 10000)",
            "Su et al. 2021 (RoFormer) §3.4.3, Fig. 2",
            Some(json!({"at_0": 32.5, "at_100": 10.2, "at_250": 6.6})),
            rules::roformer_decay([b0, b100, b250]),
        ),
    );
    let mut plot = LinePlot::new()
        .title(format!("RoFormer long-term decay bound — {}", enc.label))
        .x_label("relative distance")
        .y_label("relative upper bound")
        .series(Series::new(
            "d = 128, base 10000 (RoFormer)",
            pts(dists.iter().copied(), &reference),
        ));
    if !(inv.len() == 64 && theta == 10000.0 && default_scaling) {
        plot = plot.series(Series::new(
            format!("this encoding (d = {})", 2 * inv.len()),
            pts(dists.iter().copied(), &own),
        ));
    }
    c.plot("decay-bound", plot);

    // 4. Wavelengths per pair.
    let wl = analysis::wavelengths(&inv);
    let two_pi = 2.0 * std::f64::consts::PI;
    let d = 2 * inv.len();
    let (wmin, wmax) = (wl[0], wl[wl.len() - 1]);
    let unscaled: Option<Vec<f64>> = if default_scaling {
        None
    } else {
        RopeConfig::new(theta, d)
            .and_then(|c| c.frequencies(None))
            .ok()
            .map(|f| {
                analysis::wavelengths(&f.inv_freq.iter().map(|&x| x as f64).collect::<Vec<_>>())
            })
    };
    let wl_dev = rules::ratio_deviation(&wl);
    c.add(
        "wavelengths",
        "inverse frequency θ_i and wavelength 2π/θ_i of each pair, in positions",
        json!({"inv_freq": inv, "wavelengths": wl, "min_over_2pi": wmin / two_pi,
               "max_over_2pi": wmax / two_pi, "unscaled_wavelengths": unscaled}),
        if default_scaling {
            claim(
                &format!("Wavelengths form a geometric progression from 2π to {theta}·2π"),
                "Su et al. 2021 (θ_i = base^(−2i/d)); Vaswani et al. 2017 §3.5",
                Some(json!({"min_over_2pi": 1.0, "max_over_2pi": theta})),
                rules::geometric_wavelengths(wmin / two_pi, wmax / two_pi, wl_dev, theta, d, 1e-6),
            )
        } else {
            None
        },
    );
    c.plot(
        "wavelengths",
        wavelength_plot(&enc.label, &wl, unscaled.as_deref(), theta),
    );
    Ok(())
}

fn bias(enc: &Encoding, c: &mut Collector) -> Result<()> {
    let n = enc.positions.min(512);
    let pos: Vec<u64> = (0..n as u64).collect();
    // The matrix this encoding adds (or indexes) for one head.
    let matrix: Vec<Vec<f64>> = match &enc.built {
        Built::Alibi(al, h) => al.bias_matrix(*h, &pos, &pos)?,
        Built::T5(b, bias, h, show_bias) => {
            if *show_bias {
                bias.bias_matrix(*h, &pos, &pos)?
            } else {
                b.bucket_matrix(n, n, 0, 0)?
                    .into_iter()
                    .map(|r| r.into_iter().map(|x| x as f64).collect())
                    .collect()
            }
        }
        Built::Shaw(s) => s
            .index_matrix(n, n, 0, 0)?
            .into_iter()
            .map(|r| r.into_iter().map(|x| x as f64).collect())
            .collect(),
        _ => return Err(invalid("not a relative encoding")),
    };
    // 1. Depends on j − i only (Toeplitz).
    let mut worst = 0.0f64;
    for i in 1..n {
        for j in 1..n {
            worst = worst.max((matrix[i][j] - matrix[i - 1][j - 1]).abs());
        }
    }
    c.add(
        "relative",
        format!("max |b(i, j) − b(i − 1, j − 1)| over {n} × {n} positions"),
        json!(worst),
        claim(
            "The bias depends on the relative position j − i only",
            match enc.family {
                Family::Alibi => "Press et al. 2022 (ALiBi)",
                Family::T5 => "Raffel et al. 2020 (T5) §2.1",
                _ => "Shaw et al. 2018",
            },
            Some(json!(0.0)),
            rules::toeplitz_bias(worst),
        ),
    );
    match &enc.built {
        Built::Alibi(al, _) => {
            let slopes = al.slopes().to_vec();
            let h = slopes.len();
            let pow2 = h.is_power_of_two();
            let dev = slopes
                .iter()
                .enumerate()
                .map(|(i, &m)| (m / 2f64.powf(-8.0 * (i + 1) as f64 / h as f64) - 1.0).abs())
                .fold(0.0, f64::max);
            c.add(
                "slopes",
                "the head slopes m_h",
                json!({"slopes": slopes, "max_relative_deviation_from_geometric": dev}),
                if pow2 {
                    claim(
                        "For n heads the slopes are the geometric sequence 2^(−8/n), 2^(−16/n), …, 2^(−8)",
                        "Press et al. 2022 (ALiBi) §3",
                        None,
                        rules::alibi_geometric(dev),
                    )
                } else {
                    None
                },
            );
            let mut plot = LinePlot::new()
                .title(format!("ALiBi bias against distance — {}", enc.label))
                .x_label("key − query distance j − i")
                .y_label("bias");
            let range = n as i64 - 1;
            for (hh, &m) in slopes.iter().enumerate().take(8) {
                let p: Vec<(f64, f64)> = (-range..=range)
                    .map(|r| (r as f64, al.bias_for_distance(m, r)))
                    .collect();
                plot = plot.series(Series::new(
                    format!("head {hh} (m = {})", posenc_plot::format_value(m)),
                    p,
                ));
            }
            c.plot("bias-distance", plot);
        }
        Built::T5(b, _, _, _) => {
            let md = b.max_distance() as i64;
            let half = if b.bidirectional() {
                b.num_buckets() / 2
            } else {
                b.num_buckets()
            } as i64;
            let max_exact = half / 2;
            // Look at the past (r ≤ 0), which both modes bucket.
            let bucket = |r: i64| b.bucket(-r) as i64;
            let exact = (0..max_exact).all(|r| bucket(r) == r);
            let monotone = (0..4 * md).all(|r| bucket(r + 1) >= bucket(r));
            let flat = (md..4 * md).all(|r| bucket(r) == bucket(md));
            let rs: Vec<i64> = if b.bidirectional() {
                (-2 * md..=2 * md).collect()
            } else {
                (-2 * md..=0).collect()
            };
            let buckets: Vec<f64> = rs.iter().map(|&r| b.bucket(r) as f64).collect();
            c.add(
                "buckets",
                format!("bucket of relative position r = j − i, |r| ≤ {}", 2 * md),
                json!({"max_exact": max_exact, "exact_below_max_exact": exact, "monotone_in_distance": monotone,
                       "constant_beyond_max_distance": flat, "r": rs, "bucket": buckets}),
                claim(
                    "Small distances get one bucket each, larger ones logarithmically wider buckets up to max_distance, beyond which all share one bucket",
                    "Raffel et al. 2020 (T5) §2.1; transformers T5Attention._relative_position_bucket",
                    None,
                    rules::t5_buckets(exact, monotone, flat),
                ),
            );
            c.plot(
                "buckets",
                LinePlot::new()
                    .title(format!("T5 bucket against distance — {}", enc.label))
                    .x_label("key − query distance j − i")
                    .y_label("bucket")
                    .series(Series::new(
                        "bucket",
                        pts(rs.iter().map(|&r| r as f64), &buckets),
                    )),
            );
        }
        Built::Shaw(s) => {
            let k = s.max_relative() as i64;
            let range = (n as i64 - 1).max(k + 2);
            let rs: Vec<i64> = (-range..=range).collect();
            let idx: Vec<f64> = rs
                .iter()
                .map(|&r| {
                    let (q, kk) = if r >= 0 {
                        (0, r as u64)
                    } else {
                        ((-r) as u64, 0)
                    };
                    s.relative_index(q, kk).map(|v| v as f64)
                })
                .collect::<posenc::Result<_>>()?;
            let distinct = {
                let mut v: Vec<i64> = idx.iter().map(|&x| x as i64).collect();
                v.sort_unstable();
                v.dedup();
                v.len()
            };
            c.add(
                "clipping",
                format!("table row used for each relative position |j − i| ≤ {range}"),
                json!({"k": k, "distinct_rows": distinct, "r": rs, "row": idx}),
                claim(
                    "Relative positions are clipped to [−k, k]: 2k + 1 learned vectors",
                    "Shaw et al. 2018 §3.2",
                    Some(json!(2 * k + 1)),
                    rules::shaw_clipping(distinct, k as usize),
                ),
            );
            c.plot(
                "clipping",
                LinePlot::new()
                    .title(format!("Shaw table row against distance — {}", enc.label))
                    .x_label("key − query distance j − i")
                    .y_label("table row")
                    .series(
                        Series::new("row", pts(rs.iter().map(|&r| r as f64), &idx)).markers(true),
                    ),
            );
        }
        _ => {}
    }
    Ok(())
}
