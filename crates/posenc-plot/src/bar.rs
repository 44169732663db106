//! Grouped bar charts with error bars.

use plotters::backend::DrawingBackend;
use plotters::coord::Shift;
use plotters::drawing::DrawingArea;
use plotters::element::{PathElement, Rectangle};
use plotters::style::Color;

use crate::axis::{CellAxis, ValueAxis};
use crate::colormap::Rgb;
use crate::error::{check_finite, PlotError, Result};
use crate::figure::{impl_draw, Figure};
use crate::fonts::{Fonts, GRID, INK};
use crate::frame::{self, label_setters, setters};
use crate::legend::Swatch;

/// One series of a [`BarChart`]: a value (e.g. a mean) per group, and an
/// optional spread per group drawn as an error bar `value ± spread`.
///
/// ```
/// use posenc_plot::BarSeries;
/// let s = BarSeries::new("RoPE", vec![0.91, 0.72]).errors(vec![0.02, 0.05]);
/// assert_eq!(s.values(), &[0.91, 0.72]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct BarSeries {
    name: String,
    values: Vec<f64>,
    errors: Option<Vec<f64>>,
    color: Option<Rgb>,
}

impl BarSeries {
    /// A series named `name` (legend) with one value per group.
    pub fn new(name: impl Into<String>, values: Vec<f64>) -> BarSeries {
        BarSeries {
            name: name.into(),
            values,
            errors: None,
            color: None,
        }
    }

    setters! {
        /// Adds error bars: one non-negative spread per group.
        errors(spreads: Vec<f64>) = Some(spreads);
        /// Sets the colour (default: the matplotlib "tab10" cycle).
        color(color: Rgb) = Some(color);
    }

    /// The values, one per group.
    pub fn values(&self) -> &[f64] {
        &self.values
    }
}

/// A grouped bar chart: for each named group (x axis), one bar per series,
/// side by side, with optional error bars; a legend names the series.
///
/// ```
/// use posenc_plot::{BarChart, BarSeries, Figure};
/// let chart = BarChart::new(vec!["len 64".into(), "len 256".into(), "len 1024".into()])
///     .title("Accuracy by length")
///     .y_label("accuracy")
///     .series(BarSeries::new("sinusoidal", vec![0.95, 0.61, 0.20]).errors(vec![0.01, 0.04, 0.05]))
///     .series(BarSeries::new("ALiBi", vec![0.96, 0.93, 0.90]).errors(vec![0.01, 0.02, 0.02]));
/// let img = chart.to_rgb(600, 400)?;
/// assert_eq!((img.width, img.height), (600, 400));
/// # Ok::<(), posenc_plot::PlotError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    title: String,
    x_label: String,
    y_label: String,
    groups: Vec<String>,
    series: Vec<BarSeries>,
}

impl BarChart {
    /// A chart with these group names on the x axis (add series next).
    pub fn new(groups: Vec<String>) -> BarChart {
        BarChart {
            title: String::new(),
            x_label: String::new(),
            y_label: String::new(),
            groups,
            series: Vec::new(),
        }
    }

    label_setters!();

    /// Adds a series (one value per group).
    pub fn series(mut self, series: BarSeries) -> Self {
        self.series.push(series);
        self
    }

    fn check(&self) -> Result<()> {
        if self.groups.is_empty() {
            return Err(PlotError::Empty {
                what: "bar chart groups".into(),
            });
        }
        if self.series.is_empty() {
            return Err(PlotError::Empty {
                what: "bar chart (no series)".into(),
            });
        }
        for s in &self.series {
            let what = format!("bar series `{}`", s.name);
            if s.values.len() != self.groups.len() {
                return Err(PlotError::LengthMismatch {
                    what: format!("{what}: values per group"),
                    expected: self.groups.len(),
                    found: s.values.len(),
                });
            }
            for (i, &v) in s.values.iter().enumerate() {
                check_finite(v, &what, || format!("group {i}"))?;
            }
            if let Some(errs) = &s.errors {
                if errs.len() != self.groups.len() {
                    return Err(PlotError::LengthMismatch {
                        what: format!("{what}: error bars per group"),
                        expected: self.groups.len(),
                        found: errs.len(),
                    });
                }
                for (i, &e) in errs.iter().enumerate() {
                    check_finite(e, &what, || format!("error bar {i}"))?;
                    if e < 0.0 {
                        return Err(PlotError::InvalidOption(format!(
                            "{what}: error bar {i} is negative ({e})"
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// The y extent: always includes 0; padded 6 % away from zero.
    fn y_extent(&self) -> (f64, f64) {
        let (mut lo, mut hi) = (0f64, 0f64);
        for s in &self.series {
            for (i, &v) in s.values.iter().enumerate() {
                let e = s.errors.as_ref().map_or(0.0, |e| e[i]);
                lo = lo.min(v - e);
                hi = hi.max(v + e);
            }
        }
        if hi - lo < 1e-300 {
            return (0.0, 1.0);
        }
        let p = (hi - lo) * 0.06;
        (
            if lo < 0.0 { lo - p } else { 0.0 },
            if hi > 0.0 { hi + p } else { 0.0 },
        )
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        let be = PlotError::backend;
        let (w, h) = area.dim_in_pixel();
        let f = Fonts::for_size(w, h);
        let legend = self.series.iter().map(|s| (&*s.name, s.color, Swatch::Box));
        let area = frame::heading(area, &self.title, legend, &f)?;
        let (y0, y1) = self.y_extent();
        let (_, ah) = area.dim_in_pixel();
        let y_axis = ValueAxis {
            lo: y0,
            hi: y1,
            log: false,
            max_ticks: frame::max_ticks(ah, f.tick * 3.0),
        };
        let n = self.groups.len();
        let x_axis = CellAxis {
            n,
            ticks: (0..n).collect(),
        };
        let labels = (&*self.x_label, &*self.y_label);
        let mut chart = frame::value_chart(&area, &f, labels, x_axis, y_axis)?;
        let groups = &self.groups;
        let xf = |v: &f64| groups.get(v.floor() as usize).cloned().unwrap_or_default();
        let yf = |v: &f64| y_axis.label(*v);
        let mut mesh = chart.configure_mesh();
        mesh.disable_x_mesh()
            .x_label_formatter(&xf)
            .y_label_formatter(&yf)
            .bold_line_style(GRID)
            .max_light_lines(0);
        frame::draw_mesh(&mut mesh, labels, &f)?;

        let k = self.series.len() as f64;
        let slot = 0.8 / k;
        let stroke = (f.tick / 9.0).round().max(1.0) as u32;
        for (si, s) in self.series.iter().enumerate() {
            let c = frame::series_color(s.color, si);
            let left = |g: usize| g as f64 + 0.1 + si as f64 * slot;
            chart
                .draw_series(s.values.iter().enumerate().map(|(g, &v)| {
                    let (x0, x1) = (left(g) + slot * 0.04, left(g) + slot * 0.96);
                    Rectangle::new([(x0, v.max(0.0)), (x1, v.min(0.0))], c.filled())
                }))
                .map_err(be)?;
            if let Some(errs) = &s.errors {
                // Error bars: a vertical line from v − e to v + e with caps
                // a fixed fraction of the bar wide.
                for (g, (&v, &e)) in s.values.iter().zip(errs).enumerate() {
                    let xc = left(g) + slot / 2.0;
                    let hw = slot * 0.18;
                    for seg in [
                        vec![(xc, v - e), (xc, v + e)],
                        vec![(xc - hw, v - e), (xc + hw, v - e)],
                        vec![(xc - hw, v + e), (xc + hw, v + e)],
                    ] {
                        chart
                            .draw_series(std::iter::once(PathElement::new(
                                seg,
                                INK.stroke_width(stroke),
                            )))
                            .map_err(be)?;
                    }
                }
            }
        }
        if y0 < 0.0 {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(0.0, 0.0), (n as f64, 0.0)],
                    INK.stroke_width(1),
                )))
                .map_err(be)?;
        }
        Ok(())
    }
}

impl_draw!(BarChart);

impl Figure for BarChart {
    fn default_size(&self) -> (u32, u32) {
        let w = (240 + self.groups.len() * (40 + 30 * self.series.len())).clamp(480, 1600);
        (w as u32, 420)
    }
}
