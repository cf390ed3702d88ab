#!/usr/bin/env bash
# zero_estimate --sp S --fit SIZE (ulysses_longest_seq, ulysses/formulas.h): the longest sequence per rank
# for stage3 alone, Ulysses and ring, with and without activation checkpointing. Held to the tables the
# runs' ledgers are held to (tests/ulysses/test_ulysses.cpp, tests/stages): at the T it reports, its model
# states and activations are the `--sp S --seq T` table's (ring: `--sp-mode ring`; stage3 alone: `--stage
# stage3`, with `--activation-checkpointing` for its checkpointed row), they fit, and one step more (S
# tokens; ring 2S; stage3 1) does not. Ulysses' and ring's checkpointed activations, which no run builds,
# against the rule written out here from the tables: a block's internals are what one more block adds less
# its output, checkpointing keeps L-1 blocks' inputs instead of their internals; the same rule applied to
# stage3's tables gives stage3's own checkpointed formula (common/zero_formulas.cpp), written apart.
# Bad input: one line, exit 2. Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
est=${NZ_BIN_DIR:-build/bin}/zero_estimate
python3 - "$est" <<'PY'
import json, subprocess, sys
est = sys.argv[1]
CTX = {"tiny": 32, "small": 128, "gpt2": 1024}


def tool(*args):
    p = subprocess.run([est, *map(str, args)], capture_output=True, text=True)
    return p.returncode, (json.loads(p.stdout) if p.returncode == 0 and p.stdout.startswith("{") else p.stderr.strip())


def r64(n):
    return (n + 63) // 64 * 64


def shape(preset, extra):
    return ["--preset", preset, *extra]


def ctx_flags(preset, T):
    return ["--ctx", T] if T > CTX[preset] else []


def sp_table(preset, extra, N, S, B, prec, T, ring=False, layers=None):
    flags = shape(preset, extra) + (["--layers", layers] if layers else []) + ctx_flags(preset, T)
    rc, j = tool(*flags, "--sp", S, "--world", N, "--batch", B, "--precision", prec, "--seq", T, "--json",
                 *(["--sp-mode", "ring"] if ring else []))
    assert rc == 0, (flags, j)
    acts = j["bytes"]["activations"]
    return sum(j["bytes"].values()) - acts, acts


def stage3_table(preset, extra, N, B, prec, T, ckpt=False, layers=None):
    flags = shape(preset, extra) + (["--layers", layers] if layers else []) + ctx_flags(preset, T)
    rc, j = tool(*flags, "--stage", "stage3", "--world", N, "--batch", B, "--precision", prec, "--seq", T, "--json",
                 *(["--activation-checkpointing"] if ckpt else []))
    assert rc == 0, (flags, j)
    e = j["estimates"][0]
    return sum(e["bytes"].values()) - e["bytes"]["activations"], e["bytes"]["activations"]


def ckpt_by_rule(table, L, T, S, C, e, **kw):
    """checkpointed activations from the full tables: full - (L-1) (one block's internals)"""
    _, full = table(T=T, **kw)
    _, fewer = table(T=T, layers=L - 1, **kw)
    return full - (L - 1) * ((full - fewer) - r64(kw["B"] * (T // S) * C * e))


CASES = [  # preset, shape flags, N, S, B, precision, budget (bytes), layers, width, elem bytes
    ("small", [], 4, 4, 1, "fp32", 1_000_000_000, 5, 128, 4),
    ("small", [], 8, 2, 2, "bf16", 300_000_000, 5, 128, 2),
    ("gpt2", [], 8, 4, 1, "bf16", 80_000_000_000, 12, 768, 2),
    ("gpt2", [], 16, 8, 1, "bf16", 24_000_000_000, 12, 768, 2),   # 12 heads: Ulysses not possible at S = 8
    ("tiny", ["--heads", "8"], 8, 8, 4, "fp16", 64 * 2**20, 2, 32, 2),
]
bad, checked, rows = [], 0, 0
for preset, extra, N, S, B, prec, budget, L, C, e in CASES:
    rc, fit = tool(*shape(preset, extra), "--world", N, "--sp", S, "--batch", B, "--precision", prec, "--fit", budget,
                   "--json")
    if rc != 0:
        bad.append(f"{preset} N={N} S={S}: exit {rc}: {fit}")
        continue
    heads = fit["heads"]
    for key, r in fit["fit"].items():
        design, ckpt = key.split("_")[0], key.endswith("_checkpointing")
        where = f"{preset} N={N} S={S} {key}"
        if design == "ulysses" and heads % S != 0:
            if r is not None:
                bad.append(f"{where}: {heads} heads do not split over {S}, yet a fit {r}")
            continue
        if r is None or r["seq"] == 0:
            bad.append(f"{where}: no fit")
            continue
        T = r["seq"]
        step = {"stage3": 1, "ulysses": S, "ring": 2 * S}[design]
        kw = dict(preset=preset, extra=extra, N=N, B=B, prec=prec)

        def peak(T):
            if design == "stage3":
                return stage3_table(T=T, ckpt=ckpt, **kw)
            state, acts = sp_table(S=S, T=T, ring=design == "ring", **kw)
            if ckpt:
                acts = ckpt_by_rule(lambda **k: sp_table(S=S, ring=design == "ring", **k), L, T, S, C, e, **kw)
            return state, acts
        state, acts = peak(T)
        rows += 1
        if T % step:
            bad.append(f"{where}: T = {T} is not a multiple of {step}")
        if (state, acts) != (r["state"], r["activations"]):
            bad.append(f"{where}: at T = {T} the fit says {r['state']} + {r['activations']}, the tables {state} + {acts}")
        if state + acts > budget:
            bad.append(f"{where}: T = {T} holds {state + acts} bytes, over {budget}")
        if T + step <= fit["max_seq"] and sum(peak(T + step)) <= budget:
            bad.append(f"{where}: T = {T + step} fits too")
        checked += 1
# the rule for a checkpointed block, on stage3's tables, is stage3's own checkpointed formula
for preset, N, B, prec, T, L, C, e in (("small", 4, 2, "bf16", 128, 5, 128, 2), ("gpt2", 8, 1, "fp32", 2048, 12, 768, 4)):
    kw = dict(preset=preset, extra=[], N=N, B=B, prec=prec)
    by_rule = ckpt_by_rule(lambda **k: stage3_table(**k), L, T, 1, C, e, **kw)
    _, formula = stage3_table(T=T, ckpt=True, **kw)
    if by_rule != formula:
        bad.append(f"stage3 {preset} T={T}: the rule gives {by_rule}, zero_formulas' checkpointed {formula}")
ok = not bad and checked >= 25
print(f"NZRESULT {'PASS' if ok else 'FAIL'} ulysses.fit_is_the_longest_sequence_the_tables_fit "
      f"({len(CASES)} cases, {rows} rows checked at T and T + one step; {len(bad)} problems" + (f": {bad[:3]}" if bad else "") + ")")

# a budget that not even the shortest sequence fits: no T, said
rc, fit = tool("--preset", "gpt2", "--world", 8, "--sp", 4, "--fit", "1MB", "--json")
none = rc == 0 and all(r is None or r["seq"] == 0 for r in fit["fit"].values())
rc2 = subprocess.run([est, "--preset", "gpt2", "--world", "8", "--sp", "4", "--fit", "1MB"], capture_output=True, text=True)
said = rc2.returncode == 0 and rc2.stdout.count(" none ") >= 4
print(f"NZRESULT {'PASS' if none and said else 'FAIL'} ulysses.fit_too_small_a_device_is_no_sequence "
      f"(1 MB for gpt2: {rc2.stdout.count(' none ')} rows say none)")

# bad input: one line, exit 2
bads = {"S not dividing N": ["--preset", "small", "--world", "6", "--sp", "4", "--fit", "1GB"],
        "--seq with the fit": ["--preset", "small", "--sp", "2", "--seq", "64", "--fit", "1GB"],
        "--sp-mode with the fit": ["--preset", "small", "--sp", "2", "--sp-mode", "ring", "--fit", "1GB"],
        "--activation-checkpointing with the fit": ["--preset", "small", "--sp", "2", "--activation-checkpointing",
                                                    "--fit", "1GB"],
        "an unreadable size": ["--preset", "small", "--sp", "2", "--fit", "lots"],
        "two world sizes": ["--preset", "small", "--sp", "2", "--world", "2,4", "--fit", "1GB"]}
wrong = []
for what, flags in bads.items():
    p = subprocess.run([est, *flags], capture_output=True, text=True)
    lines = (p.stdout + p.stderr).strip().splitlines()
    if p.returncode != 2 or len(lines) != 1 or not lines[0].startswith("error: "):
        wrong.append(f"{what}: exit {p.returncode}, {lines[:2]}")
print(f"NZRESULT {'PASS' if not wrong else 'FAIL'} ulysses.fit_bad_input_is_one_line_exit_2 ({len(bads)} cases"
      + (f"; {wrong}" if wrong else "") + ")")
PY
