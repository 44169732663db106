//! `posenc.RopeConfig`: a model's RoPE from its `config.json`, with any
//! scaling or training-free method by name, and its numbers as numpy
//! arrays (transformers' values, angles in f64).

use std::sync::OnceLock;

use numpy::{
    IntoPyArray, PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2,
    PyUntypedArrayMethods,
};
use posenc::extend::{ContextMethod, ModelLengths};
use posenc::rope::{HfRopeConfig, NamedScaling, PairLayout, RopeConfig, RopeFrequencies};
use posenc::tensor::extend::MethodAttention;
use posenc::tensor::rope::Rope;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::error::{detached, err, IntoPy};
use crate::model::count;

/// A Python value as an error names it: its type, and a numpy array's
/// shape and dtype.
fn describe(v: &Bound<'_, PyAny>) -> String {
    let ty = v
        .get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string());
    match (v.getattr("shape"), v.getattr("dtype")) {
        (Ok(shape), Ok(dtype)) => format!("{ty} of shape {shape} and dtype {dtype}"),
        _ => ty,
    }
}

/// Largest number of positions one table call computes.
pub const MAX_POSITIONS: usize = 1 << 24;

/// A model's rotary position embedding (RoPE), read from a Hugging Face
/// `config.json` exactly as transformers reads it, with any scaling on
/// top.
///
/// Build one with `RopeConfig.from_hf(src)` (a path, a dict or a JSON
/// string) or `RopeConfig.plain(theta, rotary_dim)`; put a scaling or a
/// training-free attention method on it with `.with_scaling("yarn:2")`,
/// `.with_scaling("self-extend:4:1024+yarn:2")`. Its numbers:
/// `.frequencies()` (inverse frequencies, attention factor),
/// `.cos_sin(positions)` (the tables), `.inspect()` (what `posenc rope
/// inspect --json` prints). It is also the `rope=` argument of
/// `posenc.torch.apply_rope` and `posenc.torch.attention`.
#[pyclass(name = "RopeConfig", module = "posenc", frozen)]
pub struct PyRopeConfig {
    /// The parsed file, when built from one (for `inspect`).
    hf: Option<HfRopeConfig>,
    /// The RoPE the file gives, before any `with_scaling`.
    own: RopeConfig,
    /// The RoPE with the scaling applied.
    config: RopeConfig,
    /// The name given to `with_scaling`, if any.
    scaling: Option<NamedScaling>,
    /// The fused kernels' rope (cached cos/sin tables), built on first use.
    rope: OnceLock<Rope>,
}

impl PyRopeConfig {
    fn new(hf: Option<HfRopeConfig>, own: RopeConfig) -> PyRopeConfig {
        PyRopeConfig {
            hf,
            config: own.clone(),
            own,
            scaling: None,
            rope: OnceLock::new(),
        }
    }

    /// The length the model was trained on: the original
    /// `max_position_embeddings` of a scaled config, else
    /// `max_position_embeddings`.
    pub fn trained(&self) -> Option<usize> {
        self.own
            .original_max_position_embeddings()
            .or(self.own.max_position_embeddings())
    }

    /// The training-free method, if the scaling named one.
    pub fn context_method(&self) -> Option<ContextMethod> {
        self.scaling.and_then(|s| s.method)
    }

    /// What a method reads from the model.
    pub fn lengths(&self) -> ModelLengths {
        ModelLengths {
            trained: self.trained(),
            max_position_embeddings: self.own.max_position_embeddings(),
        }
    }

    /// The fused kernels' rope for this config.
    pub fn rope(&self) -> PyResult<&Rope> {
        if let Some(r) = self.rope.get() {
            return Ok(r);
        }
        let r = Rope::new(self.config.clone()).py()?;
        Ok(self.rope.get_or_init(|| r))
    }

    /// The method bound to this rope (errors when there is none).
    pub fn method_attention(&self) -> PyResult<Option<MethodAttention<'_>>> {
        match self.context_method() {
            None => Ok(None),
            Some(m) => Ok(Some(
                MethodAttention::new(m, self.rope()?, self.lengths()).py()?,
            )),
        }
    }
}

/// Reads `src`: a dict, a JSON string (starting with `{`), or a path.
fn read_hf(src: &Bound<'_, PyAny>) -> PyResult<HfRopeConfig> {
    if let Ok(d) = src.cast::<PyDict>() {
        return HfRopeConfig::from_json_str(&crate::convert::dict_to_json(d)?).py();
    }
    if let Ok(s) = src.cast::<PyString>() {
        let s: String = s.extract()?;
        let s = s.as_str();
        if s.trim_start().starts_with('{') {
            return HfRopeConfig::from_json_str(s).py();
        }
        return HfRopeConfig::from_file(std::path::Path::new(s)).py();
    }
    match src.extract::<std::path::PathBuf>() {
        Ok(p) => HfRopeConfig::from_file(&p).py(),
        Err(_) => Err(err(format!(
            "RopeConfig.from_hf: expected a path, a dict or a JSON string, got {}",
            src.get_type().name()?
        ))),
    }
}

fn layout_name(l: PairLayout) -> &'static str {
    l.as_str()
}

/// The frequencies of a RoPE at one sequence length.
#[pyclass(name = "Frequencies", module = "posenc", frozen)]
pub struct PyFrequencies {
    f: RopeFrequencies,
}

#[pymethods]
impl PyFrequencies {
    /// The inverse frequencies, `rotary_dim / 2` of them (numpy float64
    /// holding transformers' float32 values exactly).
    #[getter]
    fn inv_freq<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        self.f
            .inv_freq
            .iter()
            .map(|&x| x as f64)
            .collect::<Vec<_>>()
            .into_pyarray(py)
    }

    /// The factor cos and sin are multiplied by (YaRN's `0.1·ln s + 1`,
    /// LongRoPE's; 1 otherwise).
    #[getter]
    fn attention_factor(&self) -> f64 {
        self.f.attention_factor
    }

    /// Rotated entries of each head vector.
    #[getter]
    fn rotary_dim(&self) -> usize {
        self.f.rotary_dim
    }

    /// transformers' `rope_type` (`default`, `linear`, `dynamic`, `yarn`, ...).
    #[getter]
    fn rope_type(&self) -> String {
        self.f.rope_type.clone()
    }

    /// Which entries form a pair: `half-split` (transformers'
    /// `rotate_half`) or `interleaved` (GPT-J, GGUF Llama).
    #[getter]
    fn layout(&self) -> &'static str {
        layout_name(self.f.layout)
    }

    fn __repr__(&self) -> String {
        format!(
            "Frequencies(rope_type={:?}, rotary_dim={}, attention_factor={}, layout={:?})",
            self.f.rope_type,
            self.f.rotary_dim,
            self.f.attention_factor,
            layout_name(self.f.layout)
        )
    }
}

#[pymethods]
impl PyRopeConfig {
    /// Reads a Hugging Face `config.json`: `src` is a path (`str` or
    /// `os.PathLike`), a dict, or the JSON text. Every `rope_type` of
    /// transformers (default, linear, dynamic, yarn, longrope, llama3, ...)
    /// and per-layer-type `rope_parameters` (the full-attention layers'),
    /// `partial_rotary_factor`, `head_dim` and the model class defaults
    /// are read as transformers reads them.
    #[staticmethod]
    fn from_hf(py: Python<'_>, src: &Bound<'_, PyAny>) -> PyResult<Self> {
        let hf = read_hf(src)?;
        let own = detached(py, || RopeConfig::from_hf(&hf).py())?;
        Ok(PyRopeConfig::new(Some(hf), own))
    }

    /// Plain RoPE with base `theta` over `rotary_dim` entries, pairs laid
    /// out `half-split` (transformers) or `interleaved`;
    /// `max_position_embeddings` is the trained length the scalings are
    /// relative to.
    #[staticmethod]
    #[pyo3(signature = (theta, rotary_dim, layout = "half-split", head_dim = None, max_position_embeddings = None))]
    fn plain(
        theta: f64,
        rotary_dim: i64,
        layout: &str,
        head_dim: Option<i64>,
        max_position_embeddings: Option<i64>,
    ) -> PyResult<Self> {
        let rotary_dim = count(rotary_dim, "rotary_dim")?;
        let head_dim = head_dim.map(|v| count(v, "head_dim")).transpose()?;
        let max_position_embeddings = max_position_embeddings
            .map(|v| count(v, "max_position_embeddings"))
            .transpose()?;
        let layout = match layout {
            "half-split" | "half_split" | "neox" => PairLayout::HalfSplit,
            "interleaved" | "gptj" => PairLayout::Interleaved,
            other => {
                return Err(err(format!(
                    "layout {other:?}: use \"half-split\" or \"interleaved\""
                )))
            }
        };
        let mut c = RopeConfig::new(theta, rotary_dim)
            .py()?
            .with_layout(layout)
            .with_head_dim(head_dim.unwrap_or(rotary_dim));
        if let Some(m) = max_position_embeddings {
            c = c.with_max_position_embeddings(m);
        }
        c.validate().py()?;
        Ok(PyRopeConfig::new(None, c))
    }

    /// A new config with `name` on top of the model's own RoPE: any name
    /// the `posenc` command takes — `model`, `none`, `linear:F`,
    /// `dynamic:F`, `ntk:F`, `yarn:F`, a training-free method
    /// (`self-extend:G:W`, `rerope:W`, `leaky-rerope:W:K`,
    /// `dca:CHUNK:LOCAL`, `sinks:S:WINDOW`) or `METHOD+SCALING`. Factors
    /// are relative to the trained length (`max_position_embeddings`, or
    /// the original one of a scaled config).
    fn with_scaling(&self, name: &str) -> PyResult<Self> {
        let named: NamedScaling = name.parse().py()?;
        let trained = self.trained().ok_or_else(|| {
            err(format!(
                "scaling {name:?}: the config has no max_position_embeddings, the trained length factors are relative to"
            ))
        })?;
        let config = named.rope_config(&self.own, trained).py()?;
        if let Some(m) = named.method {
            let rope = Rope::new(config.clone()).py()?;
            let lengths = ModelLengths {
                trained: Some(trained),
                max_position_embeddings: self.own.max_position_embeddings(),
            };
            MethodAttention::new(m, &rope, lengths).py()?;
        }
        Ok(PyRopeConfig {
            hf: self.hf.clone(),
            own: self.own.clone(),
            config,
            scaling: Some(named),
            rope: OnceLock::new(),
        })
    }

    /// The frequencies at sequence length `seq_len` (`None`: the table
    /// transformers builds at load time; only `dynamic` and `longrope`
    /// depend on it), as transformers' `ROPE_INIT_FUNCTIONS`.
    #[pyo3(signature = (seq_len = None))]
    fn frequencies(&self, seq_len: Option<i64>) -> PyResult<PyFrequencies> {
        let seq_len = seq_len.map(|v| count(v, "seq_len")).transpose()?;
        Ok(PyFrequencies {
            f: self.config.frequencies(seq_len).py()?,
        })
    }

    /// `(cos, sin)` at `positions` (a sequence or 1-d array of
    /// non-negative ints), angles in f64, attention factor applied.
    /// With `full=True` (the default) each is `(len(positions),
    /// rotary_dim)` in transformers' layout (`cat(c, c)` for half-split
    /// pairs, each value twice for interleaved ones), ready for
    /// `apply_rotary_pos_emb`; with `full=False`, `(len(positions),
    /// rotary_dim/2)`. `dtype`: `float32` or `float64`. `seq_len` picks
    /// the frequencies of the length-dependent scalings (dynamic NTK,
    /// LongRoPE) as in `frequencies(seq_len)`; `None` is the load-time
    /// table.
    #[pyo3(signature = (positions, dtype = "float32", seq_len = None, full = true))]
    fn cos_sin<'py>(
        &self,
        py: Python<'py>,
        positions: &Bound<'py, PyAny>,
        dtype: &str,
        seq_len: Option<i64>,
        full: bool,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let positions: Vec<i64> = positions.extract().map_err(|_| {
            err(format!(
                "cos_sin: positions: expected ints below 2^63 in a sequence or a 1-d integer array, got {}",
                describe(positions)
            ))
        })?;
        let seq_len = seq_len.map(|v| count(v, "seq_len")).transpose()?;
        if positions.len() > MAX_POSITIONS {
            return Err(err(format!(
                "cos_sin: at most {MAX_POSITIONS} positions per call, got {}",
                positions.len()
            )));
        }
        let pos: Vec<u64> = positions
            .iter()
            .map(|&p| u64::try_from(p).map_err(|_| err(format!("position {p} is negative"))))
            .collect::<PyResult<_>>()?;
        let f = self.config.frequencies(seq_len).py()?;
        let nf = f.num_freqs();
        let n = pos.len();
        let (cos, sin) = py.detach(|| {
            let mut cos = Vec::with_capacity(n * nf);
            let mut sin = Vec::with_capacity(n * nf);
            for &p in &pos {
                let (c, s) = f.cos_sin_f64(p);
                cos.extend(c);
                sin.extend(s);
            }
            (cos, sin)
        });
        let widen = |t: Vec<f64>| -> Vec<f64> {
            if !full {
                return t;
            }
            let mut out = Vec::with_capacity(2 * t.len());
            for row in t.chunks(nf.max(1)) {
                match f.layout {
                    PairLayout::HalfSplit => {
                        out.extend_from_slice(row);
                        out.extend_from_slice(row);
                    }
                    PairLayout::Interleaved => {
                        for &v in row {
                            out.push(v);
                            out.push(v);
                        }
                    }
                }
            }
            out
        };
        let width = if full { 2 * nf } else { nf };
        let (cos, sin) = (widen(cos), widen(sin));
        let tup = match dtype {
            "float64" | "f64" | "double" => {
                let c = PyArray1::from_vec(py, cos).reshape([n, width])?;
                let s = PyArray1::from_vec(py, sin).reshape([n, width])?;
                PyTuple::new(py, [c.into_any(), s.into_any()])?
            }
            "float32" | "f32" | "float" => {
                let to32 = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
                let c = PyArray1::from_vec(py, to32(cos)).reshape([n, width])?;
                let s = PyArray1::from_vec(py, to32(sin)).reshape([n, width])?;
                PyTuple::new(py, [c.into_any(), s.into_any()])?
            }
            other => {
                return Err(err(format!(
                    "cos_sin: dtype {other:?}: use \"float32\" or \"float64\""
                )))
            }
        };
        Ok(tup)
    }

    /// What `posenc rope inspect --json` prints for this config
    /// (`rope_type`, `rotary_dim`, `head_dim`, `layout`, `rope_theta`,
    /// `inv_freq`, `attention_factor`, `seq_len`, and per layer type,
    /// M-RoPE and vision keys where the model has them); for a config
    /// with a scaling applied, the scaled RoPE's keys and `scaling`.
    #[pyo3(signature = (target_length = None))]
    fn inspect(&self, py: Python<'_>, target_length: Option<i64>) -> PyResult<Py<PyAny>> {
        let target_length = target_length
            .map(|v| count(v, "target_length"))
            .transpose()?;
        let v = match (&self.hf, &self.scaling) {
            (Some(hf), None) => posenc_viz::json::inspect_json(hf, target_length).py()?,
            _ => {
                let f = self.config.frequencies(target_length).py()?;
                let mut m = posenc_viz::json::rope_json(&self.config, &f);
                m.insert("seq_len".into(), serde_json::json!(target_length));
                if let Some(s) = &self.scaling {
                    m.insert("scaling".into(), serde_json::json!(s.to_string()));
                }
                serde_json::Value::Object(m)
            }
        };
        crate::convert::to_python(py, &v)
    }

    /// transformers' `rope_type` of the effective RoPE.
    #[getter]
    fn rope_type(&self) -> &'static str {
        self.config.rope_type()
    }

    /// The base θ.
    #[getter]
    fn theta(&self) -> f64 {
        self.config.theta()
    }

    /// The head dimension.
    #[getter]
    fn head_dim(&self) -> usize {
        self.config.head_dim()
    }

    /// Rotated entries of each head vector (`head_dim ·
    /// partial_rotary_factor`).
    #[getter]
    fn rotary_dim(&self) -> usize {
        self.config.rotary_dim()
    }

    /// `half-split` or `interleaved`.
    #[getter]
    fn layout(&self) -> &'static str {
        layout_name(self.config.layout())
    }

    /// `max_position_embeddings` of the effective RoPE.
    #[getter]
    fn max_position_embeddings(&self) -> Option<usize> {
        self.config.max_position_embeddings()
    }

    /// The trained length the scaling factors are relative to.
    #[getter]
    fn trained_length(&self) -> Option<usize> {
        self.trained()
    }

    /// The name given to `with_scaling`, in canonical form (`None`: the
    /// config's own RoPE).
    #[getter]
    fn scaling(&self) -> Option<String> {
        self.scaling.map(|s| s.to_string())
    }

    /// The training-free attention method of the scaling, if any
    /// (`self-extend:4:1024`, ...).
    #[getter]
    fn method(&self) -> Option<String> {
        self.context_method().map(|m| m.to_string())
    }

    fn __repr__(&self) -> String {
        format!(
            "RopeConfig(rope_type={:?}, theta={}, head_dim={}, rotary_dim={}, layout={:?}, scaling={:?})",
            self.config.rope_type(),
            self.config.theta(),
            self.config.head_dim(),
            self.config.rotary_dim(),
            layout_name(self.config.layout()),
            self.scaling.map(|s| s.to_string()).unwrap_or_else(|| "model".into())
        )
    }

    /// The tables of the fused kernels for keys at `ids` `(B, T_k)` and
    /// queries at the last `q_len` of each row: `(q_cos, q_sin, k_cos,
    /// k_sin)`, each `(B, T, rotary_dim/2)` float32 (the PyTorch path's
    /// tables; the kernels rotate with the same values).
    fn _tables<'py>(
        &self,
        py: Python<'py>,
        ids: PyReadonlyArray2<'py, i64>,
        q_len: usize,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (b, tk) = (ids.shape()[0], ids.shape()[1]);
        if q_len == 0 || q_len > tk {
            return Err(err(format!(
                "queries: 1 ≤ T_q ≤ T_k, got T_q {q_len}, T_k {tk}"
            )));
        }
        let ids = ids.as_slice().map_err(err)?.to_vec();
        let rope = self.rope()?;
        let t = detached(py, || {
            posenc::buffers::rotation_tables(
                rope,
                posenc::buffers::BufferPositions::Ids(&ids),
                b,
                q_len,
                tk,
            )
            .py()
        })?;
        gather_tables(py, &t, b, q_len, tk)
    }

    /// A method's ranges as data for the PyTorch path: a list of
    /// `(q_cos, q_sin, k_cos, k_sin, lo, hi)` per range (tables `(T, nf)`
    /// float32, `lo`/`hi` int64 per query), the factor of each query and
    /// the factor of every logit.
    fn _method_plan<'py>(
        &self,
        py: Python<'py>,
        q_len: usize,
        k_len: usize,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let attn = self
            .method_attention()?
            .ok_or_else(|| err("this RopeConfig has no attention method"))?;
        let plan = detached(py, || attn.plan(q_len, k_len).py())?;
        let mut views = Vec::new();
        for v in &plan.views {
            let t = gather_tables(py, &v.tables, 1, q_len, k_len)?;
            let lo: Vec<i64> = v.lo.iter().map(|&x| x as i64).collect();
            let hi: Vec<i64> = v.hi.iter().map(|&x| x as i64).collect();
            let mut items: Vec<Bound<'py, PyAny>> = t.iter().collect();
            items.push(lo.into_pyarray(py).into_any());
            items.push(hi.into_pyarray(py).into_any());
            views.push(PyTuple::new(py, items)?);
        }
        PyTuple::new(
            py,
            [
                pyo3::types::PyList::new(py, views)?.into_any(),
                plan.query_scale.into_pyarray(py).into_any(),
                plan.logit_scale.into_pyobject(py)?.into_any(),
            ],
        )
    }
}

/// The rows of rotation tables as `(B, T, nf)` float32 arrays.
fn gather_tables<'py>(
    py: Python<'py>,
    t: &posenc::tensor::rope::RotationTables,
    b: usize,
    q_len: usize,
    k_len: usize,
) -> PyResult<Bound<'py, PyTuple>> {
    let nf = t.tables.n_freq;
    let gather =
        |cos: &[f32], sin: &[f32], rows: &posenc::tensor::rope::RotationRows, len: usize| {
            let mut c = Vec::with_capacity(b * len * nf);
            let mut s = Vec::with_capacity(b * len * nf);
            for bi in 0..b {
                for ti in 0..len {
                    let r = match rows {
                        posenc::tensor::rope::RotationRows::Offset(o) => o + ti,
                        posenc::tensor::rope::RotationRows::Ids(v) => v[bi * len + ti],
                    };
                    c.extend_from_slice(&cos[r * nf..(r + 1) * nf]);
                    s.extend_from_slice(&sin[r * nf..(r + 1) * nf]);
                }
            }
            (c, s)
        };
    let q = t.tables.query();
    let kt = t.tables.key();
    let (qc, qs) = gather(q.cos, q.sin, &t.q_rows, q_len);
    let (kc, ks) = gather(kt.cos, kt.sin, &t.k_rows, k_len);
    let arr = |v: Vec<f32>, len: usize| -> PyResult<Bound<'py, PyAny>> {
        Ok(PyArray1::from_vec(py, v).reshape([b, len, nf])?.into_any())
    };
    PyTuple::new(
        py,
        [
            arr(qc, q_len)?,
            arr(qs, q_len)?,
            arr(kc, k_len)?,
            arr(ks, k_len)?,
        ],
    )
}

/// Reads a 1-d int64 array of positions (for other modules).
pub fn positions_of(a: &PyReadonlyArray1<'_, i64>) -> PyResult<Vec<u64>> {
    a.as_slice()
        .map_err(err)?
        .iter()
        .map(|&p| u64::try_from(p).map_err(|_| err(format!("position {p} is negative"))))
        .collect()
}
