// optim.h — AdamW over the slices a rank owns; gradient accumulation, averaging, norms and clipping.
#pragma once
#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/dtype.h"
#include "layout.h"
#include "ledger.h"
#include "compression/prune.h"  // UnitMasks: --prune-mask

namespace nz {

// Global-norm clipping factor: clip / norm when the norm exceeds clip (and clip > 0), else 1.
float clip_scale(double grad_norm, float clip);

// The memory these are given is checked against the ledger (check_span_at): the right size, alive,
// and where it must be (an AdamW step on the device's memory, the host AdamW on the host's).
//
// Gradient accumulation over micro-steps, in the storage type:
// dst = (first ? 0 : dst) + src * scale.
// where: Location::Host runs it on the CPU whatever the backend (offload's gradients are on the host).
void accumulate_grads(DType dt, void* dst, const void* src, size_t n, float scale, bool first,
                      Location where = Location::Device);
// grads = grads * scale, in place: the reduced sum over ranks and micro-steps becomes their mean.
// The same kernel and rounding as accumulate_grads(first = true), so averaging a sum after the
// reduction (stage0, stage1) and scaling on arrival (stage2 and later) agree bit for bit at accum 1.
void average_grads(DType dt, void* grads, size_t n, float scale);

// Sums of squared gradients, in double. The global squared norm adds one partial per rank, in
// rank order (partial r = slice r of every unit, in unit order): that is how the sharded stages
// compute it (each rank its own partial, then a rank-ordered sum over ranks), so stage0 sums the
// same way and every stage reports the same norm to the bit.
//   sq_sum_in_rank_order: the whole sum, from a full padded buffer (stage0 holds every slice);
//   sq_sum_of_slice_in_full: partial `rank`, from a full padded buffer (stage1);
//   sq_sum_of_shard: this rank's partial, from its packed shard (stage2 and later, at
//   Unit::shard_offset); where = Location::Host for offload's host gradients.
double sq_sum_in_rank_order(const Layout& L, DType dt, const void* full_grads);
double sq_sum_of_slice_in_full(const Layout& L, DType dt, const void* full_grads, int rank);
double sq_sum_of_shard(const Layout& L, DType dt, const void* shard_grads, Location where = Location::Device);
// The pipeline (pipeline.h): a segment holds units [first, end) only, their full gradients in `grads`
// (element 0 is the first unit's first). sq_sums_of_units gives the D x U table of partials, slice r
// of unit u at [r * U + u], zeros for the other segments' units: summed over the segments (exact: each
// entry has one non-zero contribution), sq_sum_of_table adds it the way sq_sum_in_rank_order does.
std::vector<double> sq_sums_of_units(const Layout& L, DType dt, const void* grads, int first, int end);
double sq_sum_of_table(const Layout& L, const std::vector<double>& sums);

// Which part of each unit a rank keeps optimizer state for.
std::vector<Slice> whole_units(const Layout& L);           // stage0: everything
std::vector<Slice> owned_shards(const Layout& L, int rank); // stages 1-3: slice `rank` of each unit

// AdamW's hyper-parameters (the trainer fills them from the command line). The learning rate is
// not here: it changes every update (lr_schedule.h) and is passed to each step.
struct AdamWConfig {
  float weight_decay = 0.1f;  // decoupled; matrices and embeddings only (TensorSpec::decay)
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  // --prune-mask (prune.h): the pruned elements, which every AdamW leaves exactly as they are
  // (no update, no weight decay, moments untouched); null: none
  std::shared_ptr<const UnitMasks> prune;
};

// Pruning: AdamW's kernels update whole pieces; the pruned elements among elements [begin,
// begin + n) of unit u's owned slice `own` are saved before and put back after (master or fp32
// params p32, m, v; out: the storage-type copy the host AdamW writes, else null). Empty without
// a mask.
class PrunedFreeze {
 public:
  PrunedFreeze(const AdamWConfig& cfg, int u, Slice own, size_t begin, size_t n, const float* p32, const float* m,
               const float* v);
  void restore(float* p32, float* m, float* v, DType dt = DType::F32, void* out = nullptr) const;

 private:
  std::vector<size_t> at_;       // elements pruned, counted from `begin`
  std::vector<float> p_, m_, v_;  // their values before the step
};

// Walks the tensors that elements [begin, end) of unit u's owned slice `own` cross, calling
// fn(i, n, weight_decay) for each piece (i: where the piece starts, counted from the slice's first
// element; n: its length). Weight decay applies to matrices and embeddings only; the padding after
// the last tensor is a piece of its own (gradient 0, no decay: it stays 0).
template <class Fn>
void for_each_piece(const Unit& unit, Slice own, size_t begin, size_t end, float weight_decay, Fn fn) {
  size_t pos = own.begin + begin;
  auto piece = [&](size_t stop, float wd) {  // unit elements [pos, stop)
    stop = std::min(stop, own.begin + end);
    if (stop <= pos) return;
    fn(pos - own.begin, stop - pos, wd);
    pos = stop;
  };
  for (const TensorSpec& ts : unit.tensors) piece(ts.offset + ts.numel, ts.decay ? weight_decay : 0.0f);
  piece(own.end, 0.0f);  // padding
}

// What a checkpoint (checkpoint.h) needs from an optimizer: the slices it owns, where each unit's slice
// starts in the packed state, and a way to copy each of its fp32 arrays (the master copy, m, v)
// to and from host memory, wherever it lives (device, host, disk).
enum class OptArray { Master, M, V };
// The stage hands its optimizer to the trainer's checkpoints (Trainer::checkpoint_state).
class OptimizerState {
 public:
  virtual ~OptimizerState() = default;
  const std::vector<Slice>& owned() const { return owned_; }
  size_t state_offset(int u) const { return state_offset_[u]; }
  size_t owned_elems() const { return total_; }
  // False when the parameters are their own master copy (fp32 on the device).
  virtual bool has_master() const { return !master_.empty(); }
  // Elements [at, at + n) of the packed array `a`, to and from host memory (from the buffers,
  // wherever they are; the disk tier overrides).
  virtual void get(OptArray a, size_t at, size_t n, float* host);
  virtual void put(OptArray a, size_t at, size_t n, const float* host);

 protected:
  // One slice per unit, packed end to end in m, v and master; the state buffers are the subclass's.
  OptimizerState(const Layout& L, std::vector<Slice> owned, DType param_dtype, const AdamWConfig& cfg);
  const Buffer& array(OptArray a) const { return a == OptArray::Master ? master_ : a == OptArray::M ? m_ : v_; }
  const Layout& L_;
  DType dt_;
  AdamWConfig cfg_;
  std::vector<Slice> owned_;
  std::vector<size_t> state_offset_;  // where unit u's slice starts in m, v, master
  size_t total_ = 0;
  Buffer m_, v_, master_;
};

// AdamW (decoupled weight decay; none on biases and layernorm parameters, nor on padding), on
// the device. The Adam moments (and in bf16 mode the fp32 master copy) exist only for the owned
// slices. In fp32 mode the parameters are their own master copy and are updated in place.
class AdamW : public OptimizerState {
 public:
  AdamW(const Layout& L, std::vector<Slice> owned, DType param_dtype, const AdamWConfig& cfg);
  // master = fp32(params) for unit u's owned slice (device memory). No-op in fp32 mode.
  void init_master(int u, const void* params_slice);
  // One step on unit u's owned slice: params_slice and grads_slice point at the slice's first
  // element. t is the 1-based step count (bias correction).
  void step(int u, void* params_slice, const void* grads_slice, float lr, float grad_scale, int t);
};

// The same AdamW on the CPU, for ZeRO-Offload: HostAdamW (offload/host_adamw.h).

}  // namespace nz
