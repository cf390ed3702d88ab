// optim.cpp — AdamW over owned slices, walking the tensors a slice crosses to apply weight decay
// only where it belongs.
#include "optim.h"

#include <algorithm>
#include <cmath>

#include "runtime/check.h"
#include "kernels/ops.h"
#include "runtime/heartbeat.h"       // heartbeat: an optimizer unit (or a disk chunk of one) is done

namespace nz {

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

std::vector<double> sq_sums_of_units(const Layout& L, DType dt, const void* grads, int first, int end) {
  const int U = L.num_units();
  const char* base = static_cast<const char*>(grads) - L.units[first].offset * dtype_bytes(dt);  // as if full
  std::vector<Piece> pieces;
  for (int r = 0; r < L.world; r++)
    for (int u = first; u < end; u++) pieces.push_back(slice_in_full(L, dt, base, u, r));
  const std::vector<double> sums = sums_of_squares(dt, pieces, Location::Device);
  std::vector<double> table(size_t(L.world) * U, 0.0);
  size_t i = 0;
  for (int r = 0; r < L.world; r++)
    for (int u = first; u < end; u++) table[size_t(r) * U + u] = sums[i++];
  return table;
}

double sq_sum_of_table(const Layout& L, const std::vector<double>& sums) {
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

// ---- what every AdamW holds ----

OptimizerState::OptimizerState(const Layout& L, std::vector<Slice> owned, DType dt, const AdamWConfig& cfg)
    : L_(L), dt_(dt), cfg_(cfg), owned_(std::move(owned)) {
  NZ_CHECK(int(owned_.size()) == L.num_units(), "one slice per unit");
  NZ_CHECK(dt_ != DType::F64, "AdamW: storage must be fp32, bf16 or fp16");
  total_ = pack_slices(owned_, &state_offset_);
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

// ---- pruning: the pruned elements put back after the update (prune.h) ----

PrunedFreeze::PrunedFreeze(const AdamWConfig& cfg, int u, Slice own, size_t begin, size_t n, const float* p32,
                           const float* m, const float* v) {
  if (!cfg.prune) return;
  for (size_t i = 0; i < n; i++)
    if (cfg.prune->pruned_at(u, own.begin, begin + i)) {
      at_.push_back(i);
      p_.push_back(p32[i]), m_.push_back(m[i]), v_.push_back(v[i]);
    }
}

void PrunedFreeze::restore(float* p32, float* m, float* v, DType dt, void* out) const {
  for (size_t j = 0; j < at_.size(); j++) {
    const size_t i = at_[j];
    p32[i] = p_[j], m[i] = m_[j], v[i] = v_[j];
    if (out) NZ_DISPATCH_TRAIN_DTYPE(dt, static_cast<T*>(out)[i] = store<T>(p_[j]));
  }
}

// ---- AdamW on the device ----

AdamW::AdamW(const Layout& L, std::vector<Slice> owned, DType dt, const AdamWConfig& cfg)
    : OptimizerState(L, std::move(owned), dt, cfg) {
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
  const PrunedFreeze pruned(cfg_, u, owned_[u], 0, n, p32, m, v);  // --prune-mask: left as they are
  for_each_piece(L_.units[u], owned_[u], 0, n, cfg_.weight_decay, [&](size_t i, size_t len, float wd) {
    NZ_DISPATCH_TRAIN_DTYPE(dt_, ops::adamw_update<T>(p32 + i, m + i, v + i, (const T*)grads_slice + i, len, lr,
                                                      cfg_.beta1, cfg_.beta2, cfg_.eps, wd, grad_scale, t));
  });
  pruned.restore(p32, m, v);
  if (dt_ == DType::BF16) ops::cast<bf16, float>((bf16*)params_slice, p32, n);  // rounded from the master
  if (dt_ == DType::F16) ops::cast<f16, float>((f16*)params_slice, p32, n);
  heartbeat();
}

}  // namespace nz
