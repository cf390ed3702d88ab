// optim.cpp — AdamW over owned slices, walking the tensors a slice crosses to apply weight decay
// only where it belongs.
#include "optim.h"

#include <algorithm>
#include <cmath>

#include "check.h"
#include "cpu_adam.h"       // the fast host AdamW (offload)
#include "offload_store.h"  // DiskState (offload to disk)
#include "ops.h"

namespace nz {

float lr_at(const Args& a, int step) {
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
  if (where != Location::Device) {  // host memory: the CPU kernel, whatever the backend
    if (dt == DType::F32) cpu::accumulate<float>((float*)dst, (const float*)src, n, scale, first);
    else cpu::accumulate<bf16>((bf16*)dst, (const bf16*)src, n, scale, first);
    return;
  }
  switch (dt) {
    case DType::F32: ops::accumulate<float>((float*)dst, (const float*)src, n, scale, first); break;
    case DType::BF16: ops::accumulate<bf16>((bf16*)dst, (const bf16*)src, n, scale, first); break;
    case DType::F64: ops::accumulate<double>((double*)dst, (const double*)src, n, scale, first); break;
  }
}

static double sum_squares_dt(DType dt, const void* p, size_t n, Location where = Location::Device) {
  if (where != Location::Device) {  // host memory: the CPU kernel, whatever the backend
    if (dt == DType::F32) return cpu::sum_squares<float>((const float*)p, n);
    return cpu::sum_squares<bf16>((const bf16*)p, n);
  }
  switch (dt) {
    case DType::F32: return ops::sum_squares<float>((const float*)p, n);
    case DType::BF16: return ops::sum_squares<bf16>((const bf16*)p, n);
    case DType::F64: return ops::sum_squares<double>((const double*)p, n);
  }
  return 0;
}

double sq_sum_of_slice_in_full(const Layout& L, DType dt, const void* full_grads, int rank) {
  const size_t e = dtype_bytes(dt);
  double s = 0;
  for (int u = 0; u < L.num_units(); u++) {
    Slice sl = L.shard(u, rank);
    s += sum_squares_dt(dt, (const char*)full_grads + (L.units[u].offset + sl.begin) * e, sl.size());
  }
  return s;
}

double sq_sum_of_shard(const Layout& L, DType dt, const void* shard_grads, Location where) {
  const size_t e = dtype_bytes(dt);
  double s = 0;
  for (int u = 0; u < L.num_units(); u++)
    s += sum_squares_dt(dt, (const char*)shard_grads + L.units[u].shard_offset * e, L.units[u].padded / L.world,
                        where);
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

AdamW::AdamW(const Layout& L, std::vector<Slice> owned, DType dt, Location where, const Args& args)
    : L_(L), owned_(std::move(owned)), dt_(dt), on_host_(where != Location::Device),
      weight_decay_(args.weight_decay) {
  NZ_CHECK(int(owned_.size()) == L.num_units(), "one slice per unit");
  NZ_CHECK(dt_ == DType::F32 || dt_ == DType::BF16, "AdamW: storage must be fp32 or bf16");
  size_t largest = 0;
  for (const Slice& s : owned_) {
    state_offset_.push_back(total_);
    total_ += s.size();
    largest = std::max(largest, s.size());
  }
  if (where == Location::Disk) {  // offload to disk: master, m, v in files, a chunk at a time in memory
    disk_ = std::make_unique<DiskState>(args.offload_dir, total_, std::min<size_t>(args.offload_chunk, largest));
    return;
  }
  m_ = Buffer(Category::AdamM, where, total_ * sizeof(float), "adam m");
  v_ = Buffer(Category::AdamV, where, total_ * sizeof(float), "adam v");
  m_.zero();
  v_.zero();
  // The fp32 master: in bf16 mode; on the host in fp32 mode too (the parameters are on the device).
  if (dt_ != DType::F32 || on_host_) master_ = Buffer(Category::Master, where, total_ * sizeof(float), "fp32 master");
}

AdamW::~AdamW() = default;

void AdamW::init_master(int u, const void* params_slice) {
  const size_t n = owned_[u].size(), base = state_offset_[u];
  auto to_fp32 = [&](float* master, size_t from, size_t count) {  // elements [from, from + count)
    if (!on_host_) return ops::cast<float, bf16>(master, (const bf16*)params_slice + from, count);
    if (dt_ == DType::F32) cpu::cast<float, float>(master, (const float*)params_slice + from, count);
    else cpu::cast<float, bf16>(master, (const bf16*)params_slice + from, count);
  };
  if (disk_) {  // write the master file a chunk at a time (m and v start at 0)
    for (size_t a = 0; a < n; a += disk_->chunk()) {
      const size_t count = std::min(disk_->chunk(), n - a);
      to_fp32(disk_->master(), a, count);
      std::fill(disk_->m(), disk_->m() + count, 0.0f);
      std::fill(disk_->v(), disk_->v() + count, 0.0f);
      disk_->write(base + a, count);
    }
  } else if (!master_.empty()) {  // (fp32 on the device: the parameters are their own master)
    to_fp32(master_.as<float>() + base, 0, n);
  }
}

void AdamW::step(int u, void* params_slice, const void* grads_slice, float lr, float grad_scale, int t) {
  const size_t n = owned_[u].size(), base = state_offset_[u];
  if (disk_) {  // offload to disk: stream master, m, v through the host buffers, a chunk at a time
    for (size_t a = 0; a < n; a += disk_->chunk()) {
      const size_t count = std::min(disk_->chunk(), n - a);
      disk_->read(base + a, count);
      update(u, a, a + count, disk_->master(), disk_->m(), disk_->v(), grads_slice, params_slice, lr, grad_scale, t);
      disk_->write(base + a, count);
    }
    return;
  }
  float* p32 = master_.empty() ? (float*)params_slice : master_.as<float>() + base;
  update(u, 0, n, p32, m_.as<float>() + base, v_.as<float>() + base, grads_slice, params_slice, lr, grad_scale, t);
  if (!on_host_ && dt_ == DType::BF16)  // the parameters in the storage type, rounded from the master
    ops::cast<bf16, float>((bf16*)params_slice, p32, n);
}

void AdamW::update(int u, size_t begin, size_t end, float* p32, float* m, float* v, const void* grads_slice,
                   void* params_out, float lr, float grad_scale, int t) {
  const Slice own = owned_[u];
  const Unit& unit = L_.units[u];
  const size_t e = dtype_bytes(dt_);
  // Walk the tensors this slice crosses: weight decay on matrices and embeddings only. The
  // padding after the last tensor is a segment of its own (gradient 0, no decay: stays 0).
  size_t pos = own.begin + begin;
  auto segment = [&](size_t stop, float wd) {  // unit elements [pos, stop)
    stop = std::min(stop, own.begin + end);
    if (stop <= pos) return;
    const size_t i = pos - own.begin, j = i - begin, n = stop - pos;  // i: in the slice; j: in p32, m, v
    const char* g = (const char*)grads_slice + i * e;
    char* out = (char*)params_out + i * e;
    if (on_host_ && dt_ == DType::F32)  // offload: the fast kernel also writes the copy for the device
      cpu_adam::adamw_update<float>(p32 + j, m + j, v + j, (const float*)g, n, lr, beta1_, beta2_, eps_, wd, grad_scale, t, (float*)out);
    else if (on_host_)
      cpu_adam::adamw_update<bf16>(p32 + j, m + j, v + j, (const bf16*)g, n, lr, beta1_, beta2_, eps_, wd, grad_scale, t, (bf16*)out);
    else if (dt_ == DType::F32)
      ops::adamw_update<float>(p32 + j, m + j, v + j, (const float*)g, n, lr, beta1_, beta2_, eps_, wd, grad_scale, t);
    else
      ops::adamw_update<bf16>(p32 + j, m + j, v + j, (const bf16*)g, n, lr, beta1_, beta2_, eps_, wd, grad_scale, t);
    pos = stop;
  };
  for (const TensorSpec& ts : unit.tensors) segment(ts.offset + ts.numel, ts.decay ? weight_decay_ : 0.0f);
  segment(own.end, 0.0f);  // padding
}

}  // namespace nz
