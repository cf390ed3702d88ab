// tensor.h — tensor parallelism's plan (Megatron-LM): which rank holds which piece.
//
// N ranks = D replicas x T tensor ranks, T fastest: rank r is tensor rank t = r % T of replica
// d = r / T, so a replica's T ranks are neighbours in rank order (inside one node on real machines,
// where the all-reduces of every layer belong). 3D (--pipeline P): N = P x D x T, rank
// r = p D T + d T + t; segment p of each replica holds a run of units (tensor/pipe3d.cpp).
// Each tensor rank holds, of every unit (of its segment's, in 3D):
//   embed   wte rows [t V', (t+1) V') of the vocabulary padded to V' T (see padded_vocab); wpe whole
//   block   qkv_w, qkv_b: the q, k and v rows of heads [t H/T, (t+1) H/T)    (column-parallel)
//           attproj_w: the columns of those heads; attproj_b whole            (row-parallel)
//           fc_w, fc_b: rows [t 4C/T, (t+1) 4C/T)                             (column-parallel)
//           fcproj_w: the columns of those rows; fcproj_b whole               (row-parallel)
//           ln1, ln2 whole
//   lnf     whole
// "whole" parameters are replicated: every tensor rank holds them, computes the same gradient for
// them from the same numbers, and updates them alike; they are never summed over the T ranks.
// tensor_layout() is a rank's own layout of these pieces: the same units and tensors in the same
// order as make_layout's (layout.h), so AdamW, the gradient sums and the per-unit all-reduce over
// the D replicas work on it unchanged.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "layout.h"
#include "rung.h"  // Topology

namespace nz {

struct Args;  // input/cli.h
class Trainer;    // trainer.h
class TensorGPT;  // tensor/tp_model.h
class Comm;       // comm.h
class AdamW;      // optim.h

struct TensorPlan {
  int tensor = 1, replicas = 1;  // T, D
  int t = 0, d = 0;              // this rank's tensor rank and replica
  int zero = 0;                  // --zero 1: the optimizer state sharded over the D replicas (ZeRO-1)
  bool sp = false;               // --sequence-parallel (Megatron's, Korthikanti et al. 2022)
  int segments = 1, p = 0;       // 3D (--pipeline P): P pipeline segments, this rank's (tensor/pipe3d.cpp)
  // T fastest, then D, then P (Megatron's order): rank = p D T + d T + t
  int rank_of(int tr, int dr, int pr = 0) const { return (pr * replicas + dr) * tensor + tr; }
};

// The plan for `rank` of `world`; bad input (T not dividing the heads, 4C or N; a flag this rung
// does not build) is one line and exit 2 (check.h, user_error).
TensorPlan tensor_plan(const Args& a, int world, int rank);
// The Trainer's view: my replica among D (the data), and a model of its own (the Trainer's holds
// only the batch: units [0, 1)).
Topology tensor_topology(const Args& a, int world, int rank);

// One line for the log: T x D, the placement, the vocabulary's rows per rank (and its padding).
std::string tensor_summary(const TensorPlan& p, const GPTConfig& cfg);
// The vocabulary rounded up to a multiple of T: each tensor rank holds V'/T rows of wte. The rows
// past V are zeros that no token looks up and no logit counts (the loss masks them).
int padded_vocab(int vocab, int T);
// Whether tensor `name` is replicated (held whole by every tensor rank) or split.
bool replicated_tensor(const char* name);
// A tensor rank's layout: the pieces above, each unit padded to a multiple of D for the replicas'
// all-reduce.
Layout tensor_layout(const GPTConfig& cfg, int T, int D);
// Rank t's piece of unit u as runs of contiguous elements: fn(full_offset, local_offset, n), the
// offsets counted from the unit's first element in the full layout (make_layout) and in the rank's.
void for_each_run(const Layout& full, const Layout& local, int u, int T, int t,
                  const std::function<void(size_t full_at, size_t local_at, size_t n)>& fn);

// ZeRO-1 over the replicas (--zero 1): the part of unit u's pieces whose optimizer state my replica
// keeps (slice d of the unit, as stage1 on D ranks); without it the whole unit.
Slice owned_part(const Layout& L, const TensorPlan& p, int u);
// The start-up of units [u0, u1) (tensor/train.cpp: all of them; 3D: my segment's, pipe3d.cpp): each
// whole unit's initial values, drawn as every rung draws them, my pieces copied out into param(u) on
// the device (the unit's padding zeros), and AdamW's master copy of the part I own (owned_part).
// AdamW: made for owned_parts(L, plan, u0, u1). In hooks.cpp (it needs the Trainer; the explorer
// links tensor.cpp alone).
std::vector<Slice> owned_parts(const Layout& L, const TensorPlan& p, int u0, int u1);
void init_my_pieces(Trainer& run, const Layout& L, const TensorPlan& plan, int u0, int u1,
                    const std::function<void*(int u)>& param, AdamW& adam);

// What the Trainer asks of a tensor rank besides training (hooks.cpp): validation's forward on my
// pieces, the model file (each unit's pieces gathered over my tensor ranks), the memory formulas.
// P(u): my pieces of unit u.
void set_tensor_hooks(Trainer& run, const TensorPlan& plan, const Layout& L, TensorGPT& model, Comm& tp,
                      std::function<void*(int u)> P);

// 3D (--pipeline P > 1, tensor/pipe3d.cpp): the training loop of one pipeline segment's tensor rank,
// called by tensor/train.cpp's main; and its hooks (validation through the segments, the model file
// from each segment's replica 0, each rank's formulas). P(u): my pieces of unit u of my segment.
struct PipelinePlan;  // pipeline/pipeline.h
int train_3d(Trainer& run, const TensorPlan& plan);
void set_3d_hooks(Trainer& run, const TensorPlan& plan, const PipelinePlan& pipe, const Layout& L, TensorGPT& model,
                  Comm& tp, std::function<void*(int u)> P, const void* head_weights);

}  // namespace nz
