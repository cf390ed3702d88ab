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
// With int8 (quant.h) every unit but, optionally, the tied embedding is stored, moved and
// gathered as int8 with its block scales, and dequantised on the device just before it runs: the
// resident bytes and the link's bytes drop by 3.76 (from fp32). Not with sharded (whose slices
// would cut blocks).
//
// With int4 (quant.h, --weights-int4) the same, as int4 codes and block scales of the project's
// quantizer (kernels/quantize.h), the embedding kept in the storage type unless asked: 7.1 times
// fewer bytes than fp32 at blocks of 64 (the default). The CPU backend only (no CUDA dequantiser for int4 yet).
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

#include "runtime/check.h"
#include "comm.h"
#include "ledger.h"
#include "model.h"
#include "inference/quant.h"

namespace nz {

enum class Placement { Device, Host, Disk, Sharded };

class Weights {
 public:
  // params: the padded model (N = 1 layout) in the storage type, on the host.
  // int8: store every unit as int8 (quant.h), the embedding too unless keep_embed.
  Weights(Placement where, const Layout& full, const Layout& sharded, DType dt, const void* params, bool prefetch,
          Comm& comm, const std::string& dir, bool int8 = false, bool keep_embed = false, size_t int4_block = 0);
  ~Weights();
  // Unit u's parameters on the device until release(u). next: the unit that runs after u (the
  // prefetch), or -1.
  const void* acquire(int u, int next);
  void release(int u);
  uint64_t link_bytes() const { return link_bytes_; }  // host -> device, so far
  size_t stored_bytes(int u) const { return img_bytes_[u]; }  // unit u as stored and moved

 private:
  void start(int u);  // bring unit u to the device (a fresh buffer of its size)
  bool quantised(int u) const { return (int8_ || int4_block_) && !(keep_embed_ && u == L_.embed_unit()); }
  // unit u's stored image (int8 + scales, or e bytes per element) -> on_device_[u] in dt
  void dequantise(int u, const char* image);
  Placement where_;
  const Layout& L_;   // N = 1
  const Layout& S_;   // N = world (sharded)
  DType dt_;
  size_t e_;
  bool prefetch_, int8_, keep_embed_;
  size_t int4_block_;  // int4: values per scale; 0: not int4
  Comm& comm_;
  std::vector<size_t> img_off_, img_bytes_;  // unit u's image in the stored model (N = 1 units)
  Buffer resident_;   // device: the model; host: the model; sharded: my slices
  Buffer staging_;    // disk: one unit on the host
  int fd_ = -1;
  size_t disk_bytes_ = 0;
  std::vector<Buffer> on_device_;  // unit u while it is in use (ledger: gathered)
  std::vector<CommRequest> in_flight_;
  uint64_t link_bytes_ = 0;
};

inline Weights::Weights(Placement where, const Layout& full, const Layout& sharded, DType dt, const void* params,
                        bool prefetch, Comm& comm, const std::string& dir, bool int8, bool keep_embed,
                        size_t int4_block)
    : where_(where), L_(full), S_(sharded), dt_(dt), e_(dtype_bytes(dt)), prefetch_(prefetch), int8_(int8),
      keep_embed_(keep_embed), int4_block_(int4_block), comm_(comm), on_device_(full.num_units()),
      in_flight_(full.num_units()) {
  NZ_CHECK(!((int8 || int4_block) && where == Placement::Sharded), "quantised weights are not sharded");
  NZ_CHECK(!(int8 && int4_block), "int8 or int4, not both");
  NZ_CHECK(!int4_block || current_device() == Device::CPU, "int4 weights: the CPU backend only");
  // the stored model: unit after unit, each as int8 + scales or as it is
  std::vector<char> image;
  for (int u = 0; u < L_.num_units(); u++) {
    const size_t n = L_.units[u].padded;
    const char* w = static_cast<const char*>(params) + L_.units[u].offset * e_;
    img_off_.push_back(image.size());
    if (quantised(u) && int4_block_) {  // int4: quantize.h's packed form, codes then scales
      image.resize(image.size() + int4_unit_bytes(n, int4_block_), 0);
      quantize_finite(int4_quant(int4_block_), dt, w, n, image.data() + img_off_[u],
                      ("int4 weights, unit " + L_.units[u].name).c_str());
    } else if (quantised(u)) {
      std::vector<float> f(n);
      for (size_t i = 0; i < n; i++)
        f[i] = dt == DType::BF16 ? bf16_to_f32(reinterpret_cast<const bf16*>(w)[i]) : reinterpret_cast<const float*>(w)[i];
      image.resize(image.size() + int8_unit_bytes(n), 0);
      char* img = image.data() + img_off_[u];
      quantize_int8(f.data(), n, reinterpret_cast<int8_t*>(img), reinterpret_cast<float*>(img + int8_scales_offset(n)));
    } else {
      image.insert(image.end(), w, w + n * e_);
    }
    img_bytes_.push_back(image.size() - img_off_[u]);
  }
  const size_t bytes = image.size();
  if (where == Placement::Device || where == Placement::Host) {
    Location loc = where == Placement::Device ? Location::Device : Location::Host;
    resident_ = Buffer(Category::Params, loc, bytes, where == Placement::Device ? "params" : "params (host)");
    copy_bytes(resident_.data(), loc, image.data(), Location::Host, bytes);
  } else if (where == Placement::Disk) {
    std::string path = (dir.empty() ? std::string("/tmp") : dir) + "/nanozero-weights.XXXXXX";
    std::vector<char> name(path.begin(), path.end());
    name.push_back('\0');
    fd_ = mkstemp(name.data());
    if (fd_ < 0) user_error("--weights-dir %s: cannot create a file there (%s); give a writable directory", dir.c_str(),
                            strerror(errno));
    unlink(name.data());  // only the descriptor keeps it: gone when the process ends
    for (size_t at = 0; at < bytes;) {
      ssize_t n = pwrite(fd_, image.data() + at, bytes - at, off_t(at));
      if (n <= 0) user_error("--weights-dir %s: writing the weights failed (%s); free space or use another directory",
                             dir.c_str(), strerror(errno));
      at += size_t(n);
    }
    disk_bytes_ = bytes;
    Ledger::get().on_alloc(Category::Params, Location::Disk, bytes, "params file");
    size_t largest = 0;
    for (size_t b : img_bytes_) largest = std::max(largest, b);
    staging_ = Buffer(Category::Scratch, Location::Host, largest, "unit staging (host)");
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

inline void Weights::dequantise(int u, const char* image) {
  const size_t n = L_.units[u].padded;
  if (int4_block_) return dequantize_packed(int4_quant(int4_block_), image, n, dt_, on_device_[u].data());
  const int8_t* q = reinterpret_cast<const int8_t*>(image);
  const float* scales = reinterpret_cast<const float*>(image + int8_scales_offset(n));
  if (dt_ == DType::BF16) dequantize_int8<bf16>(on_device_[u].as<bf16>(), q, scales, n);
  else dequantize_int8<float>(on_device_[u].as<float>(), q, scales, n);
}

inline Weights::~Weights() {
  if (fd_ >= 0) {
    close(fd_);
    Ledger::get().on_free(Category::Params, Location::Disk, disk_bytes_, "params file");
  }
}

inline void Weights::start(int u) {
  if (where_ == Placement::Device && !quantised(u)) return;  // resident as it is: nothing to bring
  const Unit& unit = where_ == Placement::Sharded ? S_.units[u] : L_.units[u];
  on_device_[u] = Buffer(Category::Gathered, Location::Device, unit.padded * e_, "unit " + unit.name);
  char* dst = static_cast<char*>(on_device_[u].data());
  const size_t bytes = img_bytes_[u];
  if (where_ == Placement::Sharded) {  // all-gather: every rank's slice of unit u
    in_flight_[u] = comm_.all_gather_start(static_cast<char*>(resident_.data()) + unit.shard_offset * e_, dst,
                                           unit.padded / S_.world, dt_);
    return;
  }
  if (where_ == Placement::Device) {  // only int8/int4 units get here: dequantised from the resident image
    dequantise(u, static_cast<char*>(resident_.data()) + img_off_[u]);
    return;
  }
  const char* src = static_cast<char*>(resident_.data()) + img_off_[u];
  if (where_ == Placement::Disk) {  // disk -> host staging
    for (size_t at = 0; at < bytes;) {
      ssize_t n = pread(fd_, static_cast<char*>(staging_.data()) + at, bytes - at, off_t(img_off_[u] + at));
      NZ_CHECK(n > 0, "reading unit %d of the weights file: %s", u, strerror(errno));
      at += size_t(n);
    }
    src = static_cast<char*>(staging_.data());
  }
  // host -> device: the unit as stored, just before it runs
  comm_.count_to_device(L_.units[u].padded, bytes);
  link_bytes_ += bytes;
  if (!quantised(u)) {
    copy_bytes_async(dst, Location::Device, src, Location::Host, bytes);
  } else {  // the int8 image lands on the device and is dequantised there
    Buffer landing(Category::Gathered, Location::Device, bytes, (int4_block_ ? "int4 " : "int8 ") + unit.name);
    copy_bytes(landing.data(), Location::Device, src, Location::Host, bytes);
    dequantise(u, static_cast<char*>(landing.data()));
  }
}

inline const void* Weights::acquire(int u, int next) {
  if (where_ == Placement::Device && !quantised(u)) return static_cast<char*>(resident_.data()) + img_off_[u];
  if (on_device_[u].empty()) start(u);
  if (where_ == Placement::Sharded) comm_.wait(in_flight_[u]);
  else copy_wait();
  if (prefetch_ && next >= 0 && on_device_[next].empty()) start(next);  // prefetch: the next unit
  return on_device_[u].data();
}

inline void Weights::release(int u) {
  on_device_[u].release();  // release: until the next step
}

}  // namespace nz
