#!/usr/bin/env python3
"""Code exercises cut from the real trainers, and the grader that checks them.

    make exercise                 list the exercises, one a line, with their goal
    make exercise E=NAME          write exercises/NAME/<file>: the real file with one region
                                  (between `// begin exercise: NAME` and `// end exercise: NAME`)
                                  replaced by a TODO that states the goal and gives hints
    make check E=NAME [HINT=2]    build exercises/NAME/<file> into its own binary and grade it
                                  (find-the-bug: HINT=2 gives a stronger hint)
    make exercise-key [E=NAME]    for instructors: the answer to a find-the-bug exercise
    make student-pack OUT=DIR     for instructors: the student edition, every region cut
                                  (scripts/exercise_pack.py; docs/exercises.md)
    make grade SUBMISSIONS=DIR [OUT=DIR] [E="NAME ..."] [HINTS=0] [SIGNING_KEY=FILE]
                                  for instructors: DIR/<student-id>/<exercise>.cpp graded on the
                                  public runs and the hidden ones (scripts/exercise_hidden.py); with
                                  the course's key, each student's own hidden runs and a signed record

Because the regions are cut from the files the tests check, an exercise can never drift from the
code. The grader (scripts/exercise_grader.py) is the project's own equality contract (docs/stages.md,
"Exactly the same model"), in every precision the lesson uses: the learner's trainer must train the
same model as the real one, hold the same bytes in every memory category, send the same elements in
the same collectives and move the same bytes between host and device, on several world sizes,
accumulation counts and precisions (fp32, bf16, fp16); stage3's prefetch must overlap. The verdict
names what differs first and gives a hint about the likely mistake; a crash, a hang, a build error
or NaN losses are verdicts too. tests/teaching/exercise_selftest.py (run by `make test`) grades each
reference solution and correct variants (they must pass) and a catalogue of wrong ones (each must
fail, with its hint).

Find-the-bug exercises are whole trainers with one thing broken. Which thing, and the hints, are
kept encoded in scripts/exercise_bugs.dat so that nobody reads an answer by accident; `make
exercise-key` decodes them.
"""
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import exercise_grader as grader  # noqa: E402  (the grader beside this file)

ROOT = grader.ROOT
LEARNER = os.path.join(ROOT, "exercises")     # learners' copies (git-ignored)
BUGS_FILE = os.path.join(ROOT, "scripts", "exercise_bugs.dat")

BEGIN = re.compile(r"^(\s*)// begin exercise: (\S+)\s*$")
END = re.compile(r"^\s*// end exercise: (\S+)\s*$")

PRECISION_TODO = ("It must hold in fp32, bf16 and fp16 (--precision): count in elements of the run's "
                  "type (dt = run.dtype, e = run.elem_bytes bytes each), never in floats.")


class Exercise:
    def __init__(self, name, path, stage, goal, todo, wrong=(), right=(), exact=False, bug=None, probe=None,
                 configs=None):
        self.name = name
        self.path = path        # the real file, relative to the repository
        self.stage = stage      # the trainer the grader runs
        self.goal = goal        # one line
        self.todo = todo        # what to write, and hints (lines of the TODO comment)
        # the catalogue of wrong solutions: [(what the mistake is, kind, the wrong region, a phrase
        # its verdict must contain)]; the wrong region is either its whole text, or a list of
        # (old, new) edits of the real region's text
        self.wrong = wrong
        # correct solutions in other forms: [(what, region, a phrase of the PASS line)]
        self.right = right
        # the lesson is the order of the arithmetic itself: bits, never "another rounding order"
        self.exact = exact
        self.bug = bug          # find-the-bug: the decoded entry of exercise_bugs.dat
        # a program that calls the learner's code directly on crafted inputs, graded before the
        # trainer runs against the same program linked with the real library (exercise_grader.py)
        self.probe = probe
        self.configs = configs  # the trainer runs graded (default: the stage's, exercise_grader.py)

    @property
    def file(self):
        return os.path.basename(self.path)

    @property
    def bug_hints(self):
        return self.bug["hints"] if self.bug else []


BITS = "bit for bit"
ROUNDING = "another rounding order"

EXERCISES = [
    Exercise(
        "stage1_reduce_scatter", "stage1/train.cpp", "stage1",
        "stage1: on the last micro-step, send each unit's gradient to the rank that owns each slice",
        ["The unit's gradient G(u) is complete on this rank (summed over the micro-steps).",
         "Sum it over the ranks so that each rank receives only the slice it owns, my_G(u), then",
         "turn the sum into the mean over ranks and micro-steps.",
         "Hints: comm.reduce_scatter(full, out_shard, shard_elems, dtype); owned(u) elements are",
         "yours; average_grads(dtype, grads, n, run.grad_average_scale()).", PRECISION_TODO],
        wrong=[("forgets to average", "average",
                "comm.reduce_scatter(G(u), my_G(u), owned(u), dt);", "averaged"),
               ("all-reduces the whole unit instead", "collective",
                "comm.all_reduce(G(u), numel(u), dt);\n"
                "average_grads(dt, my_G(u), owned(u), run.grad_average_scale());", "all-reduce"),
               ("receives the sum into slice 0 instead of its own slice", "slice",
                "comm.reduce_scatter(G(u), G(u), owned(u), dt);\n"
                "average_grads(dt, my_G(u), owned(u), run.grad_average_scale());", "slice you own"),
               ("passes DType::F32 to the reduce-scatter", "dtype",
                [("owned(u), dt);", "owned(u), DType::F32);")], "right in fp32, but in bf16"),
               ("averages as DType::F32", "dtype",
                [("average_grads(dt,", "average_grads(DType::F32,")], "right in fp32, but in bf16"),
               ("finds its slice with float pointer arithmetic", "pointer",
                "float* mine = (float*)G(u) + rank * owned(u);\n"
                "comm.reduce_scatter(G(u), mine, owned(u), dt);\n"
                "average_grads(dt, mine, owned(u), run.grad_average_scale());", "in bf16"),
               ("divides by the micro-steps minus one (infinite at --accum 1)", "nan",
                "comm.reduce_scatter(G(u), my_G(u), owned(u), dt);\n"
                "average_grads(dt, my_G(u), owned(u), 1.0f / (L.world * (run.args.accum - 1)));",
                "not a number"),
               ("calls the reduce-scatter on rank 0 only", "hang",
                "if (rank == 0) comm.reduce_scatter(G(u), my_G(u), owned(u), dt);\n"
                "average_grads(dt, my_G(u), owned(u), run.grad_average_scale());", "only some ranks call"),
               ("leaves out the dtype argument", "build",
                [("owned(u), dt);", "owned(u));")], "line ")],
        right=[("averages before the reduce-scatter",
                "average_grads(dt, G(u), numel(u), run.grad_average_scale());\n"
                "comm.reduce_scatter(G(u), my_G(u), owned(u), dt);", ROUNDING),
               ("points at its slice with elem_ptr",
                "void* mine = elem_ptr(grads, L.units[u].offset + L.shard(u, rank).begin, e);\n"
                "comm.reduce_scatter(G(u), mine, owned(u), dt);\n"
                "average_grads(dt, mine, owned(u), run.grad_average_scale());", BITS)]),
    Exercise(
        "stage1_update_and_gather", "stage1/train.cpp", "stage1",
        "stage1: update only the slice I own, then give every rank the updated parameters",
        ["AdamW has moments only for this rank's slice of unit u: update my_P(u) from my_G(u).",
         "Then every rank needs every other rank's updated slice to run the next forward.",
         "Hints: adam.step(u, params_slice, grads_slice, run.lr(), scale, run.adam_step());",
         "comm.all_gather(shard, out_full, shard_elems, dtype); P(u) is the whole unit.", PRECISION_TODO],
        wrong=[("never all-gathers", "collective",
                "adam.step(u, my_P(u), my_G(u), run.lr(), scale, run.adam_step());", "all-gather"),
               ("gathers before the update", "order",
                "comm.all_gather(my_P(u), P(u), owned(u), dt);\n"
                "adam.step(u, my_P(u), my_G(u), run.lr(), scale, run.adam_step());", "update"),
               ("updates slice 0 of the unit with slice 0 of the gradient", "slice",
                "adam.step(u, P(u), G(u), run.lr(), scale, run.adam_step());\n"
                "comm.all_gather(my_P(u), P(u), owned(u), dt);", "update"),
               ("passes DType::F32 to the all-gather", "dtype",
                [("owned(u), dt);", "owned(u), DType::F32);")], "right in fp32, but in bf16"),
               ("finds its slices with float pointer arithmetic", "pointer",
                "float* mine = (float*)P(u) + rank * owned(u);\n"
                "adam.step(u, mine, (float*)G(u) + rank * owned(u), run.lr(), scale, run.adam_step());\n"
                "comm.all_gather(mine, P(u), owned(u), dt);", "in bf16")],
        right=[("starts the all-gather and waits for it",
                "adam.step(u, my_P(u), my_G(u), run.lr(), scale, run.adam_step());\n"
                "CommRequest gather = comm.all_gather_start(my_P(u), P(u), owned(u), dt);\n"
                "comm.wait(gather);", BITS)]),
    Exercise(
        "stage2_reduce_scatter", "stage2/train.cpp", "stage2",
        "stage2: inside the backward, every micro-step, reduce-scatter the unit and keep my slice",
        ["model.backward just wrote unit u's full gradient into the bucket. Reduce-scatter it so",
         "that this rank receives the sum over ranks of the slice it owns, and add that slice,",
         "averaged, into my_G(u): the first micro-step writes, later ones add.",
         "Hints: L.shard(u, rank).begin is where my slice starts in the bucket (elem_ptr(bucket,",
         "index, e)); comm.reduce_scatter(full, out_shard, owned(u), dt); accumulate_grads(dt,",
         "dst, src, n, run.grad_average_scale(), first).", PRECISION_TODO],
        wrong=[("forgets to average", "average",
                [("run.grad_average_scale()", "1.0f")], "averaged"),
               ("overwrites instead of accumulating", "accumulation",
                [("k == 0);", "true);")], "micro-step"),
               ("reduces only on the last micro-step, as stage1 does", "accumulation",
                "if (k == run.args.accum - 1) {\n"
                "  void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);\n"
                "  comm.reduce_scatter(bucket.data(), mine, owned(u), dt);\n"
                "  accumulate_grads(dt, my_G(u), mine, owned(u), run.grad_average_scale(), true);\n"
                "}", "reduce-scatter per unit per micro-step"),
               ("points at the next rank's slice (past the bucket's end on the last rank)", "slice",
                [("L.shard(u, rank).begin", "L.shard(u, rank + 1).begin")], "past the end"),
               ("all-reduces the bucket", "collective",
                "comm.all_reduce(bucket.data(), L.units[u].padded, dt);\n"
                "void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);\n"
                "accumulate_grads(dt, my_G(u), mine, owned(u), run.grad_average_scale(), k == 0);",
                "all-reduce"),
               ("points into the bucket with float pointer arithmetic", "pointer",
                [("void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);",
                  "void* mine = (float*)bucket.data() + L.shard(u, rank).begin;")], "in bf16"),
               ("counts the slice's byte offset in floats", "bytes",
                [("void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);",
                  "void* mine = (char*)bucket.data() + L.shard(u, rank).begin * sizeof(float);")], "in bf16"),
               ("accumulates as DType::F32", "dtype",
                [("accumulate_grads(dt,", "accumulate_grads(DType::F32,")], "right in fp32, but in bf16")],
        right=[("averages the whole bucket before the reduce-scatter",
                "average_grads(dt, bucket.data(), L.units[u].padded, run.grad_average_scale());\n"
                "void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);\n"
                "comm.reduce_scatter(bucket.data(), mine, owned(u), dt);\n"
                "accumulate_grads(dt, my_G(u), mine, owned(u), 1.0f, k == 0);", ROUNDING),
               ("counts the byte offset itself",
                [("void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);",
                  "void* mine = static_cast<char*>(bucket.data()) + L.shard(u, rank).begin * e;")], BITS)]),
    Exercise(
        "stage3_gather_release", "stage3/train.cpp", "stage3",
        "stage3: gather a unit's parameters just before use, and release them right after",
        ["Define the three helpers the training loop calls:",
         "  gather_unit(u) -> const void*: unit u's full parameters, ready to use (all-gathered",
         "      into a fresh Buffer of Category::Gathered, unit.padded * e bytes, unless a prefetch",
         "      already started it: then wait for that one);",
         "  prefetch(u): when run.args.prefetch is set, START unit u's all-gather without waiting;",
         "  release_unit(u): free unit u's gathered buffer (only my slice my_P(u) stays).",
         "Hints: gathered[u] and in_flight[u] are declared above; comm.all_gather_start(shard,",
         "out_full, shard_elems, dt) returns a CommRequest; comm.wait(request); Buffer::release().",
         PRECISION_TODO],
        wrong=[("never releases", "release", [("{ gathered[u].release(); }", "{}")], "release each unit"),
               ("prefetches even with --prefetch 0", "prefetch",
                [("if (run.args.prefetch) gather_start(u);", "gather_start(u);")], "--prefetch 0"),
               ("books the gathered units as parameters", "category",
                [("Category::Gathered", "Category::Params")], "Category::Gathered"),
               ("sizes the gathered buffer in floats", "bytes",
                [("unit.padded * e,", "unit.padded * sizeof(float),")], "twice the bytes"),
               ("passes DType::F32 to the all-gather", "dtype",
                [("owned(u), dt);", "owned(u), DType::F32);")], "right in fp32, but in bf16"),
               ("a prefetch that waits at once", "blocking-prefetch",
                [("if (run.args.prefetch) gather_start(u);",
                  "if (run.args.prefetch) { gather_start(u); comm.wait(in_flight[u]); }")],
                "waited for right after it started"),
               ("waits for a gather that nobody started", "hang",
                [("if (gathered[u].empty()) gather_start(u);", "while (gathered[u].empty()) {}")], "hung")],
        right=[("gathers only when nothing is in flight",
                [("if (gathered[u].empty()) gather_start(u);",
                  "if (!in_flight[u].active() && gathered[u].empty()) gather_start(u);")], BITS)]),
    Exercise(
        "stage3_backward", "stage3/train.cpp", "stage3",
        "stage3: the backward of one unit — gather it again, prefetch the next, release, reduce-scatter",
        ["For unit u of the backward (units in reverse order): get its parameters (the embedding's",
         "backward needs none: pass nullptr), start the next unit's gather early, run",
         "model.backward(u, params, bucket.data()), release the unit, then reduce-scatter the",
         "bucket and add my averaged slice into my_G(u) (the first micro-step writes).",
         "Hints: gather_unit(u), prefetch_after_backward(u) (the next unit of the backward),",
         "release_unit(u), comm.reduce_scatter, accumulate_grads(..., run.grad_average_scale(), k == 0).",
         PRECISION_TODO],
        wrong=[("gathers the embedding for its backward", "collective",
                [("u == EMBED ? nullptr : gather_unit(u)", "gather_unit(u)")], "all-gathers"),
               ("never releases", "release", [("release_unit(u);", "")], "release each unit"),
               ("forgets to average", "average", [("run.grad_average_scale()", "1.0f")], "averaged"),
               ("releases the unit one statement early", "release",
                [("model.backward(u, p, bucket.data());\nrelease_unit(u);",
                  "release_unit(u);\nmodel.backward(u, p, bucket.data());\n")], "released before this use"),
               ("a prefetch that waits at once", "blocking-prefetch",
                [("prefetch_after_backward(u);",
                  "if (u - 1 > EMBED) { prefetch(u - 1); comm.wait(in_flight[u - 1]); }")],
                "waited for right after it started"),
               ("prefetches after the unit's backward", "blocking-prefetch",
                [("prefetch_after_backward(u);", ""),
                 ("model.backward(u, p, bucket.data());",
                  "model.backward(u, p, bucket.data());\nprefetch_after_backward(u);")],
                "started only after"),
               ("points into the bucket with float pointer arithmetic", "pointer",
                [("void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);",
                  "void* mine = (float*)bucket.data() + L.shard(u, rank).begin;")], "in bf16"),
               ("passes DType::F32 to the reduce-scatter", "dtype",
                [("owned(u), dt);", "owned(u), DType::F32);")], "right in fp32, but in bf16"),
               ("passes no parameters to any unit's backward", "crash",
                [("u == EMBED ? nullptr : gather_unit(u)", "nullptr")], "SIGSEGV")],
        right=[("prefetches before gathering its own unit",
                [("const void* p = u == EMBED ? nullptr : gather_unit(u);\nprefetch_after_backward(u);",
                  "prefetch_after_backward(u);\nconst void* p = u == EMBED ? nullptr : gather_unit(u);")],
                BITS)]),
    Exercise(
        "zeropp_qgz_reduce", "zeropp/train.cpp", "zeropp",
        "zeropp: the gradient reduce-scatter as an all-to-all of int4 blocks, dequantized before the sum",
        ["bucket holds this rank's gradient of unit u: N slices of n = owned(u) elements. Quantize",
         "each slice to int4 blocks + scales (qg, kernels/quantize.h), my own slice too; exchange them",
         "so that I receive every rank's blocks of MY slice; dequantize every rank's blocks to fp32",
         "and add them in rank order 0, 1, ..., N-1; store the sum in `mine` (storage type).",
         "Hints: quantize_packed(qg, dt, slice, n, out) into qg_all (qg.packed_bytes(n) bytes per",
         "rank); comm.all_to_all_packed(buf, bytes_each, n); dequantize_packed(qg, in, n,",
         "DType::F32, out) into qg_sum / qg_part; from_f32(dt, sum, n, mine).", PRECISION_TODO],
        wrong=[("keeps the running sum in int4 (dequantizes after the sum)", "quantized-sum",
                [("if (r > 0) for (size_t i = 0; i < n; i++) sum[i] += part[i];",
                  "if (r > 0) { for (size_t i = 0; i < n; i++) sum[i] += part[i];"
                  " quantize_packed(qg, DType::F32, sum, n, slot); dequantize_packed(qg, slot, n, DType::F32, sum); }")],
                "the sum itself is never quantized"),
               ("adds its own slice unquantized", "own-slice",
                [("dequantize_packed(qg, slot + r * wire, n, DType::F32, r == 0 ? sum : part);",
                  "if (r == rank) to_f32(dt, elem_ptr(bucket, r * n, e), n, r == 0 ? sum : part); "
                  "else dequantize_packed(qg, slot + r * wire, n, DType::F32, r == 0 ? sum : part);")],
                "my own included"),
               ("quantizes each slice with one scale", "per-slice-scale",
                [("const size_t n = owned(u), wire = qg.packed_bytes(n);",
                  "const size_t n = owned(u);\nconst BlockQuant one{4, n};  // one scale per slice\n"
                  "const size_t wire = one.packed_bytes(n);"),
                 ("quantize_packed(qg, dt,", "quantize_packed(one, dt,"),
                 ("dequantize_packed(qg, slot", "dequantize_packed(one, slot")],
                "one fp32 scale per qg.block"),
               ("adds in reverse rank order", "order",
                [("for (int r = 0; r < L.world; r++) {     // dequantize",
                  "for (int r = L.world - 1; r >= 0; r--) {     // dequantize"),
                 ("r == 0 ? sum : part", "r == L.world - 1 ? sum : part"),
                 ("if (r > 0) for", "if (r < L.world - 1) for")],
                "added in another order"),
               ("averages the sum, which the trainer averages again after it", "average",
                [("from_f32(dt, sum, n, mine);", "from_f32(dt, sum, n, mine);\n"
                  "average_grads(dt, mine, n, run.grad_average_scale());")],
                "averaged twice")],
        exact=True),
    Exercise(
        "zeropp_block_quantizer", "common/kernels/quantize.cpp", "zeropp",
        "the block quantizer of ZeRO++: one fp32 scale per block, codes rounded to nearest even, clamped",
        [["Part 1: the two rules (written out in full in kernels/quantize.h).",
          "block_scale(x, n, qmax) -> float, the scale of one block of n values of T (read each as",
          "fp32 with load(x[i])): absmax = max |x_i|; scale = absmax / qmax, one fp32 division; if",
          "qmax * scale would overflow (absmax within an ulp of FLT_MAX) the next float below it",
          "(std::nextafter(scale, 0.0f)); NaN if the block holds a NaN or an infinity (std::isfinite).",
          "code_of(x, scale, qmax) -> int: x / scale (one fp32 division) rounded to the nearest",
          "integer, ties to the even one, clamped to [-qmax, qmax]; 0 when the scale is 0 or NaN.",
          "Why pinned to the bit: every rank, and a GPU kernel of the same rule, must turn the same values into",
          "the same codes, or ZeRO++ is no longer held to its reference."],
         ["Part 2: the body of quantize_blocks. Cut x[0..n) into q.blocks(n) blocks of q.block values",
          "counted from x[0] (the last may be shorter); for each block write its scale to scales[b]",
          "and each value's code with put_code(codes, q.bits, i, code); return how many blocks got",
          "a NaN scale (quantize_finite stops a run on them). q.qmax() is 2^(bits-1) - 1.",
          "Graded: your quantizer on crafted blocks against the real one (ties, zeros, the largest",
          "float, NaN), then the real zeropp trainer built with it (--qwz --qgz, bf16 and fp16)."]],
        exact=True, probe="scripts/exercise_quantizer_probe.cpp",
        wrong=[("one scale for the whole slice instead of one per block", "per-tensor-scale",
                [("block_scale(x + begin, end - begin, qmax)", "block_scale(x, n, qmax)")], "one scale per block"),
               ("rounds toward zero (a cast to int truncates)", "truncation",
                [("const float r = std::nearbyint(x / scale);", "const float r = float(int(x / scale));")],
                "toward zero"),
               ("rounds ties away from zero (std::round)", "ties",
                [("const float r = std::nearbyint(x / scale);", "const float r = std::round(x / scale);")],
                "ties go to the even"),
               ("multiplies by the reciprocal of the scale", "ties",
                [("const float r = std::nearbyint(x / scale);", "const float r = std::nearbyint(x * (1.0f / scale));")],
                "rounds twice"),
               ("takes the largest value, not the largest magnitude", "absmax",
                [("std::fmax(absmax, std::fabs(v))", "std::fmax(absmax, v)")], "may be a negative value"),
               ("divides by 2^(bits-1), as for codes down to -128", "range",
                [("float scale = absmax / float(qmax);", "float scale = absmax / float(qmax + 1);")], "symmetric"),
               ("never clamps", "clamp",
                [("return int(std::fmin(float(qmax), std::fmax(-float(qmax), r)));", "return int(r);")], "wraps around"),
               ("keeps a scale whose largest code overflows", "overflow",
                [("if (float(qmax) * scale > FLT_MAX) scale = std::nextafter(scale, 0.0f);\n", "")],
                "largest float"),
               ("gives a block holding a NaN a finite scale", "not-finite",
                [("if (!std::isfinite(v)) return NAN;\n", "")], "std::isfinite")],
        right=[("rounds with std::rint and clamps an int",
                [("const float r = std::nearbyint(x / scale);  // the default rounding mode: ties to even\n"
                  "return int(std::fmin(float(qmax), std::fmax(-float(qmax), r)));",
                  "return std::clamp(int(std::rint(x / scale)), -qmax, qmax);")], BITS)],
        configs=grader.ZEROPP_QUANTIZER_CONFIGS),
    Exercise(
        "offload_optimizer", "offload/train.cpp", "offload",
        "offload: run AdamW on the host for my slice, then send the updated slice up",
        ["My gradient slice my_G(u) is in host memory. Run the host AdamW on it, writing my",
         "updated parameters (storage type) into outbox(u), then copy them up into my slice of",
         "the device's parameters, my_P(u) (the all-gather that follows sends them to the others).",
         "Hints: adam.step(u, grads_slice, params_out, run.lr(), scale, run.adam_step());",
         "to_device(dst, src, elems). The host computes on host memory only.", PRECISION_TODO],
        wrong=[("never copies the update up", "link",
                "adam.step(u, my_G(u), outbox(u), run.lr(), scale, run.adam_step());", "up to the device"),
               ("copies the update to slice 0 of the unit", "slice",
                "adam.step(u, my_G(u), outbox(u), run.lr(), scale, run.adam_step());\n"
                "to_device(P(u), outbox(u), owned(u));", "update"),
               ("ignores the clipping scale", "scale",
                "adam.step(u, my_G(u), outbox(u), run.lr(), 1.0f, run.adam_step());\n"
                "to_device(my_P(u), outbox(u), owned(u));", "update"),
               ("the host AdamW writes into the device's parameters (a copy still counted)", "placement",
                "adam.step(u, my_G(u), my_P(u), run.lr(), scale, run.adam_step());\n"
                "to_device(outbox(u), my_P(u), owned(u));", "in device memory; expected host memory"),
               ("copies in the wrong direction", "placement",
                "adam.step(u, my_G(u), outbox(u), run.lr(), scale, run.adam_step());\n"
                "to_device(outbox(u), my_P(u), owned(u));", "expected device memory"),
               ("copies bytes where to_device takes elements", "bytes",
                [("to_device(my_P(u), outbox(u), owned(u));", "to_device(my_P(u), outbox(u), owned(u) * e);")],
                "past its end")],
        right=[("copies and counts the copy itself",
                "adam.step(u, my_G(u), outbox(u), run.lr(), scale, run.adam_step());\n"
                "copy_bytes_async(my_P(u), Location::Device, outbox(u), Location::Host, owned(u) * e);\n"
                "comm.count_to_device(owned(u), owned(u) * e);", BITS)]),
    Exercise(
        "infinity_fetch_write_back", "infinity/train.cpp", "infinity",
        "infinity: bring my slice up just before its all-gather, and store the updated slice after AdamW",
        [["Part 1, in gather_start(u): my slice of unit u lives off the device (host memory, or a",
          "file with --offload-param disk). Copy it up into its place in the fresh gathered buffer,",
          "`mine`, then start the all-gather that sends it to the other ranks and brings theirs.",
          "Hints: params.fetch(u) -> my stored slice in host memory; to_device(dst, src, elems)",
          "copies up and counts the link; comm.all_gather_start(shard, out_full, shard_elems, dt)",
          "returns the CommRequest to keep in in_flight[u].", PRECISION_TODO],
         ["Part 2, the optimizer: the host AdamW updates my slice of unit u from my gradient slice",
          "my_G(u), writing the new parameters (storage type) into outbox(u); then store them where",
          "my slices live, so that the next step's fetch brings the updated slice up.",
          "Hints: adam.step(u, grads_slice, params_out, run.lr(), scale, run.adam_step());",
          "params.write_back(u, slice)."]],
        wrong=[("fetches after the all-gather started", "order",
                [("to_device(mine, params.fetch(u), owned(u));  // infinity: my slice up, just before the gather\nin_flight[u] = comm.all_gather_start(mine, gathered[u].data(), owned(u), dt);", "in_flight[u] = comm.all_gather_start(mine, gathered[u].data(), owned(u), dt);\nto_device(mine, params.fetch(u), owned(u));  // infinity: my slice up, just before the gather")], "before the all-gather starts"),
               ("never fetches: the all-gather sends whatever the fresh buffer holds", "fetch",
                [("to_device(mine, params.fetch(u), owned(u));  // infinity: my slice up, just before the gather\n", "")], "params.fetch(u)"),
               ("copies my slice up but never starts the all-gather", "collective",
                [("\nin_flight[u] = comm.all_gather_start(mine, gathered[u].data(), owned(u), dt);", "")],
                "all-gathers where the real infinity makes"),
               ("fetches the slice of the unit before", "unit",
                [("params.fetch(u)", "params.fetch(u > 0 ? u - 1 : u)")], "params.fetch(u)"),
               ("copies bytes where to_device takes elements", "bytes",
                [("params.fetch(u), owned(u));", "params.fetch(u), owned(u) * e);")], "past its end"),
               ("passes DType::F32 to the all-gather", "dtype",
                [("owned(u), dt);", "owned(u), DType::F32);")], "right in fp32, but in bf16"),
               ("a prefetch that waits at once", "blocking-prefetch",
                [("in_flight[u] = comm.all_gather_start(mine, gathered[u].data(), owned(u), dt);",
                  "in_flight[u] = comm.all_gather_start(mine, gathered[u].data(), owned(u), dt);\n"
                  "comm.wait(in_flight[u]);")],
                "waited for right after it started"),
               ("AdamW without the fp16 loss scale (graded in fp16)", "loss-scale",
                [("run.lr(), scale, run.adam_step());", "run.lr(), clip_scale(norm, run.args.clip), run.adam_step());")],
                "loss scale"),
               ("AdamW without the clipping scale", "adamw",
                [("run.lr(), scale, run.adam_step());", "run.lr(), 1.0f, run.adam_step());")],
                "the AdamW call"),
               ("writes back before the update (stores the gradient)", "order",
                [("adam.step(u, my_G(u), outbox(u), run.lr(), scale, run.adam_step());\nparams.write_back(u, outbox(u));", "params.write_back(u, outbox(u));\nadam.step(u, my_G(u), outbox(u), run.lr(), scale, run.adam_step());")], "after adam.step"),
               ("never writes back: every step fetches the first parameters", "write-back",
                [("\nparams.write_back(u, outbox(u));", "")], "never change"),
               ("copies the update into the fetched slice instead of writing it back", "tier",
                [("params.write_back(u, outbox(u));", "std::memcpy(const_cast<void*>(params.fetch(u)), outbox(u), owned(u) * e);")],
                "only write_back stores")],
        right=[("copies up and counts the copy itself",
                [("to_device(mine, params.fetch(u), owned(u));  // infinity: my slice up, just before the gather",
                  "copy_bytes_async(mine, Location::Device, params.fetch(u), Location::Host, owned(u) * e);\n"
                  "copy_wait();\ncomm.count_to_device(owned(u), owned(u) * e);")], BITS),
               ("writes back from my_G(u), where outbox(u) points",
                [("params.write_back(u, outbox(u));", "params.write_back(u, my_G(u));")], BITS)]),
    Exercise(
        "comm_rank_ordered_sum", "common/comm.cpp", "stage2",
        "the collective layer: add the N ranks' contributions to my slice, in rank order",
        ["After the all-to-all, slice r of `full` (elements [r * shard, (r + 1) * shard)) holds",
         "rank r's contribution to my slice. Write out[i] = c_0[i] + c_1[i] + ... + c_{N-1}[i],",
         "added left to right in acc_t<T> (fp32 for bf16 data), stored once with store<T>.",
         "Why the order matters: floating-point addition is not associative, and every stage",
         "must get the same bits as stage0_ddp. Hints: load(x) reads an element as acc_t<T>.",
         "T is float, bf16 or f16: the same code must serve each."],
        exact=True,
        wrong=[("adds in reverse rank order", "sum-order",
                "acc_t<T> acc = load(full[size_t(n_ranks - 1) * shard + i]);\n"
                "for (int r = n_ranks - 2; r >= 0; r--) acc += load(full[size_t(r) * shard + i]);\n"
                "out[i] = store<T>(acc);", "rank order"),
               ("starts the sum from the last rank's element", "sum-order",
                "acc_t<T> acc = load(full[size_t(n_ranks - 1) * shard + i]);\n"
                "for (int r = 0; r < n_ranks - 1; r++) acc += load(full[size_t(r) * shard + i]);\n"
                "out[i] = store<T>(acc);", "rank order"),
               ("keeps the running sum in the storage type", "sum-order",
                "T acc = full[i];\n"
                "for (int r = 1; r < n_ranks; r++) acc = store<T>(load(acc) + load(full[size_t(r) * shard + i]));\n"
                "out[i] = acc;", "round to T once"),
               ("keeps only rank 0's contribution", "sum",
                "out[i] = full[i];", "sum of all N ranks"),
               ("strides by one element instead of one slice", "slice",
                "acc_t<T> acc = load(full[i]);\n"
                "for (int r = 1; r < n_ranks; r++) acc += load(full[size_t(r) + i]);\n"
                "out[i] = store<T>(acc);", "sum of all N ranks"),
               ("finds the slices with float pointer arithmetic", "pointer",
                "const float* base = (const float*)full;\n"
                "acc_t<T> acc = load(full[i]);\n"
                "for (int r = 1; r < n_ranks; r++) acc += load(((const T*)(base + size_t(r) * shard))[i]);\n"
                "out[i] = store<T>(acc);", "in bf16"),
               ("writes each sum one slice further on", "overrun",
                "acc_t<T> acc = load(full[i]);\n"
                "for (int r = 1; r < n_ranks; r++) acc += load(full[size_t(r) * shard + i]);\n"
                "out[shard + i] = store<T>(acc);", "crashed")],
        right=[("starts from zero and adds every rank",
                "acc_t<T> acc = 0;\n"
                "for (int r = 0; r < n_ranks; r++) acc += load(full[size_t(r) * shard + i]);\n"
                "out[i] = store<T>(acc);", BITS)]),
    Exercise(
        "pipeline_1f1b", "pipeline/pipeline.cpp", "pipeline",
        "the pipeline: the order of forwards and backwards of 1F1B on segment s of P, for K micro-batches",
        ["Append to `ops` the 1F1B order for segment s (0-based) of P segments and K micro-batches",
         "(a segment: DeepSpeed's and Megatron's pipeline stage):",
         "{true, k} is the forward of micro-batch k, {false, k} its backward. First a warm-up of",
         "forwards (how many must segment s run before its first backward can arrive from segment s+1?),",
         "then one forward, one backward, then the remaining backwards. At most min(P - s, K)",
         "micro-batches may be in flight (forward run, backward not yet): the model has only that many",
         "activation slots. Every backward in ascending micro-batch order, as stage0_ddp adds them.",
         "Hint: the last segment (s = P - 1) runs F 0, B 0, F 1, B 1, ...; segment 0 of 4 starts F 0 F 1 F 2."],
        exact=True,
        wrong=[("warm-up one forward too short", "schedule",
                [("const int warmup = std::min(P - s - 1, K);", "const int warmup = std::max(0, std::min(P - s - 2, K));")],
                "warm-up"),
               ("warm-up one forward too long", "schedule",
                [("const int warmup = std::min(P - s - 1, K);", "const int warmup = std::min(P - s, K);")],
                "warm-up"),
               ("the cool-down's backwards in reverse order", "schedule",
                [("for (int k = K - warmup; k < K; k++) ops.push_back({false, k});",
                  "for (int k = K - 1; k >= K - warmup; k--) ops.push_back({false, k});")],
                "ascending"),
               ("the warm-up not capped at K (graded with K < P - 1)", "schedule-k",
                [("const int warmup = std::min(P - s - 1, K);", "const int warmup = P - s - 1;")],
                "at most K"),
               ("the steady state stops one micro-batch early", "schedule",
                [("for (int k = warmup; k < K; k++) {", "for (int k = warmup; k < K - 1; k++) {")],
                "its forward once and its backward once"),
               ("the cool-down starts one early on every segment but the last (waits for a gradient never sent)",
                "hang",
                [("for (int k = K - warmup; k < K; k++) ops.push_back({false, k});",
                  "for (int k = K - warmup - (s < P - 1); k < K; k++) ops.push_back({false, k});")],
                "its neighbour never sends"),
               ("GPipe's order (every forward first) under 1F1B's memory limit", "schedule",
                "for (int k = 0; k < K; k++) ops.push_back({true, k});\n"
                "for (int k = 0; k < K; k++) ops.push_back({false, k});", "GPipe")],
        right=[("the warm-up and the steady state in one loop",
                "const int warmup = std::min(P - s - 1, K);\n"
                "for (int k = 0; k < K + warmup; k++) {\n"
                "  if (k < K) ops.push_back({true, k});\n"
                "  if (k >= warmup) ops.push_back({false, k - warmup});\n"
                "}", BITS)]),
    # begin tensor_vocab_loss
    Exercise(
        "tensor_vocab_loss", "tensor/tp_model.cpp", "tensor",
        "tensor: the cross-entropy over the vocabulary's T pieces: the global max, the sum of exponentials, "
        "the target's logit",
        ["No rank holds a whole row of logits: `logits` holds my Vl columns of each of the BT rows",
         "(columns [lo, lo + Vl) of the vocabulary, the run's type X: read one with load(z[j])); only",
         "the first `mine` of them are real, the rest pad V to a multiple of T and take part in nothing.",
         "For every row i < BT, with the T ranks' columns together, fill the fp32 buffers:",
         "  row_max[i] = M, the row's largest logit over all T ranks (maxes has room for T * a.R floats);",
         "  sums[i]    = the sum of exp(z_j - M) over the row's real logits, on every rank;",
         "  target[i]  = the logit of column targets_[i], which one rank holds, on every rank.",
         "The code after the region takes loss = log(sums) + M - target, and the probabilities.",
         "Hints: tp_ is my T ranks' communicator. tp_.all_gather(mine, all, n, DType::F32) puts rank r's",
         "n floats at all + r * n; tp_.all_reduce(buf, n, DType::F32) sums them in rank order. The",
         "exchanges carry a.R floats each (BT rounded up to a multiple of T). There is no max-reduce;",
         "a max starts from float m = -INFINITY."],
        wrong=[("takes each rank's own max (no all-gather)", "local-max",
                [("tp_.all_gather(row_max, maxes, a.R, DType::F32);  // every rank's maxima\n"
                  "for (int i = 0; i < BT; i++) {\nfloat m = -INFINITY;\n"
                  "for (int r = 0; r < T_; r++) m = std::max(m, maxes[size_t(r) * a.R + i]);  // the global max M\n"
                  "row_max[i] = m;\n}", "")], "All-gather the maxima"),
               ("all-reduces the maxima (a sum, not a max)", "collective",
                [("tp_.all_gather(row_max, maxes, a.R, DType::F32);  // every rank's maxima\n"
                  "for (int i = 0; i < BT; i++) {\nfloat m = -INFINITY;\n"
                  "for (int r = 0; r < T_; r++) m = std::max(m, maxes[size_t(r) * a.R + i]);  // the global max M\n"
                  "row_max[i] = m;\n}", "tp_.all_reduce(row_max, a.R, DType::F32);")], "no max"),
               ("never all-reduces the sums of exponentials", "sum",
                [("tp_.all_reduce(sums, a.R, DType::F32);    // S\n", "")], "sum of exponentials"),
               ("never all-reduces the target's logit", "target",
                [("tp_.all_reduce(target, a.R, DType::F32);  // z_target", "")], "target's logit"),
               ("counts the padding columns (loops to Vl, not mine)", "padding",
                [("for (int j = 0; j < mine; j++) row_max[i]", "for (int j = 0; j < Vl; j++) row_max[i]"),
                 ("for (int j = 0; j < mine; j++) sums[i]", "for (int j = 0; j < Vl; j++) sums[i]")], "padding"),
               ("all-reduces the sums in the run's type", "dtype",
                [("tp_.all_reduce(sums, a.R, DType::F32);", "tp_.all_reduce(sums, a.R, dt_);")], "DType::F32"),
               ("only tensor rank 0 all-reduces the target's logits", "hang",
                [("tp_.all_reduce(target, a.R, DType::F32);", "if (t_ == 0) tp_.all_reduce(target, a.R, DType::F32);")],
                "only some ranks call")],
        right=[("starts each row's max from rank 0's",
                [("float m = -INFINITY;\nfor (int r = 0; r < T_; r++)", "float m = maxes[i];\nfor (int r = 1; r < T_; r++)")],
                BITS),
               ("writes the target with a conditional expression",
                [("if (tj >= 0 && tj < mine) target[i] = load(z[tj]);",
                  "target[i] = tj >= 0 && tj < mine ? float(load(z[tj])) : 0.0f;")], BITS)]),
    # end tensor_vocab_loss
    Exercise(
        "muon_boundary_gather", "common/muon.cpp", "stage2",
        "Muon under ZeRO: gather the parts of a matrix my slice's boundary cuts, then update only my part",
        [["Newton-Schulz needs the WHOLE matrix, and ZeRO's slices cut matrices anywhere. Ranks",
          "first..last own parts of matrix ts (rows x cols, row-major in X); this rank (me) owns elements",
          "[at, at + len) of it, and X + at already holds its part of X = G + mu B (its own gradient",
          "and momentum: X is per element). part(q) is rank q's part: {offset in the matrix, count}.",
          "Make X whole on this rank: send my part to every other owner, and receive every other",
          "owner's part into its place, point to point, fp32, with this matrix's `tag`.",
          "Hints: comm_->send_start(ptr, n, DType::F32, to, tag) returns a CommRequest: keep it in",
          "`sends` and comm_->wait it before Newton-Schulz overwrites X; comm_->recv(ptr, n, DType::F32,",
          "from, tag). Only the owners get here: a collective over every rank would wait forever."],
         ["X now holds O = NewtonSchulz5(X) of the whole matrix. Update my part of W only, elements",
          "[i, i + len) of my slice (p32 + i), from my part of O (X + at): first W *= 1 - lr wd",
          "where ts.decay, then W -= lr 0.2 sqrt(max(rows, cols)) O (Moonlight's RMS match). Every",
          "element has one owner: it is updated once. The momentum stays my slice's only (m_).",
          "Hint: ops::accumulate<float>(dst, src, n, scale, overwrite): dst = scale src, or += it;",
          "cfg_.weight_decay."]],
        exact=True, configs=grader.MUON_CONFIGS,
        wrong=[("runs Newton-Schulz on its own part only (nothing exchanged)", "exchange",
                "// (nothing: Newton-Schulz sees my part of X only)\n\n// ---- next part ----\n"
                "if (ts.decay) ops::accumulate<float>(p32 + i, p32 + i, len, 1.0f - lr * cfg_.weight_decay, true);\n"
                "const float rms_match = 0.2f * std::sqrt(float(std::max(rows, cols)));\n"
                "ops::accumulate<float>(p32 + i, X + at, len, -lr * rms_match, false);", "whole matrix"),
               ("applies its part of the update twice, as two owners updating the same elements would", "update",
                [("ops::accumulate<float>(p32 + i, X + at, len, -lr * rms_match, false);",
                  "ops::accumulate<float>(p32 + i, X + at, len, -lr * rms_match, false);\n"
                  "ops::accumulate<float>(p32 + i, X + at, len, -lr * rms_match, false);  // (and the other owner's)")],
                "updated once"),
               ("keeps the momentum of the whole matrix on every owner", "memory",
                [("sends.clear();", "sends.clear();\n"
                  "static Buffer* whole[1024] = {};  // (the momentum of each whole matrix I own part of)\n"
                  "if (!whole[tag - 7000]) whole[tag - 7000] = new Buffer(Category::AdamM, Location::Device, "
                  "ts.numel * sizeof(float), \"momentum (whole matrix)\");")], "momentum"),
               ("receives every owner's part at the start of the matrix", "placement",
                [("comm_->recv(X + part(q).first,", "comm_->recv(X,")], "its own place")],
        right=[("receives first, each send started before",
                "std::vector<CommRequest> mine;\n"
                "for (int q = first; q <= last; q++)\n"
                "  if (q != me) mine.push_back(comm_->send_start(X + at, len, DType::F32, q, tag));\n"
                "for (int q = first; q <= last; q++) {\n"
                "  if (q == me) continue;\n"
                "  const auto [offset, count] = part(q);\n"
                "  comm_->recv(X + offset, count, DType::F32, q, tag);\n"
                "}\n"
                "for (CommRequest& r : mine) comm_->wait(r);\n\n// ---- next part ----\n"
                "if (ts.decay) ops::accumulate<float>(p32 + i, p32 + i, len, 1.0f - lr * cfg_.weight_decay, true);\n"
                "ops::accumulate<float>(p32 + i, X + at, len, -lr * (0.2f * std::sqrt(float(std::max(rows, cols)))), "
                "false);", BITS)]),
    # ---- ulysses_all_to_all (ulysses/train.cpp): the all-to-all's index mapping, both ways ----
    Exercise(
        "ulysses_all_to_all", "ulysses/train.cpp", "ulysses",
        "ulysses: the all-to-alls that turn my tokens with every head into every token of my heads, and back",
        ["Define the two lambdas a block calls around attention (the layout is in the comment above):",
         "  tokens_to_heads(tokens, heads, parts): `tokens` is (B, T/S, parts x C), my T/S tokens with",
         "      every head; write `heads`, (B, T, parts x C/S): all T tokens of my NH/S heads (head group s,",
         "      my slice). Fill slot j of `exchange` with what rank j gets: my tokens' columns of head",
         "      group j, [p C + j C/S, p C + (j + 1) C/S) of each part p; exchange; then slot j holds",
         "      rank j's tokens of my heads: they go to rows j T/S .. (j + 1) T/S - 1 of each sequence.",
         "  heads_to_tokens(heads, tokens, parts): the inverse, (B, T, parts x C/S) back to (B, T/S, parts x C).",
         "Hints: B = model.rows() sequences; C, S, T and Tl = T/S are defined above; exchange.data() holds",
         "B T/S tokens of 3C elements; group.all_to_all(buf, elems_each, dt) sends slot j (elems_each",
         "elements at j * elems_each) to rank j of my sequence group and receives its slot for me there,",
         "in place. memcpy counts bytes: e = run.elem_bytes each.", PRECISION_TODO],
        wrong=[("heads and tokens swapped: slot j gets a contiguous 1/S of my tokens with every head", "layout",
                [("tok + ((size_t(b) * Tl + t) * parts * C + p * C + j * Ch) * e, Ch * e);",
                  "tok + (size_t(b) * Tl * parts * C + j * Tl * row / e + (size_t(t) * parts + p) * Ch) * e, Ch * e);"),
                 ("memcpy(tok + ((size_t(b) * Tl + t) * parts * C + p * C + j * Ch) * e,",
                  "memcpy(tok + (size_t(b) * Tl * parts * C + j * Tl * row / e + (size_t(t) * parts + p) * Ch) * e,")],
                "split by heads, not by tokens"),
               ("rank j's tokens not offset by j T/S (every slot to the first T/S rows)", "offset",
                [("memcpy(out + (size_t(b) * T + size_t(j) * Tl) * row,", "memcpy(out + size_t(b) * T * row,"),
                 ("in + (size_t(b) * T + size_t(j) * Tl) * row,", "in + size_t(b) * T * row,")],
                "the slice offset j T/S"),
               ("the inverse packs and unpacks in the forward's layout", "inverse",
                [("memcpy(x + j * slot + size_t(b) * Tl * row, in + (size_t(b) * T + size_t(j) * Tl) * row,\n"
                  "Tl * row);",
                  "for (int t = 0; t < Tl; t++)\nfor (int p = 0; p < parts; p++)\n"
                  "memcpy(x + j * slot + (size_t(b) * Tl + t) * row + p * Ch * e,\n"
                  "in + ((size_t(b) * Tl + t) * parts * C + p * C + j * Ch) * e, Ch * e);"),
                 ("for (int t = 0; t < Tl; t++)\nfor (int p = 0; p < parts; p++)\n"
                  "memcpy(tok + ((size_t(b) * Tl + t) * parts * C + p * C + j * Ch) * e,\n"
                  "x + j * slot + (size_t(b) * Tl + t) * row + p * Ch * e, Ch * e);",
                  "memcpy(tok + (size_t(b) * T + size_t(j) * Tl) * row, x + j * slot + size_t(b) * Tl * row,\n"
                  "Tl * row);")],
                "undo tokens_to_heads"),
               ("sizes a row in floats", "bytes",
                [("const size_t row = size_t(parts) * Ch * e, slot = size_t(B) * Tl * row;\n"
                  "const char* tok = static_cast<const char*>(tokens);",
                  "const size_t row = size_t(parts) * Ch * sizeof(float), slot = size_t(B) * Tl * row;\n"
                  "const char* tok = static_cast<const char*>(tokens);")], "in bf16")],
        right=[("moves the received slots token by token",
                [("memcpy(out + (size_t(b) * T + size_t(j) * Tl) * row, x + j * slot + size_t(b) * Tl * row,\n"
                  "Tl * row);",
                  "for (int t = 0; t < Tl; t++)\n"
                  "memcpy(out + (size_t(b) * T + size_t(j) * Tl + t) * row, x + j * slot + (size_t(b) * Tl + t) * row, row);")],
                BITS)],
        exact=True, configs=grader.ULYSSES_CONFIGS),
]


# ---- find the bug: whole trainers with one thing broken, kept encoded (exercise_bugs.dat) ----

def decode_bugs(path=BUGS_FILE):
    with open(path) as f:
        return json.loads(zlib.decompress(base64.b64decode("".join(f.read().split()))).decode())


def encode_bugs(entries):
    blob = base64.b64encode(zlib.compress(json.dumps(entries, indent=1).encode(), 9)).decode()
    return "\n".join(blob[i:i + 100] for i in range(0, len(blob), 100)) + "\n"


for _b in (decode_bugs() if os.path.exists(BUGS_FILE) else []):  # (not in the student edition)
    EXERCISES.append(Exercise(_b["name"], _b["path"], _b["stage"], _b["goal"], [], bug=_b))
# The student edition (scripts/exercise_pack.py) hands out the exercises reference/exercises.txt names.
_HANDED_OUT = os.path.join(ROOT, "reference", "exercises.txt")
if os.path.exists(_HANDED_OUT):
    with open(_HANDED_OUT) as _f:
        _names = set(_f.read().split())
    EXERCISES = [e for e in EXERCISES if e.name in _names]
BY_NAME = {e.name: e for e in EXERCISES}


def die(msg, code=2):
    print(msg, file=sys.stderr)
    sys.exit(code)


def find(name):
    if not name:
        die("which exercise? `make exercise` lists them; then `make exercise E=NAME`")
    if name not in BY_NAME:
        die(f"unknown exercise {name!r}; `make exercise` lists the {len(EXERCISES)} exercises")
    return BY_NAME[name]


# ---- cutting ----

# An exercise may have several parts: regions of one file with the same name (infinity's fetch
# before the gather and its write-back after the update). A solution is then the parts' texts in
# file order, separated by this line.
PART = "// ---- next part ----"


def regions(lines, name):
    """[(first, last)] line indices of the markers of exercise `name` (inclusive), in file order."""
    begin = [i for i, l in enumerate(lines) if BEGIN.match(l) and BEGIN.match(l).group(2) == name]
    end = [i for i, l in enumerate(lines) if END.match(l) and END.match(l).group(1) == name]
    if not begin or len(begin) != len(end) or any(
            not a < b or (k + 1 < len(begin) and b > begin[k + 1]) for k, (a, b) in enumerate(zip(begin, end))):
        die(f"internal: exercise {name}: expected each `// begin exercise: {name}` followed by its end marker")
    return list(zip(begin, end))


def split_parts(body_lines):
    parts = [[]]
    for l in body_lines:
        if l.strip() == PART:
            parts.append([])
        else:
            parts[-1].append(l)
    return parts


def with_region(text, name, body_lines, indent=None):
    """The file with the regions' content replaced by body_lines (PART lines between the parts;
    markers kept)."""
    lines = text.split("\n")
    spans, parts = regions(lines, name), split_parts(body_lines)
    if len(parts) != len(spans):
        die(f"internal: exercise {name}: {len(parts)} parts given for its {len(spans)} regions")
    for (a, b), part in reversed(list(zip(spans, parts))):
        ind = BEGIN.match(lines[a]).group(1) if indent is None else indent
        lines = lines[:a + 1] + [ind + l if l else l for l in part] + lines[b:]
    return "\n".join(lines)


def region_body(text, name):
    """The regions' lines, stripped of their indentation (PART lines between the parts)."""
    lines = text.split("\n")
    out = []
    for k, (a, b) in enumerate(regions(lines, name)):
        out += ([PART] if k else []) + [l.strip() for l in lines[a + 1:b]]
    return out


def edited(text, edits, what):
    """text with each (old, new) edit applied; each old must occur exactly once."""
    for old, new in edits:
        if text.count(old) != 1:
            die(f"internal: {what}: {old!r} occurs {text.count(old)} times, expected once (was the file changed?)")
        text = text.replace(old, new)
    return text


def solution_text(ex, solution):
    """The real file with the region replaced by a solution: its whole text, or edits of the real region."""
    with open(os.path.join(ROOT, ex.path)) as f:
        real = f.read()
    if isinstance(solution, list):
        solution = edited("\n".join(region_body(real, ex.name)), solution, f"exercise {ex.name}")
    return with_region(real, ex.name, solution.split("\n"))


def strip_other_markers(text):
    return "\n".join(l for l in text.split("\n") if not (BEGIN.match(l) or END.match(l)))


def broken_copy(ex):
    """Find-the-bug: the real file with the bug's edits applied."""
    with open(os.path.join(ROOT, ex.path)) as f:
        return edited(f.read(), ex.bug["edits"], f"find-the-bug {ex.name}")


def todo_lines(ex):
    """The TODO that replaces an exercise's regions (PART lines between the parts)."""
    # several parts: ex.todo is one list of lines a part
    parts = ex.todo if ex.todo and isinstance(ex.todo[0], list) else [ex.todo]
    todo = []
    for k, lines in enumerate(parts):
        which = f", part {k + 1} of {len(parts)}" if len(parts) > 1 else ""
        todo += ([PART] if k else []) + [f"// TODO(exercise {ex.name}{which}): {ex.goal}"] + [
            "//   " + l for l in lines] + [f"// Check your solution with: make check E={ex.name}"]
    return todo


# The student edition (scripts/exercise_pack.py) carries the real files as objects in reference/:
# there the files hold every region's TODO, and the markers stay in a learner's copy.
PACK = os.path.isdir(os.path.join(ROOT, "reference", "obj"))
# how the student edition marks a line of another exercise cut from a handed-out trainer (exercise_pack.py)
CUT_MARK = "cut from the student edition): write it here"
# In the student edition an exercise whose file's other region cannot be left as a TODO (the
# backward calls the helpers stage3_gather_release defines) starts from the learner's own copy of it.
BUILDS_ON = {"stage3_backward": "stage3_gather_release"}


def learner_text(ex):
    with open(os.path.join(ROOT, ex.path)) as f:
        text = f.read()
    if ex.bug:
        return strip_other_markers(broken_copy(ex))
    if PACK and ex.name in BUILDS_ON and BUILDS_ON[ex.name] in BY_NAME:
        base = BY_NAME[BUILDS_ON[ex.name]]
        mine = os.path.join(LEARNER, base.name, base.file)
        if not os.path.exists(mine):
            die(f"{ex.name} builds on your {base.name} (it calls the helpers you write there): do that one "
                f"first (make exercise E={base.name}; make check E={base.name}), then make exercise E={ex.name}")
        with open(mine) as f:
            text = f.read()
    cut = with_region(text, ex.name, todo_lines(ex))
    return cut if PACK else strip_other_markers(cut)


def cmd_list():
    print("exercises (make exercise E=NAME writes exercises/NAME/; make check E=NAME grades it):")
    for e in EXERCISES:
        print(f"  {e.name:26} {e.goal}")


def cmd_make(name):
    ex = find(name)
    d = os.path.join(LEARNER, ex.name)
    dst = os.path.join(d, ex.file)
    if os.path.exists(dst) and not os.environ.get("FORCE"):
        die(f"{os.path.relpath(dst, ROOT)} already exists (your work?): edit it and run `make check E={ex.name}`, "
            f"or start over with `FORCE=1 make exercise E={ex.name}`")
    os.makedirs(d, exist_ok=True)
    with open(dst + ".tmp", "w") as f:
        f.write(learner_text(ex))
    os.replace(dst + ".tmp", dst)
    print(f"wrote {os.path.relpath(dst, ROOT)} — {ex.goal}")
    if ex.bug:
        print(f"it is {ex.path} with one thing broken; `diff {ex.path} {os.path.relpath(dst, ROOT)}` would "
              f"give it away: read the code, run it, and let `make check E={ex.name}` (then HINT=2) guide you.")
    else:
        print(f"look for TODO(exercise {ex.name}); then: make check E={ex.name}")
        with open(dst) as f:
            cut = sum(CUT_MARK in l for l in f)
        if cut:  # the student edition: this trainer repeats lines of other exercises (exercise_pack.py)
            print(f"this file also repeats {cut} lines of other exercises, cut from the student edition: write them "
                  f"back where it says TODO(a line of exercise ...), as in your solutions there")


def cmd_check(name, source=None, hint_level=1):
    ex = find(name)
    if hint_level != 1 and not ex.bug:
        die(f"error: HINT={hint_level} is for find-the-bug exercises, expected no HINT for {name}; the verdict's "
            f"hints are all there is")
    if ex.bug and not 1 <= hint_level <= len(ex.bug_hints):
        die(f"error: HINT={hint_level}: no such hint, expected 1 to {len(ex.bug_hints)}; run make check E={name} "
            f"HINT={len(ex.bug_hints)}")
    source = source or os.path.join(LEARNER, ex.name, ex.file)
    if not os.path.exists(source):
        die(f"{os.path.relpath(source, ROOT)} does not exist: `make exercise E={ex.name}` writes it")
    with open(source, errors="replace") as f:
        cut = sum(CUT_MARK in l for l in f)
    if cut:  # the student edition: lines of other exercises this trainer repeats (exercise_pack.py)
        print(f"note: your copy still has {cut} lines of other exercises to write back (TODO(a line of exercise ...)); "
              f"until they are, it cannot train as the real {ex.stage} does")
    ok, _ = grader.grade(ex, source, hint_level=hint_level)
    sys.exit(0 if ok else 1)


STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # (a course's ids, zero_quiz.h: at most 64)


def zero_estimate(*args):
    """build/bin/zero_estimate's output line, or make grade's one error line (exit 2) with its message."""
    tool = os.path.join(grader.BUILD, "bin", "zero_estimate")
    if not os.path.exists(tool):
        die(f"make grade: {os.path.relpath(tool, ROOT)} is not built, expected it for SIGNING_KEY; run make")
    c = subprocess.run([tool, *args], capture_output=True, text=True)
    if c.returncode != 0:
        die("make grade: SIGNING_KEY: " + ((c.stderr or c.stdout).strip().splitlines() or ["failed"])[0]
            .removeprefix("error: "))
    return c.stdout.strip()


def shared_reference(ex, src):
    """For an exercise whose file holds another exercise's region (stage1's two, stage3's two): the
    real file with the other region as the submission has it, built (binary, or None when that is the
    real file). The student edition's copy has the other region as its TODO (or, for stage3_backward,
    the student's own stage3_gather_release), so the real trainer is not what it must match; this
    grades each exercise of the file on its own, as the student edition's make check does."""
    with open(os.path.join(ROOT, ex.path)) as f:
        real = f.read()
    with open(src, errors="replace") as f:
        mine = f.read()
    text = real
    for other in [o for o in EXERCISES if not o.bug and o.path == ex.path and o is not ex]:
        def markers(t):
            ls = t.split("\n")
            return ([i for i, l in enumerate(ls) if BEGIN.match(l) and BEGIN.match(l).group(2) == other.name],
                    [i for i, l in enumerate(ls) if END.match(l) and END.match(l).group(1) == other.name])
        (b, e), (rb, _) = markers(mine), markers(real)
        if len(b) != len(rb) or len(e) != len(b) or any(x >= y for x, y in zip(b, e)):
            continue  # the markers are not there as in the real file: the real region stands
        text = with_region(text, other.name, region_body(mine, other.name))
    if text == real:
        return None
    h = hashlib.sha256(text.encode()).hexdigest()[:12]
    d = os.path.join(grader.WORK, "grade", "reference", f"{ex.name}-{h}")
    binary = os.path.join(d, f"{ex.stage}@{ex.name}-{h}")  # (its name keys the cache of its runs)
    if not os.path.exists(binary):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, ex.file), "w") as f:
            f.write(text)
        built, errors = grader.compile_learner(ex, os.path.join(d, ex.file), d)
        if not built:
            return errors  # (the caller says it: the other region as submitted does not build)
        os.replace(built, binary)
    return binary


def cmd_grade(subs, out=None, only=None, hints_shown=True, signing_key=None):
    """make grade SUBMISSIONS=DIR [OUT=DIR] [E="NAME ..."] [HINTS=0] [SIGNING_KEY=FILE]: each student's
    files, DIR/<student-id>/<exercise>.cpp (one a code exercise, every one of E, nothing else), graded
    on the public runs and the hidden ones (exercise_hidden.py). One line per student and exercise;
    OUT (a new or empty folder; default build/grades/<the submissions' folder name>) gets grades.csv
    and each verdict in full, <student-id>/<exercise>.txt. With the course's private key, each
    student's hidden runs are chosen by their grading seed and their verdicts signed:
    <student-id>/grade-record.txt, one nzgrade1 line (zero_estimate --verify LINE --course-pub FILE)."""
    import csv
    import time
    from exercise_hidden import hidden_for
    if PACK:
        die("make grade: this is the student edition; grade on the instructor's full tree")
    if not subs or not os.path.isdir(subs):
        die(f"make grade: SUBMISSIONS={subs!r} is not a folder; expected SUBMISSIONS=DIR holding DIR/<student-id>/<exercise>.cpp")
    code = [e for e in EXERCISES if not e.bug]
    wanted = [find(n) for n in only.split()] if only else code
    files = {f"{e.name}{os.path.splitext(e.file)[1]}": e for e in wanted}
    students = sorted(os.listdir(subs))
    if not students:
        die(f"make grade: {subs} holds no student folder; expected {subs}/<student-id>/<exercise>.cpp")
    for sid in students:
        if not STUDENT_ID.match(sid) or not os.path.isdir(os.path.join(subs, sid)):
            die(f"make grade: {os.path.join(subs, sid)!r}: a student id is a folder named with letters, digits, "
                f"'.', '_' and '-' only, at most 64 (no spaces or path characters); rename it")
        have = set(os.listdir(os.path.join(subs, sid)))
        missing, extra = sorted(set(files) - have), sorted(have - set(files))
        if missing:
            die(f"make grade: {sid} has no {missing[0]}; expected exactly {', '.join(sorted(files))} (E= grades fewer)")
        if extra:
            die(f"make grade: {sid} has {extra[0]}, which is no exercise graded; expected exactly "
                f"{', '.join(sorted(files))}: remove it or add its exercise to E=")
    out = out or os.path.join(ROOT, "build", "grades", os.path.basename(os.path.normpath(subs)))
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        die(f"make grade: {out} exists and is not empty; expected a new or empty OUT=DIR (nothing was written)")
    # each student's grading seed, from the course's key (a key that cannot be read stops here, before
    # anything is compiled or written)
    seeds = {sid: int(zero_estimate("--grade-seed", sid, "--signing-key", signing_key)) for sid in students} \
        if signing_key is not None else {}
    # every file must compile before anything is graded or written
    refs = {}  # (student, exercise): the reference of a shared file (shared_reference), or None
    for sid in students:
        for f, ex in sorted(files.items()):
            src = os.path.join(subs, sid, f)
            binary, errors = grader.compile_learner(ex, src, os.path.join(grader.WORK, "grade", sid, ex.name))
            if binary:
                ref = shared_reference(ex, src)
                if isinstance(ref, list):
                    binary, errors = None, ref
                refs[(sid, ex.name)] = ref
            if not binary:
                first = next((l.strip() for l in errors if l.strip()), "")
                die(f"make grade: {sid}/{f} does not compile ({first}); expected a file that builds: "
                    f"`make check` in the student edition shows the same error")
    os.makedirs(out, exist_ok=True)
    rows = []
    for sid in students:
        for f, ex in sorted(files.items(), key=lambda x: EXERCISES.index(x[1])):
            t0 = time.time()
            extra = hidden_for(ex, seeds.get(sid))
            ok, verdict = grader.grade(ex, os.path.join(subs, sid, f), quiet=True, tag=f"grade_{sid}_{ex.name}",
                                       extra_configs=extra, hints_shown=hints_shown, reference=refs[(sid, ex.name)])
            secs = time.time() - t0
            os.makedirs(os.path.join(out, sid), exist_ok=True)
            with open(os.path.join(out, sid, ex.name + ".txt"), "w") as h:
                h.write(verdict + "\n")
            first = next((l for l in verdict.splitlines() if l.startswith(("FAIL", "PASS"))), "")
            hidden_failed = first.startswith("FAIL") and any(
                f"({c.label}" in first for c in extra)
            runs = len(grader.configs_of(ex)) + len(extra)
            print(f"{sid:16} {ex.name:26} {'PASS' if ok else 'FAIL'}"
                  f"{' (a hidden run)' if hidden_failed else ''}  {secs:5.1f} s" + ("" if ok else f"  {first}"), flush=True)
            rows.append({"student": sid, "seed": seeds.get(sid, ""), "exercise": ex.name,
                         "result": "PASS" if ok else "FAIL",
                         "failed_run": "" if ok else ("hidden" if hidden_failed else "public"),
                         "runs": runs, "seconds": f"{secs:.1f}", "verdict": first})
        if seeds:  # the student's verdicts, signed with the course's key
            mine = ",".join(f"{r['exercise']}:{r['result']}" for r in rows if r["student"] == sid)
            record = zero_estimate("--sign-grade", f"nzgrade1 student={sid} seed={seeds[sid]} exercises={mine}",
                                   "--signing-key", signing_key)
            with open(os.path.join(out, sid, "grade-record.txt"), "w") as h:
                h.write(record + "\n")
            print(f"{sid:16} signed: {os.path.join(out, sid, 'grade-record.txt')} "
                  f"({record.split(' passed=')[1].split()[0]} passed, seed {seeds[sid]})", flush=True)
    with open(os.path.join(out, "grades.csv"), "w", newline="") as h:
        w = csv.DictWriter(h, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {os.path.join(out, 'grades.csv')} ({len(rows)} grades) and each verdict in {out}/<student-id>/"
          + ("" if seeds else "; no SIGNING_KEY: the hidden runs are the same for every student and no record is signed"))


def cmd_key(name):
    """For instructors: each find-the-bug exercise's answer, decoded."""
    bugs = [find(name)] if name else [e for e in EXERCISES if e.bug]
    for ex in bugs:
        if not ex.bug:
            die(f"{ex.name} is not a find-the-bug exercise: its answer is the real {ex.path}")
        print(f"== {ex.name} ({ex.path}): {ex.bug['answer']}")
        for old, new in ex.bug["edits"]:
            print("   real:      " + "\n              ".join(l.strip() for l in old.strip("\n").split("\n")))
            print("   broken:    " + "\n              ".join(l.strip() for l in new.strip("\n").split("\n")))
        for i, h in enumerate(ex.bug_hints, 1):
            print(f"   hint {i}: {h}")


def main(argv):
    if len(argv) < 2 or argv[1] == "list":
        return cmd_list()
    cmd = argv[1]
    args = argv[2:]
    hint_level = 1
    if "--hint" in args:
        i = args.index("--hint")
        try:
            hint_level = int(args[i + 1])
        except (IndexError, ValueError):
            die("error: --hint needs a number, expected 1 or 2; e.g. make check E=NAME HINT=2")
        del args[i:i + 2]
    name = args[0] if args else ""
    if cmd == "make":
        return cmd_list() if not name else cmd_make(name)
    if cmd == "check":
        return cmd_check(name, args[1] if len(args) > 1 else None, hint_level)
    if cmd == "key":
        return cmd_key(name)
    if cmd == "grade":  # make grade SUBMISSIONS=DIR [OUT=DIR] [E=...] [HINTS=0]
        opts = {"--out": None, "--only": None, "--signing-key": None}
        rest = []
        i = 0
        while i < len(args):
            if args[i] in opts and i + 1 < len(args):
                opts[args[i]] = args[i + 1]
                i += 2
            else:
                rest.append(args[i])
                i += 1
        return cmd_grade(rest[0] if rest and rest[0] != "--no-hints" else "", opts["--out"], opts["--only"],
                         hints_shown="--no-hints" not in rest, signing_key=opts["--signing-key"])
    if cmd == "pack":  # make student-pack OUT=DIR
        if not name:
            die("usage: make student-pack OUT=DIR (a new or empty directory)")
        import exercise_pack
        only = args[args.index("--only") + 1] if "--only" in args[:-1] else None
        return exercise_pack.build(os.path.abspath(name), sys.modules[__name__], only)
    if cmd == "bugs-decode":  # maintainers: the plain JSON of exercise_bugs.dat
        return print(json.dumps(decode_bugs(), indent=1))
    if cmd == "bugs-encode":  # maintainers: exercise_bugs.dat from a JSON file of the same shape
        if not name:
            die("usage: exercises.py bugs-encode FILE.json")
        with open(name) as f:
            entries = json.load(f)
        with open(BUGS_FILE + ".tmp", "w") as f:
            f.write(encode_bugs(entries))
        os.replace(BUGS_FILE + ".tmp", BUGS_FILE)
        return print(f"wrote {os.path.relpath(BUGS_FILE, ROOT)} ({len(entries)} exercises)")
    die(f"unknown command {cmd!r}; use list, make NAME, check NAME [FILE] [--hint N], key [NAME], pack DIR, "
        f"grade DIR [--out DIR] [--only NAMES] [--no-hints] [--signing-key FILE]")


if __name__ == "__main__":
    main(sys.argv)
