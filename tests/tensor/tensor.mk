# tests/tensor/tensor.mk — make tensor-check: the tensor rung's whole equality matrix, every T, D and K
# with T x D <= 4 (and T = 3) in fp32, bf16 and fp16 against the single-process reference (make test runs eight).
.PHONY: tensor-check
tensor-check: $(BUILD)/tests/test_tensor $(BUILD)/bin/tensor $(BUILD)/bin/stage0_ddp $(TENSOR_MUTANT_BINS)
	NZ_TENSOR_FULL=1 OMP_NUM_THREADS=1 $(BUILD)/tests/test_tensor
