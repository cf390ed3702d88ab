# tests/ulysses/mutants.mk — deliberately broken copies of ulysses, for the tests of the tests:
# tests/ulysses/test_ulysses.cpp runs each one and requires the bit-for-bit check against the
# single-process reference (tests/ulysses/ulysses_reference.cpp) to report a difference. `make tests`
# builds them into $(BUILD)/mutants/bin/ (sources: $(BUILD)/mutants/). The first three are copies of
# ulysses/train.cpp; the ring_ ones are copies of ulysses/ring.cpp, linked before the library with
# the real train.cpp (the library's ring.o is then never pulled in).
#
#   heads_tokens_swapped  the all-to-all's layout with heads and tokens swapped: slot j of the exchange
#                         gets a contiguous 1/S of my tokens with every head (a split by tokens)
#                         instead of all my tokens with head group j (a split by heads); the bytes
#                         are as many, the receiver reads them as its heads of rank j's tokens
#   positions_not_offset  every slice takes the positions 0 .. T/S-1 (wpe's first rows) for its
#                         tokens, not those of its place in the sequence
#   causal_mask_local     attention runs on each slice's T/S tokens as a sequence of its own: the
#                         causal mask in local positions (and no token sees an earlier slice)
#   ring_no_running_max   ring mode's online softmax without the rescale: what a key tile adds is
#                         relative to the new running max, what was accumulated stays relative to
#                         the old one (exp(m_old - m_new) dropped)
#   ring_causal_mask_local ring mode's causal mask (and its tile skipping) in local positions, a
#                         token's index among its rank's T/S, instead of its place in the sequence
#   ring_zigzag_positions_unmatched ring mode's tokens in the zig-zag order (chunks s and 2S-1-s),
#                         their positions those of a contiguous slice (s T/S on)
#
# Each sed must change exactly ULYSSES_MUTANT_LINES_<name> lines: if a change to ulysses makes a
# pattern miss, the build stops and names the mutant to fix.
ULYSSES_MUTANTS := heads_tokens_swapped positions_not_offset causal_mask_local
ULYSSES_RING_MUTANTS := ring_no_running_max ring_causal_mask_local ring_zigzag_positions_unmatched
ULYSSES_MUTANT_SED_heads_tokens_swapped := \
  -e 's/^\( *\)tok + ((size_t(b) \* Tl + t) \* parts \* C + p \* C + j \* Ch) \* e, Ch \* e);$$/\1tok + (size_t(b) * Tl * parts * C + j * Tl * row \/ e + (size_t(t) * parts + p) * Ch) * e, Ch * e);/'
ULYSSES_MUTANT_LINES_heads_tokens_swapped := 1
ULYSSES_MUTANT_SED_positions_not_offset := \
  -e 's/t\.seq\.first_position = s \* (T \/ S);/t.seq.first_position = 0;/'
ULYSSES_MUTANT_LINES_positions_not_offset := 1
ULYSSES_MUTANT_SED_causal_mask_local := \
  -e 's/model\.attention(u, T);/model.attention(u, T \/ S);/' \
  -e 's/model\.attention_backward(u, T);/model.attention_backward(u, T \/ S);/'
ULYSSES_MUTANT_LINES_causal_mask_local := 2
ULYSSES_MUTANT_SED_ring_no_running_max := \
  -e 's/const A rescale = std::exp(m\[row\] - m_new);/const A rescale = 1;/'
ULYSSES_MUTANT_LINES_ring_no_running_max := 1
ULYSSES_MUTANT_SED_ring_causal_mask_local := \
  -e 's/return (h == 0 ? r : 2 \* d\.S - 1 - r) \* c + i;/return h * c + i;/'
ULYSSES_MUTANT_LINES_ring_causal_mask_local := 1
ULYSSES_MUTANT_SED_ring_zigzag_positions_unmatched := \
  -e 's/t\.seq\.first_position = s \* (T \/ (2 \* S));/t.seq.first_position = s * (T \/ S);/' \
  -e 's/t\.seq\.second_position = (2 \* S - 1 - s) \* (T \/ (2 \* S));/t.seq.second_position = s * (T \/ S) + T \/ (2 * S);/'
ULYSSES_MUTANT_LINES_ring_zigzag_positions_unmatched := 2

include tests/lib/mutants.mk
$(eval $(call train_mutants,ULYSSES,ulysses,ulysses,tests/ulysses/mutants.mk))

# The ring's mutants: ulysses/ring.cpp with sed's changes, linked with the real ulysses/train.o
ULYSSES_RING_MUTANT_BINS := $(ULYSSES_RING_MUTANTS:%=$(BUILD)/mutants/bin/mutant_ulysses_%)
EXTRA_BINS += $(ULYSSES_RING_MUTANT_BINS)
$(ULYSSES_RING_MUTANTS:%=$(BUILD)/mutants/mutant_ulysses_%_ring.cpp): \
    $(BUILD)/mutants/mutant_ulysses_%_ring.cpp: ulysses/ring.cpp tests/ulysses/mutants.mk \
    tests/lib/make_mutant.sh
	@mkdir -p $(dir $@)
	@bash tests/lib/make_mutant.sh tests/ulysses/mutants.mk mutant_ulysses_$* \
	  $(ULYSSES_MUTANT_LINES_$*) $< $@ $(ULYSSES_MUTANT_SED_$*)
$(ULYSSES_RING_MUTANTS:%=$(BUILD)/obj/mutants/mutant_ulysses_%_ring.o): \
    $(BUILD)/obj/mutants/%.o: $(BUILD)/mutants/%.cpp $(MUTANT_GCH)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@
$(ULYSSES_RING_MUTANT_BINS): $(BUILD)/mutants/bin/mutant_ulysses_%: \
    $(BUILD)/obj/mutants/mutant_ulysses_%_ring.o $(BUILD)/obj/ulysses/train.o $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $(filter %.o,$^) $(LIB) $(LDLIBS) -o $@
