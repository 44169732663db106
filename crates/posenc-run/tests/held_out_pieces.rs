//! `--held-out` read in pieces gives the window of the whole text's
//! tokenization, on the real model's tokenizer and the novel (pieces of
//! 4 KiB, so that hundreds of cuts are made).

use std::path::Path;

use posenc_run::{OpenOptions, Session};

#[test]
fn pieces_give_the_whole_texts_held_out_window() {
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.is_file() {
        if std::env::var("POSENC_REQUIRE_MODEL").is_ok_and(|v| v == "1") {
            panic!("no model at {}", model.display());
        }
        eprintln!("pieces_give_the_whole_texts_held_out_window: SKIPPED: no model");
        return;
    }
    let mut s = Session::open(&model, &OpenOptions::default()).unwrap();
    let tk = s.read_tokenizer().unwrap();
    let text = posenc_run::PRIDE_AND_PREJUDICE;
    let path = std::env::temp_dir().join(format!("posenc-run-held-{}.txt", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let whole = tk.encode(text).unwrap();
    let tail = posenc_tune::data::held_out_tokens(&whole);
    for (length, piece) in [(512, 4096), (2048, 1 << 16), (tail.len(), 4096)] {
        let w = posenc_run::text::held_out_window(&path, tk, length, piece)
            .unwrap()
            .expect("the GGUF tokenizer's pieces join");
        assert_eq!(
            w,
            tail[..length],
            "length {length}, pieces of {piece} bytes"
        );
    }
    let e = posenc_run::text::held_out_window(&path, tk, tail.len() + 1, 4096).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("--held-out: the text's last 10% is"),
        "{e}"
    );
    let _ = std::fs::remove_file(&path);
}
