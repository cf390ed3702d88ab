// layout.cpp — the presets, and the flat parameter buffer cut into padded units (layout.h).
#include "layout.h"

#include <algorithm>
#include <tuple>

#include "runtime/check.h"

namespace nz {

bool preset_config(const std::string& name, GPTConfig* c) {
  if (name == "tiny") *c = GPTConfig{256, 32, 2, 32, 4};
  else if (name == "small") *c = GPTConfig{256, 128, 5, 128, 4};
  else if (name == "gpt2") *c = GPTConfig{256, 1024, 12, 768, 12};
  else return false;
  return true;
}

const char* preset_names() { return "tiny, small, gpt2"; }

Layout make_layout(const GPTConfig& cfg, int world, size_t pad_block) {
  NZ_CHECK(world >= 1, "world size %d", world);
  Layout L;
  L.cfg = cfg;
  L.world = world;
  L.pad_block = pad_block;
  const uint64_t multiple = uint64_t(world) * pad_block;
  const uint64_t C = cfg.dim, V = cfg.vocab, Tm = cfg.ctx;
  auto add_unit = [&](const std::string& name,
                      const std::vector<std::tuple<const char*, uint64_t, bool>>& tensors) {
    Unit u;
    u.name = name;
    u.offset = L.padded_total;
    u.shard_offset = L.shard_total;
    uint64_t off = 0;
    for (const auto& [tname, n, decay] : tensors) {
      u.tensors.push_back({tname, off, n, decay});
      off += n;
    }
    u.numel = off;
    u.padded = (off + multiple - 1) / multiple * multiple;  // zeros at the end, so N divides the unit
    L.num_params += u.numel;
    L.padded_total += u.padded;
    L.shard_total += u.padded / world;
    L.max_unit_padded = std::max(L.max_unit_padded, u.padded);
    L.units.push_back(u);
  };
  add_unit("embed", {{"wte", V * C, true}, {"wpe", Tm * C, true}});
  for (int l = 0; l < cfg.layers; l++) {
    add_unit("block" + std::to_string(l),
             {{"ln1_w", C, false}, {"ln1_b", C, false},
              {"qkv_w", 3 * C * C, true}, {"qkv_b", 3 * C, false},
              {"attproj_w", C * C, true}, {"attproj_b", C, false},
              {"ln2_w", C, false}, {"ln2_b", C, false},
              {"fc_w", 4 * C * C, true}, {"fc_b", 4 * C, false},
              {"fcproj_w", 4 * C * C, true}, {"fcproj_b", C, false}});
  }
  add_unit("lnf", {{"lnf_w", C, false}, {"lnf_b", C, false}});
  return L;
}

uint64_t param_count_formula(const GPTConfig& c) {
  const uint64_t C = c.dim;
  return uint64_t(c.vocab) * C + uint64_t(c.ctx) * C + uint64_t(c.layers) * (12 * C * C + 13 * C) + 2 * C;
}

}  // namespace nz
