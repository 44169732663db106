//! Times a whole forward pass of a pretrained decoder with its plain
//! attention in blocks of 512 query rows (the default, where a pass can
//! stop) against one call per layer, alternating, best of each:
//! `cargo run --release -p posenc-models --example block_rows_time -- MODEL 4096 3`
//! (`MODEL` a GGUF file or a Hugging Face directory; synthetic token ids:
//! the time does not depend on the text).

use std::path::Path;
use std::time::Instant;

use posenc_models::perplexity::rope_of;
use posenc_models::{Scaling, DEFAULT_BLOCK_ROWS};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .map_or("models/SmolLM2-135M-Instruct.Q4_1.gguf", |s| s.as_str());
    let t: usize = args.get(1).map_or(Ok(4096), |s| s.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(3), |s| s.parse())?;
    let mut m = posenc_models::PretrainedModel::load(Path::new(path), None)?;
    let vocab = m.decoder.config().vocab_size as u64;
    let tokens: Vec<u32> = (0..t as u64)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect();
    let sc: Scaling = "none".parse()?;
    let rope = rope_of(sc.rope_config(m.decoder.config())?)?;
    let mut best = [f64::INFINITY; 2];
    let mut outs: [Vec<f32>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (i, rows) in [DEFAULT_BLOCK_ROWS, t].into_iter().enumerate() {
            m.decoder.set_block_rows(rows)?;
            let s = Instant::now();
            outs[i] = m.decoder.hidden_states(&tokens, &rope, None)?;
            best[i] = best[i].min(s.elapsed().as_secs_f64());
        }
    }
    let diff = outs[0]
        .iter()
        .zip(&outs[1])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!(
        "T={t}: blocks of {DEFAULT_BLOCK_ROWS}: {:.2} s, one call: {:.2} s (ratio {:.3}); max |difference| {diff:.2e}",
        best[0],
        best[1],
        best[0] / best[1]
    );
    Ok(())
}
