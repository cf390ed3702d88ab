# tests/stages/stage3_mutants.mk — deliberately broken copies of stage3, for the tests of the tests:
# tests/stages/test_stage3.cpp runs each one and requires its checks (bitwise equality with stage0_ddp,
# the ledger, the comm ledger, the gather/release timeline) to report the bug. `make tests` builds
# them into $(BUILD)/mutants/bin/ (the generated sources go to $(BUILD)/mutants/).
#
#   keep_gathered          release_unit frees nothing; a unit is gathered afresh whenever no
#                          prefetch is in flight, so training stays exact: only the memory is wrong
#   reuse_embedding        the LM head reuses the embedding gathered for the input (kept alive
#                          through the forward instead of gathered again): exact numbers, but three
#                          units alive at once and fewer gathers than the formula
#   prefetch_across_steps  the embedding is prefetched for the next micro-step as soon as the
#                          backward is done: right between micro-steps, but across a step it is
#                          gathered before the optimizer updates it, and the next step trains on
#                          stale parameters
#
# Each sed must change exactly STAGE3_MUTANT_LINES_<name> lines: if a refactor of stage3 makes a
# pattern miss, the build stops and names the mutant to fix, so a mutant never silently becomes
# stage3 again.
STAGE3_MUTANTS := keep_gathered reuse_embedding prefetch_across_steps
STAGE3_MUTANT_SED_keep_gathered := \
  -e 's/auto release_unit = \[&\](int u) { gathered\[u\]\.release(); };/auto release_unit = [\&](int u) {};/' \
  -e 's/if (gathered\[u\]\.empty()) gather_start(u);/if (!in_flight[u].active()) gather_start(u);/'
STAGE3_MUTANT_LINES_keep_gathered := 2
STAGE3_MUTANT_SED_reuse_embedding := \
  -e 's/^\( *\)release_unit(u); *\/\/ release: unit u, until it is needed again$$/\1if (u != EMBED) release_unit(u);/' \
  -e 's/prefetch(u < LNF ? u + 1 : EMBED);/if (u < LNF) prefetch(u + 1);/'
STAGE3_MUTANT_LINES_reuse_embedding := 2
STAGE3_MUTANT_SED_prefetch_across_steps := \
  -e 's/^\( *\)release_unit(u); *\/\/ release: unit u, until the next forward$$/\1u == EMBED ? prefetch(EMBED) : release_unit(u);/'
STAGE3_MUTANT_LINES_prefetch_across_steps := 1

include tests/lib/mutants.mk
$(eval $(call train_mutants,STAGE3,stage3,stage3,tests/stages/stage3_mutants.mk))
