// held_params.h — the parameters a rank holds away from a buffer, as checkpoints read and write them.
//
// Most rungs hold their parameters in one Buffer (Trainer::checkpoint_state takes it). A rung that
// keeps them elsewhere (infinity: host memory or a file, infinity/param_store.h) implements this.
#pragma once
#include <cstddef>
#include <string>

namespace nz {

class HeldParams {
 public:
  virtual ~HeldParams() = default;
  // Elements [at, at + n) of this rank's slices, packed (shard offsets), to or from host memory.
  virtual void read(size_t at, size_t n, void* dst) = 0;
  virtual void write(size_t at, size_t n, const void* src) = 0;
  // One line on what holding them cost, printed by rank 0 at the end ("" for nothing to say).
  virtual std::string io_summary() const { return ""; }
};

}  // namespace nz
