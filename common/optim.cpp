// optim.cpp — AdamW over owned slices, walking the tensors a slice crosses to apply weight decay
// only where it belongs.
#include "optim.h"

#include <algorithm>
#include <cmath>

#include "runtime/check.h"
#include "kernels/cpu_adam.h"       // the fast host AdamW (offload)
#include "offload/offload_store.h"  // DiskState (offload to disk)
#include "kernels/ops.h"
#include "runtime/watchdog.h"       // heartbeat: an optimizer unit (or a disk chunk of one) is done

namespace nz {

float lr_at(const Args& a, int step) {
  if (a.lr_schedule == "constant") return a.lr;  // DeepSpeed without a scheduler: the optimizer's rate
  if (a.lr_schedule != "cosine") {
    // DeepSpeed's WarmupLR and WarmupDecayLR at scheduler iteration `step`: min + (max - min) * gamma,
    // gamma rising over the warm-up (log(t + 1) / log(W), or t / W; W at least 2), then 1
    // (warmup) or falling linearly to 0 at the total step (warmup-decay).
    const int W = std::max(2, a.warmup), total = a.lr_total_steps > 0 ? a.lr_total_steps : a.steps;
    double gamma = 1.0;
    if (step < W) gamma = a.warmup_type == "log" ? std::log(double(step + 1)) / std::log(double(W)) : double(step) / W;
    else if (a.lr_schedule == "warmup-decay") gamma = std::max(0.0, double(total - step) / std::max(1.0, double(total - W)));
    return float(a.warmup_min_lr + (double(a.lr) - a.warmup_min_lr) * gamma);
  }
  if (step < a.warmup) return a.lr * float(step + 1) / float(a.warmup);
  const float min_lr = a.lr * 0.1f;
  const int decay_steps = a.steps - a.warmup;
  if (decay_steps <= 1) return a.lr;
  const float progress = float(step - a.warmup) / float(decay_steps - 1);  // 0 .. 1
  return min_lr + 0.5f * (a.lr - min_lr) * (1.0f + std::cos(float(M_PI) * progress));
}

float clip_scale(double grad_norm, float clip) {
  if (clip > 0 && grad_norm > clip) return float(clip / (grad_norm + 1e-6));
  return 1.0f;
}

void accumulate_grads(DType dt, void* dst, const void* src, size_t n, float scale, bool first, Location where) {
  check_span_at(dst, n * dtype_bytes(dt), where, "accumulate_grads: the destination");
  check_span_at(src, n * dtype_bytes(dt), where, "accumulate_grads: the source");
  if (where != Location::Device) {  // host memory: the CPU kernel, whatever the backend
    NZ_DISPATCH_DTYPE(dt, cpu::accumulate<T>((T*)dst, (const T*)src, n, scale, first));
    return;
  }
  NZ_DISPATCH_DTYPE(dt, ops::accumulate<T>((T*)dst, (const T*)src, n, scale, first));
}

void average_grads(DType dt, void* grads, size_t n, float scale) {
  accumulate_grads(dt, grads, grads, n, scale, /*first=*/true);
}

// The pieces of the gradient norm: the sum of squares of each (pointer, elements) piece, in the
// order listed. On a GPU every piece's sum is computed and left on the device, and one copy brings
// them all back: the host waits for the GPU once per norm, not once per piece (a norm over 4 ranks'
// slices of 14 units would otherwise be 56 waits, each draining the GPU's queue).
struct Piece {
  const void* p;
  size_t n;
};

static std::vector<double> sums_of_squares(DType dt, const std::vector<Piece>& pieces, Location where) {
  std::vector<double> sums(pieces.size());
  if (where != Location::Device || current_device() != Device::CUDA) {  // host memory: the CPU kernel
    for (size_t i = 0; i < pieces.size(); i++)
      NZ_DISPATCH_DTYPE(dt, sums[i] = (where == Location::Device ? ops::sum_squares<T>((const T*)pieces[i].p, pieces[i].n)
                                                                 : cpu::sum_squares<T>((const T*)pieces[i].p, pieces[i].n)));
    return sums;
  }
  // device memory for the results; grown when a norm has more pieces than before (the old block is
  // freed after the device has finished with it: raw_free of device memory waits for it)
  static double* results = nullptr;
  static size_t capacity = 0;
  if (pieces.size() > capacity) {
    if (results) raw_free(results, Location::Device);
    capacity = pieces.size();
    results = static_cast<double*>(raw_alloc(capacity * sizeof(double), Location::Device));
  }
  for (size_t i = 0; i < pieces.size(); i++)
    NZ_DISPATCH_DTYPE(dt, ops::sum_squares_to<T>(results + i, (const T*)pieces[i].p, pieces[i].n));
  copy_bytes(sums.data(), Location::Host, results, Location::Device, sums.size() * sizeof(double));  // waits
  return sums;
}

// unit u's slice `rank` of a full padded buffer
static Piece slice_in_full(const Layout& L, DType dt, const void* full_grads, int u, int rank) {
  const Slice sl = L.shard(u, rank);
  return {(const char*)full_grads + (L.units[u].offset + sl.begin) * dtype_bytes(dt), sl.size()};
}

double sq_sum_of_slice_in_full(const Layout& L, DType dt, const void* full_grads, int rank) {
  std::vector<Piece> pieces;
  for (int u = 0; u < L.num_units(); u++) pieces.push_back(slice_in_full(L, dt, full_grads, u, rank));
  double s = 0;
  for (double x : sums_of_squares(dt, pieces, Location::Device)) s += x;
  return s;
}

// The same additions as sq_sum_of_slice_in_full for rank 0, 1, ... in turn, added in that order;
// all the pieces in one batch, so one wait.
double sq_sum_in_rank_order(const Layout& L, DType dt, const void* full_grads) {
  std::vector<Piece> pieces;
  for (int r = 0; r < L.world; r++)
    for (int u = 0; u < L.num_units(); u++) pieces.push_back(slice_in_full(L, dt, full_grads, u, r));
  const std::vector<double> sums = sums_of_squares(dt, pieces, Location::Device);
  double s = 0;
  for (int r = 0; r < L.world; r++) {
    double rank_sum = 0;
    for (int u = 0; u < L.num_units(); u++) rank_sum += sums[size_t(r) * L.num_units() + u];
    s += rank_sum;
  }
  return s;
}

double sq_sum_of_shard(const Layout& L, DType dt, const void* shard_grads, Location where) {
  const size_t e = dtype_bytes(dt);
  std::vector<Piece> pieces;
  for (int u = 0; u < L.num_units(); u++)
    pieces.push_back({(const char*)shard_grads + L.units[u].shard_offset * e, L.units[u].padded / L.world});
  double s = 0;
  for (double x : sums_of_squares(dt, pieces, where)) s += x;
  return s;
}

std::vector<Slice> whole_units(const Layout& L) {
  std::vector<Slice> s;
  for (int u = 0; u < L.num_units(); u++) s.push_back(L.full(u));
  return s;
}

std::vector<Slice> owned_shards(const Layout& L, int rank) {
  std::vector<Slice> s;
  for (int u = 0; u < L.num_units(); u++) s.push_back(L.shard(u, rank));
  return s;
}

// Adam's constants (the betas of GPT-style training; eps as in the Adam paper).
constexpr float kBeta1 = 0.9f, kBeta2 = 0.95f, kEps = 1e-8f;

// Where unit u's owned slice starts in the packed optimizer state (m, v, master): one offset per
// unit, the slices laid end to end. Returns the total.
static size_t pack_slices(const std::vector<Slice>& owned, std::vector<size_t>* offset) {
  size_t total = 0;
  for (const Slice& s : owned) {
    offset->push_back(total);
    total += s.size();
  }
  return total;
}

// Walks the tensors that elements [begin, end) of unit u's owned slice `own` cross, calling
// fn(i, n, weight_decay) for each piece (i: where the piece starts, counted from the slice's first
// element; n: its length). Weight decay applies to matrices and embeddings only; the padding after
// the last tensor is a piece of its own (gradient 0, no decay: it stays 0).
template <class Fn>
static void for_each_piece(const Unit& unit, Slice own, size_t begin, size_t end, float weight_decay, Fn fn) {
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

// ---- what every AdamW holds ----

OptimizerState::OptimizerState(const Layout& L, std::vector<Slice> owned, DType dt, float weight_decay)
    : L_(L), dt_(dt), weight_decay_(weight_decay), owned_(std::move(owned)) {
  NZ_CHECK(int(owned_.size()) == L.num_units(), "one slice per unit");
  NZ_CHECK(dt_ != DType::F64, "AdamW: storage must be fp32, bf16 or fp16");
  total_ = pack_slices(owned_, &state_offset_);
  current_ = this;
}

void OptimizerState::get(OptArray a, size_t at, size_t n, float* host) {
  const Buffer& b = array(a);
  NZ_CHECK(!b.empty() && at + n <= total_, "optimizer state: no such elements");
  copy_bytes(host, Location::Host, b.as<float>() + at, b.location(), n * sizeof(float));
}

void OptimizerState::put(OptArray a, size_t at, size_t n, const float* host) {
  const Buffer& b = array(a);
  NZ_CHECK(!b.empty() && at + n <= total_, "optimizer state: no such elements");
  copy_bytes(b.as<float>() + at, b.location(), host, Location::Host, n * sizeof(float));
}

// ---- AdamW on the device ----

AdamW::AdamW(const Layout& L, std::vector<Slice> owned, DType dt, const Args& args)
    : OptimizerState(L, std::move(owned), dt, args.weight_decay) {
  m_ = Buffer(Category::AdamM, Location::Device, total_ * sizeof(float), "adam m");
  v_ = Buffer(Category::AdamV, Location::Device, total_ * sizeof(float), "adam v");
  m_.zero();
  v_.zero();
  if (dt_ != DType::F32) master_ = Buffer(Category::Master, Location::Device, total_ * sizeof(float), "fp32 master");
}

void AdamW::init_master(int u, const void* params_slice) {
  if (master_.empty()) return;  // fp32: the parameters are their own master
  NZ_DISPATCH_TRAIN_DTYPE(dt_, ops::cast<float, T>(master_.as<float>() + state_offset_[u], (const T*)params_slice,
                                                   owned_[u].size()));
}

void AdamW::step(int u, void* params_slice, const void* grads_slice, float lr, float grad_scale, int t) {
  const size_t n = owned_[u].size(), base = state_offset_[u];
  check_span_at(params_slice, n * dtype_bytes(dt_), Location::Device, "AdamW step: the parameter slice");
  check_span_at(grads_slice, n * dtype_bytes(dt_), Location::Device, "AdamW step: the gradient slice");
  float* p32 = master_.empty() ? (float*)params_slice : master_.as<float>() + base;
  float *m = m_.as<float>() + base, *v = v_.as<float>() + base;
  for_each_piece(L_.units[u], owned_[u], 0, n, weight_decay_, [&](size_t i, size_t len, float wd) {
    NZ_DISPATCH_TRAIN_DTYPE(dt_, ops::adamw_update<T>(p32 + i, m + i, v + i, (const T*)grads_slice + i, len, lr,
                                                      kBeta1, kBeta2, kEps, wd, grad_scale, t));
  });
  if (dt_ == DType::BF16) ops::cast<bf16, float>((bf16*)params_slice, p32, n);  // rounded from the master
  if (dt_ == DType::F16) ops::cast<f16, float>((f16*)params_slice, p32, n);
  heartbeat();
}

// ---- AdamW on the host (offload) ----

HostAdamW::HostAdamW(const Layout& L, std::vector<Slice> owned, DType dt, Location where, const Args& args)
    : OptimizerState(L, std::move(owned), dt, args.weight_decay) {
  NZ_CHECK(where == Location::Host || where == Location::Disk, "HostAdamW: state on the host or on disk");
  size_t largest = 0;
  for (const Slice& s : owned_) largest = std::max(largest, s.size());
  if (where == Location::Disk) {  // master, m, v in files, a chunk at a time in memory
    disk_ = std::make_unique<DiskState>(args.offload_dir, total_, std::min<size_t>(args.offload_chunk, largest));
    return;
  }
  m_ = Buffer(Category::AdamM, Location::Host, total_ * sizeof(float), "adam m");
  v_ = Buffer(Category::AdamV, Location::Host, total_ * sizeof(float), "adam v");
  master_ = Buffer(Category::Master, Location::Host, total_ * sizeof(float), "fp32 master");
  m_.zero();
  v_.zero();
}

HostAdamW::~HostAdamW() = default;

void HostAdamW::init_master(int u, const void* params_slice) {
  const size_t n = owned_[u].size(), base = state_offset_[u];
  auto to_fp32 = [&](float* master, size_t from, size_t count) {  // elements [from, from + count)
    NZ_DISPATCH_TRAIN_DTYPE(dt_, cpu::cast<float, T>(master, (const T*)params_slice + from, count));
  };
  if (!disk_) return to_fp32(master_.as<float>() + base, 0, n);
  for (size_t a = 0; a < n; a += disk_->chunk()) {  // write the master file a chunk at a time
    const size_t count = std::min(disk_->chunk(), n - a);
    to_fp32(disk_->master(), a, count);
    std::fill(disk_->m(), disk_->m() + count, 0.0f);  // m and v start at 0
    std::fill(disk_->v(), disk_->v() + count, 0.0f);
    disk_->write(base + a, count);
    heartbeat();
  }
}

void HostAdamW::step(int u, const void* grads_slice, void* params_out, float lr, float grad_scale, int t) {
  const size_t n = owned_[u].size(), base = state_offset_[u], e = dtype_bytes(dt_);
  // the CPU reads and writes these: host memory only (the device's parameters get the result by a copy)
  check_span_at(grads_slice, n * e, Location::Host, "host AdamW step: the gradient slice");
  check_span_at(params_out, n * e, Location::Host, "host AdamW step: the output (updated parameters)");
  // elements [begin, end) of the slice, with master, m, v pointing at element `begin`
  auto update = [&](size_t begin, size_t end, float* p32, float* m, float* v) {
    for_each_piece(L_.units[u], owned_[u], begin, end, weight_decay_, [&](size_t i, size_t len, float wd) {
      const size_t j = i - begin;  // in p32, m, v
      const void* g = (const char*)grads_slice + i * e;
      void* out = (char*)params_out + i * e;
      NZ_DISPATCH_TRAIN_DTYPE(dt_, cpu_adam::adamw_update<T>(p32 + j, m + j, v + j, (const T*)g, len, lr, kBeta1,
                                                             kBeta2, kEps, wd, grad_scale, t, (T*)out));
    });
  };
  if (!disk_) {
    update(0, n, master_.as<float>() + base, m_.as<float>() + base, v_.as<float>() + base);
    return heartbeat();
  }
  for (size_t a = 0; a < n; a += disk_->chunk()) {  // stream master, m, v through the host buffers
    const size_t count = std::min(disk_->chunk(), n - a);
    disk_->read(base + a, count);
    update(a, a + count, disk_->master(), disk_->m(), disk_->v());
    disk_->write(base + a, count);
    heartbeat();
  }
}

void HostAdamW::get(OptArray a, size_t at, size_t n, float* host) {
  if (!disk_) return OptimizerState::get(a, at, n, host);
  NZ_CHECK(at + n <= total_, "optimizer state: no such elements");
  disk_->read_array(int(a), at, n, host);
}

void HostAdamW::put(OptArray a, size_t at, size_t n, const float* host) {
  if (!disk_) return OptimizerState::put(a, at, n, host);
  NZ_CHECK(at + n <= total_, "optimizer state: no such elements");
  disk_->write_array(int(a), at, n, host);
}

}  // namespace nz
