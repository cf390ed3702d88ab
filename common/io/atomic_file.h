// atomic_file.h — writing a file so that a crash never leaves half of it under its name.
//
// The bytes go to a fresh temporary file beside the target (PATH.tmp.XXXXXX, created with O_EXCL,
// so two writers never share one); commit() flushes it to the disk (fsync), renames it over PATH
// and syncs the directory, so after commit() returns the new file survives a power cut, and
// before it returns PATH still holds whatever it held. A writer destroyed without commit(), or
// whose commit() fails, removes its temporary file. The CRC-32C of everything written is kept as it
// goes (crc32c.h).
//
// No temporary file outlives its writer on any way out of the process but SIGKILL: an exit()
// (user_error skips the destructors), fatal(), and SIGTERM, SIGINT or SIGHUP (what mpirun sends
// the ranks when the job is stopped) each remove the files still being written. A file-size limit
// (ulimit -f) makes a write fail (EFBIG) instead of killing the process (SIGXFSZ is ignored).
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
  int slot_ = -1;  // where the temporary file is registered for removal on any exit (-1: nowhere)
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
  void fail(const char* what);
  void remove_temp();
};

// Removes every temporary file an AtomicFile is still writing (fatal() calls it before ending the
// job; exit() and the termination signals do it by themselves). Safe in a signal handler.
void remove_unfinished_temp_files();
// What a temporary file name was to become: "NAME.tmp.XXXXXX" -> "NAME"; "" for any other name.
std::string temp_file_target(const std::string& name);

// fsync a directory, so a rename or a new entry in it is on the disk.
void sync_dir(const std::string& dir);
// The directory part of a path ("." for a bare name).
std::string dir_of(const std::string& path);

}  // namespace nz
