// model.h — the GPT-2 model: the forward/backward of one unit at a time (the trainer drives the
// unit loop), over the flat parameter layout of layout.h.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "kernels/dtype.h"
#include "kernels/kernels.h"  // Attention, flash_attention_in_force
#include "layout.h"  // GPTConfig, Unit, Slice, Layout
#include "compression/prune.h"  // UnitMasks: --prune-mask
#include "ledger.h"
#include "compression/qat.h"  // QatConfig: --qat

namespace nz {

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
// The same for a pipeline segment (pipeline.h) holding units [first, end) with `slots`
// micro-batches' activations kept at once: each slot holds the segment's input, its blocks'
// activations, the head's (last segment) and its tokens (first segment) or targets (last segment);
// one set of activation gradients serves them all. Units [0, L+2) with one slot is activation_bytes.
size_t segment_activation_bytes(const GPTConfig& cfg, int B, int T, DType dt, bool checkpointing, Attention attn,
                                int first, int end, int slots);

// Activation checkpointing (--activation-checkpointing): the forward keeps only each block's input
// (the residual stream between blocks) and computes the block's internals into one block's worth
// of scratch, shared by all blocks; the backward of a block first runs the block's forward again
// (same kernels, same parameters, same input: the same bits), then its backward as usual. Memory
// for the saved activations goes from L blocks' worth to L block inputs plus one block; the price
// is one more forward of every block per micro-step (recompute_flops_per_token, mfu.h).

// Sequence slices (ulysses/train.cpp, DeepSpeed-Ulysses): S ranks split every sequence of T tokens
// into S contiguous slices of T/S. The model of slice s holds only its tokens' activations, uses
// their rows of the learned positions (wpe from first_position on), and runs a block in three calls
// with the rung's all-to-alls between them: attention_input (ln1, qkv: my tokens, all heads), then
// attention (all T tokens, my NH/S heads, exact), then attention_output (the projection, the MLP: my
// tokens). slices = 0: the whole sequence (every other rung).
struct SeqSlices {
  int slices = 0;          // S (0: off)
  int slice = 0;           // s: my tokens are [s T/S, (s + 1) T/S) of each sequence
  int first_position = 0;  // the position of my first token (s T/S): the rows of wpe my tokens use
  // ring attention (ulysses --sp-mode ring): the sequence is cut into 2S chunks of T/(2S) and slice s
  // holds chunks s and 2S-1-s (the zig-zag order); the rung runs attention itself on my tokens, so
  // the model keeps no heads' layout and no probabilities. first_position is then my first chunk's
  // position, second_position my second chunk's.
  bool ring = false;
  int second_position = 0;
};
// The activation bytes of slice s: activation_bytes with T/S tokens per sequence, where attention
// keeps all T tokens of NH/S heads (its probabilities B(NH/S)T^2, and q, k, v and the output in the
// heads' layout) and the loss's mean is over all T tokens (ulysses/formulas.h writes it out).
size_t seq_slice_activation_bytes(const GPTConfig& cfg, int B, int T, int S, DType dt, bool ring = false);

// The model for a fixed micro-batch shape: activations allocated once (ledger: activations), the
// forward and backward of each unit, and the tied LM head + loss.
class GPT {
 public:
  // A pipeline segment (pipeline.h) builds the model of its units [first_unit, end_unit) only, with
  // `slots` micro-batches' activations (use_slot picks the one the calls below work on); by default
  // every unit and one slot.
  // seq: sequence slices (above); T stays the whole sequence's length.
  GPT(const Layout& layout, DType dt, int B, int T, bool checkpointing = false, int first_unit = 0, int end_unit = -1,
      int slots = 1, SeqSlices seq = {});
  const Layout& layout() const { return L_; }
  bool checkpointing() const { return ckpt_; }
  // Flash when flash_attention_in_force (kernels.h) at construction: the activations keep only
  // the log-sum-exp of attention (activation_bytes); Gemm otherwise (and always on the CPU).
  Attention attention() const { return attn_; }
  DType dtype() const { return dt_; }
  int batch() const { return B_; }
  int seq() const { return T_; }
  // --prune-mask (prune.h): backward() zeroes the gradient of every pruned weight before it leaves
  // the unit, so every collective, the norm and the clipping see the pruned network's gradient.
  // The CPU path only (the trainer refuses it on CUDA).
  void set_prune_mask(std::shared_ptr<const UnitMasks> masks) { prune_ = std::move(masks); }

  // ---- sequence slices (SeqSlices above; ulysses/train.cpp) ----
  // A block u's forward in three calls; forward(u) runs the embedding, lnf, and (whole sequences) blocks.
  // attention_input: ln1 and qkv of my tokens, all heads, into attention_buffers(u).qkv (B,T/S,3C).
  // attention: from qkv_heads (B,T,3C/S: q | k | v of my NH/S heads, all tokens) into out_heads
  //   (B,T,C/S), per head exactly, over sequences of seq_tokens tokens (T: causal in global positions).
  // attention_output: from out (B,T/S,C: my tokens, all heads) on: the projection, the MLP.
  void attention_input(int u, const void* unit_params);
  void attention(int u, int seq_tokens);
  void attention_output(int u, const void* unit_params);
  // Its backward in three calls, in reverse (zeroing unit_grads first; the weight gradients are my
  // tokens' part of the sum over the batch): attention_output_backward writes d out (grad_out,
  // B,T/S,C); attention_backward turns d out_heads (grad_out_heads) into d qkv_heads
  // (grad_qkv_heads); attention_input_backward goes from d qkv (grad_qkv, B,T/S,3C) to the block's input.
  void attention_output_backward(int u, const void* unit_params, void* unit_grads);
  void attention_backward(int u, int seq_tokens);
  void attention_input_backward(int u, const void* unit_params, void* unit_grads);
  // Where block u's attention reads and writes, in the two layouts the all-to-alls turn between.
  struct AttentionBuffers {
    void *qkv, *qkv_heads, *out_heads, *out;                      // forward
    void *grad_out, *grad_out_heads, *grad_qkv_heads, *grad_qkv;  // backward
  };
  AttentionBuffers attention_buffers(int u) const;
  const SeqSlices& seq_slices() const { return seq_; }

  // ---- pipeline segments (pipeline.h) ----
  int rows() const { return b_; }  // the sequences of the batch in use (evaluation's last may be short)
  bool has_embed() const { return first_ == L_.embed_unit(); }
  bool has_head() const { return end_ == L_.num_units(); }  // the segment with lnf computes the head and loss
  int slots() const { return slots_; }
  // The micro-batch slot set_batch, forward, backward and the pointers below use from now on.
  void use_slot(int s);
  // This slot's (B,T,C) input of the segment's first unit (where the previous segment's output is
  // received), and the output of its last unit (what is sent to the next segment).
  void* segment_input() const;
  void* segment_output() const;
  // The (B,T,C) activation gradient that flows backward, shared by the slots: before the backward
  // of the segment's last unit, d loss / d (its output), received from the next segment; after the
  // backward of its first unit, d loss / d (the segment's input), to send to the previous segment.
  void* activation_grad() const;
  // The last segment of a pipeline without the embedding: the LM head's gradient of the tied wte for
  // this slot's micro-batch (V,C), into zeros, after head_backward. The first segment receives it into
  // its embedding gradient, where backward(embed) adds the lookup's: the same numbers, added in the
  // same order, as backward(embed) on a model that holds both ends.
  void head_weight_backward(void* dwte);

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
  // Backward of unit u: zeroes unit_grads (padded size) and writes this unit's gradient into it
  // (the embedding on a pipeline's first segment: adds to the head's part received there, see
  // head_weight_backward).
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

  // Quantization-aware training (qat.h), from now on: forward, backward and the LM head compute
  // with a fake-quantized copy of the parameters they are given, the same in every trainer. The
  // copy is one unit's worth, reused unit after unit (ledger: scratch on the device, qat_bytes in
  // zero_formulas.h). CPU backend only (the quantizer reads host memory).
  void set_qat(const QatConfig& q);
  const QatConfig& qat() const { return qat_; }

 private:
  // --qat: the parameters unit u computes with, given the caller's p (its first n values quantized):
  // the fake-quantized copy, or p itself when QAT is off or skips the unit.
  const void* qat_view(int u, const void* p, size_t n);
  void begin_compute(const char* what, int u, const void* p);  // checks p, notes the activity (model.cpp)
  void end_compute(const char* what, int u);
  template <class T> void forward_t(int u, const T* p);
  template <class T> void head_forward_t(const T* wte);
  template <class T> void head_backward_t(const T* wte);
  template <class T> void backward_t(int u, const T* p, T* g);
  template <class T> void head_weight_backward_t(T* dwte);
  // a block's forward and backward in the three pieces above (forward_t, backward_t call them too)
  template <class T> void attention_input_t(int u, const T* p);
  template <class T> void attention_t(int u, int seq_tokens);
  template <class T> void attention_output_t(int u, const T* p);
  template <class T> void attention_output_backward_t(int u, const T* p, T* g);
  template <class T> void attention_backward_t(int u, int seq_tokens);
  template <class T> void attention_input_backward_t(int u, const T* p, T* g);
  int act_slices() const { return seq_.ring ? -seq_.slices : seq_.slices; }  // ActLayout's S (< 0: ring)
  int full_seq() const { return seq_.slices ? T_ * seq_.slices : T_; }  // the sequence's tokens (the loss's mean)
  void load_rows(const int* tokens, const int* targets, int b);  // set_batch, once the rows are mine
  char* slot_acts() const;
  const int* slot_tokens() const;
  const int* slot_targets() const;

  const Layout& L_;
  DType dt_;
  bool ckpt_;          // activation checkpointing: keep block inputs, recompute the rest
  int B_, T_, b_ = 0;  // allocated batch, sequence length (my slice's); rows used by the current batch
  SeqSlices seq_;      // sequence slices (off by default)
  Attention attn_;     // what each block's att holds: the probabilities (Gemm) or the lse (Flash)
  int first_, end_;    // the units this model computes (a pipeline segment's; all by default)
  int slots_, slot_ = 0;   // micro-batches' activations kept, and the one in use
  size_t slot_bytes_ = 0;  // one slot's activations
  float loss_scale_ = 1;  // fp16: the loss scale the backward starts from
  std::shared_ptr<const UnitMasks> prune_;  // --prune-mask: the pruned weights (null: none)
  Buffer acts_;        // all saved activations, one block (see activation_bytes for the layout)
  Buffer grad_acts_;   // activation gradients of one block, reused block after block
  Buffer tokens_, targets_;
  QatConfig qat_;      // --qat (off by default)
  Buffer qat_unit_;    // --qat: the fake-quantized copy of the unit computing now
  size_t tok_bytes_;   // tokens_' and targets_' size (B*T ints, rounded up to 64 bytes)
  // Outside the ledger (a few bytes): the loss total (device) and, on a GPU, pinned host slots the
  // token batches are staged in for their queued copies (set_batch).
  RawBlock loss_total_{sizeof(double), Location::Device};
  bool loss_total_fresh_ = true;  // the next head_forward starts the total (instead of adding to it)
  std::vector<RawBlock> staging_;
  size_t next_staging_ = 0;
};

}  // namespace nz
