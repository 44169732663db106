//! Property tests (proptest with a fixed seed, so runs are reproducible),
//! at edge sizes 1, 2, 3, 127, 128, 129.

use crate::common;

use common::decode_png;
use posenc_plot::terminal::{render, TerminalMode, PLAIN_RAMP};
use posenc_plot::{format_value, Colormap, Figure, Heatmap};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// `cases` cases from a fixed ChaCha seed.
fn runner(cases: u32) -> TestRunner {
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7u8; 32]);
    TestRunner::new_with_rng(Config::with_cases(cases), rng)
}

const EDGE: [usize; 6] = [1, 2, 3, 127, 128, 129];

/// A matrix with an edge-sized shape and values in ±1e6.
fn matrix() -> impl Strategy<Value = Vec<Vec<f64>>> {
    (
        prop::sample::select(EDGE.to_vec()),
        prop::sample::select(EDGE.to_vec()),
    )
        .prop_flat_map(|(r, c)| prop::collection::vec(prop::collection::vec(-1e6..1e6f64, c), r))
}

#[test]
fn terminal_output_has_the_matrix_shape() {
    runner(48)
        .run(&matrix(), |m| {
            let (rows, cols) = (m.len(), m[0].len());
            let plain = render(&m, TerminalMode::Plain).unwrap();
            let lines: Vec<&str> = plain.lines().collect();
            prop_assert_eq!(lines.len(), rows + 1);
            for line in &lines[..rows] {
                prop_assert_eq!(line.chars().count(), cols);
                prop_assert!(line.chars().all(|ch| PLAIN_RAMP.contains(ch)));
            }
            // The extremes are drawn with the ends of the ramp.
            prop_assert!(plain.contains('@'));
            for mode in [TerminalMode::TrueColor, TerminalMode::Ansi256] {
                let s = render(&m, mode).unwrap();
                let lines: Vec<&str> = s.lines().collect();
                prop_assert_eq!(lines.len(), rows.div_ceil(2) + 1);
                for line in &lines[..lines.len() - 1] {
                    prop_assert_eq!(line.matches('▀').count(), cols);
                    prop_assert!(line.ends_with("\x1b[0m"));
                }
                let legend = lines[lines.len() - 1];
                prop_assert_eq!(legend.matches('█').count(), 11);
                prop_assert!(legend.starts_with("min "));
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn heatmaps_of_edge_shapes_render_at_the_asked_size() {
    let sizes = (120u32..900, 90u32..700);
    runner(12)
        .run(&(matrix(), sizes), |(m, (w, h))| {
            let map = Heatmap::new(m).unwrap().title("t");
            let (dw, dh, _) = decode_png(&map.to_png_bytes(w, h).unwrap());
            prop_assert_eq!((dw, dh), (w, h));
            let (nw, nh) = map.natural_size();
            prop_assert!(nw >= 240 && nh >= 160);
            Ok(())
        })
        .unwrap();
}

#[test]
fn sequential_maps_are_monotone_in_brightness() {
    runner(256)
        .run(&(0.0..1.0f64, 0.0..1.0f64), |(a, b)| {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let lum = |c: posenc_plot::Rgb| {
                0.2126 * c.0 as f64 + 0.7152 * c.1 as f64 + 0.0722 * c.2 as f64
            };
            // Greys darkens, viridis brightens, both monotonically (±1 for rounding).
            prop_assert!(lum(Colormap::Greys.at(lo)) + 1.0 >= lum(Colormap::Greys.at(hi)));
            prop_assert!(lum(Colormap::Viridis.at(lo)) <= lum(Colormap::Viridis.at(hi)) + 1.0);
            Ok(())
        })
        .unwrap();
}

#[test]
fn format_value_is_close_to_the_value() {
    runner(512)
        .run(
            &prop_oneof![-1e9..1e9f64, -10.0..10.0f64, -1e-2..1e-2f64],
            |v| {
                let s = format_value(v);
                let back: f64 = s.parse().unwrap();
                // 3 decimals (abs 5e-4) or 3 significant digits (rel 5e-3).
                let tol = (5e-4f64).max(v.abs() * 5e-3);
                prop_assert!((back - v).abs() <= tol, "{} -> {} -> {}", v, s, back);
                prop_assert!(s != "-0");
                Ok(())
            },
        )
        .unwrap();
}
