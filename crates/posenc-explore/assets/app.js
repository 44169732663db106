// posenc explore: the page. Every number comes from the server's JSON API
// (the posenc library); this file only lays out controls and draws charts on
// canvases. The state of the page lives in location.hash.
"use strict";

// ---------------------------------------------------------------- state ---

const DEFAULTS = {
  sinusoidal: { positions: "64", dim: "64", base: "10000", layout: "interleaved", k: "4", ref: "0" },
  rope: { dim: "64", base: "10000", position: "100", context: "4096", base2: "500000" },
  model: { cfg: "llama-3.1-8b", text: "", seq: "", target: "131072" },
  compare: { a: "llama-3.1-8b", b: "qwen2.5-7b-instruct-yarn", atext: "", btext: "", bsc: "", alt: "", blt: "", target: "131072" },
  bias: { heads: "8", buckets: "32", maxdist: "128", bidir: "1", shawk: "16" },
};

function readHash() {
  const q = new URLSearchParams(location.hash.slice(1));
  const view = DEFAULTS[q.get("view")] ? q.get("view") : "sinusoidal";
  const s = Object.assign({}, DEFAULTS[view]);
  for (const k of Object.keys(s)) if (q.has(k)) s[k] = q.get(k);
  return { view, s };
}

let current = readHash();

// A pasted config.json (often kilobytes) stays out of the URL: it is kept for
// this tab in sessionStorage, and a link names the bundled config instead.
const PASTES = new Set(["text", "atext", "btext"]);
const pasteKey = (k) => `posenc:${current.view}:${k}`;

function writeHash() {
  const q = new URLSearchParams();
  q.set("view", current.view);
  for (const [k, v] of Object.entries(current.s)) if (v !== DEFAULTS[current.view][k] && !PASTES.has(k)) q.set(k, v);
  history.replaceState(null, "", "#" + q.toString());
}

function setState(k, v) {
  current.s[k] = String(v);
  writeHash();
}

// ------------------------------------------------------------------ api ---

let pending = 0;
function busy(d) {
  pending += d;
  document.getElementById("status").textContent = pending > 0 ? "computing…" : "";
}

async function api(path, body) {
  busy(1);
  try {
    const r = await fetch(path, body === undefined ? {} : {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
    });
    let v;
    try { v = await r.json(); } catch (e) { throw new Error(`HTTP ${r.status}: the answer is not JSON`); }
    if (!r.ok) throw new Error(v && v.error ? v.error : `HTTP ${r.status}`);
    return v;
  } finally { busy(-1); }
}

const qs = (o) => new URLSearchParams(o).toString();

// ------------------------------------------------------------------ dom ---

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of kids.flat()) if (c !== null && c !== undefined) e.append(c.nodeType ? c : String(c));
  return e;
}

function fmt(x, digits = 4) {
  if (x === null || x === undefined) return "—";
  if (typeof x !== "number") return String(x);
  if (!isFinite(x)) return String(x);
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e6 || a < 1e-3) return x.toExponential(digits - 1).replace(/\.?0+e/, "e");
  if (Number.isInteger(x)) return String(x);
  return x.toPrecision(digits);
}

// A slider with its value shown. `map` turns the slider's position into the
// value (for log scales), `unmap` the other way.
function slider(label, key, min, max, step, opts = {}) {
  const map = opts.map || ((x) => x), unmap = opts.unmap || ((x) => x);
  const out = el("output", {}, fmt(Number(current.s[key]), 6));
  const input = el("input", { type: "range", min, max, step, name: key, value: unmap(Number(current.s[key])) });
  input.addEventListener("input", () => {
    const v = map(Number(input.value));
    out.textContent = fmt(v, 6);
    setState(key, v);
    opts.onchange();
  });
  return el("label", {}, label, input, out);
}

const log10map = { map: (x) => Math.round(Math.pow(10, x)), unmap: (v) => Math.log10(v) };

function numberInput(label, key, opts) {
  const input = el("input", { type: "number", name: key, value: current.s[key], min: opts.min, step: opts.step || 1 });
  input.addEventListener("change", () => { setState(key, input.value); opts.onchange(); });
  return el("label", {}, label, input);
}

// ---------------------------------------------------------------- charts ---

const COLORS = ["#2f6fd0", "#d0542f", "#1b7f3b", "#7b3fb5", "#b86e00", "#0b8a8a", "#c2185b", "#555"];

function canvas(w, h, cls) {
  const c = el("canvas", { class: cls });
  const r = window.devicePixelRatio || 1;
  c.width = w * r; c.height = h * r;
  // drawn at w × h, shown at most as wide as its container (same aspect): no
  // sideways scroll on a narrow screen
  c.style.width = w + "px"; c.style.maxWidth = "100%"; c.style.height = "auto"; c.style.aspectRatio = `${w} / ${h}`;
  c.getContext("2d").scale(r, r);
  c.cssW = w; c.cssH = h;
  return c;
}

function niceTicks(lo, hi, n) {
  const span = hi - lo;
  if (!(span > 0)) return [lo];
  const step0 = span / n, p = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= step0) || 10 * p;
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(Math.abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

// Line chart. opts: series [{x, y, color, label, step, dots, width}], xlog,
// ylog, xlabel, ylabel, hlines/vlines [{v, label, color}], bands [{x0, x1, color}], ymin, ymax.
function plot(c, opts) {
  const g = c.getContext("2d"), W = c.cssW, H = c.cssH;
  const m = { l: 62, r: 12, t: opts.title ? 22 : 10, b: 38 };
  g.clearRect(0, 0, W, H);
  g.font = "11px system-ui, sans-serif";
  const tx = (v) => (opts.xlog ? Math.log10(v) : v), ty = (v) => (opts.ylog ? Math.log10(v) : v);
  const ok = (x, y) => isFinite(tx(x)) && isFinite(ty(y)) && y !== null && x !== null;
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const s of opts.series) s.x.forEach((x, i) => {
    const y = s.y[i];
    if (!ok(x, y)) return;
    x0 = Math.min(x0, tx(x)); x1 = Math.max(x1, tx(x)); y0 = Math.min(y0, ty(y)); y1 = Math.max(y1, ty(y));
  });
  for (const h of opts.hlines || []) if (isFinite(ty(h.v))) { y0 = Math.min(y0, ty(h.v)); y1 = Math.max(y1, ty(h.v)); }
  if (opts.ymin !== undefined) y0 = ty(opts.ymin);
  if (opts.ymax !== undefined) y1 = ty(opts.ymax);
  if (!isFinite(x0)) { x0 = 0; x1 = 1; }
  if (!isFinite(y0)) { y0 = 0; y1 = 1; }
  if (x1 === x0) { x0 -= 0.5; x1 += 0.5; }
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  if (!opts.ylog) { const pad = (y1 - y0) * 0.04; y0 -= pad; y1 += pad; }
  const px = (x) => m.l + ((tx(x) - x0) / (x1 - x0)) * (W - m.l - m.r);
  const py = (y) => H - m.b - ((ty(y) - y0) / (y1 - y0)) * (H - m.t - m.b);
  // bands, axes and ticks
  for (const b of opts.bands || []) {
    g.fillStyle = b.color || "rgba(184,110,0,0.12)";
    const a = Math.max(px(b.x0), m.l), z = Math.min(px(b.x1), W - m.r);
    if (z > a) g.fillRect(a, m.t, z - a, H - m.t - m.b);
  }
  g.strokeStyle = "#c9ced6"; g.fillStyle = "#5b6575"; g.lineWidth = 1;
  g.strokeRect(m.l, m.t, W - m.l - m.r, H - m.t - m.b);
  const ticks = (lo, hi, log) => {
    if (!log) return niceTicks(lo, hi, 6);
    const inside = (t) => t >= lo - 1e-9 && t <= hi + 1e-9;
    const whole = niceTicks(Math.floor(lo), Math.ceil(hi), 6).filter((t) => Number.isInteger(t) && inside(t));
    if (whole.length >= 2) return whole.map((t) => Math.pow(10, t));
    // less than a decade: 1, 2 and 5 times the powers of ten
    const out = [];
    for (let e = Math.floor(lo); e <= Math.ceil(hi); e++) for (const m of [1, 2, 5]) if (inside(e + Math.log10(m))) out.push(m * Math.pow(10, e));
    return out;
  };
  g.textAlign = "center"; g.textBaseline = "top";
  for (const t of ticks(x0, x1, opts.xlog)) {
    const x = px(t); g.beginPath(); g.moveTo(x, H - m.b); g.lineTo(x, H - m.b + 4); g.stroke();
    g.fillText(tickLabel(t), x, H - m.b + 6);
  }
  g.textAlign = "right"; g.textBaseline = "middle";
  for (const t of ticks(y0, y1, opts.ylog)) {
    const y = py(t); g.beginPath(); g.moveTo(m.l - 4, y); g.lineTo(m.l, y); g.stroke();
    g.strokeStyle = "#eef0f3"; g.beginPath(); g.moveTo(m.l, y); g.lineTo(W - m.r, y); g.stroke(); g.strokeStyle = "#c9ced6";
    g.fillText(tickLabel(t), m.l - 6, y);
  }
  g.textAlign = "center"; g.textBaseline = "bottom";
  if (opts.xlabel) g.fillText(opts.xlabel, m.l + (W - m.l - m.r) / 2, H - 2);
  if (opts.title) { g.textBaseline = "top"; g.font = "600 12px system-ui, sans-serif"; g.fillStyle = "#1d2430"; g.fillText(opts.title, W / 2, 3); g.font = "11px system-ui, sans-serif"; g.fillStyle = "#5b6575"; }
  if (opts.ylabel) { g.save(); g.translate(12, m.t + (H - m.t - m.b) / 2); g.rotate(-Math.PI / 2); g.textBaseline = "middle"; g.fillText(opts.ylabel, 0, 0); g.restore(); }
  g.save(); g.beginPath(); g.rect(m.l, m.t, W - m.l - m.r, H - m.t - m.b); g.clip();
  (opts.hlines || []).forEach((h, i) => {
    if (!isFinite(ty(h.v))) return;
    const y = py(h.v);
    g.strokeStyle = h.color || "#888"; g.setLineDash([5, 4]); g.beginPath(); g.moveTo(m.l, y); g.lineTo(W - m.r, y); g.stroke(); g.setLineDash([]);
    // labels alternate left and right, below the line near the top
    g.fillStyle = h.color || "#888"; g.textAlign = i % 2 ? "right" : "left";
    g.textBaseline = y - 14 < m.t ? "top" : "bottom";
    g.fillText(h.label || "", i % 2 ? W - m.r - 4 : m.l + 4, y - 14 < m.t ? y + 2 : y - 2);
  });
  for (const v of opts.vlines || []) {
    if (!isFinite(tx(v.v))) continue;
    const x = px(v.v), right = x > W - m.r - 90;
    g.strokeStyle = v.color || "#888"; g.setLineDash([5, 4]); g.beginPath(); g.moveTo(x, m.t); g.lineTo(x, H - m.b); g.stroke(); g.setLineDash([]);
    g.fillStyle = v.color || "#888"; g.textAlign = right ? "right" : "left"; g.textBaseline = "top"; g.fillText(v.label || "", right ? x - 3 : x + 3, m.t + 2);
  }
  opts.series.forEach((s, si) => {
    const col = s.color || COLORS[si % COLORS.length];
    g.strokeStyle = col; g.fillStyle = col; g.lineWidth = s.width || 1.6;
    if (!s.dotsOnly) {
      g.beginPath(); let started = false, prevY = null;
      s.x.forEach((x, i) => {
        const y = s.y[i];
        if (!ok(x, y)) { started = false; return; }
        if (!started) { g.moveTo(px(x), py(y)); started = true; }
        else if (s.step) { g.lineTo(px(x), py(prevY)); g.lineTo(px(x), py(y)); }
        else g.lineTo(px(x), py(y));
        prevY = y;
      });
      g.stroke();
    }
    if (s.dots || s.dotsOnly) s.x.forEach((x, i) => {
      const y = s.y[i]; if (!ok(x, y)) return;
      g.fillStyle = s.dotColor ? s.dotColor(i) : col;
      g.beginPath(); g.arc(px(x), py(y), s.r || 2.6, 0, 2 * Math.PI); g.fill();
    });
  });
  g.restore();
  // what the hover readout needs: every drawn point in the chart's own
  // coordinates, its series and index
  const points = [];
  opts.series.forEach((s, si) => s.x.forEach((x, i) => { if (ok(x, s.y[i])) points.push({ si, i, x, y: s.y[i], cx: px(x), cy: py(s.y[i]) }); }));
  c.hover = { points, names: opts.series.map((s, si) => s.label || (opts.series.length > 1 ? `series ${si + 1}` : "")), xlabel: opts.xlabel || "x", ylabel: opts.ylabel || "y", onHover: opts.onHover };
  hoverable(c);
  return c;
}

// The hover readout of a chart drawn by plot(): the nearest point (within
// 16 px) named with its series, x and y; opts.onHover(i, si) links it to
// other views of the same data (the pair tables' rows).
const tip = el("div", { class: "tip", id: "tip" });
function hoverable(c) {
  if (c.hoverBound) return;
  c.hoverBound = true;
  const leave = () => { tip.style.display = "none"; if (c.hover && c.hover.onHover) c.hover.onHover(null); };
  c.addEventListener("mouseleave", leave);
  c.addEventListener("mousemove", (e) => {
    const h = c.hover;
    if (!h || !h.points.length) return;
    const r = c.getBoundingClientRect(), sx = c.cssW / r.width, sy = c.cssH / r.height;
    const mx = (e.clientX - r.left) * sx, my = (e.clientY - r.top) * sy;
    let best = null, bd = 16 * 16;
    for (const p of h.points) { const d = (p.cx - mx) ** 2 + (p.cy - my) ** 2; if (d < bd) { bd = d; best = p; } }
    if (!best) { leave(); return; }
    const name = h.names[best.si];
    tip.textContent = `${name ? name + ": " : ""}${h.xlabel} = ${fmt(best.x, 6)}, ${h.ylabel} = ${fmt(best.y, 6)}`;
    if (!tip.isConnected) document.body.append(tip);
    tip.style.display = "block";
    tip.style.left = Math.min(window.scrollX + e.clientX + 12, window.scrollX + document.documentElement.clientWidth - tip.offsetWidth - 4) + "px";
    tip.style.top = window.scrollY + e.clientY + 14 + "px";
    if (h.onHover) h.onHover(best.i, best.si);
  });
}

// A tick's label: plain decimals without trailing zeros, powers beyond.
function tickLabel(t) {
  const a = Math.abs(t);
  return a >= 1e6 || (a < 1e-3 && t !== 0) ? fmt(t, 3) : String(+t.toPrecision(6));
}

// A chart's caption for a learner: what the picture shows, in one or two sentences.
function notice(text) {
  return el("p", { class: "notice" }, el("b", {}, "What to notice: "), text);
}

function legend(items) {
  return el("div", { class: "legend" }, items.map(([label, color]) => el("span", {}, el("i", { style: `background:${color}` }), label)));
}

// Whole-number ticks from lo to hi (rows and columns: no 0.6000000000000001).
function wholeTicks(lo, hi, n) {
  return niceTicks(lo, hi, Math.max(1, Math.min(n, hi - lo))).filter((t) => Number.isInteger(t));
}

// The heatmap's colour of v in [-1, 1]: blue (−1), white (0), red (+1).
function heatColor(v) {
  const a = Math.abs(Math.max(-1, Math.min(1, v))), w = Math.round(255 * (1 - a));
  return v > 0 ? `rgb(255,${w},${w})` : `rgb(${w},${w},255)`;
}

// Blue–white–red heatmap of rows (values in [-1, 1]), with its colour bar.
function heatmap(c, rows, opts = {}) {
  const g = c.getContext("2d"), W = c.cssW, H = c.cssH;
  const m = { l: 40, r: 48, t: 8, b: 30 };
  g.clearRect(0, 0, W, H);
  const n = rows.length, d = rows[0].length;
  const cw = (W - m.l - m.r) / d, ch = (H - m.t - m.b) / n;
  for (let i = 0; i < n; i++) for (let j = 0; j < d; j++) {
    g.fillStyle = heatColor(rows[i][j]);
    g.fillRect(m.l + j * cw, m.t + i * ch, Math.ceil(cw), Math.ceil(ch));
  }
  g.fillStyle = "#5b6575"; g.font = "11px system-ui, sans-serif"; g.textAlign = "right"; g.textBaseline = "middle";
  const rowTicks = wholeTicks(0, n - 1, 6).map((t) => [t, String(t + (opts.offset || 0))]), colTicks = wholeTicks(0, d - 1, 8).map((t) => [t, String(t)]);
  for (const [t, label] of rowTicks) g.fillText(label, m.l - 4, m.t + (t + 0.5) * ch);
  g.textAlign = "center"; g.textBaseline = "top";
  for (const [t, label] of colTicks) g.fillText(label, m.l + (t + 0.5) * cw, H - m.b + 3);
  c.dataset.ticks = JSON.stringify([...rowTicks, ...colTicks].map(([, label]) => label));
  g.textBaseline = "bottom"; g.fillText(opts.xlabel || "dimension", m.l + (W - m.l - m.r) / 2, H - 1);
  g.save(); g.translate(10, m.t + (H - m.t - m.b) / 2); g.rotate(-Math.PI / 2); g.textBaseline = "middle"; g.fillText(opts.ylabel || "position", 0, 0); g.restore();
  // colour bar: +1 at the top, −1 at the bottom
  const bx = W - m.r + 10, bw = 10, top = m.t, bottom = H - m.b, steps = 100;
  for (let k = 0; k < steps; k++) {
    const v = 1 - (2 * (k + 0.5)) / steps;
    g.fillStyle = heatColor(v);
    g.fillRect(bx, top + (k * (bottom - top)) / steps, bw, Math.ceil((bottom - top) / steps) + 1);
  }
  g.strokeStyle = "#c9ced6"; g.lineWidth = 1; g.strokeRect(bx, top, bw, bottom - top);
  g.fillStyle = "#5b6575"; g.textAlign = "left"; g.textBaseline = "middle";
  for (const [v, label] of [[1, "+1"], [0, "0"], [-1, "−1"]]) g.fillText(label, bx + bw + 4, top + ((1 - v) / 2) * (bottom - top));
  c.dataset.colorbar = "-1..1";
  return c;
}

// ------------------------------------------------------------ sinusoidal ---

function viewSinusoidal(root) {
  const err = el("div", { class: "error", id: "error" });
  const heat = canvas(520, 420), bits = canvas(170, 420), sim = canvas(520, 260), waves = canvas(520, 260);
  const blocks = el("div", { class: "blocks", id: "mk-blocks" }), mkInfo = el("p", { class: "note", id: "mk-info" });
  let timer = null;
  const refresh = () => { clearTimeout(timer); timer = setTimeout(draw, 60); };
  const s = current.s;
  const layoutSel = el("select", { name: "layout" }, el("option", { value: "interleaved" }, "interleaved (sin, cos, sin, …)"), el("option", { value: "concatenated" }, "concatenated ([sin | cos])"));
  layoutSel.value = s.layout;
  layoutSel.addEventListener("change", () => { setState("layout", layoutSel.value); refresh(); });
  root.append(
    el("h2", {}, "Sinusoidal encoding (Vaswani et al. 2017)"),
    el("p", { class: "note" }, "PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d)). Each pair of columns turns at its own frequency, from one radian per position down to 1/base: the fast columns flip like the low bits of a binary counter, the slow ones like the high bits."),
    el("div", { class: "controls" },
      slider("positions", "positions", 4, 512, 1, { onchange: refresh }),
      slider("d_model", "dim", 2, 256, 2, { onchange: refresh }),
      slider("base", "base", 1, 6, 0.05, Object.assign({ onchange: refresh }, log10map)),
      el("label", {}, "layout", layoutSel),
      slider("k (shift)", "k", 0, 256, 1, { onchange: refresh }),
      slider("reference p", "ref", 0, 1000, 1, { onchange: refresh })),
    err,
    el("div", { class: "grid" },
      el("div", { class: "panel" }, el("h3", {}, "PE table (rows: positions, columns: dimensions)"), heat,
        notice("the first columns (the fast pairs) flip every few positions, like the low bits of the binary counter beside; each column to the right changes more slowly, so every row is a different pattern.")),
      el("div", { class: "panel" }, el("h3", {}, "binary counter"), bits,
        notice("bit b flips every 2^b positions: the sinusoid does the same with smooth turns instead of jumps.")),
      el("div", { class: "panel" }, el("h3", {}, "similarity of PE(p) and PE(p + k) against k"), sim,
        notice("the similarity is largest at k = 0 and falls, with ripples, as k grows; moving the reference p changes nothing, so the encoding carries relative distance."),
        legend([["cosine", COLORS[0]], ["dot product / (d/2)", COLORS[1]]]),
        el("p", { class: "note" }, "Every row has norm √(d/2), so the two curves coincide; both depend on k only, not on the reference p.")),
      el("div", { class: "panel" }, el("h3", {}, "wavelength of each pair (positions per turn)"), waves,
        notice("the wavelengths grow geometrically, from 2π up to 2π·base; pairs above the dashed line never complete a turn within the positions shown.")),
      el("div", { class: "panel", style: "max-width:1080px" }, el("h3", {}, "PE(p + k) = M_k · PE(p): the rotation blocks of M_k"), mkInfo, blocks)));

  async function draw() {
    let v;
    try {
      v = await api("/api/sinusoidal?" + qs({ positions: s.positions, dim: s.dim, base: s.base, layout: s.layout, k: s.k, ref: s.ref, max_k: Math.min(512, Math.max(16, Number(s.positions))) }));
      err.textContent = "";
    } catch (e) { err.textContent = e.message; return; }
    const rows = v.table.table;
    setExport(v, [["position", ...rows[0].map((_, j) => `dim ${j}`)], ...rows.map((r, p) => [p + Number(v.table.offset || 0), ...r])]);
    heatmap(heat, rows);
    heat.dataset.positions = rows.length; heat.dataset.dim = rows[0].length;
    heat.dataset.first = JSON.stringify(rows[Math.min(1, rows.length - 1)]);
    // binary counter: bit b of position p, the same rows as the table
    const g = bits.getContext("2d"), n = rows.length, nb = Math.max(1, Math.ceil(Math.log2(n + 1)));
    g.clearRect(0, 0, bits.cssW, bits.cssH);
    const cw = (bits.cssW - 30) / nb, ch = (bits.cssH - 38) / n;
    for (let p = 0; p < n; p++) for (let b = 0; b < nb; b++) {
      g.fillStyle = (p >> b) & 1 ? "#1d2430" : "#e9edf2";
      g.fillRect(30 + (nb - 1 - b) * cw, 8 + p * ch, Math.ceil(cw) - 1, Math.ceil(ch));
    }
    g.fillStyle = "#5b6575"; g.font = "11px system-ui"; g.textAlign = "center"; g.textBaseline = "top";
    g.fillText("bits (high … low)", 30 + (bits.cssW - 30) / 2, bits.cssH - 16);
    const sm = v.similarity, half = Number(s.dim) / 2;
    plot(sim, { series: [{ x: sm.offsets, y: sm.cosine, label: "cosine" }, { x: sm.offsets, y: sm.dot.map((d) => d / half), label: "dot product / (d/2)" }], xlabel: "k", ylabel: "similarity", hlines: [{ v: 0, label: "", color: "#bbb" }] });
    plot(waves, { series: [{ x: v.wavelengths.map((_, i) => i), y: v.wavelengths, dots: true, label: "wavelength" }], ylog: true, xlabel: "pair i", ylabel: "wavelength", hlines: [{ v: Number(s.positions), label: `positions shown (${s.positions})`, color: "#b86e00" }] });
    waves.dataset.wavelengths = JSON.stringify(v.wavelengths);
    const lm = v.linear_map;
    blocks.textContent = "";
    if (lm.error) { mkInfo.textContent = lm.error; return; }
    mkInfo.textContent = `M_k is block diagonal: pair i is rotated by the angle k·ω_i, whatever p is. Largest |M_k·PE(p) − PE(p + k)| over the first ${lm.rows_checked} positions: ${fmt(lm.max_residual, 3)}.`;
    for (const b of lm.blocks.slice(0, 24)) {
      const [[a, bb], [c, d]] = b.block;
      blocks.append(el("div", { class: "block" }, `pair ${b.pair} (cols ${b.columns[0]}, ${b.columns[1]}), k·ω = ${fmt(Number(s.k) * b.omega, 4)}`,
        el("table", {}, el("tr", {}, el("td", {}, a.toFixed(4)), el("td", {}, bb.toFixed(4))), el("tr", {}, el("td", {}, c.toFixed(4)), el("td", {}, d.toFixed(4))))));
    }
    if (lm.blocks.length > 24) blocks.append(el("div", { class: "block" }, `… ${lm.blocks.length - 24} more pairs`));
    root.dataset.ready = "1";
  }
  draw();
}

// ------------------------------------------------------------------ rope ---

function viewRope(root) {
  const err = el("div", { class: "error", id: "error" });
  const clocks = canvas(560, 340), wl = canvas(520, 300), decay = canvas(520, 300);
  const unturnedNote = el("p", { class: "note", id: "rope-unturned" });
  let timer = null;
  const refresh = () => { clearTimeout(timer); timer = setTimeout(draw, 60); };
  const s = current.s;
  root.append(
    el("h2", {}, "Rotary position embedding (Su et al. 2021, RoFormer)"),
    el("p", { class: "note" }, "RoPE turns the pair (x_2i, x_2i+1) of each query and key by the angle p·θ_i with θ_i = base^(−2i/d). The dot product of a query at p and a key at q then depends on p − q only. Each clock below is one pair at the chosen position; the wavelength 2π/θ_i is how many positions one turn takes."),
    el("div", { class: "controls" },
      slider("head_dim", "dim", 4, 256, 2, { onchange: refresh }),
      slider("base", "base", 1, 7, 0.05, Object.assign({ onchange: refresh }, log10map)),
      slider("position", "position", 0, 6, 0.01, Object.assign({ onchange: refresh }, log10map)),
      slider("context length", "context", 2, 7, 0.05, Object.assign({ onchange: refresh }, log10map)),
      slider("second base", "base2", 1, 7, 0.05, Object.assign({ onchange: refresh }, log10map))),
    err,
    el("div", { class: "grid" },
      el("div", { class: "panel" }, el("h3", {}, "each pair's rotation at the position (the clock picture)"), clocks,
        notice("by this position the first pairs have turned many times and the last ones have barely moved; orange clocks never complete a turn within the context length.")),
      el("div", { class: "panel" }, el("h3", {}, "wavelength per pair against the context length"), wl, unturnedNote,
        notice("a larger base stretches every wavelength, so more pairs stay under one turn within the context: the second base shows by how much."),
        legend([["base", COLORS[0]], ["second base", COLORS[1]]])),
      el("div", { class: "panel" }, el("h3", {}, "RoFormer's long-term decay bound (§3.4.3) against relative distance"), decay,
        notice("the bound falls with the distance between query and key, with ripples: far tokens can contribute less; with a larger base it falls more slowly."),
        legend([["base", COLORS[0]], ["second base", COLORS[1]]]))));

  async function draw() {
    let a, b;
    try {
      const common = { dim: s.dim, position: s.position, context: s.context, max_distance: Math.max(256, Math.min(Number(s.context), 65536)), points: 400 };
      [a, b] = await Promise.all([api("/api/rope?" + qs(Object.assign({ base: s.base }, common))), api("/api/rope?" + qs(Object.assign({ base: s.base2 }, common)))]);
      err.textContent = "";
    } catch (e) { err.textContent = e.message; return; }
    // clocks
    const g = clocks.getContext("2d"), n = a.angle.length, cols = Math.ceil(Math.sqrt(n * 1.6)), rowsN = Math.ceil(n / cols);
    const cell = Math.min((clocks.cssW - 10) / cols, (clocks.cssH - 10) / rowsN), r = cell * 0.38;
    g.clearRect(0, 0, clocks.cssW, clocks.cssH);
    g.font = "10px system-ui"; g.textAlign = "center"; g.textBaseline = "top";
    for (let i = 0; i < n; i++) {
      const cx = 5 + (i % cols + 0.5) * cell, cy = 5 + (Math.floor(i / cols) + 0.45) * cell;
      const seen = a.turns_in_context[i] >= 1;
      g.strokeStyle = seen ? "#c9ced6" : "#e6b27a"; g.lineWidth = 1; g.beginPath(); g.arc(cx, cy, r, 0, 2 * Math.PI); g.stroke();
      g.strokeStyle = COLORS[0]; g.lineWidth = 2; g.beginPath(); g.moveTo(cx, cy); g.lineTo(cx + r * a.cos[i], cy - r * a.sin[i]); g.stroke();
      if (cell > 26) { g.fillStyle = "#5b6575"; g.fillText(String(i), cx, cy + r + 1); }
    }
    clocks.dataset.angles = JSON.stringify(a.angle);
    setExport({ base: a, second_base: b }, [["pair", "inv_freq", "angle at position", "wavelength", "turns in context", "second base inv_freq", "second base wavelength"],
      ...a.inv_freq.map((w, i) => [i, w, a.angle[i], a.wavelengths[i], a.turns_in_context[i], b.inv_freq[i], b.wavelengths[i]])]);
    const pairs = a.inv_freq.map((_, i) => i);
    plot(wl, { series: [{ x: pairs, y: a.wavelengths, dots: true, label: `base ${s.base}` }, { x: pairs, y: b.wavelengths, dots: true, label: `second base ${s.base2}` }], ylog: true, xlabel: "pair i", ylabel: "wavelength (positions)", hlines: [{ v: Number(s.context), label: `context ${s.context}`, color: "#b86e00" }] });
    const unturned = a.turns_in_context.filter((t) => t < 1).length;
    unturnedNote.textContent = `${unturned} of ${n} pairs make less than one turn within ${s.context} positions (base ${s.base}; orange clocks): their angles near the end of the context are ones no shorter sequence showed.`;
    plot(decay, { series: [{ x: a.decay.distances, y: a.decay.bound, label: `base ${s.base}` }, { x: b.decay.distances, y: b.decay.bound, label: `second base ${s.base2}` }], xlabel: "relative distance", ylabel: "(1/(d/2)) Σ|S_j|" });
    root.dataset.ready = "1";
  }
  draw();
}

// ----------------------------------------------------------------- model ---

let configList = null;
async function configs() {
  if (!configList) configList = (await api("/api/configs")).configs;
  return configList;
}

async function configText(name) {
  const r = await fetch("/api/configs/" + encodeURIComponent(name));
  if (!r.ok) throw new Error(`no bundled config ${name}`);
  return r.text();
}

// The picker of bundled configs with a textarea for a pasted one.
function configPicker(keyCfg, keyText, onload, id) {
  const sel = el("select", { name: keyCfg, id: id + "-select" }, el("option", { value: "" }, "— paste below —"));
  const ta = el("textarea", { name: keyText, id: id + "-text", spellcheck: "false", placeholder: "paste a config.json here" });
  const btn = el("button", { id: id + "-load" }, "Inspect");
  configs().then((list) => {
    for (const c of list) sel.append(el("option", { value: c.name }, c.label));
    sel.value = current.s[keyCfg];
    start();
  });
  async function start() {
    // a link's own text (older links carried it), else this tab's paste when
    // no bundled config is named, else the bundled config
    const pasted = current.s[keyCfg] ? "" : sessionStorage.getItem(pasteKey(keyText)) || "";
    if (current.s[keyText]) ta.value = current.s[keyText];
    else if (pasted) { ta.value = pasted; current.s[keyText] = pasted; }
    else if (current.s[keyCfg]) ta.value = await configText(current.s[keyCfg]);
    onload(ta.value);
  }
  sel.addEventListener("change", async () => {
    setState(keyCfg, sel.value); setState(keyText, "");
    if (sel.value) { ta.value = await configText(sel.value); onload(ta.value); }
  });
  btn.addEventListener("click", () => {
    try { sessionStorage.setItem(pasteKey(keyText), ta.value); } catch (e) { /* storage full or off: the paste lives in the page only */ }
    sel.value = ""; setState(keyCfg, ""); setState(keyText, ta.value); onload(ta.value);
  });
  return { node: el("div", {}, el("label", {}, "a real config: ", sel), ta, btn, el("span", { class: "note" }, " a pasted config stays in this tab, not in the page's link")), ta, sel };
}

const ROLE_COLORS = { kept: "#1b7f3b", interpolated: "#2f6fd0", ramp: "#b86e00", rescaled: "#7b3fb5", "not rotated": "#888" };
const AXES = ["t", "h", "w"];

function inspectOf(m, name) {
  const ins = m.inspect;
  return ins.layer_types ? ins.layer_types[name] : ins;
}

function summary(m) {
  const kv = el("div", { class: "kv" });
  const add = (k, v) => { if (v !== null && v !== undefined && v !== "") kv.append(el("b", {}, k), el("span", {}, v)); };
  add("model_type", m.model_type);
  add("layers", m.num_layers || null);
  add("layer types with RoPE", m.layer_types.map((t) => t.name + (t.layers ? ` (layers ${t.layers})` : "")).join("; "));
  add("NoPE layers", m.nope_layers);
  if (m.mrope_section) add("M-RoPE section (t, h, w)", `${m.mrope_section.join(", ")} pairs${m.inspect.mrope_interleaved ? ", interleaved" : ", chunked"}`);
  if (m.inspect.attention_chunk_size) add("attention chunk", m.inspect.attention_chunk_size + " tokens");
  if (m.inspect.nope_attn_temperature) add("NoPE attention temperature", JSON.stringify(m.inspect.nope_attn_temperature));
  if (m.inspect.softmax_scale_factor) add("softmax scale × (mscale²)", fmt(m.inspect.softmax_scale_factor, 6));
  if (m.inspect.vision) add("vision encoder", `${m.inspect.vision.kind} 2-D RoPE, head_dim ${m.inspect.vision.head_dim}, θ ${m.inspect.vision.rope_theta}`);
  return kv;
}

function layerTypePanel(m, t, target, width = 520) {
  const ins = inspectOf(m, t.name);
  const box = el("div", { class: "panel", "data-layer-type": t.name });
  const sc = t.scaling || {};
  const kv = el("div", { class: "kv" });
  const add = (k, v) => { if (v !== null && v !== undefined) kv.append(el("b", {}, k), el("span", {}, v)); };
  add("rope_type", t.rope_type); add("rope_theta", fmt(t.rope_theta, 8)); add("head_dim / rotary_dim", `${t.head_dim} / ${t.rotary_dim}`);
  add("layout", t.layout); add("attention factor", fmt(t.attention_factor, 8));
  add("max_position_embeddings", t.max_position_embeddings); add("original_max_position_embeddings", t.original_max_position_embeddings);
  const shown = new Set(["correction_range", "original_max_position_embeddings", "max_position_embeddings", "high_freq_wavelen", "low_freq_wavelen", "uses_long_factor", "target_uses_long_factor"]);
  // LongRoPE: which factor set each column uses (short up to the original length, long past it)
  const set = (long) => (long ? "long_factor" : "short_factor");
  const longrope = Array.isArray(sc.long_factor);
  if (longrope) add("factor set", `${set(sc.uses_long_factor)} in the frequency columns (seq_len ${m.seq_len || "not given"})` + (target ? `, ${set(sc.target_uses_long_factor)} at N = ${target}` : ""));
  for (const [k, v] of Object.entries(sc)) if (!Array.isArray(v) && !shown.has(k) && v !== null) add(k, typeof v === "number" ? fmt(v, 6) : String(v));
  if (sc.correction_range) add("YaRN correction range (pairs)", `${fmt(sc.correction_range[0], 4)} … ${fmt(sc.correction_range[1], 4)}: below kept (> β_fast turns), above interpolated (< β_slow turns)`);
  if (sc.high_freq_wavelen) add("llama3 bands", `wavelength < ${fmt(sc.high_freq_wavelen, 6)} kept, > ${fmt(sc.low_freq_wavelen, 6)} divided by ${sc.factor}, between: smooth`);
  if (target && t.unseen_pairs !== null) add(`at N = ${target}`, `${t.unseen_pairs} of ${t.pairs.length} pairs reach angles never seen in pre-training (L = ${t.train_len})`);
  const pairs = t.pairs.map((p) => p.pair);
  // M-RoPE without a scaling: colour the pairs by their axis (t, h, w)
  const byAxis = t.num_axes > 1 && t.pairs.every((p) => p.role === "kept");
  const roleColor = (i) => (byAxis ? COLORS[t.pairs[i].axis % COLORS.length] : ROLE_COLORS[t.pairs[i].role]);
  const f = canvas(width, 280), w = canvas(width, 280);
  const vlines = [];
  // YaRN's correction range is in pair indices (transformers ramps over dim // 2 entries)
  if (sc.correction_range) { vlines.push({ v: sc.correction_range[0], label: "β_fast", color: "#b86e00" }, { v: sc.correction_range[1], label: "β_slow", color: "#b86e00" }); }
  // hovering a chart's point marks its pair's row in the table below
  const rowEls = [];
  const onHover = (i) => {
    for (const r of rowEls) r.classList.remove("hover");
    const r = i === null ? null : rowEls[i];
    if (!r) return;
    r.classList.add("hover");
    const box = r.closest(".scroll");
    if (box && (r.offsetTop < box.scrollTop + 24 || r.offsetTop > box.scrollTop + box.clientHeight - 24)) box.scrollTop = r.offsetTop - box.clientHeight / 2;
  };
  plot(f, { series: [{ x: pairs, y: t.pairs.map((p) => p.unscaled_inv_freq), color: "#aab2bf", label: "unscaled" }, { x: pairs, y: t.pairs.map((p) => p.inv_freq), dots: true, dotColor: roleColor, label: "scaled" }], ylog: true, xlabel: "pair i", ylabel: "inv_freq (rad / position)", vlines, onHover });
  const hl = [];
  if (t.train_len) hl.push({ v: t.train_len, label: `training length ${t.train_len}`, color: "#1b7f3b" });
  if (target) hl.push({ v: target, label: `N = ${target}`, color: "#d0542f" });
  if (sc.high_freq_wavelen) hl.push({ v: sc.high_freq_wavelen, label: "high_freq_wavelen", color: "#b86e00" }, { v: sc.low_freq_wavelen, label: "low_freq_wavelen", color: "#b86e00" });
  plot(w, { series: [{ x: pairs, y: t.pairs.map((p) => p.unscaled_wavelength), color: "#aab2bf", label: "unscaled" }, { x: pairs, y: t.pairs.map((p) => p.wavelength), dots: true, dotColor: roleColor, label: "scaled" }], ylog: true, xlabel: "pair i", ylabel: "wavelength (positions)", hlines: hl, onHover });
  const charts = el("div", { class: "grid" },
    el("div", {}, el("h3", {}, "frequency per pair (grey: unscaled)"), f,
      notice("where the dots leave the grey line the scaling changed that pair: kept pairs lie on it, interpolated ones sit the factor below it.")),
    el("div", {}, el("h3", {}, "wavelength per pair"), w,
      notice("pairs whose wavelength is above the training length never completed a turn in pre-training: at a longer N these are the ones that can meet angles they never saw.")));
  if (sc.long_factor) {
    const lf = canvas(width, 220);
    plot(lf, { series: [{ x: pairs, y: sc.short_factor, dots: true, label: "short_factor" }, { x: pairs, y: sc.long_factor, dots: true, label: "long_factor" }], xlabel: "pair i", ylabel: "LongRoPE factor λ_i", onHover });
    charts.append(el("div", {}, el("h3", {}, "LongRoPE factors"), lf, legend([["short_factor", COLORS[0]], ["long_factor", COLORS[1]]])));
  }
  const invHead = longrope ? `inv_freq (${set(sc.uses_long_factor)})` : "inv_freq";
  const angleHead = longrope ? `max angle at N (rad, ${set(sc.target_uses_long_factor)})` : "max angle at N (rad)";
  const table = el("table", { class: "pairs" }, el("tr", {}, ["pair", t.num_axes > 1 ? "axis" : null, invHead, "unscaled", "ratio", "wavelength", "role", target ? angleHead : null, target ? "seen in training" : null].filter((x) => x).map((h) => el("th", {}, h))));
  t.pairs.forEach((p, i) => {
    const iv = ins && ins.inv_freq ? ins.inv_freq[i] : p.inv_freq;
    table.append(rowEls[i] = el("tr", { class: p.unseen ? "unseen" : "", "data-pair": p.pair },
      el("td", {}, p.pair),
      t.num_axes > 1 ? el("td", {}, AXES[p.axis] || p.axis) : null,
      el("td", { class: "inv-freq", "data-value": String(iv) }, fmt(iv, 6)),
      el("td", {}, fmt(p.unscaled_inv_freq, 6)),
      el("td", {}, fmt(p.ratio, 5)),
      el("td", {}, fmt(p.wavelength, 6)),
      el("td", { class: "role-" + p.role.replace(" ", "-") }, p.role),
      target ? el("td", {}, fmt(p.target_max_angle, 4)) : null,
      target ? el("td", { class: "seen" }, p.unseen === undefined ? "unknown" : p.unseen ? "no: unseen angles" : "yes") : null));
  });
  box.append(el("h3", {}, `layer type ${t.name}` + (t.layers ? ` (layers ${t.layers})` : "")), kv, charts,
    byAxis ? legend(AXES.slice(0, t.num_axes).map((a, i) => [`axis ${a} (every pair kept)`, COLORS[i]])) : legend(Object.entries(ROLE_COLORS)),
    el("div", { class: "scroll" }, table));
  return box;
}

function viewModel(root) {
  const err = el("div", { class: "error", id: "error" }), out = el("div", { id: "model-out" });
  const s = current.s;
  let lastText = "";
  const picker = configPicker("cfg", "text", (text) => { lastText = text; load(); }, "model");
  root.append(
    el("h2", {}, "A model's RoPE"),
    el("p", { class: "note" }, "Pick a real config.json or paste one (transformers' keys: rope_theta, rope_scaling or rope_parameters, head_dim, partial_rotary_factor, layer_types, mrope_section …). Each pair's frequency is transformers' own (f32), compared with the unscaled base^(−2i/d): kept, interpolated (÷ factor), on the ramp between, or otherwise rescaled. With a target length N, the pairs whose largest angle at N was never reached in pre-training are marked."),
    el("div", { class: "controls" }, numberInput("target length N", "target", { min: 1, onchange: load }), numberInput("seq_len (dynamic, LongRoPE)", "seq", { min: 1, onchange: load })),
    el("div", { class: "panel" }, picker.node), err, out);
  async function load() {
    const body = { config: lastText };
    if (s.target) body.target_len = Number(s.target);
    if (s.seq) body.seq_len = Number(s.seq);
    let m;
    try { m = await api("/api/model", body); err.textContent = ""; } catch (e) { err.textContent = e.message; out.textContent = ""; root.dataset.ready = "error"; return; }
    out.textContent = "";
    if (m.warnings && m.warnings.length) out.append(el("div", { class: "warning", id: "model-warnings" }, ...m.warnings.map((w) => el("p", {}, "⚠ " + w))));
    out.append(el("div", { class: "panel" }, summary(m)));
    for (const t of m.layer_types) out.append(layerTypePanel(m, t, body.target_len));
    setExport(m, [["layer_type", ...PAIR_COLUMNS], ...pairRows(m)]);
    root.dataset.ready = "1";
  }
}

// --------------------------------------------------------------- compare ---

const SCALINGS = {
  "linear ×4": (orig) => ({ rope_type: "linear", factor: 4.0 }),
  "dynamic ×4": (orig) => ({ rope_type: "dynamic", factor: 4.0 }),
  "YaRN ×4": (orig) => ({ rope_type: "yarn", factor: 4.0, original_max_position_embeddings: orig }),
  "llama3 ×8": (orig) => ({ rope_type: "llama3", factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: orig }),
  "none (default)": () => ({ rope_type: "default" }),
};

// The config text with another scaling (in rope_parameters when the config
// keeps its RoPE there, else in rope_scaling).
function withScaling(text, name) {
  const c = JSON.parse(text);
  const flat = (p) => p && typeof p === "object" && !Object.values(p).some((v) => v && typeof v === "object" && !Array.isArray(v));
  const orig = (c.rope_scaling && c.rope_scaling.original_max_position_embeddings) || c.max_position_embeddings || 4096;
  const sc = SCALINGS[name](orig);
  if (flat(c.rope_parameters)) {
    const theta = c.rope_parameters.rope_theta;
    c.rope_parameters = Object.assign(theta !== undefined ? { rope_theta: theta } : {}, sc);
  } else c.rope_scaling = sc;
  return JSON.stringify(c, null, 1);
}

function viewCompare(root) {
  const s = current.s;
  const err = el("div", { class: "error", id: "error" }), out = el("div", { id: "compare-out" });
  const texts = { a: "", b: "" };
  const pa = configPicker("a", "atext", (t) => { texts.a = t; load(); }, "cmp-a");
  const pb = configPicker("b", "btext", (t) => { texts.b = t; load(); }, "cmp-b");
  const scSel = el("select", { id: "cmp-scaling" }, Object.keys(SCALINGS).map((k) => el("option", { value: k }, k)));
  if (SCALINGS[s.bsc]) scSel.value = s.bsc;
  const scBtn = el("button", { id: "cmp-apply" }, "B = A with this scaling");
  // B as "A with a scaling" is kept in the URL by the scaling's name (bsc),
  // never as B's text: a shared link derives B from A again.
  scBtn.addEventListener("click", () => {
    try { pb.ta.value = withScaling(pa.ta.value, scSel.value); } catch (e) { err.textContent = "config A is not JSON: " + e.message; return; }
    pb.sel.value = ""; setState("b", ""); setState("btext", ""); setState("bsc", scSel.value); texts.b = pb.ta.value; load();
  });
  // choosing or pasting a B of its own ends "A with a scaling" (capture: before the picker's own handler)
  const ownB = () => setState("bsc", "");
  pb.sel.addEventListener("change", ownB, true);
  pb.node.querySelector("button").addEventListener("click", ownB, true);
  // what the legends and headings call each side
  const picked = (p) => (p.sel.value && p.sel.selectedOptions[0] ? p.sel.selectedOptions[0].textContent : "pasted config");
  const names = () => { const a = picked(pa); return { a, b: SCALINGS[s.bsc] ? `${a}, with ${s.bsc}` : picked(pb) }; };
  const hA = el("h3", { id: "cmp-a-name" }, "A"), hB = el("h3", { id: "cmp-b-name" }, "B");
  root.append(el("h2", {}, "Compare two configs (or two scalings of one)"),
    el("div", { class: "controls" }, numberInput("target length N", "target", { min: 1, onchange: () => load() }), el("label", {}, "scaling for B:", scSel), scBtn),
    el("div", { class: "cols2" }, el("div", { class: "panel" }, hA, pa.node), el("div", { class: "panel" }, hB, pb.node)),
    err, out);
  let seq = 0;
  async function load() {
    if (SCALINGS[s.bsc] && texts.a) {
      try { texts.b = withScaling(texts.a, s.bsc); pb.ta.value = texts.b; pb.sel.value = ""; } catch (e) { err.textContent = "config A is not JSON: " + e.message; root.dataset.ready = "error"; return; }
    }
    if (!texts.a || !texts.b) return;
    const n = names();
    hA.textContent = "A: " + n.a; hB.textContent = "B: " + n.b;
    const my = ++seq;
    const target = s.target ? Number(s.target) : undefined;
    let a, b;
    try {
      [a, b] = await Promise.all([api("/api/model", { config: texts.a, target_len: target }), api("/api/model", { config: texts.b, target_len: target })]);
      err.textContent = "";
    } catch (e) { err.textContent = e.message; root.dataset.ready = "error"; return; }
    if (my !== seq) return;
    out.textContent = "";
    setExport({ a, b, a_name: n.a, b_name: n.b }, [["side", "layer_type", ...PAIR_COLUMNS], ...pairRows(a, "A"), ...pairRows(b, "B")]);
    // which layer type of each side is overlaid (every one can be: alt, blt in the URL)
    const pick = (m, key) => m.layer_types.find((x) => x.name === s[key]) || m.layer_types[0];
    const ta = pick(a, "alt"), tb = pick(b, "blt");
    const typeSel = (m, key, side) => (m.layer_types.length > 1
      ? el("label", {}, `${side}'s layer type: `, el("select", { id: `cmp-${side.toLowerCase()}-type`, onchange: (e) => { setState(key, e.target.value); load(); } },
        m.layer_types.map((x) => { const o = el("option", { value: x.name }, x.name); if (x === (side === "A" ? ta : tb)) o.selected = true; return o; })))
      : null);
    const wl = canvas(540, 300), ratio = canvas(540, 300);
    if (ta && tb) {
      plot(wl, { series: [{ x: ta.pairs.map((p) => p.pair / ta.pairs.length), y: ta.pairs.map((p) => p.wavelength), dots: true, label: "A" }, { x: tb.pairs.map((p) => p.pair / tb.pairs.length), y: tb.pairs.map((p) => p.wavelength), dots: true, label: "B" }], ylog: true, xlabel: "pair i / (rotary_dim/2)", ylabel: "wavelength", hlines: target ? [{ v: target, label: `N = ${target}`, color: "#b86e00" }] : [] });
      plot(ratio, { series: [{ x: ta.pairs.map((p) => p.pair / ta.pairs.length), y: ta.pairs.map((p) => p.ratio), dots: true, label: "A" }, { x: tb.pairs.map((p) => p.pair / tb.pairs.length), y: tb.pairs.map((p) => p.ratio), dots: true, label: "B" }], ylog: true, xlabel: "pair i / (rotary_dim/2)", ylabel: "scaled / unscaled frequency" });
      const sels = [typeSel(a, "alt", "A"), typeSel(b, "blt", "B")].filter((x) => x);
      if (sels.length) out.append(el("div", { class: "controls" }, sels));
      out.append(el("div", { class: "grid" },
        el("div", { class: "panel" }, el("h3", {}, `overlaid: wavelength per pair (layer type ${ta.name} / ${tb.name})`), wl, legend([["A: " + n.a, COLORS[0]], ["B: " + n.b, COLORS[1]]]),
          notice("where the two curves part, the two RoPEs differ; a curve shifted up is a slower rotation, stretched to reach further positions.")),
        el("div", { class: "panel" }, el("h3", {}, "overlaid: what the scaling does to each frequency"), ratio, legend([["A: " + n.a, COLORS[0]], ["B: " + n.b, COLORS[1]]]),
          notice("1 is a pair kept as trained; below 1 the scaling slows that pair down (interpolation), typically the slow pairs more than the fast ones."))));
      // pair by pair, side by side (pairs matched by index; a note where the sizes differ)
      const k = Math.min(ta.pairs.length, tb.pairs.length);
      const diff = el("table", { class: "pairs", id: "cmp-diff" }, el("tr", {}, ["pair", "A inv_freq", "B inv_freq", "B / A", "A wavelength", "B wavelength", "A role", "B role"].map((h) => el("th", {}, h))));
      for (let i = 0; i < k; i++) {
        const pa_ = ta.pairs[i], pb_ = tb.pairs[i];
        diff.append(el("tr", { "data-pair": i }, el("td", {}, i), el("td", {}, fmt(pa_.inv_freq, 6)), el("td", {}, fmt(pb_.inv_freq, 6)),
          el("td", { class: "ratio-ba", "data-value": String(pb_.inv_freq / pa_.inv_freq) }, fmt(pb_.inv_freq / pa_.inv_freq, 5)),
          el("td", {}, fmt(pa_.wavelength, 6)), el("td", {}, fmt(pb_.wavelength, 6)),
          el("td", { class: "role-" + pa_.role.replace(" ", "-") }, pa_.role), el("td", { class: "role-" + pb_.role.replace(" ", "-") }, pb_.role)));
      }
      out.append(el("div", { class: "panel" }, el("h3", {}, `pair by pair: B against A (layer type ${ta.name} / ${tb.name})`),
        ta.pairs.length !== tb.pairs.length ? el("p", { class: "note" }, `A has ${ta.pairs.length} pairs, B ${tb.pairs.length}: the first ${k} are matched by index.`) : null,
        el("div", { class: "scroll" }, diff)));
    }
    out.append(el("div", { class: "cols2" },
      el("div", { id: "cmp-a-out" }, el("div", { class: "panel" }, el("h3", {}, "A: " + n.a), summary(a)), a.layer_types.map((t) => layerTypePanel(a, t, target, 540))),
      el("div", { id: "cmp-b-out" }, el("div", { class: "panel" }, el("h3", {}, "B: " + n.b), summary(b)), b.layer_types.map((t) => layerTypePanel(b, t, target, 540)))));
    root.dataset.ready = "1";
  }
}

// ------------------------------------------------------------------ bias ---

function viewBias(root) {
  const s = current.s;
  const err = el("div", { class: "error", id: "error" });
  const al = canvas(520, 300), t5c = canvas(520, 300), sh = canvas(520, 300), slopes = el("p", { class: "note", id: "alibi-slopes" });
  let timer = null;
  const refresh = () => { clearTimeout(timer); timer = setTimeout(draw, 60); };
  const bid = el("input", { type: "checkbox", name: "bidir" }); bid.checked = s.bidir === "1";
  bid.addEventListener("change", () => { setState("bidir", bid.checked ? "1" : "0"); refresh(); });
  root.append(el("h2", {}, "Relative position biases"),
    el("p", { class: "note" }, "ALiBi (Press et al. 2022) adds −m_h·distance to the logits of head h, with geometric slopes m_h. T5 (Raffel et al. 2020) learns one bias per bucket: exact buckets for small distances, logarithmic ones up to max_distance, one shared bucket beyond. Shaw et al. (2018) learn one vector per distance, clipped at ±k."),
    el("div", { class: "controls" },
      slider("ALiBi heads", "heads", 1, 64, 1, { onchange: refresh }),
      slider("T5 buckets", "buckets", 2, 128, 1, { onchange: refresh }),
      slider("T5 max_distance", "maxdist", 2, 1024, 1, { onchange: refresh }),
      el("label", {}, "T5 bidirectional", bid),
      slider("Shaw k", "shawk", 0, 64, 1, { onchange: refresh })),
    err,
    el("div", { class: "grid" },
      el("div", { class: "panel" }, el("h3", {}, "ALiBi: bias per head against distance"), al, slopes,
        notice("each head's bias is a straight line in the distance, with slopes falling geometrically from head to head: steep heads look nearby, flat heads far.")),
      el("div", { class: "panel" }, el("h3", {}, "T5: bucket against relative position (key − query)"), t5c,
        notice("small distances get a bucket each, larger ones share logarithmically wider buckets, and everything past max_distance shares the last bucket.")),
      el("div", { class: "panel" }, el("h3", {}, "Shaw: the clipped distance, the table row used"), sh,
        notice("past ±k every distance uses the same table row: the model cannot tell those distances apart."))));
  async function draw() {
    let a, t, h;
    const md = Number(s.maxdist);
    try {
      [a, t, h] = await Promise.all([
        api("/api/bias/alibi?" + qs({ heads: s.heads, max_distance: 64, points: 65 })),
        api("/api/bias/t5?" + qs({ buckets: s.buckets, max_distance: s.maxdist, bidirectional: s.bidir === "1", lo: -Math.round(md * 1.25), hi: Math.round(md * 1.25) })),
        api("/api/bias/shaw?" + qs({ max_relative: s.shawk, lo: -64, hi: 64 }))]);
      err.textContent = "";
    } catch (e) { err.textContent = e.message; return; }
    plot(al, { series: a.bias.map((b, h) => ({ x: a.distances, y: b, width: 1.2, label: `head ${h} (slope ${fmt(a.slopes[h], 4)})` })), xlabel: "distance (query − key)", ylabel: "bias" });
    slopes.textContent = "slopes: " + a.slopes.map((x) => fmt(x, 4)).join(", ");
    setExport({ alibi: a, t5: t, shaw: h }, [["distance (query − key)", ...a.slopes.map((m, i) => `ALiBi head ${i} (slope ${m})`)], ...a.distances.map((d, j) => [d, ...a.bias.map((b) => b[j])])]);
    slopes.dataset.slopes = JSON.stringify(a.slopes);
    plot(t5c, { series: [{ x: t.relative, y: t.bucket, step: true, label: "T5" }], xlabel: "relative position", ylabel: "bucket", vlines: [{ v: -md, label: "−max_distance", color: "#b86e00" }, { v: md, label: "max_distance", color: "#b86e00" }] });
    plot(sh, { series: [{ x: h.relative, y: h.clipped, step: true, label: "Shaw" }], xlabel: "relative position", ylabel: "clipped distance", hlines: [{ v: Number(s.shawk), label: "k", color: "#b86e00" }, { v: -Number(s.shawk), label: "−k", color: "#b86e00" }] });
    root.dataset.ready = "1";
  }
  draw();
}

// ------------------------------------------------------------------ main ---

const VIEWS = { sinusoidal: viewSinusoidal, rope: viewRope, model: viewModel, compare: viewCompare, bias: viewBias };

// ---------------------------------------------------------------- export ---

// A model's pairs as CSV rows (one per pair of every layer type).
const PAIR_COLUMNS = ["pair", "axis", "inv_freq", "unscaled_inv_freq", "ratio", "wavelength", "unscaled_wavelength", "role", "target_inv_freq", "target_max_angle", "train_max_angle", "unseen"];
function pairRows(m, side) {
  const rows = [];
  for (const t of m.layer_types) for (const p of t.pairs) rows.push([...(side ? [side] : []), t.name, ...PAIR_COLUMNS.map((k) => p[k])]);
  return rows;
}

// What the current view shows, for the export bar: its API answers (JSON),
// its main table (CSV rows, the first the header) and its charts (PNG).
let exported = null;
function setExport(json, rows) { exported = { json, rows }; }

function csvText(rows) {
  const cell = (v) => (v === null || v === undefined ? "" : /[",\n]/.test(String(v)) ? `"${String(v).replace(/"/g, '""')}"` : String(v));
  return rows.map((r) => r.map(cell).join(",")).join("\n") + "\n";
}

function download(name, blob) {
  const a = el("a", { href: URL.createObjectURL(blob), download: name });
  document.body.append(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

// Every chart of the view in one PNG, stacked, at the screen's resolution.
function chartsPng() {
  const cs = [...document.querySelectorAll("main canvas")];
  const w = Math.max(...cs.map((c) => c.width)), h = cs.reduce((s, c) => s + c.height, 0);
  const out = document.createElement("canvas");
  out.width = w; out.height = h;
  const g = out.getContext("2d");
  g.fillStyle = "#fff"; g.fillRect(0, 0, w, h);
  let y = 0;
  for (const c of cs) { g.drawImage(c, 0, y); y += c.height; }
  return out;
}

function exportBar() {
  const name = () => `posenc-${current.view}`;
  const btn = (label, id, f) => el("button", { id, onclick: () => { if (exported) f(); } }, label);
  return el("div", { class: "export" }, "export: ",
    btn("JSON", "export-json", () => download(name() + ".json", new Blob([JSON.stringify(exported.json, null, 1)], { type: "application/json" }))),
    btn("CSV", "export-csv", () => download(name() + ".csv", new Blob([csvText(exported.rows)], { type: "text/csv" }))),
    btn("PNG", "export-png", () => chartsPng().toBlob((b) => download(name() + ".png", b), "image/png")));
}

function render() {
  current = readHash();
  exported = null;
  const main = document.getElementById("main");
  main.textContent = "";
  const root = el("section", { id: "view-" + current.view });
  main.append(exportBar(), root);
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.view === current.view);
  VIEWS[current.view](root);
  writeHash();
}

// history.replaceState (the views' own state updates) fires no hashchange:
// this runs for a tab, a link or a URL edited by hand.
window.addEventListener("hashchange", render);
render();
