// zero_formulas.cpp — the per-rank bytes of each ZeRO stage, written the way the paper writes them.
#include "zero_formulas.h"

#include <algorithm>  // std::max

#include "check.h"

namespace nz {

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::DDP: return "stage0_ddp";
    case Stage::Z1: return "stage1";
    case Stage::Z2: return "stage2";
    case Stage::Z3: return "stage3";
    case Stage::Offload: return "offload";
  }
  return "?";
}

bool parse_stage(const std::string& s, Stage* out) {
  for (Stage st : {Stage::DDP, Stage::Z1, Stage::Z2, Stage::Z3, Stage::Offload})
    if (s == stage_name(st) || (s == "0" && st == Stage::DDP) || (s == "1" && st == Stage::Z1) ||
        (s == "2" && st == Stage::Z2) || (s == "3" && st == Stage::Z3)) {
      *out = st;
      return true;
    }
  return false;
}

uint64_t StateBytes::of(Category c) const {
  switch (c) {
    case Category::Params: return params;
    case Category::Grads: return grads;
    case Category::Master: return master;
    case Category::AdamM: return adam_m;
    case Category::AdamV: return adam_v;
    case Category::CommBuffers: return comm_buffers;
    case Category::Gathered: return gathered_peak;
    default: return 0;
  }
}

Layout paper_layout(uint64_t psi, int world) {
  Layout L;
  L.world = world;
  L.num_params = psi;
  L.padded_total = (psi + world - 1) / world * world;
  L.shard_total = L.padded_total / world;
  L.max_unit_padded = 0;
  return L;
}

StateBytes expected_state_bytes(Stage stage, const Layout& L, DType dt) {
  const uint64_t P = L.padded_total, S = L.shard_total, U = L.max_unit_padded;
  const uint64_t e = dtype_bytes(dt);
  const bool mixed = dt != DType::F32;  // bf16, fp16: an fp32 master copy (the paper's K = 12)
  StateBytes b;
  switch (stage) {
    case Stage::DDP:  // everything, everywhere
      b.params = e * P;
      // the full gradient, accumulated locally over the micro-steps and all-reduced in place once
      // per step, plus one unit's gradient of the current micro-step on its way into it
      b.grads = e * P + e * U;
      b.master = mixed ? 4 * P : 0;
      b.adam_m = 4 * P;
      b.adam_v = 4 * P;
      break;
    case Stage::Z1:  // P_os: optimizer state sharded
      b.params = e * P;
      b.grads = e * P + e * U;  // still full: accumulated locally, reduce-scattered once per step
      b.master = mixed ? 4 * S : 0;
      b.adam_m = 4 * S;
      b.adam_v = 4 * S;
      break;
    case Stage::Z2:  // P_os+g: gradients sharded too
      b.params = e * P;
      b.grads = e * S;
      b.master = mixed ? 4 * S : 0;
      b.adam_m = 4 * S;
      b.adam_v = 4 * S;
      b.comm_buffers = e * U;  // the bucket: a unit's full gradient lives only here, until reduce-scattered
      break;
    case Stage::Z3: {  // P_os+g+p: parameters sharded too; units gathered only while in use
      b.params = e * S;
      b.grads = e * S;
      b.master = mixed ? 4 * S : 0;
      b.adam_m = 4 * S;
      b.adam_v = 4 * S;
      b.comm_buffers = e * U;
      // Gathered: each unit is gathered into a buffer of its own padded size. The gather order of
      // a micro-step is embed, block 1..L, lnf, embed (LM head), lnf, block L..1, and with prefetch
      // a unit's successor in that order is gathered while it computes, then the unit is released:
      // two neighbours alive at once, never more. The neighbours are the units next to each other
      // on the cycle embed, block 1, ..., block L, lnf (lnf -> embed at the LM head); nothing is
      // prefetched across micro-steps or steps (the optimizer changes the parameters in between).
      // So the peak is the largest sum of two cyclic neighbours: 2eU when two equal blocks are the
      // largest units (every preset), less when they are not (one layer: embed + block).
      // With --prefetch 0 one unit at a time is alive: eU, under this bound.
      for (int u = 0; u < L.num_units(); u++) {
        const Unit &a = L.units[u], &next = L.units[(u + 1) % L.num_units()];
        b.gathered_peak = std::max(b.gathered_peak, e * (a.padded + next.padded));
      }
      break;
    }
    case Stage::Offload:  // stage2 on the device; grads shard, master, moments on the host
      b.params = e * P;
      b.grads = e * S;
      b.master = 4 * S;  // the host updates an fp32 copy of the slice, in fp32 mode too
      b.adam_m = 4 * S;
      b.adam_v = 4 * S;
      b.comm_buffers = e * U;
      // (the host also stages one unit's reduced slice, eU/N, as scratch; with --offload-to disk
      // master, m, v are on disk and the host holds three chunk buffers, scratch too)
      b.host = b.grads + b.master + b.adam_m + b.adam_v;
      break;
  }
  return b;
}

uint64_t expected_comm_elems(Stage stage, const Layout& L, int accum) {
  const uint64_t N = L.world, S = L.shard_total, K = accum;
  switch (stage) {
    case Stage::DDP:
    case Stage::Z1: return 2 * (N - 1) * S;
    case Stage::Z2:
    case Stage::Offload: return K * (N - 1) * S + (N - 1) * S;
    case Stage::Z3: return K * 3 * (N - 1) * S;
  }
  return 0;
}

uint64_t expected_overflow_flag_elems(const Layout& L, DType dt) {
  return dt == DType::F16 ? uint64_t(L.world - 1) : 0;
}

uint64_t expected_link_elems(Stage stage, const Layout& L, int accum) {
  if (stage != Stage::Offload) return 0;
  return uint64_t(accum) * L.shard_total + L.shard_total;
}

}  // namespace nz
