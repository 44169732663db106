//! Candle absolute-encoding modules against the plain f64 encodings.

// Naive reference loops index by position on purpose.
#![allow(clippy::needless_range_loop)]

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use posenc::absolute::{Sinusoidal, SinusoidalLayout};
use posenc::tensor::absolute::{LearnedEmbedding, Positions, SinusoidalEmbedding};
use posenc::{AbsoluteEncoding, Error};

fn ramp(b: usize, t: usize, d: usize) -> Tensor {
    let v: Vec<f32> = (0..b * t * d).map(|i| (i as f32 * 0.01).sin()).collect();
    Tensor::from_vec(v, (b, t, d), &Device::Cpu).unwrap()
}

#[test]
fn sinusoidal_module_matches_plain_rows() {
    for dim in [1usize, 2, 3, 127, 128, 129] {
        for layout in [
            SinusoidalLayout::Interleaved,
            SinusoidalLayout::Concatenated,
        ] {
            if dim == 1 && layout == SinusoidalLayout::Concatenated {
                continue;
            }
            let enc = Sinusoidal::new(dim).unwrap().with_layout(layout);
            let emb = SinusoidalEmbedding::new(enc.clone(), &Device::Cpu).unwrap();
            for offset in [0usize, 1, 37] {
                let x = ramp(2, 5, dim);
                let y: Vec<Vec<Vec<f32>>> = emb
                    .forward(&x, Positions::Offset(offset))
                    .unwrap()
                    .to_vec3()
                    .unwrap();
                let xv: Vec<Vec<Vec<f32>>> = x.to_vec3().unwrap();
                for b in 0..2 {
                    for t in 0..5 {
                        let row = enc.encode((offset + t) as u64).unwrap();
                        for c in 0..dim {
                            let want = xv[b][t][c] as f64 + row[c];
                            assert!((y[b][t][c] as f64 - want).abs() < 1e-6);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn sinusoidal_cache_grows_on_demand() {
    let enc = Sinusoidal::new(16).unwrap();
    let emb = SinusoidalEmbedding::new(enc.clone(), &Device::Cpu).unwrap();
    assert_eq!(emb.cached_len(), 0);
    let a: Vec<Vec<f32>> = emb.table(0, 10).unwrap().to_vec2().unwrap();
    assert!(emb.cached_len() >= 10);
    let b: Vec<Vec<f32>> = emb.table(500, 300).unwrap().to_vec2().unwrap();
    assert!(emb.cached_len() >= 800);
    let a2: Vec<Vec<f32>> = emb.table(0, 10).unwrap().to_vec2().unwrap();
    assert_eq!(a, a2);
    for (i, row) in b.iter().enumerate() {
        let want = enc.encode(500 + i as u64).unwrap();
        for (g, w) in row.iter().zip(&want) {
            assert!((*g as f64 - w).abs() < 1e-6);
        }
    }
}

#[test]
fn sinusoidal_ids_and_half_precision() {
    let enc = Sinusoidal::new(8).unwrap();
    let emb = SinusoidalEmbedding::new(enc.clone(), &Device::Cpu).unwrap();
    let ids = Tensor::new(&[[3u32, 0, 9], [100, 100, 2]], &Device::Cpu).unwrap();
    let x = Tensor::zeros((2, 3, 8), DType::F32, &Device::Cpu).unwrap();
    let y: Vec<Vec<Vec<f32>>> = emb
        .forward(&x, Positions::Ids(&ids))
        .unwrap()
        .to_vec3()
        .unwrap();
    let idv: Vec<Vec<u32>> = ids.to_vec2().unwrap();
    for b in 0..2 {
        for t in 0..3 {
            let want = enc.encode(idv[b][t] as u64).unwrap();
            for c in 0..8 {
                assert!((y[b][t][c] as f64 - want[c]).abs() < 1e-6);
            }
        }
    }
    for dt in [DType::F16, DType::BF16] {
        let x = Tensor::zeros((1, 4, 8), dt, &Device::Cpu).unwrap();
        let y = emb.forward(&x, Positions::Offset(2)).unwrap();
        assert_eq!(y.dtype(), dt);
        let y: Vec<Vec<f32>> = y
            .to_dtype(DType::F32)
            .unwrap()
            .get(0)
            .unwrap()
            .to_vec2()
            .unwrap();
        let want = enc.encode(3).unwrap();
        for c in 0..8 {
            assert!((y[1][c] as f64 - want[c]).abs() < 1e-2);
        }
    }
}

#[test]
fn learned_module_adds_rows_and_trains() {
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
    let emb = LearnedEmbedding::new(8, 4, vb).unwrap();
    assert_eq!(emb.max_positions(), 8);
    let x = ramp(2, 3, 4);
    let y = emb.forward(&x, Positions::Offset(5)).unwrap();
    let w: Vec<Vec<f32>> = emb.weight().to_vec2().unwrap();
    let yv: Vec<Vec<Vec<f32>>> = y.to_vec3().unwrap();
    let xv: Vec<Vec<Vec<f32>>> = x.to_vec3().unwrap();
    for b in 0..2 {
        for t in 0..3 {
            for c in 0..4 {
                assert!((yv[b][t][c] - (xv[b][t][c] + w[5 + t][c])).abs() < 1e-6);
            }
        }
    }
    let grads = y.sum_all().unwrap().backward().unwrap();
    let g: Vec<Vec<f32>> = grads.get(emb.weight()).unwrap().to_vec2().unwrap();
    for (p, row) in g.iter().enumerate() {
        // Each used row is summed over 2 batch entries: gradient 2.
        let want = if (5..8).contains(&p) { 2.0 } else { 0.0 };
        assert!(
            row.iter().all(|v| (*v - want).abs() < 1e-6),
            "row {p}: {row:?}"
        );
    }
    let ids = Tensor::new(&[[7i64, 0, 7]], &Device::Cpu).unwrap();
    let y = emb.forward(&ramp(1, 3, 4), Positions::Ids(&ids)).unwrap();
    assert_eq!(y.dims(), &[1, 3, 4]);
}

#[test]
fn learned_module_errors_past_the_table() {
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
    let emb = LearnedEmbedding::new(8, 4, vb).unwrap();
    assert!(emb.forward(&ramp(1, 8, 4), Positions::Offset(0)).is_ok());
    assert!(matches!(
        emb.forward(&ramp(1, 3, 4), Positions::Offset(6)),
        Err(Error::PositionOutOfRange {
            position: 8,
            limit: 8,
            ..
        })
    ));
    let ids = Tensor::new(&[[1u32, 8, 2]], &Device::Cpu).unwrap();
    assert!(matches!(
        emb.forward(&ramp(1, 3, 4), Positions::Ids(&ids)),
        Err(Error::PositionOutOfRange { position: 8, .. })
    ));
}

#[test]
fn bad_input_is_a_typed_error() {
    let emb = SinusoidalEmbedding::new(Sinusoidal::new(8).unwrap(), &Device::Cpu).unwrap();
    assert!(matches!(
        emb.forward(&ramp(1, 3, 7), Positions::Offset(0)),
        Err(Error::Shape { .. })
    ));
    let x = ramp(2, 3, 8);
    let wrong = Tensor::new(&[[0u32, 1, 2]], &Device::Cpu).unwrap();
    assert!(matches!(
        emb.forward(&x, Positions::Ids(&wrong)),
        Err(Error::Shape { .. })
    ));
    let floats = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
    assert!(matches!(
        emb.forward(&x, Positions::Ids(&floats)),
        Err(Error::DType { .. })
    ));
    let neg = Tensor::new(&[[0i64, 1, 2], [3, -4, 5]], &Device::Cpu).unwrap();
    assert!(matches!(
        emb.forward(&x, Positions::Ids(&neg)),
        Err(Error::NegativePosition(-4))
    ));
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
    assert!(matches!(
        LearnedEmbedding::new(0, 4, vb.clone()),
        Err(Error::InvalidDimension { .. })
    ));
    assert!(matches!(
        LearnedEmbedding::new(4, 0, vb),
        Err(Error::InvalidDimension { .. })
    ));
}
