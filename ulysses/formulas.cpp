// formulas.cpp — ulysses' activations and all-to-all traffic, written out (formulas.h).
#include "ulysses/formulas.h"

#include "zero_formulas.h"  // expected_state_bytes, expected_activation_bytes: stage3's

namespace nz {

namespace {
uint64_t r(uint64_t n) { return (n + 63) / 64 * 64; }  // every activation is 64-byte aligned
}  // namespace

uint64_t ulysses_scores_bytes(const GPTConfig& c, int B, int T, int S, DType dt) {
  return r(uint64_t(B) * (c.heads / S) * T * T * dtype_bytes(dt));
}

uint64_t ulysses_activation_bytes(const GPTConfig& c, int B, int T, int S, DType dt) {
  const uint64_t BT = uint64_t(B) * (T / S), C = c.dim, V = c.vocab, L = c.layers;  // my T/S tokens
  const uint64_t e = dtype_bytes(dt), f = dt == DType::F64 ? 8 : 4;
  const uint64_t heads_layout = r(3 * BT * C * e) + r(BT * C * e);  // q|k|v and the output: all T, my heads
  const uint64_t internals = 4 * r(BT * C * e) + r(3 * BT * C * e) + 2 * r(4 * BT * C * e) +
                             ulysses_scores_bytes(c, B, T, S, dt) + 4 * r(BT * f) + heads_layout;
  const uint64_t output = r(BT * C * e);
  const uint64_t blocks = L * (internals + output);
  const uint64_t ends = r(BT * C * e) + r(BT * C * e) + 2 * r(BT * f) + r(BT * V * e) + r(BT * f);
  const uint64_t grads = 4 * r(BT * C * e) + r(4 * BT * C * e) + r(3 * BT * C * e) + heads_layout;
  const uint64_t tokens = 2 * r(4 * BT);
  const uint64_t exchange = r(3 * BT * C * e);  // the all-to-all's buffer (ulysses/train.cpp)
  return blocks + ends + grads + tokens + exchange;
}

uint64_t ulysses_all_to_all_elems_per_block(const GPTConfig& c, int B, int T, int S) {
  const uint64_t mine = uint64_t(B) * (T / S);  // my tokens
  // per call: each of the S-1 others gets its heads' share (1/S) of my tokens' 3C (q|k|v) or C
  const uint64_t per_peer = mine * (3 + 1 + 1 + 3) * c.dim / S;  // forward qkv, out; backward d out, d qkv
  return per_peer * uint64_t(S - 1);
}

uint64_t ulysses_all_to_all_elems(const GPTConfig& c, int B, int T, int S, int accum) {
  return uint64_t(accum) * c.layers * ulysses_all_to_all_elems_per_block(c, B, T, S);
}

uint64_t ring_activation_bytes(const GPTConfig& c, int B, int T, int S, DType dt) {
  const uint64_t BT = uint64_t(B) * (T / S), C = c.dim, V = c.vocab, L = c.layers, NH = c.heads;
  const uint64_t e = dtype_bytes(dt), f = dt == DType::F64 ? 8 : 4;
  const uint64_t lse = r(NH * BT * f);  // (B, NH, T/S)
  const uint64_t internals = 4 * r(BT * C * e) + r(3 * BT * C * e) + 2 * r(4 * BT * C * e) + 4 * r(BT * f) + lse;
  const uint64_t blocks = L * (internals + r(BT * C * e));
  const uint64_t ends = r(BT * C * e) + r(BT * C * e) + 2 * r(BT * f) + r(BT * V * e) + r(BT * f);
  const uint64_t grads = 4 * r(BT * C * e) + r(4 * BT * C * e) + r(3 * BT * C * e);
  const uint64_t tokens = 2 * r(4 * BT);
  const uint64_t ring = 2 * lse + r(BT * C * f) + r(2 * BT * C * f) + 2 * r(4 * BT * C * e);
  return blocks + ends + grads + tokens + ring;
}

uint64_t ring_p2p_elems_forward_per_block(const GPTConfig& c, int B, int T, int S) {
  return 2 * uint64_t(B) * (T / S) * c.dim * (S - 1);
}

uint64_t ring_p2p_elems_per_block(const GPTConfig& c, int B, int T, int S) {
  const uint64_t kv = 2 * uint64_t(B) * (T / S) * c.dim;  // k|v (or dk|dv) of my tokens
  return S == 1 ? 0 : kv * (S - 1) + (2 * kv * (S - 1) + kv);
}

// ---- what fits (zero_estimate --sp S --fit SIZE, the explorer's panel) ----

int ulysses_largest_sp(const GPTConfig& c, int world, int T, bool ring) {
  for (int S = world; S > 1; S--)
    if (world % S == 0 && (ring ? T % (2 * S) == 0 : c.heads % S == 0 && T % S == 0)) return S;
  return 1;
}

uint64_t ulysses_checkpointed_activation_bytes(const GPTConfig& c, int B, int T, int S, DType dt, bool ring) {
  auto acts = [&](const GPTConfig& x) {
    return ring ? ring_activation_bytes(x, B, T, S, dt) : ulysses_activation_bytes(x, B, T, S, dt);
  };
  GPTConfig fewer = c;
  fewer.layers = c.layers - 1;
  const uint64_t all = acts(c), per_block = all - acts(fewer);           // a block's internals and output
  const uint64_t input = r(uint64_t(B) * (T / S) * c.dim * dtype_bytes(dt));  // what a checkpoint keeps
  return all - uint64_t(c.layers - 1) * (per_block - input);
}

SeqFit ulysses_longest_seq(const GPTConfig& c, int world, int S, int B, DType dt, uint64_t budget,
                           bool checkpointing, bool ring, bool stage3_alone, int max_T) {
  const int step = stage3_alone ? 1 : ring ? 2 * S : S;  // the sequences the trainer splits evenly
  auto peak = [&](int T) {
    GPTConfig x = c;
    if (T > x.ctx) x.ctx = T;  // learned positions: a row of wpe for every position
    SeqFit f;
    f.seq = T;
    f.state = expected_state_bytes(stage3_alone ? Stage::Z3 : Stage::Ulysses, make_layout(x, world), dt).total();
    f.activations = stage3_alone ? expected_activation_bytes(x, B, T, dt, checkpointing, Attention::Gemm)
                    : checkpointing ? ulysses_checkpointed_activation_bytes(x, B, T, S, dt, ring)
                    : ring ? ring_activation_bytes(x, B, T, S, dt) : ulysses_activation_bytes(x, B, T, S, dt);
    return f;
  };
  auto fits = [&](int k) { const SeqFit f = peak(k * step); return f.state + f.activations <= budget; };
  if (!fits(1)) return SeqFit{};
  int lo = 1, hi = max_T / step;  // fits(lo); the answer is in [lo, hi] (the peak grows with T)
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return peak(lo * step);
}

}  // namespace nz
