//! RoPE cos/sin tables in `f32`, computed in `f64`.
//!
//! Row `p` of a table holds, for every frequency `i`,
//! `cos(p · f_i) · a · s_i(p)` and `sin(p · f_i) · a · s_i(p)` where `f_i` is
//! the `f32` inverse frequency (taken exactly as `f64`), `a` the attention
//! factor and `s_i(p)` the xPos scale (1 without xPos; `ζ_i^(p/scale_base)`
//! for queries and `ζ_i^(−p/scale_base)` for keys, `ζ_i = (2i/d + 0.4)/1.4`,
//! Sun et al. 2022). The angle `p · f_i` is exact in `f64` for `p < 2^29`
//! (a 24-bit mantissa times a 29-bit integer).
//!
//! - [`Tables::exact`] evaluates `sin_cos` (and `powf`) for every entry;
//! - [`Tables::contiguous`] / [`Tables::extended`] walk positions with the
//!   `f64` rotation recurrence `(c, s) ← (c·cos f − s·sin f, s·cos f + c·sin f)`
//!   and re-anchor with an exact `sin_cos` every [`ANCHOR_EVERY`] positions,
//!   so the recurrence's error stays below `ANCHOR_EVERY · 2^-52`, far under
//!   the final `f32` rounding; rows are split over threads.

use rayon::prelude::*;

/// Positions between two exact re-anchorings of the recurrence.
pub const ANCHOR_EVERY: usize = 32;

/// What a table is made of.
#[derive(Debug, Clone, Copy)]
pub struct TableSpec<'a> {
    /// Inverse frequencies (radians per position), one per pair.
    pub inv_freq: &'a [f32],
    /// Factor applied to cos and sin (YaRN / LongRoPE attention factor).
    pub attention_factor: f64,
    /// xPos `scale_base` (None: no xPos, and no key tables).
    pub xpos_scale_base: Option<f64>,
}

impl TableSpec<'_> {
    /// Number of frequencies (`rotary_dim / 2`).
    pub fn n_freq(&self) -> usize {
        self.inv_freq.len()
    }

    /// `ln(ζ_i) / scale_base` for every pair (empty without xPos).
    pub fn xpos_log_rates(&self) -> Vec<f64> {
        match self.xpos_scale_base {
            None => Vec::new(),
            Some(sb) => (0..self.n_freq())
                .map(|i| xpos_zeta(i, 2 * self.n_freq()).ln() / sb)
                .collect(),
        }
    }
}

/// xPos's `ζ_i = (2i/d + 0.4) / 1.4` for pair `i` of a `d`-dimensional
/// rotary block (torchscale's `(arange(0, d, 2) + 0.4·d) / (1.4·d)`).
pub fn xpos_zeta(i: usize, rotary_dim: usize) -> f64 {
    (2.0 * i as f64 / rotary_dim as f64 + 0.4) / 1.4
}

/// Row-major `(rows, n_freq)` tables for queries and, with xPos, keys.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tables {
    /// Width of a row.
    pub n_freq: usize,
    /// Number of rows.
    pub rows: usize,
    /// Query (and, without xPos, key) cosines.
    pub cos: Vec<f32>,
    /// Query (and, without xPos, key) sines.
    pub sin: Vec<f32>,
    /// Key cosines with xPos (empty otherwise).
    pub cos_k: Vec<f32>,
    /// Key sines with xPos (empty otherwise).
    pub sin_k: Vec<f32>,
}

impl Tables {
    /// Whether keys have their own tables (xPos).
    pub fn has_key_tables(&self) -> bool {
        !self.cos_k.is_empty()
    }

    /// Query tables.
    pub fn query(&self) -> super::RopeTables<'_> {
        super::RopeTables {
            cos: &self.cos,
            sin: &self.sin,
            n_freq: self.n_freq,
        }
    }

    /// Key tables (the query ones without xPos).
    pub fn key(&self) -> super::RopeTables<'_> {
        if self.has_key_tables() {
            super::RopeTables {
                cos: &self.cos_k,
                sin: &self.sin_k,
                n_freq: self.n_freq,
            }
        } else {
            self.query()
        }
    }

    /// The exact tables at arbitrary `positions` (row `r` is `positions[r]`):
    /// one `f64` `sin_cos` (and `powf` with xPos) per entry.
    pub fn exact(spec: &TableSpec<'_>, positions: &[u64]) -> Tables {
        let nf = spec.n_freq();
        let n = positions.len() * nf;
        let xpos = spec.xpos_scale_base.is_some();
        let mut t = Tables {
            n_freq: nf,
            rows: positions.len(),
            cos: vec![0.0; n],
            sin: vec![0.0; n],
            cos_k: vec![0.0; if xpos { n } else { 0 }],
            sin_k: vec![0.0; if xpos { n } else { 0 }],
        };
        if nf == 0 {
            return t;
        }
        let a = spec.attention_factor;
        let rd = 2 * nf;
        let fill = |r: usize, c: &mut [f32], s: &mut [f32], ck: &mut [f32], sk: &mut [f32]| {
            let p = positions[r];
            for i in 0..nf {
                let (sv, cv) = (p as f64 * spec.inv_freq[i] as f64).sin_cos();
                match spec.xpos_scale_base {
                    None => {
                        c[i] = (cv * a) as f32;
                        s[i] = (sv * a) as f32;
                    }
                    Some(sb) => {
                        let z = xpos_zeta(i, rd);
                        let up = z.powf(p as f64 / sb);
                        let down = z.powf(-(p as f64) / sb);
                        c[i] = (cv * a * up) as f32;
                        s[i] = (sv * a * up) as f32;
                        ck[i] = (cv * a * down) as f32;
                        sk[i] = (sv * a * down) as f32;
                    }
                }
            }
        };
        if xpos {
            t.cos
                .par_chunks_mut(nf)
                .zip(t.sin.par_chunks_mut(nf))
                .zip(t.cos_k.par_chunks_mut(nf).zip(t.sin_k.par_chunks_mut(nf)))
                .enumerate()
                .for_each(|(r, ((c, s), (ck, sk)))| fill(r, c, s, ck, sk));
        } else {
            t.cos
                .par_chunks_mut(nf)
                .zip(t.sin.par_chunks_mut(nf))
                .enumerate()
                .for_each(|(r, (c, s))| fill(r, c, s, &mut [], &mut []));
        }
        t
    }

    /// Fast tables for the contiguous positions `start..start + rows`.
    pub fn contiguous(spec: &TableSpec<'_>, start: u64, rows: usize) -> Tables {
        Tables {
            n_freq: spec.n_freq(),
            ..Default::default()
        }
        .extended(spec, start, rows)
    }

    /// A copy of `self` (positions `start..start + self.rows`) extended to
    /// `rows` rows with the fast builder.
    pub fn extended(&self, spec: &TableSpec<'_>, start: u64, rows: usize) -> Tables {
        let n = rows.max(self.rows) * self.n_freq;
        let xpos = spec.xpos_scale_base.is_some();
        let copy = |old: &[f32]| {
            let mut v = super::mem::with_capacity_huge(n);
            v.extend_from_slice(old);
            v
        };
        let mut t = Tables {
            n_freq: self.n_freq,
            rows: 0,
            cos: copy(&self.cos),
            sin: copy(&self.sin),
            cos_k: if xpos { copy(&self.cos_k) } else { Vec::new() },
            sin_k: if xpos { copy(&self.sin_k) } else { Vec::new() },
        };
        t.rows = self.rows;
        t.grow(spec, start, rows);
        t
    }

    /// Appends rows `self.rows..rows` (positions `start + r`) in place.
    fn grow(&mut self, spec: &TableSpec<'_>, start: u64, rows: usize) {
        let nf = self.n_freq;
        debug_assert_eq!(nf, spec.n_freq());
        if rows <= self.rows || nf == 0 {
            return;
        }
        let xpos = spec.xpos_scale_base.is_some();
        let old = self.rows * nf;
        let new = rows * nf;
        let reserve = |v: &mut Vec<f32>| -> *mut f32 {
            v.reserve_exact(new - v.len());
            // Raw pointer to the spare capacity: no reference to
            // uninitialised memory is created.
            unsafe { v.as_mut_ptr().add(old) }
        };
        let ptrs = Ptrs {
            cos: reserve(&mut self.cos),
            sin: reserve(&mut self.sin),
            cos_k: if xpos {
                reserve(&mut self.cos_k)
            } else {
                std::ptr::null_mut()
            },
            sin_k: if xpos {
                reserve(&mut self.sin_k)
            } else {
                std::ptr::null_mut()
            },
        };
        let n_rows = rows - self.rows;
        let first = start + self.rows as u64;
        let steps = Steps::new(spec);
        let threads = rayon::current_num_threads().max(1);
        let chunk = n_rows
            .div_ceil(threads * 4)
            .max(1024.max(ANCHOR_EVERY))
            .next_multiple_of(ANCHOR_EVERY);
        let n_chunks = n_rows.div_ceil(chunk);
        let run = |c: usize| {
            let r0 = c * chunk;
            let r1 = (r0 + chunk).min(n_rows);
            // SAFETY: chunk c writes rows r0..r1 only, inside the new part.
            unsafe { fill_rows(spec, &steps, &ptrs, first, r0, r1) };
        };
        if n_chunks <= 1 {
            run(0);
        } else {
            (0..n_chunks).into_par_iter().for_each(run);
        }
        // SAFETY: fill_rows wrote every entry of rows old..rows.
        unsafe {
            self.cos.set_len(new);
            self.sin.set_len(new);
            if xpos {
                self.cos_k.set_len(new);
                self.sin_k.set_len(new);
            }
        }
        self.rows = rows;
    }
}

struct Ptrs {
    cos: *mut f32,
    sin: *mut f32,
    cos_k: *mut f32,
    sin_k: *mut f32,
}
// SAFETY: the pointers are only written at disjoint rows by different tasks.
unsafe impl Send for Ptrs {}
unsafe impl Sync for Ptrs {}

/// Per-frequency step rotation and xPos rates.
struct Steps {
    cos_f: Vec<f64>,
    sin_f: Vec<f64>,
    log_rate: Vec<f64>,
    up: Vec<f64>,
    down: Vec<f64>,
}

impl Steps {
    fn new(spec: &TableSpec<'_>) -> Steps {
        let (sin_f, cos_f) = spec.inv_freq.iter().map(|&f| (f as f64).sin_cos()).unzip();
        let log_rate = spec.xpos_log_rates();
        let up = log_rate.iter().map(|l| l.exp()).collect();
        let down = log_rate.iter().map(|l| (-l).exp()).collect();
        Steps {
            cos_f,
            sin_f,
            log_rate,
            up,
            down,
        }
    }
}

/// Rows `r0..r1` of the new part (position `first + r`).
///
/// # Safety
/// The pointers are valid for `r1 · n_freq` values; nobody else writes
/// these rows.
unsafe fn fill_rows(
    spec: &TableSpec<'_>,
    steps: &Steps,
    p: &Ptrs,
    first: u64,
    r0: usize,
    r1: usize,
) {
    let nf = spec.n_freq();
    let a = spec.attention_factor;
    let xpos = spec.xpos_scale_base.is_some();
    let mut c = vec![0.0f64; nf];
    let mut s = vec![0.0f64; nf];
    let mut up = vec![1.0f64; nf];
    let mut down = vec![1.0f64; nf];
    for r in r0..r1 {
        let pos = first + r as u64;
        if (r - r0).is_multiple_of(ANCHOR_EVERY) {
            for i in 0..nf {
                let (sv, cv) = (pos as f64 * spec.inv_freq[i] as f64).sin_cos();
                c[i] = cv;
                s[i] = sv;
            }
            if xpos {
                for i in 0..nf {
                    up[i] = (pos as f64 * steps.log_rate[i]).exp();
                    down[i] = (-(pos as f64) * steps.log_rate[i]).exp();
                }
            }
        } else {
            for i in 0..nf {
                let (cf, sf) = (steps.cos_f[i], steps.sin_f[i]);
                let (cv, sv) = (c[i], s[i]);
                c[i] = cv * cf - sv * sf;
                s[i] = sv * cf + cv * sf;
            }
            if xpos {
                for i in 0..nf {
                    up[i] *= steps.up[i];
                    down[i] *= steps.down[i];
                }
            }
        }
        let (rc, rs) = (p.cos.add(r * nf), p.sin.add(r * nf));
        if xpos {
            let (rck, rsk) = (p.cos_k.add(r * nf), p.sin_k.add(r * nf));
            for i in 0..nf {
                rc.add(i).write((c[i] * a * up[i]) as f32);
                rs.add(i).write((s[i] * a * up[i]) as f32);
                rck.add(i).write((c[i] * a * down[i]) as f32);
                rsk.add(i).write((s[i] * a * down[i]) as f32);
            }
        } else {
            for i in 0..nf {
                rc.add(i).write((c[i] * a) as f32);
                rs.add(i).write((s[i] * a) as f32);
            }
        }
    }
}
