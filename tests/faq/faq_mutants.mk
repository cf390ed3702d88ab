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
# last_microbatch_only.) Each sed must change exactly one line (tests/lib/make_mutant.sh): if a refactor
# of the rung makes a pattern miss, the build stops and names the mutant to fix.
# One set per rung (tests/lib/mutants.mk: the shared recipe), all named mutant_faq_<name>.
FAQ_OFFLOAD_MUTANTS := offload_copy_grads
FAQ_OFFLOAD_MUTANT_SED_offload_copy_grads := -e 's/landing\.data(), owned(u), run\.grad_average_scale(), k == 0,/landing.data(), owned(u), run.grad_average_scale(), true,/'
FAQ_STAGE2_MUTANTS := clip_not_applied norm_local_shard norm_loss_scaled
FAQ_STAGE2_MUTANT_SED_clip_not_applied := -e 's/const float scale = clip_scale(norm, run\.args\.clip) \/ run\.loss_scale();/const float scale = 1.0f \/ run.loss_scale();/'
FAQ_STAGE2_MUTANT_SED_norm_local_shard := -e 's/^\( *\)comm\.sum_scalars(&sq, 1);/\1(void)sq;/'
FAQ_STAGE2_MUTANT_SED_norm_loss_scaled := -e 's/const double norm = std::sqrt(sq) \/ run\.loss_scale();/const double norm = std::sqrt(sq);/'
FAQ_DDP_MUTANTS := ddp_grads_not_zeroed
FAQ_DDP_MUTANT_SED_ddp_grads_not_zeroed := -e 's/accumulate_grads(dt, G(u), unit_grad\.data(), numel(u), 1\.0f, k == 0);/accumulate_grads(dt, G(u), unit_grad.data(), numel(u), 1.0f, false);/'
$(foreach m,$(FAQ_OFFLOAD_MUTANTS),$(eval FAQ_OFFLOAD_MUTANT_LINES_$(m) := 1))
$(foreach m,$(FAQ_STAGE2_MUTANTS),$(eval FAQ_STAGE2_MUTANT_LINES_$(m) := 1))
$(foreach m,$(FAQ_DDP_MUTANTS),$(eval FAQ_DDP_MUTANT_LINES_$(m) := 1))

include tests/lib/mutants.mk
$(eval $(call train_mutants,FAQ_OFFLOAD,faq,offload,tests/faq/faq_mutants.mk))
$(eval $(call train_mutants,FAQ_STAGE2,faq,stage2,tests/faq/faq_mutants.mk))
$(eval $(call train_mutants,FAQ_DDP,faq,stage0_ddp,tests/faq/faq_mutants.mk))
FAQ_MUTANT_BINS := $(FAQ_OFFLOAD_MUTANT_BINS) $(FAQ_STAGE2_MUTANT_BINS) $(FAQ_DDP_MUTANT_BINS)

# `make bugs`: every replayed bug, its source, its symptom on the broken copy and the test that catches it.
BUGS_BINS := $(FAQ_MUTANT_BINS) $(BUILD)/mutants/bin/mutant_stage2_last_microbatch_only \
             $(addprefix $(BUILD)/bin/,stage0_ddp stage1 stage2 stage3 offload)
.PHONY: bugs
bugs: $(BUGS_BINS)
	@bash tests/faq/bugs_check.sh
