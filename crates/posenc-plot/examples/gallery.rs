//! Renders every figure type into a folder (default `target/gallery`):
//! `cargo run -p posenc-plot --example gallery [DIR]`.

use posenc_plot::terminal::TerminalMode;
use posenc_plot::{
    binary_analogy, BarChart, BarSeries, Figure, Heatmap, LinePlot, Result, Series, ValueRange,
};

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

    // RoPE-style frequencies on a log axis, with markers and a band.
    let freq = |base: f64| -> Vec<(f64, f64)> {
        (0..32)
            .map(|i| (i as f64, base.powf(-(i as f64) / 32.0)))
            .collect()
    };
    let band: Vec<(f64, f64, f64)> = freq(10_000.0)
        .into_iter()
        .map(|(x, y)| (x, y * 0.6, y * 1.6))
        .collect();
    let lines = LinePlot::new()
        .title("Rotary frequencies θ_i = base^(−2i/d)")
        .x_label("pair index i")
        .y_label("θ_i (radians per token)")
        .log_y(true)
        .series(Series::new("base 10 000", freq(10_000.0)).band(band))
        .series(Series::new("base 500 000", freq(500_000.0)).markers(true));
    lines.to_png(format!("{dir}/lines.png"), 720, 450)?;
    lines.to_svg(format!("{dir}/lines.svg"), 720, 450)?;
    let loglog = LinePlot::new()
        .title("Perplexity vs length")
        .x_label("sequence length")
        .y_label("perplexity")
        .log_x(true)
        .series(
            Series::new(
                "RoPE",
                vec![(128.0, 12.0), (512.0, 11.0), (2048.0, 10.5), (8192.0, 60.0)],
            )
            .markers(true),
        )
        .series(
            Series::new(
                "ALiBi",
                vec![(128.0, 12.5), (512.0, 11.2), (2048.0, 10.9), (8192.0, 10.8)],
            )
            .markers(true),
        );
    loglog.to_png(format!("{dir}/loglog.png"), 720, 450)?;

    let bars = BarChart::new(vec![
        "64".into(),
        "256".into(),
        "1024".into(),
        "4096".into(),
    ])
    .title("Copy-task accuracy by sequence length")
    .x_label("sequence length")
    .y_label("accuracy")
    .series(
        BarSeries::new("sinusoidal", vec![0.97, 0.81, 0.35, 0.08])
            .errors(vec![0.01, 0.04, 0.06, 0.03]),
    )
    .series(
        BarSeries::new("RoPE", vec![0.98, 0.90, 0.52, 0.12]).errors(vec![0.01, 0.03, 0.07, 0.04]),
    )
    .series(
        BarSeries::new("ALiBi", vec![0.96, 0.94, 0.91, 0.88]).errors(vec![0.02, 0.02, 0.03, 0.03]),
    );
    let (w, h) = bars.default_size();
    bars.to_png(format!("{dir}/bars.png"), w, h)?;
    bars.to_svg(format!("{dir}/bars.svg"), w, h)?;

    let bits: Vec<Vec<f64>> = (0..32)
        .map(|p| (0..5).map(|k| ((p >> k) & 1) as f64).collect())
        .collect();
    let fig = binary_analogy(bits, sinusoidal(32, 16))?;
    let (w, h) = fig.default_size();
    fig.to_png(format!("{dir}/binary_analogy.png"), w, h)?;
    fig.to_svg(format!("{dir}/binary_analogy.svg"), w, h)?;
    // An attention-like square map (ALiBi-style distance bias), viridis.
    let n = 64;
    let bias: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| -((i as f64) - (j as f64)).abs() / 8.0)
                .collect()
        })
        .collect();
    Heatmap::new(bias)?
        .title("Distance bias −|i − j| / 8")
        .x_label("key position j")
        .y_label("query position i")
        .colorbar_label("bias")
        .colormap(posenc_plot::Colormap::Viridis)
        .orientation(posenc_plot::Orientation::RowsAsRows)
        .cell_size(8)
        .render_png(format!("{dir}/bias.png"))?;

    // Small and large renderings of the same figures, to check the layout.
    map.to_png(format!("{dir}/heatmap_small.png"), 360, 240)?;
    lines.to_png(format!("{dir}/lines_small.png"), 360, 240)?;
    bars.to_png(format!("{dir}/bars_large.png"), 1600, 900)?;
    println!("wrote {dir}/{{heatmap,lines,loglog,bars,binary_analogy}}.{{png,svg}}");
    Ok(())
}
