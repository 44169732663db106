//! `--held-out` read in pieces gives the window of the whole text's
//! tokenization, on the real model's tokenizer and the novel (pieces of
//! 4 KiB, so that hundreds of cuts are made).

#[path = "../../posenc-models/tests/common/model.rs"]
mod model;

use posenc_run::{OpenOptions, Session};

#[test]
fn pieces_give_the_whole_texts_held_out_window() {
    let Some(model) = model::model_path("pieces_give_the_whole_texts_held_out_window") else {
        return;
    };
    let mut s = Session::open(&model, &OpenOptions::default()).unwrap();
    let tk = s.read_tokenizer().unwrap();
    let text = posenc_run::PRIDE_AND_PREJUDICE;
    let dir = tempfile::Builder::new()
        .prefix("posenc-run-held-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("text.txt");
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
}
