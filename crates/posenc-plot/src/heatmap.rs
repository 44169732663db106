//! Heatmaps: a matrix as coloured cells with axes, a colour bar and a title.

use std::path::Path;

use plotters::backend::DrawingBackend;
use plotters::chart::ChartBuilder;
use plotters::coord::Shift;
use plotters::drawing::DrawingArea;
use plotters::element::Rectangle;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{Color, ShapeStyle};

use crate::axis::{auto_cell_ticks, CellAxis, ValueAxis};
use crate::colormap::{extremes, Colormap, Rgb, Scale, ValueRange};
use crate::error::{check_matrix, PlotError, Result};
use crate::figure::{impl_draw, Figure, RgbImage};
use crate::fonts::{self, Fonts, INK};
use crate::frame::{self, label_setters, setters};
use crate::terminal::{self, TerminalMode};

/// How the data's rows map onto the picture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Orientation {
    /// Row `i` of the data is column `i` of the picture (x axis = rows,
    /// y axis = columns, column 0 at the top). This is the introductory articles' picture
    /// of a `positions × dims` table: "the j-th token is the j-th column".
    #[default]
    RowsAsColumns,
    /// Matrix layout: row `i` of the data is row `i` of the picture (from
    /// the top), column `j` is column `j`.
    RowsAsRows,
}

/// Which cells of an axis get a tick label. Indices are positions along the
/// axis *as drawn* (after the [`Orientation`] is applied).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Ticks {
    /// Every 1, 2, 4, 5, 8, 10, 16, 20, … cells, as many as fit.
    #[default]
    Auto,
    /// Every `k`-th cell from 0 (`k = 0` is treated as 1).
    Every(usize),
    /// Given cells with given labels.
    Custom(Vec<(usize, String)>),
    /// No ticks.
    None,
}

/// A heatmap of a `rows × cols` matrix.
///
/// Drawn with a title, axis labels, tick labels at cell centres and a
/// colour bar with its scale on the right. Build it with [`Heatmap::new`]
/// and the builder methods; render it with [`Figure`] at any size, or at
/// its natural size (cells of [`Heatmap::cell_size`] pixels) with
/// [`Heatmap::render_png`] / [`Heatmap::render_svg`], or in the terminal
/// with [`Heatmap::to_terminal`].
///
/// ```
/// use posenc_plot::{Colormap, Heatmap, Orientation, ValueRange};
/// let map = Heatmap::new(vec![vec![0.0, 1.0, 2.0], vec![3.0, 4.0, 5.0]])?
///     .title("A 2 × 3 matrix")
///     .orientation(Orientation::RowsAsRows)
///     .colormap(Colormap::Viridis)
///     .range(ValueRange::Fixed { min: 0.0, max: 5.0 })
///     .cell_size(40);
/// let img = map.render_rgb()?;
/// assert_eq!((img.width, img.height), map.natural_size());
/// # Ok::<(), posenc_plot::PlotError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Heatmap {
    data: Vec<Vec<f64>>,
    title: String,
    x_label: String,
    y_label: String,
    colorbar_label: String,
    x_ticks: Ticks,
    y_ticks: Ticks,
    colormap: Colormap,
    range: ValueRange,
    cell_size: u32,
    orientation: Orientation,
}

impl Heatmap {
    /// A heatmap of `data` (`rows × cols`), with no title or labels, the
    /// [`Colormap::RdBu`] map over [`ValueRange::Auto`], 18-pixel cells and
    /// the introductory articles' orientation ([`Orientation::RowsAsColumns`]).
    ///
    /// Errors: [`PlotError::Empty`] (no rows or no columns),
    /// [`PlotError::Ragged`], [`PlotError::NonFinite`] (NaN, ±∞).
    pub fn new(data: Vec<Vec<f64>>) -> Result<Heatmap> {
        check_matrix(&data, "heatmap data")?;
        Ok(Heatmap {
            data,
            title: String::new(),
            x_label: String::new(),
            y_label: String::new(),
            colorbar_label: String::new(),
            x_ticks: Ticks::Auto,
            y_ticks: Ticks::Auto,
            colormap: Colormap::RdBu,
            range: ValueRange::Auto,
            cell_size: 18,
            orientation: Orientation::RowsAsColumns,
        })
    }

    label_setters!(
        "Sets the title drawn above the map.",
        "Sets the label of the horizontal axis (as drawn).",
        "Sets the label of the vertical axis (as drawn)."
    );

    setters! {
        /// Sets the label drawn beside the colour bar (e.g. the quantity).
        colorbar_label(label: impl Into<String>) = label.into();
        /// Sets the ticks of the horizontal axis.
        x_ticks(ticks: Ticks) = ticks;
        /// Sets the ticks of the vertical axis.
        y_ticks(ticks: Ticks) = ticks;
        /// Sets the colour map.
        colormap(colormap: Colormap) = colormap;
        /// Sets the value range of the colour map. A bad fixed range is
        /// reported when rendering ([`PlotError::InvalidRange`]).
        range(range: ValueRange) = range;
        /// Sets the side of a cell, in pixels, at the natural size
        /// ([`Heatmap::natural_size`]); clamped to `1..=200`.
        cell_size(pixels: u32) = pixels.clamp(1, 200);
        /// Sets how data rows map onto the picture.
        orientation(orientation: Orientation) = orientation;
    }

    /// Swaps the orientation (rows as columns ↔ rows as rows).
    pub fn transpose(mut self) -> Self {
        self.orientation = match self.orientation {
            Orientation::RowsAsColumns => Orientation::RowsAsRows,
            Orientation::RowsAsRows => Orientation::RowsAsColumns,
        };
        self
    }

    /// The data, as given.
    pub fn data(&self) -> &[Vec<f64>] {
        &self.data
    }

    /// The matrix as drawn: `displayed()[r][c]` is the cell in picture row
    /// `r` (from the top) and column `c` (from the left).
    ///
    /// ```
    /// use posenc_plot::Heatmap;
    /// let map = Heatmap::new(vec![vec![1.0, 2.0], vec![3.0, 4.0], vec![5.0, 6.0]])?;
    /// // Default orientation: data row i is picture column i.
    /// assert_eq!(map.displayed(), vec![vec![1.0, 3.0, 5.0], vec![2.0, 4.0, 6.0]]);
    /// # Ok::<(), posenc_plot::PlotError>(())
    /// ```
    pub fn displayed(&self) -> Vec<Vec<f64>> {
        match self.orientation {
            Orientation::RowsAsRows => self.data.clone(),
            Orientation::RowsAsColumns => transpose(&self.data),
        }
    }

    /// `(rows, cols)` of the picture's cell grid.
    fn grid(&self) -> (usize, usize) {
        let (r, c) = (self.data.len(), self.data[0].len());
        match self.orientation {
            Orientation::RowsAsRows => (r, c),
            Orientation::RowsAsColumns => (c, r),
        }
    }

    fn value_at(&self, row: usize, col: usize) -> f64 {
        match self.orientation {
            Orientation::RowsAsRows => self.data[row][col],
            Orientation::RowsAsColumns => self.data[col][row],
        }
    }

    fn scale(&self) -> Result<Scale> {
        let (lo, hi) = extremes(&self.data);
        Scale::resolve(self.range, lo, hi)
    }

    fn check(&self) -> Result<()> {
        self.scale().map(|_| ())
    }

    /// The size at which every cell is `cell_size` pixels square, with
    /// room for the title, labels and colour bar (at least 240 × 160).
    pub fn natural_size(&self) -> (u32, u32) {
        let (rows, cols) = self.grid();
        let f = Fonts::for_size(640, 400);
        let l = self.layout(&f);
        let cell = self.cell_size as f64;
        let w = l.y_area + cols as f64 * cell + l.colorbar + 2.0 * l.margin;
        let h = l.title + l.margin + rows as f64 * cell + l.x_area + l.margin;
        (
            (w.ceil() as u32).clamp(240, crate::figure::MAX_SIDE),
            (h.ceil() as u32).clamp(160, crate::figure::MAX_SIDE),
        )
    }

    /// Renders at the natural size to an in-memory picture.
    pub fn render_rgb(&self) -> Result<RgbImage> {
        let (w, h) = self.natural_size();
        self.to_rgb(w, h)
    }

    /// Renders at the natural size to a PNG file.
    pub fn render_png(&self, path: impl AsRef<Path>) -> Result<()> {
        let (w, h) = self.natural_size();
        self.to_png(path, w, h)
    }

    /// Renders at the natural size to an SVG file.
    pub fn render_svg(&self, path: impl AsRef<Path>) -> Result<()> {
        let (w, h) = self.natural_size();
        self.to_svg(path, w, h)
    }

    /// Renders at the natural size to an SVG document.
    pub fn render_svg_string(&self) -> Result<String> {
        let (w, h) = self.natural_size();
        self.to_svg_string(w, h)
    }

    /// Renders in the terminal ([`terminal::render_with`]) in the same
    /// orientation, colour map and range as the picture.
    pub fn to_terminal(&self, mode: TerminalMode) -> Result<String> {
        terminal::render_with(&self.displayed(), mode, self.colormap, self.range)
    }

    fn tick_list(ticks: &Ticks, n: usize, max: usize) -> Vec<(usize, String)> {
        let idx: Vec<usize> = match ticks {
            Ticks::Auto => auto_cell_ticks(n, max),
            Ticks::Every(k) => (0..n).step_by((*k).max(1)).collect(),
            Ticks::Custom(list) => {
                return list.iter().filter(|(i, _)| *i < n).cloned().collect();
            }
            Ticks::None => Vec::new(),
        };
        idx.into_iter().map(|i| (i, i.to_string())).collect()
    }

    /// Pixel sizes of the parts around the cells.
    fn layout(&self, f: &Fonts) -> Layout {
        let (rows, _) = self.grid();
        let max_label = |ticks: &Ticks, n: usize| -> f64 {
            match ticks {
                Ticks::None => 0.0,
                Ticks::Custom(l) => l
                    .iter()
                    .map(|(_, s)| Fonts::width(s, f.tick))
                    .fold(0.0, f64::max),
                _ => Fonts::width(&n.saturating_sub(1).to_string(), f.tick),
            }
        };
        let y_area = max_label(&self.y_ticks, rows) + f.tick * 0.9 + f.desc(&self.y_label);
        let x_area = f.tick * 1.7 + f.desc(&self.x_label);
        let title = if self.title.is_empty() {
            0.0
        } else {
            f.title * 2.0
        };
        let scale_labels = self
            .scale()
            .map(|s| {
                let ax = colorbar_axis(s);
                ax.ticks()
                    .into_iter()
                    .map(|v| Fonts::width(&ax.label(v), f.tick))
                    .fold(0.0, f64::max)
            })
            .unwrap_or(4.0 * f.tick);
        let colorbar = f.tick * 1.2 // gap
            + f.tick * 1.3 // bar
            + f.tick * 0.8 + scale_labels // ticks + labels
            + f.desc(&self.colorbar_label)
            + f.tick * 0.4;
        Layout {
            margin: (f.tick * 0.8).round(),
            title: title.round(),
            x_area: x_area.round(),
            y_area: y_area.round(),
            colorbar: colorbar.round(),
        }
    }

    /// Draws the heatmap on `area` with the fonts of the whole picture.
    pub(crate) fn draw_with<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        f: &Fonts,
    ) -> Result<()> {
        let scale = self.scale()?;
        let l = self.layout(f);
        let be = PlotError::backend;

        // Title, centred over the whole panel.
        let area = fonts::title_band(area, &self.title, f)?;
        let (aw, _) = area.dim_in_pixel();
        let split = (aw as i32 - l.colorbar as i32).max(1);
        let (main, bar) = area.split_horizontally(split);

        // Axes and cells.
        let (rows, cols) = self.grid();
        let (mw, mh) = main.dim_in_pixel();
        let max_x = ((mw as f64 - l.y_area) / (f.tick * 3.2)).max(1.0) as usize;
        let max_y = ((mh as f64 - l.x_area) / (f.tick * 1.8)).max(1.0) as usize;
        let xt = Self::tick_list(&self.x_ticks, cols, max_x);
        let yt = Self::tick_list(&self.y_ticks, rows, max_y);
        let x_axis = CellAxis {
            n: cols,
            ticks: xt.iter().map(|t| t.0).collect(),
        };
        let y_axis = CellAxis {
            n: rows,
            ticks: yt.iter().map(|t| t.0).collect(),
        };
        let mut chart = ChartBuilder::on(&main)
            .margin_top(l.margin as i32)
            .margin_bottom(l.margin as i32)
            .margin_left(l.margin as i32)
            .margin_right(0)
            .x_label_area_size(l.x_area as i32)
            .y_label_area_size(l.y_area as i32)
            .build_cartesian_2d(x_axis, y_axis)
            .map_err(be)?;
        let label_of = |list: &[(usize, String)], v: f64| -> String {
            let i = v.floor() as usize;
            list.iter()
                .find(|(k, _)| *k == i)
                .map(|(_, s)| s.clone())
                .unwrap_or_default()
        };
        let xf = |v: &f64| label_of(&xt, *v);
        let yf = |v: &f64| label_of(&yt, *v);
        let mut mesh = chart.configure_mesh();
        mesh.disable_mesh()
            .x_label_formatter(&xf)
            .y_label_formatter(&yf);
        frame::draw_mesh(&mut mesh, (&self.x_label, &self.y_label), f)?;

        let plot = chart.plotting_area().strip_coord_spec();
        let (pw, ph) = plot.dim_in_pixel();
        let xs: Vec<i32> = (0..=cols)
            .map(|k| CellAxis::offset(cols, k as f64, pw as i32))
            .collect();
        let ys: Vec<i32> = (0..=rows)
            .map(|k| CellAxis::offset(rows, k as f64, ph as i32))
            .collect();
        for r in 0..rows {
            for c in 0..cols {
                let colour = self.colormap.at(scale.t(self.value_at(r, c)));
                fill(&plot, [(xs[c], ys[r]), (xs[c + 1], ys[r + 1])], colour)?;
            }
        }
        border(&plot)?;

        draw_colorbar(
            &bar,
            f,
            &l,
            self.colormap,
            scale,
            &self.colorbar_label,
            (l.margin as i32, (l.margin + l.x_area) as i32),
        )
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        let (w, h) = area.dim_in_pixel();
        self.draw_with(area, &Fonts::for_size(w, h))
    }
}

impl_draw!(Heatmap);

impl Figure for Heatmap {
    fn default_size(&self) -> (u32, u32) {
        self.natural_size()
    }
}

/// Pixel sizes around a heatmap's cells.
#[derive(Debug, Clone, Copy)]
struct Layout {
    margin: f64,
    title: f64,
    x_area: f64,
    y_area: f64,
    colorbar: f64,
}

/// The colour bar's axis: the scale's displayed range, about 6 ticks.
fn colorbar_axis(scale: Scale) -> ValueAxis {
    let (lo, hi) = scale.display();
    ValueAxis {
        lo,
        hi,
        log: false,
        max_ticks: 6,
    }
}

/// Draws a vertical colour bar filling `area` less `vmargin` (top, bottom)
/// so that it lines up with the cells, with ticks and labels on its right.
fn draw_colorbar<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    f: &Fonts,
    l: &Layout,
    colormap: Colormap,
    scale: Scale,
    label: &str,
    vmargin: (i32, i32),
) -> Result<()> {
    let be = PlotError::backend;
    let (lo, hi) = scale.display();
    let axis = colorbar_axis(scale);
    let (aw, _) = area.dim_in_pixel();
    let gap = (f.tick * 1.2) as i32;
    let bar_w = (f.tick * 1.3) as i32;
    let desc = f.desc(label) as i32;
    let right = (aw as i32 - gap - bar_w).max(1);
    let mut chart = ChartBuilder::on(area)
        .margin_top(vmargin.0)
        .margin_bottom(vmargin.1)
        .margin_left(gap)
        .margin_right(0)
        .right_y_label_area_size(right)
        .build_cartesian_2d(0f64..1f64, axis)
        .map_err(be)?;
    let tick_fmt = |v: &f64| axis.label(*v);
    chart
        .configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_label_formatter(&tick_fmt)
        .label_style(fonts::regular(f.tick))
        .axis_style(INK)
        .draw()
        .map_err(be)?;
    let plot = chart.plotting_area().strip_coord_spec();
    let (pw, ph) = plot.dim_in_pixel();
    let steps = (ph as usize).clamp(1, 256);
    for k in 0..steps {
        let y0 = (k as f64 / steps as f64 * ph as f64).round() as i32;
        let y1 = ((k + 1) as f64 / steps as f64 * ph as f64).round() as i32;
        // Top of the bar is the high end of the scale.
        let v = hi - (k as f64 + 0.5) / steps as f64 * (hi - lo);
        fill(&plot, [(0, y0), (pw as i32, y1)], colormap.at(scale.t(v)))?;
    }
    border(&plot)?;
    if desc > 0 {
        // The label sits just right of the widest tick label.
        let style = fonts::regular(f.tick);
        let widest = axis
            .ticks()
            .iter()
            .map(|&v| {
                area.estimate_text_size(&axis.label(v), &style)
                    .map_or(0, |(tw, _)| tw as i32)
            })
            .max()
            .unwrap_or(0);
        let (bw, bh) = area.dim_in_pixel();
        let y_mid = vmargin.0 + (bh as i32 - vmargin.0 - vmargin.1) / 2;
        let x = (gap + bar_w + (f.tick * 0.9) as i32 + widest + (f.label * 0.9) as i32)
            .min(bw as i32 - desc / 2);
        area.draw_text(
            label,
            &fonts::regular(f.label)
                .transform(plotters::style::FontTransform::Rotate270)
                .pos(Pos::new(HPos::Center, VPos::Center)),
            (x, y_mid),
        )
        .map_err(be)?;
    }
    let _ = l;
    Ok(())
}

/// Fills the pixel rectangle between `corners` of `plot` with `colour`.
fn fill<DB: DrawingBackend>(
    plot: &DrawingArea<DB, Shift>,
    corners: [(i32, i32); 2],
    colour: Rgb,
) -> Result<()> {
    plot.draw(&Rectangle::new(corners, colour.plotters().filled()))
        .map_err(PlotError::backend)
}

/// Draws a one-pixel ink frame around `plot`.
fn border<DB: DrawingBackend>(plot: &DrawingArea<DB, Shift>) -> Result<()> {
    let (pw, ph) = plot.dim_in_pixel();
    plot.draw(&Rectangle::new(
        [(0, 0), (pw as i32 - 1, ph as i32 - 1)],
        ShapeStyle::from(INK).stroke_width(1),
    ))
    .map_err(PlotError::backend)
}

/// Transposes a rectangular matrix.
pub(crate) fn transpose(m: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let cols = m.first().map_or(0, Vec::len);
    (0..cols)
        .map(|j| m.iter().map(|row| row[j]).collect())
        .collect()
}
