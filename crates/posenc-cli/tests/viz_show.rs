//! `posenc show`: every family as PNG, SVG and terminal text; bad input.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common;

use common::{argv, ok, words};

const FAMILIES: &[(&str, &str)] = &[
    ("sinusoidal", "sinusoidal (interleaved), D = 16, base 10000"),
    ("rope", "RoPE default"),
    ("alibi", "ALiBi (causal"),
    ("t5", "T5 buckets"),
    ("shaw", "Shaw relative index"),
    ("learned", "learned table"),
    ("floater", "FLOATER"),
    ("xpos", "xPos"),
    ("binary", "Positions as bits and as sinusoids"),
];

/// `posenc` with `NO_COLOR` unset, so the terminal output's colour is tested.
fn posenc(args: &[&str]) -> Output {
    common::command(args)
        .env_remove("NO_COLOR")
        .output()
        .expect("run posenc")
}

/// The standard output of `posenc LINE` (split at white space), which must
/// succeed.
fn shown(line: &str) -> String {
    ok(&posenc(&words(line)))
}

/// Runs `posenc show FAM ARGS -o DIR/FAM.EXT`, which must succeed, and
/// returns the file's path.
fn show_to(dir: &Path, fam: &str, ext: &str, args: &[&str]) -> PathBuf {
    let path = dir.join(format!("{fam}.{ext}"));
    let mut all = vec!["show", fam];
    all.extend(args);
    all.extend(["-o", path.to_str().unwrap()]);
    ok(&posenc(&all));
    path
}

/// A new scratch directory for one test, removed when dropped.
fn tmpdir(name: &str) -> tempfile::TempDir {
    common::tempdir(&format!("viz-show-{name}"))
}

/// Exit code 2 and exactly one line on stderr, starting `posenc: error:`.
fn fails(args: &[&str], needle: &str) {
    let err = common::one_line_error(posenc(args), args);
    assert!(
        err.to_lowercase().contains(&needle.to_lowercase()),
        "{args:?}: {err} should mention {needle:?}"
    );
}

fn png_size(path: &Path) -> (u32, u32) {
    let dec = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = dec.read_info().expect("valid PNG header");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("PNG decodes");
    (info.width, info.height)
}

#[test]
fn every_family_writes_a_png_of_the_requested_size() {
    let tmp = tmpdir("png");
    let dir = tmp.path();
    for (fam, _) in FAMILIES {
        let path = show_to(dir, fam, "png", &["--size", "500x320"]);
        assert_eq!(png_size(&path), (500, 320), "{fam}");
    }
}

#[test]
fn every_family_writes_a_png_at_its_natural_size() {
    let tmp = tmpdir("png-natural");
    let dir = tmp.path();
    for (fam, _) in FAMILIES {
        let path = show_to(dir, fam, "png", &[]);
        let (w, h) = png_size(&path);
        // 32 positions of 18-pixel cells plus axes: wider than the cells.
        assert!(w >= 32 * 18 && h >= 160, "{fam}: {w}x{h}");
    }
}

#[test]
fn every_family_writes_an_svg_that_parses_and_holds_the_title() {
    let tmp = tmpdir("svg");
    let dir = tmp.path();
    for (fam, title) in FAMILIES {
        let path = show_to(dir, fam, "SVG", &[]);
        let text = std::fs::read_to_string(&path).unwrap();
        let doc = roxmltree::Document::parse(&text).expect("SVG parses");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let all_text: String = doc
            .descendants()
            .filter(|n| n.is_text())
            .filter_map(|n| n.text())
            .collect::<Vec<_>>()
            .join(" ");
        assert!(all_text.contains(title), "{fam}: title {title:?} missing");
    }
}

/// The plain ramp of posenc-plot: value v on scale [lo, hi] is character
/// `floor(10·(v − lo)/(hi − lo))`, capped at 9.
fn ramp(v: f64, lo: f64, hi: f64) -> char {
    let chars: Vec<char> = " .:-=+*#%@".chars().collect();
    let t = ((v - lo) / (hi - lo)).clamp(0.0, 1.0);
    chars[((t * 10.0) as usize).min(9)]
}

#[test]
fn shaw_index_matrix_in_plain_mode_is_exact() {
    // Shaw et al. 2018: row index clip(j − i, −k, k) + k; k = 1, 3 positions.
    let k = 1i64;
    let mut expected = String::from("Shaw relative index, k = 1\n");
    for i in 0..3i64 {
        for j in 0..3i64 {
            let idx = ((j - i).clamp(-k, k) + k) as f64;
            expected.push(ramp(idx, 0.0, 2.0 * k as f64));
        }
        expected.push('\n');
    }
    expected
        .push_str("min 0 [ .:-=+*#%@] max 2\nrows: query position i; columns: key position j\n");
    let out = shown("show shaw --k 1 --positions 3 --color plain");
    assert_eq!(out, expected);
}

#[test]
fn sinusoidal_table_in_plain_mode_is_exact() {
    // D = 2: dimension 0 is sin(p), dimension 1 is cos(p); position p is column p.
    let n = 7;
    let vals: Vec<[f64; 2]> = (0..n)
        .map(|p| [(p as f64).sin(), (p as f64).cos()])
        .collect();
    let m = vals.iter().flatten().fold(0.0f64, |a, v| a.max(v.abs()));
    let mut expected = String::from("sinusoidal (interleaved), D = 2, base 10000\n");
    for d in 0..2 {
        for row in &vals {
            expected.push(ramp(row[d], -m, m));
        }
        expected.push('\n');
    }
    expected.push_str("min -1 [ .:-=+*#%@] max 1\ncolumns: position; rows: dimension\n");
    let out = shown("show sinusoidal --dim 2 --positions 7 --color plain");
    assert_eq!(out, expected);
}

#[test]
fn alibi_plain_rows_follow_the_slope_formula() {
    // One head: slope 2^-8; causal bias m·(j − i) on a 4 × 4 grid.
    let out = shown("show alibi --heads 1 --positions 4 --color plain");
    let m = 2f64.powi(-8);
    let lines: Vec<&str> = out.lines().collect();
    for i in 0..4 {
        let row: String = (0..4)
            .map(|j| ramp(m * (j as f64 - i as f64), -3.0 * m, 3.0 * m))
            .collect();
        assert_eq!(lines[1 + i], row, "row {i}");
    }
}

#[test]
fn terminal_colour_modes_can_be_forced_and_auto_is_plain_in_a_pipe() {
    let tc = shown("show rope --positions 8 --dim 4 --color truecolor");
    assert!(tc.contains("\x1b[38;2;") && tc.contains("\x1b[48;2;") && tc.contains('▀'));
    let c256 = shown("show rope --positions 8 --dim 4 --color 256");
    assert!(c256.contains("\x1b[38;5;") && !c256.contains("\x1b[38;2;"));
    // stdout is a pipe here: auto detection must give plain text.
    let auto = ok(&posenc(&["show", "rope", "--positions", "8", "--dim", "4"]));
    assert!(!auto.contains('\x1b'));
    // RoPE has a cos and a sin panel of d/2 = 2 pairs each.
    assert!(auto.contains("cos(m·θ_i)") && auto.contains("sin(m·θ_i)"));
    let first_panel: Vec<&str> = auto.lines().skip(2).take(2).collect();
    assert!(first_panel.iter().all(|l| l.chars().count() == 8), "{auto}");
}

#[test]
fn binary_terminal_has_the_bits_of_each_position() {
    let out = shown("show binary --positions 8 --color plain");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[1], "Binary code of the position");
    // 8 positions need 3 bits; bit k of position p is '@' (1) or ' ' (0).
    for k in 0..3 {
        let row: String = (0..8)
            .map(|p| if (p >> k) & 1 == 1 { '@' } else { ' ' })
            .collect();
        assert_eq!(lines[2 + k], row, "bit {k}");
    }
}

#[test]
fn specs_override_options_and_read_hf_configs() {
    let out = shown("show rope:scaling=yarn,factor=8 --positions 4 --color plain");
    assert!(
        out.starts_with("RoPE yarn, θ = 10000, d = 16 (half-split), factor 8\n"),
        "{out}"
    );
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/viz-fixtures/yarn-8.config.json"
    );
    let out = ok(&posenc(&argv(
        "show rope --config {} --positions 4 --color plain",
        &[cfg],
    )));
    assert!(
        out.starts_with("RoPE yarn, θ = 10000, d = 128 (half-split), factor 8\n"),
        "{out}"
    );
    // 64 pairs: each panel has 64 lines of 4 characters.
    let cos_lines = out
        .lines()
        .skip(2)
        .take_while(|l| !l.starts_with("min"))
        .count();
    assert_eq!(cos_lines, 64);
    let out = shown("show alibi:bidirectional,heads=4,head=3 --positions 2 --color plain");
    assert!(
        out.starts_with("ALiBi (bidirectional), head 3 of 4, slope 0.004\n"),
        "{out}"
    );
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let tmp = tmpdir("bad");
    let dir = tmp.path();
    let png = dir.join("x.png");
    let png = png.to_str().unwrap();
    for (line, needle) in [
        ("show nope", "unknown encoding"),
        ("show sinusoidal --dim 0", "dim = 0"),
        ("show learned --positions 0", "positions = 0"),
        ("show rope --dim 15", "rotary_dim = 15"),
        ("show xpos --dim 7", "head_dim = 7"),
        ("show rope -o /nonexistent-dir/x.png", "cannot write"),
        ("show rope --scaling bogus", "unknown scaling"),
        ("show rope --theta=-1", "rope_theta"),
        ("show rope --scaling yarn --factor 0", "factor"),
        ("show rope --config /nonexistent/config.json", "cannot read"),
        ("show alibi --heads 0", "heads = 0"),
        ("show alibi --heads 2 --head 2", "head = 2"),
        ("show t5 --buckets 1", "bucket"),
        ("show t5 --values weird", "values"),
        ("show sinusoidal --layout diagonal", "layout"),
        ("show rope:frobnicate=1", "unknown option"),
        ("show rope:dim=abc", "invalid value"),
        ("show rope --color purple", "purple"),
        ("show alibi --causal --bidirectional", "cannot be used"),
        ("show learned --positions 100000000", "at most"),
        ("show learned --positions 100000 --dim 65536", "too large"),
    ] {
        fails(&words(line), needle);
    }
    fails(
        &["show", "rope", "-o", dir.join("x.jpg").to_str().unwrap()],
        "unknown extension",
    );
    fails(
        &["show", "rope", "-o", dir.join("x").to_str().unwrap()],
        "no extension",
    );
    fails(&["show", "rope", "--size", "10x10", "-o", png], "size");
    assert!(!Path::new(png).exists(), "a failed run leaves no file");
}
