//! Figures for posenc: heatmaps, line plots and bar charts, rendered to PNG,
//! SVG or the terminal.
//!
//! The crate takes plain data (`Vec<Vec<f64>>`, `(x, y)` pairs, means and
//! spreads) and knows nothing about positional encodings, so the CLI and the
//! report can call it with whatever they computed.
//!
//! * [`Heatmap`]: a matrix as coloured cells, with a title, axis labels,
//!   ticks and a colour bar. By default the `i`-th row of the data is drawn as
//!   the `i`-th *column* of the picture (the introductory articles' picture of a
//!   `positions × dims` table: token `j` is column `j`); see [`Orientation`].
//! * [`LinePlot`]: named series of `(x, y)` points with a legend, optional
//!   log axes, markers and shaded bands.
//! * [`BarChart`]: grouped bars with error bars (mean ± spread).
//! * [`Panels`]: several heatmaps side by side in one picture, e.g.
//!   [`binary_analogy`].
//! * [`terminal`]: a heatmap drawn with half-block characters and ANSI
//!   colours (24-bit, 256-colour) or a plain character ramp.
//!
//! Every figure implements [`Figure`]: `to_png(path, w, h)`,
//! `to_svg(path, w, h)`, and in-memory variants. Text uses DejaVu Sans,
//! compiled into the crate, so rendering needs no system font.
//!
//! ```
//! use posenc_plot::{Figure, Heatmap};
//!
//! // 32 positions × 16 dimensions, like the introductory articles' sinusoidal picture.
//! let table: Vec<Vec<f64>> = (0..32)
//!     .map(|p| (0..16).map(|d| (p as f64 / 10f64.powf(d as f64 / 4.0)).sin()).collect())
//!     .collect();
//! let map = Heatmap::new(table)?
//!     .title("Sinusoidal encoding")
//!     .x_label("position")
//!     .y_label("dimension");
//! let image = map.to_rgb(640, 360)?;
//! assert_eq!((image.width, image.height), (640, 360));
//! let svg = map.to_svg_string(640, 360)?;
//! assert!(svg.contains("Sinusoidal encoding"));
//! # Ok::<(), posenc_plot::PlotError>(())
//! ```
#![warn(missing_docs)]

mod axis;
mod bar;
mod colormap;
mod error;
mod figure;
mod fonts;
mod format;
mod frame;
mod heatmap;
mod legend;
mod line;
mod panels;
pub mod terminal;

pub use bar::{BarChart, BarSeries};
pub use colormap::{Colormap, Rgb, ValueRange};
pub use error::{PlotError, Result};
pub use figure::{Figure, RgbImage, MAX_SIDE, MIN_SIZE};
pub use format::format_value;
pub use heatmap::{Heatmap, Orientation, Ticks};
pub use line::{LinePlot, Series};
pub use panels::{binary_analogy, Panels};
