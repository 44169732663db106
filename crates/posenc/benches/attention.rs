//! `cargo bench -p posenc --bench attention [-- T ROUNDS [H_Q H_KV]]
//! [keep|keep-fresh]`: the fused attention with RoPE inside on `(B, H, T, D)
//! = (1, 8, T, 64)` buffers (by default; `9 3` is SmolLM2's grouped heads),
//! causal, forward alone and backward alone (the shape of
//! `scripts/bench/python_ops.py`, without Python around it), median of the
//! rounds, with the CPU time of both passes. With `keep` the forward keeps
//! the logits for the backward in one buffer reused by every round; with
//! `keep-fresh` in a fresh buffer each round (whose pages fault in). Threads
//! as rayon's (`RAYON_NUM_THREADS`).

use posenc::buffers::{AttentionShape, BufferAttention, BufferPositions};
use posenc::rope::{PairLayout, RopeFrequencies};
use posenc::tensor::rope::{HeadLayout, Rope};
use std::time::Instant;

/// This process's CPU time (every thread's), ms.
fn cpu_ms() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID) failed");
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 * 1e-6
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<usize> = words.iter().filter_map(|a| a.parse().ok()).collect();
    let keep = words.iter().find(|w| w.starts_with("keep")).cloned();
    let t = args.first().copied().unwrap_or(2048);
    let rounds = args.get(1).copied().unwrap_or(7);
    let (b, h, d) = (1, args.get(2).copied().unwrap_or(8), 64);
    let kv = args.get(3).copied().unwrap_or(h);
    let s = AttentionShape {
        batch: b,
        q_heads: h,
        kv_heads: kv,
        q_len: t,
        k_len: t,
        head_dim: d,
    };
    let freqs = RopeFrequencies::plain(500000.0, d, PairLayout::HalfSplit).unwrap();
    let rope = Rope::new(freqs).unwrap().with_layout(HeadLayout::Bhtd);
    let attn = BufferAttention {
        causal: true,
        scale: None,
        rope: Some(&rope),
        alibi: None,
    };
    let (n, nkv) = (s.q_elements(), s.kv_elements());
    // A fixed pseudo-random fill (a linear congruential sequence in [-1, 1)).
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut fill = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    };
    let (q, k, v, d_o) = (fill(n), fill(nkv), fill(nkv), fill(n));
    let (mut o, mut lse) = (vec![0f32; n], vec![0f32; s.lse_elements()]);
    let (mut dq, mut dk, mut dv) = (vec![0f32; n], vec![0f32; nkv], vec![0f32; nkv]);
    let pos = BufferPositions::Offset(0);
    let (mut fwd, mut bwd, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    let kept_len = attn.kept_logits_len(s).unwrap();
    let mut kept = Vec::new();
    for _ in 0..rounds + 1 {
        let c0 = cpu_ms();
        let t0 = Instant::now();
        match keep.as_deref() {
            None => attn.forward(&q, &k, &v, s, pos, &mut o, &mut lse).unwrap(),
            Some(mode) => {
                if mode == "keep-fresh" || kept.is_empty() {
                    kept = vec![0f32; kept_len];
                }
                attn.forward_keeping([&q, &k, &v], s, pos, [&mut o, &mut lse], &mut kept)
                    .unwrap()
            }
        }
        let t1 = Instant::now();
        attn.backward(
            [&q, &k, &v],
            &o,
            &lse,
            keep.as_ref().map(|_| &kept[..]),
            &d_o,
            s,
            pos,
            [&mut dq, &mut dk, &mut dv],
        )
        .unwrap();
        let t2 = Instant::now();
        cpu.push(cpu_ms() - c0);
        fwd.push((t1 - t0).as_secs_f64() * 1e3);
        bwd.push((t2 - t1).as_secs_f64() * 1e3);
    }
    // The first round warms the caches and the scratch buffers.
    fwd.remove(0);
    bwd.remove(0);
    cpu.remove(0);
    let (fwd, bwd, cpu) = (median(fwd), median(bwd), median(cpu));
    let checksum: f64 = dq
        .iter()
        .chain(&dk)
        .chain(&dv)
        .chain(&o)
        .map(|x| *x as f64)
        .sum();
    // FNV-1a over the bits of the output and the three gradients: equal
    // hashes before and after a kernel change mean equal bits.
    let bits = o
        .iter()
        .chain(&dq)
        .chain(&dk)
        .chain(&dv)
        .fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
            (h ^ x.to_bits() as u64).wrapping_mul(0x0100_0000_01b3)
        });
    println!(
        "(B, H, H_kv, T, D) = ({b}, {h}, {kv}, {t}, {d}), causal, RoPE inside, {} threads, {}, median of {rounds}: \
         forward {:.2} ms, backward {:.2} ms, total {:.2} ms, CPU {cpu:.2} ms (checksum {checksum:.6e}, bits {bits:016x})",
        rayon::current_num_threads(),
        keep.as_deref().unwrap_or("logits recomputed"),
        fwd,
        bwd,
        fwd + bwd,
    );
}
