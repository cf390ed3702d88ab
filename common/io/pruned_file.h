// pruned_file.h — the compact file of a pruned model: a bitmask and the kept weights only, written
// atomically, with a checksum (prune.h: what is pruned; docs/files.md, "Pruned model file").
//
// Format (little-endian):
//   bytes 0..7    magic: the ASCII bytes "NZGPTPRN"
//   uint32        version (1)
//   int32 x 5     vocab, ctx, layers, dim, heads
//   uint64        Ψ, the number of parameters
//   uint64        K, the number of kept parameters (mask bits set)
//   uint8 x ceil(Ψ/8)   the mask: bit j of byte i is parameter 8i + j, 1 = kept, in the model
//                 file's order; the bits after Ψ in the last byte are 0
//   float32 x K   the kept parameters, in the same order
//   uint32        CRC-32C of every byte before it
// Size: kPrunedHeaderBytes + ceil(Ψ/8) + 4K + 4 bytes (pruned_file_bytes), against the model
// file's 40 + 4Ψ + 4: a pruned model is smaller once more than 1/32 of its weights are pruned.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "layout.h"

namespace nz {

constexpr char kPrunedMagic[8] = {'N', 'Z', 'G', 'P', 'T', 'P', 'R', 'N'};
constexpr uint32_t kPrunedVersion = 1;
constexpr size_t kPrunedHeaderBytes = 8 + 4 + 5 * 4 + 8 + 8;

inline uint64_t pruned_file_bytes(uint64_t params, uint64_t kept) {
  return kPrunedHeaderBytes + (params + 7) / 8 + 4 * kept + 4;
}

// Writes PATH atomically (atomic_file.h). params: Ψ floats (the pruned ones 0), keep: Ψ bytes
// (1 = kept). False and *why when it cannot be written: PATH is then untouched.
bool write_pruned_file(const std::string& path, const GPTConfig& cfg, const std::vector<float>& params,
                       const std::vector<uint8_t>& keep, std::string* why);
// Reads and checks a pruned model file the way load_model checks a model file: the header against
// sane limits and the file's size before anything is allocated, the checksum, the mask (its bit
// count against K, the bits past Ψ, every unprunable tensor kept), finite weights. Out: the
// dense parameters (pruned ones 0) and keep. Anything wrong is one line with a HINT, exit 2,
// naming `flag`.
void load_pruned(const std::string& path, GPTConfig* cfg, std::vector<float>* params, std::vector<uint8_t>* keep,
                 const char* flag);
// Whether PATH starts with the pruned file's magic (load_model reads either kind).
bool is_pruned_file(const std::string& path);

}  // namespace nz
