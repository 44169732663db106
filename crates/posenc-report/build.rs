//! Hashes the sources a trained run depends on (the library and the lab), so
//! that the report's caches are keyed by the code itself and a change to it
//! can never be answered from a stale cache.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let crates = manifest.parent().expect("crates/").to_path_buf();
    let mut files = Vec::new();
    for dir in ["posenc/src", "posenc-lab/src"] {
        let d = crates.join(dir);
        println!("cargo:rerun-if-changed={}", d.display());
        rust_files(&d, &mut files);
    }
    files.sort();
    // FNV-1a over (relative path, contents) of every file, in path order.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in &files {
        let rel = f.strip_prefix(&crates).unwrap_or(f);
        let bytes = std::fs::read(f).unwrap_or_default();
        for b in rel.to_string_lossy().as_bytes().iter().chain(&bytes) {
            h = (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    println!("cargo:rustc-env=POSENC_TRAINING_SOURCE_HASH={h:016x}");
}
