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

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use posenc::absolute::sinusoidal::SinusoidalLayout;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::configs::{config, CONFIGS};
use crate::json::{inspect_json, SinusoidalParams};
use crate::model::{model_json, MAX_LENGTH};
use crate::views::{alibi_view, rope_view, shaw_view, sinusoidal_view, t5_view};

/// The largest request body accepted (1 MiB; real `config.json` files are a
/// few KiB).
pub const MAX_BODY_BYTES: usize = 1 << 20;

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

type ApiResult = Result<Json<Value>, ApiError>;
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

async fn sinusoidal(q: Params) -> ApiResult {
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
    let v = sinusoidal_view(
        &p,
        param(&q, "ref", 0)?,
        param(&q, "max_k", 64)?,
        param(&q, "k", 1)?,
    )?;
    Ok(Json(v))
}

async fn rope(q: Params) -> ApiResult {
    let Query(q) = q?;
    Ok(Json(rope_view(
        param(&q, "dim", 64)?,
        param(&q, "base", 10000.0)?,
        param(&q, "position", 100)?,
        param(&q, "context", 4096)?,
        param(&q, "max_distance", 256)?,
        param(&q, "points", 257)?,
    )?))
}

async fn alibi(q: Params) -> ApiResult {
    let Query(q) = q?;
    Ok(Json(alibi_view(
        param(&q, "heads", 8)?,
        param(&q, "max_distance", 64)?,
        param(&q, "points", 65)?,
    )?))
}

async fn t5(q: Params) -> ApiResult {
    let Query(q) = q?;
    Ok(Json(t5_view(
        param(&q, "buckets", 32)?,
        param(&q, "max_distance", 128)?,
        flag(&q, "bidirectional", true)?,
        param(&q, "lo", -160)?,
        param(&q, "hi", 160)?,
    )?))
}

async fn shaw(q: Params) -> ApiResult {
    let Query(q) = q?;
    Ok(Json(shaw_view(
        param(&q, "max_relative", 16)?,
        param(&q, "lo", -64)?,
        param(&q, "hi", 64)?,
    )?))
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

/// Runs `f` on the blocking pool: a hostile config's work never stalls the
/// server, and a panic (a bug) becomes a 500 answer, the server still up.
async fn blocking(f: impl FnOnce() -> Result<Value, ApiError> + Send + 'static) -> ApiResult {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map(Json),
        Err(e) => Err(ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("internal error: {e}"),
        }),
    }
}

async fn inspect(body: Result<Bytes, BytesRejection>) -> ApiResult {
    let r = config_request(body)?;
    blocking(move || {
        let hf = posenc::rope::HfRopeConfig::from_json_str(&r.text)?;
        Ok(inspect_json(&hf, r.seq_len)?)
    })
    .await
}

async fn model(body: Result<Bytes, BytesRejection>) -> ApiResult {
    let r = config_request(body)?;
    blocking(move || Ok(model_json(&r.text, r.seq_len, r.target_len)?)).await
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

/// The explorer's routes (see [the module](self)).
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

/// Serves the explorer on `listener` until the process ends.
///
/// # Errors
/// An I/O error of the listener.
pub async fn serve(listener: TcpListener) -> std::io::Result<()> {
    axum::serve(listener, router()).await
}

/// Listens on `127.0.0.1:port` (0: a free port), calls `ready` with the
/// address, and serves until the process ends, on a runtime of two worker
/// threads.
///
/// # Errors
/// The I/O error of binding the port or of the listener.
pub fn run(port: u16, ready: impl FnOnce(SocketAddr)) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await?;
        ready(listener.local_addr()?);
        serve(listener).await
    })
}
