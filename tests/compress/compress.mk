# tests/compress/compress.mk — the test-only trainers of tests/compress/test_qat.cpp, built by
# `make tests` into $(BUILD)/mutants/bin (build/bin holds only what a learner runs):
#
#   qat_reference   stage0_ddp with --qat's fake quantization written out in its loop
#                   (tests/compress/qat_reference.cpp), the truth the trainers are held to
#
# and deliberately broken copies of the QAT code in common/ (each a sed of one line of one file,
# compiled and linked before the library, so its symbols replace the library's), on stage0_ddp:
#
#   master_quantized   the model quantizes the parameters it is given in place: in fp32 that is the
#                      master, which then lives on the grid (the optimizer's small steps are lost)
#   backward_exact     a unit's backward computes with the exact weights, not the forward's q(w)
#   per_unit_scale     one scale per unit instead of one per block of --qat-block values
#   skip_ignored       --qat-skip embedding is parsed but the embedding is quantized anyway
#
# Each sed must change exactly one line: if a change to common/ makes a pattern miss, the build
# stops and names the mutant to fix.
QAT_REFERENCE := $(BUILD)/mutants/bin/qat_reference
EXTRA_BINS += $(QAT_REFERENCE)
$(QAT_REFERENCE): $(BUILD)/obj/tests/compress/qat_reference.o $(LIB) $(LINK_EXTRA)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $< $(LIB) $(LINK_EXTRA) $(LDLIBS) -o $@

QAT_MUTANTS := master_quantized backward_exact per_unit_scale skip_ignored
QAT_MUTANT_FILE_master_quantized := common/model.cpp
QAT_MUTANT_SED_master_quantized := s/^  return qat_unit_\.data();$$/  memcpy(const_cast<void*>(p), qat_unit_.data(), n * dtype_bytes(dt_)); return p;/
QAT_MUTANT_FILE_backward_exact := common/model.cpp
QAT_MUTANT_SED_backward_exact := s|^  p = qat_view(u, p, L_\.units\[u\]\.numel);  // q(w), as in the forward$$|  // (the exact weights)|
QAT_MUTANT_FILE_per_unit_scale := common/compression/qat.cpp
QAT_MUTANT_SED_per_unit_scale := s/const BlockQuant bq{q\.bits, q\.block};/const BlockQuant bq{q.bits, n};/
QAT_MUTANT_FILE_skip_ignored := common/compression_setup.cpp
QAT_MUTANT_SED_skip_ignored := s/size_t(args\.qat_block), args\.qat_skip_embed};/size_t(args.qat_block), false};/

QAT_MUTANT_BINS := $(QAT_MUTANTS:%=$(BUILD)/mutants/bin/mutant_qat_%)
EXTRA_BINS += $(QAT_MUTANT_BINS)

# one rule per mutant: its source is a copy of the file it breaks
define QAT_MUTANT_SRC_RULE
$(BUILD)/mutants/mutant_qat_$(1).cpp: $(QAT_MUTANT_FILE_$(1)) tests/compress/compress.mk tests/lib/make_mutant.sh
	@mkdir -p $$(dir $$@)
	@bash tests/lib/make_mutant.sh tests/compress/compress.mk mutant_qat_$(1) 1 $$< $$@ -e '$$(QAT_MUTANT_SED_$(1))'
endef
$(foreach m,$(QAT_MUTANTS),$(eval $(call QAT_MUTANT_SRC_RULE,$(m))))

$(QAT_MUTANTS:%=$(BUILD)/obj/mutants/mutant_qat_%.o): $(BUILD)/obj/mutants/%.o: $(BUILD)/mutants/%.cpp $(MUTANT_GCH)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(QAT_MUTANT_BINS): $(BUILD)/mutants/bin/%: $(BUILD)/obj/mutants/%.o $(BUILD)/obj/stage0_ddp/train.o $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $(BUILD)/obj/stage0_ddp/train.o $< $(LIB) $(LDLIBS) -o $@
