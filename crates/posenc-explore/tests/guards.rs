//! The served explorer's guards, over real TCP connections: only loopback
//! `Host` names, no cross-origin or cross-site requests, bounded answers and
//! concurrency, and timeouts for clients that send half a request.

mod common;

use std::time::{Duration, Instant};

use common::{get, send, start};
use posenc_explore::server::{is_own_authority, is_own_origin};
use posenc_explore::Limits;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[test]
fn loopback_names_and_ports() {
    for ok in [
        "localhost",
        "localhost:8017",
        "LOCALHOST:8017",
        "127.0.0.1",
        "127.0.0.1:8017",
        "[::1]",
        "[::1]:8017",
    ] {
        assert!(is_own_authority(ok, 8017, true), "{ok}");
    }
    for bad in [
        "attacker.example",
        "attacker.example:8017",
        "localhost:8018",
        "localhost:",
        "localhost.:8017",
        "127.0.0.2:8017",
        "0.0.0.0:8017",
        "[::1]8017",
        "[::2]:8017",
        "localhost:+8017",
        "localhost:08017x",
        "",
    ] {
        assert!(!is_own_authority(bad, 8017, true), "{bad}");
    }
    assert!(!is_own_authority("localhost", 8017, false));
    assert!(is_own_origin("http://127.0.0.1:8017", 8017));
    assert!(is_own_origin("http://localhost:8017", 8017));
    assert!(is_own_origin("http://[::1]:8017", 8017));
    for bad in [
        "null",
        "https://127.0.0.1:8017",
        "http://127.0.0.1:8018",
        "http://127.0.0.1",
        "http://attacker.example:8017",
        "http://localhost:8017/path",
    ] {
        assert!(!is_own_origin(bad, 8017), "{bad}");
    }
    assert!(is_own_origin("http://localhost", 80));
}

#[tokio::test]
async fn only_loopback_hosts_are_served() {
    let addr = start(Limits::default()).await;
    let port = addr.port();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "localhost".to_string(),
    ] {
        let a = send(addr, &format!("GET / HTTP/1.1\r\nHost: {host}"), b"").await;
        assert_eq!(a.status, 200, "Host: {host}");
        assert!(String::from_utf8_lossy(&a.body).contains("posenc explore"));
    }
    // a DNS-rebinding page names its own host; a wrong port, no Host, or an
    // absolute-form request to another host are refused alike
    for head in [
        "GET /api/configs HTTP/1.1\r\nHost: attacker.example".to_string(),
        format!("GET /api/configs HTTP/1.1\r\nHost: attacker.example:{port}"),
        format!(
            "GET /api/configs HTTP/1.1\r\nHost: localhost:{}",
            port.wrapping_add(1)
        ),
        format!("GET /api/configs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: attacker.example"),
        "GET /api/configs HTTP/1.0".to_string(),
        format!("GET http://attacker.example/api/configs HTTP/1.1\r\nHost: 127.0.0.1:{port}"),
    ] {
        let a = send(addr, &head, b"").await;
        assert!(
            a.status == 421 || a.status == 400,
            "{head:?} answered {}",
            a.status
        );
        if a.status == 421 {
            assert!(a.error().contains("localhost"));
        }
    }
}

#[tokio::test]
async fn cross_origin_and_cross_site_requests_are_refused() {
    let addr = start(Limits::default()).await;
    let port = addr.port();
    let config = json!({"config": {"hidden_size": 64, "num_attention_heads": 4}}).to_string();
    // what the page itself sends, from either loopback name
    for origin in [
        format!("http://127.0.0.1:{port}"),
        format!("http://localhost:{port}"),
    ] {
        let a = send(
            addr,
            &format!(
                "POST /api/inspect HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {origin}\r\nSec-Fetch-Site: same-origin\r\nContent-Type: application/json"
            ),
            config.as_bytes(),
        )
        .await;
        assert_eq!(
            a.status,
            200,
            "{origin}: {}",
            String::from_utf8_lossy(&a.body)
        );
        assert_eq!(a.json()["head_dim"], 16);
    }
    // a form or `fetch(..., {mode: "no-cors"})` from another page: a
    // text/plain POST needs no preflight, so the server itself must refuse it
    for extra in [
        "Origin: http://attacker.example\r\nContent-Type: text/plain".to_string(),
        "Origin: null\r\nContent-Type: text/plain".to_string(),
        format!(
            "Origin: http://127.0.0.1:{}\r\nContent-Type: text/plain",
            port.wrapping_add(1)
        ),
        format!("Origin: https://localhost:{port}\r\nContent-Type: application/json"),
        "Sec-Fetch-Site: cross-site\r\nContent-Type: text/plain".to_string(),
        "Sec-Fetch-Site: same-site\r\nContent-Type: text/plain".to_string(),
    ] {
        let a = send(
            addr,
            &format!("POST /api/inspect HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}"),
            config.as_bytes(),
        )
        .await;
        assert_eq!(a.status, 403, "{extra:?}");
        assert!(a.error().contains("refused"), "{extra:?}");
    }
    // a cross-site GET (an <img> or <script> tag) is refused too
    let a = send(
        addr,
        &format!(
            "GET /api/bias/alibi?heads=8 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nSec-Fetch-Site: cross-site"
        ),
        b"",
    )
    .await;
    assert_eq!(a.status, 403);
    // a navigation typed by the user
    let a = send(
        addr,
        &format!("GET / HTTP/1.1\r\nHost: localhost:{port}\r\nSec-Fetch-Site: none"),
        b"",
    )
    .await;
    assert_eq!(a.status, 200);
}

#[tokio::test]
async fn the_largest_bias_request_is_refused_in_one_line() {
    let addr = start(Limits::default()).await;
    let a = get(
        addr,
        "/api/bias/alibi?heads=4096&max_distance=100000&points=4096",
    )
    .await;
    assert_eq!(a.status, 422);
    let m = a.error();
    assert!(m.contains("heads × points"), "{m}");
    assert!(a.body.len() < 1000);
}

#[tokio::test]
async fn answers_past_the_bound_are_never_sent() {
    let addr = start(Limits {
        max_answer_bytes: 20_000,
        ..Limits::default()
    })
    .await;
    // a small view is served; a table of 256 × 64 values is not
    let a = get(addr, "/api/bias/alibi?heads=2&points=3").await;
    assert_eq!(a.status, 200);
    let a = get(addr, "/api/sinusoidal?positions=256&dim=64").await;
    assert_eq!(a.status, 422);
    assert!(a.error().contains("20000 bytes"));
    assert!(a.body.len() < 1000);
}

#[tokio::test]
async fn heavy_requests_past_the_concurrency_wait_get_503() {
    let addr = start(Limits {
        heavy_concurrency: 1,
        heavy_wait: Duration::ZERO,
        ..Limits::default()
    })
    .await;
    // eight large tables at once with one turn and no wait: the first takes
    // the turn, requests arriving while it computes are told to come back;
    // rounds until that overlap happens (it does in the first on any machine
    // seen so far)
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let tasks: Vec<_> = (0..8)
            .map(|_| tokio::spawn(get(addr, "/api/sinusoidal?positions=2048&dim=128")))
            .collect();
        for t in tasks {
            let a = t.await.unwrap();
            if a.status == 503 {
                assert!(a.error().contains("busy"));
            }
            statuses.push(a.status);
        }
        if statuses.contains(&503) {
            break;
        }
    }
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 503),
        "{statuses:?}"
    );
    assert!(
        statuses.contains(&200) && statuses.contains(&503),
        "{statuses:?}"
    );
    // the turn is given back: a lone request is served
    assert_eq!(get(addr, "/api/bias/alibi?heads=8").await.status, 200);
}

/// Reads until the server closes the connection; the time it took.
async fn closed_after(mut s: TcpStream) -> (Duration, Vec<u8>) {
    let t = Instant::now();
    let mut got = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut got)).await;
    assert!(r.is_ok(), "the connection is still open after 20 s");
    (t.elapsed(), got)
}

#[tokio::test]
async fn half_sent_requests_are_closed_within_the_timeouts() {
    let limits = Limits {
        header_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let addr = start(limits).await;
    let port = addr.port();
    // 30 clients that send part of the headers and stop, and 5 that send
    // nothing at all
    let mut conns = Vec::new();
    for i in 0..35 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        if i < 30 {
            s.write_all(format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ").as_bytes())
                .await
                .unwrap();
        }
        conns.push(tokio::spawn(closed_after(s)));
    }
    for c in conns {
        let (took, _) = c.await.unwrap();
        assert!(took < Duration::from_secs(5), "closed after {took:?}");
    }
    // a body announced and half sent: 408 once the request timeout passes,
    // then the connection is closed
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!(
            "POST /api/inspect HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"config\": "
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let (took, raw) = closed_after(s).await;
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(6),
        "{took:?}"
    );
    let a = common::parse(&raw);
    assert_eq!(a.status, 408);
    assert!(a.error().contains("within 2 s"));
    // and the server still answers
    assert_eq!(get(addr, "/api/configs").await.status, 200);
}

#[tokio::test]
async fn the_default_timeouts_are_at_most_30_seconds() {
    let l = Limits::default();
    assert!(l.header_timeout <= Duration::from_secs(30));
    assert!(l.request_timeout <= Duration::from_secs(30));
    assert!(l.max_answer_bytes <= 50_000_000);
    assert!(l.heavy_concurrency >= 2 && l.max_connections >= 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_view_at_its_caps_answers_at_most_50_mb() {
    use posenc_explore::views::{MAX_CURVE_POINTS, MAX_SHAW_K, MAX_SIN_VALUES, MAX_VIEW_DIM};
    let addr = start(Limits::default()).await;
    let span = (MAX_CURVE_POINTS * 16 / 2) as i64;
    for uri in [
        format!(
            "/api/sinusoidal?positions={}&dim=128&max_k={MAX_CURVE_POINTS}",
            MAX_SIN_VALUES / 128
        ),
        format!("/api/sinusoidal?positions=256&dim={MAX_VIEW_DIM}&max_k={MAX_CURVE_POINTS}&k=-3"),
        format!("/api/rope?dim={MAX_VIEW_DIM}&points={MAX_CURVE_POINTS}&max_distance=1000000000"),
        format!("/api/bias/t5?buckets=1048576&max_distance=10000000&lo=-{span}&hi={span}"),
        format!("/api/bias/shaw?max_relative={MAX_SHAW_K}&lo=-{span}&hi={span}"),
    ] {
        let a = get(addr, &uri).await;
        assert_eq!(a.status, 200, "{uri}: {}", String::from_utf8_lossy(&a.body));
        assert!(a.body.len() <= 50_000_000, "{uri}: {} bytes", a.body.len());
        eprintln!("{uri}: {} bytes", a.body.len());
    }
    // a model view with the most pairs a config may have, a scaling and a
    // target length (every pair's row)
    let pairs = posenc_explore::model::MAX_PAIRS;
    let config = json!({"config": {
        "hidden_size": 2 * pairs, "num_attention_heads": 1, "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    }, "target_len": 1u64 << 40})
    .to_string();
    let a = send(
        addr,
        &format!(
            "POST /api/model HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json",
            addr.port()
        ),
        config.as_bytes(),
    )
    .await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    assert!(
        a.body.len() <= 50_000_000,
        "/api/model: {} bytes",
        a.body.len()
    );
    eprintln!("/api/model with {pairs} pairs: {} bytes", a.body.len());
}
