//! Experiment 9: the training-free extension methods side by side on one
//! pretrained model: Self-Extend (Jin et al. 2024), ReRoPE and leaky ReRoPE
//! (Su 2023), dual chunk attention (An et al. 2024) and attention sinks
//! (Xiao et al. 2024), beside no scaling and static NTK-aware scaling, on
//! the same window of twice the trained length and the same passkey
//! prompts; each paper's claim as a rule.

use posenc_models::perplexity::{self, Study};
use posenc_models::{Scaling, Step};

use crate::claims::experiments as ce;
use crate::experiments::ExpOutput;
use crate::pretrained::{
    cached_run, comma_list, err, loss_figure, loss_table, losses_beyond, passkey_lengths,
    retrieval_table, run_retrieval, ModelRun, Opened,
};
use crate::Result;

/// The sources whose change reruns the experiment (see
/// [`ModelRun::cache_path`]).
const CODE: [&str; 4] = [
    include_str!("training_free.rs"),
    include_str!("pretrained.rs"),
    include_str!("../../posenc-viz/src/claims/experiments.rs"),
    include_str!("../../posenc-models/src/passkey/mod.rs"),
];

/// The experiment number.
pub const ID: usize = 9;

/// The experiment's title.
pub const TITLE: &str = "training-free methods side by side";

/// Positions per band of the loss tables for a model trained on `l`
/// tokens: L/8, at most 1,024 (experiment 8's bands), so that the paired
/// comparisons have eight bands past L.
fn band(l: usize) -> usize {
    (l / 8).clamp(1, 1024)
}

/// The settings of experiment 9 for a model trained on `l` tokens, in the
/// tables' order: no scaling; static NTK-aware scaling ×2 (ReRoPE's
/// comparison); Self-Extend with group 4 and a neighbour window of L/8;
/// ReRoPE and leaky ReRoPE (k 16) with w = L/4 (Su's w 1,024 at L 4,096);
/// dual chunk attention with ChunkLlama's defaults (chunk 3L/4, local
/// window L/8); 4 attention sinks with a cache of L/8.
pub fn methods(l: usize) -> Vec<String> {
    let w8 = ((l / 8).max(4) / 4) * 4;
    let w4 = (l / 4).max(1);
    let chunk = (3 * l / 4).max(2);
    let local = (l / 8).clamp(1, chunk - 1);
    vec![
        "none".into(),
        "ntk:2".into(),
        format!("self-extend:4:{w8}"),
        format!("rerope:{w4}"),
        format!("leaky-rerope:{w4}:16"),
        format!("dca:{chunk}:{local}"),
        format!("sinks:4:{}", (l / 8).max(5)),
    ]
}

/// The settings probed by retrieval: all but NTK-aware scaling (a RoPE
/// scaling, probed with the others in experiment 8's family; here it is
/// ReRoPE's loss comparison only).
fn retrieval_methods(l: usize) -> Vec<String> {
    methods(l).into_iter().filter(|m| m != "ntk:2").collect()
}

/// Experiment 9 on `model` over the first `2L` tokens of `text` and the
/// landmark passkey grid of experiment 8 (`passkey_trials` keys per length
/// and depth; trials shared with experiment 8 through the cache's trial
/// log). Cached under `cache` by model, text and code.
///
/// # Errors
/// A model that cannot be read or run, a text shorter than `2L` tokens, a
/// window that does not fit in memory.
pub fn experiment(run: &ModelRun) -> Result<ExpOutput> {
    let (model, text_name, preset) = (run.model, run.text_name, run.preset);
    let passkey_trials = run.passkey_trials;
    let Opened {
        files,
        cfg,
        tk,
        window,
        ..
    } = run.open(ID, 0)?;
    let l = cfg.trained_length();
    let t = 2 * l;
    let names = methods(l);
    let scalings: Vec<Scaling> = names
        .iter()
        .map(|n| n.parse())
        .collect::<posenc_models::Result<_>>()
        .map_err(err)?;
    let path = run.cache_path("training-free", &format!("{t} {passkey_trials}"), &CODE)?;
    let layers = cfg.num_layers;
    cached_run(&path, files, cfg, |decoder, source| {
        let n = names.len();
        let band = band(l);
        let study: Study =
            perplexity::study(&decoder, &source, &window, &scalings, band, |s, step| {
                if let Step::Done(li) = step {
                    eprint!(
                        "\rposenc report: experiment {ID}: {} ({}/{n}), layer {}/{layers}   ",
                        names[s],
                        s + 1,
                        li + 1
                    );
                }
            })
            .map_err(err)?;
        eprintln!();
        let found = run_retrieval(run, &decoder, &source, &tk, l, &retrieval_methods(l), ID)?;
        let run = |name: &str| study.runs.iter().find(|r| r.name == name);
        let beyond = |name: &str| run(name).map_or(Vec::new(), |r| losses_beyond(r, l));
        let mean_beyond = |name: &str| run(name).and_then(|r| r.mean_beyond).unwrap_or(f64::NAN);
        let at_l = run("none").and_then(|r| r.mean_inside).unwrap_or(f64::NAN);
        let [none, ntk, se, rerope, _leaky, dca, sinks] =
            [0, 1, 2, 3, 4, 5, 6].map(|i| names[i].as_str());
        let mut o = ExpOutput::new(ID, TITLE);
        o.figures.push(loss_figure(
        &study,
        "e9_training_free_loss.png",
        &format!("Loss per band of {band} positions over one window of 2L = {t} tokens of {text_name}, for each training-free method, zero-shot; the vertical segment marks the trained length L = {l}."),
    ));
        // Retrieval claims read the lengths past L.
        let lengths = passkey_lengths(l);
        let (l15, l2) = (lengths[3], lengths[4]);
        if let Some(r) = &found {
            let acc = |m: &str, len: usize| -> f64 {
                let (Some(mi), Some(li)) = (
                    r.methods.iter().position(|x| x == m),
                    r.lengths.iter().position(|&x| x == len),
                ) else {
                    return f64::NAN;
                };
                r.accuracy[mi][li]
            };
            o.push_claim(
                &ce::SELF_EXTEND_RETRIEVES,
                preset,
                &format!(
                    "greedy passkey accuracy ({} prompts per length)",
                    r.trials_per_length
                ),
                serde_json::json!({
                    format!("{se}, {l15}"): acc(se, l15),
                    format!("{se}, {l2}"): acc(se, l2),
                    format!("none, {l15}"): acc(none, l15),
                    format!("none, {l2}"): acc(none, l2),
                }),
                serde_json::json!(
                    "≈ 1.0 at every depth up to 4 × L (Llama-2-chat, Mistral; Fig. 3)"
                ),
                ce::self_extend_retrieves(
                    [acc(se, l15), acc(se, l2)],
                    [acc(none, l15), acc(none, l2)],
                ),
            );
        }
        o.push_claim(
            &ce::REROPE_AT_MOST_NTK,
            preset,
            "mean loss on L..2L (nats)",
            serde_json::json!({rerope: mean_beyond(rerope), ntk: mean_beyond(ntk)}),
            serde_json::json!("Llama-2 13B, loss at 8k (2L): ReRoPE w1024 1.43, NTK-RoPE 1.54"),
            ce::rerope_at_most_ntk(&beyond(rerope), &beyond(ntk)),
        );
        // The probe's control: no scaling retrieves inside L on this model.
        let control = found.as_ref().map_or(f64::NAN, |r| {
            let Some(mi) = r.methods.iter().position(|x| x == none) else {
                return f64::NAN;
            };
            let of: Vec<f64> = r
                .lengths
                .iter()
                .enumerate()
                .filter(|(_, &n)| n <= l)
                .map(|(li, _)| r.accuracy[mi][li])
                .collect();
            if of.is_empty() {
                f64::NAN
            } else {
                of.iter().sum::<f64>() / of.len() as f64
            }
        });
        let sinks_inside = run(sinks).map_or(f64::NAN, |r| {
            let a = (l / 8).min(r.loss.len());
            let b = l.min(r.loss.len());
            if a < b {
                r.loss[a..b].iter().sum::<f64>() / (b - a) as f64
            } else {
                f64::NAN
            }
        });
        let far = found.as_ref().map_or(f64::NAN, |r| {
            let Some(mi) = r.methods.iter().position(|x| x == sinks) else {
                return f64::NAN;
            };
            let mut v = Vec::new();
            for len in [l15, l2] {
                if let Some(li) = r.lengths.iter().position(|&x| x == len) {
                    for (di, &d) in crate::pretrained::PASSKEY_DEPTHS.iter().enumerate() {
                        if d <= 0.5 {
                            v.push(r.by_depth[mi][li][di]);
                        }
                    }
                }
            }
            if v.is_empty() {
                f64::NAN
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        });
        o.push_claim(
            &ce::SINKS_FLAT_NO_RETRIEVAL,
            preset,
            "mean loss (nats); greedy passkey accuracy",
            serde_json::json!({
                format!("{sinks}, loss on L..2L"): mean_beyond(sinks),
                format!("{sinks}, loss on L/8..L"): sinks_inside,
                format!("{sinks}, accuracy at 1.5L and 2L, depths 0 and 0.5"): far,
                "none, accuracy at lengths ≤ L (control)": control,
            }),
            serde_json::json!(
                "flat perplexity to 4M tokens (Fig. 3); context window not extended (FAQ)"
            ),
            ce::sinks_flat_no_retrieval(mean_beyond(sinks), sinks_inside, far, control),
        );
        o.push_claim(
            &ce::DCA_FLAT,
            preset,
            "mean loss (nats)",
            serde_json::json!({
                format!("{dca}, L..2L"): mean_beyond(dca),
                "none, L..2L": mean_beyond(none),
                "loss at L (no scaling, positions 0..L)": at_l,
            }),
            serde_json::json!("Llama 2 PG19 perplexity flat from 4k to 32k+ (Table 1)"),
            ce::dca_flat(&beyond(dca), &beyond(none), at_l),
        );
        o.tables.push(loss_table(
        &study,
        at_l,
        "no scaling's loss at L",
        format!("Loss (nats) per band of {band} positions, one window of {t} tokens (band A–B: mean over positions i in [A, B) of the loss of token i + 1)"),
    ));
        if let Some(r) = &found {
            o.tables.push(retrieval_table(
            r,
            "method",
            format!(
                "Passkey retrieval (landmark prompts, greedy exact match over depths {:?}, {} prompts per length; the last column: mean teacher-forced log-probability of the key's tokens at 2L); {:.0} s of trials",
                crate::pretrained::PASSKEY_DEPTHS,
                r.trials_per_length,
                r.seconds
            ),
        ));
        }
        o.text = format!(
        "Past its trained length a RoPE decoder can be extended without training in two ways: by scaling RoPE's frequencies (experiment 8), or by changing which positions the attention sees. This experiment runs the second kind on **{source}** (trained length L = {l}), each as its authors' code computes it (`posenc::extend`; parity with ports of that code in `scripts/methods/`): **Self-Extend** (Jin et al. 2024) keeps exact positions for the nearest L/8 keys and groups the farther ones by 4; **ReRoPE** (Su 2023) clips the relative distance at w = L/4, and **leaky ReRoPE** continues it with slope 1/16; **dual chunk attention** (An et al. 2024) maps positions within a chunk of 3L/4, to the previous chunk and to every earlier chunk so that none exceeds L; **attention sinks** (Xiao et al. 2024) keep the first 4 keys and the most recent ones, L/8 in all, numbered by cache slot. Beside them: no scaling, and static NTK-aware scaling ×2, the comparison of ReRoPE's own table.\n\n\
         One window: the first 2L = {t} tokens of {text_name}, the loss of every position, zero-shot; then experiment 8's landmark passkey grid (L/4 to 2L, depths 0, 0.5 and 1, {passkey_trials} key per cell, greedy) for every method. The trials of a method that experiment 8 also runs are shared with it.\n\n\
         Reproduce the losses with `posenc perplexity --model {} --length {t} --scaling {}` and the retrieval with `posenc passkey --model {} --lengths {} --depths 0,0.5,1 --trials {passkey_trials} --scaling {}`.",
        model.display(),
        names.join(","),
        model.display(),
        comma_list(&lengths),
        retrieval_methods(l).join(","),
    );
        Ok(o)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_follow_the_papers_defaults() {
        let m = methods(8192);
        assert_eq!(
            m,
            [
                "none",
                "ntk:2",
                "self-extend:4:1024",
                "rerope:2048",
                "leaky-rerope:2048:16",
                "dca:6144:1024",
                "sinks:4:1024"
            ]
        );
        // Every setting parses, also for a tiny model.
        for l in [64, 100, 8192] {
            for s in methods(l) {
                s.parse::<Scaling>()
                    .unwrap_or_else(|e| panic!("{s} at L = {l}: {e}"));
            }
        }
        assert!(!retrieval_methods(8192).contains(&"ntk:2".to_string()));
    }
}
