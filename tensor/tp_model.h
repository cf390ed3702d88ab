// tp_model.h — the GPT of one tensor rank: each matrix a piece, the all-reduces between.
//
// Megatron-LM's two conjugate operators, written out in tp_model.cpp where they run:
//   f  identity forward, all-reduce backward: before a column-parallel matrix (qkv, fc, the LM
//      head). Its input is the same on every tensor rank; each rank's piece sends back only its
//      part of the input's gradient, so the T parts are summed.
//   g  all-reduce forward, identity backward: after a row-parallel matrix (attproj, fcproj, the
//      embedding's lookup). Each rank computes a partial product from its heads / its rows; the
//      output is their sum. Its gradient is the same on every rank already.
// Per block and micro-batch that is 4 all-reduces of (b, s, C): g twice in the forward, f twice in
// the backward. The cross-entropy runs over the vocabulary pieces (head_forward): no rank holds a
// whole row of logits.
//
// Sums over ranks add the contributions in rank order (comm.h), so a single process that adds the
// same partial products in the same order gets the same bits (tests/tensor/tp_reference.h).
// Every op runs on the run's backend (kernels/ops.h): on the GPU the vocabulary's lookup, the
// biases and the cross-entropy's per-row numbers are device kernels too (kernel_table.inc, vocab_*).
#pragma once
#include <vector>

#include "comm.h"
#include "kernels/dtype.h"
#include "layout.h"
#include "ledger.h"

namespace nz {

// 3D (tensor/pipe3d.cpp): the units [u0, u1) of one pipeline segment (u1 < 0: to the last), and
// the activations of `slots` micro-batches (pipeline.h's activation_slots for the schedule).
struct TensorSegment {
  int u0 = 0, u1 = -1, slots = 1;
};

class TensorGPT {
 public:
  // L: this rank's layout (tensor_layout); tp: my replica's T tensor ranks; B x S the micro-batch.
  // sp: Megatron's sequence parallelism (--sequence-parallel): outside attention and the MLP each
  // rank keeps bs/T rows of the (b,s,C) activations; g becomes a reduce-scatter, f's all-reduce an
  // all-gather forward and a reduce-scatter backward (gather_rows, scatter_sum_rows).
  TensorGPT(const Layout& L, int T, int t, Comm& tp, DType dt, int B, int S, bool sp = false,
            const TensorSegment& seg = {});
  // 3D: which micro-batch's activations (and tokens) the calls below use; set before set_batch
  void use_slot(int s);
  // 3D: the (b, s, C) rows that cross to the next segment (SP: my b s/T rows): where my segment's
  // input is received, where its output is sent from, the gradient of either (one buffer, shared
  // by the slots); their elements
  void* segment_input();
  void* segment_output();
  void* activation_grad();
  size_t boundary_elems() const;
  // 3D, the last segment: the LM head's part of my wte rows' gradient, for the first segment
  void head_weight_backward(void* g_wte);
  // tokens, targets: b x S ints on the host (b <= B: evaluation may run a short last batch)
  void set_batch(const int* tokens, const int* targets, int b);
  void set_loss_scale(float s) { loss_scale_ = s; }  // fp16 (loss_scale.h)
  void forward(int u, const void* p);   // p: my piece of unit u
  // The LM head (the tied wte's rows I hold) and the vocabulary-parallel cross-entropy; adds the
  // batch's summed loss to a total (the same on every tensor rank).
  void head_forward(const void* p_embed);
  double take_loss_sum();
  void head_backward(const void* p_embed);  // d loss / d logits of my columns, and d lnf (summed: f)
  // My piece of unit u's gradient into g (zeroed first); the embedding's adds the LM head's part
  // (3D, the head on another segment: g holds that part already, received, and the lookup's is added).
  void backward(int u, const void* p, void* g);
  // Activation bytes this model allocates (ledger: activations), as the constructor lays them out.
  static uint64_t activation_bytes(const GPTConfig& cfg, int T, DType dt, int B, int S, bool sp,
                                   const TensorSegment& seg = {});

 private:
  template <class X> void forward_t(int u, const X* p);
  template <class X> void head_forward_t(const X* wte);
  template <class X> void head_backward_t(const X* wte);
  template <class X> void backward_t(int u, const X* p, X* g);
  template <class X>
  void loss_from_sums(X* logits, const float* row_max, const float* sums, const float* target, int BT, int mine,
                      int Vl, size_t losses_at);
  void g_forward(void* partial_sum, size_t n);  // g: all-reduce forward
  void f_backward(void* grad_sum, size_t n);    // f: all-reduce backward
  // sequence parallelism's pair: every rank's rows to every rank (all-gather: ḡ forward, g
  // backward), and the partials summed, each rank keeping its rows (reduce-scatter: g forward, ḡ
  // backward); n: my rows' elements
  void gather_rows(const void* mine, void* all, size_t n);
  void scatter_sum_rows(void* all, void* mine, size_t n);
  const Layout& L_;
  int T_, t_;
  Comm& tp_;
  DType dt_;
  int B_, S_, b_ = 0;
  bool sp_;
  int u0_, u1_, slots_, slot_ = 0;  // my units [u0, u1); the activation slots, the one in use
  size_t slot_bytes_ = 0, tok_bytes_ = 0;
  float loss_scale_ = 1;
  RawBlock loss_total_{sizeof(double), Location::Device};  // the step's loss sum, where the losses are
  bool loss_fresh_ = true;
  Buffer acts_, grads_, rows_;  // saved activations; one block's activation grads; the loss's per-row scalars
  Buffer tok_;                  // the batch's tokens and targets
  int *tokens_ = nullptr, *targets_ = nullptr;
};

}  // namespace nz
