#!/usr/bin/env bash
# `make bugs` (docs/faq.md, "Bugs that shipped"): real defects of ZeRO implementations, each replayed as
# a broken copy of a rung (tests/faq/faq_mutants.mk, tests/stages/stage2_mutants.mk). For each bug it
# prints its source, the symptom measured on the broken copy (what the users saw), and the invariant
# that catches it ("caught by ..."), or MISSED. Each invariant is first run on the correct rungs, where
# it must hold (a check that cannot pass catches nothing). Runs: 2 or 4 ranks, the tiny preset, a few
# steps, compared through --log-json (every loss and norm at full precision).
# Prints NZRESULT lines for tests/run_all.sh. Binaries: $NZ_BIN_DIR, $NZ_MUTANT_DIR (harness.h's).
cd "$(dirname "$0")/../.."
BIN=${NZ_BIN_DIR:-build/bin} MUT=${NZ_MUTANT_DIR:-build/mutants/bin}
tmp=$(mktemp -d /tmp/nanozero-bugs.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
BIN=$BIN MUT=$MUT TMP=$tmp timeout -k 10 600 python3 - <<'PY'
import json, os, subprocess, sys
sys.path.insert(0, "tests/faq")
from doc_lines import missing as missing_lines, quoted_block
printed = []
def say(text):  # what the page quotes (docs/faq.md, under `$ bash tests/faq/bugs_check.sh | grep -v "^NZRESULT"`)
    print(text)
    printed.extend(text.splitlines())
BIN, MUT, TMP = os.environ["BIN"], os.environ["MUT"], os.environ["TMP"]
runs = {}

def run(prog, N, *flags):
    """Rank 0's --log-json report of `prog` on N ranks (tiny preset, 6 steps), cached; None if it failed."""
    key = (prog, N) + flags
    if key in runs:
        return runs[key]
    path = os.path.join(MUT if prog.startswith("mutant_") else BIN, prog)
    log = os.path.join(TMP, f"run{len(runs)}.json")
    cmd = ["mpirun", "-np", str(N), path, "--preset", "tiny", "--seq", "32", "--steps", "6", "--quiet",
           "--log-json", log, *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    runs[key] = json.load(open(log)) if p.returncode == 0 and os.path.exists(log) else None
    if runs[key] is None:
        print(f"  {' '.join(cmd)} failed ({p.returncode}): {(p.stderr or p.stdout)[-300:]}")
    return runs[key]

def losses(r): return [s["loss"] for s in r["steps_log"]]
def norms(r): return [s["grad_norm"] for s in r["steps_log"]]
def same_numbers(a, b):  # bit for bit: every step's loss and norm, and the validation loss
    return a is not None and b is not None and losses(a) == losses(b) and norms(a) == norms(b) \
        and a["final_val_loss"] == b["final_val_loss"]

# The invariants (docs/stages.md, "Exactly the same model"), as functions of the trainer under test.
K = ["--accum", "3"]
FP16 = ["--precision", "fp16"]
invariants = {
    "stage2_equals_stage3_at_accum_3": (lambda t: same_numbers(run(t, 2, *K), run("stage3", 2, *K)), "stage2"),
    "offload_equals_stage2_at_accum_3": (lambda t: same_numbers(run(t, 2, *K), run("stage2", 2, *K)), "offload"),
    "stage2_equals_stage0_ddp_with_clipping": (lambda t: same_numbers(run(t, 2), run("stage0_ddp", 2)), "stage2"),
    "norm_over_shards_equals_stage0_ddp": (lambda t: run(t, 4) is not None and run("stage0_ddp", 4) is not None
                                           and norms(run(t, 4)) == norms(run("stage0_ddp", 4)), "stage2"),
    "stage0_ddp_equals_stage1_at_accum_3": (lambda t: same_numbers(run(t, 2, *K), run("stage1", 2, *K)), "stage0_ddp"),
    "stage2_equals_stage0_ddp_in_fp16": (lambda t: same_numbers(run(t, 2, *FP16), run("stage0_ddp", 2, *FP16)), "stage2"),
}

def ratio(a, b): return a / b if b else float("inf")

# Each bug: its source, its broken copy, what the users saw measured on it, and its invariant.
def sym_accum(mutant, good):
    a1, g1 = run(mutant, 2), run(good, 2)
    a3, g3 = run(mutant, 2, *K), run(good, 2, *K)
    hidden = same_numbers(a1, g1)
    drift = abs(losses(a3)[-1] - losses(g3)[-1])
    return hidden and drift > 0, (f"at --accum 1 bit for bit {good}'s ({'yes' if hidden else 'no'}); at --accum 3 "
                                  f"step 6's loss {losses(a3)[-1]:.6f} against {losses(g3)[-1]:.6f} (norm "
                                  f"{norms(a3)[0]:.4f} against {norms(g3)[0]:.4f})")
def sym_clip():
    m, g = run("mutant_faq_clip_not_applied", 2), run("stage2", 2)
    m0, g0 = run("mutant_faq_clip_not_applied", 2, "--clip", "0"), run("stage2", 2, "--clip", "0")
    ok = norms(m)[0] == norms(g)[0] and norms(g)[0] > 1.0 and losses(m)[-1] != losses(g)[-1] and same_numbers(m0, g0)
    return ok, (f"step 1's norm {norms(m)[0]:.4f} as stage2's (above --clip 1.0), yet step 6's loss "
                f"{losses(m)[-1]:.9f} against {losses(g)[-1]:.9f} (the gradient up to {norms(g)[0]:.1f} x the "
                f"clipped one; Adam divides most of that away); with --clip 0 bit for bit stage2's")
def sym_local_norm():
    m, g = run("mutant_faq_norm_local_shard", 4), run("stage3", 4)
    r = ratio(norms(m)[0], norms(g)[0])
    return r < 0.75, f"on 4 ranks step 1's norm {norms(m)[0]:.4f} against stage3's {norms(g)[0]:.4f} ({r:.2f} x: rank 0's slices only)"
def sym_ddp_grows():
    m, g = run("mutant_faq_ddp_grads_not_zeroed", 2), run("stage1", 2)
    grow = ratio(norms(m)[-1], norms(g)[-1])
    return norms(m)[0] == norms(g)[0] and grow > 2, (f"step 1's norm {norms(m)[0]:.4f} as stage1's; by step 6 "
                                                     f"{norms(m)[-1]:.4f} against {norms(g)[-1]:.4f} ({grow:.1f} x)")
def sym_scaled_norm():
    m, g = run("mutant_faq_norm_loss_scaled", 2, *FP16), run("stage2", 2, *FP16)
    b, gb = run("mutant_faq_norm_loss_scaled", 2), run("stage2", 2)
    r = ratio(norms(m)[-1], norms(g)[-1])
    return r > 100 and same_numbers(b, gb), (f"fp16: step 6's norm {norms(m)[-1]:.4g} against {norms(g)[-1]:.4f} "
                                             f"({r:.1f} x: the loss scale); fp32: bit for bit stage2's")

bugs = [
    ("accumulation_boundary_reset", "open-instruct pull request 1498 (ZeRO-2 with accumulation driven by hand)",
     "mutant_stage2_last_microbatch_only", lambda: sym_accum("mutant_stage2_last_microbatch_only", "stage2"),
     "stage2_equals_stage3_at_accum_3", "also Zero12.BrokenStage2VariantsAreCaught"),
    ("offload_copies_grads", "DeepSpeed pull request 6550 (ZeRO-2 + offload: micro-step counter)",
     "mutant_faq_offload_copy_grads", lambda: sym_accum("mutant_faq_offload_copy_grads", "offload"),
     "offload_equals_stage2_at_accum_3", ""),
    ("clip_not_applied", "DeepSpeed pull request 5150 (the clipping coefficient not applied)",
     "mutant_faq_clip_not_applied", sym_clip, "stage2_equals_stage0_ddp_with_clipping", ""),
    ("norm_of_local_shard", "DeepSpeed issue 7718 (ZeRO-2 norms far below ZeRO-3's)",
     "mutant_faq_norm_local_shard", sym_local_norm, "norm_over_shards_equals_stage0_ddp", ""),
    ("ddp_grads_not_zeroed", "DeepSpeed issue 7837, pull request 7839 (the norm grows only under ZeRO-0)",
     "mutant_faq_ddp_grads_not_zeroed", sym_ddp_grows, "stage0_ddp_equals_stage1_at_accum_3", ""),
    ("norm_with_loss_scale", "DeepSpeed pull request 2695, issue 2686 (the norm with the wrong loss scale)",
     "mutant_faq_norm_loss_scaled", sym_scaled_norm, "stage2_equals_stage0_ddp_in_fp16", ""),
]

for name, (check, rung) in invariants.items():
    ok = check(rung)
    print(f"NZRESULT {'PASS' if ok else 'FAIL'} faq.bugs.invariant_holds.{name}" + ("" if ok else f" ({rung} breaks it)"))

missed = 0
for name, source, mutant, symptom, invariant, also in bugs:
    if not os.path.exists(os.path.join(MUT, mutant)):
        print(f"NZRESULT FAIL faq.bugs.{name} ({MUT}/{mutant} not built: make tests)")
        continue
    seen, what = symptom()
    caught = not invariants[invariant][0](mutant)
    missed += not caught
    say(f"bug {name}\n  source:  {source}\n  broken:  {mutant}\n  symptom: {what}\n  "
          + (f"caught by faq.bugs.{name}.caught ({invariant}){'; ' + also if also else ''}" if caught else "MISSED"))
    print(f"NZRESULT {'PASS' if seen else 'FAIL'} faq.bugs.{name}.symptom" + ("" if seen else f" ({what})"))
    print(f"NZRESULT {'PASS' if caught else 'FAIL'} faq.bugs.{name}.caught" + ("" if caught else f" (MISSED: {invariant} holds)"))
say(f"{len(bugs)} bugs replayed, {len(bugs) - missed} caught, {missed} missed")
quoted = quoted_block(open("docs/faq.md").read(), 'bash tests/faq/bugs_check.sh | grep -v "^NZRESULT"')
gone = missing_lines(quoted or [], printed)
ok = bool(quoted) and not gone
print(f"NZRESULT {'PASS' if ok else 'FAIL'} faq.bugs.doc (docs/faq.md quotes this output"
      + (f": {len(quoted)} lines, all printed)" if ok else f": {'no quoted block' if not quoted else f'{len(gone)} line(s) not printed, first: {gone[0]}'})"))
PY
rc=$?
[ $rc = 0 ] || echo "NZRESULT FAIL faq.bugs (the checker exited with $rc)"
