# tests/zeropp/zeropp.mk — the fake-quant reference ZeRO++ is held to (tests/zeropp/fake_quant_ddp.cpp),
# a test-only trainer: `make tests` builds it into $(BUILD)/mutants/bin/zeropp_reference, beside the
# deliberately broken ones (build/bin holds only what a learner runs).
ZEROPP_REFERENCE := $(BUILD)/mutants/bin/zeropp_reference
EXTRA_BINS += $(ZEROPP_REFERENCE)
$(ZEROPP_REFERENCE): $(BUILD)/obj/tests/zeropp/fake_quant_ddp.o $(LIB) $(LINK_EXTRA)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $< $(LIB) $(LINK_EXTRA) $(LDLIBS) -o $@

# The CUDA quantizer against the CPU's, bit for bit, on the CUDA emulator: `make emu` builds
# tests/zeropp/test_cuda_quantize.cpp into build/emu/tests (dev/emu.mk builds tests/cuda's itself;
# this file is read before it, hence the folder spelled out); tests/cuda/emu_check.sh runs it.
ZEROPP_EMU_TEST := $(BUILD)/emu/tests/test_cuda_quantize
emu: $(ZEROPP_EMU_TEST)
$(ZEROPP_EMU_TEST): $(BUILD)/emu/obj/tests/zeropp/test_cuda_quantize.o $(BUILD)/emu/obj/tests/lib/gtest_mpi_main.o \
                    $(BUILD)/emu/libnanozero_emu.a
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $^ -lgtest $(EMU_LIBS) -o $@
