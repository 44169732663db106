//! The HTTP server: the embedded page and the JSON API.
//!
//! | route | what |
//! | --- | --- |
//! | `GET /` | the page (`/app.js`, `/style.css`) |
//! | `GET /api/configs`, `GET /api/configs/{name}` | the bundled real configs |
//! | `GET /api/sinusoidal?positions&dim&base&layout&offset&ref&max_k&k` | [`sinusoidal_view`] |
//! | `GET /api/rope?dim&base&position&context&max_distance&points` | [`rope_view`] |
//! | `POST /api/inspect` `{"config", "seq_len"}` | `posenc rope inspect --json` |
//! | `POST /api/model` `{"config", "seq_len", "target_len"}` | [`model_json`] |
//! | `GET /api/bias/alibi?heads&max_distance&points` | [`alibi_view`] |
//! | `GET /api/bias/t5?buckets&max_distance&bidirectional&lo&hi` | [`t5_view`] |
//! | `GET /api/bias/shaw?max_relative&lo&hi` | [`shaw_view`] |
//!
//! `config` is the text of a `config.json` (or the JSON object itself).
//! Errors are `{"error": "one line"}`: 400 for a request the API cannot
//! read, 413 for a body over [`MAX_BODY_BYTES`], 422 for the library's
//! error on a config or a parameter, 404 for an unknown route or config.
//!
//! # Guards
//!
//! [`serve`] answers through [`app`], which puts the guards of [`Limits`]
//! around the routes: a local server must not be reachable by a page the
//! user visits elsewhere (DNS rebinding, cross-site requests) nor exhaust
//! the machine.
//!
//! - Only loopback `Host` names are served (`localhost`, `127.0.0.1`,
//!   `[::1]`, with the bound port or none); any other gets 421.
//! - An `Origin` other than the server's own loopback origin, or a request a
//!   browser marks as coming from another site (`Sec-Fetch-Site` other than
//!   `same-origin` or `none`), gets 403, whatever its content type.
//! - Every answer is bounded: each view caps its sizes before computing, and
//!   a JSON answer over [`Limits::max_answer_bytes`] is never sent (422).
//! - The API routes run at most [`Limits::heavy_concurrency`] at once;
//!   others wait up to [`Limits::heavy_wait`], then get 503.
//! - Request headers must arrive within [`Limits::header_timeout`] and the
//!   whole request be handled within [`Limits::request_timeout`] (408, and
//!   the connection closed); at most [`Limits::max_connections`] are open.

use std::collections::HashMap;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, Request};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use posenc::absolute::sinusoidal::SinusoidalLayout;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::configs::{config, CONFIGS};
use crate::json::{inspect_json, SinusoidalParams};
use crate::model::{model_json, MAX_LENGTH};
use crate::views::{alibi_view, rope_view, shaw_view, sinusoidal_view, t5_view};

/// The largest request body accepted (1 MiB; real `config.json` files are a
/// few KiB).
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// The largest JSON answer sent by default (32 MiB; the views' own caps keep
/// every answer well below it, this is the last bound).
pub const MAX_ANSWER_BYTES: usize = 32 << 20;

/// The server's guards: timeouts, concurrency and the largest answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Time for a request's headers to arrive, from the connection's start
    /// or the previous answer (default 10 s).
    pub header_timeout: Duration,
    /// Time to read and answer a whole request, body included (default
    /// 30 s); 408 beyond, and the connection is closed.
    pub request_timeout: Duration,
    /// API requests computed at once (default 4).
    pub heavy_concurrency: usize,
    /// How long an API request waits for its turn before a 503 (default
    /// 10 s).
    pub heavy_wait: Duration,
    /// Connections open at once (default 64); further ones wait in the
    /// listener's queue.
    pub max_connections: usize,
    /// The largest JSON answer (default [`MAX_ANSWER_BYTES`]).
    pub max_answer_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            heavy_concurrency: 4,
            heavy_wait: Duration::from_secs(10),
            max_connections: 64,
            max_answer_bytes: MAX_ANSWER_BYTES,
        }
    }
}

/// An error answer: a status and one line.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }
}

impl From<posenc::Error> for ApiError {
    fn from(e: posenc::Error) -> Self {
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            message: e.to_string().replace('\n', " "),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        Self::bad_request(e.body_text())
    }
}

impl From<BytesRejection> for ApiError {
    fn from(e: BytesRejection) -> Self {
        Self {
            status: e.status(),
            message: e.body_text(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": self.message}))).into_response()
    }
}

/// A JSON answer: serialized into at most [`MAX_ANSWER_BYTES`] (an error
/// answer instead beyond), and at most [`Limits::max_answer_bytes`] by
/// [`app`]'s guard.
#[derive(Debug)]
pub struct Answer(pub Value);

/// A writer that refuses to grow past `max` bytes.
struct Bounded {
    buf: Vec<u8>,
    max: usize,
}

impl Write for Bounded {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > self.max {
            return Err(std::io::Error::other("answer too large"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `v` as JSON bytes, or the error answer when it would pass `max` bytes.
fn answer_bytes(v: &Value, max: usize) -> Result<Vec<u8>, ApiError> {
    let mut w = Bounded {
        buf: Vec::new(),
        max,
    };
    serde_json::to_writer(&mut w, v).map_err(|_| ApiError {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        message: format!(
            "the answer would be larger than {max} bytes: ask for fewer positions, heads or points"
        ),
    })?;
    Ok(w.buf)
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        match answer_bytes(&self.0, MAX_ANSWER_BYTES) {
            Ok(bytes) => (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                bytes,
            )
                .into_response(),
            Err(e) => e.into_response(),
        }
    }
}

type ApiResult = Result<Answer, ApiError>;
type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

/// The value of query parameter `key`, or `default`.
fn param<T: FromStr>(q: &HashMap<String, String>, key: &str, default: T) -> Result<T, ApiError> {
    match q.get(key).map(|s| s.trim()) {
        None | Some("") => Ok(default),
        Some(s) => s
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid value {s:?} for `{key}`"))),
    }
}

fn flag(q: &HashMap<String, String>, key: &str, default: bool) -> Result<bool, ApiError> {
    match q.get(key).map(|s| s.trim()) {
        None | Some("") => Ok(default),
        Some("1" | "true" | "yes") => Ok(true),
        Some("0" | "false" | "no") => Ok(false),
        Some(s) => Err(ApiError::bad_request(format!(
            "invalid value {s:?} for `{key}`: expected true or false"
        ))),
    }
}

async fn sinusoidal(gate: GateExt, q: Params) -> ApiResult {
    let Query(q) = q?;
    let layout = match q.get("layout").map(String::as_str) {
        None | Some("interleaved") => SinusoidalLayout::Interleaved,
        Some("concatenated") => SinusoidalLayout::Concatenated,
        Some(s) => {
            return Err(ApiError::bad_request(format!(
                "invalid layout {s:?}: expected interleaved or concatenated"
            )))
        }
    };
    let p = SinusoidalParams {
        positions: param(&q, "positions", 32)?,
        dim: param(&q, "dim", 16)?,
        layout,
        base: param(&q, "base", 10000.0)?,
        offset: param(&q, "offset", 0)?,
    };
    let (reference, max_k, k) = (
        param(&q, "ref", 0)?,
        param(&q, "max_k", 64)?,
        param(&q, "k", 1)?,
    );
    blocking(gate, move || Ok(sinusoidal_view(&p, reference, max_k, k)?)).await
}

async fn rope(gate: GateExt, q: Params) -> ApiResult {
    let Query(q) = q?;
    let (dim, base, position, context, max_distance, points) = (
        param(&q, "dim", 64)?,
        param(&q, "base", 10000.0)?,
        param(&q, "position", 100)?,
        param(&q, "context", 4096)?,
        param(&q, "max_distance", 256)?,
        param(&q, "points", 257)?,
    );
    blocking(gate, move || {
        Ok(rope_view(
            dim,
            base,
            position,
            context,
            max_distance,
            points,
        )?)
    })
    .await
}

async fn alibi(gate: GateExt, q: Params) -> ApiResult {
    let Query(q) = q?;
    let (heads, max_distance, points) = (
        param(&q, "heads", 8)?,
        param(&q, "max_distance", 64)?,
        param(&q, "points", 65)?,
    );
    blocking(gate, move || Ok(alibi_view(heads, max_distance, points)?)).await
}

async fn t5(gate: GateExt, q: Params) -> ApiResult {
    let Query(q) = q?;
    let (buckets, max_distance, bidirectional, lo, hi) = (
        param(&q, "buckets", 32)?,
        param(&q, "max_distance", 128)?,
        flag(&q, "bidirectional", true)?,
        param(&q, "lo", -160)?,
        param(&q, "hi", 160)?,
    );
    blocking(gate, move || {
        Ok(t5_view(buckets, max_distance, bidirectional, lo, hi)?)
    })
    .await
}

async fn shaw(gate: GateExt, q: Params) -> ApiResult {
    let Query(q) = q?;
    let (max_relative, lo, hi) = (
        param(&q, "max_relative", 16)?,
        param(&q, "lo", -64)?,
        param(&q, "hi", 64)?,
    );
    blocking(gate, move || Ok(shaw_view(max_relative, lo, hi)?)).await
}

/// A config request: the config's text and the lengths.
struct ConfigRequest {
    text: String,
    seq_len: Option<usize>,
    target_len: Option<usize>,
}

fn length(v: &Value, key: &str) -> Result<Option<usize>, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => {
            let n = x.as_u64().filter(|&n| n >= 1).ok_or_else(|| {
                ApiError::bad_request(format!("`{key}` must be a whole number ≥ 1"))
            })?;
            if n > MAX_LENGTH as u64 {
                return Err(posenc::Error::TooLarge {
                    what: "sequence length",
                    value: n,
                    max: MAX_LENGTH as u64,
                }
                .into());
            }
            Ok(Some(n as usize))
        }
    }
}

fn config_request(body: Result<Bytes, BytesRejection>) -> Result<ConfigRequest, ApiError> {
    let body = body?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the request is not JSON: {e}")))?;
    let text = match v.get("config") {
        Some(Value::String(s)) => s.clone(),
        Some(o @ Value::Object(_)) => o.to_string(),
        _ => {
            return Err(ApiError::bad_request(
                "the request needs `config`: the text of a config.json",
            ))
        }
    };
    Ok(ConfigRequest {
        text,
        seq_len: length(&v, "seq_len")?,
        target_len: length(&v, "target_len")?,
    })
}

/// The turn-taking of the API's computations: at most
/// [`Limits::heavy_concurrency`] at once, each waiting at most
/// [`Limits::heavy_wait`] for its turn. [`app`] hands it to the handlers
/// as a request extension; [`router`] alone has none (no limit).
#[derive(Debug, Clone)]
struct Gate {
    permits: Arc<Semaphore>,
    wait: Duration,
}

type GateExt = Option<Extension<Gate>>;

/// Runs `f` on the blocking pool once `gate` gives it a turn (503 after the
/// wait): the computation never stalls the server's own threads, its permit
/// is held until it ends (a request that timed out still holds its turn
/// while its computation finishes), and a panic (a bug) becomes a 500
/// answer, the server still up.
async fn blocking(
    gate: GateExt,
    f: impl FnOnce() -> Result<Value, ApiError> + Send + 'static,
) -> ApiResult {
    let permit = match gate {
        Some(Extension(g)) => match tokio::time::timeout(g.wait, g.permits.acquire_owned()).await {
            Ok(Ok(p)) => Some(p),
            _ => {
                return Err(ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    message: "the explorer is busy with other requests: try again".into(),
                })
            }
        },
        None => None,
    };
    let work = move || {
        let _turn = permit;
        f()
    };
    match tokio::task::spawn_blocking(work).await {
        Ok(r) => r.map(Answer),
        Err(e) => Err(ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("internal error: {e}"),
        }),
    }
}

async fn inspect(gate: GateExt, body: Result<Bytes, BytesRejection>) -> ApiResult {
    let r = config_request(body)?;
    blocking(gate, move || {
        let hf = posenc::rope::HfRopeConfig::from_json_str(&r.text)?;
        Ok(inspect_json(&hf, r.seq_len)?)
    })
    .await
}

async fn model(gate: GateExt, body: Result<Bytes, BytesRejection>) -> ApiResult {
    let r = config_request(body)?;
    blocking(gate, move || {
        Ok(model_json(&r.text, r.seq_len, r.target_len)?)
    })
    .await
}

async fn list_configs() -> Json<Value> {
    let list: Vec<Value> = CONFIGS
        .iter()
        .map(|(name, label, _)| json!({"name": name, "label": label}))
        .collect();
    Json(json!({"configs": list}))
}

async fn get_config(Path(name): Path<String>) -> Response {
    match config(&name) {
        Some(text) => ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        None => ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("no bundled config named {name:?}"),
        }
        .into_response(),
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such page or API route".into(),
    }
}

/// The explorer's routes (see [the module](self)), without the guards:
/// what [`app`] serves, for tests that call it directly.
pub fn router() -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", crate::assets::INDEX_HTML) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", crate::assets::APP_JS) }),
        )
        .route(
            "/style.css",
            get(|| async { asset("text/css; charset=utf-8", crate::assets::STYLE_CSS) }),
        )
        .route("/api/configs", get(list_configs))
        .route("/api/configs/{name}", get(get_config))
        .route("/api/sinusoidal", get(sinusoidal))
        .route("/api/rope", get(rope))
        .route("/api/inspect", post(inspect))
        .route("/api/model", post(model))
        .route("/api/bias/alibi", get(alibi))
        .route("/api/bias/t5", get(t5))
        .route("/api/bias/shaw", get(shaw))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

/// The loopback names the explorer answers to.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Whether `authority` (`name` or `name:port`, IPv6 in brackets) names this
/// server: a loopback name, and the bound `port` (or no port where
/// `no_port_ok`).
pub fn is_own_authority(authority: &str, port: u16, no_port_ok: bool) -> bool {
    let (name, given) = if authority.starts_with('[') {
        match authority.split_once(']') {
            Some((inner, "")) => (format!("{inner}]"), None),
            Some((inner, rest)) => match rest.strip_prefix(':') {
                Some(p) => (format!("{inner}]"), Some(p)),
                None => return false,
            },
            None => return false,
        }
    } else {
        match authority.rsplit_once(':') {
            Some((n, p)) => (n.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    let name_ok = LOOPBACK_NAMES.iter().any(|l| name.eq_ignore_ascii_case(l));
    let port_ok = match given {
        None => no_port_ok,
        Some(p) => !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.parse() == Ok(port),
    };
    name_ok && port_ok
}

/// Whether `origin` (an `Origin` header's value) is this server's own page:
/// `http://` and a loopback name with the bound port (none for port 80).
pub fn is_own_origin(origin: &str, port: u16) -> bool {
    let Some(scheme_end) = origin.find("://") else {
        return false;
    };
    let (scheme, authority) = (&origin[..scheme_end], &origin[scheme_end + 3..]);
    scheme.eq_ignore_ascii_case("http") && is_own_authority(authority, port, port == 80)
}

/// The guard's verdict on a request's headers: `None` to serve it, or the
/// refusal.
fn refusal(headers: &HeaderMap, uri: &axum::http::Uri, port: u16) -> Option<ApiError> {
    let refuse = |status, message: &str| {
        Some(ApiError {
            status,
            message: message.into(),
        })
    };
    // The host the client asked for (an absolute-form request line carries
    // its own): a rebinding page's requests name the attacker's host.
    let hosts: Vec<&str> = headers
        .get_all(header::HOST)
        .iter()
        .map(|h| h.to_str().unwrap_or("\u{0}"))
        .chain(uri.authority().map(|a| a.as_str()))
        .collect();
    if hosts.is_empty() || !hosts.iter().all(|h| is_own_authority(h.trim(), port, true)) {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "this explorer answers only to localhost, 127.0.0.1 and [::1]",
        );
    }
    for origin in headers.get_all(header::ORIGIN) {
        if !origin.to_str().is_ok_and(|o| is_own_origin(o.trim(), port)) {
            return refuse(
                StatusCode::FORBIDDEN,
                "cross-origin requests are refused: open the explorer's own page",
            );
        }
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.to_str(), Ok("same-origin" | "none")) {
            return refuse(
                StatusCode::FORBIDDEN,
                "cross-site requests are refused: open the explorer's own page",
            );
        }
    }
    None
}

/// The guards of [`app`] (see [the module](self)).
#[derive(Debug, Clone)]
struct Guard {
    port: u16,
    limits: Limits,
    gate: Gate,
}

async fn guard(
    axum::extract::State(g): axum::extract::State<Arc<Guard>>,
    mut req: Request,
    next: Next,
) -> Response {
    if let Some(e) = refusal(req.headers(), req.uri(), g.port) {
        return e.into_response();
    }
    req.extensions_mut().insert(g.gate.clone());
    let resp = match tokio::time::timeout(g.limits.request_timeout, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => {
            let mut resp = ApiError {
                status: StatusCode::REQUEST_TIMEOUT,
                message: format!(
                    "the request was not read and answered within {} s",
                    g.limits.request_timeout.as_secs_f64()
                ),
            }
            .into_response();
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return resp;
        }
    };
    // The last bound on an answer's size (the views' caps come first).
    let too_large = axum::body::HttpBody::size_hint(resp.body())
        .exact()
        .is_none_or(|n| n > g.limits.max_answer_bytes as u64);
    if too_large {
        return ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            message: format!(
                "the answer would be larger than {} bytes: ask for fewer positions, heads or points",
                g.limits.max_answer_bytes
            ),
        }
        .into_response();
    }
    resp
}

/// The explorer as it is served on `port`: [`router`] behind the guards of
/// [`Limits`] (see [the module](self)).
pub fn app(port: u16, limits: Limits) -> Router {
    let gate = Gate {
        permits: Arc::new(Semaphore::new(limits.heavy_concurrency.max(1))),
        wait: limits.heavy_wait,
    };
    let state = Arc::new(Guard { port, limits, gate });
    router().layer(axum::middleware::from_fn_with_state(state, guard))
}

/// Serves the explorer on `listener` with the default [`Limits`] until the
/// process ends.
///
/// # Errors
/// The I/O error of reading the listener's address.
pub async fn serve(listener: TcpListener) -> std::io::Result<()> {
    serve_with(listener, Limits::default()).await
}

/// Serves [`app`] on `listener` with `limits` until the process ends: each
/// connection on its own task, its request headers read within
/// [`Limits::header_timeout`], at most [`Limits::max_connections`] open.
///
/// # Errors
/// The I/O error of reading the listener's address.
pub async fn serve_with(listener: TcpListener, limits: Limits) -> std::io::Result<()> {
    let port = listener.local_addr()?.port();
    let app = app(port, limits.clone());
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let Ok(slot) = open.clone().acquire_owned().await else {
            return Ok(());
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // A connection that failed before it was accepted is the
                // client's; anything else (out of file descriptors) is
                // waited out, as axum's own server does.
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionRefused
                        | std::io::ErrorKind::Interrupted
                ) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let header_timeout = limits.header_timeout;
        tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            // A connection's error (a client gone, a timeout) ends only it.
            let _ = http.serve_connection(TokioIo::new(stream), service).await;
            drop(slot);
        });
    }
}

/// Listens on `127.0.0.1:port` (0: a free port), calls `ready` with the
/// address, and serves until the process ends, on a runtime of two worker
/// threads, with the default [`Limits`].
///
/// # Errors
/// The I/O error of binding the port or of the listener.
pub fn run(port: u16, ready: impl FnOnce(SocketAddr)) -> std::io::Result<()> {
    run_with(port, Limits::default(), ready)
}

/// [`run`] with `limits`.
///
/// # Errors
/// The I/O error of binding the port or of the listener.
pub fn run_with(port: u16, limits: Limits, ready: impl FnOnce(SocketAddr)) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await?;
        ready(listener.local_addr()?);
        serve_with(listener, limits).await
    })
}
