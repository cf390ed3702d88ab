// param_store.cpp — infinity's parameter slices in host memory or in a file (param_store.h).
#include "infinity/param_store.h"

#include <signal.h>  // signal (SIGXFSZ)
#include <unistd.h>  // close

#include <algorithm>  // std::max
#include <cerrno>
#include <chrono>
#include <climits>  // INT_MAX
#include <cstring>

#include "comm.h"  // the control channel: every rank agrees before anyone exits
#include "offload/offload_store.h"  // open_unlinked_reserved, transfer_all: offload's file discipline
#include "runtime/check.h"

namespace nz {
namespace {

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch()).count());
}

}  // namespace

ParamSlices::ParamSlices(const Layout& L, int rank, DType dt, Location where, const std::string& dir,
                         const Comm& comm, bool read_ahead)
    : L_(L), comm_(comm), rank_(rank), e_(dtype_bytes(dt)), where_(where), dir_(dir), read_ahead_(read_ahead) {
  NZ_CHECK(where == Location::Host || where == Location::Disk, "ParamSlices: on the host or on disk");
  const size_t bytes = L.shard_total * e_;
  if (where == Location::Host) {
    host_ = Buffer(Category::Params, Location::Host, bytes, "params (my slices)");
    return;
  }
  signal(SIGXFSZ, SIG_IGN);  // a file-size limit (ulimit -f) becomes an error (EFBIG), not a kill
  std::string error;
  fd_ = open_unlinked_reserved(dir + "/nanozero-params-r" + std::to_string(rank), bytes, "the parameter slices",
                               double(bytes), &error);
  // Collective: every rank learns whether any rank failed; the first one that did says why.
  const int first = comm.control_min(error.empty() ? INT_MAX : rank);
  if (first != INT_MAX) {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    if (rank == first) user_error_this_rank("--offload-dir %s: %s", dir.c_str(), error.c_str());
    comm.exit_quietly(2);  // the others exit with the same code, silently
  }
  Ledger::get().on_alloc(Category::Params, Location::Disk, bytes, "params file (my slices)");
  size_t largest = 0;
  for (int u = 0; u < L.num_units(); u++) largest = std::max(largest, slice_bytes(u));
  for (int i = 0; i < 2; i++) slot_[i] = Buffer(Category::Scratch, Location::Host, largest, "param slice slot");
}

ParamSlices::~ParamSlices() {
  if (fd_ < 0) return;
  if (ahead_.valid()) ahead_.wait();
  Ledger::get().on_free(Category::Params, Location::Disk, L_.shard_total * e_, "params file (my slices)");
  close(fd_);  // the last reference to an unlinked file: its blocks are freed
}

bool ParamSlices::read_slice(int u, void* dst) {
  const uint64_t t0 = now_ns();
  const bool ok = transfer_all(false, fd_, static_cast<char*>(dst), slice_bytes(u), file_at(u));
  read_ns_ += now_ns() - t0;
  return ok;
}

void ParamSlices::join_ahead() {
  if (!ahead_.valid()) return;
  const int err = ahead_.get();  // the reading thread's errno (0: read)
  if (err != 0) {
    errno = err;
    fail("read");
  }
}

const void* ParamSlices::fetch(int u) {
  if (where_ == Location::Host) return static_cast<const char*>(host_.data()) + L_.units[u].shard_offset * e_;
  fetches_++;
  const uint64_t t0 = now_ns();
  join_ahead();
  if (ahead_unit_ == u) {  // the guess was right: the slice is already here
    hits_++;
    std::swap(slot_[0], slot_[1]);
  } else if (!read_slice(u, slot_[0].data())) {
    fail("read");
  }
  waited_ns_ += now_ns() - t0;
  ready_unit_ = u, ahead_unit_ = -1;
  bytes_read_ += slice_bytes(u);
  // learn the order: after (prev_, last_) came u
  if (last_ >= 0) next_[{prev_, last_}] = u;
  prev_ = last_, last_ = u;
  // read ahead the unit that came after (last unit, u) the last time, while u computes
  auto guess = next_.find({prev_, last_});
  if (read_ahead_ && guess != next_.end()) {
    const int v = guess->second;
    void* dst = slot_[1].data();
    ahead_unit_ = v;
    ahead_ = std::async(std::launch::async, [this, v, dst] { return read_slice(v, dst) ? 0 : errno; });
  }
  return slot_[0].data();
}

void ParamSlices::write_back(int u, const void* slice) {
  if (where_ == Location::Host) {
    memcpy(static_cast<char*>(host_.data()) + L_.units[u].shard_offset * e_, slice, slice_bytes(u));
    return;
  }
  // a read-ahead of this unit read the old slice: it must not be used after this write
  join_ahead();
  if (ahead_unit_ == u) ahead_unit_ = -1;
  if (ready_unit_ == u) ready_unit_ = -1;
  const uint64_t t0 = now_ns();
  if (!transfer_all(true, fd_, (char*)slice, slice_bytes(u), file_at(u))) fail("write");
  write_ns_ += now_ns() - t0;
  bytes_written_ += slice_bytes(u);
}

ParamSlices::IoStats ParamSlices::io_stats() const {
  IoStats s;
  s.hits = hits_, s.fetches = fetches_, s.bytes_read = bytes_read_, s.bytes_written = bytes_written_;
  s.read_ms = double(read_ns_.load()) / 1e6, s.write_ms = double(write_ns_) / 1e6;
  s.waited_ms = double(waited_ns_) / 1e6;
  return s;
}

std::string ParamSlices::io_summary() const {
  if (where_ != Location::Disk) return "";
  const IoStats s = io_stats();
  auto rate = [](uint64_t bytes, double ms) { return ms > 0 ? fmt_bytes(double(bytes) / (ms / 1e3)) + "/s" : "-"; };
  char line[512];
  snprintf(line, sizeof line,
           "parameter file (rank 0): read %s in %.1f ms (%s), written %s in %.1f ms (%s); %llu of %llu fetches "
           "read ahead (%s), %.1f ms waited for a slice",
           fmt_bytes(double(s.bytes_read)).c_str(), s.read_ms, rate(s.bytes_read, s.read_ms).c_str(),
           fmt_bytes(double(s.bytes_written)).c_str(), s.write_ms, rate(s.bytes_written, s.write_ms).c_str(),
           (unsigned long long)s.hits, (unsigned long long)s.fetches, read_ahead_ ? "--prefetch 1" : "--prefetch 0",
           s.waited_ms);
  return line;
}

void ParamSlices::read(size_t at, size_t n, void* dst) {
  NZ_CHECK(at + n <= L_.shard_total, "ParamSlices: elements [%zu, %zu) outside my slices", at, at + n);
  if (where_ == Location::Host) {
    memcpy(dst, static_cast<const char*>(host_.data()) + at * e_, n * e_);
    return;
  }
  join_ahead();
  if (!transfer_all(false, fd_, static_cast<char*>(dst), n * e_, off_t(at * e_))) fail("read");
}

void ParamSlices::write(size_t at, size_t n, const void* src) {
  NZ_CHECK(at + n <= L_.shard_total, "ParamSlices: elements [%zu, %zu) outside my slices", at, at + n);
  if (where_ == Location::Host) {
    memcpy(static_cast<char*>(host_.data()) + at * e_, src, n * e_);
    return;
  }
  join_ahead();
  ahead_unit_ = ready_unit_ = -1;  // whatever was read before is stale now
  if (!transfer_all(true, fd_, (char*)src, n * e_, off_t(at * e_))) fail("write");
}

void ParamSlices::fail(const char* what) {
  // As offload's disk tier: the space was reserved, so this is an I/O error or a file system gone.
  fprintf(stderr, "error: --offload-dir %s: cannot %s the parameter file (%s); the run stops\n", dir_.c_str(),
          what, strerror(errno));
  fflush(stderr);
  close(fd_);
  fd_ = -1;
  comm_.abort_job(2);
}

}  // namespace nz
