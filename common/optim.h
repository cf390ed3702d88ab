// optim.h — AdamW over the slices a rank owns, the learning-rate schedule, gradient clipping.
#pragma once
#include <memory>
#include <vector>

#include "cli.h"
#include "ledger.h"
#include "model.h"

namespace nz {

// Linear warm-up to args.lr over args.warmup steps, then cosine decay to lr/10 at the last step.
float lr_at(const Args& args, int step);

// Global-norm clipping factor: clip / norm when the norm exceeds clip (and clip > 0), else 1.
float clip_scale(double grad_norm, float clip);

// Gradient accumulation over micro-steps, in the storage type:
// dst = (first ? 0 : dst) + src * scale.
// where: Location::Host runs it on the CPU whatever the backend (offload's gradients are on the host).
void accumulate_grads(DType dt, void* dst, const void* src, size_t n, float scale, bool first,
                      Location where = Location::Device);

// Sum of squared gradients over slice `rank` of every unit, in unit order, in double.
// The global squared norm is the sum of these over ranks in rank order: that is how the sharded
// stages compute it (one partial per rank, then a rank-ordered sum), so stage0 sums the same way.
//   ..._in_full: grads is a full padded buffer (stage0, stage1);
//   ..._of_shard: grads is this rank's packed shard (stage2 and later, at Unit::shard_offset).
double sq_sum_of_slice_in_full(const Layout& L, DType dt, const void* full_grads, int rank);
double sq_sum_of_shard(const Layout& L, DType dt, const void* shard_grads, Location where = Location::Device);

// Which part of each unit a rank keeps optimizer state for.
std::vector<Slice> whole_units(const Layout& L);           // stage0: everything
std::vector<Slice> owned_shards(const Layout& L, int rank); // stages 1-3: slice `rank` of each unit

// AdamW (decoupled weight decay; none on biases and layernorm parameters, nor on padding).
// The Adam moments (and in bf16 mode the fp32 master copy) exist only for the owned slices.
// In fp32 mode the parameters are their own master copy and are updated in place.
// Offload: where = Location::Host runs the update on the CPU (the fast kernel of cpu_adam.h) with
// its own fp32 master, in fp32 mode too (the parameters stay on the device): step() reads the
// gradient slice from host memory and writes the updated slice, in the storage type, to
// params_slice in host memory, for the trainer to copy up. Location::Disk: the same, with master,
// m and v in files (offload_store.h) streamed through host buffers of args.offload_chunk elements.
class DiskState;
class AdamW {
 public:
  AdamW(const Layout& L, std::vector<Slice> owned, DType param_dtype, Location where, const Args& args);
  ~AdamW();
  // master = fp32(params) for unit u's owned slice (params_slice: where the state is, device or
  // host memory). No-op in fp32 mode on the device.
  void init_master(int u, const void* params_slice);
  // One step on unit u's owned slice: params_slice and grads_slice point at the slice's first
  // element. t is the 1-based step count (bias correction).
  void step(int u, void* params_slice, const void* grads_slice, float lr, float grad_scale, int t);
  size_t owned_elems() const { return total_; }

 private:
  // Elements [begin, end) of unit u's owned slice; p32, m, v point at element `begin`, grads_slice
  // and params_out at the slice's first element.
  void update(int u, size_t begin, size_t end, float* p32, float* m, float* v, const void* grads_slice,
              void* params_out, float lr, float grad_scale, int t);
  const Layout& L_;
  std::vector<Slice> owned_;
  std::vector<size_t> state_offset_;  // where unit u's slice starts in m, v, master
  size_t total_ = 0;
  DType dt_;
  bool on_host_;  // the optimizer runs on the CPU (offload), whatever the device
  float beta1_ = 0.9f, beta2_ = 0.95f, eps_ = 1e-8f, weight_decay_;
  Buffer m_, v_, master_;
  std::unique_ptr<DiskState> disk_;  // Location::Disk only
};

}  // namespace nz
