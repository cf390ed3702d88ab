// formulas.cpp — the pipeline segments' bytes, term by term (formulas.h).
#include "pipeline/formulas.h"

#include <algorithm>  // std::max, std::min

namespace nz {

StateBytes pipeline_segment_bytes(const Layout& L, DType dt, const PipelinePlan& plan, int segment) {
  const uint64_t e = dtype_bytes(dt);
  const bool mixed = dt != DType::F32;
  uint64_t Ps = 0, Us = 0;
  for (int u = plan.first_unit[segment]; u < plan.first_unit[segment + 1]; u++) {
    Ps += L.units[u].padded;
    Us = std::max<uint64_t>(Us, L.units[u].padded);
  }
  const bool tied_copy = segment == plan.segments - 1 && segment != 0;  // the head without the embedding
  const uint64_t VC = uint64_t(L.cfg.vocab) * L.cfg.dim;
  StateBytes b;
  b.params = e * Ps + (tied_copy ? e * VC : 0);
  b.grads = e * Ps + e * Us + (tied_copy ? e * VC : 0);
  const uint64_t Os = plan.zero == 1 ? Ps / plan.replicas : Ps;  // --zero 1: my replica's slice of each unit
  b.master = mixed ? 4 * Os : 0;
  b.adam_m = 4 * Os;
  b.adam_v = 4 * Os;
  return b;
}

uint64_t pipeline_activation_bytes(const GPTConfig& c, int B, int T, DType dt, bool checkpointing, Attention attn,
                                   const PipelinePlan& plan, int segment, int accum) {
  auto r = [](uint64_t n) { return (n + 63) / 64 * 64; };
  const uint64_t BT = uint64_t(B) * T, C = c.dim, H = c.heads, V = c.vocab;
  const uint64_t e = dtype_bytes(dt), f = dt == DType::F64 ? 8 : 4;
  const int first = plan.first_unit[segment], end = plan.first_unit[segment + 1], units = c.layers + 2;
  uint64_t blocks_here = 0;  // units 1..L are the blocks
  for (int u = std::max(first, 1); u < std::min(end, units - 1); u++) blocks_here++;
  const bool has_embed = first == 0, has_head = end == units;
  const uint64_t softmax = attn == Attention::Flash ? r(4 * uint64_t(B) * H * T) : r(uint64_t(B) * H * T * T * e);
  const uint64_t internals = 4 * r(BT * C * e) + r(3 * BT * C * e) + 2 * r(4 * BT * C * e) + softmax + 4 * r(BT * f);
  const uint64_t output = r(BT * C * e);
  const uint64_t blocks = checkpointing ? blocks_here * output + (blocks_here > 0 ? internals : 0)
                                        : blocks_here * (internals + output);
  const uint64_t input = r(BT * C * e);
  const uint64_t head = has_head ? r(BT * C * e) + 2 * r(BT * f) + r(BT * V * e) + r(BT * f) : 0;
  const uint64_t tokens = (has_embed ? r(4 * BT) : 0) + (has_head ? r(4 * BT) : 0);
  const uint64_t grads = 4 * r(BT * C * e) + r(4 * BT * C * e) + r(3 * BT * C * e);
  const uint64_t slots = activation_slots(plan.schedule, plan.segments, segment, accum);
  return slots * (input + blocks + head + tokens) + grads;
}

}  // namespace nz
