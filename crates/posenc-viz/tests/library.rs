//! The analysis layer called directly, without the binary.

use posenc_viz::{
    analyze, build, compare, parse_spec, picture, AnalyzeOptions, EncodingOptions, ShowOptions,
    VizError,
};

/// `posenc show ENCODING` with every option at its default.
fn picture_of(encoding: &str) -> Result<posenc_viz::Picture, VizError> {
    picture(&ShowOptions {
        encoding: encoding.into(),
        ..Default::default()
    })
}

#[test]
fn sinusoidal_picture_holds_the_table() {
    let pic = picture_of("sinusoidal").unwrap();
    assert_eq!(pic.panels.len(), 1);
    let d = &pic.panels[0].data;
    // show's defaults: 32 positions × 16 dimensions, interleaved sin/cos.
    assert_eq!((d.len(), d[0].len()), (32, 16));
    assert_eq!(&d[0][..4], &[0.0, 1.0, 0.0, 1.0]);
    assert!((d[1][0] - 1f64.sin()).abs() < 1e-12);
    assert!((d[1][1] - 1f64.cos()).abs() < 1e-12);
    // pair 1 turns at 10000^(-2/16) radians per position
    let w = 10000f64.powf(-2.0 / 16.0);
    assert!((d[5][2] - (5.0 * w).sin()).abs() < 1e-12);
    assert_eq!(pic.title, "sinusoidal (interleaved), D = 16, base 10000");
}

#[test]
fn the_spec_wins_over_the_options() {
    let opts = EncodingOptions {
        dim: Some(8),
        theta: Some(500.0),
        ..Default::default()
    };
    let spec = parse_spec("rope:theta=20000", &opts).unwrap();
    assert_eq!((spec.opts.dim, spec.opts.theta), (Some(8), Some(20000.0)));
    let enc = build(&spec, 16, 32).unwrap();
    let f = enc.inv_freq().unwrap();
    assert_eq!(f.len(), 4);
    assert!((f[1] - 20000f64.powf(-2.0 / 8.0)).abs() < 1e-6);
}

#[test]
fn linear_scaling_divides_every_frequency() {
    let c = compare("rope", "rope:scaling=linear,factor=4", &Default::default()).unwrap();
    let (fa, fb) = (c.a.inv_freq().unwrap(), c.b.inv_freq().unwrap());
    assert_eq!(fa.len(), 8);
    for (x, y) in fa.iter().zip(&fb) {
        assert!((y / x - 0.25).abs() < 1e-6);
    }
    assert!(c.summary.starts_with("A: RoPE default"));
    assert!(c
        .summary
        .contains("8 pairs; frequency ratio B/A from 0.25 to 0.25\n"));
    assert!(c.summary.contains("pairs 0–7"));
    assert_eq!(c.plots.len(), 2);
    assert!(c.panel_a.title.starts_with("A: "));
}

#[test]
fn alibi_slopes_are_geometric() {
    let (a, plots) = analyze(&AnalyzeOptions {
        encoding: "alibi".into(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(a.family, "alibi");
    let slopes = a
        .measurements
        .iter()
        .find(|m| m.id == "slopes")
        .unwrap()
        .value["slopes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect::<Vec<_>>();
    let expected: Vec<f64> = (1..=8).map(|i| 2f64.powi(-i)).collect();
    assert_eq!(slopes, expected);
    assert!(a.measurements.iter().all(|m| m
        .claim
        .as_ref()
        .is_none_or(|c| c.verdict.as_str() == "reproduced")));
    assert!(plots.iter().any(|(name, _)| name == "bias-distance"));
}

#[test]
fn bad_input_is_a_typed_error() {
    let err = picture_of("nope").unwrap_err();
    assert!(matches!(err, VizError::Invalid(_)));
    assert!(err
        .to_string()
        .starts_with("unknown encoding \"nope\"; known: "));
    let err = analyze(&AnalyzeOptions {
        n: 1,
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(err.to_string(), "invalid n = 1: need at least 2 positions");
    let err = build(
        &parse_spec("rope:theta=-1", &Default::default()).unwrap(),
        16,
        32,
    )
    .unwrap_err();
    assert!(matches!(err, VizError::Posenc(_)), "{err:?}");
}
