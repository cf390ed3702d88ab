"""The hidden grading runs (make grade, scripts/exercises.py grade): run after the public ones of
each exercise, never in the student edition. More ranks, odd world sizes, K < P - 1 and K > P for the
pipeline, every precision each rung supports, prefetch on and off."""
from exercise_grader import Config, INFINITY_DISK, ZEROPP_FLAGS

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
}


def hidden_for(ex):
    return HIDDEN.get(ex.stage, [])
