//! Measured properties of encodings: distinctness of positions, similarity
//! against distance, linear shift maps, relative invariance, RoFormer's
//! long-term decay bound (for any frequencies), wavelengths — and the plain
//! f64 linear algebra they and the lab's probes need (Cholesky solve, ridge
//! regression), written once here.
//!
//! Every function here measures; none asserts. The report and
//! `posenc analyze` turn the measurements into verdicts with rules they
//! state next to the numbers.

use crate::encoding::{AbsoluteEncoding, RotaryEncoding};
use crate::error::{Error, Result};

/// A small deterministic random generator (SplitMix64), so that every
/// measurement that samples vectors is reproducible from its seed.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator with the given seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// A vector of `n` standard normals.
    pub fn normal_vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.normal()).collect()
    }

    /// Uniform integer in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Dot product.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Euclidean norm.
pub fn norm(a: &[f64]) -> f64 {
    dot(a, a).sqrt()
}

/// Cosine similarity (0 if either vector is zero).
pub fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let d = norm(a) * norm(b);
    if d == 0.0 {
        0.0
    } else {
        dot(a, b) / d
    }
}

/// Ranks (1-based, ties get their average rank).
fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut r = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            r[k] = avg;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rank correlation of two equally long samples (−1: one
/// decreases whenever the other increases). NaN for fewer than 2 values or a
/// constant sample.
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() || a.len() < 2 {
        return f64::NAN;
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let n = a.len() as f64;
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = ra.iter().map(|x| (x - ma) * (x - ma)).sum();
    let vb: f64 = rb.iter().map(|y| (y - mb) * (y - mb)).sum();
    cov / (va * vb).sqrt()
}

/// Similarity of the encodings of `p` and `p + k`, for each `k` in `ks`.
#[derive(Debug, Clone, PartialEq)]
pub struct SimilarityCurve {
    /// The reference position `p`.
    pub position: u64,
    /// The offsets `k`.
    pub offsets: Vec<u64>,
    /// `PE(p) · PE(p + k)`.
    pub dot: Vec<f64>,
    /// `cos(PE(p), PE(p + k))`.
    pub cosine: Vec<f64>,
}

impl SimilarityCurve {
    /// Fraction of consecutive offsets over which the cosine does not
    /// increase (1.0: monotone non-increasing), with slack `tol`.
    pub fn monotone_fraction(&self, tol: f64) -> f64 {
        if self.cosine.len() < 2 {
            return 1.0;
        }
        let ok = self
            .cosine
            .windows(2)
            .filter(|w| w[1] <= w[0] + tol)
            .count();
        ok as f64 / (self.cosine.len() - 1) as f64
    }

    /// The first offset at which the cosine increases by more than `tol`, if any.
    pub fn first_increase(&self, tol: f64) -> Option<u64> {
        self.cosine
            .windows(2)
            .position(|w| w[1] > w[0] + tol)
            .map(|i| self.offsets[i + 1])
    }
}

/// Measures `PE(p) · PE(p + k)` and the cosine for every `k` in `offsets`.
///
/// # Errors
/// Whatever the encoding returns for a position it cannot encode.
pub fn similarity_curve(
    enc: &dyn AbsoluteEncoding,
    position: u64,
    offsets: &[u64],
) -> Result<SimilarityCurve> {
    let base = enc.encode(position)?;
    let mut dots = Vec::with_capacity(offsets.len());
    let mut cos = Vec::with_capacity(offsets.len());
    for &k in offsets {
        let v = enc.encode(position + k)?;
        dots.push(dot(&base, &v));
        cos.push(cosine(&base, &v));
    }
    Ok(SimilarityCurve {
        position,
        offsets: offsets.to_vec(),
        dot: dots,
        cosine: cos,
    })
}

/// The largest change of `PE(p) · PE(p + k)` across reference positions
/// `p` in `positions`, over all `k` in `offsets`: 0 when the similarity
/// depends on the distance only.
pub fn similarity_shift_dependence(
    enc: &dyn AbsoluteEncoding,
    positions: &[u64],
    offsets: &[u64],
) -> Result<f64> {
    let mut worst = 0.0f64;
    let reference = similarity_curve(enc, positions.first().copied().unwrap_or(0), offsets)?;
    for &p in positions.iter().skip(1) {
        let c = similarity_curve(enc, p, offsets)?;
        for (a, b) in c.dot.iter().zip(&reference.dot) {
            worst = worst.max((a - b).abs());
        }
    }
    Ok(worst)
}

/// Distinctness of positions `0..n`.
#[derive(Debug, Clone, PartialEq)]
pub struct Distinctness {
    /// Number of positions compared.
    pub positions: u64,
    /// The smallest distance `‖PE(k) − PE(0)‖` over `k in 1..n`.
    pub min_distance: f64,
    /// The offset that attains it.
    pub argmin: u64,
}

/// Smallest `‖PE(k) − PE(0)‖` over `k in 1..n`.
///
/// For an encoding whose shift `PE(p) → PE(p + k)` is an isometry (the
/// sinusoidal encoding's `M_k` is a rotation, which
/// [`linear_map_residual`] measures), the distance between two positions
/// depends only on their difference, so this is the smallest distance
/// between any two of the `n` positions: all are distinct iff it is > 0.
///
/// # Errors
/// [`Error::InvalidDimension`] for `n < 2`; encoding errors.
pub fn distinctness(enc: &dyn AbsoluteEncoding, n: u64) -> Result<Distinctness> {
    if n < 2 {
        return Err(Error::InvalidDimension {
            what: "number of positions",
            value: n as usize,
            reason: "need at least 2 positions to compare",
        });
    }
    let zero = enc.encode(0)?;
    let mut buf = vec![0.0; enc.dim()];
    let mut best = (f64::INFINITY, 0);
    for k in 1..n {
        enc.encode_into(k, &mut buf)?;
        let d: f64 = buf
            .iter()
            .zip(&zero)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f64>()
            .sqrt();
        if d < best.0 {
            best = (d, k);
        }
    }
    Ok(Distinctness {
        positions: n,
        min_distance: best.0,
        argmin: best.1,
    })
}

/// Multiplies a matrix (rows) by a vector.
pub fn mat_vec(m: &[Vec<f64>], v: &[f64]) -> Vec<f64> {
    m.iter().map(|row| dot(row, v)).collect()
}

/// The largest `‖PE(p + k) − M_k · PE(p)‖∞` over `p` in `positions`: how far
/// the encoding is from the claim that a shift by `k` is one fixed linear map
/// (Vaswani et al. 2017, §3.5, and the annotated notes on it).
pub fn linear_map_residual(
    enc: &dyn AbsoluteEncoding,
    m_k: &[Vec<f64>],
    k: u64,
    positions: &[u64],
) -> Result<f64> {
    let mut worst = 0.0f64;
    for &p in positions {
        let pe = enc.encode(p)?;
        let shifted = enc.encode(p + k)?;
        let pred = mat_vec(m_k, &pe);
        for (a, b) in shifted.iter().zip(&pred) {
            worst = worst.max((a - b).abs());
        }
    }
    Ok(worst)
}

/// Fits, by least squares over `positions`, the matrix `M` that maps
/// `PE(p)` to `PE(p + k)` and returns it: a measurement of the linear map
/// that needs no knowledge of the formula. The fit solves the normal
/// equations `M (X Xᵀ) = Y Xᵀ` with Gaussian elimination in f64.
///
/// # Errors
/// [`Error::InvalidValue`] if the positions do not span the encoding space
/// (the normal matrix is singular).
pub fn fit_linear_map(
    enc: &dyn AbsoluteEncoding,
    k: u64,
    positions: &[u64],
) -> Result<Vec<Vec<f64>>> {
    let d = enc.dim();
    let mut xxt = vec![vec![0.0; d]; d];
    let mut yxt = vec![vec![0.0; d]; d];
    for &p in positions {
        let x = enc.encode(p)?;
        let y = enc.encode(p + k)?;
        for i in 0..d {
            for j in 0..d {
                xxt[i][j] += x[i] * x[j];
                yxt[i][j] += y[i] * x[j];
            }
        }
    }
    // M = Y Xᵀ (X Xᵀ)⁻¹  ⇔  (X Xᵀ) Mᵀ = (Y Xᵀ)ᵀ  (X Xᵀ symmetric).
    let rhs: Vec<Vec<f64>> = (0..d)
        .map(|i| (0..d).map(|j| yxt[j][i]).collect())
        .collect();
    let mt = solve(xxt, rhs)?;
    Ok((0..d).map(|i| (0..d).map(|j| mt[j][i]).collect()).collect())
}

/// Solves `A X = B` (A square, B with several columns) by Gaussian
/// elimination with partial pivoting.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<Vec<f64>>) -> Result<Vec<Vec<f64>>> {
    let n = a.len();
    let scale = a
        .iter()
        .flat_map(|r| r.iter())
        .fold(0.0f64, |m, v| m.max(v.abs()));
    for col in 0..n {
        let piv = (col..n)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))
            .unwrap_or(col);
        if a[piv][col].abs() <= scale * 1e-13 {
            return Err(Error::invalid(
                "positions",
                "the sampled encodings do not span the space (singular normal matrix)",
            ));
        }
        a.swap(col, piv);
        b.swap(col, piv);
        let (prow, pb) = (a[col].clone(), b[col].clone());
        for (r, (arow, brow)) in a.iter_mut().zip(b.iter_mut()).enumerate() {
            if r == col {
                continue;
            }
            let f = arow[col] / prow[col];
            if f != 0.0 {
                for (x, p) in arow[col..].iter_mut().zip(&prow[col..]) {
                    *x -= f * p;
                }
                for (x, p) in brow.iter_mut().zip(&pb) {
                    *x -= f * p;
                }
            }
        }
    }
    for (r, brow) in b.iter_mut().enumerate() {
        let p = a[r][r];
        for v in brow.iter_mut() {
            *v /= p;
        }
    }
    Ok(b)
}

/// The random trials of [`relative_invariance`] and [`norm_change`]:
/// how many, the largest position drawn, and the generator's seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draws {
    /// How many trials.
    pub trials: usize,
    /// Positions are drawn from `0..=max_position`.
    pub max_position: u64,
    /// Seed of the generator.
    pub seed: u64,
}

/// The largest deviation of `⟨f_q(q, m), f_k(k, n)⟩` from its value at
/// `(m − n, 0)`-shifted positions, over `draws.trials` random `q`, `k`, `m`,
/// `n` (seeded): 0 when the score depends on `m − n` only. Relative to
/// `‖q‖‖k‖`.
pub fn relative_invariance(enc: &dyn RotaryEncoding, draws: Draws) -> Result<f64> {
    let d = enc.head_dim();
    let max_position = draws.max_position;
    worst_of(draws, |rng| {
        let q = rng.normal_vec(d);
        let k = rng.normal_vec(d);
        let m = rng.below(max_position + 1);
        let n = rng.below(max_position + 1);
        let shift = rng.below(max_position + 1);
        let score = |mq: u64, nk: u64| -> Result<f64> {
            let mut qq = q.clone();
            let mut kk = k.clone();
            enc.apply_query(&mut qq, mq)?;
            enc.apply_key(&mut kk, nk)?;
            Ok(dot(&qq, &kk))
        };
        let a = score(m, n)?;
        let b = score(m + shift, n + shift)?;
        Ok((a - b).abs() / (norm(&q) * norm(&k)))
    })
}

/// The largest of `trial`'s values over `draws.trials` trials drawing from
/// one generator seeded with `draws.seed` (0 for no trial).
fn worst_of(draws: Draws, mut trial: impl FnMut(&mut SplitMix64) -> Result<f64>) -> Result<f64> {
    let mut rng = SplitMix64::new(draws.seed);
    let mut worst = 0.0f64;
    for _ in 0..draws.trials {
        worst = worst.max(trial(&mut rng)?);
    }
    Ok(worst)
}

/// The largest relative change of `‖x‖` under the encoding, over
/// `draws.trials` random vectors and positions (0 for a pure rotation).
pub fn norm_change(enc: &dyn RotaryEncoding, draws: Draws) -> Result<f64> {
    let d = enc.head_dim();
    worst_of(draws, |rng| {
        let x = rng.normal_vec(d);
        let mut y = x.clone();
        enc.apply_query(&mut y, rng.below(draws.max_position + 1))?;
        Ok((norm(&y) - norm(&x)).abs() / norm(&x))
    })
}

/// RoFormer's relative upper bound (Su et al. 2021, §3.4.3):
/// `(1 / (d/2)) · Σ_{j=1}^{d/2} |S_j|` with `S_j = Σ_{i=0}^{j−1} e^{i·r·θ_i}`
/// and `θ_i = base^(−2i/d)`, at each relative distance `r`. It bounds
/// `|q·k|` up to the factor `max |h_{i+1} − h_i|` and decays with `r`:
/// 32.5 at 0 and about 10.2 at 100 for d = 128, base 10000.
///
/// # Errors
/// [`Error::InvalidDimension`] for an odd or zero `d`;
/// [`Error::InvalidTheta`] for a bad base.
pub fn rope_decay_bound(d: usize, base: f64, distances: &[f64]) -> Result<Vec<f64>> {
    let theta = crate::rope::frequencies::default_inv_freq(base, d)?;
    Ok(decay_bound(&theta, distances))
}

/// RoFormer's relative upper bound for any frequencies `θ_i` (a scaled
/// RoPE's, or any head dimension's): `(1 / n) · Σ_{j=1}^{n} |S_j|` with
/// `S_j = Σ_{i<j} e^{i·r·θ_i}` and `n = inv_freq.len()`, at each distance
/// `r`; [`rope_decay_bound`] is this with the default frequencies. NaN for
/// no frequencies.
///
/// ```
/// use posenc::analysis::decay_bound;
/// // At r = 0 every term is 1: the bound is (n + 1) / 2.
/// assert_eq!(decay_bound(&[1.0, 0.1, 0.01], &[0.0]), vec![2.0]);
/// ```
pub fn decay_bound(inv_freq: &[f64], distances: &[f64]) -> Vec<f64> {
    distances
        .iter()
        .map(|&r| {
            let (mut re, mut im, mut total) = (0.0f64, 0.0f64, 0.0f64);
            for &t in inv_freq {
                let (s, c) = (r * t).sin_cos();
                re += c;
                im += s;
                total += (re * re + im * im).sqrt();
            }
            total / inv_freq.len() as f64
        })
        .collect()
}

/// Solves `A w = b` for a symmetric positive-definite `A` (rows) by
/// Cholesky factorisation `A = L Lᵀ`, in f64. Only the lower triangle of
/// `A` (`a[i][j]`, `j ≤ i`) is read.
///
/// # Errors
/// [`Error::InvalidValue`] if `A` is not square and as long as `b`, or not
/// positive definite (a pivot ≤ 0).
///
/// ```
/// use posenc::analysis::cholesky_solve;
/// let w = cholesky_solve(&[vec![4.0, 2.0], vec![2.0, 3.0]], &[2.0, 5.0])?;
/// assert!((w[0] + 0.5).abs() < 1e-12 && (w[1] - 2.0).abs() < 1e-12);
/// # Ok::<(), posenc::Error>(())
/// ```
pub fn cholesky_solve(a: &[Vec<f64>], b: &[f64]) -> Result<Vec<f64>> {
    let n = a.len();
    if b.len() != n || a.iter().any(|r| r.len() != n) {
        return Err(Error::invalid(
            "matrix",
            "Cholesky solve needs a square matrix as long as the right-hand side",
        ));
    }
    let mut l = vec![vec![0.0f64; n]; n];
    for i in 0..n {
        for j in 0..=i {
            let s: f64 = (0..j).map(|k| l[i][k] * l[j][k]).sum();
            if i == j {
                let v = a[i][i] - s;
                if v <= 0.0 || !v.is_finite() {
                    return Err(Error::invalid(
                        "matrix",
                        "not positive definite (Cholesky pivot ≤ 0)",
                    ));
                }
                l[i][j] = v.sqrt();
            } else {
                l[i][j] = (a[i][j] - s) / l[j][j];
            }
        }
    }
    let mut z = vec![0.0; n];
    for i in 0..n {
        z[i] = (b[i] - (0..i).map(|k| l[i][k] * z[k]).sum::<f64>()) / l[i][i];
    }
    let mut w = vec![0.0; n];
    for i in (0..n).rev() {
        w[i] = (z[i] - (i + 1..n).map(|k| l[k][i] * w[k]).sum::<f64>()) / l[i][i];
    }
    Ok(w)
}

/// Ridge regression: the `w` minimising `‖X w − y‖² + λ‖w‖²`, from the
/// normal equations `(XᵀX + λI) w = Xᵀy` solved by [`cholesky_solve`]
/// (rows of `x` are samples).
///
/// # Errors
/// [`Error::InvalidValue`] for no samples, rows of different lengths, a
/// `y` of another length, or normal equations that are not positive
/// definite (λ = 0 with collinear columns).
///
/// ```
/// use posenc::analysis::ridge;
/// // y = 2·x₀ − x₁, recovered exactly with λ → 0.
/// let x = vec![vec![1.0, 0.0], vec![0.0, 1.0], vec![1.0, 1.0]];
/// let w = ridge(&x, &[2.0, -1.0, 1.0], 1e-12)?;
/// assert!((w[0] - 2.0).abs() < 1e-9 && (w[1] + 1.0).abs() < 1e-9);
/// # Ok::<(), posenc::Error>(())
/// ```
pub fn ridge(x: &[Vec<f64>], y: &[f64], lambda: f64) -> Result<Vec<f64>> {
    let d = x.first().map_or(0, Vec::len);
    if x.is_empty() || d == 0 || y.len() != x.len() || x.iter().any(|r| r.len() != d) {
        return Err(Error::invalid(
            "samples",
            "ridge regression needs equally long non-empty rows, one target per row",
        ));
    }
    let mut a = vec![vec![0.0; d]; d];
    let mut b = vec![0.0; d];
    for (row, &t) in x.iter().zip(y) {
        for i in 0..d {
            b[i] += row[i] * t;
            for j in 0..=i {
                a[i][j] += row[i] * row[j];
            }
        }
    }
    // The lower triangle is all Cholesky reads.
    for (i, row) in a.iter_mut().enumerate() {
        row[i] += lambda;
    }
    cholesky_solve(&a, &b)
}

/// Wavelength `2π / ω` of each frequency, in positions.
pub fn wavelengths(inv_freq: &[f64]) -> Vec<f64> {
    inv_freq
        .iter()
        .map(|w| 2.0 * std::f64::consts::PI / w)
        .collect()
}

/// Single-head softmax attention in f64 without any positional encoding:
/// `softmax(X Wq (X Wk)ᵀ / √d) X Wv`, each matrix `d × d`, rows of `x` are
/// tokens. With `causal`, token `i` attends to `0..=i` only.
pub fn attention(
    x: &[Vec<f64>],
    wq: &[Vec<f64>],
    wk: &[Vec<f64>],
    wv: &[Vec<f64>],
    causal: bool,
) -> Vec<Vec<f64>> {
    let proj = |w: &[Vec<f64>]| -> Vec<Vec<f64>> {
        x.iter()
            .map(|row| {
                (0..w[0].len())
                    .map(|j| (0..row.len()).map(|i| row[i] * w[i][j]).sum())
                    .collect()
            })
            .collect()
    };
    let (q, k, v) = (proj(wq), proj(wk), proj(wv));
    let d = q.first().map_or(1, |r| r.len()) as f64;
    q.iter()
        .enumerate()
        .map(|(i, qi)| {
            let visible = if causal { i + 1 } else { k.len() };
            let logits: Vec<f64> = k[..visible]
                .iter()
                .map(|kj| dot(qi, kj) / d.sqrt())
                .collect();
            let mx = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = logits.iter().map(|l| (l - mx).exp()).collect();
            let z: f64 = w.iter().sum();
            (0..v[0].len())
                .map(|c| {
                    w.iter()
                        .zip(&v[..visible])
                        .map(|(a, vj)| a * vj[c])
                        .sum::<f64>()
                        / z
                })
                .collect()
        })
        .collect()
}

/// Measures permutation equivariance of attention without positions: the
/// largest `|Attn(P X) − P Attn(X)|` over `trials` random inputs and
/// permutations (seeded). Close to 0 for bidirectional attention (an
/// encoder without positions cannot see order); large for causal attention
/// (the mask itself carries order, which is why a decoder can learn
/// positions without any encoding).
pub fn permutation_gap(tokens: usize, d: usize, causal: bool, trials: usize, seed: u64) -> f64 {
    let mut rng = SplitMix64::new(seed);
    let mut mat = |r: usize, c: usize, s: f64| -> Vec<Vec<f64>> {
        (0..r)
            .map(|_| (0..c).map(|_| rng.normal() * s).collect())
            .collect()
    };
    let mut worst = 0.0f64;
    for t in 0..trials {
        let x = mat(tokens, d, 1.0);
        let s = 1.0 / (d as f64).sqrt();
        let (wq, wk, wv) = (mat(d, d, s), mat(d, d, s), mat(d, d, s));
        // A derangement-free random permutation (Fisher–Yates, seeded).
        let mut perm: Vec<usize> = (0..tokens).collect();
        let mut prng = SplitMix64::new(seed ^ (t as u64 + 1).wrapping_mul(0x9E37));
        for i in (1..tokens).rev() {
            perm.swap(i, prng.below(i as u64 + 1) as usize);
        }
        let px: Vec<Vec<f64>> = perm.iter().map(|&i| x[i].clone()).collect();
        let out = attention(&x, &wq, &wk, &wv, causal);
        let out_p = attention(&px, &wq, &wk, &wv, causal);
        for (r, &i) in perm.iter().enumerate() {
            for c in 0..d {
                worst = worst.max((out_p[r][c] - out[i][c]).abs());
            }
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decay_bound_matches_roformer_figure() {
        // RoFormer §3.4.3, Fig. 2: d = 128, base 10000.
        let v = rope_decay_bound(128, 10000.0, &[0.0, 100.0, 250.0]).unwrap();
        assert!((v[0] - 32.5).abs() < 1e-12, "{v:?}");
        assert!((v[1] - 10.2).abs() < 0.1, "{v:?}");
        assert!((v[2] - 6.6).abs() < 0.2, "{v:?}");
    }

    #[test]
    fn attention_without_positions_is_permutation_equivariant_only_when_bidirectional() {
        let enc = permutation_gap(7, 8, false, 5, 1);
        let dec = permutation_gap(7, 8, true, 5, 1);
        assert!(enc < 1e-12, "encoder gap {enc}");
        assert!(dec > 1e-3, "decoder gap {dec}");
    }

    #[test]
    fn splitmix_is_deterministic_and_roughly_normal() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = SplitMix64::new(42);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut r = SplitMix64::new(42);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        let mut r = SplitMix64::new(3);
        let xs = r.normal_vec(20000);
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
    }

    #[test]
    fn spearman_of_monotone_and_reversed_samples() {
        let a = [1.0, 2.0, 3.0, 4.0];
        assert!((spearman(&a, &[10.0, 20.0, 30.0, 41.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&a, &[4.0, 3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        assert!((spearman(&a, &[1.0, 1.0, 2.0, 2.0]) - 0.894_427_190_999_915_9).abs() < 1e-12);
        assert!(spearman(&a, &[1.0]).is_nan());
    }

    #[test]
    fn decay_bound_of_the_default_frequencies_is_rope_decay_bound() {
        let theta = crate::rope::frequencies::default_inv_freq(10000.0, 64).unwrap();
        let d = [0.0, 1.0, 17.5, 300.0];
        assert_eq!(
            decay_bound(&theta, &d),
            rope_decay_bound(64, 10000.0, &d).unwrap()
        );
        // r = 0: |S_j| = j, so the mean is (n + 1) / 2 for any frequencies.
        assert_eq!(decay_bound(&[0.3; 7], &[0.0]), vec![4.0]);
        assert!(decay_bound(&[], &[1.0])[0].is_nan());
    }

    #[test]
    fn cholesky_and_ridge_recover_known_solutions() {
        // A = M Mᵀ + I is positive definite; b = A w.
        let m = [[1.0, 2.0, 0.5], [0.0, 1.0, -1.0], [3.0, 0.0, 1.0]];
        let a: Vec<Vec<f64>> = (0..3)
            .map(|i| {
                (0..3)
                    .map(|j| {
                        (0..3).map(|k| m[i][k] * m[j][k]).sum::<f64>()
                            + if i == j { 1.0 } else { 0.0 }
                    })
                    .collect()
            })
            .collect();
        let w = [0.5, -2.0, 1.25];
        let b: Vec<f64> = a.iter().map(|r| dot(r, &w)).collect();
        let got = cholesky_solve(&a, &b).unwrap();
        for (g, e) in got.iter().zip(w) {
            assert!((g - e).abs() < 1e-12, "{got:?}");
        }
        assert!(cholesky_solve(&[vec![1.0, 2.0], vec![2.0, 1.0]], &[1.0, 1.0]).is_err());
        assert!(cholesky_solve(&[vec![1.0]], &[1.0, 2.0]).is_err());
        // Ridge: y = 1 + 3x on 5 points, with an intercept column.
        let x: Vec<Vec<f64>> = (0..5).map(|i| vec![1.0, i as f64]).collect();
        let y: Vec<f64> = (0..5).map(|i| 1.0 + 3.0 * i as f64).collect();
        let w = ridge(&x, &y, 1e-12).unwrap();
        assert!(
            (w[0] - 1.0).abs() < 1e-9 && (w[1] - 3.0).abs() < 1e-9,
            "{w:?}"
        );
        // λ shrinks the weights toward 0.
        let shrunk = ridge(&x, &y, 100.0).unwrap();
        assert!(norm(&shrunk) < norm(&w));
        assert!(ridge(&[], &[], 1.0).is_err());
        assert!(ridge(&x, &y[..3], 1.0).is_err());
    }

    #[test]
    fn solver_recovers_a_known_matrix() {
        let a = vec![vec![4.0, 1.0], vec![2.0, 3.0]];
        let x = [vec![1.0, -2.0], vec![0.5, 3.0]];
        let b: Vec<Vec<f64>> = (0..2)
            .map(|i| {
                (0..2)
                    .map(|j| (0..2).map(|k| a[i][k] * x[k][j]).sum())
                    .collect()
            })
            .collect();
        let got = solve(a, b).unwrap();
        for i in 0..2 {
            for j in 0..2 {
                assert!((got[i][j] - x[i][j]).abs() < 1e-12);
            }
        }
        assert!(solve(
            vec![vec![1.0, 2.0], vec![2.0, 4.0]],
            vec![vec![1.0], vec![2.0]]
        )
        .is_err());
    }
}
