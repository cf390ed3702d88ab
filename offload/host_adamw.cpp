// host_adamw.cpp — AdamW run by the CPU on offload's state, in host memory or in files.
// (host_adamw.h)
#include "offload/host_adamw.h"

#include <algorithm>

#include "kernels/cpu_adam.h"       // the fast host AdamW, bitwise equal to the device's
#include "kernels/ops.h"
#include "offload/offload_store.h"  // DiskState (offload to disk)
#include "runtime/check.h"
#include "input/cli.h"            // Args: --offload-dir, --offload-chunk
#include "runtime/heartbeat.h"       // heartbeat: an optimizer unit (or a disk chunk of one) is done

namespace nz {

HostAdamW::HostAdamW(const Layout& L, std::vector<Slice> owned, DType dt, Location where, const AdamWConfig& cfg,
                     const OffloadConfig& offload)
    : OptimizerState(L, std::move(owned), dt, cfg) {
  NZ_CHECK(where == Location::Host || where == Location::Disk, "HostAdamW: state on the host or on disk");
  size_t largest = 0;
  for (const Slice& s : owned_) largest = std::max(largest, s.size());
  if (where == Location::Disk) {  // master, m, v in files, a chunk at a time in memory
    NZ_CHECK(offload.comm != nullptr, "HostAdamW: the disk tier needs the run's Comm (OffloadConfig::comm)");
    disk_ = std::make_unique<DiskState>(*offload.comm, offload.dir, total_, std::min<size_t>(offload.chunk_elems, largest));
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
    // --prune-mask: the pruned elements are left as they are (and written out as they were)
    const PrunedFreeze pruned(cfg_, u, owned_[u], begin, end - begin, p32, m, v);
    for_each_piece(L_.units[u], owned_[u], begin, end, cfg_.weight_decay, [&](size_t i, size_t len, float wd) {
      const size_t j = i - begin;  // in p32, m, v
      const void* g = (const char*)grads_slice + i * e;
      void* out = (char*)params_out + i * e;
      NZ_DISPATCH_TRAIN_DTYPE(dt_, cpu_adam::adamw_update<T>(p32 + j, m + j, v + j, (const T*)g, len, lr, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, grad_scale, t, (T*)out));
    });
    pruned.restore(p32, m, v, dt_, (char*)params_out + begin * e);
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

OffloadConfig offload_config(const Args& a, const Comm& comm) {
  return {a.offload_dir, size_t(a.offload_chunk), &comm};
}

}  // namespace nz
