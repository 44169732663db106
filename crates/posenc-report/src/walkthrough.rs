//! The introductory articles' own walk-through, at the top of the report: tokens,
//! embeddings, the encodings added to them, the 32×16 picture, the binary
//! analogy and the four-number example.

use posenc::absolute::sinusoidal::Sinusoidal;
use posenc::analysis::{self, SplitMix64};
use posenc_viz::sources::{GENAI, INTRO_RU, NOPE_ROPE_RU};

use super::experiments::{f4, ExpOutput, Table};
use super::figures::{Fig, FigSpec, HeatSpec, LineSpec};
use crate::Result;

/// The Russian introductory article's picture: the sinusoidal table of 32 positions in 16
/// dimensions (rows are positions).
fn seed_table() -> Result<Vec<Vec<f64>>> {
    Ok(Sinusoidal::new(16)?.table_range(0, 32)?)
}

/// The bits of positions 0..32, least significant first (5 bits).
fn seed_bits() -> Vec<Vec<f64>> {
    (0..32usize)
        .map(|p| (0..5).map(|k| ((p >> k) & 1) as f64).collect())
        .collect()
}

fn table(data: &[Vec<f64>], labels: &[String]) -> Vec<Vec<String>> {
    data.iter()
        .zip(labels)
        .map(|(r, l)| {
            let mut v = vec![l.clone()];
            v.extend(
                r.iter()
                    .map(|x| format!("{:.2}", if x.abs() < 5e-3 { 0.0 } else { *x })),
            );
            v
        })
        .collect()
}

/// The walk-through section (no claims).
pub fn build_section() -> Result<ExpOutput> {
    let mut o = ExpOutput::new(0, "Walk-through: what a positional encoding is");
    let words = ["the", "mother", "loves", "the", "daughter"];
    let d = 8;
    let mut vocab: Vec<&str> = Vec::new();
    for w in words {
        if !vocab.contains(&w) {
            vocab.push(w);
        }
    }
    let mut rng = SplitMix64::new(2024);
    let emb: Vec<Vec<f64>> = vocab
        .iter()
        .map(|_| (0..d).map(|_| 0.5 * rng.normal()).collect())
        .collect();
    let tok: Vec<Vec<f64>> = words
        .iter()
        .map(|w| emb[vocab.iter().position(|v| v == w).unwrap_or(0)].clone())
        .collect();
    let pe_enc = Sinusoidal::new(d)?;
    let pe = pe_enc.table_range(0, words.len())?;
    let sum: Vec<Vec<f64>> = tok
        .iter()
        .zip(&pe)
        .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x + y).collect())
        .collect();
    let labels: Vec<String> = words
        .iter()
        .enumerate()
        .map(|(i, w)| format!("{i}: {w}"))
        .collect();
    let cos_tok = analysis::cosine(&tok[0], &tok[3]);
    let cos_sum = analysis::cosine(&sum[0], &sum[3]);
    o.text = format!(
        "**1. Tokens.** The sentence *the mother loves the daughter* is split into tokens: \
         {}.\n\n**2. Token embeddings.** Each token id looks up a vector (here {d} random numbers \
         per token); both *the*s get the same vector, so attention — which only compares \
         vectors — cannot tell them, or the sentence and *the daughter loves the mother*, apart. \
        \n\n**3. Add the positions ({GENAI}).** The sinusoidal encoding PE(p) is added to the \
         token at position p: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / \
         10000^(2i/d)). The cosine similarity of the two *the*s drops from {} to {}.\n\n**4. The \
         picture ({INTRO_RU}).** The 32 × 16 table: each column a position, each row a \
         dimension; fast waves at the top, slow ones at the bottom.\n\n**5. The binary analogy.** \
         Counting in binary, the lowest bit flips every step and each higher bit half as often; \
         the sinusoid's dimensions do the same, smoothly.\n\n**6. Four numbers ({NOPE_ROPE_RU}).** With \
         d = 4 and pairs turning at 0.5 and 0.25 cycles per position, PE(p) = [sin(πp), \
         cos(πp), sin(πp/2), cos(πp/2)]: position 0 is [0, 1, 0, 1].",
        words
            .iter()
            .enumerate()
            .map(|(i, w)| format!(
                "`{w}`→id {}",
                vocab.iter().position(|v| v == w).unwrap_or(i)
            ))
            .collect::<Vec<_>>()
            .join(", "),
        f4(cos_tok),
        f4(cos_sum),
    );
    let hs = |title: &str, data: Vec<Vec<f64>>| HeatSpec {
        title: title.into(),
        data,
        x_label: "position (token)".into(),
        y_label: "dimension".into(),
        colorbar: "value".into(),
        rows_as_columns: true,
        diverging: true,
    };
    o.figures.push(Fig::new(
        "w1-embeddings-plus-pe.png",
        &format!("Token embeddings + positional encoding = the transformer's input ({GENAI}). Columns are the five tokens."),
        FigSpec::Panels {
            title: "the mother loves the daughter".into(),
            panels: vec![hs("token embeddings", tok.clone()), hs("+ sinusoidal PE", pe.clone()), hs("= input", sum.clone())],
        },
    ));
    let mut header = vec!["token".to_string()];
    header.extend((0..d).map(|i| format!("d{i}")));
    o.tables.push(Table {
        title: "Token embeddings".into(),
        header: header.clone(),
        rows: table(&tok, &labels),
    });
    o.tables.push(Table {
        title: "Positional encodings PE(p)".into(),
        header: header.clone(),
        rows: table(&pe, &labels),
    });
    o.tables.push(Table {
        title: "Their sum, the input of the first layer".into(),
        header,
        rows: table(&sum, &labels),
    });
    let seed = seed_table()?;
    o.figures.push(Fig::new(
        "w2-sinusoidal-32x16.png",
        &format!(
            "The sinusoidal encoding of 32 positions in 16 dimensions, as pictured in {INTRO_RU}."
        ),
        FigSpec::Heatmap(HeatSpec {
            title: "Sinusoidal encoding, 32 positions × 16 dimensions".into(),
            data: seed.clone(),
            x_label: "position".into(),
            y_label: "dimension".into(),
            colorbar: "PE".into(),
            rows_as_columns: true,
            diverging: true,
        }),
    ));
    o.figures.push(Fig::new(
        "w3-binary-analogy.png",
        "The binary-counter analogy: bits flip at halving rates, like the sinusoid's dimensions.",
        FigSpec::Binary {
            bits: seed_bits(),
            table: seed,
        },
    ));
    let four: Vec<Vec<f64>> = (0..8)
        .map(|p| {
            let (a, b) = (
                std::f64::consts::PI * p as f64,
                std::f64::consts::PI * p as f64 / 2.0,
            );
            vec![a.sin(), a.cos(), b.sin(), b.cos()]
        })
        .collect();
    o.tables.push(Table {
        title: format!("The four-number encoding of {NOPE_ROPE_RU}: pairs turning at 0.5 and 0.25 cycles per position"),
        header: vec![
            "position".into(),
            "sin πp".into(),
            "cos πp".into(),
            "sin πp/2".into(),
            "cos πp/2".into(),
        ],
        rows: table(&four, &(0..8).map(|p| p.to_string()).collect::<Vec<_>>()),
    });
    let offsets: Vec<u64> = (0..=64).collect();
    let mut series = Vec::new();
    for dim in [16usize, 64, 128] {
        let c = analysis::similarity_curve(&Sinusoidal::new(dim)?, 0, &offsets)?;
        series.push(LineSpec {
            name: format!("d = {dim}"),
            points: offsets
                .iter()
                .zip(&c.cosine)
                .map(|(&k, &v)| (k as f64, v))
                .collect(),
            markers: false,
        });
    }
    o.figures.push(Fig::new(
        "w4-similarity.png",
        "Similarity against distance: cosine of PE(0) and PE(k) for the sinusoidal encoding.",
        FigSpec::Line {
            title: "cos(PE(0), PE(k)) against distance k".into(),
            x_label: "distance k".into(),
            y_label: "cosine similarity".into(),
            series,
            log_y: false,
        },
    ));
    Ok(o)
}
