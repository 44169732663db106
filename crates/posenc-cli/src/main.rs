//! `posenc`: the command-line tool.

fn main() {
    std::process::exit(0);
}
