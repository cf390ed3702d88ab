// formulas.h — what one tensor rank holds and sends, to the byte and the element.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/dtype.h"
#include "layout.h"
#include "zero_formulas.h"  // StateBytes

namespace nz {

// ---- model state of a tensor rank: stage0_ddp's terms over its own pieces (tensor_layout), with
// P_t = Σ padded over its units and U_t its largest unit ----
//   params e P_t   grads e P_t + e U_t   master 4 P_t (bf16, fp16)   Adam m, v 4 P_t each
// P_t = (V'C + 12LC²)/T + ctxC + L·9C + 2C (+ padding to D): the matrices and the split biases
// (qkv_b, fc_b) 1/T each, every replicated parameter whole (layer norms, wpe, attproj_b, fcproj_b).
// --zero 1: master, m and v of the rank's slice only, P_t / D each (as stage1 on D ranks).
StateBytes tensor_state_bytes(const Layout& mine, DType dt, int zero = 0);
// P_t by the formula above, unpadded (the tests hold tensor_layout's numel to it).
uint64_t tensor_param_formula(const GPTConfig& cfg, int T);

// ---- activations of a tensor rank for a micro-batch b x s (every term rounded up to 64 bytes) ----
//   per block  the residual stream's and the layer norms' (b,s,C): ln1, res_att, ln2, res_out
//              my heads' q|k|v (b,s,3C/T), probabilities (b,H/T,s,s), output (b,s,C/T)
//              my MLP columns (b,s,4C/T) twice (before and after GELU); 4 rows of fp32 (means, rstds)
//   once       x0 and lnf (b,s,C), lnf's 2 rows, my logits (b,s,V'/T), the losses (b,s) fp32;
//              the backward's grads of one block: 4 (b,s,C), (b,s,4C/T), (b,s,3C/T);
//              the loss's per-row max, sum and target (R = bs rounded up to T), the T maxima (T R);
//              the tokens and targets (b,s) ints
//   + the Trainer's model of the embedding at one position (Topology::own_model), which only holds
//     the batch: x0 and one block's activation grads at s = 1 (5 (b,1,C), (b,1,4C), (b,1,3C)), b tokens.
// Without sequence parallelism the (b,s,C) terms do not shrink with T: Korthikanti et al. (2022).
// With it (sp) every (b,s,C) term of the residual stream and the layer norms, their rows of fp32,
// x0 and the block's grads of (b,s,C) hold bs/T rows; lnf's output is kept whole for the LM head
// (and its bs/T rows apart); the backward adds two (b,s,C) buffers: a gathered layer norm (its
// rows are gathered again in the backward instead of kept) and a partial before its scatter.
// 3D (--pipeline): a segment's rank holds the terms above of its units [u0, u1) only, for `slots`
// micro-batches (activation_slots: K for GPipe, min(P-p, K) for 1F1B): per slot its blocks' terms,
// x0 if it holds the embedding or block 1, the (b,s,C) rows it receives (the previous block's output:
// b s/T rows with sp) if it starts past block 1, lnf's and the head's terms on the last segment only,
// the tokens and targets; once, the backward's grads of one block; the loss's scalars on the last.
uint64_t tensor_activation_bytes(const GPTConfig& cfg, int T, DType dt, int B, int S, bool sp = false, int u0 = 0,
                                 int u1 = -1, int slots = 1);
// 3D: the model state of a rank of the segment holding units [u0, u1): tensor_state_bytes's terms
// over those units, P_s = Σ padded and U_s the largest; on the last segment (last) the LM head's copy
// of my V'/T rows of wte and their gradient, e V'C/T each (as pipeline_stage_bytes, over my rows).
StateBytes tensor3d_state_bytes(const Layout& mine, DType dt, int zero, int u0, int u1, bool last);

// ---- elements one rank sends per step (the comm ledger's), K micro-steps of b x s ----
//   all-reduce over the T tensor ranks, per micro-step: 4 per block (g twice forward, f twice
//     backward) and 2 more (the embedding's g, the LM head's f) of bsC; the loss's S and z_target of
//     R each. An all-reduce of n over G ranks sends 2(G-1)n/G.
//   all-gather over the T tensor ranks, per micro-step: the loss's row maxima, (T-1) R.
//   all-reduce over the D replicas, once per step: my pieces, 2(D-1) P_t / D (--zero 1: a
//     reduce-scatter and an all-gather of (D-1) P_t / D each, in the step's total as well).
// Sequence parallelism (sp): each all-reduce of b s C becomes a reduce-scatter and an all-gather,
// (T-1) b s C / T each, and the backward gathers each block's two layer norms' rows again: per
// micro-step (4L + 2) reduce-scatters and (6L + 2) all-gathers of b s C; and the replicated layer
// norms' gradients, each rank's over its rows, are all-reduced: 2C per layer norm, 2L + 1 of them.
struct TensorComm {
  uint64_t all_reduce = 0, all_gather = 0, reduce_scatter = 0;
  uint64_t point_to_point = 0;  // 3D: to the neighbour segments
  uint64_t total() const { return all_reduce + all_gather + reduce_scatter + point_to_point; }
};
TensorComm tensor_comm_elems(const GPTConfig& cfg, int T, int D, const Layout& mine, int B, int S, int accum,
                             bool sp = false);
// 3D: a rank of the segment holding units [u0, u1) (first, last: the first and the last segment),
// per step: the terms above for its units only (the embedding's g and its 4 per block, the head's f
// and the loss's on the last segment; with sp each block's 4 reduce-scatters, 6 all-gathers, 2
// all-reduces of 2C, the embedding's 1 reduce-scatter and 1 all-gather, lnf's 1 all-gather and
// all-reduce of 2C, the head's 1 reduce-scatter), the all-reduce of its pieces P_s over the D
// replicas, and point to point: K activations (b s C, with sp b s C/T) to the next segment unless
// last, K of their gradients to the previous one unless first, K head gradients of wte's V'C/T rows
// from the last segment to the first, and the first's V'C/T updated rows to the last once per step.
TensorComm tensor3d_comm_elems(const GPTConfig& cfg, int T, int D, const Layout& mine, int B, int S, int accum,
                               bool sp, int u0, int u1, bool first, bool last);

// The report's "tensor" object: T, D, P_t, the formulas' numbers.
struct TensorPlan;    // tensor.h
struct PipelinePlan;  // pipeline/pipeline.h
// 3D: T, P, D, the partition and schedule, rank 0's formulas.
std::string tensor3d_report_json(const GPTConfig& cfg, const TensorPlan& plan, const PipelinePlan& pipe,
                                 const Layout& mine, DType dt, int B, int S, int accum);
std::string tensor_report_json(const GPTConfig& cfg, int T, int D, const Layout& mine, DType dt, int B, int S,
                               int accum, int zero, bool sp);

}  // namespace nz
