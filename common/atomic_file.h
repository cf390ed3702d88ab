// atomic_file.h — writing a file so that a crash never leaves half of it under its name.
//
// The bytes go to a fresh temporary file beside the target (PATH.tmp.XXXXXX, created with O_EXCL,
// so two writers never share one); commit() flushes it to the disk (fsync), renames it over PATH
// and syncs the directory, so after commit() returns the new file survives a power cut, and
// before it returns PATH still holds whatever it held. A writer destroyed without commit() removes
// its temporary file. The CRC-32C of everything written is kept as it goes (crc32c.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace nz {

class AtomicFile {
 public:
  // Creates the temporary file; on failure ok() is false and error() says why.
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  bool write(const void* data, size_t bytes);  // false (and error()) on a failed write
  uint32_t crc() const { return crc_; }        // CRC-32C of the bytes written so far
  uint64_t bytes() const { return bytes_; }
  // fsync, rename over the target, fsync the directory. False (and error()) if any fails; the
  // target is then untouched and the temporary file removed.
  bool commit();

 private:
  std::string path_, tmp_, error_;
  int fd_ = -1;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
  void fail(const char* what);
};

// fsync a directory, so a rename or a new entry in it is on the disk.
void sync_dir(const std::string& dir);
// The directory part of a path ("." for a bare name).
std::string dir_of(const std::string& path);

}  // namespace nz
