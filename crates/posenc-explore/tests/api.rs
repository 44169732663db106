//! The explorer's JSON API, through its router: status codes, bounded
//! bodies, the library's numbers, and hostile configs (random mutations of
//! the test suite's real configs) that must give a typed error or finite
//! numbers, never a panic.

use axum::body::{to_bytes, Body};
use axum::http::{Request, StatusCode};
use posenc::relative::t5::T5Buckets;
use posenc::rope::HfRopeConfig;
use posenc_explore::configs::CONFIGS;
use posenc_explore::json::{
    alibi_json, inspect_json, sinusoidal_table_json, t5_json, SinusoidalParams,
};
use posenc_explore::{router, MAX_BODY_BYTES};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tower::ServiceExt;

async fn call(method: &str, uri: &str, body: Option<Vec<u8>>) -> (StatusCode, Vec<u8>) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.map(Body::from).unwrap_or_else(Body::empty))
        .unwrap();
    let resp = router().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, bytes.to_vec())
}

async fn call_json(method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
    let (s, b) = call(method, uri, body.map(|v| v.to_string().into_bytes())).await;
    let v: Value = serde_json::from_slice(&b).unwrap_or_else(|e| {
        panic!(
            "{uri}: answer is not JSON ({e}): {}",
            String::from_utf8_lossy(&b)
        )
    });
    (s, v)
}

/// The JSON answer to `GET uri`, which must be 200.
async fn get_ok(uri: &str) -> Value {
    let (s, v) = call_json("GET", uri, None).await;
    assert_eq!(s, StatusCode::OK, "{uri}: {v}");
    v
}

/// The one-line error message of a request that must be answered `status`.
async fn refused(method: &str, uri: &str, body: Option<Value>, status: StatusCode) -> String {
    let (s, v) = call_json(method, uri, body).await;
    assert_eq!(s, status, "{method} {uri}: {v}");
    assert_error(&v).to_string()
}

/// The `/api/model` answer for `config` (its text or its object) at
/// `target_len`, which must be 200.
async fn model_at(config: impl Into<Value>, target_len: usize) -> Value {
    let body = json!({"config": config.into(), "target_len": target_len});
    let (s, v) = call_json("POST", "/api/model", Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

/// `v` as a client reads it: serde_json's default parser may land one ulp
/// off a printed `f64`, the same way for the same text, so an answer parsed
/// from the wire is compared with the expected value printed and parsed
/// alike (the text itself is compared byte for byte where it matters).
fn reparse(v: &Value) -> Value {
    serde_json::from_str(&v.to_string()).unwrap()
}

/// An error answer: `{"error": one line}`.
fn assert_error(v: &Value) -> &str {
    let m = v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error message in {v}"));
    assert!(
        !m.is_empty() && !m.contains('\n'),
        "error not one line: {m:?}"
    );
    m
}

#[tokio::test]
async fn the_page_and_its_assets_are_served() {
    for (uri, kind, needle) in [
        ("/", "text/html", "posenc explore"),
        ("/app.js", "text/javascript", "viewSinusoidal"),
        ("/style.css", "text/css", "body"),
    ] {
        let req = Request::builder().uri(uri).body(Body::empty()).unwrap();
        let resp = router().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{uri}");
        let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with(kind), "{uri}: {ct}");
        let body = to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        assert!(String::from_utf8_lossy(&body).contains(needle), "{uri}");
    }
    // nothing is fetched from elsewhere: no absolute URL in the page's code
    for asset in [
        posenc_explore::assets::INDEX_HTML,
        posenc_explore::assets::APP_JS,
    ] {
        assert!(!asset.contains("http://") && !asset.contains("https://"));
    }
}

#[tokio::test]
async fn unknown_routes_and_configs_are_404_json() {
    refused("GET", "/api/nothing", None, StatusCode::NOT_FOUND).await;
    assert!(refused(
        "GET",
        "/api/configs/no-such-model",
        None,
        StatusCode::NOT_FOUND
    )
    .await
    .contains("no-such-model"));
}

#[tokio::test]
async fn every_bundled_config_inspects_as_the_library_does() {
    let list = get_ok("/api/configs").await;
    let names: Vec<&str> = list["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), CONFIGS.len());
    assert!(names.contains(&"llama-3.1-8b") && names.contains(&"qwen2-vl-7b-instruct"));
    for (name, _, text) in CONFIGS {
        let (s, b) = call("GET", &format!("/api/configs/{name}"), None).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(b, text.as_bytes());
        let hf = HfRopeConfig::from_json_str(text).unwrap();
        let expected = inspect_json(&hf, None).unwrap();
        let body = json!({"config": text}).to_string().into_bytes();
        let (s, got) = call("POST", "/api/inspect", Some(body)).await;
        assert_eq!(s, StatusCode::OK, "{name}");
        // byte for byte what `posenc rope inspect --json` prints
        assert_eq!(
            String::from_utf8(got).unwrap(),
            expected.to_string(),
            "{name}"
        );
        // the model view carries the same document and one row per pair
        let m = model_at(*text, 131072).await;
        assert_eq!(m["inspect"], reparse(&expected), "{name}");
        for t in m["layer_types"].as_array().unwrap() {
            let ins = match expected.get("layer_types") {
                Some(lt) => &lt[t["name"].as_str().unwrap()],
                None => &expected,
            };
            let inv = ins["inv_freq"].as_array().unwrap();
            let pairs = t["pairs"].as_array().unwrap();
            assert_eq!(pairs.len(), inv.len(), "{name}");
            for (p, f) in pairs.iter().zip(inv) {
                // the pair's inv_freq is the f32 of `inspect`, widened
                assert_eq!(
                    p["inv_freq"].as_f64().unwrap() as f32,
                    f.as_f64().unwrap() as f32
                );
            }
        }
    }
}

#[tokio::test]
async fn the_config_may_be_sent_as_an_object() {
    let text = posenc_explore::configs::config("llama-3.1-8b").unwrap();
    let obj: Value = serde_json::from_str(text).unwrap();
    let body = json!({"config": obj, "seq_len": 9000})
        .to_string()
        .into_bytes();
    let (s, a) = call("POST", "/api/inspect", Some(body)).await;
    assert_eq!(s, StatusCode::OK);
    let expected = inspect_json(&HfRopeConfig::from_json_str(text).unwrap(), Some(9000)).unwrap();
    assert_eq!(String::from_utf8(a).unwrap(), expected.to_string());
}

#[tokio::test]
async fn llama3_pairs_are_labelled_by_band_and_unseen_angles_found() {
    let text = posenc_explore::configs::config("llama-3.1-8b").unwrap();
    let m = model_at(text, 131072).await;
    let t = &m["layer_types"][0];
    let sc = &t["scaling"];
    let (hi_wl, lo_wl) = (
        sc["high_freq_wavelen"].as_f64().unwrap(),
        sc["low_freq_wavelen"].as_f64().unwrap(),
    );
    let factor = sc["factor"].as_f64().unwrap();
    let mut roles = std::collections::BTreeSet::new();
    for p in t["pairs"].as_array().unwrap() {
        let wl0 = p["unscaled_wavelength"].as_f64().unwrap();
        let role = p["role"].as_str().unwrap();
        roles.insert(role.to_string());
        // Meta's bands, from the unscaled wavelength
        if wl0 < hi_wl * 0.999 {
            assert_eq!(role, "kept", "{p}");
        } else if wl0 > lo_wl * 1.001 {
            assert_eq!(role, "interpolated", "{p}");
            let r = p["ratio"].as_f64().unwrap();
            assert!((r - 1.0 / factor).abs() < 1e-5, "{p}");
        }
        // an unseen angle needs a wavelength beyond the training length
        if p["unseen"].as_bool().unwrap() {
            assert!(wl0 > t["train_len"].as_f64().unwrap());
        }
    }
    assert!(
        roles.contains("kept") && roles.contains("interpolated") && roles.contains("ramp"),
        "{roles:?}"
    );
    // at 16× the training length, the slowest pairs meet new angles
    assert!(t["unseen_pairs"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn yarn_correction_range_matches_its_definition() {
    let text = posenc_explore::configs::config("qwen2.5-7b-instruct-yarn").unwrap();
    let (s, m) = call_json("POST", "/api/model", Some(json!({"config": text}))).await;
    assert_eq!(s, StatusCode::OK);
    let t = &m["layer_types"][0];
    let sc = &t["scaling"];
    let d = t["rotary_dim"].as_f64().unwrap();
    let base = t["rope_theta"].as_f64().unwrap();
    let l = sc["original_max_position_embeddings"].as_f64().unwrap();
    // Peng et al. 2023: the dimension making `beta` turns over L
    let dim = |beta: f64| d * (l / (beta * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln());
    let r = sc["correction_range"].as_array().unwrap();
    assert_eq!(
        r[0].as_f64().unwrap(),
        dim(sc["beta_fast"].as_f64().unwrap()).floor().max(0.0)
    );
    assert_eq!(
        r[1].as_f64().unwrap(),
        dim(sc["beta_slow"].as_f64().unwrap()).ceil().min(d - 1.0)
    );
}

#[tokio::test]
async fn bad_requests_get_json_errors_with_their_status() {
    // not JSON at all
    let (s, b) = call("POST", "/api/model", Some(b"{not json".to_vec())).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_error(&serde_json::from_slice(&b).unwrap());
    // no config
    assert!(refused(
        "POST",
        "/api/model",
        Some(json!({"seq_len": 3})),
        StatusCode::BAD_REQUEST
    )
    .await
    .contains("config"));
    // a config that is not JSON: the library's message
    let got = refused(
        "POST",
        "/api/model",
        Some(json!({"config": "{\"rope_theta\": "})),
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    let lib = HfRopeConfig::from_json_str("{\"rope_theta\": ")
        .unwrap_err()
        .to_string();
    assert_eq!(got, lib);
    // a config the library rejects
    let bad = json!({"hidden_size": 64, "num_attention_heads": 2, "rope_theta": -5.0});
    let got = refused(
        "POST",
        "/api/model",
        Some(json!({"config": bad})),
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    let lib = inspect_json(
        &HfRopeConfig::from_json_str(&bad.to_string()).unwrap(),
        None,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(got, lib);
    // lengths
    for len in [json!(0), json!(-1), json!(1.5), json!("x")] {
        refused(
            "POST",
            "/api/model",
            Some(json!({"config": "{}", "seq_len": len})),
            StatusCode::BAD_REQUEST,
        )
        .await;
    }
    refused(
        "POST",
        "/api/model",
        Some(json!({"config": "{}", "target_len": 1u64 << 50})),
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    // query parameters
    for uri in [
        "/api/sinusoidal?dim=abc",
        "/api/sinusoidal?layout=diagonal",
        "/api/rope?position=-1",
        "/api/bias/t5?bidirectional=maybe",
    ] {
        refused("GET", uri, None, StatusCode::BAD_REQUEST).await;
    }
    // sizes past the views' bounds and the library's own errors
    for uri in [
        "/api/sinusoidal?positions=100000",
        "/api/sinusoidal?dim=100000",
        "/api/sinusoidal?positions=2048&dim=1024",
        "/api/sinusoidal?dim=0",
        "/api/sinusoidal?base=-3",
        "/api/rope?dim=7",
        "/api/rope?dim=4096",
        "/api/rope?points=100000000",
        "/api/bias/alibi?heads=0",
        "/api/bias/alibi?heads=100000000000",
        "/api/bias/t5?lo=-100000000&hi=100000000",
        "/api/bias/t5?lo=5&hi=-5",
        "/api/bias/shaw?max_relative=1000000000000",
    ] {
        refused("GET", uri, None, StatusCode::UNPROCESSABLE_ENTITY).await;
    }
}

#[tokio::test]
async fn bodies_over_the_bound_are_413() {
    let mut big = b"{\"config\": \"".to_vec();
    big.resize(MAX_BODY_BYTES + 10, b' ');
    big.extend_from_slice(b"\"}");
    let (s, b) = call("POST", "/api/model", Some(big)).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert_error(&serde_json::from_slice(&b).unwrap());
    // just under the bound is read (and rejected by the library as a config)
    let mut ok = b"{\"config\": \"".to_vec();
    ok.resize(MAX_BODY_BYTES - 10, b' ');
    ok.extend_from_slice(b"\"}");
    let (s, _) = call("POST", "/api/model", Some(ok)).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn the_teaching_views_give_the_library_s_numbers() {
    let v = get_ok("/api/sinusoidal?positions=32&dim=16&base=10000&layout=concatenated&k=3").await;
    let p = SinusoidalParams {
        positions: 32,
        dim: 16,
        layout: posenc::absolute::sinusoidal::SinusoidalLayout::Concatenated,
        base: 10000.0,
        offset: 0,
    };
    assert_eq!(v["table"], reparse(&sinusoidal_table_json(&p).unwrap()));
    // PE(p + k) = M_k PE(p) holds for the sinusoidal encoding
    assert!(v["linear_map"]["max_residual"].as_f64().unwrap() < 1e-12);
    assert_eq!(v["linear_map"]["blocks"].as_array().unwrap().len(), 8);
    // cosine of PE(p) with itself
    assert!((v["similarity"]["cosine"][0].as_f64().unwrap() - 1.0).abs() < 1e-15);
    // an odd interleaved dimension has no M_k: said, not an error
    let v = get_ok("/api/sinusoidal?dim=7").await;
    assert!(v["linear_map"]["error"].as_str().is_some());

    let v = get_ok("/api/rope?dim=128&base=10000&max_distance=100&points=101").await;
    let bound = v["decay"]["bound"].as_array().unwrap();
    // RoFormer's bound: (d/2 + 1)/2 at distance 0
    assert_eq!(bound[0].as_f64().unwrap(), 32.5);
    assert_eq!(
        bound[100],
        reparse(&json!(
            posenc::analysis::rope_decay_bound(128, 10000.0, &[100.0]).unwrap()[0]
        ))
    );

    let v = get_ok("/api/bias/alibi?heads=12").await;
    assert_eq!(v["slopes"], reparse(&alibi_json(12).unwrap()["slopes"]));
    let v =
        get_ok("/api/bias/t5?buckets=32&max_distance=128&bidirectional=false&lo=-200&hi=20").await;
    let buckets = T5Buckets::new(32, 128, false).unwrap();
    assert_eq!(v, reparse(&t5_json(&buckets, -200, 20)));
    let v = get_ok("/api/bias/shaw?max_relative=4&lo=-6&hi=6").await;
    assert_eq!(
        v["clipped"],
        json!([-4, -4, -4, -3, -2, -1, 0, 1, 2, 3, 4, 4, 4])
    );
    assert_eq!(v["index"][0], json!(0));
}

// ---------------------------------------------------------------- fuzz ---

// The hostile-config generator of posenc's own fuzz test.
#[path = "../../posenc/tests/config_fuzz/mod.rs"]
mod config_fuzz;
use config_fuzz::mutate;

/// Every number in an answer is finite: serde_json writes a NaN or an
/// infinity as `null`, so no array of numbers may hold a null.
fn assert_finite(v: &Value, path: &str) {
    match v {
        Value::Array(a) => {
            if a.iter().any(Value::is_number) {
                assert!(
                    !a.iter().any(Value::is_null),
                    "{path}: non-finite entry in {v}"
                );
            }
            for (i, x) in a.iter().enumerate() {
                assert_finite(x, &format!("{path}[{i}]"));
            }
        }
        Value::Object(m) => {
            for (k, x) in m {
                assert_finite(x, &format!("{path}.{k}"));
            }
        }
        Value::Number(n) => assert!(n.as_f64().is_some_and(f64::is_finite), "{path}"),
        _ => {}
    }
}

#[tokio::test]
async fn mutated_real_configs_get_typed_errors_or_finite_numbers() {
    let mut rng = StdRng::seed_from_u64(0x00e8_9107_e000_0018);
    let (mut ok, mut errors) = (0usize, 0usize);
    const MUTANTS: usize = 600;
    for i in 0..MUTANTS {
        let (name, _, text) = CONFIGS[i % CONFIGS.len()];
        let mut v: Value = serde_json::from_str(text).unwrap();
        for _ in 0..rng.random_range(1..4) {
            mutate(&mut rng, &mut v);
        }
        let target = [None, Some(1u64), Some(131072), Some(1 << 40)][rng.random_range(0..4)];
        let seq = [None, Some(4096u64), Some(1 << 30)][rng.random_range(0..3)];
        let body = json!({"config": v.to_string(), "target_len": target, "seq_len": seq});
        for route in ["/api/model", "/api/inspect"] {
            let (s, ans) = call_json("POST", route, Some(body.clone())).await;
            match s {
                StatusCode::OK => {
                    assert_finite(&ans, route);
                    ok += 1;
                }
                StatusCode::UNPROCESSABLE_ENTITY => {
                    assert_error(&ans);
                    errors += 1;
                }
                other => panic!("mutant {i} of {name}: {route} answered {other}: {ans}\n{v}"),
            }
        }
    }
    println!("{MUTANTS} mutants through 2 routes: {ok} answers, {errors} typed errors");
    assert!(
        ok > MUTANTS / 5 && errors > MUTANTS / 20,
        "{ok} answers, {errors} errors"
    );
}

#[tokio::test]
async fn defaults_the_config_does_not_name_are_warned_and_unknown_stays_unknown() {
    // no RoPE key at all: the base is a default, and the page says so
    let v = model_at(json!({"hidden_size": 64, "num_attention_heads": 4}), 8192).await;
    assert_eq!(
        v["defaulted"],
        json!(["rope_theta", "max_position_embeddings"])
    );
    let w = v["warnings"].as_array().unwrap();
    assert!(w[0].as_str().unwrap().contains("no rope_theta"), "{w:?}");
    assert!(w[0].as_str().unwrap().contains("10000"), "{w:?}");
    assert!(w[1].as_str().unwrap().contains("unknown"), "{w:?}");
    // without a training length no pair is judged seen or unseen
    let t = &v["layer_types"][0];
    assert!(t["unseen_pairs"].is_null());
    assert!(t["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p.get("unseen").is_none()));
    // Gemma 3 4B's config names neither (transformers' config class holds
    // them): warned, not guessed
    let gemma = posenc_explore::configs::config("gemma-3-4b-it").expect("bundled");
    let v = model_at(gemma, 131072).await;
    assert_eq!(
        v["defaulted"],
        json!(["rope_theta", "max_position_embeddings"])
    );
    // a config that names both: no warning, and every pair judged
    let llama = posenc_explore::configs::config("llama-3.1-8b").unwrap();
    let v = model_at(llama, 131072).await;
    assert_eq!(v["warnings"], json!([]));
    assert_eq!(v["defaulted"], json!([]));
    let pairs = v["layer_types"][0]["pairs"].as_array().unwrap();
    assert!(pairs.iter().all(|p| p["unseen"].is_boolean()));
}

#[tokio::test]
async fn longrope_names_the_factor_set_of_each_column() {
    let phi = posenc_explore::configs::config("phi-3-mini-128k-instruct").expect("bundled");
    // no seq_len: the frequency columns use the short factors; at N past the
    // original 4096 positions the model uses the long ones
    let v = model_at(phi, 131072).await;
    let t = &v["layer_types"][0];
    assert_eq!(t["scaling"]["uses_long_factor"], json!(false));
    assert_eq!(t["scaling"]["target_uses_long_factor"], json!(true));
    let short = t["scaling"]["short_factor"].as_array().unwrap();
    let long = t["scaling"]["long_factor"].as_array().unwrap();
    let p = &t["pairs"][20];
    let w0 = p["unscaled_inv_freq"].as_f64().unwrap();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs();
    // each column is the unscaled frequency over its own set's factor
    assert!(close(
        p["inv_freq"].as_f64().unwrap(),
        w0 / short[20].as_f64().unwrap()
    ));
    assert!(close(
        p["target_inv_freq"].as_f64().unwrap(),
        w0 / long[20].as_f64().unwrap()
    ));
    // at N within the original length both are the short set
    let v = model_at(phi, 2048).await;
    assert_eq!(
        v["layer_types"][0]["scaling"]["target_uses_long_factor"],
        json!(false)
    );
}
