//! `posenc compare A B`: two encodings side by side, with a short summary.

use std::path::Path;

use posenc::analysis;
use posenc_plot::terminal::TerminalMode;
use posenc_plot::{Figure, LinePlot, Series};

use crate::encodings::{build, parse_spec, Encoding, EncodingOptions, Panel};
use crate::error::{invalid, Result};
use crate::output::Grid;
use crate::show::{DEFAULT_DIM, DEFAULT_POSITIONS};

/// Size of each line plot in the figure.
pub const PLOT_SIZE: (u32, u32) = (640, 400);

/// Two encodings built side by side: what `posenc compare` draws and prints.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Encoding A.
    pub a: Encoding,
    /// Encoding B.
    pub b: Encoding,
    /// A's first heatmap (RoPE: its cos table), titled `A: ...`.
    pub panel_a: Panel,
    /// B's first heatmap, titled `B: ...`.
    pub panel_b: Panel,
    /// Line plots: frequency ratio and wavelengths for rotating encodings,
    /// else a profile along the distance (possibly none).
    pub plots: Vec<LinePlot>,
    /// The text summary (one fact a line, ending in a newline).
    pub summary: String,
}

/// Builds encodings `a` and `b` (each an ENCODING spec on top of the shared
/// `opts`; defaults as `show`'s: [`DEFAULT_DIM`], [`DEFAULT_POSITIONS`]) and
/// compares them.
pub fn compare(a: &str, b: &str, opts: &EncodingOptions) -> Result<Comparison> {
    let ea = build(&parse_spec(a, opts)?, DEFAULT_DIM, DEFAULT_POSITIONS)?;
    let eb = build(&parse_spec(b, opts)?, DEFAULT_DIM, DEFAULT_POSITIONS)?;
    let pa = first_panel(&ea, "A")?;
    let pb = first_panel(&eb, "B")?;
    let plots = line_plots(&ea, &eb)?;
    let text = summary(&ea, &eb, &pa, &pb);
    Ok(Comparison {
        a: ea,
        b: eb,
        panel_a: pa,
        panel_b: pb,
        plots,
        summary: text,
    })
}

impl Comparison {
    /// The figure's title, `A: ...   vs   B: ...`.
    pub fn title(&self) -> String {
        format!("A: {}   vs   B: {}", self.a.label, self.b.label)
    }

    /// Writes the figure (both heatmaps, the line plots below) to `path`,
    /// PNG or SVG from its extension.
    pub fn write(&self, path: &Path) -> Result<()> {
        let (ha, hb) = (self.panel_a.heatmap()?, self.panel_b.heatmap()?);
        let mut rows: Vec<Vec<(&dyn Figure, u32, u32)>> = vec![vec![
            (&ha, ha.natural_size().0, ha.natural_size().1),
            (&hb, hb.natural_size().0, hb.natural_size().1),
        ]];
        if !self.plots.is_empty() {
            rows.push(
                self.plots
                    .iter()
                    .map(|p| (p as &dyn Figure, PLOT_SIZE.0, PLOT_SIZE.1))
                    .collect(),
            );
        }
        let grid = Grid {
            title: self.title(),
            rows,
        };
        grid.write(path)
    }

    /// Both heatmaps drawn for the terminal, each under its title and
    /// followed by an empty line, then the summary.
    pub fn terminal(&self, mode: TerminalMode) -> Result<String> {
        let mut out = String::new();
        for p in [&self.panel_a, &self.panel_b] {
            out.push_str(&p.title);
            out.push('\n');
            out.push_str(&p.heatmap()?.to_terminal(mode)?);
            out.push('\n');
        }
        out.push_str(&self.summary);
        Ok(out)
    }
}

/// The first heatmap of an encoding's picture (RoPE: its cos table),
/// titled with the side it is on.
fn first_panel(enc: &Encoding, side: &str) -> Result<Panel> {
    let pic = enc.picture()?;
    let mut p = pic
        .panels
        .into_iter()
        .next()
        .ok_or_else(|| invalid("nothing to draw"))?;
    p.title = if p.title == enc.label {
        format!("{side}: {}", enc.label)
    } else {
        format!("{side}: {} — {}", enc.label, p.title)
    };
    Ok(p)
}

/// A curve describing an encoding along distance: cos(PE(0), PE(k)) for
/// absolute encodings, the last query's bias against key − query distance
/// for biases.
/// A named curve.
type Curve = (String, Vec<(f64, f64)>);

fn profile(enc: &Encoding) -> Result<Option<Curve>> {
    if let Some(pe) = enc.absolute() {
        let ks: Vec<u64> = (0..enc.positions as u64).collect();
        let c = analysis::similarity_curve(pe, 0, &ks)?;
        return Ok(Some((
            "cos(PE(0), PE(k))".into(),
            ks.iter().map(|&k| k as f64).zip(c.cosine).collect(),
        )));
    }
    let pic = enc.picture()?;
    let p = &pic.panels[0];
    if p.orientation == posenc_plot::Orientation::RowsAsRows {
        let last = p.data.len() - 1;
        return Ok(Some((
            format!("{} of query {last}", p.colorbar_label),
            p.data[last]
                .iter()
                .enumerate()
                .map(|(j, &v)| (j as f64 - last as f64, v))
                .collect(),
        )));
    }
    Ok(None)
}

fn line_plots(a: &Encoding, b: &Encoding) -> Result<Vec<LinePlot>> {
    let mut out = Vec::new();
    match (a.inv_freq(), b.inv_freq()) {
        (Some(fa), Some(fb)) => {
            if fa.len() == fb.len() {
                let ratio: Vec<(f64, f64)> = fa
                    .iter()
                    .zip(&fb)
                    .enumerate()
                    .map(|(i, (x, y))| (i as f64, y / x))
                    .collect();
                out.push(
                    LinePlot::new()
                        .title("Frequency ratio B / A per pair")
                        .x_label("pair i")
                        .y_label("θ_i(B) / θ_i(A)")
                        .series(Series::new("B / A", ratio).markers(true)),
                );
            }
            let wl = |f: &[f64]| -> Vec<(f64, f64)> {
                analysis::wavelengths(f)
                    .into_iter()
                    .enumerate()
                    .map(|(i, w)| (i as f64, w))
                    .collect()
            };
            out.push(
                LinePlot::new()
                    .title("Wavelength per pair")
                    .x_label("pair i")
                    .y_label("wavelength 2π/θ_i (positions)")
                    .log_y(true)
                    .series(Series::new("A", wl(&fa)).markers(true))
                    .series(Series::new("B", wl(&fb)).markers(true)),
            );
        }
        _ => {
            let (qa, qb) = (profile(a)?, profile(b)?);
            let mut plot = LinePlot::new()
                .title("Along the distance")
                .x_label("distance");
            let mut any = false;
            for (side, q) in [("A", qa), ("B", qb)] {
                if let Some((name, pts)) = q {
                    plot = plot.series(Series::new(format!("{side}: {name}"), pts));
                    any = true;
                }
            }
            if any {
                out.push(plot);
            }
        }
    }
    Ok(out)
}

/// Ranges of consecutive indices, e.g. `0–3, 7`.
fn ranges(idx: &[usize]) -> String {
    if idx.is_empty() {
        return "none".into();
    }
    let mut parts = Vec::new();
    let mut start = idx[0];
    let mut prev = idx[0];
    for &i in &idx[1..] {
        if i != prev + 1 {
            parts.push(if start == prev {
                format!("{start}")
            } else {
                format!("{start}–{prev}")
            });
            start = i;
        }
        prev = i;
    }
    parts.push(if start == prev {
        format!("{start}")
    } else {
        format!("{start}–{prev}")
    });
    parts.join(", ")
}

/// The text summary.
pub fn summary(a: &Encoding, b: &Encoding, pa: &Panel, pb: &Panel) -> String {
    let mut out = format!("A: {}\nB: {}\n", a.label, b.label);
    for (side, enc) in [("A", a), ("B", b)] {
        if let crate::encodings::Built::Rope { freqs, .. } = &enc.built {
            if freqs.attention_factor != 1.0 {
                out.push_str(&format!(
                    "{side}: cos and sin are multiplied by the attention factor {}\n",
                    posenc_plot::format_value(freqs.attention_factor)
                ));
            }
        }
    }
    if let (Some(fa), Some(fb)) = (a.inv_freq(), b.inv_freq()) {
        if fa.len() == fb.len() {
            let r: Vec<f64> = fa.iter().zip(&fb).map(|(x, y)| y / x).collect();
            let (lo, hi) = r
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| {
                    (l.min(v), h.max(v))
                });
            let tol = 1e-6;
            let same: Vec<usize> = (0..r.len())
                .filter(|&i| (r[i] - 1.0).abs() <= tol)
                .collect();
            let at_min: Vec<usize> = (0..r.len())
                .filter(|&i| (r[i] / lo - 1.0).abs() <= tol && (r[i] - 1.0).abs() > tol)
                .collect();
            let between: Vec<usize> = (0..r.len())
                .filter(|&i| !same.contains(&i) && !at_min.contains(&i))
                .collect();
            out.push_str(&format!(
                "{} pairs; frequency ratio B/A from {} to {}\n",
                r.len(),
                posenc_plot::format_value(lo),
                posenc_plot::format_value(hi)
            ));
            out.push_str(&format!(
                "  unchanged (ratio 1 ± 1e-6): pairs {}\n",
                ranges(&same)
            ));
            if lo < 1.0 - tol {
                out.push_str(&format!(
                    "  interpolated by the full factor {} (ratio {}): pairs {}\n",
                    posenc_plot::format_value(1.0 / lo),
                    posenc_plot::format_value(lo),
                    ranges(&at_min)
                ));
            } else if !at_min.is_empty() {
                out.push_str(&format!(
                    "  scaled by {}: pairs {}\n",
                    posenc_plot::format_value(lo),
                    ranges(&at_min)
                ));
            }
            out.push_str(&format!("  in between: pairs {}\n", ranges(&between)));
        } else {
            out.push_str(&format!(
                "A has {} frequencies, B has {}\n",
                fa.len(),
                fb.len()
            ));
        }
    }
    if pa.data.len() == pb.data.len() && pa.data[0].len() == pb.data[0].len() {
        let diffs: Vec<f64> = pa
            .data
            .iter()
            .flatten()
            .zip(pb.data.iter().flatten())
            .map(|(x, y)| (x - y).abs())
            .collect();
        let max = diffs.iter().cloned().fold(0.0, f64::max);
        let mean = diffs.iter().sum::<f64>() / diffs.len() as f64;
        out.push_str(&format!(
            "pictured matrices ({} × {}): max |A − B| = {}, mean |A − B| = {}\n",
            pa.data.len(),
            pa.data[0].len(),
            posenc_plot::format_value(max),
            posenc_plot::format_value(mean)
        ));
    } else {
        out.push_str(&format!(
            "pictured matrices differ in shape: {} × {} and {} × {}\n",
            pa.data.len(),
            pa.data[0].len(),
            pb.data.len(),
            pb.data[0].len()
        ));
    }
    out
}
