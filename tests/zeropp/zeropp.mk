# tests/zeropp/zeropp.mk — the fake-quant reference ZeRO++ is held to (tests/zeropp/fake_quant_ddp.cpp),
# a test-only trainer: `make tests` builds it into $(BUILD)/mutants/bin/zeropp_reference, beside the
# deliberately broken ones (build/bin holds only what a learner runs).
ZEROPP_REFERENCE := $(BUILD)/mutants/bin/zeropp_reference
EXTRA_BINS += $(ZEROPP_REFERENCE)
$(ZEROPP_REFERENCE): $(BUILD)/obj/tests/zeropp/fake_quant_ddp.o $(LIB) $(LINK_EXTRA)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $< $(LIB) $(LINK_EXTRA) $(LDLIBS) -o $@
