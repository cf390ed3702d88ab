# tests/tensor/mutants.mk — deliberately broken copies of the tensor rung, for the tests of the tests:
# tests/tensor/test_tensor.cpp runs each one and requires the check that finds the rung equal to the
# single-process reference (tests/tensor/tp_reference.h) bit for bit to report a difference. `make tests`
# builds them into $(BUILD)/mutants/bin/.
#
# Each mutant is tensor/train.cpp or one of the rung's library files (tensor/tp_model.cpp, tensor/pipe3d.cpp,
# tensor/tensor.cpp) with exactly one line changed by sed
# (tests/lib/make_mutant.sh: a pattern that misses or hits twice stops the build, naming the mutant).
#
#   f_no_all_reduce     f's backward forgets its all-reduce: each rank keeps only its own part of
#                       the gradient flowing into ln1, ln2 and lnf (column-parallel inputs)
#   bias_summed_t_times the replicated fcproj_b's gradient is all-reduced over the T ranks: T times too big
#   local_max           the cross-entropy shifts each rank's exponentials by its own max, not the global one
#   wrong_placement     the tensor group is made replica-fastest (ranks r, r+T, ...) while the data and the
#                       replicas' group assume T fastest: tensor ranks of different replicas sum their partials
#   sp_ln_not_summed    sequence parallelism: the blocks' layer norms keep the gradient of their own rows
#                       only (the T ranks' parts never summed)
#   wrong_peer_3d       3D: each tensor rank exchanges activations with tensor rank T-1-t of the neighbour
#                       segments instead of t (sends and receives still pair up: it runs). Without sequence
#                       parallelism every tensor rank's copy is the same and the numbers too (not a bug
#                       then); with it each sends its own rows, and the next segment gets them misplaced
#   placement_3d_p_fastest  3D: tensor_plan places the segments before the replicas (P fastest after T) while
#                       the pipeline rung's plan over the tensor groups places them last: the ranks would
#                       disagree on their neighbours (sends without a receiver: a hang, not other numbers);
#                       the rung's check that the two plans agree (pipe3d.cpp, segment_plan) stops it at once
TENSOR_MUTANTS := f_no_all_reduce bias_summed_t_times local_max wrong_placement sp_ln_not_summed wrong_peer_3d \
                  placement_3d_p_fastest
TENSOR_MUTANT_FILE_f_no_all_reduce := tensor/tp_model.cpp
TENSOR_MUTANT_SED_f_no_all_reduce := s/void TensorGPT::f_backward(void\* grad_sum, size_t n) { tp_\.all_reduce(grad_sum, n, dt_); }/void TensorGPT::f_backward(void* grad_sum, size_t n) { (void)grad_sum, (void)n; }/
TENSOR_MUTANT_FILE_bias_summed_t_times := tensor/tp_model.cpp
TENSOR_MUTANT_SED_bias_summed_t_times := /ops::matmul_backward<X>(d4c, G(FCPW), G(FCPB)/s/$$/ tp_.all_reduce(G(FCPB), C, dt_);/
TENSOR_MUTANT_FILE_local_max := tensor/tp_model.cpp
TENSOR_MUTANT_SED_local_max := s/m = std::max(m, maxes\[size_t(r) \* a\.R + i\]);/m = maxes[size_t(t_) * a.R + i];/
TENSOR_MUTANT_FILE_sp_ln_not_summed := tensor/tp_model.cpp
TENSOR_MUTANT_SED_sp_ln_not_summed := s/if (sp_) tp_\.all_reduce(G(LN1W), 2 \* size_t(C), dt_), tp_\.all_reduce(G(LN2W), 2 \* size_t(C), dt_);/(void)0;/
TENSOR_MUTANT_FILE_wrong_placement := tensor/train.cpp
TENSOR_MUTANT_SED_wrong_placement := s/Comm tp(comm, d, t, "tensor group");/Comm tp(comm, t, d, "tensor group");/
TENSOR_MUTANT_FILE_placement_3d_p_fastest := tensor/tensor.cpp
TENSOR_MUTANT_SED_placement_3d_p_fastest := s/p\.d = rank \/ T % p\.replicas, p\.p = rank \/ T \/ p\.replicas;/p.p = rank \/ T % P, p.d = rank \/ T \/ P;/
TENSOR_MUTANT_FILE_wrong_peer_3d := tensor/pipe3d.cpp
TENSOR_MUTANT_SED_wrong_peer_3d := s/const int peer_t = t; /const int peer_t = plan.tensor - 1 - t; /

TENSOR_MUTANT_BINS := $(TENSOR_MUTANTS:%=$(BUILD)/mutants/bin/mutant_tensor_%)
EXTRA_BINS += $(TENSOR_MUTANT_BINS)

# A mutant of the trainer is its own train.cpp; a mutant of a library file (tensor/tp_model.cpp,
# tensor/pipe3d.cpp, tensor/tensor.cpp) is linked before the library with the real train.cpp (the library's copy of that
# file is then never pulled in).
tensor_mutant_lib = $(filter-out %/train.cpp,$(TENSOR_MUTANT_FILE_$(1)))
tensor_mutant_src = $(BUILD)/mutants/mutant_tensor_$(1)$(if $(call tensor_mutant_lib,$(1)),_$(basename $(notdir $(TENSOR_MUTANT_FILE_$(1)))),).cpp

define TENSOR_MUTANT_RULES
$(call tensor_mutant_src,$(1)): $(TENSOR_MUTANT_FILE_$(1)) tests/tensor/mutants.mk tests/lib/make_mutant.sh
	@mkdir -p $$(dir $$@)
	@bash tests/lib/make_mutant.sh tests/tensor/mutants.mk mutant_tensor_$(1) 1 $$< $$@ -e '$$(TENSOR_MUTANT_SED_$(1))'
$(BUILD)/obj/mutants/$(notdir $(basename $(call tensor_mutant_src,$(1)))).o: $(call tensor_mutant_src,$(1)) $(MUTANT_GCH)
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(CXXFLAGS) -Itensor -c $$< -o $$@
$(BUILD)/mutants/bin/mutant_tensor_$(1): $(BUILD)/obj/mutants/$(notdir $(basename $(call tensor_mutant_src,$(1)))).o \
    $(if $(call tensor_mutant_lib,$(1)),$(BUILD)/obj/tensor/train.o) $$(LIB)
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(LDFLAGS) $$(filter %.o,$$^) $$(LIB) $$(LDLIBS) -o $$@
endef
$(foreach m,$(TENSOR_MUTANTS),$(eval $(call TENSOR_MUTANT_RULES,$(m))))
