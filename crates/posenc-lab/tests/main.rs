//! posenc-lab's integration tests, one binary (one link instead of one per
//! file): each file below is a module, its tests named `file::test`
//! (`cargo test -p posenc-lab --test integration bpe::`).

mod common;

mod bpe;
mod eval;
mod finetune;
mod fused;
mod lab;
mod mlm;
