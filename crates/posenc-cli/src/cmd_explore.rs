//! `posenc explore`: the interactive explorer, served on 127.0.0.1 behind
//! the guards of `posenc_explore::Limits` (loopback `Host` names only, no
//! cross-origin requests, bounded answers, header and request timeouts).

use std::io::Write;

use clap::Args;

use crate::{CliError, CliResult};

/// Arguments of `posenc explore`.
#[derive(Args, Debug)]
pub struct ExploreArgs {
    /// Port on 127.0.0.1 (0: a free port, printed).
    #[arg(long, default_value_t = 8017)]
    pub port: u16,
    /// Open the page in a browser (xdg-open or open); only logs if none can.
    #[arg(long)]
    pub open: bool,
}

/// Tries the desktop's opener; logs on stderr when none works.
fn open_browser(url: &str) {
    for opener in ["xdg-open", "open"] {
        let spawned = std::process::Command::new(opener)
            .arg(url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        if spawned.is_ok() {
            return;
        }
    }
    eprintln!(
        "posenc explore: could not open a browser (no xdg-open or open); open {url} yourself"
    );
}

/// Serves until the process is stopped. The URL is the first line on
/// stdout.
pub fn run(a: ExploreArgs) -> CliResult {
    let open = a.open;
    posenc_explore::run(a.port, |addr| {
        let url = format!("http://{addr}/");
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{url}");
        let _ = out.flush();
        eprintln!(
            "posenc explore: serving on {url} and http://localhost:{}/ only, to this machine's own pages (Ctrl-C stops)",
            addr.port()
        );
        if open {
            open_browser(&url);
        }
    })
    .map_err(|e| CliError(format!("cannot serve on 127.0.0.1:{}: {e}", a.port)))
}
