//! The memory plan of a run: the bytes it will hold, estimated from its
//! arguments and the model's shape before anything large is allocated,
//! against the memory it may use.
//!
//! Each command has a typed estimate ([`perplexity`], [`generate`],
//! [`passkey`], [`finetune`]) returning a [`Plan`]: named parts (weights,
//! activations, KV cache, logits, text, ...) whose sum is the run's peak.
//! [`Limit::current`] is the memory the run may use: the smaller of
//! `MemAvailable` (`/proc/meminfo`) and `RLIMIT_AS` less the address space
//! the process already maps (`VmSize` of `/proc/self/status`), or the
//! `--max-memory` given. [`Plan::check`] refuses a plan over the limit in
//! one line naming the estimate, the limit, the flag to lower and the
//! largest value of it that fits, and `--max-memory`.
//!
//! The notation of the formulas: `T` tokens in the window, `D` the hidden
//! size, `W = (Hq + 2 Hk)·Dh` the packed q, k, v width, `Q = Hq·Dh`,
//! `K = Hk·Dh`, `I` the SwiGLU width, `V` the vocabulary, `N` the layers,
//! `P` the model's parameters, `n` the worker threads; every float is 4
//! bytes.

use posenc_models::DecoderConfig;

use crate::{Result, RunError};

const MIB: u64 = 1 << 20;

/// Bytes of the runtime beside the model: the binary's touched pages, the
/// tokenizer (vocabulary, merges, caches), the thread pool's stacks.
/// Measured on SmolLM2-135M (docs/models.md's table).
pub const RUNTIME_BYTES: u64 = 24 * MIB;

/// One part of a plan: what it is and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// What the bytes hold (`weights`, `activations`, `KV cache`, ...).
    pub what: &'static str,
    /// Bytes.
    pub bytes: u64,
}

/// A run's estimated peak memory, in parts, and the argument that scales
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The command (`perplexity`, `generate`, `passkey`, `finetune`).
    pub command: &'static str,
    /// The flag that scales the estimate (`--length`, `--lengths`,
    /// `--max-tokens`).
    pub flag: &'static str,
    /// Its value in this run.
    pub value: usize,
    /// The parts, in order.
    pub parts: Vec<Part>,
}

impl Plan {
    fn new(command: &'static str, flag: &'static str, value: usize) -> Plan {
        Plan {
            command,
            flag,
            value,
            parts: Vec::new(),
        }
    }

    fn part(mut self, what: &'static str, bytes: u64) -> Plan {
        if bytes > 0 {
            self.parts.push(Part { what, bytes });
        }
        self
    }

    /// The estimated peak, bytes: the sum of the parts.
    pub fn total(&self) -> u64 {
        self.parts
            .iter()
            .fold(0u64, |a, p| a.saturating_add(p.bytes))
    }

    /// The parts as `weights 513 MiB, activations 99 MiB, ...`.
    pub fn describe(&self) -> String {
        self.parts
            .iter()
            .map(|p| format!("{} {}", p.what, mib(p.bytes)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Refuses the plan when its total is over `limit`: one line naming
    /// the estimate (with its parts), the limit and where it comes from,
    /// the flag and `largest`, the largest value of the flag that fits (if
    /// any does), and `--max-memory`.
    ///
    /// # Errors
    /// [`RunError::Invalid`].
    pub fn check(&self, limit: &Limit, largest: Option<usize>) -> Result<()> {
        let need = self.total();
        if need <= limit.bytes {
            return Ok(());
        }
        let fits = match largest {
            Some(n) => format!("{} {n} is the largest that fits", self.flag),
            None => format!("no {} fits", self.flag),
        };
        Err(RunError::Invalid(format!(
            "{} with {} {} needs about {} ({}), over the {} limit ({}): {fits}; lower {} or set --max-memory",
            self.command,
            self.flag,
            self.value,
            mib(need),
            self.describe(),
            mib(limit.bytes),
            limit.why,
            self.flag,
        )))
    }
}

/// `n` bytes in MiB, rounded up.
pub fn mib(n: u64) -> String {
    format!("{} MiB", n.div_ceil(MIB))
}

/// The memory a run may use and where that figure comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// Bytes.
    pub bytes: u64,
    /// Where it comes from (`--max-memory`, `MemAvailable`, `RLIMIT_AS
    /// ... less ... mapped`).
    pub why: String,
}

impl Limit {
    /// The limit of a run: `max_memory` (bytes, `--max-memory`) if given,
    /// else the smaller of the machine's available memory (`MemAvailable`
    /// of `/proc/meminfo`; 16 GiB if unknown) and `RLIMIT_AS` less what
    /// the process maps now (`VmSize`), the worker threads' malloc arenas
    /// made first so that their reservations are counted.
    pub fn current(max_memory: Option<u64>) -> Limit {
        if let Some(b) = max_memory {
            return Limit {
                bytes: b,
                why: format!("--max-memory {}", mib(b)),
            };
        }
        let (mut bytes, mut why) = match posenc_models::available_memory() {
            Some(b) => (b, "MemAvailable in /proc/meminfo".to_string()),
            None => (
                16 << 30,
                "a default of 16 GiB: available memory unknown".into(),
            ),
        };
        if let Some(rlim) = address_space_limit() {
            // Every worker allocates once, so that its arena is mapped.
            rayon::broadcast(|_| std::hint::black_box(vec![0u8; 64]));
            let mapped = mapped_bytes().unwrap_or(0);
            let left = rlim.saturating_sub(mapped);
            if left < bytes {
                bytes = left;
                why = format!(
                    "RLIMIT_AS {} less {} already mapped",
                    mib(rlim),
                    mib(mapped)
                );
            }
        }
        Limit { bytes, why }
    }
}

/// `RLIMIT_AS`'s soft limit in bytes, `None` when unlimited.
pub fn address_space_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0 {
        return None;
    }
    (lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// The address space the process maps now (`VmSize` of
/// `/proc/self/status`), bytes.
pub fn mapped_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmSize:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Parses a `--max-memory` size: bytes, or a number with `K`, `M`, `G` or
/// `T` (powers of 1024; `KiB`, `MB`, ... accepted), e.g. `900M`, `2G`,
/// `1.5G`.
///
/// # Errors
/// [`RunError::Invalid`] naming `--max-memory` for anything else, 0 or a
/// size past 2^60.
pub fn parse_size(s: &str) -> Result<u64> {
    let bad = || {
        RunError::Invalid(format!(
            "--max-memory {s:?}: give a size such as 900M, 2G or 1073741824 (bytes), at least 1M"
        ))
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(bad()),
    };
    let b = x * mult as f64;
    if !b.is_finite() || b < MIB as f64 || b > (1u64 << 60) as f64 {
        return Err(bad());
    }
    Ok(b as u64)
}

/// The largest `v` in `lo..=hi` whose plan `f(v)` fits in `limit` bytes
/// (plans grow with `v`), or `None`.
pub fn largest_fitting(
    lo: usize,
    hi: usize,
    limit: u64,
    f: impl Fn(usize) -> u64,
) -> Option<usize> {
    if lo > hi || f(lo) > limit {
        return None;
    }
    let (mut a, mut b) = (lo, hi);
    while a < b {
        let m = a + (b - a).div_ceil(2);
        if f(m) <= limit {
            a = m;
        } else {
            b = m - 1;
        }
    }
    Some(a)
}

fn f32s(n: u64) -> u64 {
    n.saturating_mul(4)
}

/// The weights as held in memory: `4·P` (every tensor dequantized to
/// `f32`), and the loader's copy of the largest tensor `4·V·D` (the
/// embedding's `f32` tensor copied into its buffer, which the allocator
/// keeps); none when the session holds them already.
fn weights(plan: Plan, cfg: &DecoderConfig, loaded: bool) -> Plan {
    if loaded {
        return plan;
    }
    let d = cfg.hidden_size as u64;
    let largest = (cfg.vocab_size as u64 * d)
        .max(2 * cfg.intermediate_size as u64 * d)
        .max(cfg.qkv_width() as u64 * d);
    plan.part("weights", posenc_models::llama::weight_bytes(cfg))
        .part("loader's copy", f32s(largest))
        .part("runtime", RUNTIME_BYTES)
}

/// Floats per token of one layer of the forward pass at its peak: the
/// residual stream and its norm `2·D`, and the larger of the attention's
/// (`W` packed q, k, v; `3·Q` the queries copied, the output and its copy;
/// `2·K` the keys and values copied from a cache) and the MLP's (`3·I + D`:
/// gate and up `2·I`, their product `I`, the down projection `D`).
pub fn forward_floats_per_token(cfg: &DecoderConfig) -> u64 {
    let d = cfg.hidden_size as u64;
    let w = cfg.qkv_width() as u64;
    let q = (cfg.num_heads * cfg.head_dim) as u64;
    let k = (cfg.num_kv_heads * cfg.head_dim) as u64;
    let i = cfg.intermediate_size as u64;
    2 * d + (w + 3 * q + 2 * k).max(3 * i + d)
}

/// The fused attention's scratch: per worker thread, a key/value row block
/// `2·Dh·T` and its tiles (`64·128 + 64·Dh`) floats.
fn attention_scratch(cfg: &DecoderConfig, t: u64, threads: u64) -> u64 {
    let dh = cfg.head_dim as u64;
    f32s(threads * (2 * dh * t + 64 * 128 + 64 * dh))
}

/// The worker threads of the forward pass.
fn threads() -> u64 {
    rayon::current_num_threads() as u64
}

/// `posenc perplexity --length T`:
///
/// `4·P + 4·V·D + runtime` (the weights, see above; none when loaded)
/// `+ 4·T·(2D + max(W + 3Q + 2K, 3I + D))` (one layer's activations)
/// `+ 4·n·(2·Dh·T + 64·128 + 64·Dh)` (the attention's scratch)
/// `+ 4·256·V` (logits, 256 rows at a time)
/// `+ 8·T + 8·T` (the window's tokens, twice, and the loss per position)
/// `+ text` (the tokens of the text read: the built-in novel or a
/// string whole, a file only as far as the window, or with `--held-out`
/// its token count, `4` bytes each, counted in 1 MiB pieces).
pub fn perplexity(cfg: &DecoderConfig, length: usize, text_tokens: u64, loaded: bool) -> Plan {
    let t = length as u64;
    let plan = weights(Plan::new("perplexity", "--length", length), cfg, loaded);
    plan.part("activations", f32s(t * forward_floats_per_token(cfg)))
        .part("attention scratch", attention_scratch(cfg, t, threads()))
        .part(
            "logits",
            f32s(posenc_models::perplexity::LOGIT_ROWS as u64 * cfg.vocab_size as u64),
        )
        .part("tokens and losses", 16 * t + 4 * text_tokens)
}

/// The capacity a vector reaches when `rows` rows are appended one at a
/// time (Rust's doubling growth): the next power of two.
fn grown(rows: u64) -> u64 {
    rows.max(1).next_power_of_two()
}

/// The KV cache of `positions` positions: `2·N·K` floats a position, in
/// vectors grown by doubling (`next_power_of_two(positions)` rows
/// reserved).
fn kv_cache(cfg: &DecoderConfig, positions: u64) -> u64 {
    posenc_models::llama::kv_bytes_per_position(cfg) * grown(positions)
}

/// `posenc generate` with a prompt of `prompt` tokens and `--max-tokens M`
/// (`S = prompt + M` positions):
///
/// `weights` (as [`perplexity`])
/// `+ 8·N·K·next_power_of_two(S)` (the KV cache, grown by doubling)
/// `+ 4·prompt·(2D + max(W + 3Q + 2K, 3I + D))` (the prefill's layer)
/// `+ 4·n·(2·Dh·S + 64·128 + 64·Dh)` (the attention's scratch)
/// `+ 4·2·K·S` (a decoding step's copy of the cached keys and values)
/// `+ 4·V` (one row of logits) `+ 8·S` (the ids).
pub fn generate(cfg: &DecoderConfig, prompt: usize, max_new: usize, loaded: bool) -> Plan {
    let s = (prompt + max_new) as u64;
    let plan = weights(Plan::new("generate", "--max-tokens", max_new), cfg, loaded);
    decoding(plan, cfg, prompt as u64, s)
        .part("logits and ids", f32s(cfg.vocab_size as u64) + 8 * s)
}

/// What decoding after a prefill of `prefill` tokens holds over `s`
/// positions in all, added to `plan`: `8·N·K·next_power_of_two(S)` (the
/// KV cache, grown by doubling), `4·prefill·(2D + max(W + 3Q + 2K, 3I +
/// D))` (the prefill's layer), `4·n·(2·Dh·S + 64·128 + 64·Dh)` (the
/// attention's scratch) and `4·2·K·S` (a decoding step's copy of the
/// cached keys and values).
fn decoding(plan: Plan, cfg: &DecoderConfig, prefill: u64, s: u64) -> Plan {
    let k = (cfg.num_kv_heads * cfg.head_dim) as u64;
    plan.part("KV cache", kv_cache(cfg, s))
        .part(
            "prefill activations",
            f32s(prefill * forward_floats_per_token(cfg)),
        )
        .part("attention scratch", attention_scratch(cfg, s, threads()))
        .part("cache copies", f32s(2 * k * s))
}

/// Refuses a generation whose [`generate`] plan is over `limit`, naming
/// the largest `--max-tokens` that fits, or when even none fits, the
/// largest `--prompt-tokens` that fits with these new tokens.
///
/// # Errors
/// [`Plan::check`]'s.
pub fn check_generate(
    cfg: &DecoderConfig,
    prompt: usize,
    max_new: usize,
    loaded: bool,
    limit: &Limit,
) -> Result<()> {
    let full = generate(cfg, prompt, max_new, loaded);
    if full.total() <= limit.bytes {
        return Ok(());
    }
    let fit = |p: usize, m: usize| generate(cfg, p, m, loaded).total();
    if let Some(m) = largest_fitting(0, max_new, limit.bytes, |m| fit(prompt, m)) {
        return full.check(limit, Some(m));
    }
    let by_prompt = Plan {
        flag: "--prompt-tokens",
        value: prompt,
        ..full
    };
    by_prompt.check(
        limit,
        largest_fitting(1, prompt, limit.bytes, |p| fit(p, max_new)),
    )
}

/// `posenc passkey --lengths ...`, `L` the longest length, `A` the answer
/// and new tokens past it (`S = L + A` positions), `H` the haystack's
/// bytes:
///
/// `weights` (as [`perplexity`])
/// `+ 8·N·K·next_power_of_two(S)` (one scaling's KV cache, reused from
/// trial to trial)
/// `+ 4·L·(2D + max(W + 3Q + 2K, 3I + D))` (the prefill's layer)
/// `+ 4·n·(2·Dh·S + 64·128 + 64·Dh)` (the attention's scratch)
/// `+ 4·2·K·S` (a decoding step's copy of the cache)
/// `+ 4·V·A` (the answer's logits) `+ 3·H` (the haystack's text, its
/// sentences and a prompt's text).
pub fn passkey(
    cfg: &DecoderConfig,
    longest: usize,
    extra: usize,
    haystack_bytes: u64,
    loaded: bool,
) -> Plan {
    let s = (longest + extra) as u64;
    let plan = weights(Plan::new("passkey", "--lengths", longest), cfg, loaded);
    decoding(plan, cfg, longest as u64, s)
        .part("logits", f32s(cfg.vocab_size as u64 * extra as u64))
        .part("haystack", 3 * haystack_bytes)
}

/// `posenc finetune --model --length T` (or `--pose T`: the window), with
/// a training text of `text_bytes` bytes (read whole, tokenized in 1 MiB
/// pieces of which only the token ids are kept):
///
/// posenc-tune's estimate of a training step
/// ([`posenc_tune::train::estimate_train_bytes`]: the loaded model and its
/// trainable copy `8·P`, the activations the backward pass keeps and
/// their gradients, the logits with their softmax and gradient, the
/// largest frozen weight's gradient, the trained parameters with AdamW's
/// two moments, the attention backward's partial query gradients)
/// `+ runtime` (as above; the loader's copy of the embedding is within
/// posenc-tune's largest-gradient term)
/// `+ 6·H` (the text: its bytes, its token ids, and the tokenizer's work
/// on one piece; kept at the bound measured when the text was tokenized
/// whole, so an over-estimate now).
pub fn finetune(
    cfg: &DecoderConfig,
    window: usize,
    trainable: posenc_tune::Trainable,
    checkpoint_layers: bool,
    text_bytes: u64,
) -> Plan {
    let flag = "--length";
    Plan::new("finetune", flag, window)
        .part(
            "training step",
            posenc_tune::train::estimate_train_bytes(cfg, window, trainable, checkpoint_layers),
        )
        .part("runtime", RUNTIME_BYTES)
        .part("text", 6 * text_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_their_units() {
        assert_eq!(parse_size("900M").unwrap(), 900 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        for bad in ["", "0", "-1G", "1X", "nanG", "1e400", "12K", "9999999T"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.starts_with("--max-memory"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_largest_fitting_value_is_found() {
        let f = |v: usize| 100 + 10 * v as u64;
        assert_eq!(largest_fitting(2, 1000, 1000, f), Some(90));
        assert_eq!(largest_fitting(2, 50, 1000, f), Some(50));
        assert_eq!(largest_fitting(2, 1000, 50, f), None);
    }

    #[test]
    fn a_plan_over_the_limit_names_estimate_limit_and_flag() {
        let plan = Plan::new("perplexity", "--length", 9000)
            .part("weights", 500 * MIB)
            .part("activations", 300 * MIB);
        let limit = Limit {
            bytes: 700 * MIB,
            why: "--max-memory 700 MiB".into(),
        };
        let e = plan.check(&limit, Some(5000)).unwrap_err().to_string();
        assert_eq!(
            e,
            "perplexity with --length 9000 needs about 800 MiB (weights 500 MiB, activations 300 MiB), \
             over the 700 MiB limit (--max-memory 700 MiB): --length 5000 is the largest that fits; \
             lower --length or set --max-memory"
        );
        assert!(plan
            .check(
                &Limit {
                    bytes: 800 * MIB,
                    why: String::new()
                },
                None
            )
            .is_ok());
    }

    #[test]
    fn rlimit_as_lowers_the_limit() {
        // This process has no RLIMIT_AS in CI; the limit is then
        // MemAvailable (or --max-memory), and VmSize is read.
        assert!(mapped_bytes().unwrap() > 0);
        assert_eq!(Limit::current(Some(5 << 30)).bytes, 5 << 30);
        let l = Limit::current(None);
        assert!(l.bytes > 0 && !l.why.is_empty(), "{l:?}");
    }
}
