//! Learned table: initialisation statistics, lookup, out-of-range errors.

// Naive reference loops index by position on purpose.
#![allow(clippy::needless_range_loop)]

use posenc::absolute::LearnedTable;
use posenc::{AbsoluteEncoding, Error, Hooks, PositionalEncoding};

#[test]
fn init_is_seeded_normal_with_std_002() {
    let t = LearnedTable::new(512, 64, 3).unwrap();
    assert_eq!(t.max_positions(), 512);
    assert_eq!(t.dim(), 64);
    assert_eq!(t.hooks(), Hooks::INPUT);
    let xs: Vec<f64> = t.rows().iter().flatten().copied().collect();
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let std = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    // 32768 samples: the standard error of the mean is 0.02/181 ≈ 1.1e-4.
    assert!(mean.abs() < 6e-4, "mean {mean}");
    assert!((std - 0.02).abs() < 5e-4, "std {std}");
    assert_eq!(t, LearnedTable::new(512, 64, 3).unwrap());
    assert_ne!(t, LearnedTable::new(512, 64, 4).unwrap());
}

#[test]
fn lookup_returns_the_row() {
    let rows: Vec<Vec<f64>> = (0..3).map(|p| vec![p as f64, -(p as f64)]).collect();
    let t = LearnedTable::from_rows(rows.clone()).unwrap();
    for p in 0..3u64 {
        assert_eq!(t.encode(p).unwrap(), rows[p as usize]);
    }
    assert_eq!(
        t.table(&[2, 0]).unwrap(),
        vec![rows[2].clone(), rows[0].clone()]
    );
}

#[test]
fn position_past_the_table_is_an_error() {
    for n in [1usize, 2, 3, 127, 128, 129] {
        let t = LearnedTable::new(n, 4, 0).unwrap();
        assert!(t.encode(n as u64 - 1).is_ok());
        match t.encode(n as u64) {
            Err(Error::PositionOutOfRange {
                position, limit, ..
            }) => {
                assert_eq!(position, n as u64);
                assert_eq!(limit, n as u64);
            }
            other => panic!("expected PositionOutOfRange, got {other:?}"),
        }
        assert!(matches!(
            t.encode(u64::MAX),
            Err(Error::PositionOutOfRange { .. })
        ));
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    for (max_positions, dim, name) in [(0, 4, "max_positions"), (4, 0, "dim")] {
        let err = LearnedTable::new(max_positions, dim, 0).unwrap_err();
        assert!(
            matches!(err, Error::InvalidDimension { what, .. } if what == name),
            "{err}"
        );
    }
    for rows in [vec![], vec![vec![1.0], vec![1.0, 2.0]]] {
        assert!(matches!(
            LearnedTable::from_rows(rows),
            Err(Error::Shape { .. })
        ));
    }
    assert!(matches!(
        LearnedTable::from_rows(vec![vec![], vec![]]),
        Err(Error::InvalidDimension { .. })
    ));
    assert!(matches!(
        LearnedTable::from_rows(vec![vec![f64::NAN]]),
        Err(Error::NotFinite { .. })
    ));
    let t = LearnedTable::new(2, 3, 0).unwrap();
    assert!(matches!(
        t.encode_into(0, &mut [0.0; 2]),
        Err(Error::Shape { .. })
    ));
}
