# tests/tensor/tensor.mk — make tensor-check: the tensor rung's whole equality matrix, every T, D and K
# with T x D <= 4 (and T = 3) in fp32, bf16 and fp16 against the single-process reference (make test runs
# twelve), and 3D: 60 runs of T x P x D in {2x2x1, 1x2x2, 2x2x2, 2x3x1, 1x4x1, 2x4x1}, GPipe, ZeRO-1, sequence
# parallel, K = 1 and 3 (make test runs seven).
.PHONY: tensor-check
tensor-check: $(BUILD)/tests/test_tensor $(BUILD)/bin/tensor $(BUILD)/bin/stage0_ddp $(TENSOR_MUTANT_BINS)
	NZ_TENSOR_FULL=1 OMP_NUM_THREADS=1 $(BUILD)/tests/test_tensor
