//! The embedded font and the text sizes of a figure.

use std::sync::OnceLock;

use plotters::style::{register_font, FontDesc, FontFamily, FontStyle, TextStyle};

use crate::error::{PlotError, Result};

static REGULAR: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");
static BOLD: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans-Bold.ttf");

/// Text colour: near-black, like matplotlib's.
pub(crate) const INK: plotters::style::RGBColor = plotters::style::RGBColor(0x22, 0x22, 0x22);

/// Registers DejaVu Sans (regular and bold) as plotters' `sans-serif`
/// family, once per process.
pub(crate) fn ensure() -> Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        register_font("sans-serif", FontStyle::Normal, REGULAR).is_ok()
            && register_font("sans-serif", FontStyle::Bold, BOLD).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::Backend(
            "the embedded DejaVu Sans font could not be loaded".into(),
        ))
    }
}

/// Font sizes (pixels) of one figure, scaled with its size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fonts {
    pub tick: f64,
    pub label: f64,
    pub title: f64,
}

impl Fonts {
    /// Sizes for a `w × h` picture: 13/15/18 px at 640 px (the smaller of
    /// the width and 1.6 × the height), scaled linearly, within 0.75×–3×.
    pub fn for_size(w: u32, h: u32) -> Fonts {
        let s = ((w as f64).min(h as f64 * 1.6) / 640.0).clamp(0.75, 3.0);
        Fonts {
            tick: 13.0 * s,
            label: 15.0 * s,
            title: 18.0 * s,
        }
    }

    /// Approximate width in pixels of `text` at size `size` (DejaVu Sans
    /// averages about 0.62 em per character for digits and lower case).
    pub fn width(text: &str, size: f64) -> f64 {
        text.chars().count() as f64 * size * 0.62
    }

    /// Room for an axis (or colour bar) label `text`: none when it is empty.
    pub fn desc(&self, text: &str) -> f64 {
        if text.is_empty() {
            0.0
        } else {
            self.label * 1.7
        }
    }
}

pub(crate) fn regular(size: f64) -> TextStyle<'static> {
    TextStyle::from(FontDesc::new(
        FontFamily::SansSerif,
        size,
        FontStyle::Normal,
    ))
    .color(&INK)
}

pub(crate) fn bold(size: f64) -> TextStyle<'static> {
    TextStyle::from(FontDesc::new(FontFamily::SansSerif, size, FontStyle::Bold)).color(&INK)
}

/// Draws `title` (bold, centred) in a band at the top of `area` and returns
/// the area below it; returns `area` itself for an empty title.
pub(crate) fn title_band<DB: plotters::backend::DrawingBackend>(
    area: &plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    f: &Fonts,
) -> Result<plotters::drawing::DrawingArea<DB, plotters::coord::Shift>> {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    if title.is_empty() {
        return Ok(area.clone());
    }
    let band = (f.title * 2.0).round();
    let (w, _) = area.dim_in_pixel();
    // Shrink a title that would not fit (down to 60 % of the size).
    let room = w as f64 * 0.96;
    let size = match area.estimate_text_size(title, &bold(f.title)) {
        Ok((tw, _)) if tw as f64 > room => f.title * (room / tw as f64).max(0.6),
        _ => f.title,
    };
    let (top, rest) = area.split_vertically(band as i32);
    top.draw_text(
        title,
        &bold(size).pos(Pos::new(HPos::Center, VPos::Center)),
        (w as i32 / 2, (band * 0.55) as i32),
    )
    .map_err(PlotError::backend)?;
    Ok(rest)
}

/// matplotlib's "tab10" colour cycle.
pub(crate) const PALETTE: [crate::colormap::Rgb; 10] = [
    crate::colormap::Rgb::hex(0x1f77b4),
    crate::colormap::Rgb::hex(0xff7f0e),
    crate::colormap::Rgb::hex(0x2ca02c),
    crate::colormap::Rgb::hex(0xd62728),
    crate::colormap::Rgb::hex(0x9467bd),
    crate::colormap::Rgb::hex(0x8c564b),
    crate::colormap::Rgb::hex(0xe377c2),
    crate::colormap::Rgb::hex(0x7f7f7f),
    crate::colormap::Rgb::hex(0xbcbd22),
    crate::colormap::Rgb::hex(0x17becf),
];

/// Light grey for grid lines and legend frames.
pub(crate) const GRID: plotters::style::RGBColor = plotters::style::RGBColor(0xdd, 0xdd, 0xdd);
