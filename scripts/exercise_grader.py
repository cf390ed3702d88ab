"""The exercise grader: builds a learner's trainer, runs it beside the real one, and turns every
outcome into a verdict with a hint (scripts/exercises.py is the command line and the catalogue).

What it checks, on every configuration (CONFIGS: fp32, bf16 and fp16, 2 and 3 ranks, with and
without accumulation; stage3 also without prefetch), against the real trainer built on this
machine and run with the same flags (never against stored numbers: bf16 products differ between
CPUs):
  - the model: every step's loss and gradient norm, and the saved model, bit for bit; or, where the
    learner's arithmetic is another rounding order of the same sums, within 4 units of roundoff of
    the precision (the verdict says so; exercises whose lesson is the order itself demand bits);
  - the memory ledger: peak bytes of every category at every location, on every rank;
  - the comm ledger: calls, elements and bytes of every collective, and the host<->device link;
  - for an exercise with a probe (the block quantizer): first, the learner's code called directly on
    inputs made to find its mistakes, against the same program linked with the real library;
  - what a CPU run cannot time but can order (stage3): from the ledger's activity log, every
    gather the real trainer overlaps with a unit's computation must overlap one here too;
  - the pipeline's order (PIPELINE_CONFIGS): every rank runs the real trainer's forwards and
    backwards in the real order (its events of the last step, pipeline.h);
  - placement and bounds: the library checks every buffer it is given against the ledger (a slice
    past its buffer's end, a released unit, host code on device memory) and stops the run, naming
    the buffer; the stack printed by exercise_support.cpp gives the learner's line.
Every failure is a verdict: a build error (the compiler's first error, at the learner's line), a
crash (the library's, glibc's or the signal's own message, and the learner's line), a hang (the
watchdog ends it in seconds, naming the rank and phase), NaN or infinite losses; the grader itself
never ends in a traceback.
"""
import json
import math
import os
import re
import signal
import struct
import subprocess
import threading
from array import array

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
WORK = os.path.join(BUILD, "exercises")  # grader builds and runs
SUPPORT_SRC = os.path.join(ROOT, "scripts", "exercise_support.cpp")

FLAGS = ("--preset tiny --seq 32 --batch 2 --steps 4 --lr 3e-3 --warmup 2 --clip 0.5 "
         "--eval-every 0 --eval-windows 4 --quiet")
# fp16 starts from a small loss scale that grows (window 4): no step of these short runs overflows,
# so every step updates the model (the default 2^16 skips them all on this tiny model).
FP16_FLAGS = "--loss-scale 1024 --loss-scale-window 4"
WATCHDOG_S = 5     # a rank without progress this long ends the run (common/watchdog.h)
RUN_TIMEOUT_S = 60  # and if even the watchdog cannot (a rank spinning in set-up), this does
# unit roundoff of each precision: the size of one rounding error, relative
UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
ROUNDING_UNITS = 4  # "another rounding order" when every logged number is within this many of them
ELEM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


class Config:
    """One run: ranks, accumulation, precision, extra flags."""

    def __init__(self, n, accum, precision="fp32", extra=""):
        self.n, self.accum, self.precision, self.extra = n, accum, precision, extra

    @property
    def label(self):
        s = f"{self.n} ranks, --accum {self.accum}, {self.precision}"
        return s + (f", {self.extra}" if self.extra else "")

    @property
    def flags(self):
        f = f"--accum {self.accum} --precision {self.precision} {self.extra}"
        return f + (" " + FP16_FLAGS if self.precision == "fp16" else "")

    @property
    def tag(self):
        return re.sub(r"\W+", "", f"{self.n}_{self.accum}_{self.precision}_{self.extra}")

    def fp32_twin(self):
        return Config(self.n, self.accum, "fp32", self.extra)

    def same(self, other):
        return self.tag == other.tag


# The order is the order of the verdict: fp32 first (the plain arithmetic), then the same shape in
# bf16 (a failure there, after fp32 passed, is about the precision), fp16 on a second shape (2 ranks,
# accumulation 2: when it fails, its fp32 twin is run to tell the precision from the shape), then
# accumulation 3 in fp32. 3 ranks pad every unit.
CONFIGS = [Config(3, 1), Config(3, 1, "bf16"), Config(2, 2, "fp16"), Config(3, 3)]
STAGE3_CONFIGS = CONFIGS + [Config(3, 1, "fp32", "--prefetch 0")]
# infinity's lines move slices, not sums: accumulation and fp16 change nothing they do. Two runs:
# fp32 with the slices in host memory, and bf16 with them on disk (a failure there runs its fp32
# twin, which tells a size in floats from a slice that only host memory kept).
INFINITY_DISK = "--offload-param disk --offload-dir build/exercises"
# fp16 on 2 ranks with accumulation 2 too: the host AdamW must undo fp16's loss scale (a mistake there
# changes the losses from step 3 on, and nothing in fp32 or bf16, whose loss scale is 1).
INFINITY_CONFIGS = [Config(3, 1), Config(3, 1, "bf16", INFINITY_DISK), Config(2, 2, "fp16")]
# The pipeline: 4 segments and 5 micro-batches (every segment's warm-up differs, the first segment's slots
# are reused), then 4 segments and 2 micro-batches (K < P - 1: the warm-up is capped at K), then 2
# segments x 2 replicas in bf16 with 3. Its order of operations is checked too.
PIPELINE_CONFIGS = [Config(4, 5, "fp32", "--pipeline 4 --schedule 1f1b"),
                    Config(4, 2, "fp32", "--pipeline 4 --schedule 1f1b"),
                    Config(4, 3, "bf16", "--pipeline 2 --schedule 1f1b")]


# zeropp: all three of ZeRO++'s switches, in blocks small enough for the tiny model to have many;
# 3 ranks in one node of 3, 2 ranks with accumulation 2 in bf16 and fp16 (skipped steps included)
ZEROPP_FLAGS = "--qwz --qgz --qw-block 64 --qg-block 64"
ZEROPP_CONFIGS = [Config(3, 1, "fp32", ZEROPP_FLAGS + " --hpz 3"), Config(3, 1, "bf16", ZEROPP_FLAGS),
                  Config(2, 2, "fp16", ZEROPP_FLAGS + " --hpz 2"), Config(3, 3, "fp32", ZEROPP_FLAGS)]


# the block quantizer, once its probe passed (every scale and code of crafted blocks, all three types):
# the real zeropp built with it, in the two precisions whose values it reads as 2-byte types, fp16 with
# its skipped steps (a gradient block that overflowed must dequantize to NaN). Both runs are two of the
# qgZ exercise's: the real trainer's are shared.
ZEROPP_QUANTIZER_CONFIGS = [ZEROPP_CONFIGS[1], ZEROPP_CONFIGS[2]]


# tensor parallelism (tensor/, the vocabulary-parallel loss): T = 2; T = 4 in bf16; T = 2 x 2 replicas
# in fp16 with accumulation 2; T = 3 on a 48-wide model of 3 heads, whose vocabulary of 256 is padded
# to 258 (the two padding columns must take part in nothing: the T's that divide 256 cannot show it).
TENSOR_THREE = "--tensor 3 --dim 48 --heads 3"
TENSOR_CONFIGS = [Config(2, 1, "fp32", "--tensor 2"), Config(4, 1, "bf16", "--tensor 4"),
                  Config(4, 2, "fp16", "--tensor 2"), Config(3, 1, "fp32", TENSOR_THREE)]
# Muon (--optimizer muon, the owners' design, stage2): 3 ranks cut attproj_w and fc_w of every block,
# 2 ranks fc_w; bf16 rounds the parameters from the fp32 master the update writes; accumulation 2.
# Its point-to-point messages are graded too (compare, p2p).
MUON_FLAGS = "--optimizer muon"
MUON_CONFIGS = [Config(3, 1, "fp32", MUON_FLAGS), Config(2, 1, "bf16", MUON_FLAGS), Config(2, 2, "fp32", MUON_FLAGS)]
# ulysses (ulysses_all_to_all): the all-to-all's layout at S = 2 and 4, one replica (N = S) and two (N = 4,
# S = 2, accumulation 3), and S = 4 in bf16 (2-byte elements: a size in floats runs past the exchange)
ULYSSES_CONFIGS = [Config(2, 1, "fp32", "--sp 2"), Config(4, 1, "fp32", "--sp 4"),
                   Config(4, 1, "bf16", "--sp 4"), Config(4, 3, "fp32", "--sp 2")]


# the trainers whose all-gathers are prefetched: their overlap is graded (compare, "overlap")
PREFETCH_STAGES = ("stage3", "infinity")


def configs_for(stage):
    return {"stage3": STAGE3_CONFIGS, "pipeline": PIPELINE_CONFIGS, "infinity": INFINITY_CONFIGS,
            "zeropp": ZEROPP_CONFIGS, "tensor": TENSOR_CONFIGS}.get(stage, CONFIGS)


def configs_of(ex):
    """The runs an exercise is graded on: its own list, else its stage's."""
    return getattr(ex, "configs", None) or configs_for(ex.stage)


class GraderError(Exception):
    """Something the grader needs is missing (the real trainers not built): said in one line."""


# ---- building ----

_build_lock = threading.Lock()
_flags_cache = {}


def build_flags():
    if not _flags_cache:
        out = subprocess.run(["make", "-s", "--no-print-directory", "print-build-flags"], cwd=ROOT,
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise GraderError("could not read the build flags from the Makefile: " + out.stderr.strip())
        for line in out.stdout.splitlines():
            k, _, v = line.partition("=")
            _flags_cache[k.strip()] = v.strip()
    return _flags_cache


def learner_cxxflags():
    # -O0: the trainer file only drives the loops (the numbers are computed by the library, built as
    # usual), so its optimisation level does not change a bit, and it compiles in seconds. -g: the
    # lines of a crash's stack.
    return re.sub(r"-O\d", "-O0", build_flags()["CXXFLAGS"]).replace("-MMD -MP", "") + " -g"


def _run_quiet(cmd):
    return subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, text=True)


PREPARED_INCLUDES = '#include "kernels/ops.h"\n#include "trainer.h"\n'
# a rung's own header that includes the library's headers goes in too: GCC's precompiled header
# does not keep #pragma once for a header included again from outside it (ulysses/ring.h includes
# comm.h: "multiple definition of enum class CommOp")
PREPARED_INCLUDES += '#include "ulysses/ring.h"\n'


_header_inputs = []


def prepared_header_inputs():
    """Every header of the repository the precompiled header includes, the rungs' own among them
    (trainer.h includes zeropp/formulas.h): the compiler's list (-MM), so none is missed. Listed once
    per process (a grading run does not change the headers it compiles against)."""
    if _header_inputs:
        return list(_header_inputs)
    f = build_flags()
    d = os.path.join(WORK, "prepared")
    os.makedirs(d, exist_ok=True)
    header = os.path.join(d, "exercise.h")
    if not os.path.exists(header) or open(header).read() != PREPARED_INCLUDES:
        with open(header, "w") as h:
            h.write(PREPARED_INCLUDES)
    c = _run_quiet(f"{f['CXX']} {learner_cxxflags()} -MM -x c++-header {header}")
    if c.returncode != 0:
        raise GraderError("internal: could not list the grader's headers: " + c.stderr.strip()[:2000])
    paths = c.stdout.replace("\\\n", " ").split()[1:]  # after "exercise.o:"
    _header_inputs[:] = [os.path.abspath(os.path.join(ROOT, p)) for p in paths
                         if os.path.abspath(p) != os.path.abspath(header)]
    return list(_header_inputs)


def prepared_objects():
    """The precompiled header every learner's file is compiled with (the library's headers: most of a
    trainer's compile time) and the crash-reporting object, built once and again when their
    sources (every header the precompiled one includes) or the flags change. Returns (pch_header,
    support_object)."""
    f = build_flags()
    d = os.path.join(WORK, "prepared")
    header, gch = os.path.join(d, "exercise.h"), os.path.join(d, "exercise.h.gch")
    support = os.path.join(d, "exercise_support.o")
    stamp = os.path.join(d, "flags")
    with _build_lock:
        os.makedirs(d, exist_ok=True)
        flags = f["CXX"] + " " + learner_cxxflags()
        newest = max(os.path.getmtime(h) for h in prepared_header_inputs() + [SUPPORT_SRC, header])
        fresh = (os.path.exists(stamp) and open(stamp).read() == flags and os.path.exists(gch)
                 and os.path.exists(support) and min(os.path.getmtime(gch), os.path.getmtime(support)) > newest)
        if not fresh:
            for cmd in (f"{flags} -c -x c++-header {header} -o {gch}.tmp && mv {gch}.tmp {gch}",
                        f"{flags} -c {SUPPORT_SRC} -o {support}"):
                c = _run_quiet(cmd)
                if c.returncode != 0:
                    raise GraderError("internal: could not prepare the grader's build: " + c.stderr.strip()[:2000])
            with open(stamp, "w") as s:
                s.write(flags)
    return header, support


def first_compile_error(errors, source, source_text):
    """The compiler's first error, at the learner's line where the compiler names one."""
    lines = errors.splitlines()
    first = next((i for i, l in enumerate(lines) if re.search(r":\d+:\d+: (fatal )?error: ", l)), None)
    if first is None:
        tail = [l for l in lines if l.strip()]
        return ["  " + l for l in tail[:6]] or ["  (no message from the compiler)"]
    m = re.match(r"(.*?):(\d+):\d+: (?:fatal )?error: (.*)", lines[first])
    where, line_no, msg = m.group(1), int(m.group(2)), m.group(3)
    if os.path.abspath(where) != os.path.abspath(source):
        # an error inside a header, caused by a call in the learner's file: the learner's line from
        # the "required from here" / "In instantiation" context around it
        for l in lines[max(0, first - 8):first + 8]:
            mm = re.match(r"(.*?):(\d+):\d+:", l)
            if mm and os.path.abspath(mm.group(1)) == os.path.abspath(source):
                line_no, where = int(mm.group(2)), source
                break
    out = [f"  line {line_no}: error: {msg}" if where == source else f"  {lines[first]}"]
    if where == source:
        src = source_text.split("\n")
        if 0 < line_no <= len(src):
            out.append(f"  {line_no:5d} | {src[line_no - 1].rstrip()}")
    return out


def compile_learner(ex, source, out_dir):
    """Builds the learner's trainer; returns (binary, None) or (None, verdict lines)."""
    f = build_flags()
    header, support = prepared_objects()
    os.makedirs(out_dir, exist_ok=True)
    obj = os.path.join(out_dir, "learner.o")
    binary = os.path.join(out_dir, ex.stage)
    c = _run_quiet(f"{f['CXX']} {learner_cxxflags()} -include {header} -Winvalid-pch -c {source} -o {obj}")
    if c.returncode != 0:
        with open(source, errors="replace") as s:
            return None, first_compile_error(c.stderr, source, s.read())
    if not ex.path.endswith("/train.cpp"):  # a library file: the real trainer, the learner's object first
        objs = f"{os.path.join(BUILD, 'obj', ex.stage, 'train.o')} {obj}"
    else:
        objs = obj
    c = _run_quiet(f"{f['CXX']} {f['LDFLAGS']} {support} {objs} {f['LIB']} {f['LDLIBS']} -o {binary}")
    if c.returncode != 0:
        errs = [l for l in c.stderr.splitlines() if "error" in l or "undefined" in l] or c.stderr.splitlines()
        return None, ["  (linking) " + l for l in errs[:4]]
    return binary, None


# ---- the probe: the learner's code called directly, on inputs made to find its mistakes ----

def probe_build(ex, learner_obj=None):
    """The exercise's probe program linked with the real library (learner_obj None: built once, and
    again when the library or the probe changes) or with the learner's object first. Returns
    (binary, None) or (None, the linker's first errors)."""
    f = build_flags()
    _, support = prepared_objects()
    d = os.path.join(WORK, "prepared")
    src = os.path.join(ROOT, ex.probe)
    name = os.path.splitext(os.path.basename(ex.probe))[0]
    obj = os.path.join(d, name + ".o")
    lib = os.path.join(ROOT, f["LIB"])
    with _build_lock:
        if not os.path.exists(obj) or os.path.getmtime(obj) < max(os.path.getmtime(src), os.path.getmtime(lib)):
            c = _run_quiet(f"{f['CXX']} {learner_cxxflags()} -c {src} -o {obj}")
            if c.returncode != 0:
                raise GraderError(f"internal: could not build {ex.probe}: " + c.stderr.strip()[:2000])
        binary = os.path.join(d, name) if learner_obj is None else os.path.join(os.path.dirname(learner_obj), name)
        if learner_obj is None and os.path.exists(binary) and os.path.getmtime(binary) > max(
                os.path.getmtime(obj), os.path.getmtime(lib)):
            return binary, None
        c = _run_quiet(f"{f['CXX']} {f['LDFLAGS']} {support} {obj} {learner_obj or ''} {f['LIB']} {f['LDLIBS']} "
                       f"-o {binary}")
    if c.returncode != 0:
        if learner_obj is None:
            raise GraderError(f"internal: could not link {ex.probe}: " + c.stderr.strip()[:2000])
        errs = [l for l in c.stderr.splitlines() if "error" in l or "undefined" in l] or c.stderr.splitlines()
        return None, ["  (linking) " + l for l in errs[:4]]
    return binary, None


def probe_cases(text):
    """The probe's output (exercise_quantizer_probe.cpp): [{name, bits, block, type, n, bad, x, scale,
    code}], values as fp32 bit patterns."""
    cases, lines = [], text.splitlines()
    for i, l in enumerate(lines):
        f = l.split()
        if f[:1] == ["case"] and i + 3 < len(lines):
            c = dict(zip(f[2::2], f[3::2]))
            c.update(name=f[1], bits=int(c["bits"]), block=int(c["block"]), n=int(c["n"]), bad=int(c["bad"]))
            for key, line in zip(("x", "scale", "code"), lines[i + 1:i + 4]):
                vals = line.split()[1:]
                c[key] = [int(v) for v in vals] if key == "code" else [int(v, 16) for v in vals]
            cases.append(c)
    return cases


def f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def to_f32(x):
    """x rounded to fp32 (an fp32 quotient or product of two fp32 values, computed in double: exact
    before this one rounding)."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def round_even(q):
    """q rounded to the nearest integer, ties to even (Python's round); infinities stay."""
    return float(round(q)) if math.isfinite(q) else q


def quantizer_diff(ref, got):
    """The first scale or code (or count) where the learner's quantizer differs from the real one on
    the probe's cases: (what differs, hint), or None. The hint reads the numbers: what rule would
    have given the learner's value."""
    if len(got) != len(ref) or any(len(g[k]) != len(r[k]) for r, g in zip(ref, got) for k in ("scale", "code")):
        return ("your quantizer's results could not be read in full (a crash part-way?)", None)
    for r, g in zip(ref, got):
        qmax = (1 << (r["bits"] - 1)) - 1
        where = f"case {r['name']}: int{r['bits']}, blocks of {r['block']}, {r['type']}, {r['n']} values"
        xs = [f32(v) for v in r["x"]]
        blocks = [xs[b * r["block"]:(b + 1) * r["block"]] for b in range(len(r["scale"]))]
        for b, (want_bits, got_bits) in enumerate(zip(r["scale"], g["scale"])):
            if want_bits == got_bits:
                continue
            want, have, vals = f32(want_bits), f32(got_bits), blocks[b]
            msg = f"{where}: block {b}'s scale is {fmt(have)}, expected {fmt(want)}"
            finite_vals = [v for v in vals if math.isfinite(v)]
            absmax = max((abs(v) for v in finite_vals), default=0.0)
            call_absmax = max((abs(v) for v in xs if math.isfinite(v)), default=0.0)
            if math.isnan(want):
                hint = ("a block holding a NaN or an infinity has no scale: its scale is NaN, its codes 0, and it is "
                        "counted (std::fmax skips a NaN, so test std::isfinite on each value first)")
            elif len(set(g["scale"])) == 1 and len(r["scale"]) > 1 and have == to_f32(call_absmax / qmax):
                hint = ("one scale for the whole call (per tensor): a block's scale is from that block's values "
                        "only, one scale per block of q.block values, or a small block next to a large one "
                        "quantizes to zeros")
            elif max(finite_vals, default=0.0) < absmax and have == to_f32(max(finite_vals, default=0.0) / qmax):
                hint = "the scale comes from the largest magnitude, max |x|, which may be a negative value"
            elif have == to_f32(absmax / (qmax + 1)):
                hint = (f"the codes are symmetric, -qmax..qmax with qmax = 2^(bits-1) - 1 = {qmax} (q.qmax()): "
                        f"the scale is absmax / qmax, so that the largest magnitude gets the code ±qmax")
            elif want_bits == got_bits - 1 and qmax * have > 3.4028234663852886e38:  # the next float below
                hint = ("near the largest float, qmax * scale overflows to infinity: then the scale is the next "
                        "float below (std::nextafter(scale, 0.0f)), so the largest code dequantizes to a finite "
                        "number")
            else:
                hint = "scale = max |x| over the block / qmax, one fp32 division (kernels/quantize.h)"
            return msg, hint
        for i, (want, have) in enumerate(zip(r["code"], g["code"])):
            if want == have:
                continue
            b = i // r["block"]
            x, scale = xs[i], f32(r["scale"][b])
            msg = (f"{where}: value {i - b * r['block']} of block {b}: x = {fmt(x)}, scale {fmt(scale)} (right): "
                   f"your code {have}, expected {want}")
            if not scale > 0:
                return msg, (f"a block whose scale is {fmt(scale)} (all zeros, a scale that underflows, or NaN) "
                             f"has every code 0: no division by it")
            q = to_f32(x / scale)
            msg += f" (x / scale = {fmt(q)})"
            span = 1 << r["bits"]

            def clamped(v):
                return int(max(-qmax, min(qmax, v)))
            rules = [  # what the learner's code would be under each likely mistake, most specific first
                (lambda: abs(round_even(q)) > qmax and have == (int(round_even(q)) + span // 2) % span - span // 2,
                 f"clamp the code to [-qmax, qmax] = [{-qmax}, {qmax}]: a subnormal scale is rounded, so |x / scale| "
                 f"can exceed qmax, and a code out of range wraps around in {r['bits']} bits"),
                (lambda: have == clamped(round_even(to_f32(x * to_f32(1 / scale)))),
                 "one fp32 division, x / scale: x * (1 / scale) rounds twice, and an exact tie moves off its half "
                 "(a kernel on another device must divide too, to give the same bits)"),
                (lambda: abs(q) % 1 == 0.5 and have == clamped(math.copysign(math.floor(abs(q) + 0.5), q)),
                 "x / scale is exactly halfway: ties go to the even integer (std::nearbyint or std::rint in the "
                 "default rounding mode), not away from zero (std::round): 2.5 -> 2, 3.5 -> 4"),
                (lambda: have == clamped(math.trunc(q)),
                 "rounding toward zero: a cast to int truncates (2.7 -> 2); round to the nearest integer, ties to "
                 "even (std::nearbyint)"),
                (lambda: have == clamped(math.floor(q)),
                 "rounding down (floor): round to the nearest integer, ties to even (std::nearbyint)")]
            hint = next((h for rule, h in rules if math.isfinite(q) and rule()),
                        "code = clamp(round_half_even(x / scale), -qmax, qmax), x / scale one fp32 division")
            return msg, hint
        if r["bad"] != g["bad"]:
            return (f"{where}: your quantize_blocks returned {g['bad']}, expected {r['bad']} (blocks with a NaN scale)",
                    "return how many blocks got a NaN scale: quantize_finite stops a run on them")
    return None


def probe_passes(ex, learner_obj, source, source_text, p, show_hints):
    """Runs the probe with the learner's code and with the real library; prints the verdict line."""
    ref_bin, _ = probe_build(ex)
    mine, errors = probe_build(ex, learner_obj)
    if not mine:
        p(f"FAIL {ex.name}: your code does not link:")
        for l in errors:
            p(l)
        return False
    outs = []
    for binary in (ref_bin, mine):
        try:
            c = subprocess.run([binary], cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
            outs.append({"rc": c.returncode, "output": c.stdout + c.stderr, "stdout": c.stdout})
        except subprocess.TimeoutExpired:
            outs.append({"rc": None, "hung": True, "output": ""})
    ref, got = outs
    if ref["rc"] != 0:
        raise GraderError(f"internal: the probe with the real library failed: {ref['output'][-2000:]}")
    label = "your quantizer alone, on crafted blocks"
    if got["rc"] != 0:
        what, hint = failure_verdict(got)
        p(f"FAIL {ex.name} ({label}): {what.replace('your trainer', 'your code')}")
        for n, text in learner_lines(mine, got.get("output", ""), source, source_text)[:3]:
            p(f"  at line {n} of your {ex.file}: {text}")
        show_hints([hint] if hint else [])
        return False
    ref_cases = probe_cases(ref["stdout"])
    diff = quantizer_diff(ref_cases, probe_cases(got["stdout"]))
    if diff:
        msg, hint = diff
        p(f"FAIL {ex.name} ({label}), compared with the real quantizer:")
        p("  - " + msg)
        show_hints([hint] if hint else [])
        return False
    p(f"  ok   {label}: every scale and code of {len(ref_cases)} calls the real quantizer's (exact ties, "
      f"blocks of different magnitudes, zeros, subnormal scales, the largest float, NaN and infinity)")
    return True


# ---- running ----

def run(binary, cfg, tag, guard=True):
    """One run of a trainer. Returns a dict: rc, output, hung, and (when it finished) report, model.
    guard: every buffer followed by inaccessible memory (an overrun faults where it happens)."""
    os.makedirs(WORK, exist_ok=True)
    base = os.path.join(WORK, tag)
    for p in (base + ".json", base + ".model"):
        if os.path.exists(p):
            os.remove(p)
    cmd = (f"mpirun -np {cfg.n} {binary} {FLAGS} {cfg.flags} --watchdog {WATCHDOG_S} "
           f"--log-json {base}.json --save-model {base}.model")
    res = {"rc": None, "output": "", "hung": False}
    env = dict(os.environ, NZ_GUARD_BUFFERS="1") if guard else None  # common/runtime/device.h, guard_after
    p = subprocess.Popen(cmd, shell=True, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True, env=env)
    try:
        out, _ = p.communicate(timeout=RUN_TIMEOUT_S)
        res["rc"] = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the launcher and every rank: this run's own process group
        out, _ = p.communicate()
        res["hung"] = True
    res["output"] = out.decode(errors="replace")
    if res["rc"] == 0:
        try:
            with open(base + ".json") as f:
                res["report"] = json.load(f)
            with open(base + ".model", "rb") as f:
                res["model"] = f.read()
        except (OSError, ValueError) as e:
            res["rc"] = -1
            res["output"] += f"\n(the run ended but its report could not be read: {e})"
    return res


_ref_lock = threading.Lock()


def reference_binary(stage, ex_name=None):
    """The real trainer: build/bin/STAGE; in the student edition, for an exercise that shares its file
    with another, the real file with the other's region cut (reference/obj/STAGE/train@NAME.o,
    scripts/exercise_pack.py), linked here once."""
    obj = os.path.join(ROOT, "reference", "obj", stage, f"train@{ex_name}.o") if ex_name else ""
    if not obj or not os.path.exists(obj):
        return os.path.join(BUILD, "bin", stage)
    f = build_flags()
    binary = os.path.join(WORK, "reference", f"{stage}@{ex_name}")
    lib = os.path.join(ROOT, f["LIB"])
    with _build_lock:
        if not os.path.exists(binary) or os.path.getmtime(binary) < max(os.path.getmtime(obj), os.path.getmtime(lib)):
            os.makedirs(os.path.dirname(binary), exist_ok=True)
            c = _run_quiet(f"{f['CXX']} {f['LDFLAGS']} {obj} {f['LIB']} {f['LDLIBS']} -o {binary}")
            if c.returncode != 0:
                raise GraderError(f"internal: could not link the reference {stage} for {ex_name}: " + c.stderr[-1000:])
    return binary


def reference_run(stage, cfg, ex_name=None, binary=None):
    """The real trainer's run, cached until the binary changes. binary: another reference than
    reference_binary's (make grade's, for a file another exercise shares: exercises.py)."""
    binary = binary or reference_binary(stage, ex_name)
    if not os.path.exists(binary):
        raise GraderError(f"{os.path.relpath(binary, ROOT)} is not built: `make check` builds it "
                          f"(or make {os.path.relpath(binary, ROOT)})")
    base = os.path.join(WORK, f"ref_{os.path.basename(binary)}_{cfg.tag}")
    with _ref_lock:
        if (os.path.exists(base + ".json") and os.path.exists(base + ".model")
                and os.path.getmtime(base + ".json") > os.path.getmtime(binary)):
            try:
                with open(base + ".json") as f, open(base + ".model", "rb") as g:
                    return {"rc": 0, "report": json.load(f), "model": g.read(), "output": ""}
            except (OSError, ValueError):
                pass
        # a reference cut for the student edition leaves a region out, and with it maybe the writes
        # that fill a buffer (stage3 without its backward: no gradient): it runs as the learner's does,
        # every buffer fresh from the guard's zeroed pages, so that both read the same zeros
        variant = binary != os.path.join(BUILD, "bin", stage)
        r = run(binary, cfg, os.path.basename(base), guard=variant)
    if r.get("rc") != 0:
        raise GraderError(f"internal: the real {stage} failed ({cfg.label}):\n{r.get('output', '')[-2000:]}")
    return r


# ---- what a failed run says ----

def learner_lines(binary, output, source, source_text):
    """The learner's lines on the stack a dying rank printed (exercise_support.cpp), innermost first."""
    frames = re.findall(r"nz_grader: frame (\S+) \+0x([0-9a-f]+)", output)
    offsets = [off for obj, off in frames if os.path.realpath(obj) == os.path.realpath(binary)]
    if not offsets:
        return []
    c = subprocess.run(["addr2line", "-e", binary] + ["0x" + o for o in offsets[:40]], capture_output=True, text=True)
    found = []
    src = source_text.split("\n")
    for l in c.stdout.splitlines():
        m = re.match(r"(.*?):(\d+)", l)
        if m and os.path.basename(m.group(1)) == os.path.basename(source) and m.group(2) != "0":
            n = int(m.group(2))
            if n not in [x for x, _ in found] and 0 < n <= len(src):
                found.append((n, src[n - 1].strip()))
    return found


GLIBC_HEAP = re.compile(r"(free\(\): [^\n]*|malloc\(\): [^\n]*|double free or corruption[^\n]*|"
                        r"corrupted [^\n]*|munmap_chunk\(\): [^\n]*|realloc\(\): [^\n]*|malloc_consolidate\(\)[^\n]*)")


PIPELINE_HANG_HINT = ("a segment waits for a message its neighbour never sends: segment s's forward of micro-batch k "
                      "waits for segment s-1's forward of k, its backward of k for segment s+1's backward of k. Run "
                      "every forward and backward once, and order them so that these waits never form a circle: "
                      "on every segment the forward of k comes before the backward of k, and a backward comes "
                      "only after the warm-up's forwards")
PIPELINE_BOUNDS_HINT = ("a forward or backward of a micro-batch outside 0..K-1, or more micro-batches in flight "
                        "than the model has activation slots: with few micro-batches (K < P - 1) the warm-up "
                        "is at most K forwards, and every k from 0 to K-1 runs once each way")


def failure_verdict(res, stage=None):
    """(what happened, hint) for a run that did not finish: a hang, a stop, a crash. stage: the
    trainer graded (the pipeline's hangs and stops have hints of their own)."""
    out = res.get("output", "")
    hang_hint = PIPELINE_HANG_HINT if stage == "pipeline" else (
        "a collective that only some ranks call (inside an `if` on the rank, or a loop whose "
        "count differs between ranks) waits forever for the others; so does a wait for something "
        "that was never started")
    m = re.search(r"error: watchdog: rank (\d+) (.*?)\(last progress ([\d.]+) s ago, ([^)]*)\)", out)
    if m:
        return (f"your trainer hung: rank {m.group(1)} made no progress for {WATCHDOG_S} s ({m.group(4)}), "
                f"and the watchdog ended the run", hang_hint)
    if res.get("hung"):
        return f"your trainer did not finish within {RUN_TIMEOUT_S} s", hang_hint
    m = re.search(r"internal error at [^:]+:\d+: (.*)", out)
    if m:
        msg = m.group(1).strip()
        if stage == "pipeline":  # its region only orders the operations: a bad index or too many in flight
            hint = PIPELINE_BOUNDS_HINT
        elif "not yet waited for" in msg:
            hint = ("a unit's gathered buffer was used while its all-gather was in flight: my slice must "
                    "be in its place before the all-gather starts (the all-gather sends it), and the unit "
                    "is read only after the wait")
        elif "released before this use" in msg:
            hint = ("a unit's gathered parameters were released while still needed: release a unit only "
                    "after the computation that reads it, and gather it again for its next use")
        elif "past its end" in msg or "past the end" in msg:
            hint = ("a slice or a size that does not fit its buffer: count in elements of the run's type "
                    "(owned(u) elements of e = run.elem_bytes bytes), point with elem_ptr or the my_P/my_G "
                    "helpers, and pass dt (run.dtype) to the collectives")
        elif "memory; expected" in msg:
            hint = ("host code cannot read or write device memory (on a GPU it would crash): the host "
                    "optimizer reads and writes host buffers, and the update reaches the device's "
                    "parameters only through the copy up (to_device, counted on the link)")
        else:
            hint = None
        return f"your trainer was stopped: {msg}", hint
    m = GLIBC_HEAP.search(out)
    if m:
        return (f"your trainer crashed: the C library found its heap corrupted (\"{m.group(1).strip()}\")",
                "something wrote past the end of a buffer (or freed memory twice): check the offsets and "
                "sizes of the slices you write, in elements of the run's type")
    m = re.search(r"nz_grader: rank (\d+): signal (\d+) \(([^)]*)\)", out)
    if m:
        sig = int(m.group(2))
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = ("a pointer that does not point into a buffer: a null or stale pointer, or one past the end "
                "of its buffer" if name in ("SIGSEGV", "SIGBUS") else None)
        if stage == "pipeline" and hint:
            hint = PIPELINE_BOUNDS_HINT
        return f"your trainer crashed on rank {m.group(1)}: {name} ({m.group(3)})", hint
    m = re.search(r"^error: (.*)$", out, re.M)
    if m:  # the trainer's own message (a rank that stops calls MPI_Abort, whose lines follow it)
        return f"your trainer stopped with an error: {m.group(1).strip()}", None
    m = re.search(r"^(Abort.*|Fatal error in [^\n]*)$", out, re.M)
    if m and "MPI" in out:  # MPI itself found the ranks' calls inconsistent
        return (f"MPI stopped your trainer: {m.group(1).strip()[:300]}",
                "the ranks called different collectives, or the same ones with different sizes: " + hang_hint)
    m = re.search(r"signal (\d+)", out) or re.search(r"EXIT CODE: (\d+)", out)
    if m:
        sig = int(m.group(1))
        sig = sig - 128 if sig > 128 else sig
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"your trainer was killed ({name}) with no message of its own", None
    lines = [l for l in out.splitlines() if l.strip()]
    return "your trainer failed (exit code %s): %s" % (res.get("rc"), lines[-1] if lines else "no output"), None


# ---- comparing ----

CATS = ["params", "grads", "master", "adam_m", "adam_v", "comm_buffers", "gathered", "activations", "scratch"]
OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast"]


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def fmt(x):
    return f"{x:.9g}" if isinstance(x, (int, float)) else "null (not a number)"


def model_floats(blob):
    """The parameters of a model file (common/io/model_file.h): a 40-byte header, Ψ floats, a CRC."""
    a = array("f")
    a.frombytes(blob[40:40 + (len(blob) - 44) // 4 * 4])
    return a


def not_finite(ref, got):
    """The first step whose loss or gradient norm is NaN or infinite here but a number in the real run."""
    for i, (a, b) in enumerate(zip(ref["report"]["steps_log"], got["report"]["steps_log"])):
        for k, what in (("loss", "loss"), ("grad_norm", "gradient norm")):
            if finite(a.get(k)) and not finite(b.get(k)):
                return i, what
    return None


def overlaps(activity):
    """Each all-gather of the activity log (ledger.h): (its buffer's name, whether a unit's computation
    ended between its start and its wait, whether the first computation after its wait is the
    gathered unit's own — waited for when needed)."""
    out, open_at = [], {}
    for i, e in enumerate(activity):
        if e["what"] == "gather_start":
            open_at.setdefault(e["name"], []).append(i)
        elif e["what"] == "gather_wait" and open_at.get(e["name"]):
            s = open_at[e["name"]].pop(0)
            overlapped = any(x["what"] == "compute_end" for x in activity[s + 1:i])
            unit = e["name"].split(" ", 1)[-1]  # "gathered block1" -> "block1"
            nxt = next((x["name"] for x in activity[i + 1:] if x["what"] == "compute_begin"), "")
            out.append((e["name"], overlapped, nxt.endswith(" " + unit)))
    return out


def pipeline_ops(rank):
    """A pipeline rank's ops of the last step, in the order it ran them (its events, pipeline.h):
    [("F" or "B", micro-batch)]."""
    ops = []
    for op, k, _, _, _ in rank.get("events", []):
        if not ops or ops[-1] != (op, k):
            ops.append((op, k))
    return ops


def schedule_diff(R, G):
    """The first pipeline rank whose order of forwards and backwards differs from the real one's:
    ("schedule", message, (P, [(segment, real ops, these ops) for every rank])), or None."""
    if "pipeline" not in R or "pipeline" not in G:
        return None
    P, D = R["pipeline"]["segments"], R["pipeline"]["replicas"]
    ranks = [(r // D, pipeline_ops(rr), pipeline_ops(gr))
             for r, (rr, gr) in enumerate(zip(R["pipeline"]["ranks"], G["pipeline"]["ranks"]))]
    for r, (s, want, have) in enumerate(ranks):
        if want != have:
            i = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))

            def shown(ops):
                return " ".join(f"{o}{k}" for o, k in ops[:i + 3]) + (" ..." if len(ops) > i + 3 else "")
            return ("schedule", f"rank {r} (segment {s} of {P}): ran {shown(have)}, expected {shown(want)} "
                                f"(operation {i + 1} differs)", (P, ranks))
    return None


def schedule_hints(data):
    """What a wrong order of forwards and backwards most likely is."""
    P, ranks = data

    def forwards_first(ops):  # the forwards run before the first backward
        return next((i for i, (o, _) in enumerate(ops) if o == "B"), len(ops))
    short = next(((s, want, have) for s, want, have in ranks if sorted(have) != sorted(want)), None)
    if short:
        s, want, have = short
        return [f"every micro-batch runs its forward once and its backward once on every segment: {len(want)} "
                f"operations on segment {s}, F and B of each of 0..K-1, and yours ran {len(have)}"]
    if any([k for o, k in have if o == "B"] != sorted(k for o, k in have if o == "B") for _, _, have in ranks):
        return ["the backwards must run in ascending micro-batch order 0, 1, ..., K - 1 on every segment, "
                "cool-down included: each unit's gradient is then summed in stage0_ddp's order, bit for bit"]
    if all(forwards_first(have) == sum(o == "F" for o, _ in have) for _, _, have in ranks):
        return ["that is GPipe's order: every segment runs all K forwards first, so all K micro-batches are in "
                "flight, but 1F1B's model keeps only min(P - s, K) of them on segment s and a later forward "
                "overwrites activations a backward still needs: start the backwards after the warm-up"]
    s, want, have = next(x for x in ranks if x[1] != x[2])
    return [f"segment {s} of {P} ran {forwards_first(have)} forwards before its first backward, expected "
            f"{forwards_first(want)}: the warm-up is P - s - 1 forwards (the micro-batches on their way through "
            f"the segments after it), at most K, then one forward before each backward"]


def compare(ref, got, prefetch, p2p=False):
    """Everything that differs, as (kind, message, data), in the order a learner should read it.
    p2p: the point-to-point messages are graded too (Muon's exchange)."""
    R, G = ref["report"], got["report"]
    diffs = []
    order = schedule_diff(R, G)  # the pipeline's lesson is the order: said first
    if order:
        diffs.append(order)
    rl, gl = R["steps_log"], G["steps_log"]
    steps = []  # the first step whose loss differs, and the first whose gradient norm does: earliest first
    for i, (a, b) in enumerate(zip(rl, gl)):
        if a["loss"] != b["loss"]:
            steps.append((i, 1, ("loss", f"step {i + 1}: loss {fmt(b['loss'])}, expected {fmt(a['loss'])}", i)))
            break
    for i, (a, b) in enumerate(zip(rl, gl)):  # (the norm is computed after the step's loss)
        if a["grad_norm"] != b["grad_norm"]:
            ratio = b["grad_norm"] / a["grad_norm"] if finite(a["grad_norm"]) and finite(b["grad_norm"]) \
                and a["grad_norm"] else float("inf")
            steps.append((i, 0, ("norm", f"step {i + 1}: gradient norm {fmt(b['grad_norm'])}, expected "
                                         f"{fmt(a['grad_norm'])}", (i, ratio))))
            break
    diffs += [d for _, _, d in sorted(steps, key=lambda x: (x[0], x[1]))]
    if len(rl) != len(gl):
        diffs.append(("steps", f"the run logged {len(gl)} steps, expected {len(rl)}", None))
    if ref["model"] != got["model"]:
        diffs.append(("model", "the saved model's bytes differ from the real trainer's", None))
    for rr, gr in zip(R["ranks"], G["ranks"]):
        for loc in ("device", "host", "disk"):
            for c in CATS:
                a = rr["ledger"][loc]["peak"].get(c, 0)
                b = gr["ledger"][loc]["peak"].get(c, 0)
                if a != b:
                    diffs.append(("memory", f"rank {rr['rank']}: {c} on the {loc} peaked at {b:,} bytes, "
                                            f"expected {a:,}", (c, loc, a, b)))
        for op in OPS + ["all_to_all"] + (["p2p"] if p2p else []):
            a, b = rr["comm"].get(op), gr["comm"].get(op)
            if a is None or b is None:
                continue
            if a["calls"] != b["calls"] or a["elems_sent"] != b["elems_sent"]:
                diffs.append(("comm", f"rank {rr['rank']}: {op} sent {b['elems_sent']:,} elements in {b['calls']} "
                                      f"calls, expected {a['elems_sent']:,} in {a['calls']}",
                              (op, a["calls"], b["calls"], a["elems_sent"], b["elems_sent"])))
            elif a.get("bytes_sent") != b.get("bytes_sent"):  # bytes on the wire: quantized blocks
                diffs.append(("bytes", f"rank {rr['rank']}: {op} sent {b.get('bytes_sent', 0):,} bytes, expected "
                                       f"{a.get('bytes_sent', 0):,} (the same {a['elems_sent']:,} elements in the "
                                       f"same {a['calls']} calls)", (op, a.get("bytes_sent", 0), b.get("bytes_sent", 0))))
    for i, (a, b) in enumerate(zip(rl, gl)):
        for k in ("to_host_elems", "to_device_elems"):
            if a.get(k, 0) != b.get(k, 0):
                diffs.append(("link", f"step {i + 1}: {k.replace('_elems', '').replace('_', ' ')} "
                                      f"{b.get(k, 0):,} elements, expected {a.get(k, 0):,}",
                              (k, a.get(k, 0), b.get(k, 0))))
                break
    if prefetch:
        for rr, gr in zip(R["ranks"], G["ranks"]):
            want = overlaps(rr["ledger"].get("activity", []))
            have = overlaps(gr["ledger"].get("activity", []))
            n_want = sum(1 for _, o, _ in want if o)
            n_have = sum(1 for _, o, _ in have if o)
            if n_have < n_want:
                # the first gather the real trainer overlaps and this one does not: matched by the
                # buffer's name and how many times it was gathered before
                def keyed(gathers):
                    seen, out = {}, {}
                    for g in gathers:
                        seen[g[0]] = seen.get(g[0], 0) + 1
                        out[(g[0], seen[g[0]])] = g
                    return out
                mine = keyed(have)
                first = next((mine[k] for k, g in keyed(want).items() if g[1] and k in mine and not mine[k][1]), None)
                diffs.append(("overlap", f"rank {rr['rank']}: {n_have} of the {len(have)} all-gathers of steps "
                                         f"1-2 overlapped a unit's computation, expected {n_want}", first))
                break
    return diffs


def within_rounding(ref, got, precision):
    """Whether two runs of the same model differ only as sums added in another order do: step 1's
    loss (the forward before any update) identical, every step's loss and gradient norm within
    ROUNDING_UNITS units of roundoff of the precision, and the saved models within as much,
    relative, in the 2-norm. (Wrong models differ by far more: a missing average by a factor, a
    wrong slice or a lost update by whole percents.)"""
    tol = ROUNDING_UNITS * UNIT_ROUNDOFF[precision]
    rl, gl = ref["report"]["steps_log"], got["report"]["steps_log"]
    if len(rl) != len(gl) or not rl or rl[0]["loss"] != gl[0]["loss"]:
        return False
    for a, b in zip(rl, gl):
        for k in ("loss", "grad_norm"):
            x, y = a.get(k), b.get(k)
            if x == y:
                continue
            if not (finite(x) and finite(y)) or abs(x - y) > tol * abs(x):
                return False
    pa, pb = model_floats(ref["model"]), model_floats(got["model"])
    if len(pa) != len(pb):
        return False
    diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(pa, pb)))
    norm = math.sqrt(sum(x * x for x in pa))
    return diff <= tol * norm


# ---- hints ----

def precision_hints(cfg, diffs, crashed_msg=None):
    """A configuration in bf16 or fp16 failed where the same shape passed in fp32: the mistake
    assumes 4-byte floats, or (fp16, step 1 right, memory and communication right) forgets the
    loss scale, which is 1 in fp32 and bf16."""
    p = cfg.precision
    first = min((d[2] if d[0] == "loss" else d[2][0] for d in diffs if d[0] in ("loss", "norm")), default=None)
    if p == "fp16" and crashed_msg is None and first and all(d[0] in ("loss", "norm", "model") for d in diffs):
        return [f"right in fp32 and bf16 but not in fp16, from step {first + 1} on: fp16 stores the gradients "
                f"multiplied by the loss scale (run.loss_scale(), 1 in the other precisions), and the scale given "
                f"to AdamW must undo it: pass the AdamW call the `scale` computed above the loop (the clipping "
                f"divided by the loss scale), not the clipping alone"]
    if crashed_msg is not None:
        return [f"right in fp32, but in {p} (2-byte elements) it does not fit its buffer: a hard-coded "
                f"DType::F32 for dt, a (float*) cast for pointer arithmetic into a {p} buffer, or "
                f"sizeof(float) in a size? Use dt = run.dtype, e = run.elem_bytes and elem_ptr"]
    out = []
    for kind, _, data in diffs:
        if kind == "memory":
            c, loc, want, got = data
            if want and got == 2 * want:
                out.append(f"in {p} \"{c}\" holds twice the bytes it should: a size counted in 4-byte floats "
                           f"(sizeof(float))? A buffer of n elements is n * e bytes (e = run.elem_bytes, 2 in {p})")
    if any(k in ("loss", "norm", "model") for k, _, _ in diffs):
        out.append(f"right in fp32 but not in {p}: something assumes 4-byte elements — a DType::F32 passed "
                   f"where the run's dt belongs, pointer arithmetic on a (float*) into a {p} buffer, or "
                   f"sizeof(float) in an offset. Use dt = run.dtype, e = run.elem_bytes and elem_ptr")
    return out


def nan_hint(ex):
    """What NaN or infinite numbers most likely come from, in this exercise's code."""
    if ex.stage == "tensor":
        return ("a log of a sum that is 0 or not a number: exp(z - M) overflows when M is not the row's largest "
                "logit, and a sum read before it was set (or set in the run's type) is garbage: M is the largest "
                "of the T ranks' maxima, the sums start from 0, and the rows' buffers are fp32 (DType::F32)")
    if ex.stage == "pipeline":
        return ("a backward that ran before its own forward, or on activations a later forward overwrote: "
                "on every segment the forward of k comes before the backward of k, and at most min(P - s, K) "
                "micro-batches are in flight")
    if ex.stage == "zeropp":
        return ("a scale that divides by zero, or a sum read before it was written: dequantize rank 0's blocks "
                "into the sum first, then add the others")
    return ("a division by zero in a scale, or memory read before it was written (a gradient slice "
            "added to, not written, on the first micro-step; a unit used before its gather was waited for)")


def pipeline_hints(diffs):
    """The pipeline's order was right but something else differs: its own hints, never another
    exercise's (its region decides only the order of forwards and backwards)."""
    kinds = {d[0] for d in diffs}
    if kinds & {"memory"}:
        return ["the activations held differ from the real pipeline's: at most min(P - s, K) micro-batches may "
                "be in flight on segment s (forward run, backward not yet)"]
    return ["every rank ran the real order of forwards and backwards, yet the model differs: each micro-batch's "
            "forward and backward must run once on every segment, the backwards in ascending order"]


def infinity_update_hint(cfg, ref, got):
    """Infinity, step 1 right and a later step not: the stored slices never changed (no write-back),
    they hold something else than the update (a write-back before adam.step stores the gradient),
    or the update itself differs (the AdamW call's arguments). Told apart by the real trainer run
    with --lr 0 (its weights never move) and by the saved model's distance from the real one."""
    frozen = reference_run("infinity", Config(cfg.n, cfg.accum, cfg.precision, (cfg.extra + " --lr 0").strip()))
    losses = [s["loss"] for s in got["report"]["steps_log"]]
    if losses == [s["loss"] for s in frozen["report"]["steps_log"]]:
        return ("step 1 is right but every later step computes with the first parameters: the stored slices "
                "never change. After the host AdamW, store the updated slice where the slices live "
                "(params.write_back(u, slice)), so that the next step's fetch brings it up")
    pa, pb = model_floats(ref["model"]), model_floats(got["model"])
    far = len(pa) == len(pb) and math.sqrt(sum((x - y) ** 2 for x, y in zip(pa, pb))) > \
        0.5 * math.sqrt(sum(x * x for x in pa))
    if far:
        return ("step 1 is right but the stored slices then hold something other than parameters: the "
                "write-back stores what the host AdamW wrote into outbox(u), so it comes after adam.step; only "
                "params.write_back stores a slice (what params.fetch(u) returns is a copy)")
    return ("step 1 is right and the slices are written back, but the update differs from the real one: check "
            "the AdamW call's arguments (the gradient slice in, outbox(u) out, run.lr(), and the `scale` computed "
            "above the loop: it applies the clipping and undoes fp16's loss scale)")


# begin tensor_vocab_loss's hints
TENSOR_PRECISION_HINT = ("right in fp32 but not in {p}: the rows' buffers (row_max, maxes, sums, target) are fp32 "
                         "whatever the run's precision, so their collectives take DType::F32, never dt_; a logit "
                         "is read with load(z[j]) from the run's type X, never through a float*")


def tensor_hints(cfg, diffs, passed):
    """The vocabulary-parallel loss: what the collectives and the numbers say (its region computes the
    three per-row numbers of the cross-entropy over the T ranks' columns, and nothing else)."""
    comm = {d[2][0]: d[2] for d in diffs if d[0] == "comm"}
    out = []
    gather, reduce = comm.get("all_gather"), comm.get("all_reduce")
    if gather and gather[2] < gather[1] and reduce and reduce[2] > reduce[1]:
        out.append("the maxima were all-reduced, and an all-reduce adds: the sum of the T ranks' maxima is no "
                   "max (in exact arithmetic the loss is the same for any M, which is why the numbers are close; "
                   "M is there to keep exp(z - M) in range, and only the row's max does that for every row). "
                   "All-gather them (each rank's a.R maxima into maxes, rank r's at maxes + r * a.R) "
                   "and take the largest of the T for each row")
    elif gather and gather[2] < gather[1]:
        out.append("M must be the largest logit of the whole row, whose columns lie on T ranks: with each rank's "
                   "own max the ranks shift their exponentials by different amounts, and their sums cannot be "
                   "added. All-gather the maxima (a.R floats from each rank into maxes) and take the largest of "
                   "the T for each row, before the sums")
    elif gather:
        out.append(f"one all-gather of the maxima per micro-batch ({gather[1]} in all on this run), got {gather[2]}")
    if reduce and not (gather and gather[2] < gather[1] and reduce[2] > reduce[1]):
        numbers_right = not any(d[0] in ("loss", "norm", "model") for d in diffs)
        if reduce[2] < reduce[1] and numbers_right:
            out.append("every logged number and the model are right, yet an all-reduce is missing: the target's "
                       "logit lies on one rank only (here rank 0 holds every target, so its loss is right), and "
                       "without the all-reduce the other ranks' losses lack it. Sum the target's logits over the "
                       "T ranks, the others contributing 0, as the sums of exponentials are")
        elif reduce[2] < reduce[1]:
            out.append("each rank holds only its columns' part of the sum of exponentials, and only one rank "
                       "holds the target's logit (the others contribute 0): both are all-reduced over the T "
                       "ranks (a.R floats each, DType::F32), once per micro-batch each")
        elif reduce[2] > reduce[1]:
            out.append("two all-reduces per micro-batch, the sums of exponentials and the target's logits: more "
                       "than that adds a number twice")
        else:
            out.append(f"the loss's collectives are called as often as they should be but send {reduce[4]:,} "
                       f"elements instead of {reduce[3]:,}: each carries a.R floats (the rows, rounded up to a "
                       f"multiple of T)")
    if any(d[0] == "bytes" for d in diffs):
        out.append(TENSOR_PRECISION_HINT.format(p=cfg.precision))
    if not out and any(d[0] in ("loss", "norm", "model") for d in diffs):
        if "--tensor 3" in cfg.extra and passed:
            out.append("right where T divides the vocabulary, wrong with T = 3, whose 256 rows are padded to 258: "
                       "the columns j >= mine of the last rank are padding, not logits; leave them out of the max, "
                       "the sum and the target (loop to mine, not Vl)")
        else:
            out.append("the three exchanges are the real ones but what goes into them is not: for each row, M = "
                       "the largest of the T ranks' maxima (a max, exact in any order), the sum of exp(z_j - M) "
                       "over my real columns with that M, and the target's logit from the rank whose columns "
                       "hold targets_[i] (tj = targets_[i] - lo in [0, mine)), 0 from the others")
    return out
# end tensor_vocab_loss's hints


def muon_hints(diffs):
    """Muon's boundary gather (muon_boundary_gather): what its messages, memory and numbers say."""
    out = []
    for kind, _, data in diffs:
        if kind == "comm" and data[0] == "p2p" and data[4] < data[3]:
            out.append("fewer elements sent point to point than the real exchange: Newton-Schulz needs the whole "
                       "matrix, so every owner of a cut matrix must receive every other owner's part of X (and "
                       "send its own, len elements, to each of them)")
        elif kind == "comm" and data[0] == "p2p":
            out.append("more elements sent point to point than the real exchange: each owner sends only its own "
                       "part (X + at, len elements) to each other owner, once per step")
        elif kind == "comm":
            out.append(f"the exchange is point to point between the owners of the matrix, not a {data[0]} over "
                       f"every rank")
        elif kind == "memory" and data[0] == "adam_m" and data[3] > data[2]:
            out.append("more momentum than the real Muon: the momentum is per element, so each rank keeps it for "
                       "its own slice only (m_); the exchange sends X = G + mu B, whose parts each owner computes "
                       "from its own momentum, so no rank needs the others' momentum")
        elif kind == "memory":
            out.append(f"{data[0]} differs from the real Muon's: the exchange needs no buffer of its own (X is "
                       f"the work space's)")
    if out:
        return list(dict.fromkeys(out))
    if any(d[0] in ("loss", "norm", "model") for d in diffs):
        out.append("the messages and the memory are the real ones but the model is not: each owner's part of X "
                   "must land at its own place in the matrix (X + part(q).first), and each element of W is "
                   "updated once, by its one owner, from its own part of O (X + at)")
    return out


def hints(ex, cfg, diffs, passed, rounding_only, runs=None):
    """What the differences most likely mean; each hint follows from the lines printed above it."""
    n, accum = cfg.n, cfg.accum
    kinds = {d[0] for d in diffs}
    out = []
    if "schedule" in kinds:  # the rest follows from it
        return schedule_hints(next(d[2] for d in diffs if d[0] == "schedule"))
    if ex.stage == "pipeline":
        return pipeline_hints(diffs)
    if ex.stage == "tensor":
        return tensor_hints(cfg, diffs, passed)
    if ex.name == "muon_boundary_gather":
        return muon_hints(diffs)
    comm = {d[2][0]: d[2] for d in diffs if d[0] == "comm"}
    for kind, _, data in diffs:
        if kind == "comm":
            op, want, got, want_e, got_e = data
            if want == got:
                out.append(f"{op} is called as often as it should be but sends {got_e:,} elements instead of "
                           f"{want_e:,}: each rank sends owned(u) elements of the run's type")
            elif op == "all_reduce" and got > want:
                out.append("an all-reduce leaves the whole sum on every rank; here each rank should receive "
                           "only its slice (reduce_scatter)")
            elif op == "all_gather" and ex.stage == "infinity":
                out.append(f"{got} all-gathers where the real infinity makes {want}: gather_start(u) starts unit "
                           f"u's all-gather once (comm.all_gather_start, its request kept in in_flight[u]), "
                           f"after my slice is in its place")
            elif op == "all_gather" and got < want and ex.stage == "stage3":
                out.append("fewer all-gathers than the real stage3: every use of a unit (forward, LM head, "
                           "backward) gathers it afresh; a buffer kept from an earlier use can hold parameters "
                           "from before the optimizer step")
            elif op == "all_gather" and got < want:
                out.append("every rank needs every other rank's updated slice: all-gather after the update")
            elif op == "all_gather" and got > want and ex.stage == "stage3":
                out.append("more all-gathers than the real stage3: is a unit gathered that needs no "
                           "parameters (the embedding's backward), or gathered again while its prefetch is "
                           "in flight?")
            elif op == "all_gather" and got > want:
                out.append("more all-gathers than needed: one per unit per step, after the update")
            elif op == "reduce_scatter" and ex.stage == "stage1":
                out.append(f"stage1 reduce-scatters each unit once per step, on the last micro-step ({want} "
                           f"calls on this run), got {got}")
            elif op == "reduce_scatter":
                out.append(f"one reduce-scatter per unit per micro-step ({want} calls on this run), got {got}")
        if kind == "bytes":
            op, want, got = data
            if ex.stage == "zeropp" and got < want:
                out.append(f"{op} sends fewer bytes than the real zeropp for the same elements: a quantized slice is "
                           f"its codes and one fp32 scale per qg.block (or qw.block) values, packed_bytes(n) bytes; "
                           f"fewer bytes means fewer scales — one per slice instead of one per block?")
            else:
                out.append(f"{op} sends the same elements as the real {ex.stage} but another number of bytes: "
                           f"count them in the run's type (e = run.elem_bytes) or, quantized, with packed_bytes(n)")
        if kind == "memory":
            cat, loc, want, got = data
            if cat == "gathered" and got > want and "all_gather" in comm and comm["all_gather"][2] < comm["all_gather"][1]:
                out.append("gathered units stay alive too long, so fewer are gathered again: release each "
                           "unit right after the computation that uses it")
            elif cat == "gathered" and got > want and "--prefetch 0" in cfg.extra:
                out.append("with --prefetch 0 only one unit may be gathered at a time: prefetch only when "
                           "run.args.prefetch is set")
            elif cat == "gathered" and got > want:
                out.append("gathered units stay alive too long: release each unit right after use")
            elif cat == "gathered" and got == 0 and want > 0:
                out.append("nothing was booked as gathered: a unit's gathered parameters are a Buffer of "
                           "Category::Gathered")
            elif cat == "gathered" and got < want:
                out.append("fewer units gathered at once than the real stage3: with --prefetch 1 the next "
                           "unit's all-gather starts before the current unit computes")
            elif cat == "grads" and got > want:
                out.append("the gradient kept is larger than the slice this rank owns")
            elif want and got == 0:
                out.append(f"nothing was booked as {cat} on the {loc}: is a buffer booked in another category?")
        if kind == "link":
            k, want, got = data
            if k == "to_device_elems" and ex.stage == "infinity":
                out.append("my slice of a unit goes up once per all-gather of the unit (to_device: owned(u) "
                           "elements, from params.fetch(u)), and nothing else")
            elif k == "to_device_elems":
                out.append("the updated slice must go up to the device once per unit per step (to_device: "
                           "owned(u) elements), and nothing else")
            else:
                out.append("each micro-step's reduced slice goes down to the host once per unit (to_host: "
                           "owned(u) elements)")
        if kind == "steps":
            out.append("the training loop ran another number of steps: the loops around your region decide "
                       "the steps; leave them as they are")
        if kind == "overlap":
            first = data
            if first and not first[2]:  # its wait came before another unit's computation
                out.append(f"the all-gather of \"{first[0]}\" was waited for right after it started: a prefetch "
                           f"must only start the gather (all_gather_start) and return; gather_unit waits for it "
                           f"when the unit is needed, so that it travels while the current unit computes")
            elif first:  # waited for when needed, but started too late
                out.append(f"the all-gather of \"{first[0]}\" started only after the current unit's computation "
                           f"had ended: prefetch the next unit before model.forward / model.backward of this one")
            else:
                out.append("no all-gather travels while a unit computes: a prefetch must start the next unit's "
                           "gather before this unit's computation, and wait for it only when it is needed")
    if kinds & {"loss", "norm", "model"}:
        norm = next((d for d in diffs if d[0] == "norm"), None)
        loss = next((d for d in diffs if d[0] == "loss"), None)
        too_large = norm and norm[2][0] == 0 and any(
            abs(norm[2][1] - m) < 1e-3 * m for m in {n * accum, n, accum} if m > 1)
        too_small = norm and norm[2][0] == 0 and any(
            abs(norm[2][1] - 1 / m) < 1e-3 / m for m in {n * accum, n, accum} if m > 1)
        if ex.stage == "zeropp" and "bytes" in kinds:
            pass  # the bytes on the wire said what is wrong
        elif ex.stage == "zeropp" and too_small:  # (before the quantization's hint: a factor is no rounding)
            out.append(f"the gradient is {1 / norm[2][1]:.3g} times too small: averaged twice? Your reduction "
                       f"stores the plain sum over the ranks in `mine`; the trainer averages it afterwards, when "
                       f"it adds my slice into my_G(u)")
        elif ex.stage == "zeropp" and not rounding_only:
            out.append("every rank's int4 blocks of my slice, my own included, must be dequantized to fp32 "
                       "first, then added in rank order: the sum itself is never quantized, and no rank's "
                       "gradient skips the int4 round trip the others take")
        elif ex.exact and rounding_only:
            out.append("almost right: the same numbers added in another order. Add in rank order 0, 1, ..., "
                       "N-1, starting from rank 0's value, in acc_t<T> (fp32 for 2-byte types), rounded once")
        elif ex.exact:
            out.append("each output must be the sum of all N ranks' contributions, read from slice r of "
                       "`full` at r * shard + i")
        elif too_large:
            out.append(f"the gradient is {norm[2][1]:.3g} times too large: the sum over ranks and micro-steps "
                       f"must be averaged (run.grad_average_scale() = 1/(N * accum))")
        elif too_small:
            out.append(f"the gradient is {1 / norm[2][1]:.3g} times too small: averaged twice?")
        elif accum > 1 and any(c.accum == 1 and c.precision == cfg.precision for c in passed) and ex.stage == "stage1":
            out.append("right with --accum 1 but not with accumulation: G(u) holds the sum of this rank's "
                       "micro-steps; reduce-scatter it once, on the last micro-step, and average by "
                       "run.grad_average_scale()")
        elif accum > 1 and any(c.accum == 1 and c.precision == cfg.precision for c in passed):
            out.append("right with --accum 1 but not with accumulation: every micro-step must reduce, and add "
                       "its slice (the first micro-step writes, the others add)")
        elif ex.stage == "infinity" and "disk" in cfg.extra and any("disk" not in c.extra for c in passed) \
                and not (loss and loss[2] == 0):
            out.append("right with the slices in host memory, not on disk: only write_back stores a slice "
                       "(what params.fetch(u) returns is a copy read from the file, gone at the next fetch)")
        elif ex.stage == "infinity" and loss and loss[2] == 0:
            out.append("the very first forward differs: a gathered unit does not hold every rank's stored "
                       "slice of it: copy this rank's own slice of unit u, params.fetch(u), up into its place "
                       "before the all-gather starts")
        elif ex.stage == "infinity" and (norm or loss) and runs:
            out.append(infinity_update_hint(cfg, *runs))
        elif loss and loss[2] == 0:
            out.append("the very first forward differs: the parameters it reads are not the full, current ones")
        elif norm and norm[2][0] == 0:
            out.append("step 1's gradient is wrong: is the reduced sum in the slice you own (my_G(u)), and the "
                       "sum of all ranks' gradients?")
        elif (norm or loss) and ex.stage == "stage3":
            out.append("step 1 is right but a later step is not: a later forward reads parameters other than "
                       "the updated ones — a unit gathered before the optimizer step (kept, or prefetched "
                       "across it) is stale")
        elif norm or loss:
            out.append("the gradient is right but the update is not: update the slice you own with its own "
                       "gradient and scale, then bring every rank every updated slice")
        else:
            out.append("every logged step matches but the saved model does not: the last step's update (or what "
                       "brings it to every rank) is wrong")
    seen, unique = set(), []
    for h in out:
        if h not in seen:
            seen.add(h)
            unique.append(h)
    return unique


# ---- ulysses_all_to_all: the learner's two lambdas alone, on numbered elements ----
# A trainer whose all-to-all misplaces elements trains another model, and the losses cannot say which
# element went where. So when a run's numbers differ, the grader lifts tokens_to_heads and
# heads_to_tokens out of the learner's file (by their names) and runs them in LAYOUT_PROBE: S threads
# play one sequence group, every element numbered by where it comes from, and the first element that
# lands in the wrong place is named, with the rule it breaks. A file whose lambdas cannot be run
# there (renamed, or using names the probe does not define) gets the layout's rule alone.

LAYOUT_PROBE = r"""// the layout probe of ulysses_all_to_all (written by scripts/exercise_grader.py)
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
using namespace nz;

namespace {
struct Threads {  // S threads of one sequence group: a barrier, and where each one's exchange is
  int S = 0, arrived = 0;
  long round = 0;
  std::mutex m;
  std::condition_variable cv;
  std::vector<char*> bufs;
  std::atomic<bool> bad{false};
  void barrier() {
    std::unique_lock<std::mutex> lock(m);
    const long mine = round;
    if (++arrived == S) { arrived = 0; round++; cv.notify_all(); }
    else cv.wait(lock, [&] { return round != mine; });
  }
};
struct ProbeGroup {  // group.all_to_all as Comm's: in place, slot j to rank j, rank j's slot for me
  Threads* th;
  int rank;
  size_t capacity;
  void all_to_all(void* buf, size_t elems_each, DType dt) {
    const size_t each = elems_each * dtype_bytes(dt);
    if (each * th->S > capacity) th->bad = true;
    th->bufs[rank] = static_cast<char*>(buf);
    th->barrier();
    std::vector<char> got(each * th->S);
    if (!th->bad)
      for (int j = 0; j < th->S; j++) memcpy(got.data() + j * each, th->bufs[j] + rank * each, each);
    th->barrier();
    if (!th->bad) memcpy(buf, got.data(), got.size());
    th->barrier();
  }
};
struct ProbeModel { int B; int rows() const { return B; } };
struct ProbeExchange { std::vector<char> bytes; void* data() { return bytes.data(); } };

void one_rank(Threads* th, int rank, int B, int T, int C, DType dt, int parts, bool forward,
              const char* in, char* out) {
  const int S = th->S, Tl = T / S;
  const size_t e = dtype_bytes(dt);
  ProbeModel model{B};
  ProbeExchange exchange{std::vector<char>(size_t(B) * Tl * 3 * C * e)};
  ProbeGroup group{th, rank, exchange.bytes.size()};
  (void)T, (void)Tl, (void)C, (void)S, (void)e, (void)model, (void)group;
@LEARNER@
  if (forward) tokens_to_heads(in, out, parts);
  else heads_to_tokens(in, out, parts);
}

unsigned get(const std::vector<char>& v, size_t i, size_t e) {
  unsigned x = 0;
  memcpy(&x, v.data() + i * e, e);
  return x;
}
void put(std::vector<char>& v, size_t i, size_t e, unsigned x) { memcpy(v.data() + i * e, &x, e); }
}  // namespace

int main() {
  const int B = 2, T = 8, C = 16;
  struct Case { int S; DType dt; int parts; };
  const Case cases[] = {{2, DType::F32, 3}, {2, DType::F32, 1}, {4, DType::F32, 3}, {4, DType::BF16, 3},
                        {4, DType::BF16, 1}};
  for (const Case& k : cases)
    for (int forward = 1; forward >= 0; forward--) {
      const int S = k.S, Tl = T / S, Ch = C / S, W = k.parts * C, Wh = k.parts * Ch;
      const size_t e = dtype_bytes(k.dt), n = size_t(B) * Tl * W;  // elements per rank, either layout
      std::vector<std::vector<char>> in(S, std::vector<char>(n * e)), out(S, std::vector<char>(n * e));
      for (int r = 0; r < S; r++)  // every element numbered from 1 by its place (0: never written)
        for (size_t i = 0; i < n; i++) put(in[r], i, e, unsigned(r * n + i + 1));
      Threads th;
      th.S = S;
      th.bufs.assign(S, nullptr);
      std::vector<std::thread> ranks;
      for (int r = 0; r < S; r++)
        ranks.emplace_back(one_rank, &th, r, B, T, C, k.dt, k.parts, forward == 1, in[r].data(), out[r].data());
      for (auto& t : ranks) t.join();
      const char* fn = forward ? "tokens_to_heads" : "heads_to_tokens";
      if (th.bad) {
        printf("overrun %s S %d e %zu parts %d\n", fn, S, e, k.parts);
        return 0;
      }
      for (int r = 0; r < S; r++)
        for (int b = 0; b < B; b++)
          for (int row = 0; row < (forward ? T : Tl); row++)
            for (int col = 0; col < (forward ? Wh : W); col++) {
              unsigned want;
              if (forward) {  // heads (B, T, parts x C/S) of rank r: token row of rank row / Tl, head group r
                const int j = row / Tl, t = row % Tl, p = col / Ch, c = col % Ch;
                want = unsigned(j * n + (size_t(b) * Tl + t) * W + p * C + r * Ch + c + 1);
              } else {  // tokens (B, T/S, parts x C) of rank r: column p C + j C/S + c from rank j
                const int p = col / C, j = (col % C) / Ch, c = col % Ch;
                want = unsigned(j * n + (size_t(b) * T + r * Tl + row) * Wh + p * Ch + c + 1);
              }
              const size_t i = (size_t(b) * (forward ? T : Tl) + row) * (forward ? Wh : W) + col;
              const unsigned got = get(out[r], i, e);
              if (got != want) {
                printf("mismatch %s S %d e %zu parts %d rank %d b %d row %d col %d got %u want %u\n", fn, S, e,
                       k.parts, r, b, row, col, got, want);
                return 0;
              }
            }
    }
  printf("ok\n");
  return 0;
}
"""

LAYOUT_RULE = ("the layout: slot j of the exchange carries my T/S tokens' columns of head group j, "
               "[p C + j C/S, p C + (j + 1) C/S) of each part p; after the all-to-all slot j holds rank j's "
               "tokens of my heads, rows j T/S .. (j + 1) T/S - 1 of each sequence; heads_to_tokens is the "
               "exact inverse")


def lambda_text(source_text, name):
    """`auto NAME = [&](...) { ... };` from the learner's file, by brace matching; None if not there."""
    m = re.search(r"auto\s+" + name + r"\s*=\s*\[", source_text)
    if not m:
        return None
    i = source_text.find("{", m.end())
    depth = 0
    for k in range(i, len(source_text)):
        depth += {"{": 1, "}": -1}.get(source_text[k], 0)
        if depth == 0:
            end = source_text.find(";", k)
            return source_text[m.start():end + 1] if end >= 0 else None
    return None


def layout_place(kind, S, e, parts, n_rank, value):
    """What a probe element's number says: (rank, sequence, token, column) of the tokens' layout
    (tokens_to_heads' input) or (rank, sequence, row, column) of the heads' layout (heads_to_tokens')."""
    B, T, C = 2, 8, 16
    Tl, Ch = T // S, C // S
    W = parts * C if kind == "tokens_to_heads" else parts * Ch
    rows = Tl if kind == "tokens_to_heads" else T
    v = value - 1
    r, rest = divmod(v, n_rank)
    b, rest = divmod(rest, rows * W)
    t, col = divmod(rest, W)
    return r, b, t, col


def layout_element(fn, rank, row, col):
    """An element of the layout that fn reads, as the verdicts name it: a rank's token (tokens_to_heads
    reads the tokens' layout) or a rank's heads' row (heads_to_tokens reads the heads' layout)."""
    what = "token" if fn == "tokens_to_heads" else "heads' row"
    return f"rank {rank}'s {what} {row}, column {col}"


def layout_found(fn, S, e, parts, n_rank, b, got):
    """What the probe found where another element belongs, in words (the same for both directions), and
    where it came from: (rank, sequence, row, column) of the layout fn reads, or None when no rank sent it."""
    if got == 0:
        return "was never written", None
    if not 0 < got <= S * n_rank:
        return f"holds a number no rank sent ({got})", None
    gr, gb, grow, gc = came = layout_place(fn, S, e, parts, n_rank, got)
    return f"holds {layout_element(fn, gr, grow, gc)}" + (f" of sequence {gb}" if gb != b else ""), came


def ulysses_layout_diagnosis(source_text, out_dir):
    """(what the probe found, hint), or None when it could not run the learner's lambdas."""
    parts = [lambda_text(source_text, n) for n in ("tokens_to_heads", "heads_to_tokens")]
    if not all(parts):
        return None
    f = build_flags()
    header, _ = prepared_objects()
    src = os.path.join(out_dir, "layout_probe.cpp")
    binary = os.path.join(out_dir, "layout_probe")
    with open(src, "w") as h:
        h.write(LAYOUT_PROBE.replace("@LEARNER@", "\n".join(parts)))
    c = _run_quiet(f"{f['CXX']} {learner_cxxflags()} -include {header} -Winvalid-pch {src} {f['LIB']} "
                   f"{f['LDLIBS']} -o {binary}")
    if c.returncode != 0:
        return None
    try:
        r = subprocess.run([binary], cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None
    words = r.stdout.split()
    if r.returncode != 0 or not words:
        return None
    if words[0] == "ok":
        return ("your two all-to-alls alone, on numbered elements (S = 2 and 4, 4- and 2-byte elements, q|k|v "
                "and the output), put every element where it belongs",
                "the layout is right, yet the run differs: does your code depend on something the layout "
                "alone does not show (a size fixed for one S, one dtype or one micro-batch)?")
    kv = dict(zip(words[2::2], words[3::2]))
    fn, S, e, parts = words[1], int(kv["S"]), int(kv["e"]), int(kv["parts"])
    if words[0] == "overrun":
        return (f"your {fn} alone (S = {S}, {e}-byte elements): its all-to-all exchanges more than the "
                f"exchange buffer holds", "group.all_to_all(buf, elems_each, dt) takes elements per slot, "
                f"S slots of B T/S tokens of parts C/S elements")
    rank, b, row, col, got, want = (int(kv[k]) for k in ("rank", "b", "row", "col", "got", "want"))
    B, T, C = 2, 8, 16
    Tl, Ch = T // S, C // S
    n_rank = B * Tl * parts * C
    what = "q|k|v" if parts == 3 else "the output"
    where_in = f"alone, on numbered elements (S = {S}, {e}-byte elements, {what}): rank {rank}'s"
    wr, _, wrow, wc = layout_place(fn, S, e, parts, n_rank, want)
    expected = layout_element(fn, wr, wrow, wc)
    found, came = layout_found(fn, S, e, parts, n_rank, b, got)
    if fn == "tokens_to_heads":
        where = f"your tokens_to_heads {where_in} heads' layout, sequence {b}, row {row} (position {row}), column {col}"
        gr, _, gt, gc = came if came else (None,) * 4
        if came is None:
            hint = (f"every row of the heads' layout gets a token: rank j's T/S tokens go to rows j T/S .. (j + 1) "
                    f"T/S - 1 of each sequence (the slice offset j T/S), so the T rows hold the whole sequence "
                    f"in order" if row >= Tl else LAYOUT_RULE)
        elif (gc % C) // Ch != rank:
            hint = (f"rank {rank} attends with head group {rank}, but head group {(gc % C) // Ch}'s columns reached it: "
                    f"slot j of the exchange must carry ALL my T/S tokens, only head group j's columns of each, "
                    f"[p C + j C/S, p C + (j + 1) C/S): the all-to-all is a split by heads, not by tokens")
        elif gc != wc:
            hint = (f"the right head group, the wrong column: column p C/S + c of the heads' layout is column p C + "
                    f"{rank} C/S + c of the token (part p = q, k or v, then the head group's C/S columns)")
        elif (gr, gt) != (wr, wrow):
            hint = (f"rank {gr}'s token {gt} sits at position {row}, where rank {wr}'s token {wrow} belongs: after the "
                    f"exchange slot j holds rank j's tokens, which go to rows j T/S + t of each sequence (the "
                    f"slice offset j T/S: the heads' layout is the whole sequence in order)")
        else:
            hint = LAYOUT_RULE
    else:
        where = f"your heads_to_tokens {where_in} token {row} of sequence {b}, column {col}"
        hint = (f"heads_to_tokens must undo tokens_to_heads: slot j of the exchange gets rows j T/S .. (j + 1) T/S "
                f"- 1 of my heads' layout (rank j's tokens, my heads); after the all-to-all slot j holds head "
                f"group j of my tokens, which goes to columns p C + j C/S .. of each token: not the forward's "
                f"packing again")
    return f"{where} {found}, expected {expected}", hint


# ---- grading ----

def grade(ex, source, quiet=False, tag=None, hint_level=1, extra_configs=(), hints_shown=True, reference=None):
    """Returns (passed, verdict text). Never raises: whatever goes wrong is a verdict. extra_configs:
    runs graded after the exercise's own (make grade's hidden ones); hints_shown False: no hint lines;
    reference: the trainer to compare with, when not the real one (make grade, a shared file)."""
    lines = []

    def p(s=""):
        lines.append(s)
        if not quiet:
            print(s, flush=True)

    try:
        ok = _grade(ex, source, p, tag or ex.name, hint_level, list(extra_configs), hints_shown, reference)
    except GraderError as e:
        p(f"FAIL {ex.name}: the grader could not run: {e}")
        ok = False
    except Exception as e:  # a verdict, never a traceback: say what the grader could not read
        p(f"FAIL {ex.name}: the grader could not read your trainer's results ({type(e).__name__}: {e}); "
          f"run `make check E={ex.name}` again, and report it if it persists")
        ok = False
    return ok, "\n".join(lines)


def _grade(ex, source, p, tag, hint_level, extra_configs=(), hints_shown=True, reference=None):
    all_configs = list(configs_of(ex)) + list(extra_configs)
    with open(source, errors="replace") as f:
        source_text = f.read()
    out_dir = os.path.join(WORK, tag)
    binary, errors = compile_learner(ex, source, out_dir)
    if not binary:
        p(f"FAIL {ex.name}: your code does not compile:")
        for l in errors:
            p(l)
        return False

    def show_hints(hs):
        if ex.bug:  # find the bug: the exercise's own hints, which guide without naming it
            hs = ex.bug_hints[:hint_level]
            if hint_level < len(ex.bug_hints):
                hs = hs + [f"(a stronger hint: make check E={ex.name} HINT={hint_level + 1})"]
        for h in dict.fromkeys(hs if hints_shown else []):  # (each once, in order)
            p("  hint: " + h)

    passed, rounded = [], []
    results = {}

    def one(cfg):
        if cfg.tag not in results:
            ref = reference_run(ex.stage, cfg, ex.name, reference)
            results[cfg.tag] = (ref, run(binary, cfg, f"learner_{tag}"))
        return results[cfg.tag]

    def failed_here(cfg):
        """The verdict for cfg, or None when it passes (bits, or rounding where allowed)."""
        ref, got = one(cfg)
        if got.get("rc") != 0:
            what, hint = failure_verdict(got, ex.stage)
            where = learner_lines(binary, got.get("output", ""), source, source_text)
            return ("crash", what, hint, where)
        nf = not_finite(ref, got)
        if nf:
            i, what = nf
            return ("nan", f"step {i + 1}: the {what} is not a number (NaN or infinite), where the real "
                           f"{ex.stage}'s is {fmt(ref['report']['steps_log'][i]['loss' if what == 'loss' else 'grad_norm'])}",
                    nan_hint(ex), [])
        diffs = compare(ref, got, prefetch=ex.stage in PREFETCH_STAGES and "--prefetch 0" not in cfg.extra,
                        p2p=MUON_FLAGS in cfg.extra)
        if not diffs:
            return None
        numeric_only = all(d[0] in ("loss", "norm", "model") for d in diffs)
        rounding = numeric_only and within_rounding(ref, got, cfg.precision)
        if rounding and not ex.exact:
            rounded.append(cfg)
            return None
        return ("diff", diffs, rounding, [])

    if ex.probe and not probe_passes(ex, os.path.join(out_dir, "learner.o"), source, source_text, p, show_hints):
        return False
    for cfg in all_configs:
        v = failed_here(cfg)
        if v is None:
            if any(cfg is r for r in rounded):
                p(f"  ok   {cfg.label}: the same model, another rounding order (within {ROUNDING_UNITS} units "
                  f"of {cfg.precision} roundoff); the same memory and communication")
            else:
                p(f"  ok   {cfg.label}: the same model, memory and communication as the real {ex.stage}")
            passed.append(cfg)
            continue
        # a failure in bf16 or fp16: is it about the precision? The same shape in fp32 says.
        about_precision = False
        if cfg.precision != "fp32":
            twin = cfg.fp32_twin()
            if any(c.same(twin) for c in passed):
                about_precision = True
            else:
                tv = failed_here(twin)
                if tv is None:
                    about_precision = True
                    passed.append(twin)
                else:
                    cfg, v = twin, tv  # the plain arithmetic is wrong already: say that
        kind = v[0]
        if kind in ("crash", "nan"):
            _, what, hint, where = v
            p(f"FAIL {ex.name} ({cfg.label}): {what}")
            for n, text in [w for w in where if not w[1].startswith("#")][:3]:
                p(f"  at line {n} of your {ex.file}: {text}")
            hs = [hint] if hint else []
            if about_precision:
                hs = precision_hints(cfg, [], crashed_msg=what) if ex.stage != "tensor" else \
                    [TENSOR_PRECISION_HINT.format(p=cfg.precision)]
            show_hints(hs)
            return False
        _, diffs, rounding, _ = v
        p(f"FAIL {ex.name} ({cfg.label}), compared with the real {ex.stage}:")
        for _, msg, _ in diffs[:6]:
            p("  - " + msg)
        if len(diffs) > 6:
            p(f"  - ... and {len(diffs) - 6} more differences")
        if about_precision:
            hs = precision_hints(cfg, diffs) if ex.stage != "tensor" else \
                [TENSOR_PRECISION_HINT.format(p=cfg.precision)]
            if ex.exact and rounding:
                hs = [f"right in fp32; in {cfg.precision} the sums differ by rounding: add in acc_t<T> (fp32) "
                      f"and round to T once, at the end (store<T>)"]
        elif ex.name == "ulysses_all_to_all":  # the numbers cannot say where an element went: the probe can
            found = ulysses_layout_diagnosis(source_text, out_dir)
            if found:
                p("  - " + found[0])
            hs = [found[1] if found else LAYOUT_RULE]
        else:
            hs = hints(ex, cfg, diffs, passed, rounding, runs=one(cfg))
        show_hints(hs)
        return False
    n_cfg = len(all_configs)
    what = ("losses, gradient norms, saved model, memory by category, collectives, host<->device traffic"
            + (", prefetch overlap" if ex.stage in PREFETCH_STAGES else "")
            + ("; and your code alone on the probe's crafted inputs" if ex.probe else ""))
    if rounded:
        exact = [c for c in all_configs if not any(c is r for r in rounded)]
        p(f"PASS {ex.name}: the same model as the real {ex.stage}, another rounding order: your arithmetic adds "
          f"the same numbers in another order, so the results agree within {ROUNDING_UNITS} units of roundoff on "
          f"{len(rounded)} of {n_cfg} configurations" + (f" and bit for bit on {'; '.join(c.label for c in exact)}"
                                                       if exact else "")
          + "; memory, collectives and traffic are the real ones everywhere")
    else:
        precisions = ", ".join(dict.fromkeys(c.precision for c in all_configs))
        p(f"PASS {ex.name}: bit for bit the real {ex.stage} on {n_cfg} configurations in {precisions} "
          f"({what}" + (", the order of forwards and backwards" if ex.stage == "pipeline" else "") + ")")
    return True
