//! posenc-tune's integration tests, one binary (one link instead of one per
//! file): each file below is a module, its tests named `file::test`
//! (`cargo test -p posenc-tune --test integration grads::`).

mod common;

mod grads;
mod hostile_adapters;
mod peft;
mod pose;
mod train;
