// data.cpp — reading the corpus and cutting windows from it.
#include "input/data.h"

#include <fcntl.h>     // open: O_NONBLOCK (read_input_file)
#include <sys/stat.h>  // fstat: a regular file only
#include <unistd.h>    // read, close

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstring>

#include "runtime/check.h"
#include "runtime/rng.h"

namespace nz {

void check_input_file(const char* flag, const std::string& path, uint64_t max_bytes, const char* what) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0)
    user_error("%s %s: cannot read it (%s), expected %s; give a readable file", flag, path.c_str(), strerror(errno), what);
  if (!S_ISREG(st.st_mode))
    user_error("%s %s: not a regular file (%s), expected %s; give a file", flag, path.c_str(),
               S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a pipe" : "a device or socket", what);
  if (uint64_t(st.st_size) > max_bytes)
    user_error("%s %s: %llu bytes, more than the limit of %llu, expected %s; give a smaller file", flag, path.c_str(),
               (unsigned long long)st.st_size, (unsigned long long)max_bytes, what);
}

std::string read_input_file(const char* flag, const std::string& path, uint64_t max_bytes, const char* what) {
  check_input_file(flag, path, max_bytes, what);
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    user_error("%s %s: cannot open it (%s), expected %s; give a readable file", flag, path.c_str(), strerror(errno), what);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || uint64_t(st.st_size) > max_bytes) {
    close(fd);
    user_error("%s %s: changed while being opened, expected %s of at most %llu bytes; give a file nothing else writes",
               flag, path.c_str(), what, (unsigned long long)max_bytes);
  }
  std::string text;
  char buf[1 << 16];
  ssize_t n;
  while (text.size() <= max_bytes && (n = read(fd, buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      user_error("%s %s: read error (%s), expected %s; check the file", flag, path.c_str(), strerror(err), what);
    }
    text.append(buf, size_t(n));
  }
  close(fd);
  if (text.size() > max_bytes)
    user_error("%s %s: grew past the limit of %llu bytes while being read, expected %s; give a file nothing else writes",
               flag, path.c_str(), (unsigned long long)max_bytes, what);
  return text;
}

void check_data_file(const std::string& path) { check_input_file("--data", path, kMaxDataBytes, "a text file"); }

uint64_t min_data_bytes(int B, int T) {
  // split as the constructor does: train = n - n/10, validation = n/10
  const uint64_t need_train = uint64_t(B) * T + 1, need_val = uint64_t(T) + 1;
  uint64_t n = std::max(need_train, 10 * need_val);  // neither part can be satisfied below this
  while (n - n / 10 < need_train || n / 10 < need_val) n++;  // a few steps at most
  return n;
}

DataLoader::DataLoader(const std::string& path, int B, int T, uint64_t seed) : B_(B), T_(T), seed_(seed) {
  // A regular file of bounded size, checked before opening it and again on the open file (it may
  // have been swapped in between).
  check_data_file(path);
  struct stat st;
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) user_error("--data %s: cannot open (%s); give a readable text file", path.c_str(), strerror(errno));
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || uint64_t(st.st_size) > kMaxDataBytes) {
    fclose(f);
    user_error("--data %s: not a regular file of at most %llu bytes; give a text file", path.c_str(),
               (unsigned long long)kMaxDataBytes);
  }
  bytes_.reserve(size_t(st.st_size));
  char buf[1 << 16];
  size_t n;
  while (bytes_.size() <= kMaxDataBytes && (n = fread(buf, 1, sizeof buf, f)) > 0) bytes_.insert(bytes_.end(), buf, buf + n);
  bool failed = ferror(f) || bytes_.size() > kMaxDataBytes;
  fclose(f);
  if (failed) user_error("--data %s: read error (or the file grew past the limit); check the file", path.c_str());
  train_end_ = bytes_.size() - bytes_.size() / 10;
  const uint64_t need = min_data_bytes(B, T);
  if (bytes_.size() < need)
    user_error("--data %s: %zu bytes is shorter than one batch: --batch %d x --seq %d needs at least %llu bytes "
               "(%d x %d + 1 for training, %d + 1 for validation in the last 10%%); use a longer file or a smaller "
               "--batch/--seq",
               path.c_str(), bytes_.size(), B, T, (unsigned long long)need, B, T, T);
}

void DataLoader::train_batch(long step, int k, int accum, int world, int rank, int* tokens,
                             int* targets) const {
  const size_t span = train_end_ - T_;  // window starts: [0, span)
  for (int b = 0; b < B_; b++) {
    uint64_t i = ((uint64_t(step) * accum + k) * world + rank) * B_ + b;
    size_t off = splitmix64(seed_ * 0x9e3779b97f4a7c15ull + i) % span;
    for (int t = 0; t < T_; t++) {
      tokens[b * T_ + t] = bytes_[off + t];
      targets[b * T_ + t] = bytes_[off + t + 1];
    }
  }
}

int DataLoader::num_val_windows() const { return int((bytes_.size() - train_end_ - 1) / T_); }

void DataLoader::val_window(int j, int* tokens, int* targets) const {
  NZ_CHECK(j >= 0 && j < num_val_windows(), "validation window %d of %d", j, num_val_windows());
  size_t off = train_end_ + size_t(j) * T_;
  for (int t = 0; t < T_; t++) {
    tokens[t] = bytes_[off + t];
    targets[t] = bytes_[off + t + 1];
  }
}

double DataLoader::unigram_baseline() const {
  double count[256];
  for (double& c : count) c = 1.0;  // add-one smoothing
  for (size_t i = 0; i < train_end_; i++) count[bytes_[i]] += 1.0;
  double total = 0;
  for (double c : count) total += c;
  double ce = 0;
  for (size_t i = train_end_; i < bytes_.size(); i++) ce -= std::log(count[bytes_[i]] / total);
  return ce / double(bytes_.size() - train_end_);
}

}  // namespace nz
