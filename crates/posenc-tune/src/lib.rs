//! # posenc-tune — fine-tuning pretrained decoders on the CPU
//!
//! The pretrained decoders [`posenc_models`] loads (the Llama family and
//! Qwen2, from GGUF or safetensors, dequantized to `f32`) as a
//! differentiable candle graph, for parameter-efficient fine-tuning at new
//! context lengths:
//!
//! - [`lora`]: LoRA adapters (Hu et al. 2021, *LoRA: Low-Rank Adaptation of
//!   Large Language Models*) with PEFT's defaults, initialisation and
//!   parameter names;
//! - [`model`]: [`TrainableDecoder`], the forward pass with adapters on the
//!   chosen projections, the RoPE of any [`posenc_models::Scaling`] at
//!   explicit position ids, posenc's fused differentiable attention, and the
//!   next-token loss; the embeddings and RMSNorm weights optionally trained
//!   too, as LongLoRA does (Chen et al. 2024, *LongLoRA: Efficient
//!   Fine-tuning of Long-Context Large Language Models*, §3.3);
//! - [`pose`]: PoSE's position ids (Zhu et al. 2024, *PoSE: Efficient
//!   Context Window Extension of LLMs via Positional Skip-wise Training*),
//!   drawn as the authors' training script draws them, with CPython's
//!   generator so that a seed gives their very draws;
//! - [`data`]: training windows from a text's first 90% (the last 10% held
//!   out), plain or PoSE, seeded per step;
//! - [`train`]: the loop — AdamW with warm-up and YaRN's linear (or cosine)
//!   decay, clipping, checkpoints every K steps, at the end and on Ctrl-C,
//!   exact resume;
//! - [`peft`]: the adapter in PEFT's layout (`adapter_config.json`,
//!   `adapter_model.safetensors`), read back, checked against a model and
//!   merged into it;
//! - [`merged`]: the merged model as a Hugging Face checkpoint whose
//!   `config.json` carries the RoPE it was trained through.
//!
//! The loss and every gradient match PyTorch with PEFT on two tiny random
//! models (Llama 3.1's llama3 scaling with an untied head; Qwen2.5's YaRN
//! with q/k/v biases and a tied head), at contiguous and at skipped
//! position ids: `tests/grads.rs`, reference values from
//! `scripts/finetune/grad_reference.py`.
//!
//! ```no_run
//! use posenc_models::PretrainedModel;
//! use posenc_tune::{LoraConfig, Trainable, TrainableDecoder};
//!
//! let model = PretrainedModel::load("SmolLM2-135M-Instruct.Q4_1.gguf".as_ref(), None)?;
//! let tuned = TrainableDecoder::new(&model.decoder, LoraConfig::default(), Trainable::default(), 0)?
//!     .with_scaling(&"yarn:4".parse()?)?;
//! let tokens = model.tokenizer.encode("It is a truth universally acknowledged")?;
//! let positions: Vec<u32> = (0..tokens.len() as u32).collect();
//! let loss = tuned.loss(&tokens, &positions)?;
//! for (name, grad) in tuned.gradients(&loss)? {
//!     println!("{name}: {:?}", grad.dims());
//! }
//! # Ok::<(), posenc_tune::TuneError>(())
//! ```
//!
//! # Design notes
//!
//! - **One window per call.** The forward takes one sequence of tokens and
//!   its position ids (`(T, D)` activations, a batch of 1 inside the
//!   attention); a batch is a sum of window losses. The position ids are
//!   explicit so that PoSE (Zhu et al. 2024) can train long positions in
//!   short windows: the rotation and the RoPE scaling follow the ids (a
//!   length-dependent scaling such as dynamic NTK uses the largest id + 1,
//!   as transformers does), the causal mask follows the token order.
//! - **Frozen projections are candle matmuls.** candle's autograd computes
//!   the gradient of both operands of a matmul, so the backward pass also
//!   forms (and drops) a weight-sized gradient for each frozen projection:
//!   one GEMM per projection that a frozen-linear op returning only the
//!   input's gradient would save, along with that buffer. This is the first
//!   place to look for speed and memory.
//! - **Activations are all kept.** The backward pass holds every layer's
//!   activations (`O(T·(D + I))` per layer, no `T × T` matrix: the fused
//!   attention saves only its log-sum-exp). Activation checkpointing
//!   (recomputing a layer's forward in its backward) would trade one extra
//!   forward for keeping only the layer inputs; it needs a custom op around
//!   a whole layer, since candle's autograd has no checkpoint primitive.
//! - **Weights are `f32` copies.** [`TrainableDecoder::new`] copies the
//!   loaded decoder's dequantized weights into candle tensors; the
//!   [`posenc_models::Decoder`] can be dropped afterwards.
//! - **Dropout** follows PEFT: an independent mask on each adapter's input,
//!   only while training ([`TrainableDecoder::set_training`]), drawn from a
//!   seeded generator.
#![warn(missing_docs)]

pub mod data;
pub mod error;
pub mod frozen;
pub mod lora;
pub mod merged;
pub mod model;
pub mod peft;
pub mod pose;
pub mod train;

pub use error::{Result, TuneError};
pub use lora::{LoraConfig, Target};
pub use model::{Trainable, TrainableDecoder};
