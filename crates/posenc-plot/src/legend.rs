//! A legend drawn as a row (or rows) of entries above a chart, so that it
//! never hides data.

use plotters::backend::DrawingBackend;
use plotters::coord::Shift;
use plotters::drawing::DrawingArea;
use plotters::element::{Circle, PathElement, Rectangle};
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{Color, RGBColor};

use crate::error::{PlotError, Result};
use crate::fonts::{self, Fonts};

/// What the swatch of an entry looks like.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Swatch {
    /// A line, with a dot if the series has markers.
    Line { marker: bool },
    /// A filled box (bars).
    Box,
}

/// One legend entry.
pub(crate) struct Entry {
    pub name: String,
    pub color: RGBColor,
    pub swatch: Swatch,
}

/// Draws `entries` centred in rows at the top of `area` and returns the area
/// below. No entries (or only unnamed ones): returns `area` unchanged.
pub(crate) fn legend_row<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[Entry],
    f: &Fonts,
) -> Result<DrawingArea<DB, Shift>> {
    let entries: Vec<&Entry> = entries.iter().filter(|e| !e.name.is_empty()).collect();
    if entries.is_empty() {
        return Ok(area.clone());
    }
    let be = PlotError::backend;
    let style = fonts::regular(f.tick);
    let sw = (f.tick * 1.8).round() as i32; // swatch width
    let gap = (f.tick * 0.5).round() as i32; // swatch ↔ text
    let space = (f.tick * 1.6).round() as i32; // between entries
    let (w, _) = area.dim_in_pixel();
    let avail = w as i32 - 2 * space;
    // Entry widths and rows.
    let widths: Vec<i32> = entries
        .iter()
        .map(|e| {
            let tw = area
                .estimate_text_size(&e.name, &style)
                .map(|(tw, _)| tw as i32)
                .unwrap_or_else(|_| Fonts::width(&e.name, f.tick) as i32);
            sw + gap + tw
        })
        .collect();
    let mut rows: Vec<Vec<usize>> = vec![Vec::new()];
    let mut used = 0;
    for (i, &ew) in widths.iter().enumerate() {
        let extra = if used == 0 { ew } else { space + ew };
        if used > 0 && used + extra > avail {
            rows.push(Vec::new());
            used = 0;
        }
        used += if used == 0 { ew } else { space + ew };
        rows.last_mut().unwrap().push(i);
    }
    let line_h = (f.tick * 1.6).round() as i32;
    let band = line_h * rows.len() as i32 + (f.tick * 0.4).round() as i32;
    let (top, rest) = area.split_vertically(band);
    for (r, row) in rows.iter().enumerate() {
        let total: i32 =
            row.iter().map(|&i| widths[i]).sum::<i32>() + space * (row.len() as i32 - 1);
        let mut x = (w as i32 - total) / 2;
        let y = line_h * r as i32 + line_h / 2 + (f.tick * 0.2) as i32;
        for &i in row {
            let e = entries[i];
            match e.swatch {
                Swatch::Line { marker } => {
                    let stroke = (f.tick / 6.0).round().max(1.5) as u32;
                    top.draw(&PathElement::new(
                        vec![(x, y), (x + sw, y)],
                        e.color.stroke_width(stroke),
                    ))
                    .map_err(be)?;
                    if marker {
                        let rad = (f.tick / 4.0).round().max(2.0) as i32;
                        top.draw(&Circle::new((x + sw / 2, y), rad, e.color.filled()))
                            .map_err(be)?;
                    }
                }
                Swatch::Box => {
                    let s = (f.tick * 0.45).round() as i32;
                    top.draw(&Rectangle::new(
                        [(x + sw / 2 - s, y - s), (x + sw / 2 + s, y + s)],
                        e.color.filled(),
                    ))
                    .map_err(be)?;
                }
            }
            top.draw_text(
                &e.name,
                &style.pos(Pos::new(HPos::Left, VPos::Center)),
                (x + sw + gap, y),
            )
            .map_err(be)?;
            x += widths[i] + space;
        }
    }
    Ok(rest)
}
