// muon.h — Muon (--optimizer muon): an optimizer that is not element-wise, under ZeRO.
//
// Muon (Keller Jordan, 2024; "Muon is Scalable for LLM Training", the Moonlight report, 2025)
// updates a 2-D weight matrix W (rows x cols) with its momentum orthogonalised:
//   B  <- mu B + G                        momentum, per element (mu = 0.95)
//   X  <- G + mu B                        Nesterov's look-ahead, per element
//   O  <- NewtonSchulz5(X)                ~ U V^T of X = U S V^T: needs the WHOLE matrix
//   W  <- W (1 - lr wd) - lr 0.2 sqrt(max(rows, cols)) O
// The scale 0.2 sqrt(max(rows, cols)) is the Moonlight report's (and DeepSpeed's): it gives the
// update the RMS AdamW's has, so Muon runs at AdamW's learning rate and weight decay. Here it
// updates the blocks' hidden matrices (qkv, attention projection, MLP up and down); the embedding,
// the layer norms and the biases keep AdamW (DeepSpeed's hybrid), each at its own rate:
// --muon-lr and --adam-lr (both default --lr, on --lr's curve).
//
// The ZeRO lesson: AdamW's update is per element, so a rank can update any slice of the flat buffer.
// Muon's is not: Newton–Schulz needs the whole matrix, and a unit's slices cut matrices at arbitrary
// places (zero_estimate --optimizer muon prints where). What each rank holds in stages 1-3 (the
// default design, DeepSpeed's: the owners of a cut matrix exchange what it needs):
//   - the momentum B of its own slice only (4 bytes per Muon element; AdamW's m and v: 8);
//   - X of its own part of each matrix it owns part of (X is per element: no one needs the others' B);
//   - the other owners' parts of X, received point to point, so X is whole: the same full matrix on
//     every owner, and in stage0_ddp. Newton–Schulz runs on it there (the same kernels, the same
//     shapes, the same bits) and each owner keeps its own part of O. Bit for bit stage0_ddp's.
// --muon-shard gather-all and whole-matrices are the other two designs (muon_formulas.h, MuonShard),
// each a marked block in muon.cpp. Not built yet: checkpoints of Muon's state.
// The formulas (which matrices the slices cut, the bytes held and sent): muon_formulas.h.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm.h"
#include "layout.h"
#include "optim.h"
#include "muon_formulas.h"  // which matrices, which owners, the formulas

namespace nz {

class Trainer;

struct MuonConfig {
  float lr = 3e-3f;        // --muon-lr: the Muon matrices' peak rate (default --lr)
  float adam_lr = 3e-3f;   // --adam-lr: the AdamW parameters' peak rate (default --lr)
  float momentum = 0.95f;  // mu (Keller Jordan's and Moonlight's)
  int ns_steps = 5;
  MuonShard shard = MuonShard::Owners;  // --muon-shard: how stages 1-3 make a cut matrix whole
};

// The quintic Newton–Schulz iteration's coefficients (Keller Jordan's Muon): each step maps every
// singular value s of X to a s + b s^3 + c s^5. Five steps from X / (||X||_F + 1e-7) bring every
// singular value in [0.002, 1] into [0.68, 1.21] ([0.68, 1.14] from 0.01): not to exactly 1 (a fast,
// loose fixed point; tests/muon/test_muon.cpp measures it).
constexpr float kNsA = 3.4445f, kNsB = -4.7750f, kNsC = 2.0315f, kNsEps = 1e-7f;

// X (rows x cols, fp32, row-major, device memory) orthogonalised in place, `steps` quintic steps, with
// the kernel table's matrix products (ops.h: the CPU's BLAS or reference loops, or CUDA). work: at
// least ns_work_elems(rows, cols) - rows * cols floats. The Gram matrix is formed on the short side
// (X X^T when rows <= cols, X^T X otherwise), which is the usual "transpose when rows > cols".
void newton_schulz(float* X, int rows, int cols, float* work, int steps = 5);

// AdamW for every element but the Muon matrices', Muon for those. m holds AdamW's first moment
// and Muon's momentum (both per owned element), v only the AdamW elements' second moment.
class Muon : public OptimizerState {
 public:
  // comm: null where every rank holds whole units (stage0_ddp); else the owners of a cut matrix
  // exchange their parts of X through it.
  Muon(const Layout& L, std::vector<Slice> owned, DType param_dtype, const AdamWConfig& adam, const MuonConfig& m,
       Comm* comm);
  void init_master(int u, const void* params_slice);
  void step(int u, void* params_slice, const void* grads_slice, float muon_lr, float adam_lr, float grad_scale,
            int t);

 private:
  void nesterov(float* x, float* b, const void* g, size_t i, size_t len, float grad_scale);
  void matrix_step(int u, int k, const TensorSpec& ts, float* p32, float* m, const void* g, float lr,
                   float grad_scale);
  MuonConfig mc_;
  Comm* comm_;
  std::vector<size_t> v_offset_;  // where unit u's AdamW elements start in v
  Buffer work_;  // X, X's next value, the three Gram-side matrices; gather-all: the gathered unit at the end
};

// The stage's optimizer: AdamW, or with --optimizer muon the Muon hybrid. Each stage names it once;
// step() takes the learning-rate curve's rate at update t (with Muon the same curve runs at --muon-lr and
// --adam-lr instead, and lr is not used). With Muon it also gives the trainer's memory table the
// per-rank formulas and the report its "muon" object (rung.h's hooks).
class StageOptimizer {
 public:
  StageOptimizer(Trainer& run, std::vector<Slice> owned);
  void init_master(int u, const void* params_slice);
  void step(int u, void* params_slice, const void* grads_slice, float lr, float grad_scale, int t);
  operator OptimizerState&();

 private:
  Trainer& run_;
  std::unique_ptr<AdamW> adamw_;
  std::unique_ptr<Muon> muon_;
};

}  // namespace nz
