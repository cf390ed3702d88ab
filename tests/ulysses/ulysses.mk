# tests/ulysses/ulysses.mk — the single-process reference ulysses is held to bit for bit
# (tests/ulysses/ulysses_reference.cpp), a test-only trainer: `make tests` builds it into
# $(BUILD)/mutants/bin/ulysses_reference, beside the deliberately broken ones.
ULYSSES_REFERENCE := $(BUILD)/mutants/bin/ulysses_reference
EXTRA_BINS += $(ULYSSES_REFERENCE)
$(ULYSSES_REFERENCE): $(BUILD)/obj/tests/ulysses/ulysses_reference.o $(LIB) $(LINK_EXTRA)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $< $(LIB) $(LINK_EXTRA) $(LDLIBS) -o $@
