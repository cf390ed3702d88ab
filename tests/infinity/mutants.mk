# tests/infinity/mutants.mk — deliberately broken copies of infinity, for the tests of the tests:
# tests/infinity/test_infinity.cpp runs each one and requires its checks (stage3's bits, the
# ledger) to report the bug. `make tests` builds them into $(BUILD)/mutants/bin/ (sources:
# $(BUILD)/mutants/).
#
#   stale_slice          the updated slice is written back after the next step's forward has
#                        gathered the unit: every forward trains on the previous step's parameters
#   prefetch_wrong_unit  the backward prefetches the unit after the next one: the numbers stay
#                        right (each unit is gathered when it is needed, the wrong one waits for
#                        its turn) but three units are alive at once (with 3 layers or more):
#                        only the ledger sees it
#   grad_slice_not_down  the reduced gradient slice is never copied down to the host: the host
#                        accumulates whatever its landing buffer held (and the link counts miss it)
#
# Each sed must change exactly INFINITY_MUTANT_LINES_<name> lines: if a refactor of infinity makes a
# pattern miss, the build stops and names the mutant to fix.
INFINITY_MUTANTS := stale_slice prefetch_wrong_unit grad_slice_not_down
INFINITY_MUTANT_SED_stale_slice := \
  -e 's/^      params\.write_back(u, outbox(u));$$/      ;  \/\/ (written back in the next forward)/' \
  -e 's/^\( *\)const void\* p = gather_unit(u); *\/\/ all-gather: unit u, just before it runs$$/&\n\1if (k == 0) params.write_back(u, outbox(u));/'
INFINITY_MUTANT_LINES_stale_slice := 2
INFINITY_MUTANT_SED_prefetch_wrong_unit := \
  -e 's/if (u - 1 > EMBED) prefetch(u - 1);/if (u - 2 > EMBED) prefetch(u - 2);/'
INFINITY_MUTANT_LINES_prefetch_wrong_unit := 1
INFINITY_MUTANT_SED_grad_slice_not_down := \
  -e 's/^\( *\)to_host(landing\.data(), mine, owned(u));$$/\1(void)to_host;  \/\/ (never copied down)/'
INFINITY_MUTANT_LINES_grad_slice_not_down := 1

include tests/lib/mutants.mk
$(eval $(call train_mutants,INFINITY,infinity,infinity,tests/infinity/mutants.mk))
