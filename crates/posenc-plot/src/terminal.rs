//! Heatmaps in the terminal.
//!
//! Colour modes draw two matrix rows per text line with the upper half block
//! `▀`: its foreground colour is the upper row, its background the lower row,
//! so cells come out roughly square. [`TerminalMode::Plain`] maps each value
//! to a character of [`PLAIN_RAMP`], one line per row. Every rendering ends
//! with a legend line giving the values at the two ends of the colour scale:
//!
//! ```text
//! min -1 ███████████ max 1      (colour modes: 11 swatches, low → high)
//! min -1 [ .:-=+*#%@] max 1     (plain mode: the ramp, low → high)
//! ```
//!
//! Row `i` of the data is line `i` of the picture (pairs of rows per line in
//! colour modes); use [`crate::Heatmap::to_terminal`] for the
//! introductory articles' orientation (data rows as columns).
//!
//! ```
//! use posenc_plot::terminal::{render, TerminalMode};
//! let s = render(&[vec![0.0, 0.5, 1.0]], TerminalMode::Plain)?;
//! assert_eq!(s, " +@\nmin 0 [ .:-=+*#%@] max 1\n");
//! # Ok::<(), posenc_plot::PlotError>(())
//! ```

use std::fmt::Write as _;
use std::io::IsTerminal;

use crate::colormap::{extremes, Colormap, Rgb, Scale, ValueRange};
use crate::error::{check_matrix, Result};
use crate::format::format_value;

/// Characters of plain mode, from the lowest value to the highest.
pub const PLAIN_RAMP: &str = " .:-=+*#%@";

/// Number of colour swatches in the legend of the colour modes (samples of
/// the colour map at `k / 10`, `k = 0..=10`).
pub const LEGEND_SWATCHES: usize = 11;

const RESET: &str = "\x1b[0m";

/// How to draw in the terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminalMode {
    /// 24-bit colour escapes (`ESC[38;2;R;G;Bm`).
    TrueColor,
    /// The xterm 256-colour palette (`ESC[38;5;Nm`).
    Ansi256,
    /// No escapes: one character of [`PLAIN_RAMP`] per value.
    Plain,
}

impl TerminalMode {
    /// Picks the mode for this process's standard output, from the
    /// environment: see [`TerminalMode::detect_from`].
    pub fn detect() -> TerminalMode {
        TerminalMode::detect_from(|k| std::env::var(k).ok(), std::io::stdout().is_terminal())
    }

    /// Picks the mode from environment variables (looked up with `var`) and
    /// whether standard output is a terminal, in this order:
    ///
    /// 1. `NO_COLOR` set and non-empty → `Plain` (<https://no-color.org>);
    /// 2. output not a terminal → `Plain`;
    /// 3. `TERM` unset, empty or `dumb` → `Plain`;
    /// 4. `COLORTERM` is `truecolor` or `24bit` → `TrueColor`;
    /// 5. otherwise → `Ansi256`.
    ///
    /// ```
    /// use posenc_plot::terminal::TerminalMode;
    /// let env = |k: &str| match k {
    ///     "TERM" => Some("xterm-256color".to_string()),
    ///     "COLORTERM" => Some("truecolor".to_string()),
    ///     _ => None,
    /// };
    /// assert_eq!(TerminalMode::detect_from(env, true), TerminalMode::TrueColor);
    /// assert_eq!(TerminalMode::detect_from(env, false), TerminalMode::Plain);
    /// ```
    pub fn detect_from(var: impl Fn(&str) -> Option<String>, stdout_is_terminal: bool) -> Self {
        if var("NO_COLOR").is_some_and(|v| !v.is_empty()) || !stdout_is_terminal {
            return TerminalMode::Plain;
        }
        let term = var("TERM").unwrap_or_default();
        if term.is_empty() || term == "dumb" {
            return TerminalMode::Plain;
        }
        let colorterm = var("COLORTERM").unwrap_or_default().to_ascii_lowercase();
        if colorterm == "truecolor" || colorterm == "24bit" {
            TerminalMode::TrueColor
        } else {
            TerminalMode::Ansi256
        }
    }
}

/// Renders `data` (rows × columns) with the diverging [`Colormap::RdBu`]
/// over the data's own range ([`ValueRange::Auto`]).
///
/// Errors: [`crate::PlotError::Empty`], [`crate::PlotError::Ragged`],
/// [`crate::PlotError::NonFinite`]. A constant matrix maps to the middle
/// of the colour map (ramp character `+`).
pub fn render(data: &[Vec<f64>], mode: TerminalMode) -> Result<String> {
    render_with(data, mode, Colormap::RdBu, ValueRange::Auto)
}

/// Renders `data` (rows × columns) with a chosen colour map and value range.
///
/// Errors as [`render`], plus [`crate::PlotError::InvalidRange`] for a bad
/// fixed range.
pub fn render_with(
    data: &[Vec<f64>],
    mode: TerminalMode,
    colormap: Colormap,
    range: ValueRange,
) -> Result<String> {
    let (_, cols) = check_matrix(data, "matrix")?;
    let (min, max) = extremes(data);
    let scale = Scale::resolve(range, min, max)?;
    let mut out = String::new();
    let (lo, hi) = (format_value(scale.lo), format_value(scale.hi));
    match mode {
        TerminalMode::Plain => {
            let ramp: Vec<char> = PLAIN_RAMP.chars().collect();
            for row in data {
                for &v in row {
                    let k = ((scale.t(v) * ramp.len() as f64) as usize).min(ramp.len() - 1);
                    out.push(ramp[k]);
                }
                out.push('\n');
            }
            let _ = writeln!(out, "min {lo} [{PLAIN_RAMP}] max {hi}");
        }
        TerminalMode::TrueColor | TerminalMode::Ansi256 => {
            let colour = |v: f64| colormap.at(scale.t(v));
            for pair in data.chunks(2) {
                for c in 0..cols {
                    fg(&mut out, mode, colour(pair[0][c]));
                    if let Some(lower) = pair.get(1) {
                        bg(&mut out, mode, colour(lower[c]));
                    }
                    out.push('▀');
                }
                out.push_str(RESET);
                out.push('\n');
            }
            let _ = write!(out, "min {lo} ");
            for k in 0..LEGEND_SWATCHES {
                fg(
                    &mut out,
                    mode,
                    colormap.at(k as f64 / (LEGEND_SWATCHES - 1) as f64),
                );
                out.push('█');
            }
            let _ = writeln!(out, "{RESET} max {hi}");
        }
    }
    Ok(out)
}

fn fg(out: &mut String, mode: TerminalMode, c: Rgb) {
    sgr_colour(out, mode, 38, c);
}

fn bg(out: &mut String, mode: TerminalMode, c: Rgb) {
    sgr_colour(out, mode, 48, c);
}

/// Writes the escape that sets the colour `c`: the foreground for `layer`
/// 38, the background for 48.
fn sgr_colour(out: &mut String, mode: TerminalMode, layer: u8, c: Rgb) {
    match mode {
        TerminalMode::TrueColor => {
            let _ = write!(out, "\x1b[{layer};2;{};{};{}m", c.0, c.1, c.2);
        }
        _ => {
            let _ = write!(out, "\x1b[{layer};5;{}m", ansi256_index(c));
        }
    }
}

/// The xterm 256-colour palette index nearest to `c`: the nearer (squared
/// RGB distance, ties to the cube) of the 6×6×6 colour cube (indices
/// 16–231, levels 0, 95, 135, 175, 215, 255) and the 24-step grey ramp
/// (232–255, levels 8, 18, …, 238).
///
/// ```
/// use posenc_plot::{terminal::ansi256_index, Rgb};
/// assert_eq!(ansi256_index(Rgb(255, 0, 0)), 196);
/// assert_eq!(ansi256_index(Rgb(128, 128, 128)), 244);
/// ```
pub fn ansi256_index(c: Rgb) -> u8 {
    const LEVELS: [i32; 6] = [0, 95, 135, 175, 215, 255];
    let nearest_level = |v: u8| -> usize {
        let v = v as i32;
        (0..6).min_by_key(|&i| (LEVELS[i] - v).abs()).unwrap_or(0)
    };
    let (r, g, b) = (c.0 as i32, c.1 as i32, c.2 as i32);
    let (qr, qg, qb) = (nearest_level(c.0), nearest_level(c.1), nearest_level(c.2));
    let cube = (LEVELS[qr], LEVELS[qg], LEVELS[qb]);
    let dist = |(x, y, z): (i32, i32, i32)| (x - r).pow(2) + (y - g).pow(2) + (z - b).pow(2);
    let avg = (r + g + b) / 3;
    let gi = ((avg - 8 + 5) / 10).clamp(0, 23);
    let grey = 8 + 10 * gi;
    if dist((grey, grey, grey)) < dist(cube) {
        (232 + gi) as u8
    } else {
        (16 + 36 * qr + 6 * qg + qb) as u8
    }
}
