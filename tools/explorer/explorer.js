// explorer.js — the page of `make explore` (docs/explorer.md). Every number it shows comes from
// zero_estimate itself, compiled to WebAssembly (zero_estimate.js, built from tools/zero_estimate.cpp and
// common/zero_formulas.cpp by the Makefile's explorer target): the page runs the command line's main()
// with flags, as a terminal would, and reads its --json output. Nothing here computes a byte of the
// estimates: the page only multiplies the elements sent by the bytes of one element, and reads the
// device memory it is given to draw its line.
"use strict";

// ---- zero_estimate, in the page ----
let wasm = null;              // the module, once loaded
let captured = { out: [], err: [] };

// Runs `zero_estimate ARGS...`: its exit code and what it printed, as a terminal would show them.
function zeroEstimate(args) {
  captured = { out: [], err: [] };
  const rc = wasm.callMain(args.map(String));
  return { rc: rc, out: captured.out.join("\n"), err: captured.err.join("\n") };
}

// JSON with every integer of 16 digits or more kept as a string: bytes reach 1e17, past the 2^53 that
// a JavaScript number holds exactly. The page shows them as they are (BigInt where it adds them up).
function parseExact(text) {
  return JSON.parse(text.replace(/([:\[,]\s*)(-?\d{16,})(?=\s*[,\]}])/g, '$1"$2"'));
}

function estimateJson(args) {
  const r = zeroEstimate(args.concat(["--json"]));
  if (r.rc !== 0) throw new Error(r.err || ("zero_estimate exited with " + r.rc));
  return parseExact(r.out);
}

// ---- numbers ----
const CATEGORIES = ["params", "grads", "master", "adam_m", "adam_v", "comm_buffers", "gathered", "activations"];
const COLORS = {  // colour-blind-safe (Okabe-Ito), each with contrast against white and against its neighbour
  params: "#0072B2", grads: "#E69F00", master: "#009E73", adam_m: "#CC79A7", adam_v: "#882255",
  comm_buffers: "#56B4E9", gathered: "#D55E00", activations: "#666666",
};
const big = (v) => BigInt(v);
function fmtBytes(v) {  // for reading: kB, MB, GB, TB = 1e3 ... 1e12 bytes, 4 digits (every digit: hover, data-value)
  const b = Number(v);
  if (b >= 1e12) return (b / 1e12).toPrecision(4) + " TB";
  if (b >= 1e9) return (b / 1e9).toPrecision(4) + " GB";
  if (b >= 1e6) return (b / 1e6).toPrecision(4) + " MB";
  if (b >= 1e3) return (b / 1e3).toPrecision(4) + " kB";
  return b + " B";
}
const grouped = (v) => String(v).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
const $ = (id) => document.getElementById(id);
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  for (const c of kids) e.append(c);
  return e;
}

// ---- the form -> zero_estimate's flags ----
const WORLDS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];
function flagsFromForm() {
  const f = [];
  if ($("model").value === "params") f.push("--params", $("params").value.trim());
  else {
    f.push("--preset", $("preset").value);
    for (const k of ["layers", "dim", "heads", "vocab"]) if ($(k).value.trim()) f.push("--" + k, $(k).value.trim());
    f.push("--batch", $("batch").value);
    // the sequence as typed, else zero_estimate's own default (64, or the model's context where shorter)
    if ($("seq").value.trim()) f.push("--seq", $("seq").value.trim());
    if ($("ckpt").checked) f.push("--activation-checkpointing");
    f.push("--attention", $("attention").value);
    if ($("fit").value.trim()) f.push("--fit", $("fit").value.trim());
  }
  f.push("--precision", $("precision").value, "--accum", $("accum").value);
  return f;
}
const stageFlags = () => ["--stage", $("stage").value];

// ---- drawing ----
function renderTable(est, N) {
  const rows = est.estimates.filter((e) => e.world === N);
  const t = $("table");
  t.replaceChildren();
  const head = el("tr", {}, el("th", { scope: "col" }, "per rank, N = " + N));
  for (const e of rows) head.append(el("th", { scope: "col" }, e.stage));
  t.append(el("thead", {}, head));
  const body = el("tbody");
  const line = (name, key, value, exact) => {
    const tr = el("tr", {}, el("th", { scope: "row" }, name));
    rows.forEach((e) => {
      const v = value(e);
      tr.append(el("td", { "data-key": key, "data-stage": e.stage, "data-value": String(v), title: grouped(v) + (exact ? " bytes" : "") },
                   exact ? fmtBytes(v) : grouped(v)));
    });
    body.append(tr);
  };
  for (const c of CATEGORIES) line(c, "bytes." + c, (e) => e.bytes[c], true);
  line("= model state", "model_state", (e) => e.model_state, true);
  line("on the device", "device", (e) => e.device, true);
  line("on the host", "host", (e) => e.host, true);
  if (rows.length && rows[0].fit_batch !== undefined) {
    line("fit: micro-batch", "fit_batch", (e) => e.fit_batch, false);
    line("  checkpointed", "fit_batch_checkpointed", (e) => e.fit_batch_checkpointed, false);
  }
  line("sent / step (elements)", "comm_elems_per_step", (e) => e.comm_elems_per_step, false);
  line("host link / step (elements)", "link_elems_per_step", (e) => e.link_elems_per_step, false);
  t.append(body);
}

// Per-rank device bytes by category, a stacked bar per stage, grouped by N. Drawn at the width it is
// shown at (a phone's 400 px as a projector's 700), so that its text keeps its size; on a narrow screen
// every other N, so that each bar stays wide enough to see and to label.
const STAGE_MARK = { stage0_ddp: "0", stage1: "1", stage2: "2", stage3: "3", offload: "o", infinity: "i" };
let lastChart = null;  // what the chart shows, drawn again when the window's width changes
function renderChart(est, budget, N) {
  lastChart = [est, budget, N];
  const svg = $("chart");
  const W = Math.max(300, Math.round(svg.parentElement.clientWidth || 640)), H = 300, left = 64, bottom = 48, top = 10;
  const log = $("scale").value === "log";
  const worlds = W < 560 ? WORLDS.filter((n, i) => i % 2 === 0 || n === N) : WORLDS;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.replaceChildren();
  const ns = "http://www.w3.org/2000/svg";
  const mk = (tag, a, text) => {
    const e = document.createElementNS(ns, tag);
    for (const k in a) e.setAttribute(k, a[k]);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
    return e;
  };
  const stages = [...new Set(est.estimates.map((e) => e.stage))];
  const deviceOf = (e) => CATEGORIES.filter((c) => e.location[c] === "device");
  let ymax = 0, ymin = Infinity;  // device bytes, and offload's and infinity's host bytes drawn on top of them
  for (const e of est.estimates) {
    ymax = Math.max(ymax, Number(e.device) + Number(e.host));
    if (Number(e.device) > 0) ymin = Math.min(ymin, Number(e.device));
  }
  if (budget) ymax = Math.max(ymax, budget * 1.05);
  if (!(ymax > 0)) ymax = 1;
  // the log scale: whole powers of ten from below the smallest bar to above the largest
  const lo = Math.floor(Math.log10(Math.min(ymin, ymax) || 1)), hi = Math.max(lo + 1, Math.ceil(Math.log10(ymax)));
  const gw = (W - left - 8) / worlds.length, bw = Math.max(2, (gw - 6) / stages.length);
  const frac = (b) => log ? (b > 0 ? Math.max(0, (Math.log10(b) - lo) / (hi - lo)) : 0) : b / ymax;
  const y = (b) => H - bottom - frac(b) * (H - bottom - top);
  const ticks = log ? Array.from({ length: hi - lo + 1 }, (_, i) => 10 ** (lo + i)) : [0, 1, 2, 3, 4].map((i) => (ymax * i) / 4);
  for (const v of ticks) {  // the y axis, in bytes per rank on the device
    mk("line", { x1: left, x2: W - 4, y1: y(v), y2: y(v), stroke: "#ccc" });
    mk("text", { x: left - 4, y: y(v) + 4, "text-anchor": "end", "font-size": 11 }, fmtBytes(v));
  }
  worlds.forEach((n, gi) => {
    const x0 = left + gi * gw + 3;
    if (n === N)  // the N of the table below, shaded
      mk("rect", { x: x0 - 2, width: gw - 2, y: top, height: H - bottom - top, fill: "#eef3fb", class: "chosen" });
    mk("text", { x: x0 + gw / 2 - 3, y: H - bottom + 26, "text-anchor": "middle", "font-size": 11,
                 "font-weight": n === N ? 700 : 400 }, String(n));
    stages.forEach((s, si) => {
      const e = est.estimates.find((r) => r.world === n && r.stage === s);
      if (!e) return;
      if (stages.length > 1 && bw >= 6)  // which stage each bar is: 0 1 2 3 o i under it
        mk("text", { x: x0 + si * bw + (bw - 1) / 2, y: H - bottom + 11, "text-anchor": "middle", "font-size": 10,
                     class: "bar-label", "data-stage": s, "data-world": n }, STAGE_MARK[s]);
      let acc = 0;
      for (const c of deviceOf(e)) {
        const b = Number(e.bytes[c]);
        if (!b) continue;
        const r = mk("rect", { x: x0 + si * bw, width: bw - 1, y: y(acc + b), height: Math.max(0, y(acc) - y(acc + b)), fill: COLORS[c],
                               "data-stage": s, "data-world": n, "data-cat": c, "data-bytes": String(e.bytes[c]) });
        r.append(document.createElementNS(ns, "title"));
        r.lastChild.textContent = `${s}, N = ${n}: ${c} ${grouped(e.bytes[c])} bytes`;
        acc += b;
      }
      if (acc > 0 && y(0) - y(acc) < 2) {  // a bar under 2 px at this scale: a mark, so that it does not vanish
        const m = mk("line", { x1: x0 + si * bw, x2: x0 + si * bw + bw - 1, y1: y(0) - 1.5, y2: y(0) - 1.5, stroke: "#111",
                               "stroke-width": 3, class: "too-small", "data-stage": s, "data-world": n });
        m.append(document.createElementNS(ns, "title"));
        m.lastChild.textContent = `${s}, N = ${n}: ${fmtBytes(acc)} on the device, too small to see at this scale (see the log scale)`;
      }
      const host = Number(e.host);
      if (host) {  // offload, infinity: what lives on the host, a dashed outline above the device's bytes
        const r = mk("rect", { x: x0 + si * bw + 0.5, width: bw - 2, y: y(acc + host), height: Math.max(0, y(acc) - y(acc + host)),
                               fill: "none", stroke: "#111", "stroke-dasharray": "2 2", "data-stage": s, "data-world": n,
                               "data-cat": "host", "data-bytes": String(e.host) });
        r.append(document.createElementNS(ns, "title"));
        r.lastChild.textContent = `${s}, N = ${n}: on the host ${grouped(e.host)} bytes`;
      }
    });
  });
  mk("text", { x: left + (W - left) / 2, y: H - 4, "text-anchor": "middle", "font-size": 12 },
     stages.length > 1 ? "N ranks; bars " + stages.map((s) => STAGE_MARK[s]).join(" ") + (log ? ", log scale" : "")
                       : "N ranks, " + stages[0] + (log ? ", log scale" : ""));
  if (budget) {
    mk("line", { x1: left, x2: W - 4, y1: y(budget), y2: y(budget), stroke: "#000", "stroke-dasharray": "6 3" });
    mk("text", { x: W - 6, y: y(budget) - 4, "text-anchor": "end", "font-size": 11 }, "device memory " + fmtBytes(budget));
  }
  const legend = $("legend");
  legend.replaceChildren();
  for (const c of CATEGORIES)
    legend.append(el("span", { class: "key" }, el("span", { class: "swatch", style: "background:" + COLORS[c] }), c));
  legend.append(el("span", { class: "key" }, el("span", { class: "swatch host" }), "on the host (offload, infinity)"));
  if (stages.length > 1)
    legend.append(el("span", { class: "key" }, "bars: " + stages.map((s) => STAGE_MARK[s] + " = " + s).join(", ")));
}
window.addEventListener("resize", () => {  // the chart follows the window's width
  clearTimeout(window.nzResize);
  window.nzResize = setTimeout(() => { if (lastChart && $("chart").firstChild) renderChart(...lastChart); }, 100);
});

function budgetBytes() {  // the device memory line: zero_estimate parses it (--fit), the JSON has no echo of it
  if ($("model").value !== "shape") return 0;  // a parameter count has no --fit: its box is hidden, so no line
  const s = $("fit").value.trim().toLowerCase();
  const m = /^([0-9.]+)\s*(b|kb|mb|gb|tb|kib|mib|gib|tib)?$/.exec(s);
  if (!m) return 0;
  const mult = { b: 1, kb: 1e3, mb: 1e6, gb: 1e9, tb: 1e12, kib: 1024, mib: 1048576, gib: 1073741824, tib: 1099511627776 };
  return parseFloat(m[1]) * (mult[m[2] || "b"]);
}

// The accumulation dependence: elements sent per step for K = 1, 2, 4, 8 at the chosen N.
function renderAccum(base, N) {
  const t = $("accum-table");
  t.replaceChildren();
  const Ks = [1, 2, 4, 8];
  const per = Ks.map((K) => {
    const f = base.slice();
    f[f.indexOf("--accum") + 1] = String(K);
    return estimateJson(f.concat(["--world", String(N)], stageFlags()));
  });
  const stages = per[0].estimates.map((e) => e.stage);
  const bytesPer = { fp32: 4, bf16: 2, fp16: 2 }[per[0].precision];
  const head = el("tr", {}, el("th", { scope: "col" }, "sent / step, N = " + N));
  for (const K of Ks) head.append(el("th", { scope: "col" }, "K = " + K));
  t.append(el("thead", {}, head));
  const body = el("tbody");
  stages.forEach((s, i) => {
    const tr = el("tr", {}, el("th", { scope: "row" }, s));
    per.forEach((p, k) => {
      const elems = p.estimates[i].comm_elems_per_step;
      tr.append(el("td", { "data-key": "comm_elems_per_step", "data-stage": s, "data-accum": Ks[k], "data-value": String(elems),
                           title: grouped(elems) + " elements = " + grouped(big(elems) * big(bytesPer)) + " bytes" },
                   grouped(elems) + " (" + fmtBytes(big(elems) * big(bytesPer)) + ")"));
    });
    body.append(tr);
  });
  t.append(body);
}

// The view's settings in the page's address (#model=params&params=7.5B&...), kept current on every change
// (history.replaceState: no new history entry per keystroke), so that the address bar is always this
// view: reloading shows it again, and it can be bookmarked or handed to a class as a link.
const MAIN_IDS = ["model", "preset", "layers", "dim", "heads", "vocab", "params", "precision", "stage", "world", "batch",
                  "seq", "accum", "ckpt", "attention", "fit", "scale"];
const ZPP_IDS = ["zpp-node", "zpp-qw", "zpp-qg", "zpp-net", "zpp-ms"];
const PP_IDS = ["pp-segments", "pp-schedule", "pp-partition", "pp-zero"];
// Links made before the pipeline's "stages" were called segments: pp-stages stands for pp-segments.
const FORM_ALIASES = { "pp-segments": "pp-stages" };
const TP_IDS = ["tp-mem", "tp-sp", "tp-zero", "tp-schedule"];  // a link from before tp-schedule: 1F1B
const SP_IDS = ["sp-s", "sp-mem"];  // the long sequences' panel (updateSeqFit)
const FORM_IDS = MAIN_IDS.concat(ZPP_IDS, PP_IDS, TP_IDS, SP_IDS);
function formState() {
  const p = new URLSearchParams();
  for (const id of FORM_IDS) p.set(id, $(id).type === "checkbox" ? ($(id).checked ? "1" : "") : $(id).value);
  return p.toString();
}
function loadFormState(hash) {
  const p = new URLSearchParams(hash.replace(/^#/, ""));
  for (const id of FORM_IDS) {
    const key = !p.has(id) && FORM_ALIASES[id] && p.has(FORM_ALIASES[id]) ? FORM_ALIASES[id] : id;
    if (!p.has(key)) continue;
    if ($(id).type === "checkbox") $(id).checked = p.get(key) === "1";
    else $(id).value = p.get(key);
  }
}
// After every change: the link and the address bar hold the view shown. Once the change is done (a
// change runs up to three sections, each calling this), as browsers limit how often an address changes.
let viewPending = false;
function saveView() {
  $("permalink").href = "#" + formState();
  if (viewPending) return;
  viewPending = true;
  setTimeout(() => {
    viewPending = false;
    const hash = "#" + formState();
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }, 0);
}

// The whole page again for the settings: the explorer, ZeRO++, the pipeline and long sequences (each reads the form).
function update() {
  updateMain();
  updateZeropp();
  updatePipeline();
  scheduleTensor();
  updateMuon();
  updateSeqFit();
}
function updateMain() {
  const status = $("status");
  const base = flagsFromForm();
  // the command of the numbers below, or of the error line that stands in for them
  $("cmdline").textContent = "zero_estimate " + base.concat(["--world", $("world").value.trim()], stageFlags()).join(" ");
  try {
    // N as typed goes to zero_estimate, which judges it (a bad one is its error line)
    const here = estimateJson(base.concat(["--world", $("world").value.trim()], stageFlags()));
    const N = here.estimates[0].world;
    const all = estimateJson(base.concat(["--world", WORLDS.join(",")], stageFlags()));
    if (!here.raw_params) $("seq").placeholder = String(here.seq);  // the sequence used when none is typed
    renderChart(all, budgetBytes(), N);
    renderTable(here, N);
    renderAccum(base, N);
    const fits = here.estimates.filter((e) => e.fit_batch !== undefined)
      .map((e) => `${e.stage} ${e.fit_batch || "none"} (${e.fit_batch_checkpointed || "none"} checkpointed)`);
    const perRank = here.estimates.map((e) => `${e.stage} ${fmtBytes(e.device)}`).join(", ");
    status.textContent = `N = ${N}, on the device per rank: ${perRank}. ` +
      `Ψ = ${grouped(here.num_params)} parameters, ${here.precision}` +
      (here.raw_params ? " (a raw count: model states only)" : `, activations for batch ${here.batch} x seq ${here.seq}`) +
      (fits.length ? `. Largest micro-batch that fits ${$("fit").value} at N = ${N}: ${fits.join(", ")}.` : "");
    status.className = "";
  } catch (e) {
    status.textContent = e.message;  // zero_estimate's own one-line error, and no numbers left from before
    status.className = "error";
    for (const id of ["chart", "table", "accum-table", "legend"]) $(id).replaceChildren();
  }
  saveView();
}

// ZeRO++ and the pipeline need a model shape: for a parameter count, a plain note saying so and a
// button that gives one (not an error: nothing the user typed is wrong), instead of a red line.
function needsShape(status, what) {
  if ($("model").value === "shape") return false;
  const b = el("button", { type: "button" }, "use a shape (preset " + $("preset").value + ")");
  b.addEventListener("click", () => { $("model").value = "shape"; syncModel(); update(); });
  status.className = "needs";
  status.replaceChildren(what + " needs a model shape, and Model above gives a parameter count: ", b);
  saveView();
  return true;
}

// ---- ZeRO++: zero_estimate --zeropp G for the model and N of the form ----
// (--fit is the ladder table's: zero_estimate refuses it with --zeropp)
function withoutFit(f) {
  const i = f.indexOf("--fit");
  return i < 0 ? f : f.slice(0, i).concat(f.slice(i + 2));
}
function zeroppFlags() {
  const f = withoutFit(flagsFromForm()).concat(["--world", $("world").value.trim(), "--zeropp", $("zpp-node").value.trim(),
                                    "--qw-block", $("zpp-qw").value.trim(), "--qg-block", $("zpp-qg").value.trim()]);
  if ($("zpp-net").value.trim()) {
    f.push("--network", $("zpp-net").value.trim());
    if ($("zpp-ms").value.trim()) f.push("--compute-ms", $("zpp-ms").value.trim());
  }
  return f;
}
function updateZeropp() {
  const status = $("zpp-status"), t = $("zpp-table");
  t.replaceChildren();
  if (needsShape(status, "ZeRO++'s table")) return;
  try {
    const z = estimateJson(zeroppFlags());
    const timed = z.estimates.some((e) => e.step_ms !== undefined);
    const cols = [["comm_bytes_per_step", "sent"], ["inside", "inside node"], ["comm_bytes_across_nodes_per_step", "across nodes"],
                  ["state_bytes_added", "memory added"]].concat(timed ? [["step_ms", "step ms"]] : []);
    const head = el("tr", {}, el("th", { scope: "col" }, "bytes per rank per step"));
    for (const [, name] of cols) head.append(el("th", { scope: "col" }, name));
    t.append(el("thead", {}, head));
    const body = el("tbody");
    for (const e of z.estimates) {
      const tr = el("tr", {}, el("th", { scope: "row" }, e.technique));
      for (const [key] of cols) {
        // inside = sent - across: the table zero_estimate prints has this column too
        const v = key === "inside" ? big(e.comm_bytes_per_step) - big(e.comm_bytes_across_nodes_per_step) : e[key];
        tr.append(el("td", { "data-key": key, "data-technique": e.technique, "data-value": String(v),
                             title: key === "step_ms" ? String(v) + " ms" : grouped(v) + " bytes" },
                     key === "step_ms" ? Number(v).toFixed(3) : fmtBytes(v)));
      }
      body.append(tr);
    }
    t.append(body);
    status.className = "";
    status.textContent = `${z.model}, ${z.precision}, N = ${z.estimates[0].world} in nodes of ${z.node_size}, ` +
      `accumulation ${z.accum}: zero_estimate ${zeroppFlags().join(" ")}`;
  } catch (e) {
    status.className = "error";
    status.textContent = e.message;
  }
  saveView();
}

// ---- the pipeline: zero_estimate --pipeline P for the form's model, N and K ----
const PP_CATEGORIES = ["params", "grads", "master", "adam_m", "adam_v", "activations"];
function pipelineFlags() {
  const f = flagsFromForm().concat(["--world", $("world").value.trim(), "--pipeline", $("pp-segments").value.trim(),
                                    "--schedule", $("pp-schedule").value]);
  if ($("pp-partition").value.trim()) f.push("--partition", $("pp-partition").value.trim());
  if ($("pp-zero").value !== "0") f.push("--zero", $("pp-zero").value);
  return f;
}
function updatePipeline() {
  const status = $("pp-status"), t = $("pp-table");
  t.replaceChildren();
  $("pp-chart").replaceChildren();
  if (needsShape(status, "The pipeline's table")) return;
  try {
    const p = estimateJson(pipelineFlags());
    const head = el("tr", {}, el("th", { scope: "col" }, "segment"), el("th", { scope: "col" }, "units"));
    for (const c of PP_CATEGORIES.concat(["slots", "total"])) head.append(el("th", { scope: "col" }, c));
    t.append(el("thead", {}, head));
    const body = el("tbody");
    const bars = [];
    for (const e of p.estimates) {
      const tr = el("tr", {}, el("th", { scope: "row" }, String(e.segment)), el("td", {}, `${e.first_unit}..${e.last_unit}`));
      const cell = (key, v, bytes) => tr.append(el("td", { "data-key": key, "data-segment": String(e.segment), "data-value": String(v),
                                                           title: grouped(v) + (bytes ? " bytes" : "") }, bytes ? fmtBytes(v) : String(v)));
      const parts = {};
      for (const c of PP_CATEGORIES) {
        cell("bytes." + c, e.bytes[c], true);
        parts[c] = Number(e.bytes[c]);
      }
      cell("slots", e.slots, false);
      cell("total", e.total, true);
      body.append(tr);
      bars.push({ name: "segment " + e.segment, parts: parts });
    }
    t.append(body);
    drawBars("pp-chart", bars, PP_CATEGORIES);
    status.className = "";
    status.textContent = `${p.segments} segments x ${p.replicas} replicas, ${p.schedule}, ${p.micro_batches} micro-batches: ` +
      `bubble (P-1)/(K+P-1) = ${Number(p.bubble).toFixed(3)} — zero_estimate ${pipelineFlags().join(" ")}`;
  } catch (e) {
    status.className = "error";
    status.textContent = e.message;
  }
  saveView();
}

// ---- tensor parallelism and 3D: zero_estimate --tensor T [--pipeline P] for the form's model and N ----
// Every (T, P, D) with T x P x D = N: P = 1 is `--tensor T` (T x D, every rank alike), P > 1 is
// `--tensor T --pipeline P` (3D: P segments of D replicas of T tensor ranks), which zero_estimate judges
// (a T that does not divide the heads, a P past the model's units: its own line, named in the status).
// Per configuration: a rank's bytes and the elements it sends per step, in 3D the rank of the segment
// that holds the most (the one that must fit), and the most blocks of the form's width that fit the
// panel's device memory. That rank's total grows with the blocks (by a block's bytes, in 3D by about one
// every P blocks), so two runs P blocks apart give the slope and two more confirm the boundary, which is
// stepped to where the estimate's own totals put it; --layers stops at 1000.
const MAX_LAYERS = 1000;
// the form's model without --fit (the ladder's) and checkpointing (the tensor rung has none), with L
// blocks when L is given
function tensorModel(layers) {
  let f = withoutFit(flagsFromForm()).filter((x) => x !== "--activation-checkpointing");
  if (layers === undefined) return f;
  const i = f.indexOf("--layers");
  if (i >= 0) f = f.slice(0, i).concat(f.slice(i + 2));
  return f.concat(["--layers", String(layers)]);
}
function tensorFlags(T, layers, P = 1) {
  const f = tensorModel(layers).concat(["--world", $("world").value.trim(), "--tensor", String(T)]);
  if (P > 1) f.push("--pipeline", String(P), "--schedule", $("tp-schedule").value);
  if ($("tp-sp").checked && T > 1) f.push("--sequence-parallel");
  if ($("tp-zero").value !== "0") f.push("--zero", $("tp-zero").value);
  return f;
}
// The rank a configuration is judged by: with P = 1 its one row; in 3D the segment whose rank holds the
// most bytes (the first of equals)
function fullestRank(est) {
  let most = est.estimates[0];
  for (const e of est.estimates) if (big(e.total) > big(most.total)) most = e;
  return most;
}
function memoryBytes(text) {  // "80GB", "24 GiB", "1e9": bytes as a BigInt, or null
  const m = /^([0-9.]+(?:e[0-9]+)?)\s*(b|kb|mb|gb|tb|kib|mib|gib|tib)?$/.exec(text.trim().toLowerCase());
  if (!m || !(parseFloat(m[1]) > 0)) return null;
  const mult = { b: 1, kb: 1e3, mb: 1e6, gb: 1e9, tb: 1e12, kib: 1024, mib: 1048576, gib: 1073741824, tib: 1099511627776 };
  return BigInt(Math.floor(parseFloat(m[1]) * mult[m[2] || "b"]));
}
function mostBlocks(T, P, budget) {  // [blocks, "or more" when --layers' limit fits too]
  const total = (L) => big(fullestRank(estimateJson(tensorFlags(T, L, P))).total);
  const first = Math.max(1, P - 2);  // P segments need P units: the embedding, the blocks, the final norm
  const t1 = total(first);
  if (t1 > budget) return [0, false];
  const slope = (total(first + P) - t1) / big(P);
  let L = slope > 0n ? first + Number((budget - t1) / slope) : MAX_LAYERS;
  L = Math.max(first, Math.min(L, MAX_LAYERS));
  while (L > first && total(L) > budget) L--;
  while (L < MAX_LAYERS && total(L + 1) <= budget) L++;
  return [L, L === MAX_LAYERS];
}
let tensorPending = false;
function scheduleTensor() {  // once for a burst of changes: the search runs a few dozen estimates
  if (tensorPending) return;
  tensorPending = true;
  setTimeout(() => { tensorPending = false; updateTensor(); }, 0);
}
const TP_COLUMNS = [["segment", "rank of"], ["params", "params"], ["grads", "grads"], ["optimizer", "optimizer"],
                    ["activations", "activations"], ["total", "total"], ["comm_elems_per_step", "sent / step"],
                    ["most_blocks", "most blocks"], ["most_params", "their Ψ"]];
// A configuration's row: the fullest rank's bytes and elements, the most blocks that fit and their Ψ.
function tensorRow(T, P, est, budget) {
  const e = fullestRank(est);
  const D = P === 1 ? e.replicas : est.replicas;
  const [blocks, more] = mostBlocks(T, P, budget);
  // their Ψ: the whole model's parameters at that many blocks
  const psi = blocks ? estimateJson(tensorModel(blocks).concat(["--world", "1", "--stage", "stage0_ddp"])).num_params : 0;
  const b = e.bytes;
  const v = { segment: P === 1 ? "" : e.segment, params: b.params, grads: b.grads,
              optimizer: big(b.master) + big(b.adam_m) + big(b.adam_v), activations: b.activations, total: e.total,
              comm_elems_per_step: e.comm_elems_per_step, most_blocks: blocks, most_params: psi };
  const tr = el("tr", {}, el("th", { scope: "row" }, `${T} x ${P} x ${D}`));
  for (const [key] of TP_COLUMNS) {
    const text = key === "segment" ? (P === 1 ? "every rank" : `segment ${v[key]} of ${P}`)
      : key === "comm_elems_per_step" ? grouped(v[key]) : key === "most_blocks" ? String(v[key]) + (more ? " or more" : "")
      : key === "most_params" ? grouped(v[key]) : fmtBytes(v[key]);
    const title = key === "segment" ? (P === 1 ? "T x D: every rank holds the same" : `units ${e.first_unit}..${e.end_unit - 1}, ` +
                                       `${e.slots} micro-batches' activations: the segment whose rank holds the most`)
      : grouped(v[key]) + (key.startsWith("most") || key === "comm_elems_per_step" ? "" : " bytes");
    tr.append(el("td", { "data-key": key, "data-tensor": String(T), "data-pipeline": String(P), "data-value": String(v[key]),
                         title: title }, text));
  }
  return tr;
}
// What a configuration zero_estimate refuses is, in the status line: per T, its first refused P with
// zero_estimate's line, and the larger P refused with the same line (their own P in it)
function refusedLine(T, fails) {
  const [P0, msg] = fails[0];
  const alike = fails.slice(1).filter(([P, m]) => m.split(`--pipeline ${P}:`).join(`--pipeline ${P0}:`) === msg);
  const other = fails.slice(1).filter((f) => !alike.includes(f));
  const one = (P, m, more) => (P === 1 ? `T = ${T}` : `T x P = ${T} x ${P}`) + more + ": " + m.replace(/^error: /, "");
  return [one(P0, msg, alike.length ? ` (also P = ${alike.map(([P]) => P).join(", ")}, alike)` : "")]
    .concat(other.map(([P, m]) => one(P, m, "")));
}
function updateTensor() {
  const status = $("tp-status"), t = $("tp-table");
  t.replaceChildren();
  if (needsShape(status, "The tensor table")) return;
  const budget = memoryBytes($("tp-mem").value);
  if (budget === null) {
    status.className = "error";
    status.textContent = `Device memory "${$("tp-mem").value}" is not a size, expected a number with a unit, e.g. 80GB`;
    saveView();
    return;
  }
  const N = parseInt($("world").value, 10);
  const skipped = [];
  const head = el("tr", {}, el("th", { scope: "col" }, "T x P x D"));
  for (const [, name] of TP_COLUMNS) head.append(el("th", { scope: "col" }, name));
  const body = el("tbody");
  let shown = 0, last = [1, 1];
  for (let T = 1; N > 0 && T <= N; T++) {
    if (N % T) continue;
    const fails = [];  // [P, zero_estimate's line] of each P it refuses with this T
    for (let P = 1; P <= N / T; P++) {
      if ((N / T) % P) continue;
      let est;
      try {
        est = estimateJson(tensorFlags(T, undefined, P));
      } catch (err) {
        if (T === 1 && P === 1) {  // the model or N itself: zero_estimate's line, no table
          status.className = "error";
          status.textContent = err.message;
          saveView();
          return;
        }
        fails.push([P, err.message]);
        if (P === 1) break;  // the T itself (the heads, the sequence): no P with it either
        continue;
      }
      body.append(tensorRow(T, P, est, budget));
      shown++;
      last = [T, P];
    }
    if (fails.length) skipped.push(...refusedLine(T, fails));
  }
  t.append(el("thead", {}, head), body);
  status.className = "";
  status.textContent = `N = ${N}, ${shown} configurations T x P x D (with P > 1 the rank of the segment that holds the ` +
    `most); the most blocks of ${$("dim").value.trim() ? "width " + $("dim").value.trim() : "the preset's width"} ` +
    `that fit ${$("tp-mem").value.trim()} per rank` + (skipped.length ? `. Not: ${skipped.join("; ")}` : "") +
    ` — zero_estimate ${tensorFlags(last[0], undefined, last[1]).join(" ")}`;
  saveView();
}
// ---- Muon beside AdamW: zero_estimate --optimizer muon --json for the form's model and N ----
// (its "muon" object: per stage adam_m and adam_v with each optimizer, per design the elements sent and
// the Newton-Schulz FLOPs, lowest and highest rank; the page adds adam_m and adam_v, nothing more)
function muonFlags() {
  return withoutFit(flagsFromForm()).concat(["--world", $("world").value.trim(), "--optimizer", "muon"]);
}
function muonCell(tr, key, who, v, kind) {
  const shown = kind === "bytes" ? fmtBytes(v) : kind === "flops" ? (Number(v) / 1e9).toPrecision(4) + " GFLOP"
                                                                   : grouped(v);
  tr.append(el("td", { "data-key": key, "data-who": who, "data-value": String(v),
                       title: grouped(v) + (kind === "bytes" ? " bytes" : kind === "flops" ? " FLOPs" : " elements") },
               shown));
}
function updateMuon() {
  const status = $("muon-status"), t = $("muon-table"), d = $("muon-designs");
  t.replaceChildren();
  d.replaceChildren();
  if (needsShape(status, "Muon's table")) return;
  try {
    const m = estimateJson(muonFlags()).muon[0];
    const head = el("tr", {}, el("th", { scope: "col" }, "bytes per rank"));
    for (const name of ["adam_m (m, or Muon's momentum)", "adam_v AdamW", "adam_v Muon (lowest rank)",
                        "adam_v Muon (highest rank)", "optimizer state AdamW", "optimizer state Muon (highest rank)"])
      head.append(el("th", { scope: "col" }, name));
    t.append(el("thead", {}, head));
    const body = el("tbody");
    for (const st of m.stages) {
      const tr = el("tr", {}, el("th", { scope: "row" }, st.stage));
      for (const k of ["adam_m", "adam_v_adamw", "adam_v_muon_min", "adam_v_muon_max"]) muonCell(tr, k, st.stage, st[k], "bytes");
      muonCell(tr, "state_adamw", st.stage, big(st.adam_m) + big(st.adam_v_adamw), "bytes");
      muonCell(tr, "state_muon_max", st.stage, big(st.adam_m) + big(st.adam_v_muon_max), "bytes");
      body.append(tr);
    }
    t.append(body);
    const dhead = el("tr", {}, el("th", { scope: "col" }, "stages 1-3, per rank per step"));
    for (const name of ["p2p elements (lowest)", "p2p elements (highest)", "all-gathered elements", "Newton-Schulz (lowest)",
                        "Newton-Schulz (highest)", "work space"])
      dhead.append(el("th", { scope: "col" }, name));
    d.append(el("thead", {}, dhead));
    const dbody = el("tbody");
    for (const x of m.designs) {
      const tr = el("tr", {}, el("th", { scope: "row" }, "--muon-shard " + x.design));
      muonCell(tr, "p2p_elems_min", x.design, x.p2p_elems_min, "elems");
      muonCell(tr, "p2p_elems_max", x.design, x.p2p_elems_max, "elems");
      muonCell(tr, "gather_elems", x.design, x.gather_elems, "elems");
      muonCell(tr, "ns_flops_min", x.design, x.ns_flops_min, "flops");
      muonCell(tr, "ns_flops_max", x.design, x.ns_flops_max, "flops");
      muonCell(tr, "work_bytes", x.design, x.work_bytes, "bytes");
      dbody.append(tr);
    }
    d.append(dbody);
    status.className = "";
    status.textContent = `${m.matrices} hidden matrices, ${grouped(m.muon_params)} parameters; at N = ${m.world} the ` +
      `slices cut ${m.cut.length} of them` + (m.cut.length ? ` (${m.cut.slice(0, 4).map((c) => `${c.name} ranks ` +
      `${c.first_rank}..${c.last_rank}`).join(", ")}${m.cut.length > 4 ? ", ..." : ""})` : "") +
      `; stage0_ddp: Newton-Schulz ${(Number(m.ddp_ns_flops) / 1e9).toPrecision(4)} GFLOP on every rank — zero_estimate ` +
      muonFlags().join(" ");
  } catch (e) {
    status.className = "error";
    status.textContent = e.message;
  }
  saveView();
}
// ---- long sequences: zero_estimate --sp S --fit SIZE, the longest sequence per rank (docs/ulysses.md) ----
// The form's model, micro-batch, precision and N; no --seq (the fit finds it), no --fit of the ladder's table.
function spFlags() {
  const f = ["--preset", $("preset").value];
  for (const k of ["layers", "dim", "heads", "vocab"]) if ($(k).value.trim()) f.push("--" + k, $(k).value.trim());
  return f.concat(["--batch", $("batch").value, "--precision", $("precision").value, "--world", $("world").value.trim(),
                   "--sp", $("sp-s").value.trim(), "--fit", $("sp-mem").value.trim()]);
}
const SP_DESIGNS = [["stage3", "stage3 alone"], ["ulysses", "Ulysses"], ["ring", "ring"]];
function updateSeqFit() {
  const status = $("sp-status"), t = $("sp-table");
  t.replaceChildren();
  if (needsShape(status, "The longest sequence")) return;
  try {
    const z = estimateJson(spFlags());
    const head = el("tr", {}, el("th", { scope: "col" }, `S = ${z.sp}, ${fmtBytes(z.budget)} per rank`));
    for (const ck of ["", " (checkpointing)"])
      for (const name of ["longest T", "model states", "activations"]) head.append(el("th", { scope: "col" }, name + ck));
    t.append(el("thead", {}, head));
    const body = el("tbody");
    for (const [key, name] of SP_DESIGNS) {
      const tr = el("tr", {}, el("th", { scope: "row" }, name));
      for (const ck of ["", "_checkpointing"]) {
        const r = z.fit[key + ck];
        if (r === null) {  // Ulysses with S not dividing the heads
          tr.append(el("td", { colspan: "3", "data-key": "seq" + ck, "data-design": key, "data-value": "" },
                       `not possible: ${z.heads} heads do not split over S = ${z.sp}`));
          continue;
        }
        const cell = (k, v, text) => tr.append(el("td", { "data-key": k + ck, "data-design": key, "data-value": String(v),
                                                          title: grouped(v) + (k === "seq" ? " tokens" : " bytes") }, text));
        cell("seq", r.seq, r.seq ? grouped(r.seq) : "none fits");
        cell("state", r.state, fmtBytes(r.state));
        cell("activations", r.activations, fmtBytes(r.activations));
      }
      body.append(tr);
    }
    t.append(body);
    status.className = "";
    status.textContent = `${z.world} ranks = ${z.replicas} replicas x S = ${z.sp}, micro-batch ${z.batch}, ${z.precision}: ` +
      `zero_estimate ${spFlags().join(" ")}`;
  } catch (e) {
    status.className = "error";
    status.textContent = e.message;
  }
  saveView();
}

// ---- a measured run: a trainer's --log-json report, its ledger beside the formula ----
// The formula is zero_estimate's for the run's own settings (stage, world, model, precision, batch,
// sequence, accumulation, checkpointing, attention); the ledger is each rank's peak by category,
// summed over device, host and disk.
const LEDGER_CATEGORIES = CATEGORIES.concat(["scratch"]);
function runFlags(r) {
  const f = ["--preset", r.preset];
  for (const k of ["layers", "dim", "heads", "vocab"]) f.push("--" + k, String(r.config[k]));
  f.push("--batch", String(r.batch), "--seq", String(r.seq), "--precision", r.precision, "--accum", String(r.accum),
         "--world", String(r.world), "--stage", r.stage, "--attention", r.attention);
  if (r.activation_checkpointing) f.push("--activation-checkpointing");
  return f;
}
function ledgerPeak(rank, c) {
  let sum = 0n;
  for (const where of ["device", "host", "disk"]) {
    const l = rank.ledger[where];
    if (l && l.peak && l.peak[c] !== undefined) sum += big(l.peak[c]);
  }
  return sum;
}
function showReport(text) {
  const status = $("run-status");
  const table = $("run-table");
  table.replaceChildren();
  $("run-chart").replaceChildren();
  try {
    const r = parseExact(text);
    if (!r.ranks || !r.stage || !r.config) throw new Error("not a trainer's --log-json report (no ranks, stage or config)");
    const flags = runFlags(r);
    const formula = estimateJson(flags).estimates[0];
    const head = el("tr", {}, el("th", { scope: "col" }, "peak bytes"), el("th", { scope: "col" }, "formula"));
    for (const k of r.ranks) head.append(el("th", { scope: "col" }, "rank " + k.rank + " ledger"));
    table.append(el("thead", {}, head));
    const body = el("tbody");
    let differ = 0;
    const bars = [{ name: "formula", parts: {} }];
    for (const k of r.ranks) bars.push({ name: "rank " + k.rank, parts: {} });
    for (const c of LEDGER_CATEGORIES) {
      const want = c in formula.bytes ? big(formula.bytes[c]) : null;
      const got = r.ranks.map((k) => ledgerPeak(k, c));
      if (want === null && got.every((g) => g === 0n)) continue;
      const tr = el("tr", {}, el("th", { scope: "row" }, c),
                    el("td", { "data-key": c, "data-who": "formula", "data-value": want === null ? "" : String(want) },
                       want === null ? "not in the formula" : grouped(want)));
      got.forEach((g, i) => {
        const same = want !== null && g === want;
        differ += !same;
        tr.append(el("td", { "data-key": c, "data-who": "rank" + r.ranks[i].rank, "data-value": String(g),
                             "data-match": same ? "1" : "0", class: same ? "right" : "wrong" },
                     grouped(g) + (same ? " =" : " ≠")));
        bars[i + 1].parts[c] = Number(g);
      });
      if (want !== null) bars[0].parts[c] = Number(want);
      body.append(tr);
    }
    table.append(body);
    drawBars("run-chart", bars, LEDGER_CATEGORIES);
    status.className = differ ? "error" : "";
    status.textContent = `${r.stage} on ${r.world} ranks, ${r.preset} (${r.precision}, batch ${r.batch} x ${r.seq}): ` +
      (differ ? `${differ} ledger cells differ from the formula` : "ledger = formula, to the byte, on every rank") +
      ` — zero_estimate ${flags.join(" ")}`;
  } catch (e) {
    status.className = "error";
    status.textContent = e.message;
  }
}
// Horizontal bars, one per row of `bars` ({name, parts: {category: bytes}}), stacked by category.
function drawBars(id, bars, categories) {
  const svg = $(id), ns = "http://www.w3.org/2000/svg";
  const W = 640, left = 80, barH = 24, H = 16 + bars.length * (barH + 6);
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const max = Math.max(1, ...bars.map((b) => Object.values(b.parts).reduce((a, v) => a + v, 0)));
  bars.forEach((b, i) => {
    const y = 10 + i * (barH + 6);
    const t = document.createElementNS(ns, "text");
    Object.entries({ x: left - 6, y: y + barH / 2 + 4, "text-anchor": "end", "font-size": 12 }).forEach(([k, v]) => t.setAttribute(k, v));
    t.textContent = b.name;
    svg.append(t);
    let x = left;
    for (const c of categories) {
      const w = ((b.parts[c] || 0) / max) * (W - left - 10);
      if (!w) continue;
      const r = document.createElementNS(ns, "rect");
      Object.entries({ x: x, y: y, width: w, height: barH, fill: COLORS[c] || "#999" }).forEach(([k, v]) => r.setAttribute(k, v));
      const title = document.createElementNS(ns, "title");
      title.textContent = `${b.name}: ${c} ${grouped(b.parts[c])} bytes`;
      r.append(title);
      svg.append(r);
      x += w;
    }
  });
}

// ---- the paper's Table 1 ----
function showPaperTable() {
  $("paper-out").textContent = zeroEstimate(["--paper-table"]).out;
}
// A case of Table 1: the form above is set to it (its chart and table follow), and its model states are
// shown here, under the button clicked, where the eye is.
function paperCase(psi, N) {
  $("model").value = "params";
  $("params").value = psi;
  $("precision").value = "bf16";
  $("world").value = String(N);
  $("stage").value = "all";
  $("fit").value = "";
  syncModel();
  update();
  const out = $("paper-case");
  out.replaceChildren();
  const cells = [...document.querySelectorAll("#table td[data-key=model_state]")];
  const head = el("tr", {}, el("th", { scope: "col" }, `Ψ = ${psi}, N = ${N}`));
  const row = el("tr", {}, el("th", { scope: "row" }, "model states per rank"));
  for (const td of cells) {
    head.append(el("th", { scope: "col" }, td.dataset.stage));
    row.append(el("td", { "data-key": "model_state", "data-stage": td.dataset.stage, "data-value": td.dataset.value,
                          title: td.title }, td.textContent));
  }
  out.append(el("div", { class: "scroll" }, el("table", {}, el("thead", {}, head), el("tbody", {}, row))),
             el("p", { class: "note" }, "Set in the form above: ", el("a", { href: "#explore" }, "its chart and every category"), "."));
  out.scrollIntoView({ block: "nearest" });
}

// ---- DeepSpeed's estimator beside the ledger (docs/faq.md): zero_estimate's own text ----
function showDeepSpeed(flags) {
  $("ds-out").textContent = zeroEstimate(["--deepspeed-estimator", "--precision", "bf16"].concat(flags.split(" "))).out;
}

function syncModel() {
  const raw = $("model").value === "params";
  for (const id of ["shape-fields", "activation-fields"]) $(id).hidden = raw;
  $("params-field").hidden = !raw;
}

// ---- start ----
function start(factory) {
  factory({ print: (l) => captured.out.push(l), printErr: (l) => captured.err.push(l) }).then((m) => {
    wasm = m;
    for (const id of MAIN_IDS) $(id).addEventListener("change", () => { syncModel(); update(); });
    for (const id of ZPP_IDS) $(id).addEventListener("change", updateZeropp);
    for (const id of PP_IDS) $(id).addEventListener("change", updatePipeline);
    for (const id of TP_IDS) $(id).addEventListener("change", updateTensor);
    for (const id of SP_IDS) $(id).addEventListener("change", updateSeqFit);
    // an address edited or pasted in the bar (the same page, another view): that view
    window.addEventListener("hashchange", () => {
      if (location.hash.includes("=")) { loadFormState(location.hash); syncModel(); update(); }
    });
    for (const b of document.querySelectorAll("[data-paper]"))
      b.addEventListener("click", () => paperCase(b.dataset.paper, parseInt(b.dataset.world, 10)));
    $("report").addEventListener("change", (ev) => {
      const f = ev.target.files[0];
      if (f) f.text().then(showReport);
    });
    showPaperTable();
    for (const b of document.querySelectorAll("[data-ds]")) b.addEventListener("click", () => showDeepSpeed(b.dataset.ds));
    showDeepSpeed("--params 7.5B --world 64");
    if (location.hash.includes("=")) loadFormState(location.hash);
    syncModel();
    update();
    if (window.nzQuiz) window.nzQuiz.init();
    document.body.dataset.ready = "1";  // the browser test waits for this
  });
}
const writeFile = (path, text) => wasm.FS.writeFile(path, text);
window.nzExplorer = { zeroEstimate, estimateJson, update, updateTensor, paperCase, writeFile, showReport, showDeepSpeed };
start(createZeroEstimate);
