# tests/stages/stage2_mutants.mk — deliberately broken copies of stage2, for the tests of the tests:
# tests/stages/test_zero12.cpp runs each one and requires the very checks that find stage1 and stage2
# equal to stage0_ddp to report a difference. `make tests` builds them into $(BUILD)/mutants/bin/.
#
# Each mutant is stage2/train.cpp with exactly one line changed by sed (the generated source goes
# to $(BUILD)/mutants/). If a refactor of stage2 makes a pattern miss, or hit more than one line,
# the build stops and names the mutant to fix: a mutant can never silently become stage2 again.
#
#   no_average            sums the gradients over ranks and micro-steps instead of averaging them
#   wrong_slice           the optimizer updates (and gathers) slice rank+1 of each unit with the
#                         gradient of slice rank
#   last_microbatch_only  every micro-step overwrites the gradient shard instead of adding to it
#
# (Pointing the reduce-scatter's output at another slice of the bucket is NOT a mutant: the
# reduce-scatter writes the summed slice wherever it is told, and the bucket is scratch, so the
# result is bit for bit stage2's.)
STAGE2_MUTANTS := no_average wrong_slice last_microbatch_only
STAGE2_MUTANT_SED_no_average := -e 's/run\.grad_average_scale()/1.0f/'
STAGE2_MUTANT_LINES_no_average := 1
STAGE2_MUTANT_SED_wrong_slice := -e 's/L\.units\[u\]\.offset + L\.shard(u, rank)\.begin/L.units[u].offset + L.shard(u, (rank + 1) % L.world).begin/'
STAGE2_MUTANT_LINES_wrong_slice := 1
STAGE2_MUTANT_SED_last_microbatch_only := -e '/accumulate_grads(/s/k == 0)/true)/'
STAGE2_MUTANT_LINES_last_microbatch_only := 1

include tests/lib/mutants.mk
$(eval $(call train_mutants,STAGE2,stage2,stage2,tests/stages/stage2_mutants.mk))
