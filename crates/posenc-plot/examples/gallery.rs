//! Renders every figure type into a folder (default `target/gallery`):
//! `cargo run -p posenc-plot --example gallery [DIR]`.

use posenc_plot::terminal::TerminalMode;
use posenc_plot::{Figure, Heatmap, Result, ValueRange};

fn sinusoidal(positions: usize, dims: usize) -> Vec<Vec<f64>> {
    (0..positions)
        .map(|p| {
            (0..dims)
                .map(|d| {
                    let i = (d / 2) as f64;
                    let angle = p as f64 / 10_000f64.powf(2.0 * i / dims as f64);
                    if d % 2 == 0 {
                        angle.sin()
                    } else {
                        angle.cos()
                    }
                })
                .collect()
        })
        .collect()
}

fn main() -> Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "target/gallery".to_string());
    std::fs::create_dir_all(&dir).map_err(|source| posenc_plot::PlotError::Io {
        path: dir.clone().into(),
        source,
    })?;
    let table = sinusoidal(32, 16);
    let map = Heatmap::new(table)?
        .title("Sinusoidal positional encoding (32 tokens × 16 dims)")
        .x_label("token position")
        .y_label("embedding dimension")
        .colorbar_label("value")
        .range(ValueRange::Symmetric);
    map.render_png(format!("{dir}/heatmap.png"))?;
    map.render_svg(format!("{dir}/heatmap.svg"))?;
    map.to_png(format!("{dir}/heatmap_1200x500.png"), 1200, 500)?;
    print!("{}", map.to_terminal(TerminalMode::detect())?);
    Ok(())
}
