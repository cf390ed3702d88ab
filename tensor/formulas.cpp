// formulas.cpp — a tensor rank's bytes and elements, term by term (formulas.h).
#include "tensor/formulas.h"

#include <algorithm>
#include <cstdio>

#include "pipeline/pipeline.h"  // PipelinePlan, activation_slots, schedule_name
#include "tensor/tensor.h"  // padded_vocab, TensorPlan

namespace nz {

StateBytes tensor_state_bytes(const Layout& mine, DType dt, int zero) {
  const uint64_t e = dtype_bytes(dt), P = mine.padded_total, U = mine.max_unit_padded;
  const uint64_t O = zero == 1 ? mine.shard_total : P;  // the optimizer's elements
  StateBytes b;
  b.params = e * P;
  b.grads = e * P + e * U;
  b.master = dt != DType::F32 ? 4 * O : 0;
  b.adam_m = 4 * O;
  b.adam_v = 4 * O;
  return b;
}

uint64_t tensor_param_formula(const GPTConfig& c, int T) {
  const uint64_t C = c.dim, L = c.layers, V = padded_vocab(c.vocab, T);
  const uint64_t split = V * C + L * (12 * C * C + 7 * C);  // wte; qkv_w, attproj_w, fc_w, fcproj_w, qkv_b, fc_b
  const uint64_t whole = uint64_t(c.ctx) * C + L * 6 * C + 2 * C;  // wpe; ln1, ln2, attproj_b, fcproj_b; lnf
  return split / T + whole;
}

uint64_t tensor_activation_bytes(const GPTConfig& c, int T, DType dt, int B, int S, bool sp, int u0, int u1,
                                 int slots) {
  auto r = [](uint64_t n) { return (n + 63) / 64 * 64; };
  const uint64_t e = dtype_bytes(dt), BT = uint64_t(B) * S, C = c.dim, V = padded_vocab(c.vocab, T);
  const uint64_t R = (BT + T - 1) / T * T, Rl = sp ? BT / T : BT;  // Rl: the residual stream's rows
  const int U = c.layers + 2;
  if (u1 < 0) u1 = U;
  const bool head = u1 == U;                                                       // lnf, the head, the loss
  const uint64_t blocks = std::max(0, std::min(u1, U - 1) - std::max(u0, 1));      // my blocks
  const uint64_t block = 4 * r(Rl * C * e) + r(BT * 3 * C / T * e) + r(uint64_t(B) * c.heads / T * S * S * e) +
                         r(BT * C / T * e) + 2 * r(BT * 4 * C / T * e) + 4 * r(4 * Rl);
  const uint64_t x0 = u0 <= 1 ? r(Rl * C * e) : 0, input = u0 >= 2 ? r(Rl * C * e) : 0;
  const uint64_t head_terms = head ? r(BT * C * e) + (sp ? r(Rl * C * e) : 0) + 2 * r(4 * Rl) + r(BT * V / T * e) +
                                         r(4 * BT) : 0;
  const uint64_t tokens = 2 * r(4 * BT);  // the tokens and the targets
  const uint64_t per_slot = blocks * block + x0 + input + head_terms + tokens;
  const uint64_t grads = 4 * r(Rl * C * e) + r(BT * 4 * C / T * e) + r(BT * 3 * C / T * e) +
                         (sp ? 2 * r(BT * C * e) : 0);
  const uint64_t rows = head ? 3 * r(4 * R) + r(4 * T * R) : 0;
  // the Trainer's model of the embedding at one position (its ActLayout at s = 1, units [0, 1)):
  // x0 (b,1,C), the activation grads of one block (4 of (b,1,C), (b,1,4C), (b,1,3C)), the tokens
  const uint64_t BC = uint64_t(B) * C;
  const uint64_t batch_holder = 5 * r(BC * e) + r(4 * BC * e) + r(3 * BC * e) + r(4 * uint64_t(B));
  return uint64_t(slots) * per_slot + grads + rows + batch_holder;
}

StateBytes tensor3d_state_bytes(const Layout& mine, DType dt, int zero, int u0, int u1, bool last) {
  const uint64_t e = dtype_bytes(dt);
  uint64_t P = 0, U = 0, O = 0;
  for (int u = u0; u < u1; u++) {
    P += mine.units[u].padded;
    U = std::max<uint64_t>(U, mine.units[u].padded);
    O += zero == 1 ? mine.units[u].padded / mine.world : mine.units[u].padded;  // the optimizer's elements
  }
  const uint64_t head = last ? mine.units[mine.embed_unit()].tensors[0].numel : 0;  // my V'/T rows of wte
  StateBytes b;
  b.params = e * P + e * head;
  b.grads = e * P + e * U + e * head;
  b.master = dt != DType::F32 ? 4 * O : 0;
  b.adam_m = 4 * O;
  b.adam_v = 4 * O;
  return b;
}

TensorComm tensor3d_comm_elems(const GPTConfig& c, int T, int D, const Layout& mine, int B, int S, int accum,
                               bool sp, int u0, int u1, bool first, bool last) {
  const uint64_t BT = uint64_t(B) * S, C = c.dim, R = (BT + T - 1) / T * T, K = accum;
  const uint64_t blocks = std::max(0, std::min(u1, c.layers + 1) - std::max(u0, 1));
  const uint64_t embed = u0 == 0, head = last;  // the embedding's g (and SP's gather back); lnf and the head
  uint64_t Ps = 0;
  for (int u = u0; u < u1; u++) Ps += mine.units[u].padded;
  TensorComm x;
  x.all_reduce = 2 * uint64_t(D - 1) * Ps / D;  // over the replicas, once per step (--zero 1: as many elements)
  if (!sp) {
    x.all_reduce += K * 2 * (T - 1) * ((4 * blocks + embed + head) * BT * C + head * 2 * R) / T;
    x.all_gather = K * head * uint64_t(T - 1) * R;
  } else {
    const uint64_t slice = uint64_t(T - 1) * BT * C / T;
    x.all_reduce += K * 2 * (T - 1) * (head * 2 * R + (2 * blocks + head) * 2 * C) / T;
    x.all_gather = K * (head * uint64_t(T - 1) * R + (6 * blocks + embed + head) * slice);
    x.reduce_scatter = K * (4 * blocks + embed + head) * slice;
  }
  const uint64_t boundary = sp ? BT * C / T : BT * C, wte_rows = uint64_t(padded_vocab(c.vocab, T)) / T * C;
  x.point_to_point = K * (!last) * boundary + K * (!first) * boundary + (last ? K * wte_rows : 0) +
                     (first ? wte_rows : 0);
  return x;
}

std::string tensor3d_report_json(const GPTConfig& c, const TensorPlan& plan, const PipelinePlan& pipe,
                                 const Layout& mine, DType dt, int B, int S, int accum) {
  std::string units;
  for (size_t i = 0; i < pipe.first_unit.size(); i++) units += (i ? ", " : "") + std::to_string(pipe.first_unit[i]);
  const int last = plan.segments - 1;
  const StateBytes s = tensor3d_state_bytes(mine, dt, plan.zero, 0, pipe.first_unit[1], last == 0);
  char j[768];
  snprintf(j, sizeof j,
           "{\"tensor\": %d, \"pipeline\": %d, \"replicas\": %d, \"zero\": %d, \"sequence_parallel\": %s, "
           "\"schedule\": \"%s\", \"first_unit\": [%s], \"padded_vocab\": %d, \"rank0_state_bytes\": %llu, "
           "\"rank0_activation_bytes\": %llu, \"rank0_comm_elems_per_step\": %llu}",
           plan.tensor, plan.segments, plan.replicas, plan.zero, plan.sp ? "true" : "false",
           schedule_name(pipe.schedule), units.c_str(), padded_vocab(c.vocab, plan.tensor),
           (unsigned long long)s.total(),
           (unsigned long long)tensor_activation_bytes(c, plan.tensor, dt, B, S, plan.sp, 0, pipe.first_unit[1],
                                                       activation_slots(pipe.schedule, plan.segments, 0, accum)),
           (unsigned long long)tensor3d_comm_elems(c, plan.tensor, plan.replicas, mine, B, S, accum, plan.sp, 0,
                                                   pipe.first_unit[1], true, last == 0).total());
  return j;
}

TensorComm tensor_comm_elems(const GPTConfig& c, int T, int D, const Layout& mine, int B, int S, int accum,
                             bool sp) {
  const uint64_t BT = uint64_t(B) * S, C = c.dim, R = (BT + T - 1) / T * T, K = accum, L = c.layers;
  const uint64_t replicas = 2 * uint64_t(D - 1) * mine.padded_total / D;  // once per step
  TensorComm x;
  if (!sp) {
    const uint64_t per_micro = (4 * L + 2) * BT * C + 2 * R;  // all-reduced over T
    x.all_reduce = K * 2 * (T - 1) * per_micro / T + replicas;
    x.all_gather = K * uint64_t(T - 1) * R;
    return x;
  }
  const uint64_t slice = uint64_t(T - 1) * BT * C / T;  // an all-gather's or a reduce-scatter's of b s C
  x.all_reduce = K * 2 * (T - 1) * (2 * R + (2 * L + 1) * 2 * C) / T + replicas;
  x.all_gather = K * (uint64_t(T - 1) * R + (6 * L + 2) * slice);
  x.reduce_scatter = K * (4 * L + 2) * slice;
  return x;
}

std::string tensor_report_json(const GPTConfig& c, int T, int D, const Layout& mine, DType dt, int B, int S,
                               int accum, int zero, bool sp) {
  const StateBytes s = tensor_state_bytes(mine, dt, zero);
  const TensorComm x = tensor_comm_elems(c, T, D, mine, B, S, accum, sp);
  char j[512];
  snprintf(j, sizeof j,
           "{\"tensor\": %d, \"replicas\": %d, \"zero\": %d, \"sequence_parallel\": %s, \"padded_vocab\": %d, "
           "\"params_per_rank\": %llu, "
           "\"state_bytes\": %llu, \"activation_bytes\": %llu, \"step_all_reduce_elems\": %llu, "
           "\"step_all_gather_elems\": %llu, \"step_reduce_scatter_elems\": %llu}",
           T, D, zero, sp ? "true" : "false", padded_vocab(c.vocab, T), (unsigned long long)mine.num_params,
           (unsigned long long)s.total(),
           (unsigned long long)tensor_activation_bytes(c, T, dt, B, S, sp), (unsigned long long)x.all_reduce,
           (unsigned long long)x.all_gather, (unsigned long long)x.reduce_scatter);
  return j;
}

}  // namespace nz
