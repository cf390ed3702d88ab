// offload_store.cpp — the optimizer state files of offload's disk tier (offload_store.h).
#include "offload/offload_store.h"

#include <fcntl.h>     // posix_fallocate
#include <signal.h>    // signal (SIGXFSZ)
#include <unistd.h>    // pread, pwrite, unlink, close

#include <cerrno>
#include <climits>  // INT_MAX
#include <cstring>
#include <vector>

#include "comm.h"  // the control channel: every rank agrees before anyone exits
#include "runtime/check.h"

namespace nz {

bool transfer_all(bool write, int fd, char* p, size_t bytes, off_t at) {
  while (bytes > 0) {
    ssize_t k = write ? pwrite(fd, p, bytes, at) : pread(fd, p, bytes, at);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = EIO;  // the file is shorter than it was made
      return false;
    }
    p += k, bytes -= size_t(k), at += k;
  }
  return true;
}

int open_unlinked_reserved(const std::string& stem, size_t bytes, const char* what, double total_bytes,
                           std::string* error) {
  std::string name = stem + ".XXXXXX";
  std::vector<char> path(name.begin(), name.end());
  path.push_back('\0');
  const int fd = mkstemp(path.data());  // O_CREAT | O_EXCL with a unique name: a fresh file, never an old one
  if (fd < 0) {
    *error = std::string("cannot create files there (") + strerror(errno) +
             "); expected a writable directory: fix its permissions or pass another";
    return -1;
  }
  // Unlinked at once: the name goes, the open descriptor keeps the file. So no crash, not even a
  // SIGKILL from mpirun when another rank dies, can leave it behind: the kernel frees it when
  // the process ends, however it ends.
  unlink(path.data());
  // Reserve the whole file now (zeros: m and v start at 0), so a full disk shows here.
  const int err = posix_fallocate(fd, 0, off_t(bytes));
  if (err != 0) {
    *error = "cannot reserve " + fmt_bytes(total_bytes) + " per rank for " + what + ": " + strerror(err) +
             "; free some space or pass another directory";
    close(fd);
    return -1;
  }
  return fd;
}

DiskState::DiskState(const Comm& comm, const std::string& dir, size_t elems, size_t chunk_elems)
    : comm_(comm), dir_(dir), elems_(elems), chunk_(chunk_elems) {
  NZ_CHECK(elems > 0 && chunk_elems > 0, "DiskState: empty state or chunk");
  const size_t bytes = elems * sizeof(float);
  const int rank = comm.rank();
  signal(SIGXFSZ, SIG_IGN);  // a file-size limit (ulimit -f) becomes an error (EFBIG), not a kill
  // What is wrong, if anything, with the directory on this rank (one line for the user).
  // (The command line has checked that it exists and is a writable directory; this is what is left.)
  std::string error;
  for (File& f : files_) {
    if (!error.empty()) break;
    f.fd = open_unlinked_reserved(dir + "/nanozero-offload-r" + std::to_string(rank) + "-" + f.what, bytes,
                                  "the optimizer state (master, m, v)", 3.0 * double(bytes), &error);
  }
  // Collective: every rank learns whether any rank failed; the first one that did says why.
  const int first = comm.control_min(error.empty() ? INT_MAX : rank);
  if (first != INT_MAX) {
    remove_files();
    if (rank == first) user_error_this_rank("--offload-dir %s: %s", dir.c_str(), error.c_str());
    comm.exit_quietly(2);  // the others exit with the same code, silently
  }
  for (File& f : files_) Ledger::get().on_alloc(f.cat, Location::Disk, bytes, std::string(f.what) + " file");
  for (int i = 0; i < 3; i++)
    buf_[i] = Buffer(Category::Scratch, Location::Host, chunk_ * sizeof(float),
                     std::string("offload chunk: ") + files_[i].what);
}

DiskState::~DiskState() {
  if (files_[0].fd >= 0)
    for (File& f : files_) Ledger::get().on_free(f.cat, Location::Disk, elems_ * sizeof(float), std::string(f.what) + " file");
  remove_files();
}

void DiskState::remove_files() {
  for (File& f : files_) {
    if (f.fd >= 0) close(f.fd);  // the last reference to an unlinked file: its blocks are freed
    f.fd = -1;
    f.path.clear();
  }
}

void DiskState::read(size_t at, size_t n) {
  NZ_CHECK(n <= chunk_, "DiskState: %zu elements, more than the chunk", n);
  for (int i = 0; i < 3; i++) transfer(false, i, at, n, buf_[i].as<float>());
}
void DiskState::write(size_t at, size_t n) {
  NZ_CHECK(n <= chunk_, "DiskState: %zu elements, more than the chunk", n);
  for (int i = 0; i < 3; i++) transfer(true, i, at, n, buf_[i].as<float>());
}
void DiskState::read_array(int i, size_t at, size_t n, float* dst) { transfer(false, i, at, n, dst); }
void DiskState::write_array(int i, size_t at, size_t n, const float* src) { transfer(true, i, at, n, (float*)src); }

void DiskState::transfer(bool write, int i, size_t at, size_t n, float* p) {
  NZ_CHECK(i >= 0 && i < 3 && at + n <= elems_, "DiskState: elements [%zu, %zu) outside the file", at, at + n);
  if (transfer_all(write, files_[i].fd, (char*)p, n * sizeof(float), off_t(at * sizeof(float)))) return;
  // A failed read or write in the middle of a step (the space was reserved, so this is rare: an
  // I/O error, a file system gone). One line, the files closed (and so freed), the whole job stopped.
  fprintf(stderr, "error: --offload-dir %s: cannot %s the %s file (%s); the run stops\n", dir_.c_str(),
          write ? "write" : "read", files_[i].what, strerror(errno));
  fflush(stderr);
  remove_files();
  comm_.abort_job(2);
}

}  // namespace nz
