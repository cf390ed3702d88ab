#!/usr/bin/env python3
"""check_profile.py — NZ_PROFILE=1's output of one run, against the same run without it.

  check_profile.py LABEL CLOCK STEPS PROFILED.log PROFILED.json PLAIN.log PLAIN.json [--collectives] [--gpu-memory]

CLOCK is "host" or "cuda_events"; STEPS the line's "steps A-B of N" part ("3-6 of 6"). Prints
NZRESULT PASS/FAIL lines named LABEL.<check> (tests/run_all.sh):
  line      exactly one "profile:" line, after "done:", in the format of docs/gpu.md, steps and clock
            as given, its figures the JSON's (to the 0.1 ms it prints); none without NZ_PROFILE;
  parts     the JSON's parts each >= 0 (forward, backward, optimizer and both attentions > 0; with
            --collectives the collectives too), attention <= its phase, and the parts add up to
            step_ms (to 1e-9 of it: they tile the step);
  same_bits every step's loss and gradient norm, and the validation loss, equal with and without;
  gpu_memory (--gpu-memory) the JSON's gpu_memory: in use >= baseline > 0, above = in use -
            baseline, the ledger figures rank 0's ledger's device totals, one rank on the GPU, and
            the log's "GPU memory" line saying "above the baseline".
"""
import json
import re
import sys

NUM = r"(-?[0-9.]+)"
LINE = re.compile(
    rf"^profile: step {NUM} ms = forward {NUM} \(attention {NUM}\) \+ backward {NUM} \(attention {NUM}\) "
    rf"\+ optimizer {NUM} \+ collectives {NUM} \+ other {NUM} \| steps ([0-9]+-[0-9]+ of [0-9]+), rank 0, "
    rf"(CUDA events|host clock)$")
KEYS = ["step_ms", "forward_ms", "forward_attention_ms", "backward_ms", "backward_attention_ms",
        "optimizer_ms", "collectives_ms", "other_ms"]
PARTS = ["forward_ms", "backward_ms", "optimizer_ms", "collectives_ms", "other_ms"]


def result(label, ok, what):
    print(f"NZRESULT {'PASS' if ok else 'FAIL'} {label} ({what})")
    return ok


def main():
    label, clock, steps, plog, pjson, qlog, qjson = sys.argv[1:8]
    flags = sys.argv[8:]
    lines = open(plog).read().splitlines()
    plain_lines = open(qlog).read().splitlines()
    try:
        rep, plain = json.load(open(pjson)), json.load(open(qjson))
    except (OSError, ValueError) as e:
        return result(f"{label}.line", False, f"no report: {e}; see {plog}")
    prof = rep.get("profile")
    found = [i for i, l in enumerate(lines) if l.startswith("profile:")]
    done = [i for i, l in enumerate(lines) if l.startswith("done:")]
    m = LINE.match(lines[found[0]]) if len(found) == 1 else None
    ok = (m is not None and len(done) == 1 and found[0] > done[0] and prof is not None
          and not any(l.startswith("profile:") for l in plain_lines) and "profile" not in plain)
    if ok:
        printed = [float(x) for x in m.groups()[:8]]
        want_line = [prof[k] for k in KEYS]
        ok = (m.group(9) == steps and m.group(10) == {"host": "host clock", "cuda_events": "CUDA events"}[clock]
              and prof["clock"] == clock and all(abs(a - b) <= 0.05 + 1e-9 for a, b in zip(printed, want_line)))
    result(f"{label}.line", ok, (lines[found[0]] if len(found) == 1 else f"{len(found)} profile lines") +
           ("" if ok else f"; expected steps {steps}, clock {clock}; see {plog}"))
    if prof is None:
        return
    step = prof["step_ms"]
    total = sum(prof[k] for k in PARTS)
    positive = ["forward_ms", "forward_attention_ms", "backward_ms", "backward_attention_ms", "optimizer_ms"]
    if "--collectives" in flags:
        positive.append("collectives_ms")
    ok = (all(prof[k] >= 0 for k in KEYS) and all(prof[k] > 0 for k in positive)
          and prof["forward_attention_ms"] <= prof["forward_ms"] and prof["backward_attention_ms"] <= prof["backward_ms"]
          and abs(total - step) <= 1e-9 * max(step, 1.0))
    result(f"{label}.parts", ok, f"step {step:.3f} ms, parts sum {total:.3f}, " +
           ", ".join(f"{k} {prof[k]:.3f}" for k in KEYS[1:]))
    a = [(s["loss"], s["grad_norm"]) for s in rep["steps_log"]]
    b = [(s["loss"], s["grad_norm"]) for s in plain["steps_log"]]
    ok = a == b and len(a) > 0 and rep["final_val_loss"] == plain["final_val_loss"]
    result(f"{label}.same_bits", ok, f"{len(a)} steps' losses and norms and the validation loss "
           + ("identical" if ok else f"differ: {a} vs {b}"))
    if "--gpu-memory" in flags:
        g = rep.get("gpu_memory")
        dev = rep["ranks"][0]["ledger"]["device"]
        ok = (g is not None and g["baseline_bytes"] > 0 and g["in_use_bytes"] >= g["baseline_bytes"]
              and g["above_baseline_bytes"] == g["in_use_bytes"] - g["baseline_bytes"]
              and g["ledger_peak_bytes"] == dev["peak"]["total"] and g["ledger_now_bytes"] == dev["current"]["total"]
              and g["ranks_on_gpu"] == 1 and any(l.startswith("GPU memory") and "above the baseline" in l for l in lines))
        result(f"{label}.gpu_memory", ok, f"{g}; ledger device peak {dev['peak']['total']}, now {dev['current']['total']}")


if __name__ == "__main__":
    main()
