//! The frame that the bar chart, the line plot and the heatmap share: the
//! title and legend above, the value axes and the labelled mesh.

use plotters::backend::DrawingBackend;
use plotters::chart::{ChartBuilder, ChartContext, MeshStyle};
use plotters::coord::cartesian::Cartesian2d;
use plotters::coord::ranged1d::{DefaultFormatting, Ranged};
use plotters::coord::Shift;
use plotters::drawing::DrawingArea;

use crate::axis::ValueAxis;
use crate::colormap::Rgb;
use crate::error::{PlotError, Result};
use crate::fonts::{self, Fonts, INK, PALETTE};
use crate::legend::{legend_row, Entry, Swatch};

/// Builder methods that set a field of the method's name to a value made
/// from the arguments: `name(arg: Type, ..) = value;` each, with its docs.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $t:ty),*) = $value:expr;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, $($arg: $t),*) -> Self {
                self.$name = $value;
                self
            }
        )*
    };
}
pub(crate) use setters;

/// Sets `title`, `x_label` and `y_label` (builder methods over fields of
/// those names), with the given doc lines or plain ones.
macro_rules! label_setters {
    () => {
        $crate::frame::label_setters!(
            "Sets the title.",
            "Sets the x-axis label.",
            "Sets the y-axis label."
        );
    };
    ($title:literal, $x:literal, $y:literal) => {
        $crate::frame::setters! {
            #[doc = $title]
            title(title: impl Into<String>) = title.into();
            #[doc = $x]
            x_label(label: impl Into<String>) = label.into();
            #[doc = $y]
            y_label(label: impl Into<String>) = label.into();
        }
    };
}
pub(crate) use label_setters;

/// The colour of series `i`: its own, or the next of the "tab10" cycle.
pub(crate) fn series_color(color: Option<Rgb>, i: usize) -> plotters::style::RGBColor {
    color.unwrap_or(PALETTE[i % PALETTE.len()]).plotters()
}

/// Draws the title band and a legend of `(name, colour, swatch)` for each
/// series (in order, for the colour cycle) and returns the area below.
pub(crate) fn heading<'s, DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    series: impl Iterator<Item = (&'s str, Option<Rgb>, Swatch)>,
    f: &Fonts,
) -> Result<DrawingArea<DB, Shift>> {
    let area = fonts::title_band(area, title, f)?;
    let entries: Vec<Entry> = series
        .enumerate()
        .map(|(i, (name, color, swatch))| Entry {
            name: name.to_string(),
            color: series_color(color, i),
            swatch,
        })
        .collect();
    legend_row(&area, &entries, f)
}

/// How many ticks fit along `pixels` with `spacing` pixels each (2 to 10).
pub(crate) fn max_ticks(pixels: u32, spacing: f64) -> usize {
    ((pixels as f64 / spacing) as usize).clamp(2, 10)
}

/// A chart on `area` with `x_axis` and the value axis `y_axis`, with room
/// for the tick labels and the axis labels `x_label` and `y_label`.
pub(crate) fn value_chart<'c, DB: DrawingBackend, X: Ranged>(
    area: &DrawingArea<DB, Shift>,
    f: &Fonts,
    (x_label, y_label): (&str, &str),
    x_axis: X,
    y_axis: ValueAxis,
) -> Result<ChartContext<'c, DB, Cartesian2d<X, ValueAxis>>> {
    let y_label_w = y_axis
        .ticks()
        .iter()
        .map(|&v| Fonts::width(&y_axis.label(v), f.tick))
        .fold(f.tick, f64::max);
    let margin = (f.tick * 0.9) as i32;
    ChartBuilder::on(area)
        .margin(margin)
        .margin_right(margin * 2)
        .x_label_area_size((f.tick * 1.7 + f.desc(x_label)) as i32)
        .y_label_area_size((y_label_w + f.tick * 0.9 + f.desc(y_label)) as i32)
        .build_cartesian_2d(x_axis, y_axis)
        .map_err(PlotError::backend)
}

/// An axis of real values (cells or values), labelled by formatters.
pub(crate) trait Axis: Ranged<ValueType = f64, FormatOption = DefaultFormatting> {}
impl<T: Ranged<ValueType = f64, FormatOption = DefaultFormatting>> Axis for T {}

/// Draws `mesh` with the axis labels `x_label` and `y_label` (none where
/// empty) and the figure's text styles.
pub(crate) fn draw_mesh<X: Axis, Y: Axis, DB: DrawingBackend>(
    mesh: &mut MeshStyle<'_, '_, X, Y, DB>,
    (x_label, y_label): (&str, &str),
    f: &Fonts,
) -> Result<()> {
    if !x_label.is_empty() {
        mesh.x_desc(x_label);
    }
    if !y_label.is_empty() {
        mesh.y_desc(y_label);
    }
    mesh.label_style(fonts::regular(f.tick))
        .axis_desc_style(fonts::regular(f.label))
        .axis_style(INK)
        .draw()
        .map_err(PlotError::backend)
}
