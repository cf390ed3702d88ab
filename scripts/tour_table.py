#!/usr/bin/env python3
"""Side-by-side table of the tour's JSON reports (one per stage): per-rank memory by category,
measured by the ledger and predicted by the formula, the loss, ms per step, elements sent per step.

    python3 scripts/tour_table.py [--at K] runs/tour/stage0_ddp runs/tour/stage1 ...   (".json" is added)

--at K: the losses are compared over the first K steps, the ones every report holds (the tour trains
stage0_ddp longer than the others); without it, over every step of the shortest report.
"""
import json
import sys

CATS = ["params", "grads", "master", "adam_m", "adam_v", "comm_buffers", "gathered", "activations"]


def load(path):
    with open(path if path.endswith(".json") else path + ".json") as f:
        return json.load(f)


def mb(b):
    return f"{b / 1e6:.3f}"


def main(args):
    at = None
    if args[:1] == ["--at"]:
        at, args = int(args[1]), args[2:]
    reps = [load(p) for p in args]
    if not reps:
        sys.exit("no reports")
    shortest = min(len(r["steps_log"]) for r in reps)
    if at is None:
        at = shortest
    if not 1 <= at <= shortest:
        sys.exit(f"--at {at}: expected a step every report holds (1..{shortest})")

    def val_at(r):
        v = [e["val_loss"] for e in r["evals"] if e["step"] == at]
        return f"{v[0]:.6f}" if v else "-"

    names = [r["stage"] for r in reps]
    w = max(12, *(len(n) + 2 for n in names))
    r0 = reps[0]
    print(f"per-rank memory in MB (10^6 bytes), rank 0 peak as measured by the ledger | formula "
          f"({r0['world']} ranks, {r0['precision']}, Ψ = {r0['num_params']:,} parameters)")
    print(f"{'':14}" + "".join(f"{n:>{w}}" for n in names))
    ok = True
    for cat in CATS:
        row = f"{cat:14}"
        for r in reps:
            led = r["ranks"][0]["ledger"]
            measured = sum(led[loc]["peak"][cat] for loc in ("device", "host", "disk"))
            formula = r["formula"].get(cat, 0)
            mismatch = measured > formula if cat == "gathered" else measured != formula
            ok &= not mismatch
            row += f"{(mb(measured) + ('≠' if mismatch else '')):>{w}}"
        print(row)
    for label, fn in [
        ("device total", lambda r: mb(r["ranks"][0]["ledger"]["device"]["peak"]["total"])),
        ("host total", lambda r: mb(r["ranks"][0]["ledger"]["host"]["peak"]["total"])),
        ("disk total", lambda r: mb(r["ranks"][0]["ledger"]["disk"]["peak"]["total"])),
        (f"loss @{at}", lambda r: f"{r['steps_log'][at - 1]['loss']:.6f}"),
        (f"val loss @{at}", val_at),
        ("ms / step", lambda r: f"{sum(s['ms'] for s in r['steps_log'][1:]) / max(1, len(r['steps_log']) - 1):.1f}"),
        ("sent/step", lambda r: f"{r['steps_log'][-1]['comm_elems'] / 1e6:.3f}M"),
        ("formula", lambda r: f"{r['formula']['comm_elems_per_step'] / 1e6:.3f}M"),
        ("host<->dev", lambda r: f"{(r['steps_log'][-1]['to_host_elems'] + r['steps_log'][-1]['to_device_elems']) / 1e6:.3f}M"),
    ]:
        print(f"{label:14}" + "".join(f"{fn(r):>{w}}" for r in reps))
    # The equality contract (docs/stages.md, "Exactly the same model"): with accum 1 every stage is bit for
    # bit the same; with accum K > 1 stage0_ddp and stage1 sum micro-steps locally and the others
    # reduce every micro-step, so each group is bit for bit the same and the groups differ in the
    # last bits (summation order).
    losses = {r["stage"]: [s["loss"] for s in r["steps_log"][:at]] for r in reps}
    local = {"stage0_ddp", "stage1"}
    groups = [list(losses)] if r0["accum"] == 1 else [[n for n in losses if n in local],
                                                      [n for n in losses if n not in local]]
    groups = [g for g in groups if g]
    same = all(losses[n] == losses[g[0]] for g in groups for n in g)
    steps = at
    print()
    print("every stage's memory matches its formula on rank 0" if ok else "MISMATCH between ledger and formula (≠ above)")
    where = "across the stages" if len(groups) == 1 else \
        f"within each group at accum {r0['accum']} ({', '.join(groups[0])} | {', '.join(groups[-1])}: another summation order)"
    print(f"every step's loss is {'bit-for-bit identical' if same else 'NOT identical'} {where}"
          f" (the first {steps} steps; sent/step counts elements of the model-state collectives per rank)")
    for r in reps:
        if len(r["steps_log"]) > at:
            print(f"{r['stage']} trained on to step {len(r['steps_log'])}: loss {r['steps_log'][-1]['loss']:.6f}, "
                  f"validation loss {r['final_val_loss']:.6f}")
    print(f"unigram baseline (a model that ignores context): {r0['unigram_baseline']:.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
