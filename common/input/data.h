// data.h — a byte-level loader over any text file: deterministic, each rank reads its part of the
// global batch, and a train/validation split (the last 10% of the file is validation).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nz {

// The largest --data file: every rank reads the whole file into memory.
constexpr uint64_t kMaxDataBytes = uint64_t(1) << 30;

// Exits 2 with one line naming `flag` unless `path` is a regular file of at most max_bytes, checked
// without opening it: opening a FIFO blocks, /dev/zero never ends, and a directory is no file.
// what: what the file should be, for the message ("a text file", "a DeepSpeed JSON config").
void check_input_file(const char* flag, const std::string& path, uint64_t max_bytes, const char* what);
// The whole of such a file: checked first, then opened without blocking (O_NONBLOCK) and checked
// again on the open descriptor (the path may have been swapped for a FIFO in between), and read
// up to max_bytes. Any failure is one line naming `flag`, exit 2.
std::string read_input_file(const char* flag, const std::string& path, uint64_t max_bytes, const char* what);

// check_input_file for --data: at most kMaxDataBytes.
void check_data_file(const std::string& path);

// The fewest bytes a file needs for batches of B windows of T tokens: its first 90% must hold B*T+1
// bytes (one batch and its last target) and its last 10% T+1 (one validation window).
uint64_t min_data_bytes(int B, int T);

class DataLoader {
 public:
  // Reads the whole file. Exits with code 2 and one line when it is unreadable, not a regular file,
  // larger than kMaxDataBytes, or shorter than min_data_bytes(B, T).
  DataLoader(const std::string& path, int B, int T, uint64_t seed);

  // Micro-batch k of optimizer step `step` for `rank` of `world`: B windows of T tokens, targets
  // shifted by one. Window i of the global batch starts at a pseudo-random offset drawn from i
  // alone, with i = ((step * accum + k) * world + rank) * B + b. So N ranks with batch B see
  // exactly the windows 1 rank with batch N*B sees, and accum K with batch B those of batch K*B.
  void train_batch(long step, int k, int accum, int world, int rank, int* tokens, int* targets) const;

  // Validation: consecutive non-overlapping windows of T tokens from the validation split.
  int num_val_windows() const;
  void val_window(int j, int* tokens, int* targets) const;

  // Cross-entropy (nats/byte) of the validation split under the training split's byte frequencies
  // (add-one smoothing): the loss a model that ignores context would reach.
  double unigram_baseline() const;

  size_t train_bytes() const { return train_end_; }
  size_t val_bytes() const { return bytes_.size() - train_end_; }

 private:
  std::vector<uint8_t> bytes_;
  size_t train_end_ = 0;
  int B_, T_;
  uint64_t seed_;
};

}  // namespace nz
