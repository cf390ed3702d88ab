// offload_store.h — offload's disk tier: the optimizer state in files (--offload-to disk).
// With --offload-dir DIR the optimizer state of a rank's owned slices (fp32 master, Adam m and v)
// lives in three files, and each step streams
// it through host buffers a chunk at a time. Host memory for the optimizer state is then bounded
// by the chunk (--offload-chunk elements), however large the model; the price is reading and
// writing 12 bytes per owned parameter per step. Reads and writes are plain and synchronous.
//
// The files are created fresh (unique names, O_EXCL) and unlinked at once: only their open
// descriptors keep them, so they vanish when the process ends, whatever ends it (SIGKILL included).
// Their full size is reserved up front, so a full disk shows at start-up and not in a step.
#pragma once
#include <sys/types.h>  // off_t

#include <cstddef>
#include <string>

#include "ledger.h"  // Buffer, Category

namespace nz {

class Comm;  // comm.h: the control channel, for the ranks' agreement on a failure

// A fresh file stem.XXXXXX in its directory, unlinked at once, with `bytes` reserved (zeros): its
// descriptor, or -1 and *error set to what failed and what to do (what: the state it is for,
// total_bytes: the rank's bytes of that state, for the message). signal(SIGXFSZ) is the caller's.
int open_unlinked_reserved(const std::string& stem, size_t bytes, const char* what, double total_bytes,
                           std::string* error);

// pread (write: pwrite) of all `bytes` at offset `at`, resuming after short transfers and signals;
// false (errno set) when it fails.
bool transfer_all(bool write, int fd, char* p, size_t bytes, off_t at);

class DiskState {
 public:
  // Three files of `elems` floats (zeros) in `dir`, counted in the ledger at Location::Disk, and
  // three host buffers of chunk_elems floats (ledger: scratch, host). A missing, unusable or full
  // directory is a user error (one line, exit 2), agreed on by every rank (collective: no rank is
  // left waiting), and leaves no file behind.
  DiskState(const Comm& comm, const std::string& dir, size_t elems, size_t chunk_elems);
  ~DiskState();
  DiskState(const DiskState&) = delete;
  DiskState& operator=(const DiskState&) = delete;

  size_t chunk() const { return chunk_; }
  float* master() const { return buf_[0].as<float>(); }
  float* m() const { return buf_[1].as<float>(); }
  float* v() const { return buf_[2].as<float>(); }
  // Elements [at, at + n) of the three files into the three buffers (n <= chunk()), and back.
  void read(size_t at, size_t n);
  void write(size_t at, size_t n);
  // Elements [at, at + n) of one file (0 master, 1 m, 2 v) to or from host memory (checkpoints).
  void read_array(int i, size_t at, size_t n, float* dst);
  void write_array(int i, size_t at, size_t n, const float* src);

 private:
  const Comm& comm_;
  struct File {
    Category cat;
    const char* what;  // "master", "adam_m", "adam_v"
    std::string path;
    int fd = -1;
  };
  File files_[3] = {{Category::Master, "master", "", -1},
                    {Category::AdamM, "adam_m", "", -1},
                    {Category::AdamV, "adam_v", "", -1}};
  Buffer buf_[3];
  std::string dir_;
  size_t elems_, chunk_;
  void transfer(bool write, int i, size_t at, size_t n, float* p);
  void remove_files();  // closes the files: unlinked since creation, this frees their space
};

}  // namespace nz
