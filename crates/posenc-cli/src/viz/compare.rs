//! `posenc compare`.
use clap::Args;
/// Arguments of `posenc compare`.
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// First encoding.
    pub a: String,
    /// Second encoding.
    pub b: String,
}
/// Runs `posenc compare`.
pub fn compare(_a: CompareArgs) -> Result<(), String> {
    Err("not yet".into())
}
