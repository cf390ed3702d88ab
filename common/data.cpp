// data.cpp — reading the corpus and cutting windows from it.
#include "data.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstring>

#include "check.h"
#include "rng.h"

namespace nz {

DataLoader::DataLoader(const std::string& path, int B, int T, uint64_t seed) : B_(B), T_(T), seed_(seed) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) user_error("--data %s: cannot open (%s); give a readable text file", path.c_str(), strerror(errno));
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) bytes_.insert(bytes_.end(), buf, buf + n);
  bool failed = ferror(f);
  fclose(f);
  if (failed) user_error("--data %s: read error; check the file", path.c_str());
  train_end_ = bytes_.size() - bytes_.size() / 10;
  const size_t need_train = size_t(B) * T + 1, need_val = size_t(T) + 1;
  if (train_end_ < need_train || bytes_.size() - train_end_ < need_val)
    user_error("--data %s: %zu bytes is shorter than one batch (needs %zu: %zu for --batch %d x --seq %d, "
               "plus 10%% for validation); use a longer file or a smaller --batch/--seq",
               path.c_str(), bytes_.size(), std::max(need_train + need_train / 9, need_train + need_val),
               need_train, B, T);
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
