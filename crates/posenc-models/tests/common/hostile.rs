//! The hostile-input generator shared by `posenc-models`'
//! `tests/hostile_inputs.rs` (the library) and `posenc-cli`'s
//! `tests/hostile_inputs.rs` (the binary, which includes this file by
//! path): from a tiny model the tests carry (`tests/fixtures/tiny-qwen25`,
//! written as GGUF with a 256-token byte-level vocabulary added), it writes
//! every damaged variant issue 29 lists — truncations at every header
//! field, every metadata type with absurd counts, alignments 0, 3, 4 and
//! 2^31, offsets ±1, overlapping and duplicate tensors, overflowing
//! dimensions, NaN/Inf weights, mismatched tokenizers and configs — and
//! damaged Hugging Face checkpoints, each of which must be refused with one
//! line — and issue 37's ([`issue_37_variants`]: terminal escapes in names
//! and keys, scaling factors, bases and counts out of the CLI's ranges,
//! weights of absurd magnitude, the files whose messages were confusing),
//! each with the words its refusal must hold. It also sets the
//! address-space limit (RLIMIT_AS, 1 GiB) the runs are made under.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use posenc_models::gguf::write_gguf;
use posenc_models::weights::Safetensors;
use posenc_models::ModelFiles;

/// The address-space limit every hostile run is made under.
pub const LIMIT_BYTES: u64 = 1 << 30;

/// Sets RLIMIT_AS to [`LIMIT_BYTES`] in a child process before it
/// executes (glibc's arenas are capped at 2 as the CLI caps them, so that
/// the limit measures memory used rather than address space reserved per
/// thread).
pub fn limit_memory(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    cmd.env("MALLOC_ARENA_MAX", "2");
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between
    // fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: LIMIT_BYTES as libc::rlim_t,
                rlim_max: LIMIT_BYTES as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// One metadata entry: key, GGUF value type id, encoded value.
#[derive(Clone, Debug)]
pub struct Meta {
    pub key: String,
    pub ty: u32,
    pub bytes: Vec<u8>,
}

/// One tensor: name, dimensions in GGML order (innermost first), GGML type
/// id, data, and an offset that replaces the computed one when set.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: u32,
    pub data: Vec<u8>,
    pub offset: Option<u64>,
}

/// A GGUF file as parts, written by [`Gguf::write`].
#[derive(Clone, Debug)]
pub struct Gguf {
    pub version: u32,
    pub meta: Vec<Meta>,
    pub tensors: Vec<Tensor>,
    /// Alignment used to place the data (whatever the metadata says).
    pub align: u64,
}

fn str_bytes(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

/// The encoding of a candle metadata value: (type id, bytes).
pub fn encode(v: &Value) -> (u32, Vec<u8>) {
    match v {
        Value::U8(x) => (0, vec![*x]),
        Value::I8(x) => (1, vec![*x as u8]),
        Value::U16(x) => (2, x.to_le_bytes().to_vec()),
        Value::I16(x) => (3, x.to_le_bytes().to_vec()),
        Value::U32(x) => (4, x.to_le_bytes().to_vec()),
        Value::I32(x) => (5, x.to_le_bytes().to_vec()),
        Value::F32(x) => (6, x.to_le_bytes().to_vec()),
        Value::Bool(x) => (7, vec![*x as u8]),
        Value::String(s) => (8, str_bytes(s.as_bytes())),
        Value::Array(a) => {
            let ty = a.first().map_or(4, |x| encode(x).0);
            let mut b = ty.to_le_bytes().to_vec();
            b.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for x in a {
                b.extend(encode(x).1);
            }
            (9, b)
        }
        Value::U64(x) => (10, x.to_le_bytes().to_vec()),
        Value::I64(x) => (11, x.to_le_bytes().to_vec()),
        Value::F64(x) => (12, x.to_le_bytes().to_vec()),
    }
}

/// A metadata entry from a candle value.
pub fn meta(key: &str, v: Value) -> Meta {
    let (ty, bytes) = encode(&v);
    Meta {
        key: key.into(),
        ty,
        bytes,
    }
}

/// GPT-2's byte → character map.
fn byte_chars() -> Vec<char> {
    let mut n = 0u32;
    (0..256u32)
        .map(|b| {
            let printable = (0x21..=0x7e).contains(&b)
                || (0xa1..=0xac).contains(&b)
                || (0xae..=0xff).contains(&b);
            if printable {
                char::from_u32(b).unwrap()
            } else {
                n += 1;
                char::from_u32(255 + n).unwrap()
            }
        })
        .collect()
}

/// A byte-level vocabulary of `n` tokens: the 256 bytes, then `x0`, ...
pub fn byte_vocab(n: usize) -> Vec<String> {
    let chars = byte_chars();
    (0..n)
        .map(|i| {
            if i < 256 {
                chars[i].to_string()
            } else {
                format!("x{i}")
            }
        })
        .collect()
}

/// The tokenizer metadata of a byte-level model of `n` tokens.
pub fn tokenizer_meta(model: &str, n: usize) -> Vec<Meta> {
    let tokens = byte_vocab(n);
    vec![
        meta("tokenizer.ggml.model", Value::String(model.into())),
        meta(
            "tokenizer.ggml.tokens",
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        ),
        // An empty string array (type id 8, length 0).
        Meta {
            key: "tokenizer.ggml.merges".into(),
            ty: 9,
            bytes: {
                let mut b = 8u32.to_le_bytes().to_vec();
                b.extend_from_slice(&0u64.to_le_bytes());
                b
            },
        },
        meta(
            "tokenizer.ggml.token_type",
            Value::Array(vec![Value::I32(1); n]),
        ),
    ]
}

/// Offsets of the header's fields, recorded while writing: (what, start).
pub type Fields = Vec<(String, usize)>;

impl Gguf {
    /// The tiny Qwen2.5 of the fixtures as GGUF (F32), with a 256-token
    /// byte-level tokenizer, in parts. `scratch` is a directory to write the
    /// intermediate file into.
    pub fn tiny(fixtures: &Path, scratch: &Path) -> Gguf {
        let dir = fixtures.join("tiny-qwen25");
        let mut files = ModelFiles::open(&dir).unwrap();
        let cfg = files.config().unwrap();
        let mut st = Safetensors::open_dir(&dir).unwrap();
        let path = scratch.join("tiny-base.gguf");
        write_gguf(&cfg, &mut st, &path, GgmlDType::F32).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let content = Content::read(&mut std::io::Cursor::new(&bytes)).unwrap();
        let mut meta_list: Vec<Meta> = content
            .metadata
            .iter()
            .map(|(k, v)| meta(k, v.clone()))
            .collect();
        meta_list.sort_by(|a, b| a.key.cmp(&b.key));
        meta_list.extend(tokenizer_meta("gpt2", 256));
        let mut infos: Vec<_> = content.tensor_infos.iter().collect();
        infos.sort_by_key(|(_, i)| i.offset);
        let tensors = infos
            .into_iter()
            .map(|(name, info)| {
                assert_eq!(info.ggml_dtype, GgmlDType::F32);
                let n = info.shape.elem_count();
                let start = (content.tensor_data_offset + info.offset) as usize;
                Tensor {
                    name: name.clone(),
                    dims: info.shape.dims().iter().rev().map(|&d| d as u64).collect(),
                    ty: 0,
                    data: bytes[start..start + 4 * n].to_vec(),
                    offset: None,
                }
            })
            .collect();
        Gguf {
            version: 3,
            meta: meta_list,
            tensors,
            align: 32,
        }
    }

    /// The file's bytes, and the offsets of its header fields.
    pub fn write(&self) -> (Vec<u8>, Fields) {
        let mut b: Vec<u8> = Vec::new();
        let mut f: Fields = Vec::new();
        let mark = |f: &mut Fields, what: String, at: usize| f.push((what, at));
        mark(&mut f, "magic".into(), 0);
        b.extend_from_slice(b"GGUF");
        mark(&mut f, "version".into(), b.len());
        b.extend_from_slice(&self.version.to_le_bytes());
        mark(&mut f, "tensor count".into(), b.len());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        mark(&mut f, "metadata count".into(), b.len());
        b.extend_from_slice(&(self.meta.len() as u64).to_le_bytes());
        for m in &self.meta {
            mark(&mut f, format!("key of {}", m.key), b.len());
            b.extend(str_bytes(m.key.as_bytes()));
            mark(&mut f, format!("type of {}", m.key), b.len());
            b.extend_from_slice(&m.ty.to_le_bytes());
            mark(&mut f, format!("value of {}", m.key), b.len());
            b.extend_from_slice(&m.bytes);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            mark(&mut f, format!("name of tensor {}", t.name), b.len());
            b.extend(str_bytes(t.name.as_bytes()));
            mark(&mut f, format!("dimension count of {}", t.name), b.len());
            b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            mark(&mut f, format!("dimensions of {}", t.name), b.len());
            for d in &t.dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            mark(&mut f, format!("type of {}", t.name), b.len());
            b.extend_from_slice(&t.ty.to_le_bytes());
            mark(&mut f, format!("offset of {}", t.name), b.len());
            let o = t.offset.unwrap_or(offset);
            b.extend_from_slice(&o.to_le_bytes());
            offsets.push(offset);
            offset += (t.data.len() as u64).div_ceil(self.align) * self.align;
        }
        mark(&mut f, "padding".into(), b.len());
        while !(b.len() as u64).is_multiple_of(self.align) {
            b.push(0);
        }
        let start = b.len();
        mark(&mut f, "tensor data".into(), start);
        for (t, o) in self.tensors.iter().zip(&offsets) {
            b.resize(start + *o as usize, 0);
            b.extend_from_slice(&t.data);
        }
        (b, f)
    }

    fn set_meta(&mut self, m: Meta) {
        self.meta.retain(|x| x.key != m.key);
        self.meta.push(m);
    }

    fn tensor(&mut self, name: &str) -> &mut Tensor {
        self.tensors.iter_mut().find(|t| t.name == name).unwrap()
    }
}

/// One hostile input: a name and the files it is made of.
pub struct Variant {
    /// What is wrong with it.
    pub name: String,
    /// The model path (a GGUF file or a checkpoint directory).
    pub model: PathBuf,
}

fn absurd_array(elem: u32, count: u64) -> Vec<u8> {
    let mut b = elem.to_le_bytes().to_vec();
    b.extend_from_slice(&count.to_le_bytes());
    b
}

/// Writes every hostile model variant under `dir`; the first is the
/// undamaged base (which must load), the rest must all be refused.
pub fn model_variants(fixtures: &Path, dir: &Path) -> (PathBuf, Vec<Variant>) {
    std::fs::create_dir_all(dir).unwrap();
    let base = Gguf::tiny(fixtures, dir);
    let (base_bytes, fields) = base.write();
    let base_path = dir.join("base.gguf");
    std::fs::write(&base_path, &base_bytes).unwrap();
    let mut out: Vec<Variant> = Vec::new();
    let mut n = 0usize;
    let mut emit = |name: String, bytes: &[u8]| {
        n += 1;
        let p = dir.join(format!("v{n:04}.gguf"));
        std::fs::write(&p, bytes).unwrap();
        out.push(Variant { name, model: p });
    };
    // Truncations at every header field, and one byte into it.
    for (what, at) in &fields {
        emit(format!("cut at the {what}"), &base_bytes[..*at]);
        if at + 1 < base_bytes.len() {
            emit(
                format!("cut one byte into the {what}"),
                &base_bytes[..at + 1],
            );
        }
    }
    emit(
        "cut one byte short".into(),
        &base_bytes[..base_bytes.len() - 1],
    );
    // Header words.
    let mut v = base_bytes.clone();
    v[..4].copy_from_slice(b"GGUG");
    emit("wrong magic".into(), &v);
    for version in [0u32, 4, u32::MAX] {
        let mut g = base.clone();
        g.version = version;
        emit(format!("version {version}"), &g.write().0);
    }
    for (field, at) in [("tensor count", 8usize), ("metadata count", 16)] {
        for count in [1u64 << 40, u64::MAX, 1 << 20] {
            let mut v = base_bytes.clone();
            v[at..at + 8].copy_from_slice(&count.to_le_bytes());
            emit(format!("{field} {count}"), &v);
        }
    }
    // Every metadata value type with absurd counts and lengths.
    for elem in 0u32..=12 {
        for count in [1u64 << 40, 1 << 62, 300_000_000] {
            let mut g = base.clone();
            g.meta.insert(
                0,
                Meta {
                    key: "posenc.hostile".into(),
                    ty: 9,
                    bytes: absurd_array(elem, count),
                },
            );
            emit(
                format!("array of type {elem} with {count} elements"),
                &g.write().0,
            );
        }
    }
    for len in [1u64 << 62, 1 << 40, 1 << 31] {
        let mut g = base.clone();
        g.meta.insert(
            0,
            Meta {
                key: "posenc.hostile".into(),
                ty: 8,
                bytes: len.to_le_bytes().to_vec(),
            },
        );
        emit(format!("string of {len} bytes"), &g.write().0);
        let mut g = base.clone();
        let mut key = len.to_le_bytes().to_vec();
        key.extend_from_slice(b"k");
        g.meta.insert(
            0,
            Meta {
                key: "posenc.key-follows".into(),
                ty: 4,
                bytes: 0u32.to_le_bytes().to_vec(),
            },
        );
        let (mut bytes, f) = g.write();
        // The key length of the first entry, made absurd.
        let at = f.iter().find(|(w, _)| w.starts_with("key of")).unwrap().1;
        bytes[at..at + 8].copy_from_slice(&len.to_le_bytes());
        emit(format!("metadata key of {len} bytes"), &bytes);
    }
    for ty in [13u32, 255, u32::MAX] {
        let mut g = base.clone();
        g.meta.insert(
            0,
            Meta {
                key: "posenc.hostile".into(),
                ty,
                bytes: vec![0; 8],
            },
        );
        emit(format!("metadata value type {ty}"), &g.write().0);
    }
    {
        let mut g = base.clone();
        g.meta.insert(
            0,
            Meta {
                key: "posenc.hostile".into(),
                ty: 7,
                bytes: vec![2],
            },
        );
        emit("boolean byte 2".into(), &g.write().0);
        let mut g = base.clone();
        let mut nested = absurd_array(9, 1);
        nested.extend(absurd_array(4, 1));
        nested.extend_from_slice(&7u32.to_le_bytes());
        g.meta.insert(
            0,
            Meta {
                key: "posenc.hostile".into(),
                ty: 9,
                bytes: nested,
            },
        );
        emit("array of arrays".into(), &g.write().0);
        let mut g = base.clone();
        let dup = g.meta[0].clone();
        g.meta.push(dup);
        emit("duplicate metadata key".into(), &g.write().0);
    }
    // Alignment.
    for a in [0u32, 3, 4, 12, 1 << 31] {
        let mut g = base.clone();
        g.set_meta(meta("general.alignment", Value::U32(a)));
        emit(format!("general.alignment {a}"), &g.write().0);
    }
    {
        let mut g = base.clone();
        g.set_meta(meta("general.alignment", Value::String("32".into())));
        emit("general.alignment as a string".into(), &g.write().0);
    }
    // Offsets, extents, overlaps, duplicates.
    let names: Vec<String> = base.tensors.iter().map(|t| t.name.clone()).collect();
    let (first, last) = (names[0].clone(), names[names.len() - 1].clone());
    let base_offsets: Vec<u64> = {
        let mut o = 0u64;
        base.tensors
            .iter()
            .map(|t| {
                let x = o;
                o += (t.data.len() as u64).div_ceil(32) * 32;
                x
            })
            .collect()
    };
    for (i, name) in [(0usize, &first), (names.len() - 1, &last)] {
        for delta in [1i64, -1, 32, 1 << 40] {
            let mut g = base.clone();
            let o = base_offsets[i] as i64 + delta;
            g.tensor(name).offset = Some(o.max(0) as u64);
            if o < 0 {
                continue;
            }
            emit(format!("offset of {name} {delta:+}"), &g.write().0);
        }
        let mut g = base.clone();
        g.tensor(name).offset = Some(u64::MAX - 31);
        emit(format!("offset of {name} near 2^64"), &g.write().0);
    }
    {
        let mut g = base.clone();
        let o = base_offsets[0];
        g.tensors[1].offset = Some(o);
        emit(format!("{} overlaps {}", names[1], names[0]), &g.write().0);
        let mut g = base.clone();
        let dup = g.tensors[0].clone();
        g.tensors.push(dup);
        emit(format!("{} listed twice", names[0]), &g.write().0);
    }
    // Dimensions and types.
    {
        let embd = "token_embd.weight";
        for dims in [
            vec![1u64 << 32, 1 << 32],
            vec![u64::MAX, 2],
            vec![0, 64],
            vec![64, 256, 1, 1, 1],
            vec![1 << 62, 4],
        ] {
            let mut g = base.clone();
            g.tensor(embd).dims = dims.clone();
            emit(format!("{embd} with dimensions {dims:?}"), &g.write().0);
        }
        for ty in [4u32, 5, 99, u32::MAX] {
            let mut g = base.clone();
            g.tensor(embd).ty = ty;
            emit(format!("{embd} of type id {ty}"), &g.write().0);
        }
    }
    // Non-finite weights.
    for (name, value) in [
        ("token_embd.weight", f32::NAN),
        ("blk.0.attn_q.weight", f32::INFINITY),
        ("blk.1.ffn_down.weight", f32::NEG_INFINITY),
        ("output_norm.weight", f32::NAN),
    ] {
        let mut g = base.clone();
        g.tensor(name).data[4..8].copy_from_slice(&value.to_le_bytes());
        emit(format!("{value} in {name}"), &g.write().0);
    }
    {
        // Finite weights whose activations overflow in layer 1.
        let mut g = base.clone();
        for c in g.tensor("blk.1.ffn_up.weight").data.chunks_mut(4) {
            c.copy_from_slice(&3.0e18f32.to_le_bytes());
        }
        for c in g.tensor("blk.1.ffn_gate.weight").data.chunks_mut(4) {
            c.copy_from_slice(&3.0e18f32.to_le_bytes());
        }
        emit("activations overflowing in layer 1".into(), &g.write().0);
    }
    // Tokenizer and config against the tensors.
    let arch = "qwen2";
    {
        let mut g = base.clone();
        g.set_meta(meta("tokenizer.ggml.model", Value::String("llama".into())));
        emit(
            "tokenizer model llama over a byte-level vocabulary".into(),
            &g.write().0,
        );
        let mut g = base.clone();
        for m in tokenizer_meta("gpt2", 300) {
            g.set_meta(m);
        }
        emit(
            "300-token tokenizer for 256 embedding rows".into(),
            &g.write().0,
        );
        for layers in [1u32, 3] {
            let mut g = base.clone();
            g.set_meta(meta(&format!("{arch}.block_count"), Value::U32(layers)));
            emit(
                format!("block_count {layers} over 2 layers of tensors"),
                &g.write().0,
            );
        }
        let mut g = base.clone();
        g.set_meta(meta(&format!("{arch}.embedding_length"), Value::U32(32)));
        emit(
            "embedding_length 32 over 64-wide tensors".into(),
            &g.write().0,
        );
        let mut g = base.clone();
        g.set_meta(meta(&format!("{arch}.vocab_size"), Value::U32(300)));
        emit(
            "vocab_size 300 over 256 embedding rows".into(),
            &g.write().0,
        );
        let mut g = base.clone();
        g.tensors.retain(|t| t.name != "blk.1.attn_k.weight");
        emit("blk.1.attn_k.weight missing".into(), &g.write().0);
        let mut g = base.clone();
        let mut extra = g.tensors[0].clone();
        extra.name = "blk.7.attn_q.weight".into();
        g.tensors.push(extra);
        emit(
            "a tensor of a layer 7 the config does not have".into(),
            &g.write().0,
        );
    }
    // Damaged Hugging Face checkpoints.
    let hf = |name: &str, edit: &dyn Fn(&Path)| -> PathBuf {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(fixtures.join("tiny-llama31").join(f), d.join(f)).unwrap();
        }
        edit(&d);
        d
    };
    let set_config = |d: &Path, key: &str, value: serde_json::Value| {
        let p = d.join("config.json");
        let mut c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        c[key] = value;
        std::fs::write(&p, c.to_string()).unwrap();
    };
    let st_bytes = std::fs::read(fixtures.join("tiny-llama31/model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(st_bytes[..8].try_into().unwrap()) as usize;
    let mut hf_variants: Vec<(String, PathBuf)> = vec![
        (
            "checkpoint config with 1 layer over 2".into(),
            hf("hf-layers-1", &|d| {
                set_config(d, "num_hidden_layers", 1.into())
            }),
        ),
        (
            "checkpoint config with 3 layers over 2".into(),
            hf("hf-layers-3", &|d| {
                set_config(d, "num_hidden_layers", 3.into())
            }),
        ),
        (
            "checkpoint config with hidden_size 32".into(),
            hf("hf-hidden", &|d| set_config(d, "hidden_size", 32.into())),
        ),
        (
            "safetensors header length 2^62".into(),
            hf("hf-st-len", &|d| {
                let mut b = st_bytes.clone();
                b[..8].copy_from_slice(&(1u64 << 62).to_le_bytes());
                std::fs::write(d.join("model.safetensors"), b).unwrap();
            }),
        ),
        (
            "safetensors header of garbage".into(),
            hf("hf-st-garbage", &|d| {
                let mut b = st_bytes.clone();
                for x in &mut b[8..8 + header_len.min(64)] {
                    *x = b'#';
                }
                std::fs::write(d.join("model.safetensors"), b).unwrap();
            }),
        ),
        (
            "safetensors data truncated".into(),
            hf("hf-st-cut", &|d| {
                std::fs::write(d.join("model.safetensors"), &st_bytes[..st_bytes.len() / 2])
                    .unwrap();
            }),
        ),
        (
            "safetensors NaN weights".into(),
            hf("hf-st-nan", &|d| {
                let mut b = st_bytes.clone();
                let at = 8 + header_len + 4 * 100;
                b[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
                std::fs::write(d.join("model.safetensors"), b).unwrap();
            }),
        ),
        (
            "config.json that is not JSON".into(),
            hf("hf-config-garbage", &|d| {
                std::fs::write(d.join("config.json"), "{\"model_type\": \"llama\", ").unwrap();
            }),
        ),
    ];
    for (name, model) in hf_variants.drain(..) {
        out.push(Variant { name, model });
    }
    (base_path, out)
}

/// `ESC [ 2 J` (clear the screen), as a hostile file would carry it.
pub const CLEAR: &str = "\u{1b}[2J";

/// Issue 37's hostile models: (name, path, the words its refusal holds,
/// joined by ` && `). GGUF variants are the generator's tiny Qwen2.5 with
/// one change; checkpoint variants the tiny Llama 3.1 with one change.
pub fn issue_37_variants(fixtures: &Path, dir: &Path) -> Vec<(String, PathBuf, &'static str)> {
    std::fs::create_dir_all(dir).unwrap();
    let base = Gguf::tiny(fixtures, dir);
    let mut out: Vec<(String, PathBuf, &'static str)> = Vec::new();
    let mut emit_gguf = |name: &str, g: &Gguf, needle: &'static str| {
        let p = dir.join(format!("i37-{}.gguf", out.len()));
        std::fs::write(&p, g.write().0).unwrap();
        out.push((name.to_string(), p, needle));
    };
    // The base with each of `edits` in place of the entry of its key.
    let with = |edits: Vec<Meta>| {
        let mut g = base.clone();
        for m in edits {
            g.meta.retain(|x| x.key != m.key);
            g.meta.push(m);
        }
        g
    };
    let evil = format!("token_embd.weight{CLEAR}");
    let renamed = |edit: &dyn Fn(&mut Tensor)| {
        let mut g = base.clone();
        let t = &mut g.tensors[0];
        t.name = evil.clone();
        edit(t);
        g
    };
    // 3. Terminal escapes in every message that quotes the file.
    emit_gguf(
        "escape in a tensor name with 5 dimensions",
        &renamed(&|t| t.dims = vec![1, 1, 1, 1, 1]),
        "5 dimensions && \\u{1b}[2J",
    );
    emit_gguf(
        "escape in a tensor name of type id 99",
        &renamed(&|t| t.ty = 99),
        "unknown type id 99 && \\u{1b}[2J",
    );
    emit_gguf(
        "escape in a tensor name at an unaligned offset",
        &renamed(&|t| t.offset = Some(1)),
        "not a multiple of the alignment && \\u{1b}[2J",
    );
    {
        let mut g = renamed(&|_| {});
        let dup = g.tensors[0].clone();
        g.tensors.push(dup);
        emit_gguf(
            "escape in a duplicate tensor name",
            &g,
            "appears twice && \\u{1b}[2J",
        );
        let mut g = base.clone();
        let key = format!("posenc.key{CLEAR}");
        g.meta.insert(0, meta(&key, Value::U32(1)));
        g.meta.insert(0, meta(&key, Value::U32(2)));
        emit_gguf(
            "escape in a duplicate metadata key",
            &g,
            "appears twice && \\u{1b}[2J",
        );
        let mut g = base.clone();
        g.meta.insert(
            0,
            Meta {
                key,
                ty: 13,
                bytes: vec![0; 8],
            },
        );
        emit_gguf(
            "escape in a metadata key of value type 13",
            &g,
            "unknown value type id 13 && \\u{1b}[2J",
        );
        // Version 1 reads 32-bit lengths: the 64-bit ones written here
        // make keys of NULs and length bytes.
        let mut g = base.clone();
        g.version = 1;
        emit_gguf("version 1 header read with 32-bit lengths", &g, "");
        emit_gguf(
            "escape in general.architecture",
            &with(vec![meta(
                "general.architecture",
                Value::String(format!("qwen2\0{CLEAR}")),
            )]),
            "unsupported architecture && qwen2\\0\\u{1b}[2J",
        );
        emit_gguf(
            "escape in tokenizer.ggml.model",
            &with(vec![meta(
                "tokenizer.ggml.model",
                Value::String(format!("gpt2{CLEAR}")),
            )]),
            "tokenizer model && \\u{1b}[2J",
        );
    }
    {
        // A tokenizer piece: a merge without its space.
        emit_gguf(
            "escape in a tokenizer merge",
            &with(vec![meta(
                "tokenizer.ggml.merges",
                Value::Array(vec![Value::String(format!("Ġ{CLEAR}t"))]),
            )]),
            "tokenizer.ggml.merges: merge \"Ġ\\u{1b}[2Jt\" has no space",
        );
    }
    // 4. Scaling factors, bases, counts out of the CLI's ranges.
    let a = "qwen2";
    for (name, edits, needle) in [
        (
            "GGUF linear factor 1e30",
            vec![
                meta(
                    &format!("{a}.rope.scaling.type"),
                    Value::String("linear".into()),
                ),
                meta(&format!("{a}.rope.scaling.factor"), Value::F32(1e30)),
            ],
            "qwen2.rope.scaling.factor && outside [0.0009765625, 1024]",
        ),
        (
            "GGUF yarn factor 1e-30",
            vec![
                meta(
                    &format!("{a}.rope.scaling.type"),
                    Value::String("yarn".into()),
                ),
                meta(&format!("{a}.rope.scaling.factor"), Value::F32(1e-30)),
            ],
            "qwen2.rope.scaling.factor && outside [0.0009765625, 1024]",
        ),
        (
            "GGUF rope.freq_base 1e30",
            vec![meta(&format!("{a}.rope.freq_base"), Value::F64(1e30))],
            "qwen2.rope.freq_base = 1e30 is outside (1, 1e12]",
        ),
        (
            "GGUF block_count 5000",
            vec![meta(&format!("{a}.block_count"), Value::U32(5000))],
            "qwen2.block_count = 5000 is outside 1..=1024",
        ),
        (
            "GGUF head_count 4096",
            vec![meta(&format!("{a}.attention.head_count"), Value::U32(4096))],
            "qwen2.attention.head_count = 4096 is outside 1..=1024",
        ),
        (
            "GGUF rms epsilon 1e30",
            vec![meta(
                &format!("{a}.attention.layer_norm_rms_epsilon"),
                Value::F64(1e30),
            )],
            "qwen2.attention.layer_norm_rms_epsilon = 1e30 is outside (0, 0.1]",
        ),
    ] {
        emit_gguf(name, &with(edits), needle);
    }
    // 5. Finite weights of a magnitude no model has.
    {
        let mut g = base.clone();
        let t = g
            .tensors
            .iter_mut()
            .find(|t| t.name == "output_norm.weight")
            .unwrap();
        t.data[4..8].copy_from_slice(&1e30f32.to_le_bytes());
        emit_gguf(
            "output_norm.weight 1e30",
            &g,
            "tensor output_norm.weight (norm weight) holds 1e30 at index 1 && ±1e4",
        );
    }
    // Checkpoints: the tiny Llama 3.1 with its config or weights edited.
    let hf = |name: &str, config: Option<String>, weights: Option<Vec<u8>>| -> PathBuf {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(fixtures.join("tiny-llama31").join(f), d.join(f)).unwrap();
        }
        if let Some(c) = config {
            std::fs::write(d.join("config.json"), c).unwrap();
        }
        if let Some(w) = weights {
            std::fs::write(d.join("model.safetensors"), w).unwrap();
        }
        d
    };
    let config_text = std::fs::read_to_string(fixtures.join("tiny-llama31/config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&config_text).unwrap();
    let with = |k: &str, v: serde_json::Value| {
        let mut c = config.clone();
        c[k] = v;
        Some(c.to_string())
    };
    let yarn = |extra: serde_json::Value| {
        let mut y = serde_json::json!({"rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 64});
        for (k, v) in extra.as_object().unwrap() {
            y[k] = v.clone();
        }
        y
    };
    /// A checkpoint case: name, config.json text, safetensors bytes (each
    /// `None`: the fixture's), the words of its refusal.
    type HfCase = (&'static str, Option<String>, Option<Vec<u8>>, &'static str);
    let mut hf_cases: Vec<HfCase> = vec![
        (
            "config.json yarn factor 1e308",
            with("rope_scaling", yarn(serde_json::json!({"factor": 1e308}))),
            None,
            "config.json: key rope_scaling.factor && outside [0.0009765625, 1024]",
        ),
        (
            "config.json yarn attention_factor 100",
            with(
                "rope_scaling",
                yarn(serde_json::json!({"attention_factor": 100.0})),
            ),
            None,
            "key rope_scaling.attention_factor && outside [0.1, 10]",
        ),
        (
            "config.json rope_theta 1e30",
            with("rope_parameters", {
                let mut p = config["rope_parameters"].clone();
                p["rope_theta"] = 1e30.into();
                p
            }),
            None,
            "config.json: rope_theta = 1e30 is outside (1, 1e12]",
        ),
        (
            "config.json num_hidden_layers 100000",
            with("num_hidden_layers", 100_000.into()),
            None,
            "config.json: num_hidden_layers = 100000 is outside 1..=1024",
        ),
        (
            "config.json holding []",
            Some("[]".into()),
            None,
            "config.json: not a JSON object but an array",
        ),
        (
            "config.json rope_theta 1e400",
            Some(config_text.replacen('{', "{\"rope_theta\": 1e400, ", 1)),
            None,
            "config.json: not valid JSON at key \"rope_theta\" && number out of range && 64-bit float",
        ),
        (
            "config.json hidden_size as a string",
            with("hidden_size", "64".into()),
            None,
            "config.json: a value of the wrong type at key \"hidden_size\"",
        ),
    ];
    // The final norm's weights 1e30 in the safetensors.
    let st = std::fs::read(fixtures.join("tiny-llama31/model.safetensors")).unwrap();
    let n = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&st[8..8 + n]).unwrap();
    let norm = &header["model.norm.weight"];
    assert_eq!(norm["dtype"], "F32");
    let at = 8 + n + norm["data_offsets"][0].as_u64().unwrap() as usize;
    let mut w = st.clone();
    w[at..at + 4].copy_from_slice(&1e30f32.to_le_bytes());
    hf_cases.push((
        "safetensors model.norm.weight 1e30",
        None,
        Some(w),
        "tensor model.norm.weight (norm weight) holds 1e30 at index 0 && ±1e4",
    ));
    for (i, (name, c, w, needle)) in hf_cases.into_iter().enumerate() {
        out.push((name.to_string(), hf(&format!("i37-hf-{i}"), c, w), needle));
    }
    out
}
