//! What the lab's training loop (posenc-lab) and the fine-tuner's
//! (posenc-tune) share: the line each writes to `metrics.jsonl`, the run's
//! clock (throughput and time left), the progress line on stderr, and the
//! check that an output directory is not the input's.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// One line of a training run's `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Steps completed.
    pub step: usize,
    /// Training loss: the lab's mean over the scored tokens of its logging
    /// window's steps; the fine-tuner's step's loss (the mean over its
    /// windows of each window's mean next-token loss).
    pub loss: f64,
    /// Exact-match accuracy of the lab's batches over the same steps
    /// (`None` for fine-tuning, which has no exact answer; then not
    /// written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Learning rate used.
    pub lr: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Training tokens per second since the run (or its resumption)
    /// started.
    pub tokens_per_s: f64,
    /// Seconds since the run (or its resumption) started.
    pub elapsed_s: f64,
}

impl Metrics {
    /// Appends this line, as JSON, and a newline to `text`.
    pub fn push_line(&self, text: &mut String) {
        text.push_str(&serde_json::to_string(self).expect("serialisable"));
        text.push('\n');
    }
}

/// The clock of a training run from its first step (or its resumption) at
/// `start_step` to `steps`, with `tokens_per_step` training tokens a step.
#[derive(Debug, Clone, Copy)]
pub struct RunClock {
    start: Instant,
    start_step: usize,
    steps: usize,
    tokens_per_step: f64,
}

impl RunClock {
    /// A clock started now.
    pub fn start(start_step: usize, steps: usize, tokens_per_step: f64) -> RunClock {
        RunClock {
            start: Instant::now(),
            start_step,
            steps,
            tokens_per_step,
        }
    }

    /// Seconds since the start.
    pub fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Training tokens per second when `done` steps are done after
    /// `seconds`.
    pub fn tokens_per_s(&self, done: usize, seconds: f64) -> f64 {
        self.tokens_per_step * (done - self.start_step) as f64 / seconds.max(1e-9)
    }

    /// Seconds left when `done` steps are done after `seconds`, at the pace
    /// so far.
    pub fn eta(&self, done: usize, seconds: f64) -> f64 {
        (self.steps - done) as f64 * seconds / (done - self.start_step) as f64
    }
}

/// `[#####.....] step 12/100 {middle} ETA 0:31`: a bar of 24 columns, the
/// step, the loop's own figures, the time left.
pub fn progress_line(step: usize, total: usize, middle: &str, eta_s: f64) -> String {
    let width = 24;
    let filled = (width * step) / total.max(1);
    let eta = eta_s.max(0.0).round() as u64;
    format!(
        "[{}{}] step {step}/{total} {middle} ETA {}:{:02}",
        "#".repeat(filled),
        ".".repeat(width - filled),
        eta / 60,
        eta % 60
    )
}

/// Prints a progress line on stderr: rewritten in place on a terminal
/// (`tty`), one line each otherwise.
pub fn show_progress(line: &str, tty: bool) {
    if tty {
        eprint!("\r{line}");
        let _ = std::io::stderr().flush();
    } else {
        eprintln!("{line}");
    }
}

/// Whether two paths name the same directory (compared as given when
/// either does not exist yet): a run refuses to write its output into the
/// directory it reads its base from.
pub fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a.components().eq(b.components()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_paths() {
        assert_eq!(
            progress_line(6, 24, "loss 1.0000", 75.4),
            "[######..................] step 6/24 loss 1.0000 ETA 1:15"
        );
        let mut text = String::new();
        let mut m = Metrics {
            step: 3,
            loss: 0.5,
            accuracy: None,
            lr: 1e-3,
            grad_norm: 2.0,
            tokens_per_s: 10.0,
            elapsed_s: 1.5,
        };
        m.push_line(&mut text);
        m.accuracy = Some(0.25);
        m.push_line(&mut text);
        assert_eq!(
            text,
            "{\"step\":3,\"loss\":0.5,\"lr\":0.001,\"grad_norm\":2.0,\"tokens_per_s\":10.0,\"elapsed_s\":1.5}\n\
             {\"step\":3,\"loss\":0.5,\"accuracy\":0.25,\"lr\":0.001,\"grad_norm\":2.0,\"tokens_per_s\":10.0,\"elapsed_s\":1.5}\n"
        );
        let back: Vec<Metrics> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(back[1], m);
        assert_eq!(back[0].accuracy, None);
        let tmp = tempfile::Builder::new()
            .prefix("posenc-nn-train-")
            .tempdir()
            .unwrap();
        let d = tmp.path();
        assert!(same_dir(d, &d.join(".")));
        assert!(!same_dir(d, &d.join("posenc-no-such-dir")));
        assert!(same_dir(Path::new("a/b"), Path::new("a/./b")));
    }
}
