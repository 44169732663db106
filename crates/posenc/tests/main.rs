//! posenc's integration tests, one binary (one link instead of one per
//! file): each file below is a module, its tests named `file::test`
//! (`cargo test -p posenc --test integration rope_fuzz::`). The helpers
//! the files share are the first four modules.

mod common;
mod config_fuzz;
mod learned_common;
mod rope_common;

mod alibi;
mod attention;
mod cope;
mod extend;
mod fire;
mod floater;
mod forgetting;
mod kernels;
mod learned;
mod rope_class_defaults;
mod rope_errors;
mod rope_fuzz;
mod rope_hf_parity;
mod rope_models;
mod rope_multiaxis;
mod rope_precision;
mod rope_properties;
mod shaw;
mod sinusoidal;
mod t5;
mod tensor_absolute;
mod tensor_axial;
mod tensor_bias;
mod tensor_rope;
mod tensor_rope_config;
