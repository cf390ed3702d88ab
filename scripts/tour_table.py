#!/usr/bin/env python3
"""Side-by-side table of the tour's JSON reports (one per stage): per-rank memory by category,
measured by the ledger and predicted by the formula, final loss, ms per step, elements sent per step.

    python3 scripts/tour_table.py runs/tour/stage0_ddp runs/tour/stage1 ...   (".json" is added)
"""
import json
import sys

CATS = ["params", "grads", "master", "adam_m", "adam_v", "comm_buffers", "gathered", "activations"]


def load(path):
    with open(path if path.endswith(".json") else path + ".json") as f:
        return json.load(f)


def mb(b):
    return f"{b / 1e6:.3f}"


def main(paths):
    reps = [load(p) for p in paths]
    if not reps:
        sys.exit("no reports")
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
        ("final loss", lambda r: f"{r['steps_log'][-1]['loss']:.6f}"),
        ("val loss", lambda r: f"{r['final_val_loss']:.6f}"),
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
    losses = {r["stage"]: [s["loss"] for s in r["steps_log"]] for r in reps}
    local = {"stage0_ddp", "stage1"}
    groups = [list(losses)] if r0["accum"] == 1 else [[n for n in losses if n in local],
                                                      [n for n in losses if n not in local]]
    groups = [g for g in groups if g]
    same = all(losses[n] == losses[g[0]] for g in groups for n in g)
    steps = len(next(iter(losses.values())))
    print()
    print("every stage's memory matches its formula on rank 0" if ok else "MISMATCH between ledger and formula (≠ above)")
    where = "across the stages" if len(groups) == 1 else \
        f"within each group at accum {r0['accum']} ({', '.join(groups[0])} | {', '.join(groups[-1])}: another summation order)"
    print(f"every step's loss is {'bit-for-bit identical' if same else 'NOT identical'} {where}"
          f" ({steps} steps; sent/step counts elements of the model-state collectives per rank)")
    print(f"unigram baseline (a model that ignores context): {r0['unigram_baseline']:.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
