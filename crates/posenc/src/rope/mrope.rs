//! Multimodal RoPE (M-RoPE): three position axes (time, height, width).
//!
//! Wang et al. 2024, *Qwen2-VL: Enhancing Vision-Language Model's Perception
//! of the World at Any Resolution* (arXiv:2409.12191), §2.1: the `d_r / 2`
//! frequencies of a RoPE are split into three sections, and each section
//! rotates by one coordinate of the token — its time `t`, row `h` or column
//! `w`. Text tokens have `t = h = w`, so on text M-RoPE is plain RoPE;
//! image and video patches get their grid coordinates (see
//! [`rope_index`]). It is a [multi-axis RoPE](super::axial) with three axes:
//!
//! - **chunked** (Qwen2-VL, Qwen2.5-VL, GLM-4V; transformers' `split` of the
//!   frequencies by `mrope_section = [s_t, s_h, s_w]`): frequencies
//!   `0..s_t` use `t`, the next `s_h` use `h`, the last `s_w` use `w` (with
//!   more than three sections, section `i` uses axis `i mod 3`);
//! - **interleaved** (Qwen3-VL, Qwen3.5; Bai et al. 2025, *Qwen3-VL
//!   Technical Report*, arXiv:2511.21631, transformers'
//!   `recomposition_frequencies` / `apply_interleaved_mrope`): frequency `j`
//!   uses `h` when `j mod 3 = 1` and `j < 3·s_h`, `w` when `j mod 3 = 2`
//!   and `j < 3·s_w`, `t` otherwise, so every axis spans the whole band of
//!   wavelengths.
//!
//! In both, `s_t + s_h + s_w = d_r / 2` is checked, and each axis must get
//! exactly its section's number of frequencies. The frequencies themselves
//! are those of the config's scaling (transformers allows YaRN and the
//! others with M-RoPE: `ROPE_INIT_FUNCTIONS` builds `inv_freq`, the sections
//! only choose the axis), so [`Mrope`] wraps a [`RopeConfig`].
//!
//! The pair layout is the model's: half-split (`rotate_half`) for Qwen,
//! interleaved for GLM-4V (`repeat_interleave` of the recomposed
//! frequencies).

use super::axial::AxialFrequencies;
use super::config::RopeConfig;
use super::limits::MAX_TOKENS;
use crate::error::{check_dim, check_size, Error, Result};

/// How the M-RoPE sections are laid over the frequencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MropeLayout {
    /// Contiguous sections (Qwen2-VL, Qwen2.5-VL, GLM-4V).
    #[default]
    Chunked,
    /// `j mod 3` within the section bounds (Qwen3-VL, Qwen3.5).
    Interleaved,
}

/// The axis (0 = t, 1 = h, 2 = w) of each of `n_freq` frequencies.
///
/// ```
/// use posenc::rope::mrope::{mrope_axes, MropeLayout};
/// assert_eq!(mrope_axes(&[2, 1, 1], 4, MropeLayout::Chunked)?, vec![0, 0, 1, 2]);
/// // Qwen3-VL's interleaving: t h w t h w ... then t for the rest
/// assert_eq!(mrope_axes(&[3, 2, 2], 7, MropeLayout::Interleaved)?, vec![0, 1, 2, 0, 1, 2, 0]);
/// # Ok::<(), posenc::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidValue`] if the sections do not add up to `n_freq`, if the
/// interleaved layout has other than three sections, or if an axis would
/// not get exactly its section's number of frequencies.
pub fn mrope_axes(section: &[usize], n_freq: usize, layout: MropeLayout) -> Result<Vec<usize>> {
    check_dim("number of mrope sections", section.len(), false)?;
    let sum = section
        .iter()
        .try_fold(0usize, |a, &s| a.checked_add(s))
        .unwrap_or(usize::MAX);
    if sum != n_freq {
        return Err(Error::invalid(
            "mrope_section",
            format!(
                "{section:?} adds up to {sum}, but the rotary dimension has {n_freq} frequencies (rotary_dim / 2)"
            ),
        ));
    }
    let axes = match layout {
        MropeLayout::Chunked => section
            .iter()
            .enumerate()
            .flat_map(|(i, &s)| std::iter::repeat_n(i % 3, s))
            .collect::<Vec<_>>(),
        MropeLayout::Interleaved => {
            if section.len() != 3 {
                return Err(Error::invalid(
                    "mrope_section",
                    format!(
                        "interleaved M-RoPE needs three sections [t, h, w], got {}",
                        section.len()
                    ),
                ));
            }
            (0..n_freq)
                .map(|j| match j % 3 {
                    1 if j < 3 * section[1] => 1,
                    2 if j < 3 * section[2] => 2,
                    _ => 0,
                })
                .collect()
        }
    };
    let mut counts = [0usize; 3];
    for &a in &axes {
        counts[a] += 1;
    }
    let mut want = [0usize; 3];
    for (i, &s) in section.iter().enumerate() {
        want[i % 3] += s;
    }
    if counts != want {
        return Err(Error::invalid(
            "mrope_section",
            format!(
                "{section:?} interleaved over {n_freq} frequencies gives the axes (t, h, w) {counts:?} frequencies, not {want:?}"
            ),
        ));
    }
    Ok(axes)
}

/// M-RoPE: a RoPE configuration (any scaling) with its three sections.
///
/// ```
/// use posenc::rope::mrope::{Mrope, MropeLayout};
/// use posenc::rope::RopeConfig;
/// // Qwen2-VL-7B: head_dim 128, sections [16, 24, 24]
/// let m = Mrope::new(RopeConfig::new(1e6, 128)?, vec![16, 24, 24], MropeLayout::Chunked)?;
/// let f = m.frequencies(None)?;
/// assert_eq!(f.axis_counts(), vec![16, 24, 24]);
/// // a text token (t = h = w) is rotated as by plain RoPE
/// let (c, _) = f.cos_sin_f64(&[7, 7, 7])?;
/// let plain = m.config().frequencies(None)?.cos_sin_f64(7).0;
/// assert_eq!(c, plain);
/// # Ok::<(), posenc::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Mrope {
    config: RopeConfig,
    section: Vec<usize>,
    layout: MropeLayout,
}

impl Mrope {
    /// M-RoPE over `config`'s frequencies with `section = [s_t, s_h, s_w]`.
    ///
    /// # Errors
    /// Those of [`RopeConfig::validate`] and [`mrope_axes`].
    pub fn new(config: RopeConfig, section: Vec<usize>, layout: MropeLayout) -> Result<Self> {
        config.validate()?;
        mrope_axes(&section, config.rotary_dim() / 2, layout)?;
        Ok(Mrope {
            config,
            section,
            layout,
        })
    }

    /// The underlying RoPE configuration.
    pub fn config(&self) -> &RopeConfig {
        &self.config
    }
    /// `mrope_section`.
    pub fn section(&self) -> &[usize] {
        &self.section
    }
    /// Chunked or interleaved.
    pub fn layout(&self) -> MropeLayout {
        self.layout
    }
    /// Whether the sections are interleaved (`mrope_interleaved`).
    pub fn interleaved(&self) -> bool {
        self.layout == MropeLayout::Interleaved
    }

    /// The three-axis frequencies at sequence length `seq_len` (see
    /// [`RopeConfig::frequencies`]).
    ///
    /// # Errors
    /// Those of [`RopeConfig::frequencies`] and [`mrope_axes`].
    pub fn frequencies(&self, seq_len: Option<usize>) -> Result<AxialFrequencies> {
        let f = self.config.frequencies(seq_len)?;
        let axes = mrope_axes(&self.section, f.inv_freq.len(), self.layout)?;
        AxialFrequencies::from_frequencies(&f, axes, 3)
    }
}

/// One part of a multimodal sequence, in the order of the tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Segment {
    /// `n` text tokens.
    Text(usize),
    /// An image of `t × h × w` patches (`image_grid_thw`; `t` is 1 for a
    /// still image), merged `m × m` into `t · (h/m) · (w/m)` tokens.
    Image {
        /// Temporal patches.
        t: usize,
        /// Rows of patches.
        h: usize,
        /// Columns of patches.
        w: usize,
    },
    /// A video of `t × h × w` patches (`video_grid_thw`).
    Video {
        /// Temporal patches (frames / `temporal_patch_size`).
        t: usize,
        /// Rows of patches.
        h: usize,
        /// Columns of patches.
        w: usize,
        /// Seconds per temporal patch (`second_per_grid_ts`, Qwen2.5-VL);
        /// `None` is 1.
        seconds_per_grid: Option<f64>,
    },
}

/// Which model's `get_rope_index` rules build the position ids.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum IndexRules {
    /// Qwen2-VL: the temporal index of a video advances by 1 per temporal
    /// patch.
    Qwen2Vl,
    /// Qwen2.5-VL: the temporal index of a video advances by
    /// `tokens_per_second × seconds_per_grid` per temporal patch (truncated
    /// to an integer), so that it follows absolute time.
    Qwen25Vl {
        /// `vision_config.tokens_per_second`.
        tokens_per_second: f64,
    },
    /// Qwen3-VL, Qwen3.5 and GLM-4V: a video is a sequence of one-frame
    /// grids (in the prompt each frame follows its timestamp text); each
    /// frame starts at the current position.
    FrameSplit,
}

impl IndexRules {
    /// The rules of a `model_type` (`qwen2_vl`, `qwen2_5_vl`, `qwen3_vl`,
    /// `glm4v`, ...; a `_text` suffix is ignored), `None` for a model that
    /// is not an M-RoPE model. `tokens_per_second` is Qwen2.5-VL's (its
    /// config default is 4).
    pub fn for_model(model_type: &str, tokens_per_second: Option<f64>) -> Option<IndexRules> {
        match super::config::base_model_type(model_type) {
            "qwen2_vl" => Some(IndexRules::Qwen2Vl),
            "qwen2_5_vl" | "qwen2_5_omni" => Some(IndexRules::Qwen25Vl {
                tokens_per_second: tokens_per_second.unwrap_or(4.0),
            }),
            "qwen3_vl" | "qwen3_vl_moe" | "qwen3_5" | "qwen3_5_moe" | "glm4v" | "glm4v_moe" => {
                Some(IndexRules::FrameSplit)
            }
            _ => None,
        }
    }
}

/// M-RoPE position ids of a sequence: one `(t, h, w)` per token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MropePositions {
    /// `(t, h, w)` of each token, in order.
    pub ids: Vec<[u64; 3]>,
}

impl MropePositions {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    /// Whether there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    /// The largest coordinate of any token on any axis plus 1 (0 when
    /// empty): where decoding continues.
    pub fn next_position(&self) -> u64 {
        self.ids
            .iter()
            .flat_map(|p| p.iter().copied())
            .max()
            .map_or(0, |m| m + 1)
    }
    /// transformers' `rope_deltas`: `next_position − len`, added to the
    /// 1-D position of every generated token.
    pub fn delta(&self) -> i128 {
        self.next_position() as i128 - self.len() as i128
    }
    /// The position of generated token `step` (0 for the first token after
    /// the prompt): `next_position + step` on every axis.
    ///
    /// # Errors
    /// [`Error::PositionOutOfRange`] if it overflows `u64`.
    pub fn decode_position(&self, step: u64) -> Result<[u64; 3]> {
        let p = self
            .next_position()
            .checked_add(step)
            .ok_or(Error::PositionOutOfRange {
                position: u64::MAX,
                limit: u64::MAX,
                what: "M-RoPE decode position",
            })?;
        Ok([p, p, p])
    }
    /// The positions as a row-major `(tokens, 3)` list (the input of
    /// [`AxialFrequencies::cos_sin_table`]).
    pub fn flat(&self) -> Vec<u64> {
        self.ids.iter().flat_map(|p| p.iter().copied()).collect()
    }
    /// The positions per axis, transformers' `(3, seq_len)` layout.
    pub fn by_axis(&self) -> [Vec<u64>; 3] {
        [0, 1, 2].map(|a| self.ids.iter().map(|p| p[a]).collect())
    }
}

/// Largest coordinate a position may reach (beyond, `f64` angles lose
/// integer exactness and torch's `.long()` of the temporal index is
/// undefined).
const MAX_COORDINATE: u64 = 1 << 53;

/// `c + by`, bounded by [`MAX_COORDINATE`].
fn advance(c: u64, by: u64) -> Result<u64> {
    coordinate(c.saturating_add(by), "M-RoPE position")
}

/// `v` when it is at most [`MAX_COORDINATE`].
///
/// # Errors
/// [`Error::TooLarge`] otherwise, about `what`.
fn coordinate(v: u64, what: &'static str) -> Result<u64> {
    if v > MAX_COORDINATE {
        return Err(Error::TooLarge {
            what,
            value: v,
            max: MAX_COORDINATE,
        });
    }
    Ok(v)
}

/// The tokens of one `T × H × W` grid at the current position `c`, which
/// then advances by `max(H, W) / m`.
fn grid(
    ids: &mut Vec<[u64; 3]>,
    c: &mut u64,
    [t, h, w]: [usize; 3],
    m: usize,
    interval: Interval,
) -> Result<()> {
    let (gh, gw) = ((h / m) as u64, (w / m) as u64);
    let start = *c;
    for k in temporal_indices(t, interval)? {
        let tt = advance(start, k)?;
        let hh = advance(start, gh)?;
        let _ = advance(start, gw)?;
        for i in start..hh {
            for j in 0..gw {
                ids.push([tt, i, start + j]);
            }
        }
    }
    *c = advance(start, (h.max(w) / m) as u64)?;
    Ok(())
}

/// The temporal indices `⌊k · interval⌋`, `k = 0..t`, of one grid, as
/// transformers computes `(torch.arange(t) * time_interval).long()`: integer
/// arithmetic when the interval is an integer Python number, `float32`
/// otherwise.
fn temporal_indices(t: usize, interval: Interval) -> Result<Vec<u64>> {
    (0..t as u64)
        .map(|k| {
            let v = match interval {
                Interval::Int(i) => k.checked_mul(i).ok_or(Error::TooLarge {
                    what: "video temporal position",
                    value: u64::MAX,
                    max: MAX_COORDINATE,
                })?,
                Interval::F32(i) => {
                    let x = (k as f32) * i;
                    if !(x.is_finite() && x >= 0.0) {
                        return Err(Error::invalid(
                            "video time interval",
                            format!("temporal position {x} is not a finite non-negative number"),
                        ));
                    }
                    if x as f64 > MAX_COORDINATE as f64 {
                        return Err(Error::TooLarge {
                            what: "video temporal position",
                            value: x as u64,
                            max: MAX_COORDINATE,
                        });
                    }
                    x.trunc() as u64
                }
            };
            coordinate(v, "video temporal position")
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
enum Interval {
    Int(u64),
    F32(f32),
}

fn interval_of(tokens_per_second: f64, seconds_per_grid: Option<f64>) -> Result<Interval> {
    for (name, v) in [
        ("tokens_per_second", Some(tokens_per_second)),
        ("seconds_per_grid", seconds_per_grid),
    ] {
        if let Some(v) = v {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::invalid(
                    name,
                    format!("{v} is not a finite non-negative number"),
                ));
            }
        }
    }
    Ok(match seconds_per_grid {
        // `tokens_per_second * tensor(second_per_grid)`: a float32 tensor
        Some(s) => Interval::F32((tokens_per_second as f32) * (s as f32)),
        // `tokens_per_second * 1`: a Python number
        None if tokens_per_second.fract() == 0.0 && tokens_per_second <= MAX_COORDINATE as f64 => {
            Interval::Int(tokens_per_second as u64)
        }
        None => Interval::F32(tokens_per_second as f32),
    })
}

/// The M-RoPE position ids of a sequence of text runs and image / video
/// grids, exactly as transformers 5's `get_rope_index` builds them
/// (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V):
///
/// - a text run of `n` tokens at the current position `c` gets
///   `(c + i, c + i, c + i)`, `i = 0..n`, and `c` advances by `n`;
/// - a grid of `T × H × W` patches with spatial merge `m` gives
///   `T · (H/m) · (W/m)` tokens in `(t, h, w)` order with
///   `(c + ⌊k · Δ⌋, c + i, c + j)` for `k < T`, `i < H/m`, `j < W/m`, and
///   `c` advances by `max(H, W) / m` (integer division). `Δ` is 1 for
///   images; for videos 1 (Qwen2-VL), `tokens_per_second ×
///   seconds_per_grid` (Qwen2.5-VL, `float32` then truncated), and with
///   [`IndexRules::FrameSplit`] a video of `T` patches is `T` one-frame
///   grids in a row.
///
/// Decoding continues from [`MropePositions::next_position`] (transformers'
/// `rope_deltas`).
///
/// ```
/// use posenc::rope::mrope::{rope_index, IndexRules, Segment};
/// // "<text> <image 1×4×6 patches> <text>", merge 2 → 2 × 3 image tokens
/// let ids = rope_index(
///     &[Segment::Text(2), Segment::Image { t: 1, h: 4, w: 6 }, Segment::Text(1)],
///     IndexRules::Qwen2Vl,
///     2,
/// )?;
/// assert_eq!(ids.ids, vec![
///     [0, 0, 0], [1, 1, 1],
///     [2, 2, 2], [2, 2, 3], [2, 2, 4], [2, 3, 2], [2, 3, 3], [2, 3, 4],
///     [5, 5, 5],
/// ]);
/// assert_eq!(ids.next_position(), 6);
/// # Ok::<(), posenc::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidDimension`] for a zero merge size or a grid with a zero
/// side or a side smaller than the merge size; [`Error::TooLarge`] for more
/// than [`MAX_TOKENS`] tokens or a coordinate past 2^53;
/// [`Error::InvalidValue`] for a negative or non-finite time interval.
pub fn rope_index(
    segments: &[Segment],
    rules: IndexRules,
    spatial_merge_size: usize,
) -> Result<MropePositions> {
    check_dim("spatial_merge_size", spatial_merge_size, false)?;
    let m = spatial_merge_size;
    // count first, so that nothing is allocated for a sequence that is too long
    let mut total = 0usize;
    for s in segments {
        let n = match *s {
            Segment::Text(n) => n,
            Segment::Image { t, h, w } | Segment::Video { t, h, w, .. } => {
                for (what, v) in [("grid t", t), ("grid h", h), ("grid w", w)] {
                    check_dim(what, v, false)?;
                }
                if h < m || w < m {
                    return Err(Error::InvalidDimension {
                        what: "grid side",
                        value: h.min(w),
                        reason: "smaller than spatial_merge_size (no token would be left)",
                    });
                }
                t.saturating_mul(h / m).saturating_mul(w / m)
            }
        };
        total = total.saturating_add(n);
        check_size("number of tokens", total, MAX_TOKENS)?;
    }
    let mut ids = Vec::with_capacity(total);
    let mut c: u64 = 0;
    for s in segments {
        match *s {
            Segment::Text(n) => {
                let end = advance(c, n as u64)?;
                ids.extend((c..end).map(|p| [p, p, p]));
                c = end;
            }
            Segment::Image { t, h, w } => grid(&mut ids, &mut c, [t, h, w], m, Interval::Int(1))?,
            Segment::Video {
                t,
                h,
                w,
                seconds_per_grid,
            } => match rules {
                IndexRules::Qwen2Vl => grid(&mut ids, &mut c, [t, h, w], m, Interval::Int(1))?,
                IndexRules::Qwen25Vl { tokens_per_second } => grid(
                    &mut ids,
                    &mut c,
                    [t, h, w],
                    m,
                    interval_of(tokens_per_second, seconds_per_grid)?,
                )?,
                IndexRules::FrameSplit => {
                    for _ in 0..t {
                        grid(&mut ids, &mut c, [1, h, w], m, Interval::Int(1))?;
                    }
                }
            },
        }
    }
    Ok(MropePositions { ids })
}
