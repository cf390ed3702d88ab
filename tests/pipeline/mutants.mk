# tests/pipeline/mutants.mk — deliberately broken copies of the pipeline, for the tests of the tests:
# tests/pipeline/test_pipeline.cpp runs each one and requires the checks that find the pipeline equal to
# stage0_ddp --accum K bit for bit to report a difference. `make tests` builds them into $(BUILD)/mutants/bin/.
#
# Each mutant is pipeline/train.cpp, or pipeline/pipeline.cpp (the schedules), with exactly one line
# changed by sed (the generated source goes to $(BUILD)/mutants/). If a refactor makes a pattern
# miss, or hit more than one line, the build stops and names the mutant to fix.
#
#   reverse_backward    GPipe runs its backwards in micro-batch order K-1, ..., 0 (pipeline/pipeline.cpp)
#   grad_scaled_by_k    every segment divides its averaged gradient by K once more (the bug DeepSpeed's
#                       pipeline engine had: the accumulation's scale applied again on each segment)
#   tied_not_combined   the first segment drops the head's part of the tied embedding's gradient
#   wrong_neighbour     activations go to, and gradients come from, the next segment of another replica
PIPELINE_MUTANTS := reverse_backward grad_scaled_by_k tied_not_combined wrong_neighbour
PIPELINE_MUTANT_FILE_reverse_backward := pipeline/pipeline.cpp
PIPELINE_MUTANT_SED_reverse_backward := s/for (int k = 0; k < K; k++) ops\.push_back({false, k});/for (int k = K - 1; k >= 0; k--) ops.push_back({false, k});/
PIPELINE_MUTANT_FILE_grad_scaled_by_k := pipeline/train.cpp
PIPELINE_MUTANT_SED_grad_scaled_by_k := s/average_grads(dt, my_G(u), owned(u)\.size(), run\.grad_average_scale());/average_grads(dt, my_G(u), owned(u).size(), run.grad_average_scale() \/ K);/
PIPELINE_MUTANT_FILE_tied_not_combined := pipeline/train.cpp
PIPELINE_MUTANT_SED_tied_not_combined := s/fill_zero(elem_ptr(unit_grad, wte_elems, e), (numel(EMBED) - wte_elems) \* e,/fill_zero(unit_grad.data(), numel(EMBED) * e,/
PIPELINE_MUTANT_FILE_wrong_neighbour := pipeline/train.cpp
PIPELINE_MUTANT_SED_wrong_neighbour := /const int prev = /s/, d)/, pipe.replicas - 1 - d)/g

PIPELINE_MUTANT_BINS := $(PIPELINE_MUTANTS:%=$(BUILD)/mutants/bin/mutant_pipeline_%)
EXTRA_BINS += $(PIPELINE_MUTANT_BINS)

# A mutant of the trainer is its own train.cpp; a mutant of pipeline/pipeline.cpp is linked before the
# library with the real train.cpp (the library's pipeline.o is then never pulled in).
pipeline_mutant_lib = $(filter-out %/train.cpp,$(PIPELINE_MUTANT_FILE_$(1)))
pipeline_mutant_src = $(BUILD)/mutants/mutant_pipeline_$(1)$(if $(call pipeline_mutant_lib,$(1)),_pipeline,).cpp

define PIPELINE_MUTANT_RULES
$(call pipeline_mutant_src,$(1)): $(PIPELINE_MUTANT_FILE_$(1)) tests/pipeline/mutants.mk tests/lib/make_mutant.sh
	@mkdir -p $$(dir $$@)
	@bash tests/lib/make_mutant.sh tests/pipeline/mutants.mk mutant_pipeline_$(1) 1 $$< $$@ -e '$$(PIPELINE_MUTANT_SED_$(1))'
$(BUILD)/obj/mutants/$(notdir $(basename $(call pipeline_mutant_src,$(1)))).o: $(call pipeline_mutant_src,$(1)) $(MUTANT_GCH)
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(CXXFLAGS) -Ipipeline -c $$< -o $$@
$(BUILD)/mutants/bin/mutant_pipeline_$(1): $(BUILD)/obj/mutants/$(notdir $(basename $(call pipeline_mutant_src,$(1)))).o \
    $(if $(call pipeline_mutant_lib,$(1)),$(BUILD)/obj/pipeline/train.o) $$(LIB)
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(LDFLAGS) $$(filter %.o,$$^) $$(LIB) $$(LDLIBS) -o $$@
endef
$(foreach m,$(PIPELINE_MUTANTS),$(eval $(call PIPELINE_MUTANT_RULES,$(m))))
