//! `posenc analyze`.
use clap::Args;
/// Arguments of `posenc analyze`.
#[derive(Args, Debug, Clone)]
pub struct AnalyzeArgs {
    /// The encoding.
    pub encoding: String,
}
/// Runs `posenc analyze`.
pub fn analyze(_a: AnalyzeArgs) -> Result<(), String> {
    Err("not yet".into())
}
