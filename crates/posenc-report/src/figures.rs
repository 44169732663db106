//! Figures of the report as data (so that cached experiments can be drawn
//! again), rendered to PNG with posenc-plot.

use posenc_plot::{
    BarChart, BarSeries, Colormap, Figure, Heatmap, LinePlot, Orientation, Panels, Series,
    ValueRange,
};
use serde::{Deserialize, Serialize};

use crate::{ReportError, Result};

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

/// JSON has no NaN: serde_json writes it as `null`, and these read `null`
/// back as NaN, so that a cached figure with a missing value (a diverged
/// seed, a length a model cannot run at, one seed's undefined spread) reads
/// back as it was written.
mod nan {
    use serde::{Deserialize, Deserializer};

    fn f(x: Option<f64>) -> f64 {
        x.unwrap_or(f64::NAN)
    }

    pub fn values<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Ok(Vec::<Option<f64>>::deserialize(d)?
            .into_iter()
            .map(f)
            .collect())
    }

    pub fn maybe_values<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<f64>>, D::Error> {
        Ok(Option::<Vec<Option<f64>>>::deserialize(d)?.map(|v| v.into_iter().map(f).collect()))
    }

    pub fn points<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(f64, f64)>, D::Error> {
        Ok(Vec::<(Option<f64>, Option<f64>)>::deserialize(d)?
            .into_iter()
            .map(|(x, y)| (f(x), f(y)))
            .collect())
    }
}

/// One line series.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LineSpec {
    /// Legend name.
    pub name: String,
    /// Points.
    #[serde(deserialize_with = "nan::points")]
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
    #[serde(deserialize_with = "nan::values")]
    pub values: Vec<f64>,
    /// Error bars (spread), if any.
    #[serde(default, deserialize_with = "nan::maybe_values")]
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
    pub fn png(&self) -> Result<Vec<u8>> {
        let err = |e: posenc_plot::PlotError| ReportError(format!("figure {}: {e}", self.file));
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
    use super::*;

    #[test]
    fn figures_with_nan_read_back_from_json() {
        let f = Fig::new(
            "x.png",
            "x",
            FigSpec::Bar {
                title: "t".into(),
                groups: vec!["a".into(), "b".into()],
                y_label: "y".into(),
                series: vec![BarSpec {
                    name: "s".into(),
                    values: vec![1.0, f64::NAN],
                    errors: Some(vec![f64::NAN, 0.5]),
                }],
            },
        );
        let back: Fig = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        let FigSpec::Bar { series, .. } = back.spec else {
            panic!("not a bar chart")
        };
        assert_eq!(series[0].values[0], 1.0);
        assert!(series[0].values[1].is_nan());
        let e = series[0].errors.as_ref().unwrap();
        assert!(e[0].is_nan() && e[1] == 0.5);
        let l = LineSpec {
            name: "l".into(),
            points: vec![(0.0, f64::NAN), (1.0, 2.0)],
            markers: false,
        };
        let back: LineSpec = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
        assert!(back.points[0].1.is_nan() && back.points[1] == (1.0, 2.0));
    }

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
