// atomic_file.cpp — temporary file, fsync, rename (atomic_file.h).
#include "io/atomic_file.h"

#include <fcntl.h>     // open
#include <limits.h>    // PATH_MAX
#include <signal.h>    // sigaction: removing the temporary files on SIGTERM, SIGINT, SIGHUP
#include <sys/stat.h>  // fchmod
#include <unistd.h>  // write, fsync, close, unlink

#include <algorithm>  // std::min
#include <atomic>
#include <cerrno>
#include <cstdio>   // rename
#include <cstdlib>  // mkstemp, atexit
#include <cstring>  // strerror
#include <mutex>    // std::call_once
#include <vector>

#include "io/crc32c.h"
#include "runtime/check.h"   // at_fatal_exit
#include "runtime/heartbeat.h"  // heartbeat: a piece of the file written

namespace nz {

// ---- the temporary files being written now ----
// Kept where an exit(), fatal() or a signal handler can find them: fixed slots of plain bytes,
// since a signal handler may neither allocate nor take a lock. A slot is 0 (free), 1 (being
// filled) or 2 (holds the path of a temporary file to remove).
namespace {
constexpr int kTempSlots = 64;  // writers alive at once: a shard and a MANIFEST at most, in practice
char temp_paths[kTempSlots][PATH_MAX];
std::atomic<int> temp_state[kTempSlots];

void on_termination_signal(int sig) {
  remove_unfinished_temp_files();
  raise(sig);  // SA_RESETHAND restored the default action: the process ends as it would have
}

void install_cleanup_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit(remove_unfinished_temp_files);  // exit(): user_error skips the writers' destructors
    at_fatal_exit(remove_unfinished_temp_files);  // fatal(): MPI_Abort runs no exit handlers
    signal(SIGXFSZ, SIG_IGN);  // a file-size limit (ulimit -f) becomes a failed write (EFBIG), not a kill
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
      struct sigaction old;
      if (sigaction(sig, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL)
        continue;  // someone else handles it: leave theirs alone
      struct sigaction sa;
      memset(&sa, 0, sizeof sa);
      sa.sa_handler = on_termination_signal;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESETHAND;
      sigaction(sig, &sa, nullptr);
    }
  });
}

int register_temp(const std::string& path) {
  install_cleanup_once();
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kTempSlots; i++) {
    int expected = 0;
    if (temp_state[i].compare_exchange_strong(expected, 1)) {
      memcpy(temp_paths[i], path.c_str(), path.size() + 1);
      temp_state[i].store(2);
      return i;
    }
  }
  return -1;  // no slot free: the destructor still removes it
}
}  // namespace

void remove_unfinished_temp_files() {
  for (int i = 0; i < kTempSlots; i++)
    if (temp_state[i].load() == 2) unlink(temp_paths[i]);
}

std::string temp_file_target(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  // mkstemp's six characters follow ".tmp."
  if (at == std::string::npos || at == 0 || name.size() != at + 5 + 6) return "";
  return name.substr(0, at);
}

std::string dir_of(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void sync_dir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  fsync(fd);  // some file systems refuse to sync a directory: the rename itself is still atomic
  close(fd);
}

AtomicFile::AtomicFile(const std::string& path) : path_(path) {
  install_cleanup_once();
  std::string name = path + ".tmp.XXXXXX";
  std::vector<char> buf(name.begin(), name.end());
  buf.push_back('\0');
  fd_ = mkstemp(buf.data());  // O_CREAT | O_EXCL, mode 0600: a fresh file only this writer knows
  if (fd_ < 0) {
    fail("cannot create a file there");
    return;
  }
  tmp_ = buf.data();
  slot_ = register_temp(tmp_);
  fchmod(fd_, 0644);  // what fopen would have made (umask aside): readable by the tools
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) close(fd_);
  remove_temp();
}

void AtomicFile::remove_temp() {
  if (!tmp_.empty()) unlink(tmp_.c_str());
  tmp_.clear();
  if (slot_ >= 0) temp_state[slot_].store(0);
  slot_ = -1;
}

void AtomicFile::fail(const char* what) {
  if (error_.empty()) error_ = std::string(what) + " (" + strerror(errno) + ")";
}

bool AtomicFile::write(const void* data, size_t n) {
  if (!ok()) return false;
  const char* p = static_cast<const char*>(data);
  crc_ = crc32c(crc_, p, n);
  bytes_ += n;
  while (n > 0) {
    // at most 64 MiB a call, each a heartbeat: a big file on a slow disk is slow, not stuck
    ssize_t k = ::write(fd_, p, std::min(n, size_t(64) << 20));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = EIO;
      fail("write failed (disk full?)");
      return false;
    }
    p += k, n -= size_t(k);
    heartbeat();
  }
  return true;
}

bool AtomicFile::commit() {
  if (ok() && fsync(fd_) != 0) fail("cannot flush it to the disk");
  if (fd_ >= 0 && close(fd_) != 0) fail("write failed on close");
  fd_ = -1;
  if (ok() && rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename it into place");
  if (!ok()) {
    remove_temp();  // now, not at the destructor: the caller may exit() on the error (user_error)
    return false;
  }
  tmp_.clear();  // it has the target's name now: nothing to remove
  remove_temp();
  sync_dir(dir_of(path_));
  return true;
}

}  // namespace nz
