// zero_formulas.cpp — the per-rank bytes of each ZeRO stage, written the way the paper writes them.
#include "zero_formulas.h"

#include <algorithm>  // std::max

#include "runtime/check.h"
#include "kernels/quantize.h"  // BlockQuant: the packed sizes

namespace nz {

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::DDP: return "stage0_ddp";
    case Stage::Z1: return "stage1";
    case Stage::Z2: return "stage2";
    case Stage::Z3: return "stage3";
    case Stage::Offload: return "offload";
    case Stage::Pipeline: return "pipeline";
    case Stage::Infinity: return "infinity";
    case Stage::ZeroPP: return "zeropp";
    case Stage::Tensor: return "tensor";
    case Stage::Ulysses: return "ulysses";
  }
  return "?";
}

bool parse_stage(const std::string& s, Stage* out) {
  for (Stage st : {Stage::DDP, Stage::Z1, Stage::Z2, Stage::Z3, Stage::Offload, Stage::Infinity})
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
    case Stage::Pipeline:  // as an upper bound (a segment holds less: pipeline_segment_bytes)
    case Stage::Tensor:    // as an upper bound (a tensor rank holds less: tensor/formulas.h)
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
    case Stage::Infinity:  // stage3 with every slice off the device: only gathered units and the bucket on it
    case Stage::ZeroPP:  // stage3's, before what ZeRO++ adds (zeropp_state_bytes)
    case Stage::Ulysses:  // stage3's over all N ranks (the sequence slices too); activations: ulysses/formulas.h
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
      if (stage == Stage::Infinity) {
        // ZeRO-Infinity: my parameter and gradient slices, an fp32 master (in fp32 too, as
        // offload: the host updates it and writes the parameter slice back) and m, v off the device
        b.master = 4 * S;
        b.host = b.params + b.grads + b.master + b.adam_m + b.adam_v;
        // (the host also stages one unit's reduced gradient slice, eU/N, as scratch; on disk,
        // three optimizer chunks and two parameter-slice slots of the largest slice)
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
    case Stage::Pipeline:  // the whole model's all-reduce, as stage0_ddp on the D replicas
    case Stage::Tensor:    // (the replicas' part only; the tensor ranks' all-reduces: tensor/formulas.h)
    case Stage::Z1: return 2 * (N - 1) * S;  // recomputation: the full parameters are here already
    case Stage::Z2:
    case Stage::Offload: return K * (N - 1) * S + (N - 1) * S;  // the same
    case Stage::Infinity:  // stage3's collectives: the slices reach them from the host first
    case Stage::ZeroPP:  // stage3's elements (zeropp_comm_bytes: the bytes, inside and across nodes)
    case Stage::Ulysses:  // stage3's, plus the all-to-alls (ulysses/formulas.h)
    case Stage::Z3: {
      // Gathering a unit of padded size p sends this rank's slice p/N to each of the N-1 others:
      // (N-1) p/N. Per micro-step, in slices (s_u = p_u/N, Σ s_u = S, s_E = the embedding's):
      //   forward:  every unit, then the embedding again for the LM head      S + s_E
      //   backward: every unit but the embedding (its backward needs none)     S - s_E
      //   recomputation (checkpointing): each block's forward runs on the parameters its
      //             backward has just gathered, before they are released        0
      //   reduce-scatter of every unit's gradient                                S
      const uint64_t s_E = L.units.empty() ? 0 : L.units[L.embed_unit()].padded / N;
      const uint64_t forward = S + s_E, backward = S - s_E;
      const uint64_t recompute = 0;  // with activation checkpointing or without: the backward's gather serves it
      return K * (N - 1) * (forward + backward + recompute + S);  // = 3K(N-1)S
    }
  }
  return 0;
}

// Activation bytes, term by term. Every saved tensor is its own 64-byte-aligned allocation inside
// one arena, so each term is rounded up to a multiple of 64: r(n) = ⌈n / 64⌉ 64. With BT = B T
// tokens, C channels, H heads, V the vocabulary, e bytes per stored element and f bytes per
// layernorm statistic and loss (4: fp32; 8 in the fp64 tests):
//   a block's internals   4 r(BTCe): ln1, attention output, res_att (x + attention), ln2 (its
//                           input is the previous block's output, counted there);
//                         r(3BTCe): q, k, v;  2 r(4BTCe): fc before and after GELU;
//                         r(B H T^2 e): the softmax, the full T x T of every head (the causal
//                           upper triangle is zeros, kept to keep the kernels plain);
//                           with flash attention in force (kernels.h) r(4 B H T) instead: one
//                           fp32 log-sum-exp per row, whatever e;
//                         4 r(BT f): mean and 1/std of the two layernorms
//   a block's output      r(BTCe): res_out, the next block's input (lnf's for the last)
//   the ends              r(BTCe) x0 (embedding out), r(BTCe) + 2 r(BT f) the final layernorm,
//                         r(BTVe) the logits (then the probabilities, then their gradient),
//                         r(BT f) the per-token losses
//   the backward's grads  one block's worth, reused by every block: 4 r(BTCe) + r(4BTCe) + r(3BTCe)
//   tokens and targets    2 r(4BT)
// Without checkpointing L blocks keep internals and output; with it L outputs and one block's
// internals (the scratch each block is recomputed into).
uint64_t expected_activation_bytes(const GPTConfig& c, int B, int T, DType dt, bool checkpointing,
                                   Attention attn) {
  auto r = [](uint64_t n) { return (n + 63) / 64 * 64; };
  const uint64_t BT = uint64_t(B) * T, C = c.dim, H = c.heads, V = c.vocab, L = c.layers;
  const uint64_t e = dtype_bytes(dt), f = dt == DType::F64 ? 8 : 4;
  const uint64_t softmax = attn == Attention::Flash ? r(4 * uint64_t(B) * H * T) : r(uint64_t(B) * H * T * T * e);
  const uint64_t internals = 4 * r(BT * C * e) + r(3 * BT * C * e) + 2 * r(4 * BT * C * e) + softmax + 4 * r(BT * f);
  const uint64_t output = r(BT * C * e);
  const uint64_t blocks = checkpointing ? L * output + internals : L * (internals + output);
  const uint64_t ends = r(BT * C * e) + r(BT * C * e) + 2 * r(BT * f) + r(BT * V * e) + r(BT * f);
  const uint64_t grads = 4 * r(BT * C * e) + r(4 * BT * C * e) + r(3 * BT * C * e);
  const uint64_t tokens = 2 * r(4 * BT);
  return blocks + ends + grads + tokens;
}

uint64_t expected_device_peak(Stage stage, const Layout& L, int B, int T, DType dt, bool checkpointing,
                              Attention attn, const StateBytes* state) {
  const StateBytes b = state ? *state : expected_state_bytes(stage, L, dt);
  return b.total() - b.host + expected_activation_bytes(L.cfg, B, T, dt, checkpointing, attn);
}

int largest_fitting_batch(Stage stage, const Layout& L, int T, DType dt, bool checkpointing, uint64_t budget,
                          int max_batch, Attention attn, const StateBytes* state) {
  auto fits = [&](int B) { return expected_device_peak(stage, L, B, T, dt, checkpointing, attn, state) <= budget; };
  if (!fits(1)) return 0;
  int lo = 1, hi = max_batch;  // fits(lo); the answer is in [lo, hi]
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

uint64_t expected_overflow_flag_elems(const Layout& L, DType dt) {
  return dt == DType::F16 ? uint64_t(L.world - 1) : 0;
}

uint64_t expected_link_elems(Stage stage, const Layout& L, int accum) {
  const uint64_t K = accum, S = L.shard_total;
  if (stage == Stage::Offload) return K * S + S;
  // infinity: per micro-step my slice of every gathered unit goes up (S + s_E forward, S - s_E
  // backward: 2S) and my reduced gradient slice of every unit comes down (S)
  if (stage == Stage::Infinity) return K * (2 * S + S);
  return 0;
}

StateBytes offload_state_bytes(Stage stage, const Layout& L, DType dt, Location tier) {
  StateBytes b = expected_state_bytes(stage, L, dt);
  if (tier != Location::Disk) return b;
  // offload: master, m, v in files; infinity: the parameter slices too. The gradient slices stay
  // in host memory (they are summed there every micro-step).
  b.disk = b.master + b.adam_m + b.adam_v + (stage == Stage::Infinity ? b.params : 0);
  b.host -= b.disk;
  return b;
}

uint64_t qat_bytes(const Layout& L, DType dt, const QatConfig& q, int first, int end) {
  if (end < 0) end = L.num_units();
  uint64_t elems = 0;
  for (int u = first; u < end; u++)
    if (q.quantizes(L, u)) elems = std::max<uint64_t>(elems, L.units[u].padded);
  const bool head_only = end == L.num_units() && first > L.embed_unit();  // a pipeline's last segment
  if (head_only && q.quantizes(L, L.embed_unit())) elems = std::max<uint64_t>(elems, uint64_t(L.cfg.vocab) * L.cfg.dim);
  return elems * dtype_bytes(dt);
}

}  // namespace nz
