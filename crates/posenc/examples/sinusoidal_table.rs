//! The sinusoidal encoding of Vaswani et al. 2017 ("Attention Is All You
//! Need", §3.5): the first 32 positions × 16 dimensions, and the linear map
//! `M_k` with `PE(p + k) = M_k · PE(p)` for every `p`.
//!
//! ```sh
//! cargo run -p posenc --example sinusoidal_table
//! ```

use posenc::absolute::Sinusoidal;
use posenc::analysis::mat_vec;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pe = Sinusoidal::new(16)?;
    let table = pe.table_range(0, 32)?;
    println!(
        "PE(pos, i), 32 positions × 16 dimensions (base {}):",
        pe.base()
    );
    for (pos, row) in table.iter().enumerate() {
        let cells: Vec<String> = row.iter().map(|v| format!("{v:+.2}")).collect();
        println!("{pos:>3}  {}", cells.join(" "));
    }
    // the relative-position property: one fixed matrix per offset k
    let k = 5;
    let m = pe.linear_map(k)?;
    let worst = (0..27)
        .map(|p| {
            let moved = mat_vec(&m, &table[p]);
            moved
                .iter()
                .zip(&table[p + k as usize])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max)
        })
        .fold(0.0, f64::max);
    println!("PE(p + {k}) = M_{k} · PE(p) for p in 0..27: largest difference {worst:.1e}");
    if worst > 1e-12 {
        return Err(format!("M_k does not move PE(p) to PE(p + k): {worst}").into());
    }
    Ok(())
}
