// ledger.h — the memory ledger: every byte of model state, tagged, counted, and timed.
//
// All model-state memory is allocated through nz::Buffer, which tells the process's Ledger what it
// holds (category) and where (location). The ledger keeps current and peak bytes per (category,
// location), a timeline of allocation events through the first steps, and writes a JSON report.
// The tests compare these numbers with the ZeRO formulas to the byte (zero_formulas.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/device.h"  // Location, raw_alloc

namespace nz {

enum class Category {
  Params,       // model parameters in the storage type (full or this rank's shard)
  Grads,        // gradients in the storage type (full or this rank's shard)
  Master,       // fp32 master copy of the parameters (bf16 and fp16 modes; offload: always)
  AdamM,        // Adam first moment, fp32
  AdamV,        // Adam second moment, fp32
  Activations,  // what the forward saves for the backward, plus the backward's activation grads
  CommBuffers,  // gradient buckets in flight
  Gathered,     // stage3: parameters of units gathered for use, released right after
  Scratch,      // anything else (staging copies, temporary buffers)
  KVCache,      // inference: the keys and values of every past position, 2·L·B·T·C elements
  kCount
};
constexpr int kNumCategories = int(Category::kCount);
constexpr int kNumLocations = 3;
const char* category_name(Category c);

struct LedgerEvent {
  double t_ms;        // since the ledger started
  int step;           // training step (-1: set-up)
  std::string phase;  // what the trainer was doing ("forward", "backward", "optimizer", ...)
  std::string name;   // the buffer
  Category cat;
  Location loc;
  int64_t delta;      // + allocated, - freed
  uint64_t loc_total; // bytes in use at this location after the event
};

// Which buffer holds an address, and where that buffer lives: kept for every Buffer while it lives,
// and for released gathered units (their blocks stay in the pool, device.h) until their memory is
// taken again, so that a use after release is named.
struct BufferExtent {
  uintptr_t begin = 0;
  size_t bytes = 0;
  size_t reach = 0;  // the addresses it owns: its bytes, and the guard after them (device.h, guard_after)
  Location loc = Location::Device;
  std::string name;
  bool released = false;
  bool gathering = false;  // an all-gather into it was started and not yet waited for
};

// One event of the activity log: an all-gather started ("gather_start") or waited for
// ("gather_wait", the name is its output buffer's), a unit's computation begun or ended
// ("compute_begin", "compute_end": "forward block 1", "head backward", ...). The log shows what
// overlapped what (stage3's prefetch), which the memory timeline cannot.
struct ActivityEvent {
  double t_ms;
  int step;
  const char* what;
  std::string name;
};

class Ledger {
 public:
  static Ledger& get();  // one per process (one process per rank)

  void on_alloc(Category c, Location l, size_t bytes, const std::string& name);
  void on_free(Category c, Location l, size_t bytes, const std::string& name);

  uint64_t current(Category c, Location l) const { return cur_[int(l)][int(c)]; }
  uint64_t peak(Category c, Location l) const { return peak_[int(l)][int(c)]; }
  uint64_t current_total(Location l) const { return cur_total_[int(l)]; }
  uint64_t peak_total(Location l) const { return peak_total_[int(l)]; }
  // Sum over locations (the model-state formulas do not care where a byte lives).
  uint64_t current(Category c) const;
  uint64_t peak(Category c) const;

  // Timeline labels: the trainer says which step and phase it is in.
  void set_step(int step) { step_ = step; }
  void set_phase(const char* phase) { phase_ = phase; }
  // Events are kept for steps <= timeline_last_step (set-up included), to keep the report small.
  void set_timeline_last_step(int s) { timeline_last_step_ = s; }
  const std::vector<LedgerEvent>& timeline() const { return events_; }

  // The activity log (ActivityEvent), kept for the same steps as the timeline.
  void note(const char* what, const std::string& name);
  const std::vector<ActivityEvent>& activity() const { return activity_; }

  // Where each Buffer's memory is (Buffer calls track and untrack): buffer_at(p) is the buffer that
  // holds address p, or nullptr when p is in none the ledger knows of (a test's own memory, the stack).
  void track(const void* p, size_t bytes, Location l, const std::string& name);
  void untrack(const void* p, bool remember);  // remember: keep it, marked released
  const BufferExtent* buffer_at(const void* p) const;
  // The buffer at p is being all-gathered into (Comm: from the start until the wait): nothing may
  // read or write it meanwhile (check_span says so, naming it).
  void set_gathering(const void* p, bool on);

  // Forget everything (tests that build several models in one process).
  void reset();
  std::string to_json() const;

 private:
  Ledger();
  void record(Category c, Location l, int64_t delta, const std::string& name);
  uint64_t cur_[kNumLocations][kNumCategories] = {};
  uint64_t peak_[kNumLocations][kNumCategories] = {};
  uint64_t cur_total_[kNumLocations] = {};
  uint64_t peak_total_[kNumLocations] = {};
  int step_ = -1;
  int timeline_last_step_ = 1;
  std::string phase_ = "setup";
  std::vector<LedgerEvent> events_;
  std::vector<ActivityEvent> activity_;
  std::map<uintptr_t, BufferExtent> extents_;  // by first byte
  double t0_;
};

// A tracked allocation: the only way model state gets memory. Move-only; frees on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Category c, Location l, size_t bytes, std::string name);
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void release();  // give the bytes back now (stage3's release_unit)
  void* data() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }
  Location location() const { return loc_; }
  const std::string& name() const { return name_; }
  void zero();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Category cat_ = Category::Scratch;
  Location loc_ = Location::Device;
  std::string name_;
};

// Stops the job with a message naming the buffer when [p, p + bytes) is not inside one live buffer:
// a slice pointer past its buffer's end (a size in the wrong unit, float arithmetic on a bf16
// buffer), memory released before this use, or a buffer whose all-gather is still in flight. `use` says what the memory is for ("the
// reduce-scatter's output"). Memory the ledger does not know of passes.
void check_span(const void* p, size_t bytes, const char* use);
// The same, and the buffer must live at `at`: host code cannot compute on device memory, and a copy
// must come from where its source is (offload's host optimizer and its copy up).
void check_span_at(const void* p, size_t bytes, Location at, const char* use);

// Offload's host<->device copy (device.h, raw_copy_async: queued on a copy stream; copy_wait waits
// for it), with both sides checked against the ledger first: each must be where it is said to be,
// so a copy that would fail on a GPU fails on the CPU too.
void copy_bytes_async(void* dst, Location dst_loc, const void* src, Location src_loc, size_t bytes);

}  // namespace nz
