// model.h — the GPT-2 model: config and presets, the flat parameter layout in units, and the
// forward/backward of one unit at a time (the trainer drives the unit loop).
//
// Units, in forward order (docs/stages.md, "Units and sharding"):
//   unit 0          "embed":  wte (V,C) token embedding, tied to the LM head; wpe (maxT,C)
//   units 1..L      "block l": ln1 w,b (C) | qkv w (3C,C), b (3C) | attproj w (C,C), b (C) |
//                             ln2 w,b (C) | fc w (4C,C), b (4C) | fcproj w (C,4C), b (C)
//   unit L+1        "lnf":    final layernorm w,b (C)
// Each unit is contiguous in the flat buffer and padded with zeros to a multiple of the world size
// N, so rank r owns slice r of every unit, and every collective is one call per unit.
#pragma once
#include <string>
#include <vector>

#include "device.h"
#include "dtype.h"
#include "kernels.h"  // Attention, flash_attention_in_force
#include "ledger.h"

namespace nz {

struct GPTConfig {
  int vocab = 256;  // byte-level
  int ctx = 128;    // maximum sequence length (rows of wpe)
  int layers = 4;
  int dim = 128;
  int heads = 4;
};
// Presets: "tiny" (tests), "small" (~1M parameters, the CPU default), "gpt2" (GPT-2 124M's shape:
// 12 layers, 768 wide, 12 heads, context 1024; 85.9M parameters with the 256-byte vocabulary).
bool preset_config(const std::string& name, GPTConfig* out);
const char* preset_names();  // "tiny, small, gpt2"

struct TensorSpec {
  std::string name;
  size_t offset;  // elements from the start of the unit
  size_t numel;
  bool decay;     // weight decay applies (matrices and embeddings; not biases or layernorms)
};

struct Unit {
  std::string name;
  size_t offset;        // elements from the start of the flat (padded) buffer
  size_t numel;         // real parameters
  size_t padded;        // numel rounded up to a multiple of N
  size_t shard_offset;  // where this unit's slice starts in a rank's shard buffers (Σ earlier padded/N)
  std::vector<TensorSpec> tensors;
};

// A range of elements inside a unit: what one rank owns, or the whole unit.
struct Slice {
  size_t begin, end;
  size_t size() const { return end - begin; }
};

struct Layout {
  GPTConfig cfg;
  int world = 1;                // N
  std::vector<Unit> units;      // embed, blocks, lnf
  size_t num_params = 0;        // Ψ: real parameters
  size_t padded_total = 0;      // Σ padded
  size_t shard_total = 0;       // S: Σ padded / N, the elements each rank owns
  size_t max_unit_padded = 0;   // the largest unit (the size of a bucket / gather buffer)
  int num_units() const { return int(units.size()); }
  int embed_unit() const { return 0; }
  int lnf_unit() const { return num_units() - 1; }
  Slice full(int u) const { return {0, units[u].padded}; }
  Slice shard(int u, int rank) const {
    size_t s = units[u].padded / world;
    return {rank * s, (rank + 1) * s};
  }
};
Layout make_layout(const GPTConfig& cfg, int world);
// The same number the layout counts, by the textbook formula (the tests compare the two).
size_t param_count_formula(const GPTConfig& cfg);

// Deterministic initialisation of one unit (padded, fp32, host), identical on every rank and in
// every stage: weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), biases 0, layernorm
// weight 1. Each unit has its own random stream, so stage3 can initialise units one at a time.
void init_unit(const Layout& L, int u, uint64_t seed, float* out);

// A model file's Ψ weights (layout order, as load_model reads them) spread into the padded layout
// of N = 1 (each unit at its offset, zeros after it): what the tools run a saved model from.
std::vector<float> padded_params(const Layout& L, const std::vector<float>& weights);

// Activation bytes the model allocates for a micro-batch of B sequences of length T, with or
// without activation checkpointing, with the attention in force (Flash: each block keeps the
// (B,NH,T) fp32 log-sum-exp instead of the (B,NH,T,T) probabilities) (zero_formulas.h writes the
// same number out as a formula; the tests compare the two, and the ledger with both).
size_t activation_bytes(const GPTConfig& cfg, int B, int T, DType dt, bool checkpointing = false,
                        Attention attn = Attention::Gemm);

// Activation checkpointing (--activation-checkpointing): the forward keeps only each block's input
// (the residual stream between blocks) and computes the block's internals into one block's worth
// of scratch, shared by all blocks; the backward of a block first runs the block's forward again
// (same kernels, same parameters, same input: the same bits), then its backward as usual. Memory
// for the saved activations goes from L blocks' worth to L block inputs plus one block; the price
// is one more forward of every block per micro-step (recompute_flops_per_token, mfu.h).

// The model for a fixed micro-batch shape: activations allocated once (ledger: activations), the
// forward and backward of each unit, and the tied LM head + loss.
class GPT {
 public:
  GPT(const Layout& layout, DType dt, int B, int T, bool checkpointing = false);
  const Layout& layout() const { return L_; }
  bool checkpointing() const { return ckpt_; }
  // Flash when flash_attention_in_force (kernels.h) at construction: the activations keep only
  // the log-sum-exp of attention (activation_bytes); Gemm otherwise (and always on the CPU).
  Attention attention() const { return attn_; }
  DType dtype() const { return dt_; }
  int batch() const { return B_; }
  int seq() const { return T_; }

  // tokens, targets: host arrays of b*T ints (b <= B: evaluation may run a short last batch).
  // The copy to the device is queued behind the work already queued: the host does not wait.
  void set_batch(const int* tokens, const int* targets, int b);

  // Forward of unit u given its parameters (a pointer to the unit's first element, anywhere).
  void forward(int u, const void* unit_params);
  // LM head (the tied wte) + softmax cross-entropy. Adds the SUM of the batch's per-token losses,
  // in double, to a total kept on the device: the host does not wait for the GPU here.
  void head_forward(const void* embed_params);
  // The total of the batches' summed losses since the last call (the micro-steps of one training
  // step; the trainer divides), then starts a new total. Waits for the GPU: once per step.
  double take_loss_sum();
  // d loss / d logits (mean over the batch's tokens), then the gradient flowing into the final
  // layernorm. The LM head's weight gradient is NOT computed here: it is added to the tied
  // embedding's gradient by backward(embed_unit), so that gradient is complete in one place.
  void head_backward(const void* embed_params);
  // fp16 loss scaling (loss_scale.h): head_backward starts from S * d loss / d logits, so every
  // gradient of the backward is S times the true one. 1 by default.
  void set_loss_scale(float s) { loss_scale_ = s; }
  // Backward of unit u: zeroes unit_grads (padded size) and writes this unit's gradient into it.
  // With checkpointing, a block's backward first recomputes its forward from its saved input, with
  // the same unit_params (in stage3, the parameters its backward gathers anyway).
  // The embed unit's backward needs no parameters (pass nullptr): it collects the LM head's
  // weight gradient and the token/position lookup gradients.
  void backward(int u, const void* unit_params, void* unit_grads);
  // After head_forward (before head_backward): the softmax probabilities of one row (token
  // position b*T + t) as fp32 on the host (text generation).
  void probs_row(int row, float* out_vocab) const;
  // After forward(block l + 1): that block's q | k | v, (B,T,3C) in the storage type on the device
  // (inference fills its KV cache from a prompt's forward).
  const void* layer_qkv(int l) const;

 private:
  void begin_compute(const char* what, int u, const void* p);  // checks p, notes the activity (model.cpp)
  void end_compute(const char* what, int u);
  template <class T> void forward_t(int u, const T* p);
  template <class T> void head_forward_t(const T* wte);
  template <class T> void head_backward_t(const T* wte);
  template <class T> void backward_t(int u, const T* p, T* g);

  const Layout& L_;
  DType dt_;
  bool ckpt_;          // activation checkpointing: keep block inputs, recompute the rest
  int B_, T_, b_ = 0;  // allocated batch, sequence length; rows used by the current batch
  Attention attn_;     // what each block's att holds: the probabilities (Gemm) or the lse (Flash)
  float loss_scale_ = 1;  // fp16: the loss scale the backward starts from
  Buffer acts_;        // all saved activations, one block (see activation_bytes for the layout)
  Buffer grad_acts_;   // activation gradients of one block, reused block after block
  Buffer tokens_, targets_;
  size_t tok_bytes_;   // tokens_' and targets_' size (B*T ints, rounded up to 64 bytes)
  // Outside the ledger (a few bytes): the loss total (device) and, on a GPU, pinned host slots the
  // token batches are staged in for their queued copies (set_batch).
  RawBlock loss_total_{sizeof(double), Location::Device};
  bool loss_total_fresh_ = true;  // the next head_forward starts the total (instead of adding to it)
  std::vector<RawBlock> staging_;
  size_t next_staging_ = 0;
};

}  // namespace nz
