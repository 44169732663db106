//! The RoPE benchmark behind `posenc bench rope` and `cargo bench`.
//!
//! On the same tensors it times posenc's in-place and out-of-place fused
//! rope, candle-nn 0.11's `rope` / `rope_i` (for `(B, H, T, D)`) or
//! `rope_thd` (for `(B, T, H, D)`), and a multi-threaded copy of the same
//! bytes into a preallocated buffer. Each time is the median of repeated
//! runs after a warm-up; bandwidth counts the bytes read plus the bytes
//! written (`2 ×` the tensor's size) for every implementation. It also times
//! building a fresh 131072-position × 64-frequency cos/sin cache.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;
use serde::Serialize;

use crate::error::Result;
use crate::kernels::{HeadLayout, SimdLevel};
use crate::rope::{PairLayout, RopeFrequencies};
use crate::tensor::rope::{Role, Rope};

/// What to run.
#[derive(Debug, Clone, Copy, Default)]
pub struct BenchOptions {
    /// Fewer repeats (for smoke tests); the median is noisier.
    pub quick: bool,
}

/// One `(shape, layout, dtype)` case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BenchKey {
    /// Tensor shape, in the order of `layout`.
    pub shape: [usize; 4],
    /// `bhtd` or `bthd`.
    pub layout: &'static str,
    /// `f32` or `bf16`.
    pub dtype: &'static str,
}

impl BenchKey {
    /// The case's first three columns of [`BenchReport::to_text`].
    fn columns(&self) -> String {
        let shape = format!("{:?}", self.shape);
        format!("{shape:<22} {:<5} {:<5}", self.layout, self.dtype)
    }
}

/// One timed implementation on one case.
#[derive(Debug, Clone, Serialize)]
pub struct BenchCase {
    /// The case (its fields inline in JSON).
    #[serde(flatten)]
    pub key: BenchKey,
    /// `posenc-inplace`, `posenc`, `candle-rope`, `candle-rope-i`,
    /// `candle-rope-thd` or `copy`.
    #[serde(rename = "impl")]
    pub imp: &'static str,
    /// Median time in milliseconds.
    pub ms: f64,
    /// `2 × bytes / time` in GB/s.
    pub gbps: f64,
}

/// Ratios of one `(shape, layout, dtype)` case, from the same run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRatios {
    /// The case (its fields inline in JSON).
    #[serde(flatten)]
    pub key: BenchKey,
    /// posenc in-place bandwidth / copy bandwidth.
    pub inplace_vs_copy: f64,
    /// posenc out-of-place bandwidth / copy bandwidth.
    pub posenc_vs_copy: f64,
    /// candle-nn time / posenc out-of-place time (`rope` or `rope_thd`).
    pub speedup_vs_candle: f64,
    /// candle-nn time / posenc in-place time.
    pub inplace_speedup_vs_candle: f64,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Every timing.
    pub cases: Vec<BenchCase>,
    /// Median time to build a 131072 × 64 cos/sin cache, in ms.
    pub cache_ms: f64,
    /// Ratios per case.
    pub ratios: Vec<BenchRatios>,
    /// rayon threads used.
    pub threads: usize,
    /// SIMD level of the posenc kernels.
    pub simd: &'static str,
}

/// Each measurement keeps sampling until it has at least this much time in
/// samples (and at least `reps` samples), so that microsecond cases such as
/// decode get thousands of samples and a stable median, not fifteen.
const MIN_SAMPLED_SECONDS: f64 = 0.3;

/// Most samples per measurement.
const MAX_SAMPLES: usize = 20_000;

/// Median wall time of `f` in milliseconds, after one warm-up call: at least
/// `reps` samples, more until [`MIN_SAMPLED_SECONDS`] are covered.
fn median_ms(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?; // warm-up
    let mut t = Vec::with_capacity(reps);
    let mut total = 0.0;
    while t.len() < reps.max(1) || (total < MIN_SAMPLED_SECONDS && t.len() < MAX_SAMPLES) {
        let s = Instant::now();
        f()?;
        let dt = s.elapsed().as_secs_f64();
        total += dt;
        t.push(dt * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// A multi-threaded copy of `src` into `dst` (the bandwidth yardstick).
pub fn parallel_copy<T: Copy + Send + Sync>(src: &[T], dst: &mut [T]) {
    let threads = rayon::current_num_threads().max(1);
    let chunk = src.len().div_ceil(threads * 4).max(16 * 1024);
    dst.par_chunks_mut(chunk)
        .zip(src.par_chunks(chunk))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

fn copy_ms(x: &Tensor, reps: usize) -> Result<f64> {
    let v: Vec<f32> = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    match x.dtype() {
        DType::BF16 => {
            let src: Vec<half::bf16> = v.iter().map(|&f| half::bf16::from_f32(f)).collect();
            let mut dst = vec![half::bf16::ZERO; src.len()];
            median_ms(reps, || {
                parallel_copy(&src, &mut dst);
                Ok(())
            })
        }
        _ => {
            let mut dst = vec![0f32; v.len()];
            median_ms(reps, || {
                parallel_copy(&v, &mut dst);
                Ok(())
            })
        }
    }
}

/// The shapes and layouts benchmarked: prefill, batch, decode, and the
/// `(B, T, H, D)` layout.
pub const SHAPES: [([usize; 4], HeadLayout); 4] = [
    ([1, 32, 4096, 128], HeadLayout::Bhtd),
    ([8, 32, 512, 128], HeadLayout::Bhtd),
    ([64, 32, 1, 128], HeadLayout::Bhtd),
    ([1, 4096, 32, 128], HeadLayout::Bthd),
];

/// Times building a fresh cache of 131072 positions × 64 frequencies.
///
/// # Errors
/// None in practice (the frequencies are valid).
pub fn cache_ms(reps: usize) -> Result<f64> {
    let f = RopeFrequencies::plain(500000.0, 128, PairLayout::HalfSplit)?;
    median_ms(reps, || {
        let rope = Rope::new(f.clone())?.with_max_cached_positions(131072);
        rope.warm_up(131072)?;
        std::hint::black_box(rope.cached_positions());
        Ok(())
    })
}

/// Runs one `(shape, layout, dtype)` case: every implementation on the
/// same tensor.
///
/// # Errors
/// candle's errors.
pub fn run_case(
    dims: [usize; 4],
    layout: HeadLayout,
    dtype: DType,
    reps: usize,
) -> Result<Vec<BenchCase>> {
    let dev = Device::Cpu;
    let (b, _h, t, d) = match layout {
        HeadLayout::Bhtd => (dims[0], dims[1], dims[2], dims[3]),
        HeadLayout::Bthd => (dims[0], dims[2], dims[1], dims[3]),
    };
    let _ = b;
    // decode runs at the last position of a 4096-token cache
    let offset = if t == 1 { 4095 } else { 0 };
    let x = Tensor::randn(0f32, 1.0, dims.to_vec(), &dev)?.to_dtype(dtype)?;
    let freqs = RopeFrequencies::plain(500000.0, d, PairLayout::HalfSplit)?;
    let rope = Rope::new(freqs.clone())?.with_layout(layout);
    rope.warm_up(offset + t)?;
    let positions: Vec<u64> = (offset as u64..(offset + t) as u64).collect();
    let (c, s) = freqs.cos_sin_table(&positions);
    let cos = Tensor::from_vec(c, (t, d / 2), &dev)?.to_dtype(dtype)?;
    let sin = Tensor::from_vec(s, (t, d / 2), &dev)?.to_dtype(dtype)?;
    let (ci, si) = {
        let fi = RopeFrequencies::plain(500000.0, d, PairLayout::Interleaved)?;
        let (c, s) = fi.cos_sin_table(&positions);
        (
            Tensor::from_vec(c, (t, d / 2), &dev)?.to_dtype(dtype)?,
            Tensor::from_vec(s, (t, d / 2), &dev)?.to_dtype(dtype)?,
        )
    };
    let bytes = 2.0 * (x.elem_count() * dtype.size_in_bytes()) as f64;
    let dname = match dtype {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "f32",
    };
    let key = BenchKey {
        shape: dims,
        layout: layout.as_str(),
        dtype: dname,
    };
    let mut out = Vec::new();
    let mut push = |imp: &'static str, ms: f64| {
        out.push(BenchCase {
            key,
            imp,
            ms,
            gbps: bytes / (ms * 1e-3) / 1e9,
        })
    };
    let xi = x.copy()?;
    push(
        "posenc-inplace",
        median_ms(reps, || rope.rotate_inplace(&xi, offset, Role::Query))?,
    );
    drop(xi);
    push(
        "posenc",
        median_ms(reps, || {
            std::hint::black_box(rope.rotate(&x, offset, Role::Query)?);
            Ok(())
        })?,
    );
    match layout {
        HeadLayout::Bhtd => {
            push(
                "candle-rope",
                median_ms(reps, || {
                    std::hint::black_box(candle_nn::rotary_emb::rope(&x, &cos, &sin)?);
                    Ok(())
                })?,
            );
            push(
                "candle-rope-i",
                median_ms(reps, || {
                    std::hint::black_box(candle_nn::rotary_emb::rope_i(&x, &ci, &si)?);
                    Ok(())
                })?,
            );
        }
        HeadLayout::Bthd => {
            push(
                "candle-rope-thd",
                median_ms(reps, || {
                    std::hint::black_box(candle_nn::rotary_emb::rope_thd(&x, &cos, &sin)?);
                    Ok(())
                })?,
            );
        }
    }
    push("copy", copy_ms(&x, reps)?);
    Ok(out)
}

fn ratios(cases: &[BenchCase]) -> Vec<BenchRatios> {
    let mut r = Vec::new();
    for (dims, layout) in SHAPES {
        for dtype in ["f32", "bf16"] {
            let key = BenchKey {
                shape: dims,
                layout: layout.as_str(),
                dtype,
            };
            let find = |imp: &str| cases.iter().find(|c| c.key == key && c.imp == imp);
            let (Some(ip), Some(op), Some(cp)) =
                (find("posenc-inplace"), find("posenc"), find("copy"))
            else {
                continue;
            };
            let candle = find("candle-rope").or(find("candle-rope-thd"));
            let candle_ms = candle.map(|c| c.ms).unwrap_or(f64::NAN);
            r.push(BenchRatios {
                key,
                inplace_vs_copy: ip.gbps / cp.gbps,
                posenc_vs_copy: op.gbps / cp.gbps,
                speedup_vs_candle: candle_ms / op.ms,
                inplace_speedup_vs_candle: candle_ms / ip.ms,
            });
        }
    }
    r
}

/// Runs the whole benchmark.
///
/// # Errors
/// candle's errors.
pub fn rope_bench(opts: BenchOptions) -> Result<BenchReport> {
    let reps = if opts.quick { 3 } else { 15 };
    let mut cases = Vec::new();
    for (dims, layout) in SHAPES {
        for dtype in [DType::F32, DType::BF16] {
            cases.extend(run_case(dims, layout, dtype, reps)?);
        }
    }
    let cache_ms = cache_ms(if opts.quick { 3 } else { 9 })?;
    Ok(BenchReport {
        ratios: ratios(&cases),
        cases,
        cache_ms,
        threads: rayon::current_num_threads(),
        simd: SimdLevel::detect().as_str(),
    })
}

impl BenchReport {
    /// A plain-text table of the timings and ratios.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "rope benchmark: {} threads, simd {}",
            self.threads, self.simd
        );
        let _ = writeln!(
            s,
            "{:<22} {:<5} {:<5} {:<16} {:>10} {:>8}",
            "shape", "lay", "dtype", "impl", "ms", "GB/s"
        );
        for c in &self.cases {
            let (key, imp, ms, gbps) = (c.key.columns(), c.imp, c.ms, c.gbps);
            let _ = writeln!(s, "{key} {imp:<16} {ms:>10.3} {gbps:>8.2}");
        }
        let _ = writeln!(s, "\nratios (same run):");
        for r in &self.ratios {
            let _ = writeln!(
                s,
                "{} inplace/copy {:.2}  posenc/copy {:.2}  candle/posenc {:.1}x  candle/inplace {:.1}x",
                r.key.columns(),
                r.inplace_vs_copy,
                r.posenc_vs_copy,
                r.speedup_vs_candle,
                r.inplace_speedup_vs_candle
            );
        }
        let _ = writeln!(s, "\ncache 131072 x 64: {:.2} ms", self.cache_ms);
        s
    }
}
