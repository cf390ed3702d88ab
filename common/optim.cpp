// optim.cpp — AdamW over owned slices, walking the tensors a slice crosses to apply weight decay
// only where it belongs.
#include "optim.h"

#include <cmath>

#include "check.h"
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

void accumulate_grads(DType dt, void* dst, const void* src, size_t n, float scale, bool first) {
  switch (dt) {
    case DType::F32: ops::accumulate<float>((float*)dst, (const float*)src, n, scale, first); break;
    case DType::BF16: ops::accumulate<bf16>((bf16*)dst, (const bf16*)src, n, scale, first); break;
    case DType::F64: ops::accumulate<double>((double*)dst, (const double*)src, n, scale, first); break;
  }
}

static double sum_squares_dt(DType dt, const void* p, size_t n) {
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

double sq_sum_of_shard(const Layout& L, DType dt, const void* shard_grads) {
  const size_t e = dtype_bytes(dt);
  double s = 0;
  for (int u = 0; u < L.num_units(); u++)
    s += sum_squares_dt(dt, (const char*)shard_grads + L.units[u].shard_offset * e, L.units[u].padded / L.world);
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
    : L_(L), owned_(std::move(owned)), dt_(dt), on_host_(where == Location::Host),
      weight_decay_(args.weight_decay) {
  NZ_CHECK(int(owned_.size()) == L.num_units(), "one slice per unit");
  for (const Slice& s : owned_) {
    state_offset_.push_back(total_);
    total_ += s.size();
  }
  m_ = Buffer(Category::AdamM, where, total_ * sizeof(float), "adam m");
  v_ = Buffer(Category::AdamV, where, total_ * sizeof(float), "adam v");
  m_.zero();
  v_.zero();
  if (dt_ != DType::F32) master_ = Buffer(Category::Master, where, total_ * sizeof(float), "fp32 master");
}

void AdamW::init_master(int u, const void* params_slice) {
  if (dt_ == DType::F32) return;
  NZ_CHECK(dt_ == DType::BF16, "AdamW: storage must be fp32 or bf16");
  float* master = master_.as<float>() + state_offset_[u];
  if (on_host_) cpu::cast<float, bf16>(master, (const bf16*)params_slice, owned_[u].size());
  else ops::cast<float, bf16>(master, (const bf16*)params_slice, owned_[u].size());
}

void AdamW::step(int u, void* params_slice, const void* grads_slice, float lr, float grad_scale, int t) {
  const Slice own = owned_[u];
  const Unit& unit = L_.units[u];
  const size_t e = dtype_bytes(dt_), base = state_offset_[u];
  float* p32 = dt_ == DType::F32 ? (float*)params_slice : master_.as<float>() + base;
  float* m = m_.as<float>() + base;
  float* v = v_.as<float>() + base;
  // Walk the tensors this slice crosses: weight decay on matrices and embeddings only. The
  // padding after the last tensor is a segment of its own (gradient 0, no decay: stays 0).
  size_t pos = own.begin;
  auto update = [&](size_t end, float wd) {
    if (end <= pos) return;
    const size_t i = pos - own.begin, n = end - pos;
    const char* g = (const char*)grads_slice + i * e;
    if (dt_ == DType::F32) {
      if (on_host_) cpu::adamw_update<float>(p32 + i, m + i, v + i, (const float*)g, n, lr, beta1_, beta2_, eps_, wd, grad_scale, t);
      else ops::adamw_update<float>(p32 + i, m + i, v + i, (const float*)g, n, lr, beta1_, beta2_, eps_, wd, grad_scale, t);
    } else {
      if (on_host_) cpu::adamw_update<bf16>(p32 + i, m + i, v + i, (const bf16*)g, n, lr, beta1_, beta2_, eps_, wd, grad_scale, t);
      else ops::adamw_update<bf16>(p32 + i, m + i, v + i, (const bf16*)g, n, lr, beta1_, beta2_, eps_, wd, grad_scale, t);
    }
    pos = end;
  };
  for (const TensorSpec& ts : unit.tensors) {
    size_t end = std::min(own.end, ts.offset + ts.numel);
    if (end > pos) update(end, ts.decay ? weight_decay_ : 0.0f);
  }
  update(own.end, 0.0f);  // padding
  if (dt_ == DType::BF16) {  // the parameters in the storage type, rounded from the master
    if (on_host_) cpu::cast<bf16, float>((bf16*)params_slice, p32, own.size());
    else ops::cast<bf16, float>((bf16*)params_slice, p32, own.size());
  }
}

}  // namespace nz
