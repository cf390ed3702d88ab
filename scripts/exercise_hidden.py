"""The hidden grading runs (make grade, scripts/exercises.py grade): run after the public ones of
each exercise, never in the student edition. More ranks, odd world sizes, K < P - 1 and K > P for the
pipeline, every precision each rung supports, prefetch on and off.

With the course's key (make grade SIGNING_KEY=course.key) each student's hidden runs are their own:
the initialisation seed and data order (--seed), the sequence length and the micro-batch come from
the student's grading seed (zero_estimate --grade-seed: SHA-256 of the course's public key and the
student's id, docs/certificates.md), so the outputs one student's trainer must match are no other's."""
import hashlib

from exercise_grader import Config, INFINITY_DISK, MUON_FLAGS, TENSOR_THREE, ZEROPP_FLAGS

HIDDEN = {
    "stage1": [Config(4, 2), Config(5, 1, "bf16"), Config(4, 2, "fp16")],
    "stage2": [Config(4, 2), Config(5, 1, "bf16"), Config(4, 3, "fp16")],
    "stage3": [Config(4, 2, "fp16"), Config(5, 1, "bf16", "--prefetch 0"), Config(4, 3, "fp32")],
    "offload": [Config(4, 2, "fp16"), Config(5, 1, "bf16")],
    "infinity": [Config(4, 1, "fp16"), Config(3, 2, "fp32", "--prefetch 0"),
                 Config(2, 1, "fp16", INFINITY_DISK + " --prefetch 0")],
    "pipeline": [Config(4, 1, "fp32", "--pipeline 4 --schedule 1f1b"),   # K = 1 < P - 1
                 Config(3, 7, "fp32", "--pipeline 3 --schedule 1f1b"),   # K > P
                 Config(4, 2, "fp16", "--pipeline 2 --schedule 1f1b")],
    "zeropp": [Config(4, 1, "bf16", ZEROPP_FLAGS + " --hpz 2"), Config(5, 1, "fp32", ZEROPP_FLAGS)],
    # T = 4 with sequence parallelism (the loss's rows are the gathered ones); T = 3 x 2 replicas in bf16
    # (the padded vocabulary); T = 2 x 2 in fp16 with accumulation 3
    "tensor": [Config(4, 1, "fp32", "--tensor 4 --sequence-parallel"), Config(6, 2, "bf16", TENSOR_THREE),
               Config(4, 3, "fp16", "--tensor 2")],
    # an exercise's own (its runs need flags of their own): Muon's boundary gather at 4 ranks (two cut
    # matrices a block), 5 in fp16, and the whole-matrices design (its update is the learner's too)
    "muon_boundary_gather": [Config(4, 1, "fp32", MUON_FLAGS), Config(5, 2, "fp16", MUON_FLAGS),
                             Config(4, 1, "bf16", MUON_FLAGS + " --muon-shard whole-matrices")],
    # ulysses: S = 2 on 4 ranks in fp16 with accumulation, S = 4 in bf16, S = 2 on 6 ranks
    # (three replicas: the padded layout of 6); every seq the student's seed picks (16, 24, 32) divides by 4
    "ulysses": [Config(4, 2, "fp16", "--sp 2"), Config(4, 1, "bf16", "--sp 4"),
                Config(6, 1, "fp32", "--sp 2")],
}
SEQS, BATCHES = (16, 24, 32), (1, 2)  # the tiny model's context is 32 or more; sizes no larger than the public runs'


def personal(cfg, seed, i):
    """Hidden run i with the initialisation seed, data order and sizes of a student's grading seed
    (the trainers take the last of a repeated flag: these override exercise_grader.FLAGS')."""
    h = hashlib.sha256(f"nzgrade-run {seed} {i}".encode()).digest()
    init = 1 + int.from_bytes(h[:4], "big") % (1 << 30)
    seq, batch = SEQS[h[4] % len(SEQS)], BATCHES[h[5] % len(BATCHES)]
    return Config(cfg.n, cfg.accum, cfg.precision, f"{cfg.extra} --seed {init} --seq {seq} --batch {batch}".strip())


def hidden_for(ex, seed=None):
    """The hidden runs of an exercise; with a student's grading seed, that student's own."""
    runs = HIDDEN.get(ex.name, HIDDEN.get(ex.stage, []))
    return runs if seed is None else [personal(c, seed, i) for i, c in enumerate(runs)]
