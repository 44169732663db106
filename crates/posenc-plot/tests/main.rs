//! posenc-plot's integration tests, one binary (one link instead of one per
//! file): each file below is a module, its tests named `file::test`
//! (`cargo test -p posenc-plot --test integration figures::`).

mod common;

mod figures;
mod heatmap;
mod properties;
mod terminal;
