// param_store.h — ZeRO-Infinity's parameter slices off the device, in host memory or a file.
// For infinity/train.cpp (--offload-param cpu|disk): this rank's slice of every unit, in the
// storage type, in host memory or in one file. The trainer fetches a unit's slice just before its all-gather (it is copied up
// into its place in the gathered unit) and writes the updated slice back after the host AdamW.
//
// Disk tier: the file is made as offload's are (offload_store.h: a fresh name, unlinked at once,
// its size reserved up front), so nothing is left behind on any exit. A fetch reads the slice
// into one of two host buffers; with read-ahead on (--prefetch 1), a background thread then reads
// the slice most likely needed next while the unit computes: the unit that came after this one
// last time, after the same predecessor (the order is learnt from the fetches themselves, as FSDP2
// records its forward order). A wrong guess costs one plain read, never a wrong slice: a slice
// written back drops any read-ahead of it, so nothing read before the optimizer is used after it.
// Writes are plain and synchronous (the optimizer's phase has nothing to overlap them with here).
#pragma once
#include <atomic>
#include <cstddef>
#include <future>
#include <map>
#include <string>
#include <utility>

#include "io/held_params.h"  // HeldParams
#include "kernels/dtype.h"
#include "layout.h"
#include "ledger.h"  // Buffer

namespace nz {

class Comm;  // comm.h

class ParamSlices : public HeldParams {  // checkpoints read and write it (held_params.h)
 public:
  // where: Location::Host (a Buffer of S elements, ledger params/host) or Location::Disk (a file of
  // S elements in dir, ledger params/disk, and two host buffers of the largest slice, scratch).
  // A directory where the file cannot be made or reserved is a user error, agreed by every rank.
  ParamSlices(const Layout& L, int rank, DType dt, Location where, const std::string& dir, const Comm& comm,
              bool read_ahead);
  ~ParamSlices();
  ParamSlices(const ParamSlices&) = delete;
  ParamSlices& operator=(const ParamSlices&) = delete;

  Location where() const { return where_; }
  // My slice of unit u, in host memory: valid until the next fetch but one (disk) or always (host).
  const void* fetch(int u);
  // The updated slice of unit u (host memory) becomes the stored one.
  void write_back(int u, const void* slice);
  // Elements [at, at + n) of my packed slices (shard offsets), to or from host memory (checkpoints).
  void read(size_t at, size_t n, void* dst) override;
  void write(size_t at, size_t n, const void* src) override;
  // Disk tier: what the file cost. Fetches served by the read-ahead, of all fetches (the guess's hit
  // rate); bytes read and written; the time spent reading (in either thread) and writing, and the
  // time the training waited for a slice: reading time it did not wait for overlapped compute.
  struct IoStats {
    uint64_t hits = 0, fetches = 0, bytes_read = 0, bytes_written = 0;
    double read_ms = 0, write_ms = 0, waited_ms = 0;
  };
  IoStats io_stats() const;
  std::string io_summary() const override;  // one line (Trainer::finish prints rank 0's); "" on the host tier

 private:
  const Layout& L_;
  const Comm& comm_;
  int rank_;
  size_t e_;
  Location where_;
  std::string dir_;
  bool read_ahead_;
  Buffer host_;      // Location::Host: the slices
  int fd_ = -1;      // Location::Disk: the file (unlinked)
  Buffer slot_[2];   // Location::Disk: the fetched slice and the one being read ahead
  int ready_unit_ = -1, ahead_unit_ = -1;  // which unit each slot holds (-1: none)
  std::future<int> ahead_;                  // the read-ahead in flight: 0, or its errno
  int prev_ = -1, last_ = -1;               // the last two units fetched
  std::map<std::pair<int, int>, int> next_;  // (before, unit) -> the unit fetched after them
  uint64_t hits_ = 0, fetches_ = 0, bytes_read_ = 0, bytes_written_ = 0;
  std::atomic<uint64_t> read_ns_{0};  // both threads read
  uint64_t write_ns_ = 0, waited_ns_ = 0;
  size_t slice_bytes(int u) const { return L_.units[u].padded / L_.world * e_; }
  off_t file_at(int u) const { return off_t(L_.units[u].shard_offset * e_); }
  bool read_slice(int u, void* dst);  // false: the read failed (errno)
  void join_ahead();                  // waits for the read-ahead; a failed one stops the run
  void fail(const char* what);        // one line, the file closed, the whole job stopped
};

}  // namespace nz
