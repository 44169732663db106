//! `posenc show rope2d --grid HxW`: how similar one image patch is to every
//! other under a 2-D RoPE.
//!
//! For a 2-D RoPE with frequencies `θ_j` on axes `a(j)` ([`AxialFrequencies`]),
//! the similarity of patch `p` to patch `q` is the expected normalised dot
//! product of a vector rotated to `p` and the same vector rotated to `q`:
//!
//! ```text
//! s(p, q) = (1/n) Σ_j cos(θ_j · (p[a(j)] − q[a(j)]))
//! ```
//!
//! 1 at `q = p`, decaying (with ripples) along rows and columns. Variants:
//! `axial` (Heo et al. 2024; the Qwen-VL encoders' layout, the default),
//! `axial-interleaved`, `pixtral`, `llama4`.

use posenc::rope::axial::{AxialFrequencies, AxisSplit};
use posenc::rope::vision::{llama4_vision, pixtral};
use posenc::rope::PairLayout;
use posenc_plot::{Colormap, Orientation, ValueRange};

use crate::encodings::{Panel, Picture};
use crate::error::{invalid, Result};

/// Largest grid side drawn.
pub const MAX_SIDE: usize = 512;

/// Whether an ENCODING spec names the 2-D RoPE picture.
pub fn is_rope2d(spec: &str) -> bool {
    let name = spec
        .split(':')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(name.as_str(), "rope2d" | "rope-2d" | "2d-rope")
}

/// Parses `HxW`.
pub fn parse_grid(s: &str) -> Result<(usize, usize)> {
    let bad = || invalid(format!("invalid grid {s:?}: expected HxW, e.g. 16x16"));
    let (h, w) = s.split_once(['x', 'X', '×']).ok_or_else(bad)?;
    let p = |v: &str| v.trim().parse::<usize>().map_err(|_| bad());
    let (h, w) = (p(h)?, p(w)?);
    for v in [h, w] {
        if v == 0 || v > MAX_SIDE {
            return Err(invalid(format!(
                "invalid grid {h}x{w}: each side from 1 to {MAX_SIDE}"
            )));
        }
    }
    Ok((h, w))
}

/// Parses `ROW,COL`.
fn parse_patch(s: &str, h: usize, w: usize) -> Result<(usize, usize)> {
    let bad = || invalid(format!("invalid patch {s:?}: expected ROW,COL, e.g. 3,5"));
    let (r, c) = s.split_once([',', '.']).ok_or_else(bad)?;
    let r: usize = r.trim().parse().map_err(|_| bad())?;
    let c: usize = c.trim().parse().map_err(|_| bad())?;
    if r >= h || c >= w {
        return Err(invalid(format!(
            "patch ({r}, {c}) is outside the {h}x{w} grid"
        )));
    }
    Ok((r, c))
}

/// The picture: one heatmap, rows = patch rows, columns = patch columns.
pub fn picture(
    spec: &str,
    grid: Option<&str>,
    patch: Option<&str>,
    dim: Option<usize>,
    theta: Option<f64>,
) -> Result<Picture> {
    let (mut variant, mut dim, mut theta) = (
        "axial".to_string(),
        dim.unwrap_or(64),
        theta.unwrap_or(100.0),
    );
    if let Some((_, rest)) = spec.split_once(':') {
        for item in rest.split(',').filter(|s| !s.trim().is_empty()) {
            let (k, v) = item.split_once('=').unwrap_or((item, ""));
            match k.trim() {
                "variant" => variant = v.trim().to_string(),
                "dim" => {
                    dim = v
                        .trim()
                        .parse()
                        .map_err(|_| invalid(format!("invalid dim {v:?}")))?
                }
                "theta" => {
                    theta = v
                        .trim()
                        .parse()
                        .map_err(|_| invalid(format!("invalid theta {v:?}")))?
                }
                other => {
                    return Err(invalid(format!(
                        "unknown option {other:?} for rope2d (variant, dim, theta)"
                    )))
                }
            }
        }
    }
    let (h, w) = parse_grid(grid.unwrap_or("16x16"))?;
    let (pr, pc) = match patch {
        Some(p) => parse_patch(p, h, w)?,
        None => (h / 2, w / 2),
    };
    let f: AxialFrequencies = match variant.as_str() {
        "axial" | "qwen" | "qwen-vl" => {
            AxialFrequencies::axial(theta, dim, 2, AxisSplit::Chunked, PairLayout::HalfSplit)?
        }
        "axial-interleaved" => {
            AxialFrequencies::axial(theta, dim, 2, AxisSplit::Interleaved, PairLayout::HalfSplit)?
        }
        "pixtral" => pixtral(theta, dim)?,
        "llama4" => llama4_vision(theta, dim)?,
        other => {
            return Err(invalid(format!(
                "unknown rope2d variant {other:?}; known: axial, axial-interleaved, pixtral, llama4"
            )))
        }
    };
    let n = f.num_freqs() as f64;
    let data: Vec<Vec<f64>> = (0..h)
        .map(|r| {
            (0..w)
                .map(|c| {
                    let d = [r as f64 - pr as f64, c as f64 - pc as f64];
                    f.inv_freq()
                        .iter()
                        .zip(f.axes())
                        .map(|(&t, &a)| (t as f64 * d[a]).cos())
                        .sum::<f64>()
                        / n
                })
                .collect()
        })
        .collect();
    let title = format!(
        "2-D RoPE ({variant}, d = {dim}, θ = {theta}): similarity of patch ({pr}, {pc}) to every patch of a {h}×{w} grid"
    );
    Ok(Picture {
        title: title.clone(),
        panels: vec![Panel {
            title,
            data,
            x_label: "patch column w".into(),
            y_label: "patch row h".into(),
            colorbar_label: "mean cos of the angle differences".into(),
            orientation: Orientation::RowsAsRows,
            colormap: Colormap::RdBu,
            range: ValueRange::Symmetric,
        }],
        bits: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn similarity_is_one_at_the_patch_and_symmetric() {
        let p = picture("rope2d", Some("9x7"), Some("4,3"), Some(16), Some(100.0)).unwrap();
        let d = &p.panels[0].data;
        assert_eq!((d.len(), d[0].len()), (9, 7));
        assert!((d[4][3] - 1.0).abs() < 1e-12);
        // symmetric around the patch, and below 1 elsewhere
        assert!((d[2][3] - d[6][3]).abs() < 1e-12 && (d[4][1] - d[4][5]).abs() < 1e-12);
        assert!(d.iter().flatten().all(|&v| v <= 1.0 + 1e-12));
        assert!(d[0][0] < 1.0);
        for v in ["pixtral", "llama4", "axial-interleaved"] {
            assert!(picture(
                &format!("rope2d:variant={v}"),
                Some("4x4"),
                None,
                Some(16),
                None
            )
            .is_ok());
        }
        assert!(picture("rope2d:variant=bogus", None, None, None, None).is_err());
        assert!(picture("rope2d", Some("0x4"), None, None, None).is_err());
        assert!(picture("rope2d", Some("4x4"), Some("4,0"), None, None).is_err());
        assert!(picture("rope2d", Some("4x4"), None, Some(18), None).is_err());
        assert!(is_rope2d("rope2d:variant=pixtral") && !is_rope2d("rope"));
    }
}
