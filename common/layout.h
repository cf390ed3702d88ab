// layout.h — the model's shape and its flat parameter buffer cut into units: the GPT config and
// presets, each unit's tensors, and which slice of every unit each rank owns. Every stage, the
// formulas, the checkpoints and the tools share this one picture of the parameters.
//
// Units, in forward order (docs/stages.md, "Units and sharding"):
//   unit 0          "embed":  wte (V,C) token embedding, tied to the LM head; wpe (maxT,C)
//   units 1..L      "block l": ln1 w,b (C) | qkv w (3C,C), b (3C) | attproj w (C,C), b (C) |
//                             ln2 w,b (C) | fc w (4C,C), b (4C) | fcproj w (C,4C), b (C)
//   unit L+1        "lnf":    final layernorm w,b (C)
// Each unit is contiguous in the flat buffer and padded with zeros to a multiple of the world size
// N, so rank r owns slice r of every unit, and every collective is one call per unit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace nz {

struct GPTConfig {
  int vocab = 256;  // byte-level
  int ctx = 128;    // maximum sequence length (rows of wpe)
  int layers = 4;
  int dim = 128;
  int heads = 4;
};
// Presets: "tiny" (tests), "small" (~1M parameters, the CPU default), "gpt2" (GPT-2 124M's shape:
// 12 layers, 768 wide, 12 heads, context 1024; 85.9M parameters with the 256-byte vocabulary).
bool preset_config(const std::string& name, GPTConfig* out);
const char* preset_names();  // "tiny, small, gpt2"

// Element counts are uint64_t, not size_t: the same code compiled for a 32-bit target (the explorer's
// WebAssembly, docs/explorer.md) counts models of billions of parameters too (on 64-bit Linux they
// are the same type).
struct TensorSpec {
  std::string name;
  uint64_t offset;  // elements from the start of the unit
  uint64_t numel;
  bool decay;     // weight decay applies (matrices and embeddings; not biases or layernorms)
};

struct Unit {
  std::string name;
  uint64_t offset;        // elements from the start of the flat (padded) buffer
  uint64_t numel;         // real parameters
  uint64_t padded;        // numel rounded up to a multiple of N
  uint64_t shard_offset;  // where this unit's slice starts in a rank's shard buffers (Σ earlier padded/N)
  std::vector<TensorSpec> tensors;
};

// A range of elements inside a unit: what one rank owns, or the whole unit.
struct Slice {
  uint64_t begin, end;
  uint64_t size() const { return end - begin; }
};

struct Layout {
  GPTConfig cfg;
  int world = 1;                // N
  size_t pad_block = 1;         // units are padded to a multiple of N x this (ZeRO++'s blocks; else 1)
  std::vector<Unit> units;      // embed, blocks, lnf
  uint64_t num_params = 0;      // Ψ: real parameters
  uint64_t padded_total = 0;    // Σ padded
  uint64_t shard_total = 0;     // S: Σ padded / N, the elements each rank owns
  uint64_t max_unit_padded = 0;   // the largest unit (the size of a bucket / gather buffer)
  int num_units() const { return int(units.size()); }
  int embed_unit() const { return 0; }
  int lnf_unit() const { return num_units() - 1; }
  Slice full(int u) const { return {0, units[u].padded}; }
  Slice shard(int u, int rank) const {
    uint64_t s = units[u].padded / world;
    return {rank * s, (rank + 1) * s};
  }
};
// pad_block (ZeRO++): each unit is padded to a multiple of world * pad_block, so that every slice is
// a whole number of quantization blocks counted from the unit's start.
Layout make_layout(const GPTConfig& cfg, int world, size_t pad_block = 1);

// Which parameters a rank holds, as its stage says (checkpoints read and write what it holds):
// every unit whole (stages 0-2, offload), only its own slice of each unit (stage3), or its pipeline
// segment's units whole (pipeline.h: a contiguous run of them).
enum class ParamsHeld { AllUnits, OwnSlices, SegmentUnits };
// The same number the layout counts, by the textbook formula (the tests compare the two).
uint64_t param_count_formula(const GPTConfig& cfg);

}  // namespace nz
