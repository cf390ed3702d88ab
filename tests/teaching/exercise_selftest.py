#!/usr/bin/env python3
"""The exercise grader's own tests (tests/teaching/exercises_check.sh runs them; NZRESULT lines).

For every exercise of scripts/exercises.py:
  - the reference solution (the real region) passes, bit for bit, on every configuration;
  - each correct solution in another form passes: bit for bit where its arithmetic is the real
    one's, "another rounding order" where it adds the same numbers in another order;
  - each wrong solution of the catalogue fails, and its verdict contains the phrase the catalogue
    expects (the hint that names the mistake, or the failure's own message): the dtype, pointer,
    byte-size, sum-order, blocking-prefetch and placement kinds among them, and one case of each
    failure that is not a difference — NaN losses, a crash by signal, a corrupted heap, a hang, a
    build error;
  - each find-the-bug copy fails with its first hint and not its second (HINT=2 gives the second),
    and its answer is nowhere in the repository in plain text.
Plus the verdict functions on results no trainer should produce (the grader never raises).
Usage: exercise_selftest.py [-v] [NAME_SUBSTRING]   (only the exercises whose name contains it;
-v: every verdict in full)
"""
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/teaching/
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import exercise_grader as grader  # noqa: E402
import exercises  # noqa: E402


def label(ex, what):
    return f"exercise.{ex.name}.{what}"


def slug(s):
    return re.sub(r"\W+", "_", s).strip("_")


def jobs_for(ex, tmp):
    """(exercise, test label, source file, check(ok, verdict) -> problem or None, hint level)"""
    out = []

    def write(text, i):
        src = os.path.join(tmp, f"{ex.name}_{i}_{ex.file}")
        with open(src, "w") as f:
            f.write(text)
        return src

    if ex.bug:
        def bug_check(ok, verdict, ex=ex):
            if ok:
                return "it PASSED"
            if ex.bug_hints[0] not in verdict:
                return "no first hint: " + verdict
            if ex.bug_hints[1] in verdict:
                return "the second hint shown unasked: " + verdict
            if sum(1 for l in verdict.splitlines() if "hint:" in l) != 2:  # hint 1 and the pointer to HINT=2
                return "hints other than the exercise's own: " + verdict
            return None
        src = write(exercises.learner_text(ex), 0)
        out.append((ex, label(ex, "rejects_the_handed_out_copy_with_its_first_hint"), src, bug_check, 1))
        if ex.name == "bug_stage2_a":
            def second(ok, verdict, ex=ex):
                return None if not ok and ex.bug_hints[1] in verdict else "no second hint: " + verdict
            out.append((ex, label(ex, "gives_its_second_hint_on_request"), src, second, 2))
        # the bugs of docs/faq.md: a fix that only hides the symptom is rejected, the real fix passes
        for i, (what, fix) in enumerate(ex.bug.get("wrong_fixes", []), 1):
            text = exercises.edited(exercises.learner_text(ex), fix, f"{ex.name}: {what}")
            out.append((ex, label(ex, "rejects_" + slug(what)), write(text, i),
                        lambda ok, verdict: "it PASSED" if ok else None, 1))
        if ex.bug.get("wrong_fixes"):
            with open(os.path.join(ROOT, ex.path)) as f:
                real = f.read()
            out.append((ex, label(ex, "accepts_the_fixed_file"), write(real, 99),
                        lambda ok, verdict: None if ok else "it FAILED: " + verdict, 1))
        return out

    def passes(phrase):
        def check(ok, verdict):
            last = verdict.splitlines()[-1] if verdict else ""
            return None if ok and phrase in last else ("it FAILED: " if not ok else f"no {phrase!r}: ") + verdict
        return check

    with open(os.path.join(ROOT, ex.path)) as f:
        real = f.read()
    out.append((ex, label(ex, "accepts_the_reference_solution"),
                write(exercises.solution_text(ex, "\n".join(exercises.region_body(real, ex.name))), 0),
                passes(exercises.BITS), 1))
    for i, (what, solution, phrase) in enumerate(ex.right, 1):
        out.append((ex, label(ex, "accepts_" + slug(what)), write(exercises.solution_text(ex, solution), i),
                    passes(phrase), 1))
    for i, (what, kind, solution, phrase) in enumerate(ex.wrong, 100):
        def fails(ok, verdict, phrase=phrase):
            if ok:
                return "it PASSED"
            return None if phrase.lower() in verdict.lower() else f"no {phrase!r} in the verdict: " + verdict
        out.append((ex, label(ex, f"rejects_{slug(kind)}_{slug(what)}"), write(exercises.solution_text(ex, solution), i),
                    fails, 1))
    return out


def offline_checks():
    """The verdict functions on results no real run gives: each is a verdict, none raises."""
    results = []
    ex = exercises.BY_NAME["stage2_reduce_scatter"]
    cases = [
        ("a_watchdog_line_is_a_hang", {"rc": 3, "output": "error: watchdog: rank 1 has made no progress (last "
                                       "progress 5 s ago, in phase 'backward' of step 1); no progress"}, "hung"),
        ("a_timeout_is_a_hang", {"rc": None, "hung": True, "output": ""}, "did not finish"),
        ("a_glibc_message_is_a_corrupted_heap", {"rc": 134, "output": "free(): invalid next size (normal)\n"}, "heap"),
        ("a_signal_is_named", {"rc": 139, "output": "nz_grader: rank 2: signal 11 (Segmentation fault)\n"}, "SIGSEGV"),
        ("an_mpi_error_is_named", {"rc": 15, "output": "Abort(806969615) on node 1 (rank 1 in comm 0): Fatal "
                                   "error in internal_Wait: Message truncated, error stack:\nMPIR_Wait(): ..."},
         "MPI stopped your trainer"),
        ("no_output_at_all_is_a_verdict", {"rc": 1, "output": ""}, "exit code 1"),
    ]
    for name, res, phrase in cases:
        try:
            what, hint = grader.failure_verdict(res)
            good = phrase in what
        except Exception as e:  # noqa: BLE001
            what, good = f"raised {type(e).__name__}: {e}", False
        results.append((good, f"exercise.grader.{name}" + ("" if good else f" ({what})")))
    # the trainer's own error line is the verdict, not the MPI abort that follows it
    res = {"rc": 1, "output": "error: parameters are NaN after step 2 (rank 0)\nAbort(1) on node 0 (rank 0 in comm 0): "
                              "application called MPI_Abort(MPI_COMM_WORLD, 1) - process 0\n"}
    what, hint = grader.failure_verdict(res, "zeropp")
    good = "parameters are NaN" in what and "different collectives" not in (hint or "")
    results.append((good, "exercise.grader.the_trainers_own_error_line_before_mpis_abort" + ("" if good else f" ({what})")))
    # a pipeline that hangs gets the pipeline's hint, never the collectives' one
    hang = {"rc": 3, "output": "error: watchdog: rank 1 has made no progress (last progress 5 s ago, in phase "
                               "'backward' of step 1); no progress"}
    what, hint = grader.failure_verdict(hang, "pipeline")
    good = "neighbour never sends" in hint and "collective" not in hint
    results.append((good, "exercise.grader.a_pipeline_hang_gets_the_pipelines_hint"))
    # a pipeline stopped by a buffer check or a signal: the pipeline's hint, not the slices' one
    for out in ("internal error at common/ledger.cpp:12: copy: bytes [0, 8) of buffer \"x\" run past its end",
                "nz_grader: rank 1: signal 11 (Segmentation fault)\n"):
        what, hint = grader.failure_verdict({"rc": 1, "output": out}, "pipeline")
        good = hint and "micro-batch" in hint and "dt (run.dtype)" not in hint
        results.append((good, "exercise.grader.a_pipeline_crash_gets_the_pipelines_hint_" + out.split()[0].replace(":", "")
                        + ("" if good else f" ({hint})")))
    # a pipeline whose order is right but whose numbers are not gets no other exercise's hint
    pipe = exercises.BY_NAME["pipeline_1f1b"]
    hs = grader.hints(pipe, grader.PIPELINE_CONFIGS[0], [("norm", "step 1: ...", (0, 2.0))], [], False)
    good = hs and not any("reduce" in h or "averaged" in h or "slice" in h for h in hs)
    results.append((good, "exercise.grader.pipeline_hints_name_no_other_exercise" + ("" if good else f" ({hs})")))
    # null losses on both sides (fp16's skipped steps) are equal, not a crash of the comparison
    step = {"loss": None, "grad_norm": None, "to_host_elems": 0, "to_device_elems": 0}
    rank = {"rank": 0, "ledger": {l: {"peak": {}} for l in ("device", "host", "disk")},
            "comm": {op: {"calls": 0, "elems_sent": 0} for op in grader.OPS}}
    rep = {"report": {"steps_log": [step], "ranks": [rank]}, "model": b""}
    try:
        good = grader.compare(rep, rep, prefetch=True) == [] and grader.not_finite(rep, rep) is None
    except Exception as e:  # noqa: BLE001
        good = False
    results.append((good, "exercise.grader.null_losses_on_both_sides_compare_equal"))
    # a learner whose report has nulls where the real run has numbers: a NaN verdict, not a TypeError
    got = {"report": {"steps_log": [dict(step)], "ranks": [rank]}, "model": b""}
    ref = {"report": {"steps_log": [dict(step, loss=5.5, grad_norm=2.0)], "ranks": [rank]}, "model": b""}
    try:
        good = grader.not_finite(ref, got) == (0, "loss") and any(d[0] == "loss" for d in grader.compare(ref, got, True))
        hs = grader.hints(ex, grader.CONFIGS[0], grader.compare(ref, got, True), [], False)
        good = good and isinstance(hs, list)
    except Exception as e:  # noqa: BLE001
        good = False
    results.append((good, "exercise.grader.nan_in_the_report_is_compared_without_raising"))
    # the precompiled header is rebuilt when any header it includes changes, not only common/*.h: one in a
    # room below common/ too (trainer.h includes compression_setup.h, which includes compression/qat.h; once trainer.h included
    # zeropp/formulas.h, and a stale header failed every zeropp exercise with a redefinition)
    try:
        inputs = grader.prepared_header_inputs()
        good = (os.path.join(ROOT, "common", "compression", "qat.h") in inputs
                and os.path.join(ROOT, "common", "trainer.h") in inputs)
    except Exception as e:  # noqa: BLE001
        inputs, good = f"raised {type(e).__name__}: {e}", False
    results.append((good, "exercise.grader.the_prepared_header_follows_every_header_it_includes"
                    + ("" if good else f" ({inputs})")))
    return results


def secrecy_checks():
    """A find-the-bug answer is in no file a learner reads: no file names a find-the-bug exercise and
    holds its broken line, and its answer and hints are only in the encoded exercise_bugs.dat."""
    results = []
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    texts = {}
    for f in files:
        if f.endswith((".dat", ".png", ".ipynb")):
            continue
        try:
            with open(os.path.join(ROOT, f), errors="replace") as h:
                texts[f] = h.read()
        except OSError:
            pass
    for ex in exercises.EXERCISES:
        if not ex.bug:
            continue
        leaks = [f for f, t in texts.items() for _, new in ex.bug["edits"]
                 if new.strip() and new.strip() in t and ex.name in t]
        leaks += [f for f, t in texts.items() if ex.bug["answer"] in t or any(h in t for h in ex.bug_hints)]
        results.append((not leaks, f"exercise.{ex.name}.answer_not_in_plain_text" + (f" (in {leaks})" if leaks else "")))
    key = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "exercises.py"), "key", "bug_stage2_a"],
                         capture_output=True, text=True)
    good = key.returncode == 0 and exercises.BY_NAME["bug_stage2_a"].bug["answer"] in key.stdout
    results.append((good, "exercise.key_command_prints_the_answer"))
    return results


def main():
    verbose = "-v" in sys.argv
    args = [a for a in sys.argv[1:] if a != "-v"]
    only = args[0] if args else ""
    tmp = os.path.join(grader.WORK, "selftest")
    os.makedirs(tmp, exist_ok=True)
    start = time.time()
    exs = [e for e in exercises.EXERCISES if only in e.name]
    jobs = [j for ex in exs for j in jobs_for(ex, tmp)]
    try:  # the real trainers' runs and the prepared objects, once, before the grades share them
        grader.prepared_objects()
        for stage, cfg in {(ex.stage, cfg.tag): (ex.stage, cfg) for ex in exs for cfg in grader.configs_of(ex)}.values():
            grader.reference_run(stage, cfg)
        for ex in exs:
            if ex.probe:
                grader.probe_build(ex)
    except grader.GraderError as e:
        print(f"NZRESULT FAIL exercise.grader_setup: {e}")
        return False
    setup_s = time.time() - start

    def one(i):
        ex, name, src, check, level = jobs[i]
        t0 = time.time()
        ok, verdict = grader.grade(ex, src, quiet=True, tag=f"selftest_{i}", hint_level=level)
        problem = check(ok, verdict)
        lines = [f"NZRESULT {'FAIL' if problem else 'PASS'} {name}" +
                 (" " + problem.replace("\n", " | ") if problem else "")]
        if verbose:
            lines += ["    | " + l for l in verdict.splitlines()]
        elif not ok and not problem:  # what the learner would read: what happened, and the first hint
            said = [l.strip() for l in verdict.splitlines() if l.startswith("FAIL")][:1] + \
                   [l.strip() for l in verdict.splitlines() if "hint:" in l or l.strip().startswith("line ")][:1]
            lines.append(f"  {name[len('exercise.'):]}: {' / '.join(said)}")
        return not problem, "\n".join(lines), time.time() - t0, name

    # the grades that run every configuration first: they take longest
    order = sorted(range(len(jobs)), key=lambda i: ".accepts_" not in jobs[i][1])
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = dict(zip(order, pool.map(one, order)))
    for i in range(len(jobs)):
        print(results[i][1], flush=True)
    for good, name in offline_checks() + (secrecy_checks() if not only else []):
        print(f"NZRESULT {'PASS' if good else 'FAIL'} {name}")
    print("grade time of each reference solution (every configuration; 3 grades at a time):")
    for i in range(len(jobs)):
        if jobs[i][1].endswith("accepts_the_reference_solution"):
            print(f"  {jobs[i][0].name:26} {results[i][2]:5.1f} s")
    print(f"exercise selftest: {len(jobs)} grades, {time.time() - start:.0f} s "
          f"(the real trainers' runs and the prepared build {setup_s:.0f} s)")
    return all(r[0] for r in results.values())


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
