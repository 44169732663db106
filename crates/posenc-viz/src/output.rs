//! Writing figures: file format from the extension, sizes, terminal mode,
//! and stacking several figures into one picture.

use std::path::Path;

use posenc_plot::{Figure, RgbImage};

use crate::error::{invalid, Result, VizError};

/// File formats a figure can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// PNG bitmap.
    Png,
    /// SVG vector picture.
    Svg,
}

/// The format named by `path`'s extension (`.png` or `.svg`, any case).
pub fn format_of(path: &Path) -> Result<Format> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("png") => Ok(Format::Png),
        Some("svg") => Ok(Format::Svg),
        Some(other) => Err(invalid(format!(
            "unknown extension .{other} for {}: use .png or .svg",
            path.display()
        ))),
        None => Err(invalid(format!(
            "{} has no extension: use .png or .svg",
            path.display()
        ))),
    }
}

/// Parses `WIDTHxHEIGHT`.
pub fn parse_size(s: &str) -> Result<(u32, u32)> {
    let (w, h) = s.split_once(['x', 'X', '×']).ok_or_else(|| {
        invalid(format!(
            "invalid size {s:?}: expected WIDTHxHEIGHT, e.g. 800x600"
        ))
    })?;
    let p = |v: &str| {
        v.trim().parse::<u32>().map_err(|_| {
            invalid(format!(
                "invalid size {s:?}: expected WIDTHxHEIGHT, e.g. 800x600"
            ))
        })
    };
    let (w, h) = (p(w)?, p(h)?);
    let (mw, mh) = posenc_plot::MIN_SIZE;
    if w < mw || h < mh || w > posenc_plot::MAX_SIDE || h > posenc_plot::MAX_SIDE {
        return Err(invalid(format!(
            "invalid size {w}x{h}: need at least {mw}x{mh} and at most {} a side",
            posenc_plot::MAX_SIDE
        )));
    }
    Ok((w, h))
}

/// Checks that the file can be created (before any long computation), so
/// that a bad path fails fast. Leaves no file behind.
pub fn check_writable(path: &Path) -> Result<()> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| VizError::Write {
            path: path.to_path_buf(),
            source,
        })?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Writes `fig` to `path` (format from the extension) at `size`, or at the
/// figure's natural size.
pub fn write_figure<F: Figure>(fig: &F, path: &Path, size: Option<(u32, u32)>) -> Result<()> {
    let (w, h) = size.unwrap_or_else(|| fig.default_size());
    match format_of(path)? {
        Format::Png => fig.to_png(path, w, h),
        Format::Svg => fig.to_svg(path, w, h),
    }?;
    Ok(())
}

/// Several figures stacked in rows (each row's figures side by side), with
/// a title on top: one picture for `compare`.
pub struct Grid<'a> {
    /// Title drawn above everything.
    pub title: String,
    /// Rows of `(figure, width, height)`.
    pub rows: Vec<Vec<(&'a dyn Figure, u32, u32)>>,
}

const GRID_TITLE: u32 = 36;

impl Grid<'_> {
    /// Total size.
    pub fn size(&self) -> (u32, u32) {
        let w = self
            .rows
            .iter()
            .map(|r| r.iter().map(|c| c.1).sum::<u32>())
            .max()
            .unwrap_or(0);
        let h = GRID_TITLE + self.rows.iter().map(row_height).sum::<u32>();
        (w, h)
    }

    /// Renders to an RGB picture.
    pub fn to_rgb(&self) -> Result<RgbImage> {
        let (w, h) = self.size();
        let mut pixels = vec![255u8; (w * h * 3) as usize];
        let mut y0 = GRID_TITLE;
        for row in &self.rows {
            let mut x0 = 0;
            for &(fig, fw, fh) in row {
                let img = fig.to_rgb(fw, fh)?;
                for y in 0..fh {
                    let src = (y * fw * 3) as usize;
                    let dst = (((y0 + y) * w + x0) * 3) as usize;
                    pixels[dst..dst + (fw * 3) as usize]
                        .copy_from_slice(&img.pixels[src..src + (fw * 3) as usize]);
                }
                x0 += fw;
            }
            y0 += row_height(row);
        }
        // The title, drawn by rendering a one-cell heatmap would be clumsy;
        // render it through an SVG-free path: a title-only line plot strip.
        let strip = title_strip(&self.title, w)?;
        pixels[..strip.pixels.len()].copy_from_slice(&strip.pixels);
        Ok(RgbImage {
            width: w,
            height: h,
            pixels,
        })
    }

    /// Renders to an SVG document (the figures nested as `<svg>` elements).
    pub fn to_svg_string(&self) -> Result<String> {
        let (w, h) = self.size();
        let mut out = format!(
            "<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" xmlns=\"http://www.w3.org/2000/svg\">\n\
             <rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"#FFFFFF\"/>\n\
             <text x=\"{}\" y=\"24\" font-family=\"DejaVu Sans, sans-serif\" font-size=\"20\" text-anchor=\"middle\">{}</text>\n",
            w / 2,
            xml_escape(&self.title)
        );
        let mut y0 = GRID_TITLE;
        for row in &self.rows {
            let mut x0 = 0;
            for &(fig, fw, fh) in row {
                let svg = fig.to_svg_string(fw, fh)?;
                let start = svg
                    .find("<svg")
                    .ok_or_else(|| invalid("the SVG back end wrote no <svg> element"))?;
                let body = &svg[start + 4..];
                out.push_str(&format!("<svg x=\"{x0}\" y=\"{y0}\""));
                out.push_str(body);
                if !body.ends_with('\n') {
                    out.push('\n');
                }
                x0 += fw;
            }
            y0 += row_height(row);
        }
        out.push_str("</svg>\n");
        Ok(out)
    }

    /// Writes to `path` (format from the extension).
    pub fn write(&self, path: &Path) -> Result<()> {
        let bytes = match format_of(path)? {
            Format::Png => self.to_rgb()?.to_png_bytes()?,
            Format::Svg => self.to_svg_string()?.into_bytes(),
        };
        std::fs::write(path, bytes).map_err(|source| VizError::Write {
            path: path.to_path_buf(),
            source,
        })
    }
}

fn row_height(row: &Vec<(&dyn Figure, u32, u32)>) -> u32 {
    row.iter().map(|c| c.2).max().unwrap_or(0)
}

/// A white strip `width × GRID_TITLE` with `title` centred: drawn as a
/// titled empty panel picture's top part.
fn title_strip(title: &str, width: u32) -> Result<RgbImage> {
    // A 1×1 heatmap with the title, drawn tall enough; only its top
    // GRID_TITLE rows (the title) are kept.
    let map = posenc_plot::Heatmap::new(vec![vec![0.0]])?.title(title);
    let img = map.to_rgb(width.max(posenc_plot::MIN_SIZE.0), 400)?;
    let mut pixels = Vec::with_capacity((width * GRID_TITLE * 3) as usize);
    for y in 0..GRID_TITLE {
        let start = (y * img.width * 3) as usize;
        pixels.extend_from_slice(&img.pixels[start..start + (width * 3) as usize]);
    }
    Ok(RgbImage {
        width,
        height: GRID_TITLE,
        pixels,
    })
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
