//! PoSE position ids: Zhu et al. 2024, *PoSE: Efficient Context Window
//! Extension of LLMs via Positional Skip-wise Training*, as the authors'
//! training script samples them (`train_preprocess_function_pose` in
//! `src/train_pose.py` of github.com/dwzhu-pku/PoSE).
//!
//! A model is trained on windows of `L` tokens (its original context) whose
//! position ids cover a target length `N > L`. From a document `ids` of
//! `n ≥ L` tokens (the authors truncate their documents to `5·L` tokens:
//! [`PoseSampler::DOC_FACTOR`]), with three draws of Python's `random`
//! module, in this order:
//!
//! ```text
//! rt1  = randint(1, (L + 1) // 2)          length of the first chunk (both ends inclusive)
//! rt2  = randint(L, n)                     end of the second chunk in the document
//! lt2  = rt2 − (L − rt1)                   its start: the chunks hold L tokens together
//! skip = randint(0, N − L)                 the skip of the second chunk's positions
//!
//! tokens    = ids[0 .. rt1]  ++ ids[lt2 .. rt2]
//! positions = 0 .. rt1       ++ rt1 + skip .. L + skip
//! ```
//!
//! Two chunks (the paper's default), the first starting at position 0
//! (`lt = 0`, the authors' "revision \[that\] makes the coverage possibility
//! more uniform for large relative positions"), the skip uniform over
//! `0..=N − L` (the paper's §3.2, uniform skipping bias). The largest id is
//! `L − 1 + skip ≤ N − 1`. Both the tokens and the positions jump between
//! the chunks, by independent amounts.
//!
//! [`PyRandom`] is CPython's Mersenne Twister with its seeding from an
//! integer, `getrandbits` and `randint`, so that a seed gives posenc the
//! very draws `random.seed(seed)` gives the authors' function:
//! `scripts/finetune/pose_reference.py` holds a verbatim copy of it, and
//! `tests/pose.rs` checks the ids it writes.

use std::ops::Range;

use crate::error::{Result, TuneError};

/// Words of the Mersenne Twister's state.
const N_MT: usize = 624;
const M_MT: usize = 397;

/// CPython's `random.Random` generator: MT19937 (Matsumoto & Nishimura
/// 1998) seeded by `init_by_array` from an integer's 32-bit words, with
/// `getrandbits` and `randint` as `Modules/_randommodule.c` and
/// `Lib/random.py` compute them (rejection sampling over `k` bits for a
/// range of `k`-bit width).
#[derive(Clone)]
pub struct PyRandom {
    mt: [u32; N_MT],
    index: usize,
}

impl std::fmt::Debug for PyRandom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyRandom")
            .field("index", &self.index)
            .finish()
    }
}

impl PyRandom {
    /// The generator `random.seed(seed)` makes (an `int` seed: its 32-bit
    /// words, least significant first, one word for 0).
    pub fn seed(seed: u64) -> PyRandom {
        let (lo, hi) = (seed as u32, (seed >> 32) as u32);
        let key: &[u32] = if hi == 0 { &[lo] } else { &[lo, hi] };
        let mut r = PyRandom {
            mt: [0; N_MT],
            index: N_MT,
        };
        r.init_by_array(key);
        r
    }

    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..N_MT {
            let prev = self.mt[i - 1];
            self.mt[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        self.index = N_MT;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19_650_218);
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N_MT.max(key.len()) {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N_MT {
                self.mt[0] = self.mt[N_MT - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N_MT - 1 {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= N_MT {
                self.mt[0] = self.mt[N_MT - 1];
                i = 1;
            }
        }
        self.mt[0] = 0x8000_0000;
    }

    /// The next 32-bit output (`genrand_uint32`).
    pub fn next_u32(&mut self) -> u32 {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        const MATRIX_A: u32 = 0x9908_b0df;
        if self.index >= N_MT {
            for k in 0..N_MT {
                let y = (self.mt[k] & UPPER) | (self.mt[(k + 1) % N_MT] & LOWER);
                let mag = if y & 1 == 1 { MATRIX_A } else { 0 };
                self.mt[k] = self.mt[(k + M_MT) % N_MT] ^ (y >> 1) ^ mag;
            }
            self.index = 0;
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// `random.getrandbits(k)` for `1 ≤ k ≤ 64`: 32-bit words, least
    /// significant first, the last one shifted down to what is left.
    ///
    /// # Panics
    /// For `k` outside `1..=64` (an internal misuse: [`randint`]'s ranges
    /// stay within it).
    ///
    /// [`randint`]: Self::randint
    pub fn getrandbits(&mut self, k: u32) -> u64 {
        assert!((1..=64).contains(&k), "getrandbits({k}) outside 1..=64");
        if k <= 32 {
            return (self.next_u32() >> (32 - k)) as u64;
        }
        let lo = self.next_u32() as u64;
        let hi = (self.next_u32() >> (64 - k)) as u64;
        lo | (hi << 32)
    }

    /// `random.Random._randbelow_with_getrandbits(n)`: uniform on `0..n`,
    /// by drawing `n.bit_length()` bits until the value is below `n`.
    /// `n = 0` gives 0 (Python raises; no caller here asks for it).
    pub fn randbelow(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let k = 64 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }

    /// `random.randint(a, b)`: uniform on `a..=b` (`a ≤ b`; the range's
    /// width `b − a + 1` must fit in 64 bits, which every range here does).
    pub fn randint(&mut self, a: u64, b: u64) -> u64 {
        debug_assert!(a <= b);
        a + self.randbelow(b - a + 1)
    }
}

/// One PoSE draw (see the [module docs](self)): the chunks of the document
/// and the skip of the second chunk's positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoseDraw {
    /// Length of the first chunk, `ids[0..rt1]` (the authors' `rt1`, with
    /// `lt1 = 0`).
    pub rt1: usize,
    /// Start of the second chunk in the document (`lt2`).
    pub lt2: usize,
    /// End of the second chunk in the document (`rt2`, exclusive).
    pub rt2: usize,
    /// Added to the second chunk's positions (the authors' `rt`).
    pub skip: usize,
}

impl PoseDraw {
    /// The document ranges whose tokens make the window, in order.
    pub fn token_ranges(&self) -> [Range<usize>; 2] {
        [0..self.rt1, self.lt2..self.rt2]
    }

    /// The window's position ids: `0..rt1` then `rt1 + skip..window +
    /// skip`.
    pub fn positions(&self, window: usize) -> Vec<u32> {
        (0..window)
            .map(|i| {
                if i < self.rt1 {
                    i as u32
                } else {
                    (i + self.skip) as u32
                }
            })
            .collect()
    }
}

/// Largest target length (position ids are `u32`, and the CLI bounds its
/// lengths far below this).
pub const MAX_TARGET: usize = 1 << 30;

/// PoSE's sampler for windows of `window` tokens whose ids cover
/// `0..target`, checked at construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoseSampler {
    window: usize,
    target: usize,
}

impl PoseSampler {
    /// The authors truncate each training document to this many windows
    /// (`max_length=model_max_position_embeddings*5`).
    pub const DOC_FACTOR: usize = 5;

    /// A sampler for windows of `window` tokens (at least 2) with ids over
    /// `0..target` (`window < target ≤ MAX_TARGET`).
    ///
    /// # Errors
    /// [`TuneError::PoseWindow`].
    pub fn new(window: usize, target: usize) -> Result<PoseSampler> {
        if window < 2 || window >= target || target > MAX_TARGET {
            return Err(TuneError::PoseWindow { window, target });
        }
        Ok(PoseSampler { window, target })
    }

    /// Tokens per window (`L`).
    pub fn window(&self) -> usize {
        self.window
    }

    /// The length the ids cover (`N`).
    pub fn target(&self) -> usize {
        self.target
    }

    /// The authors' document length for this window: `5·L`.
    pub fn doc_len(&self) -> usize {
        self.window.saturating_mul(Self::DOC_FACTOR)
    }

    /// One draw for a document of `doc_len` tokens (the authors'
    /// `len(ids)`), three calls of `rng.randint` in the authors' order.
    ///
    /// # Errors
    /// [`TuneError::Input`] for a document shorter than the window.
    pub fn draw(&self, doc_len: usize, rng: &mut PyRandom) -> Result<PoseDraw> {
        let l = self.window;
        if doc_len < l {
            return Err(TuneError::Input(format!(
                "a PoSE document of {doc_len} tokens is shorter than the window of {l}"
            )));
        }
        // The authors' `(len_chunk + 1) // 2`.
        let rt1 = rng.randint(1, (l as u64).div_ceil(2)) as usize;
        let rt2 = rng.randint(l as u64, doc_len as u64) as usize;
        let lt2 = rt2 - (l - rt1);
        let skip = rng.randint(0, (self.target - l) as u64) as usize;
        Ok(PoseDraw {
            rt1,
            lt2,
            rt2,
            skip,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python 3.11's `[random.getrandbits(32) for _ in range(3)]` after
    /// `random.seed(0)` and `random.seed(2**40 + 7)` (a two-word key), and
    /// `random.getrandbits(40), random.randint(0, 2**33)` after the second
    /// seed (two words per draw).
    #[test]
    fn matches_cpython_getrandbits() {
        let mut r = PyRandom::seed(0);
        let got: Vec<u64> = (0..3).map(|_| r.getrandbits(32)).collect();
        assert_eq!(got, vec![3626764237, 1654615998, 3255389356]);
        let mut r = PyRandom::seed((1 << 40) + 7);
        let got: Vec<u64> = (0..3).map(|_| r.getrandbits(32)).collect();
        assert_eq!(got, vec![2635837658, 3209733218, 3500038837]);
        let mut r = PyRandom::seed((1 << 40) + 7);
        assert_eq!(r.getrandbits(40), 822974591194);
        assert_eq!(r.randint(0, 1 << 33), 6339045738);
    }

    #[test]
    fn sampler_checks_its_lengths() {
        assert!(matches!(
            PoseSampler::new(64, 64),
            Err(TuneError::PoseWindow { .. })
        ));
        assert!(PoseSampler::new(1, 64).is_err());
        assert!(PoseSampler::new(8, MAX_TARGET + 1).is_err());
        let s = PoseSampler::new(8, 64).unwrap();
        assert_eq!(s.doc_len(), 40);
        assert!(s.draw(7, &mut PyRandom::seed(1)).is_err());
    }

    /// The stated ranges, for every draw of many seeds: `1 ≤ rt1 ≤ (L+1)/2`,
    /// `L ≤ rt2 ≤ n`, the chunks `L` tokens together inside the document,
    /// `0 ≤ skip ≤ N − L`, positions increasing with the largest `< N`.
    #[test]
    fn every_draw_is_inside_the_stated_ranges() {
        for (l, n, doc) in [(8usize, 64usize, 40usize), (7, 8, 7), (2, 100, 10)] {
            let s = PoseSampler::new(l, n).unwrap();
            let mut rng = PyRandom::seed(l as u64 * 1000 + n as u64);
            for _ in 0..2000 {
                let d = s.draw(doc, &mut rng).unwrap();
                assert!((1..=l.div_ceil(2)).contains(&d.rt1), "{d:?}");
                assert!((l..=doc).contains(&d.rt2), "{d:?}");
                let [a, b] = d.token_ranges();
                assert_eq!(a.len() + b.len(), l);
                assert!(b.start >= a.end, "{d:?}");
                assert!(d.skip <= n - l);
                let p = d.positions(l);
                assert!(p.windows(2).all(|w| w[0] < w[1]));
                assert!((*p.last().unwrap() as usize) < n);
                assert_eq!(p[0], 0);
            }
        }
    }
}
