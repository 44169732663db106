//! `posenc show ENCODING`: a heatmap of the encoding, in the terminal or
//! written to a PNG / SVG file.

use std::path::PathBuf;

use clap::Args;
use posenc_plot::{binary_analogy, Heatmap, Panels};

use super::encodings::{build, parse_spec, EncodingOpts, Picture};
use super::output::{check_writable, format_of, parse_size, write_figure, ColorChoice};

/// Arguments of `posenc show`.
#[derive(Args, Debug, Clone)]
pub struct ShowArgs {
    /// The encoding: sinusoidal, rope, alibi, t5, shaw, learned, floater,
    /// xpos, binary or rope2d (`rope2d:variant=axial|pixtral|llama4`),
    /// optionally with `:KEY=VALUE,...`.
    pub encoding: String,
    /// Encoding options.
    #[command(flatten)]
    pub opts: EncodingOpts,
    /// Write the picture to FILE.png or FILE.svg instead of the terminal.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Picture size WIDTHxHEIGHT in pixels (default: the natural size).
    #[arg(long)]
    pub size: Option<String>,
    /// Terminal colours.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    /// `rope2d`: the grid of patches, HxW (default 16x16).
    #[arg(long)]
    pub grid: Option<String>,
    /// `rope2d`: the patch compared with every other, ROW,COL (default the centre).
    #[arg(long)]
    pub patch: Option<String>,
}

/// Default model dimension of `show`.
pub const DEFAULT_DIM: usize = 16;
/// Default number of positions of `show`.
pub const DEFAULT_POSITIONS: usize = 32;

/// Runs `posenc show`.
pub fn show(a: ShowArgs) -> Result<(), String> {
    let size = a.size.as_deref().map(parse_size).transpose()?;
    if let Some(path) = &a.output {
        format_of(path)?;
        check_writable(path)?;
    }
    let pic = if super::rope2d::is_rope2d(&a.encoding) {
        super::rope2d::picture(
            &a.encoding,
            a.grid.as_deref(),
            a.patch.as_deref(),
            a.opts.dim,
            a.opts.theta,
        )?
    } else {
        if a.grid.is_some() || a.patch.is_some() {
            return Err("--grid and --patch are options of `posenc show rope2d`".into());
        }
        let spec = parse_spec(&a.encoding, &a.opts)?;
        let enc = build(&spec, DEFAULT_DIM, DEFAULT_POSITIONS)?;
        enc.picture()?
    };
    match &a.output {
        Some(path) => {
            write_picture(&pic, path, size)?;
            println!("wrote {} ({})", path.display(), pic.title);
            Ok(())
        }
        None => {
            print!("{}", terminal(&pic, a.color)?);
            Ok(())
        }
    }
}

/// The figure of a picture: one heatmap, several side by side, or the
/// binary analogy.
pub fn write_picture(
    pic: &Picture,
    path: &std::path::Path,
    size: Option<(u32, u32)>,
) -> Result<(), String> {
    if let Some(bits) = &pic.bits {
        let fig =
            binary_analogy(bits.clone(), pic.panels[0].data.clone()).map_err(|e| e.to_string())?;
        return write_figure(&fig, path, size);
    }
    if pic.panels.len() == 1 {
        return write_figure(&pic.panels[0].heatmap()?, path, size);
    }
    let maps = pic
        .panels
        .iter()
        .map(|p| p.heatmap())
        .collect::<Result<Vec<Heatmap>, String>>()?;
    let fig = Panels::new(maps)
        .map_err(|e| e.to_string())?
        .title(pic.title.clone());
    write_figure(&fig, path, size)
}

/// The terminal rendering of a picture: for each panel a title line, the
/// half-block (or plain) heatmap with its legend, and a line naming the axes.
pub fn terminal(pic: &Picture, color: ColorChoice) -> Result<String, String> {
    let mode = color.mode();
    let mut out = String::new();
    if pic.panels.len() > 1 || pic.bits.is_some() {
        out.push_str(&pic.title);
        out.push('\n');
    }
    let mut panels: Vec<(String, Heatmap, String)> = Vec::new();
    if let Some(bits) = &pic.bits {
        let map = Heatmap::new(bits.clone())
            .map_err(|e| e.to_string())?
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
        out.push_str(&map.to_terminal(mode).map_err(|e| e.to_string())?);
        out.push_str(axes);
        out.push('\n');
    }
    Ok(out)
}
