//! `cargo bench -p posenc --bench attention [-- T ROUNDS]`: the fused
//! attention with RoPE inside on `(B, H, T, D) = (1, 8, T, 64)` buffers,
//! causal, forward alone and backward alone (the shape of
//! `scripts/bench/python_ops.py`, without Python around it), median of the
//! rounds. Threads as rayon's (`RAYON_NUM_THREADS`).

use posenc::buffers::{AttentionShape, BufferAttention, BufferPositions};
use posenc::rope::{PairLayout, RopeFrequencies};
use posenc::tensor::rope::{HeadLayout, Rope};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let t = args.first().copied().unwrap_or(2048);
    let rounds = args.get(1).copied().unwrap_or(7);
    let (b, h, d) = (1, 8, 64);
    let s = AttentionShape {
        batch: b,
        q_heads: h,
        kv_heads: h,
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
    let n = s.q_elements();
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
    let (q, k, v, d_o) = (fill(n), fill(n), fill(n), fill(n));
    let (mut o, mut lse) = (vec![0f32; n], vec![0f32; s.lse_elements()]);
    let (mut dq, mut dk, mut dv) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    let pos = BufferPositions::Offset(0);
    let (mut fwd, mut bwd) = (Vec::new(), Vec::new());
    for _ in 0..rounds + 1 {
        let t0 = Instant::now();
        attn.forward(&q, &k, &v, s, pos, &mut o, &mut lse).unwrap();
        let t1 = Instant::now();
        attn.backward(
            [&q, &k, &v],
            &o,
            &lse,
            &d_o,
            s,
            pos,
            [&mut dq, &mut dk, &mut dv],
        )
        .unwrap();
        let t2 = Instant::now();
        fwd.push((t1 - t0).as_secs_f64() * 1e3);
        bwd.push((t2 - t1).as_secs_f64() * 1e3);
    }
    // The first round warms the caches and the scratch buffers.
    fwd.remove(0);
    bwd.remove(0);
    let (fwd, bwd) = (median(fwd), median(bwd));
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
        "(B, H, T, D) = ({b}, {h}, {t}, {d}), causal, RoPE inside, {} threads, median of {rounds}: \
         forward {:.2} ms, backward {:.2} ms, total {:.2} ms (checksum {checksum:.6e}, bits {bits:016x})",
        rayon::current_num_threads(),
        fwd,
        bwd,
        fwd + bwd,
    );
}
