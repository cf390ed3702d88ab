# tests/faq/faq_mutants.mk — real defects of ZeRO implementations, replayed as broken copies of a rung
# (docs/faq.md, "Bugs that shipped"): tests/faq/bugs_check.sh (`make bugs`) runs each one, measures
# the symptom its users reported, and requires the invariant that should catch it to report it.
# `make tests` builds them into $(BUILD)/mutants/bin/ (the generated sources go to $(BUILD)/mutants/).
#
#   offload_copy_grads   offload: every micro-step copies its gradient slice into the host's instead of
#                        adding it (DeepSpeed pull request 6550: ZeRO-2 + offload's micro-step counter)
#   clip_not_applied     stage2: the clipping coefficient is computed and never applied (DeepSpeed pull
#                        request 5150)
#   norm_local_shard     stage2: the gradient norm of my slices only, never summed over the ranks (the
#                        symptom of DeepSpeed issue 7718: ZeRO-2's norms far below ZeRO-3's)
#   ddp_grads_not_zeroed stage0_ddp: the gradient is never reset between steps, so it accumulates over
#                        them (DeepSpeed issue 7837, fixed by pull request 7839: zero_grad skipped at ZeRO-0)
#   norm_loss_scaled     stage2: the norm is not divided by the loss scale (DeepSpeed pull request 2695,
#                        issue 2686: the norm computed with the wrong loss scale)
# (The accumulation-boundary reset of open-instruct 1498 is tests/stages/stage2_mutants.mk's
# last_microbatch_only.) Each sed must change exactly one line: if a refactor of the rung makes a
# pattern miss, the build stops and names the mutant to fix.
FAQ_MUTANTS := offload_copy_grads clip_not_applied norm_local_shard ddp_grads_not_zeroed norm_loss_scaled
FAQ_MUTANT_FROM_offload_copy_grads := offload/train.cpp
FAQ_MUTANT_SED_offload_copy_grads := s/landing\.data(), owned(u), run\.grad_average_scale(), k == 0,/landing.data(), owned(u), run.grad_average_scale(), true,/
FAQ_MUTANT_FROM_clip_not_applied := stage2/train.cpp
FAQ_MUTANT_SED_clip_not_applied := s/const float scale = clip_scale(norm, run\.args\.clip) \/ run\.loss_scale();/const float scale = 1.0f \/ run.loss_scale();/
FAQ_MUTANT_FROM_norm_local_shard := stage2/train.cpp
FAQ_MUTANT_SED_norm_local_shard := s/^\( *\)comm\.sum_scalars(&sq, 1);/\1(void)sq;/
FAQ_MUTANT_FROM_ddp_grads_not_zeroed := stage0_ddp/train.cpp
FAQ_MUTANT_SED_ddp_grads_not_zeroed := s/accumulate_grads(dt, G(u), unit_grad\.data(), numel(u), 1\.0f, k == 0);/accumulate_grads(dt, G(u), unit_grad.data(), numel(u), 1.0f, false);/
FAQ_MUTANT_FROM_norm_loss_scaled := stage2/train.cpp
FAQ_MUTANT_SED_norm_loss_scaled := s/const double norm = std::sqrt(sq) \/ run\.loss_scale();/const double norm = std::sqrt(sq);/

FAQ_MUTANT_BINS := $(FAQ_MUTANTS:%=$(BUILD)/mutants/bin/mutant_faq_%)
EXTRA_BINS += $(FAQ_MUTANT_BINS)

# One rule per mutant: its source depends on the rung it breaks.
define FAQ_MUTANT_RULE
$(BUILD)/mutants/mutant_faq_$(1).cpp: $(FAQ_MUTANT_FROM_$(1)) tests/faq/faq_mutants.mk
	@mkdir -p $$(dir $$@)
	@sed -e '$(FAQ_MUTANT_SED_$(1))' $$< >$$@.tmp
	@n=$$$$(diff $$< $$@.tmp | grep -c '^[<>]'); if [ "$$$$n" != 2 ]; then \
	  echo "tests/faq/faq_mutants.mk: mutant_faq_$(1) must change exactly one line of $$<, but its sed"; \
	  echo "  changed $$$$((n / 2)): the rung was refactored; update FAQ_MUTANT_SED_$(1)"; \
	  rm -f $$@.tmp; exit 1; fi
	@mv $$@.tmp $$@
	@echo "mutant_faq_$(1): $$$$(diff $$< $$@ | grep '^>' | sed 's/^> *//')"
endef
$(foreach m,$(FAQ_MUTANTS),$(eval $(call FAQ_MUTANT_RULE,$(m))))

$(FAQ_MUTANTS:%=$(BUILD)/obj/mutants/mutant_faq_%.o): $(BUILD)/obj/mutants/%.o: $(BUILD)/mutants/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(FAQ_MUTANT_BINS): $(BUILD)/mutants/bin/%: $(BUILD)/obj/mutants/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

# `make bugs`: every replayed bug, its source, its symptom on the broken copy and the test that catches it.
BUGS_BINS := $(FAQ_MUTANT_BINS) $(BUILD)/mutants/bin/mutant_stage2_last_microbatch_only \
             $(addprefix $(BUILD)/bin/,stage0_ddp stage1 stage2 stage3 offload)
.PHONY: bugs
bugs: $(BUGS_BINS)
	@bash tests/faq/bugs_check.sh
