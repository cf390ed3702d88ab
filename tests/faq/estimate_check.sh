#!/usr/bin/env bash
# zero_estimate --config and --deepspeed-estimator (docs/faq.md) against arithmetic done here by hand:
# DeepSpeed's estimator formulas restated from its source (stage_1_and_2.py, stage3.py), the knobs'
# bytes from DeepSpeed's defaults and the Hugging Face integration's "auto", the model's tensors
# from its shape. Nothing here is read back from the program to compute what it must print.
# Prints NZRESULT lines for tests/run_all.sh. Binaries: $NZ_BIN_DIR, else build/bin.
cd "$(dirname "$0")/../.."
bin=${NZ_BIN_DIR:-build/bin}/zero_estimate
[ -x "$bin" ] || { echo "NZRESULT FAIL faq.estimate (no $bin: run make)"; exit 0; }
tmp=$(mktemp -d /tmp/nanozero-faq-estimate.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
BIN=$bin TMP=$tmp timeout 120 python3 - <<'PY'
import json, math, os, re, subprocess
BIN, TMP = os.environ["BIN"], os.environ["TMP"]

def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr

def result(name, ok, why=""):
    print(f"NZRESULT {'PASS' if ok else 'FAIL'} faq.{name}" + ("" if ok else f" ({why})"))

def config(name, obj):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        json.dump(obj, f)
    return path

# ---- DeepSpeed's estimator for 7.5B on 64 GPUs (8 nodes of 8), bf16 ----
psi, T, g = 7.5e9, 64, 8
S = psi / T                     # 117187500, no padding: 64 divides 7.5e9
ds_z2 = 2 * psi + int(18 * psi / T)       # 2Ψ + 18Ψ/N
led_z2 = 2 * psi + (2 + 4 + 4 + 4) * S    # bf16 params, grad slice, fp32 master, Adam m and v
ds_z3 = 4 * 0 + int(18 * psi / T)         # no largest layer for a raw count
led_z3 = 16 * S
ds_z2_cpu_host = psi * max(4 * T, 16) * 1.5
rc, out, err = run("--deepspeed-estimator", "--params", "7.5B", "--world", "64", "--precision", "bf16")
def row(text, case):
    line = next((l for l in text.splitlines() if l.startswith(case)), "")
    return re.findall(r"[-+]?\d+\.\d+", line), line
nums, line = row(out, "ZeRO-2 offload_optimizer=none")
result("estimator_zero2_7.5B_N64", rc == 0 and nums[:4] == [f"{ds_z2/1e9:.2f}", f"{psi*4*g*1.5/1e9:.2f}", f"{led_z2/1e9:.2f}", "0.00"],
       f"{line!r}, expected {ds_z2/1e9:.2f} against {led_z2/1e9:.2f}")
result("estimator_zero2_is_17.11_against_16.64", f"{ds_z2/1e9:.2f}" == "17.11" and f"{led_z2/1e9:.2f}" == "16.64" and "17.11" in line and "16.64" in line, line)
nums, line = row(out, "ZeRO-3 none, zero_init=1")
ratio = ds_z3 / led_z3  # 18/16: the 12.5 % of docs/faq.md
result("estimator_zero3_ratio_18_over_16", rc == 0 and nums[0] == f"{ds_z3/1e9:.2f}" and nums[2] == f"{led_z3/1e9:.2f}"
       and f"{ratio:.3f}" == "1.125" and "1.125 x" in line, line)
nums, line = row(out, "ZeRO-2 offload_optimizer=cpu")
result("estimator_zero2_offload_load_peak", rc == 0 and nums[1] == f"{ds_z2_cpu_host/1e9:.2f}" == "2880.00", line)
nums, line = row(out, "ZeRO-3 param+optimizer=cpu, zero_init=0")
nodes = T // g
result("estimator_zero3_param_offload_cpu", rc == 0 and nums[0] == "0.00" and nums[1] == f"{psi*max(4*g, 18/nodes)*1.5/1e9:.2f}"
       and nums[3] == f"{g*16*S/1e9:.2f}", line)

# ---- the same for GPT-2's shape (50257 tokens) on one node of 8: the largest layer is wte ----
V, ctx, C, L, N = 50257, 1024, 768, 12, 8
def padded(n): return (n + N - 1) // N * N
units = [V * C + ctx * C] + [12 * C * C + 13 * C] * L + [2 * C]
P = sum(padded(u) for u in units)
Psi = sum(units)
LL = max(V * C, ctx * C, 4 * C * C + 4 * C)
rc, out, err = run("--deepspeed-estimator", "--preset", "gpt2", "--vocab", "50257", "--world", "8", "--precision", "bf16")
nums, line = row(out, "ZeRO-3 none, zero_init=1")
ds = 4 * LL + int(18 * Psi / N)
U = max(padded(u) for u in units)
ledger = 2 * (P // N) * 2 + 12 * (P // N) + 2 * U + 2 * (padded(units[0]) + padded(units[1]))
result("estimator_gpt2_zero3", rc == 0 and f"LL = {LL}" in out and nums[0] == f"{ds/1e9:.2f}" and nums[2] == f"{ledger/1e9:.2f}",
       f"{line!r}: expected {ds/1e9:.2f} and {ledger/1e9:.2f}, LL {LL}")

# ---- --config: what each knob may hold ----
# stage 3, bf16, max_live 1e9: 2.00 GB for 7.5B (the issue's number); the rest DeepSpeed's defaults
path = config("z3.json", {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e9}})
rc, out, err = run("--config", path, "--params", "7.5B", "--world", "64", "--json")
d = json.loads(out) if rc == 0 else {}
want = {"reduce_bucket_size": 5e8 * 2, "overlap_comm": 0, "allgather_bucket_size": 0,
        "stage3_prefetch_bucket_size": 5e7 * 2, "stage3_max_live_parameters": 1e9 * 2, "stage3_max_reuse_distance": 0,
        "stage3_param_persistence_threshold": 0, "sub_group_size": 4 * min(1e9, S)}
got = d.get("estimates", [{}])[0].get("deepspeed_buffers") if d else None
result("config_stage3_defaults_7.5B", got == {k: int(v) for k, v in want.items()} and d["estimates"][0]["stage"] == "stage3"
       and d["precision"] == "bf16", f"{got} != {want}")
result("config_max_live_1e9_bf16_is_2.00GB", got and got["stage3_max_live_parameters"] == 2_000_000_000, str(got))

# the Hugging Face ZeRO-3 config ("auto" everywhere) on the gpt2 preset (256 tokens), N = 8, bf16
V, C = 256, 768
units_t = [[V * C, 1024 * C]] + [[C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C]] * 12 + [[C, C]]
Pn = sum(padded(sum(u)) for u in units_t)
small = sum(t for u in units_t for t in u if t < 10 * C)  # tensors under the threshold 10C stay whole
want = {"reduce_bucket_size": C * C * 2, "overlap_comm": 0, "allgather_bucket_size": 0,
        "stage3_prefetch_bucket_size": math.floor(0.9 * C * C) * 2, "stage3_max_live_parameters": min(10**9, sum(map(sum, units_t))) * 2,
        "stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": small * 2,
        "sub_group_size": 4 * min(10**9, Pn // N)}
rc, out, err = run("--config", "tests/tools/ds_configs/hf_zero3.json", "--preset", "gpt2", "--world", "8",
                   "--precision", "bf16", "--seq", "1024", "--json")
got = json.loads(out)["estimates"][0]["deepspeed_buffers"] if rc == 0 else err
result("config_hf_zero3_auto_resolved", got == want, f"{got} != {want}")
rc, out, err = run("--config", "tests/tools/ds_configs/hf_zero3.json", "--preset", "gpt2", "--world", "8",
                   "--precision", "bf16", "--seq", "1024")
total = sum(want.values())
result("config_table_sums_the_knobs", rc == 0 and re.search(rf"= DeepSpeed's buffers\s+{total}\b", out) is not None
       and "auto: C^2" in out and "auto: 10 C" in out, f"no line with {total}")

# stage 2 with overlap_comm: two reduction buckets; allgather_bucket_size bounded by the model
path = config("z2.json", {"fp16": {"enabled": True}, "zero_optimization": {"stage": 2, "overlap_comm": True,
              "reduce_bucket_size": 2e8, "allgather_bucket_size": 5e8}})
rc, out, err = run("--config", path, "--params", "125M", "--world", "4", "--json")
got = json.loads(out)["estimates"][0]["deepspeed_buffers"] if rc == 0 else err
result("config_stage2_overlap_doubles_the_bucket", rc == 0 and got["reduce_bucket_size"] == 2e8 * 2
       and got["overlap_comm"] == 2e8 * 2 and got["allgather_bucket_size"] == 125e6 * 2
       and json.loads(out)["estimates"][0]["stage"] == "stage2", str(got))
# the command line wins over the file: --precision fp32 (4 bytes), --stage stage3
rc, out, err = run("--config", path, "--params", "125M", "--world", "4", "--json", "--precision", "fp32", "--stage", "stage1")
d = json.loads(out) if rc == 0 else {}
result("config_command_line_wins", d.get("precision") == "fp32" and d["estimates"][0]["stage"] == "stage1"
       and d["estimates"][0]["deepspeed_buffers"]["reduce_bucket_size"] == 2e8 * 4, out[:200] + err)

# parameters and optimizer on the host (build/bin/infinity): the sub-group's fp32 gradient is there too
path = config("inf.json", {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
              "offload_optimizer": {"device": "cpu"}}})
rc, out, err = run("--config", path, "--params", "1B", "--world", "4", "--json")
e0 = json.loads(out)["estimates"][0] if rc == 0 else {}
result("config_offloaded_sub_group_on_the_host", e0.get("stage") == "infinity" and e0["deepspeed_buffers"]["sub_group_size"] == 0
       and e0["deepspeed_buffers"]["stage3_max_live_parameters"] == 2 * 10**9, out[:300] + err)

# ---- bad input: one line naming the key, exit 2, nothing on stdout ----
def bad(name, obj, must, args=()):
    path = config(name + ".json", obj)
    rc, out, err = run("--config", path, *args)
    lines = err.strip().splitlines()
    result(f"config_refuses_{name}", rc == 2 and out == "" and len(lines) == 1 and all(m in lines[0] for m in must),
           f"rc {rc}, stdout {out[:80]!r}, stderr {err!r}")
bad("string_size", {"zero_optimization": {"stage": 2, "reduce_bucket_size": "big"}}, ["reduce_bucket_size", '"big"'])
bad("negative_size", {"zero_optimization": {"stage": 3, "stage3_max_live_parameters": -1}}, ["stage3_max_live_parameters", "-1"])
bad("unknown_keys", {"zero_optimization": {"stage": 2, "reduce_bucket": 5, "stage3_prefetch": 1}},
    ["zero_optimization.reduce_bucket", "zero_optimization.stage3_prefetch"])
bad("auto_not_filled", {"zero_optimization": {"stage": 3, "sub_group_size": "auto"}}, ["sub_group_size", "auto"])
bad("auto_without_shape", {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}, ["reduce_bucket_size", "--params"],
    ("--params", "1B"))
for name, args, must in [("estimator_fp32", ["--params", "1B"], "--precision fp32"),
                         ("estimator_with_stage", ["--params", "1B", "--precision", "bf16", "--stage", "2"], "--stage"),
                         ("estimator_json", ["--params", "1B", "--precision", "bf16", "--json"], "--json"),
                         ("estimator_node", ["--params", "1B", "--precision", "bf16", "--world", "12", "--gpus-per-node", "8"], "--gpus-per-node 8")]:
    rc, out, err = run("--deepspeed-estimator", *args)
    result(f"refuses_{name}", rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and must in err, f"rc {rc} {err!r}")

# ---- the explorer's WebAssembly build prints the same as the native one (where it is built) ----
js = "build/explorer/zero_estimate.js"
if os.path.exists(js) and subprocess.run(["node", "--version"], capture_output=True).returncode == 0:
    bad = []
    for args in (["--deepspeed-estimator", "--params", "7.5B", "--world", "64", "--precision", "bf16"],
                 ["--deepspeed-estimator", "--preset", "gpt2", "--vocab", "50257", "--world", "8", "--precision", "bf16"],
                 ["--quiz", "--seed", "5", "--count", "24", "--key"]):
        script = (f"require('./{js}')({{print: l => console.log(l), printErr: l => console.error(l)}})"
                  f".then(m => m.callMain({json.dumps(args)}))")
        page = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60).stdout
        if page != run(*args)[1]:
            bad.append(" ".join(args[:3]))
    result("explorer_prints_the_same", not bad, f"the page differs for: {bad} (make explorer rebuilds it)")
else:
    print("NZRESULT SKIP faq.explorer_prints_the_same (no build/explorer/zero_estimate.js or no node: make explorer)")
PY
rc=$?
[ $rc = 0 ] || echo "NZRESULT FAIL faq.estimate_check (the checker exited with $rc)"
