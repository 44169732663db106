//! `posenc bench rope [--json] [--quick]`: the RoPE benchmark
//! (`posenc::kernels::bench`), printed as a table or as JSON.

use posenc::kernels::bench::{rope_bench, BenchOptions};

const USAGE: &str = "usage: posenc bench rope [--json] [--quick]";

/// Runs `posenc bench ARGS...` (ARGS without the `bench` word); returns the
/// process exit code.
pub fn run(args: &[String]) -> i32 {
    let mut json = false;
    let mut quick = false;
    let mut what = None;
    for a in args {
        match a.as_str() {
            "--json" => json = true,
            "--quick" => quick = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return 0;
            }
            w if what.is_none() && !w.starts_with('-') => what = Some(w.to_owned()),
            other => {
                eprintln!("posenc bench: unexpected argument {other:?}\n{USAGE}");
                return 2;
            }
        }
    }
    if what.as_deref() != Some("rope") {
        eprintln!("posenc bench: what to benchmark? (rope)\n{USAGE}");
        return 2;
    }
    match rope_bench(BenchOptions { quick }) {
        Ok(report) => {
            if json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("posenc bench: {e}");
                        return 1;
                    }
                }
            } else {
                print!("{}", report.to_text());
            }
            0
        }
        Err(e) => {
            eprintln!("posenc bench: {e}");
            1
        }
    }
}
