//! Line plots: named series of `(x, y)` points.

use plotters::backend::DrawingBackend;
use plotters::coord::Shift;
use plotters::drawing::DrawingArea;
use plotters::element::{Circle, Polygon};
use plotters::series::LineSeries;
use plotters::style::Color;

use crate::axis::ValueAxis;
use crate::colormap::Rgb;
use crate::error::{check_finite, PlotError, Result};
use crate::figure::{impl_draw, Figure};
use crate::fonts::{Fonts, GRID};
use crate::frame::{self, label_setters, setters};
use crate::legend::Swatch;

/// One named curve of a [`LinePlot`].
///
/// ```
/// use posenc_plot::{Rgb, Series};
/// let s = Series::new("mean", vec![(1.0, 2.0), (2.0, 3.0)])
///     .band(vec![(1.0, 1.5, 2.5), (2.0, 2.0, 4.0)])
///     .markers(true)
///     .color(Rgb(0, 0, 0));
/// assert_eq!(s.name(), "mean");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    name: String,
    points: Vec<(f64, f64)>,
    band: Option<Vec<(f64, f64, f64)>>,
    markers: bool,
    color: Option<Rgb>,
}

impl Series {
    /// A series named `name` (shown in the legend unless empty) through
    /// `points`, drawn in order, without markers or band, in the next
    /// colour of the matplotlib "tab10" cycle.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
            band: None,
            markers: false,
            color: None,
        }
    }

    setters! {
        /// Adds a shaded band: `(x, low, high)` triples, e.g. mean ± spread.
        band(band: Vec<(f64, f64, f64)>) = Some(band);
        /// Draws a dot at every point.
        markers(on: bool) = on;
        /// Sets the colour (default: the colour cycle).
        color(color: Rgb) = Some(color);
    }

    /// The name shown in the legend.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The points.
    pub fn points(&self) -> &[(f64, f64)] {
        &self.points
    }
}

/// A line plot: several [`Series`], a legend, axis labels, a title and
/// optional logarithmic axes.
///
/// ```
/// use posenc_plot::{Figure, LinePlot, Series};
/// let plot = LinePlot::new()
///     .title("Frequencies")
///     .x_label("pair index i")
///     .y_label("θ_i")
///     .log_y(true)
///     .series(Series::new("base 10000", (0..32).map(|i| (i as f64, 10000f64.powf(-(i as f64) / 32.0))).collect()))
///     .series(Series::new("base 500000", (0..32).map(|i| (i as f64, 500000f64.powf(-(i as f64) / 32.0))).collect()).markers(true));
/// let svg = plot.to_svg_string(640, 400)?;
/// assert!(svg.contains("base 500000"));
/// # Ok::<(), posenc_plot::PlotError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinePlot {
    title: String,
    x_label: String,
    y_label: String,
    series: Vec<Series>,
    log_x: bool,
    log_y: bool,
    x_range: Option<(f64, f64)>,
    y_range: Option<(f64, f64)>,
}

impl LinePlot {
    /// An empty plot (add at least one series before rendering).
    pub fn new() -> LinePlot {
        LinePlot::default()
    }

    label_setters!();

    /// Adds a series.
    pub fn series(mut self, series: Series) -> Self {
        self.series.push(series);
        self
    }

    setters! {
        /// Logarithmic x axis (every x must then be positive).
        log_x(on: bool) = on;
        /// Logarithmic y axis (every y, and every band end, must be positive).
        log_y(on: bool) = on;
        /// Fixes the x range (default: the data's, padded a little).
        x_range(min: f64, max: f64) = Some((min, max));
        /// Fixes the y range (default: the data's, padded a little).
        y_range(min: f64, max: f64) = Some((min, max));
    }

    fn check(&self) -> Result<()> {
        if self.series.is_empty() {
            return Err(PlotError::Empty {
                what: "line plot (no series)".into(),
            });
        }
        for s in &self.series {
            let what = format!("series `{}`", s.name);
            if s.points.is_empty() {
                return Err(PlotError::Empty { what });
            }
            for (i, &(x, y)) in s.points.iter().enumerate() {
                check_finite(x, &what, || format!("point {i} (x)"))?;
                check_finite(y, &what, || format!("point {i} (y)"))?;
                self.check_log(x, y)?;
            }
            for (i, &(x, lo, hi)) in s.band.iter().flatten().enumerate() {
                let what = format!("band of series `{}`", s.name);
                check_finite(x, &what, || format!("point {i} (x)"))?;
                check_finite(lo, &what, || format!("point {i} (low)"))?;
                check_finite(hi, &what, || format!("point {i} (high)"))?;
                self.check_log(x, lo)?;
                self.check_log(x, hi)?;
            }
        }
        for (axis, range, log) in [
            ("x", self.x_range, self.log_x),
            ("y", self.y_range, self.log_y),
        ] {
            if let Some((min, max)) = range {
                if !(min.is_finite() && max.is_finite() && min < max) {
                    return Err(PlotError::InvalidRange { min, max });
                }
                if log && min <= 0.0 {
                    return Err(PlotError::NonPositiveOnLogAxis { axis, value: min });
                }
            }
        }
        Ok(())
    }

    fn check_log(&self, x: f64, y: f64) -> Result<()> {
        if self.log_x && x <= 0.0 {
            return Err(PlotError::NonPositiveOnLogAxis {
                axis: "x",
                value: x,
            });
        }
        if self.log_y && y <= 0.0 {
            return Err(PlotError::NonPositiveOnLogAxis {
                axis: "y",
                value: y,
            });
        }
        Ok(())
    }

    /// Data extents (x, y) over points and bands.
    fn extents(&self) -> ((f64, f64), (f64, f64)) {
        let mut xs = (f64::INFINITY, f64::NEG_INFINITY);
        let mut ys = xs;
        let mut add = |x: f64, y: f64| {
            xs = (xs.0.min(x), xs.1.max(x));
            ys = (ys.0.min(y), ys.1.max(y));
        };
        for s in &self.series {
            s.points.iter().for_each(|&(x, y)| add(x, y));
            for &(x, lo, hi) in s.band.iter().flatten() {
                add(x, lo);
                add(x, hi);
            }
        }
        (xs, ys)
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        let be = PlotError::backend;
        let (w, h) = area.dim_in_pixel();
        let f = Fonts::for_size(w, h);
        let legend =
            (self.series.iter()).map(|s| (&*s.name, s.color, Swatch::Line { marker: s.markers }));
        let area = frame::heading(area, &self.title, legend, &f)?;
        let (xe, ye) = self.extents();
        let (x0, x1) = self.x_range.unwrap_or_else(|| pad(xe, self.log_x));
        let (y0, y1) = self.y_range.unwrap_or_else(|| pad(ye, self.log_y));
        let (aw, ah) = area.dim_in_pixel();
        let x_axis = ValueAxis {
            lo: x0,
            hi: x1,
            log: self.log_x,
            max_ticks: frame::max_ticks(aw, f.tick * 6.0),
        };
        let y_axis = ValueAxis {
            lo: y0,
            hi: y1,
            log: self.log_y,
            max_ticks: frame::max_ticks(ah, f.tick * 3.0),
        };
        let labels = (&*self.x_label, &*self.y_label);
        let mut chart = frame::value_chart(&area, &f, labels, x_axis, y_axis)?;
        let xf = |v: &f64| x_axis.label(*v);
        let yf = |v: &f64| y_axis.label(*v);
        let mut mesh = chart.configure_mesh();
        mesh.x_label_formatter(&xf)
            .y_label_formatter(&yf)
            .bold_line_style(GRID)
            .max_light_lines(0);
        frame::draw_mesh(&mut mesh, labels, &f)?;

        let stroke = (f.tick / 6.0).round().max(1.5) as u32;
        for (i, s) in self.series.iter().enumerate() {
            let c = frame::series_color(s.color, i);
            if let Some(band) = &s.band {
                let mut poly: Vec<(f64, f64)> = band.iter().map(|&(x, _, hi)| (x, hi)).collect();
                poly.extend(band.iter().rev().map(|&(x, lo, _)| (x, lo)));
                chart
                    .draw_series(std::iter::once(Polygon::new(poly, c.mix(0.2).filled())))
                    .map_err(be)?;
            }
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().copied(),
                    c.stroke_width(stroke),
                ))
                .map_err(be)?;
            if s.markers {
                let r = (f.tick / 4.0).round().max(2.0) as i32;
                chart
                    .draw_series(s.points.iter().map(|&p| Circle::new(p, r, c.filled())))
                    .map_err(be)?;
            }
        }
        Ok(())
    }
}

/// Pads a data extent for display: 4 % each side (of decades on a log
/// axis); a single value gets a unit (or factor-2) interval around it.
pub(crate) fn pad((lo, hi): (f64, f64), log: bool) -> (f64, f64) {
    if log {
        let (a, b) = (lo.log10(), hi.log10());
        if b - a < 1e-12 {
            return (lo / 2.0, hi * 2.0);
        }
        let p = (b - a) * 0.04;
        (10f64.powf(a - p), 10f64.powf(b + p))
    } else {
        if hi - lo < 1e-300 {
            let p = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
            return (lo - p, hi + p);
        }
        let p = (hi - lo) * 0.04;
        (lo - p, hi + p)
    }
}

impl_draw!(LinePlot);

impl Figure for LinePlot {
    fn default_size(&self) -> (u32, u32) {
        (720, 450)
    }
}
