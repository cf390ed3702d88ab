// ledger.cpp — counting bytes, keeping the timeline, writing the JSON report.
#include "ledger.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "runtime/check.h"
#include "runtime/json.h"

namespace nz {

const char* category_name(Category c) {
  switch (c) {
    case Category::Params: return "params";
    case Category::Grads: return "grads";
    case Category::Master: return "master";
    case Category::AdamM: return "adam_m";
    case Category::AdamV: return "adam_v";
    case Category::Activations: return "activations";
    case Category::CommBuffers: return "comm_buffers";
    case Category::Gathered: return "gathered";
    case Category::Scratch: return "scratch";
    case Category::KVCache: return "kv_cache";
    default: return "?";
  }
}

static double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

Ledger::Ledger() : t0_(now_ms()) {}

Ledger& Ledger::get() {
  static Ledger ledger;
  return ledger;
}

void Ledger::reset() {
  Ledger fresh;
  *this = fresh;
}

uint64_t Ledger::current(Category c) const {
  uint64_t s = 0;
  for (int l = 0; l < kNumLocations; l++) s += cur_[l][int(c)];
  return s;
}

uint64_t Ledger::peak(Category c) const {
  uint64_t s = 0;
  for (int l = 0; l < kNumLocations; l++) s += peak_[l][int(c)];
  return s;
}

void Ledger::record(Category c, Location l, int64_t delta, const std::string& name) {
  int li = int(l), ci = int(c);
  NZ_CHECK(delta >= 0 || cur_[li][ci] >= uint64_t(-delta), "ledger: freeing more %s than allocated",
           category_name(c));
  cur_[li][ci] += delta;
  cur_total_[li] += delta;
  if (cur_[li][ci] > peak_[li][ci]) peak_[li][ci] = cur_[li][ci];
  if (cur_total_[li] > peak_total_[li]) peak_total_[li] = cur_total_[li];
  if (step_ <= timeline_last_step_)
    events_.push_back({now_ms() - t0_, step_, phase_, name, c, l, delta, cur_total_[li]});
}

void Ledger::on_alloc(Category c, Location l, size_t bytes, const std::string& name) {
  record(c, l, int64_t(bytes), name);
}

void Ledger::on_free(Category c, Location l, size_t bytes, const std::string& name) {
  record(c, l, -int64_t(bytes), name);
}

void Ledger::note(const char* what, const std::string& name) {
  if (step_ <= timeline_last_step_) activity_.push_back({now_ms() - t0_, step_, what, name});
}

void Ledger::track(const void* p, size_t bytes, Location l, const std::string& name) {
  if (!p) return;
  const uintptr_t b = uintptr_t(p), e = b + bytes + guard_after(bytes);
  // released buffers whose memory this one now uses are forgotten (and live ones cannot overlap)
  auto it = extents_.lower_bound(b);
  if (it != extents_.begin() && std::prev(it)->second.begin + std::prev(it)->second.reach > b) --it;
  while (it != extents_.end() && it->first < std::max(e, b + 1)) it = extents_.erase(it);
  extents_[b] = BufferExtent{b, bytes, bytes + guard_after(bytes), l, name, false};
}

void Ledger::untrack(const void* p, bool remember) {
  auto it = extents_.find(uintptr_t(p));
  if (it == extents_.end()) return;
  if (remember) it->second.released = true;
  else extents_.erase(it);
}

void Ledger::set_gathering(const void* p, bool on) {
  auto it = extents_.find(uintptr_t(p));
  if (it != extents_.end()) it->second.gathering = on;
}

const BufferExtent* Ledger::buffer_at(const void* p) const {
  const uintptr_t a = uintptr_t(p);
  auto it = extents_.upper_bound(a);
  if (it == extents_.begin()) return nullptr;
  --it;
  const BufferExtent& ext = it->second;
  return a < ext.begin + std::max<size_t>(ext.reach, 1) ? &ext : nullptr;
}

std::string Ledger::to_json() const {
  JsonWriter j;
  j.begin_object();
  for (int l = 0; l < kNumLocations; l++) {
    j.key(location_name(Location(l)));
    j.begin_object();
    j.key("current");
    j.begin_object();
    for (int c = 0; c < kNumCategories; c++) j.kv(category_name(Category(c)), cur_[l][c]);
    j.kv("total", cur_total_[l]);
    j.end_object();
    j.key("peak");
    j.begin_object();
    for (int c = 0; c < kNumCategories; c++) j.kv(category_name(Category(c)), peak_[l][c]);
    j.kv("total", peak_total_[l]);
    j.end_object();
    j.end_object();
  }
  j.key("timeline");
  j.begin_array();
  for (const LedgerEvent& e : events_) {
    j.begin_object();
    j.kv("t_ms", e.t_ms);
    j.kv("step", e.step);
    j.kv("phase", e.phase);
    j.kv("name", e.name);
    j.kv("category", category_name(e.cat));
    j.kv("location", location_name(e.loc));
    j.kv("delta", e.delta);
    j.kv("location_total", e.loc_total);
    j.end_object();
  }
  j.end_array();
  j.key("activity");
  j.begin_array();
  for (const ActivityEvent& e : activity_) {
    j.begin_object();
    j.kv("t_ms", e.t_ms);
    j.kv("step", e.step);
    j.kv("what", e.what);
    j.kv("name", e.name);
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.str();
}

// ---- Buffer ----

Buffer::Buffer(Category c, Location l, size_t bytes, std::string name)
    : bytes_(bytes), cat_(c), loc_(l), name_(std::move(name)) {
  // gathered units come and go every step: their device blocks are reused (device.h, pool_take)
  ptr_ = !bytes ? nullptr : c == Category::Gathered ? pool_take(bytes, l) : raw_alloc(bytes, l);
  Ledger::get().on_alloc(cat_, loc_, bytes_, name_);
  Ledger::get().track(ptr_, bytes_, loc_, name_);
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    cat_ = o.cat_;
    loc_ = o.loc_;
    name_ = std::move(o.name_);
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::release() {
  if (ptr_ == nullptr && bytes_ == 0) return;
  // a released gathered block stays in the pool (device.h): no other allocation can take its
  // memory, so a later use of it is known to be a use after release
  Ledger::get().untrack(ptr_, /*remember=*/cat_ == Category::Gathered);
  if (ptr_ && cat_ == Category::Gathered) pool_give(ptr_, bytes_, loc_);
  else if (ptr_) raw_free(ptr_, loc_);
  Ledger::get().on_free(cat_, loc_, bytes_, name_);
  ptr_ = nullptr;
  bytes_ = 0;
}

void Buffer::zero() {
  if (ptr_) fill_zero(ptr_, bytes_, loc_);
}

// ---- checks of the memory an operation is given ----

static const BufferExtent* checked_extent(const void* p, size_t bytes, const char* use) {
  const BufferExtent* ext = Ledger::get().buffer_at(p);
  if (!ext) return nullptr;
  const size_t at = uintptr_t(p) - ext->begin;
  NZ_CHECK(!ext->released, "%s: points into buffer \"%s\", which was released before this use", use, ext->name.c_str());
  NZ_CHECK(!ext->gathering, "%s: points into buffer \"%s\", whose all-gather was started and not yet "
           "waited for", use, ext->name.c_str());
  NZ_CHECK(at <= ext->bytes && bytes <= ext->bytes - at,
           "%s: bytes [%zu, %zu) of buffer \"%s\" run past its end (%zu bytes)", use, at, at + bytes,
           ext->name.c_str(), ext->bytes);
  return ext;
}

void check_span(const void* p, size_t bytes, const char* use) { checked_extent(p, bytes, use); }

void check_span_at(const void* p, size_t bytes, Location at, const char* use) {
  const BufferExtent* ext = checked_extent(p, bytes, use);
  NZ_CHECK(!ext || ext->loc == at, "%s: points into buffer \"%s\" in %s memory; expected %s memory", use,
           ext->name.c_str(), location_name(ext->loc), location_name(at));
}

void copy_bytes_async(void* dst, Location dst_loc, const void* src, Location src_loc, size_t bytes) {
  if (bytes == 0) return;
  // offload's copies say where each side is: the ledger knows where it really is (a copy "up" from the
  // device's own memory, or into host memory, would work on the CPU backend and fail on a GPU)
  check_span_at(dst, bytes, dst_loc, "copy: the destination");
  check_span_at(src, bytes, src_loc, "copy: the source");
  raw_copy_async(dst, dst_loc, src, src_loc, bytes);
}

}  // namespace nz
