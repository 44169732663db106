//! GGUF files (llama.cpp's format): the header scanned and checked by this
//! module first ([`scan_header`]: every count, string and array bounded by
//! the bytes present and by a stated cap, the alignment, every tensor's
//! type, shape, offset and extent, no duplicate or overlapping tensors),
//! then read by candle's reader ([`candle_core::quantized::gguf_file`]),
//! which thus only ever sees a well-formed header; metadata mapped onto the
//! Hugging Face config as transformers' `integrations/ggml.py` maps it, and
//! tensors dequantized to `f32` under their Hugging Face names.
//!
//! **Pair layout.** llama.cpp's converter permutes the rows of a Llama
//! model's q and k projections so that its "normal" RoPE (pairs `(2i,
//! 2i+1)`) computes what Hugging Face's half-split RoPE computes on the
//! original rows; transformers permutes them back when it loads a GGUF.
//! posenc keeps the file's rows and rotates interleaved pairs
//! ([`PairLayout::Interleaved`]): the same logits, since q and k are
//! permuted alike within each head. Qwen2 files use llama.cpp's NeoX RoPE
//! and are not permuted: half-split pairs.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use posenc::rope::{PairLayout, RopeConfig, RopeScaling, YarnParams};

use crate::config::{Arch, DecoderConfig, HfDecoderConfig, TokenIds};
use crate::error::{ModelError, Result};
use crate::safe::{escape as esc, quote};
use crate::weights::WeightSource;

/// Largest number of elements of one tensor accepted (2^34: 64 GB in f32).
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 34;

/// Longest metadata string accepted (16 MiB; chat templates are tens of
/// kilobytes).
pub const MAX_METADATA_STRING: u64 = 16 << 20;

/// Longest metadata key or tensor name accepted, bytes.
pub const MAX_NAME_BYTES: u64 = 1024;

/// Most metadata entries accepted.
pub const MAX_METADATA_KEYS: u64 = 1 << 16;

/// Most tensors accepted.
pub const MAX_TENSORS: u64 = 1 << 20;

/// Most metadata array elements accepted, all arrays together (2^22: the
/// largest vocabularies, with their scores, types and merges, need under
/// 2 million). candle holds each element in 32 bytes, so the metadata's
/// memory is bounded by 128 MiB plus the bytes of its strings.
pub const MAX_METADATA_ELEMENTS: u64 = 1 << 22;

/// The tensor types this crate dequantizes (others are refused by name).
pub const SUPPORTED_TYPES: &[GgmlDType] = &[
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::BF16,
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q2K,
    GgmlDType::Q3K,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

/// An open GGUF file: its metadata and tensor directory, checked.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
}

debug_summary!(GgufFile {
    "path": |s| &s.path,
    "tensors": |s| s.content.tensor_infos.len(),
});

impl GgufFile {
    /// Opens `path` and reads its header: the magic, the metadata, the
    /// tensor directory. Every tensor's byte range is checked against the
    /// file's size here, so a truncated file is refused before any tensor
    /// is read.
    ///
    /// # Errors
    /// [`ModelError::Io`] if the file cannot be opened;
    /// [`ModelError::BadFile`] for anything that is not a complete GGUF
    /// file.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let (file, file_size) = crate::fsio::open_regular(path)?;
        let mut reader = BufReader::new(file);
        let scanned = scan_header(&mut reader, file_size)
            .map_err(|reason| ModelError::bad_file(path, reason))?;
        reader
            .seek(SeekFrom::Start(0))
            .map_err(|e| ModelError::io(path, e))?;
        let content = Content::read(&mut reader).map_err(|e| {
            let msg = crate::weights::candle_reason(&e).1;
            if msg.contains("magic") {
                ModelError::bad_file(path, "not a GGUF file (wrong magic number)")
            } else if msg.contains("failed to fill whole buffer") || msg.contains("UnexpectedEof") {
                ModelError::bad_file(path, "GGUF header is truncated")
            } else {
                ModelError::bad_file(path, format!("unreadable GGUF header: {}", esc(&msg)))
            }
        })?;
        if content.tensor_data_offset != scanned.data_offset
            || content.tensor_infos.len() != scanned.tensors
        {
            return Err(ModelError::bad_file(
                path,
                "candle's reader and the header scan disagree on the tensor directory",
            ));
        }
        for (name, info) in &content.tensor_infos {
            let name = esc(name);
            let dims = info.shape.dims();
            let mut elems: u64 = 1;
            for &d in dims {
                elems = elems.saturating_mul(d as u64);
            }
            if elems == 0 || elems > MAX_TENSOR_ELEMENTS {
                return Err(ModelError::bad_file(
                    path,
                    format!("tensor {name} has shape {dims:?}"),
                ));
            }
            let block = info.ggml_dtype.block_size() as u64;
            if !elems.is_multiple_of(block) {
                return Err(ModelError::bad_file(
                    path,
                    format!(
                        "tensor {name}: {elems} elements are not whole {:?} blocks",
                        info.ggml_dtype
                    ),
                ));
            }
            let bytes = elems / block * info.ggml_dtype.type_size() as u64;
            let start = content.tensor_data_offset.saturating_add(info.offset);
            if start.saturating_add(bytes) > file_size {
                return Err(ModelError::bad_file(
                    path,
                    format!(
                        "truncated: tensor {name} needs bytes {start}..{} of a {file_size}-byte file",
                        start.saturating_add(bytes)
                    ),
                ));
            }
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            content,
            reader,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The metadata, key by key.
    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    /// The names of the tensors in the file.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.content.tensor_infos.keys().map(String::as_str)
    }

    /// The shape (candle order: outermost first) and type of a tensor.
    pub fn tensor_info(&self, name: &str) -> Option<(Vec<usize>, GgmlDType)> {
        self.content
            .tensor_infos
            .get(name)
            .map(|i| (i.shape.dims().to_vec(), i.ggml_dtype))
    }

    /// `general.architecture`.
    ///
    /// # Errors
    /// [`ModelError::BadFile`] if the key is missing or not a string.
    pub fn architecture(&self) -> Result<String> {
        self.string("general.architecture")?.ok_or_else(|| {
            ModelError::bad_file(&self.path, "no general.architecture in the metadata")
        })
    }

    fn string(&self, key: &str) -> Result<Option<String>> {
        match self.content.metadata.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(ModelError::bad_file(
                &self.path,
                format!(
                    "metadata {} is {:?}, expected a string",
                    esc(key),
                    v.value_type()
                ),
            )),
        }
    }

    fn uint(&self, key: &str) -> Result<Option<u64>> {
        match self.content.metadata.get(key) {
            None => Ok(None),
            Some(v) => v.to_u64().map(Some).or_else(|_| match v {
                Value::I32(x) if *x >= 0 => Ok(Some(*x as u64)),
                Value::I64(x) if *x >= 0 => Ok(Some(*x as u64)),
                Value::U8(x) => Ok(Some(*x as u64)),
                Value::U16(x) => Ok(Some(*x as u64)),
                _ => Err(ModelError::bad_file(
                    &self.path,
                    format!("metadata {} is not a non-negative integer", esc(key)),
                )),
            }),
        }
    }

    fn usize_key(&self, key: &str) -> Result<Option<usize>> {
        Ok(self
            .uint(key)?
            .map(|v| usize::try_from(v).unwrap_or(usize::MAX)))
    }

    fn float(&self, key: &str) -> Result<Option<f64>> {
        match self.content.metadata.get(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(*x as f64)),
            Some(Value::F64(x)) => Ok(Some(*x)),
            Some(v) => match v.to_u64() {
                Ok(x) => Ok(Some(x as f64)),
                Err(_) => Err(ModelError::bad_file(
                    &self.path,
                    format!("metadata {} is not a number", esc(key)),
                )),
            },
        }
    }

    /// Whether the tokenizer asks for a BOS token (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos_token(&self) -> bool {
        matches!(
            self.content.metadata.get("tokenizer.ggml.add_bos_token"),
            Some(Value::Bool(true))
        )
    }

    /// The model's configuration, from the metadata as transformers maps it
    /// (`{arch}.context_length` → `max_position_embeddings`, `block_count`
    /// → `num_hidden_layers`, `feed_forward_length` → `intermediate_size`,
    /// `embedding_length` → `hidden_size`, `rope.freq_base` → `rope_theta`,
    /// `attention.head_count(_kv)`, `attention.layer_norm_rms_epsilon`,
    /// `vocab_size` or the number of tokens; the embedding is tied when the
    /// file has no `output.weight`). Beyond transformers: `attention.key_length`
    /// (head dimension), `rope.dimension_count` (partial rotary), the
    /// `rope.scaling.*` keys (linear, YaRN) and a `rope_freqs.weight` tensor
    /// (Llama 3.1's per-pair frequency divisors) are honoured.
    ///
    /// # Errors
    /// [`ModelError::Unsupported`] for an architecture other than llama,
    /// mistral or qwen2; [`ModelError::BadFile`] for missing or ill-typed
    /// keys; the bounds of [`DecoderConfig::from_hf`].
    pub fn config(&mut self) -> Result<DecoderConfig> {
        let arch_name = self.architecture()?;
        let arch = Arch::parse(&arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let need = |v: Option<usize>, k: &str| -> Result<usize> {
            v.ok_or_else(|| ModelError::bad_file(&self.path, format!("missing metadata {k}")))
        };
        let hidden = need(
            self.usize_key(&key("embedding_length"))?,
            &key("embedding_length"),
        )?;
        let heads = need(
            self.usize_key(&key("attention.head_count"))?,
            &key("attention.head_count"),
        )?;
        let vocab = match self.usize_key(&key("vocab_size"))? {
            Some(v) => Some(v),
            None => match self.content.metadata.get("tokenizer.ggml.tokens") {
                Some(Value::Array(a)) => Some(a.len()),
                _ => self.tensor_info("token_embd.weight").map(|(d, _)| d[0]),
            },
        };
        let hf = HfDecoderConfig {
            model_type: Some(arch.name().to_string()),
            vocab_size: vocab,
            hidden_size: Some(hidden),
            intermediate_size: Some(need(
                self.usize_key(&key("feed_forward_length"))?,
                &key("feed_forward_length"),
            )?),
            num_hidden_layers: Some(need(
                self.usize_key(&key("block_count"))?,
                &key("block_count"),
            )?),
            num_attention_heads: Some(heads),
            num_key_value_heads: self.usize_key(&key("attention.head_count_kv"))?,
            head_dim: self.usize_key(&key("attention.key_length"))?,
            rms_norm_eps: self.float(&key("attention.layer_norm_rms_epsilon"))?,
            max_position_embeddings: self.usize_key(&key("context_length"))?,
            tie_word_embeddings: Some(!self.content.tensor_infos.contains_key("output.weight")),
            attention_bias: Some(self.content.tensor_infos.contains_key("blk.0.attn_q.bias")),
            mlp_bias: None,
            hidden_act: None,
            sliding_window: None,
            use_sliding_window: None,
            architectures: None,
            bos_token_id: self
                .uint("tokenizer.ggml.bos_token_id")?
                .map(|v| TokenIds::One(v as u32)),
            eos_token_id: self
                .uint("tokenizer.ggml.eos_token_id")?
                .map(|v| TokenIds::One(v as u32)),
        };
        let head_dim = hf.head_dim.unwrap_or(hidden / heads.max(1));
        let theta = self.float(&key("rope.freq_base"))?.unwrap_or(10000.0);
        let rotary_dim = self
            .usize_key(&key("rope.dimension_count"))?
            .unwrap_or(head_dim);
        let layout = match arch {
            Arch::Llama | Arch::Mistral => PairLayout::Interleaved,
            Arch::Qwen2 => PairLayout::HalfSplit,
        };
        // A posenc error on the RoPE keys, named by the GGUF key(s) it
        // comes from.
        let path = self.path.clone();
        let in_key = move |k: String| {
            let path = path.clone();
            move |e: posenc::Error| ModelError::bad_file(&path, format!("{k}: {e}"))
        };
        let mut rope = RopeConfig::new(theta, rotary_dim)
            .map_err(in_key(format!(
                "{} / {}",
                key("rope.freq_base"),
                key("rope.dimension_count")
            )))?
            .with_head_dim(head_dim)
            .with_layout(layout);
        if let Some(ctx) = hf.max_position_embeddings {
            rope = rope.with_max_position_embeddings(ctx);
        }
        let scaling = self.string(&key("rope.scaling.type"))?;
        let factor = self.float(&key("rope.scaling.factor"))?;
        let original = self.usize_key(&key("rope.scaling.original_context_length"))?;
        match scaling.as_deref() {
            None | Some("none") => {}
            Some("linear") => {
                let factor = factor.ok_or_else(|| {
                    ModelError::bad_file(&self.path, "linear rope scaling without a factor")
                })?;
                rope = rope
                    .with_scaling(RopeScaling::Linear { factor })
                    .map_err(in_key(key("rope.scaling.factor")))?;
            }
            Some("yarn") => {
                let factor = factor.ok_or_else(|| {
                    ModelError::bad_file(&self.path, "yarn rope scaling without a factor")
                })?;
                let original = original.or(hf.max_position_embeddings).ok_or_else(|| {
                    ModelError::bad_file(&self.path, "yarn rope scaling without a length")
                })?;
                rope = rope
                    .with_scaling(RopeScaling::Yarn(YarnParams {
                        beta_fast: self
                            .float(&key("rope.scaling.yarn_beta_fast"))?
                            .unwrap_or(32.0),
                        beta_slow: self
                            .float(&key("rope.scaling.yarn_beta_slow"))?
                            .unwrap_or(1.0),
                        ..YarnParams::new(factor, original)
                    }))
                    .map_err(in_key(format!("{} (yarn)", key("rope.scaling.factor"))))?;
            }
            Some(other) => {
                return Err(ModelError::bad_file(
                    &self.path,
                    format!(
                        "rope scaling type {} is not supported in GGUF files (linear, yarn)",
                        quote(other)
                    ),
                ))
            }
        }
        if let Some((dims, _)) = self.tensor_info("rope_freqs.weight") {
            if dims != [rotary_dim / 2] {
                return Err(ModelError::bad_file(
                    &self.path,
                    format!(
                        "rope_freqs.weight has shape {dims:?}, expected [{}]",
                        rotary_dim / 2
                    ),
                ));
            }
            let t = self.read_f32("rope_freqs.weight")?;
            let factors: Vec<f64> = t.to_vec1::<f32>()?.into_iter().map(|v| v as f64).collect();
            // llama.cpp divides each frequency by its factor: LongRoPE's
            // formula with one factor list and no attention factor.
            rope = rope
                .with_scaling(RopeScaling::LongRope {
                    short_factor: factors.clone(),
                    long_factor: factors,
                    original_max_position_embeddings: hf.max_position_embeddings.unwrap_or(1),
                    factor: 1.0,
                    attention_factor: Some(1.0),
                })
                .map_err(in_key("tensor rope_freqs.weight".to_string()))?;
        }
        let cfg = DecoderConfig::from_hf(&hf, rope).map_err(|e| self.gguf_keys(&arch_name, e))?;
        self.check_config(&cfg)?;
        Ok(cfg)
    }

    /// A config error from [`DecoderConfig::from_hf`], the Hugging Face
    /// keys it names replaced by the GGUF keys they were read from, with
    /// the file's path.
    fn gguf_keys(&self, arch: &str, e: ModelError) -> ModelError {
        let msg = match e {
            ModelError::Config(m) => m,
            ModelError::Posenc(p) => format!("{arch}.rope.*: {p}"),
            other => return other,
        };
        // Longest names first: `original_max_position_embeddings` holds
        // `max_position_embeddings`.
        let mut msg = msg;
        for (hf, gguf) in [
            (
                "original_max_position_embeddings",
                "rope.scaling.original_context_length",
            ),
            ("max_position_embeddings", "context_length"),
            ("num_hidden_layers", "block_count"),
            ("num_attention_heads", "attention.head_count"),
            ("num_key_value_heads", "attention.head_count_kv"),
            ("intermediate_size", "feed_forward_length"),
            ("hidden_size", "embedding_length"),
            ("vocab_size", "vocab_size"),
            ("head_dim", "attention.key_length"),
            ("rms_norm_eps", "attention.layer_norm_rms_epsilon"),
            ("rope_theta", "rope.freq_base"),
        ] {
            msg = msg.replace(&format!("{hf} ="), &format!("{arch}.{gguf} ="));
        }
        ModelError::bad_file(&self.path, msg)
    }

    fn read_f32(&mut self, name: &str) -> Result<Tensor> {
        let info =
            self.content.tensor_infos.get(name).ok_or_else(|| {
                ModelError::bad_file(&self.path, format!("no tensor {}", esc(name)))
            })?;
        if !SUPPORTED_TYPES.contains(&info.ggml_dtype) {
            return Err(ModelError::bad_file(
                &self.path,
                format!(
                    "tensor {} has type {:?}, not supported",
                    esc(name),
                    info.ggml_dtype
                ),
            ));
        }
        let q = self
            .content
            .tensor(&mut self.reader, name, &Device::Cpu)
            .map_err(|e| {
                let reason = crate::weights::candle_reason(&e).1;
                ModelError::bad_file(
                    &self.path,
                    format!("tensor {}: {}", esc(name), esc(&reason)),
                )
            })?;
        let t = q.dequantize(&Device::Cpu)?;
        crate::weights::check_values(&t, name, &self.path)?;
        Ok(t)
    }

    /// Checks the file's tensors against `cfg` before any is read
    /// ([`crate::weights::check_tensor_set`], under GGUF names; a
    /// `rope_freqs.weight` and `attn_rot_embd` tensors are allowed).
    ///
    /// # Errors
    /// [`ModelError::BadFile`] naming missing, unexpected or misshapen
    /// tensors.
    pub fn check_config(&self, cfg: &DecoderConfig) -> Result<()> {
        let present: HashMap<String, Vec<usize>> = self
            .content
            .tensor_infos
            .iter()
            .map(|(n, i)| (n.clone(), i.shape.dims().to_vec()))
            .collect();
        crate::weights::check_tensor_set(
            cfg,
            &present,
            &gguf_name,
            &|n| n == "rope_freqs.weight" || n.ends_with(".attn_rot_embd"),
            &self.path,
        )
    }
}

/// What [`scan_header`] found in a well-formed GGUF header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderScan {
    /// The format version (1, 2 or 3).
    pub version: u32,
    /// Metadata entries.
    pub metadata_entries: usize,
    /// Tensors.
    pub tensors: usize,
    /// `general.alignment`, or 32.
    pub alignment: u64,
    /// Where the tensor data starts (the end of the header, aligned).
    pub data_offset: u64,
}

/// The GGML type of a type id (`ggml.h`), for the types candle reads.
fn ggml_type(id: u32) -> Option<GgmlDType> {
    Some(match id {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

/// Bytes on disk of one metadata value of a fixed-size type id, `None` for
/// strings and arrays.
fn fixed_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// A reader that knows its position and the file's size, so that every
/// read is checked against the bytes present before it is made.
struct Scanner<'a, R> {
    r: &'a mut R,
    pos: u64,
    size: u64,
    version: u32,
}

type ScanResult<T> = std::result::Result<T, String>;

impl<R: Read> Scanner<'_, R> {
    fn need(&self, n: u64, what: &dyn Fn() -> String) -> ScanResult<()> {
        if self.size.saturating_sub(self.pos) < n {
            return Err(format!(
                "truncated: {} needs {n} bytes at offset {}, the file has {}",
                what(),
                self.pos,
                self.size
            ));
        }
        Ok(())
    }

    fn bytes(&mut self, n: u64, what: &dyn Fn() -> String) -> ScanResult<Vec<u8>> {
        self.need(n, what)?;
        let mut v = vec![0u8; n as usize];
        self.r
            .read_exact(&mut v)
            .map_err(|e| format!("{}: {e}", what()))?;
        self.pos += n;
        Ok(v)
    }

    fn skip(&mut self, n: u64, what: &dyn Fn() -> String) -> ScanResult<()> {
        self.need(n, what)?;
        let copied = std::io::copy(&mut (&mut *self.r).take(n), &mut std::io::sink())
            .map_err(|e| format!("{}: {e}", what()))?;
        if copied != n {
            return Err(format!("truncated: {} at offset {}", what(), self.pos));
        }
        self.pos += n;
        Ok(())
    }

    fn u8(&mut self, what: &dyn Fn() -> String) -> ScanResult<u8> {
        Ok(self.bytes(1, what)?[0])
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> ScanResult<u32> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> ScanResult<u64> {
        let b = self.bytes(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(&b);
        Ok(u64::from_le_bytes(a))
    }

    /// A count or string length: 32 bits in version 1, 64 after.
    fn length(&mut self, what: &dyn Fn() -> String) -> ScanResult<u64> {
        if self.version == 1 {
            Ok(self.u32(what)? as u64)
        } else {
            self.u64(what)
        }
    }

    fn prefix_size(&self) -> u64 {
        if self.version == 1 {
            4
        } else {
            8
        }
    }

    /// A key or tensor name, as candle stores it (trailing NULs dropped,
    /// invalid UTF-8 replaced).
    fn name(&mut self, what: &dyn Fn() -> String) -> ScanResult<String> {
        let len = self.length(what)?;
        if len > MAX_NAME_BYTES {
            return Err(format!(
                "{} is {len} bytes long, over the {MAX_NAME_BYTES}-byte limit",
                what()
            ));
        }
        let mut v = self.bytes(len, what)?;
        while v.last() == Some(&0) {
            v.pop();
        }
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    /// One metadata value of type `ty`; the value of an integer, for
    /// `general.alignment`.
    fn value(&mut self, ty: u32, key: &str, elements: &mut u64) -> ScanResult<Option<i128>> {
        let what = || format!("the value of metadata {key}");
        Ok(match ty {
            0 => Some(self.u8(&what)? as i128),
            1 => Some(self.u8(&what)? as i8 as i128),
            2 | 3 => {
                let b = self.bytes(2, &what)?;
                let u = u16::from_le_bytes([b[0], b[1]]);
                Some(if ty == 2 { u as i128 } else { u as i16 as i128 })
            }
            4 => Some(self.u32(&what)? as i128),
            5 => Some(self.u32(&what)? as i32 as i128),
            7 => match self.u8(&what)? {
                0 | 1 => None,
                b => return Err(format!("metadata {key}: boolean byte {b}, not 0 or 1")),
            },
            6 | 10..=12 => {
                self.skip(fixed_size(ty).unwrap_or(8), &what)?;
                None
            }
            8 => {
                let len = self.length(&what)?;
                if len > MAX_METADATA_STRING {
                    return Err(format!(
                        "metadata {key}: a string of {len} bytes, over the {MAX_METADATA_STRING}-byte limit"
                    ));
                }
                self.skip(len, &what)?;
                None
            }
            9 => {
                let elem = self.u32(&|| format!("the element type of metadata {key}"))?;
                if elem == 9 {
                    return Err(format!(
                        "metadata {key}: an array of arrays (not supported, as in llama.cpp)"
                    ));
                }
                if elem > 12 {
                    return Err(format!(
                        "metadata {key}: an array of unknown value type id {elem}"
                    ));
                }
                let n = self.length(&|| format!("the length of metadata array {key}"))?;
                let min = fixed_size(elem).unwrap_or(self.prefix_size());
                let left = self.size.saturating_sub(self.pos);
                if n.saturating_mul(min) > left {
                    return Err(format!(
                        "metadata {key}: an array of {n} elements needs at least {} bytes, the file has {left} left",
                        n.saturating_mul(min)
                    ));
                }
                *elements = elements.saturating_add(n);
                if *elements > MAX_METADATA_ELEMENTS {
                    return Err(format!(
                        "metadata {key}: {} array elements in all, over the limit of {MAX_METADATA_ELEMENTS}",
                        *elements
                    ));
                }
                match (elem, fixed_size(elem)) {
                    (7, _) => {
                        for _ in 0..n {
                            self.value(7, key, elements)?;
                        }
                    }
                    (_, Some(size)) => self.skip(n * size, &what)?,
                    _ => {
                        for _ in 0..n {
                            self.value(elem, key, elements)?;
                        }
                    }
                }
                None
            }
            other => return Err(format!("metadata {key} has unknown value type id {other}")),
        })
    }
}

/// Reads and checks a GGUF header from the start of `r` (a file of
/// `file_size` bytes) without keeping it: the magic and version; the
/// tensor and metadata counts against the bytes left and
/// [`MAX_TENSORS`] / [`MAX_METADATA_KEYS`]; every key and name (at most
/// [`MAX_NAME_BYTES`], no duplicates); every value's type id, every string
/// ([`MAX_METADATA_STRING`]) and array (its elements' minimum size against
/// the bytes left, all arrays together at most [`MAX_METADATA_ELEMENTS`],
/// no nesting) and boolean byte; `general.alignment` (an integer, a
/// non-zero multiple of 8, as the GGUF specification says); every tensor's
/// dimensions (at most 4, none zero, at most [`MAX_TENSOR_ELEMENTS`]
/// elements, whole blocks), type id, offset (a multiple of the alignment)
/// and extent (inside the file), and that no two tensors overlap. Nothing
/// larger than a name is allocated, whatever the file says.
///
/// # Errors
/// The reason, in words, naming the field (with the path added by the
/// caller).
pub fn scan_header<R: Read>(r: &mut R, file_size: u64) -> ScanResult<HeaderScan> {
    let mut s = Scanner {
        r,
        pos: 0,
        size: file_size,
        version: 3,
    };
    let magic = s.bytes(4, &|| "the magic number".to_string())?;
    if magic != b"GGUF" {
        return Err("not a GGUF file (wrong magic number)".into());
    }
    let version = s.u32(&|| "the version".to_string())?;
    if !(1..=3).contains(&version) {
        return Err(format!("GGUF version {version} (posenc reads 1 to 3)"));
    }
    s.version = version;
    let tensor_count = s.length(&|| "the tensor count".to_string())?;
    let kv_count = s.length(&|| "the metadata count".to_string())?;
    if tensor_count > MAX_TENSORS {
        return Err(format!(
            "{tensor_count} tensors, over the limit of {MAX_TENSORS}"
        ));
    }
    if kv_count > MAX_METADATA_KEYS {
        return Err(format!(
            "{kv_count} metadata entries, over the limit of {MAX_METADATA_KEYS}"
        ));
    }
    let p = s.prefix_size();
    let least = kv_count
        .saturating_mul(p + 4 + 1)
        .saturating_add(tensor_count.saturating_mul(p + 4 + 4 + 8));
    let left = file_size.saturating_sub(s.pos);
    if least > left {
        return Err(format!(
            "truncated: the header declares {tensor_count} tensors and {kv_count} metadata entries, at least {least} bytes, the file has {left} left"
        ));
    }
    let mut keys = std::collections::HashSet::new();
    let mut elements = 0u64;
    let mut alignment: Option<u64> = None;
    for i in 0..kv_count {
        let key = s.name(&|| format!("the key of metadata entry {i}"))?;
        let shown = esc(&key);
        if !keys.insert(key.clone()) {
            return Err(format!("metadata {shown} appears twice"));
        }
        let ty = s.u32(&|| format!("the value type of metadata {shown}"))?;
        let v = s.value(ty, &shown, &mut elements)?;
        if key == "general.alignment" {
            // The integer types candle's reader takes the alignment from.
            let a = match (ty, v) {
                (0..=5, Some(a)) if a >= 0 => a as u64,
                _ => {
                    return Err("general.alignment is not a non-negative 32-bit integer".to_string())
                }
            };
            if a == 0 || !a.is_multiple_of(8) {
                return Err(format!(
                    "general.alignment is {a}: the GGUF specification asks for a non-zero multiple of 8"
                ));
            }
            alignment = Some(a);
        }
    }
    let alignment = alignment.unwrap_or(32);
    struct Entry {
        name: String,
        offset: u64,
        bytes: u64,
    }
    let mut names = std::collections::HashSet::new();
    let mut entries: Vec<Entry> = Vec::with_capacity(tensor_count.min(1 << 16) as usize);
    for i in 0..tensor_count {
        let raw = s.name(&|| format!("the name of tensor {i}"))?;
        let name = esc(&raw);
        if !names.insert(raw) {
            return Err(format!("tensor {name} appears twice"));
        }
        let nd = s.u32(&|| format!("the dimension count of tensor {name}"))?;
        if nd > 4 {
            return Err(format!("tensor {name} has {nd} dimensions, at most 4"));
        }
        let mut elems: u64 = 1;
        let mut dims = Vec::with_capacity(nd as usize);
        for k in 0..nd {
            let d = s.length(&|| format!("dimension {k} of tensor {name}"))?;
            dims.push(d);
            elems = elems.saturating_mul(d);
        }
        if dims.contains(&0) || elems > MAX_TENSOR_ELEMENTS {
            return Err(format!(
                "tensor {name} has dimensions {dims:?} ({elems} elements; 1 to {MAX_TENSOR_ELEMENTS} accepted)"
            ));
        }
        let ty = s.u32(&|| format!("the type of tensor {name}"))?;
        let dtype =
            ggml_type(ty).ok_or_else(|| format!("tensor {name} has unknown type id {ty}"))?;
        let block = dtype.block_size() as u64;
        if !elems.is_multiple_of(block) {
            return Err(format!(
                "tensor {name}: {elems} elements are not whole {dtype:?} blocks of {block}"
            ));
        }
        let bytes = elems / block * dtype.type_size() as u64;
        let offset = s.u64(&|| format!("the offset of tensor {name}"))?;
        entries.push(Entry {
            name,
            offset,
            bytes,
        });
    }
    let data_offset = s.pos.div_ceil(alignment).saturating_mul(alignment);
    for e in &entries {
        if !e.offset.is_multiple_of(alignment) {
            return Err(format!(
                "tensor {}: offset {} is not a multiple of the alignment {alignment}",
                e.name, e.offset
            ));
        }
        let end = data_offset
            .checked_add(e.offset)
            .and_then(|x| x.checked_add(e.bytes));
        if end.is_none_or(|end| end > file_size) {
            return Err(format!(
                "truncated: tensor {} needs bytes {}..{} of a {file_size}-byte file",
                e.name,
                data_offset.saturating_add(e.offset),
                data_offset.saturating_add(e.offset).saturating_add(e.bytes)
            ));
        }
    }
    entries.sort_by_key(|e| e.offset);
    for w in entries.windows(2) {
        if w[0].offset + w[0].bytes > w[1].offset {
            return Err(format!(
                "tensors {} (bytes {}..{} of the data) and {} (from {}) overlap",
                w[0].name,
                w[0].offset,
                w[0].offset + w[0].bytes,
                w[1].name,
                w[1].offset
            ));
        }
    }
    Ok(HeaderScan {
        version,
        metadata_entries: kv_count as usize,
        tensors: tensor_count as usize,
        alignment,
        data_offset,
    })
}

/// The GGUF name of a Hugging Face parameter name (Llama and Qwen2 layouts,
/// as transformers' `GGUF_TENSOR_MAPPING`).
pub fn gguf_name(hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = rest.rsplit_once('.')?;
    let g = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{g}.{kind}"))
}

impl WeightSource for GgufFile {
    fn contains(&self, hf_name: &str) -> bool {
        gguf_name(hf_name).is_some_and(|g| self.content.tensor_infos.contains_key(&g))
    }

    fn load(&mut self, hf_name: &str, shape: &[usize]) -> Result<Tensor> {
        let g = gguf_name(hf_name).ok_or_else(|| {
            ModelError::bad_file(&self.path, format!("no GGUF name for {hf_name}"))
        })?;
        let (dims, _) = self.tensor_info(&g).ok_or_else(|| {
            ModelError::bad_file(&self.path, format!("missing tensor {g} ({hf_name})"))
        })?;
        if dims != shape {
            return Err(ModelError::bad_file(
                &self.path,
                format!("tensor {g} has shape {dims:?}, the config expects {shape:?}"),
            ));
        }
        self.read_f32(&g)
    }

    fn describe(&self) -> String {
        let mut types: HashMap<String, usize> = HashMap::new();
        for info in self.content.tensor_infos.values() {
            *types.entry(format!("{:?}", info.ggml_dtype)).or_default() += 1;
        }
        let mut t: Vec<_> = types.into_iter().collect();
        t.sort();
        let t: Vec<String> = t.into_iter().map(|(k, n)| format!("{n} {k}")).collect();
        format!("GGUF, tensors: {}", t.join(", "))
    }
}

/// llama.cpp's row permutation of a Llama q or k projection `(heads·Dh,
/// in)`: within each head, row `half·Dh/2 + i` moves to `2i + half`, so
/// that interleaved pairs hold what half-split pairs held
/// (`convert_hf_to_gguf.py`'s `permute`).
pub fn permute_for_interleaved(w: &Tensor, heads: usize) -> Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    if heads == 0 || rows % (2 * heads) != 0 {
        return Err(ModelError::Invalid(format!(
            "cannot permute {rows} rows into {heads} heads of pairs"
        )));
    }
    Ok(w.reshape((heads, 2, rows / heads / 2, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))?)
}

/// Writes the decoder `cfg` read from `src` as a GGUF file, as llama.cpp's
/// converter does: its metadata keys, its tensor names, Llama and Mistral q/k
/// rows permuted for interleaved pairs (Qwen2 left as is), matrices stored
/// as `dtype` (F32, F16 or Q8_0; norms and biases as F32). No tokenizer is
/// written, and the RoPE scaling is written only for `linear` and `yarn`
/// (other scalings are refused).
///
/// # Errors
/// [`ModelError::Unsupported`]-style [`ModelError::Invalid`] for a scaling
/// GGUF cannot carry; I/O and candle errors.
pub fn write_gguf(
    cfg: &DecoderConfig,
    src: &mut dyn WeightSource,
    out: &Path,
    dtype: GgmlDType,
) -> Result<()> {
    use candle_core::quantized::{gguf_file, QTensor};
    let arch = cfg.arch.name();
    let k = |s: &str| format!("{arch}.{s}");
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (
            k("context_length"),
            Value::U32(cfg.max_position_embeddings as u32),
        ),
        (k("embedding_length"), Value::U32(cfg.hidden_size as u32)),
        (
            k("feed_forward_length"),
            Value::U32(cfg.intermediate_size as u32),
        ),
        (k("block_count"), Value::U32(cfg.num_layers as u32)),
        (k("attention.head_count"), Value::U32(cfg.num_heads as u32)),
        (
            k("attention.head_count_kv"),
            Value::U32(cfg.num_kv_heads as u32),
        ),
        (k("attention.key_length"), Value::U32(cfg.head_dim as u32)),
        (k("attention.value_length"), Value::U32(cfg.head_dim as u32)),
        (
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(cfg.rms_norm_eps as f32),
        ),
        (k("rope.freq_base"), Value::F32(cfg.rope.theta() as f32)),
        (
            k("rope.dimension_count"),
            Value::U32(cfg.rope.rotary_dim() as u32),
        ),
        (k("vocab_size"), Value::U32(cfg.vocab_size as u32)),
    ];
    match cfg.rope.scaling() {
        RopeScaling::Default => {}
        RopeScaling::Linear { factor } => {
            meta.push((k("rope.scaling.type"), Value::String("linear".into())));
            meta.push((k("rope.scaling.factor"), Value::F32(*factor as f32)));
        }
        RopeScaling::Yarn(YarnParams {
            factor,
            original_max_position_embeddings,
            ..
        }) => {
            meta.push((k("rope.scaling.type"), Value::String("yarn".into())));
            meta.push((k("rope.scaling.factor"), Value::F32(*factor as f32)));
            meta.push((
                k("rope.scaling.original_context_length"),
                Value::U32(*original_max_position_embeddings as u32),
            ));
        }
        other => {
            return Err(ModelError::Invalid(format!(
                "write_gguf: the {} scaling has no GGUF metadata here",
                other.rope_type()
            )))
        }
    }
    let permute = matches!(cfg.arch, Arch::Llama | Arch::Mistral);
    let (d, v) = (cfg.hidden_size, cfg.vocab_size);
    let (hq, hk) = (cfg.num_heads, cfg.num_kv_heads);
    let mut names: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![v, d]),
        ("model.norm.weight".into(), vec![d]),
    ];
    if src.contains("lm_head.weight") {
        names.push(("lm_head.weight".into(), vec![v, d]));
    }
    for l in 0..cfg.num_layers {
        names.extend(cfg.layer_tensors(l));
    }
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(names.len());
    for (hf, shape) in &names {
        let mut t = src.load(hf, shape)?;
        if permute && hf.ends_with("q_proj.weight") {
            t = permute_for_interleaved(&t, hq)?;
        } else if permute && hf.ends_with("k_proj.weight") {
            t = permute_for_interleaved(&t, hk)?;
        } else if permute && hf.ends_with("q_proj.bias") {
            t = permute_for_interleaved(&t.unsqueeze(1)?, hq)?.squeeze(1)?;
        } else if permute && hf.ends_with("k_proj.bias") {
            t = permute_for_interleaved(&t.unsqueeze(1)?, hk)?.squeeze(1)?;
        }
        let ty = if shape.len() == 2 {
            dtype
        } else {
            GgmlDType::F32
        };
        let name =
            gguf_name(hf).ok_or_else(|| ModelError::Invalid(format!("no GGUF name for {hf}")))?;
        tensors.push((name, QTensor::quantize(&t, ty)?));
    }
    let mut f = std::io::BufWriter::new(File::create(out).map_err(|e| ModelError::io(out, e))?);
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs)?;
    use std::io::Write;
    f.flush().map_err(|e| ModelError::io(out, e))?;
    Ok(())
}
