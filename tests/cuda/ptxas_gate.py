#!/usr/bin/env python3
"""ptxas_gate.py — the GPU resource gate over the CUDA objects' resource reports (OBJ.ptxas, written
by the Makefile's nvcc rule: the GPU assembler's -Xptxas -v lines and each kernel's .maxntid from
the PTX). For every kernel compiled for every GPU architecture:
  - no spills: 0 bytes spill stores and 0 bytes spill loads (a spill is local memory, that is DRAM,
    on the kernel's hottest path);
  - static shared memory within 48 KiB (49152 bytes), the most a block may have without opting in
    at run time (cudaFuncSetAttribute, which is for dynamic shared memory only);
  - registers within the register file of one SM (65536 32-bit registers; every architecture
    nanoZeRO builds for): a warp is given its registers in units of 256, so a block of T threads
    needs ceil(R / 8) * 8 * ceil(T / 32) * 32 of them, with R the kernel's registers per thread.
    T is the kernel's __launch_bounds__ (.maxntid), times its minimum blocks per SM (.minnctapersm)
    where it asks for more than one. A kernel with no bound may be launched with up to 1024
    threads, which fit only at R <= 64: above that it must carry a bound (the block it is launched
    with), or a launch of a large block fails with "too many resources requested".
Usage: ptxas_gate.py REPORT.ptxas... ; one line per problem ("ptxas-gate: FAIL ..."), then a summary
line; exit status 1 when anything is wrong, 2 when a report cannot be read.
"""
import re
import subprocess
import sys

REGISTER_FILE = 65536
STATIC_SHARED_LIMIT = 48 * 1024
UNBOUNDED_THREADS = 1024


def ceil_to(n, unit):
    return (n + unit - 1) // unit * unit


def parse(path):
    """The kernels of one report: [(kernel, arch, registers, spill stores, spill loads, smem, threads, blocks)]."""
    bounds = {}  # mangled name -> (max threads per block, min blocks per SM)
    props = []
    current = None  # (name, arch) of the entry ptxas is compiling
    entry = None  # the PTX entry whose directives follow
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"ptx: .*\.entry\s+([\w$]+)", line)
            if m:
                entry = m.group(1)
                bounds.setdefault(entry, [None, None])
                continue
            m = re.match(r"ptx: \s*\.maxntid\s+(\d+)(?:,\s*(\d+))?(?:,\s*(\d+))?", line)
            if m and entry:
                bounds[entry][0] = int(m.group(1)) * int(m.group(2) or 1) * int(m.group(3) or 1)
                continue
            m = re.match(r"ptx: \s*\.minnctapersm\s+(\d+)", line)
            if m and entry:
                bounds[entry][1] = int(m.group(1))
                continue
            m = re.match(r"ptxas info\s*: Compiling entry function '([^']+)' for '(\w+)'", line)
            if m:
                current = {"name": m.group(1), "arch": m.group(2)}
                props.append(current)
                continue
            m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m and current is not None:
                current["spill_stores"], current["spill_loads"] = int(m.group(1)), int(m.group(2))
                continue
            m = re.match(r"ptxas info\s*: Used (\d+) registers", line)
            if m and current is not None:
                current["registers"] = int(m.group(1))
                s = re.search(r"(\d+) bytes smem", line)
                current["smem"] = int(s.group(1)) if s else 0
    for p in props:
        b = bounds.get(p["name"], [None, None])
        p["threads"], p["blocks"] = b[0], b[1]
    return props


def demangled(names):
    """The kernels' C++ names (c++filt, where binutils has it), without their parameter lists."""
    names = sorted(set(names))
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        plain = out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        plain = names
    if len(plain) != len(names):
        plain = names
    shorter = [re.sub(r"^void |\(anonymous namespace\)::", "", re.sub(r"\((?:[^()]|\([^()]*\))*\)$", "", p))
               for p in plain]
    return dict(zip(names, shorter))


def check(path):
    problems, kernels = [], 0
    props = parse(path)
    name = demangled(p["name"] for p in props)
    for p in props:
        kernels += 1
        missing = [k for k in ("spill_stores", "registers") if k not in p]
        where = f"{name[p['name']]} ({p['arch']}, {path})"
        if missing:
            problems.append(f"{where}: the report has no {' or '.join(missing)} line for it")
            continue
        if p["spill_stores"] or p["spill_loads"]:
            problems.append(f"{where}: spills ({p['spill_stores']} bytes of spill stores, {p['spill_loads']} of "
                            f"spill loads at {p['registers']} registers); expected none")
        if p["smem"] > STATIC_SHARED_LIMIT:
            problems.append(f"{where}: {p['smem']} bytes of static shared memory; a block may have at most "
                            f"{STATIC_SHARED_LIMIT}")
        regs = ceil_to(p["registers"], 8)
        if p["threads"] is None:
            if regs * UNBOUNDED_THREADS > REGISTER_FILE:
                problems.append(f"{where}: {p['registers']} registers a thread and no __launch_bounds__: a block of "
                                f"more than {REGISTER_FILE // (regs * 32) * 32} threads cannot launch (at most 64 registers "
                                f"fit any block); give it the bound of the block it is launched with")
        else:
            blocks = max(1, p["blocks"] or 1)
            need = regs * ceil_to(p["threads"], 32) * blocks
            if need > REGISTER_FILE:
                problems.append(f"{where}: {p['registers']} registers x {p['threads']} threads"
                                f"{f' x {blocks} blocks' if blocks > 1 else ''} = {need} registers; an SM has "
                                f"{REGISTER_FILE}")
    return problems, kernels


def main(paths):
    if not paths:
        print("usage: ptxas_gate.py REPORT.ptxas...", file=sys.stderr)
        return 2
    problems, kernels = [], 0
    for path in paths:
        try:
            pr, k = check(path)
        except OSError as e:
            print(f"ptxas-gate: cannot read {path}: {e.strerror}", file=sys.stderr)
            return 2
        problems += pr
        kernels += k
    if kernels == 0:  # a report may have none (a file of host code), but not every report
        problems.append("no kernel in any report (were they written by the nvcc rule's -Xptxas -v?)")
    for p in problems:
        print(f"ptxas-gate: FAIL {p}")
    print(f"ptxas-gate: {kernels} kernels in {len(paths)} reports, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
