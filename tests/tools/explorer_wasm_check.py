"""The explorer's WebAssembly against the native zero_estimate, without a browser (Node runs it).

The page's numbers are the WebAssembly build's output; this holds that output to the native build's
byte for byte, stdout, stderr and exit code: every mode (the tables and their --json, the paper's
Table 1, ZeRO++, the pipeline, the quiz, its key, grading and --verify, --help, bad input) on fixed
flags, and 300 random configurations of the main table in text and in --json. It runs where a browser
is not installed (the browser test, explorer_check.py, then says SKIP), so the compiled formulas are
checked wherever the page is built. Prints NZRESULT lines; usage: explorer_wasm_check.py PAGE_DIR ZERO_ESTIMATE
"""
import concurrent.futures
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
page_dir, native = sys.argv[1], sys.argv[2]

FIXED = [
    ["--help"], ["--paper-table"], ["--preset", "tiny", "--world", "1,2,3,4"],
    ["--preset", "small", "--world", "1,4,64", "--precision", "bf16"],
    ["--preset", "gpt2", "--world", "8", "--precision", "fp16", "--accum", "4", "--json"],
    ["--preset", "gpt2", "--world", "1,2,4,8,16,1024", "--precision", "bf16", "--fit", "24GB", "--activation-checkpointing"],
    ["--preset", "small", "--stage", "stage3", "--world", "3", "--batch", "8", "--seq", "128", "--attention", "flash"],
    ["--params", "7.5B", "--world", "64", "--precision", "bf16"], ["--params", "1T", "--world", "1,1024", "--json"],
    ["--params", "1e16", "--world", "7", "--json"], ["--params", "125M", "--world", "3", "--stage", "offload", "--accum", "3"],
    ["--preset", "gpt2", "--vocab", "50257", "--world", "16", "--stage", "infinity", "--precision", "bf16", "--json"],
    ["--zeropp", "4", "--world", "8,16", "--preset", "small", "--precision", "bf16"],
    ["--zeropp", "2", "--world", "4", "--preset", "tiny", "--json", "--network", "300,25", "--compute-ms", "10"],
    ["--pipeline", "2", "--world", "4", "--preset", "small", "--accum", "4", "--zero", "1"],
    ["--pipeline", "3", "--preset", "tiny", "--seq", "32", "--accum", "8", "--schedule", "gpipe", "--json"],
    ["--preset", "small", "--world", "2,4,64", "--optimizer", "muon"],  # Muon's text and its --json (muon.md)
    ["--preset", "tiny", "--world", "3", "--optimizer", "muon", "--json", "--precision", "bf16"],
    ["--quiz", "--seed", "7", "--count", "12"], ["--quiz", "--seed", "7", "--count", "12", "--key"],
    ["--stage", "bogus"], ["--params", "7.5B", "--preset", "small"], ["--preset", "nope"], ["--world", "0"],
    ["--verify", "nzquiz1 seed=1 count=2 answers=1,- score=0/2 code=00000000"], ["--verify", "garbage"],
]


def run_native(args):  # without trailing newlines, as the WebAssembly's printed lines are compared
    p = subprocess.run([native] + args, capture_output=True, text=True)
    return {"rc": p.returncode, "out": p.stdout.rstrip("\n"), "err": p.stderr.rstrip("\n")}


def main():
    t0 = time.time()
    from explorer_check import random_config, native_flags  # the browser test's configurations
    rng = random.Random(30)
    configs = [random_config(rng) for _ in range(300)]
    randoms = [native_flags(c) for c in configs] + [native_flags(c) + ["--json"] for c in configs]
    # the quiz graded from a file: the key, and the key with every answer off, in both builds' file systems
    key = subprocess.run([native, "--quiz", "--seed", "5", "--count", "10", "--key"], capture_output=True, text=True).stdout
    answers = "\n".join(line.split("#")[0] for line in key.splitlines() if line.startswith("Q")) + "\n"
    # (the WebAssembly build reads files from its own memory, not Node's disk: the grading itself is
    # compared in the browser test; here a result line made natively is verified by both builds)
    graded = subprocess.run([native, "--quiz", "--seed", "5", "--count", "10", "--check", "/dev/stdin", "--result"],
                            input=answers, capture_output=True, text=True).stdout
    line = next(l[len("result: "):] for l in graded.splitlines() if l.startswith("result: "))
    fixed = FIXED + [["--verify", line], ["--verify", line.replace("score=10", "score=9")]]
    arg_lists = fixed + randoms
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        want = list(pool.map(run_native, arg_lists))
    node = subprocess.run(["node", os.path.join(os.path.dirname(__file__), "explorer_wasm.js"), page_dir],
                          input=json.dumps(arg_lists), capture_output=True, text=True, timeout=300)
    if node.returncode != 0:
        print(f"NZRESULT FAIL explorer.wasm.runs_under_node (exit {node.returncode}: {node.stderr.strip()[-300:]})")
        return
    # the page collects printed lines, so a run's trailing blank lines are not told apart: compare without
    got = [{"rc": g["rc"], "out": g["out"].rstrip("\n"), "err": g["err"].rstrip("\n")} for g in json.loads(node.stdout)]
    for name, lo, hi in (("every_mode_as_the_native_build", 0, len(fixed)),
                         ("random_configurations_as_the_native_build", len(fixed), len(arg_lists))):
        diffs = [f"zero_estimate {' '.join(arg_lists[i])}: native {want[i]['rc']} {want[i]['out'][:80]!r}"
                 f"{want[i]['err'][:80]!r}, wasm {got[i]['rc']} {got[i]['out'][:80]!r}{got[i]['err'][:80]!r}"
                 for i in range(lo, hi) if got[i] != want[i]]
        errors = sum(1 for i in range(lo, hi) if want[i]["rc"] != 0)
        print(f"NZRESULT {'PASS' if not diffs else 'FAIL'} explorer.wasm.{name} ({hi - lo} runs, {errors} of them "
              f"errors, stdout, stderr and exit code compared byte for byte; {len(diffs)} differ"
              f"{': ' + diffs[0] if diffs else ''})")
    print(f"explorer_wasm_check: {time.time() - t0:.1f} s", flush=True)


main()
