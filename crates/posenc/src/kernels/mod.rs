//! CPU kernels (SIMD, threads) beneath the tensor API, each beside a reference path.
//!
//! - [`rope`]: the fused rotary kernel. For every head vector `x` of a
//!   `(B, H, T, D)` or `(B, T, H, D)` buffer and every pair `i` it computes
//!   `y_a = x_a·cos − x_b·sin`, `y_b = x_b·cos + x_a·sin` with `cos`, `sin`
//!   read from an `f32` table row chosen by the vector's `(b, t)`; entries
//!   past `rotary_dim` pass through. Activations are `f32`, `f16` or `bf16`;
//!   half types are converted to `f32` in registers and rounded back once.
//!   [`rope::rope_reference`] is the plain scalar loop it is tested against.
//! - [`attention`]: fused attention, forward and backward, with the
//!   positional hooks inside (rotary queries and keys, ALiBi, bucketed and
//!   dense biases, Shaw et al.'s relative keys and values), streaming over
//!   key tiles; [`attention::reference_forward`] beside it.
//! - [`bf16`]: products in bfloat16 (AVX512_BF16), which the attention's
//!   long-sequence forward tiles use when asked
//!   ([`attention::Products::Bf16`]).
//! - [`table`]: the cos/sin tables themselves, built with an `f64`
//!   recurrence re-anchored exactly every [`table::ANCHOR_EVERY`] positions
//!   (fast) beside the direct `f64` evaluation (exact).
//!
//! The instruction set is chosen at run time ([`SimdLevel::detect`]):
//! AVX-512 (F, VL, BW, DQ), then AVX2 + FMA + F16C on x86-64, NEON on
//! aarch64, and a portable scalar loop everywhere. The environment variable
//! `POSENC_SIMD` (`scalar`, `avx2`, `avx512`, `neon`) picks a lower level
//! than the CPU's best for the whole process ([`SimdLevel::from_env`]), so a
//! machine with AVX-512 also runs and times the AVX2 kernels. Every level
//! can be asked for explicitly ([`SimdLevel::available`]) so that tests
//! compare each one with the scalar loop. Work is split with rayon over head vectors, so every shape — one
//! long prefill, many short sequences, decode (`T = 1`, many heads) and
//! `B = 1` in `(B, T, H, D)` — keeps every core busy.

pub mod attention;
pub mod bench;
pub mod bf16;
pub mod matmul;
pub(crate) mod mem;
#[cfg(target_arch = "aarch64")]
mod neon;
pub mod rope;
pub mod table;
pub mod tile;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use rope::{Element, HeadLayout, RopeGeometry, RopeTables, RowMap};

/// Defines `fn $name(level: SimdLevel, args…) -> R`, which runs
/// `$body(args…)` compiled for the instruction set of `level`: AVX-512
/// (F, VL, BW, DQ), AVX2 + FMA, or the portable baseline. The body and everything it calls
/// must be `#[inline(always)]` so that the whole computation is compiled
/// (and vectorised, with fused multiply-adds) for that level; `mul_add` in
/// the baseline instance is a library call, so bodies run at the baseline
/// only on CPUs without AVX2.
///
/// ```
/// use posenc::kernels::SimdLevel;
///
/// #[inline(always)]
/// fn body(x: &mut [f32]) {
///     for v in x.iter_mut() {
///         *v = v.mul_add(2.0, 1.0);
///     }
/// }
/// posenc::multiversion!(fn double_plus_one => body(x: &mut [f32]) -> ());
///
/// let mut x = [1.0f32, 2.0];
/// double_plus_one(SimdLevel::detect(), &mut x);
/// assert_eq!(x, [3.0, 5.0]);
/// ```
#[macro_export]
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident => $body:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name(level: $crate::kernels::SimdLevel, $($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v4($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma,f16c")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v3($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                match level {
                    // SAFETY: a level is only handed out where the CPU has it
                    // (`SimdLevel::detect`, `SimdLevel::available`).
                    $crate::kernels::SimdLevel::Avx512 => unsafe { v4($($arg),*) },
                    $crate::kernels::SimdLevel::Avx2 => unsafe { v3($($arg),*) },
                    _ => $body($($arg),*),
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = level;
                $body($($arg),*)
            }
        }
    };
}

thread_local! {
    static SERIAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the kernels' own threading turned off on this thread:
/// every kernel called inside runs on the calling thread. For callers that
/// already split work over threads at a coarser grain (the lab trains the
/// halves of a batch side by side). Results are the same either way: the
/// kernels never depend on their thread count.
pub fn run_serial<R>(f: impl FnOnce() -> R) -> R {
    /// Restores the flag even if `f` unwinds (a pool thread lives on).
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SERIAL.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SERIAL.with(|s| s.replace(true)));
    f()
}

/// The threads a kernel may use here: 1 inside [`run_serial`], otherwise
/// rayon's current pool.
pub fn threads() -> usize {
    if SERIAL.with(|s| s.get()) {
        1
    } else {
        rayon::current_num_threads()
    }
}

/// Sets `RAYON_NUM_THREADS`, if it is unset, to the count rayon's pool
/// takes by default (`std::thread::available_parallelism`), for a program's
/// entry point to call before any thread starts (the `posenc` binary, the
/// Python module).
///
/// candle 0.11's CPU matmul asks for its thread count on every call and,
/// without the variable, reads and parses `/proc/cpuinfo` to count physical
/// cores: a system call and a file of some kilobytes per core per product.
/// The fine-tuner's frozen products and every candle reference path pay it
/// (`strace -f -e openat` of `tests/fused.rs`: 27,020 opens in 20 s; the
/// binary 52 s, 34 s with the variable, Zen 3, 2 cores). Returns the value
/// set, `None` when the user had set one.
///
/// Not for a library's own code: changing the environment while other
/// threads may read it is a data race.
pub fn default_rayon_threads_env() -> Option<usize> {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return None;
    }
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    Some(n)
}

/// An instruction-set level for the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SimdLevel {
    /// Portable scalar code (the compiler may still auto-vectorise it).
    Scalar,
    /// x86-64 AVX2 with FMA and F16C, 8 lanes of `f32`.
    Avx2,
    /// x86-64 AVX-512 F, VL, BW and DQ (every AVX-512 CPU since Intel
    /// Skylake-SP and AMD Zen 4), 16 lanes of `f32` and 32 vector registers.
    Avx512,
    /// aarch64 NEON, 4 lanes of `f32`.
    Neon,
}

/// The environment variable that lowers [`SimdLevel::detect`].
pub const SIMD_ENV: &str = "POSENC_SIMD";

impl SimdLevel {
    /// The level the kernels run at by default: the CPU's best
    /// ([`SimdLevel::best`]), or the one `POSENC_SIMD` names when this CPU
    /// supports it (read once, then cached). An unknown or unsupported
    /// value is ignored here; [`SimdLevel::from_env`] reports it (the
    /// `posenc` binary refuses it before doing anything).
    pub fn detect() -> SimdLevel {
        static LEVEL: std::sync::OnceLock<SimdLevel> = std::sync::OnceLock::new();
        *LEVEL.get_or_init(|| Self::from_env().ok().flatten().unwrap_or_else(Self::best))
    }

    /// The best level this CPU supports, whatever `POSENC_SIMD` says.
    pub fn best() -> SimdLevel {
        *Self::available().last().unwrap_or(&SimdLevel::Scalar)
    }

    /// The level `POSENC_SIMD` asks for: `None` when it is unset or empty.
    ///
    /// # Errors
    /// [`Error::InvalidValue`](crate::Error::InvalidValue) for a name that
    /// is not a level, or a level this CPU lacks.
    pub fn from_env() -> crate::Result<Option<SimdLevel>> {
        match std::env::var(SIMD_ENV) {
            Ok(v) if !v.trim().is_empty() => {
                let level = SimdLevel::parse(v.trim())?;
                if !level.is_supported() {
                    return Err(crate::Error::invalid(
                        SIMD_ENV,
                        format!(
                            "{level} is not supported by this CPU (it has: {})",
                            Self::available()
                                .iter()
                                .map(|l| l.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
                Ok(Some(level))
            }
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(crate::Error::invalid(
                SIMD_ENV,
                "not valid UTF-8 (expected scalar, avx2, avx512 or neon)".to_string(),
            )),
        }
    }

    /// The level named `s` (`scalar`, `avx2`, `avx512`, `neon`; ASCII case
    /// ignored), whether or not this CPU has it.
    ///
    /// # Errors
    /// [`Error::InvalidValue`](crate::Error::InvalidValue) for any other name.
    pub fn parse(s: &str) -> crate::Result<SimdLevel> {
        [
            SimdLevel::Scalar,
            SimdLevel::Avx2,
            SimdLevel::Avx512,
            SimdLevel::Neon,
        ]
        .into_iter()
        .find(|l| l.as_str().eq_ignore_ascii_case(s))
        .ok_or_else(|| {
            let shown: String = s.chars().take(40).collect();
            crate::Error::invalid(
                SIMD_ENV,
                format!("unknown SIMD level {shown:?} (expected scalar, avx2, avx512 or neon)"),
            )
        })
    }

    /// Every level this CPU supports, worst first (always starts with
    /// [`SimdLevel::Scalar`]).
    pub fn available() -> Vec<SimdLevel> {
        #[allow(unused_mut)]
        let mut levels = vec![SimdLevel::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c");
            if avx2 {
                levels.push(SimdLevel::Avx2);
                if std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512dq")
                {
                    levels.push(SimdLevel::Avx512);
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                levels.push(SimdLevel::Neon);
            }
        }
        levels
    }

    /// Whether this CPU can run the level.
    pub fn is_supported(self) -> bool {
        Self::available().contains(&self)
    }

    /// The level itself when this CPU can run it (what every
    /// `with_simd_level` checks).
    ///
    /// # Errors
    /// [`Error::InvalidValue`](crate::Error::InvalidValue) if this CPU
    /// lacks the level.
    pub fn supported(self) -> crate::Result<SimdLevel> {
        if self.is_supported() {
            Ok(self)
        } else {
            Err(crate::Error::invalid(
                "simd level",
                format!("{self} is not supported by this CPU"),
            ))
        }
    }

    /// Short name (`scalar`, `avx2`, `avx512`, `neon`).
    pub fn as_str(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Neon => "neon",
        }
    }
}

crate::display_as_str!(SimdLevel);
