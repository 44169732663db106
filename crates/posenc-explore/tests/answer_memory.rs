//! The heaviest bias requests the explorer serves, measured in this process
//! alone (one test in this binary, so the peak resident set is the
//! server's): each answer at most 50 MB, the peak under 200 MB with three at
//! once. Before the heads × points bound, 4096 heads at 4096 distances
//! built 325 MB of JSON and three at once took 2.28 GB (issue 28).

mod common;

use common::{get, start};
use posenc_explore::views::{MAX_BIAS_VALUES, MAX_HEADS};
use posenc_explore::Limits;

/// A `/proc/self/status` field in kB (`VmHWM`: the peak resident set).
fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heaviest_bias_answers_are_bounded_in_size_and_memory() {
    let addr = start(Limits::default()).await;
    // the most heads at the most distances the bound allows
    let points = MAX_BIAS_VALUES / MAX_HEADS;
    let uri = format!("/api/bias/alibi?heads={MAX_HEADS}&max_distance=100000&points={points}");
    let a = get(addr, &uri).await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    let v = a.json();
    assert_eq!(v["bias"].as_array().unwrap().len(), MAX_HEADS);
    assert_eq!(v["bias"][0].as_array().unwrap().len(), points);
    let size = a.body.len();
    assert!(size <= 50_000_000, "{size} bytes");
    drop((a, v));
    // the request of issue 28 (at the default 64 distances: 65 points)
    let a = get(addr, "/api/bias/alibi?heads=4096&points=4096").await;
    assert_eq!(a.status, 200);
    assert!(a.body.len() <= 50_000_000, "{} bytes", a.body.len());
    eprintln!("heads=4096&points=4096: {} bytes", a.body.len());
    drop(a);
    // three heaviest at once, and one past the bound beside them
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let uri = uri.clone();
            tokio::spawn(async move { get(addr, &uri).await })
        })
        .collect();
    let over = get(
        addr,
        "/api/bias/alibi?heads=4096&max_distance=100000&points=4096",
    )
    .await;
    assert_eq!(over.status, 422);
    assert!(over.error().contains("heads × points"));
    for t in tasks {
        let a = t.await.unwrap();
        assert_eq!(a.status, 200);
        assert!(a.body.len() <= 50_000_000);
    }
    let peak_mb = status_kb("VmHWM") / 1024;
    eprintln!("answer {size} bytes; peak resident set {peak_mb} MB");
    // the client's copies of the answers are in this process too
    assert!(peak_mb < 200, "peak resident set {peak_mb} MB");
}
