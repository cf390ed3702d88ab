// model.cpp — GPT-2 forward and backward, one unit at a time.
#include "model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>  // getenv
#include <tuple>
#include <cstring>
#include <thread>   // std::this_thread::sleep_for

#include "runtime/check.h"
#include "kernels/ops.h"
#include "runtime/rng.h"
#include "runtime/heartbeat.h"  // heartbeat
#include "profile.h"           // StepProfile: NZ_PROFILE=1 times attention

namespace nz {

namespace {
// A unit's forward or backward is done: a heartbeat for the watchdog, so a long phase made of many
// units (an evaluation of many windows, a big model's step) is seen alive. Test hook:
// NZ_TEST_SLOW_UNIT_MS=M first sleeps M ms, which makes every phase slow but alive
// (tests/checkpoint/fault_check.sh); never set in a real run.
void unit_done() {
  static const int slow_ms = [] {
    const char* s = getenv("NZ_TEST_SLOW_UNIT_MS");
    return s ? atoi(s) : 0;
  }();
  if (slow_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
  heartbeat();
}
}  // namespace

// ---------------------------------------------------------------- initialisation

// Tensor order inside a block unit (as make_layout lists them, layout.cpp).
enum BlockTensor { LN1W, LN1B, QKVW, QKVB, ATTPW, ATTPB, LN2W, LN2B, FCW, FCB, FCPW, FCPB };

void init_unit(const Layout& L, int u, uint64_t seed, float* out) {
  const Unit& unit = L.units[u];
  memset(out, 0, unit.padded * sizeof(float));
  Rng rng(seed, uint64_t(u) + 1);  // one stream per unit
  const float std_resid = 0.02f / std::sqrt(2.0f * L.cfg.layers);
  for (const TensorSpec& t : unit.tensors) {
    float* p = out + t.offset;
    bool is_ln_w = t.name == "ln1_w" || t.name == "ln2_w" || t.name == "lnf_w";
    bool is_resid = t.name == "attproj_w" || t.name == "fcproj_w";
    if (is_ln_w) {
      for (size_t i = 0; i < t.numel; i++) p[i] = 1.0f;
    } else if (t.decay) {  // weight matrices and embeddings
      float s = is_resid ? std_resid : 0.02f;
      for (size_t i = 0; i < t.numel; i++) p[i] = s * rng.normal();
    }  // biases, layernorm biases: 0
  }
}

std::vector<float> padded_params(const Layout& L, const std::vector<float>& weights) {
  NZ_CHECK(L.world == 1 && weights.size() == L.num_params, "%zu weights for a layout of %zu", weights.size(),
           L.num_params);
  std::vector<float> params(L.padded_total, 0.0f);
  size_t at = 0;
  for (const Unit& u : L.units) {
    memcpy(params.data() + u.offset, weights.data() + at, u.numel * sizeof(float));
    at += u.numel;
  }
  return params;
}

// ---------------------------------------------------------------- activations

namespace {
// Byte offsets of every saved activation inside one allocation. The same function sizes the
// allocation (activation_bytes) and hands out the pointers, so the two cannot disagree.
//
// Without checkpointing every block has its own copy of everything its backward reads. With
// checkpointing only res_out (the block's output, which is the next block's input, and lnf's
// for the last) is kept per block; the other entries of every block point at the same one block
// of scratch, which the forward overwrites block after block and the backward refills by
// recomputing the block it is about to differentiate.
//
// Attention saves what its backward reads: with the textbook / gemm kernels the softmax, all of
// the (B,NH,T,T) probabilities; with flash attention in force (kernels.h) one number per row, the
// log-sum-exp of the scores, (B,NH,T) fp32, from which the backward recomputes each probability.
// The flash backward also reads the forward's output, atty (for D = dout·out per row), which the
// attention kernel interface (kernel_table.inc) passes on all three backends; the others ignore it.
struct ActLayout {
  struct Layer {
    size_t ln1, ln1_mean, ln1_rstd, qkv, att /* or the lse */, atty, res_att, ln2, ln2_mean, ln2_rstd, fch, fchg, res_out;
    size_t qkv_heads = 0, atty_heads = 0;  // sequence slices: attention's input and output, all tokens, my heads
  };
  size_t x0, lnf, lnf_mean, lnf_rstd, logits, losses;
  std::vector<Layer> layer;
  size_t total = 0;
  // activation grads of one block, reused by every block
  size_t dx, dres, dtmp, dln, d4c, dqkv, grad_total = 0;
  size_t dqkv_heads = 0, datty_heads = 0;  // sequence slices

  // Units [first, end) only (a pipeline segment, pipeline.h; all units by default): x0 is then
  // the segment's input (the embedding's output on the first segment, the previous segment's on
  // the others), only the segment's blocks keep their activations, and only the segment with lnf
  // keeps the head's.
  // S > 0: sequence slices (model.h, SeqSlices): T is my slice's tokens, attention's are S T.
  // S < 0: ring attention's slices: T is my tokens; attention's state is the rung's (nothing here).
  ActLayout(const GPTConfig& c, int B, int T, DType dt, bool checkpointing, Attention attn, int first = 0,
            int end = -1, int S = 0) {
    const int units = c.layers + 2;
    if (end < 0) end = units;
    const bool has_head = end == units;
    int blocks_here = 0;
    for (int l = 0; l < c.layers; l++) blocks_here += l + 1 >= first && l + 1 < end;
    const size_t BT = size_t(B) * T, C = c.dim, e = dtype_bytes(dt);
    const size_t a = dt == DType::F64 ? 8 : 4;  // mean/rstd/losses are fp32 (fp64 in tests)
    auto take = [](size_t& total, size_t bytes) {
      size_t off = total;
      total += (bytes + 63) / 64 * 64;  // 64-byte aligned
      return off;
    };
    // a block's internals: everything its backward reads except its input
    auto internals = [&](Layer& l) {
      l.ln1 = take(total, BT * C * e);
      l.ln1_mean = take(total, BT * a);
      l.ln1_rstd = take(total, BT * a);
      l.qkv = take(total, BT * 3 * C * e);
      if (S > 0) {  // all S T tokens of NH/S heads: as many elements as my tokens' q, k, v; the softmax S^2/S larger
        const size_t all_T = size_t(S) * T;
        l.qkv_heads = take(total, BT * 3 * C * e);
        l.att = take(total, size_t(B) * (c.heads / S) * all_T * all_T * e);  // (B, NH/S, ST, ST)
        l.atty_heads = take(total, BT * C * e);
      } else if (S < 0) {  // ring: the rung keeps attention's log-sum-exp (ulysses/train.cpp)
      } else if (attn == Attention::Flash) {
        l.att = take(total, size_t(B) * c.heads * T * sizeof(float));  // lse (B,NH,T)
      } else {
        l.att = take(total, size_t(B) * c.heads * T * T * e);  // (B, NH, T, T): the softmax, all of it
      }
      l.atty = take(total, BT * C * e);
      l.res_att = take(total, BT * C * e);
      l.ln2 = take(total, BT * C * e);
      l.ln2_mean = take(total, BT * a);
      l.ln2_rstd = take(total, BT * a);
      l.fch = take(total, BT * 4 * C * e);
      l.fchg = take(total, BT * 4 * C * e);
    };
    x0 = take(total, BT * C * e);
    layer.resize(c.layers);
    Layer shared{};
    if (checkpointing && blocks_here > 0) internals(shared);  // one block of scratch for all blocks
    for (int i = 0; i < c.layers; i++) {
      Layer& l = layer[i];
      if (i + 1 < first || i + 1 >= end) continue;  // another segment's block
      if (checkpointing) l = shared;
      else internals(l);
      l.res_out = take(total, BT * C * e);  // kept either way: the next block's input
    }
    lnf = lnf_mean = lnf_rstd = logits = losses = 0;
    if (has_head) {
      lnf = take(total, BT * C * e);
      lnf_mean = take(total, BT * a);
      lnf_rstd = take(total, BT * a);
      logits = take(total, BT * c.vocab * e);
      losses = take(total, BT * a);
    }
    dx = take(grad_total, BT * C * e);
    dres = take(grad_total, BT * C * e);
    dtmp = take(grad_total, BT * C * e);
    dln = take(grad_total, BT * C * e);
    d4c = take(grad_total, BT * 4 * C * e);
    dqkv = take(grad_total, BT * 3 * C * e);
    if (S > 0) {  // (ring, S < 0: the rung's own)
      dqkv_heads = take(grad_total, BT * 3 * C * e);
      datty_heads = take(grad_total, BT * C * e);
    }
  }
};
}  // namespace

size_t activation_bytes(const GPTConfig& cfg, int B, int T, DType dt, bool checkpointing, Attention attn) {
  return segment_activation_bytes(cfg, B, T, dt, checkpointing, attn, 0, cfg.layers + 2, 1);
}

size_t segment_activation_bytes(const GPTConfig& cfg, int B, int T, DType dt, bool checkpointing, Attention attn,
                                int first, int end, int slots) {
  ActLayout a(cfg, B, T, dt, checkpointing, attn, first, end);
  size_t tokens = (size_t(B) * T * sizeof(int) + 63) / 64 * 64;
  const size_t per_slot = a.total + (first == 0 ? tokens : 0) + (end == cfg.layers + 2 ? tokens : 0);
  return size_t(slots) * per_slot + a.grad_total;
}

size_t seq_slice_activation_bytes(const GPTConfig& cfg, int B, int T, int S, DType dt, bool ring) {
  ActLayout a(cfg, B, T / S, dt, false, Attention::Gemm, 0, -1, ring ? -S : S);
  const size_t tokens = (size_t(B) * (T / S) * sizeof(int) + 63) / 64 * 64;
  return a.total + 2 * tokens + a.grad_total;  // my slice's tokens and targets
}

GPT::GPT(const Layout& layout, DType dt, int B, int T, bool checkpointing, int first_unit, int end_unit, int slots,
         SeqSlices seq)
    : L_(layout), dt_(dt), ckpt_(checkpointing), B_(B), T_(seq.slices ? T / seq.slices : T), seq_(seq),
      attn_(flash_attention_in_force(layout.cfg.dim, layout.cfg.heads) ? Attention::Flash : Attention::Gemm),
      first_(first_unit), end_(end_unit < 0 ? layout.num_units() : end_unit), slots_(slots) {
  NZ_CHECK(T <= layout.cfg.ctx, "sequence %d longer than the context %d", T, layout.cfg.ctx);
  NZ_CHECK(first_ >= 0 && first_ < end_ && end_ <= layout.num_units() && slots >= 1,
           "units [%d, %d) of %d, %d slots", first_, end_, layout.num_units(), slots);
  NZ_CHECK(!seq.slices || (T % (seq.ring ? 2 * seq.slices : seq.slices) == 0 &&
                           (seq.ring || layout.cfg.heads % seq.slices == 0) && !checkpointing &&
                           attn_ == Attention::Gemm && slots == 1 && first_ == 0 && end_ == layout.num_units()),
           "sequence slices: %d slices of T=%d, %d heads (whole model, no checkpointing, gemm attention)",
           seq.slices, T, layout.cfg.heads);
  ActLayout a(layout.cfg, B, T_, dt, checkpointing, attn_, first_, end_, act_slices());
  slot_bytes_ = a.total;
  acts_ = Buffer(Category::Activations, Location::Device, slots * a.total,
                 slots == 1 ? "activations" : "activations (" + std::to_string(slots) + " micro-batches in flight)");
  grad_acts_ = Buffer(Category::Activations, Location::Device, a.grad_total, "activation grads");
  tok_bytes_ = (size_t(B) * T_ * sizeof(int) + 63) / 64 * 64;
  // the embedding reads the tokens, the loss the targets: each only on the segment that has it
  if (has_embed()) tokens_ = Buffer(Category::Activations, Location::Device, slots * tok_bytes_, "tokens");
  if (has_head()) targets_ = Buffer(Category::Activations, Location::Device, slots * tok_bytes_, "targets");
}

void GPT::use_slot(int s) {
  NZ_CHECK(s >= 0 && s < slots_, "activation slot %d of %d", s, slots_);
  slot_ = s;
}

void* GPT::segment_input() const {
  const ActLayout a(L_.cfg, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  return slot_acts() + a.x0;
}

void* GPT::segment_output() const {
  NZ_CHECK(!has_head(), "segment_output: the last segment's output is the loss");
  const ActLayout a(L_.cfg, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  const int last = end_ - 1;
  return slot_acts() + (last == L_.embed_unit() ? a.x0 : a.layer[last - 1].res_out);
}

void* GPT::activation_grad() const {
  const ActLayout a(L_.cfg, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  return static_cast<char*>(grad_acts_.data()) + a.dx;
}

char* GPT::slot_acts() const { return static_cast<char*>(acts_.data()) + size_t(slot_) * slot_bytes_; }
const int* GPT::slot_tokens() const {
  return reinterpret_cast<const int*>(static_cast<const char*>(tokens_.data()) + size_t(slot_) * tok_bytes_);
}
const int* GPT::slot_targets() const {
  return reinterpret_cast<const int*>(static_cast<const char*>(targets_.data()) + size_t(slot_) * tok_bytes_);
}

void GPT::set_batch(const int* tokens, const int* targets, int b) {
  NZ_CHECK(b >= 1 && b <= B_, "batch of %d rows, model allocated for %d", b, B_);
  if (seq_.slices) {  // whole sequences in; my slice of each row kept: tokens [s T/S, (s + 1) T/S)
    std::vector<int> tok(size_t(b) * T_), tgt(tok.size());
    for (int r = 0; r < b; r++) {
      const size_t from = size_t(r) * full_seq() + size_t(seq_.slice) * T_;
      if (seq_.ring) {  // zig-zag: chunks s and 2S-1-s of T/2 (my T) tokens each
        const int c = T_ / 2, second = 2 * seq_.slices - 1 - seq_.slice;
        for (int h = 0; h < 2; h++) {
          const size_t at = size_t(r) * full_seq() + size_t(h ? second : seq_.slice) * c;
          memcpy(&tok[size_t(r) * T_ + h * c], tokens + at, c * sizeof(int));
          memcpy(&tgt[size_t(r) * T_ + h * c], targets + at, c * sizeof(int));
        }
        continue;
      }
      memcpy(&tok[size_t(r) * T_], tokens + from, T_ * sizeof(int));
      memcpy(&tgt[size_t(r) * T_], targets + from, T_ * sizeof(int));
    }
    load_rows(tok.data(), tgt.data(), b);
  } else {
    load_rows(tokens, targets, b);
  }
}

void GPT::load_rows(const int* tokens, const int* targets, int b) {
  b_ = b;
  const size_t bytes = size_t(b) * T_ * sizeof(int);
  void* tok = has_embed() ? (void*)slot_tokens() : nullptr;
  void* tgt = has_head() ? (void*)slot_targets() : nullptr;
  if (current_device() != Device::CUDA) {
    if (tok) copy_bytes(tok, Location::Device, tokens, Location::Host, bytes);
    if (tgt) copy_bytes(tgt, Location::Device, targets, Location::Host, bytes);
    return;
  }
  // On a GPU a copy from ordinary host memory first waits for everything already queued (the last
  // micro-step's backward). So the batch goes to a pinned staging slot and its copy is queued behind
  // that work instead; the stream's order makes the kernels before it read the previous batch. A slot
  // is refilled only after its copy has run: take_loss_sum (once per step) waits for the GPU and so
  // frees them all; a run that never asks for its loss waits here once every kStagingSlots batches.
  constexpr size_t kStagingSlots = 8;
  if (next_staging_ == kStagingSlots) {
    device_sync();
    next_staging_ = 0;
  }
  if (next_staging_ == staging_.size()) staging_.emplace_back(2 * tok_bytes_, Location::Host);
  char* slot = static_cast<char*>(staging_[next_staging_++].data());
  memcpy(slot, tokens, bytes);
  memcpy(slot + tok_bytes_, targets, bytes);
  if (tok) copy_to_device_queued(tok, slot, bytes);
  if (tgt) copy_to_device_queued(tgt, slot + tok_bytes_, bytes);
}


// Each unit's computation checks the parameters it is given (the whole unit, in a live buffer: a
// stage3 unit released or never gathered is named, not read) and marks its begin and end in the
// ledger's activity log, where stage3's prefetch can be seen to overlap it.
void GPT::begin_compute(const char* what, int u, const void* p) {
  const std::string name = std::string(what) + " " + L_.units[u].name;
  // the LM head reads only wte, the first V x C elements of the embedding (a pipeline's last segment
  // holds a copy of just those)
  const bool head = what[0] == 'h';
  const size_t elems = head ? size_t(L_.cfg.vocab) * L_.cfg.dim : L_.units[u].padded;
  if (p) check_span(p, elems * dtype_bytes(dt_), ("the parameters of the " + name).c_str());
  Ledger::get().note("compute_begin", name);
}
void GPT::end_compute(const char* what, int u) {
  Ledger::get().note("compute_end", std::string(what) + " " + L_.units[u].name);
}

void GPT::set_qat(const QatConfig& q) {
  NZ_CHECK(!q.on() || current_device() != Device::CUDA, "--qat runs on the CPU backend only");
  qat_ = q;
  // the largest parameters a call hands over: a unit (padded, as begin_compute checks it), or the
  // LM head's copy of wte alone on a pipeline's last segment
  size_t elems = 0;
  for (int u = first_; u < end_; u++)
    if (q.quantizes(L_, u)) elems = std::max(elems, L_.units[u].padded);
  if (has_head() && !has_embed() && q.quantizes(L_, L_.embed_unit()))
    elems = std::max(elems, size_t(L_.cfg.vocab) * L_.cfg.dim);
  qat_unit_ = Buffer();
  if (elems)
    qat_unit_ = Buffer(Category::Scratch, Location::Device, elems * dtype_bytes(dt_), "qat: fake-quantized unit");
}

const void* GPT::qat_view(int u, const void* p, size_t n) {
  if (!p || !qat_.quantizes(L_, u)) return p;
  fake_quantize(qat_, dt_, p, n, qat_unit_.data());  // a copy: p (the master in fp32) stays exact
  return qat_unit_.data();
}

// The LM head's share of the tied embedding: the whole unit where this model holds it, so its
// blocks are the lookup's; a pipeline's last segment holds only wte (the trainer then requires
// V x C to be whole blocks, so the two still agree).
static size_t head_elems(const Layout& L, bool has_embed) {
  return has_embed ? L.units[L.embed_unit()].numel : size_t(L.cfg.vocab) * L.cfg.dim;
}

void GPT::forward(int u, const void* p) {
  NZ_CHECK(!seq_.slices || u == L_.embed_unit() || u == L_.lnf_unit(),
           "forward: with sequence slices block %d runs in three calls (attention_input, attention, attention_output)", u);
  begin_compute("forward", u, p);
  p = qat_view(u, p, L_.units[u].numel);
  NZ_DISPATCH_DTYPE(dt_, forward_t<T>(u, (const T*)p));
  end_compute("forward", u);
  unit_done();
}
void GPT::head_forward(const void* p) {
  begin_compute("head forward", L_.embed_unit(), p);
  p = qat_view(L_.embed_unit(), p, head_elems(L_, has_embed()));
  NZ_DISPATCH_DTYPE(dt_, head_forward_t<T>((const T*)p));
  end_compute("head forward", L_.embed_unit());
  unit_done();
}

double GPT::take_loss_sum() {
  double total = 0;  // (no head_forward since the last call: 0)
  if (!loss_total_fresh_) copy_bytes(&total, Location::Host, loss_total_.data(), Location::Device, sizeof(double));
  else device_sync();  // nothing to read, but the staging slots are free only once the GPU is done
  loss_total_fresh_ = true;
  next_staging_ = 0;  // the GPU has run every queued copy
  return total;
}
void GPT::head_backward(const void* p) {
  begin_compute("head backward", L_.embed_unit(), p);
  p = qat_view(L_.embed_unit(), p, head_elems(L_, has_embed()));  // see backward
  NZ_DISPATCH_DTYPE(dt_, head_backward_t<T>((const T*)p));
  end_compute("head backward", L_.embed_unit());
  unit_done();
}
void GPT::backward(int u, const void* p, void* g) {
  NZ_CHECK(!seq_.slices || u == L_.embed_unit() || u == L_.lnf_unit(),
           "backward: with sequence slices block %d runs in three calls (attention_output_backward, ...)", u);
  begin_compute("backward", u, p);
  check_span(g, L_.units[u].padded * dtype_bytes(dt_), ("the gradient of backward " + L_.units[u].name).c_str());
  // --qat, the straight-through estimator: the forward computed y = f(x, q(w)) with q(w) =
  // dequantize(quantize(w)), a step function of w whose derivative is 0 almost everywhere. QAT
  // pretends dq/dw = 1 instead: the backward runs on the same q(w) the forward used (activation
  // gradients dx = df/dx at q(w); a checkpointed block recomputes its forward from q(w) too) and
  // the weight gradient it writes, dL/dq(w), is taken as dL/dw and handed to the optimizer, which
  // updates the exact w. Small updates accumulate in w until they move q(w) across a grid step.
  p = qat_view(u, p, L_.units[u].numel);  // q(w), as in the forward
  NZ_DISPATCH_DTYPE(dt_, backward_t<T>(u, (const T*)p, (T*)g));
  // pruning: d loss / d theta = keep * d loss / d w (prune.h)
  if (prune_) zero_pruned(*prune_, u, 0, L_.units[u].padded, g, dtype_bytes(dt_));
  end_compute("backward", u);
  unit_done();
}

void GPT::probs_row(int row, float* out) const {
  const ActLayout a(L_.cfg, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  const int V = L_.cfg.vocab;
  const size_t e = dtype_bytes(dt_);
  std::vector<char> raw(V * e);
  copy_bytes(raw.data(), Location::Host, slot_acts() + a.logits + size_t(row) * V * e,
             Location::Device, V * e);
  for (int i = 0; i < V; i++) {
    NZ_DISPATCH_DTYPE(dt_, out[i] = float(load(reinterpret_cast<const T*>(raw.data())[i])));
  }
}

const void* GPT::layer_qkv(int l) const {
  // with activation checkpointing the blocks share one block of scratch: no layer's q, k, v is kept
  NZ_CHECK(!ckpt_, "layer_qkv: the model was built with activation checkpointing");
  const ActLayout a(L_.cfg, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  return slot_acts() + a.layer[l].qkv;
}

// Where unit u's input is, in a slot: the segment's input x0 for its first unit (and for the first
// block, whose input is the embedding's output), else the output of the block before it.
// (Unit 0 is the embedding, unit l + 1 block l.)
static size_t unit_input(const ActLayout& a, int u, int first) {
  return u == first || u == 1 ? a.x0 : a.layer[u - 2].res_out;
}

void GPT::head_weight_backward(void* dwte) {
  NZ_CHECK(has_head(), "head_weight_backward on a segment without the head");
  check_span(dwte, size_t(L_.cfg.vocab) * L_.cfg.dim * dtype_bytes(dt_), "the head's gradient of wte");
  Ledger::get().note("compute_begin", "head weight backward");
  NZ_DISPATCH_DTYPE(dt_, head_weight_backward_t<T>((T*)dwte));
  Ledger::get().note("compute_end", "head weight backward");
  unit_done();
}

// Pointer helpers: a typed view of the activation arena.
#define ACT(T, off) reinterpret_cast<T*>(slot_acts() + (off))  // the current micro-batch's slot
#define GACT(T, off) reinterpret_cast<T*>(static_cast<char*>(grad_acts_.data()) + (off))

template <class T>
void GPT::forward_t(int u, const T* p) {
  using A = acc_t<T>;
  const GPTConfig& c = L_.cfg;
  const int C = c.dim, BT = b_ * T_;
  const ActLayout a(c, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  const int* tokens = slot_tokens();
  if (u == L_.embed_unit()) {
    // x0 (B,T,C) = wte[token] + wpe[position]
    const T* wte = p;
    const T* wpe = p + L_.units[u].tensors[1].offset;
    // sequence slices: my tokens' positions start at first_position (the rows of wpe they use)
    if (seq_.ring) {  // ring's zig-zag: each row's two chunks, each with its own positions
      const int c = T_ / 2;
      for (int r = 0; r < b_; r++)
        for (int h = 0; h < 2; h++)
          ops::embedding_forward<T>(ACT(T, a.x0) + (size_t(r) * T_ + h * c) * C, tokens + size_t(r) * T_ + h * c, wte,
                                    wpe + size_t(h ? seq_.second_position : seq_.first_position) * C, 1, c, C);
      return;
    }
    ops::embedding_forward<T>(ACT(T, a.x0), tokens, wte, wpe + size_t(seq_.first_position) * C, b_, T_, C);
    return;
  }
  if (u == L_.lnf_unit()) {
    const T* x = ACT(T, unit_input(a, u, first_));
    ops::layernorm_forward<T>(ACT(T, a.lnf), ACT(A, a.lnf_mean), ACT(A, a.lnf_rstd), x, p, p + C, BT, C);
    return;
  }
  // transformer block l (pre-LN): x -> x + attn(ln1(x)) -> that + mlp(ln2(that)), in its three pieces
  attention_input_t(u, p);
  attention_t<T>(u, T_);  // the whole sequence here: attention reads and writes the token layout
  attention_output_t(u, p);
}

// The pieces of block u = l + 1 (model.h). Without sequence slices attention's buffers are the
// token layout's own (qkv, atty); with them, its own (all tokens, my heads), filled by the all-to-all.
template <class T>
void GPT::attention_input_t(int u, const T* p) {
  using A = acc_t<T>;
  const int C = L_.cfg.dim, BT = b_ * T_;
  const ActLayout a(L_.cfg, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  const ActLayout::Layer& s = a.layer[u - 1];
  const std::vector<TensorSpec>& t = L_.units[u].tensors;
  auto W = [&](int i) { return p + t[i].offset; };
  const T* x = ACT(T, unit_input(a, u, first_));
  ops::layernorm_forward<T>(ACT(T, s.ln1), ACT(A, s.ln1_mean), ACT(A, s.ln1_rstd), x, W(LN1W), W(LN1B), BT, C);
  ops::matmul_forward<T>(ACT(T, s.qkv), ACT(T, s.ln1), W(QKVW), W(QKVB), BT, C, 3 * C);
}

template <class T>
void GPT::attention_t(int u, int seq_tokens) {
  const int S = std::max(seq_.slices, 1), C = L_.cfg.dim / S, NH = L_.cfg.heads / S;  // my heads' width
  const int rows = b_ * full_seq() / seq_tokens;  // the sequences attention sees
  const ActLayout a(L_.cfg, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  const ActLayout::Layer& s = a.layer[u - 1];
  T* qkv = ACT(T, seq_.slices ? s.qkv_heads : s.qkv);
  T* out = ACT(T, seq_.slices ? s.atty_heads : s.atty);
  // att was sized for the attention chosen at construction; the kernels must still choose it
  NZ_CHECK((attn_ == Attention::Flash) == flash_attention_in_force(L_.cfg.dim, L_.cfg.heads),
           "attention: the model was built for %s attention, the kernels now run the other",
           attention_name(attn_));
  StepProfile::Scope profiled(StepProfile::ForwardAttention);  // NZ_PROFILE (profile.h)
  ops::attention_forward<T>(out, ACT(T, s.att), qkv, rows, seq_tokens, C, NH);
}

template <class T>
void GPT::attention_output_t(int u, const T* p) {
  using A = acc_t<T>;
  const int C = L_.cfg.dim, BT = b_ * T_;
  const ActLayout a(L_.cfg, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  const ActLayout::Layer& s = a.layer[u - 1];
  const std::vector<TensorSpec>& t = L_.units[u].tensors;
  auto W = [&](int i) { return p + t[i].offset; };
  const T* x = ACT(T, unit_input(a, u, first_));
  T* res_att = ACT(T, s.res_att);
  T* res_out = ACT(T, s.res_out);
  ops::matmul_forward<T>(res_att, ACT(T, s.atty), W(ATTPW), W(ATTPB), BT, C, C);
  // res_att = x + res_att, and ln2 = layernorm(res_att) in the same pass (fused)
  ops::residual_layernorm_forward<T>(res_att, ACT(T, s.ln2), ACT(A, s.ln2_mean), ACT(A, s.ln2_rstd), x, res_att,
                                     W(LN2W), W(LN2B), BT, C);
  // fch = ln2 @ fc_w^T + fc_b, and fchg = gelu(fch) (fused; both are kept for the backward)
  ops::matmul_bias_gelu_forward<T>(ACT(T, s.fch), ACT(T, s.fchg), ACT(T, s.ln2), W(FCW), W(FCB), BT, C, 4 * C);
  ops::matmul_forward<T>(res_out, ACT(T, s.fchg), W(FCPW), W(FCPB), BT, 4 * C, C);
  ops::residual_forward<T>(res_out, res_att, res_out, size_t(BT) * C);
}

template <class T>
void GPT::head_forward_t(const T* wte) {
  using A = acc_t<T>;
  const GPTConfig& c = L_.cfg;
  const int BT = b_ * T_;
  const ActLayout a(c, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  // logits (BT,V) = lnf (BT,C) @ wte^T: the LM head is the token embedding, transposed (tied)
  T* logits = ACT(T, a.logits);
  ops::matmul_forward<T>(logits, ACT(T, a.lnf), wte, nullptr, BT, c.dim, c.vocab);
  // probabilities overwrite the logits; the backward turns them into dlogits in place
  ops::softmax_xent_forward<T>(ACT(A, a.losses), logits, logits, slot_targets(), BT, c.vocab);
  // the batch's sum, in double, added to the total where it was computed (in token order on the
  // CPU; a fixed order on a GPU), so every run and every stage adds the same way
  ops::add_sum_to<A>(static_cast<double*>(loss_total_.data()), ACT(A, a.losses), size_t(BT), loss_total_fresh_);
  loss_total_fresh_ = false;
}

template <class T>
void GPT::head_backward_t(const T* wte) {
  const GPTConfig& c = L_.cfg;
  const int BT = b_ * T_;
  const ActLayout a(c, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  T* dlogits = ACT(T, a.logits);  // in place over the probabilities
  // the mean over the batch's tokens: with sequence slices, all b x S T/S of them (each slice's
  // gradient is then its part of the whole batch's, and the S parts sum to it)
  ops::softmax_xent_backward<T>(dlogits, dlogits, slot_targets(), loss_scale_ / (b_ * full_seq()), BT, c.vocab);
  // d lnf_out (BT,C) = dlogits @ wte; the weight gradient waits for backward(embed)
  ops::matmul_backward<T>(GACT(T, a.dx), nullptr, nullptr, dlogits, ACT(T, a.lnf), wte, BT, c.dim, c.vocab);
}

template <class T>
void GPT::head_weight_backward_t(T* dwte) {
  const GPTConfig& c = L_.cfg;
  const ActLayout a(c, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  fill_zero(dwte, size_t(c.vocab) * c.dim * sizeof(T), Location::Device);
  // the same product into the same zeros as backward(embed) on a model that holds both ends
  ops::matmul_backward<T>(nullptr, dwte, nullptr, ACT(T, a.logits), ACT(T, a.lnf), nullptr, b_ * T_, c.dim, c.vocab);
}

template <class T>
void GPT::backward_t(int u, const T* p, T* g) {
  const GPTConfig& c = L_.cfg;
  const int C = c.dim, BT = b_ * T_;
  const size_t n = size_t(BT) * C;
  const ActLayout a(c, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  // weight grads accumulate; a pipeline's first segment receives the head's part of the tied embedding
  // gradient into g before the lookup's is added (below), so that g is not cleared
  if (u != L_.embed_unit() || has_head()) fill_zero(g, L_.units[u].padded * sizeof(T), Location::Device);
  T* dx = GACT(T, a.dx);  // in: d loss / d (this unit's output); out: d loss / d (its input)
  T* dtmp = GACT(T, a.dtmp);
  using A = acc_t<T>;

  if (u == L_.embed_unit()) {
    // The tied embedding's two contributions, summed in one buffer:
    // 1. the LM head: d wte (V,C) += dlogits^T (V,BT) @ lnf (BT,C) (on a pipeline's last segment instead:
    //    head_weight_backward, whose result the first segment has received into g)
    if (has_head()) ops::matmul_backward<T>(nullptr, g, nullptr, ACT(T, a.logits), ACT(T, a.lnf), nullptr, BT, C, c.vocab);
    // 2. the lookup: d wte[token] += dx0, d wpe[t] += dx0
    T* dwpe = g + L_.units[u].tensors[1].offset + size_t(seq_.first_position) * C;  // my positions' rows
    if (seq_.ring) {  // ring's zig-zag: each row's two chunks into their own positions' rows
      const int c = T_ / 2;
      T* dwpe0 = g + L_.units[u].tensors[1].offset;
      for (int r = 0; r < b_; r++)
        for (int h = 0; h < 2; h++)
          ops::embedding_backward<T>(g, dwpe0 + size_t(h ? seq_.second_position : seq_.first_position) * C,
                                     dx + (size_t(r) * T_ + h * c) * C, slot_tokens() + size_t(r) * T_ + h * c, 1, c, C);
      return;
    }
    ops::embedding_backward<T>(g, dwpe, dx, slot_tokens(), b_, T_, C);
    return;
  }
  if (u == L_.lnf_unit()) {
    const T* x = ACT(T, unit_input(a, u, first_));
    ops::layernorm_backward<T>(dtmp, g, g + C, dx, x, p, ACT(A, a.lnf_mean), ACT(A, a.lnf_rstd), BT, C);
    ops::cast<T, T>(dx, dtmp, n);
    return;
  }
  // checkpointing: the scratch holds another block's internals (or none); refill it with this
  // block's, recomputed from its saved input (it rewrites res_out with the bits it already holds)
  if (ckpt_) forward_t(u, p);
  attention_output_backward_t(u, p, g);
  attention_backward_t<T>(u, T_);  // the whole sequence here: the token layout's buffers
  attention_input_backward_t(u, p, g);
}

// The backward's pieces of block u = l + 1, in reverse order of the forward's (model.h); the
// activation gradient arrives in dx and leaves in dx, through dln (d atty, then d ln1) and dqkv.
template <class T>
void GPT::attention_output_backward_t(int u, const T* p, T* g) {
  using A = acc_t<T>;
  const int C = L_.cfg.dim, BT = b_ * T_;
  const ActLayout a(L_.cfg, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  const ActLayout::Layer& s = a.layer[u - 1];
  const std::vector<TensorSpec>& t = L_.units[u].tensors;
  auto W = [&](int i) { return p + t[i].offset; };
  auto G = [&](int i) { return g + t[i].offset; };
  T* dx = GACT(T, a.dx);
  T* dres = GACT(T, a.dres);
  T* dln = GACT(T, a.dln);
  T* d4c = GACT(T, a.d4c);
  // MLP: out = res_att + fcproj(gelu(fc(ln2(res_att))))
  ops::matmul_backward<T>(d4c, G(FCPW), G(FCPB), dx, ACT(T, s.fchg), W(FCPW), BT, 4 * C, C);
  // through the GELU, and the fc bias gradient (the column sums of d4c) in the same pass (fused)
  ops::gelu_backward_bias<T>(d4c, G(FCB), ACT(T, s.fch), d4c, BT, 4 * C);
  ops::matmul_backward<T>(dln, G(FCW), nullptr, d4c, ACT(T, s.ln2), W(FCW), BT, C, 4 * C);
  // d res_att = the skip path (dx) plus the MLP path through ln2 (fused)
  ops::layernorm_backward_residual<T>(dres, G(LN2W), G(LN2B), dx, dln, ACT(T, s.res_att), W(LN2W),
                                      ACT(A, s.ln2_mean), ACT(A, s.ln2_rstd), BT, C);
  // attention: res_att = x + attproj(attn(qkv(ln1(x)))): dln = d atty
  ops::matmul_backward<T>(dln, G(ATTPW), G(ATTPB), dres, ACT(T, s.atty), W(ATTPW), BT, C, C);
}

template <class T>
void GPT::attention_backward_t(int u, int seq_tokens) {
  const int S = std::max(seq_.slices, 1), C = L_.cfg.dim / S, NH = L_.cfg.heads / S;  // my heads' width
  const int rows = b_ * full_seq() / seq_tokens;  // the sequences attention sees
  const ActLayout a(L_.cfg, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  const ActLayout::Layer& s = a.layer[u - 1];
  const bool sl = seq_.slices > 0;
  T* dqkv = GACT(T, sl ? a.dqkv_heads : a.dqkv);
  const T* dout = GACT(T, sl ? a.datty_heads : a.dln);
  StepProfile::Scope profiled(StepProfile::ForwardAttention);  // the phase says backward (profile.h)
  ops::attention_backward<T>(dqkv, dout, ACT(T, sl ? s.qkv_heads : s.qkv), ACT(T, s.att),
                             ACT(T, sl ? s.atty_heads : s.atty), rows, seq_tokens, C, NH);
}

template <class T>
void GPT::attention_input_backward_t(int u, const T* p, T* g) {
  using A = acc_t<T>;
  const int C = L_.cfg.dim, BT = b_ * T_;
  const ActLayout a(L_.cfg, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  const ActLayout::Layer& s = a.layer[u - 1];
  const std::vector<TensorSpec>& t = L_.units[u].tensors;
  auto W = [&](int i) { return p + t[i].offset; };
  auto G = [&](int i) { return g + t[i].offset; };
  const T* x = ACT(T, unit_input(a, u, first_));
  T* dx = GACT(T, a.dx);
  T* dres = GACT(T, a.dres);
  T* dln = GACT(T, a.dln);
  ops::matmul_backward<T>(dln, G(QKVW), G(QKVB), GACT(T, a.dqkv), ACT(T, s.ln1), W(QKVW), BT, C, 3 * C);
  // d x = the skip path (dres) plus the attention path through ln1 (fused)
  ops::layernorm_backward_residual<T>(dx, G(LN1W), G(LN1B), dres, dln, x, W(LN1W), ACT(A, s.ln1_mean),
                                      ACT(A, s.ln1_rstd), BT, C);
}

// ---- sequence slices: the public pieces (model.h) ----

void GPT::attention_input(int u, const void* p) {
  NZ_CHECK(seq_.slices && u > L_.embed_unit() && u < L_.lnf_unit(), "attention_input: unit %d", u);
  begin_compute("forward", u, p);
  p = qat_view(u, p, L_.units[u].numel);
  NZ_DISPATCH_DTYPE(dt_, attention_input_t<T>(u, (const T*)p));
  end_compute("forward", u);
}
void GPT::attention(int u, int seq_tokens) {
  NZ_CHECK(seq_.slices && !seq_.ring && u > L_.embed_unit() && u < L_.lnf_unit() && seq_tokens > 0 &&
           (b_ * full_seq()) % seq_tokens == 0, "attention: unit %d, sequences of %d (ring: the rung attends)", u, seq_tokens);
  NZ_DISPATCH_DTYPE(dt_, attention_t<T>(u, seq_tokens));
}
void GPT::attention_output(int u, const void* p) {
  NZ_CHECK(seq_.slices && u > L_.embed_unit() && u < L_.lnf_unit(), "attention_output: unit %d", u);
  begin_compute("forward", u, p);
  p = qat_view(u, p, L_.units[u].numel);
  NZ_DISPATCH_DTYPE(dt_, attention_output_t<T>(u, (const T*)p));
  end_compute("forward", u);
  unit_done();
}
void GPT::attention_output_backward(int u, const void* p, void* g) {
  NZ_CHECK(seq_.slices && u > L_.embed_unit() && u < L_.lnf_unit(), "attention_output_backward: unit %d", u);
  begin_compute("backward", u, p);
  check_span(g, L_.units[u].padded * dtype_bytes(dt_), ("the gradient of backward " + L_.units[u].name).c_str());
  fill_zero(g, L_.units[u].padded * dtype_bytes(dt_), Location::Device);
  p = qat_view(u, p, L_.units[u].numel);
  NZ_DISPATCH_DTYPE(dt_, attention_output_backward_t<T>(u, (const T*)p, (T*)g));
  end_compute("backward", u);
}
void GPT::attention_backward(int u, int seq_tokens) {
  NZ_CHECK(seq_.slices && !seq_.ring && u > L_.embed_unit() && u < L_.lnf_unit() && seq_tokens > 0 &&
           (b_ * full_seq()) % seq_tokens == 0, "attention_backward: unit %d, sequences of %d (ring: the rung attends)", u, seq_tokens);
  NZ_DISPATCH_DTYPE(dt_, attention_backward_t<T>(u, seq_tokens));
}
void GPT::attention_input_backward(int u, const void* p, void* g) {
  NZ_CHECK(seq_.slices && u > L_.embed_unit() && u < L_.lnf_unit(), "attention_input_backward: unit %d", u);
  begin_compute("backward", u, p);
  p = qat_view(u, p, L_.units[u].numel);
  NZ_DISPATCH_DTYPE(dt_, attention_input_backward_t<T>(u, (const T*)p, (T*)g));
  NZ_CHECK(!prune_, "--prune-mask with sequence slices: not built (the trainer refuses it)");
  end_compute("backward", u);
  unit_done();
}

GPT::AttentionBuffers GPT::attention_buffers(int u) const {
  NZ_CHECK(seq_.slices && u > L_.embed_unit() && u < L_.lnf_unit(), "attention_buffers: unit %d", u);
  const ActLayout a(L_.cfg, B_, T_, dt_, ckpt_, attn_, first_, end_, act_slices());
  const ActLayout::Layer& s = a.layer[u - 1];
  char* acts = slot_acts();
  char* grads = static_cast<char*>(grad_acts_.data());
  return {acts + s.qkv, acts + s.qkv_heads, acts + s.atty_heads, acts + s.atty,
          grads + a.dln, grads + a.datty_heads, grads + a.dqkv_heads, grads + a.dqkv};
}

}  // namespace nz
