//! `posenc show ENCODING`: a heatmap of the encoding, in the terminal or
//! written to a PNG / SVG file.

use posenc_plot::terminal::TerminalMode;
use posenc_plot::{binary_analogy, Heatmap, Panels};

use crate::encodings::{build, parse_spec, EncodingOptions, Picture};
use crate::error::{invalid, Result};
use crate::output::write_figure;

/// What to picture: the options of `posenc show`.
#[derive(Debug, Clone, Default)]
pub struct ShowOptions {
    /// The encoding: sinusoidal, rope, alibi, t5, shaw, learned, floater,
    /// xpos, binary or rope2d (`rope2d:variant=axial|pixtral|llama4`),
    /// optionally with `:KEY=VALUE,...`.
    pub encoding: String,
    /// Encoding options (defaults: [`DEFAULT_DIM`] dimensions,
    /// [`DEFAULT_POSITIONS`] positions; `rope2d`: d = 64, θ = 100).
    pub encoding_options: EncodingOptions,
    /// `rope2d`: the grid of patches, `HxW` (default `16x16`).
    pub grid: Option<String>,
    /// `rope2d`: the patch compared with every other, `ROW,COL` (default the
    /// centre).
    pub patch: Option<String>,
}

/// Default model dimension of `show`.
pub const DEFAULT_DIM: usize = 16;
/// Default number of positions of `show`.
pub const DEFAULT_POSITIONS: usize = 32;

/// The picture `posenc show` draws: the encoding's heatmaps, or a 2-D
/// RoPE's patch similarity.
pub fn picture(a: &ShowOptions) -> Result<Picture> {
    if crate::rope2d::is_rope2d(&a.encoding) {
        crate::rope2d::picture(
            &a.encoding,
            a.grid.as_deref(),
            a.patch.as_deref(),
            a.encoding_options.dim,
            a.encoding_options.theta,
        )
    } else {
        if a.grid.is_some() || a.patch.is_some() {
            return Err(invalid(
                "--grid and --patch are options of `posenc show rope2d`",
            ));
        }
        let spec = parse_spec(&a.encoding, &a.encoding_options)?;
        let enc = build(&spec, DEFAULT_DIM, DEFAULT_POSITIONS)?;
        enc.picture()
    }
}

/// The figure of a picture: one heatmap, several side by side, or the
/// binary analogy.
pub fn write_picture(
    pic: &Picture,
    path: &std::path::Path,
    size: Option<(u32, u32)>,
) -> Result<()> {
    if let Some(bits) = &pic.bits {
        let fig = binary_analogy(bits.clone(), pic.panels[0].data.clone())?;
        return write_figure(&fig, path, size);
    }
    if pic.panels.len() == 1 {
        return write_figure(&pic.panels[0].heatmap()?, path, size);
    }
    let maps = pic
        .panels
        .iter()
        .map(|p| p.heatmap())
        .collect::<Result<Vec<Heatmap>>>()?;
    let fig = Panels::new(maps)?.title(pic.title.clone());
    write_figure(&fig, path, size)
}

/// The terminal rendering of a picture: for each panel a title line, the
/// half-block (or plain) heatmap with its legend, and a line naming the axes.
pub fn terminal(pic: &Picture, mode: TerminalMode) -> Result<String> {
    let mut out = String::new();
    if pic.panels.len() > 1 || pic.bits.is_some() {
        out.push_str(&pic.title);
        out.push('\n');
    }
    let mut panels: Vec<(String, Heatmap, String)> = Vec::new();
    if let Some(bits) = &pic.bits {
        let map = Heatmap::new(bits.clone())?
            .colormap(posenc_plot::Colormap::Greys)
            .range(posenc_plot::ValueRange::Fixed { min: 0.0, max: 1.0 });
        panels.push((
            "Binary code of the position".into(),
            map,
            "columns: position; rows: bit (lowest first)".into(),
        ));
    }
    for p in &pic.panels {
        let axes = match p.orientation {
            posenc_plot::Orientation::RowsAsColumns => {
                format!("columns: {}; rows: {}", p.x_label, p.y_label)
            }
            posenc_plot::Orientation::RowsAsRows => {
                format!("rows: {}; columns: {}", p.y_label, p.x_label)
            }
        };
        panels.push((p.title.clone(), p.heatmap()?, axes));
    }
    for (i, (title, map, axes)) in panels.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(title);
        out.push('\n');
        out.push_str(&map.to_terminal(mode)?);
        out.push_str(axes);
        out.push('\n');
    }
    Ok(out)
}
