//! The angle `position × inv_freq` and its cos/sin are evaluated in f64 and
//! only then rounded: Llama 3.1 8B's table stays within 2e-7 of the f64 truth
//! (numpy's float64 evaluation from transformers' f32 frequencies, in the
//! checkpoint fixture) at positions 0, 1, 4095, 10^6 and 10^7, where an f32
//! angle (transformers' own path) is off by more than 1e-2.

use crate::rope_common;
use rope_common as common;

use posenc::rope::RopeConfig;

#[test]
fn llama31_table_exact_to_f32_rounding_up_to_1e7() {
    let fixtures = common::load_dir("checkpoints");
    let (_, config, exp) = fixtures
        .iter()
        .find(|f| f.0 == "llama-3.1-8b")
        .expect("fixture");
    let cfg = RopeConfig::from_hf_file(config).unwrap();
    let case = &exp.cases[0];
    let f = cfg.frequencies(None).unwrap();
    // the frequencies agree bit for bit here, so our own table is compared
    for (a, b) in f.inv_freq.iter().zip(&case.inv_freq) {
        assert_eq!(*a, *b as f32);
    }
    let n = f.num_freqs();
    let mut f32_angle_err = 0.0f64;
    for p in [0u64, 1, 4095, 1_000_000, 10_000_000] {
        let r = case
            .positions
            .iter()
            .position(|&q| q == p)
            .expect("position in fixture");
        let (cos, sin) = f.cos_sin_table(&[p]);
        let mut at_p = 0.0f64;
        for i in 0..n {
            let (ec, es) = (
                (cos[i] as f64 - case.cos_f64[r][i]).abs(),
                (sin[i] as f64 - case.sin_f64[r][i]).abs(),
            );
            assert!(
                ec <= 2e-7 && es <= 2e-7,
                "position {p}, pair {i}: {ec:e} {es:e}"
            );
            // the f32-angle alternative
            let a32 = (p as f32) * f.inv_freq[i];
            at_p = at_p.max((a32.cos() as f64 - case.cos_f64[r][i]).abs());
        }
        eprintln!("position {p}: f32-angle cos error {at_p:.2e} (posenc within 2e-7)");
        f32_angle_err = f32_angle_err.max(at_p);
    }
    assert!(f32_angle_err > 1e-2, "f32 angle error {f32_angle_err:e}");
}
