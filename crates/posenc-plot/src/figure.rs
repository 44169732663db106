//! The [`Figure`] trait: one way to render every figure type.

use std::path::Path;

use plotters::backend::{BitMapBackend, SVGBackend};
use plotters::coord::Shift;
use plotters::drawing::{DrawingArea, IntoDrawingArea};
use plotters::style::WHITE;

use crate::colormap::Rgb;
use crate::error::{PlotError, Result};

/// Smallest picture drawn, in pixels.
pub const MIN_SIZE: (u32, u32) = (120, 90);
/// Largest picture drawn, in pixels (each side).
pub const MAX_SIDE: u32 = 16_384;

/// An 8-bit RGB picture in memory, row-major, 3 bytes a pixel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// `width × height × 3` bytes, row by row from the top.
    pub pixels: Vec<u8>,
}

impl RgbImage {
    /// The colour at `(x, y)`, or `None` outside the picture.
    pub fn pixel(&self, x: u32, y: u32) -> Option<Rgb> {
        if x >= self.width || y >= self.height {
            return None;
        }
        let i = 3 * (y as usize * self.width as usize + x as usize);
        Some(Rgb(self.pixels[i], self.pixels[i + 1], self.pixels[i + 2]))
    }

    /// Encodes the picture as PNG.
    pub fn to_png_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut out, self.width, self.height);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut w = enc
                .write_header()
                .map_err(|e| PlotError::Png(e.to_string()))?;
            w.write_image_data(&self.pixels)
                .map_err(|e| PlotError::Png(e.to_string()))?;
            w.finish().map_err(|e| PlotError::Png(e.to_string()))?;
        }
        Ok(out)
    }

    /// Writes the picture to `path` as PNG.
    pub fn save_png(&self, path: impl AsRef<Path>) -> Result<()> {
        write_file(path.as_ref(), &self.to_png_bytes()?)
    }
}

pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|source| PlotError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn check_size(width: u32, height: u32) -> Result<()> {
    if width < MIN_SIZE.0 || height < MIN_SIZE.1 || width > MAX_SIDE || height > MAX_SIDE {
        return Err(PlotError::InvalidSize {
            width,
            height,
            reason: format!(
                "need at least {}×{} and at most {MAX_SIDE} a side",
                MIN_SIZE.0, MIN_SIZE.1
            ),
        });
    }
    Ok(())
}

pub(crate) mod private {
    use super::*;

    /// Drawing on the two back ends; implemented by every figure.
    pub trait Draw {
        /// Checks the figure's data and options.
        fn validate(&self) -> Result<()>;
        /// Draws on a bitmap area.
        fn draw_bitmap(&self, area: &DrawingArea<BitMapBackend<'_>, Shift>) -> Result<()>;
        /// Draws on an SVG area.
        fn draw_svg(&self, area: &DrawingArea<SVGBackend<'_>, Shift>) -> Result<()>;
    }
}

/// A figure that renders to PNG and SVG at any size.
///
/// Every method validates the figure first: bad data (empty, ragged, NaN,
/// non-positive values on a log axis) and sizes below
/// [`MIN_SIZE`] (120 × 90) or above [`MAX_SIDE`] (16 384) a
/// side are [`PlotError`]s.
///
/// ```
/// use posenc_plot::{Figure, LinePlot, Series};
/// let plot = LinePlot::new()
///     .title("y = x²")
///     .series(Series::new("square", (0..10).map(|i| (i as f64, (i * i) as f64)).collect()));
/// let png = plot.to_png_bytes(400, 300)?;
/// assert_eq!(&png[1..4], b"PNG");
/// # Ok::<(), posenc_plot::PlotError>(())
/// ```
pub trait Figure: private::Draw {
    /// The size the figure is drawn at when none is asked for.
    fn default_size(&self) -> (u32, u32);

    /// Renders to an in-memory RGB picture of exactly `width × height`.
    fn to_rgb(&self, width: u32, height: u32) -> Result<RgbImage> {
        check_size(width, height)?;
        self.validate()?;
        crate::fonts::ensure()?;
        let mut pixels = vec![255u8; width as usize * height as usize * 3];
        {
            let root = BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area();
            root.fill(&WHITE).map_err(PlotError::backend)?;
            self.draw_bitmap(&root)?;
            root.present().map_err(PlotError::backend)?;
        }
        Ok(RgbImage {
            width,
            height,
            pixels,
        })
    }

    /// Renders to PNG bytes of exactly `width × height`.
    fn to_png_bytes(&self, width: u32, height: u32) -> Result<Vec<u8>> {
        self.to_rgb(width, height)?.to_png_bytes()
    }

    /// Renders to a PNG file of exactly `width × height`.
    fn to_png(&self, path: impl AsRef<Path>, width: u32, height: u32) -> Result<()>
    where
        Self: Sized,
    {
        self.to_rgb(width, height)?.save_png(path)
    }

    /// Renders to an SVG document of `width × height`.
    fn to_svg_string(&self, width: u32, height: u32) -> Result<String> {
        check_size(width, height)?;
        self.validate()?;
        crate::fonts::ensure()?;
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (width, height)).into_drawing_area();
            root.fill(&WHITE).map_err(PlotError::backend)?;
            self.draw_svg(&root)?;
            root.present().map_err(PlotError::backend)?;
        }
        Ok(out)
    }

    /// Renders to an SVG file of `width × height`.
    fn to_svg(&self, path: impl AsRef<Path>, width: u32, height: u32) -> Result<()>
    where
        Self: Sized,
    {
        let svg = self.to_svg_string(width, height)?;
        write_file(path.as_ref(), svg.as_bytes())
    }
}

/// Implements [`private::Draw`] for a type with a generic
/// `fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()>`
/// and a `fn check(&self) -> Result<()>`.
macro_rules! impl_draw {
    ($t:ty) => {
        impl $crate::figure::private::Draw for $t {
            fn validate(&self) -> $crate::error::Result<()> {
                self.check()
            }
            $crate::figure::impl_draw!(@on draw_bitmap, BitMapBackend);
            $crate::figure::impl_draw!(@on draw_svg, SVGBackend);
        }
    };
    (@on $name:ident, $backend:ident) => {
        fn $name(
            &self,
            area: &plotters::drawing::DrawingArea<
                plotters::backend::$backend<'_>,
                plotters::coord::Shift,
            >,
        ) -> $crate::error::Result<()> {
            self.draw(area)
        }
    };
}
pub(crate) use impl_draw;
