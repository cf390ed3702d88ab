# tests/compress/prune_mutants.mk — deliberately broken copies of the pruning mask, for the tests of
# the tests: tests/compress/test_prune.cpp runs each one and requires its checks to report the bug.
# The mask lives in common/ (compression/prune.h), not in the stage files, so each mutant is a sed of one common
# file, compiled and linked into one stage ahead of the library (the library's copy of that file
# is then never pulled in). `make tests` builds them into $(BUILD)/mutants/bin/.
#
#   grad_unmasked   (stage0_ddp) the backward does not mask the gradient: the pruned weights still
#                   stay 0 (AdamW freezes them), but the gradient norm and so the clipping count
#                   weights that do not exist: step 1's norm is not the pruned network's
#   decay_unmasked  (stage3) AdamW puts the pruned elements' moments back but not the weights: a
#                   pruned weight with moments (a dense checkpoint resumed with a mask) moves off 0
#   one_shard       (stage2) AdamW reads the mask as if every rank's slice started at the unit's first
#                   element: right on rank 0, the wrong elements frozen on the others
#   host_unmasked   (offload) the host AdamW never puts the pruned elements back
#
# Each sed must change exactly PRUNE_MUTANT_LINES_<name> lines of its file.
PRUNE_MUTANTS := grad_unmasked decay_unmasked one_shard host_unmasked
PRUNE_MUTANT_FILE_grad_unmasked := common/model.cpp
PRUNE_MUTANT_STAGE_grad_unmasked := stage0_ddp
PRUNE_MUTANT_SED_grad_unmasked := -e 's/^  if (prune_) zero_pruned(\*prune_, u, 0,.*$$/  ;  \/\/ (not masked)/'
PRUNE_MUTANT_FILE_decay_unmasked := common/optim.cpp
PRUNE_MUTANT_STAGE_decay_unmasked := stage3
PRUNE_MUTANT_SED_decay_unmasked := -e 's/^    p32\[i\] = p_\[j\], m\[i\] = m_\[j\], v\[i\] = v_\[j\];$$/    m[i] = m_[j], v[i] = v_[j];/'
PRUNE_MUTANT_FILE_one_shard := common/optim.cpp
PRUNE_MUTANT_STAGE_one_shard := stage2
PRUNE_MUTANT_SED_one_shard := -e 's/cfg\.prune->pruned_at(u, own\.begin, begin + i)/cfg.prune->pruned_at(u, 0, begin + i)/'
PRUNE_MUTANT_FILE_host_unmasked := offload/host_adamw.cpp
PRUNE_MUTANT_STAGE_host_unmasked := offload
PRUNE_MUTANT_SED_host_unmasked := -e 's/^    pruned\.restore(p32, m, v, dt_, .*$$/    ;  \/\/ (not put back)/'
PRUNE_MUTANT_LINES := 1

PRUNE_MUTANT_BINS := $(PRUNE_MUTANTS:%=$(BUILD)/mutants/bin/mutant_prune_%)
EXTRA_BINS += $(PRUNE_MUTANT_BINS)

define prune_mutant
$(BUILD)/mutants/mutant_prune_$(1).cpp: $(PRUNE_MUTANT_FILE_$(1)) tests/compress/prune_mutants.mk tests/lib/make_mutant.sh
	@mkdir -p $$(dir $$@)
	@bash tests/lib/make_mutant.sh tests/compress/prune_mutants.mk mutant_prune_$(1) $(PRUNE_MUTANT_LINES) $$< $$@ $$(PRUNE_MUTANT_SED_$(1))
$(BUILD)/obj/mutants/mutant_prune_$(1).o: $(BUILD)/mutants/mutant_prune_$(1).cpp $(MUTANT_GCH)
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(CXXFLAGS) -I$$(dir $(PRUNE_MUTANT_FILE_$(1))) -c $$< -o $$@
$(BUILD)/mutants/bin/mutant_prune_$(1): $(BUILD)/obj/$(PRUNE_MUTANT_STAGE_$(1))/train.o \
    $(BUILD)/obj/mutants/mutant_prune_$(1).o $(LIB)
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(LDFLAGS) $$(filter-out $(LIB),$$^) $(LIB) $(LINK_EXTRA) $$(LDLIBS) -o $$@
endef
$(foreach m,$(PRUNE_MUTANTS),$(eval $(call prune_mutant,$(m))))
