//! `posenc`: the command-line tool.

mod bench;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("bench") {
        std::process::exit(bench::run(&args[1..]));
    }
    std::process::exit(0);
}
