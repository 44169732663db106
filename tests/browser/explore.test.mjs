// Browser tests of `posenc explore`: Debian's chromium (playwright's own
// browser download is not used) drives every view of the page served by
// the binary, and the numbers the page shows are compared with the CLI's
// (`posenc rope inspect --json`, `posenc table sinusoidal --json`,
// `posenc bias alibi --json`). A screenshot of each view is written to the
// directory printed at the start (POSENC_SHOTS, else a fresh temporary one).
//
// POSENC_BIN: the binary (default: target/debug/posenc); CHROMIUM: the
// browser (default: /usr/bin/chromium).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { createServer } from "node:http";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const bin = process.env.POSENC_BIN || path.join(root, "target/debug/posenc");
const shots = process.env.POSENC_SHOTS || mkdtempSync(path.join(tmpdir(), "posenc-explore-shots-"));
mkdirSync(shots, { recursive: true });
console.log(`screenshots: ${shots}`);
const fixture = (p) => path.join(root, "crates/posenc/tests/fixtures", p);

let server, url, browser, page;
const pageErrors = [];

function cli(...args) {
  return JSON.parse(execFileSync(bin, args, { encoding: "utf8" }));
}

before(async () => {
  server = spawn(bin, ["explore", "--port", "0"], { stdio: ["ignore", "pipe", "inherit"] });
  url = await new Promise((resolve, reject) => {
    let buf = "";
    const timer = setTimeout(() => reject(new Error("posenc explore printed no URL in 20 s")), 20000);
    server.stdout.on("data", (d) => {
      buf += d;
      const nl = buf.indexOf("\n");
      if (nl >= 0) { clearTimeout(timer); resolve(buf.slice(0, nl).trim()); }
    });
    server.on("exit", (code) => reject(new Error(`posenc explore exited with ${code}`)));
  });
  assert.match(url, /^http:\/\/127\.0\.0\.1:\d+\/$/);
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu"],
  });
  page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.on("pageerror", (e) => pageErrors.push(e.message));
});

after(async () => {
  if (browser) await browser.close();
  if (server) server.kill();
});

// Opens `hash` and waits until the view has drawn.
async function open(hash) {
  assert.deepEqual(pageErrors, [], "script errors in the page");
  await page.goto("about:blank");
  await page.goto(url + "#" + hash);
  await page.waitForSelector("section[data-ready='1']", { timeout: 20000 });
}

// Runs `action`, then waits for the view to draw again (or to show an error).
async function redraw(action, state = "1") {
  await page.evaluate(() => { delete document.querySelector("main section").dataset.ready; });
  await action();
  await page.waitForSelector(`section[data-ready='${state}']`, { timeout: 20000 });
}

async function shot(name) {
  assert.deepEqual(pageErrors, [], "script errors in the page");
  const file = path.join(shots, name + ".png");
  await page.screenshot({ path: file, fullPage: true });
  return file;
}

async function slide(name, value) {
  await page.locator(`input[name='${name}']`).first().fill(String(value));
}

const invFreqs = (scope) => page.$$eval(`${scope} td.inv-freq`, (tds) => tds.map((td) => Number(td.dataset.value)));

test("sinusoidal: the heatmap is the CLI's table, and follows its sliders", async () => {
  await open("view=sinusoidal");
  const row1 = JSON.parse(await page.getAttribute("canvas[data-first]", "data-first"));
  const cliTable = cli("table", "sinusoidal", "--positions", "64", "--dim", "64", "--json").table;
  assert.deepEqual(row1, cliTable[1]);
  await redraw(() => slide("dim", 32));
  assert.equal(await page.getAttribute("canvas[data-first]", "data-dim"), "32");
  const row = JSON.parse(await page.getAttribute("canvas[data-first]", "data-first"));
  assert.deepEqual(row, cli("table", "sinusoidal", "--positions", "64", "--dim", "32", "--json").table[1]);
  assert.match(page.url(), /dim=32/);
  await redraw(() => page.selectOption("select[name='layout']", "concatenated"));
  const row2 = JSON.parse(await page.getAttribute("canvas[data-first]", "data-first"));
  assert.deepEqual(row2, cli("table", "sinusoidal", "--positions", "64", "--dim", "32", "--layout", "concatenated", "--json").table[1]);
  // the heatmap carries its colour bar, and with few rows and columns its
  // ticks stay whole numbers (they read 0.6000000000000001 before)
  assert.equal(await page.getAttribute("canvas[data-first]", "data-colorbar"), "-1..1");
  await redraw(() => slide("positions", 4));
  await redraw(() => slide("dim", 4));
  const ticks = JSON.parse(await page.getAttribute("canvas[data-first]", "data-ticks"));
  assert.ok(ticks.length >= 4 && ticks.every((l) => /^\d+$/.test(l)), ticks.join(" "));
  await redraw(() => slide("positions", 64));
  await redraw(() => slide("dim", 32));
  // M_k's blocks are shown, and its residual is tiny
  assert.ok((await page.$$(".block")).length > 4);
  assert.match(await page.textContent("#mk-info"), /over the first/);
  await shot("sinusoidal");
});

test("rope: one clock per pair, and the state is shareable in the URL", async () => {
  await open("view=rope&dim=32&position=1000");
  assert.equal(await page.inputValue("input[name='dim']"), "32");
  const angles = JSON.parse(await page.getAttribute("canvas[data-angles]", "data-angles"));
  assert.equal(angles.length, 16);
  // pair 0 turns one radian per position: 1000 rad modulo 2π
  assert.ok(Math.abs(angles[0] - (1000 % (2 * Math.PI))) < 1e-9);
  await redraw(() => slide("dim", 64));
  assert.equal(JSON.parse(await page.getAttribute("canvas[data-angles]", "data-angles")).length, 32);
  await shot("rope");
});

test("a model: every inv_freq of Llama 3.1 equals posenc rope inspect --json; a broken config shows its error", async () => {
  await open("view=model&cfg=llama-3.1-8b");
  const want = cli("rope", "inspect", "--json", "--config", fixture("checkpoints/llama-3.1-8b.config.json")).inv_freq;
  assert.deepEqual(await invFreqs("#model-out"), want);
  await shot("model-llama-3.1");

  // a broken config: its one-line error in the page
  await redraw(async () => {
    await page.fill("#model-text", '{"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": -1}');
    await page.click("#model-load");
  }, "error");
  const msg = await page.textContent("#error");
  assert.match(msg, /theta/i);
  await shot("model-error");

  // the server is still up: paste a real config (Qwen2-VL, M-RoPE)
  const qwen = readFileSync(fixture("models/qwen2-vl-7b-instruct.config.json"), "utf8");
  await redraw(async () => {
    await page.fill("#model-text", qwen);
    await page.click("#model-load");
  });
  assert.equal(await page.textContent("#error"), "");
  const wantQ = cli("rope", "inspect", "--json", "--config", fixture("models/qwen2-vl-7b-instruct.config.json")).inv_freq;
  assert.deepEqual(await invFreqs("#model-out"), wantQ);
  assert.match(await page.textContent("#model-out"), /M-RoPE section/);
  await shot("model-qwen2-vl");

  // Gemma 3: two layer types, each with the CLI's frequencies
  await open("view=model&cfg=gemma-3-1b-it");
  const g = cli("rope", "inspect", "--json", "--config", fixture("models/gemma-3-1b-it.config.json"));
  for (const [name, lt] of Object.entries(g.layer_types)) {
    assert.deepEqual(await invFreqs(`[data-layer-type='${name}']`), lt.inv_freq);
  }
});

test("compare: two configs side by side, then two scalings of one", async () => {
  await open("view=compare&a=llama-3.1-8b&b=qwen2.5-7b-instruct-yarn");
  const a = cli("rope", "inspect", "--json", "--config", fixture("checkpoints/llama-3.1-8b.config.json")).inv_freq;
  const b = cli("rope", "inspect", "--json", "--config", fixture("checkpoints/qwen2.5-7b-instruct-yarn.config.json")).inv_freq;
  assert.deepEqual(await invFreqs("#cmp-a-out"), a);
  assert.deepEqual(await invFreqs("#cmp-b-out"), b);
  await shot("compare");
  await redraw(async () => {
    await page.selectOption("#cmp-scaling", "linear ×4");
    await page.click("#cmp-apply");
  });
  const lin = await invFreqs("#cmp-b-out");
  // linear ×4 on Llama 3.1's base: every frequency of A's unscaled table / 4
  const text = JSON.parse(await page.inputValue("#cmp-b-text"));
  assert.equal(text.rope_scaling.rope_type, "linear");
  assert.equal(lin.length, a.length);
  assert.match(await page.textContent("#cmp-b-out"), /linear/);
  // the legends and headings name both sides
  const legends = await page.$$eval("#compare-out > .grid .legend", (ls) => ls.map((l) => l.textContent));
  assert.ok(legends.length >= 2);
  for (const l of legends) assert.match(l, /A: Llama 3\.1 8B.*B: Llama 3\.1 8B.*, with linear ×4/);
  assert.match(await page.textContent("#cmp-b-name"), /with linear ×4/);
  await shot("compare-scalings");
  // the scaling is in the URL by its name, B's text is not; the link
  // restores the same B
  const hash = new URL(page.url()).hash;
  const q = new URLSearchParams(hash.slice(1));
  assert.equal(q.get("bsc"), "linear ×4");
  assert.equal(q.get("btext"), null);
  await open(hash.slice(1));
  assert.deepEqual(await invFreqs("#cmp-b-out"), lin);
  assert.equal(await page.inputValue("#cmp-scaling"), "linear ×4");
  // picking a B of its own ends "A with a scaling"
  await redraw(() => page.selectOption("#cmp-b-select", "qwen2.5-7b-instruct-yarn"));
  assert.equal(new URLSearchParams(new URL(page.url()).hash.slice(1)).get("bsc"), null);
  assert.deepEqual(await invFreqs("#cmp-b-out"), b);
});

test("relative biases: ALiBi slopes equal posenc bias alibi --json", async () => {
  await open("view=bias");
  const slopes = JSON.parse(await page.getAttribute("#alibi-slopes", "data-slopes"));
  assert.deepEqual(slopes, cli("bias", "alibi", "--heads", "8", "--json").slopes);
  await redraw(() => slide("heads", 12));
  const s12 = JSON.parse(await page.getAttribute("#alibi-slopes", "data-slopes"));
  assert.deepEqual(s12, cli("bias", "alibi", "--heads", "12", "--json").slopes);
  await shot("bias");
});

test("the page works from http://localhost:PORT too; another origin's requests are refused", async () => {
  const local = url.replace("127.0.0.1", "localhost");
  assert.deepEqual(pageErrors, [], "script errors in the page");
  await page.goto("about:blank");
  await page.goto(local + "#view=model&cfg=llama-3.1-8b");
  await page.waitForSelector("section[data-ready='1']", { timeout: 20000 });
  const want = cli("rope", "inspect", "--json", "--config", fixture("checkpoints/llama-3.1-8b.config.json")).inv_freq;
  assert.deepEqual(await invFreqs("#model-out"), want);
  assert.equal(await page.textContent("#error"), "");
  // the page's own POST from localhost is served
  const own = await page.evaluate(async () => (await fetch("/api/inspect", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ config: { hidden_size: 64, num_attention_heads: 4 } }),
  })).status);
  assert.equal(own, 200);
  assert.deepEqual(pageErrors, [], "script errors in the page");
  // a page of another origin (another local server's, the attacker's page
  // of a DNS rebinding or a cross-site request) sends a text/plain POST,
  // which needs no preflight: the server refuses it on the wire
  const other = createServer((req, res) => {
    res.writeHead(200, { "content-type": "text/html" });
    res.end("<p>elsewhere</p>");
  });
  await new Promise((resolve) => other.listen(0, "127.0.0.1", resolve));
  const statuses = [];
  const listen = (r) => { if (r.url().includes("/api/inspect")) statuses.push(r.status()); };
  page.on("response", listen);
  try {
    await page.goto(`http://127.0.0.1:${other.address().port}/`);
    await page.evaluate(async (target) => {
      await fetch(target + "api/inspect", {
        method: "POST", mode: "no-cors", headers: { "content-type": "text/plain" },
        body: JSON.stringify({ config: { hidden_size: 64, num_attention_heads: 4 } }),
      });
    }, url);
  } finally {
    page.off("response", listen);
    other.close();
  }
  assert.deepEqual(statuses, [403]);
});

test("a model whose config leaves RoPE keys to defaults: warned, and seen in training 'unknown'", async () => {
  await open("view=model&cfg=gemma-3-4b-it&target=131072");
  const warn = await page.textContent("#model-warnings");
  assert.match(warn, /no rope_theta/);
  assert.match(warn, /training length is unknown/);
  const seen = await page.$$eval("#model-out td.seen", (tds) => [...new Set(tds.map((td) => td.textContent))]);
  assert.deepEqual(seen, ["unknown"]);
  await shot("model-defaults");
  // a config that names them: no warning, every pair judged
  await open("view=model&cfg=llama-3.1-8b&target=131072");
  assert.equal(await page.$("#model-warnings"), null);
  const judged = await page.$$eval("#model-out td.seen", (tds) => tds.map((td) => td.textContent));
  assert.ok(judged.length > 0 && judged.every((s) => s === "yes" || s === "no: unseen angles"));
});

test("LongRoPE: each column names the factor set it uses", async () => {
  await open("view=model&cfg=phi-3-mini-128k-instruct&target=131072");
  const heads = await page.$$eval("#model-out table.pairs tr:first-child th", (ths) => ths.map((th) => th.textContent));
  assert.ok(heads.includes("inv_freq (short_factor)"), heads.join(" | "));
  assert.ok(heads.includes("max angle at N (rad, long_factor)"), heads.join(" | "));
  assert.match(await page.textContent("#model-out"), /short_factor in the frequency columns .*long_factor at N = 131072/);
  // at a seq_len past the original length the frequency columns use the long set too
  await open("view=model&cfg=phi-3-mini-128k-instruct&target=131072&seq=8192");
  const heads2 = await page.$$eval("#model-out table.pairs tr:first-child th", (ths) => ths.map((th) => th.textContent));
  assert.ok(heads2.includes("inv_freq (long_factor)"), heads2.join(" | "));
  await shot("model-longrope");
});

test("at 400 px wide no view scrolls sideways", async () => {
  await page.setViewportSize({ width: 400, height: 900 });
  try {
    for (const hash of ["view=sinusoidal", "view=rope", "view=model&cfg=llama-3.1-8b", "view=compare", "view=bias"]) {
      await open(hash);
      const wide = await page.evaluate(() => document.documentElement.scrollWidth);
      assert.ok(wide <= 400, `${hash}: the page is ${wide} px wide at a 400 px viewport`);
      // the charts shrink to their boxes, keeping their shape
      const shapes = await page.$$eval("main canvas", (cs) => cs.map((c) => [c.getBoundingClientRect().width, c.getBoundingClientRect().height, c.width / c.height]));
      for (const [w, h, ratio] of shapes) {
        assert.ok(w <= 400 && w > 100, `${hash}: a chart ${w} px wide`);
        assert.ok(Math.abs(w / h - ratio) < 0.05, `${hash}: a chart drawn at ${ratio} shown at ${w / h}`);
      }
      await shot("narrow-" + hash.split("&")[0].slice(5));
    }
  } finally {
    await page.setViewportSize({ width: 1400, height: 1000 });
  }
});

test("hover readouts: the nearest point of a chart, linked to the pair's table row", async () => {
  await open("view=model&cfg=llama-3.1-8b");
  // pair 40's dot on the wavelength chart, in page coordinates
  const at = await page.evaluate(() => {
    const c = document.querySelectorAll("[data-layer-type] canvas")[1];
    const p = c.hover.points.find((q) => q.si === 1 && q.i === 40);
    const r = c.getBoundingClientRect();
    return { x: r.left + (p.cx * r.width) / c.cssW, y: r.top + (p.cy * r.height) / c.cssH, y40: p.y };
  });
  await page.mouse.move(at.x, at.y);
  const tip = await page.textContent("#tip");
  assert.match(tip, /^scaled: pair i = 40, wavelength \(positions\) = /);
  assert.equal(await page.getAttribute("tr.hover", "data-pair"), "40");
  assert.ok(await page.isVisible("#tip"));
  await shot("model-hover");
  // away from every point: no readout, no row marked
  await page.mouse.move(2, 2);
  assert.equal(await page.isVisible("#tip"), false);
  assert.equal(await page.$("tr.hover"), null);
  // every other view's charts have readouts too
  for (const hash of ["view=sinusoidal", "view=rope", "view=compare", "view=bias"]) {
    await open(hash);
    const counts = await page.$$eval("main canvas", (cs) => cs.filter((c) => c.hover).map((c) => c.hover.points.length));
    assert.ok(counts.length >= 2 && counts.every((n) => n > 0), `${hash}: ${counts}`);
  }
});

test("export: the view's API answer as JSON, its table as CSV, its charts as PNG", async () => {
  await open("view=model&cfg=llama-3.1-8b");
  const get = async (id) => {
    const [d] = await Promise.all([page.waitForEvent("download"), page.click(id)]);
    return { name: d.suggestedFilename(), bytes: readFileSync(await d.path()) };
  };
  const j = await get("#export-json");
  assert.equal(j.name, "posenc-model.json");
  const m = JSON.parse(j.bytes.toString("utf8"));
  const want = cli("rope", "inspect", "--json", "--config", fixture("checkpoints/llama-3.1-8b.config.json"));
  assert.deepEqual(m.inspect.inv_freq, want.inv_freq);
  const c = await get("#export-csv");
  assert.equal(c.name, "posenc-model.csv");
  const lines = c.bytes.toString("utf8").trim().split("\n");
  assert.equal(lines[0], "layer_type,pair,axis,inv_freq,unscaled_inv_freq,ratio,wavelength,unscaled_wavelength,role,target_inv_freq,target_max_angle,train_max_angle,unseen");
  assert.equal(lines.length, 1 + want.inv_freq.length);
  assert.equal(lines[41].split(",")[1], "40");
  assert.equal(Number(lines[41].split(",")[3]), m.layer_types[0].pairs[40].inv_freq);
  const p = await get("#export-png");
  assert.equal(p.name, "posenc-model.png");
  assert.deepEqual([...p.bytes.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  assert.ok(p.bytes.length > 5000);
  // and on the teaching views
  await open("view=bias");
  const b = await get("#export-csv");
  assert.match(b.bytes.toString("utf8"), /^distance \(query − key\),ALiBi head 0 \(slope 0\.5\)/);
});

test("a pasted config stays out of the URL, and in the tab across a reload", async () => {
  await open("view=model");
  const qwen = readFileSync(fixture("models/qwen2-vl-7b-instruct.config.json"), "utf8");
  await redraw(async () => {
    await page.fill("#model-text", qwen);
    await page.click("#model-load");
  });
  const q = new URLSearchParams(new URL(page.url()).hash.slice(1));
  assert.equal(q.get("text"), null);
  assert.equal(q.get("cfg"), "");
  assert.ok(page.url().length < 200, page.url());
  const want = cli("rope", "inspect", "--json", "--config", fixture("models/qwen2-vl-7b-instruct.config.json")).inv_freq;
  assert.deepEqual(await invFreqs("#model-out"), want);
  await page.reload();
  await page.waitForSelector("section[data-ready='1']", { timeout: 20000 });
  assert.deepEqual(await invFreqs("#model-out"), want);
  // a link that names a bundled config shows it, whatever the tab pasted
  await open("view=model&cfg=llama-2-7b");
  assert.deepEqual(await invFreqs("#model-out"), cli("rope", "inspect", "--json", "--config", fixture("checkpoints/llama-2-7b.config.json")).inv_freq);
});

test("compare: a pair-by-pair table of B against A, and any layer type overlaid", async () => {
  await open("view=compare&a=llama-3.1-8b&bsc=linear%20%C3%974");
  const a = cli("rope", "inspect", "--json", "--config", fixture("checkpoints/llama-3.1-8b.config.json"));
  const ratios = await page.$$eval("#cmp-diff td.ratio-ba", (tds) => tds.map((td) => Number(td.dataset.value)));
  assert.equal(ratios.length, a.inv_freq.length);
  // B is Llama 3.1's base with linear ×4: B / A is 1/4 on llama3's kept (fast) pairs
  assert.ok(Math.abs(ratios[0] - 0.25) < 1e-6, String(ratios[0]));
  // Gemma 3 against itself with YaRN: either layer type can be overlaid
  await open("view=compare&a=gemma-3-1b-it&bsc=YaRN%20%C3%974");
  assert.match(await page.textContent("#compare-out"), /layer type full_attention \/ full_attention/);
  await redraw(() => page.selectOption("#cmp-a-type", "sliding_attention"));
  assert.match(await page.textContent("#compare-out"), /layer type sliding_attention \/ full_attention/);
  assert.equal(new URLSearchParams(new URL(page.url()).hash.slice(1)).get("alt"), "sliding_attention");
  await shot("compare-layer-types");
});

test("every chart has a caption saying what to notice", async () => {
  for (const hash of ["view=sinusoidal", "view=rope", "view=model&cfg=llama-3.1-8b", "view=compare", "view=bias"]) {
    await open(hash);
    // each chart's box (its panel, or its cell in a model's grid) holds one caption
    const missing = await page.$$eval("main canvas", (cs) => cs
      .filter((c) => !c.parentElement.querySelector(".notice"))
      .map((c) => c.parentElement.querySelector("h3")?.textContent || "?"));
    const lf = missing.filter((h) => h !== "LongRoPE factors");
    assert.deepEqual(lf, [], `${hash}: charts without a caption`);
    const notices = await page.$$eval(".notice", (ns) => ns.map((n) => n.textContent));
    assert.ok(notices.length >= 2 && notices.every((n) => n.startsWith("What to notice: ") && n.length > 40), hash);
  }
});
