//! Pretrained decoders in the report: the figure of loss against position
//! for each RoPE scaling (also `posenc perplexity --out`), and the
//! experiment "the third quiz answer on a pretrained model".

use posenc_models::perplexity::Study;
use posenc_plot::{LinePlot, Series};

use crate::figures::{Fig, FigSpec, LineSpec};

/// The curves of a [`Study`]: one per scaling, each band's mean loss at the
/// band's middle position, and a vertical segment at the trained length
/// spanning the curves' range.
pub fn loss_series(study: &Study) -> Vec<LineSpec> {
    let mut series: Vec<LineSpec> = study
        .runs
        .iter()
        .map(|r| LineSpec {
            name: r.name.clone(),
            points: r
                .bands
                .iter()
                .map(|b| {
                    let end = b.end.min(r.loss.len());
                    ((b.start + end) as f64 / 2.0, b.loss)
                })
                .collect(),
            markers: r.bands.len() <= 32,
        })
        .collect();
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
        if y.is_finite() {
            (a.min(y), b.max(y))
        } else {
            (a, b)
        }
    });
    let l = study.trained_length;
    if lo.is_finite() && l < study.length {
        series.push(LineSpec {
            name: format!("trained length L = {l}"),
            points: vec![(l as f64, lo), (l as f64, hi)],
            markers: false,
        });
    }
    series
}

fn title(study: &Study) -> String {
    format!(
        "loss per position, bands of {} ({} tokens, trained length {})",
        study.band, study.length, study.trained_length
    )
}

/// The figure as the report stores it (PNG).
pub fn loss_figure(study: &Study, file: &str, caption: &str) -> Fig {
    Fig::new(
        file,
        caption,
        FigSpec::Line {
            title: title(study),
            x_label: "position i (loss of token i + 1)".into(),
            y_label: "loss (nats)".into(),
            series: loss_series(study),
            log_y: false,
        },
    )
}

/// The same figure as a [`LinePlot`], for SVG or PNG files.
pub fn loss_plot(study: &Study) -> LinePlot {
    let mut p = LinePlot::new()
        .title(title(study))
        .x_label("position i (loss of token i + 1)")
        .y_label("loss (nats)");
    for s in loss_series(study) {
        let pts: Vec<(f64, f64)> = s
            .points
            .into_iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        if !pts.is_empty() {
            p = p.series(Series::new(s.name, pts).markers(s.markers));
        }
    }
    p
}
