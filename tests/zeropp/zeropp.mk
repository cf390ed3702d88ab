# tests/zeropp/zeropp.mk — the ZeRO++ tests' binaries (tests/zeropp/test_*.cpp -> $(BUILD)/tests/),
# built by `make all` beside the others.
ZEROPP_TEST_BINS := $(patsubst tests/zeropp/%.cpp,$(BUILD)/tests/%,$(wildcard tests/zeropp/test_*.cpp))
EXTRA_BINS += $(ZEROPP_TEST_BINS)

$(BUILD)/obj/tests/zeropp/%.o: tests/zeropp/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -Itests -Itests/lib -c $< -o $@

$(ZEROPP_TEST_BINS): $(BUILD)/tests/%: $(BUILD)/obj/tests/zeropp/%.o $(BUILD)/obj/tests/gtest_mpi_main.o $(LIB) $(LINK_EXTRA)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $^ -lgtest $(LDLIBS) -o $@

# The fake-quant reference (tests/zeropp/fake_quant_ddp.cpp): $(BUILD)/bin/zeropp_reference.
EXTRA_BINS += $(BUILD)/bin/zeropp_reference
$(BUILD)/obj/tests/zeropp/fake_quant_ddp.o: tests/zeropp/fake_quant_ddp.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@
$(BUILD)/bin/zeropp_reference: $(BUILD)/obj/tests/zeropp/fake_quant_ddp.o $(LIB) $(LINK_EXTRA)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $< $(LIB) $(LINK_EXTRA) $(LDLIBS) -o $@
