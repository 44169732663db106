//! 2-D RoPE of vision encoders: Pixtral, Qwen-VL and Llama 4.
//!
//! Each is a two-axis [multi-axis RoPE](super::axial) — one position per
//! patch row and one per patch column — built here exactly as transformers
//! 5.23 builds it, with the patch positions of its encoder:
//!
//! - **Pixtral** (Agrawal et al. 2024, *Pixtral 12B*, arXiv:2410.07073,
//!   §2.1.1 "RoPE-2D"; transformers' `PixtralVisionRotaryEmbedding`): the
//!   frequencies `θ_k = theta^(−2k/d)` of a plain RoPE over the head
//!   dimension `d`; the row `h` rotates by the even ones (`θ_0, θ_2, ...`,
//!   first half of the pairs), the column `w` by the odd ones (second half);
//!   half-split pairs; patch `(h, w)` of an `H × W` image has position
//!   `(h, w)`, row-major.
//! - **Qwen-VL vision** (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V encoders;
//!   `Qwen2VLVisionRotaryEmbedding`): frequencies `theta^(−2k/(d/2))` of a
//!   RoPE over half the head, the same for both axes: `h` on the first half
//!   of the pairs, `w` on the second (Heo et al.'s axial RoPE); half-split
//!   pairs; the patches are listed block by block of `m × m` (the spatial
//!   merge), repeated for every temporal patch ([`qwen_vl_vision_positions`]).
//! - **Llama 4 vision** (`Llama4VisionRotaryEmbedding`): frequencies
//!   `theta^(−2k/(d/2))`, `x` (column) on the first half of the pairs, `y`
//!   (row) on the second; interleaved (complex) pairs; patch coordinates
//!   start at 1 and the class token, last, has angle 0
//!   ([`llama4_vision_positions`]).

use serde::{Deserialize, Serialize};

use super::axial::{AxialFrequencies, AxisSplit};
use super::config::HfRopeParametersField;
use super::frequencies::PairLayout;
use super::limits::{MAX_HEAD_DIM, MAX_TOKENS};
use super::scaling::default_inv_freq_f32;
use crate::error::{check_dim, check_size, Error, Result};

/// The vision-encoder keys of a multimodal `config.json`
/// (`vision_config`). Unknown keys are ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HfVisionConfig {
    /// `model_type` of the encoder (`pixtral`, `qwen2_vl`, `llama4_vision_model`, ...).
    pub model_type: Option<String>,
    /// Width of the encoder (Pixtral, Llama 4; Qwen-VL's is `embed_dim`).
    pub hidden_size: Option<usize>,
    /// Qwen2-VL's encoder width.
    pub embed_dim: Option<usize>,
    /// Number of heads.
    pub num_attention_heads: Option<usize>,
    /// Qwen-VL's name of the number of heads (used without `num_attention_heads`).
    pub num_heads: Option<usize>,
    /// Explicit head dimension.
    pub head_dim: Option<usize>,
    /// RoPE base.
    pub rope_theta: Option<f64>,
    /// transformers 5 parameters (may hold `rope_theta`).
    pub rope_parameters: Option<HfRopeParametersField>,
    /// Image side in pixels (Llama 4), or `[height, width]`.
    pub image_size: Option<Side>,
    /// Patch side in pixels, or `[height, width]`.
    pub patch_size: Option<Side>,
    /// Qwen-VL: patches merged `m × m` into one language-model token.
    pub spatial_merge_size: Option<usize>,
    /// Qwen-VL: frames per temporal patch.
    pub temporal_patch_size: Option<Side>,
    /// Qwen2.5-VL: temporal positions per second of video.
    pub tokens_per_second: Option<f64>,
}

/// A size that transformers accepts as one number or a list (`int |
/// list[int]`): `image_size`, `patch_size`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Side {
    /// One value for both sides.
    One(usize),
    /// One value per side.
    Many(Vec<usize>),
}

impl Side {
    /// The first side (the only one for a square).
    pub fn first(&self) -> Option<usize> {
        match self {
            Side::One(v) => Some(*v),
            Side::Many(v) => v.first().copied(),
        }
    }
}

impl HfVisionConfig {
    /// The encoder's RoPE base: `rope_parameters.rope_theta`, `rope_theta`,
    /// or `default` (the model's default).
    pub fn theta(&self, default: f64) -> Result<f64> {
        let from_params = match &self.rope_parameters {
            Some(f) => f
                .resolve("vision_config.rope_parameters")?
                .and_then(|p| p.rope_theta),
            None => None,
        };
        let t = from_params.or(self.rope_theta).unwrap_or(default);
        if !(t.is_finite() && t > 0.0) {
            return Err(Error::InvalidTheta(t));
        }
        Ok(t)
    }

    /// Patches per side of a square image, `image_size / patch_size`
    /// (Llama 4's grid).
    ///
    /// # Errors
    /// [`Error::MissingKey`] without both sizes; [`Error::InvalidDimension`]
    /// for a zero patch size or fewer than one patch; [`Error::TooLarge`]
    /// for more than [`MAX_TOKENS`] patches.
    pub fn patches_per_side(&self) -> Result<usize> {
        let image = self
            .image_size
            .as_ref()
            .and_then(Side::first)
            .ok_or_else(|| Error::missing("vision_config.image_size", None))?;
        let patch = self
            .patch_size
            .as_ref()
            .and_then(Side::first)
            .ok_or_else(|| Error::missing("vision_config.patch_size", None))?;
        check_dim("vision_config.patch_size", patch, false)?;
        let side = check_dim("patches per side", image / patch, false)?;
        check_size("number of patches", side.saturating_mul(side), MAX_TOKENS)?;
        Ok(side)
    }

    /// The encoder's head dimension: `head_dim`, else width (`embed_dim`,
    /// else `hidden_size`) / heads.
    ///
    /// # Errors
    /// [`Error::MissingKey`], [`Error::ZeroHeads`], [`Error::TooLarge`].
    pub fn head_dim(&self) -> Result<usize> {
        let d = match self.head_dim {
            Some(d) if d > 0 => d,
            _ => {
                // Qwen2-VL's `hidden_size` is the language model's; its encoder width is `embed_dim`
                let width = self.embed_dim.or(self.hidden_size).ok_or_else(|| {
                    Error::missing("vision_config.hidden_size", Some("or embed_dim / head_dim"))
                })?;
                let heads = self
                    .num_attention_heads
                    .or(self.num_heads)
                    .ok_or_else(|| Error::missing("vision_config.num_attention_heads", None))?;
                if heads == 0 {
                    return Err(Error::ZeroHeads);
                }
                width / heads
            }
        };
        check_size("vision head_dim", d, MAX_HEAD_DIM)?;
        check_dim("vision head_dim", d, false)
    }
}

/// Defaults of one of transformers' vision config classes: the values its
/// fields take when `config.json` leaves them out.
struct ClassDefaults {
    embed_dim: Option<usize>,
    hidden_size: usize,
    heads: usize,
    /// Whether the class names its head count `num_heads` (Qwen-VL, GLM-4V)
    /// rather than `num_attention_heads` (Pixtral, Llama 4).
    heads_key_is_num_heads: bool,
    image_size: Option<usize>,
    patch_size: usize,
    merge: Option<usize>,
    tokens_per_second: Option<f64>,
}

/// The vision config classes of transformers 5.24 whose encoders have a
/// 2-D RoPE, by the `model_type` (base name) of the model or the encoder:
/// `Qwen2VLVisionConfig`, `Qwen2_5_VLVisionConfig`, `Qwen3VLVisionConfig`
/// (and its MoE and Qwen3.5 siblings), `Glm4vVisionConfig`,
/// `PixtralVisionConfig`, `Llama4VisionConfig`.
fn class_defaults(model_type: &str, vision_model_type: Option<&str>) -> Option<ClassDefaults> {
    let v = vision_model_type.unwrap_or("");
    let m = super::config::base_model_type(model_type);
    let qwen = |hidden_size, embed_dim, patch_size, tokens_per_second| ClassDefaults {
        embed_dim,
        hidden_size,
        heads: 16,
        heads_key_is_num_heads: true,
        image_size: None,
        patch_size,
        merge: Some(2),
        tokens_per_second,
    };
    let is = |name: &str| m == name || v.strip_suffix("_vision").unwrap_or(v) == name;
    if is("qwen2_vl") {
        return Some(qwen(3584, Some(1280), 14, None));
    }
    if is("qwen2_5_vl") {
        return Some(qwen(3584, None, 14, Some(4.0)));
    }
    if ["qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"]
        .iter()
        .any(|n| is(n))
    {
        return Some(qwen(1152, None, 16, None));
    }
    if is("glm4v") || is("glm4v_moe") {
        return Some(ClassDefaults {
            embed_dim: None,
            hidden_size: 1536,
            heads: 12,
            heads_key_is_num_heads: true,
            image_size: Some(336),
            patch_size: 14,
            merge: Some(2),
            tokens_per_second: None,
        });
    }
    if v == "pixtral" || m == "pixtral" {
        return Some(ClassDefaults {
            embed_dim: None,
            hidden_size: 1024,
            heads: 16,
            heads_key_is_num_heads: false,
            image_size: Some(1024),
            patch_size: 16,
            merge: None,
            tokens_per_second: None,
        });
    }
    if v.starts_with("llama4") || m == "llama4" {
        return Some(ClassDefaults {
            embed_dim: None,
            hidden_size: 768,
            heads: 16,
            heads_key_is_num_heads: false,
            image_size: Some(448),
            patch_size: 14,
            merge: None,
            tokens_per_second: None,
        });
    }
    None
}

impl HfVisionConfig {
    /// This encoder config as transformers reads it: every key the file
    /// leaves out takes the default of the vision config class that
    /// transformers picks for `model_type` (the outer model's) or for the
    /// encoder's own `model_type` — so a Qwen2-VL `vision_config` holding
    /// only `{"depth": 32}` reads as the full one (`embed_dim` 1280, 16
    /// heads, patch 14, merge 2). Encoders of other models are returned
    /// unchanged.
    ///
    /// ```
    /// use posenc::rope::vision::HfVisionConfig;
    /// let vc: HfVisionConfig = serde_json::from_str(r#"{"depth": 32}"#)?;
    /// assert!(vc.head_dim().is_err());
    /// assert_eq!(vc.with_class_defaults("qwen2_vl").head_dim()?, 80);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_class_defaults(&self, model_type: &str) -> HfVisionConfig {
        let mut out = self.clone();
        let Some(d) = class_defaults(model_type, self.model_type.as_deref()) else {
            return out;
        };
        if out.embed_dim.is_none() {
            out.embed_dim = d.embed_dim;
        }
        if out.hidden_size.is_none() {
            out.hidden_size = Some(d.hidden_size);
        }
        if out.num_attention_heads.is_none() && out.num_heads.is_none() {
            if d.heads_key_is_num_heads {
                out.num_heads = Some(d.heads);
            } else {
                out.num_attention_heads = Some(d.heads);
            }
        }
        if out.image_size.is_none() {
            out.image_size = d.image_size.map(Side::One);
        }
        if out.patch_size.is_none() {
            out.patch_size = Some(Side::One(d.patch_size));
        }
        if out.spatial_merge_size.is_none() {
            out.spatial_merge_size = d.merge;
        }
        if out.temporal_patch_size.is_none() && d.merge.is_some() {
            out.temporal_patch_size = Some(Side::One(2));
        }
        if out.tokens_per_second.is_none() {
            out.tokens_per_second = d.tokens_per_second;
        }
        out
    }
}

/// A vision encoder's 2-D RoPE as read from a multimodal `config.json`.
#[derive(Debug, Clone)]
pub struct VisionRope {
    /// Which encoder.
    pub kind: VisionRopeKind,
    /// Its head dimension.
    pub head_dim: usize,
    /// Its RoPE base.
    pub rope_theta: f64,
    /// Its frequencies and axes.
    pub frequencies: AxialFrequencies,
}

impl VisionRope {
    /// The vision RoPE of `hf` (its `vision_config`, or its text config's,
    /// with transformers' class defaults applied), or `None` for a model
    /// without a `vision_config` or with an encoder posenc does not know to
    /// use a 2-D RoPE.
    ///
    /// # Errors
    /// Those of [`HfVisionConfig::theta`], [`HfVisionConfig::head_dim`] and
    /// [`VisionRopeKind::frequencies`] for values the file does give.
    pub fn from_hf(hf: &super::config::HfRopeConfig) -> Result<Option<VisionRope>> {
        let Some(vc) = hf.vision() else {
            return Ok(None);
        };
        let mt = hf.model_type.as_deref().unwrap_or("");
        let Some(kind) = VisionRopeKind::for_model(mt, vc.model_type.as_deref()) else {
            return Ok(None);
        };
        let rope_theta = vc.theta(10000.0)?;
        let head_dim = vc.head_dim()?;
        let frequencies = kind.frequencies(rope_theta, head_dim)?;
        Ok(Some(VisionRope {
            kind,
            head_dim,
            rope_theta,
            frequencies,
        }))
    }
}

fn check_quarter(what: &'static str, head_dim: usize) -> Result<()> {
    check_size(what, head_dim, MAX_HEAD_DIM)?;
    check_dim(what, head_dim, false)?;
    if !head_dim.is_multiple_of(4) {
        return Err(Error::InvalidDimension {
            what,
            value: head_dim,
            reason: "a 2-D RoPE needs a multiple of 4 (a whole number of pairs per axis)",
        });
    }
    Ok(())
}

/// Pixtral's 2-D RoPE over a head of `head_dim` (a multiple of 4): pair `j <
/// d/4` rotates by the row with `θ_{2j}`, pair `d/4 + j` by the column with
/// `θ_{2j+1}`, `θ_k = theta^(−2k/d)`; half-split pairs.
///
/// ```
/// use posenc::rope::vision::pixtral;
/// let f = pixtral(10000.0, 8)?;
/// // θ = [1, 0.1, 0.01, 0.001]: rows use 1 and 0.01, columns 0.1 and 0.001
/// assert_eq!(f.inv_freq(), &[1.0, 0.01, 0.1, 0.001]);
/// assert_eq!(f.axes(), &[0, 0, 1, 1]);
/// # Ok::<(), posenc::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidTheta`]; [`Error::InvalidDimension`] /
/// [`Error::TooLarge`] for a head dimension that is zero, not a multiple of
/// 4 or too large.
pub fn pixtral(theta: f64, head_dim: usize) -> Result<AxialFrequencies> {
    if !(theta.is_finite() && theta > 0.0) {
        return Err(Error::InvalidTheta(theta));
    }
    check_quarter("pixtral head_dim", head_dim)?;
    let base = default_inv_freq_f32(theta, head_dim);
    let inv: Vec<f32> = base
        .iter()
        .step_by(2)
        .chain(base.iter().skip(1).step_by(2))
        .copied()
        .collect();
    let q = head_dim / 4;
    let axes = (0..2 * q).map(|j| j / q).collect();
    AxialFrequencies::new("pixtral", inv, axes, 2, 1.0, PairLayout::HalfSplit)
}

/// The positions `(h, w)` of an `h × w` grid of patches, row-major
/// (Pixtral's `meshgrid(..., indexing="ij")`).
///
/// # Errors
/// [`Error::InvalidDimension`] for a zero side; [`Error::TooLarge`] for
/// more than [`MAX_TOKENS`] patches.
pub fn grid_positions(h: usize, w: usize) -> Result<Vec<[u64; 2]>> {
    check_dim("grid h", h, false)?;
    check_dim("grid w", w, false)?;
    check_size("number of patches", h.saturating_mul(w), MAX_TOKENS)?;
    Ok((0..h as u64)
        .flat_map(|i| (0..w as u64).map(move |j| [i, j]))
        .collect())
}

/// The vision RoPE of the Qwen-VL encoders over a head of `head_dim` (a
/// multiple of 4): the generic two-axis axial RoPE, rows on the first half
/// of the pairs and columns on the second, frequencies
/// `theta^(−2k/(head_dim/2))`; half-split pairs.
///
/// # Errors
/// As [`pixtral`].
pub fn qwen_vl_vision(theta: f64, head_dim: usize) -> Result<AxialFrequencies> {
    let what = "qwen-vl vision head_dim";
    two_axis_chunked(
        "qwen-vl-vision",
        what,
        theta,
        head_dim,
        PairLayout::HalfSplit,
    )
}

/// The patch positions `(h, w)` of a `t × h × w` grid in the order of the
/// Qwen-VL encoders (transformers' `get_vision_position_ids`): the `h × w`
/// patches are listed by `m × m` merge blocks (block-major, each block
/// row-major), and the whole frame is repeated `t` times.
///
/// ```
/// use posenc::rope::vision::qwen_vl_vision_positions;
/// let p = qwen_vl_vision_positions(1, 2, 4, 2)?;
/// assert_eq!(p, vec![[0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3], [1, 2], [1, 3]]);
/// # Ok::<(), posenc::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidDimension`] for a zero size or sides that are not
/// multiples of `m`; [`Error::TooLarge`] for more than [`MAX_TOKENS`]
/// patches.
pub fn qwen_vl_vision_positions(t: usize, h: usize, w: usize, m: usize) -> Result<Vec<[u64; 2]>> {
    for (what, v) in [
        ("grid t", t),
        ("grid h", h),
        ("grid w", w),
        ("spatial_merge_size", m),
    ] {
        check_dim(what, v, false)?;
    }
    if !h.is_multiple_of(m) || !w.is_multiple_of(m) {
        return Err(Error::InvalidDimension {
            what: "grid side",
            value: if h.is_multiple_of(m) { w } else { h },
            reason: "must be a multiple of spatial_merge_size",
        });
    }
    check_size(
        "number of patches",
        t.saturating_mul(h).saturating_mul(w),
        MAX_TOKENS,
    )?;
    let mut frame = Vec::with_capacity(h * w);
    for bi in 0..h / m {
        for bj in 0..w / m {
            for i in 0..m {
                for j in 0..m {
                    frame.push([(bi * m + i) as u64, (bj * m + j) as u64]);
                }
            }
        }
    }
    let mut out = Vec::with_capacity(t * frame.len());
    for _ in 0..t {
        out.extend_from_slice(&frame);
    }
    Ok(out)
}

/// Llama 4's vision RoPE over a head of `head_dim` (a multiple of 4): with
/// `F = head_dim / 2` pairs and `θ_k = theta^(−2k/F)`, pair `j < F/2`
/// rotates by the column `x` with `θ_j`, pair `F/2 + j` by the row `y`;
/// interleaved (complex) pairs.
///
/// # Errors
/// As [`pixtral`].
pub fn llama4_vision(theta: f64, head_dim: usize) -> Result<AxialFrequencies> {
    let what = "llama4 vision head_dim";
    two_axis_chunked(
        "llama4-vision",
        what,
        theta,
        head_dim,
        PairLayout::Interleaved,
    )
}

/// The two-axis axial RoPE named `name` over a head of `head_dim` (checked
/// a multiple of 4 as `what`): the first half of the pairs on the first axis, the
/// second half on the second, frequencies `theta^(−2k/(head_dim/2))`,
/// `pairs` layout (the Qwen-VL and Llama 4 vision encoders).
fn two_axis_chunked(
    name: &str,
    what: &'static str,
    theta: f64,
    head_dim: usize,
    pairs: PairLayout,
) -> Result<AxialFrequencies> {
    check_quarter(what, head_dim)?;
    let f = AxialFrequencies::axial(theta, head_dim, 2, AxisSplit::Chunked, pairs)?;
    AxialFrequencies::new(
        name,
        f.inv_freq().to_vec(),
        f.axes().to_vec(),
        2,
        1.0,
        pairs,
    )
}

/// The positions `(x, y)` of Llama 4's vision tokens for a square image of
/// `side × side` patches: patch `i` (row-major) at `(i mod side + 1, i / side
/// + 1)`, then the class token at `(0, 0)` (angle 0), as
/// `Llama4VisionRotaryEmbedding` builds them.
///
/// # Errors
/// [`Error::InvalidDimension`] for a zero side; [`Error::TooLarge`] for
/// more than [`MAX_TOKENS`] patches.
pub fn llama4_vision_positions(side: usize) -> Result<Vec<[u64; 2]>> {
    check_dim("patches per side", side, false)?;
    check_size("number of patches", side.saturating_mul(side), MAX_TOKENS)?;
    let s = side as u64;
    let mut out: Vec<[u64; 2]> = (0..s * s).map(|i| [i % s + 1, i / s + 1]).collect();
    out.push([0, 0]);
    Ok(out)
}

/// A vision encoder's RoPE, read from a multimodal config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionRopeKind {
    /// Pixtral (`model_type` `pixtral`, `llava` / `mistral3` with a Pixtral encoder).
    Pixtral,
    /// The Qwen-VL family's encoders (and GLM-4V's).
    QwenVl,
    /// Llama 4's encoder.
    Llama4,
}

impl VisionRopeKind {
    /// Name used in JSON (`pixtral`, `qwen-vl`, `llama4`).
    pub fn as_str(self) -> &'static str {
        match self {
            VisionRopeKind::Pixtral => "pixtral",
            VisionRopeKind::QwenVl => "qwen-vl",
            VisionRopeKind::Llama4 => "llama4",
        }
    }

    /// The kind for a model (outer `model_type`) or encoder (`vision_config.model_type`).
    pub fn for_model(model_type: &str, vision_model_type: Option<&str>) -> Option<Self> {
        let v = vision_model_type.unwrap_or("");
        let m = super::config::base_model_type(model_type);
        if v == "pixtral" || m == "pixtral" {
            return Some(VisionRopeKind::Pixtral);
        }
        if v.starts_with("llama4") || m == "llama4" {
            return Some(VisionRopeKind::Llama4);
        }
        let qwen = [
            "qwen2_vl",
            "qwen2_5_vl",
            "qwen3_vl",
            "qwen3_vl_moe",
            "qwen3_5",
            "qwen3_5_moe",
            "glm4v",
            "glm4v_moe",
        ];
        if qwen.contains(&m) || qwen.iter().any(|q| v.starts_with(q)) {
            return Some(VisionRopeKind::QwenVl);
        }
        None
    }

    /// The frequencies for base `theta` and head dimension `head_dim`.
    ///
    /// # Errors
    /// Those of [`pixtral`], [`qwen_vl_vision`], [`llama4_vision`].
    pub fn frequencies(self, theta: f64, head_dim: usize) -> Result<AxialFrequencies> {
        match self {
            VisionRopeKind::Pixtral => pixtral(theta, head_dim),
            VisionRopeKind::QwenVl => qwen_vl_vision(theta, head_dim),
            VisionRopeKind::Llama4 => llama4_vision(theta, head_dim),
        }
    }
}
