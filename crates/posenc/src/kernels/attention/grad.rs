//! The backward pass: the probabilities recomputed tile by tile from the
//! forward pass's log-sum-exp (and the logits, where it kept them), the
//! gradients of queries, keys, values and every bias parameter.

use super::*;

crate::multiversion!(fn backward_dispatch => backward_task(
    p: &Problem, task: usize, chunk: &KeyChunk, o: &[f32], o_rows: Rows, d_o: &[f32],
    do_rows: Rows, lse: &[f32], kept: Kept, g: GradRows, ptrs: &BwdPtrs, want: (bool, bool, bool),
    level: SimdLevel) -> Partial);

/// (batch, key/value head) tasks the backward pass aims at: fewer, and each
/// task's keys are split into runs ([`KeyChunk`]) so that there are about
/// this many. A count fixed by the shape alone, never by the threads, so
/// that the results do not depend on the thread count.
const BWD_TASKS: usize = 24;

/// Most runs of keys per task: each run's query gradients are a partial sum
/// of its own (`B · H_q · T_q · D` floats at most), added afterwards.
const MAX_KEY_CHUNKS: usize = 4;

/// One task's run of keys: key tiles `keys.0..keys.1` (multiples of the
/// key tile), which the queries from `first_query` on meet.
///
/// With its keys split into runs, a task writes its keys' and values'
/// gradients whole (each key's terms still added over the group's heads and
/// the query tiles in order) and its queries' gradients as a partial sum
/// at `partial` (row `t` of head `bh` at `(bh · (T_q − first_query) + t −
/// first_query) · D`), which [`backward`] adds over the runs in order.
#[derive(Clone, Copy)]
struct KeyChunk {
    keys: (usize, usize),
    first_query: usize,
    partial: Option<SendPtr>,
}

/// Largest partial-sum buffer kept between calls, floats (32 MiB; 9 MiB at
/// `(1, 8, 2048, 64)`). Past it the products' work, which grows with the
/// square of the length, dwarfs the first touch of fresh pages.
const KEEP_PARTIALS: usize = 8 << 20;

thread_local! {
    /// The runs' partial query gradients ([`KeyChunk`]), kept between calls.
    static PARTIALS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Per-task partial gradients of the shared tables.
#[derive(Default)]
struct Partial {
    scalar: Vec<f32>,
    keys: Vec<f32>,
    values: Vec<f32>,
}

/// The backward pass: from the output `o`, its gradient `d_o` (both laid out
/// as their `Rows`) and the forward pass's `lse`, writes every gradient in
/// `g`. With `kept`, the logits [`forward_keeping`] wrote for the same
/// problem, it reads them rather than recomputing them (the same bits where
/// the forward's products are the backward's, as on AVX2 and AVX-512).
///
/// # Panics
/// On buffers too short for their layouts (the tensor API checks them
/// before calling).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    p: &Problem,
    o: &[f32],
    o_rows: Rows,
    d_o: &[f32],
    do_rows: Rows,
    lse: &[f32],
    kept: Option<&[f32]>,
    g: Grads,
    level: SimdLevel,
) {
    let dm = p.dims;
    assert!(
        p.window.is_none(),
        "the backward pass has no key windows (context methods are forward-only)"
    );
    let layout = kept.map(|k| {
        let at = KeptLogits::new(p, level).expect("the logits can be kept for this problem");
        assert!(k.len() >= at.floats());
        (SendPtr(k.as_ptr() as *mut f32), at)
    });
    let kept: Kept = layout.as_ref().map(|(ptr, at)| (*ptr, at));
    assert!(o.len() >= o_rows.extent(dm.batch, dm.q_heads, dm.q_len, dm.head_dim));
    assert!(d_o.len() >= do_rows.extent(dm.batch, dm.q_heads, dm.q_len, dm.head_dim));
    assert!(lse.len() >= dm.batch * dm.q_heads * dm.q_len);
    let nv = p.n_vec_rows();
    let d = dm.head_dim;
    let ns = p.scalar.map_or(0, |s| s.index.rows());
    let mut g = g;
    if let Some(dd) = g.dense.as_deref_mut() {
        assert!(dd.len() >= dm.batch * dm.q_heads * dm.q_len * dm.k_len);
        dd.fill(0.0);
    }
    if let Some(c) = g.cumulative_q.as_deref_mut() {
        assert!(c.len() >= dm.batch * dm.q_heads * dm.q_len);
        c.fill(0.0);
    }
    if let Some(c) = g.cumulative_k.as_deref_mut() {
        assert!(c.len() >= dm.batch * dm.q_heads * dm.k_len);
        c.fill(0.0);
    }
    let ptrs = BwdPtrs {
        dq: SendPtr(g.dq),
        dk: SendPtr(g.dk),
        dv: SendPtr(g.dv),
        dense: g.dense.as_ref().map(|x| SendPtr(x.as_ptr() as *mut f32)),
        cq: g
            .cumulative_q
            .as_ref()
            .map(|x| SendPtr(x.as_ptr() as *mut f32)),
        ck: g
            .cumulative_k
            .as_ref()
            .map(|x| SendPtr(x.as_ptr() as *mut f32)),
    };
    let want = (g.scalar.is_some(), g.keys.is_some(), g.values.is_some());
    let parallel = p.work() >= PARALLEL_WORK / 2;
    let rows = GradRows {
        dq_rows: g.dq_rows,
        dk_rows: g.dk_rows,
        dv_rows: g.dv_rows,
    };
    let bq = backward_query_tile(p);
    // Runs of keys: only where every shared sum stays within its run (no
    // Shaw tables, whose per-query weights sum over all keys, no cumulative
    // query sums, no T5 table gradient, which keeps query tiles outermost).
    let tasks = dm.batch * dm.kv_heads;
    let splits =
        p.vector.is_none() && ptrs.cq.is_none() && !(want.0 && p.scalar.is_some()) && parallel;
    let mut chunks = match key_runs(dm) {
        runs if splits && runs > 1 => key_chunks(p, bq, runs),
        _ => Vec::new(),
    };
    let parts = if chunks.len() > 1 {
        // Each run's partial dQ̃ over the rows that meet it (zeros where a
        // row meets none of its keys).
        let per_run = |c: &KeyChunk| dm.batch * dm.q_heads * (dm.q_len - c.first_query) * d;
        // Kept between calls on this thread: a fresh buffer's pages fault
        // in on first touch (some 2,000 pages at 2,048 tokens). The tasks
        // zero their rows. (Not `tile::Scratch`: the tasks take that one,
        // on this thread too when they run here.)
        let mut partials = PARTIALS.with(|c| {
            c.try_borrow_mut()
                .map(|mut b| std::mem::take(&mut *b))
                .unwrap_or_default()
        });
        let need: usize = chunks.iter().map(per_run).sum();
        assert!(need <= backward_extra_floats(dm), "the memory bound holds");
        if partials.len() < need {
            partials.resize(need, 0.0);
        }
        let mut at = 0;
        for c in &mut chunks {
            c.partial = Some(SendPtr(partials[at..].as_mut_ptr()));
            at += per_run(c);
        }
        let n = chunks.len();
        run_in_turn(tasks, n, parallel, |i| {
            let part = backward_dispatch(
                level,
                p,
                i / n,
                &chunks[i % n],
                o,
                o_rows,
                d_o,
                do_rows,
                lse,
                kept,
                rows,
                &ptrs,
                want,
                level,
            );
            debug_assert!(part.scalar.is_empty() && part.keys.is_empty() && part.values.is_empty());
        });
        add_runs(p, &chunks, ptrs.dq, rows.dq_rows, parallel);
        if partials.len() <= KEEP_PARTIALS {
            PARTIALS.with(|c| {
                if let Ok(mut b) = c.try_borrow_mut() {
                    *b = partials;
                }
            });
        }
        Vec::new()
    } else {
        let whole = KeyChunk {
            keys: (0, dm.k_len),
            first_query: 0,
            partial: None,
        };
        run_tasks(tasks, parallel, |task| {
            backward_dispatch(
                level, p, task, &whole, o, o_rows, d_o, do_rows, lse, kept, rows, &ptrs, want,
                level,
            )
        })
    };
    // Shared tables: add the partial sums in task order.
    let add = |dst: Option<&mut [f32]>, pick: fn(&Partial) -> &Vec<f32>, len: usize| {
        if let Some(dst) = dst {
            dst[..len].fill(0.0);
            for part in &parts {
                for (a, b) in dst.iter_mut().zip(pick(part)) {
                    *a += b;
                }
            }
        }
    };
    add(g.scalar, |x| &x.scalar, ns * dm.q_heads);
    add(g.keys, |x| &x.keys, nv * d);
    add(g.values, |x| &x.values, nv * d);
}

/// `dq = scale·Rᵀ·dQ̃` with `dQ̃` the runs' partial sums (see [`KeyChunk`]),
/// added in run order, a (batch, query head) pair per task.
fn add_runs(p: &Problem, chunks: &[KeyChunk], dq: SendPtr, dq_rows: Rows, parallel: bool) {
    let dm = p.dims;
    let d = dm.head_dim;
    run_tasks(dm.batch * dm.q_heads, parallel, |bh| {
        let (b, h) = (bh / dm.q_heads, bh % dm.q_heads);
        // The whole pointer (a closure captures `dq.0` alone otherwise,
        // which is not `Sync`).
        let dq: SendPtr = dq;
        let mut acc = vec![0f32; d];
        for t in 0..dm.q_len {
            acc.fill(0.0);
            for c in chunks.iter().filter(|c| c.first_query <= t) {
                let rows = dm.q_len - c.first_query;
                let at = (bh * rows + t - c.first_query) * d;
                let run: SendPtr = c.partial.expect("every run has its partial sum");
                let part = unsafe { std::slice::from_raw_parts(run.0.add(at), d) };
                for (a, x) in acc.iter_mut().zip(part) {
                    *a += x;
                }
            }
            let dst = unsafe { std::slice::from_raw_parts_mut(dq.0.add(dq_rows.at(b, h, t)), d) };
            p.rotate(true, (b, t), &acc, dst, true, p.scale);
        }
    });
}

/// Most floats the backward pass on `dims` allocates besides its per-thread
/// scratch: the runs' partial query gradients ([`KeyChunk`]), up to 4 times
/// the queries' size where the keys may be split into runs (fewer than 24
/// (batch, key/value head) pairs, more than one key tile), else none. The
/// calling thread keeps a buffer of up to 32 MiB of them for its next call.
/// For memory estimates (`posenc_tune`'s training estimate counts it).
pub fn backward_extra_floats(dims: Dims) -> usize {
    // Runs hold whole key tiles.
    let runs = key_runs(dims).min(dims.k_len.div_ceil(BK));
    if runs > 1 {
        runs * dims.batch * dims.q_heads * dims.q_len * dims.head_dim
    } else {
        0
    }
}

/// The runs of keys each (batch, key/value head) task is split into on
/// `dims` by its shape: enough for about [`BWD_TASKS`] tasks, at most
/// [`MAX_KEY_CHUNKS`]; 1 (whole tasks) from [`BWD_TASKS`] pairs on.
fn key_runs(dims: Dims) -> usize {
    let tasks = dims.batch * dims.kv_heads;
    if tasks >= BWD_TASKS {
        1
    } else {
        BWD_TASKS.div_ceil(tasks.max(1)).min(MAX_KEY_CHUNKS)
    }
}

/// Layouts of the q, k, v gradients.
#[derive(Clone, Copy)]
struct GradRows {
    dq_rows: Rows,
    dk_rows: Rows,
    dv_rows: Rows,
}

struct BwdPtrs {
    dq: SendPtr,
    dk: SendPtr,
    dv: SendPtr,
    dense: Option<SendPtr>,
    cq: Option<SendPtr>,
    ck: Option<SendPtr>,
}

/// Queries per tile of the backward pass: larger tiles on long sequences,
/// where the products' register tiles reload their accumulators less often.
fn backward_query_tile(p: &Problem) -> usize {
    if p.dims.k_len > LONG_KEYS {
        BQ_BWD_LONG
    } else {
        BQ_BWD
    }
}

/// One head's key tiles split into at most `n` runs of about equal work
/// (the query-key products of their tile pairs), in key order; fewer runs
/// where there are fewer key tiles or some would be empty.
fn key_chunks(p: &Problem, bq: usize, n: usize) -> Vec<KeyChunk> {
    // (first key of the tile, its work, the first query tile meeting it),
    // in key order: the pairs come key tile by key tile.
    let mut tiles: Vec<(usize, usize, usize)> = Vec::new();
    for (i0, rows, j0, width) in tile_pairs(p, bq, false) {
        match tiles.last_mut() {
            Some(t) if t.0 == j0 => {
                t.1 += rows * width;
                t.2 = t.2.min(i0);
            }
            _ => tiles.push((j0, rows * width, i0)),
        }
    }
    let total: usize = tiles.iter().map(|t| t.1).sum();
    let mut chunks: Vec<KeyChunk> = Vec::new();
    let (mut done, mut start) = (0usize, 0usize);
    for (k, t) in tiles.iter().enumerate() {
        done += t.1;
        let last = k + 1 == tiles.len();
        // Close a run once it holds its share of the work.
        if last || done * n >= total * (chunks.len() + 1) {
            // The runs cover every key (a key no query sees gets zero
            // gradients from its run, as from a whole task).
            let first = if chunks.is_empty() { 0 } else { tiles[start].0 };
            let end = tiles.get(k + 1).map_or(p.dims.k_len, |t| t.0);
            chunks.push(KeyChunk {
                keys: (first, end),
                first_query: tiles[start..=k].iter().map(|t| t.2).min().unwrap_or(0),
                partial: None,
            });
            start = k + 1;
        }
    }
    chunks
}

/// The (query tile, key tile) pairs of one head's backward pass, as
/// `(i0, rows, j0, n)`: queries `i0..i0 + rows` against keys `j0..j0 + n`,
/// every pair whose last query sees key `j0`.
///
/// Key tiles outermost: a key tile's keys, values and their gradients
/// (some 180 KB) stay in the L2 cache while the query tiles stream past,
/// where query tiles outermost streamed every key-side array (about 2.5 KB
/// a key, the gradients read and written) from memory once per query tile.
/// Each gradient entry still adds its terms in the same order (a query's
/// over the key tiles in increasing order, a key's over the query tiles in
/// increasing order), so the results keep their bits. Only a shared table
/// of scalar biases (T5's buckets) sums terms of many queries and keys into
/// one entry: with its gradient wanted (`queries_outer`), query tiles stay
/// outermost, as before, so that its sums keep their order too.
fn tile_pairs(p: &Problem, bq: usize, queries_outer: bool) -> Vec<(usize, usize, usize, usize)> {
    let tq = p.dims.q_len;
    let q_tiles: Vec<(usize, usize, usize)> = (0..tq)
        .step_by(bq)
        .map(|i0| {
            let rows = bq.min(tq - i0);
            (i0, rows, p.visible(i0 + rows - 1))
        })
        .collect();
    let k_tiles = q_tiles.iter().map(|t| t.2).max().unwrap_or(0).div_ceil(BK);
    let mut pairs = Vec::new();
    if queries_outer {
        for &(i0, rows, k_end) in &q_tiles {
            pairs.extend(
                (0..k_end)
                    .step_by(BK)
                    .map(|j0| (i0, rows, j0, BK.min(k_end - j0))),
            );
        }
    } else {
        for j0 in (0..k_tiles).map(|t| t * BK) {
            for &(i0, rows, k_end) in q_tiles.iter().filter(|t| j0 < t.2) {
                pairs.push((i0, rows, j0, BK.min(k_end - j0)));
            }
        }
    }
    pairs
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn backward_task(
    p: &Problem,
    task: usize,
    chunk: &KeyChunk,
    o: &[f32],
    o_rows: Rows,
    d_o: &[f32],
    do_rows: Rows,
    lse: &[f32],
    kept: Kept,
    g: GradRows,
    ptrs: &BwdPtrs,
    want: (bool, bool, bool),
    level: SimdLevel,
) -> Partial {
    let dm = p.dims;
    let d = dm.head_dim;
    let (tq, tk) = (dm.q_len, dm.k_len);
    let (b, hk) = (task / dm.kv_heads, task % dm.kv_heads);
    let nv = p.n_vec_rows();
    let ns = p.scalar.map_or(0, |s| s.index.rows());
    let mut part = Partial {
        scalar: vec![0f32; if want.0 { ns * dm.q_heads } else { 0 }],
        keys: vec![0f32; if want.1 { nv * d } else { 0 }],
        values: vec![0f32; if want.2 { nv * d } else { 0 }],
    };
    let keys = p.vector.and_then(|v| v.keys);
    let values = p.vector.and_then(|v| v.values);
    let nk = if keys.is_some() { tq * nv } else { 0 };
    let nvv = if values.is_some() { tq * nv } else { 0 };
    let nakt = if keys.is_some() { d * nv } else { 0 };
    let navt = if values.is_some() { d * nv } else { 0 };
    let bq = backward_query_tile(p);
    let (k_lo, k_hi) = chunk.keys;
    let i_lo = chunk.first_query;
    // Key tiles of the transposed keys and values are contiguous `(D, BK)`
    // blocks with leading dimension `packed_ld(BK)`: a leading dimension of
    // `T_k` (a power of two, often) mapped a tile's rows onto the same cache
    // sets.
    let ldt = packed_ld(BK);
    let tkp = tk.div_ceil(BK) * ldt;
    // Rows of the rotated keys 16 apart more than `D`: the product dQ̃ +=
    // dS·K̃ reads a tile's rows at that stride.
    let ldr = d + 16;
    // The rotated queries, the output's gradient (copied) and the tiles of
    // P and dS likewise: the products read their columns (the transposed
    // tiles' too) at these strides, which at 64 or 128 floats put a
    // panel's rows in a quarter or an eighth of the L1 cache's sets.
    let ldq = d + 16;
    let mut scratch = tile::Scratch::take();
    let [kr, kt, vt, dkr, dv, qs, dos, dqs, dvec, pm, dp, qa, doa, wk, wv, akt, avt] = scratch
        .split([
            tk * ldr, // kr: rotated keys (T_k, D), leading dimension ldr
            // kt: their transpose, per key tile (for the logits' product)
            if kept.is_none() { d * tkp } else { 0 },
            d * tkp,  // vt: values transposed, per key tile
            tk * d,   // dkr
            tk * d,   // dv
            tq * ldq, // qs: rotated, scaled queries, leading dimension ldq
            tq * ldq, // dos: the output's gradient, leading dimension ldq
            tq * d,   // dqs
            tq,       // dvec
            bq * ldt, // P, leading dimension ldt
            bq * ldt, // dP, then dS
            nk,       // qa
            nvv,      // doa
            nk,       // wk
            nvv,      // wv
            nakt,     // a^K transposed
            navt,     // a^V transposed
        ]);
    {
        {
            for t in k_lo..k_hi {
                prefetch_kv(p, b, hk, t + PREFETCH_AHEAD);
                load_k(p, b, hk, t, &mut kr[t * ldr..][..d]);
            }
            dkr[k_lo * d..k_hi * d].fill(0.0);
            dv[k_lo * d..k_hi * d].fill(0.0);
            unsafe {
                let mut j0 = k_lo;
                while j0 < k_hi {
                    let n = BK.min(k_hi - j0);
                    // The transposed keys serve the logits' product alone.
                    if kept.is_none() {
                        tile::transpose(
                            n,
                            d,
                            kr.as_ptr().add(j0 * ldr),
                            ldr,
                            kt.as_mut_ptr().add(j0 / BK * d * ldt),
                            ldt,
                        );
                    }
                    tile::transpose(
                        n,
                        d,
                        p.v.as_ptr().add(p.v_rows.at(b, hk, j0)),
                        p.v_rows.st,
                        vt.as_mut_ptr().add(j0 / BK * d * ldt),
                        ldt,
                    );
                    j0 += n;
                }
            }
            if let Some(ak) = keys {
                unsafe { tile::transpose(nv, d, ak.as_ptr(), d, akt.as_mut_ptr(), nv) };
            }
            if let Some(av) = values {
                unsafe { tile::transpose(nv, d, av.as_ptr(), d, avt.as_mut_ptr(), nv) };
            }
            let mut tile_pairs = tile_pairs(p, bq, want.0 && p.scalar.is_some());
            tile_pairs.retain(|t| (k_lo..k_hi).contains(&t.2));
            for h in hk * p.group()..(hk + 1) * p.group() {
                let bh = b * dm.q_heads + h;
                let do0 = do_rows.at(b, h, 0);
                for t in i_lo..tq {
                    let ahead = t + PREFETCH_AHEAD;
                    prefetch_q(p, b, h, ahead);
                    if ahead < tq {
                        prefetch(d_o, do_rows.at(b, h, ahead), d);
                        prefetch(o, o_rows.at(b, h, ahead), d);
                    }
                    load_q(p, b, h, t, &mut qs[t * ldq..][..d]);
                    let dor = &d_o[do_rows.at(b, h, t)..][..d];
                    dos[t * ldq..][..d].copy_from_slice(dor);
                    dvec[t] = tile::dot(dor, &o[o_rows.at(b, h, t)..][..d]);
                }
                // dQ̃'s rows: here, or this run's partial sum (zeros).
                let (dq_acc, dq_row0) = match chunk.partial {
                    Some(ptr) => {
                        let rows = unsafe {
                            std::slice::from_raw_parts_mut(
                                ptr.0.add(bh * (tq - i_lo) * d),
                                (tq - i_lo) * d,
                            )
                        };
                        rows.fill(0.0);
                        (rows.as_mut_ptr(), i_lo)
                    }
                    None => {
                        dqs.fill(0.0);
                        (dqs.as_mut_ptr(), 0)
                    }
                };
                if keys.is_some() {
                    unsafe {
                        let g = tile::Gemm::new(tq, nv, d)
                            .a(qs.as_ptr(), ldq)
                            .b(akt.as_ptr(), nv);
                        tile::gemm(level, g.to(qa.as_mut_ptr(), nv))
                    };
                    wk.fill(0.0);
                }
                if values.is_some() {
                    unsafe {
                        let g = tile::Gemm::new(tq, nv, d)
                            .a(d_o.as_ptr().add(do0), do_rows.st)
                            .b(avt.as_ptr(), nv);
                        tile::gemm(level, g.to(doa.as_mut_ptr(), nv))
                    };
                    wv.fill(0.0);
                }
                let lse_h = &lse[bh * tq..][..tq];
                for &(i0, rows, j0, n) in &tile_pairs {
                    // A long tile on the causal diagonal runs its products
                    // on the keys each group of rows sees: the rest of P
                    // and dS is zeros, which only added zeros to the sums,
                    // and the rest of S and dP is never read. Same bits.
                    // (A short tile's hidden triangle, 16 rows, is too
                    // small to pay for the extra calls.)
                    let trim = bq > BQ_BWD && p.sees_part(i0, rows, j0, n);
                    // The keys the rows before r1 see, from j0 (no window
                    // here: they start at j0).
                    let seen = |r1: usize| p.seen(i0, j0, n, 0, r1).1;
                    // The first row that sees key j0 + c.
                    let first = |c: usize| {
                        (0..rows)
                            .find(|&r| p.visible(i0 + r) > j0 + c)
                            .unwrap_or(rows)
                    };
                    // S and dP: whole registers of the columns seen.
                    let logits = |_, r1| ([0, seen(r1).next_multiple_of(16)], [0, d]);
                    unsafe {
                        // S (rows × n) = Q̃[i0..] · K̃ᵀ[:, j0..], unless kept.
                        if kept.is_none() {
                            let g = tile::Gemm::new(rows, n, d)
                                .a(qs.as_ptr().add(i0 * ldq), ldq)
                                .b(kt.as_ptr().add(j0 / BK * d * ldt), ldt)
                                .to(pm.as_mut_ptr(), ldt);
                            tile::gemm_maybe_trimmed(level, g, trim, logits);
                        }
                        // dP (rows × n) = dO[i0..] · Vᵀ[:, j0..]
                        let g = tile::Gemm::new(rows, n, d)
                            .a(dos.as_ptr().add(i0 * ldq), ldq)
                            .b(vt.as_ptr().add(j0 / BK * d * ldt), ldt)
                            .to(dp.as_mut_ptr(), ldt);
                        tile::gemm_maybe_trimmed(level, g, trim, logits);
                    }
                    for r in 0..rows {
                        let i = i0 + r;
                        let vis = p.visible(i).saturating_sub(j0).min(n);
                        let pr = &mut pm[r * ldt..][..n];
                        let dpr = &mut dp[r * ldt..][..n];
                        if vis == 0 || lse_h[i] == f32::NEG_INFINITY {
                            pr.fill(0.0);
                            dpr.fill(0.0);
                            continue;
                        }
                        let qar = if qa.is_empty() {
                            &qa[..]
                        } else {
                            &qa[i * nv..][..nv]
                        };
                        let li = lse_h[i];
                        if let Some((ptr, at)) = kept {
                            // The forward's logits, biases added.
                            let s = unsafe {
                                std::slice::from_raw_parts(ptr.0.add(at.at(bh, i, j0)), vis)
                            };
                            for (v, s) in pr[..vis].iter_mut().zip(s) {
                                *v = tile::exp(*s - li);
                            }
                        } else {
                            p.add_bias(b, h, i, j0, &mut pr[..vis], qar);
                            for v in pr[..vis].iter_mut() {
                                *v = tile::exp(*v - li);
                            }
                        }
                        pr[vis..].fill(0.0);
                        let qp = p.q_pos.at(b, i, tq);
                        if let (Some(vt_), false) = (p.vector, doa.is_empty()) {
                            let dar = &doa[i * nv..][..nv];
                            let w = &mut wv[i * nv..][..nv];
                            for c in 0..vis {
                                let idx = vt_.index.get(p.k_pos.at(b, j0 + c, tk) - qp);
                                dpr[c] += dar[idx];
                                w[idx] += pr[c];
                            }
                        }
                        // dS = P ∘ (dP − D_i), in place of dP (zeros where
                        // P is: dP may not be computed there).
                        let di = dvec[i];
                        for (dv_, pv) in dpr[..vis].iter_mut().zip(pr.iter()) {
                            *dv_ = pv * (*dv_ - di);
                        }
                        dpr[vis..].fill(0.0);
                        let dsr = &dpr[..vis];
                        if let (Some(t), true) = (p.scalar, want.0) {
                            for (c, v) in dsr.iter().enumerate() {
                                let idx = t.index.get(p.k_pos.at(b, j0 + c, tk) - qp);
                                part.scalar[idx * dm.q_heads + h] += v;
                            }
                        }
                        if let (Some(vt_), false) = (p.vector, wk.is_empty()) {
                            let w = &mut wk[i * nv..][..nv];
                            for (c, v) in dsr.iter().enumerate() {
                                w[vt_.index.get(p.k_pos.at(b, j0 + c, tk) - qp)] += v;
                            }
                        }
                        if let Some(ptr) = ptrs.dense {
                            let base = ((bh * tq) + i) * tk + j0;
                            for (c, v) in dpr.iter().enumerate() {
                                unsafe { *ptr.0.add(base + c) = *v };
                            }
                        }
                        if let Some(ptr) = ptrs.cq {
                            unsafe { *ptr.0.add(bh * tq + i) += tile::sum(dsr) };
                        }
                        if let Some(ptr) = ptrs.ck {
                            for (c, v) in dsr.iter().enumerate() {
                                unsafe { *ptr.0.add(bh * tk + j0 + c) -= v };
                            }
                        }
                    }
                    // dV and dK̃: a group of keys from the first row that
                    // sees it; dQ̃: a group of rows up to the keys it sees.
                    let by_keys = |c0, _| ([0, d], [first(c0), rows]);
                    let by_rows = |_, r1| ([0, d], [0, seen(r1)]);
                    unsafe {
                        // dV[j0..] += Pᵀ · dO[i0..]
                        let g = tile::Gemm::new(n, d, rows)
                            .a_t(pm.as_ptr(), ldt)
                            .b(dos.as_ptr().add(i0 * ldq), ldq)
                            .add_to(dv.as_mut_ptr().add(j0 * d), d);
                        tile::gemm_maybe_trimmed(level, g, trim, by_keys);
                        // dK̃[j0..] += dSᵀ · Q̃[i0..]
                        let g = tile::Gemm::new(n, d, rows)
                            .a_t(dp.as_ptr(), ldt)
                            .b(qs.as_ptr().add(i0 * ldq), ldq)
                            .add_to(dkr.as_mut_ptr().add(j0 * d), d);
                        tile::gemm_maybe_trimmed(level, g, trim, by_keys);
                        // dQ̃[i0..] += dS · K̃[j0..]
                        let g = tile::Gemm::new(rows, d, n)
                            .a(dp.as_ptr(), ldt)
                            .b(kr.as_ptr().add(j0 * ldr), ldr)
                            .add_to(dq_acc.add((i0 - dq_row0) * d), d);
                        tile::gemm_maybe_trimmed(level, g, trim, by_rows);
                    }
                }
                // Shaw's tables: dQ̃ += Wk·a^K, d a^K += Wkᵀ·Q̃, d a^V += Wvᵀ·dO.
                if let Some(ak) = keys {
                    unsafe {
                        let g = tile::Gemm::new(tq, d, nv)
                            .a(wk.as_ptr(), nv)
                            .b(ak.as_ptr(), d);
                        tile::gemm(level, g.add_to(dqs.as_mut_ptr(), d));
                        if want.1 {
                            let g = tile::Gemm::new(nv, d, tq)
                                .a_t(wk.as_ptr(), nv)
                                .b(qs.as_ptr(), ldq);
                            tile::gemm(level, g.add_to(part.keys.as_mut_ptr(), d));
                        }
                    }
                }
                if values.is_some() && want.2 {
                    unsafe {
                        let g = tile::Gemm::new(nv, d, tq)
                            .a_t(wv.as_ptr(), nv)
                            .b(d_o.as_ptr().add(do0), do_rows.st);
                        tile::gemm(level, g.add_to(part.values.as_mut_ptr(), d))
                    };
                }
                if chunk.partial.is_some() {
                    // Added over the runs, then rotated, by `backward`.
                    continue;
                }
                // dq = scale·Rᵀ·dQ̃.
                for t in 0..tq {
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(ptrs.dq.0.add(g.dq_rows.at(b, h, t)), d)
                    };
                    p.rotate(true, (b, t), &dqs[t * d..][..d], dst, true, p.scale);
                }
            }
            for t in k_lo..k_hi {
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(ptrs.dk.0.add(g.dk_rows.at(b, hk, t)), d)
                };
                p.rotate(false, (b, t), &dkr[t * d..][..d], dst, true, 1.0);
                let dvd = unsafe {
                    std::slice::from_raw_parts_mut(ptrs.dv.0.add(g.dv_rows.at(b, hk, t)), d)
                };
                dvd.copy_from_slice(&dv[t * d..][..d]);
            }
        }
    }
    part
}
