// atomic_file.cpp — temporary file, fsync, rename (atomic_file.h).
#include "atomic_file.h"

#include <fcntl.h>     // open
#include <sys/stat.h>  // fchmod
#include <unistd.h>  // write, fsync, close, unlink

#include <algorithm>  // std::min
#include <cerrno>
#include <cstdio>   // rename
#include <cstdlib>  // mkstemp
#include <cstring>  // strerror
#include <vector>

#include "crc32c.h"
#include "watchdog.h"  // heartbeat: a piece of the file written

namespace nz {

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
  std::string name = path + ".tmp.XXXXXX";
  std::vector<char> buf(name.begin(), name.end());
  buf.push_back('\0');
  fd_ = mkstemp(buf.data());  // O_CREAT | O_EXCL, mode 0600: a fresh file only this writer knows
  if (fd_ < 0) {
    fail("cannot create a file there");
    return;
  }
  tmp_ = buf.data();
  fchmod(fd_, 0644);  // what fopen would have made (umask aside): readable by the tools
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) close(fd_);
  if (!tmp_.empty()) unlink(tmp_.c_str());
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
  if (!ok()) return false;
  if (fsync(fd_) != 0) fail("cannot flush it to the disk");
  if (close(fd_) != 0) fail("write failed on close");
  fd_ = -1;
  if (ok() && rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename it into place");
  if (!ok()) return false;
  tmp_.clear();  // it has the target's name now: nothing to remove
  sync_dir(dir_of(path_));
  return true;
}

}  // namespace nz
