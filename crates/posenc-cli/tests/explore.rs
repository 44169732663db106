//! `posenc explore` as a user runs it: the URL is the first line on stdout,
//! the server answers over TCP, its `/api/inspect` equals `posenc rope
//! inspect --json` on every real config of the test suite, and it stays up
//! after bad requests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns `cmd` with its standard output piped and its standard error to
/// `stderr`, and reads the first line of its output (the URL).
fn spawn_first_line(cmd: &mut Command, stderr: Stdio) -> (Child, String) {
    let mut child = cmd.stdout(Stdio::piped()).stderr(stderr).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

fn start() -> Server {
    let (child, line) = spawn_first_line(
        Command::new(env!("CARGO_BIN_EXE_posenc")).args(["explore", "--port", "0"]),
        Stdio::null(),
    );
    let url = line.trim();
    let addr = url
        .strip_prefix("http://")
        .and_then(|s| s.strip_suffix('/'))
        .unwrap_or_else(|| panic!("first line is not the URL: {line:?}"))
        .to_string();
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    Server { child, addr }
}

/// One HTTP/1.1 request; the status and the body.
fn http(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("no end of headers");
    let head = String::from_utf8_lossy(&resp[..split]).to_string();
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, resp[split + 4..].to_vec())
}

fn configs() -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../posenc/tests/fixtures");
    let mut out = Vec::new();
    for sub in ["checkpoints", "models"] {
        for e in std::fs::read_dir(root.join(sub)).unwrap() {
            let p = e.unwrap().path();
            if p.to_string_lossy().ends_with(".config.json") {
                out.push(p);
            }
        }
    }
    out.sort();
    assert!(out.len() >= 20);
    out
}

#[test]
fn the_api_answers_as_posenc_rope_inspect_json() {
    let server = start();
    for path in configs() {
        let cli = Command::new(env!("CARGO_BIN_EXE_posenc"))
            .args(["rope", "inspect", "--json", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(cli.status.success(), "{}", path.display());
        let want: Value = serde_json::from_slice(&cli.stdout).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let body = json!({"config": text}).to_string();
        let (status, got) = http(&server.addr, "POST", "/api/inspect", body.as_bytes());
        assert_eq!(status, 200, "{}", path.display());
        let got: Value = serde_json::from_slice(&got).unwrap();
        assert_eq!(got, want, "{}", path.display());
    }
}

#[test]
fn the_server_stays_up_after_bad_requests() {
    let server = start();
    let (s, b) = http(
        &server.addr,
        "POST",
        "/api/model",
        b"{\"config\": \"{oops\"}",
    );
    assert_eq!(s, 422);
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert!(v["error"].as_str().unwrap().contains("JSON"), "{v}");
    let big = vec![b'x'; 2 << 20];
    for (method, path, body, want) in [
        ("POST", "/api/model", &big[..], 413),
        ("GET", "/api/sinusoidal?positions=99999999", &b""[..], 422),
    ] {
        let (s, _) = http(&server.addr, method, path, body);
        assert_eq!(s, want, "{method} {path}");
    }
    let (s, b) = http(&server.addr, "GET", "/", b"");
    assert_eq!(s, 200);
    assert!(String::from_utf8_lossy(&b).contains("posenc explore"));
}

#[test]
fn a_port_in_use_is_one_line_and_exit_2() {
    let server = start();
    let port = server.addr.rsplit(':').next().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_posenc"))
        .args(["explore", "--port", port])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
}

#[test]
fn open_without_a_browser_only_logs() {
    let (mut child, url) = spawn_first_line(
        Command::new(env!("CARGO_BIN_EXE_posenc"))
            .args(["explore", "--port", "0", "--open"])
            .env("PATH", "/nonexistent"),
        Stdio::piped(),
    );
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    for _ in 0..2 {
        err.read_line(&mut log).unwrap();
    }
    // still serving
    let addr = url
        .trim()
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let (status, _) = http(addr, "GET", "/api/configs", b"");
    let _ = child.kill();
    let _ = child.wait();
    assert!(log.contains("could not open a browser"), "{log}");
    assert_eq!(status, 200);
}
