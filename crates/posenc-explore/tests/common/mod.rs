//! A server on a free loopback port and a raw HTTP/1.1 client, so that the
//! tests send exactly the bytes a browser, a rebinding page or a slow
//! client would.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use posenc_explore::{serve_with, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Starts the explorer with `limits` on 127.0.0.1, a free port.
pub async fn start(limits: Limits) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_with(listener, limits));
    addr
}

/// An answer: status, headers (lower-case names), body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "answer is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The one-line error of an error answer.
    pub fn error(&self) -> String {
        let v = self.json();
        let m = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error in {v}"));
        assert!(!m.is_empty() && !m.contains('\n'), "{m:?}");
        m.to_string()
    }
}

/// Sends `head` (the request line and headers, without the blank line),
/// `Connection: close` and `body`, and reads the whole answer.
pub async fn send(addr: SocketAddr, head: &str, body: &[u8]) -> Answer {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{head}\r\nConnection: close\r\n");
    if !body.is_empty() {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut raw))
        .await
        .expect("no answer in 60 s")
        .unwrap();
    parse(&raw)
}

/// `GET path` with `Host: 127.0.0.1:port`.
pub async fn get(addr: SocketAddr, path: &str) -> Answer {
    send(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}", addr.port()),
        b"",
    )
    .await
}

pub fn parse(raw: &[u8]) -> Answer {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}
