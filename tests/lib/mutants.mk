# tests/lib/mutants.mk — the rules that every set of broken trainers shares (tests/*/*mutants.mk):
# a mutant is a rung's train.cpp with sed's changes, cut by tests/lib/make_mutant.sh (which stops
# the build unless exactly the lines it expects changed), compiled and linked against the library
# into $(BUILD)/mutants/bin/mutant_<set>_<name> (its source in $(BUILD)/mutants/).
#   $(eval $(call train_mutants,VAR,SET,RUNG,MKFILE))
# VAR_MUTANTS lists the names; for each, VAR_MUTANT_SED_<name> holds sed's arguments (-e '...'
# each) and VAR_MUTANT_LINES_<name> how many lines they change. Included by each set's file first
# (make includes tests/*/*.mk in name order), and again by that wildcard: it defines, it adds no rule.
define train_mutants
$(1)_MUTANT_BINS := $$($(1)_MUTANTS:%=$$(BUILD)/mutants/bin/mutant_$(2)_%)
EXTRA_BINS += $$($(1)_MUTANT_BINS)

$$($(1)_MUTANTS:%=$$(BUILD)/mutants/mutant_$(2)_%.cpp): $$(BUILD)/mutants/mutant_$(2)_%.cpp: $(3)/train.cpp $(4) \
    tests/lib/make_mutant.sh
	@mkdir -p $$(dir $$@)
	@bash tests/lib/make_mutant.sh $(4) mutant_$(2)_$$* $$($(1)_MUTANT_LINES_$$*) $$< $$@ $$($(1)_MUTANT_SED_$$*)

$$($(1)_MUTANTS:%=$$(BUILD)/obj/mutants/mutant_$(2)_%.o): $$(BUILD)/obj/mutants/%.o: $$(BUILD)/mutants/%.cpp $$(MUTANT_GCH)
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(CXXFLAGS) -c $$< -o $$@

$$($(1)_MUTANT_BINS): $$(BUILD)/mutants/bin/%: $$(BUILD)/obj/mutants/%.o $$(LIB)
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(LDFLAGS) $$< $$(LIB) $$(LDLIBS) -o $$@
endef
