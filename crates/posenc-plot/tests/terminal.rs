//! The terminal renderer, checked character for character against
//! hand-written expectations.
//!
//! Colours are the ColorBrewer RdBu anchors (11 classes: 67001f b2182b
//! d6604d f4a582 fddbc7 f7f7f7 d1e5f0 92c5de 4393c3 2166ac 053061); the test
//! matrices hit anchors exactly (value v on the scale [-1, 1] is the anchor
//! at t = (v + 1) / 2). The 256-colour indices were worked out by hand
//! from the cube levels 0, 95, 135, 175, 215, 255 and the grey ramp.

use posenc_plot::terminal::{ansi256_index, render, render_with, TerminalMode, PLAIN_RAMP};
use posenc_plot::{Colormap, PlotError, Rgb, ValueRange};

const ESC: &str = "\x1b";

fn tc_fg(r: u8, g: u8, b: u8) -> String {
    format!("{ESC}[38;2;{r};{g};{b}m")
}
fn tc_bg(r: u8, g: u8, b: u8) -> String {
    format!("{ESC}[48;2;{r};{g};{b}m")
}

/// The 2 × 3 matrix: every value sits on an RdBu anchor of [-1, 1].
fn m23() -> Vec<Vec<f64>> {
    vec![vec![-1.0, -0.8, 0.0], vec![0.2, 0.8, 1.0]]
}

#[test]
fn truecolor_2x3_exact() {
    let got = render(&m23(), TerminalMode::TrueColor).unwrap();
    let want = "\x1b[38;2;103;0;31m\x1b[48;2;209;229;240m▀\
                \x1b[38;2;178;24;43m\x1b[48;2;33;102;172m▀\
                \x1b[38;2;247;247;247m\x1b[48;2;5;48;97m▀\
                \x1b[0m\n\
                min -1 \
                \x1b[38;2;103;0;31m█\x1b[38;2;178;24;43m█\x1b[38;2;214;96;77m█\
                \x1b[38;2;244;165;130m█\x1b[38;2;253;219;199m█\x1b[38;2;247;247;247m█\
                \x1b[38;2;209;229;240m█\x1b[38;2;146;197;222m█\x1b[38;2;67;147;195m█\
                \x1b[38;2;33;102;172m█\x1b[38;2;5;48;97m█\
                \x1b[0m max 1\n";
    assert_eq!(got, want);
}

#[test]
fn ansi256_2x3_exact() {
    let got = render(&m23(), TerminalMode::Ansi256).unwrap();
    let want = "\x1b[38;5;52m\x1b[48;5;189m▀\
                \x1b[38;5;124m\x1b[48;5;25m▀\
                \x1b[38;5;231m\x1b[48;5;23m▀\
                \x1b[0m\n\
                min -1 \
                \x1b[38;5;52m█\x1b[38;5;124m█\x1b[38;5;167m█\x1b[38;5;216m█\
                \x1b[38;5;224m█\x1b[38;5;231m█\x1b[38;5;189m█\x1b[38;5;116m█\
                \x1b[38;5;67m█\x1b[38;5;25m█\x1b[38;5;23m█\
                \x1b[0m max 1\n";
    assert_eq!(got, want);
}

#[test]
fn plain_2x3_exact() {
    // t = 0, 0.25, 0.5 / 0.625, 0.85, 1 → ramp indices 0, 2, 5 / 6, 8, 9.
    let m = vec![vec![-1.0, -0.5, 0.0], vec![0.25, 0.7, 1.0]];
    let got = render(&m, TerminalMode::Plain).unwrap();
    assert_eq!(got, " :+\n*%@\nmin -1 [ .:-=+*#%@] max 1\n");
}

#[test]
fn odd_row_count_leaves_last_background_unset() {
    let m = vec![vec![-1.0], vec![0.0], vec![1.0]];
    let got = render(&m, TerminalMode::TrueColor).unwrap();
    let first_lines: String = got.lines().take(2).collect::<Vec<_>>().join("\n");
    let want = format!(
        "{}{}▀{ESC}[0m\n{}▀{ESC}[0m",
        tc_fg(103, 0, 31),
        tc_bg(247, 247, 247),
        tc_fg(5, 48, 97)
    );
    assert_eq!(first_lines, want);
    assert_eq!(got.lines().count(), 3, "2 picture lines + legend");
}

#[test]
fn constant_matrix_is_mid_scale_without_division_by_zero() {
    let m = vec![vec![2.0, 2.0], vec![2.0, 2.0]];
    assert_eq!(
        render(&m, TerminalMode::Plain).unwrap(),
        "++\n++\nmin 2 [ .:-=+*#%@] max 2\n"
    );
    let tc = render(&m, TerminalMode::TrueColor).unwrap();
    let line = tc.lines().next().unwrap();
    let cell = format!("{}{}▀", tc_fg(247, 247, 247), tc_bg(247, 247, 247));
    assert_eq!(line, format!("{cell}{cell}{ESC}[0m"));
}

#[test]
fn fixed_and_symmetric_ranges_and_other_maps() {
    // Greys over a fixed [0, 1]: 0 → white, 1 → black; out-of-range clamps.
    let m = vec![vec![0.0, 1.0, 7.0]];
    let got = render_with(
        &m,
        TerminalMode::TrueColor,
        Colormap::Greys,
        ValueRange::Fixed { min: 0.0, max: 1.0 },
    )
    .unwrap();
    let line = got.lines().next().unwrap();
    assert_eq!(
        line,
        format!(
            "{}▀{}▀{}▀{ESC}[0m",
            tc_fg(255, 255, 255),
            tc_fg(0, 0, 0),
            tc_fg(0, 0, 0)
        )
    );
    // Symmetric: [0, 0.5] is shown on [-0.5, 0.5], so 0 is the middle.
    let s = render_with(
        &[vec![0.0, 0.5]],
        TerminalMode::Plain,
        Colormap::RdBu,
        ValueRange::Symmetric,
    )
    .unwrap();
    assert_eq!(s, "+@\nmin -0.5 [ .:-=+*#%@] max 0.5\n");
}

#[test]
fn bad_input_is_a_typed_error() {
    assert!(matches!(
        render(&[], TerminalMode::Plain),
        Err(PlotError::Empty { .. })
    ));
    assert!(matches!(
        render(&[vec![]], TerminalMode::Plain),
        Err(PlotError::Empty { .. })
    ));
    assert!(matches!(
        render(&[vec![1.0, 2.0], vec![3.0]], TerminalMode::TrueColor),
        Err(PlotError::Ragged {
            row: 1,
            expected: 2,
            found: 1
        })
    ));
    match render(&[vec![1.0, f64::NAN]], TerminalMode::Ansi256) {
        Err(PlotError::NonFinite { location, .. }) => assert_eq!(location, "row 0, column 1"),
        other => panic!("expected NonFinite, got {other:?}"),
    }
    assert!(matches!(
        render(&[vec![f64::INFINITY]], TerminalMode::Plain),
        Err(PlotError::NonFinite { .. })
    ));
    assert!(matches!(
        render_with(
            &[vec![1.0]],
            TerminalMode::Plain,
            Colormap::RdBu,
            ValueRange::Fixed { min: 2.0, max: 1.0 }
        ),
        Err(PlotError::InvalidRange { .. })
    ));
}

#[test]
fn ansi256_palette_corners() {
    assert_eq!(ansi256_index(Rgb(0, 0, 0)), 16);
    assert_eq!(ansi256_index(Rgb(255, 255, 255)), 231);
    assert_eq!(ansi256_index(Rgb(0, 0, 255)), 21);
    assert_eq!(ansi256_index(Rgb(8, 8, 8)), 232);
    assert_eq!(ansi256_index(Rgb(238, 238, 238)), 255);
    assert_eq!(ansi256_index(Rgb(95, 135, 175)), 16 + 36 + 12 + 3);
}

#[test]
fn plain_ramp_has_ten_levels() {
    assert_eq!(PLAIN_RAMP.chars().count(), 10);
    // 10 evenly spaced values in [0, 1) hit each character once.
    let row: Vec<f64> = (0..10).map(|k| k as f64 / 10.0 + 0.05).collect();
    let mut m = vec![row];
    m[0].push(0.0);
    m[0].push(1.0);
    let s = render(&m, TerminalMode::Plain).unwrap();
    assert_eq!(s.lines().next().unwrap(), " .:-=+*#%@ @");
}

#[test]
fn detect_follows_the_environment() {
    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }
    use TerminalMode::*;
    let d = |p: &[(&str, &str)], tty| TerminalMode::detect_from(env(p), tty);
    assert_eq!(
        d(
            &[("TERM", "xterm-256color"), ("COLORTERM", "truecolor")],
            true
        ),
        TrueColor
    );
    assert_eq!(
        d(&[("TERM", "xterm"), ("COLORTERM", "24bit")], true),
        TrueColor
    );
    assert_eq!(
        d(&[("TERM", "xterm"), ("COLORTERM", "TrueColor")], true),
        TrueColor
    );
    assert_eq!(d(&[("TERM", "xterm-256color")], true), Ansi256);
    assert_eq!(d(&[("TERM", "screen")], true), Ansi256);
    assert_eq!(
        d(&[("TERM", "dumb"), ("COLORTERM", "truecolor")], true),
        Plain
    );
    assert_eq!(d(&[], true), Plain);
    assert_eq!(
        d(
            &[("TERM", "xterm-256color"), ("COLORTERM", "truecolor")],
            false
        ),
        Plain
    );
    assert_eq!(
        d(
            &[
                ("TERM", "xterm-256color"),
                ("COLORTERM", "truecolor"),
                ("NO_COLOR", "1")
            ],
            true
        ),
        Plain
    );
    // An empty NO_COLOR does not count (no-color.org).
    assert_eq!(
        d(&[("TERM", "xterm-256color"), ("NO_COLOR", "")], true),
        Ansi256
    );
}
