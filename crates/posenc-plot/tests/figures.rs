//! Line plots, bar charts and panels: PNG size and content, SVG structure,
//! typed errors.

use crate::common;

use common::*;
use posenc_plot::{
    binary_analogy, BarChart, BarSeries, Figure, Heatmap, LinePlot, Panels, PlotError, Rgb, Series,
};

const TAB_BLUE: Rgb = Rgb(0x1f, 0x77, 0xb4);
const TAB_ORANGE: Rgb = Rgb(0xff, 0x7f, 0x0e);

fn lines() -> LinePlot {
    LinePlot::new()
        .title("Frequencies")
        .x_label("pair index")
        .y_label("theta")
        .log_y(true)
        .series(Series::new(
            "base 10000",
            (0..16)
                .map(|i| (i as f64, 10_000f64.powf(-(i as f64) / 16.0)))
                .collect(),
        ))
        .series(
            Series::new(
                "base 500000",
                (0..16)
                    .map(|i| (i as f64, 500_000f64.powf(-(i as f64) / 16.0)))
                    .collect(),
            )
            .markers(true)
            .band(
                (0..16)
                    .map(|i| {
                        (
                            i as f64,
                            0.5 * 500_000f64.powf(-(i as f64) / 16.0),
                            2.0 * 500_000f64.powf(-(i as f64) / 16.0),
                        )
                    })
                    .collect(),
            ),
        )
}

fn bars() -> BarChart {
    BarChart::new(vec!["short".into(), "long".into()])
        .title("Accuracy")
        .x_label("length")
        .y_label("accuracy")
        .series(BarSeries::new("A", vec![1.0, 2.0]).errors(vec![0.1, 0.2]))
        .series(BarSeries::new("B", vec![0.5, 0.5]))
}

fn analogy() -> Panels {
    let bits = (0..16)
        .map(|p| (0..4).map(|k| ((p >> k) & 1) as f64).collect())
        .collect();
    let table = (0..16)
        .map(|p| {
            (0..8)
                .map(|d| (p as f64 / 10f64.powf(d as f64 / 2.0)).sin())
                .collect()
        })
        .collect();
    binary_analogy(bits, table).unwrap()
}

/// Every figure type through the common trait: exact PNG size, not blank,
/// a parseable SVG whose root is <svg> and which holds the title.
#[test]
fn every_figure_renders_to_png_and_svg() {
    let heat = Heatmap::new(vec![vec![0.0, 1.0], vec![2.0, 3.0]])
        .unwrap()
        .title("Heat");
    let figures: Vec<(Box<dyn Figure>, &str)> = vec![
        (Box::new(heat), "Heat"),
        (Box::new(lines()), "Frequencies"),
        (Box::new(bars()), "Accuracy"),
        (Box::new(analogy()), "Positions as bits and as sinusoids"),
    ];
    for (fig, title) in &figures {
        for (w, h) in [
            (640, 400),
            (333, 250),
            (fig.default_size().0, fig.default_size().1),
        ] {
            let (dw, dh, px) = decode_png(&fig.to_png_bytes(w, h).unwrap());
            assert_eq!((dw, dh), (w, h), "{title}");
            let img = posenc_plot::RgbImage {
                width: dw,
                height: dh,
                pixels: px,
            };
            assert!(
                distinct_colours(&img) > 20,
                "{title} at {w}×{h} looks blank"
            );
            assert!(dark_pixels(&img, 0, w, 0, h / 8) > 40, "{title}: title ink");
            let svg = fig.to_svg_string(w, h).unwrap();
            let texts = svg_texts(&svg, w, h);
            assert!(texts.iter().any(|t| t == title), "{title} not in {texts:?}");
        }
    }
}

#[test]
fn line_plot_content() {
    let plot = lines();
    let img = plot.to_rgb(720, 450).unwrap();
    assert!(
        centroid(&img, TAB_BLUE).0 > 300,
        "first series drawn in tab:blue"
    );
    assert!(
        centroid(&img, TAB_ORANGE).0 > 300,
        "second series in tab:orange"
    );
    let svg = plot.to_svg_string(720, 450).unwrap();
    let texts = svg_texts(&svg, 720, 450);
    for t in [
        "base 10000",
        "base 500000",
        "pair index",
        "theta",
        "1",
        "0.01",
        "1e-3",
    ] {
        assert!(texts.iter().any(|s| s == t), "{t} not in {texts:?}");
    }
    assert!(svg_count(&svg, "polygon") >= 1, "the band is a polygon");
    assert!(svg_count(&svg, "circle") >= 16, "markers are circles");
    assert!(svg_count(&svg, "polyline") >= 2, "one polyline per series");
}

#[test]
fn line_plot_single_point_and_log_x() {
    let one = LinePlot::new().series(Series::new("", vec![(3.0, 3.0)]));
    assert!(one.to_rgb(300, 200).is_ok());
    let logx = LinePlot::new()
        .log_x(true)
        .series(Series::new("s", vec![(1.0, 0.0), (1e4, 1.0)]));
    let texts = svg_texts(&logx.to_svg_string(500, 300).unwrap(), 500, 300);
    for t in ["1", "10", "100", "1000"] {
        assert!(texts.iter().any(|s| s == t), "{t} not in {texts:?}");
    }
}

#[test]
fn line_plot_errors() {
    assert!(matches!(
        LinePlot::new().to_rgb(300, 200),
        Err(PlotError::Empty { .. })
    ));
    assert!(matches!(
        LinePlot::new()
            .series(Series::new("e", vec![]))
            .to_rgb(300, 200),
        Err(PlotError::Empty { .. })
    ));
    assert!(matches!(
        LinePlot::new()
            .series(Series::new("n", vec![(0.0, f64::NAN)]))
            .to_svg_string(300, 200),
        Err(PlotError::NonFinite { .. })
    ));
    assert!(matches!(
        LinePlot::new()
            .log_y(true)
            .series(Series::new("z", vec![(0.0, 1.0), (1.0, 0.0)]))
            .to_rgb(300, 200),
        Err(PlotError::NonPositiveOnLogAxis { axis: "y", .. })
    ));
    assert!(matches!(
        LinePlot::new()
            .log_x(true)
            .series(Series::new("z", vec![(-1.0, 1.0)]))
            .to_rgb(300, 200),
        Err(PlotError::NonPositiveOnLogAxis { axis: "x", .. })
    ));
    assert!(matches!(
        LinePlot::new()
            .series(Series::new("b", vec![(0.0, 1.0)]).band(vec![(0.0, f64::INFINITY, 1.0)]))
            .to_rgb(300, 200),
        Err(PlotError::NonFinite { .. })
    ));
    assert!(matches!(
        LinePlot::new()
            .y_range(1.0, 1.0)
            .series(Series::new("r", vec![(0.0, 1.0)]))
            .to_rgb(300, 200),
        Err(PlotError::InvalidRange { .. })
    ));
}

#[test]
fn bar_heights_are_proportional_to_values() {
    // Series A is 1.0 in the left group and 2.0 in the right group; bars
    // start at 0, so the right bar has about twice the pixels.
    let chart = BarChart::new(vec!["left".into(), "right".into()])
        .series(BarSeries::new("A", vec![1.0, 2.0]));
    let img = chart.to_rgb(600, 400).unwrap();
    let (mut left, mut right) = (0usize, 0usize);
    for y in 0..img.height {
        for x in 0..img.width {
            if img.pixel(x, y) == Some(TAB_BLUE) {
                if x < img.width / 2 {
                    left += 1
                } else {
                    right += 1
                }
            }
        }
    }
    assert!(left > 1000, "{left}");
    let ratio = right as f64 / left as f64;
    assert!((ratio - 2.0).abs() < 0.1, "ratio {ratio}");
}

#[test]
fn bar_chart_svg_names_groups_series_and_has_error_bars() {
    let svg = bars().to_svg_string(600, 400).unwrap();
    let texts = svg_texts(&svg, 600, 400);
    for t in ["short", "long", "A", "B", "length", "accuracy"] {
        assert!(texts.iter().any(|s| s == t), "{t} not in {texts:?}");
    }
    // 4 bars + legend boxes.
    assert!(svg_count(&svg, "rect") >= 6);
    // 2 error bars × 3 strokes.
    assert!(svg_count(&svg, "polyline") >= 6);
}

#[test]
fn bar_chart_negative_and_zero_values() {
    let neg = BarChart::new(vec!["a".into(), "b".into()])
        .series(BarSeries::new("s", vec![-1.0, 2.0]).errors(vec![0.5, 0.0]));
    assert!(neg.to_rgb(400, 300).is_ok());
    let zero = BarChart::new(vec!["a".into()]).series(BarSeries::new("s", vec![0.0]));
    assert!(zero.to_rgb(400, 300).is_ok());
}

#[test]
fn bar_chart_errors() {
    assert!(matches!(
        BarChart::new(vec![])
            .series(BarSeries::new("s", vec![]))
            .to_rgb(300, 200),
        Err(PlotError::Empty { .. })
    ));
    assert!(matches!(
        BarChart::new(vec!["a".into()]).to_rgb(300, 200),
        Err(PlotError::Empty { .. })
    ));
    assert!(matches!(
        BarChart::new(vec!["a".into(), "b".into()])
            .series(BarSeries::new("s", vec![1.0]))
            .to_rgb(300, 200),
        Err(PlotError::LengthMismatch {
            expected: 2,
            found: 1,
            ..
        })
    ));
    assert!(matches!(
        BarChart::new(vec!["a".into()])
            .series(BarSeries::new("s", vec![1.0]).errors(vec![1.0, 2.0]))
            .to_rgb(300, 200),
        Err(PlotError::LengthMismatch { .. })
    ));
    assert!(matches!(
        BarChart::new(vec!["a".into()])
            .series(BarSeries::new("s", vec![1.0]).errors(vec![-0.1]))
            .to_rgb(300, 200),
        Err(PlotError::InvalidOption(_))
    ));
    assert!(matches!(
        BarChart::new(vec!["a".into()])
            .series(BarSeries::new("s", vec![f64::NAN]))
            .to_rgb(300, 200),
        Err(PlotError::NonFinite { .. })
    ));
}

#[test]
fn binary_analogy_has_bits_left_and_sinusoids_right() {
    let fig = analogy();
    let (w, h) = (900, 320);
    let img = fig.to_rgb(w, h).unwrap();
    let (nb, bx, _) = centroid(&img, Rgb(0, 0, 0));
    assert!(nb > 2000, "black bits: {nb}");
    assert!(bx < w as f64 / 2.0, "bits on the left: {bx}");
    let mut rdbu = 0;
    for y in 0..h {
        for x in w / 2..w {
            let Rgb(r, g, b) = img.pixel(x, y).unwrap();
            if (r as i32 - b as i32).abs() > 60 && g < 200 {
                rdbu += 1;
            }
        }
    }
    assert!(rdbu > 2000, "red/blue cells on the right: {rdbu}");
    let texts = svg_texts(&fig.to_svg_string(w, h).unwrap(), w, h);
    for t in [
        "Positions as bits and as sinusoids",
        "Binary code of the position",
        "Sinusoidal encoding",
    ] {
        assert!(texts.iter().any(|s| s == t), "{t} not in {texts:?}");
    }
}

#[test]
fn binary_analogy_and_panels_errors() {
    let bits = vec![vec![0.0, 1.0]; 4];
    let table = vec![vec![0.5; 3]; 5];
    assert!(matches!(
        binary_analogy(bits.clone(), table),
        Err(PlotError::LengthMismatch {
            expected: 4,
            found: 5,
            ..
        })
    ));
    assert!(matches!(
        binary_analogy(vec![vec![0.5]; 4], vec![vec![0.5]; 4]),
        Err(PlotError::InvalidOption(_))
    ));
    assert!(matches!(
        binary_analogy(vec![], vec![vec![0.5]]),
        Err(PlotError::Empty { .. })
    ));
    assert!(matches!(
        binary_analogy(bits, vec![vec![f64::NAN]; 4]),
        Err(PlotError::NonFinite { .. })
    ));
    assert!(matches!(Panels::new(vec![]), Err(PlotError::Empty { .. })));
}

#[test]
fn files_are_written() {
    let tmp = tempfile::Builder::new()
        .prefix("posenc-plot-figures-")
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    let plot = lines();
    plot.to_png(dir.join("l.png"), 400, 300).unwrap();
    plot.to_svg(dir.join("l.svg"), 400, 300).unwrap();
    let (w, h, _) = decode_png(&std::fs::read(dir.join("l.png")).unwrap());
    assert_eq!((w, h), (400, 300));
    let svg = std::fs::read_to_string(dir.join("l.svg")).unwrap();
    assert!(svg_texts(&svg, 400, 300).iter().any(|t| t == "Frequencies"));
}
