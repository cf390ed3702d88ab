# tests/muon/muon.mk — deliberately broken copies of Muon (a line or two of common/muon.cpp or
# common/muon_formulas.cpp), for the tests of the tests: tests/muon/test_muon_stages.cpp runs each as
# stage2 (its train.o linked with the broken file before the library, whose symbols it replaces) and
# requires the contract against stage0_ddp with Muon, or the ledger against the formulas, to report
# the bug. `make tests` builds them into $(BUILD)/mutants/bin/.
#
#   ns_on_slice        each owner runs Newton–Schulz on its own rows of a cut matrix, not the whole one
#   update_twice       a matrix's orthogonalised update is applied twice to the same elements (what two
#                      owners that both update one element do)
#   embedding_to_muon  the token embedding wte is sent to Muon as a matrix (it must stay with AdamW)
#   whole_momentum     each rank keeps the momentum of the whole of every matrix it owns part of (the
#                      numbers stay right: only the ledger against the formulas sees it)
#
# Each sed must change exactly MUON_MUTANT_LINES_<name> lines: if a change to muon.cpp makes a pattern
# miss, the build stops and names the mutant to fix.
MUON_MUTANTS := ns_on_slice update_twice embedding_to_muon whole_momentum
MUON_MUTANT_FILE_ns_on_slice := common/muon.cpp
MUON_MUTANT_FILE_update_twice := common/muon.cpp
MUON_MUTANT_FILE_embedding_to_muon := common/muon_formulas.cpp
MUON_MUTANT_FILE_whole_momentum := common/muon.cpp
MUON_MUTANT_SED_ns_on_slice := \
  -e 's|^    newton_schulz(X, rows, cols, work, mc_\.ns_steps);$$|    newton_schulz(X + at, int(len / cols), cols, work, mc_.ns_steps);  // (my rows only)|'
MUON_MUTANT_LINES_ns_on_slice := 1
MUON_MUTANT_SED_update_twice := \
  -e 's/^\(  ops::accumulate<float>(p32 + i, X + at, len, -lr \* rms_match, false);\)$$/\1 \1/'
MUON_MUTANT_LINES_update_twice := 1
MUON_MUTANT_SED_embedding_to_muon := \
  -e 's/^  return ts\.name == "qkv_w" ||/  return ts.name == "wte" || ts.name == "qkv_w" ||/' \
  -e 's/^  if (ts\.name == "qkv_w") return {3 \* C, C};$$/  if (ts.name == "wte") return {256, C};  \/\/ (the vocabulary)\n&/'
MUON_MUTANT_LINES_embedding_to_muon := 2
MUON_MUTANT_SED_whole_momentum := \
  -e 's/^  m_ = Buffer(Category::AdamM, Location::Device, total_ \* sizeof(float),/  m_ = Buffer(Category::AdamM, Location::Device, (total_ + whole_extra(L, owned_)) * sizeof(float),/' \
  -e '/^Muon::Muon(const Layout& L/i static size_t whole_extra(const Layout\& L, const std::vector<Slice>\& own) { size_t x = 0; for (const MuonMatrix\& m : muon_matrices(L)) { const uint64_t lo = std::max(m.begin, own[m.unit].begin), hi = std::min(m.end, own[m.unit].end); if (hi > lo) x += (m.end - m.begin) - (hi - lo); } return x; }  // (the other owners\x27 parts too)'
MUON_MUTANT_LINES_whole_momentum := 2

MUON_MUTANT_BINS := $(MUON_MUTANTS:%=$(BUILD)/mutants/bin/mutant_muon_%)
EXTRA_BINS += $(MUON_MUTANT_BINS)

# one rule per mutant: its source is a copy of the file it breaks
define MUON_MUTANT_SRC_RULE
$(BUILD)/mutants/mutant_muon_$(1).cpp: $(MUON_MUTANT_FILE_$(1)) tests/muon/muon.mk tests/lib/make_mutant.sh
	@mkdir -p $$(dir $$@)
	@bash tests/lib/make_mutant.sh tests/muon/muon.mk mutant_muon_$(1) $$(MUON_MUTANT_LINES_$(1)) $$< $$@ \
	  $$(MUON_MUTANT_SED_$(1))
endef
$(foreach m,$(MUON_MUTANTS),$(eval $(call MUON_MUTANT_SRC_RULE,$(m))))

$(MUON_MUTANTS:%=$(BUILD)/obj/mutants/mutant_muon_%.o): $(BUILD)/obj/mutants/%.o: $(BUILD)/mutants/%.cpp $(MUTANT_GCH)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(MUON_MUTANT_BINS): $(BUILD)/mutants/bin/%: $(BUILD)/obj/mutants/%.o $(BUILD)/obj/stage2/train.o $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $(BUILD)/obj/stage2/train.o $< $(LIB) $(LDLIBS) -o $@
