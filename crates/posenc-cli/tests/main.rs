//! The `posenc` binary's end-to-end tests, one binary (one link instead of
//! one per file): each file below is a module, its tests named
//! `file::test` (`cargo test -p posenc-cli --test integration memory_plan::`).
//! The helpers the files share come first; `hostile` and `model` are
//! posenc-models' test helpers (the hostile-file generator, the real
//! model's path).

mod common;
#[path = "../../posenc-models/tests/common/hostile.rs"]
mod hostile;
#[path = "../../posenc-models/tests/common/model.rs"]
mod model;

mod cli;
mod cli_config_defaults;
mod cli_rope_models;
mod crate_graph;
mod docs_commands;
mod explore;
mod finetune_model_cli;
mod hostile_files;
mod hostile_inputs;
mod lab_cli;
mod memory_plan;
mod models_cli;
mod passkey_cli;
mod report;
mod subword_cli;
mod viz_analyze;
mod viz_show;
