# tests/ulysses/ulysses.mk — the single-process reference ulysses is held to bit for bit
# (tests/ulysses/ulysses_reference.cpp), a test-only trainer: `make tests` builds it into
# $(BUILD)/mutants/bin/ulysses_reference, beside the deliberately broken ones.
ULYSSES_REFERENCE := $(BUILD)/mutants/bin/ulysses_reference
EXTRA_BINS += $(ULYSSES_REFERENCE)
$(ULYSSES_REFERENCE): $(BUILD)/obj/tests/ulysses/ulysses_reference.o $(LIB) $(LINK_EXTRA)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $< $(LIB) $(LINK_EXTRA) $(LDLIBS) -o $@

# The long matrix (not part of make test): ulysses against its reference in fp32, bf16 and fp16,
# S = 1, 2, 4, K = 1, 2, 3, bit for bit.
.PHONY: ulysses-matrix
ulysses-matrix: $(BUILD)/tests/test_ulysses $(ULYSSES_REFERENCE) $(BUILD)/bin/ulysses
	NZ_ULYSSES_MATRIX=1 OMP_NUM_THREADS=1 $(BUILD)/tests/test_ulysses --gtest_filter=Ulysses.MatrixInEveryPrecision
