"""The explorer (docs/explorer.md) in headless Chromium, against the command line.

The page runs zero_estimate compiled to WebAssembly; this checks, in a real browser, that what it
shows is what build/bin/zero_estimate (the native build) prints:
  - a few hundred random configurations set through the page's form: every number of its table
    (bytes by category, totals, the fitting micro-batch, elements sent), of its ZeRO++ table
    (bytes inside and across nodes, memory added, the step time) and of its pipeline table (each
    segment's bytes by category, activation slots, total), and for one in ten of its
    accumulation table too, equals the native --json output for the same flags, which are written here from the
    configuration independently of the page; an invalid one shows the command line's own error line;
  - the quiz: the questions of `zero_estimate --quiz` for a seed; each answer typed and Entered is
    marked right or wrong at once, a wrong one with its worked answer; the score, and a result line
    that `zero_estimate --verify` accepts, as does the page's own box for the instructor (and an
    edited line, or not a result line, gets the command line's verdict there too);
  - a trainer's --log-json report, loaded through the page's file input: each rank's ledger beside
    the formula, marked equal cell by cell; a report with one byte changed is marked at that cell;
  - the chart: a bar per stage, N and device category with zero_estimate's bytes, and the host's
    bytes above them for offload and infinity, stacked, to scale;
  - the paper's Table 1 cases, one click each: the bytes equal the native ones and, in GB to three
    digits, the paper's printed cells (typed in here from the paper);
  - keyboard use: Tab reaches every control of the form in order, and typing a world size and Tab
    updates the table; text contrast at least 4.5:1 (WCAG AA); at 1024 x 768 no sideways scrolling
    and the chart starts on the first screen;
  - a view's permalink (the form in the page's address) reopens the same table;
  - the page works from disk (file://) and from `make explore`'s server (scripts/explore.sh);
  - the check can fail: the same comparison on a copy of the page whose form drops --accum finds
    the differences;
  - as a newcomer uses it (newcomer_checks): at 400, 768 and 1024 CSS pixels no sideways scrolling
    and the chart at a usable size, each control's effect on the screen where the control is; the
    address bar as the view (reload = the same settings and tables, ZeRO++'s and the pipeline's
    included); the default view without an error or an empty box; preset tiny; the command shown
    under an error; the device-memory line; every bar seen and labelled; the whole result line.
The same checks run in each browser named (chromium, through chromedriver; firefox, through its
Marionette port). Prints NZRESULT lines; usage: explorer_check.py PAGE_DIR ZERO_ESTIMATE BROWSER:CONFIGURATIONS... (chromium:300 firefox:100)
"""
import concurrent.futures
import functools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from webdriver import Browser, Firefox, KEY_ENTER, KEY_TAB, WebDriverError, free_port  # noqa: E402

page_dir, native = sys.argv[1], sys.argv[2]  # (explorer_wasm_check.py imports the configurations from here)
browsers = [(b.split(":")[0], int(b.split(":")[1])) for b in sys.argv[3:]]  # chromium:300 firefox:100
current = "chromium"  # the browser the checks run in: the results' names say it


def res(name, ok, detail=""):
    print(f"NZRESULT {'PASS' if ok else 'FAIL'} explorer.{current}.{name} {detail}".rstrip(), flush=True)


# ---- random configurations, and the flags the command line takes for each ----
CTX = {"tiny": 32, "small": 128, "gpt2": 1024}
STAGES = ["all", "stage0_ddp", "stage1", "stage2", "stage3", "offload", "infinity"]
WORLDS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]  # the chart's N


def random_config(rng):
    c = {"precision": rng.choice(["fp32", "bf16", "fp16"]), "stage": rng.choice(STAGES),
         "world": rng.choice([1, 2, 3, 4, 5, 8, 16, 24, 64, 100, 256, 1024]), "accum": rng.randint(1, 8)}
    c["zpp-node"] = rng.choice([1, 2, 4, 8])
    c["zpp-qw"], c["zpp-qg"] = rng.choice([64, 256, 1024]), rng.choice([32, 256])
    c["zpp-net"], c["zpp-ms"] = rng.choice([("", ""), ("300,25", "100"), ("300,3.125", "")])
    c["pp-segments"], c["pp-schedule"] = rng.choice([1, 2, 3, 4]), rng.choice(["1f1b", "gpipe"])
    c["pp-partition"], c["pp-zero"] = rng.choice(["", "", "", "1,2"]), rng.choice(["0", "1"])
    if rng.random() < 0.25:
        c["model"] = "params"
        c["params"] = rng.choice(["7.5B", "125M", "1T", "3e9", "1.3B", str(rng.randint(1, 10**12)), "175B"])
        return c
    c["model"] = "shape"
    c["preset"] = rng.choice(list(CTX))
    c["layers"] = str(rng.randint(1, 48)) if rng.random() < 0.4 else ""
    heads = rng.choice([1, 2, 4, 6, 8, 12, 16])
    c["heads"] = str(heads) if rng.random() < 0.4 else ""
    c["dim"] = str(heads * rng.choice([8, 16, 32, 64])) if c["heads"] and rng.random() < 0.8 else ""
    c["vocab"] = rng.choice(["", "", "50257", "32000"])
    c["batch"] = rng.randint(1, 16)
    c["seq"] = rng.randint(1, CTX[c["preset"]])
    c["ckpt"] = rng.random() < 0.5
    c["attention"] = "flash" if rng.random() < 0.15 else "gemm"
    c["fit"] = rng.choice(["", "", "24GB", "64MiB", "80GB", "2GB"])
    return c


def native_flags(c, accum=None):
    f = []
    if c["model"] == "params":
        f += ["--params", c["params"]]
    else:
        f += ["--preset", c["preset"]]
        for k in ("layers", "dim", "heads", "vocab"):
            if c[k]:
                f += [f"--{k}", c[k]]
        f += ["--batch", str(c["batch"])] + (["--seq", str(c["seq"])] if c["seq"] != "" else [])
        if c["ckpt"]:
            f.append("--activation-checkpointing")
        f += ["--attention", c["attention"]]
        if c["fit"]:
            f += ["--fit", c["fit"]]
    f += ["--precision", c["precision"], "--accum", str(accum or c["accum"]), "--world", str(c["world"]),
          "--stage", c["stage"]]
    return f


@functools.lru_cache(maxsize=None)
def _native(flags):
    p = subprocess.run([native] + list(flags) + ["--json"], capture_output=True, text=True)
    return p.returncode, (json.loads(p.stdout) if p.returncode == 0 else p.stderr.strip())


def zeropp_flags(c):
    f = native_flags(c)[:-2]  # ZeRO++'s table has no --stage, nor --fit (zero_estimate refuses it there)
    if "--fit" in f:
        i = f.index("--fit")
        del f[i:i + 2]
    f += ["--zeropp", str(c["zpp-node"]), "--qw-block", str(c["zpp-qw"]), "--qg-block", str(c["zpp-qg"])]
    if c["zpp-net"]:
        f += ["--network", c["zpp-net"]] + (["--compute-ms", c["zpp-ms"]] if c["zpp-ms"] else [])
    return f


def pipeline_flags(c):
    f = native_flags(c)[:-2] + ["--pipeline", str(c["pp-segments"]), "--schedule", c["pp-schedule"]]
    if c["pp-partition"]:
        f += ["--partition", c["pp-partition"]]
    if c["pp-zero"] != "0":
        f += ["--zero", c["pp-zero"]]
    return f


def muon_flags(c):
    f = native_flags(c)[:-2]  # Muon's object has no --stage (every stage in it), nor --fit (the page drops it)
    if "--fit" in f:
        i = f.index("--fit")
        del f[i:i + 2]
    return f + ["--optimizer", "muon"]


def muon_expected(want):
    """{(key, stage or design): value} of zero_estimate --optimizer muon --json's "muon" object, with the
    page's two sums (optimizer state with AdamW, and with Muon on its highest rank)."""
    m, out = want["muon"][0], {}
    for st in m["stages"]:
        for k in ("adam_m", "adam_v_adamw", "adam_v_muon_min", "adam_v_muon_max"):
            out[(k, st["stage"])] = st[k]
        out[("state_adamw", st["stage"])] = st["adam_m"] + st["adam_v_adamw"]
        out[("state_muon_max", st["stage"])] = st["adam_m"] + st["adam_v_muon_max"]
    for x in m["designs"]:
        for k in ("p2p_elems_min", "p2p_elems_max", "gather_elems", "ns_flops_min", "ns_flops_max", "work_bytes"):
            out[(k, x["design"])] = x[k]
    return out


def run_native(flags):
    return _native(tuple(flags))


def run_native_all(flag_lists):
    """Runs them 8 at a time (each run is mostly waiting: 50 ms of start-up, 5 ms of CPU)."""
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(run_native, flag_lists))


# ---- the page: set the form, read what it shows ----
SET_AND_READ = """
const configs = arguments[0], out = [];
for (const c of configs) {
  for (const [k, v] of Object.entries(c)) {
    const e = document.getElementById(k);
    if (e.type === "checkbox") e.checked = v; else e.value = String(v);
  }
  window.nzExplorer.update();
  const st = document.getElementById("status");
  const cells = [...document.querySelectorAll("#table td, #accum-table td")].map(
      (td) => [td.dataset.key, td.dataset.stage, td.dataset.accum || "", td.dataset.value]);
  const zst = document.getElementById("zpp-status");
  const zcells = [...document.querySelectorAll("#zpp-table td")].map((td) => [td.dataset.key, td.dataset.technique, td.dataset.value]);
  const pst = document.getElementById("pp-status");
  const pcells = [...document.querySelectorAll("#pp-table td[data-key]")].map((td) => [td.dataset.key, td.dataset.segment, td.dataset.value]);
  const mst = document.getElementById("muon-status");
  const mcells = [...document.querySelectorAll("#muon-table td, #muon-designs td")].map((td) => [td.dataset.key, td.dataset.who, td.dataset.value]);
  out.push({error: st.className === "error" ? st.textContent : "", cells: cells,
            zerror: zst.className === "error" ? zst.textContent : "", zcells: zcells, zneeds: zst.className === "needs",
            perror: pst.className === "error" ? pst.textContent : "", pcells: pcells, pneeds: pst.className === "needs",
            merror: mst.className === "error" ? mst.textContent : "", mcells: mcells, mneeds: mst.className === "needs"});
}
return out;
"""

FIELDS = ["model", "preset", "layers", "dim", "heads", "vocab", "params", "precision", "stage", "world",
          "batch", "seq", "accum", "ckpt", "attention", "fit", "zpp-node", "zpp-qw", "zpp-qg", "zpp-net", "zpp-ms",
          "pp-segments", "pp-schedule", "pp-partition", "pp-zero"]
DEFAULTS = {"preset": "small", "layers": "", "dim": "", "heads": "", "vocab": "", "params": "7.5B",
            "batch": 4, "seq": "", "ckpt": False, "attention": "gemm", "fit": "", "zpp-node": 8, "zpp-qw": 256,
            "zpp-qg": 256, "zpp-net": "", "zpp-ms": "", "pp-segments": 2, "pp-schedule": "1f1b", "pp-partition": "",
            "pp-zero": "0"}


def compare(browser, configs):
    """(values compared, configurations compared, list of differences): the table, the accumulation
    table and the ZeRO++ table"""
    # the accumulation table for one configuration in ten: each K is another run of the command line
    with_k = {i for i in range(len(configs)) if i % 10 == 0}
    run_native_all([native_flags(c) for c in configs] + [zeropp_flags(c) for c in configs] +
                   [pipeline_flags(c) for c in configs] + [muon_flags(c) for c in configs] +
                   [native_flags(configs[i], accum=K) for i in with_k for K in (1, 2, 4, 8)])
    shown = browser.run(SET_AND_READ, [{k: c.get(k, DEFAULTS.get(k)) for k in FIELDS} for c in configs])
    values, diffs = 0, []
    compare.zeropp_tables = compare.pipeline_tables = compare.muon_tables = 0
    for i, (c, page) in enumerate(zip(configs, shown)):
        prc, pwant = run_native(pipeline_flags(c))
        compare.pipeline_tables += prc == 0
        # a parameter count: ZeRO++ and the pipeline need a shape, which the page says as a note, not an error
        shape_needed = c["model"] == "params"
        if shape_needed != (prc != 0 and "needs a model shape" in pwant):
            diffs.append(f"{pipeline_flags(c)}: zero_estimate's answer '{str(pwant)[:80]}' for a {c['model']}")
        if shape_needed:
            if not page["pneeds"] or page["pcells"] or page["perror"]:
                diffs.append(f"{pipeline_flags(c)}: the page shows no note that the pipeline needs a shape")
        elif prc != 0:
            if page["perror"] != pwant:
                diffs.append(f"{pipeline_flags(c)}: native '{pwant}', page '{page['perror']}'")
        else:
            pexpect = {}
            for e in pwant["estimates"]:
                for k, v in e["bytes"].items():
                    pexpect[("bytes." + k, str(e["segment"]))] = v
                pexpect[("slots", str(e["segment"]))] = e["slots"]
                pexpect[("total", str(e["segment"]))] = e["total"]
            pgot = {(k, st): v for k, st, v in page["pcells"]}
            if set(pgot) != set(pexpect):
                diffs.append(f"{pipeline_flags(c)}: pipeline cells {sorted(set(pgot) ^ set(pexpect))[:4]} on one side only")
            for key in pexpect.keys() & pgot.keys():
                values += 1
                if pgot[key] != str(pexpect[key]):
                    diffs.append(f"{pipeline_flags(c)}: {key} page {pgot[key]}, zero_estimate {pexpect[key]}")
        mrc, mwant = run_native(muon_flags(c))  # Muon beside AdamW (a shape only, as ZeRO++)
        compare.muon_tables += mrc == 0
        if shape_needed:
            if not page["mneeds"] or page["mcells"] or page["merror"] or mrc == 0:
                diffs.append(f"{muon_flags(c)}: the page shows no note that Muon's table needs a shape")
        elif mrc != 0:
            if page["merror"] != mwant:
                diffs.append(f"{muon_flags(c)}: native '{mwant}', page '{page['merror']}'")
        else:
            mexpect, mgot = muon_expected(mwant), {(k, w): v for k, w, v in page["mcells"]}
            if set(mgot) != set(mexpect):
                diffs.append(f"{muon_flags(c)}: Muon cells {sorted(set(mgot) ^ set(mexpect))[:4]} on one side only")
            for key in mexpect.keys() & mgot.keys():
                values += 1
                if mgot[key] != str(mexpect[key]):
                    diffs.append(f"{muon_flags(c)}: {key} page {mgot[key]}, zero_estimate {mexpect[key]}")
        zrc, zwant = run_native(zeropp_flags(c))
        compare.zeropp_tables += zrc == 0
        if shape_needed:
            if not page["zneeds"] or page["zcells"] or page["zerror"] or zrc == 0:
                diffs.append(f"{zeropp_flags(c)}: the page shows no note that ZeRO++ needs a shape")
        elif zrc != 0:
            if page["zerror"] != zwant:
                diffs.append(f"{zeropp_flags(c)}: native '{zwant}', page '{page['zerror']}'")
        else:
            zexpect = {}
            for e in zwant["estimates"]:
                e["inside"] = e["comm_bytes_per_step"] - e["comm_bytes_across_nodes_per_step"]
                for k in ("comm_bytes_per_step", "inside", "comm_bytes_across_nodes_per_step", "state_bytes_added",
                          "step_ms"):
                    if k in e:
                        zexpect[(k, e["technique"])] = e[k]
            zgot = {(k, t): v for k, t, v in page["zcells"]}
            if set(zgot) != set(zexpect):
                diffs.append(f"{zeropp_flags(c)}: ZeRO++ cells {sorted(set(zgot) ^ set(zexpect))[:4]} on one side only")
            for key in zexpect.keys() & zgot.keys():
                values += 1
                if zgot[key] != str(zexpect[key]):
                    diffs.append(f"{zeropp_flags(c)}: {key} page {zgot[key]}, zero_estimate {zexpect[key]}")
        rc, want = run_native(native_flags(c))
        if rc != 0:  # the page shows the command line's error line, and no numbers
            if page["error"] != want or page["cells"]:
                diffs.append(f"{native_flags(c)}: native '{want}', page '{page['error']}' and {len(page['cells'])} cells")
            continue
        if page["error"]:
            diffs.append(f"{native_flags(c)}: page error '{page['error']}', native ran")
            continue
        expect = {}
        for e in want["estimates"]:
            for k, v in e["bytes"].items():
                expect[("bytes." + k, e["stage"], "")] = v
            for k in ("model_state", "device", "host", "fit_batch", "fit_batch_checkpointed", "comm_elems_per_step",
                      "link_elems_per_step"):
                if k in e:
                    expect[(k, e["stage"], "")] = e[k]
        for K in (1, 2, 4, 8) if i in with_k else ():
            _, wk = run_native(native_flags(c, accum=K))
            for e in wk["estimates"]:
                expect[("comm_elems_per_step", e["stage"], str(K))] = e["comm_elems_per_step"]
        got = {(k, s, a): v for k, s, a, v in page["cells"] if i in with_k or not a}
        if set(got) != set(expect):
            diffs.append(f"{native_flags(c)}: cells {sorted(set(got) ^ set(expect))[:4]} on one side only")
        for key in expect.keys() & got.keys():
            values += 1
            if got[key] != str(expect[key]):
                diffs.append(f"{native_flags(c)}: {key} page {got[key]}, zero_estimate {expect[key]}")
    return values, len(configs), diffs


# ---- the long sequences' panel (zero_estimate --sp S --fit SIZE): its own configurations, set through
# the page's form, every cell against the native --json of flags written here from the configuration ----
SP_READ = """
const out = [];
for (const c of arguments[0]) {
  for (const [k, v] of Object.entries(c)) document.getElementById(k).value = String(v);
  window.nzExplorer.update();
  const st = document.getElementById("sp-status");
  out.push({error: st.className === "error" ? st.textContent : "", needs: st.className === "needs",
            cells: [...document.querySelectorAll("#sp-table td")].map((td) => [td.dataset.key, td.dataset.design, td.dataset.value])});
}
return out;
"""


def sp_config(rng):
    c = {"model": "shape", "preset": rng.choice(list(CTX)), "layers": rng.choice(["", "", "3", "24"]),
         "heads": "", "dim": "", "vocab": rng.choice(["", "50257"]), "batch": rng.randint(1, 4),
         "precision": rng.choice(["fp32", "bf16", "fp16"]), "world": rng.choice([1, 2, 4, 6, 8, 12, 16, 64, 3]),
         "sp-s": rng.choice([1, 2, 3, 4, 8, 16]), "sp-mem": rng.choice(["80GB", "24GB", "2GB", "64MiB", "1MB", "lots"])}
    if rng.random() < 0.3:
        heads = rng.choice([4, 6, 12, 16])
        c["heads"], c["dim"] = str(heads), str(heads * 32)
    return c


def sp_native_flags(c):
    f = ["--preset", c["preset"]]
    for k in ("layers", "dim", "heads", "vocab"):
        if c[k]:
            f += [f"--{k}", c[k]]
    return f + ["--batch", str(c["batch"]), "--precision", c["precision"], "--world", str(c["world"]),
                "--sp", str(c["sp-s"]), "--fit", c["sp-mem"]]


def sp_checks(browser, count=40):
    rng = random.Random(42)
    configs = [sp_config(rng) for _ in range(count)]
    run_native_all([sp_native_flags(c) for c in configs])
    shown = browser.run(SP_READ, configs)
    diffs, values, tables = [], 0, 0
    for c, page in zip(configs, shown):
        rc, want = run_native(sp_native_flags(c))
        if rc != 0:
            if page["error"] != want or page["cells"]:
                diffs.append(f"{sp_native_flags(c)}: native '{want}', page '{page['error']}'")
            continue
        tables += 1
        expect = {}
        for key, r in want["fit"].items():
            design, ck = (key.split("_", 1) + [""])[:2]
            ck = "_" + ck if ck else ""
            if r is None:
                expect[("seq" + ck, design)] = ""
            else:
                for k in ("seq", "state", "activations"):
                    expect[(k + ck, design)] = str(r[k])
        got = {(k, d): v for k, d, v in page["cells"]}
        if got != expect:
            diffs.append(f"{sp_native_flags(c)}: cells differ, e.g. {sorted(set(got.items()) ^ set(expect.items()))[:2]}")
        values += len(expect)
    # a parameter count: a note that the panel needs a shape, no error and no numbers
    page = browser.run(SP_READ, [{"model": "params", "params": "7.5B"}])[0]
    needs = page["needs"] and not page["cells"] and not page["error"]
    browser.run(SP_READ, [{"model": "shape", "sp-s": 4, "sp-mem": "80GB"}])  # the panel's defaults again
    res("long_sequences_panel_equals_zero_estimate", not diffs and tables >= 10 and needs,
        f"({len(configs)} configurations, {tables} with a table, {values} cells compared, a parameter count "
        f"{'noted' if needs else 'NOT noted'} as needing a shape; {len(diffs)} differ{': ' + diffs[0] if diffs else ''})")


def load(browser, url):
    browser.get(url)
    return browser.wait_for("return document.body.dataset.ready === '1'", timeout=60)


def serve(directory):
    """make explore's server (scripts/explore.sh) on a free port: (its process, the port)."""
    port = free_port()
    proc = subprocess.Popen(["bash", "scripts/explore.sh", directory], env=dict(os.environ, EXPLORE_PORT=str(port)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, port


def stop(proc):
    os.killpg(proc.pid, signal.SIGTERM)  # the script and the server it started: its own process group
    proc.wait(timeout=10)


def start(kind):
    """The browser, or None after one FAIL line saying why it did not start (tried twice: a first start
    on a loaded machine can time out). Either way nothing it started is left running."""
    for attempt in (1, 2):
        try:
            return Browser(1024, 768) if kind == "chromium" else Firefox(1024, 768)
        except WebDriverError as e:
            if attempt == 2:
                res("starts", False, f"({e}; tried twice)")
    return None


def main(kind, count):
    global current
    current = kind
    t0 = time.time()
    page = os.path.abspath(os.path.join(page_dir, "index.html"))
    browser = start(kind)
    if browser is None:
        return
    try:
        ok = load(browser, "file://" + page)
        res("loads_from_disk", ok, f"({page})")
        if not ok:
            return

        # -- the exactness comparison --
        rng = random.Random(30)
        configs = [random_config(rng) for _ in range(count)]
        tc = time.time()
        values, n, diffs = compare(browser, configs)
        errors = sum(1 for c in configs if run_native(native_flags(c))[0] != 0)
        res("numbers_equal_zero_estimate", not diffs and values > 0,
            f"({n} configurations, {n - errors} with numbers and {errors} with an error line, {compare.zeropp_tables} "
            f"with a ZeRO++ table, {compare.pipeline_tables} with a pipeline table and {compare.muon_tables} with "
            f"Muon's, {values} values compared "
            f"in {time.time() - tc:.1f} s; {len(diffs)} differ{': ' + diffs[0] if diffs else ''})")

        sp_checks(browser)  # the long sequences' panel

        # -- the chart: for every N and stage, a bar per device category holding zero_estimate's bytes,
        # stacked in order, every height the same number of pixels per byte --
        browser.run("document.getElementById('model').value = 'shape'; document.getElementById('preset').value = 'gpt2';"
                    "document.getElementById('precision').value = 'bf16'; document.getElementById('stage').value = 'all';"
                    "document.getElementById('fit').value = ''; document.getElementById('accum').value = '1';"
                    "document.getElementById('batch').value = '4'; document.getElementById('seq').value = '64';"
                    "document.getElementById('ckpt').checked = false; document.getElementById('attention').value = 'gemm';"
                    "for (const k of ['layers', 'dim', 'heads', 'vocab']) document.getElementById(k).value = '';"
                    "window.nzExplorer.update()")
        rects = browser.run("return [...document.querySelectorAll('#chart rect[data-cat]')].map((r) => [r.dataset.stage, "
                            "r.dataset.world, r.dataset.cat, r.dataset.bytes, +r.getAttribute('y'), +r.getAttribute('height')])")
        _, want = run_native(["--preset", "gpt2", "--precision", "bf16", "--stage", "all", "--batch", "4", "--seq", "64",
                              "--world", "1,2,4,8,16,32,64,128,256,512,1024"])
        expect = {(e["stage"], str(e["world"]), c): v for e in want["estimates"] for c, v in e["bytes"].items()
                  if v and e["location"][c] == "device"}
        expect.update({(e["stage"], str(e["world"]), "host"): e["host"] for e in want["estimates"] if e["host"]})
        got = {(st, w, c): b for st, w, c, b, _, _ in rects}
        scale = [h / int(b) for _, _, _, b, _, h in rects]
        stacked = all(abs(a[4] - (b[4] + b[5])) < 1e-6 for a, b in zip(rects, rects[1:]) if a[:2] == b[:2])
        bad = [k for k in expect if got.get(k) != str(expect[k])] + [k for k in got if k not in expect]
        res("chart_bars_are_zero_estimates_bytes_to_scale", not bad and stacked and max(scale) - min(scale) < 1e-9 * max(scale),
            f"({len(rects)} bars for {len(expect)} nonzero device categories and host totals; {bad[:3]}; stacked {stacked}; "
            f"pixels per byte {min(scale):.4g}..{max(scale):.4g})")

        # -- the paper's Table 1, one click each: its printed row for 7.5B on 64 ranks (GB, three digits),
        # and its closed forms for every case: (2+2+K)Ψ, 4Ψ + KΨ/N, 2Ψ + (2+K)Ψ/N, (2+2+K)Ψ/N, K = 12 --
        printed = {("7.5B", 64): ["120", "31.4", "16.6", "1.88"]}
        bad, cases = [], [("7.5B", 64), ("7.5B", 1024), ("128B", 64), ("1T", 1024)]
        for psi, N in cases:
            browser.click(browser.find(f'button[data-paper="{psi}"][data-world="{N}"]'))
            got = browser.run("return [...document.querySelectorAll('#table td[data-key=model_state]')]"
                              ".map((td) => [td.dataset.stage, td.dataset.value])")
            _, want = run_native(["--params", psi, "--world", str(N), "--precision", "bf16", "--stage", "all"])
            exact = {e["stage"]: str(e["model_state"]) for e in want["estimates"]}
            P = float(psi[:-1]) * {"B": 1e9, "T": 1e12}[psi[-1]]
            forms = [16 * P, 4 * P + 12 * P / N, 2 * P + 14 * P / N, 16 * P / N]
            for i, (stage, v) in enumerate(got[:4]):
                gb = int(v) / 1e9
                if v != exact[stage] or abs(int(v) - forms[i]) > 1e-6 * forms[i] + N or \
                        ((psi, N) in printed and f"{gb:.3g}" != printed[(psi, N)][i]):
                    bad.append(f"{psi} N={N} {stage}: page {v} ({gb:.3g} GB), zero_estimate {exact[stage]}, "
                               f"paper {forms[i]:.0f}")
        res("paper_table_cases_one_click", not bad, f"({len(cases) * 4} cells; {bad[:2]})")

        # -- keyboard: Tab walks the form in order; typing a world size and Tab updates the table --
        browser.run("document.getElementById('model').value = 'shape';"
                    "document.getElementById('model').dispatchEvent(new Event('change'));"
                    "document.getElementById('model').focus()")
        controls = browser.run("return [...document.querySelectorAll('#form select, #form input')]"
                               ".filter((e) => e.offsetParent !== null).map((e) => e.id)")
        seen = [browser.run("return document.activeElement.id")]
        for _ in range(len(controls) - 1):
            browser.keys(KEY_TAB)
            seen.append(browser.run("return document.activeElement.id"))
        res("tab_reaches_every_control_in_order", seen == controls, f"({len(controls)} controls; tab order {seen})")
        world = browser.find("#world")
        browser.clear(world)
        browser.type(world, "64")
        browser.keys(KEY_TAB)
        head = browser.run("return document.querySelector('#table th').textContent")
        v = browser.run("return document.querySelector('#table td[data-key=model_state]').dataset.value")
        flags = browser.run("return document.getElementById('cmdline').textContent").split()[1:]
        _, want = run_native(flags)
        res("typing_a_world_size_updates_the_table", head.endswith("N = 64") and v == str(want["estimates"][0]["model_state"]),
            f"(header '{head}', model state {v}, zero_estimate {want['estimates'][0]['model_state']})")

        # -- a view as a link: the page opened at its permalink shows the same table --
        link = browser.run("return document.getElementById('permalink').href")
        before = browser.run("return [...document.querySelectorAll('#table td')].map((td) => td.dataset.value)")
        browser.get("about:blank")
        load(browser, link)
        after = browser.run("return [...document.querySelectorAll('#table td')].map((td) => td.dataset.value)")
        res("a_permalink_reopens_the_same_view", before == after and "world=64" in link,
            f"({len(before)} cells; {link.split('#')[1][:80]}...)")

        # -- the quiz: zero_estimate's questions for a seed, each answer checked on Enter --
        qbad = []
        browser.clear(browser.find("#quiz-seed"))
        browser.type(browser.find("#quiz-seed"), "11")
        browser.clear(browser.find("#quiz-count"))
        browser.type(browser.find("#quiz-count"), "20")
        browser.click(browser.find("#quiz-start"))
        shown_q = browser.run("return [...document.querySelectorAll('#quiz-list li p')].map((p) => p.textContent)")
        text = subprocess.run([native, "--quiz", "--seed", "11", "--count", "20"], capture_output=True, text=True).stdout
        want_q = re.findall(r"^Q\d+\. (.*)$", text, re.M)
        if shown_q != want_q:
            qbad.append(f"questions differ: {len(shown_q)} shown, {len(want_q)} from zero_estimate")
        key = subprocess.run([native, "--quiz", "--seed", "11", "--count", "20", "--key"], capture_output=True,
                             text=True).stdout
        keyed = re.findall(r"^Q\d+ (\S+)(.*)$", key, re.M)
        answers = [float(v) for v, _ in keyed]
        exact = [" exactly" in rest for _, rest in keyed]  # (a whole 160 B parameters within 1%: off by 50% too)
        expect_right = []
        for i, a in enumerate(answers):  # even questions answered right, odd ones off by 50% (or by one, for counts)
            ok = i % 2 == 0
            value = a if ok else (a + 1 if exact[i] or a == 0 else a * 1.5)
            expect_right.append(ok)
            box = browser.find(f"#quiz-q{i + 1}")
            browser.type(box, f"{value:.6g}")
            browser.keys(KEY_ENTER)
            verdict = browser.run(f"const v = document.getElementById('quiz-v{i + 1}');"
                                  "return [v.querySelector('p') ? v.querySelector('p').className : '', v.querySelectorAll('.explain').length]")
            if verdict != (["right", 0] if ok else ["wrong", 1]):
                qbad.append(f"Q{i + 1}: verdict {verdict} on entry, expected {'right' if ok else 'wrong with a worked answer'}")
        score = browser.run("return document.getElementById('quiz-score').textContent")
        line = browser.run("return document.getElementById('quiz-result').value")
        box = browser.run("const b = document.getElementById('quiz-result');"
                          "return [b.scrollWidth, b.clientWidth, b.scrollHeight, b.clientHeight]")
        res("the_result_line_is_shown_whole", box[0] <= box[1] and box[2] <= box[3] and len(line) > 90,
            f"(a {len(line)}-character line: its box shows {box[1]} x {box[3]} px of {box[0]} x {box[2]})")
        v = subprocess.run([native, "--verify", line], capture_output=True, text=True)
        n_right = sum(expect_right)
        if not score.startswith(f"{n_right} of 20 right") or v.returncode != 0 or f"{n_right} of 20" not in v.stdout:
            qbad.append(f"score '{score}', result line '{line}', --verify: exit {v.returncode} {v.stdout.strip()}")
        # the instructor's box: the line verified in the page as on the command line; an edited one not
        for text, want_rc in ((line, 0), (line.replace(f"score={n_right}/", f"score={n_right + 1}/"), 1), ("garbage", 2)):
            box = browser.find("#verify-line")
            browser.clear(box)
            browser.type(box, text)
            browser.keys(KEY_ENTER)
            shown = browser.run("const o = document.getElementById('verify-out'); return [o.textContent, o.className]")
            n = subprocess.run([native, "--verify", text], capture_output=True, text=True)
            if n.returncode != want_rc or shown != [(n.stdout if want_rc != 2 else n.stderr).strip(),
                                                    "right" if want_rc == 0 else "wrong"]:
                qbad.append(f"verify '{text[:40]}': page {shown}, zero_estimate exit {n.returncode} {n.stdout.strip()}")
        res("quiz_verdicts_on_entry_and_a_line_zero_estimate_verifies", not qbad,
            f"(20 questions of --seed 11; {'; '.join(qbad[:3]) or v.stdout.strip()})")

        # -- a measured run: a trainer's --log-json report loaded through the file input; every ledger
        # cell equals the report's own peak and the native formula, and is marked equal; one byte
        # added to one rank's ledger is marked, alone, as differing --
        rbad, cells = [], 0
        trainer = os.path.join(os.path.dirname(native), "stage3")
        rundir = tempfile.mkdtemp()
        try:
            report = os.path.join(rundir, "s3.json")
            p = subprocess.run(["mpirun", "-np", "2", trainer, "--preset", "tiny", "--seq", "32", "--steps", "1",
                                "--precision", "bf16", "--log-json", report], capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                rbad.append(f"{trainer} exited {p.returncode}: {p.stderr.strip()[-200:]}")
            else:
                r = json.load(open(report))
                _, want = run_native(["--preset", "tiny", "--seq", "32", "--batch", str(r["batch"]), "--precision", "bf16",
                                      "--world", "2", "--stage", "stage3"])
                tampered = os.path.join(rundir, "tampered.json")
                r2 = json.loads(open(report).read())
                r2["ranks"][1]["ledger"]["device"]["peak"]["grads"] += 1
                json.dump(r2, open(tampered, "w"))
                for path, expect_differ in ((report, 0), (tampered, 1)):
                    # the page reads the file asynchronously: empty the table, then wait for the new one
                    browser.run("document.getElementById('report').value = '';"
                                "document.getElementById('run-table').replaceChildren()")
                    browser.type(browser.find("#report"), path)
                    browser.wait_for("return document.querySelector('#run-table td') !== null")
                    shown = browser.run("return [...document.querySelectorAll('#run-table td')].map((td) => "
                                        "[td.dataset.key, td.dataset.who, td.dataset.value, td.dataset.match || ''])")
                    differ = [c for c in shown if c[3] == "0"]
                    for key, who, value, match in shown:
                        if who == "formula":
                            ok = value == str(want["estimates"][0]["bytes"][key])
                        else:
                            rank = next(k for k in (r2 if expect_differ else r)["ranks"] if f"rank{k['rank']}" == who)
                            ok = value == str(sum(rank["ledger"][w]["peak"].get(key, 0) for w in ("device", "host", "disk")))
                        cells += 1
                        if not ok:
                            rbad.append(f"{os.path.basename(path)} {key} {who}: page {value}")
                    if len(differ) != expect_differ or (expect_differ and differ[0][:2] != ["grads", "rank1"]):
                        rbad.append(f"{os.path.basename(path)}: cells marked differing {differ}, expected {expect_differ}")
        finally:
            shutil.rmtree(rundir)
        res("a_measured_run_ledger_beside_formula", not rbad and cells > 0,
            f"(stage3 on 2 ranks, tiny, bf16: {cells} cells; {'; '.join(rbad[:2])})")

        # -- contrast of every visible text (the quiz's verdicts and the run's marks shown too), and the
        # projector's screen --
        worst = browser.run(CONTRAST)
        res("text_contrast_at_least_4.5", worst[0] >= 4.5, f"(lowest {worst[0]:.2f}: {worst[1]})")
        fit = browser.run("window.scrollTo(0, 0); const r = document.getElementById('chart').getBoundingClientRect();"
                          "return [document.documentElement.scrollWidth, window.innerWidth, r.top, window.innerHeight]")
        res("fits_1024x768", fit[0] <= fit[1] and fit[2] < fit[3],
            f"(page width {fit[0]} in a {fit[1]} px window; chart at {fit[2]:.0f} px of {fit[3]})")

        # -- served, as make explore serves it --
        server, port = serve(page_dir)
        try:
            res("loads_from_make_explores_server", load(browser, f"http://127.0.0.1:{port}/"))
        finally:
            stop(server)

        # -- the comparison can fail: a page whose form drops --accum --
        broken = tempfile.mkdtemp()
        try:
            for f in os.listdir(page_dir):  # the page's files (not the build's include/ folder)
                if os.path.isfile(os.path.join(page_dir, f)):
                    shutil.copy(os.path.join(page_dir, f), broken)
            js = os.path.join(broken, "explorer.js")
            text = open(js).read()
            mutated = text.replace('"--accum", $("accum").value', '"--accum", "1"')
            open(js, "w").write(mutated)
            load(browser, "file://" + os.path.join(broken, "index.html"))
            _, _, bdiffs = compare(browser, [c for c in configs if c["accum"] > 1][:20])
            res("a_page_that_drops_accum_is_caught", mutated != text and len(bdiffs) > 0,
                f"({len(bdiffs)} differences found)")
        finally:
            shutil.rmtree(broken)
        newcomer_checks(browser, "file://" + page)
        tensor_panel_checks(browser)
        browser_cpu = browser.cpu_seconds()
    finally:
        browser.close()
    mine = os.times()
    print(f"explorer_check, {kind}: {time.time() - t0:.1f} s, CPU {browser_cpu:.1f} s in the browser and "
          f"{mine.user + mine.system + mine.children_user + mine.children_system:.1f} s here so far (the native runs)",
          flush=True)


# ---- as a newcomer uses the page: at a phone's, a tablet's and a projector's width, each control's
# effect in view, the address bar, the defaults ----
def pick(browser, id_, value):
    """A select set as a person sets it (the page hears its change event); False where the page has no such
    select (the checks that need it then fail on what they read)."""
    return browser.run("const e = document.getElementById(arguments[0]); if (!e) return false; e.value = arguments[1];"
                       "e.dispatchEvent(new Event('change')); return true", id_, value)


def typed(browser, id_, text):
    """A box emptied, `text` typed into it and Tab pressed, through WebDriver's keys."""
    e = browser.find("#" + id_)
    browser.clear(e)
    browser.type(e, text)
    browser.keys(KEY_TAB)


def fresh(browser, url):
    browser.get("about:blank")
    return load(browser, url)


OUTPUTS = ["status", "chart", "table", "zpp-status", "zpp-table", "pp-status", "pp-table", "paper-case"]
SNAPSHOT = "return arguments[0].map((id) => document.getElementById(id) ? document.getElementById(id).innerHTML : '')"
IN_VIEW = """
const r = document.getElementById(arguments[0]).getBoundingClientRect();
return [r.top, r.bottom, r.width, window.innerHeight];
"""
CHART_DRAWN = ("const s = document.getElementById('chart'), v = s.getAttribute('viewBox');"
               "return v !== null && Math.abs(+v.split(' ')[2] - Math.max(300, Math.round(s.parentElement.clientWidth))) < 1")
LAYOUT = """
const c = document.getElementById('chart').getBoundingClientRect();
const label = document.querySelector('#chart text').getBoundingClientRect();
return [document.documentElement.scrollWidth, window.innerWidth, document.documentElement.clientWidth,
        c.width, c.height, label.height];
"""


def newcomer_checks(browser, url):
    # -- the layout at 400, 768 and 1024 CSS pixels: nothing wider than the window (no sideways
    # scrolling), the chart at least 90% of the text's width (or 600 px) and its text at least 9 px tall --
    for width, height in ((400, 800), (768, 900), (1024, 768)):
        fresh(browser, url)
        got = browser.set_width(width, height)
        browser.wait_for(CHART_DRAWN, timeout=5)
        sw, iw, cw, chart_w, chart_h, text_h = browser.run(LAYOUT)
        want_w = min(600, 0.9 * (cw - 24))
        res(f"layout_at_{width}px", got == width and sw <= iw and chart_w >= want_w and chart_h >= 150 and text_h >= 9,
            f"(viewport {got} px: page {sw} px wide; chart {chart_w:.0f} x {chart_h:.0f} px, at least {want_w:.0f} wanted; "
            f"its text {text_h:.1f} px tall)")

        # -- every control's effect in view: the control in the middle of the screen, as a person
        # scrolls to it, then changed; of the outputs that changed, one at least is on the screen --
        bad, tried = [], 0
        for control, act in (("stage", lambda: pick(browser, "stage", "stage2")),
                             ("preset", lambda: pick(browser, "preset", "gpt2")),
                             ("fit", lambda: typed(browser, "fit", "2GB")),
                             ("world", lambda: typed(browser, "world", "16")),
                             ("zpp-node", lambda: typed(browser, "zpp-node", "4")),
                             ("pp-segments", lambda: typed(browser, "pp-segments", "4")),
                             ('[data-paper="128B"]', lambda: browser.click(browser.find('button[data-paper="128B"]'))),
                             ('[data-paper="1T"]', lambda: browser.click(browser.find('button[data-paper="1T"]')))):
            if control in ("preset", "fit", "zpp-node", "pp-segments"):  # shown, or with a table, for a shape
                pick(browser, "model", "shape")
            browser.run("window.scrollTo(0, 0); document.querySelector(arguments[0].startsWith('[') ? arguments[0] : "
                        "'#' + arguments[0]).scrollIntoView({block: 'center'})", control)
            before = browser.run(SNAPSHOT, OUTPUTS)
            act()
            after = browser.run(SNAPSHOT, OUTPUTS)
            changed = [o for o, b, a in zip(OUTPUTS, before, after) if a != b]
            seen = [o for o in changed if (lambda t, b, w, h: w > 0 and b > 0 and t < h)(*browser.run(IN_VIEW, o))]
            tried += 1
            if not seen:
                bad.append(f"{control}: changed {changed or 'nothing'}, none of it on the screen")
        res(f"each_controls_effect_in_view_at_{width}px", not bad, f"({tried} controls; {'; '.join(bad[:3])})")
    browser.set_width(1024, 768)

    # -- the default view: no error and no empty box --
    fresh(browser, url)
    shown = browser.run("""
const seen = (e) => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
const errors = [...document.querySelectorAll('.error, .wrong')].filter(seen).map((e) => e.id + ': ' + e.textContent.slice(0, 60));
const empty = [...document.querySelectorAll('svg, table')].filter((e) => seen(e) && !e.querySelector('rect, td'))
  .map((e) => e.id || e.tagName);
return [errors, empty];""")
    res("the_default_view_shows_no_error_and_no_empty_box", shown == [[], []],
        f"(errors {shown[0][:2]}; empty boxes {shown[1]})")

    # -- a shape with preset tiny: the sequence the command line takes for it (its context, 32) --
    pick(browser, "model", "shape")
    pick(browser, "preset", "tiny")
    st = browser.run("const s = document.getElementById('status'); return [s.className, s.textContent]")
    flags = browser.run("return document.getElementById('cmdline').textContent").split()[1:]
    v = browser.run("return document.querySelector('#table td[data-key=model_state]')?.dataset.value || ''")
    rc, want = run_native(["--preset", "tiny", "--batch", "4", "--precision", "bf16", "--accum", "1", "--world", "64",
                           "--stage", "all", "--attention", "gemm"])
    res("a_shape_with_preset_tiny", st[0] != "error" and rc == 0 and "--seq" not in flags and
        v == str(want["estimates"][0]["model_state"]) and f"seq {want['seq']}" in st[1],
        f"(status '{st[1][:80]}'; command {' '.join(flags)})")

    # -- under an error, the terminal's command is the one that gives that error --
    typed(browser, "heads", "5")
    st = browser.run("const s = document.getElementById('status'); return [s.className, s.textContent]")
    flags = browser.run("return document.getElementById('cmdline').textContent").split()[1:]
    rc, want = run_native(flags)
    res("under_an_error_the_command_line_gives_that_error", st[0] == "error" and rc != 0 and want == st[1] and
        "--heads" in flags, f"(page '{st[1][:70]}'; zero_estimate {' '.join(flags)}: exit {rc}, '{str(want)[:70]}')")
    typed(browser, "heads", "")

    # -- the device-memory line: drawn for a shape with a memory, gone for a parameter count --
    pick(browser, "preset", "small")
    typed(browser, "fit", "24GB")
    line = "return [...document.querySelectorAll('#chart text')].filter((t) => t.textContent.startsWith('device memory')).length"
    with_shape = browser.run(line)
    pick(browser, "model", "params")
    res("no_device_memory_line_for_a_parameter_count", with_shape == 1 and browser.run(line) == 0,
        f"({with_shape} line for a shape, {browser.run(line)} for a parameter count)")

    # -- every bar of the linear chart visible or marked, and labelled with its stage; on the log
    # scale every bar at least 2 px tall (the default view, 7.5B: stage3's bars are 1/N of stage0's) --
    fresh(browser, url)
    _, want = run_native(["--params", "7.5B", "--precision", "bf16", "--accum", "1", "--stage", "all",
                          "--world", ",".join(str(n) for n in WORLDS)])
    for scale in ("linear", "log"):
        if not pick(browser, "scale", scale) and scale == "log":
            res("every_bar_seen_and_labelled_log", False, "(no log scale)")
            continue
        bars = browser.run("""
const out = {};
for (const r of document.querySelectorAll('#chart rect[data-cat]')) {
  if (r.dataset.cat === 'host') continue;
  const k = r.dataset.stage + ' ' + r.dataset.world;
  out[k] = (out[k] || 0) + r.getBoundingClientRect().height;
}
for (const m of document.querySelectorAll('#chart .too-small')) out[m.dataset.stage + ' ' + m.dataset.world + ' mark'] = 1;
out.labels = [...document.querySelectorAll('#chart .bar-label')].map((t) => t.dataset.stage + ' ' + t.dataset.world);
return out;""")
        labels = set(bars.pop("labels"))
        unseen, unlabelled = [], []
        for e in want["estimates"]:
            k = f"{e['stage']} {e['world']}"
            if int(e["device"]) > 0 and bars.get(k, 0) < (2 if scale == "log" else 1) and                     (scale == "log" or f"{k} mark" not in bars):
                unseen.append(k)
            if k not in labels:
                unlabelled.append(k)
        res(f"every_bar_seen_and_labelled_{scale}", not unseen and not unlabelled,
            f"({len(want['estimates'])} bars; unseen {unseen[:4]}; unlabelled {unlabelled[:4]})")

    # -- the address bar is the view: settings of every section changed, then the page reloaded --
    fresh(browser, url)
    pick(browser, "model", "shape")
    pick(browser, "preset", "gpt2")
    typed(browser, "world", "32")
    typed(browser, "zpp-node", "4")
    typed(browser, "zpp-net", "300,25")
    typed(browser, "pp-segments", "4")
    pick(browser, "pp-schedule", "gpipe")
    pick(browser, "pp-zero", "1")
    pick(browser, "tp-schedule", "gpipe")
    pick(browser, "scale", "log")
    view = ("return [location.hash, document.getElementById('permalink').href === location.href, "
            "arguments[0].map((id) => { const e = document.getElementById(id); return !e ? null : e.type === 'checkbox' ? e.checked : e.value; }),"
            "arguments[1].map((id) => document.getElementById(id).innerHTML)]")
    ids = FIELDS + ["scale", "tp-schedule"]
    outs = ["status", "cmdline", "table", "zpp-status", "zpp-table", "pp-status", "pp-table", "chart"]
    before = browser.run(view, ids, outs)
    browser.refresh()
    browser.wait_for("return document.body.dataset.ready === '1'", timeout=60)
    after = browser.run(view, ids, outs)
    wanted = ["preset=gpt2", "world=32", "zpp-node=4", "zpp-net=300%2C25", "pp-segments=4", "pp-schedule=gpipe",
              "pp-zero=1", "tp-schedule=gpipe", "scale=log"]
    missing = [w for w in wanted if w not in before[0]]
    res("the_address_bar_is_the_view_and_a_reload_shows_it_again",
        not missing and before[1] and before == after and "<td" in before[3][4] and "<td" in before[3][6],
        f"(address {before[0][:60]}...; missing {missing}; link = address {before[1]}; after reload "
        f"{'the same' if before == after else 'differs: ' + str([i for i, (a, b) in enumerate(zip(before[2], after[2])) if a != b])})")
    # a link made before the pipeline's stages were called segments: pp-stages=3 still sets P = 3
    fresh(browser, url.split("#")[0] + "#model=shape&preset=gpt2&world=6&pp-stages=3")
    old = browser.run("return [document.getElementById('pp-segments').value, "
                      "document.getElementById('pp-status').textContent, location.hash]")
    res("an_old_link_with_pp_stages_sets_the_segments", old[0] == "3" and old[1].startswith("3 segments x 2 replicas")
        and "pp-segments=3" in old[2], f"(P box {old[0]!r}, status {old[1][:60]!r}, address {old[2][:80]!r})")
    # a link made before the tensor panel had the pipeline dimension (no tp-schedule): its settings, 1F1B,
    # and every (T, P) of small on 8 ranks (4 heads, 7 units)
    fresh(browser, url.split("#")[0] + "#model=shape&preset=small&world=8&tp-mem=64MB&tp-sp=&tp-zero=1")
    browser.wait_for("return document.querySelector('#tp-table td') !== null && location.hash.includes('tp-schedule')",
                     timeout=30)
    old = browser.run("return [document.getElementById('tp-schedule').value, document.getElementById('tp-zero').value, "
                      "[...new Set([...document.querySelectorAll('#tp-table td[data-key]')].map((td) => "
                      "td.dataset.tensor + 'x' + td.dataset.pipeline))], location.hash]")
    configs = ["1x1", "1x2", "1x4", "2x1", "2x2", "2x4", "4x1", "4x2"]
    res("an_old_link_without_tp_schedule_shows_every_t_x_p", old[:2] == ["1f1b", "1"] and old[2] == configs and
        "tp-schedule=1f1b" in old[3] and "tp-mem=64MB" in old[3],
        f"(schedule {old[0]!r}, ZeRO {old[1]!r}, configurations {old[2]}, address {old[3][:90]!r})")


# ---- the tensor panel (docs/explorer.md): each (T, P, D) with T x P x D = N that the model allows (T
# dividing the heads, P at most the model's units: the rules, written here), its row against zero_estimate
# --tensor T [--pipeline P] (in 3D the segment whose rank holds the most), the most blocks that fit checked
# at the boundary by the command line itself (L fits, L + 1 does not), and each refused configuration
# named in the status with zero_estimate's own line ----
TENSOR_READ = """
const c = arguments[0];
for (const [k, v] of Object.entries(c)) {
  const e = document.getElementById(k);
  if (e.type === "checkbox") e.checked = v; else e.value = String(v);
}
window.nzExplorer.updateTensor();
const st = document.getElementById("tp-status");
return [st.className, st.textContent,
        [...document.querySelectorAll("#tp-table td[data-key]")].map((td) => [td.dataset.key, td.dataset.tensor,
                                                                              td.dataset.pipeline, td.dataset.value])];
"""
TENSOR_CASES = [  # (form, native model flags, the panel's extra flags, memory in bytes, the model's heads and layers)
    ({"model": "shape", "preset": "small", "layers": "", "dim": "", "heads": "", "vocab": "", "batch": 4, "seq": "",
      "accum": 1, "precision": "bf16", "attention": "gemm", "ckpt": False, "fit": "", "world": 8,
      "tp-mem": "64MB", "tp-sp": False, "tp-zero": "0", "tp-schedule": "1f1b"},
     ["--preset", "small", "--batch", "4", "--attention", "gemm", "--precision", "bf16", "--accum", "1"], [],
     64_000_000, (4, 5)),
    ({"model": "shape", "preset": "gpt2", "layers": "", "dim": "1024", "heads": "16", "vocab": "", "batch": 2,
      "seq": "256", "accum": 2, "precision": "fp16", "attention": "gemm", "ckpt": True, "fit": "24GB", "world": 16,
      "tp-mem": "40GiB", "tp-sp": True, "tp-zero": "1", "tp-schedule": "gpipe"},
     ["--preset", "gpt2", "--dim", "1024", "--heads", "16", "--batch", "2", "--seq", "256", "--attention", "gemm",
      "--precision", "fp16", "--accum", "2"], ["--sequence-parallel", "--zero", "1"], 40 * 2**30, (16, 12)),
    ({"model": "shape", "preset": "tiny", "layers": "", "dim": "", "heads": "", "vocab": "", "batch": 2, "seq": "",
      "accum": 4, "precision": "fp32", "attention": "gemm", "ckpt": False, "fit": "", "world": 32,
      "tp-mem": "8MB", "tp-sp": False, "tp-zero": "1", "tp-schedule": "1f1b"},
     ["--preset", "tiny", "--batch", "2", "--attention", "gemm", "--precision", "fp32", "--accum", "4"],
     ["--zero", "1"], 8_000_000, (4, 2)),
]


def tensor_native(form, model, extra, T, P):
    """zero_estimate's flags for (T, P), written here from the case, and the rank the row shows: the one
    row with P = 1, in 3D the segment whose total is the largest (the first of equals)"""
    flags = model + ["--world", str(form["world"]), "--tensor", str(T)]
    if P > 1:
        flags += ["--pipeline", str(P), "--schedule", form["tp-schedule"]]
    flags += extra if T > 1 else [x for x in extra if x != "--sequence-parallel"]
    rc, want = run_native(flags)
    if rc != 0:
        return flags, rc, want, None
    return flags, rc, want, max(want["estimates"], key=lambda e: e["total"])  # max keeps the first of equals


def tensor_refusals(form, model, extra, heads, layers, text):
    """Each configuration the model does not allow, named in the status line as the page says it: per T its
    first refused P with zero_estimate's line, the larger P refused with the same line (their P in it) listed
    with it; a T that does not divide the heads once, as T = T"""
    bad, N = [], form["world"]
    for T in (t for t in range(1, N + 1) if N % t == 0):
        if heads % T:
            flags, rc, msg, _ = tensor_native(form, model, extra, T, 1)
            want = [f"T = {T}: {str(msg).removeprefix('error: ')}"]
            if rc == 0:
                bad.append(f"{flags}: ran, but {heads} heads do not split over {T}")
        else:
            fails = []
            for P in (p for p in range(2, N // T + 1) if (N // T) % p == 0 and p > layers + 2):
                flags, rc, msg, _ = tensor_native(form, model, extra, T, P)
                if rc == 0:
                    bad.append(f"{flags}: ran, but {P} segments are more than the {layers + 2} units")
                fails.append((P, str(msg).removeprefix("error: ")))
            if not fails:
                continue
            P0, m0 = fails[0]
            alike = [P for P, m in fails[1:] if m.replace(f"--pipeline {P}:", f"--pipeline {P0}:") == m0]
            want = [f"T x P = {T} x {P0}" + (f" (also P = {', '.join(map(str, alike))}, alike)" if alike else "") +
                    f": {m0}"] + [f"T x P = {T} x {P}: {m}" for P, m in fails[1:] if P not in alike]
        bad += [f"N={N}: the status does not say '{w[:90]}'" for w in want if w not in text]
    return bad


def tensor_panel_checks(browser):
    bad, rows, refused = [], 0, 0
    for form, model, extra, budget, (heads, layers) in TENSOR_CASES:
        cls, text, cells = browser.run(TENSOR_READ, form)
        got = {(k, int(t), int(p)): v for k, t, p, v in cells}
        N = form["world"]
        expect_configs = sorted((T, P) for T in range(1, N + 1) if N % T == 0 and heads % T == 0
                                for P in range(1, N // T + 1) if (N // T) % P == 0 and P <= layers + 2)
        shown = sorted({(t, p) for _, t, p in got})
        if cls == "error" or shown != expect_configs:
            bad.append(f"{form['preset']} N={N}: status '{text[:80]}', configurations {shown}, expected {expect_configs}")
            continue
        before = len(bad)
        bad += tensor_refusals(form, model, extra, heads, layers, text)
        refused += "Not: " in text and len(bad) == before
        for T, P in expect_configs:
            rows += 1
            flags, rc, want, e = tensor_native(form, model, extra, T, P)
            if rc != 0:
                bad.append(f"{flags}: zero_estimate refused it: {want}")
                continue
            b = e["bytes"]
            expect = {"segment": "" if P == 1 else e["segment"], "params": b["params"], "grads": b["grads"],
                      "optimizer": b["master"] + b["adam_m"] + b["adam_v"], "activations": b["activations"],
                      "total": e["total"], "comm_elems_per_step": e["comm_elems_per_step"]}
            for k, v in expect.items():
                if got.get((k, T, P)) != str(v):
                    bad.append(f"{flags}: {k} page {got.get((k, T, P))}, zero_estimate {v}")
            L = int(got[("most_blocks", T, P)])

            def total(blocks):
                r, w = run_native(flags + ["--layers", str(blocks)])
                return max(x["total"] for x in w["estimates"]) if r == 0 else None
            if not (L >= 1 and total(L) <= budget and (L == 1000 or total(L + 1) > budget)):
                bad.append(f"{flags}: most blocks {L}, but {L} blocks total {total(L)} and {L + 1} total "
                           f"{total(L + 1)} for {budget} bytes")
            _, whole = run_native(model + ["--layers", str(L), "--world", "1", "--stage", "stage0_ddp"])
            if got[("most_params", T, P)] != str(whole["num_params"]):
                bad.append(f"{flags}: Ψ at {L} blocks page {got[('most_params', T, P)]}, zero_estimate {whole['num_params']}")
    cls, text, cells = browser.run(TENSOR_READ, {"tp-mem": "eighty"})
    if cls != "error" or "not a size" not in text or cells:
        bad.append(f"a device memory of 'eighty': '{cls}' '{text[:80]}', {len(cells)} cells")
    res("tensor_panel_is_zero_estimates", not bad and rows > 0 and refused == len(TENSOR_CASES),
        f"({rows} configurations T x P x D of {len(TENSOR_CASES)} models, {refused} with the refused ones named; "
        f"{len(bad)} differ{': ' + bad[0] if bad else ''})")


# WCAG 2 contrast of each visible element's own text against the first opaque background behind it.
CONTRAST = """
function lum(c) {
  const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}
function bg(e) {
  for (; e; e = e.parentElement) {
    const c = getComputedStyle(e).backgroundColor, a = c.match(/[\\d.]+/g);
    if (a && (a.length < 4 || +a[3] > 0.99)) return c;
  }
  return "rgb(255, 255, 255)";
}
let worst = [99, ""];
for (const e of document.querySelectorAll("body *")) {
  if (!e.offsetParent && e.tagName !== "BODY") continue;
  const own = [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
  if (!own) continue;
  const a = lum(getComputedStyle(e).color), b = lum(bg(e));
  const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  if (ratio < worst[0]) worst = [ratio, e.tagName + " " + e.textContent.trim().slice(0, 30)];
}
return worst;
"""

if __name__ == "__main__":
    # SIGTERM (a timeout, Ctrl-C's cousin) unwinds as an exception, so that each browser is closed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    failed = False
    for kind, n in browsers:
        try:
            main(kind, n)
        except Exception as e:  # a check that broke: one line, then the next browser (this one is closed)
            failed = True
            current = kind
            res("runs", False, f"(stopped by {type(e).__name__}: {str(e)[:300]})")
    sys.exit(1 if failed else 0)
