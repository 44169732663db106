//! PoSE's position ids against the authors' code: the same draws, id for
//! id. `scripts/finetune/pose_reference.py` runs a verbatim copy of the
//! body of `train_preprocess_function_pose` (github.com/dwzhu-pku/PoSE,
//! `src/train_pose.py`) with Python's `random` module seeded as recorded;
//! posenc's [`PyRandom`] is CPython's generator, so the same seed gives
//! the same chunks and skips.

use posenc_tune::data::{TrainText, WindowPlan, Windows};
use posenc_tune::pose::{PoseSampler, PyRandom};
use serde_json::Value;

use crate::common;

use common::ids;

fn reference() -> Value {
    common::fixture_json("pose-reference.json")
}

fn num(v: &Value) -> usize {
    v.as_u64().unwrap() as usize
}

#[test]
fn the_authors_chunks_and_skips_for_the_same_seed() {
    let r = reference();
    let mut cases = 0;
    for c in r["chunks"].as_array().unwrap() {
        let (doc_len, window, target) = (num(&c["doc_len"]), num(&c["window"]), num(&c["target"]));
        let sampler = PoseSampler::new(window, target).unwrap();
        let mut rng = PyRandom::seed(c["seed"].as_u64().unwrap());
        for (i, d) in c["draws"].as_array().unwrap().iter().enumerate() {
            let draw = sampler.draw(doc_len, &mut rng).unwrap();
            // The document is 0..doc_len: its ids are its offsets.
            let tokens: Vec<u32> = draw
                .token_ranges()
                .into_iter()
                .flat_map(|r| r.map(|t| t as u32))
                .collect();
            assert_eq!(tokens, ids(&d["input_ids"]), "{c:?} draw {i}: tokens");
            assert_eq!(
                draw.positions(window),
                ids(&d["position_ids"]),
                "seed {} draw {i}: positions",
                c["seed"]
            );
            cases += 1;
        }
    }
    assert_eq!(cases, 20);
}

#[test]
fn posenc_windows_are_the_reference_windows() {
    let r = reference();
    for c in r["windows"].as_array().unwrap() {
        let train_len = num(&c["train_len"]);
        // A text of n tokens whose first 90% is 0..train_len.
        let n = (train_len..2 * train_len)
            .find(|&n| posenc_nn::data::split_point(n) == train_len)
            .unwrap();
        let text = TrainText::new((0..n as u32).collect()).unwrap();
        assert_eq!(text.len(), train_len);
        let plan = WindowPlan::Pose {
            window: num(&c["window"]),
            target: num(&c["target"]),
        };
        let w = Windows::new(text, plan, c["seed"].as_u64().unwrap()).unwrap();
        let got = w.step(c["step"].as_u64().unwrap(), num(&c["batch"]));
        let want = c["windows"].as_array().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, x) in got.iter().zip(want) {
            assert_eq!(g.start, num(&x["start"]), "{}", c["seed"]);
            assert_eq!(g.tokens, ids(&x["input_ids"]));
            assert_eq!(g.positions, ids(&x["position_ids"]));
        }
    }
}

/// The distribution of the draws, stated exactly: for windows of `L = 8`
/// tokens over `N = 20` positions from documents of `40` tokens,
/// `rt1` is uniform on `1..=4`, `rt2` on `8..=40`, the skip on `0..=12`;
/// over 130,000 draws each value's count is within 5% of its expectation
/// (a count's standard deviation is under 0.6% of it for the widest
/// range, so 5% is over 8 standard deviations).
#[test]
fn draws_are_uniform_on_their_ranges() {
    let sampler = PoseSampler::new(8, 20).unwrap();
    let mut rng = PyRandom::seed(99);
    let n = 130_000;
    let (mut rt1, mut rt2, mut skip) = (vec![0usize; 5], vec![0usize; 41], vec![0usize; 13]);
    for _ in 0..n {
        let d = sampler.draw(40, &mut rng).unwrap();
        rt1[d.rt1] += 1;
        rt2[d.rt2] += 1;
        skip[d.skip] += 1;
    }
    let check = |counts: &[usize], range: std::ops::RangeInclusive<usize>, what: &str| {
        let expect = n as f64 / range.clone().count() as f64;
        for (v, &c) in counts.iter().enumerate() {
            if range.contains(&v) {
                let dev = (c as f64 - expect).abs() / expect;
                assert!(dev < 0.05, "{what} = {v}: {c} draws, {expect:.0} expected");
            } else {
                assert_eq!(c, 0, "{what} = {v} is outside {range:?}");
            }
        }
    };
    check(&rt1, 1..=4, "rt1");
    check(&rt2, 8..=40, "rt2");
    check(&skip, 0..=12, "skip");
}
