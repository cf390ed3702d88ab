// weights.h — where a model's weights live during generation, and how each unit reaches the
// device just before it runs (ZeRO-Inference: the same unit loop as stage3, seen from inference).
//
//   device   the whole model resident on the device (what a trainer holds in stage 0)
//   host     the model in host memory; each unit is copied to the device when it runs and
//            released after: the link carries P·e bytes per decode step
//   disk     the model in a file (unlinked at once, gone when the process ends); each unit is
//            read into a host staging buffer, then copied over: the same P·e per step, plus the disk
//   sharded  stage3's slices: rank r keeps slice r of every unit and each unit is all-gathered per
//            decode step, so each rank sends (N-1)·S elements per generated token (S = P/N)
//
// With prefetch the next unit is brought in before this one computes, so at most two units are on
// the device at once (ledger: gathered); without it, one. The order of units in a decode step is
// blocks 1..L, lnf, embed: the tied embedding serves this step's LM head and the next step's lookup
// in one visit, so every unit crosses once per step.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "comm.h"
#include "ledger.h"
#include "model.h"

namespace nz {

enum class Placement { Device, Host, Disk, Sharded };

class Weights {
 public:
  // params: the padded model (N = 1 layout) in the storage type, on the host.
  Weights(Placement where, const Layout& full, const Layout& sharded, DType dt, const void* params, bool prefetch,
          Comm& comm, const std::string& dir);
  ~Weights();
  // Unit u's parameters on the device until release(u). next: the unit that runs after u (the
  // prefetch), or -1.
  const void* acquire(int u, int next);
  void release(int u);
  uint64_t link_bytes() const { return link_bytes_; }  // host -> device, so far

 private:
  void start(int u);  // bring unit u to the device (a fresh buffer of its size)
  Placement where_;
  const Layout& L_;   // N = 1
  const Layout& S_;   // N = world (sharded)
  DType dt_;
  size_t e_;
  bool prefetch_;
  Comm& comm_;
  Buffer resident_;   // device: the model; host: the model; sharded: my slices
  Buffer staging_;    // disk: one unit on the host
  int fd_ = -1;
  std::vector<Buffer> on_device_;  // unit u while it is in use (ledger: gathered)
  std::vector<CommRequest> in_flight_;
  uint64_t link_bytes_ = 0;
};

inline Weights::Weights(Placement where, const Layout& full, const Layout& sharded, DType dt, const void* params,
                        bool prefetch, Comm& comm, const std::string& dir)
    : where_(where), L_(full), S_(sharded), dt_(dt), e_(dtype_bytes(dt)), prefetch_(prefetch), comm_(comm),
      on_device_(full.num_units()), in_flight_(full.num_units()) {
  const size_t bytes = L_.padded_total * e_;
  if (where == Placement::Device || where == Placement::Host) {
    Location loc = where == Placement::Device ? Location::Device : Location::Host;
    resident_ = Buffer(Category::Params, loc, bytes, where == Placement::Device ? "params" : "params (host)");
    copy_bytes(resident_.data(), loc, params, Location::Host, bytes);
  } else if (where == Placement::Disk) {
    std::string path = (dir.empty() ? std::string("/tmp") : dir) + "/nanozero-weights.XXXXXX";
    std::vector<char> name(path.begin(), path.end());
    name.push_back('\0');
    fd_ = mkstemp(name.data());
    if (fd_ < 0) user_error("--weights-dir %s: cannot create a file there (%s); give a writable directory", dir.c_str(),
                            strerror(errno));
    unlink(name.data());  // only the descriptor keeps it: gone when the process ends
    for (size_t at = 0; at < bytes;) {
      ssize_t n = pwrite(fd_, static_cast<const char*>(params) + at, bytes - at, off_t(at));
      if (n <= 0) user_error("--weights-dir %s: writing the weights failed (%s); free space or use another directory",
                             dir.c_str(), strerror(errno));
      at += size_t(n);
    }
    Ledger::get().on_alloc(Category::Params, Location::Disk, bytes, "params file");
    staging_ = Buffer(Category::Scratch, Location::Host, L_.max_unit_padded * e_, "unit staging (host)");
  } else {  // sharded: my slice of every unit, packed as stage3 packs it
    resident_ = Buffer(Category::Params, Location::Device, S_.shard_total * e_, "params (my slices)");
    for (int u = 0; u < S_.num_units(); u++) {
      // the full layout's unit u is the sharded one's first numel elements (both pad with zeros)
      const Slice s = S_.shard(u, comm.rank());
      std::vector<char> slice(s.size() * e_, 0);
      const size_t real = L_.units[u].numel;
      if (s.begin < real)
        memcpy(slice.data(), static_cast<const char*>(params) + (L_.units[u].offset + s.begin) * e_,
               (std::min(s.end, real) - s.begin) * e_);
      copy_bytes(static_cast<char*>(resident_.data()) + S_.units[u].shard_offset * e_, Location::Device, slice.data(),
                 Location::Host, slice.size());
    }
  }
}

inline Weights::~Weights() {
  if (fd_ >= 0) {
    close(fd_);
    Ledger::get().on_free(Category::Params, Location::Disk, L_.padded_total * e_, "params file");
  }
}

inline void Weights::start(int u) {
  const Unit& unit = where_ == Placement::Sharded ? S_.units[u] : L_.units[u];
  on_device_[u] = Buffer(Category::Gathered, Location::Device, unit.padded * e_, "unit " + unit.name);
  char* dst = static_cast<char*>(on_device_[u].data());
  const size_t bytes = L_.units[u].padded * e_;
  if (where_ == Placement::Host) {
    copy_bytes_async(dst, Location::Device, static_cast<char*>(resident_.data()) + L_.units[u].offset * e_,
                     Location::Host, bytes);  // host -> device: the unit, just before it runs
    comm_.count_link(false, L_.units[u].padded, bytes);
    link_bytes_ += bytes;
  } else if (where_ == Placement::Disk) {
    for (size_t at = 0; at < bytes;) {  // disk -> host staging -> device
      ssize_t n = pread(fd_, static_cast<char*>(staging_.data()) + at, bytes - at, off_t(L_.units[u].offset * e_ + at));
      NZ_CHECK(n > 0, "reading unit %d of the weights file: %s", u, strerror(errno));
      at += size_t(n);
    }
    copy_bytes(dst, Location::Device, staging_.data(), Location::Host, bytes);
    comm_.count_link(false, L_.units[u].padded, bytes);
    link_bytes_ += bytes;
  } else {  // all-gather: every rank's slice of unit u
    in_flight_[u] = comm_.all_gather_start(static_cast<char*>(resident_.data()) + unit.shard_offset * e_, dst,
                                           unit.padded / S_.world, dt_);
  }
}

inline const void* Weights::acquire(int u, int next) {
  if (where_ == Placement::Device) return static_cast<char*>(resident_.data()) + L_.units[u].offset * e_;
  if (on_device_[u].empty()) start(u);
  if (where_ == Placement::Sharded) comm_.wait(in_flight_[u]);
  else copy_wait();
  if (prefetch_ && next >= 0 && on_device_[next].empty()) start(next);  // prefetch: the next unit
  return on_device_[u].data();
}

inline void Weights::release(int u) {
  if (where_ != Placement::Device) on_device_[u].release();  // release: until the next step
}

}  // namespace nz
