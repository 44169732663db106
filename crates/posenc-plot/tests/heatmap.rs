//! Heatmaps rendered to PNG and SVG, checked as pictures and documents.

use crate::common;

use common::*;
use posenc_plot::{Colormap, Figure, Heatmap, Orientation, PlotError, Rgb, Ticks, ValueRange};

const RED: Rgb = Rgb(0x67, 0x00, 0x1f); // RdBu low end
const BLUE: Rgb = Rgb(0x05, 0x30, 0x61); // RdBu high end
const WHITE_MID: Rgb = Rgb(0xf7, 0xf7, 0xf7); // RdBu middle

fn sinusoidal(positions: usize, dims: usize) -> Vec<Vec<f64>> {
    (0..positions)
        .map(|p| {
            (0..dims)
                .map(|d| {
                    let w = 1.0 / 10_000f64.powf((d / 2 * 2) as f64 / dims as f64);
                    if d % 2 == 0 {
                        (p as f64 * w).sin()
                    } else {
                        (p as f64 * w).cos()
                    }
                })
                .collect()
        })
        .collect()
}

fn seeds_map() -> Heatmap {
    Heatmap::new(sinusoidal(32, 16))
        .unwrap()
        .title("Sinusoidal encoding")
        .x_label("position")
        .y_label("dimension")
        .range(ValueRange::Symmetric)
}

#[test]
fn png_has_the_exact_size_and_is_not_blank() {
    let map = seeds_map();
    for (w, h) in [(640, 360), (1000, 500), (321, 203)] {
        let bytes = map.to_png_bytes(w, h).unwrap();
        let (dw, dh, pixels) = decode_png(&bytes);
        assert_eq!((dw, dh), (w, h));
        assert_eq!(pixels.len(), (w * h * 3) as usize);
        let img = map.to_rgb(w, h).unwrap();
        assert_eq!(img.pixels, pixels, "PNG holds exactly the rendered pixels");
        assert!(distinct_colours(&img) > 50, "a heatmap has many colours");
    }
}

#[test]
fn title_text_is_drawn_with_the_embedded_font() {
    let with = seeds_map().to_rgb(640, 360).unwrap();
    // Same layout (a title band is kept for a blank title) but no glyphs.
    let blank = seeds_map().title(" ").to_rgb(640, 360).unwrap();
    // The title band is the top ~32 px; the title is centred.
    let ink = dark_pixels(&with, 160, 480, 0, 30);
    assert!(ink > 150, "title ink pixels: {ink}");
    assert_eq!(dark_pixels(&blank, 160, 480, 0, 30), 0);
    // Axis labels: "position" under the cells, centred.
    let bottom = dark_pixels(&with, 200, 440, 330, 360);
    assert!(bottom > 60, "x label ink pixels: {bottom}");
}

#[test]
fn natural_size_render_png_and_svg_files() {
    let tmp = tempfile::Builder::new()
        .prefix("posenc-plot-heatmap-")
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    let map = seeds_map().cell_size(20);
    let (w, h) = map.natural_size();
    // 32 columns of 20 px plus the margins, 16 rows of 20 px plus margins.
    assert!(w > 32 * 20 && w < 32 * 20 + 300, "{w}");
    assert!(h > 16 * 20 && h < 16 * 20 + 200, "{h}");
    let png_path = dir.join("map.png");
    map.render_png(&png_path).unwrap();
    let (dw, dh, _) = decode_png(&std::fs::read(&png_path).unwrap());
    assert_eq!((dw, dh), (w, h));
    let svg_path = dir.join("map.svg");
    map.render_svg(&svg_path).unwrap();
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let texts = svg_texts(&svg, w, h);
    assert!(texts.iter().any(|t| t == "Sinusoidal encoding"));
    assert!(texts.iter().any(|t| t == "position"));
    assert!(texts.iter().any(|t| t == "dimension"));
    // Colour-bar scale labels.
    assert!(texts.iter().any(|t| t == "1.0") && texts.iter().any(|t| t == "-1.0"));
    assert!(
        svg_count(&svg, "rect") >= 32 * 16,
        "one rect per cell at least"
    );
}

#[test]
fn svg_string_escapes_and_names_the_title() {
    let map = Heatmap::new(vec![vec![0.0, 1.0]])
        .unwrap()
        .title("a < b & c");
    let svg = map.to_svg_string(300, 200).unwrap();
    let texts = svg_texts(&svg, 300, 200);
    assert!(texts.iter().any(|t| t == "a < b & c"), "{texts:?}");
}

#[test]
fn default_orientation_draws_rows_as_columns() {
    // Row 0 all at the low end, row 1 all at the high end.
    let data = vec![vec![-1.0; 3], vec![1.0; 3]];
    let seeds = Heatmap::new(data.clone())
        .unwrap()
        .to_rgb(400, 300)
        .unwrap();
    let (nr, rx, _) = centroid(&seeds, RED);
    let (nb, bx, _) = centroid(&seeds, BLUE);
    assert!(nr > 1000 && nb > 1000, "{nr} {nb}");
    assert!(rx + 50.0 < bx, "row 0 left of row 1: {rx} vs {bx}");

    let matrix = Heatmap::new(data.clone())
        .unwrap()
        .orientation(Orientation::RowsAsRows)
        .to_rgb(400, 300)
        .unwrap();
    let (_, _, ry) = centroid(&matrix, RED);
    let (_, _, by) = centroid(&matrix, BLUE);
    assert!(ry + 30.0 < by, "row 0 above row 1: {ry} vs {by}");

    let transposed = Heatmap::new(data)
        .unwrap()
        .transpose()
        .to_rgb(400, 300)
        .unwrap();
    assert_eq!(transposed, matrix);
}

#[test]
fn constant_matrix_renders_mid_colour() {
    let map = Heatmap::new(vec![vec![0.3; 4]; 3]).unwrap();
    let img = map.to_rgb(400, 300).unwrap();
    let (n, _, _) = centroid(&img, WHITE_MID);
    assert!(n > 10_000, "cells in the middle colour: {n}");
    assert!(map.to_svg_string(400, 300).is_ok());
    assert!(map
        .to_terminal(posenc_plot::terminal::TerminalMode::Plain)
        .is_ok());
    let zeros = Heatmap::new(vec![vec![0.0]]).unwrap();
    assert!(zeros.to_rgb(200, 150).is_ok());
}

#[test]
fn fixed_range_clamps_and_colormaps_differ() {
    let data = vec![vec![-5.0, 5.0]];
    let map = Heatmap::new(data).unwrap().range(ValueRange::Fixed {
        min: -1.0,
        max: 1.0,
    });
    let img = map.to_rgb(400, 300).unwrap();
    assert!(centroid(&img, RED).0 > 1000 && centroid(&img, BLUE).0 > 1000);
    let viridis = map
        .clone()
        .colormap(Colormap::Viridis)
        .to_rgb(400, 300)
        .unwrap();
    assert!(centroid(&viridis, Rgb(0x44, 0x01, 0x54)).0 > 1000);
    assert!(centroid(&viridis, Rgb(0xfd, 0xe7, 0x25)).0 > 1000);
}

#[test]
fn custom_and_disabled_ticks() {
    let map = Heatmap::new(vec![vec![0.0, 1.0], vec![2.0, 3.0]])
        .unwrap()
        .x_ticks(Ticks::Custom(vec![
            (0, "first".into()),
            (1, "second".into()),
        ]))
        .y_ticks(Ticks::None);
    let svg = map.to_svg_string(400, 300).unwrap();
    let texts = svg_texts(&svg, 400, 300);
    assert!(texts.iter().any(|t| t == "first") && texts.iter().any(|t| t == "second"));
    let every = Heatmap::new(vec![vec![0.0; 10]; 2])
        .unwrap()
        .orientation(Orientation::RowsAsRows)
        .x_ticks(Ticks::Every(3));
    let texts = svg_texts(&every.to_svg_string(500, 300).unwrap(), 500, 300);
    for t in ["0", "3", "6", "9"] {
        assert!(texts.iter().any(|s| s == t), "tick {t} in {texts:?}");
    }
    assert!(!texts.iter().any(|s| s == "4"));
}

#[test]
fn bad_input_is_a_typed_error() {
    assert!(matches!(Heatmap::new(vec![]), Err(PlotError::Empty { .. })));
    assert!(matches!(
        Heatmap::new(vec![vec![]]),
        Err(PlotError::Empty { .. })
    ));
    assert!(matches!(
        Heatmap::new(vec![vec![1.0], vec![1.0, 2.0]]),
        Err(PlotError::Ragged { row: 1, .. })
    ));
    assert!(matches!(
        Heatmap::new(vec![vec![f64::NAN]]),
        Err(PlotError::NonFinite { .. })
    ));
    let map = Heatmap::new(vec![vec![1.0]])
        .unwrap()
        .range(ValueRange::Fixed {
            min: 0.0,
            max: f64::NAN,
        });
    let range = [
        map.to_rgb(300, 200).err(),
        map.to_svg_string(300, 200).err(),
    ];
    for e in &range {
        assert!(matches!(e, Some(PlotError::InvalidRange { .. })), "{e:?}");
    }
    let ok = Heatmap::new(vec![vec![1.0]]).unwrap();
    for e in [ok.to_rgb(10, 10).err(), ok.to_rgb(100_000, 300).err()] {
        assert!(matches!(e, Some(PlotError::InvalidSize { .. })), "{e:?}");
    }
    let tmp = tempfile::Builder::new()
        .prefix("posenc-plot-heatmap-")
        .tempdir()
        .unwrap();
    let missing = tmp.path().join("posenc-plot-no-such-dir/x/y.png");
    assert!(matches!(ok.render_png(&missing), Err(PlotError::Io { .. })));
}

#[test]
fn many_cells_in_few_pixels_still_render() {
    let big = vec![vec![0.5; 2000]; 3];
    let img = Heatmap::new(big).unwrap().to_rgb(300, 200).unwrap();
    assert_eq!((img.width, img.height), (300, 200));
}
