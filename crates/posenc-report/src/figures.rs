//! Figures of the report as data (so that cached experiments can be drawn
//! again), rendered to PNG with posenc-plot.

use posenc_plot::{
    BarChart, BarSeries, Colormap, Figure, Heatmap, LinePlot, Orientation, Panels, Series,
    ValueRange,
};
use serde::{Deserialize, Serialize};

use crate::{CliError, CliResult};

/// A heatmap's data and labels.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeatSpec {
    /// Title.
    pub title: String,
    /// Rows of the data.
    pub data: Vec<Vec<f64>>,
    /// Horizontal axis label.
    pub x_label: String,
    /// Vertical axis label.
    pub y_label: String,
    /// Colour-bar label.
    pub colorbar: String,
    /// `true`: row i is drawn as column i (a positions × dims table);
    /// `false`: rows as rows.
    pub rows_as_columns: bool,
    /// Diverging colours around 0 (otherwise viridis, automatic range).
    pub diverging: bool,
}

impl HeatSpec {
    fn heatmap(&self) -> posenc_plot::Result<Heatmap> {
        let h = Heatmap::new(self.data.clone())?
            .title(self.title.clone())
            .x_label(self.x_label.clone())
            .y_label(self.y_label.clone())
            .colorbar_label(self.colorbar.clone())
            .orientation(if self.rows_as_columns {
                Orientation::RowsAsColumns
            } else {
                Orientation::RowsAsRows
            });
        Ok(if self.diverging {
            h.colormap(Colormap::RdBu).range(ValueRange::Symmetric)
        } else {
            h.colormap(Colormap::Viridis).range(ValueRange::Auto)
        })
    }
}

/// One line series.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LineSpec {
    /// Legend name.
    pub name: String,
    /// Points.
    pub points: Vec<(f64, f64)>,
    /// Markers on the points.
    pub markers: bool,
}

/// One bar series.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BarSpec {
    /// Legend name.
    pub name: String,
    /// One value per group.
    pub values: Vec<f64>,
    /// Error bars (spread), if any.
    pub errors: Option<Vec<f64>>,
}

/// What a figure shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum FigSpec {
    /// A heatmap.
    Heatmap(HeatSpec),
    /// Heatmaps side by side.
    Panels {
        /// Title.
        title: String,
        /// The panels.
        panels: Vec<HeatSpec>,
    },
    /// The binary-counter analogy.
    Binary {
        /// Bits per position.
        bits: Vec<Vec<f64>>,
        /// The sinusoidal table.
        table: Vec<Vec<f64>>,
    },
    /// Line plot.
    Line {
        /// Title.
        title: String,
        /// Horizontal label.
        x_label: String,
        /// Vertical label.
        y_label: String,
        /// Series.
        series: Vec<LineSpec>,
        /// Logarithmic vertical axis.
        log_y: bool,
    },
    /// Grouped bars.
    Bar {
        /// Title.
        title: String,
        /// Group names.
        groups: Vec<String>,
        /// Vertical label.
        y_label: String,
        /// Series.
        series: Vec<BarSpec>,
    },
}

/// A figure of the report: file name, caption, and what it shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fig {
    /// PNG file name under `figures/`.
    pub file: String,
    /// Caption.
    pub caption: String,
    /// The figure.
    pub spec: FigSpec,
}

impl Fig {
    /// A figure.
    pub fn new(file: &str, caption: &str, spec: FigSpec) -> Self {
        Fig {
            file: file.into(),
            caption: caption.into(),
            spec,
        }
    }

    /// Renders the PNG.
    pub fn png(&self) -> CliResult<Vec<u8>> {
        let err = |e: posenc_plot::PlotError| CliError(format!("figure {}: {e}", self.file));
        match &self.spec {
            FigSpec::Heatmap(h) => h.heatmap().and_then(|h| h.to_png_bytes(760, 420)),
            FigSpec::Panels { title, panels } => panels
                .iter()
                .map(HeatSpec::heatmap)
                .collect::<posenc_plot::Result<Vec<_>>>()
                .and_then(Panels::new)
                .and_then(|p| {
                    p.title(title.clone())
                        .to_png_bytes(300 * panels.len() as u32 + 60, 380)
                }),
            FigSpec::Binary { bits, table } => {
                posenc_plot::binary_analogy(bits.clone(), table.clone())
                    .and_then(|p| p.to_png_bytes(980, 380))
            }
            FigSpec::Line {
                title,
                x_label,
                y_label,
                series,
                log_y,
            } => {
                let mut p = LinePlot::new()
                    .title(title.clone())
                    .x_label(x_label.clone())
                    .y_label(y_label.clone())
                    .log_y(*log_y);
                for s in series {
                    let pts: Vec<(f64, f64)> = s
                        .points
                        .iter()
                        .copied()
                        .filter(|(x, y)| x.is_finite() && y.is_finite() && (!log_y || *y > 0.0))
                        .collect();
                    if !pts.is_empty() {
                        p = p.series(Series::new(s.name.clone(), pts).markers(s.markers));
                    }
                }
                p.to_png_bytes(760, 440)
            }
            FigSpec::Bar {
                title,
                groups,
                y_label,
                series,
            } => {
                let mut b = BarChart::new(groups.clone())
                    .title(title.clone())
                    .y_label(y_label.clone());
                for s in series {
                    let clean = |v: &[f64]| {
                        v.iter()
                            .map(|x| if x.is_finite() { *x } else { 0.0 })
                            .collect()
                    };
                    let mut bs = BarSeries::new(s.name.clone(), clean(&s.values));
                    if let Some(e) = &s.errors {
                        bs = bs.errors(clean(e));
                    }
                    b = b.series(bs);
                }
                b.to_png_bytes(760, 440)
            }
        }
        .map_err(err)
    }
}

/// Standard base64 (RFC 4648, with padding), for data URIs.
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        s.push(A[(n >> 18) as usize & 63] as char);
        s.push(A[(n >> 12) as usize & 63] as char);
        s.push(if c.len() > 1 {
            A[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        s.push(if c.len() > 2 {
            A[n as usize & 63] as char
        } else {
            '='
        });
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64(i.as_bytes()), o);
        }
    }
}
