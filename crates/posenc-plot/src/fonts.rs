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
